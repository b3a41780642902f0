/* SPDX-License-Identifier: Apache-2.0 */
/* synth_cost.c: priced driver work for the replay tool (--costs FILE).
 *
 * Every driver call a replay (or the recorded run) made is priced from one table: a cost
 * per call and a cost per unit the call covers (a 2 MiB page; a handle for map, unmap and
 * set_access), in microseconds. The defaults were measured on an NVIDIA H200 by
 * bench/gpu-check (docs/replay.md, "Costs", which also lists the published A100 figures
 * used before); --costs FILE replaces any of them with a machine's own.
 * File grammar (docs/replay.md): one "KIND[.page] MICROSECONDS" per line, '#' comments. The
 * file name starts with "synth" for the library glob. */
#include "synth_model.h"
#include "trace_internal.h"


#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const _expseg_cost_names[EXPSEG_COST_N] = {
    "reserve", "create", "release", "map", "unmap", "set_access", "cudaMalloc", "cudaFree"};

void _expseg_costs_default(expseg_costs_t *c) {
  /* Measured on an NVIDIA H200 (driver 580.159.04) by bench/gpu-check: per call the
   * intercept, per 2 MiB page the slope of the medians (docs/replay.md, "Costs") */
  static const double call[EXPSEG_COST_N] = {0.93, 4.98, 0.0, 0.59, 14.25, 37.01, 46.91, 30.08};
  static const double page[EXPSEG_COST_N] = {0.005, 0.105, 1.061, 0.002, 0.033, 21.66, 0.160, 1.103};
  memset(c, 0, sizeof *c);
  for (int k = 0; k < EXPSEG_COST_N; k++) {
    c->call_us[k] = call[k];
    c->page_us[k] = page[k];
  }
}

expseg_status _expseg_costs_parse(const char *name, const char *buf, size_t len,
                                  expseg_costs_t *c) {
  _expseg_costs_default(c);
  unsigned ln = 0;
  size_t start = len >= 3 && !memcmp(buf, "\xef\xbb\xbf", 3) ? 3 : 0; /* an editor's BOM */
  for (size_t at = start; at < len;) {
    const char *nl = memchr(buf + at, '\n', len - at);
    size_t n = nl ? (size_t)(nl - (buf + at)) : len - at;
    char line[256];
    ln++;
    if (n >= sizeof line)
      return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT,
                               "--costs '%s' line %u: longer than %zu bytes", name, ln,
                               sizeof line - 1);
    memcpy(line, buf + at, n);
    line[n] = 0;
    at += n + (nl ? 1 : 0);
    if (memchr(line, 0, n))
      return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT,
                               "--costs '%s' line %u: a NUL byte (not a text file?)", name, ln);
    char key[64], extra[8];
    double v;
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    int got = sscanf(line, "%63s %lf %7s", key, &v, extra);
    if (got <= 0) continue; /* blank or comment */
    if (got != 2 || !(v >= 0.0) || v > 1e9) {
      const char *text = line + strspn(line, " \t");
      size_t end = strlen(text);
      while (end > 0 && strchr(" \t\r", text[end - 1])) end--;
      return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT,
                               "--costs '%s' line %u: '%.*s': expected 'KIND[.page] "
                               "MICROSECONDS' with a number from 0 to 1e9",
                               name, ln, (int)(end < 80 ? end : 80), text);
    }
    char *dot = strchr(key, '.');
    int page = 0;
    if (dot) {
      if (strcmp(dot, ".page"))
        return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT,
                                 "--costs '%s' line %u: unknown suffix '%s' (accepted: .page)",
                                 name, ln, dot);
      *dot = 0;
      page = 1;
    }
    int k = 0;
    while (k < EXPSEG_COST_N && strcmp(key, _expseg_cost_names[k])) k++;
    if (k == EXPSEG_COST_N)
      return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT,
                               "--costs '%s' line %u: unknown call '%s' (accepted: reserve, "
                               "create, release, map, unmap, set_access, cudaMalloc, cudaFree)",
                               name, ln, key);
    (page ? c->page_us : c->call_us)[k] = v;
  }
  return EXPSEG_OK;
}

expseg_status _expseg_costs_read(const char *path, expseg_costs_t *c) {
  _expseg_costs_default(c);
  FILE *f = fopen(path, "r");
  if (!f)
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "--costs '%s': %s", path,
                             strerror(errno));
  char buf[65536];
  size_t n = fread(buf, 1, sizeof buf, f);
  int big = n == sizeof buf && fgetc(f) != EOF;
  const int failed = ferror(f), why = errno; /* a directory opens, then reads EISDIR */
  fclose(f);
  if (failed)
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "--costs '%s': cannot read it: %s",
                             path, strerror(why));
  if (big)
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT,
                             "--costs '%s': larger than %zu bytes (a cost table is a few lines)",
                             path, sizeof buf);
  return _expseg_costs_parse(path, buf, n, c);
}

double _expseg_costs_ms(const expseg_costs_t *c, const expseg_calls_t *n) {
  double us = 0.0;
  for (int k = 0; k < EXPSEG_COST_N; k++)
    us += (double)n->calls[k] * c->call_us[k] + (double)n->pages[k] * c->page_us[k];
  return us / 1000.0;
}

/* PyTorch's expandable pages: 20 MiB in the large pool, 2 MiB in the small one; a map of a
 * multiple of 20 MiB is taken as large-pool pages. */
static uint64_t pt_page(uint64_t size) {
  const uint64_t large = UINT64_C(20) << 20;
  return size >= large && size % large == 0 ? large : UINT64_C(2) << 20;
}

void _expseg_recorded_calls(const expseg_trace_t *t, size_t n, expseg_calls_t *out) {
  memset(out, 0, sizeof *out);
  const uint64_t two = UINT64_C(2) << 20;
  if (n > t->n_events) n = t->n_events;
  for (size_t i = 0; i < n; i++) {
    const expseg_trace_event_t *e = &t->events[i];
    uint64_t pg = pt_page(e->size), pages = (e->size + pg - 1) / pg;
    uint64_t p2 = (e->size + two - 1) / two;
    switch (e->kind) {
    case EXPSEG_TR_SEG_ALLOC:
      out->calls[EXPSEG_COST_CUDA_MALLOC]++;
      out->pages[EXPSEG_COST_CUDA_MALLOC] += p2;
      break;
    case EXPSEG_TR_SEG_FREE:
      out->calls[EXPSEG_COST_CUDA_FREE]++;
      out->pages[EXPSEG_COST_CUDA_FREE] += p2;
      break;
    case EXPSEG_TR_MAP: /* per page (a handle): create and map; one set_access over the
                         * range, priced per handle; creates per 2 MiB of bytes */
      out->calls[EXPSEG_COST_CREATE] += pages;
      out->calls[EXPSEG_COST_MAP] += pages;
      out->calls[EXPSEG_COST_SET_ACCESS]++;
      out->pages[EXPSEG_COST_CREATE] += p2;
      out->pages[EXPSEG_COST_MAP] += pages;
      out->pages[EXPSEG_COST_SET_ACCESS] += pages;
      break;
    case EXPSEG_TR_UNMAP: /* per page: unmap (per handle) and release (per 2 MiB) */
      out->calls[EXPSEG_COST_UNMAP] += pages;
      out->calls[EXPSEG_COST_RELEASE] += pages;
      out->pages[EXPSEG_COST_UNMAP] += pages;
      out->pages[EXPSEG_COST_RELEASE] += p2;
      break;
    default: break;
    }
  }
}
