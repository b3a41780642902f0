/* SPDX-License-Identifier: Apache-2.0 */
/* main.c: the smallest real use of an installed expseg: the header's version agrees with the
 * library's, an allocator on the host driver hands out memory that can be written, and the
 * statistics and identity calls answer. Exit 0 when all holds. */
#include <expseg.h>

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
  char want[32];
  snprintf(want, sizeof want, "%d.%d.%d", EXPSEG_VERSION_MAJOR, EXPSEG_VERSION_MINOR,
           EXPSEG_VERSION_PATCH);
  if (strcmp(want, expseg_version()) != 0) {
    fprintf(stderr, "header %s, library %s\n", want, expseg_version());
    return 1;
  }
  expseg_allocator *a = NULL;
  if (expseg_create("host:capacity=32M", 0, "expandable_segments:True", &a) != EXPSEG_OK) {
    fprintf(stderr, "%s\n", expseg_last_error());
    return 1;
  }
  void *p = NULL;
  if (expseg_malloc(a, 1 << 20, 0, &p) != EXPSEG_OK) {
    fprintf(stderr, "%s\n", expseg_last_error());
    return 1;
  }
  memset(p, 0xab, 1 << 20);
  int64_t allocated = 0;
  expseg_info info;
  if (expseg_stat(a, "allocated_bytes.all.current", &allocated) != EXPSEG_OK ||
      allocated < (1 << 20) || expseg_get_info(a, &info) != EXPSEG_OK ||
      strcmp(info.driver, "host") != 0 || expseg_free(a, p) != EXPSEG_OK) {
    fprintf(stderr, "unexpected: %s\n", expseg_last_error());
    return 1;
  }
  expseg_destroy(a);
  printf("consumer (%s): expseg %s, %s driver, ok\n", argc > 1 ? argv[1] : "?",
         expseg_version(), info.driver);
  return 0;
}
