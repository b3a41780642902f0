/* SPDX-License-Identifier: Apache-2.0 */
/* internal.h: the allocator core's data structures and the functions shared by pools/ files.
 *
 * Memory is held in segments. A classic segment is one physical chunk mapped into its own
 * reservation. An expandable segment is a reservation of many pages (of its page size,
 * in physical chunks of one or more pages: pages.c) of which any subset is mapped. Blocks tile every
 * segment with no gap: allocated, pending-free (freed, waiting on other streams' events),
 * free mapped, or (expandable only) unmapped. Free mapped blocks sit in their pool's free
 * index keyed (stream, size, address); unmapped blocks in their pool's unmapped index keyed
 * (stream, address). Free mapped expandable blocks holding at least one whole page are also
 * on the idle list (oldest first): the pages that can move to another place or stream.
 * Unmapped physical chunks wait in the page cache. Design notes: docs/design.md.
 *
 * Locking: one mutex per allocator (a->lock) guards everything here. Driver calls that can
 * take milliseconds (create, release) are made with it dropped; observers run without it. */
#ifndef EXPSEG_POOLS_INTERNAL_H
#define EXPSEG_POOLS_INTERNAL_H

#include "error.h"
#include "expseg.h"
#include "map.h"
#include "treap.h"
#include "policy.h"
#include "vmm.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Check levels (EXPSEG_DEBUG, a compile-time level independent of NDEBUG; docs/design.md,
 * "Checks"): 0 none; 1 cheap argument and state checks (expseg_assert); 2 also structure
 * checks on each operation (expseg_assert2, _expseg_check_block_local: the touched block
 * and its neighbours); 3 also the full expseg_check every N public operations (N from the
 * environment's EXPSEG_CHECK_EVERY, default 1000), aborting with its first violation. */
#ifndef EXPSEG_DEBUG
#define EXPSEG_DEBUG 1
#endif
#if EXPSEG_DEBUG >= 1
/* Runs in every build (NDEBUG does not remove it): a broken invariant stops the process
 * with the file, line and expression instead of corrupting memory later. */
#include <stdio.h>
#include <stdlib.h>
#define expseg_assert(x)                                                                    \
  ((x) ? (void)0                                                                            \
       : (fprintf(stderr, "expseg: internal check failed at %s:%d: %s\n", __FILE__, __LINE__, \
                  #x),                                                                      \
          abort()))
#else
#define expseg_assert(x) ((void)0)
#endif
/* A function of the cache-hit path that must be inlined into it (a call's register saves
 * cost as much as its work). */
#define EXPSEG_HOT static inline __attribute__((always_inline))
#if EXPSEG_DEBUG >= 2
#define expseg_assert2(x) expseg_assert(x)
#else
#define expseg_assert2(x) ((void)0)
#endif

enum { POOL_SMALL = 0, POOL_LARGE = 1, POOL_COUNT = 2 };
enum { STAT_ALL = 0, STAT_SMALL = 1, STAT_LARGE = 2 }; /* PyTorch's StatType order */
enum { BLOCK_FREE = 0, BLOCK_ALLOCATED = 1, BLOCK_PENDING = 2 };
/* What ran out when a request fails (the OOM message's hint). */
enum { OOM_MEMORY = 0, OOM_ADDRESS_SPACE = 1, OOM_TOO_LARGE = 2, OOM_FRACTION = 3 };

typedef struct segment_s segment_t;
typedef struct block_s block_t;

/* The fields a cache hit touches (the statistics, the neighbours a free merges with)
 * come first, in the first 64-byte cache line; then the index links (a heap pop or push
 * touches t), the idle list and streams. */
struct block_s {
  uintptr_t ptr;
  size_t size;
  size_t requested;      /* the caller's size, while allocated or pending */
  segment_t *seg;
  expseg_stream stream;  /* the segment's stream */
  block_t *prev, *next;  /* address neighbours in the segment */
  uint32_t n_uses;       /* other streams recorded with record_stream */
  uint8_t state;         /* BLOCK_* */
  bool oversize;         /* allocated at >= max_split_size (oversize_allocations) */
  bool mapped;           /* false only for unmapped expandable blocks */
  bool indexed;          /* in the free or unmapped index */
  /* ---- second cache line ---- */
  EXPSEG_TREAP_LINK(block_t) t; /* treap (unmapped, single-chunk: tree.c); the free
                                 * index's heap: t.l first child, t.r next sibling */
  block_t *hprev;        /* free index: previous heap sibling, or the parent of a first child */
  block_t *idle_prev, *idle_next; /* idle list */
  uint64_t idle_since;   /* a->now_ns when it became free */
  bool idle;             /* on the idle list */
  bool lent;             /* allocated by another stream than its owner (streams.c) */
  uint32_t event_count;  /* events still outstanding (pending free) */
  expseg_stream *uses;   /* n_uses entries: uses_inline or heap */
  expseg_stream uses_inline[2];
  uint32_t uses_cap;
};

/* A page of an expandable segment: page `off` of a physical chunk of n pages (pages.c),
 * which is mapped and unmapped whole. */
typedef struct page_s {
  expseg_vmm_handle h;
  bool mapped;
  uint32_t off, n;
} page_t;

struct segment_s {
  uintptr_t base;
  size_t va_size;
  bool expandable;
  bool oversize;         /* classic, counted in oversize_segments when created */
  bool single;           /* classic, made for a single-chunk allocation: serves only those */
  bool keep_va;          /* scratch of _expseg_release_cached (the PyTorch model) */
  bool asleep;           /* its region sleeps (sleep.c): pages and handle are the layout
                          * to restore, not memory held; sleep.c knows what is held */
  uint32_t busy;         /* classic: its allocated and pending blocks (inactive_split) */
  uint8_t pool;
  expseg_stream stream;
  segment_t *next_all, *prev_all;
  block_t *first;
  size_t page;           /* expandable: its page size (model.c: _expseg_pool_page);
                          * classic: 0 */
  size_t mapped_bytes;   /* expandable: mapped pages x page; classic: va_size */
  expseg_vmm_handle handle; /* classic: the chunk */
  page_t *pages;         /* expandable: pages [0, pages_cap) known; beyond = unmapped */
  size_t pages_cap;
};

/* A treap of blocks; by_size: key (stream, size, ptr), else (stream, ptr). */
typedef struct tree_s {
  block_t *root;
  size_t count;
  bool by_size;
} tree_t;

/* Pointer -> allocated or pending block: base/map.h's map (the accessors below). */
typedef _expseg_map_t ptrmap_t;

typedef struct chunk_s {
  expseg_vmm_handle h;
  size_t size;         /* bytes: the page of the segment it was made for */
  uint8_t pool;        /* pool whose reserved_bytes counts it */
  uint64_t idle_since; /* a->now_ns when it was cached */
} chunk_t;

/* A statistic as kept. PyTorch's Stat has current, peak, allocated and freed; freed is
 * not kept: freed = allocated + base - current, base being current at the last
 * reset_accumulated (0 before), so a decrease is one write. In a StatArray (stat_t[3],
 * PyTorch's StatType order) only the two pools are counted; the `all` entry keeps its peak
 * (a maximum of sums is no sum of maxima); its current, allocated and base stay 0. Read
 * through stat_view / stat_array_view (PyTorch's four fields), never field by field. */
typedef struct stat_s {
  int64_t current, peak, allocated, base;
} stat_t;

typedef struct stat_view_s {
  int64_t current, peak, allocated, freed;
} stat_view_t;

typedef struct stats_s {
#define EXPSEG_STAT_ARRAY(n) stat_t n[3];
#define EXPSEG_STAT_SINGLE(n) stat_t n;
#define EXPSEG_STAT_COUNTER(n) int64_t n;
#define EXPSEG_STAT_VALUE(n) int64_t n;
#define EXPSEG_STAT_GAUGE(n) stat_t n;
#define EXPSEG_STAT_ACCUM(n) int64_t n;
#include "stats.def"
  uint64_t driver_base[EXPSEG_VMM_CALL_COUNT]; /* driver call counts at the last reset */
} stats_t;

typedef struct pending_s {
  expseg_vmm_event ev;
  block_t *b;
} pending_t;

typedef struct stream_queue_s {
  expseg_stream stream;
  pending_t *items; /* ring */
  size_t head, count, cap;
} stream_queue_t;

/* The free index (fidx.c): one size node per (pool, stream, size) with free blocks, in a
 * treap of sizes per pool for best fit, found directly by a hash table for an exact size;
 * its blocks form a pairing heap by address (intrusive: t.l, t.r, hprev), so the lowest
 * address of a size is the root. */
typedef struct szn_s szn_t;
struct szn_s {
  block_t *heap;         /* the blocks, lowest address at the root; NULL when empty */
  size_t size;
  expseg_stream stream;
  EXPSEG_TREAP_LINK(szn_t) t; /* the treap of sizes (base/treap.h) */
  szn_t *enext, *eprev;  /* the empty list (count 0, still indexed), or the spare list */
  uint32_t count;
  uint8_t pool;
};
typedef struct fslot_s {
  size_t key;            /* size << 1 | pool; 0 = empty slot */
  expseg_stream stream;
  szn_t *node;
} fslot_t;
/* The streams that own free blocks in the free index, counted per pool: the pool's home
 * stream (the first to own one while no other stream of the table was home: in a
 * single-stream program every stream there is) by a count beside the pool, any other by an
 * entry per (pool, stream) with at least one, in a table as large as the slots' (open
 * addressing; entries are never more than the blocks, so it is at most half full and an
 * insert never allocates). The home stream never has an entry. */
typedef struct fown_s {
  expseg_stream stream;
  size_t blocks;         /* free blocks of (pool, stream) in the index; 0 = empty entry */
  int pool;
} fown_t;
typedef struct fidx_s {
  fslot_t *slots;        /* every indexed node (nonempty or empty), at most half full */
  size_t cap, used;
  fown_t *owners;        /* cap entries (fown_t) */
  size_t streams[POOL_COUNT]; /* streams with a free block in the pool's index (last too) */
  expseg_stream home[POOL_COUNT]; /* the home stream and its free blocks in the index */
  size_t home_blocks[POOL_COUNT];
  szn_t *root[POOL_COUNT];
  block_t *last[POOL_COUNT];  /* the block inserted last, held outside the heaps (fidx.c) */
  size_t blocks[POOL_COUNT];  /* free blocks in the heaps */
  size_t nodes[POOL_COUNT];   /* nodes in the size treaps */
  szn_t *spare, *empty;       /* nodes not indexed; indexed nodes with no block */
  size_t n_nodes;             /* nodes made (never fewer than block structs: fidx.c) */
  szn_t **slabs;
  size_t n_slabs, cap_slabs;
  uint64_t rng;               /* treap priorities (base/treap.h) */
  tree_t single[POOL_COUNT];  /* free blocks of single-chunk segments, (stream, size, ptr) */
} fidx_t;

typedef struct observer_s {
  expseg_oom_observer fn;
  void *ctx;
} observer_t;

/* ---- private pools (ppool.c) ----
 * A private pool's blocks are found by the same indexes as the general cache's, under a
 * stream key: the stream with the pool's tag (its slot in a->ppools, 1 and up) in the bits
 * from EXPSEG_KEY_SHIFT up. A block's and a segment's `stream` field is that key, so a
 * lookup on (pool, key, size) can never meet another pool's block; the general cache's key
 * is the stream itself (tag 0). Streams are therefore below 2^48 (CUDA's are pointers). */
#define EXPSEG_KEY_SHIFT 48
#define EXPSEG_STREAM_MASK ((UINT64_C(1) << EXPSEG_KEY_SHIFT) - 1)
static inline expseg_stream skey_make(expseg_stream s, uint32_t tag) {
  return s | (uint64_t)tag << EXPSEG_KEY_SHIFT;
}
static inline expseg_stream skey_stream(expseg_stream key) { return key & EXPSEG_STREAM_MASK; }
static inline uint32_t skey_tag(expseg_stream key) {
  return (uint32_t)(key >> EXPSEG_KEY_SHIFT);
}
static inline uint32_t seg_tag(const segment_t *s);

typedef struct ppool_s {
  expseg_pool_id id;   /* 0: the slot is free */
  int use_count;       /* 0: released (the id is unknown); the slot stays until drained */
  size_t busy;         /* allocated and pending blocks */
  size_t inflight;     /* allocations into it under way (they may drop the lock) */
  stat_t reserved[3];  /* reserved_bytes_by_private_pools.0_<id>: mapped and classic bytes */
} ppool_t;

typedef struct route_s {
  expseg_pool_id id;
  uint32_t tag;
  bool (*filter)(void *ctx, expseg_stream stream);
  void *ctx;
} route_t;

struct expseg_allocator {
  pthread_mutex_t lock;
  expseg_vmm_t *drv;
  int device;
  expseg_config_t cfg;
  char *conf_text;            /* the option text last given (expseg_create's or its environment
                               * variable's, then expseg_configure's); NULL: none. A snapshot's
                               * PYTORCH_CUDA_ALLOC_CONF, as PyTorch's last_allocator_settings */
  size_t granularity, page;   /* page: expseg's expandable chunk size (page_size_mb); a
                               * segment's own is seg->page (_expseg_pool_page) */
  unsigned page_shift;        /* log2(page) when page is a power of two, else 0 */
  size_t total_mem;           /* device total at creation */
  size_t allowed;             /* fraction cap in bytes; SIZE_MAX = none */

  fidx_t free_idx;            /* free mapped blocks (fidx.c) */
  tree_t unmapped_idx[POOL_COUNT];
  block_t *idle_head[POOL_COUNT], *idle_tail[POOL_COUNT]; /* idle lists, oldest first */
  ptrmap_t live;
  segment_t *segments;        /* every segment */
  size_t n_segments;

  chunk_t *cache;             /* page cache (stack) */
  void *zombies;              /* releases the driver refused, to retry (segment.c) */
  size_t n_zombies, cap_zombies;
  /* refused releases the retry list had no room for (no host memory): still held by the
   * driver, so still counted, never retried; expseg_check counts them with the list */
  int64_t lost_reserved[POOL_COUNT], lost_va, lost_chunks, lost_mapped;
  size_t cache_count, cache_cap;

  size_t inflight;            /* bytes being created with the lock dropped */
  size_t unlocked_ops;        /* driver calls under way with the lock dropped */
  uint64_t tick;              /* logical clock: advanced by every free */
  uint64_t slow_mallocs;      /* mallocs the hit path did not serve (expseg_testing.h) */
  uint64_t now_ns;            /* the driver's clock (now_ns) as read on the last miss: free
                               * memory is stamped with it, garbage collection ages by it */
  uint64_t robbed[POOL_COUNT]; /* tick when the other pool last took this pool's pages */
  uint64_t rng;               /* treap priorities (base/treap.h) */
  bool model_pytorch;         /* behave as PyTorch's allocator where it differs (model.c) */

  stream_queue_t *queues;     /* per used stream: events outstanding */
  size_t n_queues, cap_queues;
  _expseg_map_t queue_of;     /* stream -> its index in queues (a stream's first use: O(1)) */
  size_t n_pending_events;
  bool warned_sync;           /* a failed wait for a stream was reported */
  block_t **orphans;          /* pending blocks no event could be recorded for yet */
  size_t n_orphans, cap_orphans;
  expseg_vmm_event *event_pool;
  size_t n_event_pool, cap_event_pool;

  block_t *block_free;        /* recycled block structs */
  void **slabs;
  size_t n_slabs, cap_slabs;

  observer_t *observers;
  size_t n_observers;
  uint8_t oom_kind;           /* OOM_*: why the current request's growth failed */
  expseg_stream oom_key;      /* the current request's stream key (its place, for the
                               * out-of-memory report's free-memory split) */

  stats_t stats;
  int64_t allocated_most;     /* the most bytes allocated at once before the last
                               * reset_peak_memory_stats (segment.c: allocated_most_bytes) */
  struct history_s *hist;     /* history.c: the recorded events; NULL = not recording */
  /* history.c: PyTorch's compile context (a stack of note ids; the top one is each later
   * event's compile_context) and user metadata (a note id: each later event's
   * user_metadata); kept while the history is off, as PyTorch keeps them */
  uint32_t *compile_ctx;
  size_t n_compile_ctx, cap_compile_ctx;
  uint32_t user_meta;

  uint64_t peers;             /* devices given access to every mapping (peer.c), bit = ordinal */
  struct ipc_state_s *ipc;    /* exports and imports (ipc.c); NULL until the first */

  ppool_t *ppools;            /* private pools by tag (slot 0 unused); ppool.c */
  size_t n_ppools;            /* slots in use or free, tag < n_ppools */
  size_t cap_ppools;          /* slots allocated (and room in the two stacks below) */
  uint32_t *ppool_free;       /* free slots (id 0), a stack */
  uint32_t *ppool_drain;      /* released slots still holding memory, a stack */
  size_t n_ppool_free, n_ppool_drain;
  _expseg_map_t ppool_ids;    /* live pool id -> its tag (use count >= 1) */
  /* segcount.c: per pool, stream key -> its expandable segments; lost: dropped (no memory) */
  _expseg_map_t segcount[POOL_COUNT];
  bool segcount_lost;
  expseg_pool_id next_pool_id;
  route_t *routes;            /* pools begun, oldest first (checked newest first) */
  size_t n_routes, cap_routes;
  bool reap;                  /* a released pool may now be given back */
  struct sleep_state_s *sleep; /* tagged regions (sleep.c); NULL until the first */
  struct rclass_s *rclasses;  /* streams' reserve classes (reserve_class.c) */
  size_t n_rclasses;
  uint32_t reap_skip;         /* non-blocking reaps to skip before the next try ... */
  uint32_t reap_backoff;      /* ... doubled after each try that left memory behind */
};

static inline uint32_t seg_tag(const segment_t *s) { return skey_tag(s->stream); }
/* The stream key of the allocation b holds, as its history events carry it: the stream
 * that asked for it (a lent block's owner is another; its first use is the borrower). */
static inline expseg_stream block_alloc_key(const block_t *b) {
  return b->lent && b->n_uses > 0 ? skey_make(b->uses[0], skey_tag(b->stream)) : b->stream;
}

/* ---- reserve_class.c: streams' expandable-segment reserve classes ---- */
/* The class stream (a stream key's stream) was tagged with, or NULL. Lock held. */
const char *_expseg_reserve_class_of(const expseg_allocator *a, expseg_stream stream);
void _expseg_reserve_classes_destroy(expseg_allocator *a);

/* ---- segcount.c: expandable segments per stream (O(1) questions of growth) ---- */
/* s's (pool, stream) gained (segs = 1) or lost (-1) an expandable segment: s */
void _expseg_segcount_add(expseg_allocator *a, const segment_t *s, int segs);
/* expandable segments of (pool, stream key) */
size_t _expseg_segcount_of(const expseg_allocator *a, int pool, expseg_stream key);
bool _expseg_segcount_check(const expseg_allocator *a, char *why, size_t len);
void _expseg_segcount_destroy(expseg_allocator *a);

/* ---- tree.c ---- */
void _expseg_tree_insert(tree_t *t, block_t *b, uint32_t prio);
void _expseg_tree_remove(tree_t *t, block_t *b);
/* Smallest block >= key in (stream, size, ptr) order (by_size) or (stream, ptr). */
block_t *_expseg_tree_lower_bound(const tree_t *t, expseg_stream s, size_t size, uintptr_t ptr);
block_t *_expseg_tree_next(const tree_t *t, const block_t *b);
bool _expseg_tree_contains(const tree_t *t, const block_t *b);

/* ---- the pointer map: base/map.h with block pointers for values ---- */
static inline bool _expseg_ptrmap_init(ptrmap_t *m) { return _expseg_map_init(m, 512); }
static inline void _expseg_ptrmap_destroy(ptrmap_t *m) { _expseg_map_free(m); }
/* false: no host memory */
static inline bool _expseg_ptrmap_put(ptrmap_t *m, uintptr_t key, block_t *b) {
  return _expseg_map_put(m, (uint64_t)key, (uint64_t)(uintptr_t)b);
}
static inline block_t *_expseg_ptrmap_get(const ptrmap_t *m, uintptr_t key) {
  const uint64_t *v = _expseg_map_get(m, (uint64_t)key);
  return v != NULL ? (block_t *)(uintptr_t)*v : NULL;
}
static inline block_t *_expseg_ptrmap_take(ptrmap_t *m, uintptr_t key) {
  uint64_t v;
  return _expseg_map_take(m, (uint64_t)key, &v) ? (block_t *)(uintptr_t)v : NULL;
}

/* ---- stats.c (the two update rules are inline: they are on the malloc/free path) ---- */
void _expseg_stats_reset_peak(stats_t *s);
void _expseg_stats_reset_accumulated(stats_t *s, const expseg_vmm_t *drv);
bool _expseg_stats_get(const expseg_allocator *a, const char *key, int64_t *v);
void _expseg_stats_visit(const expseg_allocator *a,
                         void (*fn)(void *ctx, const char *key, int64_t value), void *ctx);
size_t _expseg_stats_key_count(void);
/* One StatArray's reset: peak (peak = current) or accumulated (allocated = freed = 0). */
void _expseg_stat_array_reset(stat_t arr[3], bool peak);
const char *_expseg_stats_key(size_t i); /* sorted */

/* ---- block.c: blocks, the free sets, splitting and merging (block.h: the inline part) ---- */
#define EXPSEG_SLAB_BLOCKS 512 /* block structs are made this many at a time */
void _expseg_blocks_destroy(expseg_allocator *a);
void _expseg_unmapped_insert(expseg_allocator *a, block_t *b);
void _expseg_unmapped_remove(expseg_allocator *a, block_t *b);
/* Splits b at offset: b keeps [ptr, ptr+offset), the new block gets the rest (same state,
 * not indexed). NULL when out of host memory. */
block_t *_expseg_block_split(expseg_allocator *a, block_t *b, size_t offset);
/* b (free mapped or unmapped, not indexed) absorbs its neighbours of the same kind;
 * returns the merged block (not indexed). */
block_t *_expseg_block_coalesce(expseg_allocator *a, block_t *b);

/* ---- segment.c: classic and expandable segments, the page cache ---- */
/* Gets a free mapped block (removed from the free sets) of at least rounded bytes on
 * (pool, stream) by mapping or creating memory. May drop and retake a->lock. NULL with the
 * status in *st (OUT_OF_MEMORY when the cap or the device is full). */
block_t *_expseg_grow(expseg_allocator *a, int pool, expseg_stream stream, size_t rounded,
                      bool blocking, expseg_status *st);
/* A classic segment of exactly rounded bytes (rounded to the granularity): one chunk, for a
 * single-chunk allocation. */
block_t *_expseg_grow_single(expseg_allocator *a, int pool, expseg_stream stream,
                             size_t rounded, expseg_status *st);
/* Gives back cached memory: free classic segments and, unless keep_pages, whole free pages
 * of expandable segments (after their streams' work completes), the page cache and fully
 * unmapped segments. Returns the bytes of physical memory released. */
size_t _expseg_release_cached(expseg_allocator *a, bool keep_pages);
/* segment.c: may the allocator hold `more` bytes beyond what it holds (and is creating)
 * without passing its memory-fraction cap? Growth and a region's wake ask. */
bool _expseg_cap_allows(const expseg_allocator *a, size_t more);
size_t _expseg_cache_trim(expseg_allocator *a, size_t keep_bytes);
void _expseg_segments_destroy(expseg_allocator *a);
/* Collection before growing for a request; keep: reclaimable bytes to leave for it. */
void _expseg_garbage_collect(expseg_allocator *a, size_t keep);
/* public_error.c: the error of a public call `fn` given a NULL allocator */
expseg_status _expseg_null_allocator(const char *fn);
/* ---- model.c: PyTorch's behaviour where expseg differs (for expseg-replay --model
 * pytorch; not a configuration key) ---- */
expseg_status _expseg_set_model_pytorch(expseg_allocator *a, bool on);
/* Where PyTorch's growth of unmapped block u (pool) ends for a block ending at need: whole
 * pages from the segment's base, large_segment_size in the large pool, no growth floor. */
uintptr_t _expseg_model_map_end(const expseg_allocator *a, const block_t *u, int pool,
                                uintptr_t need);
/* The page (physical chunk size) of new expandable segments of `pool`: expseg's page in
 * both pools, or under the PyTorch model 2 MiB (small) and large_segment_size (large),
 * each rounded up to the granularity. */
size_t _expseg_pool_page(const expseg_allocator *a, int pool);
/* PyTorch's get_free_block (lock held): best fit on (stream, size), then, among expandable
 * blocks, the next larger one while its room to expand (its size plus an unmapped block
 * after it) is smaller; the oversize rules. Removed from the free sets, or NULL. */
block_t *_expseg_model_find_free(expseg_allocator *a, int pool, expseg_stream stream,
                                 size_t rounded);
size_t _expseg_largest_free(const expseg_allocator *a);
/* What the retry list and the refused releases it had no room for still hold: reserved
 * bytes by stat pool, address space, chunks, mapped bytes. */
void _expseg_zombie_totals(const expseg_allocator *a, int64_t reserved[3], int64_t *va,
                           int64_t *chunks, int64_t *mapped);

/* ---- streams.c: record_stream, events, pending frees, lending ---- */
expseg_status _expseg_block_add_use(block_t *b, expseg_stream s);
/* Reuse before growth: the smallest free mapped expandable block of `pool` of at least
 * `rounded` bytes that another stream of key's pool (the same private pool or the general
 * cache) holds and whose stream's queued work has completed, removed from the free index;
 * NULL when none. The caller hands it out and lends it (_expseg_block_add_use of key's
 * stream): it stays its owner's, and its free waits for the borrower's work like any
 * block used on another stream, then returns it to its owner's free blocks. */
block_t *_expseg_lend_find(expseg_allocator *a, int pool, expseg_stream key, size_t rounded);
/* The same for a request whose own stream's best fit has `own` bytes (0: none): the
 * smallest such block, smaller than `own`, among the best fits of the pool's streams
 * (policy.h: lending a tighter fit, at most EXPSEG_LEND_SCAN streams), free blocks too small
 * to hold a whole page included; NULL when none. */
block_t *_expseg_lend_tighter_find(expseg_allocator *a, int pool, expseg_stream key,
                                   size_t rounded, size_t own);
/* Records events for a freed block's other streams. false: no event could be recorded
 * (the caller then synchronizes). */
bool _expseg_insert_events(expseg_allocator *a, block_t *b);
void _expseg_process_events(expseg_allocator *a);
/* Frees pending block b now if the work on its streams is already done (the events just
 * recorded for it, polled), instead of at the next malloc: a lent block's borrower, or a
 * stream that recorded a use and has finished, often has. b may be gone afterwards. */
void _expseg_poll_uses(expseg_allocator *a, block_t *b);
/* Are blocks used on stream s (lent to it, or recorded) waiting for its work? */
bool _expseg_stream_frees_pending(const expseg_allocator *a, expseg_stream s);
/* A freed block used on other streams for which neither an event nor a wait worked: it
 * stays pending and events are tried again at every malloc. false: no host memory. */
bool _expseg_orphan_add(expseg_allocator *a, block_t *b);
void _expseg_sync_all_events(expseg_allocator *a); /* num_sync_all_streams +1 */
void _expseg_streams_destroy(expseg_allocator *a);
/* Events from the pool (created on demand); put back when done. */
expseg_status _expseg_event_get(expseg_allocator *a, expseg_vmm_event *ev);
void _expseg_event_put(expseg_allocator *a, expseg_vmm_event ev);

/* ---- config.c ---- */
/* The option text (config, else the environment) parsed over the defaults into *cfg;
 * EXPSEG_ERR_CONFIG with the message on bad text. who: the public call ("expseg_create",
 * "expseg_host_create"), which names text given to it. */
expseg_status _expseg_config_load(const char *config, const char *who,
                                  expseg_config_source_t *src, expseg_config_t *cfg);

/* ---- host_pool.c ---- */
/* For messages about a pointer an allocator does not know: a hint when it belongs to a
 * pinned host pool, else "". Takes the pools' locks (never the allocator's). */
const char *_expseg_host_pool_hint(const void *ptr);

/* ---- alloc.c ---- */
/* expseg_create over an already-open driver (tests: the fault wrapper). Takes ownership of
 * drv, also on failure. */
expseg_status _expseg_create_with_driver(expseg_vmm_t *drv, const char *config,
                                         expseg_allocator **out);
/* expseg_destroy, calling before_close(ctx, driver) once everything is given back and
 * before the driver closes (expseg_testing_destroy reads the driver's gauges there). */
void _expseg_destroy_with(expseg_allocator *a, void (*before_close)(void *, expseg_vmm_t *),
                          void *ctx);
/* Frees a block whose last use is complete: stats, merge, back into the free sets. */
void _expseg_free_block(expseg_allocator *a, block_t *b);

/* ---- oom.c ---- */
/* Counts the OOM, writes the message (what was asked, what the device and this allocator
 * hold, a hint that fits what ran out, the cause), gives the page cache back, unlocks
 * (api_unlock), runs the observers and returns EXPSEG_ERR_OUT_OF_MEMORY. */
expseg_status _expseg_fail_oom(expseg_allocator *a, size_t size, size_t rounded,
                               expseg_stream stream, const char *cause_msg);

/* ---- peer.c: access for peer devices ---- */
/* Grants every enabled peer access to a newly mapped range (lock held). */
expseg_status _expseg_peers_grant(expseg_allocator *a, uintptr_t addr, size_t size);

/* ---- ipc.c: sharing with other processes (lock held) ---- */
/* Importers gone: their exports dropped, deferred frees done. */
void _expseg_ipc_poll_locked(expseg_allocator *a);
/* expseg_free of an exported pointer: true when the free is deferred (*st its result). */
bool _expseg_ipc_hold_free(expseg_allocator *a, uintptr_t ptr, expseg_status *st);
/* After a poll: the first exported allocation still held by an importer whose segment
 * belongs to private pool `tag` (a region: it may not sleep), or 0. */
uintptr_t _expseg_ipc_held_in_pool(expseg_allocator *a, uint32_t tag);
/* Was ptr freed while an import keeps its memory (a deferred free)? */
bool _expseg_ipc_freed(const expseg_allocator *a, uintptr_t ptr);
/* Calls fn on every imported range (peer access). */
expseg_status _expseg_ipc_foreach_import(expseg_allocator *a,
                                         expseg_status (*fn)(void *ctx, uintptr_t, size_t),
                                         void *ctx);
void _expseg_ipc_destroy(expseg_allocator *a); /* closes and unmaps everything */
/* What imports hold from the driver: t[0] mapped bytes, t[1] chunks, t[2] chunk bytes,
 * t[3] reserved address space (expseg_check leaves them out of its recount). */
void _expseg_ipc_totals(const expseg_allocator *a, int64_t t[4]);
/* expseg_free with the lock held (alloc.c). */
expseg_status _expseg_free_locked(expseg_allocator *a, void *ptr);

/* ---- ppool.c: private pools (lock held) ---- */
/* The stream key a request on `stream` allocates under: the newest begun pool whose filter
 * accepts the stream, else the general cache. */
expseg_stream _expseg_ppool_route(const expseg_allocator *a, expseg_stream stream);
/* b (of a private pool) handed out / its last use complete. */
void _expseg_ppool_busy(expseg_allocator *a, uint32_t tag, bool up);
/* An allocation into pool `tag` starts / ends (whether it succeeded or not): while one is
 * under way the pool's slot is not freed, nor its free memory taken by others. */
void _expseg_ppool_inflight(expseg_allocator *a, uint32_t tag, bool up);
/* Released pools whose blocks are all free and with no allocation under way: memory back
 * (blocking: wait for their streams), slots freed. A non-blocking try that leaves memory
 * behind (a stream still busy) is retried after a growing number of calls (reap_backoff),
 * and at once when a pool's last block is freed or its last allocation ends. */
void _expseg_ppool_reap(expseg_allocator *a, bool blocking);
void _expseg_ppool_destroy(expseg_allocator *a);
/* expseg_check's part: segments' tags, per-pool reserved sums and busy counts, routes. */
expseg_status _expseg_ppool_check(const expseg_allocator *a);
expseg_pool_id _expseg_ppool_id(const expseg_allocator *a, uint32_t tag);
uint32_t _expseg_ppool_live_tag(const expseg_allocator *a, expseg_pool_id id); /* 0: none */
/* segment.c: gives back the free memory of pool `tag` (classic segments, idle pages, then
 * wholly unmapped segments), the chunks to the driver; true when it holds no segment now. */
bool _expseg_release_pool_memory(expseg_allocator *a, uint32_t tag, bool blocking);
/* The per-pool statistics: key count, visit (in sorted order, called by stats.c at the
 * family's place), lookup, resets. */
size_t _expseg_ppool_stat_count(const expseg_allocator *a);
void _expseg_ppool_stats_visit(const expseg_allocator *a,
                               void (*fn)(void *ctx, const char *key, int64_t value), void *ctx);
bool _expseg_ppool_stat_get(const expseg_allocator *a, const char *key, int64_t *v);
void _expseg_ppool_stats_reset(expseg_allocator *a, bool peak);
#define EXPSEG_PPOOL_FAMILY "reserved_bytes_by_private_pools"

/* ---- sleep.c: tagged regions, sleep and wake (lock held) ---- */
/* Is private pool `tag` a sleeping region's? (malloc refuses it; message set when true) */
bool _expseg_sleep_refuses(expseg_allocator *a, uint32_t tag);
/* The tag of the region whose pool is private pool `tag`, or NULL: a region's pool lives as
 * long as the allocator (expseg_pool_release never takes it to use count 0). */
const char *_expseg_sleep_region_name(const expseg_allocator *a, uint32_t tag);
/* expseg_free of b, whose segment sleeps: deferred to the wake (*st its result). */
expseg_status _expseg_sleep_defer_free(expseg_allocator *a, block_t *b);
/* What segment s holds from the driver: physical bytes (the return), mapped bytes and
 * chunks; for an awake segment its mapped bytes (classic: the segment) and chunk count. */
size_t _expseg_seg_held(const expseg_allocator *a, const segment_t *s, size_t *mapped,
                        size_t *chunks);
/* Before the segments are given back at destroy: host copies freed, sleeping segments'
 * remaining chunks released, their layout marked unmapped. */
void _expseg_sleep_destroy(expseg_allocator *a);
/* expseg_empty_cache: the host copies awake regions keep for their next sleep given back. */
void _expseg_sleep_trim(expseg_allocator *a);

/* ---- check.c ---- */
expseg_status _expseg_check_locked(const expseg_allocator *a);

/* The allocator's lock as the public entry points take it: warnings raised inside wait
 * until the lock is let go (error.c), so a log sink never runs under an expseg lock. Driver
 * calls made with the lock dropped inside an operation use pthread_mutex_* directly. */
static inline void api_lock(const expseg_allocator *a) {
  _expseg_log_defer(true);
  pthread_mutex_lock((pthread_mutex_t *)&a->lock);
}
#if EXPSEG_DEBUG >= 3
/* observe/check.c: counts public operations; every EXPSEG_CHECK_EVERY-th runs the full check
 * (lock held) and aborts on a violation. */
void _expseg_debug_tick(const expseg_allocator *a);
#endif
#if EXPSEG_DEBUG >= 2
/* observe/check.c: the block, its address neighbours and its segment links agree (abort if not). */
void _expseg_check_block_local(const expseg_allocator *a, const block_t *b);
#define EXPSEG_CHECK_BLOCK(a, b) _expseg_check_block_local((a), (b))
#else
#define EXPSEG_CHECK_BLOCK(a, b) ((void)0)
#endif
static inline void api_unlock(const expseg_allocator *a) {
#if EXPSEG_DEBUG >= 3
  _expseg_debug_tick(a);
#endif
  pthread_mutex_unlock((pthread_mutex_t *)&a->lock);
  _expseg_log_defer(false);
}

static inline int stat_pool(int pool) { return pool == POOL_SMALL ? STAT_SMALL : STAT_LARGE; }

/* PyTorch's Stat increase (delta >= 0) and decrease (delta < 0), on a single Stat or on
 * one pool's entry of an array. */
static inline void _expseg_stat_add(stat_t *s, int64_t delta) {
  s->current += delta;
  if (delta >= 0) {
    if (s->current > s->peak) s->peak = s->current;
    s->allocated += delta;
  }
  expseg_assert(s->current >= 0);
}

/* The `all` entry of an array, derived from the pools (see stat_t). */
static inline int64_t stat_all_current(const stat_t arr[3]) {
  return arr[STAT_SMALL].current + arr[STAT_LARGE].current;
}
static inline void stat_all_peak(stat_t arr[3]) {
  const int64_t c = stat_all_current(arr);
  if (c > arr[STAT_ALL].peak) arr[STAT_ALL].peak = c;
}
static inline stat_view_t stat_view(const stat_t *s) {
  return (stat_view_t){s->current, s->peak, s->allocated, s->allocated + s->base - s->current};
}
/* metric m of a view, in PyTorch's key order: current, peak, allocated, freed */
static inline int64_t stat_metric(stat_view_t v, int m) {
  return m == 0 ? v.current : m == 1 ? v.peak : m == 2 ? v.allocated : v.freed;
}
static inline stat_view_t stat_array_view(const stat_t arr[3], int i) {
  if (i != STAT_ALL) return stat_view(&arr[i]);
  const stat_t *a = &arr[STAT_ALL], *s = &arr[STAT_SMALL], *l = &arr[STAT_LARGE];
  const int64_t cur = stat_all_current(arr), alloc = a->allocated + s->allocated + l->allocated;
  return (stat_view_t){cur, a->peak, alloc, alloc + a->base + s->base + l->base - cur};
}

/* A PyTorch StatArray update: the block's pool, and the peak of `all` on an increase. */
static inline void _expseg_stat_pool_add(stat_t arr[3], int pool, int64_t delta) {
  _expseg_stat_add(&arr[stat_pool(pool)], delta);
  if (delta > 0) stat_all_peak(arr);
}
/* d units counted in pool `from` move to pool `to`: a decrease there and an increase here,
 * and so, as PyTorch's update_stat_array counts every pool update in `all` too, a freed and
 * an allocated in `all` (its current is unchanged); `all` stays the sum of its pools. */
static inline void stat_move(stat_t arr[3], int from, int to, int64_t d) {
  _expseg_stat_add(&arr[stat_pool(from)], -d);
  _expseg_stat_pool_add(arr, to, d);
}
/* The statistics of one block's life, in one place (PyTorch's rules): stat_alloc when it
 * is handed out, stat_free when the caller frees it, stat_free_done when its last use is
 * complete (at once, or after other streams' events). No sign test, no other site. Per
 * array: an increase is two adds and two peak tests, a decrease one subtraction. */
static inline void stat_up(stat_t arr[3], int pool, int64_t d) {
  stat_t *p = &arr[stat_pool(pool)];
  p->current += d;
  p->allocated += d;
  if (p->current > p->peak) p->peak = p->current;
  stat_all_peak(arr);
}
static inline void stat_down(stat_t arr[3], int pool, int64_t d) {
  arr[stat_pool(pool)].current -= d;
}
static inline void stat_alloc(stats_t *s, int pool, const block_t *b) {
  stat_up(s->allocation, pool, 1);
  stat_up(s->allocated_bytes, pool, (int64_t)b->size);
  stat_up(s->requested_bytes, pool, (int64_t)b->requested);
  stat_up(s->active, pool, 1);
  stat_up(s->active_bytes, pool, (int64_t)b->size);
  if (b->oversize) _expseg_stat_add(&s->oversize_allocations, 1);
}
static inline void stat_free(stats_t *s, int pool, const block_t *b) {
  stat_down(s->allocation, pool, 1);
  stat_down(s->allocated_bytes, pool, (int64_t)b->size);
  if (b->oversize) _expseg_stat_add(&s->oversize_allocations, -1);
}
static inline void stat_free_done(stats_t *s, int pool, const block_t *b) {
  stat_down(s->requested_bytes, pool, (int64_t)b->requested);
  stat_down(s->active, pool, 1);
  stat_down(s->active_bytes, pool, (int64_t)b->size);
}

/* inactive_split, kept as PyTorch's rules give it: PyTorch counts each free block of a
 * classic segment that has a neighbour; since free neighbours are merged at once, that is
 * each run of adjacent free blocks that is not its whole segment. Runs change only when a classic block turns busy (allocated or
 * pending) or back, so the statistic changes there, by its net change (PyTorch's rule),
 * from the block's two neighbours and whether its segment has any other busy block. */
static inline bool freeish(const block_t *n) { return n != NULL && n->state == BLOCK_FREE; }
static inline void isplit_change(expseg_allocator *a, const block_t *b, bool to_busy) {
  segment_t *s = b->seg;
  if (s->expandable) return;
  int64_t lr = (int64_t)freeish(b->prev) + (int64_t)freeish(b->next), dn, db;
  const int64_t rest = (int64_t)(s->va_size - b->size);
  if (to_busy) {
    bool whole = s->busy++ == 0; /* the run it leaves was the whole segment */
    dn = lr - (whole ? 0 : 1);
    db = whole ? rest : -(int64_t)b->size;
  } else {
    bool whole = --s->busy == 0;
    dn = (whole ? 0 : 1) - lr;
    db = whole ? -rest : (int64_t)b->size;
  }
  if (dn != 0) _expseg_stat_pool_add(a->stats.inactive_split, s->pool, dn);
  if (db != 0) _expseg_stat_pool_add(a->stats.inactive_split_bytes, s->pool, db);
}

/* Physical bytes held from the driver: classic segments, mapped pages, the page cache. */
static inline size_t held_bytes(const expseg_allocator *a) {
  return (size_t)stat_all_current(a->stats.reserved_bytes);
}

/* The whole pages (of its segment's page size) block b covers, counted from the segment's
 * base; *first (if not NULL) gets the first one's address. 0 for classic segments. Inline,
 * with no division in the usual case: every insert into the free index asks. */
static inline size_t _expseg_block_whole_pages(const expseg_allocator *a, const block_t *b,
                                               uintptr_t *first) {
  if (!b->seg->expandable) return 0;
  /* pages are counted from the segment's base (the page size need not be a power of two) */
  uintptr_t base = b->seg->base, off = b->ptr - base, lo, hi;
  const size_t pg = b->seg->page; /* the segment's own (model.c: _expseg_pool_page) */
  if (a->page_shift != 0 && pg == a->page) { /* the usual case: no division on the free path */
    const unsigned sh = a->page_shift;
    const size_t lo_page = (off + pg - 1) >> sh, hi_page = (off + b->size) >> sh;
    if (first != NULL) *first = base + (lo_page << sh);
    return hi_page > lo_page ? hi_page - lo_page : 0;
  }
  lo = base + (off + pg - 1) / pg * pg;
  hi = base + (off + b->size) / pg * pg;
  if (first != NULL) *first = lo;
  return hi > lo ? (hi - lo) / pg : 0;
}

/* bytes of segment s became mapped (delta > 0) or went away: its pool's reserved bytes. */
static inline void _expseg_ppool_reserved(expseg_allocator *a, const segment_t *s,
                                          int64_t delta) {
  const uint32_t t = seg_tag(s);
  if (t != 0) _expseg_stat_pool_add(a->ppools[t].reserved, s->pool, delta);
}
/* Whether segment s's free memory may be given back or moved by the general cache's
 * trimming or growth (policy: _expseg_pool_may_take). */
static inline bool _expseg_seg_general(const expseg_allocator *a, const segment_t *s) {
  const uint32_t t = seg_tag(s);
  if (t == 0) return true; /* the general cache: a->ppools may not exist yet */
  const ppool_t *p = &a->ppools[t];
  return _expseg_pool_may_take(0, t, p->use_count, p->busy + p->inflight);
}
#include "observe/history.h" /* EXPSEG_HIST: the history hooks */

/* The pinned host pool's state for a snapshot (pools/host/host_observe.c, read by
 * observe/snapshot.c; declared here, as neither folder includes the other): its driver
 * chunks as walk segments sorted by address, each tiled by its blocks, and its history
 * (NULL: not recording), handed to fn under the pool's lock after a `snapshot` event is
 * recorded. false: out of host memory (fn not called). */
bool _expseg_host_observe(expseg_host_pool *h,
                          void (*fn)(void *ctx, const struct history_s *hist,
                                     const expseg_walk_segment *segs, size_t n),
                          void *ctx);

#endif
