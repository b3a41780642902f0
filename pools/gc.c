/* SPDX-License-Identifier: Apache-2.0 */
/* gc.c: garbage collection. When a request finds no free block and held memory is above
 * garbage_collection_threshold x allowed, policy/gc.c picks victims oldest first (by the
 * driver's clock, a->now_ns) among the whole idle chunks of expandable blocks, free classic
 * segments and cached chunks; this file gathers them and gives back what was chosen. */
#include "internal.h"
#include "release.h"

#include <stdlib.h>

/* Garbage collection (policy/gc.c decides): idle chunks, free classic segments and cached
 * chunks, oldest first, until held memory is under threshold x allowed, leaving `keep`
 * reclaimable bytes for the request that triggered it. A chunk goes back only whole and
 * never past what the target still needs (an idle block gives its top chunks), and only
 * when its stream's work is done. */
void _expseg_garbage_collect(expseg_allocator *a, size_t keep) {
  a->now_ns = _expseg_vmm_now_ns(a->drv); /* every miss passes here: free memory's clock */
  size_t target = _expseg_gc_target(&a->cfg, held_bytes(a), a->allowed);
  if (target == 0) return;
  /* PyTorch's garbage collection skips expandable memory (model.c) */
  const bool with_pages = !a->model_pytorch;
  size_t n = with_pages ? a->cache_count : 0;
  /* a live private pool's memory is its own: never collected (docs/design.md) */
  for (int p = 0; p < POOL_COUNT && with_pages; p++)
    for (block_t *b = a->idle_head[p]; b; b = b->idle_next) n += _expseg_seg_general(a, b->seg);
  for (segment_t *s = a->segments; s; s = s->next_all)
    n += _expseg_classic_is_free(s) && _expseg_seg_general(a, s);
  if (n == 0) return;
  expseg_gc_item_t *items = malloc(n * sizeof *items);
  if (items == NULL) return;
  size_t i = 0, reclaimable = 0;
  /* tags: a block (aligned), a classic segment (| 1) or cache entry c ((c << 2) | 2) */
  for (size_t c = 0; c < a->cache_count && with_pages; c++)
    items[i++] = (expseg_gc_item_t){.bytes = a->cache[c].size,
                                    .idle_since_ns = a->cache[c].idle_since,
                                    .tag = (c << 2) | 2};
  for (int p = 0; p < POOL_COUNT && with_pages; p++)
    for (block_t *b = a->idle_head[p]; b; b = b->idle_next) {
      uintptr_t lo, hi;
      if (!_expseg_seg_general(a, b->seg)) continue;
      items[i++] = (expseg_gc_item_t){
          .bytes = _expseg_block_chunks(a, b, &lo, &hi) * b->seg->page,
          .idle_since_ns = b->idle_since, .tag = (uintptr_t)b};
    }
  for (segment_t *s = a->segments; s; s = s->next_all)
    if (_expseg_classic_is_free(s) && _expseg_seg_general(a, s))
      items[i++] = (expseg_gc_item_t){
          .bytes = s->va_size, .idle_since_ns = s->first->idle_since, .tag = (uintptr_t)s | 1};
  for (size_t j = 0; j < n; j++) reclaimable += items[j].bytes;
  target = _expseg_gc_target_for_request(target, reclaimable, keep);
  size_t k = _expseg_gc_select(items, n, target, a->now_ns);
  size_t before = held_bytes(a), n_cached = 0, left = target;
  size_t *cached = malloc((a->cache_count ? a->cache_count : 1) * sizeof *cached);
  release_batch_t rb = {0};
  stream_seen_t seen[SEEN_MAX];
  size_t n_seen = 0;
  for (size_t v = 0; v < k && left > 0 && cached != NULL; v++) {
    uintptr_t tag = items[v].tag;
    size_t gone = 0;
    if ((tag & 3) == 2) {
      if (items[v].bytes > left) continue; /* a chunk goes whole: not past the target */
      cached[n_cached++] = tag >> 2; /* given back below, once no index moves */
      gone = items[v].bytes;
    } else if (tag & 1) {
      segment_t *s = (segment_t *)(tag & ~(uintptr_t)1);
      size_t size = s->va_size;
      if (_expseg_classic_release(a, s, &rb, false, seen, &n_seen)) gone = size;
    } else {
      block_t *b = (block_t *)tag;
      if (!_expseg_stream_idle(a, b->stream, false, seen, &n_seen, SEEN_MAX)) continue;
      uintptr_t lo, hi;
      const size_t pg = b->seg->page;
      if (_expseg_block_chunks(a, b, &lo, &hi) == 0) continue;
      /* whole chunks from the top, never more than the target (which leaves the request
       * what it can use: a chunk goes back only whole) */
      uintptr_t from = _expseg_chunks_top(b->seg, lo, hi, left / pg, SIZE_MAX, true);
      if (from == hi) continue;
      expseg_status st;
      const size_t top = a->cache_count;
      size_t moved = _expseg_unmap_pages(a, b, from, hi, &st);
      /* what it unmapped went on top of the cache: give it back at once */
      while (a->cache_count > top) _expseg_cache_release_at(a, a->cache_count - 1, &rb);
      gone = moved * pg;
    }
    left = gone >= left ? 0 : left - gone;
  }
  free(items);
  /* the cached victims, highest index first (the others keep theirs) */
  for (size_t x = 1; x < n_cached; x++)
    for (size_t y = x; y > 0 && cached[y - 1] < cached[y]; y--) {
      size_t t = cached[y];
      cached[y] = cached[y - 1];
      cached[y - 1] = t;
    }
  for (size_t x = 0; x < n_cached; x++) _expseg_cache_release_at(a, cached[x], &rb);
  free(cached);
  a->stats.gc_released_bytes += (int64_t)(before - held_bytes(a));
  _expseg_batch_flush(a, &rb);
}
