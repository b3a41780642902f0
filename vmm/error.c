/* error.c: the thread's last error message, the warning sink and size formatting.
 *
 * Each thread owns a fixed 1 KiB buffer (_Thread_local): setting a message never allocates,
 * so it works on out-of-memory paths. Messages longer than the buffer are cut, ending in
 * "...". Warnings go through one process-wide sink (stderr by default) under a mutex so lines
 * from several threads never interleave. */
#include "error.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { MSG_CAP = 1024 };

static _Thread_local char tl_msg[MSG_CAP];

static pthread_mutex_t sink_mu = PTHREAD_MUTEX_INITIALIZER;
static expseg_log_sink sink_fn; /* NULL = stderr */
static void *sink_ctx;

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
}

void _expseg_error_clear(void) { tl_msg[0] = '\0'; }

const char *expseg_last_error(void) { return tl_msg; }

void expseg_set_log_sink(expseg_log_sink fn, void *ctx) {
  pthread_mutex_lock(&sink_mu);
  sink_fn = fn;
  sink_ctx = ctx;
  pthread_mutex_unlock(&sink_mu);
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
  pthread_mutex_lock(&sink_mu);
  if (sink_fn) {
    sink_fn(sink_ctx, line);
  } else {
    fprintf(stderr, "%s\n", line);
    fflush(stderr);
  }
  pthread_mutex_unlock(&sink_mu);
}

const char *_expseg_format_size(char buf[32], uint64_t bytes) {
  const double kib = 1024.0, mib = kib * 1024.0, gib = mib * 1024.0;
  if (bytes <= 1024) {
    snprintf(buf, 32, "%llu bytes", (unsigned long long)bytes);
  } else if (bytes <= 1048576ull) {
    snprintf(buf, 32, "%.2f KiB", (double)bytes / kib);
  } else if (bytes <= 1073741824ull) {
    snprintf(buf, 32, "%.2f MiB", (double)bytes / mib);
  } else {
    snprintf(buf, 32, "%.2f GiB", (double)bytes / gib);
  }
  return buf;
}

const char *expseg_status_name(expseg_status s) {
  switch (s) {
#define EXPSEG_STATUS_NAME_(name, value, text) \
  case name:                                   \
    return #name;
    EXPSEG_STATUSES(EXPSEG_STATUS_NAME_)
#undef EXPSEG_STATUS_NAME_
  }
  return "EXPSEG_UNKNOWN_STATUS";
}
