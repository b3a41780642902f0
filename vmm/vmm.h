/* SPDX-License-Identifier: Apache-2.0 */
/* vmm.h: the driver contract. The only way the rest of expseg reaches memory.
 *
 * A driver is a table of function pointers (expseg_vmm_ops_t) plus the backend's state,
 * wrapped in an expseg_vmm_t. Pools never call a backend directly: they call the
 * _expseg_vmm_* wrappers below (vmm/vmm.c), which check every precondition written here,
 * count every call by kind, and only then call the backend. Backends never count and may
 * assume the preconditions hold.
 *
 * Return convention: every operation returns an expseg_status (EXPSEG_OK = 0). On failure
 * the backend has already set the thread's message with _expseg_error_set() (vmm/error.h):
 * EXPSEG_ERR_OUT_OF_MEMORY when the device has no room, EXPSEG_ERR_DRIVER for any other
 * driver failure, EXPSEG_ERR_INVALID_ARGUMENT for a violated precondition (the wrapper, or
 * sim's own bookkeeping, which double-checks), EXPSEG_ERR_UNSUPPORTED for a missing feature.
 * A failed call leaves nothing behind (no half-created chunk, no partial mapping).
 *
 * Preconditions (checked in vmm.c; "g" is the granularity):
 *  - reserve: size > 0 and a multiple of g; align is 0 or a power of two multiple of g.
 *  - unreserve: (addr, size) is exactly one live reservation and nothing in it is mapped.
 *  - create: size > 0 and a multiple of g. Creating past the device's capacity is OOM.
 *  - release: handle is live and not mapped anywhere.
 *  - map: addr, size and offset are multiples of g; [addr, addr+size) lies inside one live
 *    reservation and none of it is mapped; [offset, offset+size) lies inside the chunk.
 *    (CUDA accepts only offset 0: the cuda backend returns UNSUPPORTED for others.)
 *  - unmap: [addr, addr+size) is exactly a union of whole earlier mappings (CUDA cannot
 *    unmap part of a mapping), all inside one reservation.
 *  - set_access: [addr, addr+size) is mapped (every byte) inside one reservation. The
 *    allocator calls it once per newly mapped contiguous range and device (its own, then
 *    each peer given with expseg_enable_peer_access), never per chunk. `device` >= 0 grants
 *    that device read-write access; EXPSEG_VMM_REVOKE(d) takes device d's access away
 *    (never the owner's). Access goes with the mapping on unmap.
 *  - events: an event is recorded before it is queried or synchronized; destroy takes a
 *    live event.
 * A physical chunk cannot be split once created: mapping part of one is allowed, but the
 * allocator never frees part of a chunk. Never merge blocks across chunks of classic
 * segments.
 *
 * Streams are plain uint64 values (a CUstream on cuda; any value on host and sim; 0 is the
 * default stream). host and sim model them: work "completes" at once unless a test holds
 * the stream (_expseg_vmm_hold_stream), in which case events recorded on it stay incomplete
 * until it is released. */
#ifndef EXPSEG_VMM_H
#define EXPSEG_VMM_H

#include "clock.h" /* base/ */
#include "expseg.h"

#ifdef __cplusplus
#include <atomic>
#define EXPSEG_ATOMIC(T) std::atomic<T>
#else
#include <stdatomic.h>
#define EXPSEG_ATOMIC(T) _Atomic T
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Call kinds: X(name). The wrapper counts each one; stats and fault injection use them. */
#define EXPSEG_VMM_CALLS(X)                                                               \
  X(reserve) X(unreserve) X(create) X(release) X(map) X(unmap) X(set_access)              \
  X(event_create) X(event_destroy) X(event_record) X(event_query) X(event_synchronize)    \
  X(stream_synchronize) X(export_fd) X(import_fd) X(host_alloc) X(host_free)               \
  X(device_synchronize) X(copy)

typedef enum expseg_vmm_call {
#define EXPSEG_VMM_CALL_ENUM_(n) EXPSEG_VMM_CALL_##n,
  EXPSEG_VMM_CALLS(EXPSEG_VMM_CALL_ENUM_)
#undef EXPSEG_VMM_CALL_ENUM_
  EXPSEG_VMM_CALL_COUNT
} expseg_vmm_call;

/* set_access's device argument for taking device d's access away: ~d (always < 0). */
#define EXPSEG_VMM_REVOKE(d) (~(d))
#define EXPSEG_VMM_REVOKED_DEVICE(arg) (~(arg))

typedef uint64_t expseg_vmm_handle; /* physical chunk (CUmemGenericAllocationHandle) */
typedef uint64_t expseg_vmm_event;  /* CUevent or the backend's own id; never 0 when live */

/* A chunk of pinned host memory (the host pool, pools/host/host_pool.c). The caller fills the
 * inputs; host_alloc fills the outputs; host_free takes the record back unchanged.
 * Preconditions (vmm.c): size > 0 and a multiple of the OS page; numa_node is -1 (no
 * placement) or a node of this machine (_expseg_topo_node_exists); fault_threads is a power of two from 1 to 128. */
typedef struct expseg_host_chunk_s {
  size_t size;            /* in */
  int numa_node;          /* in: node the pages must sit on; -1 = the OS's choice */
  bool use_register;      /* in: ordinary memory, pre-faulted, then registered (locked) */
  uint32_t fault_threads; /* in: threads that pre-fault the pages (register path) */
  bool no_huge;           /* in: do not advise transparent huge pages (pinned_huge_pages) */
  void *ptr;              /* out: host address (also the device's, unified addressing) */
  bool locked;            /* out: page-locked (host: mlock worked; cuda: always) */
  bool placed;            /* out: bound to numa_node */
  uint8_t method;         /* out: EXPSEG_HOST_* below, for host_free */
  uint32_t threads_used;  /* out: pre-faulting threads started */
  uint64_t handle;        /* out: the backend's word (cuda: the cuMemCreate handle) */
} expseg_host_chunk_t;
enum { EXPSEG_HOST_REGISTERED = 1, EXPSEG_HOST_CREATED = 2 };

typedef struct expseg_vmm_ops_s {
  const char *name; /* "cuda", "host", "sim", "fault" */
  expseg_status (*reserve)(void *st, size_t size, size_t align, uintptr_t *addr);
  expseg_status (*unreserve)(void *st, uintptr_t addr, size_t size);
  expseg_status (*create)(void *st, size_t size, expseg_vmm_handle *h);
  expseg_status (*release)(void *st, expseg_vmm_handle h);
  expseg_status (*map)(void *st, uintptr_t addr, size_t size, expseg_vmm_handle h,
                       size_t offset);
  expseg_status (*unmap)(void *st, uintptr_t addr, size_t size);
  expseg_status (*set_access)(void *st, uintptr_t addr, size_t size, int device);
  expseg_status (*event_create)(void *st, expseg_vmm_event *ev);
  expseg_status (*event_destroy)(void *st, expseg_vmm_event ev);
  expseg_status (*event_record)(void *st, expseg_vmm_event ev, expseg_stream stream);
  expseg_status (*event_query)(void *st, expseg_vmm_event ev, bool *done);
  expseg_status (*event_synchronize)(void *st, expseg_vmm_event ev);
  expseg_status (*stream_synchronize)(void *st, expseg_stream stream);
  /* Sharing between processes: a new fd the caller owns, and where the chunk starts in the
   * file it names (host: chunks are ranges of a shared arena file; cuda: always 0). import
   * takes a duplicate of fd and the same offset. */
  expseg_status (*export_fd)(void *st, expseg_vmm_handle h, int *fd, size_t *offset);
  expseg_status (*import_fd)(void *st, int fd, size_t offset, size_t size,
                             expseg_vmm_handle *h);
  /* Never fail. */
  size_t (*granularity)(void *st);
  void (*mem_info)(void *st, size_t *free_bytes, size_t *total_bytes);
  uint64_t (*now_ns)(void *st); /* monotonic clock */
  /* Test hook (NULL where a driver has none): hold = true keeps events recorded on the
   * stream from completing until hold = false. */
  void (*hold_stream)(void *st, expseg_stream stream, bool hold);
  /* Streams the driver creates (cuda; NULL on host and sim, where any value is a stream). */
  expseg_status (*stream_create)(void *st, expseg_stream *stream);
  expseg_status (*stream_destroy)(void *st, expseg_stream stream);
  /* Pinned host memory (NULL = unsupported): see expseg_host_chunk_t. host_numa: the node
   * nearest the device (cuda: PCI locality; host: its numa=N; -1 unknown). */
  expseg_status (*host_alloc)(void *st, expseg_host_chunk_t *c);
  expseg_status (*host_free)(void *st, const expseg_host_chunk_t *c);
  int (*host_numa)(void *st);
  void (*destroy)(void *st); /* frees the backend's state (and an inner driver it owns) */
  /* Test hook (host and sim; NULL elsewhere): *state = 2 when every byte of [addr,
   * addr+size) is accessible from device, 1 when some byte is, 0 when none is. */
  expseg_status (*has_access)(void *st, uintptr_t addr, size_t size, int device, int *state);
  /* Whether device `peer` exists and can access this device's memory (cuda:
   * cuDeviceCanAccessPeer); NULL: every ordinal is accepted (host, sim). */
  expseg_status (*check_peer)(void *st, int peer);
  /* Waits until all work queued on the device (every stream) is done: cuCtxSynchronize on
   * cuda; host and sim fail (EXPSEG_ERR_DRIVER) instead of waiting forever while a stream is
   * held. NULL = unsupported. */
  expseg_status (*device_synchronize)(void *st);
  /* Data-check hook (cuda: cuMemcpyHtoD/DtoH, synchronous; host: memcpy; NULL on sim, which
   * has no bytes): copies size bytes between host memory and [dev, dev+size), which must be
   * mapped and accessible to the driver's device. to_device: host -> device. */
  expseg_status (*copy)(void *st, uintptr_t dev, void *host, size_t size, bool to_device);
  /* The same queued on `stream` (a stream the driver created) and returned at once: the bytes
   * are in place once stream_synchronize(stream) returns, and neither side may be unmapped or
   * freed before. host must be pinned host memory (host_alloc's). NULL: the driver copies
   * synchronously only (host, sim). cuda: cuMemcpyHtoDAsync / cuMemcpyDtoHAsync. */
  expseg_status (*copy_async)(void *st, uintptr_t dev, void *host, size_t size, bool to_device,
                              expseg_stream stream);
} expseg_vmm_ops_t;

/* A driver instance. Counts are atomics: the allocator calls create/release outside its
 * lock. */
typedef struct expseg_vmm_s {
  const expseg_vmm_ops_t *ops;
  void *st;                 /* backend state */
  int device;               /* device ordinal the backend serves */
  int numa_override;        /* numa=N of the spec for pinned host memory; -1 = ask host_numa */
  size_t granularity;       /* cached ops->granularity(st) */
  EXPSEG_ATOMIC(uint64_t) calls[EXPSEG_VMM_CALL_COUNT]; /* successful and failed calls by kind */
  EXPSEG_ATOMIC(uint64_t) failures[EXPSEG_VMM_CALL_COUNT];
  EXPSEG_ATOMIC(int64_t) live_chunks;     /* created - released (imports included) */
  EXPSEG_ATOMIC(int64_t) live_chunk_bytes;
  EXPSEG_ATOMIC(int64_t) created_bytes;   /* accumulated bytes of chunks created */
  EXPSEG_ATOMIC(int64_t) live_reservations;
  EXPSEG_ATOMIC(int64_t) reserved_va_bytes;
  EXPSEG_ATOMIC(int64_t) mapped_bytes;
  EXPSEG_ATOMIC(int64_t) live_events;
} expseg_vmm_t;

/* ---- vmm.c: construction from a spec, and the checked, counting wrappers ---- */

/* spec: "cuda", "host", "sim" with options "name:key=value,key=value" (docs/driver.md):
 *   host: capacity=SIZE (default 8G, or physical memory / 2 when smaller),
 *         granularity=SIZE (default 2M; a power of two multiple of the OS page), numa=N
 *   sim:  capacity=SIZE (default 80G), granularity=SIZE (default 2M), va=SIZE (default 128T)
 *   cuda: numa=N (node for pinned host memory; default: the node nearest the GPU)
 * SIZE is an integer with an optional K, M, G or T suffix (binary units).
 * NULL = $EXPSEG_DRIVER, else "cuda"; no fallback: without a usable CUDA device that is
 * EXPSEG_ERR_UNSUPPORTED with a message saying why and how to pick host or sim.
 * Malformed specs are EXPSEG_ERR_CONFIG naming the bad part. */
expseg_status _expseg_vmm_open(const char *spec, int device, expseg_vmm_t **out);
/* Wraps an already-built backend (used by the fault wrapper and by tests). Takes ownership
 * of st: ops->destroy(st) runs in _expseg_vmm_close. */
expseg_status _expseg_vmm_wrap(const expseg_vmm_ops_t *ops, void *st, int device,
                               expseg_vmm_t **out);
void _expseg_vmm_close(expseg_vmm_t *v);

expseg_status _expseg_vmm_reserve(expseg_vmm_t *v, size_t size, size_t align, uintptr_t *addr);
expseg_status _expseg_vmm_unreserve(expseg_vmm_t *v, uintptr_t addr, size_t size);
expseg_status _expseg_vmm_create(expseg_vmm_t *v, size_t size, expseg_vmm_handle *h);
expseg_status _expseg_vmm_release(expseg_vmm_t *v, expseg_vmm_handle h, size_t size);
expseg_status _expseg_vmm_map(expseg_vmm_t *v, uintptr_t addr, size_t size, expseg_vmm_handle h,
                              size_t offset);
expseg_status _expseg_vmm_unmap(expseg_vmm_t *v, uintptr_t addr, size_t size);
expseg_status _expseg_vmm_set_access(expseg_vmm_t *v, uintptr_t addr, size_t size);
/* The same for another device: device >= 0 grants it, EXPSEG_VMM_REVOKE(d) revokes d.
 * Counted as a set_access call. */
expseg_status _expseg_vmm_set_access_dev(expseg_vmm_t *v, uintptr_t addr, size_t size,
                                         int device);
/* Test hook: the backend's record of device's access to the range (ops->has_access);
 * EXPSEG_ERR_UNSUPPORTED where the backend keeps none (cuda, fault). Not counted. */
expseg_status _expseg_vmm_has_access(expseg_vmm_t *v, uintptr_t addr, size_t size, int device,
                                     int *state);
/* ops->check_peer, or EXPSEG_OK where the driver has none. Not a counted call. */
expseg_status _expseg_vmm_check_peer(expseg_vmm_t *v, int peer);
/* Byte copies (ops->copy): writes size bytes of src at device address dst (copy_in),
 * reads size bytes at device address src into dst (copy_out). Used by sleep and wake and by
 * data checks. Counted as call kind `copy`, so a fault rule can fail it (a fault wrapper
 * passes the others to its inner driver). EXPSEG_ERR_UNSUPPORTED on sim (no bytes behind
 * its addresses); EXPSEG_ERR_INVALID_ARGUMENT for size 0, a NULL host pointer, or (host,
 * cuda) a range not mapped or not accessible. */
expseg_status _expseg_vmm_copy_in(expseg_vmm_t *v, uintptr_t dst, const void *src, size_t size);
expseg_status _expseg_vmm_copy_out(expseg_vmm_t *v, void *dst, uintptr_t src, size_t size);
/* Whether the driver (a fault wrapper's inner one) queues copies (ops->copy_async). */
bool _expseg_vmm_copies_async(expseg_vmm_t *v);
/* Whether the driver (a fault wrapper's inner one) has bytes behind its addresses to copy
 * (ops->copy: host and cuda; not sim). Not a call: never counted, never faulted. */
bool _expseg_vmm_has_bytes(expseg_vmm_t *v);
/* ops->copy_async, checked as copy_in/out and counted as a `copy` call; host is pinned
 * memory, stream one the driver created; synchronize the stream before using either side.
 * Where the driver has no copy_async, the synchronous copy. */
expseg_status _expseg_vmm_copy_async(expseg_vmm_t *v, uintptr_t dev, void *host, size_t size,
                                     bool to_device, expseg_stream stream);
expseg_status _expseg_vmm_event_create(expseg_vmm_t *v, expseg_vmm_event *ev);
expseg_status _expseg_vmm_event_destroy(expseg_vmm_t *v, expseg_vmm_event ev);
expseg_status _expseg_vmm_event_record(expseg_vmm_t *v, expseg_vmm_event ev, expseg_stream s);
expseg_status _expseg_vmm_event_query(expseg_vmm_t *v, expseg_vmm_event ev, bool *done);
expseg_status _expseg_vmm_event_synchronize(expseg_vmm_t *v, expseg_vmm_event ev);
expseg_status _expseg_vmm_stream_synchronize(expseg_vmm_t *v, expseg_stream s);
expseg_status _expseg_vmm_device_synchronize(expseg_vmm_t *v);
/* export_fd: *fd (the caller closes it) and *offset of the chunk in that file; pass both to
 * import_fd in the other process. offset + size must not overflow. */
expseg_status _expseg_vmm_export_fd(expseg_vmm_t *v, expseg_vmm_handle h, int *fd,
                                    size_t *offset);
expseg_status _expseg_vmm_import_fd(expseg_vmm_t *v, int fd, size_t offset, size_t size,
                                    expseg_vmm_handle *h);
void _expseg_vmm_mem_info(expseg_vmm_t *v, size_t *free_bytes, size_t *total_bytes);
uint64_t _expseg_vmm_now_ns(expseg_vmm_t *v);
/* The library's one monotonic clock in ns is base/clock.h's _expseg_clock_ns (included
 * above); the driver's now_ns is it, or a modelled clock. */
/* EXPSEG_ERR_UNSUPPORTED where the backend has no hold hook. */
expseg_status _expseg_vmm_hold_stream(expseg_vmm_t *v, expseg_stream s, bool hold);
/* EXPSEG_ERR_UNSUPPORTED where the driver has no streams to create (host, sim). */
expseg_status _expseg_vmm_stream_create(expseg_vmm_t *v, expseg_stream *s);
expseg_status _expseg_vmm_stream_destroy(expseg_vmm_t *v, expseg_stream s);
const char *_expseg_vmm_call_name(expseg_vmm_call c);
/* Pinned host memory: checked and counted as the calls above. host_numa: numa_override,
 * else the backend's answer, else 0 on a one-node machine, else -1. */
expseg_status _expseg_vmm_host_alloc(expseg_vmm_t *v, expseg_host_chunk_t *c);
expseg_status _expseg_vmm_host_free(expseg_vmm_t *v, const expseg_host_chunk_t *c);
int _expseg_vmm_host_numa(expseg_vmm_t *v);

/* ---- backends: each builds its state from already-parsed options ---- */

typedef struct expseg_host_opts_s {
  size_t capacity;    /* bytes of "device memory" chunks may use in all */
  size_t granularity; /* bytes; power of two, multiple of the OS page size */
  int numa_node;      /* -1 = no placement */
} expseg_host_opts_t;

typedef struct expseg_sim_opts_s {
  size_t capacity;
  size_t granularity;
  uint64_t va_size; /* size of the fake address space handed out by reserve */
  bool top_down;    /* reserve hands out the highest free addresses first (as cudaMalloc's
                     * addresses descend on Linux), else the lowest */
} expseg_sim_opts_t;

expseg_status _expseg_host_new(const expseg_host_opts_t *o, int device, expseg_vmm_t **out);
expseg_status _expseg_sim_new(const expseg_sim_opts_t *o, int device, expseg_vmm_t **out);
/* EXPSEG_ERR_UNSUPPORTED with a clear message where there is no libcuda.so.1, no device, or
 * the device lacks virtual memory management (and where built without CUDA). */
expseg_status _expseg_cuda_new(int device, expseg_vmm_t **out);
bool _expseg_cuda_usable(int device); /* true when _expseg_cuda_new would succeed */

/* ---- fault.c: a wrapper over any driver that fails chosen calls ---- */

typedef struct expseg_fault_rule_s {
  expseg_vmm_call call; /* which kind */
  uint64_t nth;         /* fail the nth call of that kind (1-based) ... */
  uint64_t count;       /* ... and the count-1 calls after it (0 = 1) */
  expseg_status status; /* EXPSEG_ERR_OUT_OF_MEMORY or EXPSEG_ERR_DRIVER */
} expseg_fault_rule_t;

/* Takes ownership of inner (closed with the wrapper). Rules may be replaced at run time. */
expseg_status _expseg_fault_new(expseg_vmm_t *inner, expseg_vmm_t **out);
void _expseg_fault_set_rules(expseg_vmm_t *fault, const expseg_fault_rule_t *rules, size_t n);
/* Calls of each kind that reached the fault wrapper so far. */
uint64_t _expseg_fault_seen(expseg_vmm_t *fault, expseg_vmm_call call);
expseg_vmm_t *_expseg_fault_inner(expseg_vmm_t *fault);
/* Calls failed by a rule so far. */
uint64_t _expseg_fault_injected(expseg_vmm_t *fault);
/* Replaces the rules with text "KIND@N[..[M]][:oom|:driver],..." (docs/driver.md); with
 * relative, N counts from the calls of that kind seen so far. EXPSEG_ERR_CONFIG with a
 * message naming the position and what is accepted; rules unchanged then. */
expseg_status _expseg_fault_set_rules_text(expseg_vmm_t *fault, const char *text, size_t len,
                                           bool relative);

/* ---- ipc_socket.c: a handle's bytes and descriptors over a Unix stream socket ---- */

/* Sends data and the descriptors (SCM_RIGHTS; the caller keeps its own). */
expseg_status _expseg_ipc_sock_send(int sock, const void *data, size_t size, const int *fds,
                                    size_t n_fds);
/* Receives what send sent: malloc'd *data and *fds (close-on-exec) the caller owns. On
 * failure nothing is left open. */
expseg_status _expseg_ipc_sock_recv(int sock, unsigned char **data, size_t *size, int **fds,
                                    size_t *n_fds);

/* ---- topo.c: topology through hwloc ---- */

/* Number of NUMA nodes (1 when hwloc sees none or is not built in). */
int _expseg_topo_numa_count(void);
/* Whether NUMA node `node` (the OS's number: numbers may have holes) exists. */
bool _expseg_topo_node_exists(int node);
/* NUMA node nearest the PCI device "0000:17:00.0" (cuDeviceGetPCIBusId form); -1 unknown. */
int _expseg_topo_numa_of_pci(const char *pci_bus_id);
/* Binds [addr, addr+size) to NUMA node `node` (host memory). EXPSEG_ERR_UNSUPPORTED when
 * hwloc cannot; the memory stays usable. */
expseg_status _expseg_topo_bind(void *addr, size_t size, int node);
/* Binds the calling thread to the cores of NUMA node `node`. EXPSEG_ERR_UNSUPPORTED when
 * hwloc cannot (the thread then runs anywhere). */
expseg_status _expseg_topo_bind_thread(int node);
/* Tests only (tests/test_gpu_numa.cpp): replaces the process's topology by the one the hwloc
 * XML text `xml` describes (a machine of several NUMA nodes, GPUs on chosen nodes), or with
 * NULL by this machine's again. Not thread-safe: call it while no allocator, host pool or
 * other topology call is in use; a driver opened before keeps the node it found then.
 * EXPSEG_ERR_UNSUPPORTED when the text does not load or hwloc is not built in. */
expseg_status _expseg_topo_load_for_testing(const char *xml);

/* ---- host_pinned.c: pinned host memory in ordinary host memory (host and sim) ---- */

/* host_alloc of the host and sim backends: mmap, bind to the node (mbind through hwloc),
 * pre-fault, then mlock as the stand-in for page locking (RLIMIT_MEMLOCK may refuse it:
 * then locked = false and the memory stays usable). st is unused. */
expseg_status _expseg_pinned_alloc(void *st, expseg_host_chunk_t *c);
expseg_status _expseg_pinned_free(void *st, const expseg_host_chunk_t *c);
/* Faults [p, p+size) in with n threads (bound to `node`'s cores when node >= 0); n = 1
 * runs on the caller when node < 0 or size < 2 MiB. With `huge`, a range of 4 MiB or more
 * is first advised to use transparent huge pages. Returns the threads started. */
uint32_t _expseg_pinned_prefault(void *p, size_t size, uint32_t n, int node, bool huge);

#ifdef __cplusplus
}
#endif
#endif /* EXPSEG_VMM_H */
