/* SPDX-License-Identifier: Apache-2.0 */
/* alloc.c: the public allocator API. Every entry point checks its arguments, takes the
 * allocator's lock, and leaves a message in expseg_last_error() on failure.
 *
 * malloc: round (policy, inline) -> best fit in the pool's free index on (stream, size,
 * address) (fidx.h: an exact size is a hash probe and a heap pop) -> garbage collection
 * when active -> grow (segment.c) -> on out-of-memory: wait for
 * pending frees, release free classic segments, grow again with blocking waits for idle
 * pages (num_alloc_retries) -> fail with a message that states the request, what is held
 * and a hint that fits the configuration; observers run outside the lock.
 * free: the block leaves the pointer map at once; if other streams used it, it stays
 * pending until their events complete (streams.c); otherwise it merges with its free
 * neighbours and goes back into the free index. Slow-path work (IPC polling, stream
 * events, history) is behind one test. */
#include "block.h"
#include "error.h"
#include "fidx.h"
#include "internal.h"
#include "round.h"

#include <float.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t allowed_for(const expseg_allocator *a) {
  return _expseg_allowed_bytes(a->cfg.per_process_memory_fraction, a->total_mem);
}

static void refresh_derived(expseg_allocator *a) {
  a->allowed = allowed_for(a);
  a->stats.max_split_size =
      a->cfg.max_split_size == SIZE_MAX ? -1 : (int64_t)a->cfg.max_split_size;
}

/* Names the options of c's text that are accepted without effect (docs/config.md), in one
 * warning: at creation and at every expseg_configure that gives one. No lock held. */
static void warn_no_effect(const expseg_config_t *c) {
  char none[512];
  if (_expseg_config_no_effect(c, none, sizeof none) > 0 && none[0] != '\0')
    _expseg_warn("%s", none);
}

static void warn_ignored_once(const expseg_config_source_t *src) {
  static atomic_flag warned = ATOMIC_FLAG_INIT;
  if (src->ignored[0] != '\0' && !atomic_flag_test_and_set(&warned))
    _expseg_warn("configuration taken from %s; also set and ignored: %s", src->name, src->ignored);
}

expseg_status _expseg_create_with_driver(expseg_vmm_t *drv, const char *config,
                                         expseg_allocator **out) {
  expseg_config_source_t src;
  expseg_config_t cfg;
  if (_expseg_config_load(config, "expseg_create", &src, &cfg) != EXPSEG_OK) {
    _expseg_vmm_close(drv);
    return EXPSEG_ERR_CONFIG;
  }
  warn_ignored_once(&src);
  expseg_allocator *a = calloc(1, sizeof *a);
  if (a == NULL || !_expseg_ptrmap_init(&a->live)) {
    free(a);
    _expseg_vmm_close(drv);
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_create: out of host memory");
  }
  pthread_mutex_init(&a->lock, NULL);
  a->drv = drv;
  a->device = drv->device;
  a->cfg = cfg;
  if (src.text != NULL && (a->conf_text = strdup(src.text)) == NULL) {
    pthread_mutex_destroy(&a->lock);
    _expseg_ptrmap_destroy(&a->live);
    free(a);
    _expseg_vmm_close(drv);
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_create: out of host memory");
  }
  a->granularity = drv->granularity;
  a->page = _expseg_page_size(&cfg, a->granularity);
  if ((a->page & (a->page - 1)) == 0)
    while (((size_t)1 << a->page_shift) < a->page) a->page_shift++;
  size_t free_b = 0;
  _expseg_vmm_mem_info(drv, &free_b, &a->total_mem);
  _expseg_fidx_init(&a->free_idx);
  for (int p = 0; p < POOL_COUNT; p++) a->unmapped_idx[p].by_size = false;
  a->rng = 0x9E3779B9u;
  refresh_derived(a);
  if (cfg.verbose) {
    char text[1024];
    _expseg_config_print(&cfg, text, sizeof text);
    _expseg_warn("device %d, %s driver, page %zu bytes; configuration from %s: %s", a->device,
                 drv->ops->name, a->page, src.name, text);
  }
  warn_no_effect(&cfg);
  *out = a;
  return EXPSEG_OK;
}

expseg_status expseg_create(const char *driver, int device, const char *config,
                            expseg_allocator **out) {
  if (out == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_create: out is NULL");
  *out = NULL;
  if (device < 0)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_create: device %d is negative; devices are numbered from 0",
                             device);
  expseg_vmm_t *drv = NULL;
  expseg_status st = _expseg_vmm_open(driver, device, &drv);
  if (st != EXPSEG_OK) return st;
  return _expseg_create_with_driver(drv, config, out);
}

void expseg_destroy(expseg_allocator *a) { _expseg_destroy_with(a, NULL, NULL); }

void _expseg_destroy_with(expseg_allocator *a, void (*before_close)(void *, expseg_vmm_t *),
                          void *ctx) {
  if (a == NULL) return;
  api_lock(a);
  _expseg_ipc_destroy(a); /* imports unmapped, exports' sockets closed */
  _expseg_sync_all_events(a); /* blocks used on other streams: wait for that work first */
  _expseg_sleep_destroy(a);   /* sleeping regions: host copies and what they still hold */
  _expseg_segments_destroy(a);
  _expseg_streams_destroy(a);
  _expseg_ptrmap_destroy(&a->live);
  _expseg_blocks_destroy(a);
  _expseg_fidx_destroy(&a->free_idx);
  _expseg_ppool_destroy(a);
  _expseg_segcount_destroy(a);
  _expseg_reserve_classes_destroy(a);
  free(a->observers);
  free(a->conf_text);
  _expseg_hist_destroy(a);
  pthread_mutex_unlock(&a->lock); /* not api_unlock: no EXPSEG_DEBUG=3 check of what is gone */
  _expseg_log_defer(false);
  pthread_mutex_destroy(&a->lock);
  if (before_close) before_close(ctx, a->drv);
  _expseg_vmm_close(a->drv);
  free(a);
}

/* ---- malloc ---- */

/* The free block a request takes: its stream's best fit, or (lending a tighter fit,
 * policy.h) another idle stream's smaller block when that best fit would leave
 * EXPSEG_LEND_WASTE or more unused and another stream owns free blocks in the pool (the
 * index counts them); the caller lends a block of another stream. With
 * `declined` (the hit path, which does not lend) such a request is left to the slow path:
 * *declined is set and NULL returned. */
EXPSEG_HOT block_t *find_free(expseg_allocator *a, int pool, expseg_stream stream, size_t rounded,
                              bool *declined) {
  if (a->model_pytorch) return _expseg_model_find_free(a, pool, stream, rounded);
  block_t *b = _expseg_fidx_best(&a->free_idx, pool, stream, rounded);
  if (b == NULL) return NULL;
  if (!b->seg->expandable && !_expseg_oversize_ok(&a->cfg, rounded, b->size))
    return NULL;
  if (_expseg_lend_look_inline(_expseg_fidx_streams(&a->free_idx, pool), rounded, b->size) &&
      b->seg->expandable) {
    if (declined != NULL) {
      *declined = true;
      return NULL;
    }
    block_t *o = _expseg_lend_tighter_find(a, pool, stream, rounded, b->size);
    if (o != NULL) return o;
  }
  if (b == a->free_idx.last[pool] &&
      _expseg_should_split(&a->cfg, pool == POOL_SMALL, b->seg->expandable, b->size, rounded)) {
    block_t *m = _expseg_block_split_front(a, b, rounded); /* the rest stays indexed */
    if (m != NULL) return m;
  }
  _expseg_free_remove(a, b);
  return b;
}

/* Hands out b (free, mapped, not indexed), splitting off what the request does not need;
 * key: the stream key that asked (its alloc event's). */
EXPSEG_HOT expseg_status take_block(expseg_allocator *a, block_t *b, size_t rounded, size_t size,
                                  expseg_stream key, void **out) {
  int pool = b->seg->pool;
  if (_expseg_should_split(&a->cfg, pool == POOL_SMALL, b->seg->expandable, b->size, rounded)) {
    block_t *rest = _expseg_block_split(a, b, rounded);
    if (rest != NULL) _expseg_free_insert(a, rest);
  }
  if (!_expseg_ptrmap_put(&a->live, b->ptr, b)) {
    _expseg_block_release(a, b);
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_malloc: out of host memory");
  }
  b->state = BLOCK_ALLOCATED;
  b->requested = size;
  b->n_uses = 0;
  b->lent = false;
  b->oversize = _expseg_is_oversize(&a->cfg, b->size);
  isplit_change(a, b, true);
  stat_alloc(&a->stats, pool, b);
  EXPSEG_CHECK_BLOCK(a, b);
  EXPSEG_HIST(a, HIST_ALLOC, b->ptr, size, key);
  *out = (void *)b->ptr;
  return EXPSEG_OK;
}

expseg_status expseg_malloc(expseg_allocator *a, size_t size, expseg_stream stream, void **out) {
  return expseg_malloc_ex(a, size, stream, 0, out);
}

/* A free single-chunk segment of exactly rounded bytes (at the granularity); ordinary
 * requests never take those (they sit in their own index), so it is whole. */
static block_t *find_single(expseg_allocator *a, int pool, expseg_stream stream, size_t rounded) {
  block_t *b = _expseg_tree_lower_bound(&a->free_idx.single[pool], stream, rounded, 0);
  if (b == NULL || b->stream != stream || b->size - rounded >= a->granularity) return NULL;
  _expseg_free_remove(a, b);
  return b;
}

static block_t *find_or_grow(expseg_allocator *a, int pool, expseg_stream stream, size_t rounded,
                             bool single, bool blocking, expseg_status *st) {
  block_t *b;
  if (single) {
    b = _expseg_grow_single(a, pool, stream, rounded, st);
    return b ? b : find_single(a, pool, stream, rounded);
  }
  b = _expseg_grow(a, pool, stream, rounded, blocking, st);
  /* another thread may have freed a fit while the lock was dropped */
  return b ? b : find_free(a, pool, stream, rounded, NULL);
}

/* The end of an allocation into key's private pool, if any (_expseg_ppool_inflight). */
static void inflight_end(expseg_allocator *a, expseg_stream key) {
  if (skey_tag(key) != 0) _expseg_ppool_inflight(a, skey_tag(key), false);
}

/* pool: ROUTED (the begun pools choose), 0 (the general cache) or a private pool's id. */
#define ROUTED UINT64_MAX

/* A stream value of 2^48 or more: a private pool's key (internal.h), never a stream. */
static expseg_status bad_stream(const char *fn, expseg_stream stream) {
  return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "%s: stream %#llx is not accepted; stream values are below 2^48 "
                           "(CUDA's stream handles are)",
                           fn, (unsigned long long)stream);
}

static expseg_status unknown_pool(expseg_pool_id pool) {
  return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "expseg_malloc_pool: pool %llu is not a live private pool; "
                           "accepted: 0 (the general cache) or an id expseg_pool_create "
                           "returned whose use count is at least 1",
                           (unsigned long long)pool);
}

EXPSEG_HOT expseg_status malloc_in(expseg_allocator *a, size_t size, expseg_stream stream,
                                   unsigned flags, expseg_pool_id pool, void **out) {
  if (out == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_malloc: out is NULL");
  *out = NULL;
  if (a == NULL) return _expseg_null_allocator("expseg_malloc");
  if (flags & ~EXPSEG_MALLOC_SINGLE_CHUNK)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_malloc_ex: flags 0x%x: unknown bits 0x%x; accepted: "
                             "EXPSEG_MALLOC_SINGLE_CHUNK (0x%x)",
                             flags, flags & ~EXPSEG_MALLOC_SINGLE_CHUNK,
                             EXPSEG_MALLOC_SINGLE_CHUNK);
  if (size == 0) { /* NULL, as cudaMalloc; a bad stream or pool is refused all the same */
    if (stream >> EXPSEG_KEY_SHIFT) return bad_stream("expseg_malloc", stream);
    if (pool == ROUTED || pool == 0) return EXPSEG_OK;
    api_lock(a);
    const bool live = _expseg_ppool_live_tag(a, pool) != 0;
    api_unlock(a);
    return live ? EXPSEG_OK : unknown_pool(pool);
  }
  /* The hit path takes the mutex alone: nothing on it can warn, so the deferral of warnings
   * (api_lock) starts only when the request leaves it. */
  pthread_mutex_lock(&a->lock);
  bool single = (flags & EXPSEG_MALLOC_SINGLE_CHUNK) || size >= a->cfg.single_chunk_min;
  size_t rounded = _expseg_round_size_inline(&a->cfg, size);
  /* slow-path work (stream events, history, begun pools, a pool named, a stream value a
   * pool key would use) behind one test; exports are polled only on a miss (below): a
   * block an importer released matters only when memory is short */
  const bool slow = ((uintptr_t)a->hist | a->n_pending_events | a->n_orphans | a->n_routes |
                     (stream >> EXPSEG_KEY_SHIFT) | (uint64_t)(pool != ROUTED)) != 0;
  /* rounded != 0, not over the device */
  const bool hit_tried = !slow && !single && rounded - 1 < a->total_mem;
  bool declined = false; /* the hit path left a tighter fit of another stream to lending */
  if (hit_tried) {
    int kind = _expseg_is_small(rounded) ? POOL_SMALL : POOL_LARGE;
    block_t *b = find_free(a, kind, stream, rounded, &declined);
    if (b != NULL) { /* the hit path: nothing on it warns */
      expseg_status st = take_block(a, b, rounded, size, stream, out);
#if EXPSEG_DEBUG >= 3
      _expseg_debug_tick(a);
#endif
      pthread_mutex_unlock(&a->lock);
      return st;
    }
  }
  _expseg_log_defer(true); /* from here on as api_lock */
  a->slow_mallocs++;
  if (stream >> EXPSEG_KEY_SHIFT) {
    api_unlock(a);
    return bad_stream("expseg_malloc", stream);
  }
  expseg_stream key = stream; /* the stream key: the stream, in its pool (internal.h) */
  if (pool == ROUTED) {
    if (a->n_routes > 0) key = _expseg_ppool_route(a, stream);
  } else if (pool != 0) {
    uint32_t t = _expseg_ppool_live_tag(a, pool);
    if (t == 0) {
      api_unlock(a);
      return unknown_pool(pool);
    }
    key = skey_make(stream, t);
  }
  if (skey_tag(key) != 0 && a->sleep != NULL && _expseg_sleep_refuses(a, skey_tag(key))) {
    api_unlock(a);
    return EXPSEG_ERR_INVALID_ARGUMENT; /* message set: the region sleeps */
  }
  /* an allocation into a private pool is counted from here to its end (inflight_end): the
   * lock may be dropped below, and a release meanwhile must not free the pool's slot */
  if (skey_tag(key) != 0) _expseg_ppool_inflight(a, skey_tag(key), true);
  if (a->n_pending_events > 0 || a->n_orphans > 0) _expseg_process_events(a);
  if (a->reap) _expseg_ppool_reap(a, false);
  if (rounded == 0) {
    inflight_end(a, key);
    api_unlock(a);
    return _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY,
                             "expseg_malloc: out of memory: tried to allocate %zu bytes; 1 EiB "
                             "(%zu bytes) or more is refused before any driver call, as PyTorch "
                             "does",
                             size, (size_t)EXPSEG_MAX_REQUEST);
  }
  a->oom_kind = OOM_MEMORY;
  a->oom_key = key;
  if (rounded > a->total_mem) { /* no cache, no setting can serve it: no driver call */
    a->oom_kind = OOM_TOO_LARGE;
    char total[32];
    _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY, "the device has %s in total",
                      _expseg_format_size(total, a->total_mem));
    inflight_end(a, key);
    return _expseg_fail_oom(a, size, rounded, stream, expseg_last_error()); /* unlocks */
  }
  int kind = _expseg_is_small(rounded) ? POOL_SMALL : POOL_LARGE;
  if (single) rounded = (rounded + a->granularity - 1) / a->granularity * a->granularity;
  /* the index as the hit path saw it (nothing changed since) is not searched again, unless
   * it left the request to lending */
  block_t *b = hit_tried && !declined ? NULL
               : single               ? find_single(a, kind, key, rounded)
                                      : find_free(a, kind, key, rounded, NULL);
  if (b == NULL && a->ipc != NULL) { /* importers that closed or died free their blocks */
    _expseg_ipc_poll_locked(a);
    b = single ? find_single(a, kind, key, rounded) : find_free(a, kind, key, rounded, NULL);
  }
  expseg_status st = EXPSEG_OK;
  /* reuse before growth: a free block another stream holds (lending: streams.c) */
  if (b == NULL && !single && a->cfg.expandable_segments && !a->model_pytorch)
    b = _expseg_lend_find(a, kind, key, rounded);
  if (b == NULL) {
    _expseg_garbage_collect(a, a->cfg.expandable_segments ? rounded : 0);
    b = find_or_grow(a, kind, key, rounded, single, false, &st);
  }
  if (b == NULL && st == EXPSEG_ERR_OUT_OF_MEMORY) {
    a->stats.num_alloc_retries++;
    _expseg_sync_all_events(a);
    b = single ? find_single(a, kind, key, rounded) : find_free(a, kind, key, rounded, NULL);
    if (b == NULL) {
      _expseg_release_cached(a, !single && a->cfg.expandable_segments); /* single: pages too */
      b = find_or_grow(a, kind, key, rounded, single, true, &st);
    }
  }
  if (b == NULL) {
    if (st == EXPSEG_OK) st = EXPSEG_ERR_OUT_OF_MEMORY;
    char cause[1024];
    snprintf(cause, sizeof cause, "%s", expseg_last_error());
    inflight_end(a, key);
    if (st != EXPSEG_ERR_OUT_OF_MEMORY) { /* a driver failure or host memory running out
                                           * (EXPSEG_ERR_HOST_OUT_OF_MEMORY): not the device's
                                           * memory, so no out-of-memory report */
      api_unlock(a);
      return _expseg_error_set(st, "expseg_malloc(%zu): %s", size, cause);
    }
    return _expseg_fail_oom(a, size, rounded, stream, cause); /* unlocks */
  }
  st = take_block(a, b, single ? b->size : rounded, size, key, out); /* single: never split */
  /* another stream's block, found or grown there, is lent (streams.c); its first use fits
   * the inline slots: cannot fail */
  if (st == EXPSEG_OK && b->stream != key) {
    expseg_status us = _expseg_block_add_use(b, skey_stream(key));
    expseg_assert(us == EXPSEG_OK);
    (void)us;
    b->lent = true;
    a->stats.num_lent++;
  }
  if (st == EXPSEG_OK && skey_tag(key) != 0) _expseg_ppool_busy(a, skey_tag(key), true);
  inflight_end(a, key); /* after the busy count: the pool never looks drained between */
  /* the page cache's bound (growth may have left more pages there than it allows); the
   * block is handed out already, so dropping the lock to release is safe */
  if (_expseg_page_cache_excess(&a->cfg, (size_t)a->stats.cached_physical_bytes.current) > 0)
    _expseg_cache_trim(a, a->cfg.page_cache_max);
  api_unlock(a);
  return st;
}

expseg_status expseg_malloc_ex(expseg_allocator *a, size_t size, expseg_stream stream,
                               unsigned flags, void **out) {
  return malloc_in(a, size, stream, flags, ROUTED, out);
}

expseg_status expseg_malloc_pool(expseg_allocator *a, size_t size, expseg_stream stream,
                                 expseg_pool_id pool, void **out) {
  if (pool == ROUTED) {
    if (out != NULL) *out = NULL;
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_malloc_pool: pool %llu is not a live private pool; "
                             "accepted: 0 (the general cache) or an id expseg_pool_create returned",
                             (unsigned long long)pool);
  }
  return malloc_in(a, size, stream, 0, pool, out);
}

/* ---- free ---- */

EXPSEG_HOT void free_block(expseg_allocator *a, block_t *b) {
  int pool = b->seg->pool;
  stats_t *s = &a->stats;
  EXPSEG_HIST(a, HIST_FREE_COMPLETED, b->ptr, b->requested, block_alloc_key(b));
  if (b->state == BLOCK_PENDING) _expseg_stat_add(&s->pending_free_blocks, -1);
  stat_free_done(s, pool, b);
  b->requested = 0;
  b->n_uses = 0;
  b->lent = false;
  a->tick++;
  isplit_change(a, b, false);
  b->state = BLOCK_FREE;
  block_t *m = _expseg_block_release(a, b); /* b may be gone */
  (void)m; /* read by the check at EXPSEG_DEBUG >= 2 */
  EXPSEG_CHECK_BLOCK(a, m);
}

void _expseg_free_block(expseg_allocator *a, block_t *b) {
  const uint32_t tag = skey_tag(b->stream);
  free_block(a, b); /* b may be gone */
  if (tag != 0) _expseg_ppool_busy(a, tag, false);
}

expseg_status expseg_free(expseg_allocator *a, void *ptr) {
  if (a == NULL) return _expseg_null_allocator("expseg_free");
  if (ptr == NULL) return EXPSEG_OK;
  pthread_mutex_lock(&a->lock);
  if ((((uintptr_t)a->ipc | (uintptr_t)a->hist) == 0)) { /* the hit path: nothing warns */
    block_t *b = _expseg_ptrmap_take(&a->live, (uintptr_t)ptr);
    /* a private pool's block takes the slow path (its pool counts its busy blocks) */
    if (b != NULL && (b->n_uses | (uint32_t)skey_tag(b->stream)) == 0) {
      stat_free(&a->stats, b->seg->pool, b);
      free_block(a, b);
#if EXPSEG_DEBUG >= 3
      _expseg_debug_tick(a);
#endif
      pthread_mutex_unlock(&a->lock);
      return EXPSEG_OK;
    }
    if (b != NULL) (void)_expseg_ptrmap_put(&a->live, b->ptr, b); /* its slot is free */
  }
  _expseg_log_defer(true); /* from here on as api_lock */
  expseg_status st = EXPSEG_OK;
  if (a->ipc == NULL || !_expseg_ipc_hold_free(a, (uintptr_t)ptr, &st))
    st = _expseg_free_locked(a, ptr);
  if (a->reap) _expseg_ppool_reap(a, false); /* a released pool's last block */
  api_unlock(a);
  return st;
}

expseg_status _expseg_free_locked(expseg_allocator *a, void *ptr) {
  block_t *b = _expseg_ptrmap_take(&a->live, (uintptr_t)ptr);
  if (b == NULL) {
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_free(%p): not a pointer this allocator handed out, or "
                             "already freed%s",
                             ptr, _expseg_host_pool_hint(ptr));
  }
  if (b->seg->asleep) { /* its region sleeps: the free is done at the wake (sleep.c) */
    (void)_expseg_ptrmap_put(&a->live, b->ptr, b); /* it was there: a slot is free */
    return _expseg_sleep_defer_free(a, b);
  }
  bool pending = false, evented = false;
  if (b->n_uses > 0) {
    pending = evented = _expseg_insert_events(a, b);
    /* no event could be recorded: wait for the streams instead; if even that fails the
     * memory may still be in use: the block stays pending as an orphan, its events tried
     * again at every malloc (only if no memory is left for that does free fail) */
    bool waited = true;
    for (uint32_t i = 0; !pending && waited && i < b->n_uses; i++)
      waited = _expseg_vmm_stream_synchronize(a->drv, b->uses[i]) == EXPSEG_OK;
    if (!pending && !waited) {
      if (!_expseg_orphan_add(a, b)) {
        (void)_expseg_ptrmap_put(&a->live, b->ptr, b); /* it was there: a slot is free */
        return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                                 "expseg_free(%p): out of host memory; it stays allocated", ptr);
      }
      pending = true;
    }
  }
  EXPSEG_HIST(a, HIST_FREE_REQUESTED, b->ptr, b->requested, block_alloc_key(b));
  int pool = b->seg->pool;
  stats_t *s = &a->stats;
  stat_free(s, pool, b);
  if (pending) {
    b->state = BLOCK_PENDING;
    _expseg_stat_add(&s->pending_free_blocks, 1);
    if (evented) _expseg_poll_uses(a, b); /* b may be gone */
  } else {
    _expseg_free_block(a, b);
  }
  return EXPSEG_OK;
}

expseg_status expseg_record_stream(expseg_allocator *a, void *ptr, expseg_stream stream) {
  if (a == NULL) return _expseg_null_allocator("expseg_record_stream");
  if (stream >> EXPSEG_KEY_SHIFT) return bad_stream("expseg_record_stream", stream);
  if (ptr == NULL) return EXPSEG_OK; /* as PyTorch: nothing to record */
  api_lock(a);
  block_t *b = _expseg_ptrmap_get(&a->live, (uintptr_t)ptr);
  expseg_status st;
  if (b == NULL)
    st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "expseg_record_stream(%p): not a live pointer of this allocator%s",
                           ptr, _expseg_host_pool_hint(ptr));
  else if (_expseg_ipc_freed(a, (uintptr_t)ptr)) /* gone for the caller at once (docs/api.md) */
    st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "expseg_record_stream(%p): already freed (its memory stays only "
                           "while the processes that imported it hold it)",
                           ptr);
  else
    st = _expseg_block_add_use(b, stream);
  api_unlock(a);
  return st;
}

/* ---- cache, limits, configuration ---- */

expseg_status expseg_empty_cache(expseg_allocator *a) {
  if (a == NULL) return _expseg_null_allocator("expseg_empty_cache");
  api_lock(a);
  if (a->ipc != NULL) _expseg_ipc_poll_locked(a);
  _expseg_sync_all_events(a);
  /* as PyTorch: the general cache is kept while allocations are routed to a pool; released
   * pools whose blocks are all free are given back either way */
  if (a->n_routes == 0) _expseg_release_cached(a, false);
  _expseg_ppool_reap(a, true);
  if (a->sleep != NULL) _expseg_sleep_trim(a);
  api_unlock(a);
  return EXPSEG_OK;
}

expseg_status expseg_set_memory_fraction(expseg_allocator *a, double fraction) {
  if (a == NULL) return _expseg_null_allocator("expseg_set_memory_fraction");
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    char num[40]; /* short, unless the short form would look inside the range */
    snprintf(num, sizeof num, "%g", fraction);
    double back = strtod(num, NULL);
    if (back >= 0.0 && back <= 1.0) snprintf(num, sizeof num, "%.17g", fraction);
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_set_memory_fraction: fraction %s is outside [0, 1]", num);
  }
  /* the value must survive expseg_config_string -> expseg_configure, whose parser refuses
   * what strtod reports as underflow (as PyTorch's std::stod does): subnormal numbers */
  if (fraction != 0.0 && fraction < DBL_MIN)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_set_memory_fraction: fraction %g is below the smallest "
                             "normal double (%g), which the configuration parser refuses as "
                             "out of range: accepted are 0 and [%g, 1]",
                             fraction, DBL_MIN, DBL_MIN);
  api_lock(a);
  a->cfg.per_process_memory_fraction = fraction;
  refresh_derived(a);
  api_unlock(a);
  return EXPSEG_OK;
}

/* Does the configuration's printed form parse back (from the defaults)? err: why not. */
static bool config_consistent(const expseg_config_t *c, char *err, size_t len) {
  char text[4096], warn[EXPSEG_CONFIG_MSG_MAX];
  expseg_config_t defaults, back;
  if (_expseg_config_print(c, text, sizeof text) >= sizeof text) return true; /* cannot tell */
  _expseg_config_defaults(&defaults);
  return _expseg_config_parse_warn(text, "the resulting configuration", &defaults, &back, err,
                                   len, warn, sizeof warn) == EXPSEG_OK;
}

expseg_status expseg_configure(expseg_allocator *a, const char *config) {
  if (a == NULL) return _expseg_null_allocator("expseg_configure");
  if (config == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_configure: config is NULL; pass option text such as "
                             "\"expandable_segments:False\"");
  api_lock(a);
  expseg_config_t next;
  char *text;
  char err[EXPSEG_CONFIG_MSG_MAX], warn[EXPSEG_CONFIG_MSG_MAX];
  expseg_status st = _expseg_config_parse_warn(config, "expseg_configure", &a->cfg, &next, err,
                                               sizeof err, warn, sizeof warn);
  if (st != EXPSEG_OK) {
    st = _expseg_error_set(EXPSEG_ERR_CONFIG, "%s", err);
  } else if (_expseg_page_size(&next, a->granularity) != a->page) {
    st = _expseg_error_set(EXPSEG_ERR_CONFIG,
                           "expseg_configure: page_size_mb value %zu (pages of %zu bytes) can "
                           "only be set at creation; accepted: the pages in force (%zu bytes), "
                           "or leave the key out",
                           (size_t)(next.page_size >> 20), _expseg_page_size(&next, a->granularity),
                           a->page);
  } else if (!config_consistent(&next, err, sizeof err)) {
    /* the keys given are fine alone but not with those in force (large_segment_size_mb
     * above max_split_size_mb, say): a state whose printed form would not parse back */
    st = _expseg_error_set(EXPSEG_ERR_CONFIG,
                           "expseg_configure(\"%.200s\"): not with the settings in force: %s",
                           config, err);
  } else if ((text = strdup(config)) == NULL) {
    st = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_configure: out of host memory");
  } else {
    a->cfg = next;
    free(a->conf_text);
    a->conf_text = text; /* the snapshot's PYTORCH_CUDA_ALLOC_CONF: the text last given */
    refresh_derived(a);
    /* a lower page_cache_max takes effect now (a cache hit does not look at the cache) */
    if (_expseg_page_cache_excess(&a->cfg, (size_t)a->stats.cached_physical_bytes.current) > 0)
      _expseg_cache_trim(a, a->cfg.page_cache_max);
  }
  const expseg_config_t given = a->cfg; /* its `given`: the keys of this text */
  api_unlock(a);
  if (st == EXPSEG_OK && warn[0] != '\0') _expseg_warn("%s", warn); /* no lock held */
  if (st == EXPSEG_OK) warn_no_effect(&given);
  return st;
}

size_t expseg_config_string(const expseg_allocator *a, char *buf, size_t len) {
  if (a == NULL) { /* an empty string, as expseg_memory_summary leaves */
    if (buf != NULL && len > 0) buf[0] = '\0';
    return 0;
  }
  if (buf == NULL) len = 0; /* only the length needed */
  expseg_allocator *m = (expseg_allocator *)a;
  api_lock(m);
  size_t n = _expseg_config_print(&a->cfg, buf, len);
  api_unlock(m);
  return n;
}

expseg_status expseg_add_oom_observer(expseg_allocator *a, expseg_oom_observer fn, void *ctx) {
  if (a == NULL) return _expseg_null_allocator("expseg_add_oom_observer");
  if (fn == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_add_oom_observer: fn is NULL");
  api_lock(a);
  observer_t *o = realloc(a->observers, (a->n_observers + 1) * sizeof *o);
  expseg_status st = EXPSEG_OK;
  if (o == NULL) {
    st = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_add_oom_observer: out of host memory");
  } else {
    a->observers = o;
    o[a->n_observers++] = (observer_t){fn, ctx};
  }
  api_unlock(a);
  return st;
}

/* ---- statistics ---- */

expseg_status expseg_stat(const expseg_allocator *a, const char *key, int64_t *value) {
  if (a == NULL) return _expseg_null_allocator("expseg_stat");
  if (key == NULL || value == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_stat: %s is NULL",
                             key == NULL ? "key" : "value");
  expseg_allocator *m = (expseg_allocator *)a;
  api_lock(m);
  bool found = _expseg_stats_get(a, key, value);
  api_unlock(m);
  if (!found)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_stat: unknown key '%s'; keys are those of "
                             "torch.cuda.memory_stats() (e.g. allocated_bytes.all.current) and "
                             "expseg.* (docs/stats.md)",
                             key);
  return EXPSEG_OK;
}

typedef struct collect_s {
  const char **keys;
  int64_t *vals;
  size_t n;
  char *names; /* cap x 96 bytes: copies of the keys (the private pools' are made per visit) */
  size_t cap;
} collect_t;

static void collect(void *ctx, const char *key, int64_t v) {
  collect_t *c = ctx;
  if (c->n == c->cap) return;
  char *name = c->names + c->n * 96;
  snprintf(name, 96, "%s", key);
  c->keys[c->n] = name;
  c->vals[c->n++] = v;
}

void expseg_stats_foreach(const expseg_allocator *a,
                          void (*fn)(void *ctx, const char *key, int64_t value), void *ctx) {
  if (a == NULL || fn == NULL) return;
  expseg_allocator *m = (expseg_allocator *)a;
  api_lock(m);
  /* values (and the private pools' key names, which change) taken under the lock, fn
   * called outside */
  size_t n = _expseg_stats_key_count() + _expseg_ppool_stat_count(a);
  collect_t c = {malloc(n * sizeof(char *)), malloc(n * sizeof(int64_t)), 0, malloc(n * 96), n};
  if (c.keys != NULL && c.vals != NULL && c.names != NULL) _expseg_stats_visit(a, collect, &c);
  api_unlock(m);
  for (size_t i = 0; i < c.n; i++) fn(ctx, c.keys[i], c.vals[i]);
  free(c.keys);
  free(c.vals);
  free(c.names);
}

void expseg_reset_peak_stats(expseg_allocator *a) {
  if (a == NULL) return;
  api_lock(a);
  if (a->stats.allocated_bytes[STAT_ALL].peak > a->allocated_most)
    a->allocated_most = a->stats.allocated_bytes[STAT_ALL].peak;
  _expseg_stats_reset_peak(&a->stats);
  _expseg_ppool_stats_reset(a, true);
  api_unlock(a);
}

void expseg_reset_accumulated_stats(expseg_allocator *a) {
  if (a == NULL) return;
  api_lock(a);
  _expseg_stats_reset_accumulated(&a->stats, a->drv);
  _expseg_ppool_stats_reset(a, false);
  api_unlock(a);
}

expseg_status expseg_check(const expseg_allocator *a) {
  if (a == NULL) return _expseg_null_allocator("expseg_check");
  expseg_allocator *m = (expseg_allocator *)a;
  api_lock(m);
  expseg_status st = _expseg_check_locked(a);
  api_unlock(m);
  return st;
}
