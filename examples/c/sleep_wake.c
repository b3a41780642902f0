/* SPDX-License-Identifier: Apache-2.0 */
/* sleep_wake.c: a region's device memory given back and restored at the same addresses, from C
 * (docs/api.md, "Sleep and wake").
 *   cc sleep_wake.c $(pkg-config --cflags --libs expseg)   (docs/build.md, "Install and use")
 *   ./a.out [DRIVER]   DRIVER: "host" (the default here: device memory is ordinary memory of
 *                      this process, so the example writes and reads it with memcpy)
 * Allocations between expseg_region_begin and expseg_region_end belong to the region
 * "weights"; expseg_sleep copies their bytes to pinned host memory and gives the device
 * memory back, keeping every address reserved; expseg_wake maps memory at the same addresses
 * and copies the bytes back. On a GPU ("cuda") the pointers are device memory: write and
 * read them with cudaMemcpy instead of memcpy. Exits 1 when a call fails, a byte changed, or
 * the allocation in the sleeping region was not refused with a message naming it. */
#include <expseg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(expseg_allocator *a, const char *what) {
  fprintf(stderr, "%s: %s\n", what, expseg_last_error());
  if (a != NULL) expseg_destroy(a);
  return 1;
}

static void show(expseg_allocator *a, const char *when) {
  expseg_region_info r;
  if (expseg_region_get_info(a, "weights", &r) != EXPSEG_OK) return;
  printf("%-7s device %4llu MiB, host copies %4llu MiB, asleep %4llu MiB (sleeps %llu, "
         "wakes %llu)\n",
         when, (unsigned long long)(r.device_bytes >> 20),
         (unsigned long long)((r.host_bytes + r.host_kept_bytes) >> 20),
         (unsigned long long)(r.asleep_bytes >> 20), (unsigned long long)r.sleeps,
         (unsigned long long)r.wakes);
}

int main(int argc, char **argv) {
  const char *driver = argc > 1 ? argv[1] : "host:capacity=256M";
  expseg_allocator *a;
  if (expseg_create(driver, 0, "expandable_segments:True", &a) != EXPSEG_OK)
    return fail(NULL, driver);
  const size_t size = (size_t)32 << 20;
  unsigned char *pattern = malloc(size);
  if (pattern == NULL) return fail(a, "malloc");
  for (size_t i = 0; i < size; i++) pattern[i] = (unsigned char)(i * 131 + 7);

  void *weights = NULL;
  if (expseg_region_begin(a, "weights") != EXPSEG_OK) return fail(a, "expseg_region_begin");
  if (expseg_malloc(a, size, 0 /* stream */, &weights) != EXPSEG_OK)
    return fail(a, "expseg_malloc");
  if (expseg_region_end(a, "weights") != EXPSEG_OK) return fail(a, "expseg_region_end");
  memcpy(weights, pattern, size); /* host driver: the device address is this process's */
  show(a, "awake");

  if (expseg_sleep(a, "weights", EXPSEG_SLEEP_OFFLOAD) != EXPSEG_OK) return fail(a, "expseg_sleep");
  show(a, "asleep");
  void *p = NULL; /* allocating in a sleeping region is refused, naming it */
  int refused = 0;
  if (expseg_region_begin(a, "weights") != EXPSEG_OK) return fail(a, "expseg_region_begin");
  if (expseg_malloc(a, 4096, 0, &p) != EXPSEG_OK) {
    printf("refused: %s\n", expseg_last_error());
    refused = strstr(expseg_last_error(), "\"weights\"") != NULL;
  }
  if (expseg_region_end(a, "weights") != EXPSEG_OK) return fail(a, "expseg_region_end");

  if (expseg_wake(a, "weights") != EXPSEG_OK) return fail(a, "expseg_wake");
  show(a, "awake");
  const int same = memcmp(weights, pattern, size) == 0; /* the same pointer, the same bytes */
  printf("pointer %p after wake: bytes %s\n", weights, same ? "intact" : "CHANGED");
  expseg_free(a, weights);
  expseg_destroy(a);
  free(pattern);
  return same && refused ? 0 : 1;
}
