/* SPDX-License-Identifier: Apache-2.0 */
/* clock.h: the one monotonic clock of expseg, in nanoseconds (CLOCK_MONOTONIC), header-only
 * so the library (vmm/: the driver's now_ns and the host pool's waits) and the tools
 * (bench/: timings) read the same one. policy/ takes time as an argument and never reads
 * it. Needs clock_gettime (POSIX: the targets define _GNU_SOURCE). */
#ifndef EXPSEG_BASE_CLOCK_H
#define EXPSEG_BASE_CLOCK_H

#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline uint64_t _expseg_clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#ifdef __cplusplus
}
#endif

#endif
