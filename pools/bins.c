/* bins.c: the slow half of the exact-size bins (bins.h has the hit path).
 *
 * The table is open addressing with linear probing over (stream, size | pool), at most half
 * full, at most 65,536 slots (past that a freed block simply goes to the index). A bin lives
 * until the next flush or trim that empties it. Blocks leave the bins for the best-fit index,
 * merged with their free neighbours, on:
 *  - a miss of the index (before garbage collection and growth: memory is never grown, nor
 *    pages collected, while a binned block could serve or merge), empty_cache, the OOM path,
 *    a configuration change, a snapshot (alloc.c, snapshot.c call _expseg_bins_flush);
 *  - the low-water trim every EXPSEG_BINS_TRIM_EVERY pushes: each bin gives back three
 *    quarters of the fewest blocks it held since the last trim (the blocks that sat unused
 *    all that time), as jemalloc's tcache GC does; emptied bins leave the table. */
#include "bins.h"

#include <stdlib.h>
#include <string.h>

#define BINS_MIN_CAP 64
#define BINS_MAX_CAP 65536

/* Back into the index, merged (statistics: the deferred inactive_split change). */
static void unbin(expseg_allocator *a, bin_t *bin) {
  block_t *b = bin->head;
  bin->head = b->left;
  bin->n--;
  a->binned_bytes -= b->size;
  b->left = NULL;
  b->state = BLOCK_FREE;
  _expseg_free_insert(a, _expseg_block_coalesce(a, b));
}

/* The table rebuilt at cap slots with only the bins that hold blocks. */
static bool rehash(expseg_allocator *a, size_t cap) {
  bin_t *t = calloc(cap, sizeof *t);
  if (t == NULL) return false;
  size_t used = 0;
  for (size_t i = 0; i < a->cap_bins; i++) {
    bin_t *o = &a->bins[i];
    if (o->key == 0 || o->n == 0) continue;
    size_t j = bin_hash(o->stream, o->key, cap);
    while (t[j].key != 0) j = (j + 1) & (cap - 1);
    t[j] = *o;
    used++;
  }
  free(a->bins);
  a->bins = t;
  a->cap_bins = cap;
  a->n_bins = used;
  return true;
}

static void trim(expseg_allocator *a) {
  bool emptied = false;
  for (size_t i = 0; i < a->cap_bins; i++) {
    bin_t *bin = &a->bins[i];
    if (bin->key == 0) continue;
    for (uint32_t k = bin->low - bin->low / 4; k > 0 && bin->head != NULL; k--) unbin(a, bin);
    bin->low = bin->n;
    emptied |= bin->n == 0;
  }
  if (emptied) (void)rehash(a, a->cap_bins); /* on failure the empty bins just stay */
}

bool _expseg_bin_push_slow(expseg_allocator *a, block_t *b) {
  if (a->bin_countdown <= 0) {
    trim(a);
    a->bin_countdown = EXPSEG_BINS_TRIM_EVERY;
  }
  size_t key = bin_key(b->size, b->seg->pool);
  bin_t *bin = bin_find(a, b->stream, key);
  if (bin == NULL) {
    if ((a->n_bins + 1) * 2 > a->cap_bins) {
      size_t cap = a->cap_bins ? a->cap_bins * 2 : BINS_MIN_CAP;
      if (cap > BINS_MAX_CAP || !rehash(a, cap)) return false;
    }
    size_t i = bin_hash(b->stream, key, a->cap_bins);
    while (a->bins[i].key != 0) i = (i + 1) & (a->cap_bins - 1);
    bin = &a->bins[i];
    *bin = (bin_t){.key = key, .stream = b->stream};
    a->n_bins++;
  }
  bin_link(a, bin, b);
  return true;
}

void _expseg_bins_flush(expseg_allocator *a) {
  if (a->n_bins == 0) return;
  for (size_t i = 0; i < a->cap_bins; i++)
    while (a->bins[i].head != NULL) unbin(a, &a->bins[i]);
  memset(a->bins, 0, a->cap_bins * sizeof *a->bins);
  a->n_bins = 0;
}

size_t _expseg_bins_largest_run(const expseg_allocator *a) {
  size_t m = 0;
  for (size_t i = 0; a->binned_bytes > 0 && i < a->cap_bins; i++)
    for (const block_t *b = a->bins[i].head; b != NULL; b = b->left) {
      const block_t *x = b;
      while (freeish(x->prev)) x = x->prev;
      if (x != b && x->state == BLOCK_BINNED) continue; /* counted from that one */
      size_t run = 0;
      for (; freeish(x); x = x->next) run += x->size;
      if (run > m) m = run;
    }
  return m;
}

void _expseg_bins_destroy(expseg_allocator *a) {
  free(a->bins);
  a->bins = NULL;
  a->cap_bins = a->n_bins = 0;
}

#define FAIL(...) return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_check: " __VA_ARGS__)

expseg_status _expseg_bins_check(const expseg_allocator *a, int64_t *blocks) {
  size_t used = 0, bytes = 0;
  *blocks = 0;
  for (size_t i = 0; i < a->cap_bins; i++) {
    const bin_t *bin = &a->bins[i];
    if (bin->key == 0) continue;
    used++;
    if (bin_find(a, bin->stream, bin->key) != bin)
      FAIL("bin of %zu bytes (stream %llu) cannot be found by its key", bin->key & ~(size_t)1,
           (unsigned long long)bin->stream);
    uint32_t n = 0;
    for (const block_t *b = bin->head; b != NULL; b = b->left, n++) {
      if (b->state != BLOCK_BINNED || b->indexed || !b->mapped)
        FAIL("block %#lx in a bin is not a binned mapped block", (unsigned long)b->ptr);
      if (b->stream != bin->stream || bin_key(b->size, b->seg->pool) != bin->key)
        FAIL("block %#lx (+%zu) is in the bin of %zu bytes", (unsigned long)b->ptr, b->size,
             bin->key & ~(size_t)1);
      bytes += b->size;
      if (n >= bin->n) FAIL("bin of %zu bytes: more blocks listed than its count %u (a loop?)",
                            bin->key & ~(size_t)1, bin->n);
    }
    if (n != bin->n || bin->low > bin->n)
      FAIL("bin of %zu bytes: %u blocks listed, count %u, low water %u", bin->key & ~(size_t)1,
           n, bin->n, bin->low);
    *blocks += n;
  }
  if (used != a->n_bins) FAIL("%zu bins in the table, %zu counted", used, a->n_bins);
  if (bytes != a->binned_bytes) FAIL("bins hold %zu bytes, %zu counted", bytes, a->binned_bytes);
  return EXPSEG_OK;
}
