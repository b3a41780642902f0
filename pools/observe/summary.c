/* SPDX-License-Identifier: Apache-2.0 */
/* summary.c: expseg_memory_summary, torch.cuda.memory_summary()'s text from expseg's
 * statistics, followed by expseg's own section; and _expseg_memfig, the figures that
 * section and the out-of-memory message share.
 *
 * PyTorch's layout (torch/cuda/memory.py): lines of 75 characters framed by '|'; the header
 * with the device, OOMs and cudaMalloc retries; one block per metric (Allocated, Active,
 * Requested, GPU reserved, Non-releasable memory; Allocations, Active allocs, GPU reserved
 * segments, Non-releasable allocs) with rows all / large pool / small pool (abbreviated:
 * all only) and columns current / peak / allocated / freed; then the oversize rows. Sizes
 * are stepped B -> KiB -> ... -> PiB (value floor-divided by 1024) while the column's unit
 * reference is >= 768 KiB of the current unit, counts " " -> K -> M (by 1000) while it is
 * >= 750,000; the reference of each column is its `all` row (the oversize rows their own
 * value). expseg's section uses the same frame: mapped, cached physical and reserved
 * address space (current, peak), largest free block, fragmentation, driver calls by kind. */
#include "error.h"
#include "history.h"
#include "internal.h"
#include "units.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

memfig_t _expseg_memfig(const expseg_allocator *a) {
  const stats_t *s = &a->stats;
  memfig_t f = {0};
  f.reserved = (uint64_t)stat_all_current(s->reserved_bytes);
  f.allocated = (uint64_t)stat_all_current(s->allocated_bytes);
  f.active = (uint64_t)stat_all_current(s->active_bytes);
  f.cached = (uint64_t)s->cached_physical_bytes.current;
  f.va = (uint64_t)s->reserved_va_bytes.current;
  uint64_t active = f.active; /* of mapped memory: a sleeping region's blocks have none */
  for (const segment_t *g = a->segments; g; g = g->next_all) {
    size_t mapped = g->mapped_bytes, chunks = 0;
    if (g->asleep) { /* its pages are the layout to restore: what the driver holds now */
      (void)_expseg_seg_held(a, g, &mapped, &chunks);
      for (const block_t *b = g->first; b != NULL; b = b->next)
        if (b->state != BLOCK_FREE) {
          if (active >= b->size) active -= b->size;
          if (b->state == BLOCK_ALLOCATED) f.asleep += b->size;
        }
    }
    f.mapped += mapped;
  }
  f.largest_free = _expseg_largest_free(a);
  if (f.mapped > 0 && f.mapped >= active)
    f.fragmentation = (double)(f.mapped - active) / (double)f.mapped;
  return f;
}

/* ---- output into the caller's buffer (snprintf semantics over the whole text) ---- */

typedef struct out_s {
  char *buf;
  size_t len, n;
} out_t;

static void outf(out_t *o, const char *fmt, ...) EXPSEG_PRINTF(2, 3);
static void outf(out_t *o, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *dst = o->n < o->len ? o->buf + o->n : NULL;
  int k = vsnprintf(dst, dst ? o->len - o->n : 0, fmt, ap);
  va_end(ap);
  if (k > 0) o->n += (size_t)k;
}

static void line(out_t *o, const char *body) { outf(o, "|%s|\n", body); }
static void rule(out_t *o, char c) {
  char b[76];
  memset(b, c, 75);
  b[75] = 0;
  line(o, b);
}

static int64_t floordiv(int64_t x, int64_t d) {
  int64_t q = x / d;
  return (x % d != 0 && (x < 0) != (d < 0)) ? q - 1 : q;
}

/* PyTorch's _format_size / _format_count: v in the unit its column's reference `pref`
 * reaches (base/units.h: the unit steps, v floor-divided by `step`, while pref >= the
 * threshold of the unit reached; a negative pref stays in the first unit). */
typedef struct unit_rule_s {
  int64_t step, threshold;
  int n;
  bool size; /* units B, KiB, ... (padded to 3) or " ", K, M */
  const char *fmt; /* 10 characters with the unit */
} unit_rule_t;

static const char *const count_units[] = {" ", "K", "M"};
static const unit_rule_t size_rule = {1024, 768 * 1024, 6, true, "%6" PRId64 " %-3s"};
static const unit_rule_t count_rule = {1000, 750 * 1000, 3, false, "%7" PRId64 " %s "};

static const char *fmt_unit(char b[32], int64_t v, int64_t pref, const unit_rule_t *r) {
  const int u =
      pref < 0 ? 0 : _expseg_unit_steps((uint64_t)pref, (uint64_t)r->step, (uint64_t)r->threshold, r->n - 1);
  for (int i = 0; i < u; i++) v = floordiv(v, r->step);
  snprintf(b, 32, r->fmt, v, r->size ? _expseg_size_unit(u) : count_units[u]);
  return b;
}

static const char *fmt_size(char b[32], int64_t sz, int64_t pref) {
  return fmt_unit(b, sz, pref, &size_rule);
}
static const char *fmt_count(char b[32], int64_t n, int64_t pref) {
  return fmt_unit(b, n, pref, &count_rule);
}

typedef const char *(*fmt_fn)(char b[32], int64_t v, int64_t pref);

static void row(out_t *o, const char *name, stat_view_t st, stat_view_t pref, fmt_fn f) {
  char c[4][32];
  outf(o, "| %-21s | %s | %s | %s | %s |\n", name, f(c[0], st.current, pref.current),
       f(c[1], st.peak, pref.peak), f(c[2], st.allocated, pref.allocated),
       f(c[3], st.freed, pref.freed));
}

static void pytorch_part(out_t *o, const expseg_allocator *a, bool abbreviated) {
  const stats_t *s = &a->stats;
  static const struct {
    size_t offset;
    const char *name;
    bool size;
  } metrics[] = {
      {offsetof(stats_t, allocated_bytes), "Allocated memory", true},
      {offsetof(stats_t, active_bytes), "Active memory", true},
      {offsetof(stats_t, requested_bytes), "Requested memory", true},
      {offsetof(stats_t, reserved_bytes), "GPU reserved memory", true},
      {offsetof(stats_t, inactive_split_bytes), "Non-releasable memory", true},
      {offsetof(stats_t, allocation), "Allocations", false},
      {offsetof(stats_t, active), "Active allocs", false},
      {offsetof(stats_t, segment), "GPU reserved segments", false},
      {offsetof(stats_t, inactive_split), "Non-releasable allocs", false},
  };
  rule(o, '=');
  outf(o, "| %16s PyTorch CUDA memory summary, device ID %-17d |\n", "", a->device);
  rule(o, '-');
  outf(o, "|  %9s CUDA OOMs: %-12" PRId64 " | %6s cudaMalloc retries: %-8" PRId64 "  |\n", "",
       s->num_ooms, "", s->num_alloc_retries);
  rule(o, '=');
  line(o, "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ");
  for (size_t m = 0; m < sizeof metrics / sizeof metrics[0]; m++) {
    const stat_t *arr = (const stat_t *)((const char *)s + metrics[m].offset);
    fmt_fn f = metrics[m].size ? fmt_size : fmt_count;
    rule(o, '-');
    const stat_view_t all = stat_array_view(arr, STAT_ALL);
    row(o, metrics[m].name, all, all, f);
    if (!abbreviated) {
      row(o, "      from large pool", stat_array_view(arr, STAT_LARGE), all, f);
      row(o, "      from small pool", stat_array_view(arr, STAT_SMALL), all, f);
    }
  }
  rule(o, '-');
  const stat_view_t oa = stat_view(&s->oversize_allocations), os = stat_view(&s->oversize_segments);
  row(o, "Oversize allocations", oa, oa, fmt_count);
  rule(o, '-');
  row(o, "Oversize GPU segments", os, os, fmt_count);
  rule(o, '=');
}

static void cur_peak_row(out_t *o, const char *name, int64_t cur, const int64_t *peak) {
  char c[2][32];
  outf(o, "| %-21s | %s | %10s | %10s | %10s |\n", name, fmt_size(c[0], cur, cur),
       peak ? fmt_size(c[1], *peak, *peak) : "", "", "");
}

static const char *const call_names[] = {
#define EXPSEG_CALL_NAME_(n) #n,
    EXPSEG_VMM_CALLS(EXPSEG_CALL_NAME_)
#undef EXPSEG_CALL_NAME_
};

static void expseg_part(out_t *o, const expseg_allocator *a) {
  const stats_t *s = &a->stats;
  memfig_t f = _expseg_memfig(a);
  static const char title[] = "expseg: mapped memory and driver calls";
  int pad = (75 - (int)(sizeof title - 1)) / 2;
  outf(o, "|%*s%s%*s|\n", pad, "", title, 75 - pad - (int)(sizeof title - 1), "");
  rule(o, '-');
  line(o, "        Metric         | Cur Usage  | Peak Usage |            |            ");
  rule(o, '-');
  cur_peak_row(o, "Mapped memory", (int64_t)f.mapped, NULL);
  cur_peak_row(o, "  of which expandable", s->mapped_bytes.current, &s->mapped_bytes.peak);
  cur_peak_row(o, "Cached physical pages", s->cached_physical_bytes.current,
               &s->cached_physical_bytes.peak);
  cur_peak_row(o, "Reserved addr. space", s->reserved_va_bytes.current,
               &s->reserved_va_bytes.peak);
  cur_peak_row(o, "Largest free block", (int64_t)f.largest_free, NULL);
  outf(o, "| %-21s | %9.2f%% | %10s | %10s | %10s |\n", "Fragmentation",
       100.0 * f.fragmentation, "", "", "");
  rule(o, '-');
  /* driver calls since the last reset_accumulated, wrapped into the frame */
  char text[73 + 1], item[64];
  size_t used = 0;
  snprintf(text, sizeof text, "%s", "Driver calls:");
  used = strlen(text);
  for (int i = 0; i < EXPSEG_VMM_CALL_COUNT; i++) {
    uint64_t n = atomic_load(&a->drv->calls[i]) - s->driver_base[i];
    int k = snprintf(item, sizeof item, " %s %" PRIu64 "%s", call_names[i], n,
                     i + 1 < EXPSEG_VMM_CALL_COUNT ? "," : "");
    if (used + (size_t)k > 73) {
      outf(o, "| %-73s |\n", text);
      used = (size_t)snprintf(text, sizeof text, "  %s", item + 1);
    } else {
      memcpy(text + used, item, (size_t)k + 1);
      used += (size_t)k;
    }
  }
  outf(o, "| %-73s |\n", text);
  rule(o, '=');
}

size_t expseg_memory_summary(expseg_allocator *a, char *buf, size_t len, bool abbreviated) {
  if (a == NULL) {
    if (buf != NULL && len > 0) buf[0] = '\0';
    return 0;
  }
  out_t o = {len > 0 ? buf : NULL, buf != NULL ? len : 0, 0};
  if (o.buf != NULL) o.buf[0] = '\0';
  api_lock(a);
  pytorch_part(&o, a, abbreviated);
  expseg_part(&o, a);
  api_unlock(a);
  return o.n + 1;
}
