/* synth_capture.c: what expseg-replay captures for --snapshot and --report (the file name
 * starts with "synth" so that the expseg_traces library's glob picks it up): the memory
 * summary (expseg_memory_summary) printed to the report stream, and the snapshot pickle
 * (expseg_snapshot_dump) of the allocator at that moment. The replay core decides when:
 * after the event at which reserved memory first reaches its peak, found by a first pass,
 * or after the last event (--snapshot-at end). Usage: docs/replay.md. */
#include "trace.h"
#include "trace_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

int _expseg_replay_capture(expseg_allocator *a, const char *name, const capture_t *c,
                           size_t event, int end, FILE *err) {
  const char *when = end ? "the end" : "the peak of reserved memory";
  if (!end && c->report && c->out) {
    size_t need = expseg_memory_summary(a, NULL, 0, false);
    char *text = malloc(need);
    if (text == NULL) {
      fprintf(err, "expseg-replay: out of host memory for the report\n");
      return 1;
    }
    expseg_memory_summary(a, text, need, false);
    fprintf(c->out, "# %s: memory summary at %s (after event %zu)\n%s", name, when, event, text);
    free(text);
  }
  if (c->snapshot && !end == !c->at_end) {
    if (expseg_snapshot_dump(a, c->snapshot) != EXPSEG_OK) {
      fprintf(err, "expseg-replay: --snapshot: %s\n", expseg_last_error());
      return 1;
    }
    fprintf(err, "expseg-replay: %s: snapshot at %s (after event %zu) written to %s\n", name,
            when, event, c->snapshot);
  }
  return 0;
}
