/* SPDX-License-Identifier: Apache-2.0 */
/* public_error.c: the public calls about errors and logging (include/expseg.h): the
 * thread's last message, the log sink, the status names. Their machinery is vmm/error.c's,
 * the bottom layer every other layer reports through (docs/design.md, "Layers"); vmm/
 * itself exports nothing. Also the one message of every public call given a NULL allocator. */
#include "error.h"
#include "expseg.h"
#include "internal.h"

const char *expseg_last_error(void) { return _expseg_error_message(); }

void expseg_set_log_sink(expseg_log_sink fn, void *ctx) { _expseg_log_sink_set(fn, ctx); }

const char *expseg_status_name(expseg_status s) { return _expseg_status_name(s); }

expseg_status _expseg_null_allocator(const char *fn) {
  return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "%s: the allocator is NULL", fn);
}
