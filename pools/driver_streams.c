/* SPDX-License-Identifier: Apache-2.0 */
/* driver_streams.c: streams the driver creates (expseg_stream_create/destroy) and a
 * device-wide wait (expseg_synchronize), for callers that need them without including
 * cuda.h: expseg-replay --driver cuda replaying a history's streams, and the PyTorch plug's
 * deferred frees (plugin/expseg_torch.c). Only vmm/ talks to the driver; this forwards. */
#include "internal.h"

expseg_status expseg_stream_create(expseg_allocator *a, expseg_stream *out) {
  if (a == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_stream_create: the allocator is NULL");
  if (out == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_stream_create: out is NULL");
  return _expseg_vmm_stream_create(a->drv, out);
}

expseg_status expseg_stream_destroy(expseg_allocator *a, expseg_stream stream) {
  if (a == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_stream_destroy: the allocator is NULL");
  if (stream == 0)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_stream_destroy: stream 0 is the default stream, not one "
                             "expseg_stream_create made");
  return _expseg_vmm_stream_destroy(a->drv, stream);
}

expseg_status expseg_synchronize(expseg_allocator *a) {
  if (a == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_synchronize: the allocator is NULL");
  return _expseg_vmm_device_synchronize(a->drv);
}
