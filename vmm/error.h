/* SPDX-License-Identifier: Apache-2.0 */
/* error.h: the thread's last error message and the warning sink; the bottom of the stack,
 * used by every layer (vmm, pools, bench). policy/ stays pure: its parser writes into a
 * buffer the caller passes, and the caller hands that to _expseg_error_set. */
#ifndef EXPSEG_ERROR_H
#define EXPSEG_ERROR_H

#include "expseg.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define EXPSEG_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define EXPSEG_PRINTF(f, a)
#endif

/* Sets this thread's message (printf-style) and returns s, so callers write
 * `return _expseg_error_set(EXPSEG_ERR_CONFIG, "...", ...);`. */
expseg_status _expseg_error_set(expseg_status s, const char *fmt, ...) EXPSEG_PRINTF(2, 3);
/* Prefixes the current message: "<prefix>: <old message>". */
void _expseg_error_prefix(const char *fmt, ...) EXPSEG_PRINTF(1, 2);
void _expseg_error_clear(void);
/* This thread's message (expseg_last_error's value; never NULL). */
const char *_expseg_error_message(void);
/* The process-wide sink of _expseg_warn lines (NULL: stderr); expseg_set_log_sink's body. */
void _expseg_log_sink_set(expseg_log_sink fn, void *ctx);
/* "EXPSEG_ERR_CONFIG" for EXPSEG_ERR_CONFIG (expseg_status_name's body). */
const char *_expseg_status_name(expseg_status s);
/* One line to the log sink (stderr by default), prefixed "expseg: ". */
void _expseg_warn(const char *fmt, ...) EXPSEG_PRINTF(1, 2);
/* on = true: this thread enters the allocator (its lock is about to be taken): warnings
 * wait in a thread-local queue; on = false: it has let go, and the queue goes to the sink.
 * Nests. */
void _expseg_log_defer(bool on);
/* Formats bytes for messages: "512 bytes", "1.00 MiB", "20.50 GiB", up to EiB (the largest
 * unit with a value >= 1; torch.cuda.memory_summary's own rules live in the summary). */
const char *_expseg_format_size(char buf[32], uint64_t bytes);

#ifdef __cplusplus
}
#endif
#endif
