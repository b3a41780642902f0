/* SPDX-License-Identifier: Apache-2.0 */
/* cuda.c: the cuda backend, CUDA's virtual memory management API. The only file that
 * includes cuda.h.
 *
 * No link-time dependency on libcuda: the driver library is opened at run time
 * (dlopen("libcuda.so.1")), cuGetProcAddress is found with dlsym (cuGetProcAddress_v2 on
 * CUDA 12+, the 4-argument cuGetProcAddress before), and every other entry point comes from
 * it, asked for at min(driver version, header version) so the ABI matches the prototypes of
 * the cuda.h we compiled against. Loading happens once per process (pthread_once).
 *
 * Each driver instance retains the device's primary context. Calls may come from any
 * thread, so each call makes that context current for its duration and restores the
 * caller's context afterwards (nothing changes when it was already current).
 *
 * Mapping: reserve = cuMemAddressReserve, create = cuMemCreate (pinned device memory, with a
 * POSIX fd handle type when the device supports it), map = cuMemMap (offset 0 only), set_access
 * = cuMemSetAccess (READWRITE for its own device or a peer; PROT_NONE revokes a peer), unmap =
 * cuMemUnmap, release = cuMemRelease, unreserve = cuMemAddressFree, copy = cuMemcpyHtoD/DtoH,
 * copy_async (sleep and wake) = cuMemcpyHtoDAsync/DtoHAsync; events without timing. Every failure names the call and its error name.
 * CUmemLocation ids are device ordinals, never CUdevice handles. Once the driver has shut
 * down (CUDA_ERROR_DEINITIALIZED, process exit) what frees or waits is done (cu_done).
 * hold_stream (a test hook): cuStreamWaitValue32 on a word of a registered host page; its
 * slots and the set of destroyed streams are kept by vmm/stream_holds.c.
 *
 * Pinned host memory (host_alloc): where the device supports host-NUMA locations for the
 * VMM API (CUDA 12.4+ headers, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_
 * SUPPORTED) and a node is asked, cuMemCreate on {HOST_NUMA, node}, mapped at a reserved
 * address with read-write access for the device and the host; else (and always with
 * use_register) mmap, bind to the node, pre-fault with the asked threads, then
 * cuMemHostRegister(PORTABLE | DEVICEMAP). host_numa: the node hwloc finds nearest the
 * device's PCI bus id. */
#include "vmm_impl.h"

#include "map.h"
#include "stream_holds.h"

#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- the loaded driver (process-wide) ---- */

#define CU_FUNCS(X)                                                                         \
  X(cuInit) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute)                      \
  X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxGetCurrent)               \
  X(cuCtxSetCurrent) X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease)        \
  X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemAddressReserve) X(cuMemAddressFree)    \
  X(cuMemGetInfo) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery)       \
  X(cuEventSynchronize) X(cuStreamSynchronize) X(cuMemExportToShareableHandle)              \
  X(cuMemImportFromShareableHandle) X(cuGetErrorName) X(cuMemHostRegister)                \
  X(cuMemHostUnregister) X(cuDeviceGetPCIBusId) X(cuStreamCreate) X(cuStreamDestroy)      \
  X(cuMemHostGetDevicePointer) X(cuStreamWaitValue32) X(cuMemcpyHtoD) X(cuMemcpyDtoH)     \
  X(cuCtxSynchronize) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) X(cuDeviceCanAccessPeer)

typedef struct {
#define CU_FIELD_(f) __typeof__(&f) f;
  CU_FUNCS(CU_FIELD_)
#undef CU_FIELD_
} cu_api_t;

typedef CUresult (*get_proc_v2_t)(const char *, void **, int, cuuint64_t,
                                  CUdriverProcAddressQueryResult *);
typedef CUresult (*get_proc_v1_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*driver_version_t)(int *);

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static cu_api_t cu;
static expseg_status load_status = EXPSEG_ERR_UNSUPPORTED;
static char load_msg[512];

/* cuGetProcAddress hands out the newest version of a name not newer than asked for; where a
 * version changed the arguments but cuda.h still declares the plain name with the old ones
 * (CUDA 13.0: cuCtxSynchronize(CUcontext)), ask for the last version with those. */
static int declared_version(const char *name, int ask) {
  return strcmp(name, "cuCtxSynchronize") == 0 && ask >= 13000 ? 12000 : ask;
}

static void load_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char *e = dlerror();
    snprintf(load_msg, sizeof load_msg,
             "cuda driver: cannot load libcuda.so.1 (%s): no NVIDIA driver on this machine; "
             "use the host or sim driver",
             e ? e : "not found");
    return;
  }
  get_proc_v2_t gp2 = (get_proc_v2_t)dlsym(lib, "cuGetProcAddress_v2");
  get_proc_v1_t gp1 = (get_proc_v1_t)dlsym(lib, "cuGetProcAddress");
  driver_version_t dv = (driver_version_t)dlsym(lib, "cuDriverGetVersion");
  int ver = 0;
  if ((!gp2 && !gp1) || !dv || dv(&ver) != CUDA_SUCCESS) {
    snprintf(load_msg, sizeof load_msg,
             "cuda driver: libcuda.so.1 has no cuGetProcAddress/cuDriverGetVersion (driver "
             "too old: CUDA 11.3 or newer is needed)");
    return;
  }
  int ask = ver < CUDA_VERSION ? ver : CUDA_VERSION;
#define CU_LOAD_(f)                                                                        \
  {                                                                                        \
    void *p = NULL;                                                                        \
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;                        \
    int v = declared_version(#f, ask);                                                     \
    CUresult r = gp2 ? gp2(#f, &p, v, CU_GET_PROC_ADDRESS_DEFAULT, &q)                     \
                     : gp1(#f, &p, v, CU_GET_PROC_ADDRESS_DEFAULT);                        \
    if (r != CUDA_SUCCESS || !p || q != CU_GET_PROC_ADDRESS_SUCCESS) {                     \
      snprintf(load_msg, sizeof load_msg,                                                  \
               "cuda driver: the driver (version %d) has no %s (error %d); a newer NVIDIA " \
               "driver is needed",                                                         \
               ver, #f, (int)r);                                                           \
      return;                                                                              \
    }                                                                                      \
    memcpy(&cu.f, &p, sizeof p);                                                           \
  }
  CU_FUNCS(CU_LOAD_)
#undef CU_LOAD_
  CUresult r = cu.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char *name = NULL;
    cu.cuGetErrorName(r, &name);
    snprintf(load_msg, sizeof load_msg, "cuda driver: cuInit failed: %s (no usable GPU?)",
             name ? name : "unknown error");
    return;
  }
  load_status = EXPSEG_OK;
}

static const char *err_name(CUresult r) {
  const char *n = NULL;
  if (cu.cuGetErrorName && cu.cuGetErrorName(r, &n) == CUDA_SUCCESS && n) return n;
  return "unknown CUDA error";
}

/* A failed CUDA call: OOM for CUDA_ERROR_OUT_OF_MEMORY, DRIVER otherwise. */
static expseg_status cu_fail(CUresult r, const char *call, const char *detail) {
  expseg_status s = r == CUDA_ERROR_OUT_OF_MEMORY ? EXPSEG_ERR_OUT_OF_MEMORY : EXPSEG_ERR_DRIVER;
  return _expseg_error_set(s, "cuda driver: %s%s%s failed: %s (%d)", call, detail ? " " : "",
                           detail ? detail : "", err_name(r), (int)r);
}

/* A call that frees, waits or gives back: done also when the driver has shut down
 * (CUDA_ERROR_DEINITIALIZED: at process exit, before late destructors run, the driver tears
 * itself down; the process's device memory, streams and events went with it). */
static expseg_status cu_done(CUresult r, const char *call, const char *detail) {
  return r == CUDA_SUCCESS || r == CUDA_ERROR_DEINITIALIZED ? EXPSEG_OK : cu_fail(r, call, detail);
}

/* ---- one device ---- */

typedef struct {
  CUdevice dev;
  CUcontext ctx;
  int ordinal;
  size_t granularity;
  CUmemAllocationHandleType htype; /* POSIX fd where supported, else NONE */
  bool host_numa_vmm;              /* cuMemCreate accepts HOST_NUMA locations */
  int host_numa;                   /* node nearest the device; -1 unknown */
  _expseg_holds_t holds;           /* hold_stream and destroyed streams (stream_holds.h) */
  CUdeviceptr hold_dptr;           /* the device's address of holds.page */
} cuda_t;

typedef struct {
  CUcontext prev;
  bool swapped;
} ctx_guard_t;

static expseg_status enter(cuda_t *c, ctx_guard_t *g) {
  g->swapped = false;
  CUresult r = cu.cuCtxGetCurrent(&g->prev);
  /* shut down: nothing to make current; the call itself then fails, or is done (cu_done) */
  if (r == CUDA_ERROR_DEINITIALIZED) return EXPSEG_OK;
  if (r != CUDA_SUCCESS) return cu_fail(r, "cuCtxGetCurrent", NULL);
  if (g->prev != c->ctx) {
    r = cu.cuCtxSetCurrent(c->ctx);
    if (r != CUDA_SUCCESS) return cu_fail(r, "cuCtxSetCurrent", NULL);
    g->swapped = true;
  }
  return EXPSEG_OK;
}

static void leave(ctx_guard_t *g) {
  if (g->swapped) cu.cuCtxSetCurrent(g->prev);
}

#define ENTER(c)                                \
  ctx_guard_t guard_;                           \
  {                                             \
    expseg_status es_ = enter((c), &guard_);    \
    if (es_) return es_;                        \
  }
#define LEAVE_RETURN(x) \
  do {                  \
    leave(&guard_);     \
    return (x);         \
  } while (0)

static expseg_status cuda_reserve(void *st, size_t size, size_t align, uintptr_t *addr) {
  cuda_t *c = st;
  /* The driver's default alignment (align 0) is unspecified; mappings need addresses that
   * are multiples of the granularity, so ask for at least that. */
  if (align < c->granularity) align = c->granularity;
  ENTER(c);
  CUdeviceptr p = 0;
  CUresult r = cu.cuMemAddressReserve(&p, size, align, 0, 0);
  if (r != CUDA_SUCCESS) LEAVE_RETURN(cu_fail(r, "cuMemAddressReserve", NULL));
  *addr = (uintptr_t)p;
  LEAVE_RETURN(EXPSEG_OK);
}

static expseg_status cuda_unreserve(void *st, uintptr_t addr, size_t size) {
  cuda_t *c = st;
  ENTER(c);
  CUresult r = cu.cuMemAddressFree((CUdeviceptr)addr, size);
  LEAVE_RETURN(cu_done(r, "cuMemAddressFree", NULL));
}

static CUmemAllocationProp alloc_prop(const cuda_t *c) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = c->ordinal; /* an ordinal, not a CUdevice (CU_MEM_LOCATION_TYPE_DEVICE) */
  p.requestedHandleTypes = c->htype;
  return p;
}

static expseg_status cuda_create(void *st, size_t size, expseg_vmm_handle *h) {
  cuda_t *c = st;
  ENTER(c);
  CUmemAllocationProp p = alloc_prop(c);
  CUmemGenericAllocationHandle gh = 0;
  CUresult r = cu.cuMemCreate(&gh, size, &p, 0);
  if (r != CUDA_SUCCESS) {
    char b[32], d[64];
    snprintf(d, sizeof d, "(%s on device %d)", _expseg_format_size(b, size), c->ordinal);
    LEAVE_RETURN(cu_fail(r, "cuMemCreate", d));
  }
  *h = (expseg_vmm_handle)gh;
  LEAVE_RETURN(EXPSEG_OK);
}

static expseg_status cuda_release(void *st, expseg_vmm_handle h) {
  cuda_t *c = st;
  ENTER(c);
  CUresult r = cu.cuMemRelease((CUmemGenericAllocationHandle)h);
  LEAVE_RETURN(cu_done(r, "cuMemRelease", NULL));
}

static expseg_status cuda_map(void *st, uintptr_t addr, size_t size, expseg_vmm_handle h,
                              size_t offset) {
  cuda_t *c = st;
  if (offset != 0)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                             "cuda driver: map(offset=%zu): cuMemMap accepts only offset 0", offset);
  ENTER(c);
  CUresult r = cu.cuMemMap((CUdeviceptr)addr, size, 0, (CUmemGenericAllocationHandle)h, 0);
  LEAVE_RETURN(r == CUDA_SUCCESS ? EXPSEG_OK : cu_fail(r, "cuMemMap", NULL));
}

static expseg_status cuda_unmap(void *st, uintptr_t addr, size_t size) {
  cuda_t *c = st;
  ENTER(c);
  CUresult r = cu.cuMemUnmap((CUdeviceptr)addr, size);
  LEAVE_RETURN(cu_done(r, "cuMemUnmap", NULL));
}

static expseg_status cuda_set_access(void *st, uintptr_t addr, size_t size, int device) {
  cuda_t *c = st;
  bool grant = device >= 0;
  int ordinal = grant ? device : EXPSEG_VMM_REVOKED_DEVICE(device);
  ENTER(c);
  CUmemAccessDesc d;
  memset(&d, 0, sizeof d);
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = ordinal; /* CUmemLocation.id of a device is its ordinal */
  CUresult r;
  d.flags = grant ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  r = cu.cuMemSetAccess((CUdeviceptr)addr, size, &d, 1);
  if (r == CUDA_ERROR_DEINITIALIZED && !grant) LEAVE_RETURN(EXPSEG_OK); /* a revoke: done */
  if (r != CUDA_SUCCESS) {
    char what[64];
    snprintf(what, sizeof what, "(%s device %d, memory of device %d)",
             grant ? "grant" : "revoke", ordinal, c->ordinal);
    LEAVE_RETURN(cu_fail(r, "cuMemSetAccess", what));
  }
  LEAVE_RETURN(EXPSEG_OK);
}

static expseg_status cuda_check_peer(void *st, int peer) {
  cuda_t *c = st;
  CUdevice target = c->dev;
  int n = 0, can = 0;
  if (cu.cuDeviceGetCount(&n) == CUDA_SUCCESS && peer >= n)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "cuda driver: peer device %d: this "
                             "machine has %d device(s), 0 to %d", peer, n, n - 1);
  CUresult r = cu.cuDeviceGet(&target, peer);
  if (r == CUDA_SUCCESS) r = cu.cuDeviceCanAccessPeer(&can, target, c->dev);
  if (r != CUDA_SUCCESS || !can)
    return _expseg_error_set(r ? EXPSEG_ERR_DRIVER : EXPSEG_ERR_UNSUPPORTED,
                             "cuda driver: device %d cannot access device %d's memory (%s)",
                             peer, c->ordinal, r ? err_name(r) : "cuDeviceCanAccessPeer: 0");
  return EXPSEG_OK;
}

static expseg_status cuda_event_create(void *st, expseg_vmm_event *ev) {
  cuda_t *c = st;
  ENTER(c);
  CUevent e = NULL;
  CUresult r = cu.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS) LEAVE_RETURN(cu_fail(r, "cuEventCreate", NULL));
  *ev = (expseg_vmm_event)(uintptr_t)e;
  LEAVE_RETURN(EXPSEG_OK);
}

static expseg_status cuda_event_destroy(void *st, expseg_vmm_event ev) {
  cuda_t *c = st;
  ENTER(c);
  CUresult r = cu.cuEventDestroy((CUevent)(uintptr_t)ev);
  LEAVE_RETURN(cu_done(r, "cuEventDestroy", NULL));
}

/* ---- destroyed streams ----
 * Memory freed on a stream stays tagged with it, so the allocator may name a stream after
 * expseg_stream_destroy. A destroyed CUstream must not be used: the destroy waits for the
 * stream's work and remembers the handle; a wait for it is then done at once, an event
 * recorded on it goes to the default stream. A new stream with that handle is live again. */

static expseg_status cuda_event_record(void *st, expseg_vmm_event ev, expseg_stream s) {
  cuda_t *c = st;
  if (s != 0 && _expseg_holds_retired(&c->holds, s, false)) s = 0;
  ENTER(c);
  CUresult r = cu.cuEventRecord((CUevent)(uintptr_t)ev, (CUstream)(uintptr_t)s);
  LEAVE_RETURN(r == CUDA_SUCCESS ? EXPSEG_OK : cu_fail(r, "cuEventRecord", NULL));
}

static expseg_status cuda_event_query(void *st, expseg_vmm_event ev, bool *done) {
  cuda_t *c = st;
  ENTER(c);
  CUresult r = cu.cuEventQuery((CUevent)(uintptr_t)ev);
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY || r == CUDA_ERROR_DEINITIALIZED) {
    *done = r != CUDA_ERROR_NOT_READY; /* shut down: no work is left */
    LEAVE_RETURN(EXPSEG_OK);
  }
  LEAVE_RETURN(cu_fail(r, "cuEventQuery", NULL));
}

/* ---- hold_stream: a test hook on documented driver calls ----
 * A held stream waits (cuStreamWaitValue32 GEQ) for its own word of a registered host page
 * to reach the hold's generation; releasing writes it (generations only grow: a word is
 * never reset). While held, stream_synchronize of it and event_synchronize of an incomplete
 * event fail instead of blocking forever the thread that would release it. */

static expseg_status hold_page(cuda_t *c) { /* holds.mu held, context entered */
  if (c->holds.page) return EXPSEG_OK;
  void *p = mmap(NULL, EXPSEG_HOLD_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY, "cuda driver: hold_stream: mmap: %s",
                             strerror(errno));
  CUresult r = cu.cuMemHostRegister(p, EXPSEG_HOLD_PAGE,
                                    CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  if (r != CUDA_SUCCESS) {
    munmap(p, EXPSEG_HOLD_PAGE);
    return cu_fail(r, "cuMemHostRegister", "(hold_stream)");
  }
  if ((r = cu.cuMemHostGetDevicePointer(&c->hold_dptr, p, 0)) != CUDA_SUCCESS) {
    cu.cuMemHostUnregister(p);
    munmap(p, EXPSEG_HOLD_PAGE);
    return cu_fail(r, "cuMemHostGetDevicePointer", "(hold_stream)");
  }
  c->holds.page = p;
  return EXPSEG_OK;
}

static void cuda_hold_stream(void *st, expseg_stream s, bool hold) {
  cuda_t *c = st;
  pthread_mutex_lock(&c->holds.mu);
  int i = _expseg_holds_slot(&c->holds, s);
  expseg_status es = EXPSEG_OK;
  if (!hold) {
    if (i >= 0) _expseg_holds_release(&c->holds, i);
  } else if (i < 0 || !c->holds.slot[i].held) {
    ctx_guard_t gd;
    if ((es = enter(c, &gd)) == EXPSEG_OK) {
      es = hold_page(c);
      if (es == EXPSEG_OK && i < 0) {
        if (c->holds.n == EXPSEG_HOLD_SLOTS)
          es = _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                                 "cuda driver: hold_stream: at most %d streams", EXPSEG_HOLD_SLOTS);
        else
          c->holds.slot[i = c->holds.n++].stream = s;
      }
      if (es == EXPSEG_OK) {
        uint32_t gen = c->holds.slot[i].gen + 1;
        CUresult r = cu.cuStreamWaitValue32((CUstream)(uintptr_t)s, c->hold_dptr + 4u * (unsigned)i,
                                            gen, CU_STREAM_WAIT_VALUE_GEQ);
        if (r != CUDA_SUCCESS) {
          es = cu_fail(r, "cuStreamWaitValue32", "(hold_stream)");
        } else {
          c->holds.slot[i].gen = gen;
          c->holds.slot[i].held = true;
          __atomic_add_fetch(&c->holds.held_now, 1, __ATOMIC_RELEASE);
        }
      }
      leave(&gd);
    }
  }
  pthread_mutex_unlock(&c->holds.mu);
  if (es != EXPSEG_OK) _expseg_warn("%s; stream not held", _expseg_error_message());
}

/* Releases every hold, waits for the streams that were held, unregisters the page. */
static void hold_teardown(cuda_t *c) {
  if (!c->holds.page) return;
  ctx_guard_t gd;
  bool entered = enter(c, &gd) == EXPSEG_OK;
  for (int i = 0; i < c->holds.n; i++) {
    bool was = c->holds.slot[i].gen > 0 && c->holds.slot[i].stream != (expseg_stream)-1;
    _expseg_holds_release(&c->holds, i);
    if (was && entered) cu.cuStreamSynchronize((CUstream)(uintptr_t)c->holds.slot[i].stream);
  }
  if (entered) {
    cu.cuMemHostUnregister(c->holds.page);
    leave(&gd);
  }
  munmap(c->holds.page, EXPSEG_HOLD_PAGE);
  c->holds.page = NULL;
}

static expseg_status cuda_event_synchronize(void *st, expseg_vmm_event ev) {
  cuda_t *c = st;
  ENTER(c);
  CUresult r;
  if (__atomic_load_n(&c->holds.held_now, __ATOMIC_ACQUIRE) > 0 &&
      (r = cu.cuEventQuery((CUevent)(uintptr_t)ev)) == CUDA_ERROR_NOT_READY)
    LEAVE_RETURN(_expseg_error_set(EXPSEG_ERR_DRIVER,
                                   "cuda driver: event_synchronize(event=0x%llx) would block "
                                   "forever: a stream is held (release it with hold_stream)",
                                   (unsigned long long)ev));
  r = cu.cuEventSynchronize((CUevent)(uintptr_t)ev);
  LEAVE_RETURN(cu_done(r, "cuEventSynchronize", NULL));
}

static expseg_status cuda_stream_create(void *st, expseg_stream *s) {
  cuda_t *c = st;
  ENTER(c);
  CUstream h = NULL;
  CUresult r = cu.cuStreamCreate(&h, CU_STREAM_NON_BLOCKING);
  if (r != CUDA_SUCCESS) LEAVE_RETURN(cu_fail(r, "cuStreamCreate", NULL));
  *s = (expseg_stream)(uintptr_t)h;
  _expseg_holds_retired(&c->holds, *s, true); /* the handle of a destroyed stream, reused: live again */
  LEAVE_RETURN(EXPSEG_OK);
}

static expseg_status cuda_stream_destroy(void *st, expseg_stream s) {
  cuda_t *c = st;
  pthread_mutex_lock(&c->holds.mu);
  int i = _expseg_holds_slot(&c->holds, s);
  if (i >= 0) { /* its held work must be able to finish; the slot is not synchronized later */
    _expseg_holds_release(&c->holds, i);
    c->holds.slot[i].stream = (expseg_stream)-1;
  }
  pthread_mutex_unlock(&c->holds.mu);
  ENTER(c);
  CUresult r = cu.cuStreamSynchronize((CUstream)(uintptr_t)s);
  if (r != CUDA_SUCCESS) LEAVE_RETURN(cu_done(r, "cuStreamSynchronize", "(before cuStreamDestroy)"));
  expseg_status es = _expseg_holds_retire(&c->holds, s);
  if (es != EXPSEG_OK) LEAVE_RETURN(es);
  r = cu.cuStreamDestroy((CUstream)(uintptr_t)s);
  if (r != CUDA_SUCCESS) _expseg_holds_retired(&c->holds, s, true);
  LEAVE_RETURN(cu_done(r, "cuStreamDestroy", NULL));
}

static expseg_status cuda_stream_synchronize(void *st, expseg_stream s) {
  cuda_t *c = st;
  if (_expseg_holds_held(&c->holds, s))
    return _expseg_error_set(EXPSEG_ERR_DRIVER,
                             "cuda driver: stream_synchronize would block forever: stream "
                             "0x%llx is held (release it with hold_stream)",
                             (unsigned long long)s);
  if (s != 0 && _expseg_holds_retired(&c->holds, s, false)) return EXPSEG_OK; /* waited for at its destroy */
  ENTER(c);
  CUresult r = cu.cuStreamSynchronize((CUstream)(uintptr_t)s);
  LEAVE_RETURN(cu_done(r, "cuStreamSynchronize", NULL));
}

static expseg_status cuda_device_synchronize(void *st) {
  cuda_t *c = st;
  if (__atomic_load_n(&c->holds.held_now, __ATOMIC_ACQUIRE) > 0) /* a held stream never finishes */
    return _expseg_error_set(EXPSEG_ERR_DRIVER, "cuda driver: device_synchronize would block "
                                                "forever: a stream is held (hold_stream)");
  ENTER(c); /* the device's primary context is current: cuCtxSynchronize waits for it */
  CUresult r = cu.cuCtxSynchronize();
  LEAVE_RETURN(cu_done(r, "cuCtxSynchronize", NULL));
}

static expseg_status cuda_export_fd(void *st, expseg_vmm_handle h, int *fd, size_t *offset) {
  cuda_t *c = st;
  if (c->htype != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                             "cuda driver: export_fd: device %d cannot export POSIX fd handles "
                             "(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED "
                             "is 0)",
                             c->ordinal);
  ENTER(c);
  int out = -1;
  CUresult r = cu.cuMemExportToShareableHandle(&out, (CUmemGenericAllocationHandle)h,
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS) LEAVE_RETURN(cu_fail(r, "cuMemExportToShareableHandle", NULL));
  *fd = out;
  *offset = 0; /* a CUDA handle is the whole allocation */
  LEAVE_RETURN(EXPSEG_OK);
}

static expseg_status cuda_import_fd(void *st, int fd, size_t offset, size_t size,
                                    expseg_vmm_handle *h) {
  cuda_t *c = st;
  (void)size; /* the handle knows its size */
  if (offset != 0)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "cuda driver: import_fd(fd=%d, offset=%zu): a CUDA handle is a "
                             "whole allocation; the offset must be 0",
                             fd, offset);
  if (c->htype != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                             "cuda driver: import_fd: device %d cannot import POSIX fd handles",
                             c->ordinal);
  ENTER(c);
  CUmemGenericAllocationHandle gh = 0;
  /* The driver does not take the fd: the caller keeps (and closes) its own. */
  CUresult r = cu.cuMemImportFromShareableHandle(&gh, (void *)(uintptr_t)fd,
                                                 CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) LEAVE_RETURN(cu_fail(r, "cuMemImportFromShareableHandle", NULL));
  *h = (expseg_vmm_handle)gh;
  LEAVE_RETURN(EXPSEG_OK);
}

/* ---- pinned host memory ---- */

static expseg_status host_register(cuda_t *c, expseg_host_chunk_t *hc) {
  void *p = mmap(NULL, hc->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY, "cuda driver: host_alloc: mmap: %s",
                             strerror(errno));
  if (hc->numa_node >= 0) hc->placed = _expseg_topo_bind(p, hc->size, hc->numa_node) == 0;
  hc->threads_used =
      _expseg_pinned_prefault(p, hc->size, hc->fault_threads, hc->numa_node, !hc->no_huge);
  ctx_guard_t g;
  expseg_status s = enter(c, &g);
  if (s == EXPSEG_OK) {
    CUresult r = cu.cuMemHostRegister(p, hc->size,
                                      CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    if (r != CUDA_SUCCESS) s = cu_fail(r, "cuMemHostRegister", NULL);
    leave(&g);
  }
  if (s != EXPSEG_OK) {
    munmap(p, hc->size);
    return s;
  }
  hc->ptr = p;
  hc->locked = true;
  hc->method = EXPSEG_HOST_REGISTERED;
  return EXPSEG_OK;
}

#if CUDA_VERSION >= 12040
/* cuMemCreate on a host NUMA node, mapped for the device and the host. UNSUPPORTED when
 * the size is not a multiple of that allocation's granularity (the caller registers). */
static expseg_status host_create(cuda_t *c, expseg_host_chunk_t *hc) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  p.location.id = hc->numa_node;
  ENTER(c);
  size_t g = 0;
  CUresult r = cu.cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  if (r != CUDA_SUCCESS || g == 0 || hc->size % g) LEAVE_RETURN(EXPSEG_ERR_UNSUPPORTED);
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  const char *what = "cuMemCreate(HOST_NUMA)";
  if ((r = cu.cuMemCreate(&h, hc->size, &p, 0)) == CUDA_SUCCESS) {
    what = "cuMemAddressReserve";
    if ((r = cu.cuMemAddressReserve(&va, hc->size, g, 0, 0)) == CUDA_SUCCESS) {
      what = "cuMemMap";
      if ((r = cu.cuMemMap(va, hc->size, 0, h, 0)) == CUDA_SUCCESS) {
        CUmemAccessDesc d[2];
        memset(d, 0, sizeof d);
        d[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        d[0].location.id = c->ordinal;
        d[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        d[1].location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA; /* id ignored: the host */
        d[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        what = "cuMemSetAccess";
        if ((r = cu.cuMemSetAccess(va, hc->size, d, 2)) != CUDA_SUCCESS)
          cu.cuMemUnmap(va, hc->size);
      }
      if (r != CUDA_SUCCESS) cu.cuMemAddressFree(va, hc->size);
    }
    if (r != CUDA_SUCCESS) cu.cuMemRelease(h);
  }
  if (r != CUDA_SUCCESS) LEAVE_RETURN(cu_fail(r, what, "(pinned host memory)"));
  hc->ptr = (void *)(uintptr_t)va;
  hc->handle = (uint64_t)h;
  hc->locked = hc->placed = true;
  hc->method = EXPSEG_HOST_CREATED;
  LEAVE_RETURN(EXPSEG_OK);
}
#endif

static expseg_status cuda_host_alloc(void *st, expseg_host_chunk_t *hc) {
  cuda_t *c = st;
#if CUDA_VERSION >= 12040
  if (!hc->use_register && c->host_numa_vmm && hc->numa_node >= 0) {
    expseg_status s = host_create(c, hc);
    if (s != EXPSEG_ERR_UNSUPPORTED) return s;
  }
#endif
  return host_register(c, hc);
}

static expseg_status cuda_host_free(void *st, const expseg_host_chunk_t *hc) {
  cuda_t *c = st;
  ENTER(c);
  CUresult r;
  if (hc->method == EXPSEG_HOST_CREATED) {
    CUdeviceptr va = (CUdeviceptr)(uintptr_t)hc->ptr;
    if ((r = cu.cuMemUnmap(va, hc->size)) != CUDA_SUCCESS)
      LEAVE_RETURN(cu_done(r, "cuMemUnmap", "(pinned host memory)"));
    cu.cuMemAddressFree(va, hc->size);
    r = cu.cuMemRelease((CUmemGenericAllocationHandle)hc->handle);
    LEAVE_RETURN(cu_done(r, "cuMemRelease", "(pinned host memory)"));
  }
  if ((r = cu.cuMemHostUnregister(hc->ptr)) != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED)
    LEAVE_RETURN(cu_fail(r, "cuMemHostUnregister", NULL));
  munmap(hc->ptr, hc->size);
  LEAVE_RETURN(EXPSEG_OK);
}

static int cuda_host_numa(void *st) { return ((cuda_t *)st)->host_numa; }

/* The data-check hook: synchronous copies (cuMemcpyHtoD / cuMemcpyDtoH on pageable host
 * memory return once the bytes are in place). */
static expseg_status cuda_copy(void *st, uintptr_t dev, void *host, size_t size, bool to_device) {
  cuda_t *c = st;
  ENTER(c);
  CUresult r = to_device ? cu.cuMemcpyHtoD((CUdeviceptr)dev, host, size)
                         : cu.cuMemcpyDtoH(host, (CUdeviceptr)dev, size);
  const char *what = to_device ? "cuMemcpyHtoD" : "cuMemcpyDtoH";
  /* from pageable memory HtoD returns before its DMA lands: wait, or an unmap right after
   * faults the context (CUDA_ERROR_LAUNCH_FAILED, seen on an H200) */
  if (r == CUDA_SUCCESS && to_device && (r = cu.cuStreamSynchronize(NULL)) != CUDA_SUCCESS)
    what = "cuStreamSynchronize (after cuMemcpyHtoD)";
  LEAVE_RETURN(r == CUDA_SUCCESS ? EXPSEG_OK : cu_fail(r, what, NULL));
}

/* Sleep and wake's copies: queued on the allocator's copy stream, host memory pinned. */
static expseg_status cuda_copy_async(void *st, uintptr_t dev, void *host, size_t size,
                                     bool to_device, expseg_stream s) {
  ENTER((cuda_t *)st);
  CUresult r = to_device ? cu.cuMemcpyHtoDAsync((CUdeviceptr)dev, host, size, (CUstream)s)
                         : cu.cuMemcpyDtoHAsync(host, (CUdeviceptr)dev, size, (CUstream)s);
  LEAVE_RETURN(r == CUDA_SUCCESS ? EXPSEG_OK
                                 : cu_fail(r, to_device ? "cuMemcpyHtoDAsync" : "cuMemcpyDtoHAsync", NULL));
}

static size_t cuda_granularity(void *st) { return ((cuda_t *)st)->granularity; }

static void cuda_mem_info(void *st, size_t *free_bytes, size_t *total_bytes) {
  cuda_t *c = st;
  ctx_guard_t g;
  size_t fr = 0, tot = 0;
  if (enter(c, &g) == EXPSEG_OK) {
    if (cu.cuMemGetInfo(&fr, &tot) != CUDA_SUCCESS) fr = tot = 0;
    leave(&g);
  }
  *free_bytes = fr;
  *total_bytes = tot;
}

static uint64_t cuda_now_ns(void *st) {
  (void)st;
  return _expseg_clock_ns();
}

static void cuda_destroy(void *st) {
  cuda_t *c = st;
  if (!c) return;
  if (c->ctx) {
    hold_teardown(c);
    cu.cuDevicePrimaryCtxRelease(c->dev);
  }
  _expseg_holds_fini(&c->holds);
  free(c);
}

static const expseg_vmm_ops_t cuda_ops = {
    .name = "cuda", .reserve = cuda_reserve, .unreserve = cuda_unreserve,
    .create = cuda_create, .release = cuda_release, .map = cuda_map, .unmap = cuda_unmap,
    .set_access = cuda_set_access, .check_peer = cuda_check_peer,
    .event_create = cuda_event_create, .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record, .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize, .stream_synchronize = cuda_stream_synchronize,
    .device_synchronize = cuda_device_synchronize,
    .export_fd = cuda_export_fd, .import_fd = cuda_import_fd,
    .granularity = cuda_granularity, .mem_info = cuda_mem_info, .now_ns = cuda_now_ns,
    .hold_stream = cuda_hold_stream,
    .stream_create = cuda_stream_create, .stream_destroy = cuda_stream_destroy,
    .host_alloc = cuda_host_alloc, .host_free = cuda_host_free, .host_numa = cuda_host_numa,
    .destroy = cuda_destroy, .copy = cuda_copy, .copy_async = cuda_copy_async,
};

expseg_status _expseg_cuda_new(int device, expseg_vmm_t **out) {
  if (!out) return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "cuda driver: out is NULL");
  *out = NULL;
  pthread_once(&load_once, load_driver);
  if (load_status != EXPSEG_OK) return _expseg_error_set(load_status, "%s", load_msg);
  int count = 0;
  CUresult r = cu.cuDeviceGetCount(&count);
  if (r != CUDA_SUCCESS) return cu_fail(r, "cuDeviceGetCount", NULL);
  if (device < 0 || device >= count)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                             "cuda driver: device %d does not exist (%d CUDA device(s) visible)",
                             device, count);
  cuda_t *c = calloc(1, sizeof *c);
  if (!c) return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "cuda driver: out of host memory");
  c->ordinal = device;
  _expseg_holds_init(&c->holds);
  expseg_status s = EXPSEG_OK;
  int vmm = 0, fd_ok = 0;
  if ((r = cu.cuDeviceGet(&c->dev, device)) != CUDA_SUCCESS) {
    s = cu_fail(r, "cuDeviceGet", NULL);
  } else if ((r = cu.cuDeviceGetAttribute(
                  &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, c->dev)) !=
             CUDA_SUCCESS) {
    s = cu_fail(r, "cuDeviceGetAttribute", "(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)");
  } else if (!vmm) {
    s = _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                          "cuda driver: device %d does not support virtual memory management "
                          "(cuMemCreate/cuMemMap); expseg needs it",
                          device);
  } else if ((r = cu.cuDevicePrimaryCtxRetain(&c->ctx, c->dev)) != CUDA_SUCCESS) {
    c->ctx = NULL;
    s = cu_fail(r, "cuDevicePrimaryCtxRetain", NULL);
  }
  if (s == EXPSEG_OK) {
    if (cu.cuDeviceGetAttribute(&fd_ok,
                                CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                                c->dev) != CUDA_SUCCESS)
      fd_ok = 0;
    c->htype = fd_ok ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    CUmemAllocationProp p = alloc_prop(c);
    size_t g = 0;
    r = cu.cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS) s = cu_fail(r, "cuMemGetAllocationGranularity", NULL);
    else if (g == 0 || (g & (g - 1)))
      s = _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                            "cuda driver: granularity %zu of device %d is not a power of two", g,
                            device);
    c->granularity = g;
    char bus[32] = "";
    c->host_numa = -1;
    if (cu.cuDeviceGetPCIBusId(bus, (int)sizeof bus, c->dev) == CUDA_SUCCESS)
      c->host_numa = _expseg_topo_numa_of_pci(bus);
#if CUDA_VERSION >= 12040
    int hn = 0;
    c->host_numa_vmm =
        cu.cuDeviceGetAttribute(
            &hn, CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, c->dev) ==
            CUDA_SUCCESS &&
        hn;
#endif
  }
  if (s != EXPSEG_OK) {
    cuda_destroy(c);
    return s;
  }
  return _expseg_vmm_wrap(&cuda_ops, c, device, out);
}

bool _expseg_cuda_usable(int device) {
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", _expseg_error_message());
  expseg_vmm_t *v = NULL;
  bool ok = _expseg_cuda_new(device, &v) == EXPSEG_OK;
  _expseg_vmm_close(v);
  _expseg_error_set(EXPSEG_OK, "%s", saved); /* a probe leaves the caller's message alone */
  return ok;
}
