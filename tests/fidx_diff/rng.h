/* rng.h: the harnesses' xorshift64 generator (seeded by the caller through rng). */
#ifndef EXPSEG_FIDX_DIFF_RNG_H
#define EXPSEG_FIDX_DIFF_RNG_H
#include <stdint.h>
static uint64_t rng;
static uint64_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}
#endif
