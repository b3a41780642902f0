/* SPDX-License-Identifier: Apache-2.0 */
/* round.c: the size policy as pure functions of (config, sizes): request rounding with
 * roundup_power2_divisions, classic segment sizes, the split rule, the oversize rules of
 * max_split_size / max_non_split_rounding (classic segments only), the expandable page size
 * and the memory-fraction cap. Each matches PyTorch's CUDACachingAllocator (see
 * docs/config.md and the reference, section 2); overflow gives 0 rather than wrapping.
 * Sizes of 2^60 bytes and more are refused (0) before any rounding, as PyTorch refuses them
 * as out of memory before it rounds. */
#include "policy.h"
#include "round.h"
#include "text.h"

#include <string.h>

size_t _expseg_round_size(const expseg_config_t *c, size_t size) {
  return _expseg_round_size_inline(c, size);
}

/* expandable_segments_reserve in bytes: a fraction of total, or GiB; saturates. */
static size_t reserve_bytes(const expseg_config_t *c, size_t total) {
  double v = c->expandable_segments_reserve;
  v = c->expandable_segments_reserve_gib ? v * 1073741824.0 : v * (double)total;
  if (!(v < 18446744073709551615.0)) return SIZE_MAX;
  return (size_t)v;
}

size_t _expseg_grow_bytes(size_t need, size_t segment_mapped) {
  size_t floor = segment_mapped / EXPSEG_GROW_DIVISOR;
  return need > floor ? need : floor;
}

/* the most bytes a growth may map as one chunk (its request's own pages apart) */
static size_t one_chunk(void) {
  return EXPSEG_LARGE_GROW_MIN > EXPSEG_CHUNK_MAX ? EXPSEG_LARGE_GROW_MIN : EXPSEG_CHUNK_MAX;
}

size_t _expseg_chunk_pages(bool pytorch, size_t left, size_t page, bool request, size_t want) {
  if (pytorch || page == 0) return left > 0 ? 1 : 0;
  if (!request && want <= one_chunk() / page) return left;
  size_t most = (request ? EXPSEG_REQUEST_CHUNK_MAX : EXPSEG_CHUNK_MAX) / page;
  if (most == 0) most = 1;
  return left < most ? left : most;
}

size_t _expseg_request_pages(size_t want, size_t request, size_t page, size_t bytes) {
  if (page == 0) return 0;
  if (want <= one_chunk() / page) /* one chunk, unless a request of a chunk or more */
    return request < want && (request >= EXPSEG_CHUNK_MAX / page || bytes >= EXPSEG_CHUNK_MAX)
               ? request
               : 0;
  return request < want ? request : want;
}

size_t _expseg_chunk_limit(size_t pages, size_t chunk_max, size_t page) {
  if (page == 0 || chunk_max == SIZE_MAX) return pages;
  size_t most = chunk_max / page;
  if (most == 0) most = 1;
  return pages < most ? pages : most;
}

bool _expseg_place_better(bool have_own, size_t own_pages, size_t other_pages) {
  return !have_own || other_pages < own_pages;
}

bool _expseg_place_fewest_pages(bool memory_short) { return memory_short; }

bool _expseg_place_fewer(size_t missing, size_t pages, size_t best_missing, size_t best_pages) {
  return missing != best_missing ? missing < best_missing : pages < best_pages;
}

bool _expseg_lend_look(size_t streams, size_t rounded, size_t own) {
  return _expseg_lend_look_inline(streams, rounded, own);
}

bool _expseg_lend_tighter(size_t own, size_t other) { return own == 0 || other < own; }

/* held + add within permille / 1000 x allocated + EXPSEG_TIGHT_SLACK (no wrap for sizes
 * below 2^60) */
static bool within(size_t held, size_t add, size_t allocated, size_t permille) {
  const size_t bound =
      allocated / 1000 * permille + allocated % 1000 * permille / 1000 + EXPSEG_TIGHT_SLACK;
  return held <= bound && add <= bound - held;
}

bool _expseg_move_first(size_t held, size_t add, size_t allocated) {
  /* a variable, not the macro: a build with -DEXPSEG_MOVE_PERMILLE=0 compares with 0 */
  const size_t permille = EXPSEG_MOVE_PERMILLE;
  return permille == 0 || !within(held, add, allocated, permille);
}

size_t _expseg_suffix_keep(bool any, size_t needed) { return any ? needed : SIZE_MAX; }

bool _expseg_grow_tight(size_t held, size_t allocated, size_t exact, size_t grow) {
  return exact < grow && !within(held, grow, allocated, EXPSEG_TIGHT_PERMILLE);
}

size_t _expseg_grow_for(size_t need, size_t page, size_t segment_mapped, bool small,
                        size_t held, size_t allocated, size_t request) {
  size_t grow = _expseg_grow_bytes(need, segment_mapped);
  /* a variable, not the macro: a build with -DEXPSEG_LARGE_GROW_MIN=0 compares with 0 */
  const size_t least = EXPSEG_LARGE_GROW_MIN;
  if (small && grow < EXPSEG_SMALL_GROW_MIN) grow = EXPSEG_SMALL_GROW_MIN;
  if (!small && grow < least && request < EXPSEG_CHUNK_MAX &&
      within(held, _expseg_round_up(least, page), allocated, EXPSEG_GROW_MIN_PERMILLE))
    grow = least;
  return _expseg_grow_tight(held, allocated, _expseg_round_up(need, page),
                            _expseg_round_up(grow, page))
             ? need
             : grow;
}

bool _expseg_may_take_back(uint64_t robbed, uint64_t now) {
  return robbed == 0 || now - robbed >= EXPSEG_NO_TAKE_BACK;
}

bool _expseg_class_reserve(const expseg_config_t *c, const char *cls, size_t total,
                           size_t *bytes) {
  size_t n = cls ? strlen(cls) : 0;
  if (n == 0) return false;
  /* the list as the parser keeps it: name:value entries, ',' between (names hold neither) */
  for (const char *e = c->expandable_segments_reserve_by_class; *e;) {
    const char *colon = strchr(e, ':'), *end = strchr(e, ',');
    if (!end) end = e + strlen(e);
    if (!colon || colon > end) return false; /* not the parser's text */
    if ((size_t)(colon - e) == n && !memcmp(e, cls, n)) {
      const char *v = colon + 1;
      size_t vn = (size_t)(end - v);
      bool gib = vn > 0 && (v[vn - 1] == 'G' || v[vn - 1] == 'g');
      double x;
      if (!_expseg_read_stream_double(v, gib ? vn - 1 : vn, &x) || !(x > 0)) return false;
      x = gib ? x * 1073741824.0 : x * (double)total;
      *bytes = x < 18446744073709551615.0 ? (size_t)x : SIZE_MAX;
      return true;
    }
    e = *end ? end + 1 : end;
  }
  return false;
}

size_t _expseg_segment_va(const expseg_config_t *c, bool small, size_t existing, size_t need,
                          size_t total, size_t page, const char *cls) {
  size_t va = EXPSEG_VA_FIRST, limit = SIZE_MAX, class_va; /* the default: any device */
  if (_expseg_class_reserve(c, cls, total, &class_va)) {
    /* the stream's class: every segment reserves this (bounded to 9/8 of device memory, as
     * PyTorch bounds it), never doubled */
    va = class_va < total + total / 8 ? class_va : total + total / 8;
    existing = 0;
  } else if (c->va_reserve) {
    va = c->va_reserve;
    limit = _expseg_round_up(total + total / 8, page);
  } else if (c->expandable_segments_reserve > 0) {
    /* PyTorch bounds a reserve to its full reserve, 9/8 of device memory */
    limit = _expseg_round_up(total + total / 8, page);
    va = reserve_bytes(c, total);
    if (va > total + total / 8) va = total + total / 8;
  }
  if (small) va /= 8;
  if (va < 64 * page) va = 64 * page;
  va = _expseg_round_up(va, page);
  for (size_t i = 0; i < existing && i < 4 && va < limit / 2; i++) va *= 2;
  return va < need ? _expseg_round_up(need, page) : va;
}

size_t _expseg_classic_segment_size(const expseg_config_t *c, size_t rounded) {
  if (rounded <= EXPSEG_SMALL_SIZE) return EXPSEG_SMALL_BUFFER;
  if (rounded < EXPSEG_MIN_LARGE_ALLOC) return c->large_segment_size;
  return _expseg_round_up(rounded, EXPSEG_ROUND_LARGE);
}

bool _expseg_oversize_ok(const expseg_config_t *c, size_t rounded, size_t candidate) {
  const bool big = _expseg_is_oversize(c, rounded);
  if (!big && _expseg_is_oversize(c, candidate)) return false;
  if (big && c->max_non_split_rounding <= SIZE_MAX - rounded &&
      candidate >= rounded + c->max_non_split_rounding)
    return false;
  return true;
}

size_t _expseg_page_size(const expseg_config_t *c, size_t granularity) {
  if (granularity == 0) return c->page_size;
  if (c->page_size == 0) return granularity;
  return _expseg_round_up(c->page_size, granularity);
}

size_t _expseg_carve_segment_size(size_t held, size_t cls, size_t page) {
  enum { CARVE_SHARE = 32 };
  const size_t lo = (size_t)2 << 20, hi = (size_t)256 << 20;
  size_t s = held / CARVE_SHARE;
  if (s < lo) s = lo;
  if (s > hi) s = hi;
  s = _expseg_round_up(s, page);
  return s > cls ? s : cls;
}

bool _expseg_carve_may_take(bool strict, size_t free_size, bool whole, size_t fresh) {
  return !strict || !whole || free_size <= fresh;
}

size_t _expseg_allowed_bytes(double fraction, size_t total) {
  if (fraction >= 1.0) return SIZE_MAX;
  if (!(fraction > 0.0)) return 0; /* 0, negative or NaN */
  double v = fraction * (double)total;
  if (v >= 18446744073709551615.0) return SIZE_MAX;
  return (size_t)v;
}
