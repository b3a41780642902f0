/* bins.h: the allocator's hit path, inline. Exact-size bins (jemalloc's cache bins) hold
 * freed blocks unmerged, one LIFO list per (stream, pool, size), in front of the best-fit
 * index: a hit is a hash probe and a pop, a free a probe and a push. The slow parts (table
 * growth, flushes into the index, the low-water trim, the check) are in bins.c. */
#ifndef EXPSEG_POOLS_BINS_H
#define EXPSEG_POOLS_BINS_H

#include "internal.h"

#define EXPSEG_BINS_TRIM_EVERY 4096 /* pushes between two low-water trims */

static inline size_t bin_key(size_t size, int pool) { return size | (size_t)pool; }

static inline size_t bin_hash(expseg_stream stream, size_t key, size_t cap) {
  uint64_t h = ((uint64_t)key >> 9) * 0x9E3779B97F4A7C15ull ^ (uint64_t)stream * 0xC2B2AE3D27D4EB4Full;
  return (size_t)(h >> 40) & (cap - 1);
}

/* The bin of (stream, key), or NULL when there is none. */
static inline bin_t *bin_find(const expseg_allocator *a, expseg_stream stream, size_t key) {
  if (a->cap_bins == 0) return NULL;
  for (size_t i = bin_hash(stream, key, a->cap_bins);; i = (i + 1) & (a->cap_bins - 1)) {
    bin_t *bin = &a->bins[i];
    if (bin->key == key && bin->stream == stream) return bin;
    if (bin->key == 0) return NULL;
  }
}

static inline void bin_link(expseg_allocator *a, bin_t *bin, block_t *b) {
  b->state = BLOCK_BINNED;
  b->left = bin->head;
  bin->head = b;
  bin->n++;
  a->binned_bytes += b->size;
}

/* A block of exactly rounded bytes on (stream, pool) from its bin, or NULL. */
static inline block_t *_expseg_bin_pop(expseg_allocator *a, expseg_stream stream, int pool,
                                       size_t rounded) {
  bin_t *bin = bin_find(a, stream, bin_key(rounded, pool));
  if (bin == NULL || bin->head == NULL) return NULL;
  block_t *b = bin->head;
  bin->head = b->left;
  if (--bin->n < bin->low) bin->low = bin->n;
  a->binned_bytes -= b->size;
  b->left = NULL;
  return b;
}

bool _expseg_bin_push_slow(expseg_allocator *a, block_t *b); /* bins.c */

/* Can freed block b wait in a bin? Only with hit_bins:True (off by default: bins raise peak
 * memory on some recorded runs, docs/benchmarks.md); not when merging is PyTorch's behaviour
 * (model), nor for single-chunk and oversize blocks (few and large: they go to the index). */
static inline bool bin_eligible(const expseg_allocator *a, const block_t *b) {
  return a->cfg.hit_bins && !a->model_pytorch && !_expseg_is_oversize(&a->cfg, b->size) &&
         !b->seg->single;
}

/* Puts freed block b (statistics already updated) into its bin; false: no bin could be
 * made (no host memory), the caller frees it into the index. */
static inline bool _expseg_bin_push(expseg_allocator *a, block_t *b) {
  bin_t *bin = bin_find(a, b->stream, bin_key(b->size, b->seg->pool));
  if (bin == NULL || --a->bin_countdown <= 0) return _expseg_bin_push_slow(a, b);
  bin_link(a, bin, b);
  return true;
}

/* ---- bins.c ---- */
/* Every binned block back into the free index, merged (before growing, GC, releases, a
 * configuration change, a snapshot). */
void _expseg_bins_flush(expseg_allocator *a);
void _expseg_bins_destroy(expseg_allocator *a);
/* The largest run of adjacent free blocks holding a binned one (what it would merge to). */
size_t _expseg_bins_largest_run(const expseg_allocator *a);
/* expseg_check: every bin's list agrees with its count, holds binned blocks of its key. */
expseg_status _expseg_bins_check(const expseg_allocator *a, int64_t *blocks);

#endif
