/* SPDX-License-Identifier: Apache-2.0 */
/* trace_csv.c: the RMM logging_resource_adaptor CSV reader.
 *
 * Header "Thread,Time,Action,Pointer,Size,Stream", then one line per call:
 * "allocate" (-> 'a', a new dense id), "free" or "deallocate" (-> 'f' of the live
 * allocation at that pointer), "allocate failure" (-> 'O', counted in baseline.oom).
 * Pointer and Stream are hexadecimal with or without 0x; Thread and Time are not read.
 * Streams become dense indices (0 for the default stream when it occurs, the others in
 * order of first use). Allocations still live at the end stay live; the log has no 'p'. */
#include "trace_internal.h"


#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef _expseg_field_t field_t;

static field_t trim(field_t f) {
  while (f.len && (f.p[0] == ' ' || f.p[0] == '\t')) f.p++, f.len--;
  while (f.len && (f.p[f.len - 1] == ' ' || f.p[f.len - 1] == '\t')) f.len--;
  return f;
}

static bool parse_hex(field_t f, uint64_t *out) { return _expseg_field_hex(trim(f), out); }
static bool parse_dec(field_t f, uint64_t *out) { return _expseg_field_dec(trim(f), out); }
static bool is(field_t f, const char *s) { return _expseg_field_is(trim(f), s); }

typedef struct csv_s {
  const char *name;
  uint64_t line;
  char why[256];
  expseg_trace_t *t;
  _expseg_trace_check_t chk;
  _expseg_map_t live;   /* pointer -> id */
  _expseg_streams_t streams;
} csv_t;

static expseg_status fail(csv_t *c, const char *what) {
  return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s:%" PRIu64 ": %s", c->name, c->line,
                           what);
}

static expseg_status bad_field(csv_t *c, const char *what, field_t f, const char *accepted) {
  f = trim(f);
  snprintf(c->why, sizeof c->why, "%s '%.*s' is not %s", what, (int)(f.len < 40 ? f.len : 40),
           f.p, accepted);
  return fail(c, c->why);
}

static expseg_status emit(csv_t *c, uint8_t kind, uint32_t stream, uint64_t id, uint64_t size) {
  expseg_trace_event_t e = {kind, stream, id, size, 0};
  const char *why = _expseg_trace_check(&c->chk, &e, c->why, sizeof c->why);
  if (why) {
    if (why != c->why) snprintf(c->why, sizeof c->why, "%s", why);
    return fail(c, c->why);
  }
  return _expseg_trace_push(c->t, kind, stream, id, size, 0);
}

static expseg_status line(csv_t *c, const char *p, const char *end) {
  field_t f[6];
  int n = 0;
  for (const char *s = p;; ) {
    const char *comma = memchr(s, ',', (size_t)(end - s));
    const char *fe = comma ? comma : end;
    if (n == 6) {
      return fail(c, "more than 6 fields: expected Thread,Time,Action,Pointer,Size,Stream");
    }
    f[n].p = s;
    f[n].len = (size_t)(fe - s);
    n++;
    if (!comma) break;
    s = comma + 1;
  }
  if (n != 6) {
    snprintf(c->why, sizeof c->why, "%d fields, expected 6 (Thread,Time,Action,Pointer,Size,"
             "Stream)", n);
    return fail(c, c->why);
  }
  uint64_t ptr = 0, size, handle;
  bool alloc = is(f[2], "allocate"), failure = is(f[2], "allocate failure");
  bool dealloc = is(f[2], "free") || is(f[2], "deallocate");
  if (!alloc && !failure && !dealloc) {
    field_t a = trim(f[2]);
    snprintf(c->why, sizeof c->why, "unknown action '%.*s': accepted are allocate, free "
             "(or deallocate) and allocate failure", (int)(a.len < 40 ? a.len : 40), a.p);
    return fail(c, c->why);
  }
  if (!failure && !parse_hex(f[3], &ptr)) return bad_field(c, "pointer", f[3], "hexadecimal");
  if (!parse_dec(f[4], &size)) return bad_field(c, "size", f[4], "an unsigned decimal number");
  if (!parse_hex(f[5], &handle)) return bad_field(c, "stream", f[5], "hexadecimal");
  uint32_t stream = _expseg_streams_index(&c->streams, handle);
  if (stream == UINT32_MAX) return fail(c, "too many streams, or out of host memory");
  if (failure) return emit(c, 'O', stream, 0, size);
  if (alloc) {
    if (_expseg_map_get(&c->live, ptr)) {
      snprintf(c->why, sizeof c->why, "allocate returned pointer 0x%" PRIx64 ", which is "
               "already live (no free for it since it was allocated)", ptr);
      return fail(c, c->why);
    }
    uint64_t id = c->chk.n_ids;
    expseg_status s = emit(c, 'a', stream, id, size);
    if (s != EXPSEG_OK) return s;
    if (!_expseg_map_put(&c->live, ptr, id)) return fail(c, "out of host memory");
    return EXPSEG_OK;
  }
  uint64_t *id = _expseg_map_get(&c->live, ptr);
  if (!id) {
    snprintf(c->why, sizeof c->why, "free of pointer 0x%" PRIx64 ", which is not live (never "
             "allocated in this log, or already freed)", ptr);
    return fail(c, c->why);
  }
  expseg_status s = emit(c, 'f', stream, *id, size);
  if (s != EXPSEG_OK) return s;
  _expseg_map_take(&c->live, ptr, NULL);
  return EXPSEG_OK;
}

expseg_status expseg_trace_read_rmm_csv(const char *name, const char *buf, size_t len,
                                        expseg_trace_set_t *out) {
  if (!out) return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "RMM log read: out is NULL");
  out->traces = NULL;
  out->n = 0;
  if (!name) name = "rmm_log";
  if (!buf && len)
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: buffer is NULL", name);
  if (!buf) buf = "";
  csv_t c;
  memset(&c, 0, sizeof c);
  c.name = name;
  c.t = calloc(1, sizeof *c.t);
  if (!c.t) return _expseg_trace_error(EXPSEG_ERR_OUT_OF_MEMORY, "%s: out of host memory", name);
  _expseg_trace_set_name(c.t, name, NULL);
  expseg_status s = EXPSEG_OK;
  const char *p = buf, *end = buf + len;
  while (p < end && s == EXPSEG_OK) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *le = nl ? nl : end;
    if (le > p && le[-1] == '\r') le--;
    c.line++;
    if (memchr(p, '\0', (size_t)(le - p))) {
      s = fail(&c, "NUL byte in a text line");
    } else if (c.line == 1) {
      static const char hdr[] = "Thread,Time,Action,Pointer,Size,Stream";
      if ((size_t)(le - p) != sizeof hdr - 1 || memcmp(p, hdr, sizeof hdr - 1) != 0)
        s = fail(&c, "the first line must be the header 'Thread,Time,Action,Pointer,Size,"
                     "Stream'");
    } else if (le > p) {
      s = line(&c, p, le);
    }
    p = nl ? nl + 1 : end;
  }
  if (s == EXPSEG_OK && c.line == 0)
    s = fail(&c, "empty file: the first line must be the header 'Thread,Time,Action,Pointer,"
                 "Size,Stream'");
  if (s == EXPSEG_OK) {
    _expseg_streams_finish(&c.streams, c.t);
    c.t->n_ids = c.chk.n_ids;
    c.t->peak_live_requested = c.chk.peak;
    c.t->baseline.oom = c.chk.counts[4];
    out->traces = c.t;
    out->n = 1;
  } else {
    expseg_trace_free(c.t);
    free(c.t);
  }
  _expseg_trace_check_free(&c.chk);
  _expseg_map_free(&c.live);
  _expseg_streams_free(&c.streams);
  return s;
}
