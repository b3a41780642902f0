/* SPDX-License-Identifier: Apache-2.0 */
/* units.h: the unit ladder of expseg's size and count formatters, once: the binary size
 * units and how many steps up the ladder a value goes. Two outputs use it with PyTorch's
 * two rules: _expseg_format_size (vmm/error.c; messages, as c10's format_size: "2.00 MiB",
 * a step while the value is >= 1024 of the unit) and the memory summary's columns
 * (pools/observe/summary.c, as torch.cuda.memory_summary's _format_size/_format_count: integer
 * values floor-divided while the column's reference is >= 768 KiB or 750 K of the unit). */
#ifndef EXPSEG_BASE_UNITS_H
#define EXPSEG_BASE_UNITS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* "B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" for u = 0 .. 6. */
static inline const char *_expseg_size_unit(int u) {
  static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  return u >= 0 && u < 7 ? names[u] : "?";
}

/* Steps up the ladder for a reference value: while it is >= threshold (in the unit
 * reached) and fewer than max steps were taken, it is divided by step (floor). */
static inline int _expseg_unit_steps(uint64_t ref, uint64_t step, uint64_t threshold, int max) {
  int s = 0;
  for (; s < max && ref >= threshold; s++) ref /= step;
  return s;
}

#ifdef __cplusplus
}
#endif

#endif
