/* SPDX-License-Identifier: Apache-2.0 */
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
#include <string.h>
#include <time.h>

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
  if (!end && c->walk && expseg_walk(a, c->walk, NULL, c->walk_ctx) != EXPSEG_OK) {
    fprintf(err, "expseg-replay: --report: %s\n", expseg_last_error());
    return 1;
  }
  if (c->snapshot && !end == !c->at_end) {
    uint64_t t0 = _expseg_bench_now_ns();
    if (expseg_snapshot_dump(a, c->snapshot) != EXPSEG_OK) {
      fprintf(err, "expseg-replay: --snapshot: %s\n", expseg_last_error());
      return 1;
    }
    double ms = (double)(_expseg_bench_now_ns() - t0) / 1e6;
    fprintf(err, "expseg-replay: %s: snapshot at %s (after event %zu) written to %s in %.1f ms\n",
            name, when, event, c->snapshot,
            ms);
  }
  return 0;
}

static int64_t stat_of(const expseg_allocator *a, const char *key) {
  int64_t v = -1;
  return expseg_stat(a, key, &v) == EXPSEG_OK ? v : -1;
}

/* The trace name as a CSV field (RFC 4180): quoted, quotes doubled, when it holds a comma, a
 * quote or a line break (a file name may). */
static void csv_field(FILE *f, const char *s) {
  if (!s[strcspn(s, ",\"\r\n")]) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"') fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

static void timeline_row(FILE *f, const char *name, const timeline_row_t *r) {
  csv_field(f, name);
  fprintf(f, ",%zu,%" PRIu64 ",%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "\n",
          r->event, r->live, r->v[0], r->v[1], r->v[2], r->v[3], r->v[4]);
}

/* Writes the pending peak rows before `event`, in event order, each once. */
static void flush_before(timeline_t *tl, FILE *f, const char *name, size_t event) {
  timeline_row_t *a = &tl->at[0], *b = &tl->at[1];
  if (a->pending && b->pending && b->event < a->event) {
    timeline_row_t *t = a;
    a = b;
    b = t;
  }
  if (a->pending && a->event != event) timeline_row(f, name, a);
  if (b->pending && b->event != event && !(a->pending && a->event == b->event))
    timeline_row(f, name, b);
  tl->at[0].pending = tl->at[1].pending = 0;
}

void _expseg_timeline_step(timeline_t *tl, FILE *f, const char *name, const expseg_allocator *a,
                           size_t event, uint64_t live, int sample) {
  timeline_row_t r = {1, event, live,
                      {stat_of(a, "reserved_bytes.all.current"),
                       stat_of(a, "allocated_bytes.all.current"),
                       stat_of(a, "expseg.cached_physical_bytes.current"),
                       stat_of(a, "reserved_bytes.all.peak"), stat_of(a, "allocated_bytes.all.peak")}};
  if (r.v[3] > tl->rpeak) { /* the reserved peak rose here: keep this row */
    tl->rpeak = r.v[3];
    tl->at[0] = r;
  }
  if (r.v[4] > tl->apeak) {
    tl->apeak = r.v[4];
    tl->at[1] = r;
  }
  if (!sample) return;
  flush_before(tl, f, name, event);
  timeline_row(f, name, &r);
}

void _expseg_timeline_flush(timeline_t *tl, FILE *f, const char *name) {
  flush_before(tl, f, name, SIZE_MAX);
}
