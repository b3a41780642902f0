/* SPDX-License-Identifier: Apache-2.0 */
/* trace_memtrace.c: the memtrace v1 reader.
 *
 * One event per line ("p S ID SIZE", "a ...", "f ...", "r ...", "E", "M S ADDR SIZE", "X",
 * "m", "u", "O S - SIZE device_free=N"), '#' comments, first line "# memtrace v1". Two
 * comments carry data: "# pytorch: key=value ..." (the recorded allocator's figures: the
 * baseline) and "# stats: prelive=N peak_live_requested=N" (checked against the events);
 * "# source: NAME device=N" gives the device. Without a "# pytorch:" line, baseline.oom
 * counts the 'O' lines (as the RMM CSV reader does), so a CSV trace written as memtrace
 * reads back the same. Every event goes through the shared checker,
 * so a file is rejected at the first line that breaks a rule, with the line number. */
#include "trace_internal.h"


#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct reader_s {
  const char *name;    /* for messages */
  uint64_t line;       /* 1-based */
  char why[256];
} reader_t;

static expseg_status fail(reader_t *r, const char *what) {
  return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s:%" PRIu64 ": %s", r->name, r->line,
                           what);
}

/* Splits [p, end) into at most max fields separated by spaces or tabs. Returns the number of
 * fields, or max + 1 when there are more. */
typedef _expseg_field_t field_t;

static int split(const char *p, const char *end, field_t *f, int max) {
  int n = 0;
  while (p < end) {
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    if (p == end) break;
    const char *s = p;
    while (p < end && *p != ' ' && *p != '\t') p++;
    if (n == max) return max + 1;
    f[n].p = s;
    f[n].len = (size_t)(p - s);
    n++;
  }
  return n;
}

/* Unsigned decimal (or hexadecimal with 0x when hex_ok); false on anything else or overflow. */
static bool parse_u64(field_t f, bool hex_ok, uint64_t *out) {
  if (hex_ok && f.len > 2 && f.p[0] == '0' && (f.p[1] == 'x' || f.p[1] == 'X'))
    return _expseg_field_hex(f, out);
  return _expseg_field_dec(f, out);
}

static bool field_is(field_t f, const char *s) { return _expseg_field_is(f, s); }

static expseg_status bad_number(reader_t *r, const char *what_in, field_t f) {
  char what[128];
  snprintf(what, sizeof what, "%s", what_in);  /* what_in may be r->why */
  snprintf(r->why, sizeof r->why, "%s '%.*s' is not an unsigned decimal number%s", what,
           (int)(f.len < 40 ? f.len : 40), f.p,
           strcmp(what, "address") == 0 ? " or 0x-prefixed hexadecimal" : "");
  return fail(r, r->why);
}

/* "key=value key=value ..." with the keys in keys[] (each exactly once) -> vals[]. */
static expseg_status parse_pairs(reader_t *r, const char *p, const char *end,
                                 const char *const *keys, int nkeys, uint64_t *vals,
                                 const char *what) {
  field_t f[16];
  int n = split(p, end, f, 16);
  uint32_t seen = 0;
  if (n > 16) n = 16;
  for (int i = 0; i < n; i++) {
    const char *eq = memchr(f[i].p, '=', f[i].len);
    int k = -1;
    if (eq) {
      field_t key = {f[i].p, (size_t)(eq - f[i].p)};
      for (int j = 0; j < nkeys; j++)
        if (field_is(key, keys[j])) k = j;
    }
    if (k < 0) {
      snprintf(r->why, sizeof r->why, "'# %s' line: unknown item '%.*s'", what,
               (int)(f[i].len < 40 ? f[i].len : 40), f[i].p);
      return fail(r, r->why);
    }
    field_t v = {eq + 1, f[i].len - (size_t)(eq + 1 - f[i].p)};
    if (seen & (1u << k)) {
      snprintf(r->why, sizeof r->why, "'# %s' line: %s given twice", what, keys[k]);
      return fail(r, r->why);
    }
    if (!parse_u64(v, false, &vals[k])) {
      snprintf(r->why, sizeof r->why, "'# %s' line: %s", what, keys[k]);
      return bad_number(r, r->why, v);
    }
    seen |= 1u << k;
  }
  for (int j = 0; j < nkeys; j++) {
    if (!(seen & (1u << j))) {
      snprintf(r->why, sizeof r->why, "'# %s' line: %s is missing", what, keys[j]);
      return fail(r, r->why);
    }
  }
  return EXPSEG_OK;
}

static expseg_status comment(reader_t *r, const char *p, const char *end, expseg_trace_t *t,
                             uint64_t stats[2], bool *have_stats, uint64_t *stats_line) {
  static const char *const pytorch_keys[] = {"start_reserved", "peak_reserved", "end_reserved",
                                             "segment_alloc", "segment_free", "map", "unmap",
                                             "oom"};
  static const char *const stats_keys[] = {"prelive", "peak_live_requested"};
  p++;  /* '#' */
  while (p < end && *p == ' ') p++;
  size_t len = (size_t)(end - p);
  if (len >= 8 && memcmp(p, "pytorch:", 8) == 0) {
    uint64_t v[8];
    expseg_status s = parse_pairs(r, p + 8, end, pytorch_keys, 8, v, "pytorch:");
    if (s != EXPSEG_OK) return s;
    expseg_trace_baseline_t *b = &t->baseline;
    b->present = 1;
    b->start_reserved = v[0];
    b->peak_reserved = v[1];
    b->end_reserved = v[2];
    b->segment_alloc = v[3];
    b->segment_free = v[4];
    b->map = v[5];
    b->unmap = v[6];
    b->oom = v[7];
  } else if (len >= 6 && memcmp(p, "stats:", 6) == 0) {
    expseg_status s = parse_pairs(r, p + 6, end, stats_keys, 2, stats, "stats:");
    if (s != EXPSEG_OK) return s;
    *have_stats = true;
    *stats_line = r->line;
  } else if (len >= 7 && memcmp(p, "source:", 7) == 0) {
    /* "# source: NAME device=N": the device, when it is given */
    field_t f[4];
    int n = split(p + 7, end, f, 4);
    for (int i = 0; i < n && i < 4; i++) {
      uint64_t d;
      if (f[i].len > 7 && memcmp(f[i].p, "device=", 7) == 0) {
        field_t v = {f[i].p + 7, f[i].len - 7};
        if (!parse_u64(v, false, &d) || d > 1u << 20) return bad_number(r, "device", v);
        t->device = (int)d;
      }
    }
  }
  return EXPSEG_OK;
}

static expseg_status event_line(reader_t *r, const char *p, const char *end, expseg_trace_t *t,
                                _expseg_trace_check_t *chk) {
  field_t f[6];
  int n = split(p, end, f, 5);
  expseg_trace_event_t e;
  memset(&e, 0, sizeof e);
  if (f[0].len != 1 || !strchr("pafrEMXmuO", f[0].p[0])) {
    snprintf(r->why, sizeof r->why, "unknown line kind '%.*s': accepted are p a f r E M X m u O "
             "and # comments", (int)(f[0].len < 20 ? f[0].len : 20), f[0].p);
    return fail(r, r->why);
  }
  e.kind = (uint8_t)f[0].p[0];
  int want = e.kind == 'E' ? 1 : e.kind == 'O' ? 5 : 4;
  if (n != want) {
    snprintf(r->why, sizeof r->why, "'%c' line has %s%d fields, expected %d%s", e.kind,
             n > want ? "more than " : "", n > want ? want : n, want,
             e.kind == 'O' ? " (O S - SIZE device_free=N)"
             : e.kind == 'E' ? "" : " (KIND STREAM ID SIZE)");
    return fail(r, r->why);
  }
  if (e.kind != 'E') {
    uint64_t s;
    if (!parse_u64(f[1], false, &s)) return bad_number(r, "stream", f[1]);
    if (s >= EXPSEG_TRACE_MAX_STREAMS) {
      snprintf(r->why, sizeof r->why, "stream %" PRIu64 " is above the %" PRIu32 " accepted", s,
               EXPSEG_TRACE_MAX_STREAMS - 1);
      return fail(r, r->why);
    }
    e.stream = (uint32_t)s;
    bool addr = strchr("MXmu", e.kind) != NULL;
    if (e.kind == 'O') {
      if (!field_is(f[2], "-")) {
        snprintf(r->why, sizeof r->why, "'O' line: third field must be '-', got '%.*s'",
                 (int)(f[2].len < 40 ? f[2].len : 40), f[2].p);
        return fail(r, r->why);
      }
      field_t df = f[4];
      if (df.len < 12 || memcmp(df.p, "device_free=", 12) != 0) {
        snprintf(r->why, sizeof r->why, "'O' line: last field must be device_free=N, got "
                 "'%.*s'", (int)(df.len < 40 ? df.len : 40), df.p);
        return fail(r, r->why);
      }
      field_t v = {df.p + 12, df.len - 12};
      if (!parse_u64(v, false, &e.extra)) return bad_number(r, "device_free", v);
    } else if (!parse_u64(f[2], addr, &e.id)) {
      return bad_number(r, addr ? "address" : "id", f[2]);
    }
    if (!parse_u64(f[3], false, &e.size)) return bad_number(r, "size", f[3]);
  }
  const char *why = _expseg_trace_check(chk, &e, r->why, sizeof r->why);
  if (why) {
    if (why != r->why) snprintf(r->why, sizeof r->why, "%s", why);
    return fail(r, r->why);
  }
  return _expseg_trace_push(t, e.kind, e.stream, e.id, e.size, e.extra);
}

expseg_status expseg_trace_read_memtrace(const char *name, const char *buf, size_t len,
                                         expseg_trace_set_t *out) {
  if (!out) return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "memtrace read: out is NULL");
  out->traces = NULL;
  out->n = 0;
  if (!name) name = "memtrace";
  if (!buf && len)
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: buffer is NULL", name);
  if (!buf) buf = "";
  reader_t r = {name, 0, {0}};
  expseg_trace_t *t = calloc(1, sizeof *t);
  if (!t) return _expseg_trace_error(EXPSEG_ERR_OUT_OF_MEMORY, "%s: out of host memory", name);
  _expseg_trace_set_name(t, name, NULL);
  _expseg_trace_check_t chk;
  memset(&chk, 0, sizeof chk);
  uint64_t stats[2] = {0, 0}, stats_line = 0;
  bool have_stats = false;
  expseg_status s = EXPSEG_OK;
  const char *p = buf, *end = buf + len;
  while (p < end && s == EXPSEG_OK) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *le = nl ? nl : end;
    r.line++;
    size_t ll = (size_t)(le - p);
    if (ll && p[ll - 1] == '\r') ll--;
    const char *lend = p + ll;
    if (r.line == 1) {
      static const char magic[] = "# memtrace v1";
      if ((size_t)(lend - p) != sizeof magic - 1 || memcmp(p, magic, sizeof magic - 1) != 0)
        s = fail(&r, "the first line must be '# memtrace v1'");
    } else if (memchr(p, '\0', ll)) {
      s = fail(&r, "NUL byte in a text line");
    } else if (lend > p && *p == '#') {
      s = comment(&r, p, lend, t, stats, &have_stats, &stats_line);
    } else {
      const char *q = p;
      while (q < lend && (*q == ' ' || *q == '\t')) q++;
      if (q < lend) s = event_line(&r, q, lend, t, &chk);
    }
    p = nl ? nl + 1 : end;
  }
  if (s == EXPSEG_OK && r.line == 0) s = fail(&r, "empty file: the first line must be "
                                                  "'# memtrace v1'");
  if (s == EXPSEG_OK && have_stats && (stats[0] != chk.n_prelive || stats[1] != chk.peak)) {
    r.line = stats_line;
    snprintf(r.why, sizeof r.why, "'# stats:' line says prelive=%" PRIu64 " peak_live_requested="
             "%" PRIu64 ", but the events give %" PRIu64 " and %" PRIu64 " (file cut or edited? "
             "delete that line to read it anyway)", stats[0], stats[1], chk.n_prelive, chk.peak);
    s = fail(&r, r.why);
  }
  if (s == EXPSEG_OK) s = _expseg_trace_mark_empty_cache(t);
  if (s == EXPSEG_OK) {
    /* the recorded run's setting, as far as the file tells: maps mean expandable segments */
    if (t->baseline.present)
      snprintf(t->recorded_conf, sizeof t->recorded_conf, "expandable_segments:%s",
               chk.counts[2] + chk.counts[3] ? "True" : "False");
    else  /* no recorded figures: the OOMs are the 'O' lines, as for an RMM log */
      t->baseline.oom = chk.counts[4];
    t->n_ids = chk.n_ids;
    t->n_streams = chk.n_streams;
    t->peak_live_requested = chk.peak;
    out->traces = t;
    out->n = 1;
  } else {
    expseg_trace_free(t);
    free(t);
  }
  _expseg_trace_check_free(&chk);
  return s;
}
