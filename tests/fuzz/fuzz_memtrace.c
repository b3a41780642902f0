/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_memtrace.c: libFuzzer target for the memtrace v1 reader (bench/replay/trace_memtrace.c).
 * Any input must give EXPSEG_OK with a trace the checker's rules hold for, or
 * EXPSEG_ERR_INVALID_ARGUMENT with a message naming the line; never a crash or a leak. */
#include "trace.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  expseg_trace_set_t s;
  expseg_status st = expseg_trace_read_memtrace("fuzz.memtrace", (const char *)data, size, &s);
  if (st == EXPSEG_OK) {
    if (s.n != 1) abort();
    const expseg_trace_t *t = &s.traces[0];
    uint64_t live = 0;
    for (size_t i = 0; i < t->n_events; i++) {
      const expseg_trace_event_t *e = &t->events[i];
      if ((e->kind == 'a' || e->kind == 'p' || e->kind == 'f' || e->kind == 'r') &&
          e->id >= t->n_ids)
        abort();
      if (e->stream >= t->n_streams && e->kind != 'E') abort();
      if (e->kind == 'a' || e->kind == 'p') live += e->size;
      if (e->kind == 'f') live -= e->size;
      if (live > t->peak_live_requested) abort();
    }
    expseg_trace_set_free(&s);
  } else if (st != EXPSEG_ERR_INVALID_ARGUMENT || s.n != 0 || s.traces != NULL ||
             strncmp(expseg_trace_last_error(), "fuzz.memtrace:", 14) != 0) {
    abort();
  }
  return 0;
}
