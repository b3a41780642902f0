/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_driver_spec.c: libFuzzer target over the driver spec parser (_expseg_vmm_open).
 *
 * The input is used as a spec string. Only the sim and host backends are built from it
 * (a "cuda" spec is rewritten to "sim" so runs do not depend on a GPU); building a driver
 * allocates nothing of its capacity, so a host spec of any size is safe: the driver is only
 * constructed, checked, and closed. Invariants: success leaves a driver whose granularity
 * is a power of two and whose capacity is non-zero; failure is EXPSEG_ERR_CONFIG with a
 * non-empty message (EXPSEG_ERR_UNSUPPORTED where a cuda driver is named inside another
 * spec, as in "fault;cuda", on a machine without a GPU). Fault specs ("fault:fail=...;sim")
 * are built like any other. */
#include "vmm.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4096) return 0;
  char *spec = malloc(size + 1);
  if (!spec) return 0;
  memcpy(spec, data, size);
  spec[size] = '\0';
  if (strncmp(spec, "cuda", 4) == 0) memcpy(spec, "sim\0", 4 <= size ? 4 : size + 1);
  expseg_vmm_t *v = NULL;
  expseg_status s = _expseg_vmm_open(spec, 0, &v);
  if (s == EXPSEG_OK) {
    size_t g = v->granularity, fr = 0, tot = 0;
    _expseg_vmm_mem_info(v, &fr, &tot);
    if (g == 0 || (g & (g - 1)) || tot == 0 || fr != tot) abort();
    /* A tiny round trip on sim: reserve and release one granule. */
    if (strcmp(v->ops->name, "sim") == 0) {
      uintptr_t a = 0;
      if (_expseg_vmm_reserve(v, g, 0, &a) == EXPSEG_OK &&
          _expseg_vmm_unreserve(v, a, g) != EXPSEG_OK)
        abort();
    }
    _expseg_vmm_close(v);
  } else {
    if (v != NULL) abort();
    /* a cuda driver named inside another spec ("fault;cuda") is UNSUPPORTED without a GPU */
    bool no_gpu = s == EXPSEG_ERR_UNSUPPORTED && strstr(spec, "cuda") != NULL;
    if ((s != EXPSEG_ERR_CONFIG && !no_gpu) || expseg_last_error()[0] == '\0') {
      fprintf(stderr, "spec '%s': status %d: %s\n", spec, (int)s, expseg_last_error());
      abort();
    }
  }
  free(spec);
  return 0;
}
