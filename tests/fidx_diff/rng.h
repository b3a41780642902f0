/* SPDX-License-Identifier: Apache-2.0 */
/* rng.h: the harnesses' generator: base/rand.h's splitmix64 on one state, seeded by the
 * caller through rng. */
#ifndef EXPSEG_FIDX_DIFF_RNG_H
#define EXPSEG_FIDX_DIFF_RNG_H
#include "../../base/rand.h"
static uint64_t rng;
static uint64_t rnd(void) { return _expseg_splitmix64(&rng); }
#endif
