/* SPDX-License-Identifier: Apache-2.0 */
/* bench_device.c: expseg-bench-device, the allocator on a driver's real memory, with the
 * bytes checked. Two parts:
 *
 *  random  --ops operations (seeded: --seed, printed) of malloc (sizes log-uniform from 1 B
 *          to --max-size, on one of two streams) and free, the live set capped at --live
 *          blocks. Each new block gets a pattern written (the whole block up to 1 MiB; else
 *          three 256 KiB windows: head, middle, tail) through the driver's copy hook
 *          (_expseg_vmm_copy_in: cuMemcpyHtoD on cuda), checked before its free
 *          (_expseg_vmm_copy_out): a block that shares bytes with another live block, or a
 *          mapping that lost its pages, shows as a mismatch. expseg_check runs every 256 ops.
 *  oom     blocks of 1/32 of the device's total memory until malloc says out of memory: the
 *          time of the failing call (the whole OOM path: cache given back, retry, message),
 *          its status and message; then everything freed and one block taken again.
 *
 * At the end the driver must hold nothing (expseg_testing_destroy). Exit status 0 when
 * every check passed, 1 when one failed, 2 for bad options. White-box like
 * expseg-bench-driver: it opens the driver itself to reach the copy hook. */
#include "error.h"
#include "internal.h"
#include "rand.h"
#include "synth_replay.h" /* _expseg_json_str */
#include "tool_args.h"
#include "tool_version.h"
#include "trace_internal.h"

#include "expseg_testing.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { WINDOW = 256 << 10, WHOLE = 1 << 20 };

typedef struct {
  void *p;
  size_t size;
  uint64_t tag;
} live_t;

static void usage(FILE *f) {
  fprintf(f, "usage: expseg-bench-device [options]\n"
             "  --driver SPEC    driver spec (default host:capacity=512M)\n"
             "  --ops N          random operations (default 2000)\n"
             "  --seed N         seed of the random part (default 1)\n"
             "  --live N         most live blocks (default 64)\n"
             "  --max-size SIZE  largest request (default 64M)\n"
             "  --no-oom         skip the fill-to-out-of-memory part\n"
             "  --json FILE      the figures as JSON\n");
}

static unsigned char pat(uint64_t tag, size_t off) {
  uint64_t x = tag ^ (off * 0x9E3779B97F4A7C15ull);
  x ^= x >> 29;
  return (unsigned char)(x * 0xBF58476D1CE4E5B9ull >> 56);
}

/* The windows of a block that carry the pattern: [off, off+len) for each of up to 3. */
static size_t windows(size_t size, size_t off[3], size_t len[3]) {
  if (size <= WHOLE) {
    off[0] = 0;
    len[0] = size;
    return 1;
  }
  off[0] = 0;
  off[1] = (size / 2) & ~(size_t)4095;
  off[2] = size - WINDOW;
  for (int i = 0; i < 3; i++) len[i] = WINDOW;
  return 3;
}

static expseg_status fill(expseg_vmm_t *v, const live_t *b, unsigned char *buf) {
  size_t off[3], len[3], n = windows(b->size, off, len);
  for (size_t w = 0; w < n; w++) {
    for (size_t i = 0; i < len[w]; i++) buf[i] = pat(b->tag, off[w] + i);
    expseg_status s = _expseg_vmm_copy_in(v, (uintptr_t)b->p + off[w], buf, len[w]);
    if (s) return s;
  }
  return EXPSEG_OK;
}

/* 0 when the pattern is intact, 1 on a mismatch (reported), -1 when the copy failed. */
static int check(expseg_vmm_t *v, const live_t *b, unsigned char *buf) {
  size_t off[3], len[3], n = windows(b->size, off, len);
  for (size_t w = 0; w < n; w++) {
    if (_expseg_vmm_copy_out(v, buf, (uintptr_t)b->p + off[w], len[w])) return -1;
    for (size_t i = 0; i < len[w]; i++)
      if (buf[i] != pat(b->tag, off[w] + i)) {
        fprintf(stderr, "expseg-bench-device: block %p (%zu bytes, tag %" PRIu64 "): byte %zu "
                        "is 0x%02x, written 0x%02x\n",
                b->p, b->size, b->tag, off[w] + i, buf[i], pat(b->tag, off[w] + i));
        return 1;
      }
  }
  return 0;
}

typedef struct {
  uint64_t ops, mallocs, frees, checked_bytes, mismatches, ooms_in_random;
  double seconds;
  int ok;
  char why[512];
} random_result_t;

static void run_random(expseg_allocator *a, expseg_vmm_t *v, uint64_t ops, uint64_t seed,
                       size_t max_live, size_t max_size, expseg_stream streams[2],
                       random_result_t *r) {
  memset(r, 0, sizeof *r);
  live_t *live = calloc(max_live, sizeof *live);
  unsigned char *buf = malloc(WHOLE);
  size_t n = 0;
  uint64_t rng = seed, t0 = _expseg_bench_now_ns();
  r->ok = live && buf;
  double lmax = 0;
  for (size_t s = max_size; s > 1; s >>= 1) lmax += 1;
  for (uint64_t i = 0; i < ops && r->ok; i++) {
    uint64_t x = _expseg_splitmix64(&rng);
    if (n < max_live && (n == 0 || x % 100 < 55)) {
      /* log-uniform size: 2^(0..lmax) scaled by a fraction */
      uint64_t y = _expseg_splitmix64(&rng);
      unsigned bits = (unsigned)(y % (uint64_t)(lmax + 1));
      size_t size = ((size_t)1 << bits) + (size_t)((y >> 8) % (((size_t)1 << bits)));
      if (size > max_size) size = max_size;
      live_t *b = &live[n];
      b->size = size;
      b->tag = _expseg_splitmix64(&rng);
      expseg_status s = expseg_malloc(a, size, streams[y >> 63], &b->p);
      if (s == EXPSEG_ERR_OUT_OF_MEMORY) {
        r->ooms_in_random++;
        continue;
      }
      if (s) {
        snprintf(r->why, sizeof r->why, "malloc(%zu): %s", size, expseg_last_error());
        r->ok = 0;
        break;
      }
      r->mallocs++;
      if (fill(v, b, buf)) {
        snprintf(r->why, sizeof r->why, "copy_in: %s", expseg_last_error());
        r->ok = 0;
        n++;
        break;
      }
      n++;
    } else {
      size_t k = (size_t)(x >> 32) % n;
      int c = check(v, &live[k], buf);
      if (c < 0) {
        snprintf(r->why, sizeof r->why, "copy_out: %s", expseg_last_error());
        r->ok = 0;
        break;
      }
      r->mismatches += (uint64_t)c;
      size_t off[3], len[3], w = windows(live[k].size, off, len);
      for (size_t j = 0; j < w; j++) r->checked_bytes += len[j];
      if (expseg_free(a, live[k].p)) {
        snprintf(r->why, sizeof r->why, "free: %s", expseg_last_error());
        r->ok = 0;
        break;
      }
      r->frees++;
      live[k] = live[--n];
    }
    r->ops++;
    if ((i & 255) == 255 && expseg_check(a) != EXPSEG_OK) {
      snprintf(r->why, sizeof r->why, "expseg_check after op %" PRIu64 ": %s", i,
               expseg_last_error());
      r->ok = 0;
    }
  }
  /* the rest are checked and freed too */
  while (n > 0) {
    n--;
    if (r->ok) {
      int c = check(v, &live[n], buf);
      if (c < 0) {
        snprintf(r->why, sizeof r->why, "copy_out: %s", expseg_last_error());
        r->ok = 0;
      } else {
        r->mismatches += (uint64_t)c;
      }
    }
    if (expseg_free(a, live[n].p) == EXPSEG_OK) r->frees++;
  }
  if (r->mismatches) {
    snprintf(r->why, sizeof r->why, "%" PRIu64 " blocks lost their bytes", r->mismatches);
    r->ok = 0;
  }
  r->seconds = (double)(_expseg_bench_now_ns() - t0) / 1e9;
  free(live);
  free(buf);
}

typedef struct {
  int ok;
  size_t block, blocks, total;
  double fail_ms;
  int status;
  char message[512], why[1024];
} oom_result_t;

static void run_oom(expseg_allocator *a, expseg_vmm_t *v, oom_result_t *r) {
  memset(r, 0, sizeof *r);
  size_t fr = 0, tot = 0;
  _expseg_vmm_mem_info(v, &fr, &tot);
  r->total = tot;
  size_t g = v->granularity;
  r->block = (tot / 32 + g - 1) / g * g;
  size_t cap = 4096;
  void **p = calloc(cap, sizeof *p);
  expseg_status s = EXPSEG_OK;
  double ms = 0;
  while (p && r->blocks < cap) {
    uint64_t t0 = _expseg_bench_now_ns();
    s = expseg_malloc(a, r->block, 0, &p[r->blocks]);
    ms = (double)(_expseg_bench_now_ns() - t0) / 1e6;
    if (s) break;
    r->blocks++;
  }
  r->status = (int)s;
  r->fail_ms = ms;
  snprintf(r->message, sizeof r->message, "%s", s ? expseg_last_error() : "");
  for (size_t i = 0; i < r->blocks; i++) expseg_free(a, p[i]);
  free(p);
  void *again = NULL;
  if (s != EXPSEG_ERR_OUT_OF_MEMORY)
    snprintf(r->why, sizeof r->why, "filling the device ended with %s, not out of memory: %s",
             expseg_status_name(s), r->message);
  else if (r->message[0] == 0)
    snprintf(r->why, sizeof r->why, "out of memory without a message");
  else if (expseg_malloc(a, r->block, 0, &again) != EXPSEG_OK)
    snprintf(r->why, sizeof r->why, "after freeing everything, malloc(%zu) failed: %s", r->block,
             expseg_last_error());
  else
    r->ok = 1;
  if (again) expseg_free(a, again);
}

int main(int argc, char **argv) {
  if (expseg_tool_version(argc, argv, "expseg-bench-device")) return 0;
  const char *spec = "host:capacity=512M", *json = NULL;
  uint64_t ops = 2000, seed = 1, max_live = 64, max_size = 64 << 20;
  int no_oom = 0;
  const _expseg_arg_t opts[] = {
      ARG_STR_("--driver", &spec),
      ARG_U64_("--ops", &ops, 0, 100000000),
      ARG_U64_("--seed", &seed, 0, UINT64_MAX),
      ARG_U64_("--live", &max_live, 1, 1000000),
      ARG_SIZE_("--max-size", &max_size, 1, (uint64_t)1 << 40),
      ARG_FLAG_("--no-oom", &no_oom),
      ARG_STR_("--json", &json),
  };
  if (_expseg_args_parse("expseg-bench-device", argc, argv, opts, sizeof opts / sizeof opts[0],
                         usage))
    return 2;
  printf("seed %" PRIu64 " (--seed %" PRIu64 " reproduces)\n", seed, seed);
  expseg_vmm_t *v = NULL;
  expseg_allocator *a = NULL;
  if (_expseg_vmm_open(spec, 0, &v) != EXPSEG_OK) {
    fprintf(stderr, "expseg-bench-device: %s\n", expseg_last_error());
    return 2;
  }
  /* the driver's copy hook is needed: sim has no bytes */
  if (strcmp(v->ops->name, "sim") == 0) {
    fprintf(stderr, "expseg-bench-device: --driver %s: the sim driver has no bytes to check "
                    "(accepted: cuda, host)\n", spec);
    _expseg_vmm_close(v);
    return 2;
  }
  expseg_vmm_t *drv = v; /* owned by the allocator from here on */
  if (_expseg_create_with_driver(v, NULL, &a) != EXPSEG_OK) {
    fprintf(stderr, "expseg-bench-device: %s\n", expseg_last_error());
    return 2;
  }
  expseg_stream streams[2] = {0, 7};
  int own = _expseg_vmm_stream_create(drv, &streams[1]) == EXPSEG_OK;
  random_result_t rr;
  run_random(a, drv, ops, seed, (size_t)max_live, (size_t)max_size, streams, &rr);
  printf("random: %" PRIu64 " ops (%" PRIu64 " mallocs, %" PRIu64 " frees, %" PRIu64
         " out of memory) in %.3f s, %" PRIu64 " bytes checked, %" PRIu64 " mismatches: %s%s\n",
         rr.ops, rr.mallocs, rr.frees, rr.ooms_in_random, rr.seconds, rr.checked_bytes,
         rr.mismatches, rr.ok ? "ok" : "FAILED: ", rr.ok ? "" : rr.why);
  oom_result_t oo;
  memset(&oo, 0, sizeof oo);
  if (!no_oom) {
    expseg_empty_cache(a);
    run_oom(a, drv, &oo);
    printf("oom: %zu blocks of %zu MiB (device total %zu MiB), failing malloc %.3f ms, %s: %s%s\n",
           oo.blocks, oo.block >> 20, oo.total >> 20, oo.fail_ms, expseg_status_name(oo.status),
           oo.ok ? "ok" : "FAILED: ", oo.ok ? "" : oo.why);
    printf("oom message: %s\n", oo.message);
  }
  if (own) { /* the allocator keeps no work on it: synchronized, it can go */
    _expseg_vmm_stream_synchronize(drv, streams[1]);
    _expseg_vmm_stream_destroy(drv, streams[1]);
  }
  expseg_testing_driver_counts left;
  memset(&left, 0, sizeof left);
  expseg_testing_destroy(a, &left);
  int leaked = left.live_chunks || left.live_reservations || left.mapped_bytes || left.live_events;
  printf("left with the driver after destroy: %" PRId64 " chunks, %" PRId64 " reservations, %" PRId64
         " mapped bytes, %" PRId64 " events: %s\n",
         left.live_chunks, left.live_reservations, left.mapped_bytes, left.live_events,
         leaked ? "LEAK" : "ok");
  if (json) {
    FILE *f = fopen(json, "w");
    if (!f) {
      perror(json);
      return 1;
    }
    fprintf(f, "{\"driver\": ");
    _expseg_json_str(f, spec);
    fprintf(f, ",\n \"random\": {\"ok\": %s, \"seed\": %" PRIu64 ", \"ops\": %" PRIu64
               ", \"mallocs\": %" PRIu64 ", \"frees\": %" PRIu64 ", \"out_of_memory\": %" PRIu64
               ", \"seconds\": %.6f, \"checked_bytes\": %" PRIu64 ", \"mismatches\": %" PRIu64
               ", \"why\": ",
            rr.ok ? "true" : "false", seed, rr.ops, rr.mallocs, rr.frees, rr.ooms_in_random,
            rr.seconds, rr.checked_bytes, rr.mismatches);
    _expseg_json_str(f, rr.why);
    fprintf(f, "},\n \"oom\": ");
    if (no_oom) {
      fprintf(f, "{\"status\": \"not asked\"}");
    } else {
      fprintf(f, "{\"ok\": %s, \"block_bytes\": %zu, \"blocks\": %zu, \"total_bytes\": %zu, "
                 "\"failing_malloc_ms\": %.3f, \"status\": \"%s\", \"message\": ",
              oo.ok ? "true" : "false", oo.block, oo.blocks, oo.total, oo.fail_ms,
              expseg_status_name(oo.status));
      _expseg_json_str(f, oo.message);
      fprintf(f, ", \"why\": ");
      _expseg_json_str(f, oo.why);
      fprintf(f, "}");
    }
    fprintf(f, ",\n \"leaked\": %s}\n", leaked ? "true" : "false");
    if (fclose(f)) return 1;
  }
  return (rr.ok && (no_oom || oo.ok) && !leaked) ? 0 : 1;
}
