/* model.c: the switch that makes the allocator behave as PyTorch's caching allocator (>= 2.5)
 * where expseg deliberately differs, for expseg-replay --model pytorch (docs/replay.md,
 * "Models"). It is no configuration key: only the replay tool sets it, through this
 * internal entry point. With it on: an expandable segment grows only with new pages (no
 * idle page moves from another place, stream or pool: segment.c), garbage collection skips
 * expandable memory (segment.c), and the oversize rules of max_split_size_mb /
 * max_non_split_rounding_mb apply to expandable blocks too (alloc.c). Not yet modelled:
 * PyTorch's large_segment_size_mb pages in the large pool (the allocator has one page
 * size). */
#include "internal.h"

expseg_status _expseg_set_model_pytorch(expseg_allocator *a, bool on) {
  if (a == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "set_model_pytorch: allocator is NULL");
  pthread_mutex_lock(&a->lock);
  a->model_pytorch = on;
  pthread_mutex_unlock(&a->lock);
  return EXPSEG_OK;
}
