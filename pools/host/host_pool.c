/* SPDX-License-Identifier: Apache-2.0 */
/* host_pool.c: the pinned host memory pool (public expseg_host_* API). Design and choices:
 * docs/host_pool.md; structures: host_pool.h.
 *
 * malloc: size -> power-of-two class (at least the OS page; an exact page-rounded size above
 * pinned_max_round_threshold_mb or pinned_max_cached_size_mb) -> process completed events
 * (on the caller's thread, or left to the background thread with
 * pinned_use_background_threads, which the caller then helps only on a miss) -> pop the
 * class's free list -> else slice the reserve segment (pinned_reserve_segment_size_mb) ->
 * else a new chunk from the driver (lock dropped), placed on the pool's NUMA node,
 * pre-faulted by pinned_num_register_threads threads on the register path
 * (pinned_use_cuda_host_register); on out-of-memory the cache is emptied and the chunk
 * asked for once more.
 * free: the block leaves the live map; with no recorded streams it goes straight back on
 * its free list; else one event per stream is recorded and the block stays pending until
 * all have completed (no event: the stream is synchronized; not even that: the block is
 * kept out of use, and waited for again by empty_cache and by a miss that ran out of
 * memory, as the device allocator retries its orphans). */
#include "error.h"
#include "host_pool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

expseg_status _expseg_host_no_pool(const char *fn) {
  return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "%s: the host pool is NULL", fn);
}

/* The pool's lock as the entry points take it: warnings raised inside wait until it is let
 * go (vmm/error.c), so a log sink never runs under an expseg lock. release_cached drops and
 * retakes it with pthread_mutex_* directly, inside an entry point. */
void _expseg_host_lock(expseg_host_pool *h) {
  _expseg_log_defer(true);
  pthread_mutex_lock(&h->lock);
}

void _expseg_host_unlock(expseg_host_pool *h) {
  pthread_mutex_unlock(&h->lock);
  _expseg_log_defer(false);
}

/* The block size of a request (size <= EXPSEG_MAX_REQUEST): above
 * pinned_max_round_threshold_mb or pinned_max_cached_size_mb (PyTorch 2.13), the size
 * rounded up to the page; else a power of two >= size and >= the page. */
static size_t size_class(const expseg_host_pool *h, size_t size) {
  if (size > h->cfg.pinned_max_round_threshold || size > h->cfg.pinned_max_cached_size)
    return (size + h->page - 1) / h->page * h->page;
  size_t c = h->page;
  while (c < size) c <<= 1;
  return c;
}

void _expseg_host_link_block(expseg_host_pool *h, hblock_t *b) {
  b->prev_all = NULL;
  b->next_all = h->all;
  if (h->all) h->all->prev_all = b;
  h->all = b;
}

void _expseg_host_unlink_block(expseg_host_pool *h, hblock_t *b) {
  if (b->prev_all) b->prev_all->next_all = b->next_all;
  else h->all = b->next_all;
  if (b->next_all) b->next_all->prev_all = b->prev_all;
}

static void block_delete(hblock_t *b) {
  if (b->streams != b->streams_inline) free(b->streams);
  free(b);
}

static void push_free(expseg_host_pool *h, hblock_t *b) {
  if (b->state != HB_FREE) EXPSEG_HOST_HIST(h, HIST_FREE_COMPLETED, b->ptr, b->requested);
  b->state = HB_FREE;
  b->n_streams = 0;
  b->requested = 0;
  _expseg_stat_add(&h->st.allocation, -1);
  _expseg_stat_add(&h->st.allocated_bytes, -(int64_t)b->size);
  _expseg_stat_add(&h->st.cached_bytes, (int64_t)b->size);
  if (b->carve) {
    _expseg_host_carve_put(h, b); /* may merge b away */
    return;
  }
  unsigned i = _expseg_log2_floor(b->size);
  b->next_free = h->free_list[i];
  h->free_list[i] = b;
  if (b->size > h->cfg.pinned_max_cached_size && !b->in_reserve) h->release_due = true;
}

/* A cached block of exactly cls bytes (a list holds the power of two 2^i and the exact
 * sizes between 2^i and 2^(i+1)), or NULL. */
static hblock_t *pop_free(expseg_host_pool *h, size_t cls) {
  hblock_t **pp = &h->free_list[_expseg_log2_floor(cls)];
  while (*pp && (*pp)->size != cls) pp = &(*pp)->next_free;
  hblock_t *b = *pp;
  if (!b) return NULL;
  *pp = b->next_free;
  b->next_free = NULL;
  _expseg_stat_add(&h->st.cached_bytes, -(int64_t)b->size);
  return b;
}

/* ---- events ---- */

static expseg_status event_get(expseg_host_pool *h, expseg_vmm_event *ev) {
  if (h->n_ev_pool) {
    *ev = h->ev_pool[--h->n_ev_pool];
    return EXPSEG_OK;
  }
  return _expseg_vmm_event_create(h->drv, ev);
}

static void event_put(expseg_host_pool *h, expseg_vmm_event ev) {
  if (h->n_ev_pool == h->cap_ev_pool) {
    size_t cap = h->cap_ev_pool ? 2 * h->cap_ev_pool : 16;
    expseg_vmm_event *n = realloc(h->ev_pool, cap * sizeof *n);
    if (!n) {
      (void)_expseg_vmm_event_destroy(h->drv, ev);
      return;
    }
    h->ev_pool = n;
    h->cap_ev_pool = cap;
  }
  h->ev_pool[h->n_ev_pool++] = ev;
}

static bool queue_event(expseg_host_pool *h, expseg_vmm_event ev, hblock_t *b) {
  if (h->n_events == h->cap_events) {
    size_t cap = h->cap_events ? 2 * h->cap_events : 16;
    hevent_t *n = realloc(h->events, cap * sizeof *n);
    if (!n) return false;
    h->events = n;
    h->cap_events = cap;
  }
  h->events[h->n_events++] = (hevent_t){ev, b};
  h->st.pending_events = (int64_t)h->n_events;
  return true;
}

/* Queries every outstanding event (oldest first); blocks whose last event completed go
 * back on their free lists. Lock held. */
static void process_events(expseg_host_pool *h) {
  size_t keep = 0;
  for (size_t i = 0; i < h->n_events; i++) {
    hevent_t e = h->events[i];
    bool done = false;
    if (_expseg_vmm_event_query(h->drv, e.ev, &done) != EXPSEG_OK) {
      if (!h->warned_query) {
        h->warned_query = true;
        _expseg_warn("host pool: event query failed (%s); the block waits", expseg_last_error());
      }
      done = false;
    }
    if (!done) {
      h->events[keep++] = e;
      continue;
    }
    event_put(h, e.ev);
    if (--e.b->event_count == 0 && !e.b->stuck) {
      _expseg_stat_add(&h->st.pending_blocks, -1);
      push_free(h, e.b);
    }
  }
  h->n_events = keep;
  h->st.pending_events = (int64_t)keep;
}

/* Stuck blocks whose streams can all be waited for now go back on their free lists (their
 * remaining events, if any, still complete first). Blocking; lock held. */
static void retry_stuck(expseg_host_pool *h) {
  if (h->st.stuck_blocks == 0) return;
  for (hblock_t *b = h->all; b; b = b->next_all) {
    if (!b->stuck) continue;
    bool ok = true;
    for (uint32_t i = 0; i < b->n_streams && ok; i++) {
      h->st.stream_syncs++;
      ok = _expseg_vmm_stream_synchronize(h->drv, b->streams[i]) == EXPSEG_OK;
    }
    if (!ok) continue;
    b->stuck = false;
    h->st.stuck_blocks--;
    if (b->event_count == 0) {
      _expseg_stat_add(&h->st.pending_blocks, -1);
      push_free(h, b);
    }
  }
}

static void release_due(expseg_host_pool *h);

/* ---- the background thread ---- */

enum { BG_POLL_NS = 100 * 1000 }; /* PyTorch's 100 us */

static void *bg_main(void *arg) {
  expseg_host_pool *h = arg;
  for (;;) {
    _expseg_host_lock(h); /* one pass per lock: its warnings reach the sink at each unlock */
    if (h->bg_stop) {
      _expseg_host_unlock(h);
      return NULL;
    }
    if (h->n_events == 0) {
      pthread_cond_wait(&h->cv, &h->lock);
    } else {
      process_events(h);
      release_due(h);
      h->st.background_passes++;
      uint64_t until = _expseg_clock_ns() + BG_POLL_NS; /* the cv waits on CLOCK_MONOTONIC */
      struct timespec ts = {.tv_sec = (time_t)(until / 1000000000u),
                            .tv_nsec = (long)(until % 1000000000u)};
      pthread_cond_timedwait(&h->cv, &h->lock, &ts);
    }
    _expseg_host_unlock(h);
  }
}

/* ---- driver chunks ---- */

static void note_chunk(expseg_host_pool *h, const expseg_host_chunk_t *c, uint64_t us) {
  host_stats_t *s = &h->st;
  s->num_host_alloc++;
  _expseg_dur_add(&s->host_alloc_time, (int64_t)us);
  _expseg_stat_add(&s->segment, 1);
  _expseg_stat_add(&s->reserved_bytes, (int64_t)c->size);
  if (c->locked) s->locked_bytes += (int64_t)c->size;
  else s->unlocked_bytes += (int64_t)c->size;
  if (c->placed) s->placed_bytes += (int64_t)c->size;
  if (c->method == EXPSEG_HOST_REGISTERED) s->registered_segments++;
  else s->created_segments++;
  s->fault_threads_started += c->threads_used;
  EXPSEG_HOST_HIST(h, HIST_SEGMENT_ALLOC, (uintptr_t)c->ptr, c->size);
}

/* A new chunk of `size` bytes, lock not held. Stats are the caller's (note_chunk). */
static expseg_status chunk_new(expseg_host_pool *h, size_t size, expseg_host_chunk_t *c,
                               uint64_t *us) {
  memset(c, 0, sizeof *c);
  c->size = size;
  c->numa_node = h->node;
  c->use_register = h->cfg.pinned_use_cuda_host_register;
  c->fault_threads = h->cfg.pinned_num_register_threads;
  c->no_huge = !h->cfg.pinned_huge_pages;
  uint64_t t0 = _expseg_vmm_now_ns(h->drv);
  expseg_status s = _expseg_vmm_host_alloc(h->drv, c);
  *us = (_expseg_vmm_now_ns(h->drv) - t0) / 1000;
  return s;
}

/* Gives a chunk back; lock not held. Returns the microseconds it took. */
expseg_status _expseg_host_chunk_free(expseg_host_pool *h, const expseg_host_chunk_t *c,
                                      uint64_t *us) {
  uint64_t t0 = _expseg_vmm_now_ns(h->drv);
  expseg_status s = _expseg_vmm_host_free(h->drv, c);
  *us = (_expseg_vmm_now_ns(h->drv) - t0) / 1000;
  return s;
}

void _expseg_host_note_chunk_free(expseg_host_pool *h, const expseg_host_chunk_t *c, uint64_t us) {
  host_stats_t *s = &h->st;
  s->num_host_free++;
  _expseg_dur_add(&s->host_free_time, (int64_t)us);
  _expseg_stat_add(&s->segment, -1);
  _expseg_stat_add(&s->reserved_bytes, -(int64_t)c->size);
  if (c->locked) s->locked_bytes -= (int64_t)c->size;
  else s->unlocked_bytes -= (int64_t)c->size;
  if (c->placed) s->placed_bytes -= (int64_t)c->size;
  EXPSEG_HOST_HIST(h, HIST_SEGMENT_FREE, (uintptr_t)c->ptr, c->size);
}

/* Frees the cached blocks larger than `above` that own a chunk (reserve slices stay). Lock
 * held on entry and exit; dropped around the driver calls. Returns the bytes given back. */
static size_t release_cached(expseg_host_pool *h, size_t above) {
  size_t freed = above == 0 ? _expseg_host_carve_release(h) : 0; /* carved: <= the cached size */
  hblock_t *gone = NULL;
  for (unsigned i = 0; i < EXPSEG_HOST_CLASSES; i++) {
    hblock_t **pp = &h->free_list[i];
    while (*pp) {
      hblock_t *b = *pp;
      if (b->in_reserve || b->size <= above) {
        pp = &b->next_free;
        continue;
      }
      *pp = b->next_free;
      /* still counted in cached_bytes, and walked (snapshots), until the give-back succeeds
       * (a failed one keeps it: counting it out and in again would count it twice in
       * .allocated and .freed) */
      b->next_free = gone;
      gone = b;
    }
  }
  if (!gone) return freed;
  pthread_mutex_unlock(&h->lock);
  hblock_t *kept = NULL;
  for (hblock_t *b = gone, *next; b; b = next) {
    next = b->next_free;
    uint64_t us = 0;
    expseg_status s = _expseg_host_chunk_free(h, &b->chunk, &us);
    pthread_mutex_lock(&h->lock);
    if (s == EXPSEG_OK) {
      _expseg_host_unlink_block(h, b);
      _expseg_stat_add(&h->st.cached_bytes, -(int64_t)b->size);
      _expseg_host_note_chunk_free(h, &b->chunk, us);
      freed += b->size;
      pthread_mutex_unlock(&h->lock);
      block_delete(b);
    } else {
      pthread_mutex_unlock(&h->lock);
      _expseg_warn("host pool: giving back %p failed (%s); it stays cached", b->chunk.ptr,
                   expseg_last_error());
      b->next_free = kept;
      kept = b;
    }
  }
  pthread_mutex_lock(&h->lock);
  for (hblock_t *b = kept, *next; b; b = next) {
    next = b->next_free;
    unsigned i = _expseg_log2_floor(b->size);
    b->next_free = h->free_list[i];
    h->free_list[i] = b;
  }
  return freed;
}

/* pinned_max_cached_size_mb: blocks above it that became free since the last call are given
 * back instead of cached. Lock held; dropped around the driver calls. */
static void release_due(expseg_host_pool *h) {
  if (!h->release_due) return;
  h->release_due = false;
  release_cached(h, h->cfg.pinned_max_cached_size);
}

/* ---- every live pool, for the device allocator's messages ---- */

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static expseg_host_pool *registry;

static void registry_add(expseg_host_pool *h) {
  pthread_mutex_lock(&registry_mu);
  h->next_pool = registry;
  registry = h;
  pthread_mutex_unlock(&registry_mu);
}

static void registry_remove(expseg_host_pool *h) {
  pthread_mutex_lock(&registry_mu);
  expseg_host_pool **pp = &registry;
  while (*pp && *pp != h) pp = &(*pp)->next_pool;
  if (*pp) *pp = h->next_pool;
  pthread_mutex_unlock(&registry_mu);
}

static const hblock_t *owner_of(const expseg_host_pool *h, uintptr_t p);

/* Whether a live pool other than skip covers ptr. The caller holds no pool's lock. */
static bool registry_owns(const expseg_host_pool *skip, const void *ptr) {
  bool found = false;
  pthread_mutex_lock(&registry_mu);
  for (expseg_host_pool *h = registry; h && !found; h = h->next_pool) {
    if (h == skip) continue;
    pthread_mutex_lock(&h->lock);
    found = owner_of(h, (uintptr_t)ptr) != NULL;
    pthread_mutex_unlock(&h->lock);
  }
  pthread_mutex_unlock(&registry_mu);
  return found;
}

const char *_expseg_host_pool_hint(const void *ptr) {
  return registry_owns(NULL, ptr) ? "; it is pinned host memory of a host pool: give it back "
                                    "with expseg_host_free" : "";
}

/* ---- create / destroy ---- */

expseg_vmm_t *_expseg_host_pool_driver(expseg_host_pool *h) { return h ? h->drv : NULL; }

expseg_status expseg_host_create(const char *driver, int device, const char *config,
                                 expseg_host_pool **out) {
  if (!out) return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_host_create: out is NULL");
  *out = NULL;
  expseg_vmm_t *drv = NULL;
  expseg_status s = _expseg_vmm_open(driver, device, &drv);
  if (s != EXPSEG_OK) return s;
  return _expseg_host_create_with_driver(drv, config, out);
}

expseg_status _expseg_host_create_with_driver(expseg_vmm_t *drv, const char *config,
                                              expseg_host_pool **out) {
  *out = NULL;
  expseg_config_source_t src;
  expseg_config_t cfg;
  if (_expseg_config_load(config, "expseg_host_create", &src, &cfg) != EXPSEG_OK) {
    _expseg_vmm_close(drv);
    return EXPSEG_ERR_CONFIG;
  }
  expseg_status s = EXPSEG_OK;
  expseg_host_pool *h = calloc(1, sizeof *h);
  if (!h || !_expseg_ptrmap_init(&h->live)) {
    free(h);
    _expseg_vmm_close(drv);
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_host_create: out of host memory");
  }
  pthread_mutex_init(&h->lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&h->cv, &ca);
  pthread_condattr_destroy(&ca);
  h->drv = drv;
  h->cfg = cfg;
  h->page = (size_t)sysconf(_SC_PAGESIZE);
  h->node = _expseg_vmm_host_numa(drv);
  h->st.numa_node = h->node;
  h->st.register_threads = cfg.pinned_use_cuda_host_register ? cfg.pinned_num_register_threads : 0;
  if (cfg.pinned_reserve_segment_size > 0) {
    size_t size = cfg.pinned_reserve_segment_size;
    size = size > SIZE_MAX - h->page ? SIZE_MAX : (size + h->page - 1) / h->page * h->page;
    uint64_t us = 0;
    s = chunk_new(h, size, &h->reserve, &us);
    if (s != EXPSEG_OK) {
      _expseg_error_prefix("expseg_host_create: pinned_reserve_segment_size_mb");
      expseg_host_destroy(h);
      return s;
    }
    note_chunk(h, &h->reserve, us);
    h->st.reserve_segment_bytes = (int64_t)size;
  }
  if (cfg.pinned_use_background_threads) {
    if (pthread_create(&h->bg, NULL, bg_main, h) != 0) {
      expseg_host_destroy(h);
      return _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY,
                               "expseg_host_create: cannot start the background thread "
                               "(pinned_use_background_threads:True): %s", strerror(errno));
    }
    h->bg_running = true;
  }
  registry_add(h);
  *out = h;
  return EXPSEG_OK;
}

void expseg_host_destroy(expseg_host_pool *h) {
  if (!h) return;
  registry_remove(h);
  if (h->bg_running) {
    _expseg_host_lock(h);
    h->bg_stop = true;
    pthread_cond_signal(&h->cv);
    _expseg_host_unlock(h);
    pthread_join(h->bg, NULL);
  }
  for (size_t i = 0; i < h->n_events; i++) (void)_expseg_vmm_event_destroy(h->drv, h->events[i].ev);
  for (size_t i = 0; i < h->n_ev_pool; i++) (void)_expseg_vmm_event_destroy(h->drv, h->ev_pool[i]);
  for (hblock_t *b = h->all, *next; b; b = next) {
    next = b->next_all;
    if (!b->in_reserve && !b->carve) (void)_expseg_vmm_host_free(h->drv, &b->chunk);
    block_delete(b);
  }
  for (hcarve_t *c = h->carve_segs, *next; c; c = next) {
    next = c->next;
    (void)_expseg_vmm_host_free(h->drv, &c->chunk);
    free(c);
  }
  if (h->reserve.ptr) (void)_expseg_vmm_host_free(h->drv, &h->reserve);
  _expseg_hist_free(h->hist);
  free(h->events);
  free(h->ev_pool);
  _expseg_ptrmap_destroy(&h->live);
  _expseg_vmm_close(h->drv);
  pthread_cond_destroy(&h->cv);
  pthread_mutex_destroy(&h->lock);
  free(h);
}

/* ---- malloc / free ---- */

static hblock_t *block_new(size_t cls) {
  hblock_t *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->size = cls;
  b->streams = b->streams_inline;
  b->cap_streams = 2;
  return b;
}

/* A slice of the reserve segment, or NULL. Lock held. */
static hblock_t *from_reserve(expseg_host_pool *h, size_t cls) {
  if (!h->reserve.ptr || cls > h->reserve.size - h->reserve_used) return NULL;
  hblock_t *b = block_new(cls);
  if (!b) return NULL;
  b->ptr = (uintptr_t)h->reserve.ptr + h->reserve_used;
  b->in_reserve = true;
  h->reserve_used += cls;
  h->st.reserve_segment_used_bytes = (int64_t)h->reserve_used;
  h->st.reserve_allocs++;
  _expseg_host_link_block(h, b);
  return b;
}

/* Hands b out (live map, state, stats) and drops the lock, which the caller holds. With
 * no host memory for the map, b goes back on its free list. */
static expseg_status hand_out(expseg_host_pool *h, hblock_t *b, size_t size, void **out) {
  bool ok = _expseg_ptrmap_put(&h->live, b->ptr, (block_t *)(void *)b);
  _expseg_stat_add(&h->st.allocation, 1); /* push_free takes them off again */
  _expseg_stat_add(&h->st.allocated_bytes, (int64_t)b->size);
  if (ok) {
    b->state = HB_ALLOCATED;
    b->requested = size;
    *out = (void *)b->ptr;
    EXPSEG_HOST_HIST(h, HIST_ALLOC, b->ptr, size);
  } else {
    push_free(h, b);
  }
  _expseg_host_unlock(h);
  if (!ok)
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                             "expseg_host_malloc: out of host memory for the pointer map");
  return EXPSEG_OK;
}

/* A request the driver could not serve, even after the cache went back (lock not held). */
static void note_oom(expseg_host_pool *h, size_t cls) {
  _expseg_host_lock(h);
  EXPSEG_HOST_HIST(h, HIST_OOM, 0, cls);
  _expseg_host_unlock(h);
}

/* The driver ran out of memory for a new chunk (lock not held): completed and stuck blocks
 * go back on their lists and every cached chunk is given back; returns the bytes given back.
 * The driver's out-of-memory message stays this thread's error: the waits and give-backs
 * made here set their own messages, which must not become the caller's. */
static size_t cache_back_after_oom(expseg_host_pool *h) {
  char why[1024]; /* vmm/error.c keeps at most 1024 bytes */
  snprintf(why, sizeof why, "%s", expseg_last_error());
  _expseg_host_lock(h);
  process_events(h);
  retry_stuck(h);
  size_t freed = release_cached(h, 0);
  _expseg_host_unlock(h);
  _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY, "%s", why);
  return freed;
}

/* A miss of a carved size: a new carve segment (lock held on entry, dropped around the
 * driver; on out-of-memory the cache goes back and one segment of exactly cls is asked). */
static expseg_status carve_miss(expseg_host_pool *h, size_t size, size_t cls, void **out) {
  _expseg_host_carve_release(h); /* segments all free: too small for cls, or passed over (strict) */
  size_t want = _expseg_host_carve_segment_size(h, cls);
  _expseg_host_unlock(h);
  hcarve_t *seg = calloc(1, sizeof *seg);
  if (!seg) return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_host_malloc: out of host memory");
  uint64_t us = 0;
  expseg_status s = chunk_new(h, want, &seg->chunk, &us);
  if (s == EXPSEG_ERR_OUT_OF_MEMORY) {
    size_t freed = cache_back_after_oom(h);
    if (freed || want > cls) s = chunk_new(h, cls, &seg->chunk, &us);
  }
  if (s != EXPSEG_OK) {
    char b1[32], b2[32];
    _expseg_error_prefix("expseg_host_malloc(size=%s, block %s)", _expseg_format_size(b1, size),
                         _expseg_format_size(b2, cls));
    free(seg);
    if (s == EXPSEG_ERR_OUT_OF_MEMORY) note_oom(h, cls);
    return s;
  }
  _expseg_host_lock(h);
  note_chunk(h, &seg->chunk, us);
  hblock_t *b = _expseg_host_carve_new(h, seg, cls);
  if (!b) {
    _expseg_host_unlock(h);
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_host_malloc: out of host memory");
  }
  return hand_out(h, b, size, out);
}

expseg_status expseg_host_malloc(expseg_host_pool *h, size_t size, void **out) {
  if (!h) return _expseg_host_no_pool("expseg_host_malloc");
  if (!out) return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_host_malloc: out is NULL");
  *out = NULL;
  if (size == 0) return EXPSEG_OK;
  if (size > EXPSEG_MAX_REQUEST)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_host_malloc(size=%zu): larger than 2^60 bytes, the most a "
                             "request may ask (rounding it up would overflow)",
                             size);
  size_t cls = size_class(h, size);
  /* exact blocks that will be cached are carved; those above the cached size get a chunk
   * of their own, which goes back at free */
  bool carve = size > h->cfg.pinned_max_round_threshold && size <= h->cfg.pinned_max_cached_size;
  _expseg_host_lock(h);
  if (!h->bg_running) process_events(h);
  release_due(h);
  hblock_t *b = carve ? _expseg_host_carve_take(h, cls) : pop_free(h, cls);
  if (!b && h->bg_running && h->n_events) { /* a miss: help the background thread once */
    process_events(h);
    b = carve ? _expseg_host_carve_take(h, cls) : pop_free(h, cls);
  }
  if (!b && carve && h->reserve.ptr) b = pop_free(h, cls); /* a reserve slice of this size */
  if (b) h->st.hits++;
  else b = from_reserve(h, cls); /* the reserve segment is sliced before the driver is asked */
  if (b) return hand_out(h, b, size, out);
  h->st.misses++;
  if (carve) return carve_miss(h, size, cls, out);
  _expseg_host_unlock(h);
  b = block_new(cls);
  if (!b) return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_host_malloc: out of host memory");
  uint64_t us = 0;
  expseg_status s = chunk_new(h, cls, &b->chunk, &us);
  if (s == EXPSEG_ERR_OUT_OF_MEMORY) { /* give the cache back and try once more */
    if (cache_back_after_oom(h)) s = chunk_new(h, cls, &b->chunk, &us);
  }
  if (s != EXPSEG_OK) {
    char b1[32], b2[32];
    _expseg_error_prefix("expseg_host_malloc(size=%s, block %s)", _expseg_format_size(b1, size),
                         _expseg_format_size(b2, cls));
    block_delete(b);
    if (s == EXPSEG_ERR_OUT_OF_MEMORY) note_oom(h, cls);
    return s;
  }
  b->ptr = (uintptr_t)b->chunk.ptr;
  _expseg_host_lock(h);
  note_chunk(h, &b->chunk, us);
  _expseg_host_link_block(h, b);
  return hand_out(h, b, size, out);
}

/* The block of this pool that holds ptr (any state), for messages. Lock held. */
static const hblock_t *owner_of(const expseg_host_pool *h, uintptr_t p) {
  for (const hblock_t *b = h->all; b; b = b->next_all)
    if (p - b->ptr < b->size) return b;
  return NULL;
}

/* Why h refused ptr; EXPSEG_OK when no block of h covers it (then foreign(), unlocked). */
static expseg_status not_live(expseg_host_pool *h, const char *fn, void *ptr) {
  const hblock_t *o = owner_of(h, (uintptr_t)ptr);
  if (!o) return EXPSEG_OK;
  if (o->ptr == (uintptr_t)ptr)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s(%p): this block of the host pool was already freed", fn, ptr);
  if (o->state != HB_ALLOCATED) /* a freed carved block merges into its neighbours */
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s(%p): this memory of the host pool is free (already freed; a "
                             "freed block may merge with its free neighbours, here into the "
                             "free block at 0x%llx)",
                             fn, ptr, (unsigned long long)o->ptr);
  return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "%s(%p): points inside the host pool's "
                           "block at 0x%llx; pass the pointer expseg_host_malloc returned", fn,
                           ptr, (unsigned long long)o->ptr);
}

/* ptr is not h's: where it goes (another live pool recognised; no list of allocators). */
static expseg_status foreign(const expseg_host_pool *h, const char *fn, void *ptr, bool freeing) {
  return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "%s(%p): not a pointer this host pool "
      "handed out; nothing was %s. %s", fn, ptr, freeing ? "freed" : "recorded",
      registry_owns(h, ptr) ? (freeing ? "It is pinned memory of another host pool: give it "
      "back with expseg_host_free on that pool" : "It is pinned memory of another host pool: "
      "record the stream with expseg_host_record_stream on that pool")
      : freeing ? "Device memory from expseg_malloc goes back with expseg_free; memory from "
      "malloc or cudaHostAlloc with free or cudaFreeHost"
      : "For device memory from expseg_malloc, use expseg_record_stream");
}

/* Records one event per stream the block was used on. Returns the events recorded; on a
 * failure the stream is synchronized instead (and the block marked stuck if that fails). */
static uint32_t record_events(expseg_host_pool *h, hblock_t *b) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < b->n_streams; i++) {
    expseg_vmm_event ev = 0;
    expseg_status s = event_get(h, &ev);
    if (s == EXPSEG_OK) {
      s = _expseg_vmm_event_record(h->drv, ev, b->streams[i]);
      if (s == EXPSEG_OK && !queue_event(h, ev, b)) s = EXPSEG_ERR_OUT_OF_MEMORY;
      if (s != EXPSEG_OK) event_put(h, ev);
    }
    if (s == EXPSEG_OK) {
      n++;
      continue;
    }
    h->st.stream_syncs++;
    if (_expseg_vmm_stream_synchronize(h->drv, b->streams[i]) != EXPSEG_OK) {
      if (!b->stuck) h->st.stuck_blocks++;
      b->stuck = true;
      _expseg_warn("host pool: no event and no wait worked for block %p on stream 0x%llx (%s); "
                   "it is kept out of use",
                   (void *)b->ptr, (unsigned long long)b->streams[i], expseg_last_error());
    }
  }
  return n;
}

expseg_status expseg_host_free(expseg_host_pool *h, void *ptr) {
  if (!h) return _expseg_host_no_pool("expseg_host_free");
  if (!ptr) return EXPSEG_OK;
  _expseg_host_lock(h);
  hblock_t *b = (hblock_t *)(void *)_expseg_ptrmap_take(&h->live, (uintptr_t)ptr);
  if (!b) {
    expseg_status s = not_live(h, "expseg_host_free", ptr);
    _expseg_host_unlock(h);
    return s != EXPSEG_OK ? s : foreign(h, "expseg_host_free", ptr, true);
  }
  EXPSEG_HOST_HIST(h, HIST_FREE_REQUESTED, b->ptr, b->requested);
  b->event_count = b->n_streams ? record_events(h, b) : 0;
  if (b->event_count > 0 || b->stuck) {
    b->state = HB_PENDING;
    _expseg_stat_add(&h->st.pending_blocks, 1);
    if (h->bg_running) pthread_cond_signal(&h->cv);
  } else {
    push_free(h, b);
  }
  release_due(h);
  _expseg_host_unlock(h);
  return EXPSEG_OK;
}

expseg_status expseg_host_record_stream(expseg_host_pool *h, void *ptr, expseg_stream stream) {
  if (!h) return _expseg_host_no_pool("expseg_host_record_stream");
  if (!ptr) return EXPSEG_OK;
  _expseg_host_lock(h);
  hblock_t *b = (hblock_t *)(void *)_expseg_ptrmap_get(&h->live, (uintptr_t)ptr);
  expseg_status s = EXPSEG_OK;
  if (!b) {
    s = not_live(h, "expseg_host_record_stream", ptr);
  } else {
    uint32_t i = 0;
    while (i < b->n_streams && b->streams[i] != stream) i++;
    if (i == b->n_streams) {
      if (b->n_streams == b->cap_streams) {
        uint32_t cap = 2 * b->cap_streams;
        expseg_stream *n = malloc(cap * sizeof *n);
        if (n) {
          memcpy(n, b->streams, b->n_streams * sizeof *n);
          if (b->streams != b->streams_inline) free(b->streams);
          b->streams = n;
          b->cap_streams = cap;
        }
      }
      if (b->n_streams < b->cap_streams) b->streams[b->n_streams++] = stream;
      else s = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                                 "expseg_host_record_stream: out of host memory");
    }
  }
  _expseg_host_unlock(h);
  return b || s != EXPSEG_OK ? s : foreign(h, "expseg_host_record_stream", ptr, false);
}

expseg_status expseg_host_empty_cache(expseg_host_pool *h) {
  if (!h) return _expseg_host_no_pool("expseg_host_empty_cache");
  _expseg_host_lock(h);
  process_events(h);
  retry_stuck(h);
  release_cached(h, 0);
  _expseg_host_unlock(h);
  return EXPSEG_OK;
}

int expseg_host_numa_node(const expseg_host_pool *h) { return h ? h->node : -1; }

expseg_status expseg_host_record_history(expseg_host_pool *h, bool enabled, size_t max_entries,
                                         unsigned flags) {
  if (!h) return _expseg_host_no_pool("expseg_host_record_history");
  expseg_status st = _expseg_hist_check("expseg_host_record_history", enabled, max_entries, flags);
  if (st != EXPSEG_OK) return st;
  history_t *n = NULL;
  if (enabled && (n = _expseg_hist_new(max_entries, flags)) == NULL)
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                             "expseg_host_record_history: out of host memory");
  _expseg_host_lock(h);
  history_t *old = h->hist;
  _expseg_hist_keep(n, old, flags);
  h->hist = n; /* disabling clears the history, as the device allocator's */
  _expseg_host_unlock(h);
  _expseg_hist_free(old);
  return EXPSEG_OK;
}
