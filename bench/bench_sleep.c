/* SPDX-License-Identifier: Apache-2.0 */
/* bench_sleep.c: expseg-bench-sleep, the cost of putting a region to sleep and waking it,
 * against the floor of copying the same bytes, on any driver with bytes (host, cuda) and
 * as driver calls per GiB on sim.
 *
 * A region of --size MiB (blocks of --block MiB) is filled, put to sleep with offload and
 * woken, --rounds times. Bytes go in and out through the driver's own copy
 * (expseg_testing_copy_in/out: memcpy on host, cuMemcpyHtoD/DtoH on cuda), so the tool needs
 * no CUDA toolkit and runs the same on every driver. Each round also times the floor: the
 * region's bytes copied device -> host and host -> device through that same copy, into a
 * pinned staging buffer of one block reused block by block (expseg_host_malloc, the
 * allocator's pinned host pool; pinned memory is what the copies of a sleep use), in the same
 * process on the same memory, so the floor needs one block of host memory, not the region's
 * size. That floor is harsher than the sleep's own work (its one buffer stays hot in the TLB
 * and caches), so where memory allows (--same-work: auto, the default, when the region is at
 * most a quarter of the free host memory) it also times the same work as the sleep's copy:
 * every block copied device -> host through that same copy into a pinned buffer of the
 * region's size, faulted in before the first round, as the host copies a sleep reuses are
 * after its first round; it runs twice just before each sleep, so that all three meet the
 * same moment of a shared machine: the first pass finds the pages' translations cold, as the
 * sleep finds its host copies, the second finds them warm. Ratios are also given round by
 * round. On host it also times a memcpy into freshly mapped pages (what
 * a wake's copy-back meets there: memory given back by the sleep comes back without its
 * pages, each faulted in on first touch): the wake's same-work floor. A sleep and a wake are each split into the time
 * spent copying bytes (expseg_region_info.last_sleep_copy_us / last_wake_copy_us) and the
 * rest (driver calls and bookkeeping), with the process's minor page faults during each.
 * After every wake the first and last 4 KiB of every block are checked, after the last one
 * every byte. --json FILE writes every figure.
 * Public API only (expseg.h, expseg_testing.h). */
#include "tool_args.h"

#include <expseg.h>
#include <expseg_testing.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

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
                                     "host_alloc", "host_free", "stream_synchronize", "copy"};
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
  fprintf(f,
          "usage: expseg-bench-sleep [--driver SPEC (host)] [--size MIB (1024)] [--block MIB "
          "(64)] [--rounds N (3)] [--same-work auto|on|off (auto)] [--json FILE]\n"
          "  SPEC: host, sim or cuda, or a full driver spec (host:capacity=4G); host and sim\n"
          "  alone get a capacity that fits the region.\n"
          "  host, cuda: sleep (offload) + wake of the region against copies of the same bytes\n"
          "  through the driver (the floor), each split into copy time and driver time;\n"
          "  --same-work: also the sleep's copy done as plain copies into a region-sized\n"
          "  pinned buffer already faulted in (auto: when the region is at most a quarter\n"
          "  of the free host memory);\n"
          "  sim: the driver calls of one sleep and one wake per GiB\n");
}

static int cmp_u64(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

static uint64_t median(uint64_t *v, uint64_t n) {
  qsort(v, n, sizeof *v, cmp_u64);
  return v[n / 2];
}

/* The pattern of block `blk` at byte offset `off` (a multiple of 8), n bytes (a multiple of
 * 8): distinct per block and per word, so a block restored at another's address shows. */
static void pattern(uint64_t *w, size_t blk, size_t off, size_t n) {
  const uint64_t k = ((uint64_t)blk + 1) * 0x9E3779B97F4A7C15u;
  for (size_t i = 0; i < n / 8; i++) w[i] = k ^ (off / 8 + i);
}

/* The first differing byte of [dev, dev + n) of block blk at off against its pattern, via
 * the staging buffer; -1 when none; -2 when the copy failed. */
static int64_t check_range(expseg_allocator *a, char *dev, size_t blk, size_t off, size_t n,
                           uint64_t *stage, uint64_t *want) {
  if (expseg_testing_copy_out(a, stage, dev + off, n) != EXPSEG_OK) return -2;
  pattern(want, blk, off, n);
  if (memcmp(stage, want, n) == 0) return -1;
  for (size_t i = 0; i < n; i++)
    if (((unsigned char *)stage)[i] != ((unsigned char *)want)[i]) return (int64_t)(off + i);
  return -1;
}

typedef struct {
  uint64_t sleep, sleep_copy, wake, wake_copy, d2h, h2d, fresh, same, same_warm;
  long sleep_minflt, wake_minflt; /* minor page faults of the process during each */
} round_t;

static long minflt(void) {
  struct rusage u;
  return getrusage(RUSAGE_SELF, &u) == 0 ? u.ru_minflt : 0;
}

int main(int argc, char **argv) {
  const char *driver = "host", *json = NULL;
  uint64_t size_mb = 1024, block_mb = 64, rounds = 3;
  static const char *const same_modes[] = {"auto", "on", "off", NULL};
  int same_mode = 0;
  const _expseg_arg_t table[] = {
      ARG_STR_("--driver", &driver),
      ARG_U64_("--size", &size_mb, 1, 1 << 20),
      ARG_U64_("--block", &block_mb, 1, 1 << 16),
      ARG_U64_("--rounds", &rounds, 1, 100),
      ARG_CHOICE_("--same-work", &same_mode, same_modes),
      ARG_STR_("--json", &json),
  };
  if (_expseg_args_parse("expseg-bench-sleep", argc, argv, table, sizeof table / sizeof table[0],
                         usage) != 0)
    return 2;
  char spec[512];
  if (strcmp(driver, "host") == 0 || strcmp(driver, "sim") == 0)
    snprintf(spec, sizeof spec, "%s:capacity=%" PRIu64 "M", driver, size_mb + 2 * block_mb + 64);
  else
    snprintf(spec, sizeof spec, "%s", driver);
  expseg_allocator *a;
  if (expseg_create(spec, 0, "expandable_segments:True", &a) != EXPSEG_OK) return fail(spec);
  expseg_info info;
  if (expseg_get_info(a, &info) != EXPSEG_OK) return fail("get_info");
  const bool bytes = strcmp(info.driver, "sim") != 0;
  const size_t block = (size_t)block_mb << 20, n = (size_t)((size_mb + block_mb - 1) / block_mb);
  const size_t total = n * block;
  void **p = calloc(n, sizeof *p);
  round_t *t = calloc(rounds, sizeof *t);
  if (!p || !t) return fail("out of host memory");
  /* the staging buffer (pinned, one block), and the pattern to compare with */
  expseg_host_pool *hp = NULL;
  uint64_t *stage = NULL, *want = NULL;
  if (bytes) {
    if (expseg_host_create(spec, 0, NULL, &hp) != EXPSEG_OK) return fail("host pool");
    if (expseg_host_malloc(hp, block, (void **)&stage) != EXPSEG_OK) return fail("staging buffer");
    if ((want = malloc(block)) == NULL) return fail("out of host memory");
  }
  if (expseg_region_begin(a, "r") != EXPSEG_OK) return fail("region_begin");
  for (size_t i = 0; i < n; i++)
    if (expseg_malloc(a, block, 0, &p[i]) != EXPSEG_OK) return fail("malloc");
  if (expseg_region_end(a, "r") != EXPSEG_OK) return fail("region_end");
  for (size_t i = 0; bytes && i < n; i++) {
    pattern(stage, i, 0, block);
    if (expseg_testing_copy_in(a, p[i], stage, block) != EXPSEG_OK) return fail("fill");
  }
  /* the sleep's same-work floor: a pinned destination of the region's size, faulted in
   * before the first round (as a sleep's kept host copies are from its second round on) */
  unsigned char *same = NULL;
  const char *same_state = "off"; /* "measured", "off" (--same-work off), "skipped" */
  char same_why[600] = "off (--same-work off)";
  if (bytes && same_mode != 2) {
    const uint64_t avail = (uint64_t)sysconf(_SC_AVPHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    same_state = "skipped";
    if (same_mode == 0 && total > avail / 4)
      snprintf(same_why, sizeof same_why,
               "skipped: the region (%.2f GiB) is more than a quarter of the free host memory "
               "(%.2f GiB); --same-work on measures it anyway",
               (double)total / (1u << 30), (double)avail / (1u << 30));
    else if (expseg_host_malloc(hp, total, (void **)&same) != EXPSEG_OK) {
      if (same_mode == 1) return fail("--same-work on: a pinned buffer of the region's size");
      snprintf(same_why, sizeof same_why, "skipped: a pinned buffer of the region's size: %s",
               expseg_last_error());
      same = NULL;
    } else {
      memset(same, 0, total);
      same_state = "measured";
    }
  }
  int64_t c0[N_CALLS], c1[N_CALLS], c2[N_CALLS];
  uint64_t checked = 0, mismatches = 0;
  const size_t edge = block < 8192 ? block : 4096;
  for (uint64_t r = 0; r < rounds; r++) {
    /* the sleep's copy as plain copies, twice, just before the sleep (so that all three meet
     * the same moment of a shared machine): the first pass meets source and destination
     * last touched long before, the second the same pages just touched */
    for (int pass = 0; same != NULL && pass < 2; pass++)
      for (size_t i = 0; i < n; i++) {
        const uint64_t s0 = now_ns();
        if (expseg_testing_copy_out(a, same + i * block, p[i], block) != EXPSEG_OK)
          return fail("same-work copy out");
        *(pass ? &t[r].same_warm : &t[r].same) += now_ns() - s0;
      }
    calls(a, c0);
    const long fl0 = minflt();
    uint64_t t0 = now_ns();
    if (expseg_sleep(a, "r", EXPSEG_SLEEP_OFFLOAD) != EXPSEG_OK) return fail("sleep");
    uint64_t t1 = now_ns();
    const long fl1 = minflt();
    calls(a, c1);
    if (expseg_wake(a, "r") != EXPSEG_OK) return fail("wake");
    uint64_t t2 = now_ns();
    t[r].sleep_minflt = fl1 - fl0, t[r].wake_minflt = minflt() - fl1;
    /* memcpy into fresh pages, block by block: right after the wake, so that the memory it
     * gives back (which a virtual machine's free-page reporting may hand to its host
     * meanwhile) is given back as long before the next sleep as the wake's is */
    if (bytes && strcmp(info.driver, "host") == 0) {
      for (size_t i = 0; i < n; i++) {
        unsigned char *fresh = mmap(NULL, block, PROT_READ | PROT_WRITE,
                                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (fresh == MAP_FAILED) return fail("mmap of the fresh-pages floor");
        const uint64_t f0 = now_ns();
        memcpy(fresh, stage, block);
        t[r].fresh += now_ns() - f0;
        munmap(fresh, block);
      }
    }
    calls(a, c2);
    expseg_region_info ri;
    if (expseg_region_get_info(a, "r", &ri) != EXPSEG_OK) return fail("region_get_info");
    t[r].sleep = t1 - t0, t[r].wake = t2 - t1;
    t[r].sleep_copy = ri.last_sleep_copy_us * 1000, t[r].wake_copy = ri.last_wake_copy_us * 1000;
    if (!bytes) continue;
    /* the bytes are back: 4 KiB at both ends of every block, every byte after the last wake */
    const bool all = r + 1 == rounds;
    for (size_t i = 0; i < n; i++) {
      const size_t offs[2] = {0, block - edge};
      for (int e = 0; e < (all ? 1 : 2); e++) {
        const size_t off = all ? 0 : offs[e], len = all ? block : edge;
        const int64_t bad = check_range(a, p[i], i, off, len, stage, want);
        if (bad == -2) return fail("copy out for the check");
        checked += len;
        if (bad >= 0) {
          mismatches++;
          fprintf(stderr, "expseg-bench-sleep: round %" PRIu64 ": block %zu (%p) differs at byte "
                  "%" PRId64 "\n", r + 1, i, p[i], bad);
        }
      }
    }
    /* the floor: every block out to the staging buffer and back in, through the same copy */
    for (size_t i = 0; i < n; i++) {
      const uint64_t m0 = now_ns();
      if (expseg_testing_copy_out(a, stage, p[i], block) != EXPSEG_OK) return fail("floor copy out");
      const uint64_t m1 = now_ns();
      if (expseg_testing_copy_in(a, p[i], stage, block) != EXPSEG_OK) return fail("floor copy in");
      t[r].d2h += m1 - m0, t[r].h2d += now_ns() - m1;
    }
  }
  const round_t first = t[0];
  uint64_t v[9][100];
  for (uint64_t r = 0; r < rounds; r++) {
    v[0][r] = t[r].sleep, v[1][r] = t[r].sleep_copy, v[2][r] = t[r].wake;
    v[3][r] = t[r].wake_copy, v[4][r] = t[r].d2h, v[5][r] = t[r].h2d, v[6][r] = t[r].fresh;
    v[7][r] = t[r].same, v[8][r] = t[r].same_warm;
  }
  const double sl = median(v[0], rounds) / 1e6, slc = median(v[1], rounds) / 1e6,
               wk = median(v[2], rounds) / 1e6, wkc = median(v[3], rounds) / 1e6,
               d2h = median(v[4], rounds) / 1e6, h2d = median(v[5], rounds) / 1e6,
               fresh = median(v[6], rounds) / 1e6, same_ms = median(v[7], rounds) / 1e6,
               warm_ms = median(v[8], rounds) / 1e6;
  const double gib = (double)total / (1u << 30);
  printf("driver %s (%s), region %.2f GiB in %zu blocks of %" PRIu64 " MiB, median of %" PRIu64
         " rounds\n",
         info.driver, spec, gib, n, block_mb, rounds);
  printf("sleep (offload) %.1f ms = copy %.1f + driver %.1f; wake %.1f ms = copy %.1f + driver "
         "%.1f; sleep + wake %.1f ms\n",
         sl, slc, sl - slc, wk, wkc, wk - wkc, sl + wk);
  printf("first round (host copies made): sleep %.1f ms (copy %.1f), wake %.1f ms (copy %.1f)\n",
         first.sleep / 1e6, first.sleep_copy / 1e6, first.wake / 1e6, first.wake_copy / 1e6);
  if (bytes) {
    printf("floor: device -> host %.1f ms (%.1f GB/s), host -> device %.1f ms (%.1f GB/s), "
           "through a %zu MiB pinned buffer\n",
           d2h, total / d2h / 1e6, h2d, total / h2d / 1e6, block >> 20);
    printf("sleep copy / d2h %.2f, wake copy / h2d %.2f, copies / floor %.2f, sleep + wake / "
           "floor %.2f\n",
           slc / d2h, wkc / h2d, (slc + wkc) / (d2h + h2d), (sl + wk) / (d2h + h2d));
    if (same != NULL) {
      printf("same-work floor (sleep): device -> host into a region-sized pinned buffer already "
             "faulted in, twice just before each sleep: first pass %.1f ms (%.1f GB/s), second "
             "pass %.1f ms (%.1f GB/s)\n",
             same_ms, total / same_ms / 1e6, warm_ms, total / warm_ms / 1e6);
      /* round by round, from round 2 where there is one (round 1 makes the host copies) */
      double lo[2] = {0, 0}, hi[2] = {0, 0};
      const uint64_t r0 = rounds > 1 ? 1 : 0;
      for (uint64_t r = r0; r < rounds; r++)
        for (int k = 0; k < 2; k++) {
          const uint64_t d = k ? t[r].same_warm : t[r].same;
          const double x = d ? (double)t[r].sleep_copy / (double)d : 0;
          if (r == r0 || x < lo[k]) lo[k] = x;
          if (r == r0 || x > hi[k]) hi[k] = x;
        }
      printf("sleep copy / first pass %.2f (round by round%s: %.2f to %.2f), / second pass %.2f "
             "(%.2f to %.2f)\n",
             slc / same_ms, r0 ? " from round 2" : "", lo[0], hi[0], slc / warm_ms, lo[1], hi[1]);
    }
    else
      printf("same-work floor (sleep): %s\n", same_why);
    if (fresh > 0)
      printf("same-work floor (wake): memcpy into fresh pages (one way) %.1f ms: wake copy / "
             "that %.2f\n",
             fresh, wkc / fresh);
    printf("minor page faults (last round): sleep %ld, wake %ld\n", t[rounds - 1].sleep_minflt,
           t[rounds - 1].wake_minflt);
    printf("bytes checked %" PRIu64 ", mismatches %" PRIu64 "\n", checked, mismatches);
  }
  printf("driver calls per GiB (last round):");
  for (int i = 0; i < N_CALLS; i++)
    printf(" %s %.1f+%.1f", kCalls[i], (c1[i] - c0[i]) / gib, (c2[i] - c1[i]) / gib);
  printf("  (sleep+wake)\n");
  if (json) {
    FILE *f = fopen(json, "w");
    if (!f) {
      fprintf(stderr, "expseg-bench-sleep: --json %s: cannot write\n", json);
      return 1;
    }
    fprintf(f,
            "{\"driver\": \"%s\", \"bytes\": %s, \"size_bytes\": %zu, \"block_bytes\": %zu, "
            "\"rounds\": %" PRIu64 ", \"staging_bytes\": %zu,\n"
            " \"sleep_ms\": %.3f, \"sleep_copy_ms\": %.3f, \"wake_ms\": %.3f, \"wake_copy_ms\": "
            "%.3f,\n"
            " \"first_sleep_ms\": %.3f, \"first_wake_ms\": %.3f,\n"
            " \"floor_d2h_ms\": %.3f, \"floor_h2d_ms\": %.3f, \"fresh_pages_ms\": %.3f,\n"
            " \"same_work\": \"%s\", \"same_work_d2h_ms\": %.3f, \"same_work_bytes\": %zu,\n"
            " \"same_work_second_d2h_ms\": %.3f,\n"
            " \"sleep_minflt\": %ld, \"wake_minflt\": %ld,\n"
            " \"checked_bytes\": %" PRIu64 ", \"mismatches\": %" PRIu64 ", \"calls_per_gib\": {",
            info.driver, bytes ? "true" : "false", total, block, rounds, bytes ? block : 0, sl, slc,
            wk, wkc, first.sleep / 1e6, first.wake / 1e6, d2h, h2d, fresh, same_state,
            same ? same_ms : 0.0, same ? total : (size_t)0, same ? warm_ms : 0.0,
            t[rounds - 1].sleep_minflt,
            t[rounds - 1].wake_minflt, checked, mismatches);
    for (int i = 0; i < N_CALLS; i++)
      fprintf(f, "%s\"%s\": [%.2f, %.2f]", i ? ", " : "", kCalls[i], (c1[i] - c0[i]) / gib,
              (c2[i] - c1[i]) / gib);
    fprintf(f, "}}\n");
    fclose(f);
  }
  for (size_t i = 0; i < n; i++) (void)expseg_free(a, p[i]);
  expseg_destroy(a);
  if (hp) {
    if (same) (void)expseg_host_free(hp, same);
    (void)expseg_host_free(hp, stage);
    expseg_host_destroy(hp);
  }
  free(p), free(t), free(want);
  return mismatches ? 1 : 0;
}
