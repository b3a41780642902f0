/* SPDX-License-Identifier: Apache-2.0 */
/* trace.c: what every trace reader shares, and the entry points that are not one format's.
 *
 * Readers build an expseg_trace_t with _expseg_trace_push and pass every event through the
 * checker (_expseg_trace_check), which owns the rules of a well-formed trace and computes
 * peak_live_requested; the rules are in docs/formats.md. expseg_trace_read_file opens only
 * regular files (without blocking on a FIFO), picks the reader by the first bytes and only
 * then reads the whole file; expseg_trace_write_memtrace writes
 * memtrace v1 in the layout of the reference files in ../shared/traces/memtrace. */
#include "clock.h"
#include "dec.h"
#include "trace_internal.h"


#include <errno.h>
#include <time.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- checker */

enum { ID_LIVE = 1, ID_REQUESTED = 2, ID_FREED = 3 };

void _expseg_trace_check_free(_expseg_trace_check_t *c) {
  free(c->size);
  free(c->state);
  memset(c, 0, sizeof *c);
}

static const char *check_new_id(_expseg_trace_check_t *c, const expseg_trace_event_t *e,
                                char *why, size_t why_len) {
  if (e->id != c->n_ids) {
    snprintf(why, why_len, "id %" PRIu64 " is not the next new id (%" PRIu64 "): ids are dense "
             "from 0 in order of allocation", e->id, c->n_ids);
    return why;
  }
  if (c->n_ids == c->cap) {
    uint64_t cap = c->cap ? c->cap * 2 : 1024;
    uint64_t *s = realloc(c->size, cap * sizeof *s);
    if (s) c->size = s;
    uint8_t *st = s ? realloc(c->state, cap) : NULL;
    if (!st) return "out of host memory";
    c->state = st;
    c->cap = cap;
  }
  c->size[c->n_ids] = e->size;
  c->state[c->n_ids] = ID_LIVE;
  c->n_ids++;
  c->live += e->size;
  if (c->live > c->peak) c->peak = c->live;
  return NULL;
}

static const char *check_free(_expseg_trace_check_t *c, const expseg_trace_event_t *e,
                              char *why, size_t why_len) {
  const char *what = e->kind == 'f' ? "free" : "free request";
  if (e->id >= c->n_ids) {
    snprintf(why, why_len, "%s of id %" PRIu64 ", which was never allocated (ids so far: 0..%"
             PRId64 ")", what, e->id, (int64_t)c->n_ids - 1);
    return why;
  }
  uint8_t st = c->state[e->id];
  if (st == ID_FREED || (st == ID_REQUESTED && e->kind == 'r')) {
    snprintf(why, why_len, "%s of id %" PRIu64 ", which is already %s", what, e->id,
             st == ID_FREED ? "free" : "awaiting its free");
    return why;
  }
  if (e->size != c->size[e->id]) {
    snprintf(why, why_len, "%s of id %" PRIu64 " with size %" PRIu64 ", but it was allocated "
             "with size %" PRIu64, what, e->id, e->size, c->size[e->id]);
    return why;
  }
  if (e->kind == 'r') {
    c->state[e->id] = ID_REQUESTED;
  } else {
    c->state[e->id] = ID_FREED;
    c->live -= e->size;
  }
  return NULL;
}

const char *_expseg_trace_check(_expseg_trace_check_t *c, const expseg_trace_event_t *e,
                                char *why, size_t why_len) {
  static const char baseline_kinds[] = "MXmuO";
  const char *b = e->kind ? strchr(baseline_kinds, e->kind) : NULL;
  /* streams: 0 may appear at any time; any other index is a known one or the next new one */
  uint32_t lim = c->n_streams ? c->n_streams : 1;
  if (e->stream > lim || e->stream >= EXPSEG_TRACE_MAX_STREAMS) {
    snprintf(why, why_len, "stream %" PRIu32 " skips stream %" PRIu32 ": streams are numbered "
             "densely in order of first use", e->stream, lim);
    return why;
  }
  if (e->size > EXPSEG_TRACE_MAX_SIZE) {
    snprintf(why, why_len, "size %" PRIu64 " is above the 2^50 bytes accepted", e->size);
    return why;
  }
  const char *r = NULL;
  switch (e->kind) {
  case 'p':
    if (c->seen_event) return "'p' (live at start) after the first event: 'p' lines come first";
    r = check_new_id(c, e, why, why_len);
    if (!r) c->n_prelive++;
    break;
  case 'a':
    c->seen_event = true;
    r = check_new_id(c, e, why, why_len);
    break;
  case 'f':
  case 'r':
    c->seen_event = true;
    r = check_free(c, e, why, why_len);
    break;
  case 'E':
    c->seen_event = true;
    break;
  default:
    if (!b) {
      snprintf(why, why_len, "unknown event kind 0x%02x", e->kind);
      return why;
    }
    c->seen_event = true;
    c->counts[b - baseline_kinds]++;
    break;
  }
  if (r) return r;
  if (e->stream >= c->n_streams) c->n_streams = e->stream + 1;
  return NULL;
}

/* ---------------------------------------------------------------- building */

expseg_status _expseg_trace_push(expseg_trace_t *t, uint8_t kind, uint32_t stream, uint64_t id,
                                 uint64_t size, uint64_t extra) {
  if (t->n_events == t->cap_events) {
    size_t cap = t->cap_events ? t->cap_events * 2 : 64; /* a snapshot may give 1024 */
    expseg_trace_event_t *ev = realloc(t->events, cap * sizeof *ev);
    if (!ev)
      return _expseg_trace_error(EXPSEG_ERR_OUT_OF_MEMORY, "%s: out of host memory for %zu trace "
                               "events", t->name, cap);
    t->events = ev;
    t->cap_events = cap;
  }
  expseg_trace_event_t *e = &t->events[t->n_events++];
  memset(e, 0, sizeof *e);
  e->kind = kind;
  e->stream = stream;
  e->id = id;
  e->size = size;
  e->extra = extra;
  return EXPSEG_OK;
}

/* Event i starts a run of recorded releases that is not the out-of-memory path's. */
static bool starts_empty_cache(const expseg_trace_t *t, size_t i) {
  uint8_t k = t->events[i].kind, prev = i ? t->events[i - 1].kind : 0;
  return (k == EXPSEG_TR_SEG_FREE || k == EXPSEG_TR_UNMAP) && prev != EXPSEG_TR_SEG_FREE &&
         prev != EXPSEG_TR_UNMAP && prev != EXPSEG_TR_OOM && prev != EXPSEG_TR_EMPTY;
}

expseg_status _expseg_trace_mark_empty_cache(expseg_trace_t *t) {
  size_t runs = 0;
  for (size_t i = 0; i < t->n_events; i++) runs += starts_empty_cache(t, i);
  if (!runs) return EXPSEG_OK;
  expseg_trace_event_t *ev = malloc((t->n_events + runs) * sizeof *ev);
  if (!ev)
    return _expseg_trace_error(EXPSEG_ERR_OUT_OF_MEMORY, "%s: out of host memory for %zu trace "
                             "events", t->name, t->n_events + runs);
  size_t k = 0;
  for (size_t i = 0; i < t->n_events; i++) {
    if (starts_empty_cache(t, i)) {
      memset(&ev[k], 0, sizeof ev[k]);
      ev[k++].kind = EXPSEG_TR_EMPTY;
    }
    ev[k++] = t->events[i];
  }
  free(t->events);
  t->events = ev;
  t->n_events = t->cap_events = k;
  return EXPSEG_OK;
}

void _expseg_trace_set_name(expseg_trace_t *t, const char *name, const char *suffix) {
  const char *base = name ? strrchr(name, '/') : NULL;
  base = base ? base + 1 : (name ? name : "trace");
  size_t len = strlen(base);
  const char *dot = strrchr(base, '.');
  if (dot && dot != base) len = (size_t)(dot - base);
  snprintf(t->name, sizeof t->name, "%.*s%s", (int)(len < 200 ? len : 200), base,
           suffix ? suffix : "");
}

uint32_t _expseg_streams_index(_expseg_streams_t *s, uint64_t handle) {
  uint64_t *v = _expseg_map_get(&s->map, handle);
  if (v) return (uint32_t)*v;
  if (s->n >= EXPSEG_TRACE_MAX_STREAMS || !_expseg_map_put(&s->map, handle, s->n))
    return UINT32_MAX;
  return s->n++;
}

uint32_t _expseg_streams_final(const _expseg_streams_t *s, uint32_t p) {
  uint64_t *z = _expseg_map_get(&s->map, 0);
  if (!z || *z == 0) return p;
  uint32_t zi = (uint32_t)*z;
  return p == zi ? 0 : (p < zi ? p + 1 : p);
}

void _expseg_streams_finish(_expseg_streams_t *s, expseg_trace_t *t) {
  for (size_t i = 0; i < t->n_events; i++)
    t->events[i].stream = _expseg_streams_final(s, t->events[i].stream);
  for (size_t i = 0; i < t->n_start_segs; i++)
    t->start_segs[i].stream = _expseg_streams_final(s, t->start_segs[i].stream);
  t->n_streams = s->n;
}

void _expseg_streams_free(_expseg_streams_t *s) {
  _expseg_map_free(&s->map);
  s->n = 0;
}

/* ---------------------------------------------------------------- public */

void expseg_trace_free(expseg_trace_t *t) {
  if (!t) return;
  free(t->events);
  t->events = NULL;
  t->n_events = t->cap_events = 0;
  free(t->start_segs);
  t->start_segs = NULL;
  t->n_start_segs = 0;
  free(t->start_addr);
  t->start_addr = NULL;
  t->n_start_addr = 0;
  free(t->frame_start);
  free(t->frames);
  free(t->frame_text);
  t->frame_start = NULL;
  t->frames = NULL;
  t->frame_text = NULL;
  t->n_frames = t->frame_text_len = 0;
}

size_t expseg_trace_frames_of(const expseg_trace_t *t, uint64_t id, expseg_frame *out,
                              size_t max) {
  if (!t || !t->frame_start || id >= t->n_ids) return 0;
  uint64_t b = t->frame_start[id], e = t->frame_start[id + 1];
  size_t n = e - b < max ? (size_t)(e - b) : max;
  for (size_t k = 0; k < n; k++) { /* innermost first in the trace: reversed */
    const expseg_trace_frame_t *f = &t->frames[b + n - 1 - k];
    out[k].filename = t->frame_text + f->filename;
    out[k].name = t->frame_text + f->name;
    out[k].line = f->line;
  }
  return n;
}

void expseg_trace_set_free(expseg_trace_set_t *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n; i++) expseg_trace_free(&s->traces[i]);
  free(s->traces);
  s->traces = NULL;
  s->n = 0;
}

/* Reads up to n bytes at the file position, retrying short reads and EINTR; returns the
 * count read (< n at end of file) or -1 with errno set. */
static ssize_t read_full(int fd, unsigned char *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

typedef enum { FMT_UNKNOWN, FMT_PICKLE, FMT_MEMTRACE, FMT_CSV } trace_format_t;

static const char memtrace_magic[] = "# memtrace v1";
static const char csv_magic[] = "Thread,Time,Action,Pointer,Size,Stream";

/* The format of a file from its first bytes (head: up to sizeof csv_magic of them). */
static trace_format_t detect_format(const unsigned char *head, size_t n) {
  if (n > 0 && head[0] == 0x80) return FMT_PICKLE;
  if (n >= sizeof memtrace_magic - 1 && memcmp(head, memtrace_magic, sizeof memtrace_magic - 1) == 0)
    return FMT_MEMTRACE;
  if (n >= sizeof csv_magic - 1 && memcmp(head, csv_magic, sizeof csv_magic - 1) == 0)
    return FMT_CSV;
  return FMT_UNKNOWN;
}

/* Opens path without blocking (a FIFO or a device would block or never end) and accepts
 * only a regular file; the descriptor is blocking again on success. */
static expseg_status open_regular(const char *path, int *fd_out, size_t *len) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: cannot open the trace: %s", path,
                             strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: cannot stat the trace: %s", path,
                             strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    const char *what = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO"
                     : S_ISCHR(st.st_mode) ? "a character device" : S_ISSOCK(st.st_mode) ? "a socket"
                     : S_ISBLK(st.st_mode) ? "a block device" : "not a regular file";
    close(fd);
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: is %s; a trace must be a regular "
                             "file (memtrace v1, RMM CSV or a PyTorch snapshot pickle), not a "
                             "pipe, FIFO, device or directory", path, what);
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    int e = errno;
    close(fd);
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: fcntl failed: %s", path,
                             strerror(e));
  }
  if ((uint64_t)st.st_size > SIZE_MAX) {
    close(fd);
    return _expseg_trace_error(EXPSEG_ERR_OUT_OF_MEMORY, "%s: %lld bytes do not fit in memory",
                             path, (long long)st.st_size);
  }
  *fd_out = fd;
  *len = (size_t)st.st_size;
  return EXPSEG_OK;
}

expseg_status expseg_trace_read_file(const char *path, expseg_trace_set_t *out) {
  if (!out) return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "trace read: out is NULL");
  out->traces = NULL;
  out->n = 0;
  if (!path) return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "trace read: path is NULL");
  int fd = -1;
  size_t len = 0;
  expseg_status s = open_regular(path, &fd, &len);
  if (s) return s;
  /* The format is known from the first bytes: anything else is refused before the rest of
   * a possibly huge file is read. */
  unsigned char head[sizeof csv_magic];
  ssize_t hn = read_full(fd, head, len < sizeof head ? len : sizeof head);
  trace_format_t fmt = hn < 0 ? FMT_UNKNOWN : detect_format(head, (size_t)hn);
  if (hn < 0 || fmt == FMT_UNKNOWN) {
    int e = errno;
    close(fd);
    if (hn < 0)
      return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: cannot read the trace: %s",
                               path, strerror(e));
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: unknown trace format (%zu bytes): "
                             "accepted are a PyTorch snapshot pickle (first byte 0x80), memtrace "
                             "v1 (first line '%s') and an RMM log (header '%s')", path, len,
                             memtrace_magic, csv_magic);
  }
  unsigned char *buf = malloc(len ? len : 1);
  if (!buf) {
    close(fd);
    return _expseg_trace_error(EXPSEG_ERR_OUT_OF_MEMORY, "%s: out of host memory reading %zu "
                             "bytes", path, len);
  }
  memcpy(buf, head, (size_t)hn);
  ssize_t rest = read_full(fd, buf + hn, len - (size_t)hn);
  size_t got = (size_t)hn + (rest > 0 ? (size_t)rest : 0);
  close(fd);
  if (rest < 0 || got != len) {
    free(buf);
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: read %zu of %zu bytes (the file "
                             "is unreadable or changed while read)", path, got, len);
  }
  if (fmt == FMT_PICKLE) s = expseg_trace_read_pickle(path, buf, len, out);
  else if (fmt == FMT_MEMTRACE) s = expseg_trace_read_memtrace(path, (const char *)buf, len, out);
  else s = expseg_trace_read_rmm_csv(path, (const char *)buf, len, out);
  free(buf);
  return s;
}

expseg_status expseg_trace_write_memtrace(const expseg_trace_t *t, const char *path) {
  if (!t || !path)
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "trace write: %s is NULL",
                             t ? "path" : "trace");
  FILE *f = fopen(path, "w");
  if (!f)
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: cannot create: %s", path,
                             strerror(errno));
  uint64_t prelive = 0;
  for (size_t i = 0; i < t->n_events && t->events[i].kind == 'p'; i++) prelive++;
  fprintf(f, "# memtrace v1\n# source: %s device=%d\n", t->name, t->device);
  const expseg_trace_baseline_t *b = &t->baseline;
  if (b->present)
    fprintf(f, "# pytorch: start_reserved=%" PRIu64 " peak_reserved=%" PRIu64 " end_reserved=%"
            PRIu64 " segment_alloc=%" PRIu64 " segment_free=%" PRIu64 " map=%" PRIu64 " unmap=%"
            PRIu64 " oom=%" PRIu64 "\n", b->start_reserved, b->peak_reserved, b->end_reserved,
            b->segment_alloc, b->segment_free, b->map, b->unmap, b->oom);
  fprintf(f, "# stats: prelive=%" PRIu64 " peak_live_requested=%" PRIu64 "\n", prelive,
          t->peak_live_requested);
  for (size_t i = 0; i < t->n_events; i++) {
    const expseg_trace_event_t *e = &t->events[i];
    switch (e->kind) {
    case 'p': case 'a': case 'f': case 'r':
      fprintf(f, "%c %" PRIu32 " %" PRIu64 " %" PRIu64 "\n", e->kind, e->stream, e->id, e->size);
      break;
    case 'E':
      fputs("E\n", f);
      break;
    case 'M': case 'X': case 'm': case 'u':
      fprintf(f, "%c %" PRIu32 " 0x%" PRIx64 " %" PRIu64 "\n", e->kind, e->stream, e->id,
              e->size);
      break;
    case 'O':
      fprintf(f, "O %" PRIu32 " - %" PRIu64 " device_free=%" PRIu64 "\n", e->stream, e->size,
              e->extra);
      break;
    default:
      fclose(f);
      return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: event %zu has unknown kind "
                               "0x%02x", path, i, e->kind);
    }
  }
  int werr = ferror(f);
  if (fclose(f) != 0 || werr)
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: write failed: %s", path,
                             strerror(errno));
  return EXPSEG_OK;
}

bool _expseg_field_dec(_expseg_field_t f, uint64_t *out) { return _expseg_dec_all(f.p, f.len, out); }

bool _expseg_field_hex(_expseg_field_t f, uint64_t *out) {
  if (f.len > 2 && f.p[0] == '0' && (f.p[1] == 'x' || f.p[1] == 'X')) f.p += 2, f.len -= 2;
  if (f.len == 0 || f.len > 16) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < f.len; i++) {
    char c = f.p[i];
    int d = c >= '0' && c <= '9' ? c - '0'
          : c >= 'a' && c <= 'f' ? c - 'a' + 10
          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | (uint64_t)d;
  }
  *out = v;
  return true;
}

bool _expseg_field_is(_expseg_field_t f, const char *s) {
  return f.len == strlen(s) && memcmp(f.p, s, f.len) == 0;
}

int _expseg_arg_u64(const char *s, uint64_t *v) { return _expseg_dec_str(s, v) ? 0 : -1; }

uint64_t _expseg_bench_now_ns(void) { return _expseg_clock_ns(); }

int _expseg_u64_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}
