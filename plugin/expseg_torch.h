/* SPDX-License-Identifier: Apache-2.0 */
/* expseg_torch.h: the C ABI of libexpseg_torch.so, the allocator library PyTorch loads with
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "expseg_torch_alloc", "expseg_torch_free")
 * (python/expseg.py does it for you: expseg.install()). Contract of each call: docs/torch.md.
 *
 * One expseg allocator per device ordinal, created on first use (thread-safe) by
 * expseg_create(NULL, device, NULL): the driver from $EXPSEG_DRIVER, else cuda; the
 * configuration from $EXPSEG_ALLOC_CONF, else $PYTORCH_CUDA_ALLOC_CONF, else
 * $PYTORCH_ALLOC_CONF. Allocators live until the process ends.
 *
 * Streams: `void *stream` is PyTorch's cudaStream_t; its raw value is the expseg_stream.
 * Functions returning int return an expseg_status (0 = EXPSEG_OK). On any failure the
 * message is kept per device: expseg_torch_last_error(device). */
#ifndef EXPSEG_TORCH_H
#define EXPSEG_TORCH_H

#include <stddef.h>
#include <stdint.h>

#include "expseg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Devices 0 .. EXPSEG_TORCH_MAX_DEVICES-1. */
#define EXPSEG_TORCH_MAX_DEVICES 64

/* ---- the two functions CUDAPluggableAllocator takes ---- */

/* NULL when size is 0, or on failure (out of memory, no usable driver, bad device): the
 * message is kept (expseg_torch_last_error) and printed to stderr. */
EXPSEG_EXPORT void *expseg_torch_alloc(size_t size, int device, void *stream);
/* The same, but a failure (size > 0) throws a C++ std::runtime_error with the message instead
 * of returning NULL: PyTorch's pluggable allocator does not check the pointer, and turns the
 * exception into a Python RuntimeError. expseg.install(route="python") gives PyTorch this one.
 * For C++ callers only (an exception must not cross C frames). */
EXPSEG_EXPORT void *expseg_torch_alloc_raising(size_t size, int device, void *stream);
/* The status of the calling thread's last expseg_torch_alloc (EXPSEG_OK before any):
 * EXPSEG_ERR_OUT_OF_MEMORY only when the device's memory ran out, not for a bad configuration
 * or device, nor for host memory running out (EXPSEG_ERR_HOST_OUT_OF_MEMORY). */
EXPSEG_EXPORT int expseg_torch_alloc_status(void);
/* A pointer expseg did not hand out (or a device without an allocator) is ignored with a
 * message: never a crash. size and stream are not needed (expseg knows both). */
EXPSEG_EXPORT void expseg_torch_free(void *ptr, size_t size, int device, void *stream);

/* ---- the optional hooks of torch::cuda::CUDAPluggableAllocator (C++ set_*_fn) ---- */

/* set_init_fn: remembers the device count (later devices >= count are refused). */
EXPSEG_EXPORT void expseg_torch_init(int device_count);
/* set_reset_fn (torch.cuda.empty_cache): empty_cache on every device's allocator. */
EXPSEG_EXPORT void expseg_torch_reset(void);
/* set_memory_fraction_fn (torch.cuda.set_per_process_memory_fraction). */
EXPSEG_EXPORT void expseg_torch_memory_fraction(double fraction, int device);
/* set_record_stream_fn (Tensor.record_stream): finds the device owning ptr. */
EXPSEG_EXPORT void expseg_torch_record_stream(void *ptr, void *stream);

/* ---- for ctypes (python/expseg.py) and C callers ---- */

/* The device's allocator: with create, made on first use as every call here does (NULL,
 * message kept, when it cannot be); without, NULL until some call has made it. The C++
 * backend (plugin/backend.cpp) serves PyTorch from these same allocators, so every
 * function of this library sees what it allocated. */
EXPSEG_EXPORT expseg_allocator *expseg_torch_allocator(int device, int create);

/* This device's last failure message ("" if none), copied into a buffer of the calling
 * thread (valid until its next call of this function). */
EXPSEG_EXPORT const char *expseg_torch_last_error(int device);
/* The driver of the device's allocator ("cuda", "host", "sim"), creating it if needed;
 * "" when it cannot be created. */
EXPSEG_EXPORT const char *expseg_torch_driver_name(int device);
EXPSEG_EXPORT int expseg_torch_get_info(int device, expseg_info *info);
EXPSEG_EXPORT int expseg_torch_mem_get_info(int device, size_t *free_bytes, size_t *total_bytes);
/* One statistic by key (the keys of torch.cuda.memory_stats() and expseg.*). */
EXPSEG_EXPORT int expseg_torch_stat(int device, const char *key, int64_t *value);
/* Every statistic in sorted key order. */
EXPSEG_EXPORT int expseg_torch_stats_foreach(int device,
                                             void (*fn)(void *ctx, const char *key,
                                                        int64_t value),
                                             void *ctx);
/* Every statistic as one JSON object {"key": value, ...} in sorted key order. Writes at most
 * len bytes (NUL included) and returns the length of the whole text (without the NUL), as
 * snprintf does; 0 when the allocator cannot be created. */
EXPSEG_EXPORT size_t expseg_torch_stats_json(int device, char *buf, size_t len);
EXPSEG_EXPORT int expseg_torch_reset_peak_stats(int device);
EXPSEG_EXPORT int expseg_torch_reset_accumulated_stats(int device);
/* device -1: every device that has an allocator. */
EXPSEG_EXPORT int expseg_torch_empty_cache(int device);
/* Forwards to expseg_snapshot_dump: the memory_viz pickle of the device's allocator; once
 * the process has allocated pinned host memory here (expseg_torch_host_alloc), with the host
 * pool's host_segments and host_traces (expseg_snapshot_dump_with_host). */
EXPSEG_EXPORT int expseg_torch_snapshot_dump(int device, const char *path);
/* The same with EXPSEG_SNAPSHOT_* flags (expseg_snapshot_dump_ex / _with_host). */
EXPSEG_EXPORT int expseg_torch_snapshot_dump_ex(int device, const char *path, unsigned flags);
/* Forwards to expseg_history_annotate and expseg_allocation_traceback on the device. */
EXPSEG_EXPORT int expseg_torch_annotate(int device, void *ptr, const char *text);
EXPSEG_EXPORT int expseg_torch_allocation_traceback(int device, void *ptr, char *buf,
                                                    size_t len, size_t *needed);
/* PyTorch's recordAnnotation on the device (expseg_history_record_annotation): one entry of
 * the snapshot's external_annotations. While every device records (expseg_torch_record_history
 * with device -1) the device's allocator is created if it has none yet; otherwise a device
 * without one records nothing. */
EXPSEG_EXPORT int expseg_torch_record_annotation(int device, const char *const *keys,
                                                 const char *const *values, size_t n);
/* The configuration in force (expseg_config_string): writes at most len bytes (NUL
 * included), returns the length it needs; 0 when the allocator cannot be created. */
EXPSEG_EXPORT size_t expseg_torch_config_string(int device, char *buf, size_t len);
/* 1 + the highest device ordinal that has an allocator (0: none yet). */
EXPSEG_EXPORT int expseg_torch_device_count(void);
/* 1 when the device has an allocator already, else 0 (creates nothing). */
EXPSEG_EXPORT int expseg_torch_device_used(int device);
/* torch.cuda.memory_summary()'s text then expseg's section (expseg_memory_summary): writes
 * at most len bytes (NUL included), returns the length it needs; 0 when the allocator
 * cannot be created. */
EXPSEG_EXPORT size_t expseg_torch_memory_summary(int device, char *buf, size_t len,
                                                 int abbreviated);
/* expseg_record_history_ex on the device; device -1: every device, those created later
 * included (as PyTorch's process-wide _record_memory_history). */
EXPSEG_EXPORT int expseg_torch_record_history(int device, int enabled, size_t max_entries,
                                              unsigned flags);
/* expseg_set_memory_fraction with a status (expseg_torch_memory_fraction is the hook). */
EXPSEG_EXPORT int expseg_torch_set_memory_fraction(int device, double fraction);
/* expseg_torch_record_stream with a status: EXPSEG_ERR_INVALID_ARGUMENT when no device's
 * allocator owns ptr, or the owner's status when it refuses the stream (a value of 2^48 or
 * more); message kept for device -1 either way. */
EXPSEG_EXPORT int expseg_torch_record_stream_status(void *ptr, void *stream);
/* Waits until all work on the device is done (expseg_synchronize). */
EXPSEG_EXPORT int expseg_torch_synchronize(int device);
/* Tagged regions (docs/api.md "Sleep and wake"): begin != 0 expseg_region_begin, else
 * expseg_region_end; sleep's mode is EXPSEG_SLEEP_OFFLOAD (0) or EXPSEG_SLEEP_DISCARD (1). */
EXPSEG_EXPORT int expseg_torch_region(int device, const char *tag, int begin);
EXPSEG_EXPORT int expseg_torch_sleep(int device, const char *tag, int mode);
EXPSEG_EXPORT int expseg_torch_wake(int device, const char *tag);
/* expseg_region_get_info of region `tag` as one JSON object whose keys are the fields of
 * expseg_region_info (asleep true/false, the rest integers): writes at most len bytes (NUL
 * included; truncated text when len is short) and sets *needed to the length the whole
 * text needs, NUL included. An unknown tag: EXPSEG_ERR_INVALID_ARGUMENT naming it. */
EXPSEG_EXPORT int expseg_torch_region_info_json(int device, const char *tag, char *buf,
                                                size_t len, size_t *needed);

/* ---- the pinned host pool (docs/torch.md "Pinned host memory") ----
 * One expseg_host_pool per process, created by the first expseg_torch_host_alloc (driver and
 * configuration from the environment, as the device allocators; placed near that call's
 * device). Failures keep their message under device -1 (expseg_torch_last_error(-1)). */

/* expseg_host_malloc: *out NULL for size 0. device: 0 .. EXPSEG_TORCH_MAX_DEVICES-1. */
EXPSEG_EXPORT int expseg_torch_host_alloc(int device, size_t size, void **out);
/* expseg_host_free; NULL is OK; a pointer the pool did not hand out is refused. */
EXPSEG_EXPORT int expseg_torch_host_free(void *ptr);
/* expseg_host_record_history (PyTorch's record_pinned_host_memory): kept, and applied to the
 * pool when it is created later. flags: EXPSEG_HISTORY_*. */
EXPSEG_EXPORT int expseg_torch_host_record_history(int enabled, size_t max_entries,
                                                   unsigned flags);
/* 1 once the pool exists, else 0. */
EXPSEG_EXPORT int expseg_torch_host_used(void);
/* expseg_host_stat (torch.cuda.host_memory_stats() keys); refused before the pool exists. */
EXPSEG_EXPORT int expseg_torch_host_stat(const char *key, int64_t *value);
/* expseg_host_empty_cache; nothing to do before the pool exists. */
EXPSEG_EXPORT int expseg_torch_host_empty_cache(void);

/* ---- safe mode: deferred frees (docs/torch.md "Safe record_stream") ----
 * batch > 0: every free is deferred; the device's deferred frees complete together, after a
 * device-wide synchronization, when batch of them are waiting, when a malloc would grow the
 * cache or fail, and at empty_cache. 0: off (completes what is deferred). Accepted: 0 to
 * 2^24. */
EXPSEG_EXPORT int expseg_torch_set_safe_free(int batch);
/* How many frees, and how many bytes (the sizes PyTorch gave), the device has deferred. */
EXPSEG_EXPORT int expseg_torch_deferred(int device, size_t *count, size_t *bytes);

#ifdef __cplusplus
}
#endif
#endif /* EXPSEG_TORCH_H */
