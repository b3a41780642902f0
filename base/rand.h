/* SPDX-License-Identifier: Apache-2.0 */
/* rand.h: the one pseudo-random generator of expseg's C code, splitmix64 (Steele, Lea and
 * Flood), header-only so every layer uses the same one: the ledger's treap priorities
 * (vmm/), the tools' seeded workloads and benchmarks (bench/). A seed is any 64-bit value;
 * the state advances by the golden-ratio increment and each output is a mix of it. */
#ifndef EXPSEG_BASE_RAND_H
#define EXPSEG_BASE_RAND_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline uint64_t _expseg_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

#ifdef __cplusplus
}
#endif

#endif
