/* SPDX-License-Identifier: Apache-2.0 */
/* expseg_testing.h: hooks for testing programs that use expseg, kept out of expseg.h.
 *
 * They let a test do what a GPU does to an allocator: keep work on a stream unfinished
 * (so memory freed on it must not be reused, moved or given back), and make driver calls
 * fail at chosen points (so every error and undo path can be driven). Pair them with
 * expseg_check() after each step and expseg_testing_destroy() at the end, which reports
 * anything the driver still held. Drivers: hold_stream works on `host`, `sim`, `cuda` (and a
 * `fault:` wrapper over them); fault rules need an allocator created on a driver spec
 * "fault:fail=RULES;DRIVER" (docs/driver.md), e.g.
 *   expseg_create("fault:fail=unreserve@1,map@3..5;host:capacity=64M", 0, NULL, &a);
 * See docs/api.md ("Testing hooks"). */
#ifndef EXPSEG_TESTING_H
#define EXPSEG_TESTING_H

#include "expseg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* held = true: work queued on `stream` stops completing (events recorded on it stay
 * incomplete, waits for it fail) until the same call with held = false. On `cuda` the
 * stream waits on the GPU for a host word (cuStreamWaitValue32) that releasing writes;
 * errors there are printed as warnings. */
EXPSEG_EXPORT expseg_status expseg_testing_hold_stream(expseg_allocator *a, expseg_stream stream,
                                                       bool held);

/* Replaces the fault rules: "KIND@N[..[M]][:oom|:driver],..." where N counts calls of that
 * kind from now on (map@1 fails the next map). "" removes every rule. KIND is a driver call:
 * reserve, unreserve, create, release, map, unmap, set_access, event_create, event_destroy,
 * event_record, event_query, event_synchronize, stream_synchronize, export_fd, import_fd,
 * host_alloc, host_free (the pinned host pool's, docs/host_pool.md), device_synchronize,
 * copy (the byte copies of expseg_sleep / expseg_wake and expseg_testing_copy_*).
 * EXPSEG_ERR_INVALID_ARGUMENT when the allocator's driver is not a fault driver,
 * EXPSEG_ERR_CONFIG for text that does not parse (message with the position). */
EXPSEG_EXPORT expseg_status expseg_testing_set_faults(expseg_allocator *a, const char *rules);

/* Copies size bytes between host memory and device memory the allocator handed out
 * (copy_in: host src -> device dst; copy_out: device src -> host dst), through the driver
 * (cuda: cuMemcpyHtoD / cuMemcpyDtoH, returning once the bytes are in place; host: memcpy).
 * For tests and benchmarks that fill and check device memory without a CUDA toolkit of
 * their own; counted as expseg.driver.copy and failed by a `copy` fault rule.
 * EXPSEG_ERR_UNSUPPORTED on sim (no bytes); EXPSEG_ERR_INVALID_ARGUMENT for size 0, a NULL
 * pointer, or a device range not mapped. */
EXPSEG_EXPORT expseg_status expseg_testing_copy_in(expseg_allocator *a, void *dst,
                                                   const void *src, size_t size);
EXPSEG_EXPORT expseg_status expseg_testing_copy_out(expseg_allocator *a, void *dst,
                                                    const void *src, size_t size);

/* Driver calls failed by a fault rule so far (0 without a fault driver). */
EXPSEG_EXPORT uint64_t expseg_testing_faults_injected(const expseg_allocator *a);

/* Allocation calls (expseg_malloc, _ex, _pool) so far that the cache-hit path did not
 * serve: they went on to the slower path (pending frees, growth, lending, history, a
 * private pool, an error...). A request served from the stream's own cached free block
 * with nothing else to do does not count. 0 for a NULL allocator. */
EXPSEG_EXPORT uint64_t expseg_testing_slow_mallocs(expseg_allocator *a);

/* What the allocator's driver holds right now, by its own count. */
typedef struct expseg_testing_driver_counts {
  int64_t live_chunks;       /* physical chunks created and not released */
  int64_t live_chunk_bytes;
  int64_t live_reservations; /* address ranges reserved and not freed */
  int64_t reserved_va_bytes;
  int64_t mapped_bytes;
  int64_t live_events;
} expseg_testing_driver_counts;

EXPSEG_EXPORT expseg_status expseg_testing_driver_counts_get(const expseg_allocator *a,
                                                             expseg_testing_driver_counts *out);

/* expseg_destroy, reporting in *left what the driver still held once the allocator had
 * given everything back (just before the driver is closed): all zero unless memory, address
 * space, a mapping or an event leaked. left may be NULL. */
EXPSEG_EXPORT void expseg_testing_destroy(expseg_allocator *a, expseg_testing_driver_counts *left);

/* ---- replay model switch (expseg-replay --model pytorch; pools/model.c, docs/replay.md) ----
 * on = true: the allocator behaves as PyTorch's caching allocator where expseg deliberately
 * differs. For the replay tool, which links only the public headers. */
EXPSEG_EXPORT expseg_status expseg_testing_set_model_pytorch(expseg_allocator *a, bool on);

#ifdef __cplusplus
}
#endif
#endif /* EXPSEG_TESTING_H */
