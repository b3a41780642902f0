/* SPDX-License-Identifier: Apache-2.0 */
/* bench_hit.c: expseg-bench-hit, the cache-hit path: one expseg_malloc + expseg_free pair
 * served from cached memory, timed pair by pair against a floor, for request sizes drawn from a recorded
 * trace (or a synthetic workload: --synth, the default), with 0 .. 1M other blocks live while timing.
 *
 * Method: sizes are drawn (splitmix64, --seed) from the 'a' events of the trace, so their
 * mix is the program's. For each live count L the allocator is created fresh; 2L blocks
 * (sizes from the same draw) are allocated and every other one freed, so L blocks are live
 * and up to L cached free blocks sit between them in the free index (--holes 0: only the
 * L live blocks); then every size of
 * the sequence is allocated and freed once (warm-up), so that every timed pair is a hit.
 * That is checked: the device allocations made while timing are reported (0 = every pair
 * was a hit).
 * Every pair is timed on its own (--batch 1, the default: the time-stamp counter read
 * around each malloc+free, calibrated against clock_gettime over the run; clock_gettime
 * where there is no such counter); --batch N times batches of N pairs instead. The median
 * and 99th percentile per pair are reported, and the timer's own cost (two reads back to
 * back, median) beside them.
 * --cut BYTES allocates one block of BYTES and frees it before the live set, so that the live
 * set and the timed requests are cut from one free block far larger than each of them (a
 * large free block at the end of a segment: its rest stays free after every split).
 * The floor, measured in the same run with the same size sequence and the same timing: a
 * mutex plus a LIFO stack per exact size (sizes rounded to 512 B and found by an
 * open-addressing table; free pushes onto the stack the node came from), the least a
 * thread-safe caching allocator does on a hit. ratio = median pair / median floor pair,
 * both with the timer's cost subtracted. --history on|stacks records the
 * allocation history (expseg_record_history_ex, a ring of --history-entries events, wrapped
 * many times while timing) without or with C stacks. Results: docs/benchmarks.md. */
#include "trace.h"
#include "trace_internal.h"
#include "tool_args.h"
#include "tool_version.h"

#include <errno.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SEQ 4096 /* sizes in the timed sequence (power of two) */

/* ---- the timer: the time-stamp counter where there is one ---- */
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
static inline uint64_t ticks(void) {
  _mm_lfence();
  uint64_t t = __rdtsc();
  _mm_lfence();
  return t;
}
#define TIMER_NAME "rdtsc"
#else
static inline uint64_t ticks(void) { return _expseg_bench_now_ns(); }
#define TIMER_NAME "clock_gettime"
#endif

/* ---- the floor: a mutex plus a LIFO stack per exact size ---- */
typedef struct fnode_s {
  struct fnode_s *next;
  struct fstack_s *home;
} fnode_t;
typedef struct fstack_s {
  size_t size; /* 0 = empty slot */
  fnode_t *top;
} fstack_t;
typedef struct floor_s {
  pthread_mutex_t mu;
  fstack_t slot[2 * SEQ]; /* at most SEQ distinct sizes: at most half full */
} floor_t;

static fstack_t *floor_stack(floor_t *f, size_t size) {
  size_t i = (size_t)((size >> 9) * 0x9E3779B97F4A7C15ull >> 40) & (2 * SEQ - 1);
  while (f->slot[i].size != size && f->slot[i].size != 0) i = (i + 1) & (2 * SEQ - 1);
  return &f->slot[i];
}
__attribute__((noinline)) static fnode_t *floor_malloc(floor_t *f, size_t size) {
  size = (size + 511) & ~(size_t)511;
  pthread_mutex_lock(&f->mu);
  fstack_t *st = floor_stack(f, size);
  fnode_t *n = st->top;
  if (n != NULL) st->top = n->next;
  pthread_mutex_unlock(&f->mu);
  return n;
}
__attribute__((noinline)) static void floor_free(floor_t *f, fnode_t *n) {
  pthread_mutex_lock(&f->mu);
  n->next = n->home->top;
  n->home->top = n;
  pthread_mutex_unlock(&f->mu);
}
/* one cached node per distinct size of the sequence (every timed pair is a hit) */
static int floor_init(floor_t *f, const size_t *seq, fnode_t *nodes) {
  memset(f, 0, sizeof *f);
  pthread_mutex_init(&f->mu, NULL);
  for (size_t i = 0; i < SEQ; i++) {
    size_t size = (seq[i] + 511) & ~(size_t)511;
    fstack_t *st = floor_stack(f, size);
    if (st->size == 0) {
      st->size = size;
      nodes[i].home = st;
      nodes[i].next = NULL;
      st->top = &nodes[i];
    }
  }
  return 0;
}

static int bench_hit_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int64_t stat0(const expseg_allocator *a, const char *key) {
  int64_t v = -1;
  return expseg_stat(a, key, &v) == EXPSEG_OK ? v : -1;
}

typedef struct args_s {
  const char *trace, *synth, *driver, *conf;
  uint64_t seed, batches, batch, max_live_size, holes, cut;
  uint64_t live[16];
  size_t n_live;
  int json;
  int history; /* 0 off, 1 on, 2 on with C stacks */
  uint64_t history_entries;
} args_t;

/* The sizes' source: a file's set, or the one synthetic history standing in for a set. */
static void free_sizes_source(expseg_trace_set_t *set, expseg_trace_t *synth) {
  if (set->traces == synth) expseg_trace_free(synth);
  else expseg_trace_set_free(set);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: expseg-bench-hit [options]\n"
          "  --trace FILE     sizes are drawn from its allocations\n"
          "  --synth NAME     without --trace: sizes from a synthetic workload, seed 1\n"
          "                   (train, infer, streams8 or generate; default train)\n"
          "  --seed N         PRNG seed (default 1)\n"
          "  --batches N      timed samples (default 1000000)\n"
          "  --batch N        malloc+free pairs per sample (default 1: each pair timed alone)\n"
          "  --live LIST      live block counts, comma-separated (default 0,1000,10000,100000,1000000)\n"
          "  --max-live-size BYTES  cap on the size of each held block (default: none)\n"
          "  --cut BYTES      allocate and free one block of BYTES first: every request is\n"
          "                   cut from that free block (default 0: none)\n"
          "  --holes 0|1      1: allocate 2L blocks and free every other one, leaving L free\n"
          "                   blocks between the L live ones (default); 0: just L live blocks\n"
          "  --driver SPEC    (default sim with a capacity that fits the live set)\n"
          "  --conf TEXT      allocator options (default: none, i.e. expseg's defaults)\n"
          "  --history off|on|stacks  record the history while timing (default off)\n"
          "  --history-entries N  its ring size (default 100000)\n"
          "  --json           one JSON object per live count\n");
}

static int parse_args(int argc, char **argv, args_t *a) {
  memset(a, 0, sizeof *a);
  a->trace = NULL;
  a->synth = "train";
  a->conf = "";
  a->seed = 1;
  a->batches = 1000000;
  a->batch = 1;
  a->holes = 1;
  a->history_entries = 100000;
  const uint64_t dl[] = {0, 1000, 10000, 100000, 1000000};
  memcpy(a->live, dl, sizeof dl);
  a->n_live = 5;
  static const char *const history[] = {"off", "on", "stacks", NULL};
  const _expseg_arg_t opts[] = {
      ARG_FLAG_("--json", &a->json),
      ARG_STR_("--trace", &a->trace),
      ARG_STR_("--synth", &a->synth),
      ARG_STR_("--driver", &a->driver),
      ARG_STR_("--conf", &a->conf),
      ARG_U64_("--seed", &a->seed, 0, UINT64_MAX),
      ARG_U64_("--batches", &a->batches, 1, UINT64_MAX),
      ARG_U64_("--batch", &a->batch, 1, UINT64_MAX),
      ARG_U64_("--max-live-size", &a->max_live_size, 0, UINT64_MAX),
      ARG_U64_("--holes", &a->holes, 0, 1),
      ARG_U64_("--cut", &a->cut, 0, UINT64_MAX),
      ARG_CHOICE_("--history", &a->history, history),
      ARG_U64_("--history-entries", &a->history_entries, 1, UINT64_MAX),
      ARG_LIST_("--live", a->live, 0, UINT64_MAX, &a->n_live, 16),
  };
  return _expseg_args_parse("expseg-bench-hit", argc, argv, opts, sizeof opts / sizeof opts[0],
                            usage);
}

int main(int argc, char **argv) {
  if (expseg_tool_version(argc, argv, "expseg-bench-hit")) return 0;
  args_t arg;
  if (parse_args(argc, argv, &arg)) return 2;
  expseg_trace_set_t set = {0};
  expseg_trace_t synth = {0};
  char synth_name[64];
  if (arg.trace == NULL) { /* one synthetic history stands in for a set of one */
    if (expseg_trace_synth(arg.synth, 1, 1.0, &synth) != EXPSEG_OK) {
      fprintf(stderr, "expseg-bench-hit: --synth: %s\n", expseg_trace_last_error());
      return 2;
    }
    snprintf(synth_name, sizeof synth_name, "--synth %s", arg.synth);
    arg.trace = synth_name;
    set.traces = &synth;
    set.n = 1;
  } else if (expseg_trace_read_file(arg.trace, &set) != EXPSEG_OK) {
    fprintf(stderr, "expseg-bench-hit: %s\n", expseg_trace_last_error());
    return 2;
  }
  size_t n_sizes = 0;
  uint64_t *pool = NULL;
  if (set.n > 0) {
    const expseg_trace_t *t = &set.traces[0];
    pool = malloc((t->n_events + 1) * sizeof *pool);
    for (size_t i = 0; pool && i < t->n_events; i++)
      if (t->events[i].kind == EXPSEG_TR_ALLOC && t->events[i].size > 0)
        pool[n_sizes++] = t->events[i].size;
  }
  if (n_sizes == 0) {
    fprintf(stderr, "expseg-bench-hit: %s has no allocations to draw sizes from\n", arg.trace);
    free(pool);
    free_sizes_source(&set, &synth);
    return 2;
  }
  uint64_t rng = arg.seed;
  size_t seq[SEQ];
  for (size_t i = 0; i < SEQ; i++) seq[i] = (size_t)pool[_expseg_splitmix64(&rng) % n_sizes];
  double *per = malloc(arg.batches * sizeof *per), *perf = malloc(arg.batches * sizeof *perf);
  floor_t *fl = malloc(sizeof *fl);
  fnode_t *fnodes = malloc(SEQ * sizeof *fnodes);
  if (fl != NULL && fnodes != NULL) floor_init(fl, seq, fnodes);
  int rc = 0;
  if (!arg.json)
    printf("# sizes from %s (%zu allocations), seed %" PRIu64 ", %" PRIu64 " samples x %" PRIu64
           " pairs, timer " TIMER_NAME "\n# ratio = (median - timer) / (floor median - timer);"
           " tail = (p99 - timer) / (median - timer)\n"
           "%10s %10s %10s %10s %10s %10s %7s %7s %8s %10s\n",
           arg.trace, n_sizes, arg.seed, arg.batches, arg.batch, "live", "median ns", "p99 ns",
           "mean ns", "floor med", "floor p99", "ratio", "tail", "timer ns", "dev allocs");
  for (size_t li = 0; li < arg.n_live && rc == 0; li++) {
    const uint64_t live = arg.live[li];
    /* the held set: 2L blocks, every other one freed (or L blocks with --holes 0) */
    const uint64_t nheld = arg.holes ? 2 * live : live;
    size_t *lsz = malloc((nheld + 1) * sizeof *lsz);
    void **lp = calloc(nheld + 1, sizeof *lp);
    if (!lsz || !lp || !per || !perf || !fl || !fnodes) {
      fprintf(stderr, "expseg-bench-hit: out of host memory\n");
      free(lsz);
      free(lp);
      rc = 1;
      break;
    }
    uint64_t sum = 0;
    for (uint64_t i = 0; i < nheld; i++) {
      uint64_t s = pool[_expseg_splitmix64(&rng) % n_sizes];
      if (arg.max_live_size && s > arg.max_live_size) s = arg.max_live_size;
      lsz[i] = (size_t)s;
      sum += s + 512;
    }
    char drv[128];
    if (arg.driver) snprintf(drv, sizeof drv, "%s", arg.driver);
    else {
      uint64_t gib = ((sum + arg.cut) * 2 >> 30) + 64;
      snprintf(drv, sizeof drv, "sim:capacity=%" PRIu64 "G", gib);
    }
    expseg_allocator *a = NULL;
    if (expseg_create(drv, 0, arg.conf, &a) != EXPSEG_OK) {
      fprintf(stderr, "expseg-bench-hit: expseg_create(%s): %s\n", drv, expseg_last_error());
      free(lsz);
      free(lp);
      rc = 2;
      break;
    }
    void *cut = NULL; /* --cut: one large free block that every request is cut from */
    if (arg.cut > 0 && expseg_malloc(a, (size_t)arg.cut, 0, &cut) != EXPSEG_OK) {
      fprintf(stderr, "expseg-bench-hit: --cut %" PRIu64 ": %s\n", arg.cut, expseg_last_error());
      rc = 1;
    }
    if (cut != NULL) (void)expseg_free(a, cut);
    for (uint64_t i = 0; i < nheld && rc == 0; i++)
      if (expseg_malloc(a, lsz[i], 0, &lp[i]) != EXPSEG_OK) {
        fprintf(stderr, "expseg-bench-hit: building the live set (%" PRIu64 " of %" PRIu64
                        "): %s\n", i, nheld, expseg_last_error());
        rc = 1;
      }
    for (uint64_t i = 1; arg.holes && i < nheld && rc == 0; i += 2) {
      (void)expseg_free(a, lp[i]);
      lp[i] = NULL;
    }
    /* warm-up: every size once, twice */
    for (int round = 0; round < 2 && rc == 0; round++)
      for (size_t i = 0; i < SEQ && rc == 0; i++) {
        void *p;
        if (expseg_malloc(a, seq[i], 0, &p) != EXPSEG_OK) {
          fprintf(stderr, "expseg-bench-hit: warm-up malloc(%zu): %s\n", seq[i],
                  expseg_last_error());
          rc = 1;
        } else
          (void)expseg_free(a, p);
      }
    if (arg.history && rc == 0 &&
        expseg_record_history_ex(a, true, arg.history_entries,
                                 arg.history == 2 ? EXPSEG_HISTORY_C_STACKS : 0) != EXPSEG_OK) {
      fprintf(stderr, "expseg-bench-hit: --history: %s\n", expseg_last_error());
      rc = 1;
    }
    const int64_t dev0 = stat0(a, "num_device_alloc");
    /* the timer's own cost: two reads back to back */
    for (uint64_t b = 0; b < arg.batches && b < 100000; b++) {
      const uint64_t t0 = ticks();
      per[b] = (double)(ticks() - t0);
    }
    const uint64_t nover = arg.batches < 100000 ? arg.batches : 100000;
    qsort(per, nover, sizeof *per, bench_hit_cmp);
    const double over_t = per[nover / 2];
    size_t k = 0;
    const int rc_untimed = rc;
    const uint64_t c0 = ticks(), n0 = _expseg_bench_now_ns();
    for (uint64_t b = 0; b < arg.batches && rc == 0; b++) {
      const uint64_t t0 = ticks();
      for (uint64_t j = 0; j < arg.batch; j++) {
        void *p;
        if (expseg_malloc(a, seq[k++ & (SEQ - 1)], 0, &p) != EXPSEG_OK) {
          rc = 1;
          break;
        }
        (void)expseg_free(a, p);
      }
      per[b] = (double)(ticks() - t0) / (double)arg.batch;
    }
    if (rc && !rc_untimed)
      fprintf(stderr, "expseg-bench-hit: a timed malloc failed: %s\n", expseg_last_error());
    const int64_t dev1 = stat0(a, "num_device_alloc");
    /* the floor, same sizes, same timing */
    k = 0;
    for (uint64_t b = 0; b < arg.batches && rc == 0; b++) {
      const uint64_t t0 = ticks();
      for (uint64_t j = 0; j < arg.batch; j++) {
        fnode_t *n = floor_malloc(fl, seq[k++ & (SEQ - 1)]);
        if (n == NULL) rc = 1;
        else floor_free(fl, n);
      }
      perf[b] = (double)(ticks() - t0) / (double)arg.batch;
    }
    const uint64_t c1 = ticks(), n1 = _expseg_bench_now_ns();
    const double ns_per_tick = c1 > c0 ? (double)(n1 - n0) / (double)(c1 - c0) : 1.0;
    double mean = 0;
    for (uint64_t b = 0; b < arg.batches; b++) mean += per[b];
    mean = mean / (double)arg.batches * ns_per_tick;
    qsort(per, arg.batches, sizeof *per, bench_hit_cmp);
    qsort(perf, arg.batches, sizeof *perf, bench_hit_cmp);
    const uint64_t i99 = (arg.batches * 99) / 100;
    const double over = over_t * ns_per_tick / (double)arg.batch; /* per pair */
    const double med = per[arg.batches / 2] * ns_per_tick, p99 = per[i99] * ns_per_tick;
    const double fmed = perf[arg.batches / 2] * ns_per_tick, fp99 = perf[i99] * ns_per_tick;
    const double ratio = fmed - over > 0 ? (med - over) / (fmed - over) : 0;
    const double tail = med - over > 0 ? (p99 - over) / (med - over) : 0;
    const int64_t misses = dev1 - dev0; /* device allocations while timing: 0 = all hits */
    if (rc != 0)
      ; /* a failed run has no row: the message above says why, the exit status is 1 */
    else if (arg.json)
      printf("{\"bench\":\"hit\",\"driver\":\"%s\",\"history\":\"%s\",\"live\":%" PRIu64
             ",\"holes\":%" PRIu64 ",\"cut\":%" PRIu64
             ",\"timer\":\"" TIMER_NAME "\",\"timer_ns\":%.1f"
             ",\"median_ns\":%.1f,\"p99_ns\":%.1f,\"mean_ns\":%.1f,\"floor_median_ns\":%.1f"
             ",\"floor_p99_ns\":%.1f,\"ratio\":%.2f,\"p99_over_median\":%.2f"
             ",\"device_allocs_timed\":%" PRId64 ",\"batches\":%" PRIu64 ",\"batch\":%" PRIu64
             "}\n",
             drv, arg.history == 0 ? "off" : arg.history == 1 ? "on" : "stacks", live, arg.holes,
             arg.cut, over, med, p99, mean, fmed, fp99, ratio, tail, misses, arg.batches,
             arg.batch);
    else
      printf("%10" PRIu64 " %10.1f %10.1f %10.1f %10.1f %10.1f %7.2f %7.2f %8.1f %10" PRId64 "\n",
             live, med, p99, mean, fmed, fp99, ratio, tail, over, misses);
    fflush(stdout);
    expseg_destroy(a);
    free(lsz);
    free(lp);
  }
  free(per);
  free(perf);
  free(fl);
  free(fnodes);
  free(pool);
  free_sizes_source(&set, &synth);
  return rc;
}
