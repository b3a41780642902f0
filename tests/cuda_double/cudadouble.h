/* SPDX-License-Identifier: Apache-2.0 */
/* cudadouble.h: the control interface of the CUDA driver double (tests/cuda_double/, a test
 * library named libcuda.so.1, never installed; docs/driver.md, "The CUDA driver double").
 *
 * Tests reach it with dlopen("libcuda.so.1") + dlsym, like the real driver's entry points, so
 * nothing here needs cuda.h: cudadouble_load() fills a table of the control functions and
 * fails (returns 0) when the loaded libcuda.so.1 is the real driver. Every driver call the
 * double answers is written to a call log (entry point, arguments, result, how many streams
 * had unfinished work at that moment), which tests read to assert call sequences. */
#ifndef CUDADOUBLE_H
#define CUDADOUBLE_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One logged driver call. addr/size: the address range it names (0 where none); handle: the
 * allocation handle it names or created; result: the CUresult returned; busy_streams: streams
 * with unfinished work when the call was made; injected: failed by cudadouble_fail. */
typedef struct cudadouble_call {
  uint64_t seq;
  const char *name; /* the entry point's base name, e.g. "cuMemMap" */
  uint64_t addr, size, handle;
  int device; /* the device of the current context, -1 without one */
  int result;
  int busy_streams;
  int injected;
} cudadouble_call;

/* What the double holds right now (this process). */
typedef struct cudadouble_state {
  int64_t handles;      /* created or imported, not released */
  int64_t freed_late;   /* released while mapped, waiting for the last unmap */
  int64_t reservations;
  int64_t mappings;
  int64_t streams; /* created, not destroyed */
  int64_t events;
  int64_t busy_streams;
  int64_t host_registrations;
  int64_t primary_retains; /* sum over devices */
  int64_t used_bytes;      /* device memory in use, all devices */
} cudadouble_state;

typedef struct cudadouble_api {
  /* Replaces the configuration ("devices=2,capacity=8G,granularity=2M,recommended=4M", the
   * syntax of $EXPSEG_CUDA_DOUBLE); only while nothing is live. 0 or a CUresult. */
  int (*configure)(const char *spec);
  const char *(*last_message)(void); /* this thread's last refusal, "" if none */
  size_t (*log_count)(void);         /* entries kept (the oldest are dropped past log=N) */
  int (*log_get)(size_t i, cudadouble_call *out); /* 0 on success */
  void (*log_clear)(void);
  /* The nth next call (1 = the next) of entry point `name` (a base name, e.g. "cuMemMap")
   * fails with `result` and does nothing; nth = 0 removes the rule of that name. 0 or
   * CUDA_ERROR_INVALID_VALUE (unknown name, more than 16 rules). */
  int (*fail)(const char *name, unsigned nth, int result);
  /* hold = 1: work queued on `stream` (a CUstream; NULL is the current context's default
   * stream) stops at this point until the same call with hold = 0. */
  int (*hold_stream)(void *stream, int hold);
  void (*counts)(cudadouble_state *out);
  /* The driver as it is after its own teardown at process exit: every later call of this
   * process is CUDA_ERROR_DEINITIALIZED (nothing is freed; no way back). */
  void (*shutdown)(void);
} cudadouble_api;

/* 1 when libcuda.so.1 (already loaded or loadable) is the double; fills *api. */
static inline int cudadouble_load(cudadouble_api *api) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return 0;
#define CUDADOUBLE_SYM_(field, type)                                  \
  api->field = (type)dlsym(lib, "cudadouble_" #field);               \
  if (!api->field) return 0;
  CUDADOUBLE_SYM_(configure, int (*)(const char *))
  CUDADOUBLE_SYM_(last_message, const char *(*)(void))
  CUDADOUBLE_SYM_(log_count, size_t (*)(void))
  CUDADOUBLE_SYM_(log_get, int (*)(size_t, cudadouble_call *))
  CUDADOUBLE_SYM_(log_clear, void (*)(void))
  CUDADOUBLE_SYM_(fail, int (*)(const char *, unsigned, int))
  CUDADOUBLE_SYM_(hold_stream, int (*)(void *, int))
  CUDADOUBLE_SYM_(counts, void (*)(cudadouble_state *))
  CUDADOUBLE_SYM_(shutdown, void (*)(void))
#undef CUDADOUBLE_SYM_
  return 1;
}

#ifdef __cplusplus
}
#endif
#endif /* CUDADOUBLE_H */
