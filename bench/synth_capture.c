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

static int64_t stat_of(const expseg_allocator *a, const char *key) {
  int64_t v = -1;
  return expseg_stat(a, key, &v) == EXPSEG_OK ? v : -1;
}

static void timeline_row(FILE *f, const char *name, size_t event, uint64_t live,
                         const int64_t v[6]) {
  fprintf(f, "%s,%zu,%" PRIu64 ",%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "\n",
          name, event, live, v[0], v[1], v[2], v[3], v[4]);
}

void _expseg_timeline_step(timeline_t *tl, FILE *f, const char *name, const expseg_allocator *a,
                           size_t event, uint64_t live, int sample) {
  int64_t v[6] = {stat_of(a, "reserved_bytes.all.current"),
                  stat_of(a, "allocated_bytes.all.current"),
                  stat_of(a, "expseg.cached_physical_bytes.current"),
                  stat_of(a, "reserved_bytes.all.peak"), stat_of(a, "allocated_bytes.all.peak"), 0};
  if (v[3] > tl->rpeak || v[4] > tl->apeak) { /* a peak rose here: keep this row */
    tl->rpeak = v[3];
    tl->apeak = v[4];
    tl->pending = 1;
    tl->pend_event = event;
    tl->pend_live = live;
    for (int i = 0; i < 6; i++) tl->pend[i] = v[i];
  }
  if (!sample) return;
  if (tl->pending && tl->pend_event != event) timeline_row(f, name, tl->pend_event, tl->pend_live, tl->pend);
  tl->pending = 0;
  timeline_row(f, name, event, live, v);
}

void _expseg_timeline_flush(timeline_t *tl, FILE *f, const char *name) {
  if (tl->pending) timeline_row(f, name, tl->pend_event, tl->pend_live, tl->pend);
  tl->pending = 0;
}
