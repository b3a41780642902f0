/* SPDX-License-Identifier: Apache-2.0 */
/* core.c: the CUDA driver double's process state (tests only; includes cuda.h, as test
 * doubles may): configuration ($EXPSEG_CUDA_DOUBLE or cudadouble_configure), cuInit,
 * devices and their attributes, primary contexts with retain counts and a current context
 * per thread, cuGetProcAddress over every entry point the double has (at most the configured
 * driver version), device handles apart from ordinals (device_base), error names, the call
 * log and the cudadouble_* control calls (cudadouble_shutdown: CUDA_ERROR_DEINITIALIZED). The rules each call enforces are listed in
 * docs/driver.md ("The CUDA driver double"). */
#include "double.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

dbl_state g = {.mu = PTHREAD_MUTEX_INITIALIZER, .next_handle = 0x1000};
__thread dbl_ctx *dbl_current;
static __thread char last_msg[512];

/* ---- small helpers ---- */

void dbl_vec_push(dbl_vec *v, void *p) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? v->cap * 2 : 16;
    void **nv = realloc(v->v, cap * sizeof *nv);
    if (!nv) abort(); /* a test library: out of host memory ends the test */
    v->v = nv;
    v->cap = cap;
  }
  v->v[v->n++] = p;
}

void dbl_vec_remove(dbl_vec *v, size_t i) {
  memmove(&v->v[i], &v->v[i + 1], (v->n - i - 1) * sizeof *v->v);
  v->n--;
}

const char *dbl_size(char *buf, size_t n) {
  snprintf(buf, 32, "%.2f MiB", (double)n / (1024.0 * 1024.0));
  return buf;
}

CUresult dbl_refuse(CUresult r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int k = snprintf(last_msg, sizeof last_msg, "cuda double: ");
  vsnprintf(last_msg + k, sizeof last_msg - (size_t)k, fmt, ap);
  va_end(ap);
  if (g.cfg.verbose) fprintf(stderr, "%s\n", last_msg);
  return r;
}

/* ---- configuration ---- */

static const dbl_config defaults = {
    .devices = 2,
    .capacity = 8ull << 30,
    .granularity = 2u << 20,
    .recommended = 4u << 20,
    .fd = true,
    .peer = true,
    .verbose = false,
    .sync_timeout_ms = 10000,
    .log_max = 1u << 18,
    .device_base = 0,
    .driver = CUDA_VERSION,
};

static bool parse_size(const char *s, size_t len, size_t *out) {
  size_t v = 0, i = 0;
  if (len == 0) return false;
  for (; i < len && s[i] >= '0' && s[i] <= '9'; i++) {
    if (v > (SIZE_MAX - 9) / 10) return false;
    v = v * 10 + (size_t)(s[i] - '0');
  }
  if (i == 0) return false;
  if (i < len) {
    if (i + 1 != len) return false;
    int shift = 0;
    switch (s[i]) {
    case 'K': case 'k': shift = 10; break;
    case 'M': case 'm': shift = 20; break;
    case 'G': case 'g': shift = 30; break;
    case 'T': case 't': shift = 40; break;
    default: return false;
    }
    if (v > (SIZE_MAX >> shift)) return false;
    v <<= shift;
  }
  *out = v;
  return true;
}

/* Parses spec into *c; false with the message set. */
static bool parse_config(const char *spec, dbl_config *c) {
  *c = defaults;
  const char *p = spec ? spec : "";
  while (*p) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *eq = memchr(p, '=', len);
    if (!eq) {
      dbl_refuse(CUDA_ERROR_INVALID_VALUE, "configuration '%s': '%.*s' is not key=value", spec,
                 (int)len, p);
      return false;
    }
    size_t klen = (size_t)(eq - p), v = 0;
    const char *val = eq + 1;
    size_t vlen = len - klen - 1;
    if (!parse_size(val, vlen, &v)) {
      dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                 "configuration '%s': bad value '%.*s' for '%.*s' (a number, K/M/G/T allowed)",
                 spec, (int)vlen, val, (int)klen, p);
      return false;
    }
#define KEY(k) (klen == sizeof(k) - 1 && memcmp(p, k, klen) == 0)
    if (KEY("devices") && v >= 1 && v <= DBL_MAX_DEVICES) c->devices = (int)v;
    else if (KEY("capacity") && v > 0) c->capacity = v;
    else if (KEY("granularity") && v >= 4096 && !(v & (v - 1))) c->granularity = v;
    else if (KEY("recommended") && v >= 4096 && !(v & (v - 1))) c->recommended = v;
    else if (KEY("fd") && v <= 1) c->fd = v;
    else if (KEY("peer") && v <= 1) c->peer = v;
    else if (KEY("verbose") && v <= 1) c->verbose = v;
    else if (KEY("sync_timeout") && v <= 3600000) c->sync_timeout_ms = (unsigned)v;
    else if (KEY("log") && v >= 1 && v <= (1u << 26)) c->log_max = v;
    else if (KEY("device_base") && v <= 4096) c->device_base = (int)v;
    else if (KEY("driver") && v >= 11030 && v <= CUDA_VERSION) c->driver = (int)v;
    else {
      dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                 "configuration '%s': '%.*s' is not accepted; keys: devices (1..%d), capacity "
                 "(SIZE), granularity and recommended (powers of two, at least 4K), fd, peer, "
                 "verbose (0|1), sync_timeout (ms), log (entries), device_base (0..4096), "
                 "driver (11030..%d)",
                 spec, (int)len, p, DBL_MAX_DEVICES, CUDA_VERSION);
      return false;
    }
#undef KEY
    p += len;
    if (*p == ',') p++;
  }
  if (c->recommended < c->granularity || c->recommended % c->granularity ||
      c->capacity % c->recommended) {
    dbl_refuse(CUDA_ERROR_INVALID_VALUE,
               "configuration '%s': recommended (%zu) must be a multiple of granularity (%zu) "
               "and capacity (%zu) a multiple of recommended",
               spec, c->recommended, c->granularity, c->capacity);
    return false;
  }
  return true;
}

static bool nothing_live(void) {
  for (int d = 0; d < DBL_MAX_DEVICES; d++)
    if (g.dev[d].primary.retains) return false;
  return dbl_memory_idle() && g.streams.n == 0 && g.events.n == 0;
}

static bool apply_config(const char *spec) {
  dbl_config c;
  if (!parse_config(spec, &c)) return false;
  if (c.log_max != g.cfg.log_max || !g.log) {
    free(g.log);
    g.log = calloc(c.log_max, sizeof *g.log);
    if (!g.log) abort();
    g.log_n = g.log_head = 0;
  }
  g.cfg = c;
  for (int d = 0; d < DBL_MAX_DEVICES; d++) {
    g.dev[d].primary.magic = DBL_CTX_MAGIC;
    g.dev[d].primary.dev = d;
  }
  g.configured = true;
  return true;
}

static bool ensure_configured(void) {
  static bool told;
  if (g.configured || apply_config(getenv("EXPSEG_CUDA_DOUBLE"))) return true;
  if (!told) fprintf(stderr, "$EXPSEG_CUDA_DOUBLE: %s\n", last_msg);
  told = true;
  return false;
}

/* ---- entry and exit of every call ---- */

CUresult dbl_begin(dbl_call *c, const char *name, bool needs_init) {
  pthread_mutex_lock(&g.mu);
  if (!ensure_configured()) return CUDA_ERROR_NOT_INITIALIZED;
  if (g.shut_down)
    return dbl_refuse(CUDA_ERROR_DEINITIALIZED, "%s: the driver is shutting down (process exit)",
                      name);
  if (needs_init && !g.initialized)
    return dbl_refuse(CUDA_ERROR_NOT_INITIALIZED, "%s before cuInit", name);
  for (size_t i = 0; i < sizeof g.fail / sizeof g.fail[0]; i++) {
    if (g.fail[i].name && strcmp(g.fail[i].name, name) == 0 && --g.fail[i].left == 0) {
      CUresult r = g.fail[i].result;
      g.fail[i].name = NULL;
      c->injected = true;
      return dbl_refuse(r, "%s: failure injected by cudadouble_fail", name);
    }
  }
  return CUDA_SUCCESS;
}

CUresult dbl_end(dbl_call *c, CUresult r) {
  /* the context get/set calls cuda.c makes around every call are not logged */
  bool logged = strcmp(c->name, "cuCtxGetCurrent") != 0 && strcmp(c->name, "cuCtxSetCurrent") != 0;
  if (g.log && logged) {
    dbl_advance_all();
    cudadouble_call *e = &g.log[(g.log_head + g.log_n) % g.cfg.log_max];
    if (g.log_n == g.cfg.log_max) g.log_head = (g.log_head + 1) % g.cfg.log_max;
    else g.log_n++;
    *e = (cudadouble_call){.seq = ++g.log_seq,
                           .name = c->name,
                           .addr = c->addr,
                           .size = c->size,
                           .handle = c->handle,
                           .device = dbl_valid_ctx(dbl_current) ? dbl_current->dev : -1,
                           .result = (int)r,
                           .busy_streams = dbl_busy_streams(),
                           .injected = c->injected};
  }
  if (r == CUDA_SUCCESS) last_msg[0] = 0;
  pthread_mutex_unlock(&g.mu);
  return r;
}

bool dbl_valid_ctx(const dbl_ctx *c) {
  if (!c) return false;
  for (int d = 0; d < g.cfg.devices; d++)
    if (c == &g.dev[d].primary) return c->retains > 0;
  return false;
}

dbl_ctx *dbl_need_ctx(const char *call) {
  if (!dbl_current) {
    dbl_refuse(CUDA_ERROR_INVALID_CONTEXT, "%s: no current context on this thread", call);
    return NULL;
  }
  if (!dbl_valid_ctx(dbl_current)) {
    dbl_refuse(CUDA_ERROR_INVALID_CONTEXT,
               "%s: the current context (primary context of device %d) was released", call,
               dbl_current->dev);
    return NULL;
  }
  return dbl_current;
}

/* ---- initialisation, devices, contexts ---- */

DBL_EXPORT CUresult CUDAAPI cuInit(unsigned int flags) {
  dbl_call call_ = {"cuInit", 0, 0, 0, false};
  CUresult r = dbl_begin(&call_, "cuInit", false);
  if (r != CUDA_SUCCESS) END(r);
  if (flags != 0) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuInit(flags=%u): flags must be 0", flags));
  if (!g.initialized) {
    /* one memfd per allocation: allow as many descriptors as the hard limit does */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  g.initialized = true;
  END(CUDA_SUCCESS);
}

/* The driver's version: `driver` of the configuration (not logged). */
static int driver_version(void) {
  pthread_mutex_lock(&g.mu);
  int v = ensure_configured() ? g.cfg.driver : CUDA_VERSION;
  pthread_mutex_unlock(&g.mu);
  return v;
}

DBL_EXPORT CUresult CUDAAPI cuDriverGetVersion(int *v) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = driver_version();
  return CUDA_SUCCESS;
}

DBL_EXPORT CUresult CUDAAPI cuDeviceGetCount(int *count) {
  BEGIN("cuDeviceGetCount");
  if (!count) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetCount(NULL)"));
  *count = g.cfg.devices;
  END(CUDA_SUCCESS);
}

/* CUdevice handles are ordinal + device_base: a handle is not an ordinal (CUmemLocation.id
 * is an ordinal, every CUdevice argument a handle from cuDeviceGet). The ordinal, or -1. */
static int dev_index(CUdevice d) {
  int i = d - g.cfg.device_base;
  return i >= 0 && i < g.cfg.devices ? i : -1;
}
static bool valid_dev(CUdevice d) { return dev_index(d) >= 0; }

DBL_EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice *dev, int ordinal) {
  BEGIN("cuDeviceGet");
  if (!dev) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuDeviceGet(NULL)"));
  if (ordinal < 0 || ordinal >= g.cfg.devices)
    END(dbl_refuse(CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet(%d): %d device(s)", ordinal,
                   g.cfg.devices));
  *dev = ordinal + g.cfg.device_base;
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute a, CUdevice dev) {
  BEGIN("cuDeviceGetAttribute");
  if (!pi) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute(NULL)"));
  if (!valid_dev(dev))
    END(dbl_refuse(CUDA_ERROR_INVALID_DEVICE, "cuDeviceGetAttribute: no device handle %d", dev));
  switch ((int)a) {
  case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *pi = 1; break;
  case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: *pi = g.cfg.fd; break;
#if CUDA_VERSION >= 12040
  case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *pi = 0; break;
#endif
  case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *pi = 1; break;
  case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: *pi = 1; break;
  case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *pi = 1; break;
  default:
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuDeviceGetAttribute(%d): attribute not modelled by the double", (int)a));
  }
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuDeviceGetPCIBusId(char *bus, int len, CUdevice dev) {
  BEGIN("cuDeviceGetPCIBusId");
  if (!bus || len <= 0) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetPCIBusId: no buffer"));
  if (!valid_dev(dev))
    END(dbl_refuse(CUDA_ERROR_INVALID_DEVICE, "cuDeviceGetPCIBusId: no device %d", dev));
  snprintf(bus, (size_t)len, "0000:%02x:00.0", 0xd0 + dev_index(dev)); /* no such bus on the host */
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
  BEGIN("cuDeviceCanAccessPeer");
  if (!can) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuDeviceCanAccessPeer(NULL)"));
  if (!valid_dev(dev) || !valid_dev(peer))
    END(dbl_refuse(CUDA_ERROR_INVALID_DEVICE, "cuDeviceCanAccessPeer(%d, %d)", dev, peer));
  *can = g.cfg.peer && dev != peer;
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  BEGIN("cuDevicePrimaryCtxRetain");
  if (!pctx) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxRetain(NULL)"));
  if (!valid_dev(dev))
    END(dbl_refuse(CUDA_ERROR_INVALID_DEVICE, "cuDevicePrimaryCtxRetain: no device %d", dev));
  dev = dev_index(dev);
  g.dev[dev].primary.retains++;
  *pctx = (CUcontext)&g.dev[dev].primary;
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
  BEGIN("cuDevicePrimaryCtxRelease");
  if (!valid_dev(dev))
    END(dbl_refuse(CUDA_ERROR_INVALID_DEVICE, "cuDevicePrimaryCtxRelease: no device %d", dev));
  dev = dev_index(dev);
  if (g.dev[dev].primary.retains == 0)
    END(dbl_refuse(CUDA_ERROR_INVALID_CONTEXT,
                   "cuDevicePrimaryCtxRelease(%d): the primary context is not retained", dev));
  g.dev[dev].primary.retains--;
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  BEGIN("cuCtxSetCurrent");
  dbl_ctx *c = (dbl_ctx *)ctx;
  if (c && !dbl_valid_ctx(c))
    END(dbl_refuse(CUDA_ERROR_INVALID_CONTEXT,
                   "cuCtxSetCurrent(%p): not a live context (a primary context is live while "
                   "retained)",
                   (void *)ctx));
  dbl_current = c;
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) {
  BEGIN("cuCtxGetCurrent");
  if (!pctx) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuCtxGetCurrent(NULL)"));
  *pctx = (CUcontext)dbl_current;
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuCtxGetDevice(CUdevice *dev) {
  BEGIN("cuCtxGetDevice");
  NEED_CTX(c);
  if (!dev) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuCtxGetDevice(NULL)"));
  *dev = c->dev + g.cfg.device_base;
  END(CUDA_SUCCESS);
}

/* ---- error names ---- */

#define DBL_ERRORS(X)                                                                          \
  X(CUDA_SUCCESS, "no error") X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                  \
  X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                                 \
  X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                                        \
  X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                          \
  X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                                       \
  X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                                      \
  X(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                                  \
  X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                                      \
  X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                            \
  X(CUDA_ERROR_NOT_READY, "device not ready") X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported") \
  X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                                       \
  X(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state")        \
  X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is " \
                                               "already mapped")                               \
  X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered "     \
                                           "memory region")                                    \
  X(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated")                      \
  X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two "     \
                                        "devices")                                             \
  X(CUDA_ERROR_UNKNOWN, "unknown error")

DBL_EXPORT CUresult CUDAAPI cuGetErrorName(CUresult e, const char **s) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
#define DBL_NAME_(code, text) if (e == code) { *s = #code; return CUDA_SUCCESS; }
  DBL_ERRORS(DBL_NAME_)
#undef DBL_NAME_
  *s = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

DBL_EXPORT CUresult CUDAAPI cuGetErrorString(CUresult e, const char **s) {
  if (!s) return CUDA_ERROR_INVALID_VALUE;
#define DBL_TEXT_(code, text) if (e == code) { *s = text; return CUDA_SUCCESS; }
  DBL_ERRORS(DBL_TEXT_)
#undef DBL_TEXT_
  *s = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

/* ---- cuGetProcAddress ---- */

/* base name -> the newest version of the entry point (the name argument is not expanded by
 * #, the function is: cuMemGetInfo -> cuMemGetInfo_v2) */
#define DBL_PROCS(X)                                                                          \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute) \
  X(cuDeviceGetPCIBusId) X(cuDeviceCanAccessPeer) X(cuDevicePrimaryCtxRetain)                \
  X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxGetDevice)       \
  X(cuCtxSynchronize) X(cuGetErrorName) X(cuGetErrorString)                                  \
  X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap)  \
  X(cuMemSetAccess) X(cuMemGetAccess) X(cuMemAddressReserve) X(cuMemAddressFree)             \
  X(cuMemGetInfo) X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)          \
  X(cuMemHostRegister) X(cuMemHostUnregister) X(cuMemHostGetDevicePointer) X(cuMemcpyHtoD)   \
  X(cuMemcpyDtoH) X(cuMemcpyDtoD) X(cuMemsetD8) X(cuMemsetD32) X(cuEventCreate)              \
  X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize) X(cuStreamCreate) \
  X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamWaitValue32)          \
  X(cuStreamWriteValue32) X(cuStreamWaitEvent) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)

static const struct {
  const char *name;
  int version; /* handed out to callers asking for this version or later */
  void *fn;
} procs[] = {
#define DBL_PROC_(f) {#f, 0, (void *)&f},
    DBL_PROCS(DBL_PROC_)
#undef DBL_PROC_
/* entry points whose newer version changed the arguments under the same name */
#if CUDA_VERSION >= 13000
    {"cuCtxSynchronize", 13000, (void *)&cuCtxSynchronize_v2},
#endif
};

/* cuGetProcAddress (cuda.h): a version newer than the driver's is CUDA_ERROR_INVALID_VALUE;
 * flags are DEFAULT, LEGACY_STREAM or PER_THREAD_DEFAULT_STREAM; a name the driver does not
 * have, or has only in versions newer than asked, is CUDA_SUCCESS with *pfn NULL and the
 * status saying which (the 4-argument one of CUDA 11.3..11.8 returns CUDA_ERROR_NOT_FOUND). */
static CUresult get_proc(const char *symbol, void **pfn, int version, cuuint64_t flags,
                         CUdriverProcAddressQueryResult *status, bool v1) {
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  *pfn = NULL;
  int driver = driver_version();
  if (version > driver)
    return dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                      "cuGetProcAddress('%s', cudaVersion %d): newer than the driver (%d)", symbol,
                      version, driver);
  if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                            CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
    return dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuGetProcAddress('%s', flags 0x%llx)", symbol,
                      (unsigned long long)flags);
  int best = -1; /* the newest version of the name not newer than the caller asked for */
  bool named = false;
  for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
    if (strcmp(procs[i].name, symbol) != 0) continue;
    named = true;
    if (procs[i].version <= version && (best < 0 || procs[i].version > procs[best].version))
      best = (int)i;
  }
  if (best >= 0) {
    *pfn = procs[best].fn;
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  if (status)
    *status = named ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  dbl_refuse(CUDA_ERROR_NOT_FOUND, "cuGetProcAddress('%s'): not an entry point of the double",
             symbol);
  return v1 ? CUDA_ERROR_NOT_FOUND : CUDA_SUCCESS;
}

DBL_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version,
                                             cuuint64_t flags,
                                             CUdriverProcAddressQueryResult *status) {
  return get_proc(symbol, pfn, version, flags, status, false);
}

/* The 4-argument cuGetProcAddress of CUDA 11.3..11.8 (cuda.h names the 12+ one _v2). */
#undef cuGetProcAddress
DBL_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version,
                                             cuuint64_t flags);
DBL_EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int version,
                                             cuuint64_t flags) {
  return get_proc(symbol, pfn, version, flags, NULL, true);
}

/* ---- control calls ---- */

DBL_EXPORT int cudadouble_configure(const char *spec) {
  pthread_mutex_lock(&g.mu);
  int r = CUDA_SUCCESS;
  if (g.configured && !nothing_live())
    r = dbl_refuse(CUDA_ERROR_ILLEGAL_STATE,
                   "cudadouble_configure: contexts, memory, streams or events are live");
  else if (!apply_config(spec))
    r = CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_unlock(&g.mu);
  return r;
}

DBL_EXPORT const char *cudadouble_last_message(void) { return last_msg; }

/* The driver after its own teardown at process exit: every call that BEGINs is
 * CUDA_ERROR_DEINITIALIZED from now on (this process; nothing is freed). */
DBL_EXPORT void cudadouble_shutdown(void) {
  pthread_mutex_lock(&g.mu);
  g.shut_down = true;
  pthread_mutex_unlock(&g.mu);
}

DBL_EXPORT size_t cudadouble_log_count(void) {
  pthread_mutex_lock(&g.mu);
  size_t n = g.log_n;
  pthread_mutex_unlock(&g.mu);
  return n;
}

DBL_EXPORT int cudadouble_log_get(size_t i, cudadouble_call *out) {
  pthread_mutex_lock(&g.mu);
  int r = -1;
  if (i < g.log_n && out) {
    *out = g.log[(g.log_head + i) % g.cfg.log_max];
    r = 0;
  }
  pthread_mutex_unlock(&g.mu);
  return r;
}

DBL_EXPORT void cudadouble_log_clear(void) {
  pthread_mutex_lock(&g.mu);
  g.log_n = g.log_head = 0;
  pthread_mutex_unlock(&g.mu);
}

DBL_EXPORT int cudadouble_fail(const char *name, unsigned nth, int result) {
  bool known = false;
  for (size_t i = 0; name && i < sizeof procs / sizeof procs[0]; i++)
    if (strcmp(procs[i].name, name) == 0) known = true;
  if (!known)
    return dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cudadouble_fail('%s'): no such entry point",
                      name ? name : "");
  pthread_mutex_lock(&g.mu);
  if (nth == 0) {
    for (size_t i = 0; i < sizeof g.fail / sizeof g.fail[0]; i++)
      if (g.fail[i].name && strcmp(g.fail[i].name, name) == 0) g.fail[i].name = NULL;
    pthread_mutex_unlock(&g.mu);
    return CUDA_SUCCESS;
  }
  int r = -1;
  for (size_t i = 0; r != CUDA_SUCCESS && i < sizeof g.fail / sizeof g.fail[0]; i++) {
    if (!g.fail[i].name || strcmp(g.fail[i].name, name) == 0) {
      for (size_t k = 0; k < sizeof procs / sizeof procs[0]; k++)
        if (strcmp(procs[k].name, name) == 0) g.fail[i].name = procs[k].name;
      g.fail[i].left = nth;
      g.fail[i].result = (CUresult)result;
      r = CUDA_SUCCESS;
    }
  }
  if (r != CUDA_SUCCESS) r = dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cudadouble_fail: at most 16 rules");
  pthread_mutex_unlock(&g.mu);
  return r;
}

DBL_EXPORT int cudadouble_hold_stream(void *stream, int hold) {
  pthread_mutex_lock(&g.mu);
  int r = CUDA_SUCCESS;
  dbl_stream *s = NULL;
  if (!stream) {
    if (!dbl_valid_ctx(dbl_current))
      r = dbl_refuse(CUDA_ERROR_INVALID_CONTEXT,
                     "cudadouble_hold_stream(NULL): the default stream needs a current context");
    else
      s = dbl_default_stream(dbl_current->dev);
  } else {
    s = dbl_stream_of((CUstream)stream, NULL);
  }
  if (s) r = dbl_hold(s, hold != 0);
  else if (stream) r = dbl_refuse(CUDA_ERROR_INVALID_HANDLE, "cudadouble_hold_stream(%p): no such stream", stream);
  pthread_mutex_unlock(&g.mu);
  return r;
}

DBL_EXPORT void cudadouble_counts(cudadouble_state *out) {
  pthread_mutex_lock(&g.mu);
  memset(out, 0, sizeof *out);
  dbl_advance_all();
  dbl_counts_memory(out);
  dbl_counts_streams(out);
  for (int d = 0; d < DBL_MAX_DEVICES; d++) {
    out->primary_retains += g.dev[d].primary.retains;
    out->used_bytes += g.dev[d].used;
  }
  pthread_mutex_unlock(&g.mu);
}
