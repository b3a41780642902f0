/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_rmm_csv.c: libFuzzer target for the RMM logging_resource_adaptor CSV reader
 * (bench/replay/trace_csv.c): any input gives a well-formed trace of allocations, frees and
 * OOMs, or an error naming the line (the check: tests/support/fuzz_trace_check.h). */
#include "fuzz_trace_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  expseg_trace_set_t s;
  expseg_status st = expseg_trace_read_rmm_csv("fuzz.csv", (const char *)data, size, &s);
  fuzz_check_trace_read(st, &s, "fuzz.csv", "afO");
  return 0;
}
