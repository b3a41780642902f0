/* SPDX-License-Identifier: Apache-2.0 */
/* bench_host.c: expseg-bench-host, the pinned host pool's two costs.
 *  - hit: expseg_host_malloc + expseg_host_free of one cached block, in batches; the median
 *    batch gives ns per pair (with events processed on the caller's thread, and with
 *    pinned_use_background_threads:True);
 *  - fill: the time to make and fill a fresh chunk of --size MiB on the register path with
 *    1, 2, 4 and 8 pre-faulting threads (pinned_num_register_threads), on the create path,
 *    and, for reference, mmap + one thread touching every page. Median of --rounds, each on
 *    a new pool. --huge both (the default) fills each way twice, with pinned_huge_pages:True
 *    (transparent huge pages advised, the default) and :False (on / off: one way).
 * Host-to-device copy bandwidth needs a GPU (docs/benchmarks.md). */
#include "tool_args.h"
#include "trace_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static uint64_t median(uint64_t *v, size_t n) {
  qsort(v, n, sizeof *v, _expseg_u64_cmp);
  return v[n / 2];
}

typedef struct {
  const char *driver;
  uint64_t size_mb, rounds, batches, batch, block;
  uint64_t threads[8];
  size_t n_threads;
  int huge; /* index in kHuge */
} args_t;

static const char *const kHuge[] = {"both", "on", "off", NULL};

static void usage(FILE *f) {
  fprintf(f, "usage: expseg-bench-host [options]\n"
             "  --driver SPEC   driver spec (default host:numa=0)\n"
             "  --size MiB      chunk filled per round (default 256)\n"
             "  --rounds N      fills per configuration (default 7)\n"
             "  --threads LIST  pre-faulting threads, comma-separated (default 1,2,4,8)\n"
             "  --huge WHICH    fills with transparent huge pages advised: on, off or both\n"
             "                  (default both)\n"
             "  --block BYTES   block size of the hit loop (default 65536)\n"
             "  --batches N     timed hit batches (default 200)\n"
             "  --batch N       malloc+free pairs per batch (default 10000)\n");
}

static int parse_args(int argc, char **argv, args_t *a) {
  *a = (args_t){"host:numa=0", 256, 7, 200, 10000, 65536, {1, 2, 4, 8}, 4, 0};
  const _expseg_arg_t opts[] = {
      ARG_STR_("--driver", &a->driver),
      ARG_U64_("--size", &a->size_mb, 1, 65536),
      ARG_U64_("--rounds", &a->rounds, 1, 1000),
      ARG_U64_("--block", &a->block, 1, 1ull << 34),
      ARG_U64_("--batches", &a->batches, 1, 100000),
      ARG_U64_("--batch", &a->batch, 1, UINT64_MAX),
      ARG_LIST_("--threads", a->threads, 1, 128, &a->n_threads, 8),
      ARG_CHOICE_("--huge", &a->huge, kHuge),
  };
  if (_expseg_args_parse("expseg-bench-host", argc, argv, opts, sizeof opts / sizeof opts[0],
                         usage))
    return -1;
  for (size_t i = 0; i < a->n_threads; i++)
    if (a->threads[i] & (a->threads[i] - 1)) {
      fprintf(stderr, "expseg-bench-host: --threads: %" PRIu64 " is not a power of two\n",
              a->threads[i]);
      return -1;
    }
  return 0;
}

static expseg_host_pool *open_pool(const char *driver, const char *conf) {
  expseg_host_pool *h = NULL;
  if (expseg_host_create(driver, 0, conf, &h) != EXPSEG_OK)
    fprintf(stderr, "expseg-bench-host: %s / %s: %s\n", driver, conf, expseg_last_error());
  return h;
}

/* ns per malloc+free pair of a cached block (median batch). */
static int bench_hit(const args_t *a, const char *conf) {
  expseg_host_pool *h = open_pool(a->driver, conf);
  if (!h) return 1;
  void *p = NULL;
  int rc = expseg_host_malloc(h, a->block, &p) != EXPSEG_OK || expseg_host_free(h, p) != EXPSEG_OK;
  uint64_t *t = calloc(a->batches, sizeof *t);
  for (uint64_t b = 0; !rc && b < a->batches; b++) {
    uint64_t t0 = _expseg_bench_now_ns();
    for (uint64_t i = 0; i < a->batch && !rc; i++)
      rc = expseg_host_malloc(h, a->block, &p) != EXPSEG_OK || expseg_host_free(h, p) != EXPSEG_OK;
    t[b] = _expseg_bench_now_ns() - t0;
  }
  if (rc) fprintf(stderr, "expseg-bench-host: hit loop: %s\n", expseg_last_error());
  else
    printf("hit   %-40s block %8llu  %8.1f ns per malloc+free (median of %llu batches of %llu)\n",
           conf, (unsigned long long)a->block, (double)median(t, a->batches) / (double)a->batch,
           (unsigned long long)a->batches, (unsigned long long)a->batch);
  free(t);
  expseg_host_destroy(h);
  return rc;
}

static void report_fill(const char *what, uint64_t *t, uint64_t rounds, size_t size) {
  uint64_t m = median(t, rounds);
  printf("fill  %-40s %6zu MiB  %8.2f ms  %6.2f GiB/s (median of %llu; min %.2f ms)\n", what,
         size >> 20, (double)m / 1e6, (double)size / (double)m * 1e9 / (double)(1u << 30),
         (unsigned long long)rounds, (double)t[0] / 1e6);
}

/* Time of expseg_host_malloc of a fresh chunk (a new pool per round). */
static int bench_fill(const args_t *a, const char *conf, const char *label) {
  size_t size = (size_t)a->size_mb << 20;
  uint64_t *t = calloc(a->rounds, sizeof *t);
  int rc = 0;
  for (uint64_t r = 0; r < a->rounds && !rc; r++) {
    expseg_host_pool *h = open_pool(a->driver, conf);
    if (!h) { rc = 1; break; }
    void *p = NULL;
    uint64_t t0 = _expseg_bench_now_ns();
    rc = expseg_host_malloc(h, size, &p) != EXPSEG_OK;
    t[r] = _expseg_bench_now_ns() - t0;
    if (rc) fprintf(stderr, "expseg-bench-host: fill: %s\n", expseg_last_error());
    expseg_host_destroy(h);
  }
  if (!rc) report_fill(label, t, a->rounds, size);
  free(t);
  return rc;
}

/* Reference: mmap + one thread writing a byte per page (what a first touch costs). */
static void bench_plain(const args_t *a) {
  size_t size = (size_t)a->size_mb << 20, page = (size_t)sysconf(_SC_PAGESIZE);
  uint64_t *t = calloc(a->rounds, sizeof *t);
  for (uint64_t r = 0; r < a->rounds; r++) {
    uint64_t t0 = _expseg_bench_now_ns();
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { free(t); return; }
    for (size_t i = 0; i < size; i += page) ((volatile char *)p)[i] = 0;
    t[r] = _expseg_bench_now_ns() - t0;
    munmap(p, size);
  }
  report_fill("plain mmap + 1 thread touching", t, a->rounds, size);
  free(t);
}

int main(int argc, char **argv) {
  args_t a;
  if (parse_args(argc, argv, &a)) return 2;
  expseg_set_log_sink(NULL, NULL);
  printf("# driver %s\n", a.driver);
  int rc = bench_hit(&a, "pinned_use_background_threads:False");
  rc |= bench_hit(&a, "pinned_use_background_threads:True");
  char conf[160], label[160];
  for (int h = 1; h <= 2; h++) { /* on, off */
    if (a.huge != 0 && a.huge != h) continue;
    const char *hp = h == 1 ? "huge pages" : "small pages";
    const char *hk = h == 1 ? "True" : "False";
    for (size_t i = 0; i < a.n_threads && !rc; i++) {
      snprintf(conf, sizeof conf,
               "pinned_use_cuda_host_register:True,pinned_num_register_threads:%llu,"
               "pinned_huge_pages:%s",
               (unsigned long long)a.threads[i], hk);
      snprintf(label, sizeof label, "register, %llu thread(s), %s", (unsigned long long)a.threads[i],
               hp);
      rc |= bench_fill(&a, conf, label);
    }
    snprintf(label, sizeof label, "create path, %s", hp);
    snprintf(conf, sizeof conf, "pinned_use_cuda_host_register:False,pinned_huge_pages:%s", hk);
    if (!rc) rc |= bench_fill(&a, conf, label);
  }
  if (!rc) bench_plain(&a);
  return rc;
}
