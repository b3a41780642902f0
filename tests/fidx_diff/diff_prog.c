/* SPDX-License-Identifier: Apache-2.0 */
/* diff_prog.c: a random program through the public API that prints every address handed
 * out (and each status), so that two builds of the library can be compared line by line
 * (run.sh). Usage: diff_prog SEED CONFIG_INDEX STEPS [check]; DIFF_NOGC=1 never turns garbage
 * collection on at run time (configurations 6, 9 and 15 have it from the start); DIFF_SMALL=1
 * asks mostly for the small pool. With a fault driver (DIFF_DRIVER="fault;sim:..."), random
 * driver failures are armed now and then. */
#include "expseg.h"
#include "expseg_testing.h"
#include "rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *configs[] = {
    "",
    "expandable_segments:False",
    "expandable_segments:False,max_split_size_mb:20",
    "expandable_segments:False,max_split_size_mb:64,roundup_power2_divisions:4",
    "roundup_power2_divisions:[1:2,64:8,>:4]",
    "expandable_segments:True,single_chunk_min_mb:32",
    "expandable_segments:False,garbage_collection_threshold:0.6,per_process_memory_fraction:0.5",
    "expandable_segments:True,page_cache_max_mb:0,max_split_size_mb:100",
    "expandable_segments:False,max_split_size_mb:40,max_non_split_rounding_mb:20,single_chunk_min_mb:100",
    "expandable_segments:True,garbage_collection_threshold:0.5,per_process_memory_fraction:0.7",
    "expandable_segments:True,max_split_size_mb:20,roundup_power2_divisions:[256:1,512:2,>:16]",
    "expandable_segments:False,roundup_power2_divisions:16,max_non_split_rounding_mb:512",
    "expandable_segments:True,page_size_mb:0,single_chunk_min_mb:20",
    "expandable_segments:False,per_process_memory_fraction:0.3",
    "expandable_segments:True,page_size_mb:8,va_reserve_mb:256",
    "expandable_segments:True,page_size_mb:6,garbage_collection_threshold:0.7,per_process_memory_fraction:0.6",
    "expandable_segments:False,large_segment_size_mb:12,max_split_size_mb:15",
    "expandable_segments:True,large_segment_size_mb:40,page_cache_max_mb:16",
};
static const char *runtime[] = {
    "max_split_size_mb:30", "max_split_size_mb:1000", "roundup_power2_divisions:8",
    "roundup_power2_divisions:0", "garbage_collection_threshold:0.8", "page_cache_max_mb:0",
    "single_chunk_min_mb:64", "max_non_split_rounding_mb:100",
};


static void print_stat(void *ctx, const char *key, int64_t v) {
  if (ctx != NULL || (strstr(key, ".peak") == NULL && strstr(key, "allocated") == NULL))
    printf("   %s %lld\n", key, (long long)v);
}

/* FNV-1a of a buffer: snapshots are compared by hash (the whole pickle, byte for byte) */
static uint64_t fnv(const unsigned char *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* DIFF_FULL=1: every statistic (peaks and allocated too) after every step; DIFF_SNAP=K: the
 * snapshot's hash and the memory summary every K steps (DIFF_SUMMARY_TEXT=1 prints the
 * summary whole) */
static void observe(expseg_allocator *a, long i) {
  if (getenv("DIFF_FULL")) expseg_stats_foreach(a, print_stat, (void *)1);
  long k = getenv("DIFF_SNAP") ? atol(getenv("DIFF_SNAP")) : 0;
  if (k > 0 && i % k == 0) {
    unsigned char *buf = NULL;
    size_t len = 0;
    expseg_status st = expseg_snapshot(a, &buf, &len);
    /* with history, the events' wall-clock times differ from run to run: the length only
     * (DIFF_SNAP_DIR and snapcmp.py compare such snapshots) */
    const bool hashed = st == EXPSEG_OK && getenv("DIFF_HIST") == NULL;
    printf("   snap %d %zu %016llx\n", (int)st, len, hashed ? (unsigned long long)fnv(buf, len) : 0ull);
    if (getenv("DIFF_SNAP_DIR") && st == EXPSEG_OK) {
      char path[512];
      snprintf(path, sizeof path, "%s/snap-%ld.pickle", getenv("DIFF_SNAP_DIR"), i);
      FILE *f = fopen(path, "wb");
      if (f) { fwrite(buf, 1, len, f); fclose(f); }
    }
    expseg_snapshot_free(buf);
    static char text[1 << 20];
    size_t need = expseg_memory_summary(a, text, sizeof text, (i / k) % 2 == 0);
    if (getenv("DIFF_SUMMARY_TEXT")) printf("%s\n", text);
    else printf("   summary %zu %016llx\n", need, (unsigned long long)fnv((unsigned char *)text, strlen(text)));
  }
}

typedef struct { void *p; size_t size; } live_t;

static size_t pick_size(size_t *sizes, int nsizes) {
  if (getenv("DIFF_SMALL") && rnd() % 4 != 0) /* the small pool's 2 MiB segments */
    return rnd() % 2 ? sizes[rnd() % nsizes] % (1 << 20) + 1 : 1 + rnd() % (256 << 10);
  uint64_t r = rnd() % 100;
  if (r < 35) return sizes[rnd() % nsizes];              /* repeats */
  if (r < 60) return 1 + rnd() % (1 << 20);               /* small pool */
  if (r < 85) return (1 << 20) + rnd() % (30u << 20);     /* large */
  if (r < 95) return 512 * (1 + rnd() % 64);              /* tiny exact multiples */
  return (20u << 20) + rnd() % (300u << 20);              /* big */
}

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  rng = strtoull(argv[1], NULL, 0) * 2654435761u + 1;
  int ci = atoi(argv[2]);
  if (ci < 0 || ci >= (int)(sizeof configs / sizeof *configs)) return 2;
  long steps = atol(argv[3]);
  int check = argc > 4;
  const char *drv = getenv("DIFF_DRIVER") ? getenv("DIFF_DRIVER") : "sim:capacity=8G";
  if (getenv("DIFF_PAD")) { /* shifts the host heap: block structs land elsewhere */
    void *volatile pad = malloc((size_t)atol(getenv("DIFF_PAD")));
    (void)pad;
  }
  if (getenv("DIFF_HOLES")) { /* holes in the host heap: structs made later fill them out of order */
    int k = atoi(getenv("DIFF_HOLES"));
    static void *hold[4096];
    for (int j = 0; j < k && j < 4096; j++) hold[j] = malloc(64 + 16 * (size_t)(j % 24));
    for (int j = 0; j < k && j < 4096; j += 2) free(hold[j]);
  }
  expseg_allocator *a;
  if (expseg_create(drv, 0, configs[ci], &a) != EXPSEG_OK) {
    printf("create: %s\n", expseg_last_error());
    return 1;
  }
  if (rnd() % 3 == 0) printf("model_pytorch -> %d\n", (int)expseg_testing_set_model_pytorch(a, true));
  if (getenv("DIFF_HIST")) /* history on: every request takes the slow path */
    printf("history -> %d\n", (int)expseg_record_history_ex(a, true, (size_t)atol(getenv("DIFF_HIST")), 0));
  size_t sizes[16];
  int nsizes = 1 + (int)(rnd() % 16);
  for (int i = 0; i < nsizes; i++) sizes[i] = 1 + rnd() % ((rnd() % 2) ? (1 << 20) : (40u << 20));
  int nstreams = 1 + (int)(rnd() % 4);
  expseg_stream streams[5] = {0, 7, 3, 1000, 42};
  live_t *live = calloc(100000, sizeof *live);
  size_t n = 0;
  bool held[5] = {0};
  const uint64_t pm = 380 + rnd() % 180; /* per mille of mallocs: some programs grow, some shrink */
  for (long i = 0; i < steps; i++) {
    uint64_t r = rnd() % 1000;
    if (r < pm || n == 0) {
      size_t size = pick_size(sizes, nsizes);
      expseg_stream s = streams[rnd() % nstreams];
      unsigned fl = (rnd() % 50 == 0) ? EXPSEG_MALLOC_SINGLE_CHUNK : 0;
      void *p = NULL;
      expseg_status st = expseg_malloc_ex(a, size, s, fl, &p);
      printf("%ld m %zu s%llu f%u -> %d %llx\n", i, size, (unsigned long long)s, fl, (int)st,
             (unsigned long long)(uintptr_t)p);
      if (st == EXPSEG_OK && p != NULL) live[n++] = (live_t){p, size};
    } else if (r < 900 || r < pm + 300) {
      size_t k = rnd() % n;
      expseg_status st = expseg_free(a, live[k].p);
      printf("%ld f %llx -> %d\n", i, (unsigned long long)(uintptr_t)live[k].p, (int)st);
      live[k] = live[--n];
    } else if (r < 950) {
      size_t k = rnd() % n;
      expseg_stream s = streams[rnd() % 5];
      expseg_status st = expseg_record_stream(a, live[k].p, s);
      printf("%ld r %llx s%llu -> %d\n", i, (unsigned long long)(uintptr_t)live[k].p,
             (unsigned long long)s, (int)st);
    } else if (r < 975) {
      int k = (int)(rnd() % 5);
      held[k] = !held[k];
      expseg_status st = expseg_testing_hold_stream(a, streams[k], held[k]);
      printf("%ld h s%llu %d -> %d\n", i, (unsigned long long)streams[k], held[k], (int)st);
    } else if (r < 985) {
      expseg_status st = expseg_empty_cache(a);
      printf("%ld e -> %d\n", i, (int)st);
    } else if (r < 987) {
      double f = 0.3 + (double)(rnd() % 71) / 100.0;
      expseg_status st = expseg_set_memory_fraction(a, f);
      printf("%ld x %.2f -> %d\n", i, f, (int)st);
    } else if (r < 990) {
      const char *c = runtime[rnd() % (sizeof runtime / sizeof *runtime)];
      if (getenv("DIFF_NOGC") && strstr(c, "garbage") != NULL) c = "max_split_size_mb:60";
      expseg_status st = expseg_configure(a, c);
      printf("%ld c %s -> %d\n", i, c, (int)st);
    } else {
      /* a burst of frees and re-mallocs of the same size (the hit path) */
      size_t k = rnd() % n;
      size_t size = live[k].size;
      expseg_stream s = streams[rnd() % nstreams];
      expseg_status st = expseg_free(a, live[k].p);
      live[k] = live[--n];
      void *p = NULL;
      expseg_status st2 = expseg_malloc(a, size, s, &p);
      printf("%ld b %zu s%llu -> %d %d %llx\n", i, size, (unsigned long long)s, (int)st, (int)st2,
             (unsigned long long)(uintptr_t)p);
      if (st2 == EXPSEG_OK && p != NULL) live[n++] = (live_t){p, size};
    }
    if (strncmp(drv, "fault", 5) == 0 && rnd() % 100 == 0) { /* driver failures from now on */
      static const char *rules[] = {"map@1", "create@1:oom", "event_record@1..3", "unmap@1",
                                    "event_query@1..2", "stream_synchronize@1", "reserve@1:oom",
                                    "event_synchronize@1", "set_access@1", "release@1", ""};
      const char *rule = rules[rnd() % (sizeof rules / sizeof *rules)];
      printf("%ld fault %s -> %d\n", i, rule, (int)expseg_testing_set_faults(a, rule));
    }
    if (getenv("DIFF_ALL") && i >= atol(getenv("DIFF_ALL"))) expseg_stats_foreach(a, print_stat, NULL);
    observe(a, i);
    if (getenv("DIFF_RESET") && rnd() % 200 == 0) { /* peaks from here on */
      expseg_reset_peak_stats(a);
      printf("%ld reset\n", i);
    }
    if (getenv("DIFF_STATS")) {
      int64_t df = 0, rb = 0, ma = 0;
      expseg_stat(a, "num_device_free", &df);
      expseg_stat(a, "reserved_bytes.all.current", &rb);
      expseg_stat(a, "mapped_bytes.current", &ma);
      printf("   df %lld rb %lld mapped %lld\n", (long long)df, (long long)rb, (long long)ma);
    }
    if (check && expseg_check(a) != EXPSEG_OK) {
      printf("CHECK FAILED at %ld: %s\n", i, expseg_last_error());
      return 3;
    }
  }
  const char *keys[] = {"reserved_bytes.all.peak", "reserved_bytes.all.current",
                        "num_device_alloc", "num_device_free", "active_bytes.all.current",
                        "inactive_split.all.current", "num_alloc_retries", "num_ooms"};
  for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
    int64_t v = 0;
    expseg_stat(a, keys[k], &v);
    printf("stat %s %lld\n", keys[k], (long long)v);
  }
  for (size_t k = 0; k < n; k++) (void)expseg_free(a, live[k].p);
  for (int k = 0; k < 5; k++)
    if (held[k]) (void)expseg_testing_hold_stream(a, streams[k], false);
  if (check && expseg_check(a) != EXPSEG_OK) {
    printf("CHECK FAILED at end: %s\n", expseg_last_error());
    return 3;
  }
  expseg_destroy(a);
  free(live);
  return 0;
}
