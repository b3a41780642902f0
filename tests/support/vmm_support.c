/* SPDX-License-Identifier: Apache-2.0 */
/* vmm_support.c: C helpers for the driver tests (tests/test_vmm_*.cpp, test_gpu_vmm.cpp). */
#include "vmm_support.h"

#include <stdio.h>

bool vmm_test_is_idle(expseg_vmm_t *v, char *why, size_t len) {
  struct {
    const char *name;
    int64_t value;
  } g[] = {
      {"live_chunks", atomic_load(&v->live_chunks)},
      {"live_chunk_bytes", atomic_load(&v->live_chunk_bytes)},
      {"live_reservations", atomic_load(&v->live_reservations)},
      {"reserved_va_bytes", atomic_load(&v->reserved_va_bytes)},
      {"mapped_bytes", atomic_load(&v->mapped_bytes)},
      {"live_events", atomic_load(&v->live_events)},
  };
  for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
    if (g[i].value != 0) {
      if (why && len) snprintf(why, len, "%s = %lld", g[i].name, (long long)g[i].value);
      return false;
    }
  if (why && len) why[0] = '\0';
  return true;
}

uint64_t vmm_test_calls(expseg_vmm_t *v, expseg_vmm_call c) { return atomic_load(&v->calls[c]); }

uint64_t vmm_test_failures(expseg_vmm_t *v, expseg_vmm_call c) {
  return atomic_load(&v->failures[c]);
}

vmm_gauges_t vmm_test_gauges(expseg_vmm_t *v) {
  vmm_gauges_t g = {
      .live_chunks = atomic_load(&v->live_chunks),
      .live_chunk_bytes = atomic_load(&v->live_chunk_bytes),
      .created_bytes = atomic_load(&v->created_bytes),
      .live_reservations = atomic_load(&v->live_reservations),
      .reserved_va_bytes = atomic_load(&v->reserved_va_bytes),
      .mapped_bytes = atomic_load(&v->mapped_bytes),
      .live_events = atomic_load(&v->live_events),
  };
  return g;
}
