/* SPDX-License-Identifier: Apache-2.0 */
/* report.c: expseg-replay --report FILE.html, the sweep of one history as a page a person
 * would rather look at than read: the answer first, memory over time per setting, the
 * segments at the peak, then the sweep table.
 *
 * The page is one file with nothing to fetch (inline CSS and SVG, no script), so it opens
 * offline and can be mailed. Its figures are the sweep's own: the sweep hands the report the
 * same ranked result_t rows it writes as JSON lines (synth_sweep.c), and the report keeps
 * them as they are; every figure on the page carries its exact value in a data- attribute
 * (bytes, milliseconds, counts) beside the rounded text, so a test can compare the page
 * with --json. The lines over time are each row's own --timeline, written by the same
 * replay that produced the row (so the line's highest point is the row's peak reserved);
 * the segments at the peak need one more pair of replays of the two recommended rows
 * (the first finds the event, the second walks the allocator there: synth_capture.c).
 * Usage: docs/replay.md, "The HTML report". */
#include "synth_replay.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* A card sold as "24 GB" holds 24 GiB; the CUDA context (a few hundred MiB) is not counted. */
#define CARD_BYTES (24 * GIB)
#define MAX_ROWS 32
#define MAX_SEGS_DRAWN 48

typedef struct point_s {
  uint64_t x;       /* event index */
  uint64_t live;    /* live requested bytes */
  int64_t reserved; /* reserved_bytes.all.current */
} point_t;

typedef struct segs_s {
  uint64_t *total, *alloc; /* per segment at the peak, address order */
  uint8_t *expandable;
  size_t n, cap;
  int failed;
} segs_t;

typedef struct row_s {
  result_t r;
  char label[64], conf[256];
  const char *section;
  int rank, flags;
  FILE *tl;       /* the timeline stream while the row replays */
  char *tl_buf;
  size_t tl_len;
  point_t *pts;
  size_t n_pts;
  segs_t segs;
  int64_t segs_event; /* the event the segments were taken after; -1 none */
} row_t;

struct expseg_report_s {
  char *path;
  FILE *f;
  char *command;
  row_t rows[MAX_ROWS];
  size_t n;
};

/* ------------------------------------------------------------------------------------ */
/* Rows from the sweep                                                                   */

expseg_report_t *_expseg_report_new(const char *path, int argc, char **argv, FILE *err) {
  expseg_report_t *h = calloc(1, sizeof *h);
  size_t len = 1;
  for (int i = 0; i < argc; i++) len += strlen(argv[i]) + 1;
  if (h) h->command = malloc(len);
  if (h) h->path = strdup(path);
  if (!h || !h->command || !h->path) {
    fprintf(err, "expseg-replay: out of host memory for --report\n");
    _expseg_report_free(h);
    return NULL;
  }
  h->command[0] = 0;
  for (int i = 0; i < argc; i++) {
    if (i) strcat(h->command, " ");
    strcat(h->command, argv[i]);
  }
  h->f = fopen(path, "w");
  if (!h->f) {
    fprintf(err, "expseg-replay: cannot write --report '%s': %s\n", path, strerror(errno));
    _expseg_report_free(h);
    return NULL;
  }
  return h;
}

static row_t *find_row(expseg_report_t *h, const char *label) {
  for (size_t i = 0; i < h->n; i++)
    if (!strcmp(h->rows[i].label, label)) return &h->rows[i];
  return NULL;
}

FILE *_expseg_report_timeline(expseg_report_t *h, const char *label) {
  row_t *w = find_row(h, label);
  if (!w) {
    if (h->n == MAX_ROWS) return NULL;
    w = &h->rows[h->n++];
    snprintf(w->label, sizeof w->label, "%s", label);
    w->segs_event = -1;
  }
  if (!w->tl) w->tl = open_memstream(&w->tl_buf, &w->tl_len);
  return w->tl;
}

/* The timeline's rows (EXPSEG_TIMELINE_HEADER, no header line): the trace name may hold
 * commas, so the seven numbers are read from the end of each line. */
static void parse_timeline(row_t *w) {
  size_t cap = 0;
  for (char *line = w->tl_buf; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl) *nl = 0;
    char *c[7];
    int k = 0;
    for (char *p = line + strlen(line); p > line && k < 7; p--)
      if (p[-1] == ',') c[k++] = p;
    if (k == 7) { /* c[6] = event, c[5] = live, c[4] = reserved */
      if (w->n_pts == cap) {
        cap = cap ? 2 * cap : 1024;
        point_t *np = realloc(w->pts, cap * sizeof *np);
        if (!np) break;
        w->pts = np;
      }
      w->pts[w->n_pts++] = (point_t){strtoull(c[6], NULL, 10), strtoull(c[5], NULL, 10),
                                     strtoll(c[4], NULL, 10)};
    }
    line = nl ? nl + 1 : NULL;
  }
}

void _expseg_report_row(expseg_report_t *h, const result_t *r, const char *label,
                        const char *conf, int rank, const char *section, int flags) {
  row_t *w = find_row(h, label);
  if (!w) {
    if (h->n == MAX_ROWS) return;
    w = &h->rows[h->n++];
    snprintf(w->label, sizeof w->label, "%s", label);
    w->segs_event = -1;
  }
  w->r = *r;
  snprintf(w->conf, sizeof w->conf, "%s", conf);
  w->rank = rank;
  w->section = section;
  w->flags = flags;
  if (w->tl) {
    fclose(w->tl);
    w->tl = NULL;
    parse_timeline(w);
  }
}

void _expseg_report_free(expseg_report_t *h) {
  if (!h) return;
  for (size_t i = 0; i < h->n; i++) {
    row_t *w = &h->rows[i];
    if (w->tl) fclose(w->tl);
    free(w->tl_buf);
    free(w->pts);
    free(w->segs.total);
    free(w->segs.alloc);
    free(w->segs.expandable);
  }
  if (h->f) { /* never written: no half page is left behind */
    fclose(h->f);
    remove(h->path);
  }
  free(h->path);
  free(h->command);
  free(h);
}

/* ------------------------------------------------------------------------------------ */
/* Segments at the peak                                                                  */

static void on_segment(void *ctx, const expseg_walk_segment *s) {
  segs_t *g = ctx;
  if (g->failed) return;
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 64;
    uint64_t *t = realloc(g->total, cap * sizeof *t);
    if (t) g->total = t;
    uint64_t *a = realloc(g->alloc, cap * sizeof *a);
    if (a) g->alloc = a;
    uint8_t *e = realloc(g->expandable, cap);
    if (e) g->expandable = e;
    if (!t || !a || !e) {
      g->failed = 1;
      return;
    }
    g->cap = cap;
  }
  g->total[g->n] = s->total_size;
  g->alloc[g->n] = s->allocated_size;
  g->expandable[g->n++] = s->is_expandable;
}

/* Replays row w twice more: the first pass finds the event after which reserved memory
 * first peaks, the second walks the allocator's segments there. */
static int take_segments(row_t *w, const expseg_trace_t *t, const opts_t *o, FILE *err) {
  opts_t q = *o;
  q.quiet = 1;
  q.html = NULL;
  int model = strcmp(w->section, "pytorch") ? EXPSEG_MODEL_EXPSEG : EXPSEG_MODEL_PYTORCH;
  result_t r;
  capture_t find = {-1, 0, NULL, 0, NULL, NULL, NULL};
  const int rc = _expseg_replay_cap(t, &q, model, w->conf, NULL, NULL, err, &r, &find);
  if (rc == 2) return 1;
  const int64_t at = r.peak_event;
  if (at < 0 && rc == 0) return 0; /* no event reserved memory (annotations only) */
  capture_t walk = {at, 0, NULL, 0, NULL, on_segment, &w->segs};
  if (at < 0 || _expseg_replay_cap(t, &q, model, w->conf, NULL, NULL, err, &r, &walk) != 0)
    return 1;
  w->segs_event = at;
  return w->segs.failed;
}

/* ------------------------------------------------------------------------------------ */
/* HTML                                                                                  */

/* Text for the page (UTF-8): a byte that is not UTF-8 (a file name may hold any) is U+FFFD. */
static void esc(FILE *f, const char *s) {
  for (int n; *s; s += n ? n : 1) {
    n = _expseg_utf8_len((const unsigned char *)s);
    switch (*s) {
    case '&': fputs("&amp;", f); break;
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '"': fputs("&quot;", f); break;
    case '\'': fputs("&#39;", f); break;
    default:
      if (n) fwrite(s, 1, (size_t)n, f);
      else fputs("&#xfffd;", f);
    }
  }
}

/* A byte figure: the exact value in data-bytes, _expseg_human's text inside. */
static void bytes_el(FILE *f, const char *id, int64_t v) {
  char b[32];
  fprintf(f, "<span class=\"fig\"");
  if (id) fprintf(f, " id=\"%s\"", id);
  fprintf(f, " data-bytes=\"%" PRId64 "\">%s</span>", v, _expseg_human(b, (double)v));
}

/* v as --json writes it (%.*f): the page rounds that figure further, never v itself, so
 * that its text is what anyone gets from the JSON line. */
static double as_json(double v, int digits) {
  char b[64];
  snprintf(b, sizeof b, "%.*f", digits, v);
  return strtod(b, NULL);
}

static const char *const colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};

/* Axis ticks: a step of 1, 2, 2.5 or 5 times a power of ten of MiB (below 1 GiB) or GiB
 * that gives at most 6 ticks; *unit and *uname say which. */
static double tick_step(double top, double *unit, const char **uname) {
  *unit = top >= (double)GIB ? (double)GIB : 1048576.0;
  *uname = top >= (double)GIB ? "GiB" : "MiB";
  static const double m[] = {1, 2, 2.5, 5};
  for (double p = 0.01;; p *= 10)
    for (int k = 0; k < 4; k++)
      if (top / (m[k] * p * *unit) <= 6) return m[k] * p * *unit;
}

typedef struct line_s {
  const char *name, *colour, *dash;
  const row_t *row; /* reserved of row, or NULL with live or the recorded series */
  int live;         /* the live requested bytes of `row` */
  const point_t *rec;
  size_t n_rec;
} line_t;

/* One SVG chart of lines over the event index, y from 0 to ymax bytes. */
static void chart(FILE *f, const char *id, int W, int H, uint64_t xmax, double ymax,
                  const line_t *lines, size_t n, int small) {
  const int L = small ? 58 : 72, R = 12, T = 10, B = small ? 22 : 36;
  double top = ymax > 0 ? ymax * 1.05 : 1.0, unit;
  const char *uname;
  const double step = tick_step(top, &unit, &uname);
  if (xmax == 0) xmax = 1;
  fprintf(f, "<svg id=\"%s\" class=\"chart\" viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" "
             "role=\"img\">\n", id, W, H, W, H);
  for (int k = 0; k * step <= top; k++) {
    double py = T + (H - T - B) * (1.0 - k * step / top);
    fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" class=\"grid\"/>"
               "<text x=\"%d\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%g %s</text>\n",
            L, W - R, py, py, L - 4, py + 4, k * step / unit, uname);
  }
  fprintf(f, "<text x=\"%d\" y=\"%d\" class=\"tick\" text-anchor=\"end\">event %" PRIu64
             "</text>\n", W - R, H - 4, xmax);
  for (size_t k = 0; k < n; k++) {
    const line_t *ln = &lines[k];
    fprintf(f, "<polyline class=\"series\" data-series=\"");
    esc(f, ln->name);
    fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s%s%s points=\"",
            ln->colour, small ? "1" : "1.6", ln->dash ? " stroke-dasharray=\"" : "",
            ln->dash ? ln->dash : "", ln->dash ? "\"" : "");
    const point_t *p = ln->row ? ln->row->pts : ln->rec;
    const size_t np = ln->row ? ln->row->n_pts : ln->n_rec;
    /* a point is left out where the line goes on flat through it, or where it falls on
     * the pixel of the point before */
    double px = -1, py = -1;
    for (size_t i = 0; i < np; i++) {
      double v = ln->live ? (double)p[i].live : (double)p[i].reserved;
      double x = L + (W - L - R) * (double)p[i].x / (double)xmax;
      double y = T + (H - T - B) * (1.0 - v / top);
      double vn = i + 1 < np ? (ln->live ? (double)p[i + 1].live : (double)p[i + 1].reserved)
                             : -1;
      if (i > 0 && i + 1 < np && (v == vn && y == py)) continue;
      if ((int)(x * 2) == (int)(px * 2) && (int)(y * 2) == (int)(py * 2) && i + 1 < np)
        continue;
      fprintf(f, "%s%.1f,%.1f", i ? " " : "", x, y);
      px = x;
      py = y;
    }
    fprintf(f, "\"/>\n");
  }
  fprintf(f, "</svg>\n");
}

static void legend(FILE *f, const line_t *lines, size_t n) {
  fprintf(f, "<p class=\"legend\">");
  for (size_t k = 0; k < n; k++) {
    fprintf(f, "<span><svg width=\"26\" height=\"10\"><line x1=\"0\" x2=\"26\" y1=\"5\" "
               "y2=\"5\" stroke=\"%s\" stroke-width=\"2\"%s%s%s/></svg> ",
            lines[k].colour, lines[k].dash ? " stroke-dasharray=\"" : "",
            lines[k].dash ? lines[k].dash : "", lines[k].dash ? "\"" : "");
    esc(f, lines[k].name);
    fprintf(f, "</span> ");
  }
  fprintf(f, "</p>\n");
}

static const row_t *best_of(const expseg_report_t *h, const char *section) {
  for (size_t i = 0; i < h->n; i++)
    if ((h->rows[i].flags & FLAG_BEST) && !strcmp(h->rows[i].section, section))
      return &h->rows[i];
  return NULL;
}

/* What the user has now: the recorded run's own setting, else PyTorch's default
 * (expandable_segments:False), both replayed under --model pytorch. */
static const row_t *current_of(const expseg_report_t *h) {
  for (size_t i = 0; i < h->n; i++)
    if (h->rows[i].flags & FLAG_RECORDED) return &h->rows[i];
  for (size_t i = 0; i < h->n; i++)
    if (!strcmp(h->rows[i].section, "pytorch") &&
        !strcmp(h->rows[i].conf, "expandable_segments:False"))
      return &h->rows[i];
  return NULL;
}

static void fits(FILE *f, const char *id, const row_t *w) {
  const int yes = w->r.peak_reserved <= (int64_t)CARD_BYTES;
  fprintf(f, "<b id=\"%s\" data-fits=\"%s\">%s</b>", id, yes ? "yes" : "no", yes ? "yes" : "no");
}

static void answer(FILE *f, const expseg_report_t *h, const expseg_trace_t *t) {
  const row_t *x = best_of(h, "pytorch"), *z = best_of(h, "expseg"), *y = current_of(h);
  fprintf(f, "<section id=\"answer\"><h2>The answer</h2>\n<p class=\"answer\">");
  if (x) {
    fprintf(f, "Set <code id=\"answer-pytorch-conf\">PYTORCH_CUDA_ALLOC_CONF=");
    esc(f, x->conf);
    fprintf(f, "</code>: ");
    bytes_el(f, "answer-pytorch", x->r.peak_reserved);
    if (y && y != x) {
      fprintf(f, " instead of ");
      bytes_el(f, "answer-now", y->r.peak_reserved);
      fprintf(f, " (<span id=\"answer-now-setting\">");
      esc(f, y->label);
      fprintf(f, "</span>)");
    } else if (y) {
      fprintf(f, " (<span id=\"answer-now-setting\">");
      esc(f, y->label);
      fprintf(f, "</span>: keep it)");
    }
    if (x->r.base.present) {
      fprintf(f, "; the recorded run held ");
      bytes_el(f, "answer-recorded", (int64_t)x->r.base.peak_reserved);
    }
  } else {
    fprintf(f, "<span id=\"answer-pytorch\" data-bytes=\"-1\">No PyTorch setting ran without "
               "an out-of-memory error or a failure.</span>");
  }
  if (z) {
    fprintf(f, "; with expseg (<code id=\"answer-expseg-conf\">");
    esc(f, z->conf);
    fprintf(f, "</code>): ");
    bytes_el(f, "answer-expseg", z->r.peak_reserved);
  }
  fprintf(f, ".</p>\n<p class=\"answer\">Fits on a 24 GB card (<span id=\"card\" "
             "data-bytes=\"%" PRIu64 "\">24 GiB</span>, with the CUDA context not counted): ",
          (uint64_t)CARD_BYTES);
  if (x) fprintf(f, "with PyTorch "), fits(f, "fits-pytorch", x);
  if (x && z) fprintf(f, ", ");
  if (z) fprintf(f, "with expseg "), fits(f, "fits-expseg", z);
  fprintf(f, ". (\"No\" means the allocator held more than that on an unlimited device; "
             "<code>--fit</code> finds the least memory it runs in.)</p>\n");
  char b[32];
  fprintf(f, "<p>");
  esc(f, t->name); /* a file name may hold markup */
  fprintf(f, ": <span id=\"events\" data-value=\"%" PRIu64 "\">%" PRIu64
             "</span> events, peak requested ",
          h->n ? h->rows[0].r.events : 0, h->n ? h->rows[0].r.events : 0);
  bytes_el(f, "peak-requested", h->n ? (int64_t)h->rows[0].r.peak_requested : 0);
  if (h->n && h->rows[0].r.base.present) {
    fprintf(f, "; the recorded allocator held %s",
            _expseg_human(b, (double)h->rows[0].r.base.peak_reserved));
  }
  fprintf(f, ".</p></section>\n");
}

/* The recorded allocator's reserved bytes over the events (the trace's M X m u), one point
 * per change: the line PyTorch itself drew. */
static point_t *recorded_series(const expseg_trace_t *t, size_t n, size_t *out) {
  point_t *p = malloc((n + 2) * sizeof *p);
  size_t k = 0;
  if (!p) return NULL;
  uint64_t res = t->baseline.start_reserved;
  p[k++] = (point_t){0, 0, (int64_t)res};
  for (size_t i = 0; i < n; i++) {
    uint64_t next = _expseg_baseline_reserved(res, &t->events[i]);
    if (next != res) p[k++] = (point_t){i, 0, (int64_t)next};
    res = next;
  }
  p[k++] = (point_t){n ? n - 1 : 0, 0, (int64_t)res};
  *out = k;
  return p;
}

static void over_time(FILE *f, const expseg_report_t *h, const expseg_trace_t *t,
                      const opts_t *o) {
  const row_t *x = best_of(h, "pytorch"), *z = best_of(h, "expseg"), *y = current_of(h);
  const size_t n_ev = o->limit && o->limit < t->n_events ? (size_t)o->limit : t->n_events;
  line_t lines[5];
  size_t n = 0;
  double ymax = 0;
  const row_t *pick[3] = {y, x, z};
  const char *what[3] = {"now", "PyTorch, best", "expseg, best"};
  char names[3][128];
  for (int k = 0; k < 3; k++) {
    if (!pick[k] || (k == 1 && pick[1] == y)) continue;
    snprintf(names[k], sizeof names[k], "%s: %s (reserved)", what[k], pick[k]->label);
    lines[n++] = (line_t){names[k], colours[k], NULL, pick[k], 0, NULL, 0};
    if ((double)pick[k]->r.peak_reserved > ymax) ymax = (double)pick[k]->r.peak_reserved;
  }
  point_t *rec = NULL;
  size_t n_rec = 0;
  if (t->baseline.present && (rec = recorded_series(t, n_ev, &n_rec))) {
    lines[n++] = (line_t){"recorded run (PyTorch's own)", "#555", "6 3", NULL, 0, rec, n_rec};
    for (size_t i = 0; i < n_rec; i++)
      if ((double)rec[i].reserved > ymax) ymax = (double)rec[i].reserved;
  }
  const row_t *any = h->n ? &h->rows[0] : NULL;
  if (any) lines[n++] = (line_t){"live requested", "#999", "2 2", any, 1, NULL, 0};
  fprintf(f, "<section id=\"over-time\"><h2>Memory over time</h2>\n<p>Reserved memory "
             "(what the allocator holds from the device) after each event, for the setting "
             "you have now and the best of each section; live requested bytes below them.</p>\n");
  legend(f, lines, n);
  chart(f, "chart-main", 960, 360, n_ev ? n_ev - 1 : 0, ymax, lines, n, 0);
  free(rec);
  fprintf(f, "<h3>Every setting</h3>\n<div class=\"grid\">\n");
  for (size_t i = 0; i < h->n; i++) {
    const row_t *w = &h->rows[i];
    line_t two[2] = {{"reserved", colours[strcmp(w->section, "pytorch") ? 2 : 1], NULL, w, 0,
                      NULL, 0},
                     {"live requested", "#999", "2 2", w, 1, NULL, 0}};
    char id[48];
    snprintf(id, sizeof id, "chart-%zu", i);
    fprintf(f, "<figure><figcaption>%s #%d ", w->section, w->rank);
    esc(f, w->label);
    fprintf(f, ": peak ");
    bytes_el(f, NULL, w->r.peak_reserved);
    fprintf(f, "</figcaption>\n");
    chart(f, id, 300, 150, n_ev ? n_ev - 1 : 0, (double)w->r.peak_reserved, two, 2, 1);
    fprintf(f, "</figure>\n");
  }
  fprintf(f, "</div></section>\n");
}

static void segments(FILE *f, const row_t *w, const char *id) {
  const segs_t *g = &w->segs;
  uint64_t total = 0, alloc = 0, biggest = 1;
  for (size_t i = 0; i < g->n; i++) {
    total += g->total[i];
    alloc += g->alloc[i];
    if (g->total[i] > biggest) biggest = g->total[i];
  }
  fprintf(f, "<div class=\"segs\" id=\"%s\" data-segments=\"%zu\" data-event=\"%" PRId64
             "\" data-total=\"%" PRIu64 "\" data-allocated=\"%" PRIu64 "\"><h3>%s: ",
          id, g->n, w->segs_event, total, alloc, w->section);
  esc(f, w->label);
  if (w->segs_event < 0) {
    fprintf(f, "</h3>\n<p>No segments to show: no replayed event reserved memory.</p></div>\n");
    return;
  }
  fprintf(f, "</h3>\n<p>After event %" PRId64 ": %zu segments hold ", w->segs_event, g->n);
  bytes_el(f, NULL, (int64_t)total);
  fprintf(f, " (the row's peak reserved: ");
  bytes_el(f, NULL, w->r.peak_reserved);
  fprintf(f, "), of which allocated ");
  bytes_el(f, NULL, (int64_t)alloc);
  fprintf(f, " and free inside segments ");
  bytes_el(f, NULL, (int64_t)(total - alloc));
  fprintf(f, ".%s</p>\n", g->n > MAX_SEGS_DRAWN ? " The largest are drawn." : "");
  /* the largest segments, one bar each: allocated part filled, free part hollow */
  size_t *ord = malloc((g->n ? g->n : 1) * sizeof *ord);
  if (!ord) return;
  for (size_t i = 0; i < g->n; i++) ord[i] = i;
  for (size_t i = 1; i < g->n; i++) /* insertion sort by size, largest first */
    for (size_t j = i; j > 0 && g->total[ord[j]] > g->total[ord[j - 1]]; j--) {
      size_t s = ord[j];
      ord[j] = ord[j - 1];
      ord[j - 1] = s;
    }
  const size_t shown = g->n < MAX_SEGS_DRAWN ? g->n : MAX_SEGS_DRAWN;
  const int W = 960, L = 90, bar = 12;
  fprintf(f, "<svg class=\"segbars\" viewBox=\"0 0 %d %zu\" width=\"%d\" height=\"%zu\">\n", W,
          shown * (bar + 3) + 4, W, shown * (bar + 3) + 4);
  char b[32];
  for (size_t k = 0; k < shown; k++) {
    size_t i = ord[k];
    double wt = (double)(W - L - 10) * (double)g->total[i] / (double)biggest;
    double wa = (double)(W - L - 10) * (double)g->alloc[i] / (double)biggest;
    double y = 2 + (double)k * (bar + 3);
    fprintf(f, "<text x=\"%d\" y=\"%.0f\" class=\"tick\" text-anchor=\"end\">%s</text>"
               "<rect x=\"%d\" y=\"%.0f\" width=\"%.1f\" height=\"%d\" class=\"seg%s\"/>"
               "<rect x=\"%d\" y=\"%.0f\" width=\"%.1f\" height=\"%d\" class=\"used\"/>\n",
            L - 4, y + bar - 2, _expseg_human(b, (double)g->total[i]), L, y, wt, bar,
            g->expandable[i] ? " exp" : "", L, y, wa, bar);
  }
  fprintf(f, "</svg></div>\n");
  free(ord);
}

static void table(FILE *f, const expseg_report_t *h) {
  fprintf(f, "<section id=\"sweep\"><h2>Every setting</h2>\n<p>(a) PyTorch's allocator "
             "(<code>--model pytorch</code>): change <code>PYTORCH_CUDA_ALLOC_CONF</code> "
             "only; (b) expseg (<code>--model expseg</code>): switch allocator. Ranked within "
             "each section as in <code>--sweep</code>; columns and flags: docs/replay.md.</p>\n"
             "<table><thead><tr><th>section</th><th>rank</th><th>setting</th>"
             "<th>peak reserved</th><th>ratio</th><th>device allocs + frees</th>"
             "<th>driver ms</th><th>OOMs</th><th>flags</th><th>setting string</th></tr>"
             "</thead><tbody>\n");
  for (size_t i = 0; i < h->n; i++) {
    const row_t *w = &h->rows[i];
    char b[32];
    fprintf(f, "<tr class=\"%s\" data-section=\"%s\" data-setting=\"", w->section, w->section);
    esc(f, w->label);
    fprintf(f, "\" data-rank=\"%d\"><td>%s</td><td>%d</td><td>", w->rank, w->section, w->rank);
    esc(f, w->label);
    const int64_t af = w->r.num_device_alloc - w->r.warm_alloc + w->r.num_device_free -
                       w->r.warm_free;
    fprintf(f, "</td><td data-field=\"peak_reserved\" data-value=\"%" PRId64 "\">%s</td>"
               "<td data-field=\"ratio\" data-value=\"%.4f\">%.3f</td>"
               "<td data-field=\"window_device_alloc_free\" data-value=\"%" PRId64 "\">%"
               PRId64 "</td><td data-field=\"driver_ms\" data-value=\"%.3f\">%.1f</td>"
               "<td data-field=\"num_ooms\" data-value=\"%" PRIu64 "\">%" PRIu64 "</td>"
               "<td data-field=\"flags\" data-value=\"",
            w->r.peak_reserved,
            w->r.errors ? "FAILED" : _expseg_human(b, (double)w->r.peak_reserved),
            _expseg_ratio(w->r.peak_reserved, w->r.peak_requested),
            as_json(_expseg_ratio(w->r.peak_reserved, w->r.peak_requested), 4), af, af,
            w->r.driver_ms, as_json(w->r.driver_ms, 3), w->r.num_ooms, w->r.num_ooms);
    const char *sep = "";
    for (int k = 0; k < N_FLAGS; k++)
      if (w->flags & (1 << k)) fprintf(f, "%s%s", sep, _expseg_flag_names[k]), sep = ",";
    fprintf(f, "\">");
    sep = "";
    for (int k = 0; k < N_FLAGS; k++)
      if (w->flags & (1 << k)) fprintf(f, "%s%s", sep, _expseg_flag_names[k]), sep = ", ";
    fprintf(f, "</td><td><code>");
    esc(f, w->conf);
    fprintf(f, "</code></td></tr>\n");
  }
  fprintf(f, "</tbody></table></section>\n");
}

static const char *const style =
    "body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1000px;color:#222}"
    "h1{font-size:22px}h2{font-size:18px;margin-top:28px}h3{font-size:15px}"
    "code{font:12px ui-monospace,monospace;background:#f3f3f3;padding:1px 3px}"
    ".answer{font-size:16px}.chart,.segbars{display:block;max-width:100%;height:auto}"
    ".grid{display:grid;grid-template-columns:repeat(3,1fr);gap:8px}"
    "figure{margin:0}figcaption{font-size:12px}"
    ".grid line.grid,svg line.grid{stroke:#e5e5e5}"
    ".tick{font:10px ui-monospace,monospace;fill:#555}"
    ".legend span{margin-right:14px;white-space:nowrap}"
    "rect.seg{fill:#fff;stroke:#1f77b4}rect.seg.exp{stroke:#2ca02c}"
    "rect.used{fill:#1f77b4;opacity:.55}"
    "table{border-collapse:collapse;font-size:12px}td,th{border-bottom:1px solid #ddd;"
    "padding:3px 6px;text-align:right}td:nth-child(3),td:last-child,td:nth-child(9){"
    "text-align:left}tr.expseg td:first-child{color:#2ca02c}"
    "tr.pytorch td:first-child{color:#d62728}footer{margin-top:28px;font-size:12px;color:#666}";

/* Rows in the sweep's order: section (a) then (b), each by rank. */
static int row_order(const void *pa, const void *pb) {
  const row_t *a = pa, *b = pb;
  int sa = strcmp(a->section, "pytorch") != 0, sb = strcmp(b->section, "pytorch") != 0;
  return sa != sb ? sa - sb : a->rank - b->rank;
}

int _expseg_report_write(expseg_report_t *h, const expseg_trace_t *t, const opts_t *o,
                         FILE *err) {
  for (size_t i = 0; i < h->n; i++)
    if (!h->rows[i].section) { /* replayed but never ranked: the sweep stopped */
      fprintf(err, "expseg-replay: --report: the sweep did not rank '%s'\n", h->rows[i].label);
      return 1;
    }
  qsort(h->rows, h->n, sizeof *h->rows, row_order);
  row_t *pick[2] = {(row_t *)best_of(h, "pytorch"), (row_t *)best_of(h, "expseg")};
  for (int k = 0; k < 2; k++)
    if (pick[k] && take_segments(pick[k], t, o, err)) {
      fprintf(err, "expseg-replay: --report: the segments at the peak of '%s' could not be "
                   "taken\n", pick[k]->label);
      return 1;
    }
  FILE *f = h->f;
  fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             "<meta name=\"viewport\" content=\"width=device-width\"><title>expseg-replay: ");
  esc(f, t->name);
  fprintf(f, "</title><style>%s</style></head>\n<body>\n<h1>What each allocator setting holds "
             "on <span id=\"trace\">", style);
  esc(f, t->name);
  fprintf(f, "</span></h1>\n");
  answer(f, h, t);
  over_time(f, h, t, o);
  fprintf(f, "<section id=\"segments\"><h2>Segments at the peak</h2>\n<p>The segments each "
             "recommended setting holds when its reserved memory first peaks, largest first: "
             "filled = allocated, hollow = cached free space (green outline: expandable).</p>\n");
  if (pick[0]) segments(f, pick[0], "segs-pytorch");
  if (pick[1]) segments(f, pick[1], "segs-expseg");
  fprintf(f, "</section>\n");
  table(f, h);
  fprintf(f, "<footer>Written by expseg-replay %s (driver <code>", expseg_version());
  if (h->n) esc(f, h->rows[0].r.driver);
  fprintf(f, "</code>): <code id=\"command\">");
  esc(f, h->command);
  fprintf(f, "</code>. Models and what they leave out: docs/replay.md.</footer>\n"
             "</body></html>\n");
  int bad = ferror(f);
  if (fclose(f) != 0) bad = 1;
  h->f = NULL;
  if (bad) {
    fprintf(err, "expseg-replay: writing --report '%s' failed\n", h->path);
    return 1;
  }
  return 0;
}
