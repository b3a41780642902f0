/* SPDX-License-Identifier: Apache-2.0 */
/* stats.c: statistics storage rules and the key table. The stats struct and every key are
 * generated from stats.def; this file builds the sorted key list once, answers lookups by
 * key (binary search) and visits in sorted order. The update rules (PyTorch's Stat
 * increase/decrease) are inline in internal.h, where the storage is described: per pool,
 * `all` and `freed` derived here on read (stat_array_view, stat_view); the resets below
 * keep PyTorch's semantics exact on that storage (docs/stats.md). */
#include "internal.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* peak = current; for an array's `all` entry, the derived current. */
static void reset_peak(stat_t *s) { s->peak = s->current; }
static void reset_peak_array(stat_t arr[3]) {
  reset_peak(&arr[STAT_SMALL]);
  reset_peak(&arr[STAT_LARGE]);
  arr[STAT_ALL].peak = stat_all_current(arr);
}
/* allocated = freed = 0: freed = allocated + base - current, so base = current. For an
 * array's `all` entry (current 0) the corrections go to 0, which zeroes the derived sums. */
static void reset_accum(stat_t *s) {
  s->allocated = 0;
  s->base = s->current;
}

void _expseg_stat_array_reset(stat_t arr[3], bool peak) {
  if (peak) reset_peak_array(arr);
  else
    for (int i = 0; i < 3; i++) reset_accum(&arr[i]);
}

void _expseg_stats_reset_peak(stats_t *s) {
#define EXPSEG_STAT_ARRAY(n) reset_peak_array(s->n);
#define EXPSEG_STAT_SINGLE(n) reset_peak(&s->n);
#define EXPSEG_STAT_GAUGE(n) reset_peak(&s->n);
#include "stats.def"
}

void _expseg_stats_reset_accumulated(stats_t *s, const expseg_vmm_t *drv) {
#define EXPSEG_STAT_ARRAY(n) for (int i = 0; i < 3; i++) reset_accum(&s->n[i]);
#define EXPSEG_STAT_SINGLE(n) reset_accum(&s->n);
#define EXPSEG_STAT_COUNTER(n) s->n = 0;
#define EXPSEG_STAT_ACCUM(n) s->n = 0;
#include "stats.def"
  for (int i = 0; i < EXPSEG_VMM_CALL_COUNT; i++)
    s->driver_base[i] = atomic_load(&drv->calls[i]);
}

/* ---- the key table ---- */

enum { K_STAT, K_POOL, K_INT, K_DRIVER, K_LARGEST };

typedef struct key_s {
  char name[128];
  uint8_t kind;
  uint8_t pool;    /* K_POOL: STAT_ALL, STAT_SMALL or STAT_LARGE */
  uint16_t index;  /* K_STAT, K_POOL: metric 0..3; K_DRIVER: call */
  size_t offset;   /* into stats_t; K_POOL: of the array */
} key_t_;

#define MAX_KEYS 256
static key_t_ keys[MAX_KEYS];
static size_t n_keys;
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static const char *const metric_names[4] = {"current", "peak", "allocated", "freed"};
static const char *const pool_names[3] = {"all", "small_pool", "large_pool"};

static void add_key(const char *name, uint8_t kind, uint16_t index, size_t offset) {
  if (n_keys >= MAX_KEYS) abort(); /* stats.def grew past MAX_KEYS: raise it */
  key_t_ *k = &keys[n_keys++];
  snprintf(k->name, sizeof k->name, "%s", name);
  k->kind = kind;
  k->pool = 0;
  k->index = index;
  k->offset = offset;
}

static void add_stat(const char *prefix, size_t offset, int metrics, int pool) {
  char name[128];
  for (int m = 0; m < metrics; m++) {
    snprintf(name, sizeof name, "%s.%s", prefix, metric_names[m]);
    add_key(name, pool < 0 ? K_STAT : K_POOL, (uint16_t)m, offset);
    if (pool >= 0) keys[n_keys - 1].pool = (uint8_t)pool;
  }
}

static int key_cmp(const void *x, const void *y) {
  return strcmp(((const key_t_ *)x)->name, ((const key_t_ *)y)->name);
}

static void build_keys(void) {
  char name[96];
#define EXPSEG_STAT_ARRAY(n)                                                          \
  for (int p = 0; p < 3; p++) {                                                       \
    snprintf(name, sizeof name, "%s.%s", #n, pool_names[p]);                          \
    add_stat(name, offsetof(stats_t, n), 4, p);                                       \
  }
#define EXPSEG_STAT_SINGLE(n) add_stat(#n, offsetof(stats_t, n), 4, -1);
#define EXPSEG_STAT_COUNTER(n) add_key(#n, K_INT, 0, offsetof(stats_t, n));
#define EXPSEG_STAT_VALUE(n) add_key(#n, K_INT, 0, offsetof(stats_t, n));
#define EXPSEG_STAT_GAUGE(n) add_stat("expseg." #n, offsetof(stats_t, n), 2, -1);
#define EXPSEG_STAT_ACCUM(n) add_key("expseg." #n, K_INT, 0, offsetof(stats_t, n));
#include "stats.def"
  for (int c = 0; c < EXPSEG_VMM_CALL_COUNT; c++) {
    snprintf(name, sizeof name, "expseg.driver.%s", _expseg_vmm_call_name((expseg_vmm_call)c));
    add_key(name, K_DRIVER, (uint16_t)c, 0);
  }
  add_key("expseg.largest_free_block", K_LARGEST, 0, 0);
  qsort(keys, n_keys, sizeof keys[0], key_cmp);
}

static void ensure_keys(void) { pthread_once(&keys_once, build_keys); }

size_t _expseg_stats_key_count(void) {
  ensure_keys();
  return n_keys;
}

const char *_expseg_stats_key(size_t i) {
  ensure_keys();
  return i < n_keys ? keys[i].name : NULL;
}

static int64_t key_value(const expseg_allocator *a, const key_t_ *k) {
  const char *base = (const char *)&a->stats + k->offset;
  switch (k->kind) {
  case K_STAT: return stat_metric(stat_view((const stat_t *)(const void *)base), k->index);
  case K_POOL:
    return stat_metric(stat_array_view((const stat_t *)(const void *)base, k->pool), k->index);
  case K_INT: return *(const int64_t *)base;
  case K_DRIVER:
    return (int64_t)(atomic_load(&a->drv->calls[k->index]) - a->stats.driver_base[k->index]);
  default: return (int64_t)_expseg_largest_free(a);
  }
}

bool _expseg_stats_get(const expseg_allocator *a, const char *key, int64_t *v) {
  ensure_keys();
  size_t lo = 0, hi = n_keys;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(keys[mid].name, key);
    if (c == 0) {
      *v = key_value(a, &keys[mid]);
      return true;
    }
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return _expseg_ppool_stat_get(a, key, v);
}

void _expseg_stats_visit(const expseg_allocator *a,
                         void (*fn)(void *ctx, const char *key, int64_t value), void *ctx) {
  ensure_keys();
  /* the private pools' family goes where its prefix sorts (no fixed key starts with it) */
  bool family = false;
  for (size_t i = 0; i < n_keys; i++) {
    if (!family && strcmp(keys[i].name, EXPSEG_PPOOL_FAMILY ".") > 0) {
      _expseg_ppool_stats_visit(a, fn, ctx);
      family = true;
    }
    fn(ctx, keys[i].name, key_value(a, &keys[i]));
  }
  if (!family) _expseg_ppool_stats_visit(a, fn, ctx);
}
