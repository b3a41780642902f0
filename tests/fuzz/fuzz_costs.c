/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_costs.c: libFuzzer target for expseg-replay's --costs parser (bench/replay/synth_cost.c).
 * Any input must give EXPSEG_OK with every cost in [0, 1e9], or EXPSEG_ERR_INVALID_ARGUMENT
 * with a message naming the line; never a crash or a leak. */
#include "synth_model.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  expseg_costs_t c;
  expseg_status st = _expseg_costs_parse("fuzz.costs", (const char *)data, size, &c);
  if (st == EXPSEG_OK) {
    for (int k = 0; k < EXPSEG_COST_N; k++)
      if (!(c.call_us[k] >= 0.0 && c.call_us[k] <= 1e9) ||
          !(c.page_us[k] >= 0.0 && c.page_us[k] <= 1e9))
        abort();
  } else if (st != EXPSEG_ERR_INVALID_ARGUMENT || !strstr(expseg_trace_last_error(), "line ")) {
    abort();
  }
  return 0;
}
