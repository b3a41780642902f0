/* expseg.h: the whole public C API of expseg, a caching GPU memory allocator built on
 * CUDA's virtual memory management (reserve / create / map / set-access / unmap).
 *
 * C99, usable from C++. Every fallible call returns an expseg_status and, on failure,
 * leaves a one-line message for the calling thread in expseg_last_error(): what was
 * asked, what is held, and what to change. The library prints nothing to stdout;
 * warnings go to stderr once each, or to the sink set with expseg_set_log_sink().
 * See docs/api.md for the contract of each call. */
#ifndef EXPSEG_H
#define EXPSEG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define EXPSEG_EXPORT __attribute__((visibility("default")))
#define EXPSEG_NODISCARD __attribute__((warn_unused_result))
#else
#define EXPSEG_EXPORT
#define EXPSEG_NODISCARD
#endif

#define EXPSEG_VERSION_MAJOR 0
#define EXPSEG_VERSION_MINOR 1

/* Status codes: X(name, value, short description). */
#define EXPSEG_STATUSES(X)                                                            \
  X(EXPSEG_OK, 0, "ok")                                                               \
  X(EXPSEG_ERR_OUT_OF_MEMORY, 1, "out of memory (after releasing cache and retrying)") \
  X(EXPSEG_ERR_INVALID_ARGUMENT, 2, "invalid argument")                              \
  X(EXPSEG_ERR_CONFIG, 3, "configuration text or driver spec rejected")              \
  X(EXPSEG_ERR_DRIVER, 4, "driver call failed")                                      \
  X(EXPSEG_ERR_UNSUPPORTED, 5, "unsupported here")

typedef enum expseg_status {
#define EXPSEG_STATUS_ENUM_(name, value, text) name = value,
  EXPSEG_STATUSES(EXPSEG_STATUS_ENUM_)
#undef EXPSEG_STATUS_ENUM_
} expseg_status;

typedef struct expseg_allocator expseg_allocator; /* one per device */
typedef uint64_t expseg_stream;                   /* CUstream value; 0 = default stream */

/* "EXPSEG_OK", "EXPSEG_ERR_OUT_OF_MEMORY", ...; "EXPSEG_UNKNOWN_STATUS" otherwise. */
EXPSEG_EXPORT const char *expseg_status_name(expseg_status s);
/* This thread's message for its last failed call ("" if none). Valid until the
 * thread's next expseg call. */
EXPSEG_EXPORT const char *expseg_last_error(void);

/* driver: "cuda", "host", "sim", with options, e.g. "host:capacity=8G,granularity=2M"
 *         (docs/driver.md). NULL = $EXPSEG_DRIVER, else "cuda" when a CUDA device is
 *         usable, else "host".
 * config: option text in PYTORCH_CUDA_ALLOC_CONF grammar (docs/config.md); NULL = the
 *         environment ($EXPSEG_ALLOC_CONF, else $PYTORCH_CUDA_ALLOC_CONF, else
 *         $PYTORCH_ALLOC_CONF). */
EXPSEG_EXPORT EXPSEG_NODISCARD expseg_status expseg_create(const char *driver, int device,
                                                           const char *config,
                                                           expseg_allocator **out);
/* Releases every byte the allocator holds. Pointers still live become invalid. */
EXPSEG_EXPORT void expseg_destroy(expseg_allocator *a);

/* size 0 returns EXPSEG_OK with *out = NULL (as cudaMalloc does); freeing NULL is OK. */
EXPSEG_EXPORT EXPSEG_NODISCARD expseg_status expseg_malloc(expseg_allocator *a, size_t size,
                                                           expseg_stream stream, void **out);
EXPSEG_EXPORT expseg_status expseg_free(expseg_allocator *a, void *ptr);
/* ptr is used by work on `stream` too: its memory is reused only after that work. */
EXPSEG_EXPORT expseg_status expseg_record_stream(expseg_allocator *a, void *ptr,
                                                 expseg_stream stream);
EXPSEG_EXPORT expseg_status expseg_empty_cache(expseg_allocator *a);
/* Caps what the allocator holds at fraction x total device memory; fraction in [0, 1]. */
EXPSEG_EXPORT expseg_status expseg_set_memory_fraction(expseg_allocator *a, double fraction);
/* Changes only the keys given; existing blocks stay valid. */
EXPSEG_EXPORT expseg_status expseg_configure(expseg_allocator *a, const char *config);
/* The configuration in force as one option string that parses back to itself.
 * Writes at most len bytes (NUL included); returns the length it needs. */
EXPSEG_EXPORT size_t expseg_config_string(const expseg_allocator *a, char *buf, size_t len);

/* Statistics: the keys of torch.cuda.memory_stats() exactly ("allocated_bytes.all.current",
 * "reserved_bytes.large_pool.peak", "num_device_alloc", ...), plus expseg's own keys
 * ("expseg.mapped_bytes.current", ...; docs/stats.md). foreach visits in sorted key order. */
EXPSEG_EXPORT expseg_status expseg_stat(const expseg_allocator *a, const char *key,
                                        int64_t *value);
EXPSEG_EXPORT void expseg_stats_foreach(const expseg_allocator *a,
                                        void (*fn)(void *ctx, const char *key, int64_t value),
                                        void *ctx);
EXPSEG_EXPORT void expseg_reset_peak_stats(expseg_allocator *a);
EXPSEG_EXPORT void expseg_reset_accumulated_stats(expseg_allocator *a);

/* Checks every internal invariant (blocks tile segments, free index, statistics agree with
 * a recount, mapped pages back live blocks). EXPSEG_OK or EXPSEG_ERR_INVALID_ARGUMENT with
 * the first violation in expseg_last_error(). Costs O(blocks): for tests and --check. */
EXPSEG_EXPORT expseg_status expseg_check(const expseg_allocator *a);

/* History and snapshots (the memory_viz format). Not built yet: both return
 * EXPSEG_ERR_UNSUPPORTED (docs/api.md). */
EXPSEG_EXPORT expseg_status expseg_record_history(expseg_allocator *a, bool enabled,
                                                  size_t max_entries);
EXPSEG_EXPORT expseg_status expseg_snapshot_dump(expseg_allocator *a, const char *path);

typedef void (*expseg_oom_observer)(void *ctx, int device, size_t alloc_size,
                                    size_t allowed_or_total, size_t device_free);
/* Observers run on the failing thread, outside the allocator's lock, before malloc returns. */
EXPSEG_EXPORT expseg_status expseg_add_oom_observer(expseg_allocator *a, expseg_oom_observer fn,
                                                    void *ctx);

/* Where warnings go (default: stderr). fn = NULL restores the default. The sink is called
 * with no expseg lock held (warnings raised inside a call are delivered when the call lets
 * go of the allocator), so it may call any expseg function. */
typedef void (*expseg_log_sink)(void *ctx, const char *line);
EXPSEG_EXPORT void expseg_set_log_sink(expseg_log_sink fn, void *ctx);

/* ---- Several devices, peer access, sharing between processes, single-chunk allocations
 * (docs/api.md "Devices, peers and sharing", docs/ipc.md) ---- */

/* Makes every range the allocator has mapped, and every one it maps later (growth, page
 * moves, page-cache re-maps, imports), readable and writable from peer_device: one
 * set-access call per range per peer. cudaDeviceEnablePeerAccess alone does not do this for
 * virtual-memory mappings. peer_device in [0, 63], not the allocator's own device; enabling
 * twice is OK. On failure nothing changed. disable takes the access away again. */
EXPSEG_EXPORT expseg_status expseg_enable_peer_access(expseg_allocator *a, int peer_device);
EXPSEG_EXPORT expseg_status expseg_disable_peer_access(expseg_allocator *a, int peer_device);

/* expseg_malloc with flags. EXPSEG_MALLOC_SINGLE_CHUNK: the allocation gets one physical
 * chunk of its own, mapped contiguously (what NCCL and RDMA registration need), whatever
 * its size; the option single_chunk_min_mb:N does the same for every allocation of N MB or
 * more. Unknown flag bits are EXPSEG_ERR_INVALID_ARGUMENT. */
#define EXPSEG_MALLOC_SINGLE_CHUNK 1u
EXPSEG_EXPORT EXPSEG_NODISCARD expseg_status expseg_malloc_ex(expseg_allocator *a, size_t size,
                                                              expseg_stream stream,
                                                              unsigned flags, void **out);

/* A live allocation described for another process: `data` (a versioned, fixed-layout
 * description, docs/ipc.md) and the descriptors it names by index. The handle owns both:
 * release it with expseg_ipc_handle_free (closes the descriptors). Zero-initialise before
 * use. */
typedef struct expseg_ipc_handle {
  unsigned char *data;
  size_t size;
  int *fds;
  size_t n_fds;
} expseg_ipc_handle;

/* Describes the live allocation starting at ptr. Until every process that imports it has
 * closed it or exited (and the exporter has freed its handle), the allocation stays where
 * it is: expseg_free of it is deferred, its memory is not reused, moved nor released. */
EXPSEG_EXPORT EXPSEG_NODISCARD expseg_status expseg_ipc_export(expseg_allocator *a, void *ptr,
                                                               expseg_ipc_handle *out);
/* Sends / receives a handle over a connected AF_UNIX SOCK_STREAM socket (descriptors with
 * SCM_RIGHTS; no pidfd, no ptrace). recv fills a zeroed *out the caller frees. */
EXPSEG_EXPORT expseg_status expseg_ipc_send(int socket_fd, const expseg_ipc_handle *h);
EXPSEG_EXPORT EXPSEG_NODISCARD expseg_status expseg_ipc_recv(int socket_fd,
                                                             expseg_ipc_handle *out);
/* Maps the described memory into this process (its own address range, its own device's
 * access and the enabled peers'); *ptr is where the exported allocation starts. The handle
 * stays the caller's. Malformed handles are EXPSEG_ERR_INVALID_ARGUMENT naming the field. */
EXPSEG_EXPORT EXPSEG_NODISCARD expseg_status expseg_ipc_import(expseg_allocator *a,
                                                               const expseg_ipc_handle *h,
                                                               void **ptr);
/* Unmaps an imported allocation and closes everything it held. */
EXPSEG_EXPORT expseg_status expseg_ipc_close(expseg_allocator *a, void *ptr);
/* Checks now which importers are gone (also done by every malloc and empty_cache while
 * exports are outstanding); *held (may be NULL) = exports still held open. */
EXPSEG_EXPORT expseg_status expseg_ipc_poll(expseg_allocator *a, size_t *held);
EXPSEG_EXPORT void expseg_ipc_handle_free(expseg_ipc_handle *h);

#ifdef __cplusplus
}
#endif
#endif /* EXPSEG_H */
