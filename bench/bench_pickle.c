/* SPDX-License-Identifier: Apache-2.0 */
/* bench_pickle.c: expseg-bench-pickle, the snapshot reader's time and memory against the
 * size of crafted pickles (bench/replay/pickle_craft.c) of doubling size.
 *
 * For each shape (--shape, repeatable: wide, shared, devices, memo; all by default) and
 * each n from --from doubling --steps times, the pickle is made in memory and read with
 * expseg_trace_read_pickle in a child process (fork), so each reading's peak RSS is its
 * own: the child reports its ru_maxrss minus the RSS it had before reading (the file
 * itself included in both). Linear costs show as flat "ns/byte" and "RSS/size" columns.
 * --file PATH (repeatable) measures snapshot files the same way, for comparison. */
#include "tool_args.h"
#include "tool_version.h"
#include "trace_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The current RSS in KiB (/proc/self/statm), 0 when unknown. */
static long rss_kib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long pages = 0, res = 0;
  if (!f) return 0;
  if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
  fclose(f);
  return res * (sysconf(_SC_PAGESIZE) / 1024);
}

typedef struct res_s {
  double secs;
  long rss_kib;
  int status;
} res_t;

static void usage(FILE *f) {
  fprintf(f, "usage: expseg-bench-pickle [--shape wide|shared|devices|memo]... [--from N (4096)] "
             "[--steps N (6)] [--file PATH]...\n");
}

/* Reads p in a child and prints one row. 0, or 1 when the child failed. */
static int measure(const char *label, uint64_t n, const unsigned char *p, size_t len) {
  int fd[2];
  if (pipe(fd) != 0) return 1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    close(fd[0]);
    res_t r = {0, 0, 0};
    long before = rss_kib();
    expseg_trace_set_t set;
    double t0 = now_s();
    r.status = (int)expseg_trace_read_pickle("crafted.pickle", p, len, &set);
    r.secs = now_s() - t0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    r.rss_kib = ru.ru_maxrss - before;
    if (r.status == EXPSEG_OK) expseg_trace_set_free(&set);
    ssize_t w = write(fd[1], &r, sizeof r);
    _exit(w == (ssize_t)sizeof r ? 0 : 1);
  }
  close(fd[1]);
  res_t r;
  ssize_t got = read(fd[0], &r, sizeof r);
  close(fd[0]);
  int wst = 0;
  waitpid(pid, &wst, 0);
  if (got != (ssize_t)sizeof r) {
    fprintf(stderr, "expseg-bench-pickle: the reading child failed\n");
    return 1;
  }
  printf("%-8s %9" PRIu64 " %11zu %10.2f %9.1f %10ld %9.2f  %s\n", label, n, len, r.secs * 1e3,
         r.secs * 1e9 / (double)len, r.rss_kib, (double)r.rss_kib * 1024.0 / (double)len,
         r.status == EXPSEG_OK ? "read" : "refused");
  fflush(stdout);
  return 0;
}

/* The whole file, malloc'ed (*len bytes); NULL when it cannot be read or is empty. */
static unsigned char *slurp(const char *path, size_t *len) {
  FILE *in = fopen(path, "rb");
  unsigned char *p = NULL;
  long sz = -1;
  if (in && fseek(in, 0, SEEK_END) == 0 && (sz = ftell(in)) > 0 && fseek(in, 0, SEEK_SET) == 0 &&
      (p = malloc((size_t)sz)) && fread(p, 1, (size_t)sz, in) == (size_t)sz) {
    *len = (size_t)sz;
  } else {
    free(p);
    p = NULL;
  }
  if (in) fclose(in);
  return p;
}

int main(int argc, char **argv) {
  if (expseg_tool_version(argc, argv, "expseg-bench-pickle")) return 0;
  const char *shapes[8], *files[16];
  size_t n_shapes = 0, n_files = 0;
  uint64_t from = 4096, steps = 6;
  const _expseg_arg_t opts[] = {
      ARG_STRS_("--shape", shapes, &n_shapes, 8),
      ARG_U64_("--from", &from, 1, 1u << 24),
      ARG_U64_("--steps", &steps, 1, 12),
      ARG_STRS_("--file", files, &n_files, 16),
  };
  if (_expseg_args_parse("expseg-bench-pickle", argc, argv, opts, sizeof opts / sizeof opts[0],
                         usage))
    return 2;
  if (n_shapes == 0 && n_files == 0) {
    shapes[0] = "wide", shapes[1] = "shared", shapes[2] = "devices", shapes[3] = "memo";
    n_shapes = 4;
  }
  printf("%-8s %9s %11s %10s %9s %10s %9s  %s\n", "shape", "n", "bytes", "read ms", "ns/byte",
         "peak KiB", "RSS/size", "result");
  for (size_t s = 0; s < n_shapes; s++) {
    for (uint64_t k = 0; k < steps; k++) {
      uint64_t n = from << k;
      size_t len = 0;
      unsigned char *p = _expseg_pickle_craft(shapes[s], n, &len);
      if (!p) {
        fprintf(stderr, "expseg-bench-pickle: --shape '%s': accepted: wide, shared, devices, "
                        "memo (or out of host memory)\n", shapes[s]);
        return 2;
      }
      int rc = measure(shapes[s], n, p, len);
      free(p);
      if (rc) return rc;
    }
  }
  for (size_t f = 0; f < n_files; f++) {
    size_t len = 0;
    unsigned char *p = slurp(files[f], &len);
    if (!p) {
      fprintf(stderr, "expseg-bench-pickle: --file '%s': cannot read it (or it is empty)\n",
              files[f]);
      return 2;
    }
    const char *base = strrchr(files[f], '/');
    printf("# %s\n", base ? base + 1 : files[f]);
    int rc = measure("file", 0, p, len);
    free(p);
    if (rc) return rc;
  }
  return 0;
}
