/* SPDX-License-Identifier: Apache-2.0 */
/* synth_sweep.c: the replay tool's output (JSON rows, the table) and --sweep.
 *
 * The sweep answers two questions in two sections. (a) "pytorch": what the user gets by
 * changing PYTORCH_CUDA_ALLOC_CONF alone, every row replayed under --model pytorch (the
 * recorded run's own setting, PyTorch's settings, and the user's --conf interpreted with
 * PyTorch's defaults when it holds only PyTorch keys); (b) "expseg": what switching
 * allocator gives, rows replayed under --model expseg (expseg-only keys flagged). Within a
 * section rows rank by: allocator failures last, then OOMs; rows within 1 % of the
 * section's least peak reserved first, by least modelled driver time; then the others by
 * least peak reserved. Two closing lines name the best PyTorch setting against the
 * recorded run, and expseg's saving beyond it. Usage and fields: docs/replay.md. (The file
 * name starts with "synth" for the library glob.) */
#include "synth_replay.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------ */
/* The sweep table                                                                       */

typedef struct sweep_conf_s {
  const char *label;
  const char *conf;
  int model;
} sweep_conf_t;

static const sweep_conf_t sweep_table[] = {
    {"classic", "expandable_segments:False", EXPSEG_MODEL_PYTORCH},
    {"classic, max_split 512M", "expandable_segments:False,max_split_size_mb:512",
     EXPSEG_MODEL_PYTORCH},
    {"classic, max_split 128M", "expandable_segments:False,max_split_size_mb:128",
     EXPSEG_MODEL_PYTORCH},
    {"classic, max_split 32M", "expandable_segments:False,max_split_size_mb:32",
     EXPSEG_MODEL_PYTORCH},
    {"classic, roundup 4", "expandable_segments:False,roundup_power2_divisions:4",
     EXPSEG_MODEL_PYTORCH},
    {"classic, roundup 8", "expandable_segments:False,roundup_power2_divisions:8",
     EXPSEG_MODEL_PYTORCH},
    {"expandable", "expandable_segments:True", EXPSEG_MODEL_PYTORCH},
    {"expandable, roundup 4", "expandable_segments:True,roundup_power2_divisions:4",
     EXPSEG_MODEL_PYTORCH},
    {"expandable, max_split 128M", "expandable_segments:True,max_split_size_mb:128",
     EXPSEG_MODEL_PYTORCH},
    {"expseg", "expandable_segments:True", EXPSEG_MODEL_EXPSEG},
    {"expseg, page 8M", "expandable_segments:True,page_size_mb:8", EXPSEG_MODEL_EXPSEG},
    {"expseg, page 20M", "expandable_segments:True,page_size_mb:20", EXPSEG_MODEL_EXPSEG},
    {"expseg, chunk 8M", "expandable_segments:True,chunk_max_mb:8", EXPSEG_MODEL_EXPSEG},
    {"expseg, chunk 2M", "expandable_segments:True,chunk_max_mb:2", EXPSEG_MODEL_EXPSEG},
    {"expseg, roundup 4", "expandable_segments:True,roundup_power2_divisions:4",
     EXPSEG_MODEL_EXPSEG},
    {"expseg, roundup 8", "expandable_segments:True,roundup_power2_divisions:8",
     EXPSEG_MODEL_EXPSEG},
};
#define N_SWEEP (sizeof sweep_table / sizeof sweep_table[0])

const char *const _expseg_flag_names[N_FLAGS] = {"expseg-only", "recorded", "yours",
                                                 "cold-start", "near-best", "best"};

/* Does conf give a key PyTorch does not accept (the option table says: expseg_option_pytorch)?
 * Keys are the words before ':' outside brackets ("roundup_power2_divisions:[>:0]"). */
static int expseg_only(const char *conf) {
  int depth = 0;
  for (const char *k = conf, *p = conf; p && *p; p++) {
    if (*p == '[') depth++;
    else if (*p == ']') depth--;
    else if (*p == ',' && depth == 0) k = p + 1;
    else if (*p == ':' && depth == 0 && k != NULL) {
      while (*k == ' ') k++;
      size_t n = (size_t)(p - k);
      while (n > 0 && k[n - 1] == ' ') n--;
      if (expseg_option_pytorch(k, n) != 1) return 1;
      k = NULL; /* the value follows, up to the next ',' at depth 0 */
    }
  }
  return 0;
}

/* ------------------------------------------------------------------------------------ */
/* Output                                                                                */

/* The length of the well-formed UTF-8 sequence at s (1..4), or 0 (RFC 3629: no overlong
 * form, no surrogate, nothing above U+10FFFF); s is NUL-terminated. */
int _expseg_utf8_len(const unsigned char *s) {
  if (s[0] < 0x80) return 1;
  int n = s[0] < 0xc2 ? 0 : s[0] < 0xe0 ? 2 : s[0] < 0xf0 ? 3 : s[0] < 0xf5 ? 4 : 0;
  for (int i = 1; i < n; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  if ((n == 3 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] > 0x9f))) ||
      (n == 4 && ((s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] > 0x8f))))
    return 0;
  return n;
}

/* A JSON string: a byte that is not UTF-8 (a file name may hold any) becomes U+FFFD, so the
 * line stays valid JSON. */
void _expseg_json_str(FILE *f, const char *s) {
  fputc('"', f);
  while (*s) {
    const unsigned char c = (unsigned char)*s;
    int n = _expseg_utf8_len((const unsigned char *)s);
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else if (n == 0) fputs("\\ufffd", f);
    else fwrite(s, 1, (size_t)n, f);
    s += n ? n : 1;
  }
  fputc('"', f);
}

const char *_expseg_human(char buf[32], double bytes) {
  if (bytes >= (double)GIB) snprintf(buf, 32, "%.2f GiB", bytes / (double)GIB);
  else if (bytes >= 1048576.0) snprintf(buf, 32, "%.1f MiB", bytes / 1048576.0);
  else snprintf(buf, 32, "%.0f B", bytes);
  return buf;
}

double _expseg_ratio(int64_t num, uint64_t den) {
  return den && num >= 0 ? (double)num / (double)den : 0.0;
}

static void json_calls(FILE *f, const char *name, const expseg_calls_t *c, double ms) {
  fprintf(f, ",\"%s\":{", name);
  for (int k = 0; k < EXPSEG_COST_N; k++)
    fprintf(f, "%s\"%s\":%" PRIu64, k ? "," : "", _expseg_cost_names[k], c->calls[k]);
  fprintf(f, "},\"%s_ms\":%.3f", strcmp(name, "window_calls") ? "recorded_driver" : "driver",
          ms);
}

void _expseg_replay_json(FILE *f, const expseg_trace_t *t, const result_t *r,
                         const char *label, int rank, const char *section, int flags) {
  fprintf(f, "{\"trace\":");
  _expseg_json_str(f, t->name);
  fprintf(f, ",\"device\":%d", t->device);
  if (label) {
    fprintf(f, ",\"section\":\"%s\",\"setting\":", section);
    _expseg_json_str(f, label);
    fprintf(f, ",\"rank\":%d,\"flags\":[", rank);
    const char *sep = "";
    for (int k = 0; k < N_FLAGS; k++)
      if (flags & (1 << k)) fprintf(f, "%s\"%s\"", sep, _expseg_flag_names[k]), sep = ",";
    fprintf(f, "]");
  }
  fprintf(f, ",\"model\":\"%s\",\"warm_start\":%s,\"driver\":", _expseg_model_name(r->model),
          r->warm_started ? "true" : "false");
  _expseg_json_str(f, r->driver);
  fprintf(f, ",\"capacity\":%" PRIu64 ",\"config\":", r->capacity);
  _expseg_json_str(f, r->config);
  fprintf(f,
          ",\"events\":%" PRIu64 ",\"ops\":%" PRIu64 ",\"peak_requested\":%" PRIu64
          ",\"peak_allocated\":%" PRId64 ",\"peak_reserved\":%" PRId64
          ",\"num_device_alloc\":%" PRId64 ",\"num_device_free\":%" PRId64
          ",\"num_ooms\":%" PRIu64 ",\"first_oom_event\":%" PRId64 ",\"errors\":%" PRIu64
          ",\"ns_per_op\":%.1f",
          r->events, r->ops, r->peak_requested, r->peak_allocated, r->peak_reserved,
          r->num_device_alloc, r->num_device_free, r->num_ooms, r->first_oom, r->errors,
          r->ns_per_op);
  fprintf(f, ",\"window_device_alloc\":%" PRId64 ",\"window_device_free\":%" PRId64,
          r->num_device_alloc - r->warm_alloc, r->num_device_free - r->warm_free);
  if (r->has_created) fprintf(f, ",\"created_bytes\":%" PRId64, r->created_bytes);
  fprintf(f, ",\"ratio\":%.4f", _expseg_ratio(r->peak_reserved, r->peak_requested));
  if (r->has_calls) {
    fprintf(f, ",\"driver_calls\":{");
    for (size_t k = 0; k < N_MEM_CALLS; k++)
      fprintf(f, "%s\"%s\":%" PRId64, k ? "," : "", _expseg_mem_calls[k], r->calls[k]);
    fprintf(f, "}");
  }
  json_calls(f, "window_calls", &r->win, r->driver_ms);
  if (r->base.present) {
    const expseg_trace_baseline_t *b = &r->base;
    fprintf(f,
            ",\"baseline\":{\"peak_reserved\":%" PRIu64 ",\"segment_alloc\":%" PRIu64
            ",\"segment_free\":%" PRIu64 ",\"map\":%" PRIu64 ",\"unmap\":%" PRIu64
            ",\"oom\":%" PRIu64 ",\"ratio\":%.4f",
            b->peak_reserved, b->segment_alloc, b->segment_free, b->map, b->unmap, b->oom,
            _expseg_ratio((int64_t)b->peak_reserved, r->peak_requested));
    json_calls(f, "calls", &r->rec, r->rec_ms);
    fprintf(f, "}");
  }
  fprintf(f, "}\n");
}

void _expseg_replay_table_head(FILE *f) {
  fprintf(f, "%-36s %-7s %8s %10s %10s %6s %10s %6s %11s %9s %5s\n", "trace", "model",
          "events", "peak req", "peak resv", "ratio", "recorded", "ratio", "win dev a/f",
          "drv ms", "ooms");
}

void _expseg_replay_table_row(FILE *f, const expseg_trace_t *t, const result_t *r) {
  char b1[32], b2[32], b3[32], af[32];
  snprintf(af, sizeof af, "%" PRId64 "/%" PRId64, r->num_device_alloc - r->warm_alloc,
           r->num_device_free - r->warm_free);
  fprintf(f, "%-36.36s %-7s %8" PRIu64 " %10s %10s %6.3f ", t->name,
          _expseg_model_name(r->model), r->events, _expseg_human(b1, (double)r->peak_requested),
          _expseg_human(b2, (double)r->peak_reserved),
          _expseg_ratio(r->peak_reserved, r->peak_requested));
  if (r->base.present)
    fprintf(f, "%10s %6.3f ", _expseg_human(b3, (double)r->base.peak_reserved),
            _expseg_ratio((int64_t)r->base.peak_reserved, r->peak_requested));
  else
    fprintf(f, "%10s %6s ", "-", "-");
  fprintf(f, "%11s %9.1f %5" PRIu64 "\n", af, r->driver_ms, r->num_ooms);
}

/* ------------------------------------------------------------------------------------ */
/* Sweep                                                                                 */

typedef struct sweep_row_s {
  const char *label, *conf;
  int model, flags;
  int near;   /* within SWEEP_NEAR of the section's least memory: ranked by driver time */
  result_t r;
} sweep_row_t;

/* Memory within 1 % of the section's best counts as a tie, broken by driver time: a setting
 * does not rank first for 1 % less memory bought with thousands of extra driver calls. */
#define SWEEP_NEAR 0.01

static int cmp_ms(const sweep_row_t *a, const sweep_row_t *b) {
  return a->r.driver_ms < b->r.driver_ms ? -1 : a->r.driver_ms > b->r.driver_ms;
}

static int row_cmp(const void *pa, const void *pb) {
  const sweep_row_t *a = pa, *b = pb;
  if (a->model != b->model) return a->model == EXPSEG_MODEL_PYTORCH ? -1 : 1; /* sections */
  if ((a->r.errors > 0) != (b->r.errors > 0)) return a->r.errors > 0 ? 1 : -1;
  if ((a->r.num_ooms > 0) != (b->r.num_ooms > 0)) return a->r.num_ooms > 0 ? 1 : -1;
  if (a->near != b->near) return a->near ? -1 : 1;
  if (a->near && cmp_ms(a, b)) return cmp_ms(a, b);
  if (a->r.peak_reserved != b->r.peak_reserved)
    return a->r.peak_reserved < b->r.peak_reserved ? -1 : 1;
  return cmp_ms(a, b);
}

/* Marks the rows within SWEEP_NEAR of their section's least memory (clean rows only). */
static void mark_near(sweep_row_t *rows, size_t n) {
  for (int m = EXPSEG_MODEL_EXPSEG; m <= EXPSEG_MODEL_PYTORCH; m++) {
    int64_t best = -1;
    for (size_t i = 0; i < n; i++)
      if (rows[i].model == m && !rows[i].r.errors && !rows[i].r.num_ooms &&
          (best < 0 || rows[i].r.peak_reserved < best))
        best = rows[i].r.peak_reserved;
    for (size_t i = 0; i < n; i++)
      rows[i].near = rows[i].model == m && best >= 0 && !rows[i].r.errors &&
                             !rows[i].r.num_ooms &&
                             (double)rows[i].r.peak_reserved <= (1.0 + SWEEP_NEAR) * (double)best
                         ? 1
                         : rows[i].model == m ? 0 : rows[i].near;
  }
}

static sweep_row_t row(const char *label, const char *conf, int model, int flags) {
  sweep_row_t w;
  memset(&w, 0, sizeof w);
  w.label = label;
  w.conf = conf;
  w.model = model;
  w.flags = flags;
  return w;
}

static size_t build_rows(const expseg_trace_t *t, const opts_t *o, sweep_row_t *rows) {
  size_t n = 0;
  if (t->recorded_conf[0])
    rows[n++] = row("recorded run's setting", t->recorded_conf, EXPSEG_MODEL_PYTORCH,
                    FLAG_RECORDED);
  for (size_t i = 0; i < N_SWEEP; i++)
    rows[n++] = row(sweep_table[i].label, sweep_table[i].conf, sweep_table[i].model,
                    expseg_only(sweep_table[i].conf) ? FLAG_EXPSEG_ONLY : 0);
  if (o->conf) {
    if (!expseg_only(o->conf)) /* PyTorch reads it with its own defaults */
      rows[n++] = row("yours (--conf)", o->conf, EXPSEG_MODEL_PYTORCH, FLAG_YOURS);
    rows[n++] = row("yours (--conf) on expseg", o->conf, EXPSEG_MODEL_EXPSEG,
                    FLAG_YOURS | (expseg_only(o->conf) ? FLAG_EXPSEG_ONLY : 0));
  }
  return n;
}

static const char *legend =
    "columns: peak resv = most device memory the allocator held; ratio = peak resv / peak\n"
    "requested (1.000 = no overhead); dev a+f = device allocations + frees in the recorded\n"
    "window (cudaMalloc/cudaFree or expseg's segment growth/shrink); drv ms = modelled time in\n"
    "driver calls over the window (per-call costs: docs/replay.md, --costs); ooms = requests\n"
    "that failed; flags: expseg-only = a key PyTorch does not read, recorded = the recorded\n"
    "run's own setting, yours = --conf, cold start = replayed from an empty cache although\n"
    "the recorded run started warm (expandable rows: the classic start state cannot be\n"
    "mapped), so its memory is not comparable with warm rows and its driver time includes\n"
    "growth the recorded run did not need. Rows within 1 % of a section's least memory\n"
    "rank by driver time, the others by memory.\n";

static void print_section(FILE *out, const sweep_row_t *rows, size_t n, int model) {
  char b1[32];
  fprintf(out, "%s\n%4s  %-26s %10s %6s %8s %9s %5s  %s\n",
          model == EXPSEG_MODEL_PYTORCH
              ? "(a) PyTorch's allocator (--model pytorch): change PYTORCH_CUDA_ALLOC_CONF only"
              : "(b) expseg (--model expseg): switch allocator",
          "rank", "setting", "peak resv", "ratio", "dev a+f", "drv ms", "ooms", "setting string");
  int rank = 0;
  for (size_t i = 0; i < n; i++) {
    const sweep_row_t *w = &rows[i];
    if (w->model != model) continue;
    rank++;
    if (w->r.errors) {
      fprintf(out, "%4d  %-26s %10s %6s %8s %9s %5s  %s  (allocator failed: see stderr)\n",
              rank, w->label, "FAILED", "-", "-", "-", "-", w->conf);
      continue;
    }
    fprintf(out, "%4d  %-26s %10s %6.3f %8" PRId64 " %9.1f %5" PRIu64 "  %s%s%s%s\n", rank,
            w->label, _expseg_human(b1, (double)w->r.peak_reserved),
            _expseg_ratio(w->r.peak_reserved, w->r.peak_requested),
            w->r.num_device_alloc - w->r.warm_alloc + w->r.num_device_free - w->r.warm_free,
            w->r.driver_ms, w->r.num_ooms, w->conf,
            w->flags & FLAG_EXPSEG_ONLY ? "  [expseg-only]" : "",
            w->flags & FLAG_RECORDED ? "  [recorded]" : "",
            w->flags & FLAG_COLD ? "  [cold start]" : "");
  }
}

/* Flags the best row of each section (ranked rows): the first without an OOM or failure;
 * in expseg's section never one that holds more than expseg's defaults (the row "expseg"),
 * which a tie on memory broken by driver time could otherwise pick. The closing lines, JSON
 * ("best") and --report name these rows. */
static void mark_best(sweep_row_t *rows, size_t n) {
  int64_t plain = -1; /* expseg's defaults, when they ran clean */
  for (size_t i = 0; i < n; i++)
    if (rows[i].model == EXPSEG_MODEL_EXPSEG && !strcmp(rows[i].label, "expseg") &&
        !rows[i].r.errors && !rows[i].r.num_ooms)
      plain = rows[i].r.peak_reserved;
  int seen[2] = {0, 0};
  for (size_t i = 0; i < n; i++) {
    if (rows[i].r.errors || rows[i].r.num_ooms || seen[rows[i].model]) continue;
    if (rows[i].model == EXPSEG_MODEL_EXPSEG && plain >= 0 && rows[i].r.peak_reserved > plain)
      continue;
    seen[rows[i].model] = 1;
    rows[i].flags |= FLAG_BEST;
  }
}

static void closing(FILE *out, const expseg_trace_t *t, const sweep_row_t *rows, size_t n) {
  const sweep_row_t *pt = NULL, *ex = NULL;
  for (size_t i = 0; i < n; i++) {
    if (!(rows[i].flags & FLAG_BEST)) continue;
    if (rows[i].model == EXPSEG_MODEL_PYTORCH) pt = &rows[i];
    else ex = &rows[i];
  }
  char b1[32], b2[32], b3[32];
  if (pt) {
    fprintf(out, "best PyTorch setting: %s -> PYTORCH_CUDA_ALLOC_CONF=%s holds %s, %.1f ms "
                 "in the driver",
            pt->label, pt->conf, _expseg_human(b1, (double)pt->r.peak_reserved),
            pt->r.driver_ms);
    /* like with like: a row replayed from an empty cache is not set against a recorded run
     * that started warm */
    if (pt->r.base.present && !(pt->flags & FLAG_COLD))
      fprintf(out, " (recorded run: %s, %.1f ms)",
              _expseg_human(b2, (double)pt->r.base.peak_reserved), pt->r.rec_ms);
    else if (pt->r.base.present)
      fprintf(out, " (started from an empty cache, the recorded run from a warm one: not "
                   "compared)");
    fprintf(out, "\n");
  } else {
    fprintf(out, "best PyTorch setting: none ran without an OOM or failure\n");
  }
  if (ex && pt) {
    int64_t save = pt->r.peak_reserved - ex->r.peak_reserved;
    fprintf(out, "expseg beyond it: %s -> EXPSEG_ALLOC_CONF=%s holds %s, %s %s (%.1f%%), "
                 "%.1f ms in the driver\n",
            ex->label, ex->conf, _expseg_human(b1, (double)ex->r.peak_reserved),
            save >= 0 ? "saves" : "costs",
            _expseg_human(b3, (double)(save >= 0 ? save : -save)),
            100.0 * (double)save / (double)(pt->r.peak_reserved ? pt->r.peak_reserved : 1),
            ex->r.driver_ms);
  } else if (ex) {
    fprintf(out, "expseg: %s holds %s\n", ex->label,
            _expseg_human(b1, (double)ex->r.peak_reserved));
  }
  (void)t;
}

int _expseg_replay_sweep(const expseg_trace_t *t, const opts_t *o, FILE *out, FILE *err) {
  sweep_row_t *rows = calloc(N_SWEEP + 3, sizeof *rows);
  if (!rows) return 1;
  size_t n = build_rows(t, o, rows);
  int rc = 0, failed = 0;
  const int tty = !o->quiet && isatty(fileno(err));
  for (size_t i = 0; i < n && rc != 2; i++) {
    sweep_row_t *w = &rows[i];
    if (tty)
      fprintf(err, "\r%s: setting %zu/%zu (%s)%20s", t->name, i + 1, n, w->label, "");
    /* a setting the allocator fails on (not an OOM) is ranked last and the sweep goes on;
     * the exit status is then 1 */
    FILE *tl = o->html ? _expseg_report_timeline(o->html, w->label) : NULL;
    rc = _expseg_replay_cap(t, o, w->model, w->conf, NULL, tl, err, &w->r, NULL);
    if (t->n_start_segs && !w->r.warm_started) w->flags |= FLAG_COLD;
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
  mark_near(rows, n);
  qsort(rows, n, sizeof *rows, row_cmp);
  mark_best(rows, n);
  int rank = 0, model = -1;
  for (size_t i = 0; i < n && (o->json || o->html); i++) { /* the same rows, both outputs */
    rank = rows[i].model == model ? rank + 1 : 1;
    model = rows[i].model;
    const char *section = model == EXPSEG_MODEL_PYTORCH ? "pytorch" : "expseg";
    const int flags = rows[i].flags | (rows[i].near ? FLAG_NEAR : 0);
    if (o->json) _expseg_replay_json(out, t, &rows[i].r, rows[i].label, rank, section, flags);
    if (o->html)
      _expseg_report_row(o->html, &rows[i].r, rows[i].label, rows[i].conf, rank, section,
                         flags);
  }
  if (o->json) {
    free(rows);
    return failed;
  }
  char b1[32], b2[32];
  fprintf(out, "\n%s: %" PRIu64 " events, peak requested %s", t->name, rows[0].r.events,
          _expseg_human(b1, (double)rows[0].r.peak_requested));
  if (rows[0].r.base.present)
    fprintf(out, ", recorded allocator held %s (ratio %.3f), %.1f ms in the driver",
            _expseg_human(b2, (double)rows[0].r.base.peak_reserved),
            _expseg_ratio((int64_t)rows[0].r.base.peak_reserved, rows[0].r.peak_requested),
            rows[0].r.rec_ms);
  fprintf(out, "\n%s", legend);
  print_section(out, rows, n, EXPSEG_MODEL_PYTORCH);
  print_section(out, rows, n, EXPSEG_MODEL_EXPSEG);
  closing(out, t, rows, n);
  free(rows);
  return failed;
}
