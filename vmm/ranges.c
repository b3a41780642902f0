/* SPDX-License-Identifier: Apache-2.0 */
/* ranges.c: a set of free ranges [start, start+len) of some space (sim's fake addresses,
 * the offsets of a host arena file): a sorted array, coalesced on every give-back, taken
 * from by first fit at an alignment. Sets are small (a few free extents), so the linear
 * search and the memmove are cheaper than a tree. Not thread-safe: the owner locks. */
#include "vmm_impl.h"

#include <stdlib.h>
#include <string.h>

static bool insert_at(expseg_ranges_t *s, size_t i, expseg_range_t r) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 16;
    expseg_range_t *t = realloc(s->r, cap * sizeof *t);
    if (!t) return false;
    s->r = t;
    s->cap = cap;
  }
  memmove(&s->r[i + 1], &s->r[i], (s->n - i) * sizeof *s->r);
  s->r[i] = r;
  s->n++;
  return true;
}

static void remove_at(expseg_ranges_t *s, size_t i) {
  memmove(&s->r[i], &s->r[i + 1], (s->n - i - 1) * sizeof *s->r);
  s->n--;
}

/* Carves [a, a+size) out of range i (which holds it): the head stays in place, the tail
 * goes after it. 1, or -1 when out of host memory (nothing changed). */
static int carve(expseg_ranges_t *s, size_t i, uint64_t a, uint64_t size, uint64_t *start) {
  const expseg_range_t e = s->r[i];
  const uint64_t end = a + size, eend = e.start + e.len;
  if (a > e.start) {
    if (end < eend && !insert_at(s, i + 1, (expseg_range_t){end, eend - end})) return -1;
    s->r[i].len = a - e.start;
  } else if (end < eend) {
    s->r[i] = (expseg_range_t){end, eend - end};
  } else {
    remove_at(s, i);
  }
  *start = a;
  return 1;
}

int _expseg_ranges_take(expseg_ranges_t *s, uint64_t size, uint64_t align, uint64_t *start) {
  for (size_t i = 0; i < s->n; i++) {
    const expseg_range_t e = s->r[i];
    uint64_t a = (e.start + align - 1) & ~(align - 1);
    if (a < e.start || a - e.start > e.len || size > e.len - (a - e.start)) continue;
    return carve(s, i, a, size, start);
  }
  return 0;
}

int _expseg_ranges_take_top(expseg_ranges_t *s, uint64_t size, uint64_t align,
                            uint64_t *start) {
  for (size_t i = s->n; i-- > 0;) {
    const expseg_range_t e = s->r[i];
    if (size > e.len) continue;
    uint64_t a = (e.start + e.len - size) & ~(align - 1);
    if (a < e.start) continue;
    return carve(s, i, a, size, start);
  }
  return 0;
}

bool _expseg_ranges_put(expseg_ranges_t *s, uint64_t start, uint64_t len) {
  size_t lo = 0, hi = s->n; /* first range after start */
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (s->r[mid].start < start) lo = mid + 1;
    else hi = mid;
  }
  bool join_prev = lo > 0 && s->r[lo - 1].start + s->r[lo - 1].len == start;
  bool join_next = lo < s->n && start + len == s->r[lo].start;
  if (join_prev && join_next) {
    s->r[lo - 1].len += len + s->r[lo].len;
    remove_at(s, lo);
  } else if (join_prev) {
    s->r[lo - 1].len += len;
  } else if (join_next) {
    s->r[lo].start = start;
    s->r[lo].len += len;
  } else {
    return insert_at(s, lo, (expseg_range_t){start, len});
  }
  return true;
}

void _expseg_ranges_free(expseg_ranges_t *s) {
  free(s->r);
  memset(s, 0, sizeof *s);
}
