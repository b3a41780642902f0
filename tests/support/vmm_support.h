/* SPDX-License-Identifier: Apache-2.0 */
/* vmm_support.h: C helpers for the driver tests: plain copies of the driver's atomic
 * counters and gauges, read in C so every test sees them the same way. */
#ifndef EXPSEG_VMM_SUPPORT_H
#define EXPSEG_VMM_SUPPORT_H

#include "vmm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A plain copy of the gauges of v. */
typedef struct vmm_gauges_s {
  int64_t live_chunks, live_chunk_bytes, created_bytes, live_reservations, reserved_va_bytes,
      mapped_bytes, live_events;
} vmm_gauges_t;
vmm_gauges_t vmm_test_gauges(expseg_vmm_t *v);

/* True when every gauge (chunks, bytes, reservations, mapped, events) is back to zero;
 * otherwise writes the first non-zero one to why. */
bool vmm_test_is_idle(expseg_vmm_t *v, char *why, size_t len);
uint64_t vmm_test_calls(expseg_vmm_t *v, expseg_vmm_call c);
uint64_t vmm_test_failures(expseg_vmm_t *v, expseg_vmm_call c);

#ifdef __cplusplus
}
#endif
#endif
