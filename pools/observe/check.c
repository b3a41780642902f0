/* SPDX-License-Identifier: Apache-2.0 */
/* check.c: the invariant checker behind expseg_check(). It walks every segment and block
 * and recounts everything the allocator keeps incrementally:
 *  - blocks tile each segment with no gap or overlap, neighbour links agree;
 *  - free mapped blocks are in the free index (and only they), merged with no free mapped
 *    neighbour, on the idle list exactly when they hold a whole expandable page;
 *  - the free index's own structure (fidx.c: table, size treaps, heaps, node lists);
 *  - unmapped blocks are page-aligned, in the unmapped index, cover only unmapped pages;
 *  - mapped pages back every live block; allocated blocks are in the pointer map;
 *  - every statistic with a recountable value agrees with the recount, and the driver's
 *    own counts (mapped bytes, live chunks and their bytes, reserved address space) agree
 *    with what the allocator believes it holds, the retry list of refused releases included.
 * O(blocks): for tests and expseg-replay --check. */
#include "dec.h"
#include "error.h"
#include "fidx.h"
#include "internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

typedef struct recount_s {
  int64_t allocation[3], allocated_bytes[3], active[3], active_bytes[3], requested[3];
  int64_t segment[3], reserved[3], inactive_split[3], inactive_split_bytes[3];
  int64_t mapped, va, pending, oversize, free_blocks[POOL_COUNT], unmapped_blocks[POOL_COUNT];
  int64_t idle, chunks, driver_mapped, oversize_segments;
} recount_t;

#define FAIL(...) return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_check: " __VA_ARGS__)

static void add3(int64_t arr[3], int pool, int64_t v) {
  arr[STAT_ALL] += v;
  arr[stat_pool(pool)] += v;
}

static bool page_mapped(const segment_t *s, size_t idx) {
  return idx < s->pages_cap && s->pages[idx].mapped;
}

static expseg_status check_block(const expseg_allocator *a, const segment_t *s, const block_t *b,
                                 recount_t *r) {
  int pool = s->pool;
  unsigned long p = (unsigned long)b->ptr;
  if (b->seg != s || b->stream != s->stream) FAIL("block %#lx: wrong segment or stream", p);
  if (b->size == 0) FAIL("block %#lx: size 0", p);
  if (b->next != NULL && (b->next->prev != b || b->next->ptr != b->ptr + b->size))
    FAIL("block %#lx (+%zu): next block at %#lx does not follow it", p, b->size,
         (unsigned long)b->next->ptr);
  if (!s->expandable && !b->mapped) FAIL("block %#lx: unmapped block in a classic segment", p);
  if (s->expandable) {
    size_t first = (b->ptr - s->base) / s->page;
    size_t last = (b->ptr + b->size - 1 - s->base) / s->page;
    for (size_t i = first; i <= last; i++) {
      if (b->mapped && !page_mapped(s, i))
        FAIL("block %#lx: page %zu of its segment is not mapped", p, i);
      if (!b->mapped && page_mapped(s, i))
        FAIL("unmapped block %#lx: page %zu is mapped", p, i);
    }
  }
  if (!b->mapped) {
    if (b->state != BLOCK_FREE) FAIL("unmapped block %#lx is not free", p);
    if ((b->ptr - s->base) % s->page != 0 || b->size % s->page != 0)
      FAIL("unmapped block %#lx (+%zu) is not page-aligned", p, b->size);
    if (!b->indexed || !_expseg_tree_contains(&a->unmapped_idx[pool], b))
      FAIL("unmapped block %#lx is not in the unmapped index", p);
    if (b->next != NULL && !b->next->mapped) FAIL("unmapped blocks %#lx and next not merged", p);
    r->unmapped_blocks[pool]++;
    return EXPSEG_OK;
  }
  switch (b->state) {
  case BLOCK_FREE: {
    if (!b->indexed || (s->single ? !_expseg_tree_contains(&a->free_idx.single[pool], b)
                                  : !_expseg_fidx_may_hold(&a->free_idx, b)))
      FAIL("free block %#lx is not in the free index", p);
    if (b->next != NULL && b->next->mapped && b->next->state == BLOCK_FREE)
      FAIL("free blocks %#lx and %#lx are not merged", p, (unsigned long)b->next->ptr);
    bool want_idle = s->expandable && _expseg_block_whole_pages(a, b, NULL) > 0;
    if (b->idle != want_idle) FAIL("free block %#lx: idle list membership is wrong", p);
    r->idle += b->idle;
    r->free_blocks[pool]++;
    break;
  }
  case BLOCK_ALLOCATED:
    if (_expseg_ptrmap_get(&a->live, b->ptr) != b)
      FAIL("allocated block %#lx is not in the pointer map", p);
    add3(r->allocation, pool, 1);
    add3(r->allocated_bytes, pool, (int64_t)b->size);
    r->oversize += b->oversize;
    /* fall through */
  case BLOCK_PENDING:
    if (b->indexed) FAIL("live block %#lx is in a free index", p);
    if (b->state == BLOCK_PENDING) {
      bool orphan = false;
      for (size_t i = 0; i < a->n_orphans; i++) orphan |= a->orphans[i] == b;
      if ((b->event_count == 0) != orphan)
        FAIL("pending block %#lx: %u events, %s the orphan list", p, b->event_count,
             orphan ? "on" : "not on");
      if (_expseg_ptrmap_get(&a->live, b->ptr) == b) FAIL("pending block %#lx is still live", p);
      r->pending++;
    }
    add3(r->active, pool, 1);
    add3(r->active_bytes, pool, (int64_t)b->size);
    add3(r->requested, pool, (int64_t)b->requested);
    break;
  default: FAIL("block %#lx: state %d", p, b->state);
  }
  return EXPSEG_OK;
}

static expseg_status check_segment(const expseg_allocator *a, const segment_t *s, recount_t *r) {
  unsigned long base = (unsigned long)s->base;
  const block_t *b = s->first;
  if (b == NULL || b->prev != NULL || b->ptr != s->base)
    FAIL("segment %#lx: first block does not start it", base);
  uintptr_t end = s->base;
  int64_t runs = 0, run_bytes = 0, busy = 0; /* runs of adjacent free blocks */
  for (; b != NULL; b = b->next) {
    expseg_status st = check_block(a, s, b, r);
    if (st != EXPSEG_OK) return st;
    end = b->ptr + b->size;
    if (freeish(b)) {
      runs += !freeish(b->prev);
      run_bytes += (int64_t)b->size;
    } else {
      busy++;
    }
  }
  if (!s->expandable) { /* PyTorch's inactive_split: free runs that are not the segment */
    if (busy != (int64_t)s->busy)
      FAIL("classic segment %#lx: %lld busy blocks, its count says %u", base, (long long)busy,
           s->busy);
    if (busy > 0) {
      add3(r->inactive_split, s->pool, runs);
      add3(r->inactive_split_bytes, s->pool, run_bytes);
    }
  }
  if (end != s->base + s->va_size)
    FAIL("segment %#lx: blocks end at %#lx, segment at %#lx", base, (unsigned long)end,
         (unsigned long)(s->base + s->va_size));
  add3(r->segment, s->pool, 1);
  r->va += (int64_t)s->va_size;
  if (s->asleep) { /* its region sleeps: what it holds is sleep.c's record */
    size_t mapped, chunks, held = _expseg_seg_held(a, s, &mapped, &chunks);
    add3(r->reserved, s->pool, (int64_t)held);
    if (s->expandable) r->mapped += (int64_t)mapped; /* expseg.mapped_bytes: expandable */
    else r->oversize_segments += s->oversize;
    r->driver_mapped += (int64_t)mapped;
    r->chunks += (int64_t)chunks;
    return EXPSEG_OK;
  }
  if (s->expandable) {
    size_t mapped = 0, chunks = 0;
    for (size_t i = 0; i < s->pages_cap; i++) {
      const page_t *pg = &s->pages[i];
      if (!pg->mapped) continue;
      mapped++;
      chunks += pg->off == 0;
      /* every mapped page lies in one chunk mapped whole: its first page starts the chunk,
       * all its pages are mapped and name the same handle */
      const page_t *head = pg->off <= i ? &s->pages[i - pg->off] : NULL;
      if (pg->n == 0 || pg->off >= pg->n || head == NULL || head->off != 0 ||
          head->n != pg->n || head->h != pg->h || !head->mapped ||
          i - pg->off + pg->n > s->pages_cap)
        FAIL("segment %#lx: page %zu is not part of a whole mapped chunk", base, i);
      if (pg->off + 1 == pg->n && i + 1 < s->pages_cap && s->pages[i + 1].mapped &&
          s->pages[i + 1].off != 0)
        FAIL("segment %#lx: page %zu ends a chunk but the next mapped page does not start "
             "one", base, i);
    }
    if (mapped * s->page != s->mapped_bytes)
      FAIL("segment %#lx: %zu pages mapped, mapped_bytes says %zu", base, mapped, s->mapped_bytes);
    if (s->pages_cap * s->page > s->va_size && s->pages_cap > 0) {
      for (size_t i = s->va_size / s->page; i < s->pages_cap; i++)
        if (s->pages[i].mapped) FAIL("segment %#lx: page %zu beyond its end is mapped", base, i);
    }
    add3(r->reserved, s->pool, (int64_t)s->mapped_bytes);
    r->mapped += (int64_t)s->mapped_bytes;
    r->chunks += (int64_t)chunks;
  } else {
    if (s->mapped_bytes != s->va_size) FAIL("classic segment %#lx: mapped bytes", base);
    r->oversize_segments += s->oversize;
    add3(r->reserved, s->pool, (int64_t)s->va_size);
    r->chunks += 1;
  }
  r->driver_mapped += (int64_t)s->mapped_bytes;
  return EXPSEG_OK;
}

static expseg_status same(const char *what, int64_t kept, int64_t counted) {
  if (kept != counted)
    FAIL("statistic %s is %lld, a recount gives %lld", what, (long long)kept, (long long)counted);
  return EXPSEG_OK;
}

#define SAME(what, kept, counted)                                                            \
  do {                                                                                      \
    expseg_status st_ = same(what, kept, counted);                                          \
    if (st_ != EXPSEG_OK) return st_;                                                       \
  } while (0)

static expseg_status check_pool_stats(const stat_t kept[3], const int64_t counted[3],
                                      const char *name) {
  static const char *const pools[3] = {"all", "small_pool", "large_pool"};
  char what[80];
  for (int i = 0; i < 3; i++) {
    const stat_view_t v = stat_array_view(kept, i);
    snprintf(what, sizeof what, "%s.%s.current", name, pools[i]);
    SAME(what, v.current, counted[i]);
    if (v.peak < v.current) FAIL("%s.%s: peak %" PRId64 " below current", name, pools[i], v.peak);
  }
  snprintf(what, sizeof what, "%s: the current kept in `all`", name);
  SAME(what, kept[STAT_ALL].current, 0); /* derived from the pools (internal.h, stat_t) */
  return EXPSEG_OK;
}

expseg_status _expseg_check_locked(const expseg_allocator *a) {
  recount_t r;
  memset(&r, 0, sizeof r);
  expseg_status st;
  size_t n = 0;
  for (const segment_t *s = a->segments; s != NULL; s = s->next_all, n++)
    if ((st = check_segment(a, s, &r)) != EXPSEG_OK) return st;
  if (n != a->n_segments) FAIL("segment list holds %zu, count says %zu", n, a->n_segments);
  char why[256];
  if (!_expseg_segcount_check(a, why, sizeof why)) FAIL("%s", why);
  int64_t heaps[POOL_COUNT];
  if ((st = _expseg_fidx_check(&a->free_idx, heaps)) != EXPSEG_OK) return st;
  if (a->free_idx.n_nodes < a->n_slabs * EXPSEG_SLAB_BLOCKS) /* a free could need a node */
    FAIL("free index: %zu size nodes for %zu block structs", a->free_idx.n_nodes,
         a->n_slabs * EXPSEG_SLAB_BLOCKS);
  for (int p = 0; p < POOL_COUNT; p++) {
    SAME("free index size", heaps[p] + (int64_t)a->free_idx.single[p].count, r.free_blocks[p]);
    SAME("unmapped index size", (int64_t)a->unmapped_idx[p].count, r.unmapped_blocks[p]);
  }
  int64_t idle = 0;
  for (int p = 0; p < POOL_COUNT; p++)
    for (const block_t *b = a->idle_head[p]; b; b = b->idle_next) {
      if (b->seg->pool != p) FAIL("block %#lx is on the wrong idle list", (unsigned long)b->ptr);
      if (b->idle_next != NULL && b->idle_next->idle_since < b->idle_since)
        FAIL("idle list out of order at block %#lx", (unsigned long)b->ptr);
      idle++;
    }
  SAME("idle list length", idle, r.idle);
  SAME("pointer map size", (int64_t)a->live.count, r.allocation[STAT_ALL]);
  if ((st = _expseg_ppool_check(a)) != EXPSEG_OK) return st;
  int64_t cached = 0;
  for (size_t i = 0; i < a->cache_count; i++) {
    add3(r.reserved, a->cache[i].pool, (int64_t)a->cache[i].size);
    cached += (int64_t)a->cache[i].size;
  }
  r.chunks += (int64_t)a->cache_count;
  _expseg_zombie_totals(a, r.reserved, &r.va, &r.chunks, &r.driver_mapped);
  const stats_t *s = &a->stats;
  if ((st = check_pool_stats(s->allocation, r.allocation, "allocation")) ||
      (st = check_pool_stats(s->allocated_bytes, r.allocated_bytes, "allocated_bytes")) ||
      (st = check_pool_stats(s->active, r.active, "active")) ||
      (st = check_pool_stats(s->active_bytes, r.active_bytes, "active_bytes")) ||
      (st = check_pool_stats(s->requested_bytes, r.requested, "requested_bytes")) ||
      (st = check_pool_stats(s->segment, r.segment, "segment")) ||
      (st = check_pool_stats(s->reserved_bytes, r.reserved, "reserved_bytes")) ||
      (st = check_pool_stats(s->inactive_split, r.inactive_split, "inactive_split")) ||
      (st = check_pool_stats(s->inactive_split_bytes, r.inactive_split_bytes,
                             "inactive_split_bytes")))
    return st;
  SAME("oversize_allocations.current", s->oversize_allocations.current, r.oversize);
  SAME("oversize_segments.current", s->oversize_segments.current, r.oversize_segments);
  SAME("expseg.mapped_bytes.current", s->mapped_bytes.current, r.mapped);
  SAME("expseg.cached_physical_bytes.current", s->cached_physical_bytes.current,
       cached);
  SAME("expseg.reserved_va_bytes.current", s->reserved_va_bytes.current, r.va);
  SAME("expseg.pending_free_blocks.current", s->pending_free_blocks.current, r.pending);
  size_t queued = 0;
  for (size_t i = 0; i < a->n_queues; i++) queued += a->queues[i].count;
  SAME("pending events", (int64_t)a->n_pending_events, (int64_t)queued);
  if (a->unlocked_ops == 0) { /* no chunk is being created or released with the lock dropped */
    int64_t im[4] = {0}; /* imported allocations (ipc.c): bytes mapped, chunks, their bytes, VA */
    _expseg_ipc_totals(a, im);
    SAME("driver mapped bytes", atomic_load(&a->drv->mapped_bytes) - im[0], r.driver_mapped);
    SAME("driver live chunks", atomic_load(&a->drv->live_chunks) - im[1], r.chunks);
    SAME("driver live chunk bytes", atomic_load(&a->drv->live_chunk_bytes) - im[2],
         r.reserved[STAT_ALL]);
    SAME("driver reserved address space", atomic_load(&a->drv->reserved_va_bytes) - im[3], r.va);
  }
  return EXPSEG_OK;
}

/* ---- check levels 2 and 3 (internal.h, "Check levels") ---- */
#if EXPSEG_DEBUG >= 2
static void die(const char *what, const block_t *b) {
  fprintf(stderr, "expseg: internal check failed: block %#lx (+%zu): %s\n", (unsigned long)b->ptr,
          b->size, what);
  abort();
}

void _expseg_check_block_local(const expseg_allocator *a, const block_t *b) {
  (void)a;
  if (b->size == 0) die("size 0", b);
  if (b->prev != NULL && (b->prev->next != b || b->prev->ptr + b->prev->size != b->ptr))
    die("the previous block does not end where it starts", b);
  if (b->next != NULL && (b->next->prev != b || b->ptr + b->size != b->next->ptr))
    die("the next block does not start where it ends", b);
  if (b->prev != NULL && b->prev->seg != b->seg) die("the previous block is in another segment", b);
  if (b->next != NULL && b->next->seg != b->seg) die("the next block is in another segment", b);
  if (b->state == BLOCK_FREE && b->mapped) {
    if (b->prev != NULL && b->prev->mapped && b->prev->state == BLOCK_FREE && b->prev->indexed &&
        b->indexed)
      die("free and not merged with its free previous block", b);
    if (b->next != NULL && b->next->mapped && b->next->state == BLOCK_FREE && b->next->indexed &&
        b->indexed)
      die("free and not merged with its free next block", b);
  }
}
#endif

#if EXPSEG_DEBUG >= 3
#include <stdatomic.h>
#include <stdlib.h>

/* EXPSEG_CHECK_EVERY: a positive decimal count; anything else (or unset) is 1000. */
static uint64_t check_every(void) {
  static _Atomic uint64_t every; /* 0: not read yet */
  uint64_t n = atomic_load_explicit(&every, memory_order_relaxed);
  if (n != 0) return n;
  uint64_t v = 0;
  n = _expseg_dec_str(getenv("EXPSEG_CHECK_EVERY"), &v) && v > 0 ? v : 1000;
  atomic_store_explicit(&every, n, memory_order_relaxed);
  return n;
}

void _expseg_debug_tick(const expseg_allocator *a) {
  static _Atomic uint64_t ops;
  uint64_t n = atomic_fetch_add_explicit(&ops, 1, memory_order_relaxed) + 1;
  if (n % check_every() != 0) return;
  if (_expseg_check_locked(a) != EXPSEG_OK) {
    fprintf(stderr, "expseg: EXPSEG_DEBUG=3 check after %llu operations failed: %s\n",
            (unsigned long long)n, expseg_last_error());
    abort();
  }
}
#endif
