/* SPDX-License-Identifier: Apache-2.0 */
/* probe.c: a few allocations and frees through the public API, with no expseg_check call
 * of its own. Built twice (tests/debug/CMakeLists.txt): in the normal tree it must pass; in
 * a tree built with EXPSEG_TEST_BREAK_INVARIANT (one statistic update skipped) at
 * EXPSEG_DEBUG=3, the library's own checks must stop it. */
#include "expseg.h"

#include <stdio.h>

int main(void) {
  expseg_allocator *a = NULL;
  if (expseg_create("sim", 0, "", &a) != EXPSEG_OK) {
    fprintf(stderr, "probe: expseg_create: %s\n", expseg_last_error());
    return 1;
  }
  void *p[16] = {0};
  for (int round = 0; round < 4; round++) {
    for (int i = 0; i < 16; i++)
      if (expseg_malloc(a, (size_t)(i + 1) << (10 + 2 * (i % 6)), 0, &p[i]) != EXPSEG_OK) {
        fprintf(stderr, "probe: expseg_malloc: %s\n", expseg_last_error());
        return 1;
      }
    for (int i = 0; i < 16; i++) expseg_free(a, p[i]);
    expseg_empty_cache(a);
  }
  expseg_destroy(a);
  puts("probe: done");
  return 0;
}
