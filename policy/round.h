/* SPDX-License-Identifier: Apache-2.0 */
/* round.h: request rounding as an inline pure function, so that the allocator's hit path
 * rounds without a call: log2 by count-leading-zeros (_expseg_log2_floor, policy.h), steps
 * that are powers of two by a mask. _expseg_round_size (round.c) is this function; the rules are documented there.
 * Also the hit path's test of lending a tighter fit (_expseg_lend_look, policy.h). */
#ifndef EXPSEG_POLICY_ROUND_H
#define EXPSEG_POLICY_ROUND_H

#include "policy.h"

static inline size_t _expseg_round_size_inline(const expseg_config_t *c, size_t size) {
  if (size >= EXPSEG_MAX_REQUEST) return 0;
  if (size < EXPSEG_MIN_BLOCK) return EXPSEG_MIN_BLOCK;
  unsigned lg = _expseg_log2_floor(size);
  int idx = (int)lg - 20;
  if (idx < 0) idx = 0;
  if (idx > EXPSEG_ROUNDUP_INTERVALS - 1) idx = EXPSEG_ROUNDUP_INTERVALS - 1;
  uint64_t div = c->roundup_power2_divisions[idx];
  size_t step = EXPSEG_MIN_BLOCK;
  /* PyTorch applies the divisions only when size > 512 x divisions (a 64-bit product that
   * wraps for divisions >= 2^55, as in PyTorch); sizes below 2^60 cannot overflow here. */
  if (div > 1 && (uint64_t)size > (uint64_t)EXPSEG_MIN_BLOCK * div) {
    if ((size & (size - 1)) == 0) return size;
    size_t floor2 = (size_t)1 << lg;
    step = floor2 >> _expseg_log2_floor((size_t)div);
    if (step == 0) return 2 * floor2;
  }
  return (size + step - 1) & ~(step - 1); /* step is a power of two; size < 2^60 */
}

/* _expseg_lend_look (policy.h: lending a tighter fit), inline for the hit path */
static inline bool _expseg_lend_look_inline(size_t streams, size_t rounded, size_t own) {
  return streams > 1 && (own == 0 || (own >= rounded && own - rounded >= EXPSEG_LEND_WASTE));
}

#endif
