/* SPDX-License-Identifier: Apache-2.0 */
/* host_pool.h: the pinned host memory pool's structures, shared by host_pool.c (the API
 * and the caching), host_pool_stats.c (statistics keys) and the tests. Design:
 * docs/host_pool.md.
 *
 * Blocks have power-of-two sizes (at least the OS page; above pinned_max_round_threshold_mb
 * or pinned_max_cached_size_mb, the size rounded up to the page). A block is one driver chunk
 * of its own, a slice of the reserve segment, or (exact sizes up to pinned_max_cached_size_mb)
 * a piece of a carve segment, split and merged there (host_carve.c); the others are never
 * split. Free blocks sit in
 * LIFO lists, one per size; a freed block that streams used waits for their events
 * (pending) before it goes back on a list. One mutex guards the pool; driver calls that
 * make or free memory are made without it. */
#ifndef EXPSEG_POOLS_HOST_POOL_H
#define EXPSEG_POOLS_HOST_POOL_H

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { HB_FREE = 0, HB_ALLOCATED = 1, HB_PENDING = 2 };
#define EXPSEG_HOST_CLASSES 64

typedef struct hblock_s hblock_t;

/* A carve segment: one driver chunk that exact-size blocks are cut from (host_carve.c). */
typedef struct hcarve_s {
  expseg_host_chunk_t chunk;
  struct hcarve_s *next;    /* every carve segment of the pool */
} hcarve_t;

struct hblock_s {
  uintptr_t ptr;
  size_t size;              /* a power of two, at least the OS page; or an exact size */
  size_t requested;         /* the caller's size while allocated */
  uint8_t state;            /* HB_* */
  bool in_reserve;          /* a slice of the reserve segment: never given back */
  bool stuck;               /* no event and no wait worked: kept out of use until a wait
                             * for its streams works (empty_cache, a miss's retry) */
  uint32_t event_count;     /* events still outstanding while pending */
  uint32_t n_streams, cap_streams;
  expseg_stream *streams;   /* recorded with expseg_host_record_stream */
  expseg_stream streams_inline[2];
  expseg_host_chunk_t chunk; /* its own driver chunk (not in_reserve, not carved) */
  hcarve_t *carve;          /* the carve segment it was cut from, or NULL */
  hblock_t *seg_prev, *seg_next; /* carved: its neighbours in the segment, address order */
  hblock_t *next_free;      /* free list link */
  hblock_t *prev_all, *next_all;
};

typedef struct hevent_s {
  expseg_vmm_event ev;
  hblock_t *b;
} hevent_t;

/* PyTorch's DurationStat (microseconds). */
typedef struct dur_s {
  int64_t total, max, min, count;
} dur_t;

/* Statistics: X(name) by kind; keys in docs/host_pool.md. */
#define EXPSEG_HOST_STATS(STAT, I64, DUR)                                                   \
  STAT(allocation) STAT(allocated_bytes) STAT(segment) STAT(reserved_bytes)                \
  I64(num_host_alloc) I64(num_host_free) DUR(host_alloc_time) DUR(host_free_time)          \
  I64(hits) I64(misses) I64(reserve_allocs) STAT(cached_bytes) STAT(pending_blocks)        \
  I64(pending_events) I64(locked_bytes) I64(unlocked_bytes) I64(placed_bytes)             \
  I64(registered_segments) I64(created_segments) I64(fault_threads_started)              \
  I64(reserve_segment_bytes) I64(reserve_segment_used_bytes) I64(background_passes)       \
  I64(stream_syncs) I64(stuck_blocks) I64(numa_node) I64(register_threads)

typedef struct host_stats_s {
#define EXPSEG_HS_STAT_(n) stat_t n;
#define EXPSEG_HS_I64_(n) int64_t n;
#define EXPSEG_HS_DUR_(n) dur_t n;
  EXPSEG_HOST_STATS(EXPSEG_HS_STAT_, EXPSEG_HS_I64_, EXPSEG_HS_DUR_)
#undef EXPSEG_HS_STAT_
#undef EXPSEG_HS_I64_
#undef EXPSEG_HS_DUR_
} host_stats_t;

struct expseg_host_pool {
  pthread_mutex_t lock;
  expseg_vmm_t *drv;
  expseg_config_t cfg;
  int node;                 /* NUMA node of every chunk; -1 = the OS's choice */
  size_t page;              /* OS page */
  hblock_t *free_list[EXPSEG_HOST_CLASSES]; /* by log2(size) */
  hblock_t *carve_free;     /* free carved blocks (merged with free neighbours) */
  hcarve_t *carve_segs;     /* every carve segment */
  size_t carve_reserved;    /* their bytes */
  hblock_t *all;            /* every block */
  ptrmap_t live;            /* allocated blocks (values are hblock_t*, stored cast) */
  hevent_t *events;         /* outstanding events, oldest first */
  size_t n_events, cap_events;
  expseg_vmm_event *ev_pool;
  size_t n_ev_pool, cap_ev_pool;
  expseg_host_chunk_t reserve; /* reserve.ptr NULL = none */
  size_t reserve_used;
  bool warned_query;
  bool release_due;         /* a block above pinned_max_cached_size_mb went on a free list */
  /* background event processing (pinned_use_background_threads) */
  bool bg_running, bg_stop;
  pthread_t bg;
  pthread_cond_t cv;
  host_stats_t st;
  struct history_s *hist;   /* expseg_host_record_history; NULL = not recording */
  expseg_host_pool *next_pool; /* every live pool (host_pool.c's registry) */
};

/* ---- host_pool.c, for host_carve.c and host_pool_stats.c ---- */
/* The pool's lock as the entry points take it (warnings deferred until it is let go). */
void _expseg_host_lock(expseg_host_pool *h);
void _expseg_host_unlock(expseg_host_pool *h);
/* The error of an entry point given a NULL pool. */
expseg_status _expseg_host_no_pool(const char *fn);
void _expseg_host_link_block(expseg_host_pool *h, hblock_t *b);
void _expseg_host_unlink_block(expseg_host_pool *h, hblock_t *b);
expseg_status _expseg_host_chunk_free(expseg_host_pool *h, const expseg_host_chunk_t *c,
                                      uint64_t *us);
void _expseg_host_note_chunk_free(expseg_host_pool *h, const expseg_host_chunk_t *c, uint64_t us);

/* ---- host_carve.c (lock held) ---- */
/* The size of a new carve segment for a block of cls bytes. */
size_t _expseg_host_carve_segment_size(const expseg_host_pool *h, size_t cls);
/* A free carved block of cls bytes cut from the best-fitting free one, or NULL. */
hblock_t *_expseg_host_carve_take(expseg_host_pool *h, size_t cls);
/* A new carve segment (its chunk made): the block of cls bytes at its start, or NULL
 * (no host memory; the segment is listed all the same). */
hblock_t *_expseg_host_carve_new(expseg_host_pool *h, hcarve_t *seg, size_t cls);
/* A carved block that became free (state HB_FREE, stats done): merged and listed. */
void _expseg_host_carve_put(expseg_host_pool *h, hblock_t *b);
/* Gives back every carve segment whose memory is all free (lock dropped around the driver
 * calls); returns the bytes given back. */
size_t _expseg_host_carve_release(expseg_host_pool *h);

/* History hooks (lock held): one branch when not recording. */
#define EXPSEG_HOST_HIST(h, action, addr, size)                                             \
  do {                                                                                      \
    if (__builtin_expect((h)->hist != NULL, 0))                                             \
      _expseg_hist_push((h)->hist, (action), (uint64_t)(addr), (uint64_t)(size), 0);        \
  } while (0)

/* ---- host_pool_stats.c ---- */
void _expseg_dur_add(dur_t *d, int64_t us);

/* expseg_host_create over an already-open driver (tests: the fault wrapper). Takes
 * ownership of drv, also on failure. */
expseg_status _expseg_host_create_with_driver(expseg_vmm_t *drv, const char *config,
                                              expseg_host_pool **out);
/* Tests: the pool's driver (to hold its streams). */
expseg_vmm_t *_expseg_host_pool_driver(expseg_host_pool *h);

#ifdef __cplusplus
}
#endif
#endif
