/* SPDX-License-Identifier: Apache-2.0 */
/* bench_grow.c: expseg-bench-grow, the cost of growing and shrinking what the allocator
 * holds, per GiB, on a real driver (host by default; cuda on a GPU machine).
 *
 * One round: expseg_malloc of --size bytes with nothing cached (growth: for expandable
 * segments, create + map + one set_access per contiguous range; for classic ones, one
 * segment), expseg_free (cached, no driver call), then expseg_empty_cache (shrink: unmap
 * and release everything). Each is timed with clock_gettime; the median over --rounds
 * rounds is reported as ns per GiB, with the driver calls one round made. A second
 * measurement, "re-grow", frees and re-allocates without empty_cache (a cache hit, for
 * contrast). Settings compared: the --conf values given, or a built-in list. */
#include "expseg.h"
#include "tool_args.h"
#include "tool_version.h"
#include "trace_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t stat0(const expseg_allocator *a, const char *key) {
  int64_t v = 0;
  return expseg_stat(a, key, &v) == EXPSEG_OK ? v : 0;
}

static const char *const default_confs[] = {
    "expandable_segments:True,page_size_mb:2",
    "expandable_segments:True,page_size_mb:20",
    "expandable_segments:False",
};

static void usage(FILE *f) {
  fprintf(f, "usage: expseg-bench-grow [--driver SPEC (host:capacity=4G)] [--size BYTES[K|M|G] "
             "(1G)] [--rounds N (20)] [--conf TEXT]... [--json]\n");
}

static const char *const calls[] = {"create", "map", "set_access", "unmap", "release"};
#define N_CALLS (sizeof calls / sizeof calls[0])

static uint64_t median(uint64_t *v, size_t n) {
  qsort(v, n, sizeof *v, _expseg_u64_cmp);
  return v[n / 2];
}

int main(int argc, char **argv) {
  if (expseg_tool_version(argc, argv, "expseg-bench-grow")) return 0;
  const char *driver = "host:capacity=4G";
  uint64_t size = 1ull << 30, rounds = 20;
  const char *confs[16];
  size_t n_confs = 0;
  int json = 0;
  const _expseg_arg_t opts[] = {
      ARG_FLAG_("--json", &json),
      ARG_STR_("--driver", &driver),
      ARG_SIZE_("--size", &size, 1, UINT64_MAX),
      ARG_U64_("--rounds", &rounds, 1, 99999),
      ARG_STRS_("--conf", confs, &n_confs, 16),
  };
  if (_expseg_args_parse("expseg-bench-grow", argc, argv, opts, sizeof opts / sizeof opts[0],
                         usage))
    return 2;
  if (!n_confs) {
    for (size_t i = 0; i < sizeof default_confs / sizeof default_confs[0]; i++)
      confs[n_confs++] = default_confs[i];
  }
  uint64_t *tg = malloc(rounds * sizeof *tg), *ts = malloc(rounds * sizeof *ts),
           *th = malloc(rounds * sizeof *th);
  if (!tg || !ts || !th) return 1;
  const double gib = (double)size / (double)(1ull << 30);
  if (!json)
    printf("# driver %s, block %.3f GiB, %" PRIu64 " rounds (medians)\n%-42s %12s %12s %12s  %s\n",
           driver, gib, rounds, "config", "grow ns/GiB", "shrink ns/GiB", "hit ns", "driver calls per round");
  int rc = 0;
  for (size_t c = 0; c < n_confs && rc == 0; c++) {
    expseg_allocator *a = NULL;
    if (expseg_create(driver, 0, confs[c], &a) != EXPSEG_OK) {
      fprintf(stderr, "expseg-bench-grow: expseg_create(%s, %s): %s\n", driver, confs[c],
              expseg_last_error());
      rc = 2;
      break;
    }
    int64_t before[N_CALLS], after[N_CALLS];
    for (uint64_t r = 0; r < rounds && rc == 0; r++) {
      void *p = NULL;
      if (r == 1)
        for (size_t k = 0; k < N_CALLS; k++) {
          char key[64];
          snprintf(key, sizeof key, "expseg.driver.%s", calls[k]);
          before[k] = stat0(a, key);
        }
      uint64_t t0 = _expseg_bench_now_ns();
      expseg_status s = expseg_malloc(a, size, 0, &p);
      uint64_t t1 = _expseg_bench_now_ns();
      if (s != EXPSEG_OK) {
        fprintf(stderr, "expseg-bench-grow: malloc(%" PRIu64 "): %s\n", size,
                expseg_last_error());
        rc = 1;
        break;
      }
      (void)expseg_free(a, p);
      uint64_t t2 = _expseg_bench_now_ns();
      s = expseg_malloc(a, size, 0, &p); /* hit */
      uint64_t t3 = _expseg_bench_now_ns();
      if (s == EXPSEG_OK) (void)expseg_free(a, p);
      uint64_t t4 = _expseg_bench_now_ns();
      (void)expseg_empty_cache(a);
      uint64_t t5 = _expseg_bench_now_ns();
      tg[r] = t1 - t0;
      th[r] = t3 - t2;
      ts[r] = t5 - t4;
      if (r == 1)
        for (size_t k = 0; k < N_CALLS; k++) {
          char key[64];
          snprintf(key, sizeof key, "expseg.driver.%s", calls[k]);
          after[k] = stat0(a, key);
        }
    }
    expseg_destroy(a);
    if (rc) break;
    const double g = (double)median(tg, rounds) / gib, sh = (double)median(ts, rounds) / gib;
    const uint64_t h = median(th, rounds);
    char callbuf[256] = "";
    size_t off = 0;
    for (size_t k = 0; k < N_CALLS && rounds > 1; k++)
      off += (size_t)snprintf(callbuf + off, sizeof callbuf - off,
                              json ? "%s\"%s\":%" PRId64 : "%s%s=%" PRId64,
                              k ? (json ? "," : " ") : "", calls[k], after[k] - before[k]);
    if (json)
      printf("{\"bench\":\"grow\",\"driver\":\"%s\",\"config\":\"%s\",\"size\":%" PRIu64
             ",\"grow_ns_per_gib\":%.0f,\"shrink_ns_per_gib\":%.0f,\"hit_ns\":%" PRIu64
             ",\"calls_per_round\":{%s}}\n",
             driver, confs[c], size, g, sh, h, callbuf);
    else
      printf("%-42s %12.0f %12.0f %12" PRIu64 "  %s\n", confs[c], g, sh, h, callbuf);
    fflush(stdout);
  }
  free(tg);
  free(ts);
  free(th);
  return rc;
}
