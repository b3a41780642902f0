/* SPDX-License-Identifier: Apache-2.0 */
/* testing.c: the testing hooks of include/expseg_testing.h. They reach the allocator's
 * driver: holding streams (host and sim model stream work), fault rules (the fault
 * wrapper), the driver's own gauges, and a destroy that reports what the driver still held.
 * Nothing here is on an allocation path. */
#include "error.h"
#include "expseg_testing.h"
#include "internal.h"

#include <stdatomic.h>
#include <string.h>

expseg_status expseg_testing_hold_stream(expseg_allocator *a, expseg_stream stream, bool held) {
  if (a == NULL) return _expseg_null_allocator("expseg_testing_hold_stream");
  return _expseg_vmm_hold_stream(a->drv, stream, held);
}

expseg_status expseg_testing_set_faults(expseg_allocator *a, const char *rules) {
  if (a == NULL) return _expseg_null_allocator("expseg_testing_set_faults");
  if (rules == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_testing_set_faults: rules is NULL; \"\" removes every rule");
  return _expseg_fault_set_rules_text(a->drv, rules, strlen(rules), true);
}

expseg_status expseg_testing_copy_in(expseg_allocator *a, void *dst, const void *src,
                                     size_t size) {
  if (a == NULL) return _expseg_null_allocator("expseg_testing_copy_in");
  if (dst == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_testing_copy_in: dst is NULL; accepted: device memory "
                             "the allocator handed out");
  return _expseg_vmm_copy_in(a->drv, (uintptr_t)dst, src, size);
}

expseg_status expseg_testing_copy_out(expseg_allocator *a, void *dst, const void *src,
                                      size_t size) {
  if (a == NULL) return _expseg_null_allocator("expseg_testing_copy_out");
  if (src == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_testing_copy_out: src is NULL; accepted: device memory "
                             "the allocator handed out");
  return _expseg_vmm_copy_out(a->drv, dst, (uintptr_t)src, size);
}

uint64_t expseg_testing_slow_mallocs(expseg_allocator *a) {
  if (a == NULL) return 0;
  pthread_mutex_lock(&a->lock);
  const uint64_t n = a->slow_mallocs;
  pthread_mutex_unlock(&a->lock);
  return n;
}

uint64_t expseg_testing_faults_injected(const expseg_allocator *a) {
  return a ? _expseg_fault_injected(a->drv) : 0;
}

static void counts_of(const expseg_vmm_t *d, expseg_testing_driver_counts *out) {
  *out = (expseg_testing_driver_counts){
      .live_chunks = atomic_load(&d->live_chunks),
      .live_chunk_bytes = atomic_load(&d->live_chunk_bytes),
      .live_reservations = atomic_load(&d->live_reservations),
      .reserved_va_bytes = atomic_load(&d->reserved_va_bytes),
      .mapped_bytes = atomic_load(&d->mapped_bytes),
      .live_events = atomic_load(&d->live_events),
  };
}

expseg_status expseg_testing_driver_counts_get(const expseg_allocator *a,
                                               expseg_testing_driver_counts *out) {
  if (a == NULL) return _expseg_null_allocator("expseg_testing_driver_counts_get");
  if (out == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_testing_driver_counts_get: out is NULL");
  counts_of(a->drv, out);
  return EXPSEG_OK;
}

static void before_close(void *ctx, expseg_vmm_t *drv) {
  if (ctx) counts_of(drv, ctx);
}

void expseg_testing_destroy(expseg_allocator *a, expseg_testing_driver_counts *left) {
  if (left) memset(left, 0, sizeof *left);
  if (a == NULL) return;
  _expseg_destroy_with(a, before_close, left);
}

expseg_status expseg_testing_set_model_pytorch(expseg_allocator *a, bool on) {
  return _expseg_set_model_pytorch(a, on);
}
