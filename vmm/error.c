/* SPDX-License-Identifier: Apache-2.0 */
/* error.c: the thread's last error message, the warning sink and size formatting.
 * Internal only: the public calls over them (expseg_last_error, expseg_set_log_sink,
 * expseg_status_name) are pools/public_error.c's, so vmm/ exports nothing.
 *
 * Each thread owns a fixed 1 KiB buffer (_Thread_local): setting a message never allocates,
 * so it works on out-of-memory paths. Messages longer than the buffer are cut, ending in
 * "...". Warnings go through one process-wide sink (stderr by default), one line a call,
 * and never with an expseg lock held: a thread inside the allocator (between
 * _expseg_log_defer(true) and (false), which the allocator's lock/unlock pair does) keeps
 * its lines in a small thread-local queue and delivers them once it has let go of the
 * allocator. The sink is called with no expseg mutex held either (the sink's own pointer
 * is read under a mutex, then released), so a sink may call any expseg function; calls are
 * serialized by an emit mutex that a sink re-entering from its own thread skips. */
#include "error.h"
#include "units.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { MSG_CAP = 1024, DEFER_MAX = 4 };

static _Thread_local char tl_msg[MSG_CAP];

static pthread_mutex_t sink_mu = PTHREAD_MUTEX_INITIALIZER; /* guards sink_fn, sink_ctx */
static pthread_mutex_t emit_mu = PTHREAD_MUTEX_INITIALIZER; /* one sink call at a time */
static expseg_log_sink sink_fn; /* NULL = stderr */
static void *sink_ctx;

static _Thread_local int tl_defer;        /* > 0: inside the allocator, lines wait */
static _Thread_local bool tl_in_sink;     /* this thread is running the sink */
static _Thread_local char tl_lines[DEFER_MAX][MSG_CAP];
static _Thread_local unsigned tl_nlines, tl_dropped;

/* A message is one line whatever the caller passed (a tag, option text): control bytes
 * (a newline, an escape sequence) are shown as '?'. */
static void one_line(char *buf) {
  for (unsigned char *c = (unsigned char *)buf; *c; c++)
    if (*c < 0x20 || *c == 0x7f) *c = '?';
}

/* Marks a cut message with "..." so a reader knows text is missing. */
static void mark_cut(char *buf, size_t cap, int wanted) {
  if (wanted >= (int)cap && cap > 4) memcpy(buf + cap - 4, "...", 4);
}

expseg_status _expseg_error_set(expseg_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tl_msg, MSG_CAP, fmt, ap);
  va_end(ap);
  if (n < 0) tl_msg[0] = '\0';
  mark_cut(tl_msg, MSG_CAP, n);
  one_line(tl_msg);
  return s;
}

void _expseg_error_prefix(const char *fmt, ...) {
  char pre[MSG_CAP];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(pre, sizeof pre, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  char old[MSG_CAP];
  memcpy(old, tl_msg, MSG_CAP);
  int m = old[0] ? snprintf(tl_msg, MSG_CAP, "%s: %s", pre, old)
                 : snprintf(tl_msg, MSG_CAP, "%s", pre);
  mark_cut(tl_msg, MSG_CAP, m);
  one_line(tl_msg);
}

void _expseg_error_clear(void) { tl_msg[0] = '\0'; }

const char *_expseg_error_message(void) { return tl_msg; }

void _expseg_log_sink_set(expseg_log_sink fn, void *ctx) {
  pthread_mutex_lock(&sink_mu);
  sink_fn = fn;
  sink_ctx = ctx;
  pthread_mutex_unlock(&sink_mu);
}

static void deliver(const char *line) {
  pthread_mutex_lock(&sink_mu);
  expseg_log_sink fn = sink_fn;
  void *ctx = sink_ctx;
  pthread_mutex_unlock(&sink_mu);
  if (fn) {
    fn(ctx, line);
  } else {
    fprintf(stderr, "%s\n", line);
    fflush(stderr);
  }
}

static void emit(const char *line) {
  if (tl_in_sink) { /* the sink itself warned: this thread already holds emit_mu */
    deliver(line);
    return;
  }
  pthread_mutex_lock(&emit_mu);
  tl_in_sink = true;
  deliver(line);
  tl_in_sink = false;
  pthread_mutex_unlock(&emit_mu);
}

void _expseg_log_defer(bool on) {
  if (on) {
    tl_defer++;
    return;
  }
  if (tl_defer > 0 && --tl_defer > 0) return;
  if (tl_nlines == 0 && tl_dropped == 0) return; /* the common case: nothing was raised */
  /* copy the queue first: the sink may call into expseg and warn again */
  unsigned n = tl_nlines, dropped = tl_dropped;
  char lines[DEFER_MAX][MSG_CAP];
  for (unsigned i = 0; i < n; i++) memcpy(lines[i], tl_lines[i], MSG_CAP);
  tl_nlines = tl_dropped = 0;
  for (unsigned i = 0; i < n; i++) emit(lines[i]);
  if (dropped > 0) {
    char line[96];
    snprintf(line, sizeof line, "expseg: %u more warnings in the same call were dropped",
             dropped);
    emit(line);
  }
}

void _expseg_warn(const char *fmt, ...) {
  char line[MSG_CAP];
  int p = snprintf(line, sizeof line, "expseg: ");
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line + p, sizeof line - (size_t)p, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  mark_cut(line, sizeof line, p + n);
  one_line(line);
  if (tl_defer > 0) {
    if (tl_nlines < DEFER_MAX) memcpy(tl_lines[tl_nlines++], line, MSG_CAP);
    else tl_dropped++;
    return;
  }
  emit(line);
}

const char *_expseg_format_size(char buf[32], uint64_t bytes) {
  /* the largest unit that leaves a value of at least 1: 1 MiB is "1.00 MiB", not
   * "1024.00 KiB" (PyTorch's format_size steps at <=), up to EiB */
  if (bytes < 1024) {
    snprintf(buf, 32, "%llu bytes", (unsigned long long)bytes);
    return buf;
  }
  const int u = _expseg_unit_steps(bytes, 1024, 1024, 6);
  snprintf(buf, 32, "%.2f %s", (double)bytes / (double)(1ull << (10 * u)), _expseg_size_unit(u));
  return buf;
}

const char *_expseg_status_name(expseg_status s) {
  switch (s) {
#define EXPSEG_STATUS_NAME_(name, value, text) \
  case name:                                   \
    return #name;
    EXPSEG_STATUSES(EXPSEG_STATUS_NAME_)
#undef EXPSEG_STATUS_NAME_
  }
  return "EXPSEG_UNKNOWN_STATUS";
}
