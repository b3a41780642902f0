/* SPDX-License-Identifier: Apache-2.0 */
/* ppool.c: private memory pools (PyTorch's MemPool and CUDA-graph pools).
 *
 * A private pool is a slot of a->ppools (its tag, 1 and up) holding its id, use count,
 * count of busy blocks and reserved-bytes statistic. Its segments are ordinary segments
 * whose stream field is the stream key skey_make(stream, tag) (internal.h): every index
 * (free, unmapped, single-chunk) is keyed by that field, so a pool's free blocks are found
 * only by requests routed to that pool, and no other lookup can meet them. Requests are
 * routed by the begun pools (a->routes, newest first, each with its stream filter) or by
 * expseg_malloc_pool. Memory moves between pools only as unmapped chunks through the page
 * cache: growth of any pool may take the general cache's idle pages, never another live
 * pool's; trimming (garbage collection, empty_cache, the out-of-memory path) leaves a live
 * private pool's memory alone (docs/design.md, "Private pools").
 *
 * A released pool (use count 0) has an unknown id at once; its slot stays until every block
 * is free, no allocation into it is under way (inflight: a malloc may drop the lock) and its
 * memory is back (_expseg_ppool_reap), so statistics and pool_of still see it while it
 * drains. A try that leaves memory behind backs off (docs/design.md, "Retries"). Slots are
 * reused, ids never. A live id is found by a hash map (a->ppool_ids), a free slot on a stack,
 * and a drain visits only the released pools (a->ppool_drain): no pool call walks the table. */
#include "internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TAGS 65535u /* tags live in the 16 bits above EXPSEG_KEY_SHIFT */

/* The tag of a live pool (use count >= 1), or 0: one lookup in a->ppool_ids. */
static uint32_t live_tag(const expseg_allocator *a, expseg_pool_id id) {
  if (id == 0) return 0;
  const uint64_t *v = _expseg_map_get(&a->ppool_ids, id);
  if (v == NULL) return 0;
  expseg_assert(*v < a->n_ppools && a->ppools[*v].id == id && a->ppools[*v].use_count > 0);
  return (uint32_t)*v;
}

/* Room for one more slot: the table and both stacks grow together (doubling), so a push on
 * a stack never fails. false: no host memory, nothing changed. */
static bool grow_slots(expseg_allocator *a) {
  if (a->n_ppools < a->cap_ppools) return true;
  size_t cap = a->cap_ppools ? 2 * a->cap_ppools : 8;
  if (cap > MAX_TAGS + 1) cap = MAX_TAGS + 1;
  ppool_t *p = realloc(a->ppools, cap * sizeof *p);
  if (p == NULL) return false;
  a->ppools = p;
  uint32_t *f = realloc(a->ppool_free, cap * sizeof *f);
  if (f == NULL) return false;
  a->ppool_free = f;
  uint32_t *d = realloc(a->ppool_drain, cap * sizeof *d);
  if (d == NULL) return false;
  a->ppool_drain = d;
  a->cap_ppools = cap;
  return true;
}

static expseg_status unknown_pool(const char *fn, expseg_pool_id id) {
  return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "%s: pool %" PRIu64 " is not a live private pool; accepted: an id "
                           "expseg_pool_create returned whose use count is at least 1",
                           fn, id);
}

expseg_status expseg_pool_create(expseg_allocator *a, expseg_pool_id *out) {
  if (out == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_pool_create: out is NULL");
  *out = 0;
  if (a == NULL) return _expseg_null_allocator("expseg_pool_create");
  api_lock(a);
  expseg_status st = EXPSEG_OK;
  const size_t t = a->n_ppool_free > 0 ? a->ppool_free[a->n_ppool_free - 1]
                   : a->n_ppools > 0   ? a->n_ppools
                                       : 1;
  if (t > MAX_TAGS) {
    st = _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                           "expseg_pool_create: %u private pools exist or still drain, the most "
                           "at once (not a lack of memory); release some first "
                           "(expseg_pool_release) and free their blocks",
                           MAX_TAGS);
  } else if (a->n_ppool_free == 0) { /* a new slot (slot 0, the general cache, with the first) */
    if (a->n_ppools == 0 && grow_slots(a)) a->ppools[0] = (ppool_t){0}, a->n_ppools = 1;
    if (a->n_ppools == 0 || !grow_slots(a))
      st = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_pool_create: out of host memory");
  }
  const expseg_pool_id id = a->next_pool_id + 1;
  if (st == EXPSEG_OK && !_expseg_map_put(&a->ppool_ids, id, t))
    st = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_pool_create: out of host memory");
  if (st == EXPSEG_OK) {
    if (a->n_ppool_free > 0) a->n_ppool_free--;
    else a->n_ppools = t + 1;
    a->next_pool_id = id;
    a->ppools[t] = (ppool_t){.id = id, .use_count = 1};
    *out = id;
  }
  api_unlock(a);
  return st;
}

expseg_status expseg_pool_retain(expseg_allocator *a, expseg_pool_id pool) {
  if (a == NULL) return _expseg_null_allocator("expseg_pool_retain");
  api_lock(a);
  uint32_t t = live_tag(a, pool);
  expseg_status st = EXPSEG_OK;
  if (t == 0) st = unknown_pool("expseg_pool_retain", pool);
  else if (a->ppools[t].use_count == INT32_MAX)
    st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "expseg_pool_retain: pool %" PRIu64 " has use count %d already",
                           pool, a->ppools[t].use_count);
  else a->ppools[t].use_count++;
  api_unlock(a);
  return st;
}

expseg_status expseg_pool_use_count(const expseg_allocator *a, expseg_pool_id pool, int *out) {
  if (a == NULL) return _expseg_null_allocator("expseg_pool_use_count");
  if (out == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_pool_use_count: out is NULL");
  expseg_allocator *m = (expseg_allocator *)a;
  api_lock(m);
  uint32_t t = live_tag(a, pool);
  expseg_status st = EXPSEG_OK;
  if (t == 0) st = unknown_pool("expseg_pool_use_count", pool);
  else *out = a->ppools[t].use_count;
  api_unlock(m);
  return st;
}

expseg_status expseg_pool_begin(expseg_allocator *a, expseg_pool_id pool,
                                bool (*filter)(void *ctx, expseg_stream stream), void *ctx) {
  if (a == NULL) return _expseg_null_allocator("expseg_pool_begin");
  api_lock(a);
  uint32_t t = live_tag(a, pool);
  expseg_status st = EXPSEG_OK;
  if (t == 0) {
    st = unknown_pool("expseg_pool_begin", pool);
  } else if (a->n_routes == a->cap_routes) {
    size_t cap = a->cap_routes ? 2 * a->cap_routes : 4;
    route_t *r = realloc(a->routes, cap * sizeof *r);
    if (r == NULL) st = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "expseg_pool_begin: out of host memory");
    else a->routes = r, a->cap_routes = cap;
  }
  if (st == EXPSEG_OK) a->routes[a->n_routes++] = (route_t){pool, t, filter, ctx};
  api_unlock(a);
  return st;
}

expseg_status expseg_pool_end(expseg_allocator *a, expseg_pool_id pool) {
  if (a == NULL) return _expseg_null_allocator("expseg_pool_end");
  api_lock(a);
  size_t i = a->n_routes;
  while (i > 0 && a->routes[i - 1].id != pool) i--;
  expseg_status st = EXPSEG_OK;
  if (i == 0) {
    st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "expseg_pool_end: pool %" PRIu64 " is not begun (%zu begun now); "
                           "accepted: a pool passed to expseg_pool_begin and not ended since",
                           pool, a->n_routes);
  } else {
    memmove(&a->routes[i - 1], &a->routes[i], (a->n_routes - i) * sizeof *a->routes);
    a->n_routes--;
  }
  api_unlock(a);
  return st;
}

expseg_status expseg_pool_release(expseg_allocator *a, expseg_pool_id pool) {
  if (a == NULL) return _expseg_null_allocator("expseg_pool_release");
  api_lock(a);
  uint32_t t = live_tag(a, pool);
  expseg_status st = EXPSEG_OK;
  bool begun = false;
  for (size_t i = 0; i < a->n_routes; i++) begun = begun || a->routes[i].tag == t;
  if (t == 0) {
    st = unknown_pool("expseg_pool_release", pool);
  } else if (a->ppools[t].use_count == 1 && _expseg_sleep_region_name(a, t) != NULL) {
    st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "expseg_pool_release: pool %" PRIu64 " is the pool of region \"%s\", "
                           "which lives as long as its allocator; accepted: a release for each "
                           "expseg_pool_retain of it",
                           pool, _expseg_sleep_region_name(a, t));
  } else if (a->ppools[t].use_count == 1 && begun) {
    st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "expseg_pool_release: pool %" PRIu64 " would reach use count 0 while "
                           "allocations are still routed to it; call expseg_pool_end first",
                           pool);
  } else if (--a->ppools[t].use_count == 0) {
    (void)_expseg_map_take(&a->ppool_ids, pool, NULL); /* the id is unknown from now on */
    a->ppool_drain[a->n_ppool_drain++] = t;
    a->reap = true;
    a->reap_skip = 0; /* tried now, whatever an earlier try left */
    if (a->n_pending_events > 0 || a->n_orphans > 0) _expseg_process_events(a);
    _expseg_ppool_reap(a, false);
  }
  api_unlock(a);
  return st;
}

expseg_status expseg_pool_empty_cache(expseg_allocator *a, expseg_pool_id pool) {
  if (a == NULL) return _expseg_null_allocator("expseg_pool_empty_cache");
  api_lock(a);
  uint32_t t = live_tag(a, pool);
  expseg_status st = EXPSEG_OK;
  if (t == 0) {
    st = unknown_pool("expseg_pool_empty_cache", pool);
  } else {
    _expseg_sync_all_events(a);
    (void)_expseg_release_pool_memory(a, t, true);
  }
  api_unlock(a);
  return st;
}

expseg_status expseg_pool_of(const expseg_allocator *a, const void *ptr, expseg_pool_id *out) {
  if (a == NULL) return _expseg_null_allocator("expseg_pool_of");
  if (out == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_pool_of: out is NULL");
  expseg_allocator *m = (expseg_allocator *)a;
  api_lock(m);
  block_t *b = _expseg_ptrmap_get(&a->live, (uintptr_t)ptr);
  expseg_status st = EXPSEG_OK;
  if (b == NULL)
    st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "expseg_pool_of(%p): not a live pointer of this allocator (accepted: "
                           "a pointer expseg_malloc handed out and not yet freed)",
                           ptr);
  else *out = a->ppools == NULL ? 0 : a->ppools[seg_tag(b->seg)].id;
  api_unlock(m);
  return st;
}

/* ---- inside the allocator (lock held) ---- */

expseg_stream _expseg_ppool_route(const expseg_allocator *a, expseg_stream stream) {
  for (size_t i = a->n_routes; i > 0; i--) {
    const route_t *r = &a->routes[i - 1];
    if (r->filter == NULL || r->filter(r->ctx, stream)) return skey_make(stream, r->tag);
  }
  return stream;
}

expseg_pool_id _expseg_ppool_id(const expseg_allocator *a, uint32_t tag) {
  return tag == 0 ? 0 : a->ppools[tag].id;
}

uint32_t _expseg_ppool_live_tag(const expseg_allocator *a, expseg_pool_id id) {
  return live_tag(a, id);
}

/* A released pool's last block or last allocation under way is done: it may drain now. */
static void may_drain(expseg_allocator *a, const ppool_t *p) {
  if (p->use_count == 0 && p->busy == 0 && p->inflight == 0) {
    a->reap = true;
    a->reap_skip = 0;
  }
}

void _expseg_ppool_busy(expseg_allocator *a, uint32_t tag, bool up) {
  ppool_t *p = &a->ppools[tag];
  if (up) {
    p->busy++;
    return;
  }
  expseg_assert(p->busy > 0);
  p->busy--;
  may_drain(a, p);
}

void _expseg_ppool_inflight(expseg_allocator *a, uint32_t tag, bool up) {
  ppool_t *p = &a->ppools[tag];
  if (up) {
    p->inflight++;
    return;
  }
  expseg_assert(p->inflight > 0);
  p->inflight--;
  may_drain(a, p);
}

#define REAP_BACKOFF_MAX 1024u /* non-blocking tries skipped at most between two tries */

void _expseg_ppool_reap(expseg_allocator *a, bool blocking) {
  if (!blocking && a->reap_skip > 0) { /* a.reap stays set */
    a->reap_skip--;
    return;
  }
  a->reap = false;
  bool left = false;
  for (size_t i = a->n_ppool_drain; i-- > 0;) { /* only released pools: a->ppool_drain */
    const uint32_t t = a->ppool_drain[i];
    ppool_t *p = &a->ppools[t];
    expseg_assert(p->id != 0 && p->use_count == 0);
    /* a pool with blocks or allocations is not tried: the end of the last sets a->reap */
    if (p->busy > 0 || p->inflight > 0) continue;
    if (_expseg_release_pool_memory(a, t, blocking)) {
      expseg_assert(p->reserved[STAT_SMALL].current == 0 && p->reserved[STAT_LARGE].current == 0);
      *p = (ppool_t){0};
      a->ppool_drain[i] = a->ppool_drain[--a->n_ppool_drain];
      a->ppool_free[a->n_ppool_free++] = t;
    } else {
      left = true; /* a stream still busy (non-blocking), or memory the driver kept */
    }
  }
  if (left) { /* tried again later: each try walks every segment and asks the streams */
    a->reap = true;
    a->reap_backoff = a->reap_backoff == 0 ? 1
                      : a->reap_backoff < REAP_BACKOFF_MAX ? 2 * a->reap_backoff
                                                           : REAP_BACKOFF_MAX;
    a->reap_skip = a->reap_backoff;
  } else {
    a->reap_backoff = a->reap_skip = 0;
  }
}

void _expseg_ppool_destroy(expseg_allocator *a) {
  free(a->ppools);
  free(a->routes);
  free(a->ppool_free);
  free(a->ppool_drain);
  _expseg_map_free(&a->ppool_ids);
  a->ppools = NULL;
  a->routes = NULL;
  a->ppool_free = a->ppool_drain = NULL;
  a->n_ppools = a->n_routes = a->cap_routes = a->cap_ppools = 0;
  a->n_ppool_free = a->n_ppool_drain = 0;
}

/* ---- statistics: reserved_bytes_by_private_pools.0_<id>.<type>.<metric> ---- */

static const char *const type_names[3] = {"all", "small_pool", "large_pool"};
static const char *const metric_names[4] = {"current", "peak", "allocated", "freed"};

typedef struct pkey_s {
  char name[96];
  int64_t value;
} pkey_t;

static int pkey_cmp(const void *x, const void *y) {
  return strcmp(((const pkey_t *)x)->name, ((const pkey_t *)y)->name);
}

size_t _expseg_ppool_stat_count(const expseg_allocator *a) {
  size_t n = 0;
  for (size_t t = 1; t < a->n_ppools; t++) n += a->ppools[t].id != 0;
  return n * 12;
}

static size_t fill(const expseg_allocator *a, pkey_t *k) {
  size_t n = 0;
  for (size_t t = 1; t < a->n_ppools; t++) {
    const ppool_t *p = &a->ppools[t];
    if (p->id == 0) continue;
    for (int ty = 0; ty < 3; ty++)
      for (int m = 0; m < 4; m++) {
        snprintf(k[n].name, sizeof k[n].name, "%s.0_%" PRIu64 ".%s.%s", EXPSEG_PPOOL_FAMILY,
                 p->id, type_names[ty], metric_names[m]);
        k[n++].value = stat_metric(stat_array_view(p->reserved, ty), m);
      }
  }
  return n;
}

void _expseg_ppool_stats_visit(const expseg_allocator *a,
                               void (*fn)(void *ctx, const char *key, int64_t value), void *ctx) {
  size_t n = _expseg_ppool_stat_count(a);
  if (n == 0) return;
  pkey_t *k = malloc(n * sizeof *k);
  if (k == NULL) return;
  n = fill(a, k);
  qsort(k, n, sizeof *k, pkey_cmp);
  for (size_t i = 0; i < n; i++) fn(ctx, k[i].name, k[i].value);
  free(k);
}

bool _expseg_ppool_stat_get(const expseg_allocator *a, const char *key, int64_t *v) {
  const size_t fl = strlen(EXPSEG_PPOOL_FAMILY);
  if (strncmp(key, EXPSEG_PPOOL_FAMILY ".0_", fl + 3) != 0) return false;
  char *end;
  unsigned long long id = strtoull(key + fl + 3, &end, 10);
  /* the id as foreach writes it: digits, no sign, space or leading zero (strtoull takes those) */
  if (key[fl + 3] < '1' || key[fl + 3] > '9' || *end != '.') return false;
  for (size_t t = 1; t < a->n_ppools; t++) {
    const ppool_t *p = &a->ppools[t];
    if (p->id == 0 || p->id != (expseg_pool_id)id) continue;
    for (int ty = 0; ty < 3; ty++)
      for (int m = 0; m < 4; m++) {
        char name[64];
        snprintf(name, sizeof name, ".%s.%s", type_names[ty], metric_names[m]);
        if (strcmp(end, name) == 0) {
          *v = stat_metric(stat_array_view(p->reserved, ty), m);
          return true;
        }
      }
  }
  return false;
}

void _expseg_ppool_stats_reset(expseg_allocator *a, bool peak) {
  for (size_t t = 1; t < a->n_ppools; t++)
    if (a->ppools[t].id != 0) _expseg_stat_array_reset(a->ppools[t].reserved, peak);
}

/* ---- expseg_check ---- */

expseg_status _expseg_ppool_check(const expseg_allocator *a) {
  const size_t n = a->n_ppools;
  int64_t *sum = calloc(n ? 2 * n : 1, sizeof *sum); /* reserved small, large per tag */
  size_t *busy = calloc(n ? n : 1, sizeof *busy);
  expseg_status st = EXPSEG_OK;
  if (sum == NULL || busy == NULL) goto out; /* cannot tell without host memory */
  for (const segment_t *s = a->segments; s != NULL && st == EXPSEG_OK; s = s->next_all) {
    const uint32_t t = seg_tag(s);
    if (t == 0) continue;
    if (t >= n || a->ppools[t].id == 0) {
      st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_check: segment %#lx has pool tag %u, which holds no pool",
                             (unsigned long)s->base, t);
      break;
    }
    size_t mapped, chunks;
    sum[2 * t + (s->pool == POOL_SMALL ? 0 : 1)] += (int64_t)_expseg_seg_held(a, s, &mapped, &chunks);
    for (const block_t *b = s->first; b != NULL; b = b->next)
      busy[t] += b->state != BLOCK_FREE;
  }
  for (size_t t = 1; t < n && st == EXPSEG_OK; t++) {
    const ppool_t *p = &a->ppools[t];
    if (p->id == 0) continue;
    if (p->reserved[STAT_SMALL].current != sum[2 * t] ||
        p->reserved[STAT_LARGE].current != sum[2 * t + 1])
      st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_check: pool %" PRIu64 " counts %" PRId64 " + %" PRId64
                             " reserved bytes (small + large), its segments map %" PRId64
                             " + %" PRId64,
                             p->id, p->reserved[STAT_SMALL].current,
                             p->reserved[STAT_LARGE].current, sum[2 * t], sum[2 * t + 1]);
    else if (p->busy != busy[t])
      st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_check: pool %" PRIu64 " counts %zu busy blocks, its "
                             "segments hold %zu",
                             p->id, p->busy, busy[t]);
    else if (p->use_count < 0)
      st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_check: pool %" PRIu64 ": use count %d", p->id, p->use_count);
  }
  if (st == EXPSEG_OK) { /* the id map and the two stacks agree with the table */
    size_t live = 0, draining = 0, unused = 0;
    for (size_t t = 1; t < n; t++) {
      const ppool_t *p = &a->ppools[t];
      unused += p->id == 0;
      draining += p->id != 0 && p->use_count == 0;
      if (p->id != 0 && p->use_count > 0) live += live_tag(a, p->id) == t;
    }
    if (live != _expseg_map_count(&a->ppool_ids) || draining != a->n_ppool_drain ||
        unused != a->n_ppool_free)
      st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_check: pools: %zu live, %zu draining, %zu free slots; the "
                             "id map holds %zu, the stacks %zu draining and %zu free",
                             live, draining, unused, _expseg_map_count(&a->ppool_ids),
                             a->n_ppool_drain, a->n_ppool_free);
  }
  for (size_t i = 0; i < a->n_routes && st == EXPSEG_OK; i++) {
    const route_t *r = &a->routes[i];
    if (r->tag == 0 || r->tag >= n || a->ppools[r->tag].id != r->id ||
        a->ppools[r->tag].use_count == 0)
      st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_check: begun pool %" PRIu64 " is not live", r->id);
  }
out:
  free(sum);
  free(busy);
  return st;
}
