/* SPDX-License-Identifier: Apache-2.0 */
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
/* Takes cached chunk i out for `pool`, moving its reserved_bytes to that pool. */
chunk_t _expseg_cache_take(expseg_allocator *a, size_t i, int pool);
/* The same for the m distinct chunks idx[] (read their handles first), in one pass. */
void _expseg_cache_take_set(expseg_allocator *a, const size_t *idx, size_t m, int pool);
/* Removes cached chunk i into the batch. */
void _expseg_cache_release_at(expseg_allocator *a, size_t i, release_batch_t *rb);
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
/* ---- pages.c: chunks of expandable segments ---- */
/* Unmaps the chunks [lo, hi) of free mapped expandable block b (lo, hi chunk boundaries);
 * returns the pages unmapped. */
size_t _expseg_unmap_pages(expseg_allocator *a, block_t *b, uintptr_t lo, uintptr_t hi,
                           expseg_status *st);
/* The whole chunks inside free block b: [*lo, *hi), their pages (0: none). */
size_t _expseg_block_chunks(const expseg_allocator *a, const block_t *b, uintptr_t *lo,
                            uintptr_t *hi);
/* Where the top chunks of [lo, hi) (chunk boundaries) covering `want` pages begin (at_most:
 * no more than `want` pages), taking no chunk of more than max_pages; hi when the top
 * chunk cannot be taken. */
uintptr_t _expseg_chunks_top(const segment_t *s, uintptr_t lo, uintptr_t hi, size_t want,
                             size_t max_pages, bool at_most);
/* Pages the page cache can map for a growth of k pages of pg bytes into a range of room
 * pages, in *have (< k: not enough). false: no host memory to tell (*have 0). */
bool _expseg_cache_cover(const expseg_allocator *a, size_t pg, size_t k, size_t room,
                         size_t *have);
/* Maps cached chunks covering at least k pages at the start of unmapped block u (indexed),
 * one set_access for the range; the new free mapped block, merged with free mapped
 * neighbours and not indexed; NULL on failure (nothing changed, chunks back in the cache). */
block_t *_expseg_map_cached(expseg_allocator *a, block_t *u, size_t k, size_t lead,
                           expseg_status *st);
/* Moves idle chunks of segments with page `page` (0: any), none over max_pages, into the
 * page cache until `want` pages are moved: the pool's idle blocks first (any stream), then
 * the other pool's (not right after it took this pool's pages, unless blocking), even when
 * they cover only part of `want`; oldest blocks first, never ex1, of ex2 only chunks above
 * its lowest keep2 bytes and its lowest chunk (ex2 stays, with what a growth needs of it), only
 * once an event shows their stream's work is done; chunks from the top of each block.
 * Only blocks of private pool `tag` (0: the general cache) are taken, and with `general`
 * those of the general cache and of released pools too: a live private pool's memory is
 * never taken for another. Returns pages moved. */
size_t _expseg_steal_pages(expseg_allocator *a, int pool, size_t page, size_t want,
                           size_t max_pages, const block_t *ex1, const block_t *ex2,
                           size_t keep2, bool blocking, uint32_t tag, bool general);
/* A free classic segment: given back (true) once its stream's work is done (segment.c). */
bool _expseg_classic_release(expseg_allocator *a, segment_t *s, release_batch_t *rb,
                             bool blocking, stream_seen_t *seen, size_t *n_seen);
bool _expseg_classic_is_free(const segment_t *s);

#endif
