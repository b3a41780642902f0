/* SPDX-License-Identifier: Apache-2.0 */
/* sleep.c: tagged regions, and their sleep and wake.
 *
 * A region is a private pool (ppool.c) named by a tag, so its segments and pages are never
 * shared. Sleep keeps every segment of the region (address range, blocks, pages and their
 * chunks: the bookkeeping stays as it was) and changes only what stands behind it: the live
 * blocks' bytes go to pinned host memory (offload) or nowhere (discard), then each chunk is
 * unmapped and released. Wake takes a chunk of the same size for each from the page cache,
 * else creates one, maps it at the same address, grants access and copies the bytes back.
 * Segments marked `asleep` are the only ones whose pages and handles do not describe memory
 * held: what they hold (chunks a refused unmap or release left) is in this file's records,
 * which expseg_check and the statistics read through _expseg_seg_held.
 *
 * Both directions converge on a target: each chunk record says whether its chunk is alive
 * and mapped; sleep drives every record to (dead, unmapped), wake to (alive, mapped). A
 * failed step leaves the records true to the driver, so the next call continues and nothing
 * leaks; a wake that fails part-way drives everything back to asleep (never half restored).
 * Copies go in pieces of at most 64 MiB with the lock let go (the region marked busy:
 * copy_unlocked); driver calls are made with it held. Where the driver queues copies (cuda)
 * they go on one stream of the allocator's, synchronized once per sleep or wake before
 * anything is unmapped or handed out; a wake queues each segment's copies once it is mapped
 * (one set_access per contiguous range), so they run while the next segments are mapped;
 * elsewhere (host) they are synchronous. A wake grows as an allocation does: within the
 * memory-fraction cap (checked before anything is touched and at each create), and on a
 * full device or at the cap after the general cache's free memory is given back.
 *
 * Host copies are kept: a wake keeps the region's pinned host copies and its next offload
 * reuses those of the right size (at most twice the bytes), so a cycle after the first
 * makes no host allocation. Kept copies are counted (expseg.sleep_host_kept_bytes) and given
 * back by expseg_empty_cache, a discarding sleep, or a sleep that does not need them. On a
 * driver without bytes (sim) an offload copies nothing, but its host copies are counted as
 * a real run would hold them (records of the same sizes, no memory behind them). */
#include "error.h"
#include "internal.h"
#include "release.h"
#include "sleep.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static expseg_status bad_tag(const char *fn, const char *tag) {
  if (tag == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s: tag is NULL; accepted: 1 to 63 bytes of printable ASCII", fn);
  size_t n = strlen(tag);
  bool ok = n >= 1 && n <= 63;
  for (size_t i = 0; ok && i < n; i++) ok = tag[i] >= 0x20 && tag[i] < 0x7f;
  if (ok) return EXPSEG_OK;
  return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "%s: tag \"%.80s\" (%zu bytes) is not accepted; accepted: 1 to 63 "
                           "bytes of printable ASCII",
                           fn, tag, n);
}

static region_t *find(const expseg_allocator *a, const char *tag) {
  if (a->sleep == NULL) return NULL;
  for (size_t i = 0; i < a->sleep->n; i++)
    if (strcmp(a->sleep->r[i].name, tag) == 0) return &a->sleep->r[i];
  return NULL;
}

static region_t *find_tag(const expseg_allocator *a, uint32_t tag) {
  if (a->sleep == NULL) return NULL;
  for (size_t i = 0; i < a->sleep->n; i++)
    if (a->sleep->r[i].tag == tag) return &a->sleep->r[i];
  return NULL;
}

static expseg_status unknown_tag(const char *fn, const expseg_allocator *a, const char *tag) {
  char known[256] = "";
  size_t len = 0;
  for (size_t i = 0; a->sleep != NULL && i < a->sleep->n && len + 70 < sizeof known; i++)
    len += (size_t)snprintf(known + len, sizeof known - len, "%s\"%s\"", i ? ", " : "",
                            a->sleep->r[i].name);
  return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "%s: no region is tagged \"%s\"; accepted: a tag passed to "
                           "expseg_region_begin (known: %s)",
                           fn, tag, len ? known : "none");
}

/* ---- regions ---- */

expseg_status expseg_region_begin(expseg_allocator *a, const char *tag) {
  if (a == NULL) return _expseg_null_allocator("expseg_region_begin");
  expseg_status st = bad_tag("expseg_region_begin", tag);
  if (st != EXPSEG_OK) return st;
  api_lock(a);
  region_t *r = find(a, tag);
  expseg_pool_id pool = r ? r->pool : 0;
  api_unlock(a);
  if (pool == 0) { /* a new region: its pool, then its entry (another thread may race) */
    const uint32_t note = _expseg_hist_note(tag); /* outside the lock: the table has its own */
    if ((st = expseg_pool_create(a, &pool)) != EXPSEG_OK) return st;
    api_lock(a);
    if ((r = find(a, tag)) != NULL) {
      api_unlock(a);
      (void)expseg_pool_release(a, pool);
      pool = r->pool;
    } else {
      struct sleep_state_s *ss = a->sleep;
      if (ss == NULL && (ss = a->sleep = calloc(1, sizeof *ss)) == NULL) st = EXPSEG_ERR_HOST_OUT_OF_MEMORY;
      if (st == EXPSEG_OK && ss->n == ss->cap) {
        size_t cap = ss->cap ? 2 * ss->cap : 4;
        region_t *nr = realloc(ss->r, cap * sizeof *nr);
        if (nr == NULL) st = EXPSEG_ERR_HOST_OUT_OF_MEMORY;
        else ss->r = nr, ss->cap = cap;
      }
      if (st == EXPSEG_OK) {
        region_t *e = &ss->r[ss->n++];
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", tag);
        e->pool = pool;
        e->tag = _expseg_ppool_live_tag(a, pool);
        e->note = note;
      }
      api_unlock(a);
      if (st != EXPSEG_OK) {
        (void)expseg_pool_release(a, pool);
        return _expseg_error_set(st, "expseg_region_begin(\"%s\"): out of host memory", tag);
      }
    }
  }
  return expseg_pool_begin(a, pool, NULL, NULL);
}

expseg_status expseg_region_end(expseg_allocator *a, const char *tag) {
  if (a == NULL) return _expseg_null_allocator("expseg_region_end");
  expseg_status st = bad_tag("expseg_region_end", tag);
  if (st != EXPSEG_OK) return st;
  api_lock(a);
  const region_t *r = find(a, tag);
  expseg_pool_id pool = r ? r->pool : 0;
  if (r == NULL) st = unknown_tag("expseg_region_end", a, tag);
  api_unlock(a);
  return st == EXPSEG_OK ? expseg_pool_end(a, pool) : st;
}

const char *_expseg_sleep_region_name(const expseg_allocator *a, uint32_t tag) {
  const region_t *r = tag == 0 ? NULL : find_tag(a, tag);
  return r ? r->name : NULL;
}

bool _expseg_sleep_refuses(expseg_allocator *a, uint32_t tag) {
  const region_t *r = find_tag(a, tag);
  if (r == NULL || !(r->asleep || r->busy)) return false;
  _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                    "expseg_malloc: region \"%s\" is %s; wake it (expseg_wake) before "
                    "allocating in it, or end it (expseg_region_end) to allocate elsewhere",
                    r->name, r->asleep ? "asleep" : "going to sleep (its bytes are being copied)");
  return true;
}

expseg_status _expseg_sleep_defer_free(expseg_allocator *a, block_t *b) {
  region_t *r = find_tag(a, seg_tag(b->seg));
  expseg_assert(r != NULL && (r->asleep || r->busy));
  for (size_t i = 0; i < r->n_deferred; i++)
    if (r->deferred[i] == b)
      return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                               "expseg_free(%p): already freed (region \"%s\" is asleep: the "
                               "free takes effect when it wakes)",
                               (void *)b->ptr, r->name);
  if (r->n_deferred == r->cap_deferred) {
    size_t cap = r->cap_deferred ? 2 * r->cap_deferred : 8;
    block_t **d = realloc(r->deferred, cap * sizeof *d);
    if (d == NULL)
      return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                               "expseg_free(%p): out of host memory; it stays allocated",
                               (void *)b->ptr);
    r->deferred = d, r->cap_deferred = cap;
  }
  r->deferred[r->n_deferred++] = b;
  return EXPSEG_OK;
}

/* ---- what sleeping segments hold ---- */

static const sseg_t *sseg_of(const expseg_allocator *a, const segment_t *s) {
  const region_t *r = find_tag(a, seg_tag(s));
  for (size_t i = 0; r != NULL && i < r->n_segs; i++)
    if (r->segs[i].s == s) return &r->segs[i];
  return NULL;
}

size_t _expseg_seg_held(const expseg_allocator *a, const segment_t *s, size_t *mapped,
                        size_t *chunks) {
  if (!s->asleep) {
    size_t n = 0;
    if (!s->expandable) n = 1;
    else
      for (size_t i = 0; i < s->pages_cap; i++) n += s->pages[i].mapped && s->pages[i].off == 0;
    *mapped = s->mapped_bytes;
    *chunks = n;
    return s->mapped_bytes;
  }
  const sseg_t *g = sseg_of(a, s);
  size_t held = 0;
  *mapped = *chunks = 0;
  for (size_t i = 0; g != NULL && i < g->n_chunks; i++) {
    if (g->chunks[i].mapped) *mapped += g->chunks[i].size;
    if (g->chunks[i].alive) held += g->chunks[i].size, ++*chunks;
  }
  return held;
}

/* ---- the two directions ---- */

static void held_change(expseg_allocator *a, const segment_t *s, int64_t d) {
  _expseg_stat_pool_add(a->stats.reserved_bytes, s->pool, d);
  _expseg_ppool_reserved(a, s, d);
  if (d > 0) a->stats.created_bytes += d;
  else a->stats.released_bytes += -d;
}

/* Drives every chunk of r's sleeping segments to unmapped and released; the first
 * failure's status (its message set), the rest still tried. */
static expseg_status drop_all(expseg_allocator *a, region_t *r) {
  expseg_status first = EXPSEG_OK, st;
  for (size_t i = 0; i < r->n_segs; i++) {
    sseg_t *g = &r->segs[i];
    for (size_t k = 0; k < g->n_chunks; k++) {
      crec_t *c = &g->chunks[k];
      if (c->mapped) {
        if ((st = _expseg_vmm_unmap(a->drv, c->addr, c->size)) != EXPSEG_OK) {
          if (first == EXPSEG_OK) first = st;
          continue;
        }
        c->mapped = false;
        if (g->s->expandable) _expseg_stat_add(&a->stats.mapped_bytes, -(int64_t)c->size);
      }
      if (c->alive) {
        if ((st = _expseg_vmm_release(a->drv, c->h, c->size)) != EXPSEG_OK) {
          if (first == EXPSEG_OK) first = st;
          continue;
        }
        c->alive = false;
        held_change(a, g->s, -(int64_t)c->size);
      }
    }
  }
  return first;
}

static expseg_status grant(expseg_allocator *a, uintptr_t lo, uintptr_t hi) {
  expseg_status st = EXPSEG_OK;
  if (hi > lo && (st = _expseg_vmm_set_access(a->drv, lo, hi - lo)) == EXPSEG_OK)
    st = _expseg_peers_grant(a, lo, hi - lo);
  return st;
}

/* The page cache supplies physical memory first: the newest cached chunk of exactly c's
 * size becomes c's (its reserved_bytes moved to s's pool; no create). */
static bool take_cached(expseg_allocator *a, const segment_t *s, crec_t *c) {
  for (size_t i = a->cache_count; i-- > 0;) {
    if (a->cache[i].size != c->size) continue;
    const chunk_t k = _expseg_cache_take(a, i, s->pool);
    c->h = k.h;
    c->alive = true;
    _expseg_ppool_reserved(a, s, (int64_t)c->size);
    a->stats.page_cache_hits += (int64_t)(c->size / (s->expandable ? s->page : c->size));
    return true;
  }
  return false;
}

/* A wake refused by the memory-fraction cap: `more` bytes to create would pass it. */
static expseg_status cap_refused(expseg_allocator *a, size_t more) {
  char b1[32], b2[32], b3[32];
  return _expseg_error_set(
      EXPSEG_ERR_OUT_OF_MEMORY, "memory fraction cap: waking needs %s more device memory than "
      "the page cache supplies, holding %s, %s allowed (memory fraction %.3g); raise the "
      "fraction (expseg_set_memory_fraction) or give memory back (free, expseg_empty_cache, "
      "sleep another region), then wake again", _expseg_format_size(b1, more),
      _expseg_format_size(b2, held_bytes(a) + a->inflight), _expseg_format_size(b3, a->allowed),
      a->cfg.per_process_memory_fraction);
}

/* Room for `more` within the cap, the general cache's free memory given back if needed? */
static bool cap_room(expseg_allocator *a, size_t more) {
  return _expseg_cap_allows(a, more) ||
         (_expseg_release_cached(a, false) > 0 && _expseg_cap_allows(a, more));
}

/* The memory a wake of r creates: its chunks not alive, less those the page cache supplies
 * (as take_cached will: one cached chunk of the same size each). Without host memory for
 * the matching, every such chunk counts. */
static size_t wake_creates(const expseg_allocator *a, const region_t *r) {
  bool *taken = a->cache_count ? calloc(a->cache_count, sizeof *taken) : NULL;
  size_t need = 0;
  for (size_t i = 0; i < r->n_segs; i++)
    for (size_t k = 0; k < r->segs[i].n_chunks; k++) {
      const crec_t *c = &r->segs[i].chunks[k];
      bool found = c->alive;
      for (size_t j = a->cache_count; taken && !found && j-- > 0;)
        if (!taken[j] && a->cache[j].size == c->size) taken[j] = found = true;
      if (!found) need += c->size;
    }
  free(taken);
  return need;
}

/* Drives every chunk of g to created (or taken from the page cache) and mapped, with one
 * set_access per contiguous range it maps (chunks still mapped by a sleep that failed
 * part-way kept their access); stops at the first failure. */
static expseg_status raise_seg(expseg_allocator *a, sseg_t *g) {
  expseg_status st = EXPSEG_OK;
  uintptr_t lo = 0, hi = 0; /* mapped here, access not yet granted */
  for (size_t k = 0; k < g->n_chunks && st == EXPSEG_OK; k++) {
    crec_t *c = &g->chunks[k];
    if (!c->alive && !take_cached(a, g->s, c)) {
      /* checked before the wake began; again here, as another thread may have grown while
       * the lock was let go for a copy */
      if (!cap_room(a, c->size)) {
        st = cap_refused(a, c->size);
        break;
      }
      st = _expseg_vmm_create(a->drv, c->size, &c->h);
      /* the device is full: the general cache's free memory goes back, as for a malloc */
      if (st == EXPSEG_ERR_OUT_OF_MEMORY && _expseg_release_cached(a, false) > 0)
        st = _expseg_vmm_create(a->drv, c->size, &c->h);
      if (st != EXPSEG_OK) break;
      c->alive = true;
      held_change(a, g->s, (int64_t)c->size);
    }
    if (c->mapped) continue;
    if (c->addr != hi) { /* not contiguous with the range before: that one first */
      if ((st = grant(a, lo, hi)) != EXPSEG_OK) break;
      lo = hi = c->addr;
    }
    if ((st = _expseg_vmm_map(a->drv, c->addr, c->size, c->h, 0)) != EXPSEG_OK) break;
    c->mapped = true;
    hi = c->addr + c->size;
    if (g->s->expandable) _expseg_stat_add(&a->stats.mapped_bytes, (int64_t)c->size);
  }
  if (st == EXPSEG_OK) st = grant(a, lo, hi);
  return st;
}


/* Host copies the driver refused to take back: kept and tried again at every sleep, wake
 * and destroy (reported only when the list is full or at destroy). */
static void host_give_back(expseg_allocator *a, const expseg_host_chunk_t *c, bool last) {
  struct sleep_state_s *ss = a->sleep;
  if (c->ptr == NULL) return; /* counted only, never allocated (a driver without bytes) */
  if (_expseg_vmm_host_free(a->drv, c) == EXPSEG_OK) return;
  if (!last && ss->n_stale < STALE_MAX) {
    ss->stale[ss->n_stale++] = *c;
    return;
  }
  _expseg_warn("sleep: giving back %zu bytes of pinned host memory failed: %s", c->size,
               expseg_last_error());
}

static void stale_retry(expseg_allocator *a, bool last) {
  struct sleep_state_s *ss = a->sleep;
  const size_t n = ss->n_stale;
  expseg_host_chunk_t c[STALE_MAX];
  memcpy(c, ss->stale, n * sizeof *c);
  ss->n_stale = 0;
  for (size_t i = 0; i < n; i++) host_give_back(a, &c[i], last);
}

/* A host copy kept by r for its next offload (given back when there is no room). */
static void keep_host(expseg_allocator *a, region_t *r, const expseg_host_chunk_t *c) {
  if (r->n_kept == r->cap_kept) {
    size_t cap = r->cap_kept ? 2 * r->cap_kept : 4;
    expseg_host_chunk_t *k = realloc(r->kept, cap * sizeof *k);
    if (k == NULL) {
      host_give_back(a, c, false);
      return;
    }
    r->kept = k, r->cap_kept = cap;
  }
  r->kept[r->n_kept++] = *c;
  _expseg_stat_add(&a->stats.sleep_host_kept_bytes, (int64_t)c->size);
}

/* The smallest kept host copy of `need` bytes up to twice that, taken out of the list. */
static bool take_kept(expseg_allocator *a, region_t *r, size_t need, expseg_host_chunk_t *out) {
  size_t best = SIZE_MAX;
  for (size_t i = 0; i < r->n_kept; i++)
    if (r->kept[i].size >= need && r->kept[i].size / 2 <= need &&
        (best == SIZE_MAX || r->kept[i].size < r->kept[best].size))
      best = i;
  if (best == SIZE_MAX) return false;
  *out = r->kept[best];
  r->kept[best] = r->kept[--r->n_kept];
  _expseg_stat_add(&a->stats.sleep_host_kept_bytes, -(int64_t)out->size);
  return true;
}

static void kept_give_back(expseg_allocator *a, region_t *r) {
  while (r->n_kept > 0) {
    const expseg_host_chunk_t c = r->kept[--r->n_kept];
    _expseg_stat_add(&a->stats.sleep_host_kept_bytes, -(int64_t)c.size);
    host_give_back(a, &c, false);
  }
}

/* keep: its host copy goes to r's kept list (a wake, a sleep that did not happen), else
 * back to the driver. */
static void sseg_free(expseg_allocator *a, region_t *r, sseg_t *g, bool keep) {
  if (g->has_host) {
    if (keep) keep_host(a, r, &g->host);
    else host_give_back(a, &g->host, false);
  }
  free(g->chunks);
  free(g->pieces);
  memset(g, 0, sizeof *g);
}

static void segs_free(expseg_allocator *a, region_t *r, bool keep) {
  for (size_t i = 0; i < r->n_segs; i++) sseg_free(a, r, &r->segs[i], keep);
  free(r->segs);
  r->segs = NULL;
  r->n_segs = 0;
}

/* The chunks and live blocks of s, the host memory for them (offload), their bytes copied
 * out. Nothing is changed in the allocator; on failure g holds what to free. */
static expseg_status sseg_build(expseg_allocator *a, region_t *r, segment_t *s, bool offload,
                                sseg_t *g) {
  g->s = s;
  size_t n = 0, np = 0, bytes = 0;
  if (s->expandable) {
    for (size_t i = 0; i < s->pages_cap; i++) n += s->pages[i].mapped && s->pages[i].off == 0;
  } else {
    n = 1;
  }
  for (const block_t *b = s->first; b != NULL; b = b->next)
    if (b->state != BLOCK_FREE) np++, bytes += b->size;
  g->chunks = calloc(n ? n : 1, sizeof *g->chunks);
  g->pieces = calloc(np ? np : 1, sizeof *g->pieces);
  if (g->chunks == NULL || g->pieces == NULL)
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "out of host memory");
  if (s->expandable) {
    for (size_t i = 0; i < s->pages_cap; i++)
      if (s->pages[i].mapped && s->pages[i].off == 0)
        g->chunks[g->n_chunks++] = (crec_t){.addr = s->base + i * s->page,
                                            .size = s->pages[i].n * s->page, .first_page = i,
                                            .h = s->pages[i].h, .alive = true, .mapped = true};
  } else {
    g->chunks[g->n_chunks++] = (crec_t){.addr = s->base, .size = s->va_size, .h = s->handle,
                                        .alive = true, .mapped = true};
  }
  if (!offload || bytes == 0) return EXPSEG_OK;
  const size_t os_page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t need = (bytes + os_page - 1) / os_page * os_page;
  expseg_status st = EXPSEG_OK;
  if (!take_kept(a, r, need, &g->host)) {
    g->host = (expseg_host_chunk_t){
        .size = need, .numa_node = _expseg_vmm_host_numa(a->drv),
        .fault_threads = _expseg_sleep_fault_threads(need, sysconf(_SC_NPROCESSORS_ONLN)),
        .no_huge = !a->cfg.pinned_huge_pages};
    /* a driver without bytes (sim): the host copy is counted as on any driver, so the
     * statistics show what an offload holds, but never allocated (ptr NULL) */
    if (!r->no_bytes && (st = _expseg_vmm_host_alloc(a->drv, &g->host)) != EXPSEG_OK) return st;
  }
  g->has_host = true;
  size_t off = 0;
  for (const block_t *b = s->first; b != NULL; b = b->next) {
    if (b->state == BLOCK_FREE) continue;
    g->pieces[g->n_pieces++] = (piece_t){b->ptr, b->size, off};
    off += b->size;
  }
  return EXPSEG_OK;
}

/* copy_segs of (*rp)->segs[first .. first + n) (pending: only the synchronize of copies
 * already queued on the copy stream) with the allocator's lock let go, so that other
 * threads' calls go on during the copy; the region is busy meanwhile (a sleep or wake of it
 * is refused, an allocation in it too, a free of its blocks is deferred as while it
 * sleeps). *rp is found again after: the region table may have moved. */
static expseg_status copy_unlocked(expseg_allocator *a, region_t **rp, size_t first, size_t n,
                                   bool in, bool pending) {
  region_t *r = *rp;
  char tag[sizeof r->name];
  memcpy(tag, r->name, sizeof tag);
  const sseg_t *segs = r->segs + first; /* r->segs is not freed nor moved while busy */
  bool no_bytes = r->no_bytes;
  const expseg_stream *stream = _expseg_sleep_copy_stream(a); /* a->sleep outlives the copy */
  r->busy = true;
  api_unlock(a);
  const uint64_t t0 = _expseg_vmm_now_ns(a->drv);
  expseg_status st = pending ? _expseg_sleep_sync_copies(a->drv, *stream)
                             : _expseg_sleep_copy_segs(a->drv, segs, n, in, &no_bytes, stream, NULL);
  const uint64_t dt = _expseg_vmm_now_ns(a->drv) - t0;
  char cause[512] = "";
  if (st != EXPSEG_OK) snprintf(cause, sizeof cause, "%s", expseg_last_error());
  api_lock(a);
  *rp = r = find(a, tag);
  r->busy = false;
  if (!no_bytes) r->copy_ns += dt; /* sim: nothing was copied */
  r->no_bytes = no_bytes;
  return st == EXPSEG_OK ? st : _expseg_error_set(st, "%s", cause);
}

/* The frees made while r slept or was busy, done now that its segments are awake. */
static void apply_deferred(expseg_allocator *a, region_t *r) {
  block_t **d = r->deferred;
  size_t nd = r->n_deferred;
  r->deferred = NULL;
  r->n_deferred = r->cap_deferred = 0;
  for (size_t i = 0; i < nd; i++) (void)_expseg_free_locked(a, (void *)d[i]->ptr);
  free(d);
}

/* Waits for the work of every stream the region's blocks and segments are used on. */
static expseg_status wait_streams(expseg_allocator *a, uint32_t tag) {
  _expseg_sync_all_events(a);
  for (const segment_t *s = a->segments; s != NULL; s = s->next_all) {
    if (seg_tag(s) != tag) continue;
    expseg_status st = _expseg_vmm_stream_synchronize(a->drv, skey_stream(s->stream));
    for (const block_t *b = s->first; b != NULL && st == EXPSEG_OK; b = b->next)
      for (uint32_t i = 0; i < b->n_uses && st == EXPSEG_OK; i++)
        st = _expseg_vmm_stream_synchronize(a->drv, b->uses[i]);
    if (st != EXPSEG_OK) return st;
  }
  return EXPSEG_OK;
}

/* Every segment raised (lock held), its offloaded bytes copied back right after: queued
 * (lock held) where the driver queues copies, one synchronize at the end (lock let go);
 * else copied with the lock let go. */
static expseg_status raise_all(expseg_allocator *a, region_t **rp) {
  expseg_status st = EXPSEG_OK;
  const expseg_stream *stream = _expseg_sleep_copy_stream(a);
  bool pending = false; /* copies queued on stream, not yet synchronized */
  for (size_t i = 0; i < (*rp)->n_segs && st == EXPSEG_OK; i++) {
    region_t *r = *rp;
    if ((st = raise_seg(a, &r->segs[i])) != EXPSEG_OK || r->no_bytes || !r->segs[i].has_host)
      continue;
    if (stream == NULL) { /* synchronous copies: with the lock let go */
      st = copy_unlocked(a, rp, i, 1, true, false);
      continue;
    }
    /* queued (returns at once) right after the segment is mapped, so the copies run while
     * the next segments are created and mapped; one synchronize at the end */
    const uint64_t t0 = _expseg_vmm_now_ns(a->drv);
    st = _expseg_sleep_copy_segs(a->drv, &r->segs[i], 1, true, &r->no_bytes, stream, &pending);
    r->copy_ns += _expseg_vmm_now_ns(a->drv) - t0;
  }
  if (pending) { /* also after a failure: nothing may be in flight when it is unmapped */
    const expseg_status s2 = copy_unlocked(a, rp, 0, 0, true, true);
    if (st == EXPSEG_OK) st = s2;
  }
  return st;
}

static expseg_status sleep_locked(expseg_allocator *a, region_t **rp, bool offload) {
  region_t *r = *rp;
  if (r->asleep) return drop_all(a, r); /* a sleep that failed part-way: go on */
  const uintptr_t held = _expseg_ipc_held_in_pool(a, r->tag); /* its memory must stay */
  if (held != 0)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "its allocation %p is exported (expseg_ipc_export) and an importer "
                             "still holds it; accepted: a region none of whose allocations is "
                             "held (expseg_ipc_close in every importer, or its exit, and "
                             "expseg_ipc_handle_free of the exporter's handle)",
                             (void *)held);
  expseg_status st = wait_streams(a, r->tag);
  if (st != EXPSEG_OK) return st;
  (void)_expseg_release_pool_memory(a, r->tag, true); /* nothing free is kept asleep */
  size_t n = 0;
  for (const segment_t *s = a->segments; s != NULL; s = s->next_all)
    n += seg_tag(s) == r->tag && s->mapped_bytes > 0;
  r->segs = calloc(n ? n : 1, sizeof *r->segs);
  if (r->segs == NULL) return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "out of host memory");
  r->no_bytes = !_expseg_vmm_has_bytes(a->drv); /* sim: nothing to allocate or copy */
  for (segment_t *s = a->segments; s != NULL && st == EXPSEG_OK; s = s->next_all)
    if (seg_tag(s) == r->tag && s->mapped_bytes > 0)
      st = sseg_build(a, r, s, offload, &r->segs[r->n_segs++]);
  if (st != EXPSEG_OK) {
    segs_free(a, r, true);
    return st;
  }
  kept_give_back(a, r); /* what this sleep did not reuse */
  /* its segments sleep from here for the rest of the allocator (frees deferred, release
   * and allocation kept away), while the bytes are copied out */
  for (size_t i = 0; i < r->n_segs; i++) r->segs[i].s->asleep = true;
  if (offload && !r->no_bytes) st = copy_unlocked(a, rp, 0, r->n_segs, false, false);
  r = *rp;
  if (st != EXPSEG_OK) { /* awake again as it was, with the frees made meanwhile */
    for (size_t i = 0; i < r->n_segs; i++) r->segs[i].s->asleep = false;
    segs_free(a, r, true);
    apply_deferred(a, r);
    return st;
  }
  /* from here the bytes are safe: the region is asleep whatever the driver does */
  r->asleep = true;
  return drop_all(a, r);
}

/* The records' new handles into the segments, which wake up; host copies freed. */
static void commit_wake(expseg_allocator *a, region_t *r) {
  for (size_t i = 0; i < r->n_segs; i++) {
    segment_t *s = r->segs[i].s;
    for (size_t k = 0; k < r->segs[i].n_chunks; k++) {
      const crec_t *c = &r->segs[i].chunks[k];
      if (!s->expandable) s->handle = c->h;
      else
        for (size_t j = 0; j < s->pages[c->first_page].n; j++) s->pages[c->first_page + j].h = c->h;
    }
    s->asleep = false;
  }
  segs_free(a, r, true);
  r->asleep = false;
}

static expseg_status wake_locked(expseg_allocator *a, region_t **rp) {
  if (!(*rp)->asleep) return EXPSEG_OK;
  if (a->allowed != SIZE_MAX) { /* a wake grows as an allocation does: within the cap */
    size_t need = wake_creates(a, *rp);
    if (!_expseg_cap_allows(a, need) && _expseg_release_cached(a, false) > 0)
      need = wake_creates(a, *rp); /* the page cache may be gone too */
    if (!_expseg_cap_allows(a, need)) return cap_refused(a, need); /* nothing created */
  }
  expseg_status st = raise_all(a, rp);
  region_t *r = *rp;
  if (st != EXPSEG_OK) { /* back to asleep: nothing half restored */
    char cause[512];
    snprintf(cause, sizeof cause, "%s", expseg_last_error());
    if (drop_all(a, r) != EXPSEG_OK)
      _expseg_warn("wake of region \"%s\" failed and giving its memory back failed too (%s); "
                   "what is still held is reused by the next wake",
                   r->name, expseg_last_error());
    return _expseg_error_set(st, "%s", cause);
  }
  commit_wake(a, r);
  apply_deferred(a, r); /* frees made while it slept */
  return EXPSEG_OK;
}

static uint64_t epoch_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

/* The physical memory of r's sleeping segments (what a sleep gives back, a wake maps). */
static uint64_t chunk_bytes(const region_t *r) {
  uint64_t n = 0;
  for (size_t i = 0; i < r->n_segs; i++)
    for (size_t k = 0; k < r->segs[i].n_chunks; k++) n += r->segs[i].chunks[k].size;
  return n;
}

/* A sleep or wake event: address 0, size the bytes, the tag as its text, on the region's
 * pool. */
static void hist_region(expseg_allocator *a, const region_t *r, int action, uint64_t bytes) {
  if (a->hist == NULL) return;
  hist_event_t *e = _expseg_hist_add(a, action, 0, bytes, skey_make(0, r->tag));
  if (e != NULL) e->note = r->note;
}

/* A wake (wake true, mode unused) or a sleep in `mode`, the value the caller passed: kept
 * apart so that no mode value can stand for a wake. */
static expseg_status run(expseg_allocator *a, const char *fn, const char *tag, bool wake,
                         int mode) {
  if (a == NULL) return _expseg_null_allocator(fn);
  expseg_status st = bad_tag(fn, tag);
  if (st != EXPSEG_OK) return st;
  if (!wake && mode != EXPSEG_SLEEP_OFFLOAD && mode != EXPSEG_SLEEP_DISCARD)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s(\"%s\"): mode %d is not accepted; accepted: "
                             "EXPSEG_SLEEP_OFFLOAD (0) or EXPSEG_SLEEP_DISCARD (1)",
                             fn, tag, mode);
  api_lock(a);
  region_t *r = find(a, tag);
  if (r == NULL) {
    st = unknown_tag(fn, a, tag);
    api_unlock(a);
    return st;
  }
  if (r->busy) {
    st = _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                           "%s(\"%s\"): a sleep or wake of this region is in progress on "
                           "another thread; accepted: one at a time (call again when it "
                           "returns)",
                           fn, tag);
    api_unlock(a);
    return st;
  }
  if (a->sleep->n_stale > 0) stale_retry(a, false);
  const uint64_t t0 = _expseg_vmm_now_ns(a->drv);
  const bool was = r->asleep;
  const uint64_t bytes = was ? chunk_bytes(r) : 0; /* what a wake maps again */
  r->copy_ns = 0;
  st = wake ? wake_locked(a, &r) : sleep_locked(a, &r, mode == EXPSEG_SLEEP_OFFLOAD);
  const uint64_t us = (_expseg_vmm_now_ns(a->drv) - t0) / 1000, at = epoch_us();
  if (st == EXPSEG_OK && wake && was) {
    r->wakes++, r->last_wake_us = us, r->last_wake_at_us = at;
    r->last_wake_copy_us = r->copy_ns / 1000;
    hist_region(a, r, HIST_WAKE, bytes);
  }
  if (r->asleep && !wake && !was) { /* asleep now, its bytes safe (a failed give-back is
                                     * finished by the next sleep or wake) */
    if (st == EXPSEG_OK) {
      r->sleeps++, r->last_sleep_us = us, r->last_sleep_at_us = at;
      r->last_sleep_copy_us = r->copy_ns / 1000;
    }
    hist_region(a, r, HIST_SLEEP, chunk_bytes(r));
  }
  if (st != EXPSEG_OK) {
    char cause[512];
    snprintf(cause, sizeof cause, "%s", expseg_last_error());
    st = _expseg_error_set(st, "%s(\"%s\"): %s%s", fn, tag, cause,
                           r->asleep ? " (the region is asleep, its bytes kept)"
                                     : " (the region is awake, nothing changed)");
  }
  api_unlock(a);
  return st;
}

expseg_status expseg_sleep(expseg_allocator *a, const char *tag, expseg_sleep_mode mode) {
  return run(a, "expseg_sleep", tag, false, (int)mode);
}

expseg_status expseg_wake(expseg_allocator *a, const char *tag) {
  return run(a, "expseg_wake", tag, true, 0);
}

expseg_status expseg_region_get_info(expseg_allocator *a, const char *tag,
                                     expseg_region_info *out) {
  if (a == NULL) return _expseg_null_allocator("expseg_region_get_info");
  if (out == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_region_get_info: out is NULL");
  memset(out, 0, sizeof *out);
  expseg_status st = bad_tag("expseg_region_get_info", tag);
  if (st != EXPSEG_OK) return st;
  api_lock(a);
  const region_t *r = find(a, tag);
  if (r == NULL) {
    st = unknown_tag("expseg_region_get_info", a, tag);
  } else {
    out->pool = r->pool;
    out->asleep = r->asleep;
    out->deferred_frees = r->n_deferred;
    out->sleeps = r->sleeps, out->wakes = r->wakes;
    out->last_sleep_us = r->last_sleep_us, out->last_wake_us = r->last_wake_us;
    out->last_sleep_at_us = r->last_sleep_at_us, out->last_wake_at_us = r->last_wake_at_us;
    out->last_sleep_copy_us = r->last_sleep_copy_us;
    out->last_wake_copy_us = r->last_wake_copy_us;
    for (size_t i = 0; i < r->n_kept; i++) out->host_kept_bytes += r->kept[i].size;
    for (const segment_t *s = a->segments; s != NULL; s = s->next_all) {
      if (seg_tag(s) != r->tag) continue;
      size_t mapped, chunks;
      out->device_bytes += _expseg_seg_held(a, s, &mapped, &chunks);
      for (const block_t *b = s->first; b != NULL; b = b->next)
        if (b->state == BLOCK_ALLOCATED) out->live_bytes += b->size;
    }
    for (size_t i = 0; i < r->n_segs; i++) {
      if (r->segs[i].has_host) out->host_bytes += r->segs[i].host.size;
      for (size_t k = 0; k < r->segs[i].n_chunks; k++)
        if (!r->segs[i].chunks[k].alive) out->asleep_bytes += r->segs[i].chunks[k].size;
    }
  }
  api_unlock(a);
  return st;
}

void _expseg_sleep_trim(expseg_allocator *a) {
  for (size_t i = 0; i < a->sleep->n; i++) kept_give_back(a, &a->sleep->r[i]);
}

void _expseg_sleep_destroy(expseg_allocator *a) {
  if (a->sleep == NULL) return;
  if (a->sleep->copy_stream_state == 1) /* a copy left queued by a failed wait lands first */
    (void)_expseg_vmm_stream_synchronize(a->drv, a->sleep->copy_stream);
  for (size_t i = 0; i < a->sleep->n; i++) {
    region_t *r = &a->sleep->r[i];
    if (r->asleep && drop_all(a, r) != EXPSEG_OK && drop_all(a, r) != EXPSEG_OK)
      _expseg_warn("destroy: region \"%s\": the driver kept memory: %s", r->name,
                   expseg_last_error());
    for (size_t k = 0; k < r->n_segs; k++) { /* nothing mapped behind them any more */
      segment_t *s = r->segs[k].s;
      s->asleep = false;
      if (s->expandable)
        for (size_t j = 0; j < s->pages_cap; j++) s->pages[j].mapped = false;
      s->mapped_bytes = 0;
      s->handle = 0;
    }
    segs_free(a, r, false);
    kept_give_back(a, r);
    free(r->kept);
    free(r->deferred);
  }
  stale_retry(a, false);
  stale_retry(a, true);
  if (a->sleep->copy_stream_state == 1 &&
      _expseg_vmm_stream_destroy(a->drv, a->sleep->copy_stream) != EXPSEG_OK)
    _expseg_warn("destroy: the stream of sleep and wake's copies: %s", expseg_last_error());
  free(a->sleep->r);
  free(a->sleep);
  a->sleep = NULL;
}
