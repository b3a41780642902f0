/* SPDX-License-Identifier: Apache-2.0 */
/* synth_replay.c: one replay of one history through a fresh allocator (_expseg_replay_cap), the
 * core of the replay tool; its command line (expseg_replay_main) is synth_cli.c. (The file
 * name starts with "synth" so that the expseg_traces library's glob picks it up.)
 *
 * A history (expseg_trace_t) is replayed through a fresh allocator: 'p' and 'a' become
 * expseg_malloc on the event's stream (on cuda a stream the driver created per trace
 * stream; on host and sim the index itself; 0 = the default stream), 'f' becomes expseg_free, 'r' does nothing (the memory stays live until
 * the matching 'f': the trace already says when the other stream's work completed), 'E'
 * becomes expseg_empty_cache, and the recorded allocator's own events (M X m u O) are
 * only counted for the baseline. A failed malloc counts as an OOM and leaves the id
 * unallocated, so its later free is skipped. Only the event loop is timed.
 *
 * --model pytorch starts from the recorded allocator state and PyTorch's defaults
 * (synth_model.c); driver calls are priced (synth_cost.c); --sweep and the output are in
 * synth_sweep.c; --fit is synth_fit.c. Usage and output fields: docs/replay.md. */
#include "trace.h"
#include "trace_internal.h"
#include "synth_replay.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *const _expseg_mem_calls[N_MEM_CALLS] = {"reserve", "unreserve", "create", "release",
                                                    "map", "unmap", "set_access"};

static int64_t stat_or(const expseg_allocator *a, const char *key, int64_t dflt, int *found) {
  int64_t v = 0;
  if (expseg_stat(a, key, &v) == EXPSEG_OK) {
    if (found) *found = 1;
    return v;
  }
  if (found) *found = 0;
  return dflt;
}
/* ------------------------------------------------------------------------------------ */
/* One replay                                                                            */

/* The counters at the start of the recorded window (after the pre-live set). */
static const char *const pool_keys[4] = {
    "reserved_bytes.small_pool.allocated", "reserved_bytes.small_pool.freed",
    "reserved_bytes.large_pool.allocated", "reserved_bytes.large_pool.freed"};

static void window_snap(const expseg_allocator *a, result_t *r) {
  for (int k = 0; k < 4; k++) r->warm_pool_bytes[k] = stat_or(a, pool_keys[k], 0, NULL);
  r->warm_alloc = stat_or(a, "num_device_alloc", 0, NULL);
  r->warm_free = stat_or(a, "num_device_free", 0, NULL);
  r->warm_created = stat_or(a, "expseg.created_bytes", 0, NULL);
  r->warm_released = stat_or(a, "expseg.released_bytes", 0, NULL);
  for (size_t k = 0; k < N_MEM_CALLS; k++) {
    char key[64];
    snprintf(key, sizeof key, "expseg.driver.%s", _expseg_mem_calls[k]);
    r->warm_calls[k] = stat_or(a, key, 0, NULL);
  }
}

/* The window's driver calls by kind: PyTorch's classic segments are cudaMalloc/cudaFree
 * (one per device allocation/free); otherwise the VMM calls the allocator made (under the
 * pytorch model, PyTorch's own: pools/model.c). The units each is priced per are the same
 * for every model (docs/replay.md, "Priced driver work"): physical memory created and
 * released in 2 MiB pages of its bytes (cudaMalloc and cudaFree too); a reserve per call
 * only; map, unmap and set_access per handle, since their
 * measured cost follows handles, not bytes (a map or an unmap is of one handle, and a
 * set_access covers the handles of the range it opens, one per map). */
static void window_calls(const expseg_trace_t *t, const opts_t *o, result_t *r, size_t n) {
  static const int kind_of[N_MEM_CALLS] = {EXPSEG_COST_RESERVE, -1, EXPSEG_COST_CREATE,
                                           EXPSEG_COST_RELEASE, EXPSEG_COST_MAP,
                                           EXPSEG_COST_UNMAP, EXPSEG_COST_SET_ACCESS};
  expseg_calls_t *w = &r->win;
  memset(w, 0, sizeof *w);
  const uint64_t two = UINT64_C(2) << 20;
  if (r->model == EXPSEG_MODEL_PYTORCH && _expseg_conf_expandable(r->config) != 1) {
    w->calls[EXPSEG_COST_CUDA_MALLOC] = (uint64_t)(r->num_device_alloc - r->warm_alloc);
    w->calls[EXPSEG_COST_CUDA_FREE] = (uint64_t)(r->num_device_free - r->warm_free);
    w->pages[EXPSEG_COST_CUDA_MALLOC] = (uint64_t)(r->created_bytes - r->warm_created) / two;
    w->pages[EXPSEG_COST_CUDA_FREE] = (uint64_t)(r->released_bytes - r->warm_released) / two;
  } else {
    for (size_t k = 0; k < N_MEM_CALLS; k++)
      if (kind_of[k] >= 0) w->calls[kind_of[k]] = (uint64_t)(r->calls[k] - r->warm_calls[k]);
    if (r->model == EXPSEG_MODEL_PYTORCH) {
      /* every chunk is created with its map and released with its unmap: the pools' bytes */
      uint64_t d[4];
      for (int k = 0; k < 4; k++) d[k] = (uint64_t)(r->pool_bytes[k] - r->warm_pool_bytes[k]);
      w->pages[EXPSEG_COST_CREATE] = (d[0] + d[2]) / two;
      w->pages[EXPSEG_COST_RELEASE] = (d[1] + d[3]) / two;
    } else {
      w->pages[EXPSEG_COST_CREATE] = (uint64_t)(r->created_bytes - r->warm_created) / two;
      w->pages[EXPSEG_COST_RELEASE] = (uint64_t)(r->released_bytes - r->warm_released) / two;
    }
    w->pages[EXPSEG_COST_MAP] = w->calls[EXPSEG_COST_MAP];
    w->pages[EXPSEG_COST_UNMAP] = w->calls[EXPSEG_COST_UNMAP];
    w->pages[EXPSEG_COST_SET_ACCESS] = w->calls[EXPSEG_COST_MAP];
  }
  r->driver_ms = _expseg_costs_ms(&o->costs, w);
  _expseg_recorded_calls(t, n, &r->rec);
  r->rec_ms = _expseg_costs_ms(&o->costs, &r->rec);
}

/* The trace's streams as the driver's: on cuda each index but 0 (the default stream) gets a
 * stream the driver creates; host and sim take any value, so the index itself (*out NULL).
 * 0 on success, else 2 with the reason on err. */
static int make_streams(expseg_allocator *a, const expseg_trace_t *t, expseg_stream **out,
                        FILE *err) {
  *out = NULL;
  if (t->n_streams <= 1) return 0;
  expseg_stream first = 0;
  expseg_status st = expseg_stream_create(a, &first);
  if (st == EXPSEG_ERR_UNSUPPORTED) return 0;
  expseg_stream *h = calloc(t->n_streams, sizeof *h);
  if (st != EXPSEG_OK || !h) {
    fprintf(err, "expseg-replay: %s: cannot create the trace's %" PRIu32 " streams: %s\n",
            t->name, t->n_streams, h ? expseg_last_error() : "out of host memory");
    if (st == EXPSEG_OK) (void)expseg_stream_destroy(a, first);
    free(h);
    return 2;
  }
  h[1] = first;
  for (uint32_t i = 2; i < t->n_streams; i++) {
    if (expseg_stream_create(a, &h[i]) != EXPSEG_OK) {
      fprintf(err, "expseg-replay: %s: cannot create stream %" PRIu32 " of %" PRIu32 ": %s\n",
              t->name, i, t->n_streams, expseg_last_error());
      for (uint32_t j = 1; j < i; j++) (void)expseg_stream_destroy(a, h[j]);
      free(h);
      return 2;
    }
  }
  *out = h;
  return 0;
}

/* Destroys the allocator and, before it, the streams made for the trace. */
static void close_allocator(expseg_allocator *a, const expseg_trace_t *t, expseg_stream *sh) {
  for (uint32_t i = 1; sh && i < t->n_streams; i++) (void)expseg_stream_destroy(a, sh[i]);
  free(sh);
  expseg_destroy(a);
}

/* Whether the recorded start state can be rebuilt at all: on a sim device large enough for
 * it (top down, as a pytorch row's default), so that a device too small for it counts as an
 * OOM only when a device without a limit would have started warm; a layout the allocator
 * cannot rebuild replays from an empty cache whatever the capacity (--fit and --capacity
 * then agree with the unconstrained row). 1 yes, 0 no (why: the reason), -1 the probe could
 * not run. */
static int warm_start_rebuilds(const expseg_trace_t *t, const opts_t *o, const char *conf,
                               char *why, size_t wlen) {
  uint64_t total = 0;
  for (size_t i = 0; i < t->n_start_segs; i++) total += t->start_segs[i].size;
  uint64_t gib = (2 * total + GIB - 1) / GIB;
  char spec[64];
  snprintf(spec, sizeof spec, "sim:capacity=%" PRIu64 "G,top_down=1", gib < 80 ? 80 : gib);
  expseg_allocator *a = NULL;
  expseg_stream *sh = NULL;
  void **ptr = calloc(t->n_ids ? t->n_ids : 1, sizeof *ptr);
  int rc = -1;
  if (ptr && expseg_create(spec, o->device, conf, &a) == EXPSEG_OK &&
      _expseg_model_apply(a, EXPSEG_MODEL_PYTORCH) == EXPSEG_OK &&
      make_streams(a, t, &sh, stderr) == 0)
    rc = _expseg_model_warm_start(a, t, sh, ptr, why, wlen) == 0;
  if (a) close_allocator(a, t, sh);
  free(ptr);
  return rc;
}

/* The driver spec: --driver, else $EXPSEG_DRIVER, else sim sized from the trace
 * (max(80G, 2 x peak live requested)); capacity (--capacity or --fit) is added to it. */
static void driver_spec(const expseg_trace_t *t, const opts_t *o, const char *capacity,
                        char *buf, size_t len) {
  const char *base = o->driver;
  if (!base && getenv("EXPSEG_DRIVER") && *getenv("EXPSEG_DRIVER"))
    base = getenv("EXPSEG_DRIVER");
  if (!capacity) capacity = o->capacity;
  /* the capacity is the backend's: in "fault:RULES;INNER" the inner spec's (docs/driver.md) */
  const char *inner = base;
  if (base && strncmp(base, "fault:", 6) == 0 && strrchr(base, ';'))
    inner = strrchr(base, ';') + 1;
  const char *had = inner && capacity ? strstr(inner, "capacity=") : NULL;
  if (had) { /* --capacity replaces the spec's own capacity */
    const char *rest = had + strlen("capacity=");
    rest += strcspn(rest, ",;");
    snprintf(buf, len, "%.*scapacity=%s%s", (int)(had - base), base, capacity, rest);
  } else if (base && capacity)
    snprintf(buf, len, "%s%scapacity=%s", base, strchr(inner, ':') ? "," : ":", capacity);
  else if (base) snprintf(buf, len, "%s", base);
  else if (capacity) snprintf(buf, len, "sim:capacity=%s", capacity);
  else {
    uint64_t gib = (2 * t->peak_live_requested + GIB - 1) / GIB;
    if (gib < 80) gib = 80;
    snprintf(buf, len, "sim:capacity=%" PRIu64 "G", gib);
  }
}

/* Returns 0 on success, 1 when --check found a violation or the allocator failed in a way
 * that is not an OOM, 2 when the allocator could not be created (bad --driver/--conf). */
int _expseg_replay_cap(const expseg_trace_t *t, const opts_t *o, int model,
                       const char *user_conf, const char *capacity, FILE *timeline, FILE *err,
                       result_t *r, const capture_t *cap) {
  memset(r, 0, sizeof *r);
  r->peak_event = -1;
  r->model = model;
  r->first_oom = -1;
  r->first_oom_msg[0] = '\0';
  _expseg_window_baseline(t, o->limit ? (size_t)o->limit : t->n_events, &r->base);
  driver_spec(t, o, capacity, r->driver, sizeof r->driver);
  /* PyTorch's model: cudaMalloc's addresses descend, which decides between equal free
   * segments (best fit breaks ties by address): the sim hands out addresses top down */
  if (model == EXPSEG_MODEL_PYTORCH && strncmp(r->driver, "sim", 3) == 0 &&
      (r->driver[3] == 0 || r->driver[3] == ':') && !strstr(r->driver, "top_down=")) {
    size_t n = strlen(r->driver);
    snprintf(r->driver + n, sizeof r->driver - n, "%stop_down=1", r->driver[3] ? "," : ":");
  }
  char confbuf[1024];
  const char *conf = _expseg_model_conf(model, user_conf, t, confbuf, sizeof confbuf);

  expseg_allocator *a = NULL;
  expseg_stream *sh = NULL; /* the trace's streams as the driver's (make_streams) */
  /* The recorded start state was made under the recorded setting: rebuild it under that
   * one, then switch to the row's (only the keys it gives change, docs/replay.md). */
  const int warm = model == EXPSEG_MODEL_PYTORCH && t->n_start_segs > 0 &&
                   _expseg_conf_expandable(conf) != 1;
  char recbuf[1024];
  const char *first = warm ? _expseg_model_conf(model, NULL, t, recbuf, sizeof recbuf) : conf;
  expseg_status s = expseg_create(r->driver, o->device, first, &a);
  if (s != EXPSEG_OK) {
    fprintf(err, "expseg-replay: cannot create the allocator (driver '%s', config '%s'): %s\n",
            r->driver, first ? first : "(environment)", expseg_last_error());
    return 2;
  }
  expseg_info info;
  if (expseg_get_info(a, &info) == EXPSEG_OK) r->capacity = info.total_memory;
  if (_expseg_model_apply(a, model) != EXPSEG_OK) {
    fprintf(err, "expseg-replay: %s\n", expseg_last_error());
    expseg_destroy(a);
    return 2;
  }
  if (make_streams(a, t, &sh, err)) {
    expseg_destroy(a);
    return 2;
  }
  void **ptr = calloc(t->n_ids ? t->n_ids : 1, sizeof *ptr);
  uint8_t *failed = calloc(t->n_ids ? t->n_ids : 1, 1); /* ids whose malloc failed */
  if (!ptr || !failed) {
    free(failed);
    free(ptr);
    close_allocator(a, t, sh);
    fprintf(err, "expseg-replay: out of host memory for %" PRIu64 " ids of %s\n", t->n_ids,
            t->name);
    return 1;
  }
  if (warm) {
    char why[256] = "";
    if (_expseg_model_warm_start(a, t, sh, ptr, why, sizeof why)) {
      /* on a device too small for the recorded start state, that is the first OOM */
      const int is_oom = strstr(why, "out of memory") != NULL &&
                         warm_start_rebuilds(t, o, first, why, sizeof why) != 0;
      if (!is_oom) {
        /* a layout PyTorch's rules do not produce (another PyTorch version, an edited
         * file): said on stderr once per history (not on every row of a sweep or run of
         * --fit), flagged warm_start:false, replayed from an empty cache */
        if (!o->warned || *o->warned != t)
          fprintf(err, "expseg-replay: %s: cannot rebuild the recorded start state (%s); "
                       "replaying from an empty cache\n", t->name, why);
        if (o->warned) *o->warned = t;
        close_allocator(a, t, sh);
        a = NULL;
        sh = NULL;
        memset(ptr, 0, (t->n_ids ? t->n_ids : 1) * sizeof *ptr);
        if (expseg_create(r->driver, o->device, conf, &a) != EXPSEG_OK ||
            _expseg_model_apply(a, model) != EXPSEG_OK || make_streams(a, t, &sh, err)) {
          fprintf(err, "expseg-replay: cannot create the allocator (driver '%s', config "
                       "'%s'): %s\n", r->driver, conf, expseg_last_error());
          if (a) expseg_destroy(a);
          free(failed);
          free(ptr);
          return 2;
        }
        first = conf;
      } else {
        if (!o->quiet)
          fprintf(err, "expseg-replay: %s: cannot rebuild the recorded start state: %s\n",
                  t->name, why);
        expseg_config_string(a, r->config, sizeof r->config);
        free(failed);
        free(ptr);
        close_allocator(a, t, sh);
        r->num_ooms = 1;
        r->first_oom = -2;
        return 0;
      }
    } else {
      r->warm_started = 1;
    }
    if (first != conf && strcmp(first, conf) && expseg_configure(a, conf) != EXPSEG_OK) {
      fprintf(err, "expseg-replay: cannot switch to config '%s': %s\n", conf,
              expseg_last_error());
      free(failed);
      free(ptr);
      close_allocator(a, t, sh);
      return 2;
    }
  }
  expseg_config_string(a, r->config, sizeof r->config);
  if (cap && cap->snapshot && expseg_record_history_ex(a, true, SIZE_MAX, 0) != EXPSEG_OK) {
    fprintf(err, "expseg-replay: recording the history: %s\n", expseg_last_error());
    free(failed);
    free(ptr);
    close_allocator(a, t, sh);
    return 1;
  }
  int64_t peak_reserved = -1;
  timeline_t tl;
  memset(&tl, 0, sizeof tl);
  uint64_t every = o->timeline_every;
  if (!every) every = t->n_events / 2000 ? t->n_events / 2000 : 1;

  int rc = 0, progress = 0;
  uint64_t live = 0, peak = 0, events = 0, ops = 0, ooms = 0, errors = 0;
  const expseg_trace_event_t *ev = t->events;
  const size_t n = o->limit && o->limit < t->n_events ? (size_t)o->limit : t->n_events;
  _expseg_window_baseline(t, n, &r->base);
  const uint64_t t0 = _expseg_bench_now_ns();
  /* progress: rewritten in place (\r) on a terminal; elsewhere a line after 1 s, then every 10 s */
  const int tty = err && isatty(fileno(err));
  uint64_t last_line = 0;
  for (size_t i = 0; i < n; i++) {
    const expseg_trace_event_t *e = &ev[i];
    if (i > 0 && e->kind != EXPSEG_TR_PRELIVE && ev[i - 1].kind == EXPSEG_TR_PRELIVE) {
      /* the recorded window starts here: what came before rebuilt its starting state */
      window_snap(a, r);
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
      expseg_frame fr[32]; /* where the recorded program made it: into the replay's history */
      size_t nf = cap && cap->snapshot ? expseg_trace_frames_of(t, e->id, fr, 32) : 0;
      if (nf && expseg_history_push_frames(fr, nf) != EXPSEG_OK) nf = 0;
      s = expseg_malloc(a, (size_t)e->size, sh ? sh[e->stream] : e->stream, &p);
      expseg_history_pop_frames(nf);
      if (s == EXPSEG_OK || s == EXPSEG_ERR_OUT_OF_MEMORY) {
        /* a failed request still counts in peak requested: the program asked for it */
        live += e->size;
        if (live > peak) peak = live;
      }
      if (s == EXPSEG_OK) {
        ptr[e->id] = p;
      } else if (s == EXPSEG_ERR_OUT_OF_MEMORY) {
        if (!ooms++) {
          r->first_oom = (int64_t)i;
          snprintf(r->first_oom_msg, sizeof r->first_oom_msg, "%s", expseg_last_error());
        }
        failed[e->id] = 1;
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
      } else if (e->id < t->n_ids && failed[e->id]) {
        failed[e->id] = 0;
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
    if (cap && cap->at == -1) { /* first pass: where reserved memory peaks */
      int64_t resv = stat_or(a, "reserved_bytes.all.current", -1, NULL);
      if (resv > peak_reserved) {
        peak_reserved = resv;
        r->peak_event = (int64_t)i;
      }
    }
    if (cap && cap->at == (int64_t)i && _expseg_replay_capture(a, t->name, cap, i, 0, err))
      rc = 1;
    if (timeline) _expseg_timeline_step(&tl, timeline, t->name, a, i, live,
                                        events % every == 0 || i + 1 == n);
    if ((i & 8191) == 8191 && err && !o->quiet) {
      uint64_t el = _expseg_bench_now_ns() - t0;
      if (el > 1000000000ull && (tty || !last_line || el - last_line >= 10000000000ull)) {
        progress = tty;
        last_line = el;
        fprintf(err, "%s%s: %zu / %zu events (%.0f%%), %.1f s%s", tty ? "\r" : "", t->name,
                i + 1, n, 100.0 * (double)(i + 1) / (double)n, (double)el / 1e9, tty ? "" : "\n");
        fflush(err);
      }
    }
  }
  r->loop_ns = _expseg_bench_now_ns() - t0;
  if (timeline) _expseg_timeline_flush(&tl, timeline, t->name);
  if (progress) fprintf(err, "\n");
  if (cap && cap->at_end && _expseg_replay_capture(a, t->name, cap, n ? n - 1 : 0, 1, err))
    rc = 1;

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
  r->released_bytes = stat_or(a, "expseg.released_bytes", 0, NULL);
  for (int k = 0; k < 4; k++) r->pool_bytes[k] = stat_or(a, pool_keys[k], 0, NULL);
  for (size_t k = 0; k < N_MEM_CALLS; k++) {
    char key[64];
    int found = 0;
    snprintf(key, sizeof key, "expseg.driver.%s", _expseg_mem_calls[k]);
    r->calls[k] = stat_or(a, key, 0, &found);
    if (found) {
      r->has_calls = 1;
      r->driver_calls += (uint64_t)r->calls[k];
    }
  }
  window_calls(t, o, r, n);
  free(failed);
  free(ptr);
  close_allocator(a, t, sh);
  if (errors && !rc) rc = 1;
  return rc;
}
