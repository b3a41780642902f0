/* model.c: the switch that makes the allocator behave as PyTorch's caching allocator (>= 2.5)
 * where expseg deliberately differs, for expseg-replay --model pytorch (docs/replay.md,
 * "Models"). It is no configuration key: only the replay tool sets it, through this
 * internal entry point. With it on: an expandable segment grows only with new pages (no
 * idle page moves from another place, stream or pool: segment.c), garbage collection skips
 * expandable memory (segment.c), and the oversize rules of max_split_size_mb /
 * max_non_split_rounding_mb apply to expandable blocks too (alloc.c); a segment grows
 * to exactly what the request needs in PyTorch's page units (large_segment_size_mb in the
 * large pool, 2 MiB in the small, counted from the segment's base; expseg grows by at least
 * a fraction of what is mapped). The allocator keeps one physical page size, so a 20 MiB
 * PyTorch page is ten 2 MiB chunks here: the memory held is PyTorch's, the driver calls are
 * repriced by the replay tool (bench/synth_replay.c). */
#include "internal.h"

expseg_status _expseg_set_model_pytorch(expseg_allocator *a, bool on) {
  if (a == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "set_model_pytorch: allocator is NULL");
  pthread_mutex_lock(&a->lock);
  a->model_pytorch = on;
  pthread_mutex_unlock(&a->lock);
  return EXPSEG_OK;
}

uintptr_t _expseg_model_map_end(const expseg_allocator *a, const block_t *u, int pool,
                                uintptr_t need) {
  const uintptr_t base = u->seg->base, uend = u->ptr + u->size;
  const size_t pg = pool == POOL_LARGE ? a->cfg.large_segment_size : a->page;
  uintptr_t hi = base + _expseg_round_up(_expseg_round_up(need - base, pg), a->page);
  return hi > uend ? uend : hi;
}
