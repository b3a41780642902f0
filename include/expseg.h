/* SPDX-License-Identifier: Apache-2.0 */
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
  X(EXPSEG_ERR_UNSUPPORTED, 5, "unsupported here")                                   \
  X(EXPSEG_ERR_HOST_OUT_OF_MEMORY, 6, "out of host memory (not the device's)")

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
 *         (docs/driver.md). NULL = $EXPSEG_DRIVER, else "cuda"; never a silent fallback:
 *         without a usable CUDA device that fails with EXPSEG_ERR_UNSUPPORTED and a message
 *         saying why and how to choose "host" or "sim" on purpose.
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
 * Writes at most len bytes (NUL included); returns the string's length without the NUL
 * (as snprintf): a buffer of that + 1 bytes holds it whole. A NULL allocator: 0, and buf
 * holds "". */
EXPSEG_EXPORT size_t expseg_config_string(const expseg_allocator *a, char *buf, size_t len);
/* Whether the option key key[0..len) (its canonical spelling or alias) is one PyTorch's
 * PYTORCH_CUDA_ALLOC_CONF accepts: 1; an option of expseg's own that PyTorch refuses: 0;
 * not an option at all: -1 (docs/config.md lists both kinds). */
EXPSEG_EXPORT int expseg_option_pytorch(const char *key, size_t len);

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

/* History and snapshots (PyTorch's memory_viz format): declared in the block below. */
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

/* ---- Pinned host memory pool (docs/host_pool.md) ----
 * A caching pool of page-locked host memory for fast host <-> device copies, placed on the
 * NUMA node nearest the device (or the node the driver spec names: "host:numa=N",
 * "cuda:numa=N"), tuned by the pinned_* options of the configuration. Blocks are
 * power-of-two sized (above pinned_max_round_threshold_mb or pinned_max_cached_size_mb, the
 * size rounded up to the page) and reused only after the work of every stream recorded on
 * them has completed. driver, device and config as for expseg_create; keys of the configuration
 * that only concern device memory are accepted and ignored. */
typedef struct expseg_host_pool expseg_host_pool;
EXPSEG_EXPORT EXPSEG_NODISCARD expseg_status expseg_host_create(const char *driver, int device,
                                                                const char *config,
                                                                expseg_host_pool **out);
/* Frees every chunk, live blocks included (their pointers become invalid). */
EXPSEG_EXPORT void expseg_host_destroy(expseg_host_pool *h);
/* size 0 gives EXPSEG_OK with *out = NULL; sizes above 2^60 are EXPSEG_ERR_INVALID_ARGUMENT. */
EXPSEG_EXPORT EXPSEG_NODISCARD expseg_status expseg_host_malloc(expseg_host_pool *h, size_t size,
                                                                void **out);
/* NULL is OK; a pointer this pool did not hand out is EXPSEG_ERR_INVALID_ARGUMENT. */
EXPSEG_EXPORT expseg_status expseg_host_free(expseg_host_pool *h, void *ptr);
/* ptr (as expseg_host_malloc returned it) is used by work queued on `stream`: once freed,
 * its block is reused only after that work completes. */
EXPSEG_EXPORT expseg_status expseg_host_record_stream(expseg_host_pool *h, void *ptr,
                                                      expseg_stream stream);
/* Gives back every cached block whose streams are done (not the reserve segment). */
EXPSEG_EXPORT expseg_status expseg_host_empty_cache(expseg_host_pool *h);
/* The NUMA node the pool's memory is placed on; -1 = left to the OS (unknown locality). */
EXPSEG_EXPORT int expseg_host_numa_node(const expseg_host_pool *h);
/* Statistics: torch.cuda.host_memory_stats() keys ("allocation.current",
 * "reserved_bytes.peak", "num_host_alloc", "host_alloc_time.total", ...) plus expseg's own
 * ("expseg.numa_node", "expseg.pending_blocks.current", ...); docs/host_pool.md. */
EXPSEG_EXPORT expseg_status expseg_host_stat(const expseg_host_pool *h, const char *key,
                                             int64_t *value);
EXPSEG_EXPORT void expseg_host_stats_foreach(const expseg_host_pool *h,
                                             void (*fn)(void *ctx, const char *key,
                                                        int64_t value),
                                             void *ctx);
EXPSEG_EXPORT void expseg_host_reset_peak_stats(expseg_host_pool *h);
/* The pool's own history (alloc, free_requested, free_completed, segment_alloc,
 * segment_free, oom, snapshot), as expseg_record_history_ex with the same flags, for the
 * host_traces of expseg_snapshot_with_host. Frames pushed with expseg_history_push_frames
 * are attached as on the device allocator. */
EXPSEG_EXPORT expseg_status expseg_host_record_history(expseg_host_pool *h, bool enabled,
                                                       size_t max_entries, unsigned flags);

/* ---- History, snapshots and readable reports (docs/snapshots.md) ----
 * expseg_record_history(a, true, n) keeps the newest n (>= 1) events (alloc, free_requested,
 * free_completed, segment_alloc/free/map/unmap, oom, snapshot, annotate, and expseg's own
 * sleep and wake of a region: docs/snapshots.md) with C stacks and the frames
 * pushed by the calling thread; false stops recording and clears the history (as PyTorch).
 * The _ex form takes EXPSEG_HISTORY_* flags (0 = no C stacks: the cheaper recording). */
#define EXPSEG_HISTORY_C_STACKS 1u
/* Enabling: drop the events recorded so far (PyTorch's clear_history=True); without it,
 * enabling while recording keeps the newest events that fit. */
#define EXPSEG_HISTORY_CLEAR 2u
/* Do not record these actions (PyTorch's skip_actions): alloc, free_requested,
 * free_completed, segment_alloc, segment_free, oom, snapshot. */
#define EXPSEG_HISTORY_SKIP_ALLOC (1u << 8)
#define EXPSEG_HISTORY_SKIP_FREE_REQUESTED (1u << 9)
#define EXPSEG_HISTORY_SKIP_FREE_COMPLETED (1u << 10)
#define EXPSEG_HISTORY_SKIP_SEGMENT_ALLOC (1u << 11)
#define EXPSEG_HISTORY_SKIP_SEGMENT_FREE (1u << 12)
#define EXPSEG_HISTORY_SKIP_OOM (1u << 15)
#define EXPSEG_HISTORY_SKIP_SNAPSHOT (1u << 16)
EXPSEG_EXPORT expseg_status expseg_record_history_ex(expseg_allocator *a, bool enabled,
                                                     size_t max_entries, unsigned flags);
/* The EXPSEG_HISTORY_SKIP_* flag of one of PyTorch's skip_actions names ("alloc", ...) in
 * *flag; any other name is EXPSEG_ERR_INVALID_ARGUMENT (*flag 0), the message naming it and
 * those accepted. The one table of these names, for bindings (Python, C++). */
EXPSEG_EXPORT expseg_status expseg_history_skip_action(const char *name, unsigned *flag);
/* Every name expseg_history_skip_action accepts: "alloc, free_requested, ..." (static). */
EXPSEG_EXPORT const char *expseg_history_skip_action_names(void);
/* Records an `annotate` event (PyTorch's _annotate_memory): text (copied; the event's
 * user_metadata in the snapshot) on the live allocation at ptr (addr, requested size,
 * stream), or, with ptr NULL, on no allocation (addr 0) as a mark in time. Nothing is
 * recorded while the history is off. A ptr that is no live allocation is
 * EXPSEG_ERR_INVALID_ARGUMENT. */
EXPSEG_EXPORT expseg_status expseg_history_annotate(expseg_allocator *a, const void *ptr,
                                                    const char *text);
/* PyTorch's recordAnnotation (what its record_function scopes report while the history is
 * recorded): one entry of the snapshot's external_annotations, the n key/value pairs
 * (copied) with the allocator's device and the time. Kept with the history: the newest
 * max_entries (the history's bound), kept when the history is enabled again, dropped by
 * EXPSEG_HISTORY_CLEAR and when the history stops; nothing is recorded while it is off.
 * n 0 is an entry with only device and time; a NULL key or value is
 * EXPSEG_ERR_INVALID_ARGUMENT naming its index. */
EXPSEG_EXPORT expseg_status expseg_history_record_annotation(expseg_allocator *a,
                                                             const char *const *keys,
                                                             const char *const *values,
                                                             size_t n);
typedef struct expseg_annotation {
  int device;
  uint64_t time_us; /* microseconds since the Unix epoch, as the history's events */
  size_t n;
  const char *const *keys, *const *values; /* n each */
} expseg_annotation;
/* Calls fn for each entry expseg_history_record_annotation kept, oldest first, under the
 * allocator's lock (fn must not call expseg on this allocator; the strings are valid during
 * the call only). */
EXPSEG_EXPORT expseg_status expseg_history_annotations(expseg_allocator *a,
                                                       void (*fn)(void *ctx,
                                                                  const expseg_annotation *e),
                                                       void *ctx);
/* PyTorch's pushCompileContext / popCompileContext / setUserMetadata / getUserMetadata, per
 * allocator: each event recorded later carries the top of the compile-context stack as its
 * compile_context ("N/A" while the stack is empty) and the user metadata as its
 * user_metadata ("" clears it; an annotate event's text replaces it). Both are kept while
 * the history is off. Popping an empty stack does nothing (as PyTorch). Texts are copied
 * and kept for the life of the process (once per distinct text). */
EXPSEG_EXPORT expseg_status expseg_history_push_compile_context(expseg_allocator *a,
                                                                const char *text);
EXPSEG_EXPORT expseg_status expseg_history_pop_compile_context(expseg_allocator *a);
EXPSEG_EXPORT expseg_status expseg_history_set_user_metadata(expseg_allocator *a,
                                                             const char *text);
/* The user metadata in buf (snprintf semantics); returns the length needed, NUL included. */
EXPSEG_EXPORT size_t expseg_history_user_metadata(expseg_allocator *a, char *buf, size_t len);
/* Where the live allocation at ptr was made (PyTorch's _allocation_traceback): the frames of
 * its alloc event, innermost first, one "filename:line:name" line each, in buf (snprintf
 * semantics; returns the length needed, NUL included). EXPSEG_ERR_INVALID_ARGUMENT when ptr
 * is no live allocation or the history does not hold its alloc event (not recording, or
 * dropped from the ring): the message says which. */
EXPSEG_EXPORT expseg_status expseg_allocation_traceback(expseg_allocator *a, const void *ptr,
                                                        char *buf, size_t len, size_t *needed);
/* Frames an embedding framework (e.g. Python's interpreter) attaches to the next events of
 * the calling thread, on every allocator: push outermost first; the strings are copied. */
typedef struct expseg_frame {
  const char *filename;
  const char *name;
  int line;
} expseg_frame;
EXPSEG_EXPORT expseg_status expseg_history_push_frames(const expseg_frame *frames, size_t n);
/* Pops the n innermost pushed frames (fewer if fewer are pushed). */
EXPSEG_EXPORT void expseg_history_pop_frames(size_t n);
/* The snapshot pickle (protocol 4, memory_viz's opcodes only) in a buffer the caller frees
 * with expseg_snapshot_free. expseg_snapshot_dump writes it to path through a temporary
 * file and a rename. */
EXPSEG_EXPORT expseg_status expseg_snapshot(expseg_allocator *a, unsigned char **buf,
                                            size_t *len);
/* The same with EXPSEG_SNAPSHOT_* flags. NO_TRACES: device_traces holds empty lists
 * (PyTorch's include_traces=False: the state only, written in O(blocks)). */
#define EXPSEG_SNAPSHOT_NO_TRACES 1u
EXPSEG_EXPORT expseg_status expseg_snapshot_ex(expseg_allocator *a, unsigned flags,
                                               unsigned char **buf, size_t *len);
EXPSEG_EXPORT expseg_status expseg_snapshot_dump_ex(expseg_allocator *a, const char *path,
                                                    unsigned flags);
EXPSEG_EXPORT void expseg_snapshot_free(unsigned char *buf);
/* The same snapshot plus the pinned host pool h (PyTorch's record_pinned_host_memory):
 * "host_segments" (each driver chunk of h, in the shape of "segments", device -1) and
 * "host_traces" (h's history as one list of trace entries; empty unless recording with
 * expseg_host_record_history, or with EXPSEG_SNAPSHOT_NO_TRACES). docs/snapshots.md. */
EXPSEG_EXPORT expseg_status expseg_snapshot_with_host(expseg_allocator *a, expseg_host_pool *h,
                                                      unsigned flags, unsigned char **buf,
                                                      size_t *len);
EXPSEG_EXPORT expseg_status expseg_snapshot_dump_with_host(expseg_allocator *a,
                                                           expseg_host_pool *h,
                                                           const char *path, unsigned flags);
/* torch.cuda.memory_summary()'s text, then expseg's own section. Writes at most len bytes
 * (NUL included); returns the length it needs (0 when a is NULL). */
EXPSEG_EXPORT size_t expseg_memory_summary(expseg_allocator *a, char *buf, size_t len,
                                           bool abbreviated);

/* A private pool's id ("Private memory pools" below): 0 = the general cache; private pools
 * are >= 1. */
typedef uint64_t expseg_pool_id;

/* ---- Walking the state (docs/snapshots.md "Walking the state"): what expseg_snapshot writes,
 * as C structs, for bindings that build their own snapshot objects (PyTorch's C++ backend
 * fills SnapshotInfo from it). Segments come in address order and are reported as in the
 * snapshot (an expandable segment as one segment per contiguous mapped run); each segment's
 * blocks tile it in address order. Then the history, oldest event first (none unless
 * recording, docs/snapshots.md). Both callbacks run with the allocator's lock held: they may
 * copy what they are given (valid only during the call) but must not call expseg. Either
 * callback may be NULL. Records a `snapshot` event first, as expseg_snapshot does. */
typedef enum expseg_block_state {
  EXPSEG_BLOCK_INACTIVE = 0,     /* free (cached) */
  EXPSEG_BLOCK_ALLOCATED = 1,    /* handed out, not freed */
  EXPSEG_BLOCK_PENDING_FREE = 2  /* freed, waiting for work recorded on other streams */
} expseg_block_state;
typedef struct expseg_walk_block {
  uint64_t address;
  uint64_t size;
  uint64_t requested_size; /* 0 for inactive blocks */
  expseg_block_state state;
} expseg_walk_block;
typedef struct expseg_walk_segment {
  uint64_t address, total_size;
  uint64_t allocated_size; /* bytes of allocated blocks */
  uint64_t active_size;    /* bytes of allocated and pending-free blocks */
  uint64_t requested_size; /* requested bytes of those */
  expseg_stream stream;
  bool is_large;           /* large pool (blocks over 1 MiB) */
  bool is_expandable;
  const expseg_walk_block *blocks;
  size_t n_blocks;
  expseg_pool_id pool;     /* its private pool (0 = the general cache), released or not */
  bool asleep;             /* its region sleeps (expseg_sleep): no memory behind it */
} expseg_walk_segment;
typedef struct expseg_walk_event {
  const char *action; /* PyTorch's TraceEntry action: "alloc", "free_requested",
                       * "free_completed", "segment_alloc", "segment_free", "segment_map",
                       * "segment_unmap", "oom", "snapshot", "annotate"; expseg's own
                       * "sleep" and "wake" of a region (addr 0, size its bytes) */
  uint64_t addr;      /* oom: the device's free bytes */
  uint64_t size;
  expseg_stream stream;
  uint64_t time_us;   /* microseconds since the Unix epoch */
  expseg_pool_id pool; /* the private pool of its block or segment (0 = the general cache) */
  const char *compile_context; /* the snapshot's compile_context ("N/A": none) */
  const char *user_metadata;   /* the snapshot's user_metadata ("" : none) */
} expseg_walk_event;
EXPSEG_EXPORT expseg_status expseg_walk(expseg_allocator *a,
                                        void (*segment)(void *ctx, const expseg_walk_segment *s),
                                        void (*event)(void *ctx, const expseg_walk_event *e),
                                        void *ctx);

/* ---- Identity: version, driver, device (docs/api.md "Identity") ---- */

#define EXPSEG_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, for #if checks against the header compiled with. */
#define EXPSEG_VERSION_NUMBER \
  (EXPSEG_VERSION_MAJOR * 10000 + EXPSEG_VERSION_MINOR * 100 + EXPSEG_VERSION_PATCH)

/* The version of the library loaded at run time, "MAJOR.MINOR.PATCH" (static storage). */
EXPSEG_EXPORT const char *expseg_version(void);

/* What an allocator runs on. Filled by expseg_get_info; strings have static storage. */
typedef struct expseg_info {
  const char *driver;    /* "cuda", "host" or "sim" (a fault-injecting wrapper: "fault") */
  int device;            /* the device ordinal given to expseg_create */
  size_t total_memory;   /* bytes the device has (cuMemGetInfo's total; host/sim: capacity) */
  size_t granularity;    /* the driver's allocation granularity in bytes */
  size_t page_size;      /* bytes per page of expandable segments, as configured */
} expseg_info;

EXPSEG_EXPORT expseg_status expseg_get_info(const expseg_allocator *a, expseg_info *info);
/* The driver's name, as expseg_info.driver; "" for a NULL allocator. */
EXPSEG_EXPORT const char *expseg_driver_name(const expseg_allocator *a);
/* Free and total bytes of the device now, as cudaMemGetInfo reports them (free counts what
 * every process has taken, this allocator's cache included); either pointer may be NULL. */
EXPSEG_EXPORT expseg_status expseg_mem_get_info(expseg_allocator *a, size_t *free_bytes,
                                                size_t *total_bytes);

/* ---- Several devices, peer access, sharing between processes, single-chunk allocations
 * (docs/api.md "Devices, peers and sharing", docs/ipc.md) ---- */

/* Makes every range the allocator has mapped, and every one it maps later (growth, page
 * moves, page-cache re-maps, imports), readable and writable from peer_device: one
 * set-access call per range per peer. cudaDeviceEnablePeerAccess alone does not do this for
 * virtual-memory mappings. peer_device in [0, 63], not the allocator's own device (on cuda
 * also a device the machine has that can access this one's memory, checked at enable);
 * enabling twice is OK. On failure nothing changed. disable takes the access away again. */
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
 * stays the caller's. Malformed handles are EXPSEG_ERR_INVALID_ARGUMENT naming the field,
 * and so are stale ones (the exporting allocator destroyed or its process gone). */
EXPSEG_EXPORT EXPSEG_NODISCARD expseg_status expseg_ipc_import(expseg_allocator *a,
                                                               const expseg_ipc_handle *h,
                                                               void **ptr);
/* Unmaps an imported allocation and closes everything it held. A pointer import did not
 * return (or one closed already) is EXPSEG_ERR_INVALID_ARGUMENT naming it. When the driver
 * refuses a step, the error is returned and the import stays open: close it again. */
EXPSEG_EXPORT expseg_status expseg_ipc_close(expseg_allocator *a, void *ptr);
/* Checks now which importers are gone (also done by every malloc and empty_cache while
 * exports are outstanding); *held (may be NULL) = exports still held open. */
EXPSEG_EXPORT expseg_status expseg_ipc_poll(expseg_allocator *a, size_t *held);
EXPSEG_EXPORT void expseg_ipc_handle_free(expseg_ipc_handle *h);

/* ---- Streams the driver creates (to replay a history's streams on a GPU) ---- */
/* A new stream on the allocator's device: on cuda a CUstream (cuStreamCreate, non-blocking)
 * usable with expseg_malloc and expseg_record_stream; destroy it with
 * expseg_stream_destroy. host and sim have none to create (any value is a stream there):
 * EXPSEG_ERR_UNSUPPORTED. */
EXPSEG_EXPORT expseg_status expseg_stream_create(expseg_allocator *a, expseg_stream *out);
EXPSEG_EXPORT expseg_status expseg_stream_destroy(expseg_allocator *a, expseg_stream stream);
/* Tags stream with an expandable-segment reserve class (PyTorch's
 * setExpandableSegmentReserveClassForStream): its new expandable segments reserve what
 * expandable_segments_reserve_by_class gives the class (docs/config.md); a class the option
 * does not list keeps the stream's usual reserve. cls NULL or "" removes the tag. A name of
 * 1 to 63 bytes without ',', ':', '[', ']' or spaces (what the option can name). */
EXPSEG_EXPORT expseg_status expseg_stream_set_reserve_class(expseg_allocator *a,
                                                            expseg_stream stream,
                                                            const char *cls);
/* Waits until all work queued on the allocator's device, on every stream, is done (cuda:
 * cuCtxSynchronize in the device's primary context). host and sim: EXPSEG_ERR_DRIVER while
 * a test holds a stream (it would wait forever), else EXPSEG_OK at once. */
EXPSEG_EXPORT expseg_status expseg_synchronize(expseg_allocator *a);

/* ---- Private memory pools (PyTorch's MemPool and CUDA-graph pools; docs/api.md "Private
 * pools") ----
 * A private pool has segments of its own: its blocks are never handed to another pool or to
 * the general cache, its freed blocks are reused only inside it, and its memory goes back
 * only when it is emptied or released. Stream values are below 2^48 when pools are used
 * (CUDA's stream handles are). */
/* expseg_pool_id (declared above, with expseg_walk): 0 = the general cache; private pools
 * are >= 1. */
/* A new private pool, its use count 1. Ids are never reused. At most 65,535 private pools
 * exist at once (released ones count until their blocks are freed): one more is
 * EXPSEG_ERR_UNSUPPORTED, not an out-of-memory error. */
EXPSEG_EXPORT EXPSEG_NODISCARD expseg_status expseg_pool_create(expseg_allocator *a,
                                                                expseg_pool_id *out);
/* Use count + 1 (PyTorch's createOrIncrefPool on an existing pool). */
EXPSEG_EXPORT expseg_status expseg_pool_retain(expseg_allocator *a, expseg_pool_id pool);
/* Use count; INVALID_ARGUMENT for an unknown pool. */
EXPSEG_EXPORT expseg_status expseg_pool_use_count(const expseg_allocator *a, expseg_pool_id pool,
                                                  int *out);
/* From now on, allocations on a stream for which filter(ctx, stream) is true (filter NULL:
 * every stream) come from `pool`, until expseg_pool_end. Several pools may be active at
 * once: the latest begun whose filter accepts the stream wins (PyTorch checks LIFO).
 * The filter runs under the allocator's lock: it must not call expseg. */
EXPSEG_EXPORT expseg_status expseg_pool_begin(expseg_allocator *a, expseg_pool_id pool,
                                              bool (*filter)(void *ctx, expseg_stream stream),
                                              void *ctx);
/* Ends the latest begin of `pool` still in force. */
EXPSEG_EXPORT expseg_status expseg_pool_end(expseg_allocator *a, expseg_pool_id pool);
/* Use count - 1. At 0 the pool's cached memory is given back once every block of it is
 * free and its streams' work is done (at once when that is already true; else when its last
 * block is freed / its events complete, or at the next empty_cache), and the id becomes
 * unknown. A region's pool (expseg_region_begin) never reaches 0: that release is refused. */
EXPSEG_EXPORT expseg_status expseg_pool_release(expseg_allocator *a, expseg_pool_id pool);
/* Gives back the pool's free cached memory now (PyTorch's emptyCache(mempool_id)). */
EXPSEG_EXPORT expseg_status expseg_pool_empty_cache(expseg_allocator *a, expseg_pool_id pool);
/* Allocate from a given pool directly, ignoring active pools (0 = general cache). */
EXPSEG_EXPORT EXPSEG_NODISCARD expseg_status expseg_malloc_pool(expseg_allocator *a, size_t size,
                                                                expseg_stream stream,
                                                                expseg_pool_id pool, void **out);
/* The pool a live pointer belongs to (0 = the general cache). */
EXPSEG_EXPORT expseg_status expseg_pool_of(const expseg_allocator *a, const void *ptr,
                                           expseg_pool_id *out);

/* ---- Tagged regions: sleep and wake (docs/api.md "Sleep and wake") ----
 * A region is a private pool named by a tag ("weights", "kv_cache"): between
 * expseg_region_begin and expseg_region_end, allocations on every stream come from the
 * region's own segments (never shared with another region or the general cache, not even
 * a page). expseg_sleep gives the region's physical memory back to the driver and keeps
 * every address reserved; expseg_wake maps memory at the same addresses again, so every
 * pointer into the region stays valid across a sleep. Tags are 1 to 63 bytes of printable
 * ASCII; a region lives as long as its allocator. */
typedef enum expseg_sleep_mode {
  EXPSEG_SLEEP_OFFLOAD = 0, /* live bytes are copied to pinned host memory, restored on wake */
  EXPSEG_SLEEP_DISCARD = 1  /* live bytes are dropped: after wake their contents are undefined */
} expseg_sleep_mode;
/* Allocations (on every stream) go to region `tag`, created on first use, until
 * expseg_region_end(tag). Begins nest as private pools do (the latest begun wins).
 * A sleeping region refuses allocations: EXPSEG_ERR_INVALID_ARGUMENT naming the tag. */
EXPSEG_EXPORT expseg_status expseg_region_begin(expseg_allocator *a, const char *tag);
EXPSEG_EXPORT expseg_status expseg_region_end(expseg_allocator *a, const char *tag);
/* Waits for the work queued on every stream (the region's blocks may be used on any), gives
 * the region's free cached memory back, then (offload) copies every live block to pinned
 * host memory, unmaps and releases the region's physical memory. On failure before the
 * first unmap nothing changed and the region is awake; a failure later leaves it asleep
 * with its bytes safe (some memory may still be held): calling expseg_sleep again retries,
 * expseg_wake restores. Sleeping twice is OK (the mode of the first sleep stays). */
EXPSEG_EXPORT expseg_status expseg_sleep(expseg_allocator *a, const char *tag,
                                         expseg_sleep_mode mode);
/* Creates and maps physical memory at the same addresses (on a full device, after giving
 * back the general cache's free memory, as a malloc does) and copies the offloaded bytes
 * back; when it returns the region is usable by any work queued after it. On failure the
 * region stays asleep and intact (host copies kept) and the next wake tries again. The
 * memory fraction caps a wake as it caps growth: one that would pass the cap (lowered while
 * the region slept, say) even with the general cache's free memory given back is
 * EXPSEG_ERR_OUT_OF_MEMORY naming it, before any memory is created. Frees of the region's
 * blocks made while it slept take effect here. Waking an awake region is OK. */
EXPSEG_EXPORT expseg_status expseg_wake(expseg_allocator *a, const char *tag);
typedef struct expseg_region_info {
  expseg_pool_id pool;     /* the region's private pool (expseg_pool_of of its pointers) */
  bool asleep;
  uint64_t live_bytes;     /* bytes of its allocated blocks */
  uint64_t device_bytes;   /* physical device memory it holds now */
  uint64_t asleep_bytes;   /* device memory given back by the current sleep (0 awake) */
  uint64_t host_bytes;     /* pinned host memory holding its offloaded bytes (0 awake) */
  uint64_t deferred_frees; /* frees made while asleep, done at wake */
  uint64_t sleeps, wakes;  /* completed so far */
  uint64_t last_sleep_us, last_wake_us; /* duration of the last complete sleep / wake, us */
  uint64_t last_sleep_at_us, last_wake_at_us; /* when they ended: us since the Unix epoch
                                               * (0: none yet) */
  uint64_t host_kept_bytes; /* pinned host memory kept from the last offload for the next
                             * (awake; given back by expseg_empty_cache) */
  uint64_t last_sleep_copy_us, last_wake_copy_us; /* of last_sleep_us / last_wake_us, the
                                                   * time spent copying the region's bytes
                                                   * (the rest: driver calls and bookkeeping;
                                                   * 0 for a discard) */
} expseg_region_info;
EXPSEG_EXPORT expseg_status expseg_region_get_info(expseg_allocator *a, const char *tag,
                                                   expseg_region_info *out);

#ifdef __cplusplus
}
#endif
#endif /* EXPSEG_H */
