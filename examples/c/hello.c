/* SPDX-License-Identifier: Apache-2.0 */
/* hello.c: the smallest program using expseg from C: an allocator on a driver, one allocation,
 * what the allocator holds, and every error message printed as the library words it.
 *   cc hello.c $(pkg-config --cflags --libs expseg)   (docs/build.md, "Install and use")
 *   ./a.out [DRIVER]   DRIVER: "sim" (the default here: bookkeeping only, no GPU needed),
 *                      "host" (real memory), "cuda" (a GPU); docs/driver.md */
#include <expseg.h>
#include <stdint.h>
#include <stdio.h>

int main(int argc, char **argv) {
  const char *driver = argc > 1 ? argv[1] : "sim";
  expseg_allocator *a;
  if (expseg_create(driver, 0, "expandable_segments:True", &a) != EXPSEG_OK) {
    fprintf(stderr, "%s\n", expseg_last_error());
    return 1;
  }
  expseg_info info;
  expseg_get_info(a, &info);
  void *p;
  if (expseg_malloc(a, (size_t)100 << 20, 0 /* stream */, &p) != EXPSEG_OK) {
    fprintf(stderr, "%s\n", expseg_last_error());
    expseg_destroy(a);
    return 1;
  }
  int64_t reserved = 0;
  expseg_stat(a, "reserved_bytes.all.current", &reserved);
  printf("expseg %s on %s: 100 MiB allocated, %lld bytes reserved\n", expseg_version(),
         info.driver, (long long)reserved);
  expseg_free(a, p);
  expseg_destroy(a);
  return 0;
}
