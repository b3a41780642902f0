/* SPDX-License-Identifier: Apache-2.0 */
/* bench_sleep.c: expseg-bench-sleep, the cost of putting a region to sleep and waking it.
 * A region of --size MiB (blocks of --block MiB) is filled, put to sleep with offload and
 * woken, --rounds times; each round also times a plain memcpy of the same bytes to a host
 * buffer and back (the floor for the copies), in the same process on the same memory, and
 * a memcpy into freshly mapped pages (what a wake's copy-back meets: memory given back by
 * the sleep comes back without its pages, each faulted in on first touch). The first
 * round, whose sleep makes its pinned host copies, is also shown apart. On
 * `host` the device memory is this process's memory (filled and checked directly); on
 * `sim` there are no bytes and the tool reports the driver calls per GiB of one sleep and
 * one wake (expseg.driver.<call> statistics). Public API only. */
#include "tool_args.h"

#include <expseg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int fail(const char *what) {
  fprintf(stderr, "expseg-bench-sleep: %s: %s\n", what, expseg_last_error());
  return 1;
}

static const char *const kCalls[] = {"create", "map", "set_access", "unmap", "release",
                                     "host_alloc", "host_free", "stream_synchronize"};
enum { N_CALLS = sizeof kCalls / sizeof kCalls[0] };

static void calls(expseg_allocator *a, int64_t out[N_CALLS]) {
  for (int i = 0; i < N_CALLS; i++) {
    char key[64];
    snprintf(key, sizeof key, "expseg.driver.%s", kCalls[i]);
    out[i] = 0;
    (void)expseg_stat(a, key, &out[i]);
  }
}

static void usage(FILE *f) {
  fprintf(f, "usage: expseg-bench-sleep [--driver host|sim] [--size MIB (1024)] [--block MIB "
             "(64)] [--rounds N (3)]\n"
             "  host: sleep (offload) + wake of the region against memcpy of the same bytes;\n"
             "  sim: the driver calls of one sleep and one wake per GiB\n");
}

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

int main(int argc, char **argv) {
  const char *driver = "host";
  uint64_t size_mb = 1024, block_mb = 64, rounds = 3;
  const _expseg_arg_t table[] = {
      ARG_STR_("--driver", &driver),
      ARG_U64_("--size", &size_mb, 1, 1 << 20),
      ARG_U64_("--block", &block_mb, 1, 1 << 16),
      ARG_U64_("--rounds", &rounds, 1, 100),
  };
  if (_expseg_args_parse("expseg-bench-sleep", argc, argv, table, sizeof table / sizeof table[0],
                         usage) != 0)
    return 2;
  const bool bytes = strcmp(driver, "host") == 0;
  char spec[96];
  snprintf(spec, sizeof spec, "%s:capacity=%" PRIu64 "M", driver, size_mb + 2 * block_mb + 64);
  expseg_allocator *a;
  if (expseg_create(spec, 0, "expandable_segments:True", &a) != EXPSEG_OK) return fail(spec);
  const size_t block = (size_t)block_mb << 20, n = (size_t)((size_mb + block_mb - 1) / block_mb);
  void **p = calloc(n, sizeof *p);
  unsigned char *host = bytes ? malloc(n * block) : NULL;
  uint64_t *t_sleep = calloc(rounds, 8), *t_wake = calloc(rounds, 8), *t_copy = calloc(rounds, 8),
           *t_fresh = calloc(rounds, 8);
  if (!p || (bytes && !host) || !t_sleep || !t_wake || !t_copy || !t_fresh)
    return fail("out of host memory");
  if (expseg_region_begin(a, "r") != EXPSEG_OK) return fail("region_begin");
  for (size_t i = 0; i < n; i++) {
    if (expseg_malloc(a, block, 0, &p[i]) != EXPSEG_OK) return fail("malloc");
    if (bytes) memset(p[i], (int)(i * 7 + 1), block);
  }
  if (expseg_region_end(a, "r") != EXPSEG_OK) return fail("region_end");
  if (bytes) memset(host, 0, n * block); /* the floor's buffer, faulted in before timing */
  int64_t c0[N_CALLS], c1[N_CALLS], c2[N_CALLS];
  for (uint64_t r = 0; r < rounds; r++) {
    calls(a, c0);
    uint64_t t0 = now_ns();
    if (expseg_sleep(a, "r", EXPSEG_SLEEP_OFFLOAD) != EXPSEG_OK) return fail("sleep");
    uint64_t t1 = now_ns();
    calls(a, c1);
    if (expseg_wake(a, "r") != EXPSEG_OK) return fail("wake");
    uint64_t t2 = now_ns();
    calls(a, c2);
    t_sleep[r] = t1 - t0, t_wake[r] = t2 - t1;
    if (bytes) {
      for (size_t i = 0; i < n; i++) /* the bytes are back */
        if (((unsigned char *)p[i])[block - 1] != (unsigned char)(i * 7 + 1)) return fail("bytes");
      uint64_t m0 = now_ns();
      for (size_t i = 0; i < n; i++) memcpy(host + i * block, p[i], block);
      for (size_t i = 0; i < n; i++) memcpy(p[i], host + i * block, block);
      t_copy[r] = now_ns() - m0;
      unsigned char *fresh = mmap(NULL, n * block, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (fresh == MAP_FAILED) return fail("mmap of the fresh-pages floor");
      m0 = now_ns();
      for (size_t i = 0; i < n; i++) memcpy(fresh + i * block, host + i * block, block);
      t_fresh[r] = now_ns() - m0;
      munmap(fresh, n * block);
    }
  }
  const uint64_t first_sleep = t_sleep[0], first_wake = t_wake[0];
  qsort(t_sleep, rounds, 8, cmp_u64);
  qsort(t_wake, rounds, 8, cmp_u64);
  qsort(t_copy, rounds, 8, cmp_u64);
  qsort(t_fresh, rounds, 8, cmp_u64);
  const double gib = (double)(n * block) / (1u << 30);
  printf("driver %s, region %.2f GiB in %zu blocks of %" PRIu64 " MiB, median of %" PRIu64
         " rounds\n", driver, gib, n, block_mb, rounds);
  printf("sleep (offload) %.1f ms, wake %.1f ms, sleep + wake %.1f ms\n", t_sleep[rounds / 2] / 1e6,
         t_wake[rounds / 2] / 1e6, (t_sleep[rounds / 2] + t_wake[rounds / 2]) / 1e6);
  printf("first round (host copies made): sleep %.1f ms, wake %.1f ms\n", first_sleep / 1e6,
         first_wake / 1e6);
  if (bytes) {
    printf("memcpy of the same bytes out and back %.1f ms: sleep + wake / memcpy = %.2f\n",
           t_copy[rounds / 2] / 1e6,
           (double)(t_sleep[rounds / 2] + t_wake[rounds / 2]) / (double)t_copy[rounds / 2]);
    printf("memcpy into fresh pages (one way) %.1f ms: wake / that = %.2f\n",
           t_fresh[rounds / 2] / 1e6, (double)t_wake[rounds / 2] / (double)t_fresh[rounds / 2]);
  }
  printf("driver calls per GiB (last round):");
  for (int i = 0; i < N_CALLS; i++)
    printf(" %s %.1f+%.1f", kCalls[i], (c1[i] - c0[i]) / gib, (c2[i] - c1[i]) / gib);
  printf("  (sleep+wake)\n");
  for (size_t i = 0; i < n; i++) (void)expseg_free(a, p[i]);
  expseg_destroy(a);
  free(p), free(host), free(t_sleep), free(t_wake), free(t_copy), free(t_fresh);
  return 0;
}
