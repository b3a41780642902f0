/* SPDX-License-Identifier: Apache-2.0 */
/* host_pool_stats.c: the host pool's statistics keys. The torch.cuda.host_memory_stats()
 * keys keep PyTorch's names (allocation, allocated_bytes, segment, reserved_bytes with
 * .current/.peak/.allocated/.freed; num_host_alloc, num_host_free; host_alloc_time and
 * host_free_time with .total/.max/.min/.count/.avg in microseconds); expseg's own keys
 * carry the "expseg." prefix. The sorted key table is built once from host_pool.h's
 * EXPSEG_HOST_STATS list; expseg_host_stat, _stats_foreach and _reset_peak_stats read it
 * under the pool's lock. */
#include "error.h"
#include "host_pool.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HK_STAT, HK_I64, HK_DUR };

typedef struct {
  char name[64];
  uint8_t kind, sub;
  size_t off;
} hkey_t;

#define HK_MAX 128
static hkey_t keys[HK_MAX];
static size_t n_keys;
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static const char *const torch_keys[] = {"allocation", "allocated_bytes", "segment",
                                         "reserved_bytes", "num_host_alloc", "num_host_free",
                                         "host_alloc_time", "host_free_time"};
static const char *const stat_sub[4] = {"current", "peak", "allocated", "freed"};
static const char *const dur_sub[5] = {"total", "max", "min", "count", "avg"};

static void add(const char *base, const char *sub, uint8_t kind, uint8_t idx, size_t off) {
  if (n_keys >= HK_MAX) abort(); /* EXPSEG_HOST_STATS grew past HK_MAX: raise it */
  bool torch = false;
  for (size_t i = 0; i < sizeof torch_keys / sizeof *torch_keys; i++)
    torch |= strcmp(base, torch_keys[i]) == 0;
  hkey_t *k = &keys[n_keys++];
  snprintf(k->name, sizeof k->name, "%s%s%s%s", torch ? "" : "expseg.", base, sub ? "." : "",
           sub ? sub : "");
  k->kind = kind;
  k->sub = idx;
  k->off = off;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const hkey_t *)a)->name, ((const hkey_t *)b)->name);
}

static void build(void) {
#define HK_STAT_(n) for (uint8_t i = 0; i < 4; i++) add(#n, stat_sub[i], HK_STAT, i, offsetof(host_stats_t, n));
#define HK_I64_(n) add(#n, NULL, HK_I64, 0, offsetof(host_stats_t, n));
#define HK_DUR_(n) for (uint8_t i = 0; i < 5; i++) add(#n, dur_sub[i], HK_DUR, i, offsetof(host_stats_t, n));
  EXPSEG_HOST_STATS(HK_STAT_, HK_I64_, HK_DUR_)
#undef HK_STAT_
#undef HK_I64_
#undef HK_DUR_
  qsort(keys, n_keys, sizeof *keys, by_name);
}

static int64_t value_of(const host_stats_t *s, const hkey_t *k) {
  const char *base = (const char *)s + k->off;
  if (k->kind == HK_I64) return *(const int64_t *)(const void *)base;
  if (k->kind == HK_STAT) {
    return stat_metric(stat_view((const stat_t *)(const void *)base), k->sub);
  }
  const dur_t *d = (const dur_t *)(const void *)base;
  const int64_t v[5] = {d->total, d->max, d->count ? d->min : 0, d->count,
                        d->count ? d->total / d->count : 0};
  return v[k->sub];
}

static bool stats_get(const host_stats_t *s, const char *key, int64_t *v) {
  pthread_once(&keys_once, build);
  hkey_t probe;
  snprintf(probe.name, sizeof probe.name, "%s", key);
  if (strlen(key) >= sizeof probe.name) return false;
  const hkey_t *k = bsearch(&probe, keys, n_keys, sizeof *keys, by_name);
  if (!k) return false;
  *v = value_of(s, k);
  return true;
}

static void stats_visit(const host_stats_t *s,
                              void (*fn)(void *ctx, const char *key, int64_t value), void *ctx) {
  pthread_once(&keys_once, build);
  for (size_t i = 0; i < n_keys; i++) fn(ctx, keys[i].name, value_of(s, &keys[i]));
}

static void stats_reset_peak(host_stats_t *s) {
#define HK_STAT_(n) s->n.peak = s->n.current;
#define HK_NONE_(n)
  EXPSEG_HOST_STATS(HK_STAT_, HK_NONE_, HK_NONE_)
#undef HK_STAT_
#undef HK_NONE_
}

void _expseg_dur_add(dur_t *d, int64_t us) {
  d->total += us;
  if (us > d->max) d->max = us;
  if (d->count == 0 || us < d->min) d->min = us;
  d->count++;
}

/* ---- the public statistics calls ---- */

expseg_status expseg_host_stat(const expseg_host_pool *h, const char *key, int64_t *value) {
  if (!h) return _expseg_host_no_pool("expseg_host_stat");
  if (!key || !value)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_host_stat: NULL key or value");
  expseg_host_pool *m = (expseg_host_pool *)h; /* the lock only */
  pthread_mutex_lock(&m->lock);
  bool ok = stats_get(&h->st, key, value);
  pthread_mutex_unlock(&m->lock);
  if (!ok)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_host_stat: unknown key '%.80s' (keys: docs/host_pool.md, "
                             "or expseg_host_stats_foreach)", key);
  return EXPSEG_OK;
}

void expseg_host_stats_foreach(const expseg_host_pool *h,
                               void (*fn)(void *ctx, const char *key, int64_t value), void *ctx) {
  if (!h || !fn) return;
  expseg_host_pool *m = (expseg_host_pool *)h;
  pthread_mutex_lock(&m->lock);
  host_stats_t copy = h->st; /* fn runs without the lock */
  pthread_mutex_unlock(&m->lock);
  stats_visit(&copy, fn, ctx);
}

void expseg_host_reset_peak_stats(expseg_host_pool *h) {
  if (!h) return;
  _expseg_host_lock(h);
  stats_reset_peak(&h->st);
  _expseg_host_unlock(h);
}
