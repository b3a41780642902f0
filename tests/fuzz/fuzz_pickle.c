/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_pickle.c: libFuzzer target for the snapshot unpickler and the device-history
 * extraction (bench/pickle.c, bench/trace_pickle.c): any input gives traces or an error
 * naming the byte offset; never a crash, a leak, or memory far beyond the input's size. */
#include "trace.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  expseg_trace_set_t s;
  expseg_status st = expseg_trace_read_pickle("fuzz.pickle", data, size, &s);
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
