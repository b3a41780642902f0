/* SPDX-License-Identifier: Apache-2.0 */
/* streams.c: the CUDA driver double's streams and events (tests only; includes cuda.h).
 *
 * Work is asynchronous: each stream is a queue of operations (event records, waits on a
 * 32-bit word, writes of one, waits on another stream's event, and holds a test places with
 * cudadouble_hold_stream). The queue advances from its head whenever the double is called:
 * an operation whose condition is not met (a word not yet written, a hold not released)
 * stops everything queued behind it, so an event completes only when all work recorded
 * before it on its stream is done, and cuEventQuery says CUDA_ERROR_NOT_READY until then.
 * Synchronize calls poll until done, up to sync_timeout ms (a real GPU would wait forever:
 * the double answers CUDA_ERROR_LAUNCH_TIMEOUT and says so). The default stream (NULL,
 * CU_STREAM_LEGACY, CU_STREAM_PER_THREAD) is one queue per device; its implicit
 * synchronisation with blocking streams is not modelled. Asynchronous copies
 * (cuMemcpyHtoDAsync / DtoHAsync) are queued too, and land only inside a synchronizing call
 * that covers their stream (its cuStreamSynchronize, cuCtxSynchronize, cuEventSynchronize):
 * until then the destination keeps its old bytes and an unmap of either side is refused. */
#include "double.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static dbl_stream *new_stream(dbl_ctx *ctx) {
  dbl_stream *s = calloc(1, sizeof *s);
  if (!s) abort();
  s->magic = DBL_STREAM_MAGIC;
  s->ctx = ctx;
  return s;
}

dbl_stream *dbl_default_stream(int dev) {
  if (!g.dev[dev].default_stream) g.dev[dev].default_stream = new_stream(&g.dev[dev].primary);
  return g.dev[dev].default_stream;
}

/* s as a stream of the double; ctx: the current context (for the default stream); NULL when
 * s is not a live stream. */
dbl_stream *dbl_stream_of(CUstream s, dbl_ctx *ctx) {
  if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
    return ctx ? dbl_default_stream(ctx->dev) : NULL;
  for (size_t i = 0; i < g.streams.n; i++)
    if (g.streams.v[i] == (void *)s && !((dbl_stream *)s)->destroyed) return (dbl_stream *)s;
  return NULL;
}

static bool wait_met(const dbl_op *o) {
  /* another thread (the host) may write the word at any time: an atomic read */
  uint32_t v = __atomic_load_n(o->addr, __ATOMIC_ACQUIRE);
  switch (o->flags & 0xf) {
  case CU_STREAM_WAIT_VALUE_GEQ: return (int32_t)(v - o->value) >= 0;
  case CU_STREAM_WAIT_VALUE_EQ: return v == o->value;
  case CU_STREAM_WAIT_VALUE_AND: return (v & o->value) != 0;
  default: return ~(v | o->value) != 0; /* NOR */
  }
}

/* Runs s's queue from its head as far as it can go. */
static void advance(dbl_stream *s) {
  size_t k = 0;
  for (; k < s->n; k++) {
    dbl_op *o = &s->ops[k];
    if (o->kind == OP_HOLD && !o->released) break;
    if (o->kind == OP_WAIT && !wait_met(o)) break;
    if (o->kind == OP_WAIT_EVENT && o->ev && o->ev->done < o->seq) break;
    if (o->kind == OP_COPY) { /* lands only in a synchronizing call that covers s */
      if (!g.syncing || (g.sync_stream && g.sync_stream != s)) break;
      memcpy(o->dst, o->src, o->n);
    }
    if (o->kind == OP_WRITE) __atomic_store_n(o->addr, o->value, __ATOMIC_RELEASE);
    if (o->kind == OP_EVENT && o->ev && o->ev->done < o->seq) o->ev->done = o->seq;
  }
  if (k == 0) return; /* ops may be NULL: no memmove of nothing */
  memmove(s->ops, s->ops + k, (s->n - k) * sizeof *s->ops);
  s->n -= k;
}

void dbl_advance_all(void) {
  /* twice: a wait on another stream's event may be met by the first pass */
  for (int pass = 0; pass < 2; pass++) {
    for (int d = 0; d < DBL_MAX_DEVICES; d++)
      if (g.dev[d].default_stream) advance(g.dev[d].default_stream);
    for (size_t i = 0; i < g.streams.n; i++) advance(g.streams.v[i]);
  }
  for (size_t i = 0; i < g.streams.n;) {
    dbl_stream *s = g.streams.v[i];
    if (s->destroyed && s->n == 0) {
      dbl_vec_remove(&g.streams, i);
      free(s->ops);
      free(s);
    } else {
      i++;
    }
  }
}

int dbl_busy_streams(void) {
  int n = 0;
  for (int d = 0; d < DBL_MAX_DEVICES; d++)
    if (g.dev[d].default_stream && g.dev[d].default_stream->n) n++;
  for (size_t i = 0; i < g.streams.n; i++) n += ((dbl_stream *)g.streams.v[i])->n > 0;
  return n;
}

void dbl_counts_streams(cudadouble_state *o) {
  for (size_t i = 0; i < g.streams.n; i++) o->streams += !((dbl_stream *)g.streams.v[i])->destroyed;
  o->events = (int64_t)g.events.n;
  o->busy_streams = dbl_busy_streams();
}

static void push(dbl_stream *s, dbl_op o) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 8;
    dbl_op *nv = realloc(s->ops, cap * sizeof *nv);
    if (!nv) abort();
    s->ops = nv;
    s->cap = cap;
  }
  s->ops[s->n++] = o;
}

int dbl_hold(dbl_stream *s, bool hold) {
  if (hold) {
    push(s, (dbl_op){.kind = OP_HOLD});
  } else {
    for (size_t i = 0; i < s->n; i++)
      if (s->ops[i].kind == OP_HOLD) s->ops[i].released = true;
  }
  dbl_advance_all();
  return CUDA_SUCCESS;
}

#define STREAM(var, h, ctx)                                                                  \
  dbl_stream *var = dbl_stream_of((h), (ctx));                                               \
  if (!var)                                                                                  \
    END(dbl_refuse(CUDA_ERROR_INVALID_HANDLE, "%s(stream %p): not a live stream", call_.name, \
                   (void *)(h)));                                                            \
  if (var->ctx != (ctx))                                                                     \
    END(dbl_refuse(CUDA_ERROR_INVALID_HANDLE,                                                \
                   "%s: the stream belongs to device %d's context, the current one is "      \
                   "device %d's",                                                            \
                   call_.name, var->ctx->dev, (ctx)->dev));

static dbl_event *event_of(CUevent e) {
  for (size_t i = 0; i < g.events.n; i++)
    if (g.events.v[i] == (void *)e) return (dbl_event *)e;
  return NULL;
}

#define EVENT(var, h)                                                                         \
  dbl_event *var = event_of(h);                                                               \
  if (!var)                                                                                   \
    END(dbl_refuse(CUDA_ERROR_INVALID_HANDLE, "%s(event %p): not a live event", call_.name,   \
                   (void *)(h)));

/* Polls until done() holds, the mutex released between polls; false after the timeout.
 * Queued copies of `copies` (NULL: of every stream) run meanwhile. */
static bool wait_until(bool (*done)(const void *), const void *arg, const dbl_stream *copies) {
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    g.syncing = true, g.sync_stream = copies;
    dbl_advance_all();
    g.syncing = false, g.sync_stream = NULL;
    if (done(arg)) return true;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double ms = (double)(now.tv_sec - t0.tv_sec) * 1e3 + (double)(now.tv_nsec - t0.tv_nsec) / 1e6;
    if (ms >= g.cfg.sync_timeout_ms) return false;
    pthread_mutex_unlock(&g.mu);
    usleep(200);
    pthread_mutex_lock(&g.mu);
  }
}

static CUresult timed_out(const char *call) {
  return dbl_refuse(CUDA_ERROR_LAUNCH_TIMEOUT,
                    "%s: work still queued after %u ms (sync_timeout); a real GPU would wait "
                    "forever",
                    call, g.cfg.sync_timeout_ms);
}

/* ---- streams ---- */

DBL_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream *out, unsigned int flags) {
  BEGIN("cuStreamCreate");
  NEED_CTX(ctx);
  if (!out) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate: NULL output"));
  if (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuStreamCreate(flags 0x%x): CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING",
                   flags));
  dbl_stream *s = new_stream(ctx);
  dbl_vec_push(&g.streams, s);
  *out = (CUstream)s;
  call_.handle = (uintptr_t)s;
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuStreamDestroy(CUstream h) {
  BEGIN_ARGS("cuStreamDestroy", 0, 0, (uintptr_t)h);
  NEED_CTX(ctx);
  if (!h || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
    END(dbl_refuse(CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy: the default stream"));
  STREAM(s, h, ctx);
  s->destroyed = true; /* its work still runs; freed when done (dbl_advance_all) */
  END(CUDA_SUCCESS);
}

static bool stream_idle(const void *s) { return ((const dbl_stream *)s)->n == 0; }

DBL_EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream h) {
  BEGIN_ARGS("cuStreamSynchronize", 0, 0, (uintptr_t)h);
  NEED_CTX(ctx);
  STREAM(s, h, ctx);
  if (h == NULL || h == CU_STREAM_LEGACY) dbl_dma_done(); /* the copies' stream */
  END(wait_until(stream_idle, s, s) ? CUDA_SUCCESS : timed_out(call_.name));
}

DBL_EXPORT CUresult CUDAAPI cuStreamQuery(CUstream h) {
  BEGIN_ARGS("cuStreamQuery", 0, 0, (uintptr_t)h);
  NEED_CTX(ctx);
  STREAM(s, h, ctx);
  dbl_advance_all();
  END(s->n ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

static bool device_idle(const void *ctx) {
  const dbl_ctx *c = ctx;
  if (g.dev[c->dev].default_stream && g.dev[c->dev].default_stream->n) return false;
  for (size_t i = 0; i < g.streams.n; i++) {
    const dbl_stream *s = g.streams.v[i];
    if (s->ctx == c && s->n) return false;
  }
  return true;
}

DBL_EXPORT CUresult CUDAAPI cuCtxSynchronize(void) {
  BEGIN("cuCtxSynchronize");
  NEED_CTX(ctx);
  dbl_dma_done();
  END(wait_until(device_idle, ctx, NULL) ? CUDA_SUCCESS : timed_out(call_.name));
}

#if CUDA_VERSION >= 13000
/* CUDA 13.0's cuCtxSynchronize takes the context (NULL: the current one). cuGetProcAddress
 * hands it out for "cuCtxSynchronize" at version 13000 or later, while cuda.h still declares
 * the plain name without the argument: a caller that asks for 13000 and calls the plain
 * prototype passes garbage, refused here as the driver does (CONTEXT_IS_DESTROYED). */
DBL_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  BEGIN("cuCtxSynchronize_v2");
  dbl_ctx *c = ctx ? (dbl_ctx *)ctx : dbl_current;
  if (!c)
    END(dbl_refuse(CUDA_ERROR_INVALID_CONTEXT,
                   "cuCtxSynchronize_v2(NULL): no current context on this thread"));
  if (!dbl_valid_ctx(c))
    END(dbl_refuse(CUDA_ERROR_CONTEXT_IS_DESTROYED,
                   "cuCtxSynchronize_v2(%p): not a live context (the version 13000 entry point "
                   "takes the context as its argument)",
                   (void *)ctx));
  dbl_dma_done();
  END(wait_until(device_idle, c, NULL) ? CUDA_SUCCESS : timed_out(call_.name));
}
#endif

static CUresult value_op(dbl_call *c, dbl_stream *s, dbl_op_kind kind, CUdeviceptr addr,
                         uint32_t value, unsigned flags) {
  if (addr % 4)
    return dbl_refuse(CUDA_ERROR_INVALID_VALUE, "%s(0x%llx): the address must be 4-byte aligned",
                      c->name, addr);
  if (!dbl_accessible((uintptr_t)addr, 4, s->ctx->dev))
    return dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                      "%s(0x%llx): not memory the device can access (registered host memory "
                      "through cuMemHostGetDevicePointer, or mapped device memory)",
                      c->name, addr);
  push(s, (dbl_op){.kind = kind, .addr = (volatile uint32_t *)(uintptr_t)addr, .value = value,
                   .flags = flags});
  return CUDA_SUCCESS;
}

DBL_EXPORT CUresult CUDAAPI cuStreamWaitValue32(CUstream h, CUdeviceptr addr, cuuint32_t value,
                                                unsigned int flags) {
  BEGIN_ARGS("cuStreamWaitValue32", addr, 0, (uintptr_t)h);
  NEED_CTX(ctx);
  STREAM(s, h, ctx);
  if ((flags & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH) > CU_STREAM_WAIT_VALUE_NOR)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuStreamWaitValue32(flags 0x%x): GEQ, EQ, AND or NOR",
                   flags));
  END(value_op(&call_, s, OP_WAIT, addr, value, flags));
}

DBL_EXPORT CUresult CUDAAPI cuStreamWriteValue32(CUstream h, CUdeviceptr addr, cuuint32_t value,
                                                 unsigned int flags) {
  BEGIN_ARGS("cuStreamWriteValue32", addr, 0, (uintptr_t)h);
  NEED_CTX(ctx);
  STREAM(s, h, ctx);
  if (flags & ~(unsigned)CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuStreamWriteValue32(flags 0x%x)", flags));
  END(value_op(&call_, s, OP_WRITE, addr, value, flags));
}

DBL_EXPORT CUresult CUDAAPI cuStreamWaitEvent(CUstream h, CUevent e, unsigned int flags) {
  BEGIN_ARGS("cuStreamWaitEvent", 0, 0, (uintptr_t)h);
  NEED_CTX(ctx);
  STREAM(s, h, ctx);
  EVENT(ev, e);
  if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuStreamWaitEvent(flags 0x%x)", flags));
  if (ev->recorded > ev->done) push(s, (dbl_op){.kind = OP_WAIT_EVENT, .ev = ev, .seq = ev->recorded});
  END(CUDA_SUCCESS);
}

/* ---- events ---- */

DBL_EXPORT CUresult CUDAAPI cuEventCreate(CUevent *out, unsigned int flags) {
  BEGIN("cuEventCreate");
  NEED_CTX(ctx);
  if (!out) END(dbl_refuse(CUDA_ERROR_INVALID_VALUE, "cuEventCreate: NULL output"));
  unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING;
  if (flags & ~known)
    END(dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                   "cuEventCreate(flags 0x%x): the double models DEFAULT, BLOCKING_SYNC and "
                   "DISABLE_TIMING",
                   flags));
  dbl_event *e = calloc(1, sizeof *e);
  if (!e) abort();
  e->magic = DBL_EVENT_MAGIC;
  e->ctx = ctx;
  dbl_vec_push(&g.events, e);
  *out = (CUevent)e;
  call_.handle = (uintptr_t)e;
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuEventDestroy(CUevent h) {
  BEGIN_ARGS("cuEventDestroy", 0, 0, (uintptr_t)h);
  EVENT(e, h);
  /* the driver lets an event with work pending be destroyed: its records become no-ops */
  for (int d = 0; d < DBL_MAX_DEVICES; d++) {
    dbl_stream *s = g.dev[d].default_stream;
    for (size_t i = 0; s && i < s->n; i++)
      if (s->ops[i].ev == e) s->ops[i].ev = NULL;
  }
  for (size_t k = 0; k < g.streams.n; k++) {
    dbl_stream *s = g.streams.v[k];
    for (size_t i = 0; i < s->n; i++)
      if (s->ops[i].ev == e) s->ops[i].ev = NULL;
  }
  for (size_t i = 0; i < g.events.n; i++)
    if (g.events.v[i] == e) dbl_vec_remove(&g.events, i);
  free(e);
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuEventRecord(CUevent h, CUstream sh) {
  BEGIN_ARGS("cuEventRecord", 0, 0, (uintptr_t)h);
  NEED_CTX(ctx);
  EVENT(e, h);
  STREAM(s, sh, ctx);
  if (e->ctx != s->ctx)
    END(dbl_refuse(CUDA_ERROR_INVALID_HANDLE,
                   "cuEventRecord: the event (device %d) and the stream (device %d) must belong "
                   "to the same context",
                   e->ctx->dev, s->ctx->dev));
  push(s, (dbl_op){.kind = OP_EVENT, .ev = e, .seq = ++e->recorded});
  END(CUDA_SUCCESS);
}

DBL_EXPORT CUresult CUDAAPI cuEventQuery(CUevent h) {
  BEGIN_ARGS("cuEventQuery", 0, 0, (uintptr_t)h);
  EVENT(e, h);
  dbl_advance_all();
  END(e->done == e->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
}

static bool event_done(const void *ev) {
  const dbl_event *e = ev;
  return e->done == e->recorded;
}

DBL_EXPORT CUresult CUDAAPI cuEventSynchronize(CUevent h) {
  BEGIN_ARGS("cuEventSynchronize", 0, 0, (uintptr_t)h);
  EVENT(e, h);
  /* the event cannot be destroyed while we poll: cuEventDestroy of it by another thread
   * during its own synchronize is a use after free on the driver too */
  END(wait_until(event_done, e, NULL) ? CUDA_SUCCESS : timed_out(call_.name));
}

/* ---- asynchronous copies ---- */

bool dbl_copy_queued(uintptr_t base, size_t n) {
  for (size_t i = 0; i < g.streams.n + DBL_MAX_DEVICES; i++) {
    const dbl_stream *s = i < g.streams.n ? g.streams.v[i] : g.dev[i - g.streams.n].default_stream;
    for (size_t k = 0; s && k < s->n; k++) {
      const dbl_op *o = &s->ops[k];
      if (o->kind != OP_COPY) continue;
      const uintptr_t d = (uintptr_t)o->dst, sr = (uintptr_t)o->src;
      if ((d < base + n && base < d + o->n) || (sr < base + n && base < sr + o->n)) return true;
    }
  }
  return false;
}

/* As NVIDIA documents them: the stream must be live and of the current context, the device
 * range mapped with access, and the host memory page-locked for the copy to be asynchronous;
 * the double refuses pageable memory (a real driver stages it and returns only once the
 * copy is done, which silently loses the overlap). The copy is queued: it lands when its
 * stream (or the context, or an event) is synchronized, so a reader that did not
 * synchronize sees the old bytes. */
static CUresult copy_async(dbl_call *c, dbl_ctx *ctx, dbl_stream *s, void *dst, const void *src,
                           size_t n, uintptr_t dev, const void *host) {
  if (n && !dbl_accessible(dev, n, ctx->dev))
    return dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                      "%s: [0x%lx, +%zu) is not memory device %d can access (unmapped, or no "
                      "cuMemSetAccess)",
                      c->name, (unsigned long)dev, n, ctx->dev);
  if (n && !dbl_host_pinned(host, n))
    return dbl_refuse(CUDA_ERROR_INVALID_VALUE,
                      "%s: host memory %p (+%zu) is pageable; the double accepts page-locked "
                      "memory only (cuMemHostRegister / cuMemHostAlloc): with pageable memory "
                      "the copy is not asynchronous",
                      c->name, host, n);
  if (n) push(s, (dbl_op){.kind = OP_COPY, .dst = dst, .src = src, .n = n});
  dbl_advance_all();
  return CUDA_SUCCESS;
}

DBL_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n,
                                              CUstream h) {
  BEGIN_ARGS("cuMemcpyHtoDAsync", dst, n, (uintptr_t)h);
  NEED_CTX(ctx);
  STREAM(s, h, ctx);
  END(copy_async(&call_, ctx, s, (void *)dst, src, n, (uintptr_t)dst, src));
}

DBL_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream h) {
  BEGIN_ARGS("cuMemcpyDtoHAsync", src, n, (uintptr_t)h);
  NEED_CTX(ctx);
  STREAM(s, h, ctx);
  END(copy_async(&call_, ctx, s, dst, (const void *)src, n, (uintptr_t)src, dst));
}
