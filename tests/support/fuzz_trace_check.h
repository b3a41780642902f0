/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_trace_check.h: the one check of the trace-reader fuzzers (tests/fuzz/fuzz_memtrace.c,
 * fuzz_rmm_csv.c). A reader given any input must either succeed with one trace whose rules
 * hold (ids below n_ids, streams below n_streams, the live requested bytes never above the
 * recorded peak, only the event kinds that format can give), or fail with
 * EXPSEG_ERR_INVALID_ARGUMENT, an empty set and a message starting with "NAME:" (the line).
 * Anything else aborts, which libFuzzer reports as a crash. Header-only: the fuzzers link no
 * test support library. */
#ifndef EXPSEG_FUZZ_TRACE_CHECK_H
#define EXPSEG_FUZZ_TRACE_CHECK_H

#include "trace.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* kinds: the event kinds the format may produce (NULL: any); name: the name the input was
 * read under. Frees the set on success. */
static inline void fuzz_check_trace_read(expseg_status st, expseg_trace_set_t *s,
                                         const char *name, const char *kinds) {
  if (st != EXPSEG_OK) {
    size_t n = strlen(name);
    if (st != EXPSEG_ERR_INVALID_ARGUMENT || s->n != 0 || s->traces != NULL ||
        strncmp(expseg_trace_last_error(), name, n) != 0 || expseg_trace_last_error()[n] != ':')
      abort();
    return;
  }
  if (s->n != 1) abort();
  const expseg_trace_t *t = &s->traces[0];
  uint64_t live = 0;
  for (size_t i = 0; i < t->n_events; i++) {
    const expseg_trace_event_t *e = &t->events[i];
    if (kinds != NULL && (e->kind == 0 || strchr(kinds, e->kind) == NULL)) abort();
    if ((e->kind == 'a' || e->kind == 'p' || e->kind == 'f' || e->kind == 'r') &&
        e->id >= t->n_ids)
      abort();
    if (e->stream >= t->n_streams && e->kind != 'E') abort();
    if (e->kind == 'a' || e->kind == 'p') live += e->size;
    if (e->kind == 'f') live -= e->size;
    if (live > t->peak_live_requested) abort();
  }
  expseg_trace_set_free(s);
}

#endif
