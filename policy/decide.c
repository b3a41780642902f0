/* SPDX-License-Identifier: Apache-2.0 */
/* decide.c: decisions the allocator core used to make inline, as pure functions of the
 * configuration and the figures the core passes in: when the physical page cache is over
 * its bound, which hint an out-of-memory message gives (pools/oom.c writes the words), and
 * whose free memory may be taken across private pools, how many threads fault in a sleeping
 * region's host copy.
 * The oversize test, which the hit path asks, is inline in policy.h. docs/design.md. */
#include "policy.h"

uint32_t _expseg_sleep_fault_threads(size_t bytes, long cpus) {
  size_t want = bytes / EXPSEG_SLEEP_FAULT_SPAN;
  if (cpus > 0 && want > (size_t)cpus) want = (size_t)cpus;
  if (want > EXPSEG_SLEEP_FAULT_MAX) want = EXPSEG_SLEEP_FAULT_MAX;
  uint32_t n = 1;
  while ((size_t)n * 2 <= want) n *= 2;
  return n;
}

size_t _expseg_page_cache_excess(const expseg_config_t *c, size_t cached_bytes) {
  return cached_bytes > c->page_cache_max ? cached_bytes - c->page_cache_max : 0;
}

bool _expseg_pool_may_take(uint32_t taker, uint32_t owner, int owner_use_count,
                           size_t owner_busy) {
  return owner == taker || owner == 0 || (owner_use_count == 0 && owner_busy == 0);
}

expseg_oom_hint_t _expseg_oom_hint(const expseg_oom_facts_t *f) {
  if (f->too_large) return EXPSEG_HINT_TOO_LARGE;
  /* no batch size helps when one page (or classic segment) cannot fit: its size setting is
   * what to change */
  if (f->unit > f->total) return EXPSEG_HINT_UNIT_TOO_LARGE;
  /* va_reserve_mb sizes expandable reservations only; a classic segment reserves its size */
  if (f->address_space)
    return f->expandable ? EXPSEG_HINT_ADDRESS_SPACE : EXPSEG_HINT_ADDRESS_SPACE_CLASSIC;
  if (!f->expandable && f->held >= f->allocated && f->held - f->allocated >= f->rounded)
    return EXPSEG_HINT_STRANDED;
  if (f->capped) return EXPSEG_HINT_FRACTION;
  return EXPSEG_HINT_FULL;
}

expseg_oom_help_t _expseg_oom_help(const expseg_oom_facts_t *f) {
  /* the hint already names the only remedy */
  if (f->too_large || f->unit > f->total || f->address_space) return EXPSEG_HELP_NONE;
  if (f->other_pools >= f->rounded) /* empty_cache reaches only what live pools do not hold */
    return f->other_pools_live <= f->other_pools &&
                   f->other_pools - f->other_pools_live >= f->rounded
               ? EXPSEG_HELP_OTHER_POOLS
               : EXPSEG_HELP_LIVE_POOLS;
  if (f->other_streams >= f->rounded) return EXPSEG_HELP_OTHER_STREAMS;
  /* classic segments: the stranded hint names expandable_segments already */
  if (f->expandable && f->partial >= f->rounded) return EXPSEG_HELP_PAGE_SIZE;
  /* pinned pages would have served it: something was missing beyond the whole pages that
   * could move and the device's free memory, and it is at most what is pinned; and a lower
   * chunk_max_mb can still make chunks smaller (not when they are one page already) */
  const size_t pinned = f->pinned < f->whole ? f->pinned : f->whole;
  const size_t have = f->whole - pinned, got = f->device_free < SIZE_MAX - have
                                                    ? have + f->device_free
                                                    : SIZE_MAX;
  const bool lower = f->chunk_max == SIZE_MAX || f->unit == 0 || f->chunk_max / f->unit >= 2;
  if (f->expandable && lower && pinned > 0 && got < f->rounded && f->rounded - got <= pinned)
    return EXPSEG_HELP_CHUNK_MAX;
  return EXPSEG_HELP_NONE;
}
