/* bench_driver.c: expseg-bench-driver, the cost of each driver call. For chunk sizes of
 * 2 MiB and 20 MiB (or --sizes), repeats reserve -> create -> map -> set_access -> unmap ->
 * release -> unreserve through the checked wrappers of vmm/vmm.h and reports the median and
 * p99 of each call in microseconds. On `cuda` this is the physical floor of growth
 * (docs/benchmarks.md); on `host` it is a range of a memfd arena + mmap; on `sim` bookkeeping. */
#include "error.h"
#include "tool_args.h"
#include "trace_internal.h"
#include "vmm.h"
#include "tool_version.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { K_CREATE, K_MAP, K_ACCESS, K_UNMAP, K_RELEASE, K_COUNT };
static const char *const kind_names[K_COUNT] = {"create", "map", "set_access", "unmap",
                                                "release"};

static void usage(FILE *f) {
  fprintf(f, "usage: expseg-bench-driver [--driver SPEC] [--rounds N] [--sizes MB,MB]\n"
             "  --driver SPEC  driver spec (default host:capacity=1G)\n"
             "  --rounds N     repetitions per size (default 200)\n"
             "  --sizes LIST   chunk sizes in MiB (default 2,20)\n");
}

/* One size: times every call of every round; returns 0, or 1 on a driver failure. */
static int bench_size(expseg_vmm_t *v, size_t size, unsigned rounds, const char *spec) {
  uint64_t *t[K_COUNT];
  for (int k = 0; k < K_COUNT; k++) t[k] = calloc(rounds, sizeof *t[k]);
  int rc = 0;
  for (unsigned r = 0; r < rounds && rc == 0; r++) {
    uintptr_t va = 0;
    expseg_vmm_handle h = 0;
    uint64_t s0, s1;
    if (_expseg_vmm_reserve(v, size, 0, &va) != EXPSEG_OK) rc = 1;
    s0 = _expseg_bench_now_ns();
    if (!rc && _expseg_vmm_create(v, size, &h) != EXPSEG_OK) rc = 1;
    s1 = _expseg_bench_now_ns();
    t[K_CREATE][r] = s1 - s0;
    if (!rc && _expseg_vmm_map(v, va, size, h, 0) != EXPSEG_OK) rc = 1;
    s0 = _expseg_bench_now_ns();
    t[K_MAP][r] = s0 - s1;
    if (!rc && _expseg_vmm_set_access(v, va, size) != EXPSEG_OK) rc = 1;
    s1 = _expseg_bench_now_ns();
    t[K_ACCESS][r] = s1 - s0;
    if (!rc && _expseg_vmm_unmap(v, va, size) != EXPSEG_OK) rc = 1;
    s0 = _expseg_bench_now_ns();
    t[K_UNMAP][r] = s0 - s1;
    if (!rc && _expseg_vmm_release(v, h, size) != EXPSEG_OK) rc = 1;
    s1 = _expseg_bench_now_ns();
    t[K_RELEASE][r] = s1 - s0;
    if (!rc && _expseg_vmm_unreserve(v, va, size) != EXPSEG_OK) rc = 1;
    if (rc) fprintf(stderr, "expseg-bench-driver: round %u: %s\n", r, expseg_last_error());
  }
  if (rc == 0) {
    for (int k = 0; k < K_COUNT; k++) {
      qsort(t[k], rounds, sizeof *t[k], _expseg_u64_cmp);
      size_t p99 = (size_t)((double)rounds * 0.99);
      if (p99 >= rounds) p99 = rounds - 1;
      printf("%-28s %8zu %-11s %10.2f %10.2f\n", spec, size >> 20, kind_names[k],
             (double)t[k][rounds / 2] / 1e3, (double)t[k][p99] / 1e3);
    }
  }
  for (int k = 0; k < K_COUNT; k++) free(t[k]);
  return rc;
}

int main(int argc, char **argv) {
  if (expseg_tool_version(argc, argv, "expseg-bench-driver")) return 0;
  const char *spec = "host:capacity=1G";
  uint64_t rounds = 200;
  uint64_t sizes[8] = {2, 20};
  size_t n_sizes = 2;
  const _expseg_arg_t opts[] = {
      ARG_STR_("--driver", &spec),
      ARG_U64_("--rounds", &rounds, 1, 1000000),
      ARG_LIST_("--sizes", sizes, 1, 65536, &n_sizes, 8),
  };
  if (_expseg_args_parse("expseg-bench-driver", argc, argv, opts, sizeof opts / sizeof opts[0],
                         usage))
    return 2;
  expseg_vmm_t *v = NULL;
  if (_expseg_vmm_open(spec, 0, &v) != EXPSEG_OK) {
    fprintf(stderr, "expseg-bench-driver: %s\n", expseg_last_error());
    return 2;
  }
  printf("# %" PRIu64 " rounds per size; microseconds per call\n", rounds);
  printf("%-28s %8s %-11s %10s %10s\n", "driver", "MiB", "call", "median us", "p99 us");
  int rc = 0;
  for (size_t i = 0; i < n_sizes && rc == 0; i++) {
    size_t size = sizes[i] << 20;
    if (size % v->granularity != 0) size = (size / v->granularity + 1) * v->granularity;
    rc = bench_size(v, size, (unsigned)rounds, spec);
  }
  _expseg_vmm_close(v);
  return rc;
}
