/* SPDX-License-Identifier: Apache-2.0 */
/* model.c: the switch that makes the allocator behave as PyTorch's caching allocator (>= 2.5)
 * where expseg deliberately differs, for expseg-replay --model pytorch (docs/replay.md,
 * "Models"). It is no configuration key: only the replay tool sets it, through this
 * internal entry point. With it on, expandable segments are PyTorch's (its
 * ExpandableSegment): a segment per (stream, pool) reserving 9/8 of device memory, pages
 * of 2 MiB in the small pool and large_segment_size_mb in the large one (one physical
 * chunk each, created on map, one map per page and one set_access per mapped range,
 * released as it is unmapped: segment.c), growth only with new pages to exactly what the
 * request needs counted in pages from the segment's base (no growth floor, no page moved
 * from another place, stream or pool, no page cache), garbage collection skipping
 * expandable memory (gc.c), the out-of-memory retry unmapping every free page
 * (segment.c), and PyTorch's get_free_block: best fit adjusted for room to expand, and
 * the oversize rules of max_split_size_mb / max_non_split_rounding_mb on expandable blocks
 * too (below). */
#include "block.h"
#include "fidx.h"
#include "internal.h"

expseg_status _expseg_set_model_pytorch(expseg_allocator *a, bool on) {
  if (a == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "set_model_pytorch: allocator is NULL");
  pthread_mutex_lock(&a->lock);
  a->model_pytorch = on;
  pthread_mutex_unlock(&a->lock);
  return EXPSEG_OK;
}

size_t _expseg_pool_page(const expseg_allocator *a, int pool) {
  if (!a->model_pytorch) return a->page;
  /* kSmallBuffer and large_segment_size, as ExpandableSegment's segment_size_ */
  size_t pg = pool == POOL_LARGE ? a->cfg.large_segment_size : EXPSEG_SMALL_BUFFER;
  return _expseg_round_up(pg, a->granularity);
}

uintptr_t _expseg_model_map_end(const expseg_allocator *a, const block_t *u, int pool,
                                uintptr_t need) {
  (void)a;
  (void)pool;
  const uintptr_t base = u->seg->base, uend = u->ptr + u->size;
  uintptr_t hi = base + _expseg_round_up(need - base, u->seg->page);
  return hi > uend ? uend : hi;
}

/* What an expandable free block could grow to: its size and the unmapped block after it. */
static size_t expandable_size(const block_t *b) {
  return b->size + (b->next != NULL && !b->next->mapped ? b->next->size : 0);
}

block_t *_expseg_model_find_free(expseg_allocator *a, int pool, expseg_stream stream,
                                 size_t rounded) {
  fidx_t *f = &a->free_idx;
  block_t *b = _expseg_fidx_best(f, pool, stream, rounded);
  if (b == NULL) return NULL;
  /* PyTorch counts a block's room to expand for best fit: it moves on to the next larger
   * block while that one could expand less (the end of a segment is kept for growth). The
   * next block in (size, address) order is the best fit once the visited ones are out of
   * the index; they go back after (a walk of more than 8 is cut there). */
  block_t *out[8];
  size_t n_out = 0;
  while (b->seg->expandable && n_out < 8) {
    _expseg_fidx_remove(f, b);
    out[n_out++] = b;
    block_t *n = _expseg_fidx_best(f, pool, stream, rounded);
    if (n == NULL || expandable_size(n) >= expandable_size(b)) break;
    b = n;
  }
  for (size_t i = n_out; i-- > 0;) _expseg_fidx_insert(f, out[i]);
  if (!_expseg_oversize_ok(&a->cfg, rounded, b->size)) return NULL;
  _expseg_free_remove(a, b);
  return b;
}
