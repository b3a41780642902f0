/* SPDX-License-Identifier: Apache-2.0 */
/* gc.c: garbage-collection decisions. With a memory fraction below 1 and a
 * garbage_collection_threshold > 0, the allocator reclaims idle cached memory once what it
 * holds exceeds threshold x allowed: the target is the excess, and the victims are the items
 * idle the longest, taken until their bytes reach the target. The caller (pools/) passes the
 * items (classic free segments, idle mapped pages of expandable segments, cached physical
 * pages) and the time; nothing here reads a clock or allocates. PyTorch instead frees, in
 * passes, every classic block at least as old as the average and skips expandable segments;
 * see docs/config.md. */
#include "policy.h"

size_t _expseg_gc_target(const expseg_config_t *c, size_t held, size_t allowed) {
  if (!(c->garbage_collection_threshold > 0.0) || !(c->per_process_memory_fraction < 1.0) ||
      allowed == SIZE_MAX)
    return 0;
  double limit_d = c->garbage_collection_threshold * (double)allowed;
  size_t limit = limit_d >= 18446744073709551615.0 ? SIZE_MAX : (size_t)limit_d;
  return held > limit ? held - limit : 0;
}

/* true when a should be released before b */
static bool before(const expseg_gc_item_t *a, const expseg_gc_item_t *b, uint64_t now) {
  uint64_t ta = a->idle_since_ns < now ? a->idle_since_ns : now;
  uint64_t tb = b->idle_since_ns < now ? b->idle_since_ns : now;
  if (ta != tb) return ta < tb;
  if (a->bytes != b->bytes) return a->bytes > b->bytes;
  return a->order < b->order;
}

static void swap(expseg_gc_item_t *a, expseg_gc_item_t *b) {
  expseg_gc_item_t t = *a;
  *a = *b;
  *b = t;
}

/* Heap with the next victim at the root. */
static void sift_down(expseg_gc_item_t *h, size_t n, size_t i, uint64_t now) {
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && before(&h[l], &h[m], now)) m = l;
    if (r < n && before(&h[r], &h[m], now)) m = r;
    if (m == i) return;
    swap(&h[i], &h[m]);
    i = m;
  }
}

size_t _expseg_gc_select(expseg_gc_item_t *items, size_t n, size_t target, uint64_t now_ns) {
  if (target == 0 || n == 0) return 0;
  for (size_t i = 0; i < n; i++) items[i].order = i;
  for (size_t i = n / 2; i-- > 0;) sift_down(items, n, i, now_ns);
  /* Pop victims to the back of the array (the first victim lands at n-1), then reverse
   * the whole array so that they come first, oldest first: O(n + k log n). */
  size_t m = n, got = 0, k = 0;
  while (m > 0 && got < target) {
    got = items[0].bytes > SIZE_MAX - got ? SIZE_MAX : got + items[0].bytes;
    swap(&items[0], &items[m - 1]);
    m--;
    k++;
    sift_down(items, m, 0, now_ns);
  }
  for (size_t i = 0, j = n - 1; i < j; i++, j--) swap(&items[i], &items[j]);
  return k;
}

size_t _expseg_gc_target_for_request(size_t target, size_t reclaimable, size_t keep) {
  size_t most = reclaimable > keep ? reclaimable - keep : 0;
  return target < most ? target : most;
}
