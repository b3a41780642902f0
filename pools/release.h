/* release.h: giving memory back to the driver, shared by the pools/ files that do it.
 * A release item is a mapping, a chunk and a reservation to give back in that order; items
 * are batched and given back with the allocator's lock dropped. What the driver refuses
 * stays on the retry list (a->zombies) with its accounting, retried before the next growth,
 * at empty_cache, on the out-of-memory path and at destroy. The page cache keeps unmapped
 * page-sized chunks for re-mapping. Lock held on every call unless said otherwise. */
#ifndef EXPSEG_POOLS_RELEASE_H
#define EXPSEG_POOLS_RELEASE_H

#include "internal.h"

/* One thing to give back, in order: a mapping (size_map > 0), a chunk (size_h > 0), a
 * reservation (size_va > 0). A step the driver refuses stops the item there: what is left
 * is kept on the retry list (zombies) with its accounting, and tried again at the next
 * empty_cache, out-of-memory retry or destroy. */
typedef struct release_item_s {
  uintptr_t map_va;    /* mapping to remove first, when size_map > 0 */
  size_t size_map;
  expseg_vmm_handle h; /* chunk, when size_h > 0 */
  size_t size_h;
  uintptr_t va;        /* reservation, when size_va > 0 */
  size_t size_va;
  uint8_t pool;        /* whose reserved_bytes counts the chunk */
} release_item_t;

typedef struct release_batch_s {
  release_item_t *items;
  size_t n, cap;
} release_batch_t;

/* Gives the item back (no accounting: callable with the lock dropped); returns what the
 * driver refused (all sizes 0 = done). */
release_item_t _expseg_release_do(expseg_vmm_t *drv, release_item_t it);
/* What the driver refused is still held: its accounting comes back; a page-sized chunk alone
 * goes back to the page cache, anything else onto the retry list. */
void _expseg_release_keep(expseg_allocator *a, release_item_t f);
/* Gives back now, the lock held (its accounting already removed by the caller). */
void _expseg_release_now(expseg_allocator *a, release_item_t it);
/* Memory no segment owns (the undo of a failed growth): counted as created, then given back
 * like any release. */
void _expseg_release_orphan(expseg_allocator *a, release_item_t it);
void _expseg_batch_push(expseg_allocator *a, release_batch_t *rb, release_item_t it);
/* Drops the lock, gives everything back, retakes it and keeps what was refused. */
void _expseg_batch_flush(expseg_allocator *a, release_batch_t *rb);
/* Moves the retry list into the batch, in the order the items were kept. */
void _expseg_zombies_retry(expseg_allocator *a, release_batch_t *rb);
/* Does a mapping the driver refused to remove lie in [lo, lo+len)? */
bool _expseg_zombie_mapped_in(const expseg_allocator *a, uintptr_t lo, size_t len);

/* ---- the page cache (a stack of unmapped chunks, each of its segment's page size) ---- */
bool _expseg_cache_push(expseg_allocator *a, expseg_vmm_handle h, int pool, size_t size);
/* Cached chunks of `size` bytes. */
size_t _expseg_cache_count(const expseg_allocator *a, size_t size);
/* Takes the newest cached chunk of `size` (one must be there) for `pool`, moving its
 * reserved_bytes to that pool. */
expseg_vmm_handle _expseg_cache_pop(expseg_allocator *a, int pool, size_t size);
/* Removes the n oldest cached chunks into the batch; returns their bytes. */
size_t _expseg_cache_release_oldest(expseg_allocator *a, size_t n, release_batch_t *rb);

/* ---- shared by segment.c and gc.c ---- */
enum { SEEN_MAX = 32 }; /* streams whose idleness one pass remembers */
typedef struct stream_seen_s {
  expseg_stream s;
  bool done;
} stream_seen_t;
/* Has the work queued on `stream` completed? An event recorded now tells. blocking: wait.
 * Answers are remembered in seen[] (at most max_seen streams) for one pass. */
bool _expseg_stream_idle(expseg_allocator *a, expseg_stream stream, bool blocking,
                         stream_seen_t *seen, size_t *n_seen, size_t max_seen);
/* Unmaps the whole pages [lo, hi) of free mapped expandable block b; returns the pages
 * unmapped (segment.c). */
size_t _expseg_unmap_pages(expseg_allocator *a, block_t *b, uintptr_t lo, uintptr_t hi,
                           expseg_status *st);
/* A free classic segment: given back (true) once its stream's work is done (segment.c). */
bool _expseg_classic_release(expseg_allocator *a, segment_t *s, release_batch_t *rb,
                             bool blocking, stream_seen_t *seen, size_t *n_seen);
bool _expseg_classic_is_free(const segment_t *s);

#endif
