/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_memtrace.c: libFuzzer target for the memtrace v1 reader (bench/replay/trace_memtrace.c).
 * Any input must give EXPSEG_OK with a trace the checker's rules hold for, or
 * EXPSEG_ERR_INVALID_ARGUMENT with a message naming the line; never a crash or a leak
 * (the check: tests/support/fuzz_trace_check.h). */
#include "fuzz_trace_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  expseg_trace_set_t s;
  expseg_status st = expseg_trace_read_memtrace("fuzz.memtrace", (const char *)data, size, &s);
  fuzz_check_trace_read(st, &s, "fuzz.memtrace", NULL);
  return 0;
}
