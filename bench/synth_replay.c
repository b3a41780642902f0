/* synth_replay.c: the replay tool's whole logic (expseg_replay_main); bench/replay.c is a
 * two-line main around it so that tests/test_replay.cpp can call it in-process. (The
 * file name starts with "synth" so that the expseg_traces library's glob picks it up.)
 *
 * A history (expseg_trace_t) is replayed through a fresh allocator: 'p' and 'a' become
 * expseg_malloc on the event's stream index (used as the stream handle itself, 0 = the
 * default stream), 'f' becomes expseg_free, 'r' does nothing (the memory stays live until
 * the matching 'f': the trace already says when the other stream's work completed), 'E'
 * becomes expseg_empty_cache, and the recorded allocator's own events (M X m u O) are
 * only counted for the baseline. A failed malloc counts as an OOM and leaves the id
 * unallocated, so its later free is skipped. Only the event loop is timed.
 *
 * --sweep replays each history under every configuration in `sweep_table` and ranks them
 * by peak reserved memory, then by driver calls. Usage and output fields: docs/replay.md. */
#include "trace.h"
#include "trace_internal.h"
#include "synth_model.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int expseg_replay_main(int argc, char **argv, FILE *out, FILE *err);

#define GIB ((uint64_t)1 << 30)

/* ------------------------------------------------------------------------------------ */
/* The sweep table: what --sweep tries. pytorch = 1 when the text is valid for PyTorch's  */
/* own allocator too (expseg-only keys: page_size_mb, page_cache_max_mb, va_reserve_mb).  */

typedef struct sweep_conf_s {
  const char *label;
  const char *conf;
  int pytorch;
} sweep_conf_t;

static const sweep_conf_t sweep_table[] = {
    {"classic", "expandable_segments:False", 1},
    {"classic, max_split 512M", "expandable_segments:False,max_split_size_mb:512", 1},
    {"classic, max_split 128M", "expandable_segments:False,max_split_size_mb:128", 1},
    {"classic, max_split 32M", "expandable_segments:False,max_split_size_mb:32", 1},
    {"classic, roundup 4", "expandable_segments:False,roundup_power2_divisions:4", 1},
    {"classic, roundup 8", "expandable_segments:False,roundup_power2_divisions:8", 1},
    {"expandable", "expandable_segments:True", 1},
    {"expandable, page 8M", "expandable_segments:True,page_size_mb:8", 0},
    {"expandable, page 20M", "expandable_segments:True,page_size_mb:20", 0},
    {"expandable, roundup 4", "expandable_segments:True,roundup_power2_divisions:4", 1},
    {"expandable, roundup 8", "expandable_segments:True,roundup_power2_divisions:8", 1},
    {"expandable, max_split 128M", "expandable_segments:True,max_split_size_mb:128", 1},
};
#define N_SWEEP (sizeof sweep_table / sizeof sweep_table[0])

/* Driver calls that touch memory (expseg.driver.<name>): the cost column of the sweep. */
static const char *const mem_calls[] = {"reserve", "unreserve", "create", "release",
                                        "map", "unmap", "set_access"};
#define N_MEM_CALLS (sizeof mem_calls / sizeof mem_calls[0])

/* ------------------------------------------------------------------------------------ */
/* Options and results                                                                   */

typedef struct opts_s {
  const char *driver;     /* NULL = sim sized from the trace */
  const char *conf;       /* NULL = environment */
  int model;              /* EXPSEG_MODEL_* */
  int device;
  int check, json, sweep, quiet;
  const char *timeline;   /* CSV path or NULL */
  uint64_t timeline_every; /* 0 = auto */
  uint64_t limit;         /* replay only the first `limit` events of each history; 0 = all */
} opts_t;

typedef struct result_s {
  uint64_t events;        /* replayed events (p a f r E) */
  uint64_t ops;           /* allocator calls made (malloc, free, empty_cache) */
  uint64_t peak_requested;
  int64_t peak_allocated, peak_reserved, num_device_alloc, num_device_free;
  int64_t warm_alloc, warm_free; /* num_device_alloc/free once the pre-live set is in */
  uint64_t num_ooms;      /* failed mallocs */
  uint64_t errors;        /* other failures (first one printed) */
  int64_t created_bytes;  int has_created;
  int64_t calls[N_MEM_CALLS]; int has_calls;
  uint64_t driver_calls;  /* sum of calls[] */
  double ns_per_op;
  uint64_t loop_ns;
  char driver[128];
  char config[1024];
  int model;              /* EXPSEG_MODEL_* */
  int warm_started;       /* the recorded start state was rebuilt */
} result_t;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int64_t stat_or(const expseg_allocator *a, const char *key, int64_t dflt, int *found) {
  int64_t v = 0;
  if (expseg_stat(a, key, &v) == EXPSEG_OK) {
    if (found) *found = 1;
    return v;
  }
  if (found) *found = 0;
  return dflt;
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static const char *human(char buf[32], double bytes) {
  if (bytes >= (double)GIB) snprintf(buf, 32, "%.2f GiB", bytes / (double)GIB);
  else if (bytes >= 1048576.0) snprintf(buf, 32, "%.1f MiB", bytes / 1048576.0);
  else snprintf(buf, 32, "%.0f B", bytes);
  return buf;
}

/* ------------------------------------------------------------------------------------ */
/* One replay                                                                            */

static void default_driver(const expseg_trace_t *t, char *buf, size_t len) {
  uint64_t gib = (2 * t->peak_live_requested + GIB - 1) / GIB;
  if (gib < 80) gib = 80;
  snprintf(buf, len, "sim:capacity=%" PRIu64 "G", gib);
}

/* Returns 0 on success, 1 when --check found a violation or the allocator failed in a way
 * that is not an OOM, 2 when the allocator could not be created (bad --driver/--conf). */
static int replay_one(const expseg_trace_t *t, const opts_t *o, int model,
                      const char *user_conf, FILE *timeline, FILE *err, result_t *r) {
  memset(r, 0, sizeof *r);
  r->model = model;
  if (o->driver) snprintf(r->driver, sizeof r->driver, "%s", o->driver);
  else default_driver(t, r->driver, sizeof r->driver);
  char confbuf[1024];
  const char *conf = _expseg_model_conf(model, user_conf, t, confbuf, sizeof confbuf);

  expseg_allocator *a = NULL;
  expseg_status s = expseg_create(r->driver, o->device, conf, &a);
  if (s != EXPSEG_OK) {
    fprintf(err, "expseg-replay: cannot create the allocator (driver '%s', config '%s'): %s\n",
            r->driver, conf ? conf : "(environment)", expseg_last_error());
    return 2;
  }
  expseg_config_string(a, r->config, sizeof r->config);
  void **ptr = calloc(t->n_ids ? t->n_ids : 1, sizeof *ptr);
  if (!ptr) {
    expseg_destroy(a);
    fprintf(err, "expseg-replay: out of host memory for %" PRIu64 " ids of %s\n", t->n_ids,
            t->name);
    return 1;
  }
  if (model == EXPSEG_MODEL_PYTORCH && _expseg_conf_expandable(conf) != 1) {
    char why[256] = "";
    if (_expseg_model_warm_start(a, t, ptr, why, sizeof why)) {
      fprintf(err, "expseg-replay: %s: cannot rebuild the recorded start state: %s\n",
              t->name, why);
      free(ptr);
      expseg_destroy(a);
      return 1;
    }
    r->warm_started = t->n_start_segs > 0;
  }
  uint64_t every = o->timeline_every;
  if (!every) every = t->n_events / 2000 ? t->n_events / 2000 : 1;

  int rc = 0, progress = 0;
  uint64_t live = 0, peak = 0, events = 0, ops = 0, ooms = 0, errors = 0;
  const expseg_trace_event_t *ev = t->events;
  const size_t n = o->limit && o->limit < t->n_events ? (size_t)o->limit : t->n_events;
  const uint64_t t0 = now_ns();
  for (size_t i = 0; i < n; i++) {
    const expseg_trace_event_t *e = &ev[i];
    if (i > 0 && e->kind != EXPSEG_TR_PRELIVE && ev[i - 1].kind == EXPSEG_TR_PRELIVE) {
      /* the recorded window starts here: what came before rebuilt its starting state */
      r->warm_alloc = stat_or(a, "num_device_alloc", 0, NULL);
      r->warm_free = stat_or(a, "num_device_free", 0, NULL);
    }
    switch (e->kind) {
    case EXPSEG_TR_PRELIVE:
    case EXPSEG_TR_ALLOC: {
      events++;
      ops++;
      if (e->kind == EXPSEG_TR_PRELIVE && e->id < t->n_ids && ptr[e->id]) {
        live += e->size; /* placed by the warm start */
        if (live > peak) peak = live;
        break;
      }
      if (e->id >= t->n_ids || ptr[e->id]) {
        if (!errors++)
          fprintf(err, "expseg-replay: %s event %zu: id %" PRIu64 " out of range or live\n",
                  t->name, i, e->id);
        break;
      }
      void *p = NULL;
      s = expseg_malloc(a, (size_t)e->size, (expseg_stream)e->stream, &p);
      if (s == EXPSEG_OK) {
        ptr[e->id] = p;
        live += e->size;
        if (live > peak) peak = live;
      } else if (s == EXPSEG_ERR_OUT_OF_MEMORY) {
        ooms++;
      } else if (!errors++) {
        fprintf(err, "expseg-replay: %s event %zu: malloc(%" PRIu64 "): %s\n", t->name, i,
                e->size, expseg_last_error());
      }
      break;
    }
    case EXPSEG_TR_FREE:
      events++;
      if (e->id < t->n_ids && ptr[e->id]) {
        ops++;
        if (expseg_free(a, ptr[e->id]) != EXPSEG_OK && !errors++)
          fprintf(err, "expseg-replay: %s event %zu: free(id %" PRIu64 "): %s\n", t->name, i,
                  e->id, expseg_last_error());
        ptr[e->id] = NULL;
        live -= e->size;
      }
      break;
    case EXPSEG_TR_FREE_REQ:
      events++;
      break;
    case EXPSEG_TR_EMPTY:
      events++;
      ops++;
      if (expseg_empty_cache(a) != EXPSEG_OK && !errors++)
        fprintf(err, "expseg-replay: %s event %zu: empty_cache: %s\n", t->name, i,
                expseg_last_error());
      break;
    default:
      continue; /* baseline kinds */
    }
    if (o->check && expseg_check(a) != EXPSEG_OK) {
      fprintf(err, "expseg-replay: %s: check failed after event %zu ('%c' id %" PRIu64
                   " size %" PRIu64 "): %s\n",
              t->name, i, e->kind, e->id, e->size, expseg_last_error());
      rc = 1;
      break;
    }
    if (timeline && (events % every == 0 || i + 1 == n)) {
      fprintf(timeline, "%s,%zu,%" PRIu64 ",%" PRId64 "\n", t->name, i, live,
              stat_or(a, "reserved_bytes.all.current", -1, NULL));
    }
    if ((i & 8191) == 8191 && err && !o->quiet) {
      uint64_t el = now_ns() - t0;
      if (el > 1000000000ull) {
        progress = 1;
        fprintf(err, "\r%s: %zu / %zu events (%.0f%%), %.1f s", t->name, i + 1, n,
                100.0 * (double)(i + 1) / (double)n, (double)el / 1e9);
        fflush(err);
      }
    }
  }
  r->loop_ns = now_ns() - t0;
  if (progress) fprintf(err, "\n");

  r->events = events;
  r->ops = ops;
  r->peak_requested = peak;
  r->num_ooms = ooms;
  r->errors = errors;
  r->ns_per_op = events ? (double)r->loop_ns / (double)events : 0.0;
  r->peak_allocated = stat_or(a, "allocated_bytes.all.peak", -1, NULL);
  r->peak_reserved = stat_or(a, "reserved_bytes.all.peak", -1, NULL);
  r->num_device_alloc = stat_or(a, "num_device_alloc", -1, NULL);
  r->num_device_free = stat_or(a, "num_device_free", -1, NULL);
  r->created_bytes = stat_or(a, "expseg.created_bytes", 0, &r->has_created);
  for (size_t k = 0; k < N_MEM_CALLS; k++) {
    char key[64];
    int found = 0;
    snprintf(key, sizeof key, "expseg.driver.%s", mem_calls[k]);
    r->calls[k] = stat_or(a, key, 0, &found);
    if (found) {
      r->has_calls = 1;
      r->driver_calls += (uint64_t)r->calls[k];
    }
  }
  free(ptr);
  expseg_destroy(a);
  if (errors && !rc) rc = 1;
  return rc;
}

/* ------------------------------------------------------------------------------------ */
/* Output                                                                                */

static double ratio(int64_t num, uint64_t den) {
  return den && num >= 0 ? (double)num / (double)den : 0.0;
}

static void print_json(FILE *f, const expseg_trace_t *t, const result_t *r, const char *label,
                       int rank) {
  fprintf(f, "{\"trace\":");
  json_str(f, t->name);
  fprintf(f, ",\"device\":%d", t->device);
  if (label) {
    fprintf(f, ",\"setting\":");
    json_str(f, label);
    fprintf(f, ",\"rank\":%d", rank);
  }
  fprintf(f, ",\"model\":\"%s\",\"warm_start\":%s,\"driver\":", _expseg_model_name(r->model),
          r->warm_started ? "true" : "false");
  json_str(f, r->driver);
  fprintf(f, ",\"config\":");
  json_str(f, r->config);
  fprintf(f,
          ",\"events\":%" PRIu64 ",\"ops\":%" PRIu64 ",\"peak_requested\":%" PRIu64
          ",\"peak_allocated\":%" PRId64 ",\"peak_reserved\":%" PRId64
          ",\"num_device_alloc\":%" PRId64 ",\"num_device_free\":%" PRId64
          ",\"num_ooms\":%" PRIu64 ",\"errors\":%" PRIu64 ",\"ns_per_op\":%.1f",
          r->events, r->ops, r->peak_requested, r->peak_allocated, r->peak_reserved,
          r->num_device_alloc, r->num_device_free, r->num_ooms, r->errors, r->ns_per_op);
  fprintf(f, ",\"window_device_alloc\":%" PRId64 ",\"window_device_free\":%" PRId64,
          r->num_device_alloc - r->warm_alloc, r->num_device_free - r->warm_free);
  if (r->has_created) fprintf(f, ",\"created_bytes\":%" PRId64, r->created_bytes);
  fprintf(f, ",\"ratio\":%.4f", ratio(r->peak_reserved, r->peak_requested));
  if (r->has_calls) {
    fprintf(f, ",\"driver_calls\":{");
    for (size_t k = 0; k < N_MEM_CALLS; k++)
      fprintf(f, "%s\"%s\":%" PRId64, k ? "," : "", mem_calls[k], r->calls[k]);
    fprintf(f, "}");
  }
  if (t->baseline.present) {
    const expseg_trace_baseline_t *b = &t->baseline;
    fprintf(f,
            ",\"baseline\":{\"peak_reserved\":%" PRIu64 ",\"segment_alloc\":%" PRIu64
            ",\"segment_free\":%" PRIu64 ",\"map\":%" PRIu64 ",\"unmap\":%" PRIu64
            ",\"oom\":%" PRIu64 ",\"ratio\":%.4f}",
            b->peak_reserved, b->segment_alloc, b->segment_free, b->map, b->unmap, b->oom,
            ratio((int64_t)b->peak_reserved, r->peak_requested));
  }
  fprintf(f, "}\n");
}

static void print_table_head(FILE *f) {
  fprintf(f, "%-44s %9s %11s %11s %6s %11s %6s %13s %5s %7s\n", "trace", "events",
          "peak req", "peak resv", "ratio", "recorded", "ratio", "dev a/f", "ooms", "ns/op");
}

static void print_table_row(FILE *f, const expseg_trace_t *t, const result_t *r) {
  char b1[32], b2[32], b3[32], af[32];
  snprintf(af, sizeof af, "%" PRId64 "/%" PRId64, r->num_device_alloc, r->num_device_free);
  if (t->baseline.present)
    fprintf(f, "%-44.44s %9" PRIu64 " %11s %11s %6.3f %11s %6.3f %13s %5" PRIu64 " %7.1f\n",
            t->name, r->events, human(b1, (double)r->peak_requested),
            human(b2, (double)r->peak_reserved), ratio(r->peak_reserved, r->peak_requested),
            human(b3, (double)t->baseline.peak_reserved),
            ratio((int64_t)t->baseline.peak_reserved, r->peak_requested), af, r->num_ooms,
            r->ns_per_op);
  else
    fprintf(f, "%-44.44s %9" PRIu64 " %11s %11s %6.3f %11s %6s %13s %5" PRIu64 " %7.1f\n",
            t->name, r->events, human(b1, (double)r->peak_requested),
            human(b2, (double)r->peak_reserved), ratio(r->peak_reserved, r->peak_requested),
            "-", "-", af, r->num_ooms, r->ns_per_op);
}

/* ------------------------------------------------------------------------------------ */
/* Sweep                                                                                 */

typedef struct sweep_row_s {
  const char *label, *conf;
  int pytorch, model;
  result_t r;
} sweep_row_t;

static uint64_t row_cost(const sweep_row_t *w) {
  return (uint64_t)(w->r.num_device_alloc + w->r.num_device_free) + w->r.driver_calls;
}

static int row_cmp(const void *pa, const void *pb) {
  const sweep_row_t *a = pa, *b = pb;
  /* failed settings last, then OOMs, then least memory held, then fewest driver calls */
  if ((a->r.errors > 0) != (b->r.errors > 0)) return a->r.errors > 0 ? 1 : -1;
  if ((a->r.num_ooms > 0) != (b->r.num_ooms > 0)) return a->r.num_ooms > 0 ? 1 : -1;
  if (a->r.peak_reserved != b->r.peak_reserved)
    return a->r.peak_reserved < b->r.peak_reserved ? -1 : 1;
  uint64_t ca = row_cost(a), cb = row_cost(b);
  return ca < cb ? -1 : ca > cb;
}

static int sweep_one(const expseg_trace_t *t, const opts_t *o, FILE *out, FILE *err) {
  size_t n = N_SWEEP + (o->conf ? 1 : 0);
  sweep_row_t *rows = calloc(n, sizeof *rows);
  if (!rows) return 1;
  int rc = 0, failed = 0;
  const int tty = !o->quiet && isatty(fileno(err));
  for (size_t i = 0; i < n && rc != 2; i++) {
    sweep_row_t *w = &rows[i];
    if (i < N_SWEEP) {
      w->label = sweep_table[i].label;
      w->conf = sweep_table[i].conf;
      w->pytorch = sweep_table[i].pytorch;
    } else {
      w->label = "yours (--conf)";
      w->conf = o->conf;
      w->pytorch = 1;
    }
    if (tty)
      fprintf(err, "\r%s: setting %zu/%zu (%s)%20s", t->name, i + 1, n, w->label, "");
    /* a setting the allocator fails on (not an OOM) is ranked last and the sweep goes on;
     * the exit status is then 1 */
    rc = replay_one(t, o, w->model, w->conf, NULL, err, &w->r);
    if (rc == 1) {
      failed = 1;
      if (!w->r.errors) w->r.errors = 1; /* a --check violation */
    }
  }
  if (tty) fprintf(err, "\r%90s\r", "");
  if (rc == 2) {
    free(rows);
    return rc;
  }
  qsort(rows, n, sizeof *rows, row_cmp);
  if (o->json) {
    for (size_t i = 0; i < n; i++) print_json(out, t, &rows[i].r, rows[i].label, (int)i + 1);
    free(rows);
    return failed;
  }
  char b1[32], b2[32];
  fprintf(out, "\n%s: %" PRIu64 " events, peak requested %s", t->name, rows[0].r.events,
          human(b1, (double)rows[0].r.peak_requested));
  if (t->baseline.present)
    fprintf(out, ", recorded allocator held %s (ratio %.3f)",
            human(b2, (double)t->baseline.peak_reserved),
            ratio((int64_t)t->baseline.peak_reserved, rows[0].r.peak_requested));
  fprintf(out, "\n%4s  %-28s %11s %6s %8s %9s %5s  %s\n", "rank", "setting", "peak resv",
          "ratio", "dev a+f", "drv calls", "ooms", "PYTORCH_CUDA_ALLOC_CONF");
  for (size_t i = 0; i < n; i++) {
    const sweep_row_t *w = &rows[i];
    char calls[24];
    if (w->r.has_calls) snprintf(calls, sizeof calls, "%" PRIu64, w->r.driver_calls);
    else snprintf(calls, sizeof calls, "-");
    if (w->r.errors) {
      fprintf(out, "%4zu  %-28s %11s %6s %8s %9s %5s  %s  (allocator failed: see stderr)\n",
              i + 1, w->label, "FAILED", "-", "-", "-", "-", w->conf);
      continue;
    }
    fprintf(out, "%4zu  %-28s %11s %6.3f %8" PRId64 " %9s %5" PRIu64 "  %s%s\n", i + 1,
            w->label, human(b1, (double)w->r.peak_reserved),
            ratio(w->r.peak_reserved, w->r.peak_requested),
            w->r.num_device_alloc + w->r.num_device_free, calls, w->r.num_ooms, w->conf,
            w->pytorch ? "" : "  (expseg only)");
  }
  const sweep_row_t *best = &rows[0], *best_pt = NULL;
  for (size_t i = 0; i < n && !best_pt; i++)
    if (rows[i].pytorch) best_pt = &rows[i];
  fprintf(out, "least memory: %s -> %s=%s\n", best->label,
          best->pytorch ? "PYTORCH_CUDA_ALLOC_CONF" : "EXPSEG_ALLOC_CONF", best->conf);
  if (best_pt && best_pt != best)
    fprintf(out, "least memory with PyTorch's own allocator keys: %s -> "
                 "PYTORCH_CUDA_ALLOC_CONF=%s\n",
            best_pt->label, best_pt->conf);
  free(rows);
  return failed;
}

/* ------------------------------------------------------------------------------------ */
/* Command line                                                                          */

static void usage(FILE *f) {
  fprintf(f,
          "usage: expseg-replay [options] [FILE...]\n"
          "Replays allocation histories (memtrace v1, RMM CSV, PyTorch snapshot pickles)\n"
          "through a fresh expseg allocator each and reports what it held.\n"
          "  --driver SPEC         driver spec (default sim:capacity=max(80G, 2 x peak))\n"
          "  --conf TEXT           allocator options, PYTORCH_CUDA_ALLOC_CONF grammar\n"
          "                        (default: the environment)\n"
          "  --device N            device ordinal for the allocator (default 0)\n"
          "  --synth NAME[:SEED[:SCALE]]  add a synthetic history: train, infer, streams8\n"
          "  --check               check the allocator's invariants after every event\n"
          "  --json                one JSON object per history per line\n"
          "  --sweep               replay under every setting of the sweep table, best first\n"
          "  --timeline FILE.csv   write trace,event,live_requested,reserved samples\n"
          "  --timeline-every N    sample every N events (default: events / 2000)\n"
          "  --limit N             replay only the first N events of each history\n"
          "  --quiet               no progress lines on stderr\n"
          "Exit status: 0 ok, 1 check violation or allocator error, 2 bad arguments/input.\n"
          "See docs/replay.md.\n");
}

/* NAME[:SEED[:SCALE]] */
static int parse_synth(const char *spec, char *name, size_t len, uint64_t *seed,
                       double *scale) {
  const char *c1 = strchr(spec, ':');
  size_t nl = c1 ? (size_t)(c1 - spec) : strlen(spec);
  if (nl == 0 || nl >= len) return -1;
  memcpy(name, spec, nl);
  name[nl] = 0;
  *seed = 1;
  *scale = 1.0;
  if (!c1) return 0;
  char buf[64];
  const char *c2 = strchr(c1 + 1, ':');
  size_t sl = c2 ? (size_t)(c2 - c1 - 1) : strlen(c1 + 1);
  if (sl == 0 || sl >= sizeof buf) return -1;
  memcpy(buf, c1 + 1, sl);
  buf[sl] = 0;
  if (_expseg_arg_u64(buf, seed)) return -1;
  if (!c2) return 0;
  char *end;
  *scale = strtod(c2 + 1, &end);
  if (end == c2 + 1 || *end) return -1;
  return 0;
}

typedef struct histories_s {
  expseg_trace_set_t *sets; size_t n_sets;   /* from files */
  expseg_trace_t *synth; size_t n_synth;     /* generated */
} histories_t;

static void histories_free(histories_t *h) {
  for (size_t i = 0; i < h->n_sets; i++) expseg_trace_set_free(&h->sets[i]);
  for (size_t i = 0; i < h->n_synth; i++) expseg_trace_free(&h->synth[i]);
  free(h->sets);
  free(h->synth);
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int bad(FILE *err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(err, "expseg-replay: ");
  vfprintf(err, fmt, ap);
  fprintf(err, " (--help for usage)\n");
  va_end(ap);
  return 2;
}

int expseg_replay_main(int argc, char **argv, FILE *out, FILE *err) {
  opts_t o;
  memset(&o, 0, sizeof o);
  const char **files = calloc((size_t)argc + 1, sizeof *files);
  const char **synths = calloc((size_t)argc + 1, sizeof *synths);
  size_t n_files = 0, n_synths = 0;
  int rc = 0;
  histories_t h;
  memset(&h, 0, sizeof h);
  FILE *timeline = NULL;
  if (!files || !synths) {
    rc = 1;
    goto done;
  }
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i], *val = NULL;
    char key[32];
    const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
    if (eq && (size_t)(eq - arg) < sizeof key) {
      memcpy(key, arg, (size_t)(eq - arg));
      key[eq - arg] = 0;
      val = eq + 1;
      arg = key;
    }
    const int takes = !strcmp(arg, "--driver") || !strcmp(arg, "--conf") ||
                      !strcmp(arg, "--device") || !strcmp(arg, "--synth") ||
                      !strcmp(arg, "--timeline") || !strcmp(arg, "--timeline-every") ||
                      !strcmp(arg, "--limit") || !strcmp(arg, "--model");
    if (takes && !val) {
      if (i + 1 >= argc) {
        rc = bad(err, "option %s needs a value", arg);
        goto done;
      }
      val = argv[++i];
    } else if (!takes && val) {
      rc = bad(err, "option %s takes no value (got '%s')", arg, val);
      goto done;
    }
    uint64_t v;
    if (!strcmp(arg, "--driver")) o.driver = val;
    else if (!strcmp(arg, "--conf")) o.conf = val;
    else if (!strcmp(arg, "--model")) {
      if (_expseg_model_parse(val, &o.model)) {
        rc = bad(err, "--model '%s' is not a model: accepted are expseg and pytorch", val);
        goto done;
      }
    }
    else if (!strcmp(arg, "--device")) {
      if (_expseg_arg_u64(val, &v) || v > 1024) {
        rc = bad(err, "--device '%s' is not a device ordinal (0 .. 1024)", val);
        goto done;
      }
      o.device = (int)v;
    } else if (!strcmp(arg, "--synth")) synths[n_synths++] = val;
    else if (!strcmp(arg, "--timeline")) o.timeline = val;
    else if (!strcmp(arg, "--timeline-every")) {
      if (_expseg_arg_u64(val, &v) || v == 0) {
        rc = bad(err, "--timeline-every '%s' is not a positive integer", val);
        goto done;
      }
      o.timeline_every = v;
    } else if (!strcmp(arg, "--limit")) {
      if (_expseg_arg_u64(val, &v) || v == 0) {
        rc = bad(err, "--limit '%s' is not a positive integer", val);
        goto done;
      }
      o.limit = v;
    } else if (!strcmp(arg, "--check")) o.check = 1;
    else if (!strcmp(arg, "--json")) o.json = 1;
    else if (!strcmp(arg, "--sweep")) o.sweep = 1;
    else if (!strcmp(arg, "--quiet")) o.quiet = 1;
    else if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
      usage(out);
      goto done;
    } else if (arg[0] == '-' && arg[1] != 0) {
      rc = bad(err, "unknown option '%s'", arg);
      goto done;
    } else files[n_files++] = arg;
  }
  if (n_files == 0 && n_synths == 0) {
    rc = bad(err, "nothing to replay: give trace files and/or --synth NAME");
    goto done;
  }
  if (o.sweep && o.timeline) {
    rc = bad(err, "--timeline and --sweep cannot be combined");
    goto done;
  }

  h.sets = calloc(n_files ? n_files : 1, sizeof *h.sets);
  h.synth = calloc(n_synths ? n_synths : 1, sizeof *h.synth);
  if (!h.sets || !h.synth) {
    rc = 1;
    goto done;
  }
  for (size_t i = 0; i < n_files; i++) {
    if (expseg_trace_read_file(files[i], &h.sets[h.n_sets]) != EXPSEG_OK) {
      fprintf(err, "expseg-replay: %s\n", expseg_last_error());
      rc = 2;
      goto done;
    }
    h.n_sets++;
  }
  for (size_t i = 0; i < n_synths; i++) {
    char name[64];
    uint64_t seed;
    double scale;
    if (parse_synth(synths[i], name, sizeof name, &seed, &scale)) {
      rc = bad(err, "--synth '%s' is not NAME[:SEED[:SCALE]] (e.g. train:1:0.5)", synths[i]);
      goto done;
    }
    if (expseg_trace_synth(name, seed, scale, &h.synth[h.n_synth]) != EXPSEG_OK) {
      fprintf(err, "expseg-replay: --synth %s: %s\n", synths[i], expseg_last_error());
      rc = 2;
      goto done;
    }
    h.n_synth++;
  }
  if (o.timeline) {
    timeline = fopen(o.timeline, "w");
    if (!timeline) {
      fprintf(err, "expseg-replay: cannot write --timeline '%s': %s\n", o.timeline,
              strerror(errno));
      rc = 2;
      goto done;
    }
    fprintf(timeline, "trace,event,live_requested,reserved\n");
  }

  int header = 0;
  for (size_t i = 0; i < h.n_sets + h.n_synth && rc == 0; i++) {
    size_t count = i < h.n_sets ? h.sets[i].n : 1;
    for (size_t j = 0; j < count && rc == 0; j++) {
      const expseg_trace_t *t = i < h.n_sets ? &h.sets[i].traces[j] : &h.synth[i - h.n_sets];
      if (o.sweep) {
        rc = sweep_one(t, &o, out, err);
        continue;
      }
      result_t r;
      rc = replay_one(t, &o, o.model, o.conf, timeline, err, &r);
      if (rc == 2) break;
      if (o.json) {
        print_json(out, t, &r, NULL, 0);
      } else {
        if (!header) {
          fprintf(out, "# driver %s; config %s\n", o.driver ? o.driver : "sim (sized per trace)",
                  r.config);
          print_table_head(out);
          header = 1;
        }
        print_table_row(out, t, &r);
      }
      fflush(out);
    }
  }

done:
  if (timeline && fclose(timeline) != 0 && rc == 0) {
    fprintf(err, "expseg-replay: writing --timeline '%s' failed\n", o.timeline);
    rc = 1;
  }
  histories_free(&h);
  free(files);
  free(synths);
  return rc;
}
