/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_pickle.c: libFuzzer target for the snapshot unpickler and the device-history
 * extraction (bench/replay/pickle.c, bench/replay/trace_pickle.c): any input gives traces or an error
 * naming the byte offset; never a crash, a leak, or memory far beyond the input's size;
 * and never time beyond linear in the input.
 *
 * The time limit is per input and proportional to its size: CPU time of this thread (not
 * wall time, so a loaded machine does not trip it) above 50 us per byte + 50 ms aborts.
 * Why these numbers: the reader costs 0.05-0.5 us per byte in a Release build
 * (expseg-bench-pickle, docs/benchmarks.md) and a fuzzing build (ASan, UBSan, coverage) is
 * 10-30 times slower, so 50 us per byte leaves about ten times headroom; 50 ms covers the
 * fixed costs of a small input (up to EXPSEG_PICKLE_MAX_DEVICES traces, each with its own
 * tables). A quadratic reader misses it by orders of magnitude as inputs grow: the crafted
 * shapes of bench/replay/pickle_craft.c (the seeds wide_*, shared_*, devices_*, memo_* in
 * corpus/pickle) took seconds at 80-350 KB. An input over the bound is read a second time, and
 * only a second read over it aborts. libFuzzer's own -timeout stays the backstop. */
#include "trace.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define US_PER_BYTE 50.0
#define FIXED_MS 50.0

static double cpu_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  expseg_trace_set_t s;
  const double limit = FIXED_MS + US_PER_BYTE * 1e-3 * (double)size;
  double t0 = cpu_ms();
  expseg_status st = expseg_trace_read_pickle("fuzz.pickle", data, size, &s);
  double took = cpu_ms() - t0;
  if (took > limit) {
    /* once more before calling it a bound broken: a read that is slow by its shape is slow
     * every time, where a stall of the machine (page faults under memory pressure from
     * other processes, counted in this thread's CPU time) does not repeat */
    if (st == EXPSEG_OK) expseg_trace_set_free(&s);
    t0 = cpu_ms();
    st = expseg_trace_read_pickle("fuzz.pickle", data, size, &s);
    took = cpu_ms() - t0;
  }
  if (took > limit) {
    fprintf(stderr, "fuzz_pickle: %zu bytes read in %.1f ms of CPU, above the linear bound "
                    "of %.1f ms (%.0f us per byte + %.0f ms)\n",
            size, took, limit, US_PER_BYTE, FIXED_MS);
    abort();
  }
  if (st == EXPSEG_OK) {
    if (s.n == 0) abort();
    for (size_t k = 0; k < s.n; k++) {
      const expseg_trace_t *t = &s.traces[k];
      for (size_t i = 0; i < t->n_events; i++)
        if (t->events[i].stream >= t->n_streams) abort();
      /* the start state: segments in address order, on known streams; addresses of ids */
      for (size_t i = 0; i < t->n_start_segs; i++)
        if ((i && t->start_segs[i].addr <= t->start_segs[i - 1].addr) ||
            t->start_segs[i].stream >= t->n_streams)
          abort();
      if (t->n_start_addr > t->n_ids) abort();
    }
    expseg_trace_set_free(&s);
  } else if (st == EXPSEG_ERR_OUT_OF_MEMORY) {
    if (s.n != 0) abort();
  } else if (st != EXPSEG_ERR_INVALID_ARGUMENT || s.n != 0 ||
             strncmp(expseg_trace_last_error(), "fuzz.pickle: byte ", 18) != 0) {
    abort();
  }
  return 0;
}
