/* SPDX-License-Identifier: Apache-2.0 */
/* snapshot.c: expseg_snapshot / expseg_snapshot_dump, the allocator's state and history as
 * PyTorch's memory snapshot (torch.cuda.memory._snapshot(); reference §6.3), so that
 * pytorch.org/memory_viz and torch.cuda._memory_viz open it unchanged.
 *
 * {"segments": [...], "device_traces": [[] x device, [events]], "allocator_settings": {...},
 *  "external_annotations": [...]} (the history's recordAnnotation entries: annotations.c). Segments are sorted by address. A classic segment is one
 * segment; an expandable segment is reported as PyTorch reports one: one segment per
 * contiguous mapped run (unmapped address space is not reported), is_expandable True.
 * Blocks tile each reported segment in address order (active_allocated,
 * active_pending_free, inactive). Live blocks carry the frames of the alloc event that made
 * them and classic segments those of their segment_alloc, when the history still holds it;
 * frame dicts are written once and shared (LONG_BINPUT / LONG_BINGET). Writing a snapshot
 * records a `snapshot` event (size = active bytes), as PyTorch does. The whole pickle is
 * built under the allocator's lock (C frames are symbolized then); the file is written
 * after, to a temporary name in the same directory, then renamed over the target (a
 * regular file or a new name; a symbolic link's target; never a FIFO, device or directory). */
#include "error.h"
#include "history.h"
#include "internal.h"
#include "walk.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- key -> history or memo index, on the allocator's pointer map (value = index + 1) ---- */

typedef ptrmap_t u64map_t;

static bool map_put(u64map_t *m, uint64_t key, int64_t v) {
  if (m->cap == 0 && !_expseg_ptrmap_init(m)) return false;
  if (v < 0) {
    (void)_expseg_ptrmap_take(m, (uintptr_t)key);
    return true;
  }
  return _expseg_ptrmap_put(m, (uintptr_t)key, (block_t *)(uintptr_t)(v + 1));
}

static int64_t map_get(const u64map_t *m, uint64_t key) {
  if (m->cap == 0) return -1;
  return (int64_t)(uintptr_t)_expseg_ptrmap_get(m, (uintptr_t)key) - 1;
}

static void map_free(u64map_t *m) {
  if (m->cap != 0) _expseg_ptrmap_destroy(m);
}

/* ---- frames ---- */

typedef struct ctx_s {
  pkw_t w;
  const expseg_allocator *a;
  const history_t *h;
  u64map_t frame_memo; /* C pc, or host id | 1 << 63 -> memo index */
  u64map_t live_alloc; /* block address -> its alloc event and frees since (alloc_note) */
  u64map_t seg_alloc;  /* classic segment address -> history index of its segment_alloc */
  bool oom;
  bool no_traces; /* EXPSEG_SNAPSHOT_NO_TRACES: device_traces holds empty lists */
  expseg_host_pool *host; /* host_segments and host_traces from this pool (NULL: none) */
} ctx_t;

static void write_frames(ctx_t *c, const hist_event_t *e) {
  _expseg_pkw_list(&c->w);
  for (size_t k = 0; k < (size_t)e->n_c + e->n_host; k++) {
    uint64_t key = k < e->n_c ? (uint64_t)(uintptr_t)e->c[k]
                              : ((uint64_t)1 << 63) | e->host[k - e->n_c];
    int64_t m = map_get(&c->frame_memo, key);
    if (m >= 0) {
      _expseg_pkw_get(&c->w, (uint32_t)m);
      continue;
    }
    const char *filename, *name;
    int line;
    char buf[256];
    _expseg_hist_frame(e, k, &filename, &name, &line, buf, sizeof buf);
    _expseg_pkw_dict(&c->w);
    _expseg_pkw_kstr(&c->w, "filename", filename);
    _expseg_pkw_kint(&c->w, "line", line);
    _expseg_pkw_kstr(&c->w, "name", name);
    _expseg_pkw_setitems(&c->w);
    if (!map_put(&c->frame_memo, key, _expseg_pkw_memoize(&c->w))) c->oom = true;
  }
  _expseg_pkw_appends(&c->w);
}

static void write_frames_of(ctx_t *c, int64_t idx) {
  if (idx < 0) {
    _expseg_pkw_list(&c->w);
    _expseg_pkw_appends(&c->w);
  } else {
    write_frames(c, _expseg_hist_at(c->h, (size_t)idx));
  }
}

/* ---- which alloc event made a live block (expseg_allocation_traceback's rule) ---- */

/* Notes event i of a history in m: block address -> (index of its newest alloc) << 2 | the
 * free_requested events of that address since (0, 1, 2 = more); a free_completed ends it.
 * False when out of host memory. */
static bool alloc_note(u64map_t *m, const hist_event_t *e, size_t i) {
  if (e->action == HIST_ALLOC) return map_put(m, e->addr, (int64_t)(i << 2));
  if (e->action == HIST_FREE_COMPLETED) return map_put(m, e->addr, -1);
  if (e->action != HIST_FREE_REQUESTED) return true;
  int64_t v = map_get(m, e->addr);
  return v < 0 || (v & 3) == 2 || map_put(m, e->addr, v + 1);
}

/* The history index of the alloc event of the live block at addr (requested bytes,
 * pending: freed, waiting on other streams), or -1: the newest alloc there of the same size,
 * with no free_requested after it (one, its own, for a pending block). An older allocation
 * never lends its frames: the alloc of the block may have been skipped, or dropped. */
static int64_t alloc_of(const u64map_t *m, const history_t *h, uint64_t addr, uint64_t requested,
                        bool pending) {
  int64_t v = map_get(m, addr);
  if (v < 0 || (v & 3) > (pending ? 1 : 0)) return -1;
  int64_t idx = v >> 2;
  return _expseg_hist_at(h, (size_t)idx)->size == requested ? idx : -1;
}

/* ---- segments ---- */

static const char *state_name(const block_t *b) {
  return b->state == BLOCK_ALLOCATED ? "active_allocated"
         : b->state == BLOCK_PENDING ? "active_pending_free"
                                     : "inactive";
}

/* One reported segment: the blocks [first, end) (all mapped). */
static void write_segment(ctx_t *c, const segment_t *s, const block_t *first, const block_t *end) {
  uint64_t total = 0, allocated = 0, active = 0, requested = 0;
  for (const block_t *b = first; b != end; b = b->next) {
    total += b->size;
    if (b->state == BLOCK_ALLOCATED) allocated += b->size;
    if (b->state != BLOCK_FREE) {
      active += b->size;
      requested += b->requested;
    }
  }
  pkw_t *w = &c->w;
  _expseg_pkw_dict(w);
  _expseg_pkw_kint(w, "device", c->a->device);
  _expseg_pkw_kuint(w, "address", first->ptr);
  _expseg_pkw_kuint(w, "total_size", total);
  _expseg_pkw_kuint(w, "allocated_size", allocated);
  _expseg_pkw_kuint(w, "active_size", active);
  _expseg_pkw_kuint(w, "requested_size", requested);
  _expseg_pkw_kuint(w, "stream", skey_stream(s->stream));
  _expseg_pkw_kstr(w, "segment_type", s->pool == POOL_SMALL ? "small" : "large");
  _expseg_pkw_str(w, "segment_pool_id"); /* (0, 0): the general cache; (0, id): a pool */
  _expseg_pkw_int(w, 0);
  _expseg_pkw_uint(w, _expseg_ppool_id(c->a, seg_tag(s)));
  _expseg_pkw_tuple2(w);
  _expseg_pkw_kbool(w, "is_expandable", s->expandable);
  if (s->asleep) _expseg_pkw_kbool(w, "expseg.asleep", true); /* its region sleeps */
  _expseg_pkw_str(w, "frames");
  write_frames_of(c, s->expandable ? -1 : map_get(&c->seg_alloc, s->base));
  _expseg_pkw_str(w, "blocks");
  _expseg_pkw_list(w);
  for (const block_t *b = first; b != end; b = b->next) {
    _expseg_pkw_dict(w);
    _expseg_pkw_kuint(w, "address", b->ptr);
    _expseg_pkw_kuint(w, "size", b->size);
    _expseg_pkw_kuint(w, "requested_size", b->state == BLOCK_FREE ? 0 : b->requested);
    _expseg_pkw_kstr(w, "state", state_name(b));
    _expseg_pkw_str(w, "frames");
    write_frames_of(c, b->state == BLOCK_FREE ? -1
                                              : alloc_of(&c->live_alloc, c->h, b->ptr, b->requested,
                                                         b->state == BLOCK_PENDING));
    _expseg_pkw_setitems(w);
  }
  _expseg_pkw_appends(w);
  _expseg_pkw_setitems(w);
}

static void write_reported(void *ctx, const segment_t *s, const block_t *first,
                           const block_t *end) {
  write_segment(ctx, s, first, end);
}

static void write_segments(ctx_t *c) {
  _expseg_pkw_list(&c->w);
  if (!_expseg_reported_segments(c->a, write_reported, c)) c->oom = true;
  _expseg_pkw_appends(&c->w);
}

/* ---- history and settings ---- */

static void write_event(ctx_t *c, const history_t *h, double scale, const hist_event_t *e) {
  pkw_t *w = &c->w;
  _expseg_pkw_dict(w);
  _expseg_pkw_kstr(w, "action", _expseg_hist_action_name(e->action));
  _expseg_pkw_kuint(w, e->action == HIST_OOM ? "device_free" : "addr", e->addr);
  _expseg_pkw_kuint(w, "size", e->size);
  _expseg_pkw_kuint(w, "stream", e->stream);
  _expseg_pkw_kuint(w, "time_us", _expseg_hist_time_us(h, scale, e->ticks));
  _expseg_pkw_str(w, "frames");
  write_frames(c, e);
  /* PyTorch's value when none was pushed */
  _expseg_pkw_kstr(w, "compile_context", e->compile ? _expseg_hist_note_text(e->compile) : "N/A");
  /* annotate's text; sleep's and wake's tag; else the user metadata set then */
  _expseg_pkw_kstr(w, "user_metadata", _expseg_hist_note_text(e->note));
  _expseg_pkw_setitems(w);
}

/* The events of h as one list (empty with EXPSEG_SNAPSHOT_NO_TRACES or no history). */
static void write_event_list(ctx_t *c, const history_t *h) {
  _expseg_pkw_list(&c->w);
  double scale = h ? _expseg_hist_scale(h) : 0.0;
  for (size_t i = 0; h && !c->no_traces && i < h->count; i++)
    write_event(c, h, scale, _expseg_hist_at(h, i));
  _expseg_pkw_appends(&c->w);
}

static void write_traces(ctx_t *c) {
  pkw_t *w = &c->w;
  _expseg_pkw_list(w);
  for (int d = 0; d < c->a->device; d++) {
    _expseg_pkw_list(w);
    _expseg_pkw_appends(w);
  }
  write_event_list(c, c->h);
  _expseg_pkw_appends(w);
}

/* ---- the pinned host pool: host_segments and host_traces ---- */

static const char *walk_state_name(expseg_block_state s) {
  return s == EXPSEG_BLOCK_ALLOCATED      ? "active_allocated"
         : s == EXPSEG_BLOCK_PENDING_FREE ? "active_pending_free"
                                          : "inactive";
}

/* Called by _expseg_host_observe under the host pool's lock: the segments in the device
 * segments' shape (device -1: host memory), then the pool's events. */
static void write_host(void *ctx, const history_t *hist, const expseg_walk_segment *segs,
                       size_t n) {
  ctx_t *c = ctx;
  pkw_t *w = &c->w;
  u64map_t live = {0}; /* block address -> its alloc event and frees since (alloc_note) */
  for (size_t i = 0; hist && i < hist->count; i++)
    if (!alloc_note(&live, _expseg_hist_at(hist, i), i)) c->oom = true;
  const history_t *dev = c->h;
  c->h = hist; /* write_frames_of reads events of this history */
  _expseg_pkw_str(w, "host_segments");
  _expseg_pkw_list(w);
  for (size_t i = 0; i < n; i++) {
    const expseg_walk_segment *s = &segs[i];
    _expseg_pkw_dict(w);
    _expseg_pkw_kint(w, "device", -1);
    _expseg_pkw_kuint(w, "address", s->address);
    _expseg_pkw_kuint(w, "total_size", s->total_size);
    _expseg_pkw_kuint(w, "allocated_size", s->allocated_size);
    _expseg_pkw_kuint(w, "active_size", s->active_size);
    _expseg_pkw_kuint(w, "requested_size", s->requested_size);
    _expseg_pkw_kuint(w, "stream", 0);
    _expseg_pkw_kstr(w, "segment_type", "host");
    _expseg_pkw_str(w, "segment_pool_id");
    _expseg_pkw_int(w, 0);
    _expseg_pkw_int(w, 0);
    _expseg_pkw_tuple2(w);
    _expseg_pkw_kbool(w, "is_expandable", false);
    _expseg_pkw_str(w, "frames");
    write_frames_of(c, -1);
    _expseg_pkw_str(w, "blocks");
    _expseg_pkw_list(w);
    for (size_t k = 0; k < s->n_blocks; k++) {
      const expseg_walk_block *b = &s->blocks[k];
      _expseg_pkw_dict(w);
      _expseg_pkw_kuint(w, "address", b->address);
      _expseg_pkw_kuint(w, "size", b->size);
      _expseg_pkw_kuint(w, "requested_size", b->requested_size);
      _expseg_pkw_kstr(w, "state", walk_state_name(b->state));
      _expseg_pkw_str(w, "frames");
      write_frames_of(c, b->state == EXPSEG_BLOCK_INACTIVE
                             ? -1
                             : alloc_of(&live, hist, b->address, b->requested_size,
                                        b->state == EXPSEG_BLOCK_PENDING_FREE));
      _expseg_pkw_setitems(w);
    }
    _expseg_pkw_appends(w);
    _expseg_pkw_setitems(w);
  }
  _expseg_pkw_appends(w);
  _expseg_pkw_str(w, "host_traces");
  write_event_list(c, hist);
  c->h = dev;
  map_free(&live);
}

/* PyTorch writes "no bound" (SIZE_MAX) as -1, its int64_t cast: every viewer reads it (an
 * older MemoryViz.js refuses integers wider than 8 bytes; a newer one reads them as BigInt,
 * which JSON.stringify refuses). */
static int64_t none_is_minus_1(uint64_t v) { return v > INT64_MAX ? -1 : (int64_t)v; }

static void write_settings(ctx_t *c) {
  const expseg_config_t *k = &c->a->cfg;
  pkw_t *w = &c->w;
  _expseg_pkw_dict(w);
  /* as PyTorch's last_allocator_settings: the option text the user gave, not the whole
   * configuration (expseg_config_string has that) */
  _expseg_pkw_kstr(w, "PYTORCH_CUDA_ALLOC_CONF", c->a->conf_text ? c->a->conf_text : "");
  _expseg_pkw_kint(w, "max_split_size", none_is_minus_1(k->max_split_size));
  _expseg_pkw_str(w, "garbage_collection_threshold");
  _expseg_pkw_float(w, k->garbage_collection_threshold);
  _expseg_pkw_kbool(w, "expandable_segments", k->expandable_segments);
  _expseg_pkw_kint(w, "pinned_num_register_threads", k->pinned_num_register_threads);
  _expseg_pkw_kbool(w, "release_lock_on_cudamalloc", k->release_lock_on_cudamalloc);
  _expseg_pkw_kbool(w, "pinned_use_cuda_host_register", k->pinned_use_cuda_host_register);
  _expseg_pkw_str(w, "roundup_power2_divisions");
  _expseg_pkw_dict(w);
  for (int i = 0; i < EXPSEG_ROUNDUP_INTERVALS; i++) { /* keys: interval start in MiB */
    char key[16];
    snprintf(key, sizeof key, "%u", 1u << i);
    _expseg_pkw_kint(w, key, k->roundup_power2_divisions[i]);
  }
  _expseg_pkw_setitems(w);
  _expseg_pkw_kbool(w, "graph_capture_record_stream_reuse", k->graph_capture_record_stream_reuse);
  /* expseg's own */
  _expseg_pkw_kstr(w, "expseg.driver", c->a->drv->ops->name);
  _expseg_pkw_kuint(w, "expseg.page_size", c->a->page);
  _expseg_pkw_kuint(w, "expseg.granularity", c->a->granularity);
  _expseg_pkw_kint(w, "expseg.page_cache_max", none_is_minus_1(k->page_cache_max));
  _expseg_pkw_kint(w, "expseg.va_reserve", none_is_minus_1(k->va_reserve));
  _expseg_pkw_kint(w, "expseg.chunk_max", none_is_minus_1(k->chunk_max));
  _expseg_pkw_str(w, "expseg.per_process_memory_fraction");
  _expseg_pkw_float(w, k->per_process_memory_fraction);
  _expseg_pkw_kint(w, "expseg.history_max_entries", c->h ? none_is_minus_1(c->h->max) : 0);
  _expseg_pkw_kuint(w, "expseg.history_recorded", c->h ? c->h->total : 0);
  _expseg_pkw_kbool(w, "expseg.history_c_stacks",
                    c->h != NULL && (c->h->flags & EXPSEG_HISTORY_C_STACKS));
  _expseg_pkw_setitems(w);
}

/* The history's external annotations (annotations.c), as PyTorch writes its
 * AnnotationEntry: the pairs, then device and time_us. */
static void write_annotations(ctx_t *c) {
  pkw_t *w = &c->w;
  _expseg_pkw_list(w);
  double scale = c->h ? _expseg_hist_scale(c->h) : 0.0;
  for (size_t i = 0; c->h && i < c->h->ann_count; i++) {
    const hist_ann_t *e = _expseg_hist_ann_at(c->h, i);
    _expseg_pkw_dict(w);
    for (size_t k = 0; k < e->n; k++) _expseg_pkw_kstr(w, e->kv[k], e->kv[e->n + k]);
    _expseg_pkw_kint(w, "device", c->a->device);
    _expseg_pkw_kuint(w, "time_us", _expseg_hist_time_us(c->h, scale, e->ticks));
    _expseg_pkw_setitems(w);
  }
  _expseg_pkw_appends(w);
}

/* Lock held. */
static expseg_status build(expseg_allocator *a, expseg_host_pool *host, unsigned flags,
                           unsigned char **buf, size_t *len) {
  EXPSEG_HIST(a, HIST_SNAPSHOT, 0, stat_all_current(a->stats.active_bytes), 0);
  ctx_t c;
  memset(&c, 0, sizeof c);
  c.a = a;
  c.no_traces = (flags & EXPSEG_SNAPSHOT_NO_TRACES) != 0;
  c.host = host;
  c.h = a->hist;
  for (size_t i = 0; c.h && i < c.h->count; i++) {
    const hist_event_t *e = _expseg_hist_at(c.h, i);
    bool ok = alloc_note(&c.live_alloc, e, i);
    if (e->action == HIST_SEGMENT_ALLOC) ok = map_put(&c.seg_alloc, e->addr, (int64_t)i) && ok;
    if (!ok) c.oom = true;
  }
  pkw_t *w = &c.w;
  _expseg_pkw_begin(w);
  _expseg_pkw_dict(w);
  _expseg_pkw_str(w, "segments");
  write_segments(&c);
  _expseg_pkw_str(w, "device_traces");
  write_traces(&c);
  _expseg_pkw_str(w, "allocator_settings");
  write_settings(&c);
  _expseg_pkw_str(w, "external_annotations");
  write_annotations(&c);
  if (host && !_expseg_host_observe(host, write_host, &c)) c.oom = true;
  _expseg_pkw_setitems(w);
  _expseg_pkw_end(w);
  map_free(&c.frame_memo);
  map_free(&c.live_alloc);
  map_free(&c.seg_alloc);
  if (c.oom || w->failed) {
    free(w->p);
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                             "expseg_snapshot: out of host memory building the snapshot");
  }
  *buf = w->p;
  *len = w->n;
  return EXPSEG_OK;
}

expseg_status expseg_snapshot(expseg_allocator *a, unsigned char **buf, size_t *len) {
  return expseg_snapshot_ex(a, 0, buf, len);
}

static expseg_status snapshot_any(const char *fn, expseg_allocator *a, expseg_host_pool *host,
                                  unsigned flags, unsigned char **buf, size_t *len) {
  if (flags & ~EXPSEG_SNAPSHOT_NO_TRACES)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s: unknown flags %#x; accepted: EXPSEG_SNAPSHOT_NO_TRACES (1)", fn,
                             flags);
  if (buf == NULL || len == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                             buf == NULL ? "buf" : "len");
  *buf = NULL;
  *len = 0;
  if (a == NULL)
    return _expseg_null_allocator(fn);
  api_lock(a); /* then the host pool's lock, inside (host pool code takes no allocator lock) */
  expseg_status st = build(a, host, flags, buf, len);
  api_unlock(a);
  return st;
}

expseg_status expseg_snapshot_ex(expseg_allocator *a, unsigned flags, unsigned char **buf,
                                 size_t *len) {
  return snapshot_any("expseg_snapshot", a, NULL, flags, buf, len);
}

expseg_status expseg_snapshot_with_host(expseg_allocator *a, expseg_host_pool *h,
                                        unsigned flags, unsigned char **buf, size_t *len) {
  if (h == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_snapshot_with_host: the host pool is NULL (expseg_snapshot "
                             "writes a snapshot without one)");
  return snapshot_any("expseg_snapshot_with_host", a, h, flags, buf, len);
}

void expseg_snapshot_free(unsigned char *buf) { free(buf); }

expseg_status expseg_snapshot_dump(expseg_allocator *a, const char *path) {
  return expseg_snapshot_dump_ex(a, path, 0);
}

static expseg_status dump(expseg_allocator *a, expseg_host_pool *host, const char *path,
                          unsigned flags);

expseg_status expseg_snapshot_dump_ex(expseg_allocator *a, const char *path, unsigned flags) {
  return dump(a, NULL, path, flags);
}

expseg_status expseg_snapshot_dump_with_host(expseg_allocator *a, expseg_host_pool *h,
                                             const char *path, unsigned flags) {
  if (h == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_snapshot_dump_with_host: the host pool is NULL "
                             "(expseg_snapshot_dump writes a snapshot without one)");
  return dump(a, h, path, flags);
}

static expseg_status dump(expseg_allocator *a, expseg_host_pool *host, const char *path,
                          unsigned flags) {
  if (path == NULL || path[0] == '\0')
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_snapshot_dump: path is %s; give a file name such as "
                             "\"snapshot.pickle\"",
                             path == NULL ? "NULL" : "empty");
  /* the file is replaced by a rename: only a regular file (or a new name) may be there; a
   * symbolic link is followed, so its target is written and the link stays */
  char *resolved = NULL;
  struct stat sb;
  if (lstat(path, &sb) == 0) {
    if (S_ISLNK(sb.st_mode)) {
      resolved = realpath(path, NULL);
      if (resolved == NULL || stat(resolved, &sb) != 0) {
        free(resolved);
        return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                                 "expseg_snapshot_dump(%s): a symbolic link whose target cannot "
                                 "be written (%s); give a regular file's name",
                                 path, strerror(errno));
      }
      path = resolved;
    }
    if (!S_ISREG(sb.st_mode)) {
      const char *what = S_ISDIR(sb.st_mode)    ? "a directory"
                         : S_ISFIFO(sb.st_mode) ? "a FIFO"
                         : S_ISSOCK(sb.st_mode) ? "a socket"
                                                : "a device";
      expseg_status bad = _expseg_error_set(
          EXPSEG_ERR_INVALID_ARGUMENT,
          "expseg_snapshot_dump(%s): it is %s; snapshots are written to regular files (through "
          "a temporary file renamed over the name, which would replace it)",
          path, what);
      free(resolved);
      return bad;
    }
  }
  /* the temporary file is opened before the snapshot is built: a path that cannot be
   * written records nothing (no `snapshot` event) */
  size_t n = strlen(path) + 32;
  char *tmp = malloc(n);
  if (tmp == NULL) {
    free(resolved);
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_snapshot_dump: out of host memory");
  }
  snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (f == NULL) {
    int err = errno;
    expseg_status bad = _expseg_error_set(
        err == ENOMEM ? EXPSEG_ERR_HOST_OUT_OF_MEMORY : EXPSEG_ERR_INVALID_ARGUMENT,
        "expseg_snapshot_dump(%s): cannot write the temporary file %s: %s (nothing was written "
        "at %s, nothing recorded)",
        path, tmp, strerror(err), path);
    free(tmp);
    free(resolved);
    return bad;
  }
  unsigned char *buf;
  size_t len;
  expseg_status st = host ? expseg_snapshot_with_host(a, host, flags, &buf, &len)
                          : expseg_snapshot_ex(a, flags, &buf, &len);
  if (st != EXPSEG_OK) {
    fclose(f);
    unlink(tmp);
    free(tmp);
    free(resolved);
    return st;
  }
  int err = 0;
  if (fwrite(buf, 1, len, f) != len) err = errno ? errno : EIO;
  if (fflush(f) != 0 && !err) err = errno;
  if (!err && fsync(fileno(f)) != 0) err = errno;
  if (fclose(f) != 0 && !err) err = errno;
  if (!err && rename(tmp, path) != 0) err = errno;
  if (err) unlink(tmp);
  free(buf);
  if (err)
    st = _expseg_error_set(err == ENOMEM ? EXPSEG_ERR_HOST_OUT_OF_MEMORY : EXPSEG_ERR_INVALID_ARGUMENT,
                           "expseg_snapshot_dump(%s): cannot write the snapshot: %s (nothing was "
                           "written at %s)",
                           path, strerror(err), path);
  free(tmp);
  free(resolved);
  return st;
}
