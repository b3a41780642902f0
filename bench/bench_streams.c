/* SPDX-License-Identifier: Apache-2.0 */
/* bench_streams.c: expseg-bench-streams, the cost of many streams: each stream's first
 * malloc, and a failing malloc's out-of-memory report, with N streams holding memory.
 *
 * For each N (--streams N,N,...; 1000,4000,16000 by default) an allocator on
 * the sim driver (bookkeeping only) gets an address space of exactly N small expandable
 * segments (va_reserve_mb:128 makes each small segment reserve 128 MiB); one 512-byte malloc
 * on each of N streams fills it ("fill": each is a stream's first use, a new segment), then
 * --ooms mallocs on further streams fail because no address space is left (the report
 * counts the streams that hold segments). Linear costs show as a flat "per stream" column
 * and a flat "per OOM" figure when N grows. */
#include "expseg.h"
#include "tool_args.h"
#include "tool_version.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *f) {
  fprintf(f, "usage: expseg-bench-streams [--streams N,N,... (1000,4000,16000)] [--ooms N (20)]\n");
}

int main(int argc, char **argv) {
  if (expseg_tool_version(argc, argv, "expseg-bench-streams")) return 0;
  uint64_t counts[16], ooms = 20;
  size_t n_counts = 0;
  const _expseg_arg_t opts[] = {
      ARG_LIST_("--streams", counts, 1, 1000000, &n_counts, 16),
      ARG_U64_("--ooms", &ooms, 1, 100000),
  };
  if (_expseg_args_parse("expseg-bench-streams", argc, argv, opts, sizeof opts / sizeof opts[0],
                         usage))
    return 2;
  if (n_counts == 0) {
    counts[0] = 1000, counts[1] = 4000, counts[2] = 16000;
    n_counts = 3;
  }
  printf("# sim driver, expandable_segments:True,va_reserve_mb:128; one 512-byte malloc per "
         "stream, then %" PRIu64 " mallocs that fail for want of address space\n", ooms);
  printf("%8s %10s %14s %12s %14s\n", "streams", "fill s", "per stream us", "OOM total s",
         "per OOM ms");
  for (size_t c = 0; c < n_counts; c++) {
    uint64_t n = counts[c];
    char spec[128];
    /* 128 MiB of address space per small segment, 2 MiB mapped in each */
    snprintf(spec, sizeof spec, "sim:capacity=%" PRIu64 "M,va=%" PRIu64 "M", 2 * n + 1024,
             128 * n);
    expseg_allocator *a = NULL;
    if (expseg_create(spec, 0, "expandable_segments:True,va_reserve_mb:128", &a) != EXPSEG_OK) {
      fprintf(stderr, "expseg-bench-streams: expseg_create(%s): %s\n", spec, expseg_last_error());
      return 1;
    }
    void **p = calloc(n, sizeof *p);
    if (!p) return 1;
    double t0 = now_s();
    for (uint64_t i = 0; i < n; i++) {
      if (expseg_malloc(a, 512, (expseg_stream)(i + 1), &p[i]) != EXPSEG_OK) {
        fprintf(stderr, "expseg-bench-streams: malloc on stream %" PRIu64 " of %" PRIu64 ": %s\n",
                i + 1, n, expseg_last_error());
        return 1;
      }
    }
    double fill = now_s() - t0;
    void *q = NULL;
    t0 = now_s();
    for (uint64_t i = 0; i < ooms; i++) {
      expseg_status st = expseg_malloc(a, 512, (expseg_stream)(n + 1 + i), &q);
      if (st != EXPSEG_ERR_OUT_OF_MEMORY) {
        fprintf(stderr, "expseg-bench-streams: expected an out-of-memory error, got %d: %s\n",
                (int)st, expseg_last_error());
        return 1;
      }
    }
    double oom = now_s() - t0;
    if (c == 0) printf("# the report: %.300s...\n", expseg_last_error());
    printf("%8" PRIu64 " %10.3f %14.2f %12.3f %14.3f\n", n, fill, fill / (double)n * 1e6, oom,
           oom / (double)ooms * 1e3);
    fflush(stdout);
    for (uint64_t i = 0; i < n; i++) expseg_free(a, p[i]);
    free(p);
    expseg_destroy(a);
  }
  return 0;
}
