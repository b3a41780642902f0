/* SPDX-License-Identifier: Apache-2.0 */
/* double.h: shared state of the CUDA driver double (a test library named libcuda.so.1; it
 * includes cuda.h, as test doubles in tests/ may). core.c: configuration, initialisation,
 * devices, contexts, cuGetProcAddress, the call log and the control calls; memory.c: the
 * virtual memory API, copies and host registration; streams.c: streams, events and stream
 * memory operations.
 *
 * One mutex guards everything (g.mu); the current context is thread-local. Every entry point
 * starts with BEGIN(name), which takes the mutex, checks cuInit, applies an injected
 * failure, and ends with END(result), which logs the call and unlocks. */
#ifndef CUDA_DOUBLE_H
#define CUDA_DOUBLE_H

#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cudadouble.h"

#define DBL_EXPORT __attribute__((visibility("default")))
#define DBL_MAX_DEVICES 8

typedef struct dbl_ctx {
  uint32_t magic;
  int dev;
  int retains;
} dbl_ctx;

typedef struct dbl_stream dbl_stream;

typedef struct {
  int64_t used;     /* bytes of live allocations */
  dbl_ctx primary;
  dbl_stream *default_stream;
} dbl_device;

typedef struct {
  uint64_t id;
  size_t size;
  int dev;
  int fd;         /* memfd (this allocation's memory) */
  bool imported;  /* another process's memory: not counted against capacity */
  bool released;  /* cuMemRelease called; freed at the last unmap */
  bool fd_export; /* created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
  int maps;
} dbl_alloc;

typedef struct {
  uintptr_t base;
  size_t size;
} dbl_range;

typedef struct {
  uintptr_t va;
  size_t size;
  dbl_alloc *alloc;
  unsigned access; /* bit d: device d may read and write */
} dbl_map;

typedef enum { OP_EVENT, OP_WAIT, OP_WRITE, OP_HOLD, OP_WAIT_EVENT, OP_COPY } dbl_op_kind;

typedef struct dbl_event {
  uint32_t magic;
  dbl_ctx *ctx;
  uint64_t recorded, done; /* records made, records completed */
} dbl_event;

typedef struct {
  dbl_op_kind kind;
  dbl_event *ev;
  uint64_t seq; /* OP_EVENT: the record's number; OP_WAIT_EVENT: the record waited for */
  volatile uint32_t *addr;
  uint32_t value;
  unsigned flags;
  bool released; /* OP_HOLD */
  void *dst;     /* OP_COPY: cuMemcpy*Async's n bytes from src to dst, done at a sync */
  const void *src;
  size_t n;
} dbl_op;

struct dbl_stream {
  uint32_t magic;
  dbl_ctx *ctx;
  dbl_op *ops; /* queued work, oldest first */
  size_t n, cap;
  bool destroyed; /* cuStreamDestroy with work left: freed once it is done */
};

/* a growable array of pointers */
typedef struct {
  void **v;
  size_t n, cap;
} dbl_vec;

typedef struct {
  int devices;
  size_t capacity, granularity, recommended;
  bool fd, peer, verbose;
  unsigned sync_timeout_ms;
  size_t log_max;
  int device_base; /* CUdevice handle = ordinal + device_base */
  int driver;      /* the version cuDriverGetVersion reports */
} dbl_config;

typedef struct {
  pthread_mutex_t mu;
  bool initialized;
  bool configured;
  bool shut_down; /* cudadouble_shutdown: every call is CUDA_ERROR_DEINITIALIZED */
  dbl_config cfg;
  dbl_device dev[DBL_MAX_DEVICES];
  uint64_t next_handle;
  dbl_vec allocs, ranges, maps, streams, events, hostregs;
  /* destinations of cuMemcpyHtoD from pageable memory whose DMA may still run (dbl_range *):
   * until the legacy stream or the context is synchronized, or another copy starts */
  dbl_vec dma;
  /* inside a synchronizing call: queued copies run (of sync_stream, or of every stream when
   * it is NULL); elsewhere a queued copy stops its stream */
  bool syncing;
  const struct dbl_stream *sync_stream;
  /* the call log: a ring of log_max entries */
  cudadouble_call *log;
  size_t log_n, log_head;
  uint64_t log_seq;
  /* one injected failure rule per name */
  struct {
    const char *name;
    unsigned left;
    CUresult result;
  } fail[16];
} dbl_state;

extern dbl_state g;
extern __thread dbl_ctx *dbl_current;

#define DBL_CTX_MAGIC 0xC7C7C7C7u
#define DBL_STREAM_MAGIC 0x57E57E57u
#define DBL_EVENT_MAGIC 0xE7E7E7E7u

/* Call context for one entry point: what END logs. */
typedef struct {
  const char *name;
  uint64_t addr, size, handle;
  bool injected;
} dbl_call;

/* BEGIN: lock, then CUDA_ERROR_NOT_INITIALIZED before cuInit, or an injected failure. */
CUresult dbl_begin(dbl_call *c, const char *name, bool needs_init);
/* END: log, unlock, return r. */
CUresult dbl_end(dbl_call *c, CUresult r);
/* A refusal: r, with a message (thread's last message; stderr under verbose=1). */
CUresult dbl_refuse(CUresult r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The current context, checked: NULL (and the message set) when there is none usable. */
dbl_ctx *dbl_need_ctx(const char *call);
bool dbl_valid_ctx(const dbl_ctx *c);
int dbl_busy_streams(void);
void dbl_advance_all(void);

void dbl_vec_push(dbl_vec *v, void *p);
void dbl_vec_remove(dbl_vec *v, size_t i); /* order-keeping */
const char *dbl_size(char *buf, size_t n);  /* "2.00 MiB" */

/* memory.c: is [addr, addr+n) readable and writable by device dev (mapped with access, or
 * registered host memory)? */
bool dbl_accessible(uintptr_t addr, size_t n, int dev);
void dbl_counts_memory(cudadouble_state *o);
bool dbl_memory_idle(void);
/* streams.c */
dbl_stream *dbl_default_stream(int dev);
void dbl_counts_streams(cudadouble_state *o);
int dbl_hold(dbl_stream *s, bool hold);
dbl_stream *dbl_stream_of(CUstream s, dbl_ctx *ctx);
/* an asynchronous copy to or from [base, base+n) is queued and not yet done */
bool dbl_copy_queued(uintptr_t base, size_t n);
/* memory.c: [p, p+n) lies in host memory registered with cuMemHostRegister (pinned) */
bool dbl_host_pinned(const void *p, size_t n);
/* the pageable-memory copies in flight have landed (a synchronizing call) */
void dbl_dma_done(void);

/* BEGIN_ARGS: the address range and handle the call names, logged with it (an injected
 * failure too). */
#define BEGIN_ARGS(name_, addr_, size_, handle_)                                       \
  dbl_call call_ = {name_, (uint64_t)(addr_), (uint64_t)(size_), (uint64_t)(handle_), false}; \
  {                                                                                    \
    CUresult r0_ = dbl_begin(&call_, name_, true);                                     \
    if (r0_ != CUDA_SUCCESS) return dbl_end(&call_, r0_);                              \
  }
#define BEGIN(name_) BEGIN_ARGS(name_, 0, 0, 0)
#define END(r) return dbl_end(&call_, (r))
#define NEED_CTX(ctxvar)                                                  \
  dbl_ctx *ctxvar = dbl_need_ctx(call_.name);                            \
  if (!ctxvar) END(CUDA_ERROR_INVALID_CONTEXT)

#endif /* CUDA_DOUBLE_H */
