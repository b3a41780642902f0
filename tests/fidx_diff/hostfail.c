/* SPDX-License-Identifier: Apache-2.0 */
/* hostfail.c: random traffic with host memory failing (malloc, calloc, realloc return NULL
 * after a countdown, then persistently until the step ends); expseg_check after every step
 * with host memory back; frees of plain blocks must succeed even while host memory fails.
 * Usage: hostfail SEED STEPS CONFIG */
#define _GNU_SOURCE
#include "expseg.h"
#include "expseg_testing.h"
#include "rng.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
static long countdown = -1;
static long failures;
static int failing(void) {
  if (countdown < 0) return 0;
  if (countdown == 0) {
    failures++;
    return 1;
  }
  countdown--;
  return 0;
}
extern void __libc_free(void *);
static long live_allocs;
void *malloc(size_t n) {
  void *p = failing() ? NULL : __libc_malloc(n);
  live_allocs += p != NULL;
  return p;
}
void *calloc(size_t a, size_t b) {
  void *p = failing() ? NULL : __libc_calloc(a, b);
  live_allocs += p != NULL;
  return p;
}
void *realloc(void *p, size_t n) {
  if (failing()) return NULL;
  void *q = __libc_realloc(p, n);
  if (p == NULL && q != NULL) live_allocs++;
  return q;
}
void free(void *p) {
  live_allocs -= p != NULL;
  __libc_free(p);
}


int main(int argc, char **argv) {
  if (argc < 4) return 2;
  rng = strtoull(argv[1], NULL, 0) * 2654435761u + 1;
  long steps = atol(argv[2]);
  { /* warm-up: whatever the library allocates once per process */
    expseg_allocator *w;
    if (expseg_create("sim:capacity=8G", 0, argv[3], &w) != EXPSEG_OK) return 1;
    void *p;
    if (getenv("HIST")) (void)expseg_record_history(w, true, 1000);
    if (expseg_malloc(w, 1000, 0, &p) == EXPSEG_OK) (void)expseg_free(w, p);
    (void)expseg_configure(w, "max_split_size_mb:40");
    (void)expseg_check(w);
    expseg_destroy(w);
    printf("warm-up %s\n", expseg_last_error());
  }
  long l0 = live_allocs;
  struct mallinfo2 m0 = mallinfo2();
  expseg_allocator *a;
  if (expseg_create("sim:capacity=8G", 0, argv[3], &a) != EXPSEG_OK) return 1;
  if (getenv("HIST") && expseg_record_history(a, true, 1000) != EXPSEG_OK) return 1;
  void **live = __libc_calloc(200000, sizeof *live);
  bool *rec = __libc_calloc(200000, sizeof *rec);
  size_t n = 0;
  long ok_m = 0, fail_m = 0;
  for (long i = 0; i < steps; i++) {
    uint64_t r = rnd() % 100;
    long cd = (long)(rnd() % 40);
    if (rnd() % 4 == 0 || getenv("NOFAIL")) cd = -1;
    countdown = cd;
    if (r < 55 || n == 0) {
      size_t size = rnd() % 3 ? 512 * (1 + rnd() % 4000) : 1 + rnd() % (64u << 20);
      void *p = NULL;
      expseg_status st = expseg_malloc(a, size, rnd() % (getenv("NSTREAMS") ? atoi(getenv("NSTREAMS")) : 3), &p);
      countdown = -1;
      if (st == EXPSEG_OK) {
        ok_m++;
        live[n] = p;
        rec[n++] = false;
      } else {
        fail_m++;
      }
    } else if (r < 90) {
      size_t k = rnd() % n;
      expseg_status st = expseg_free(a, live[k]);
      countdown = -1;
      if (st != EXPSEG_OK && !rec[k]) {
        printf("seed %s step %ld: free failed (countdown %ld): %s\n", argv[1], i, cd, expseg_last_error());
        return 4;
      }
      if (st == EXPSEG_OK) {
        live[k] = live[--n];
        rec[k] = rec[n];
      }
    } else if (r < 95) {
      size_t k = rnd() % n;
      expseg_status st = expseg_record_stream(a, live[k], 1 + rnd() % 3);
      countdown = -1;
      if (st == EXPSEG_OK) rec[k] = true;
    } else if (r < 98) {
      (void)expseg_empty_cache(a);
      countdown = -1;
    } else {
      (void)expseg_configure(a, rnd() % 2 ? "max_split_size_mb:40" : "max_split_size_mb:2000");
      countdown = -1;
    }
    if (getenv("CHECK_SHORT")) { /* the check itself short of host memory: no false report */
      countdown = (long)(rnd() % 8);
      expseg_status cs = expseg_check(a);
      countdown = -1;
      if (cs == EXPSEG_ERR_INVALID_ARGUMENT) {
        printf("seed %s step %ld: check short of host memory reports: %s\n", argv[1], i, expseg_last_error());
        return 5;
      }
    }
    if (expseg_check(a) != EXPSEG_OK) {
      printf("seed %s step %ld: CHECK FAILED (countdown %ld, op %llu): %s\n", argv[1], i, cd,
             (unsigned long long)r, expseg_last_error());
      return 3;
    }
  }
  for (size_t k = 0; k < n; k++)
    if (expseg_free(a, live[k]) != EXPSEG_OK) printf("final free failed\n");
  if (expseg_empty_cache(a) != EXPSEG_OK || expseg_check(a) != EXPSEG_OK) {
    printf("end: %s\n", expseg_last_error());
    return 3;
  }
  int64_t res = -1;
  expseg_stat(a, "reserved_bytes.all.current", &res);
  expseg_testing_driver_counts left;
  expseg_testing_destroy(a, &left);
  struct mallinfo2 m1 = mallinfo2();
  printf("seed %s: %ld ok, %ld failed mallocs, %ld host failures; reserved at end %lld; "
         "left chunks %lld va %lld; heap in use before %zu after %zu; live host allocations %ld\n",
         argv[1], ok_m, fail_m, failures, (long long)res, (long long)left.live_chunks,
         (long long)left.reserved_va_bytes, m0.uordblks, m1.uordblks, live_allocs - l0);
  return 0;
}
