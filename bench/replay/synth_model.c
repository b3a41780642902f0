/* SPDX-License-Identifier: Apache-2.0 */
/* synth_model.c: the replay tool's models (--model expseg | pytorch) and the warm start.
 *
 * --model expseg replays through expseg as configured (the default). --model pytorch
 * replays through the same allocator with PyTorch's defaults and PyTorch's behaviour where
 * it differs (model_conf below; docs/replay.md "Models"), and, when the trace carries the
 * recorded allocator's state at the start of the window (pickles: start_segs, and each 'p'
 * event's block address), it starts from that state instead of from empty: every recorded
 * segment is created at its recorded size on its stream and carved into the recorded
 * blocks, live ones kept and the free ranges between them given back, so the window sees
 * the same cached free blocks the recorded run had.
 *
 * The carving uses only the public calls: with no other free block in the pool, a malloc
 * lands at the start of the single free range (best fit, split at the front), so pieces
 * allocated in address order reproduce the layout; every piece's address is checked, and a
 * layout the allocator would not produce (a free range PyTorch could not have left) stops
 * the warm start with a message (the replay then starts from an empty cache). (The file
 * name starts with "synth" for the library glob.) */
#include "synth_model.h"

#include "expseg_testing.h" /* expseg_testing_set_model_pytorch: the model switch */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((uint64_t)1 << 20)
#define SMALL_SIZE MIB        /* PyTorch kSmallSize: requests up to this use the small pool */
#define MIN_BLOCK 512u        /* kMinBlockSize */

int _expseg_model_parse(const char *s, int *model) {
  if (!strcmp(s, "expseg")) *model = EXPSEG_MODEL_EXPSEG;
  else if (!strcmp(s, "pytorch")) *model = EXPSEG_MODEL_PYTORCH;
  else return -1;
  return 0;
}

const char *_expseg_model_name(int model) {
  return model == EXPSEG_MODEL_PYTORCH ? "pytorch" : "expseg";
}

int _expseg_conf_expandable(const char *conf) {
  /* the last expandable_segments key wins, as in the parser */
  int on = -1;
  for (const char *p = conf; p && (p = strstr(p, "expandable_segments:")) != NULL; p++) {
    const char *v = p + strlen("expandable_segments:");
    on = (v[0] == 'T' || v[0] == 't' || v[0] == '1');
  }
  return on;
}

const char *_expseg_model_conf(int model, const char *user, const expseg_trace_t *t,
                               char *buf, size_t len) {
  if (model != EXPSEG_MODEL_PYTORCH) return user; /* NULL = the environment */
  /* PyTorch's defaults first (classic segments), then the setting in force: the user's
   * --conf, else the recorded run's own; the last key wins. */
  const char *set = user ? user : (t && t->recorded_conf[0] ? t->recorded_conf : "");
  snprintf(buf, len, "expandable_segments:False%s%s", set[0] ? "," : "", set);
  return buf; /* PyTorch's pages and page handling: the allocator's model switch */
}

expseg_status _expseg_model_apply(expseg_allocator *a, int model) {
  return expseg_testing_set_model_pytorch(a, model == EXPSEG_MODEL_PYTORCH);
}

/* ---------------------------------------------------------------------------------- */
/* Warm start                                                                          */

typedef struct live_s { uint64_t addr, id, size; } live_t;
typedef struct piece_s { uint64_t off, size, id; int gap; } piece_t; /* id: live only */

static int live_cmp(const void *pa, const void *pb) {
  const live_t *a = pa, *b = pb;
  return a->addr < b->addr ? -1 : a->addr > b->addr;
}

static uint64_t round_block(uint64_t req) {
  return req < MIN_BLOCK ? MIN_BLOCK : (req + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
}

/* The pieces of segment g from its live blocks l[0..n): live blocks at their addresses
 * (sized as PyTorch splits: the rounded request, plus a remainder too small to split), free
 * ranges between them. -1 when the layout cannot come from PyTorch. */
static int layout(const expseg_trace_segment_t *g, const live_t *l, size_t n, piece_t *pc,
                  size_t *np, char *why, size_t wlen) {
  uint64_t cur = g->addr, end = g->addr + g->size;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (l[i].addr < cur) {
      snprintf(why, wlen, "block at 0x%" PRIx64 " overlaps the previous one", l[i].addr);
      return -1;
    }
    if (l[i].addr > cur) pc[k++] = (piece_t){cur - g->addr, l[i].addr - cur, 0, 1};
    uint64_t next = i + 1 < n ? l[i + 1].addr : end, sz = round_block(l[i].size);
    if (l[i].addr + sz > next) {
      snprintf(why, wlen, "block at 0x%" PRIx64 " (%" PRIu64 " B) runs past 0x%" PRIx64,
               l[i].addr, l[i].size, next);
      return -1;
    }
    uint64_t rem = next - (l[i].addr + sz);
    if (g->small ? rem < MIN_BLOCK : rem <= SMALL_SIZE) sz += rem; /* not split off */
    pc[k++] = (piece_t){l[i].addr - g->addr, sz, l[i].id, 0};
    cur = l[i].addr + sz;
  }
  if (cur < end) pc[k++] = (piece_t){cur - g->addr, end - cur, 0, 1};
  *np = k;
  return 0;
}

typedef struct gaps_s { void **p; size_t n, cap; } gaps_t;

static int gap_push(gaps_t *g, void *p) {
  if (g->n == g->cap) {
    size_t c = g->cap ? 2 * g->cap : 256;
    void **np = realloc(g->p, c * sizeof *np);
    if (!np) return -1;
    g->p = np;
    g->cap = c;
  }
  g->p[g->n++] = p;
  return 0;
}

/* malloc(size) on stream, which must land at want (NULL: anywhere; *got = where). */
static int place(expseg_allocator *a, uint64_t size, expseg_stream stream, char *want,
                 void **got, char *why, size_t wlen) {
  void *p = NULL;
  if (expseg_malloc(a, (size_t)size, stream, &p) != EXPSEG_OK) {
    snprintf(why, wlen, "malloc(%" PRIu64 ") failed: %s", size, expseg_last_error());
    return -1;
  }
  if (want && (char *)p != want) {
    snprintf(why, wlen, "malloc(%" PRIu64 ") landed %+td bytes from its recorded offset", size,
             (char *)p - want);
    expseg_free(a, p);
    return -1;
  }
  *got = p;
  return 0;
}

/* One segment: created, then its pieces allocated in address order. */
static int seed_segment(expseg_allocator *a, const expseg_trace_segment_t *g,
                        expseg_stream stream, const piece_t *pc, size_t np, void **ptr,
                        gaps_t *gaps, char *why, size_t wlen) {
  char *base = NULL;
  void *p;
  if (!g->small) {
    /* the whole segment as one block, given back: the pool's only free range */
    int64_t before = 0, after = 0;
    expseg_stat(a, "num_device_alloc", &before);
    if (place(a, g->size, stream, NULL, &p, why, wlen)) return -1;
    expseg_stat(a, "num_device_alloc", &after);
    base = p;
    expseg_free(a, p);
    if (after != before + 1) {
      snprintf(why, wlen, "malloc(%" PRIu64 ") did not create a segment of that size",
               g->size);
      return -1;
    }
  }
  for (size_t i = 0; i < np; i++) {
    /* small-pool pieces go in parts of at most 1 MiB (a larger request is a large one) */
    uint64_t left = pc[i].size, off = pc[i].off;
    while (left) {
      uint64_t part = g->small && left > SMALL_SIZE ? SMALL_SIZE : left;
      if (!pc[i].gap && part != left) {
        snprintf(why, wlen, "small-pool block of %" PRIu64 " B", left);
        return -1;
      }
      if (place(a, part, stream, base ? base + off : NULL, &p, why, wlen)) return -1;
      if (!base) base = p; /* a small segment is created by its first piece */
      if (pc[i].gap) {
        if (gap_push(gaps, p)) {
          expseg_free(a, p);
          snprintf(why, wlen, "out of host memory");
          return -1;
        }
      } else {
        ptr[pc[i].id] = p;
      }
      left -= part;
      off += part;
    }
  }
  return 0;
}

int _expseg_model_warm_start(expseg_allocator *a, const expseg_trace_t *t,
                             const expseg_stream *streams, void **ptr, char *why,
                             size_t wlen) {
  if (!t->n_start_segs) return 0;
  size_t nl = 0;
  for (size_t i = 0; i < t->n_events; i++)
    if (t->events[i].kind == 'p' && t->events[i].id < t->n_start_addr) nl++;
  live_t *l = malloc((nl ? nl : 1) * sizeof *l);
  piece_t *pc = malloc((2 * nl + 2) * sizeof *pc);
  gaps_t gaps = {NULL, 0, 0};
  int rc = 0;
  if (!l || !pc) {
    snprintf(why, wlen, "out of host memory");
    rc = -1;
    goto out;
  }
  nl = 0;
  for (size_t i = 0; i < t->n_events; i++) {
    const expseg_trace_event_t *e = &t->events[i];
    if (e->kind == 'p' && e->id < t->n_start_addr)
      l[nl++] = (live_t){t->start_addr[e->id], e->id, e->size};
  }
  qsort(l, nl, sizeof *l, live_cmp);
  size_t j = 0;
  for (size_t s = 0; s < t->n_start_segs && !rc; s++) {
    const expseg_trace_segment_t *g = &t->start_segs[s];
    while (j < nl && l[j].addr < g->addr) j++; /* outside every segment: replayed plainly */
    size_t k = j;
    while (k < nl && l[k].addr < g->addr + g->size) k++;
    size_t np = 0;
    if (layout(g, l + j, k - j, pc, &np, why, wlen) ||
        seed_segment(a, g, streams ? streams[g->stream] : g->stream, pc, np, ptr, &gaps, why,
                     wlen)) {
      size_t n = strlen(why);
      snprintf(why + n, wlen - n, " (segment at 0x%" PRIx64 ", %" PRIu64 " B)", g->addr,
               g->size);
      rc = -1;
    }
    j = k;
  }
out:
  for (size_t i = 0; i < gaps.n; i++) expseg_free(a, gaps.p[i]);
  free(gaps.p);
  free(l);
  free(pc);
  if (!rc) expseg_reset_peak_stats(a); /* the carving's transient blocks are no peak */
  return rc;
}

/* ---------------------------------------------------------------------------------- */
/* The recorded figures over a window                                                  */

void _expseg_window_baseline(const expseg_trace_t *t, size_t n, expseg_trace_baseline_t *b) {
  *b = t->baseline;
  if (!b->present) return;
  if (n > t->n_events) n = t->n_events;
  uint64_t res = b->start_reserved;
  b->peak_reserved = res;
  b->segment_alloc = b->segment_free = b->map = b->unmap = b->oom = 0;
  for (size_t i = 0; i < n; i++) {
    const expseg_trace_event_t *e = &t->events[i];
    res = _expseg_baseline_reserved(res, e);
    if (res > b->peak_reserved) b->peak_reserved = res;
    switch (e->kind) {
    case EXPSEG_TR_SEG_ALLOC: b->segment_alloc++; break;
    case EXPSEG_TR_MAP: b->map++; break;
    case EXPSEG_TR_SEG_FREE: b->segment_free++; break;
    case EXPSEG_TR_UNMAP: b->unmap++; break;
    case EXPSEG_TR_OOM: b->oom++; break;
    default: break;
    }
  }
  b->end_reserved = res;
}
