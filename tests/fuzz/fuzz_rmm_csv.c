/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_rmm_csv.c: libFuzzer target for the RMM logging_resource_adaptor CSV reader
 * (bench/replay/trace_csv.c): any input gives a well-formed trace or an error naming the line. */
#include "trace.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  expseg_trace_set_t s;
  expseg_status st = expseg_trace_read_rmm_csv("fuzz.csv", (const char *)data, size, &s);
  if (st == EXPSEG_OK) {
    if (s.n != 1) abort();
    const expseg_trace_t *t = &s.traces[0];
    uint64_t live = 0;
    for (size_t i = 0; i < t->n_events; i++) {
      const expseg_trace_event_t *e = &t->events[i];
      if (e->kind != 'a' && e->kind != 'f' && e->kind != 'O') abort();
      if (e->stream >= t->n_streams) abort();
      if (e->kind == 'a') live += e->size;
      if (e->kind == 'f') live -= e->size;
      if (live > t->peak_live_requested) abort();
    }
    expseg_trace_set_free(&s);
  } else if (st != EXPSEG_ERR_INVALID_ARGUMENT || s.n != 0 ||
             strncmp(expseg_trace_last_error(), "fuzz.csv:", 9) != 0) {
    abort();
  }
  return 0;
}
