/* SPDX-License-Identifier: Apache-2.0 */
/* walk.c: expseg_walk, the allocator's segments, blocks and history as C structs (the
 * content of expseg_snapshot without the pickle), and the one iteration over reported
 * segments that the snapshot also uses: sorted by address, an expandable segment split into
 * its contiguous mapped runs, as PyTorch reports expandable segments. */
#include "walk.h"

#include "error.h"
#include "history.h"

#include <stdlib.h>

static int by_base(const void *x, const void *y) {
  uintptr_t a = (*(segment_t *const *)x)->base, b = (*(segment_t *const *)y)->base;
  return a < b ? -1 : a > b;
}

bool _expseg_reported_segments(const expseg_allocator *a,
                               void (*fn)(void *ctx, const segment_t *s, const block_t *first,
                                          const block_t *end),
                               void *ctx) {
  size_t n = a->n_segments;
  segment_t **v = malloc((n ? n : 1) * sizeof *v);
  if (v == NULL) return false;
  size_t i = 0;
  for (segment_t *s = a->segments; s && i < n; s = s->next_all) v[i++] = s;
  qsort(v, i, sizeof *v, by_base);
  for (size_t j = 0; j < i; j++) {
    const segment_t *s = v[j];
    if (!s->expandable) {
      fn(ctx, s, s->first, NULL);
      continue;
    }
    for (const block_t *b = s->first; b;) {
      if (!b->mapped) {
        b = b->next;
        continue;
      }
      const block_t *e = b;
      while (e && e->mapped) e = e->next;
      fn(ctx, s, b, e);
      b = e;
    }
  }
  free(v);
  return true;
}

typedef struct walk_s {
  const expseg_allocator *a;
  void (*segment)(void *ctx, const expseg_walk_segment *s);
  void *ctx;
  expseg_walk_block *blocks;
  size_t cap;
  bool oom;
} walk_t;

static void walk_segment(void *ctx, const segment_t *s, const block_t *first, const block_t *end) {
  walk_t *w = ctx;
  if (w->oom) return;
  expseg_walk_segment out = {0};
  size_t n = 0;
  for (const block_t *b = first; b != end; b = b->next) {
    if (n == w->cap) {
      size_t cap = w->cap ? 2 * w->cap : 64;
      expseg_walk_block *nb = realloc(w->blocks, cap * sizeof *nb);
      if (nb == NULL) {
        w->oom = true;
        return;
      }
      w->blocks = nb;
      w->cap = cap;
    }
    expseg_walk_block *o = &w->blocks[n++];
    o->address = b->ptr;
    o->size = b->size;
    o->requested_size = b->state == BLOCK_FREE ? 0 : b->requested;
    o->state = b->state == BLOCK_ALLOCATED ? EXPSEG_BLOCK_ALLOCATED
               : b->state == BLOCK_PENDING ? EXPSEG_BLOCK_PENDING_FREE
                                           : EXPSEG_BLOCK_INACTIVE;
    out.total_size += b->size;
    if (b->state == BLOCK_ALLOCATED) out.allocated_size += b->size;
    if (b->state != BLOCK_FREE) {
      out.active_size += b->size;
      out.requested_size += b->requested;
    }
  }
  out.address = first->ptr;
  out.stream = skey_stream(s->stream); /* the key without its pool's tag */
  out.is_large = s->pool != POOL_SMALL;
  out.is_expandable = s->expandable;
  out.blocks = w->blocks;
  out.n_blocks = n;
  out.pool = _expseg_ppool_id(w->a, seg_tag(s));
  out.asleep = s->asleep;
  w->segment(w->ctx, &out);
}

expseg_status expseg_walk(expseg_allocator *a,
                          void (*segment)(void *ctx, const expseg_walk_segment *s),
                          void (*event)(void *ctx, const expseg_walk_event *e), void *ctx) {
  if (a == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_walk: the allocator is NULL");
  api_lock(a);
  EXPSEG_HIST(a, HIST_SNAPSHOT, 0, stat_all_current(a->stats.active_bytes), 0);
  walk_t w = {a, segment, ctx, NULL, 0, false};
  if (segment != NULL && !_expseg_reported_segments(a, walk_segment, &w)) w.oom = true;
  free(w.blocks);
  const history_t *h = a->hist;
  if (!w.oom && event != NULL && h != NULL) {
    double scale = _expseg_hist_scale(h);
    for (size_t i = 0; i < h->count; i++) {
      const hist_event_t *e = _expseg_hist_at(h, i);
      expseg_walk_event out = {_expseg_hist_action_name(e->action), e->addr, e->size, e->stream,
                               _expseg_hist_time_us(h, scale, e->ticks), e->pool,
                               e->compile ? _expseg_hist_note_text(e->compile) : "N/A",
                               _expseg_hist_note_text(e->note)};
      event(ctx, &out);
    }
  }
  api_unlock(a);
  if (w.oom)
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                             "expseg_walk: out of host memory listing the blocks (the segments "
                             "already reported are complete; the history was not walked)");
  return EXPSEG_OK;
}
