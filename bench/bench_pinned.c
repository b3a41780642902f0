/* SPDX-License-Identifier: Apache-2.0 */
/* bench_pinned.c: expseg-bench-pinned, host memory held by the pinned host pool against the
 * memory live, on one seeded workload of mixed sizes, under each block policy in the same
 * run: power-of-two blocks (PyTorch's default), exact page-rounded blocks carved from
 * shared segments (pinned_max_round_threshold_mb), and the same with pinned_carve_strict
 * (a whole free segment larger than a fresh one is given back rather than cut). Sizes are drawn log-uniformly from --min
 * to --max KiB (any byte count, as tensors have). Two shapes (--shape):
 *  - resident: buffers are allocated until --live MiB are live and kept (offloaded weights,
 *    a host KV cache), then the remaining --ops steps allocate staging buffers and free
 *    each 8 allocations later (copies in flight);
 *  - churn: each step frees a random live block when the live bytes exceed --live MiB (or
 *    with probability 0.4), else allocates: random lifetimes, the hard case for any pool.
 * Reported per policy: held / live when the live bytes first reach --live (the resident
 * set complete), peak held (reserved_bytes.peak) / peak live, the largest held / live seen
 * after that first moment, driver chunks made and given back, and the run's wall time (page
 * faulting and the driver calls dominate it).
 * The memory is real (pinned where the OS allows): keep --live modest on a shared machine. */
#include "tool_args.h"

#include <expseg.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  const char *driver, *shape;
  uint64_t ops, live_mb, min_kb, max_kb, seed;
} args_t;

static void usage(FILE *f) {
  fprintf(f, "usage: expseg-bench-pinned [options]\n"
             "  --driver SPEC   driver spec (default host)\n"
             "  --ops N         steps (default 20000)\n"
             "  --live MiB      live bytes the workload holds at most (default 512)\n"
             "  --min KiB       smallest request (default 256)\n"
             "  --max KiB       largest request (default 65536)\n"
             "  --seed N        workload seed (default 1)\n"
             "  --shape S       resident or churn (default resident)\n");
}

static uint64_t next(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return *x;
}

typedef struct {
  void *p;
  size_t size;
} live_t;

typedef struct {
  int64_t peak_held, chunks, chunks_freed;
  double seconds;
  uint64_t peak_live;
  double first; /* held / live when live first reached the target */
  double worst; /* held / live after the first time live reached the target */
} result_t;

static int64_t hstat(expseg_host_pool *h, const char *key) {
  int64_t v = 0;
  if (expseg_host_stat(h, key, &v) != EXPSEG_OK) {
    fprintf(stderr, "expseg-bench-pinned: %s\n", expseg_last_error());
    exit(1);
  }
  return v;
}

static int run(const args_t *a, const char *config, result_t *r) {
  expseg_host_pool *h = NULL;
  if (expseg_host_create(a->driver, 0, config, &h) != EXPSEG_OK) {
    fprintf(stderr, "expseg-bench-pinned: %s\n", expseg_last_error());
    return -1;
  }
  live_t *live = calloc(a->ops, sizeof *live);
  if (!live) return -1;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  size_t n = 0;
  uint64_t x = a->seed * 0x9E3779B97F4A7C15ull + 1, bytes = 0, target = a->live_mb << 20;
  bool reached = false;
  memset(r, 0, sizeof *r);
  double lo = (double)a->min_kb * 1024, ratio = (double)a->max_kb / (double)a->min_kb;
  const bool churn = strcmp(a->shape, "churn") == 0;
  size_t resident = 0; /* resident: live[0, resident) stay; staging blocks follow, FIFO */
  for (uint64_t op = 0; op < a->ops; op++) {
    bool drop;
    if (churn) drop = n > 0 && (bytes > target || next(&x) % 10 < 4);
    else if (!reached) drop = false;
    else drop = n - resident >= 8;
    if (drop) {
      size_t i = churn ? next(&x) % n : resident;
      bytes -= live[i].size;
      if (expseg_host_free(h, live[i].p) != EXPSEG_OK) goto fail;
      if (churn) live[i] = live[--n];
      else memmove(&live[i], &live[i + 1], (--n - i) * sizeof *live);
    } else {
      double u = (double)(next(&x) >> 11) / 9007199254740992.0; /* [0, 1) */
      size_t size = (size_t)(lo * pow(ratio, u)) + next(&x) % 4096;
      void *p = NULL;
      if (expseg_host_malloc(h, size, &p) != EXPSEG_OK) goto fail;
      ((volatile char *)p)[0] = 1;
      live[n++] = (live_t){p, size};
      bytes += size;
    }
    if (bytes > r->peak_live) r->peak_live = bytes;
    if (bytes >= target && !reached) {
      reached = true;
      resident = n;
      r->first = (double)hstat(h, "reserved_bytes.current") / (double)bytes;
    }
    if (reached && bytes > 0) {
      double q = (double)hstat(h, "reserved_bytes.current") / (double)bytes;
      if (q > r->worst) r->worst = q;
    }
  }
  r->peak_held = hstat(h, "reserved_bytes.peak");
  r->chunks = hstat(h, "num_host_alloc");
  r->chunks_freed = hstat(h, "num_host_free");
  clock_gettime(CLOCK_MONOTONIC, &t1);
  r->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  for (size_t i = 0; i < n; i++) (void)expseg_host_free(h, live[i].p);
  free(live);
  expseg_host_destroy(h);
  return 0;
fail:
  fprintf(stderr, "expseg-bench-pinned (%s): %s\n", config, expseg_last_error());
  free(live);
  expseg_host_destroy(h);
  return -1;
}

int main(int argc, char **argv) {
  args_t a = {"host", "resident", 20000, 512, 256, 65536, 1};
  const _expseg_arg_t opts[] = {
      ARG_STR_("--driver", &a.driver),   ARG_STR_("--shape", &a.shape),   ARG_U64_("--ops", &a.ops, 1, 100000000),
      ARG_U64_("--live", &a.live_mb, 1, 1u << 20), ARG_U64_("--min", &a.min_kb, 4, 1u << 24),
      ARG_U64_("--max", &a.max_kb, 4, 1u << 24),   ARG_U64_("--seed", &a.seed, 0, UINT64_MAX),
  };
  if (_expseg_args_parse("expseg-bench-pinned", argc, argv, opts, sizeof opts / sizeof opts[0],
                         usage))
    return 2;
  if (strcmp(a.shape, "resident") != 0 && strcmp(a.shape, "churn") != 0) {
    fprintf(stderr, "expseg-bench-pinned: --shape '%s': accepted: resident or churn\n", a.shape);
    return 2;
  }
  if (a.max_kb < a.min_kb) {
    fprintf(stderr, "expseg-bench-pinned: --max %" PRIu64 " is below --min %" PRIu64 "\n",
            a.max_kb, a.min_kb);
    return 2;
  }
  const char *configs[][2] = {
      {"power of two (default)", ""},
      {"exact, carved", "pinned_max_round_threshold_mb:1"},
      {"exact, carved, strict", "pinned_max_round_threshold_mb:1,pinned_carve_strict:True"}};
  printf("workload: %s, %" PRIu64 " ops, live %" PRIu64 " MiB, sizes %" PRIu64 " KiB .. %" PRIu64
         " KiB log-uniform, seed %" PRIu64 ", driver %s\n",
         a.shape, a.ops, a.live_mb, a.min_kb, a.max_kb, a.seed, a.driver);
  printf("| policy | config | held / live at --live | peak live MiB | peak held MiB | peak held / peak live | worst held / live after | chunks made / given back | s |\n");
  printf("|---|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
    result_t r;
    if (run(&a, configs[i][1], &r) != 0) return 1;
    printf("| %s | `%s` | %.3f | %.1f | %.1f | %.3f | %.3f | %" PRId64 " / %" PRId64 " | %.2f |\n",
           configs[i][0], configs[i][1], r.first, (double)r.peak_live / 1048576.0,
           (double)r.peak_held / 1048576.0, (double)r.peak_held / (double)r.peak_live, r.worst,
           r.chunks, r.chunks_freed, r.seconds);
  }
  return 0;
}
