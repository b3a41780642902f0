/* SPDX-License-Identifier: Apache-2.0 */
/* bench_driver.c: expseg-bench-driver, the cost of each driver call. For chunk sizes of
 * 2, 20, 256 and 2048 MiB (or --sizes), repeats reserve -> create -> map -> set_access ->
 * unmap -> release -> unreserve through the checked wrappers of vmm/vmm.h and reports the
 * median and p99 of each call in microseconds; then set_access over 1, 16 and 256 pages
 * (--pages: that many chunks of one granule each, mapped side by side, opened by one call);
 * optionally cudaMalloc/cudaFree of the same sizes (--cudart) and whether unmap waits for
 * work still running on another stream (--unmap-wait MS). On `cuda` this is the physical
 * floor of growth (docs/benchmarks.md); on `host` it is a range of a memfd arena + mmap; on
 * `sim` bookkeeping. A size larger than the driver's free memory is skipped with a line.
 *
 * cudaMalloc comes from the CUDA runtime opened by name (dlopen of libcudart.so*, the
 * runtime's own three entry points declared here): the replay tool's cost model prices
 * cudaMalloc/cudaFree because that is what a classic-segment allocator calls, and the
 * runtime call costs more than the driver's cuMemAlloc beneath it; only vmm/cuda.c may
 * include cuda.h, and the runtime needs none of it.
 *
 * --json FILE writes every figure as one JSON object; --costs-out FILE writes the cost table
 * expseg-replay reads (--costs, docs/replay.md): per call = the intercept and per page =
 * the slope of a least-squares line through the medians against the 2 MiB pages covered
 * (set_access from the --pages sweep), both clamped at 0. */
#include "error.h"
#include "synth_replay.h" /* _expseg_json_str */
#include "tool_args.h"
#include "trace_internal.h"
#include "vmm.h"
#include "tool_version.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { K_RESERVE, K_CREATE, K_MAP, K_ACCESS, K_UNMAP, K_RELEASE, K_UNRESERVE, K_COUNT };
static const char *const kind_names[K_COUNT] = {"reserve", "create", "map", "set_access",
                                                "unmap", "release", "unreserve"};
enum { MAX_SIZES = 8, MAX_PAGES = 8 };
#define TWO_MIB ((size_t)2 << 20)

typedef struct {
  double median_us, p99_us;
} stat_t;

typedef struct {
  size_t size;  /* bytes (rounded up to the granularity) */
  int measured; /* 0: skipped (larger than free memory) or failed */
  stat_t k[K_COUNT];
  int cudart; /* 1 when cudaMalloc/cudaFree were measured */
  stat_t malloc_, free_;
} size_row_t;

static void usage(FILE *f) {
  fprintf(f, "usage: expseg-bench-driver [options]\n"
             "  --driver SPEC      driver spec (default host:capacity=1G)\n"
             "  --rounds N         repetitions per size (default 200; 1/10 of it, at least 3,\n"
             "                     for sizes of 256 MiB and more and for the page sweep)\n"
             "  --sizes LIST       chunk sizes in MiB (default 2,20,256,2048)\n"
             "  --pages LIST       set_access over this many one-granule chunks (default 1,16,256;\n"
             "                     0 skips the sweep)\n"
             "  --cudart           also time cudaMalloc/cudaFree (the CUDA runtime, opened by name)\n"
             "  --unmap-wait MS    hold a second stream MS ms and time an unmap meanwhile\n"
             "                     (needs the driver's hold_stream; default 0: not measured)\n"
             "  --json FILE        every figure as JSON\n"
             "  --costs-out FILE   the cost table for expseg-replay --costs\n");
}

static stat_t summarize(uint64_t *t, unsigned n) {
  qsort(t, n, sizeof *t, _expseg_u64_cmp);
  size_t p99 = (size_t)((double)n * 0.99);
  if (p99 >= n) p99 = n - 1;
  stat_t s = {(double)t[n / 2] / 1e3, (double)t[p99] / 1e3};
  return s;
}

static unsigned rounds_for(size_t size, unsigned rounds) {
  if (size < ((size_t)256 << 20)) return rounds;
  unsigned r = rounds / 10;
  return r < 3 ? 3 : r;
}

/* One size: times every call of every round; returns 0, or 1 on a driver failure. */
static int bench_size(expseg_vmm_t *v, size_row_t *row, unsigned rounds) {
  size_t size = row->size;
  uint64_t *t[K_COUNT];
  for (int k = 0; k < K_COUNT; k++) t[k] = calloc(rounds, sizeof *t[k]);
  int rc = 0;
  for (unsigned r = 0; r < rounds && rc == 0; r++) {
    uintptr_t va = 0;
    expseg_vmm_handle h = 0;
    uint64_t s[K_COUNT + 1];
    int done = 0; /* calls that succeeded, in order: undo the rest on failure */
    s[0] = _expseg_bench_now_ns();
    if (_expseg_vmm_reserve(v, size, 0, &va) == EXPSEG_OK) done++;
    s[1] = _expseg_bench_now_ns();
    if (done == 1 && _expseg_vmm_create(v, size, &h) == EXPSEG_OK) done++;
    s[2] = _expseg_bench_now_ns();
    if (done == 2 && _expseg_vmm_map(v, va, size, h, 0) == EXPSEG_OK) done++;
    s[3] = _expseg_bench_now_ns();
    if (done == 3 && _expseg_vmm_set_access(v, va, size) == EXPSEG_OK) done++;
    s[4] = _expseg_bench_now_ns();
    if (done == 4 && _expseg_vmm_unmap(v, va, size) == EXPSEG_OK) done++;
    s[5] = _expseg_bench_now_ns();
    if (done == 5 && _expseg_vmm_release(v, h, size) == EXPSEG_OK) done++;
    s[6] = _expseg_bench_now_ns();
    if (done == 6 && _expseg_vmm_unreserve(v, va, size) == EXPSEG_OK) done++;
    s[7] = _expseg_bench_now_ns();
    if (done < K_COUNT) {
      fprintf(stderr, "expseg-bench-driver: %zu MiB, round %u: %s failed: %s\n", size >> 20, r,
              kind_names[done], expseg_last_error());
      if (done >= 3 && done < 5) _expseg_vmm_unmap(v, va, size);
      if (done >= 2 && done < 6) _expseg_vmm_release(v, h, size);
      if (done >= 1) _expseg_vmm_unreserve(v, va, size);
      rc = 1;
      break;
    }
    for (int k = 0; k < K_COUNT; k++) t[k][r] = s[k + 1] - s[k];
  }
  if (rc == 0) {
    for (int k = 0; k < K_COUNT; k++) row->k[k] = summarize(t[k], rounds);
    row->measured = 1;
  }
  for (int k = 0; k < K_COUNT; k++) free(t[k]);
  return rc;
}

/* set_access over n chunks of one granule each, mapped side by side: rounds of
 * reserve, n x (create, map), [timed] set_access, unmap, n x release, unreserve. */
static int bench_pages(expseg_vmm_t *v, size_t n, unsigned rounds, stat_t *out) {
  size_t g = v->granularity, size = n * g;
  expseg_vmm_handle *h = calloc(n, sizeof *h);
  uint64_t *t = calloc(rounds, sizeof *t);
  int rc = (h && t) ? 0 : 1;
  for (unsigned r = 0; r < rounds && rc == 0; r++) {
    uintptr_t va = 0;
    size_t made = 0, mapped = 0;
    if (_expseg_vmm_reserve(v, size, 0, &va) != EXPSEG_OK) {
      rc = 1;
      break;
    }
    while (made < n && _expseg_vmm_create(v, g, &h[made]) == EXPSEG_OK) {
      made++;
      if (_expseg_vmm_map(v, va + (made - 1) * g, g, h[made - 1], 0) != EXPSEG_OK) break;
      mapped++;
    }
    if (mapped == n) {
      uint64_t s0 = _expseg_bench_now_ns();
      if (_expseg_vmm_set_access(v, va, size) != EXPSEG_OK) rc = 1;
      t[r] = _expseg_bench_now_ns() - s0;
    } else {
      rc = 1;
    }
    if (rc) fprintf(stderr, "expseg-bench-driver: %zu pages: %s\n", n, expseg_last_error());
    if (mapped) _expseg_vmm_unmap(v, va, mapped * g);
    for (size_t i = 0; i < made; i++) _expseg_vmm_release(v, h[i], g);
    _expseg_vmm_unreserve(v, va, size);
  }
  if (rc == 0) *out = summarize(t, rounds);
  free(h);
  free(t);
  return rc;
}

/* ---- the CUDA runtime, opened by name (no cuda.h outside vmm/cuda.c) ---- */

typedef int (*cudart_set_device_t)(int);
typedef int (*cudart_malloc_t)(void **, size_t);
typedef int (*cudart_free_t)(void *);

typedef struct {
  void *lib;
  cudart_malloc_t malloc_;
  cudart_free_t free_;
  char why[256];
} cudart_t;

static int cudart_open(cudart_t *rt, int device) {
  static const char *const names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                      "/usr/local/cuda/lib64/libcudart.so"};
  memset(rt, 0, sizeof *rt);
  for (size_t i = 0; i < sizeof names / sizeof names[0] && !rt->lib; i++)
    rt->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  if (!rt->lib) {
    snprintf(rt->why, sizeof rt->why, "no CUDA runtime (libcudart.so*) could be opened");
    return 1;
  }
  cudart_set_device_t set = (cudart_set_device_t)dlsym(rt->lib, "cudaSetDevice");
  rt->malloc_ = (cudart_malloc_t)dlsym(rt->lib, "cudaMalloc");
  rt->free_ = (cudart_free_t)dlsym(rt->lib, "cudaFree");
  int e = 0;
  if (!set || !rt->malloc_ || !rt->free_ || (e = set(device)) != 0) {
    snprintf(rt->why, sizeof rt->why, "the CUDA runtime %s (cudaSetDevice(%d) = %d)",
             set && rt->malloc_ && rt->free_ ? "refused the device" : "lacks cudaMalloc/cudaFree",
             device, e);
    return 1;
  }
  return 0;
}

static int bench_cudart(cudart_t *rt, size_row_t *row, unsigned rounds) {
  uint64_t *tm = calloc(rounds, sizeof *tm), *tf = calloc(rounds, sizeof *tf);
  int rc = (tm && tf) ? 0 : 1;
  for (unsigned r = 0; r < rounds && rc == 0; r++) {
    void *p = NULL;
    uint64_t s0 = _expseg_bench_now_ns();
    int e = rt->malloc_(&p, row->size);
    uint64_t s1 = _expseg_bench_now_ns();
    if (e != 0) {
      snprintf(rt->why, sizeof rt->why, "cudaMalloc(%zu MiB) returned %d", row->size >> 20, e);
      rc = 1;
      break;
    }
    e = rt->free_(p);
    tf[r] = _expseg_bench_now_ns() - s1;
    tm[r] = s1 - s0;
    if (e != 0) {
      snprintf(rt->why, sizeof rt->why, "cudaFree returned %d", e);
      rc = 1;
    }
  }
  if (rc == 0) {
    row->malloc_ = summarize(tm, rounds);
    row->free_ = summarize(tf, rounds);
    row->cudart = 1;
  }
  free(tm);
  free(tf);
  return rc;
}

/* ---- does unmap wait for work still running on another stream? ---- */

typedef struct {
  expseg_vmm_t *v;
  expseg_stream s;
  unsigned ms;
} releaser_t;

static void *release_later(void *p) {
  releaser_t *r = p;
  struct timespec ts = {(time_t)(r->ms / 1000), (long)(r->ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  _expseg_vmm_hold_stream(r->v, r->s, false);
  return NULL;
}

typedef struct {
  int measured;
  char why[256];
  double unmap_ms, hold_ms;
  int stream_was_busy, waits;
} unmap_wait_t;

static void unmap_wait(expseg_vmm_t *v, unsigned ms, unmap_wait_t *w) {
  memset(w, 0, sizeof *w);
  w->hold_ms = ms;
  expseg_stream s = 7; /* host and sim: any value is a stream */
  int own_stream = _expseg_vmm_stream_create(v, &s) == EXPSEG_OK;
  size_t g = v->granularity;
  uintptr_t va = 0;
  expseg_vmm_handle h = 0;
  expseg_vmm_event ev = 0;
  int have_ev = 0, mapped = 0;
  if (_expseg_vmm_hold_stream(v, s, true) != EXPSEG_OK) {
    snprintf(w->why, sizeof w->why, "%s", expseg_last_error());
    goto out;
  }
  if (_expseg_vmm_event_create(v, &ev) == EXPSEG_OK) {
    have_ev = 1;
    bool done = true;
    if (_expseg_vmm_event_record(v, ev, s) == EXPSEG_OK &&
        _expseg_vmm_event_query(v, ev, &done) == EXPSEG_OK)
      w->stream_was_busy = !done;
  }
  if (_expseg_vmm_reserve(v, g, 0, &va) != EXPSEG_OK || _expseg_vmm_create(v, g, &h) != EXPSEG_OK ||
      _expseg_vmm_map(v, va, g, h, 0) != EXPSEG_OK || !(mapped = 1) ||
      _expseg_vmm_set_access(v, va, g) != EXPSEG_OK) {
    snprintf(w->why, sizeof w->why, "setting up: %s", expseg_last_error());
    _expseg_vmm_hold_stream(v, s, false);
    goto undo;
  }
  releaser_t r = {v, s, ms};
  pthread_t th;
  if (pthread_create(&th, NULL, release_later, &r) != 0) {
    snprintf(w->why, sizeof w->why, "pthread_create failed");
    _expseg_vmm_hold_stream(v, s, false);
    goto undo;
  }
  uint64_t t0 = _expseg_bench_now_ns();
  expseg_status us = _expseg_vmm_unmap(v, va, g);
  w->unmap_ms = (double)(_expseg_bench_now_ns() - t0) / 1e6;
  pthread_join(th, NULL);
  if (us != EXPSEG_OK) {
    snprintf(w->why, sizeof w->why, "unmap failed: %s", expseg_last_error());
    goto undo;
  }
  mapped = 0;
  w->waits = w->unmap_ms >= 0.5 * ms;
  /* a hold that did not keep the stream busy measures nothing */
  w->measured = w->stream_was_busy;
  if (!w->measured)
    snprintf(w->why, sizeof w->why, "the driver's hold did not keep the stream busy (an event "
                                    "recorded on it was complete at once)");
  _expseg_vmm_release(v, h, g);
  _expseg_vmm_unreserve(v, va, g);
  goto out;
undo:
  if (mapped) _expseg_vmm_unmap(v, va, g);
  if (h) _expseg_vmm_release(v, h, g);
  if (va) _expseg_vmm_unreserve(v, va, g);
out:
  if (have_ev) {
    _expseg_vmm_event_synchronize(v, ev);
    _expseg_vmm_event_destroy(v, ev);
  }
  if (own_stream) _expseg_vmm_stream_destroy(v, s);
}

/* ---- output ---- */

/* Least-squares line y = a + b x through n points; a, b clamped at 0. */
static void fit(const double *x, const double *y, size_t n, double *a, double *b) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < n; i++) {
    sx += x[i];
    sy += y[i];
    sxx += x[i] * x[i];
    sxy += x[i] * y[i];
  }
  double d = (double)n * sxx - sx * sx;
  *b = (n > 1 && d > 0) ? ((double)n * sxy - sx * sy) / d : 0.0;
  if (*b < 0) *b = 0;
  *a = n ? (sy - *b * sx) / (double)n : 0.0;
  if (*a < 0) *a = 0;
}

static int write_costs(const char *path, const char *spec, const size_row_t *rows, size_t n,
                       const size_t *pages, const stat_t *ps, const int *pok, size_t np,
                       size_t g) {
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    return 1;
  }
  fprintf(f, "# expseg-replay --costs table measured by expseg-bench-driver on %s\n"
             "# per call: intercept, per 2 MiB page: slope of the medians against pages\n",
          spec);
  double x[MAX_SIZES + MAX_PAGES], y[MAX_SIZES + MAX_PAGES], a, b;
  /* the cost model's kinds, in bench_size's terms (unreserve is not priced) */
  static const int kinds[] = {K_RESERVE, K_CREATE, K_RELEASE, K_MAP, K_UNMAP, K_ACCESS};
  static const char *const names[] = {"reserve", "create", "release", "map", "unmap",
                                      "set_access"};
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    size_t m = 0;
    for (size_t j = 0; j < np && kinds[i] == K_ACCESS; j++)
      if (pok[j]) {
        x[m] = (double)(pages[j] * g) / (double)TWO_MIB;
        y[m++] = ps[j].median_us;
      }
    if (m == 0) {
      for (size_t j = 0; j < n; j++)
        if (rows[j].measured) {
          x[m] = (double)rows[j].size / (double)TWO_MIB;
          y[m++] = rows[j].k[kinds[i]].median_us;
        }
    }
    if (!m) continue;
    fit(x, y, m, &a, &b);
    fprintf(f, "%s %.3f\n%s.page %.4f\n", names[i], a, names[i], b);
  }
  for (int which = 0; which < 2; which++) {
    size_t m = 0;
    for (size_t j = 0; j < n; j++)
      if (rows[j].cudart) {
        x[m] = (double)rows[j].size / (double)TWO_MIB;
        y[m++] = which ? rows[j].free_.median_us : rows[j].malloc_.median_us;
      }
    if (!m) continue;
    fit(x, y, m, &a, &b);
    const char *nm = which ? "cudaFree" : "cudaMalloc";
    fprintf(f, "%s %.3f\n%s.page %.4f\n", nm, a, nm, b);
  }
  return fclose(f) != 0;
}

static void json_stat(FILE *f, const char *name, stat_t s, const char *sep) {
  fprintf(f, "\"%s\": {\"median_us\": %.3f, \"p99_us\": %.3f}%s", name, s.median_us, s.p99_us,
          sep);
}

static int write_json(const char *path, const char *spec, expseg_vmm_t *v, unsigned rounds,
                      const size_row_t *rows, size_t n, const size_t *pages, const stat_t *ps,
                      const int *pok, size_t np, const cudart_t *rt, int want_rt,
                      const unmap_wait_t *w, unsigned wait_ms) {
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    return 1;
  }
  size_t fr = 0, tot = 0;
  _expseg_vmm_mem_info(v, &fr, &tot);
  fprintf(f, "{\"driver\": ");
  _expseg_json_str(f, spec);
  fprintf(f, ", \"backend\": \"%s\", \"granularity\": %zu, \"rounds\": %u, "
             "\"free_bytes\": %zu, \"total_bytes\": %zu,\n \"sizes\": [",
          v->ops->name, v->granularity, rounds, fr, tot);
  for (size_t i = 0; i < n; i++) {
    fprintf(f, "%s\n  {\"mib\": %zu, \"measured\": %s", i ? "," : "", rows[i].size >> 20,
            rows[i].measured ? "true" : "false");
    if (rows[i].measured) {
      fprintf(f, ", \"rounds\": %u, ", rounds_for(rows[i].size, rounds));
      for (int k = 0; k < K_COUNT; k++)
        json_stat(f, kind_names[k], rows[i].k[k], k + 1 < K_COUNT || rows[i].cudart ? ", " : "");
      if (rows[i].cudart) {
        json_stat(f, "cudaMalloc", rows[i].malloc_, ", ");
        json_stat(f, "cudaFree", rows[i].free_, "");
      }
    }
    fprintf(f, "}");
  }
  fprintf(f, "],\n \"set_access_pages\": [");
  for (size_t i = 0; i < np; i++) {
    fprintf(f, "%s{\"pages\": %zu, \"measured\": %s", i ? ", " : "", pages[i],
            pok[i] ? "true" : "false");
    if (pok[i]) fprintf(f, ", \"median_us\": %.3f, \"p99_us\": %.3f", ps[i].median_us, ps[i].p99_us);
    fprintf(f, "}");
  }
  fprintf(f, "],\n \"cudart\": ");
  if (!want_rt)
    fprintf(f, "{\"status\": \"not asked\"}");
  else if (rt->why[0]) {
    fprintf(f, "{\"status\": \"failed\", \"why\": ");
    _expseg_json_str(f, rt->why);
    fprintf(f, "}");
  }
  else
    fprintf(f, "{\"status\": \"ok\"}");
  fprintf(f, ",\n \"unmap_wait\": ");
  if (!wait_ms)
    fprintf(f, "{\"status\": \"not asked\"}");
  else if (!w->measured) {
    fprintf(f, "{\"status\": \"skipped\", \"why\": ");
    _expseg_json_str(f, w->why);
    fprintf(f, "}");
  }
  else
    fprintf(f, "{\"status\": \"ok\", \"hold_ms\": %.0f, \"unmap_ms\": %.3f, \"stream_was_busy\": %s, "
               "\"unmap_waits\": %s}",
            w->hold_ms, w->unmap_ms, w->stream_was_busy ? "true" : "false",
            w->waits ? "true" : "false");
  fprintf(f, "}\n");
  return fclose(f) != 0;
}

int main(int argc, char **argv) {
  if (expseg_tool_version(argc, argv, "expseg-bench-driver")) return 0;
  const char *spec = "host:capacity=1G", *json = NULL, *costs = NULL;
  uint64_t rounds = 200, wait_ms = 0;
  uint64_t sizes[MAX_SIZES] = {2, 20, 256, 2048}, pages_in[MAX_PAGES] = {1, 16, 256};
  size_t n_sizes = 4, n_pages = 3;
  int want_rt = 0;
  const _expseg_arg_t opts[] = {
      ARG_STR_("--driver", &spec),
      ARG_U64_("--rounds", &rounds, 1, 1000000),
      ARG_LIST_("--sizes", sizes, 1, 65536, &n_sizes, MAX_SIZES),
      ARG_LIST_("--pages", pages_in, 0, 4096, &n_pages, MAX_PAGES),
      ARG_FLAG_("--cudart", &want_rt),
      ARG_U64_("--unmap-wait", &wait_ms, 0, 60000),
      ARG_STR_("--json", &json),
      ARG_STR_("--costs-out", &costs),
  };
  if (_expseg_args_parse("expseg-bench-driver", argc, argv, opts, sizeof opts / sizeof opts[0],
                         usage))
    return 2;
  if (n_pages == 1 && pages_in[0] == 0) n_pages = 0;
  for (size_t i = 0; i < n_pages; i++)
    if (pages_in[i] == 0) {
      fprintf(stderr, "expseg-bench-driver: --pages: 0 is accepted only alone (no sweep)\n");
      return 2;
    }
  expseg_vmm_t *v = NULL;
  if (_expseg_vmm_open(spec, 0, &v) != EXPSEG_OK) {
    fprintf(stderr, "expseg-bench-driver: %s\n", expseg_last_error());
    return 2;
  }
  size_t g = v->granularity;
  printf("# driver %s (granularity %zu KiB); microseconds per call\n", spec, g >> 10);
  printf("%-28s %8s %-11s %10s %10s %7s\n", "driver", "MiB", "call", "median us", "p99 us",
         "rounds");
  int rc = 0;
  size_row_t rows[MAX_SIZES];
  memset(rows, 0, sizeof rows);
  cudart_t rt;
  memset(&rt, 0, sizeof rt);
  int rt_ok = want_rt && cudart_open(&rt, v->device) == 0;
  if (want_rt && !rt_ok) printf("# cudaMalloc/cudaFree: not measured: %s\n", rt.why);
  for (size_t i = 0; i < n_sizes && rc == 0; i++) {
    size_t size = sizes[i] << 20, fr = 0, tot = 0;
    if (size % g != 0) size = (size / g + 1) * g;
    rows[i].size = size;
    _expseg_vmm_mem_info(v, &fr, &tot);
    if (size > fr) {
      printf("# %zu MiB: skipped: the driver has %zu MiB free\n", size >> 20, fr >> 20);
      continue;
    }
    unsigned r = rounds_for(size, (unsigned)rounds);
    rc = bench_size(v, &rows[i], r);
    if (rc == 0)
      for (int k = 0; k < K_COUNT; k++)
        printf("%-28s %8zu %-11s %10.2f %10.2f %7u\n", spec, size >> 20, kind_names[k],
               rows[i].k[k].median_us, rows[i].k[k].p99_us, r);
    if (rc == 0 && rt_ok) {
      if (bench_cudart(&rt, &rows[i], r) == 0) {
        printf("%-28s %8zu %-11s %10.2f %10.2f %7u\n", "cudart", size >> 20, "cudaMalloc",
               rows[i].malloc_.median_us, rows[i].malloc_.p99_us, r);
        printf("%-28s %8zu %-11s %10.2f %10.2f %7u\n", "cudart", size >> 20, "cudaFree",
               rows[i].free_.median_us, rows[i].free_.p99_us, r);
      } else {
        printf("# cudaMalloc/cudaFree: %s\n", rt.why);
        rt_ok = 0;
      }
    }
  }
  size_t pages[MAX_PAGES];
  stat_t ps[MAX_PAGES];
  int pok[MAX_PAGES] = {0};
  unsigned pr = (unsigned)rounds / 10 < 3 ? 3 : (unsigned)rounds / 10;
  for (size_t i = 0; i < n_pages && rc == 0; i++) {
    size_t fr = 0, tot = 0;
    pages[i] = pages_in[i];
    _expseg_vmm_mem_info(v, &fr, &tot);
    if (pages[i] * g > fr) {
      printf("# set_access over %zu pages: skipped: the driver has %zu MiB free\n", pages[i],
             fr >> 20);
      continue;
    }
    rc = bench_pages(v, pages[i], pr, &ps[i]);
    if (rc == 0) {
      pok[i] = 1;
      printf("%-28s %8zu %-11s %10.2f %10.2f %7u  (%zu pages of %zu KiB)\n", spec,
             (pages[i] * g) >> 20, "set_access", ps[i].median_us, ps[i].p99_us, pr, pages[i],
             g >> 10);
    }
  }
  unmap_wait_t w;
  memset(&w, 0, sizeof w);
  if (wait_ms && rc == 0) {
    unmap_wait(v, (unsigned)wait_ms, &w);
    if (w.measured)
      printf("# unmap while another stream is held %u ms: %.3f ms (%s; the stream %s busy)\n",
             (unsigned)wait_ms, w.unmap_ms, w.waits ? "waits" : "does not wait",
             w.stream_was_busy ? "was" : "was NOT");
    else
      printf("# unmap-wait: skipped: %s\n", w.why);
  }
  if (json && write_json(json, spec, v, (unsigned)rounds, rows, n_sizes, pages, ps, pok, n_pages,
                         &rt, want_rt, &w, (unsigned)wait_ms))
    rc = 1;
  if (costs && rc == 0 && write_costs(costs, spec, rows, n_sizes, pages, ps, pok, n_pages, g)) rc = 1;
  _expseg_vmm_close(v);
  return rc;
}
