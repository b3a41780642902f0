/* SPDX-License-Identifier: Apache-2.0 */
/* trace_error.c: the trace library's own error message, one per thread (a fixed buffer:
 * setting it never allocates), apart from the allocator's private one. */
#include "trace_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { MSG_CAP = 1024 };
static _Thread_local char tl_msg[MSG_CAP];

expseg_status _expseg_trace_error(expseg_status s, const char *fmt, ...) {
  char buf[MSG_CAP]; /* fmt's arguments may be the current message itself */
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) buf[0] = '\0';
  if (n >= MSG_CAP) memcpy(buf + MSG_CAP - 4, "...", 4);
  memcpy(tl_msg, buf, sizeof tl_msg);
  return s;
}

const char *expseg_trace_last_error(void) { return tl_msg; }
