/* SPDX-License-Identifier: Apache-2.0 */
/* bench_safe_free.c: expseg-bench-safe-free, the cost of the PyTorch plug's safe mode
 * (expseg_torch_set_safe_free: frees deferred and completed in batches after a device-wide
 * synchronization, docs/torch.md "Safe record_stream") against plain frees, in one run.
 *
 * The workload is PyTorch's view of the plug: expseg_torch_alloc / expseg_torch_free on
 * --live slots; each step picks a slot at random and frees its block, or allocates one of a
 * log-uniform size (512 B .. --max-mb) on one of 4 streams. Rounds alternate plain (device
 * 0) and safe (device 1) on fresh allocators of the same driver, so both see the same
 * machine state; the best round of each is reported in operations (alloc or free) per
 * second, with the device-wide synchronizations the safe rounds made. On host and sim a
 * synchronization returns at once: the figure is the bookkeeping cost of the mode (the
 * deferred list, the would-grow check, batch completion and the larger cache it leads to),
 * not the GPU wait, which depends on the work in flight. Seeded (--seed). */
#include "expseg_torch.h"
#include "rand.h" /* base/ */

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  void *p;
  size_t size;
} slot_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int64_t stat_of(int device, const char *key) {
  int64_t v = -1;
  (void)expseg_torch_stat(device, key, &v);
  return v;
}

/* One round on the device: ops steps over the slots; returns ops/s, or -1 on failure. */
static double round_on(int device, slot_t *slots, size_t live, uint64_t ops, size_t max_size,
                       uint64_t seed) {
  uint64_t rng = seed;
  memset(slots, 0, live * sizeof *slots);
  double t0 = now_s();
  for (uint64_t i = 0; i < ops; i++) {
    slot_t *s = &slots[_expseg_splitmix64(&rng) % live];
    if (s->p) {
      expseg_torch_free(s->p, s->size, device, NULL);
      s->p = NULL;
      continue;
    }
    double u = (double)(_expseg_splitmix64(&rng) >> 11) / 9007199254740992.0;
    size_t size = (size_t)(512.0 * pow((double)max_size / 512.0, u));
    void *stream = (void *)(uintptr_t)(_expseg_splitmix64(&rng) % 4);
    s->p = expseg_torch_alloc(size, device, stream);
    if (!s->p) {
      fprintf(stderr, "expseg-bench-safe-free: %s\n", expseg_torch_last_error(device));
      return -1;
    }
    s->size = size;
  }
  double t = now_s() - t0;
  for (size_t i = 0; i < live; i++)
    if (slots[i].p) expseg_torch_free(slots[i].p, slots[i].size, device, NULL);
  return (double)ops / t;
}

static int usage(FILE *f, int rc) {
  fprintf(f, "usage: expseg-bench-safe-free [--driver SPEC] [--ops N] [--live N] [--max-mb N]\n"
             "                              [--batch N] [--rounds N] [--seed N]\n"
             "  --driver SPEC  host or sim spec (default host:capacity=8G)\n"
             "  --ops N        steps per round (default 200000)\n"
             "  --live N       slots (default 256)\n"
             "  --max-mb N     largest allocation in MiB (default 8)\n"
             "  --batch N      safe mode's batch size (default 256, as install())\n"
             "  --rounds N     rounds of each mode (default 3; the best is reported)\n"
             "  --seed N       workload seed (default 1)\n");
  return rc;
}

int main(int argc, char **argv) {
  const char *driver = "host:capacity=8G";
  unsigned long long ops = 200000, live = 256, max_mb = 8, batch = 256, rounds = 3, seed = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--help")) return usage(stdout, 0);
    if (i + 1 >= argc) return usage(stderr, 2);
    const char *k = argv[i], *v = argv[++i];
    if (!strcmp(k, "--driver")) {
      driver = v;
      continue;
    }
    char *end = NULL;
    unsigned long long n = strtoull(v, &end, 10);
    if (!*v || *end || n == 0) {
      fprintf(stderr, "expseg-bench-safe-free: %s %s: expected a whole number > 0\n", k, v);
      return 2;
    }
    if (!strcmp(k, "--ops")) ops = n;
    else if (!strcmp(k, "--live")) live = n;
    else if (!strcmp(k, "--max-mb")) max_mb = n;
    else if (!strcmp(k, "--batch")) batch = n;
    else if (!strcmp(k, "--rounds")) rounds = n;
    else if (!strcmp(k, "--seed")) seed = n;
    else return usage(stderr, 2);
  }
  if (strncmp(driver, "host", 4) && strncmp(driver, "sim", 3)) {
    fprintf(stderr, "expseg-bench-safe-free: --driver %s: expected a host or sim spec\n",
            driver);
    return 2;
  }
  setenv("EXPSEG_DRIVER", driver, 1);
  slot_t *slots = calloc(live, sizeof *slots);
  if (!slots) return 1;
  double best[2] = {0, 0};
  for (unsigned long long r = 0; r < rounds; r++) {
    for (int mode = 0; mode < 2; mode++) {
      if (expseg_torch_set_safe_free(mode ? (int)batch : 0) != EXPSEG_OK) {
        fprintf(stderr, "expseg-bench-safe-free: %s\n", expseg_torch_last_error(-1));
        return 1;
      }
      double v = round_on(mode, slots, live, ops, (size_t)max_mb << 20, seed);
      if (v < 0) return 1;
      if (v > best[mode]) best[mode] = v;
    }
  }
  (void)expseg_torch_set_safe_free(0);
  printf("driver %s, %llu steps x %llu rounds, %llu slots, 512 B..%llu MiB, seed %llu\n",
         driver, ops, rounds, live, max_mb, seed);
  printf("plain: %.0f ops/s\n", best[0]);
  printf("safe (batch %llu): %.0f ops/s (%.2fx), %" PRId64 " device synchronizations, "
         "peak reserved %" PRId64 " vs %" PRId64 " bytes\n",
         batch, best[1], best[1] / best[0], stat_of(1, "expseg.driver.device_synchronize"),
         stat_of(1, "reserved_bytes.all.peak"), stat_of(0, "reserved_bytes.all.peak"));
  free(slots);
  return 0;
}
