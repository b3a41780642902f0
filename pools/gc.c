/* gc.c: garbage collection. When a request finds no free block and held memory is above
 * garbage_collection_threshold x allowed, policy/gc.c picks victims oldest first (by the
 * driver's clock, a->now_ns) among idle whole pages of expandable blocks, free classic
 * segments and cached pages; this file gathers them and gives back what was chosen. */
#include "internal.h"
#include "release.h"

#include <stdlib.h>

/* Garbage collection (policy/gc.c decides): idle free pages, free classic segments and
 * cached pages, oldest first, until held memory is under threshold x allowed, leaving
 * `keep` reclaimable bytes for the request that triggered it. A victim is released only
 * as far as the target still needs (an idle block gives its top pages), and only when its
 * stream's work is done. */
void _expseg_garbage_collect(expseg_allocator *a, size_t keep) {
  a->now_ns = _expseg_vmm_now_ns(a->drv); /* every miss passes here: free memory's clock */
  size_t target = _expseg_gc_target(&a->cfg, held_bytes(a), a->allowed);
  if (target == 0) return;
  /* PyTorch's garbage collection skips expandable memory (model.c) */
  const bool with_pages = !a->model_pytorch;
  size_t n = with_pages ? a->cache_count : 0;
  for (int p = 0; p < POOL_COUNT && with_pages; p++)
    for (block_t *b = a->idle_head[p]; b; b = b->idle_next) n++;
  for (segment_t *s = a->segments; s; s = s->next_all) n += _expseg_classic_is_free(s);
  if (n == 0) return;
  expseg_gc_item_t *items = malloc(n * sizeof *items);
  if (items == NULL) return;
  size_t i = 0, reclaimable = 0;
  for (size_t c = 0; c < a->cache_count && with_pages; c++)
    items[i++] = (expseg_gc_item_t){.bytes = a->page, .idle_since_ns = a->cache[c].idle_since};
  for (int p = 0; p < POOL_COUNT && with_pages; p++)
    for (block_t *b = a->idle_head[p]; b; b = b->idle_next)
      items[i++] = (expseg_gc_item_t){
          .bytes = _expseg_block_whole_pages(a, b, NULL) * a->page,
          .idle_since_ns = b->idle_since, .tag = (uintptr_t)b};
  for (segment_t *s = a->segments; s; s = s->next_all)
    if (_expseg_classic_is_free(s))
      items[i++] = (expseg_gc_item_t){
          .bytes = s->va_size, .idle_since_ns = s->first->idle_since, .tag = (uintptr_t)s | 1};
  for (size_t j = 0; j < n; j++) reclaimable += items[j].bytes;
  target = _expseg_gc_target_for_request(target, reclaimable, keep);
  size_t k = _expseg_gc_select(items, n, target, a->now_ns);
  size_t before = held_bytes(a), cached_victims = 0, unmapped = 0, left = target;
  release_batch_t rb = {0};
  stream_seen_t seen[SEEN_MAX];
  size_t n_seen = 0;
  for (size_t v = 0; v < k && left > 0; v++) {
    uintptr_t tag = items[v].tag;
    size_t gone = 0;
    if (tag == 0) {
      cached_victims++;
      gone = a->page;
    } else if (tag & 1) {
      segment_t *s = (segment_t *)(tag & ~(uintptr_t)1);
      size_t size = s->va_size;
      if (_expseg_classic_release(a, s, &rb, false, seen, &n_seen)) gone = size;
    } else {
      block_t *b = (block_t *)tag;
      if (!_expseg_stream_idle(a, b->stream, false, seen, &n_seen, SEEN_MAX)) continue;
      uintptr_t first;
      size_t pages = _expseg_block_whole_pages(a, b, &first);
      size_t need = (left + a->page - 1) / a->page;
      size_t take = pages < need ? pages : need;
      uintptr_t lo = first + (pages - take) * a->page;
      expseg_status st;
      size_t moved = _expseg_unmap_pages(a, b, lo, lo + take * a->page, &st);
      unmapped += moved;
      gone = moved * a->page;
    }
    left = gone >= left ? 0 : left - gone;
  }
  free(items);
  /* cached pages are interchangeable: give back as many as were chosen or unmapped */
  _expseg_cache_release_oldest(a, cached_victims + unmapped, &rb);
  a->stats.gc_released_bytes += (int64_t)(before - held_bytes(a));
  _expseg_batch_flush(a, &rb);
}
