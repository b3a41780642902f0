/* driver_streams.c: streams the driver creates (expseg_stream_create/destroy), for callers
 * that need real streams of the allocator's device without including cuda.h, such as
 * expseg-replay --driver cuda replaying a history's streams. Only vmm/ talks to the
 * driver; this forwards. */
#include "internal.h"

expseg_status expseg_stream_create(expseg_allocator *a, expseg_stream *out) {
  if (a == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_stream_create: the allocator is NULL");
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
