/* SPDX-License-Identifier: Apache-2.0 */
/* c99_header.c: proves include/expseg.h is C99 (built with -std=c99 -pedantic) and that a
 * plain C program can drive the allocator through it. */
#include "expseg.h"

#include <stdio.h>
#include <string.h>

int main(void) {
  if (strcmp(expseg_status_name(EXPSEG_ERR_CONFIG), "EXPSEG_ERR_CONFIG") != 0) return 1;
  expseg_allocator *a = NULL;
  expseg_status s = expseg_create("sim:capacity=1G", 0, "", &a);
  if (s != EXPSEG_OK) {
    fprintf(stderr, "create: %s\n", expseg_last_error());
    return 1;
  }
  void *p = NULL;
  s = expseg_malloc(a, 1000, 0, &p);
  if (s != EXPSEG_OK || p == NULL) return 1;
  if (expseg_free(a, p) != EXPSEG_OK) return 1;
  expseg_destroy(a);
  puts("c99 header: ok");
  return 0;
}
