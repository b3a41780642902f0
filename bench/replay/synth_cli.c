/* SPDX-License-Identifier: Apache-2.0 */
/* synth_cli.c: the replay tool's command line (expseg_replay_main): reads the options and the
 * histories (files and --synth), then replays each one (synth_replay.c), sweeps the settings
 * (synth_sweep.c), fits the capacity (synth_fit.c) or writes the HTML report (report.c).
 * bench/replay/replay.c is a two-line main around it so that tests/test_replay.cpp can call it
 * in-process. (The file name starts with "synth" so that the expseg_traces library's glob
 * picks it up.) Usage: docs/replay.md. */
#include "trace.h"
#include "trace_internal.h"
#include "synth_replay.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

int expseg_replay_main(int argc, char **argv, FILE *out, FILE *err);

static void usage(FILE *f) {
  fprintf(f,
          "usage: expseg-replay [options] [FILE...]\n"
          "Replays allocation histories (memtrace v1, RMM CSV, PyTorch snapshot pickles)\n"
          "through a fresh expseg allocator each and reports what it held.\n"
          "  --driver SPEC         driver spec (default sim:capacity=max(80G, 2 x peak))\n"
          "  --conf TEXT           allocator options, PYTORCH_CUDA_ALLOC_CONF grammar\n"
          "                        (default: the environment)\n"
          "  --device N            device ordinal for the allocator (default 0)\n"
          "  --synth NAME[:SEED[:SCALE]]  add a synthetic history: train, infer, streams8,\n"
          "                        generate\n"
          "  --check               check the allocator's invariants after every event\n"
          "  --json                one JSON object per history per line\n"
          "  --sweep               replay under every setting of the sweep table, best first\n"
          "  --timeline FILE.csv   write samples: trace, event, live requested, reserved,\n"
          "                        allocated, cached bytes and the running peaks\n"
          "  --timeline-every N    sample every N events (default: events / 2000)\n"
          "  --limit N             replay only the first N events of each history\n"
          "  --snapshot OUT.pickle write a memory_viz snapshot (history recorded from the\n"
          "                        start) at the peak of reserved memory (one history only)\n"
          "  --snapshot-at peak|end  when to take it (default peak)\n"
          "  --report              print the memory summary at the peak of reserved memory\n"
          "  --report FILE.html    write the sweep as one self-contained HTML page: memory\n"
          "                        over time per setting, the segments at the peak, the\n"
          "                        table and the answer (implies --sweep; one history)\n"
          "  --quiet               no progress lines on stderr\n"
          "  --model M             expseg (default) or pytorch (PyTorch's allocator: its\n"
          "                        defaults, the recorded setting and start state)\n"
          "  --capacity SIZE       device memory (e.g. 24G), added to the driver spec\n"
          "  --fit                 per model, the smallest capacity that runs without OOM\n"
          "  --allow-oom           a failed request does not make the exit status 1\n"
          "  --costs FILE          per-call driver costs (KIND[.page] MICROSECONDS lines)\n"
          "Exit status: 0 ok, 1 check violation, allocator error or OOM, 2 bad arguments/input.\n"
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

/* --report takes a value only when it names an HTML file (else it is the memory summary) */
static int is_html(const char *s) {
  size_t n = strlen(s);
  return (n > 5 && !strcasecmp(s + n - 5, ".html")) || (n > 4 && !strcasecmp(s + n - 4, ".htm"));
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

/* --snapshot's file is written only after the replay (at its peak or end): a name that cannot
 * be written is refused now, as --timeline and --report FILE.html are, instead of after a
 * replay that may take minutes. A probe file next to it (the name the dump's temporary file
 * takes) is created and removed. 0 when writable, else 2 with one line said. */
static int snapshot_writable(FILE *err, const char *path) {
  struct stat st;
  if (!*path) return bad(err, "--snapshot '' needs a file name (OUT.pickle)");
  if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
    return bad(err, "--snapshot '%s' is a directory; accepted: a file name (OUT.pickle)", path);
  char probe[4096];
  if (snprintf(probe, sizeof probe, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof probe)
    return bad(err, "--snapshot '%.64s...' is too long a file name", path);
  const int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0 && errno != EEXIST) {
    fprintf(err, "expseg-replay: cannot write --snapshot '%s': %s\n", path, strerror(errno));
    return 2;
  }
  if (fd >= 0) {
    close(fd);
    unlink(probe);
  }
  return 0;
}

int expseg_replay_main(int argc, char **argv, FILE *out, FILE *err) {
  opts_t o;
  memset(&o, 0, sizeof o);
  const void *warned = NULL;
  o.warned = &warned;
  _expseg_costs_default(&o.costs);
  const char **files = calloc((size_t)argc + 1, sizeof *files);
  const char **synths = calloc((size_t)argc + 1, sizeof *synths);
  size_t n_files = 0, n_synths = 0;
  int rc = 0;
  histories_t h;
  memset(&h, 0, sizeof h);
  FILE *timeline = NULL;
  const char *html = NULL; /* --report FILE.html */
  const char *every = NULL, *at = NULL; /* --timeline-every, --snapshot-at: need their file */
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
                      !strcmp(arg, "--limit") || !strcmp(arg, "--model") ||
                      !strcmp(arg, "--capacity") || !strcmp(arg, "--costs") ||
                      !strcmp(arg, "--snapshot") || !strcmp(arg, "--snapshot-at");
    if (takes && !val) {
      if (i + 1 >= argc) {
        rc = bad(err, "option %s needs a value", arg);
        goto done;
      }
      val = argv[++i];
    } else if (!strcmp(arg, "--report")) { /* a value only when it names an .html file */
      if (!val && i + 1 < argc && is_html(argv[i + 1])) val = argv[++i];
      if (val && !*val) {
        rc = bad(err, "--report= needs a file name (FILE.html)");
        goto done;
      }
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
      every = val;
    } else if (!strcmp(arg, "--limit")) {
      if (_expseg_arg_u64(val, &v) || v == 0) {
        rc = bad(err, "--limit '%s' is not a positive integer", val);
        goto done;
      }
      o.limit = v;
    } else if (!strcmp(arg, "--snapshot")) o.snapshot = val;
    else if (!strcmp(arg, "--snapshot-at")) {
      if (strcmp(val, "peak") && strcmp(val, "end")) {
        rc = bad(err, "--snapshot-at '%s': expected peak or end", val);
        goto done;
      }
      o.snapshot_end = !strcmp(val, "end");
      at = val;
    } else if (!strcmp(arg, "--report")) {
      if (val) html = val;
      else o.report = 1;
    }
    else if (!strcmp(arg, "--check")) o.check = 1;
    else if (!strcmp(arg, "--json")) o.json = 1;
    else if (!strcmp(arg, "--sweep")) o.sweep = 1;
    else if (!strcmp(arg, "--quiet")) o.quiet = 1;
    else if (!strcmp(arg, "--allow-oom")) o.allow_oom = 1;
    else if (!strcmp(arg, "--fit")) o.fit = 1;
    else if (!strcmp(arg, "--capacity")) {
      /* one SIZE, added to the driver spec: no separator may reach the spec */
      const size_t n = strlen(val);
      size_t k = 0;
      while (k < n && ((val[k] >= '0' && val[k] <= '9') || (val[k] >= 'A' && val[k] <= 'Z') ||
                       (val[k] >= 'a' && val[k] <= 'z')))
        k++;
      if (n == 0 || k != n) {
        rc = bad(err, "--capacity '%s' is not a SIZE: an integer with an optional K, M, G or T "
                      "suffix (e.g. 24G, 512M)", val);
        goto done;
      }
      o.capacity = val;
    }
    else if (!strcmp(arg, "--costs")) {
      if (_expseg_costs_read(val, &o.costs) != EXPSEG_OK) {
        fprintf(err, "expseg-replay: %s\n", expseg_trace_last_error());
        rc = 2;
        goto done;
      }
    }
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
  if (html && (o.snapshot || o.report || o.fit || o.timeline)) {
    rc = bad(err, "--report %s (a sweep) cannot be combined with --snapshot, --report, --fit "
                  "or --timeline", html);
    goto done;
  }
  if (html) o.sweep = 1;
  if ((o.snapshot || o.report) && (o.sweep || o.fit)) {
    rc = bad(err, "--snapshot and --report cannot be combined with --sweep or --fit");
    goto done;
  }
  if (every && !o.timeline) {
    rc = bad(err, "--timeline-every %s needs --timeline FILE.csv (the file it samples into)",
             every);
    goto done;
  }
  if (at && !o.snapshot) {
    rc = bad(err, "--snapshot-at %s needs --snapshot OUT.pickle (the snapshot it times)", at);
    goto done;
  }
  if (o.snapshot && (rc = snapshot_writable(err, o.snapshot)) != 0) goto done;
  if (o.sweep && o.timeline) {
    rc = bad(err, "--timeline and --sweep cannot be combined");
    goto done;
  }
  if (o.fit && (o.capacity || o.timeline)) { /* each was left unused, silently */
    rc = bad(err, "--fit cannot be combined with %s: it searches the capacity itself and "
                  "writes no samples", o.capacity ? "--capacity" : "--timeline");
    goto done;
  }
  if (o.sweep && o.fit) { /* --fit searches a capacity per model, the sweep one per row */
    rc = bad(err, "--fit and --sweep cannot be combined: run --fit alone (per model) or "
                  "--sweep with --capacity SIZE");
    goto done;
  }

  h.sets = calloc(n_files ? n_files : 1, sizeof *h.sets);
  h.synth = calloc(n_synths ? n_synths : 1, sizeof *h.synth);
  if (!h.sets || !h.synth) {
    rc = 1;
    goto done;
  }
  size_t n_histories = n_synths;
  for (size_t i = 0; i < n_files; i++) {
    if (expseg_trace_read_file(files[i], &h.sets[h.n_sets]) != EXPSEG_OK) {
      fprintf(err, "expseg-replay: %s\n", expseg_trace_last_error());
      rc = 2;
      goto done;
    }
    n_histories += h.sets[h.n_sets++].n;
  }
  if (html && n_histories != 1) {
    rc = bad(err, "--report %s writes one page: give exactly one history (got %zu)", html,
             n_histories);
    goto done;
  }
  if (o.snapshot && n_histories != 1) {
    rc = bad(err, "--snapshot writes one file: give exactly one history (got %zu)", n_histories);
    goto done;
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
      fprintf(err, "expseg-replay: --synth %s: %s\n", synths[i], expseg_trace_last_error());
      rc = 2;
      goto done;
    }
    h.n_synth++;
  }
  if (html && !(o.html = _expseg_report_new(html, argc, argv, err))) {
    rc = 2;
    goto done;
  }
  if (o.timeline) {
    timeline = fopen(o.timeline, "w");
    if (!timeline) {
      fprintf(err, "expseg-replay: cannot write --timeline '%s': %s\n", o.timeline,
              strerror(errno));
      rc = 2;
      goto done;
    }
    fprintf(timeline, "%s\n", EXPSEG_TIMELINE_HEADER);
  }

  char last_driver[128] = "";
  int oom_rc = 0;
  for (size_t i = 0; i < h.n_sets + h.n_synth && rc == 0; i++) {
    size_t count = i < h.n_sets ? h.sets[i].n : 1;
    for (size_t j = 0; j < count && rc == 0; j++) {
      const expseg_trace_t *t = i < h.n_sets ? &h.sets[i].traces[j] : &h.synth[i - h.n_sets];
      if (o.sweep) {
        rc = _expseg_replay_sweep(t, &o, out, err);
        if (o.html && rc != 2) {
          const int wr = _expseg_report_write(o.html, t, &o, err);
          if (wr && !rc) rc = wr;
        }
        continue;
      }
      if (o.fit) {
        rc = _expseg_replay_fit(t, &o, out, err);
        continue;
      }
      result_t r;
      capture_t cap = {-2, o.snapshot_end, o.snapshot, o.report, out, NULL, NULL};
      if (o.report || (o.snapshot && !o.snapshot_end)) { /* first pass: find the peak */
        capture_t find = {-1, 0, NULL, 0, NULL, NULL, NULL};
        rc = _expseg_replay_cap(t, &o, o.model, o.conf, NULL, NULL, err, &r, &find);
        if (rc == 2) break;
        cap.at = r.peak_event;
      }
      rc = _expseg_replay_cap(t, &o, o.model, o.conf, NULL, timeline, err, &r,
                              o.snapshot || o.report ? &cap : NULL);
      if (rc == 2) break;
      if (r.num_ooms) {
        char where[64];
        if (r.first_oom == -2) snprintf(where, sizeof where, "while rebuilding the recorded "
                                                             "start state");
        else snprintf(where, sizeof where, "at event %" PRId64, r.first_oom);
        fprintf(err, "expseg-replay: %s: %" PRIu64 " request(s) failed for lack of device "
                     "memory (driver %s), the first %s\n",
                t->name, r.num_ooms, r.driver, where);
        if (r.first_oom_msg[0])
          fprintf(err, "expseg-replay: %s: the first: %s\n", t->name, r.first_oom_msg);
        if (!o.allow_oom) oom_rc = 1;
      }
      if (o.json) {
        _expseg_replay_json(out, t, &r, NULL, 0, NULL, 0);
      } else {
        if (strcmp(last_driver, r.driver)) {
          char cb[32], changed[sizeof r.config];
          fprintf(out, "# driver %s, device capacity %s; config %s (every key: --json)\n",
                  r.driver, r.capacity ? _expseg_human(cb, (double)r.capacity) : "unknown",
                  _expseg_config_changed(r.config, changed, sizeof changed));
          _expseg_replay_table_head(out);
          snprintf(last_driver, sizeof last_driver, "%s", r.driver);
        }
        _expseg_replay_table_row(out, t, &r);
      }
      fflush(out);
    }
  }

  if (rc == 0) rc = oom_rc;
done:
  if ((fflush(out) != 0 || ferror(out)) && rc == 0) { /* a full disk, a closed pipe */
    fprintf(err, "expseg-replay: writing the output failed: %s\n", strerror(errno));
    rc = 1;
  }
  if (timeline && fclose(timeline) != 0 && rc == 0) {
    fprintf(err, "expseg-replay: writing --timeline '%s' failed\n", o.timeline);
    rc = 1;
  }
  _expseg_report_free(o.html);
  histories_free(&h);
  free(files);
  free(synths);
  return rc;
}
