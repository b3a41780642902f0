/* segment.c: where memory comes from and goes back to. Classic segments (one chunk each)
 * and expandable segments (a reservation whose pages are mapped on demand), moving idle
 * pages to where they are needed, and deciding what to give back.
 *
 * Growth of an expandable segment (docs/design.md):
 *  1. place: the lowest-address unmapped range of the stream's segments that, with the free
 *     mapped block just before it (and after it), fits the request; else a new reservation;
 *  2. pages: from the page cache; else moved from idle free pages anywhere (any stream, any
 *     pool, once an event shows their stream's work is done); else created new, with the
 *     lock dropped, within the memory-fraction cap;
 *  3. map one chunk per page, then ONE set_access for the whole new range.
 * Physical memory is thus created once and reused; it goes back to the driver only on
 * empty_cache, garbage collection, the out-of-memory path, the page-cache bound, or destroy,
 * and only once the work queued on its stream is done. How it goes back (batches with the
 * lock dropped, the retry list of refusals, the page cache) is release.c's; what garbage
 * collection gives back, gc.c's. */
#include "fidx.h"
#include "error.h"
#include "release.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- segments ---- */

static void segment_link(expseg_allocator *a, segment_t *s) {
  s->prev_all = NULL;
  s->next_all = a->segments;
  if (a->segments) a->segments->prev_all = s;
  a->segments = s;
  a->n_segments++;
}

static void segment_unlink(expseg_allocator *a, segment_t *s) {
  if (s->prev_all) s->prev_all->next_all = s->next_all;
  else a->segments = s->next_all;
  if (s->next_all) s->next_all->prev_all = s->prev_all;
  a->n_segments--;
}

static bool pages_reserve(segment_t *s, size_t npages) {
  if (npages <= s->pages_cap) return true;
  size_t cap = s->pages_cap ? s->pages_cap : 16;
  while (cap < npages) cap *= 2;
  page_t *p = realloc(s->pages, cap * sizeof *p);
  if (p == NULL) return false;
  memset(p + s->pages_cap, 0, (cap - s->pages_cap) * sizeof *p);
  s->pages = p;
  s->pages_cap = cap;
  return true;
}

/* A segment struct and its first block, or NULL (message set) when out of host memory. */
static segment_t *segment_new(expseg_allocator *a, block_t **first, expseg_status *st) {
  segment_t *s = calloc(1, sizeof *s);
  block_t *b = _expseg_block_new(a);
  if (s == NULL || b == NULL) {
    free(s);
    if (b) _expseg_block_delete(a, b);
    *st = _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY, "out of host memory for segment bookkeeping");
    return NULL;
  }
  *first = b;
  return s;
}

/* Makes s a segment of [base, base+size) for (pool, stream) whose one block b covers it
 * (free; mapped for classic, unmapped for expandable) and counts it. */
static void segment_attach(expseg_allocator *a, segment_t *s, block_t *b, uintptr_t base,
                           size_t size, int pool, expseg_stream stream, bool expandable) {
  s->base = base;
  s->va_size = size;
  s->expandable = expandable;
  s->pool = (uint8_t)pool;
  s->stream = stream;
  s->first = b;
  *b = (block_t){.ptr = base, .size = size, .stream = stream, .seg = s, .state = BLOCK_FREE,
                 .mapped = !expandable, .uses = b->uses_inline, .uses_cap = 2};
  segment_link(a, s);
#if !defined(EXPSEG_TEST_BREAK_INVARIANT) || !EXPSEG_TEST_BREAK_INVARIANT
  _expseg_stat_pool_add(a->stats.segment, pool, 1); /* tests/debug/: a build skipping it */
#endif
  _expseg_stat_add(&a->stats.reserved_va_bytes, (int64_t)size);
}

/* Reserves a new expandable segment for (pool, stream) of at least `need` bytes, sized by
 * policy (_expseg_segment_va): many streams stay far from the 128 TiB limit. */
static segment_t *expandable_new(expseg_allocator *a, int pool, expseg_stream stream, size_t need,
                                 expseg_status *st) {
  size_t existing = 0;
  for (segment_t *s = a->segments; s; s = s->next_all)
    if (s->expandable && s->pool == pool && s->stream == stream) existing++;
  size_t va = _expseg_segment_va(&a->cfg, pool == POOL_SMALL, existing, need, a->total_mem,
                                 a->page);
  block_t *b;
  segment_t *s = segment_new(a, &b, st);
  if (s == NULL) return NULL;
  uintptr_t base;
  *st = _expseg_vmm_reserve(a->drv, va, 0, &base);
  if (*st != EXPSEG_OK) {
    if (*st == EXPSEG_ERR_OUT_OF_MEMORY) a->oom_kind = OOM_ADDRESS_SPACE;
    free(s);
    _expseg_block_delete(a, b);
    return NULL;
  }
  segment_attach(a, s, b, base, va, pool, stream, true);
  _expseg_unmapped_insert(a, b);
  return s;
}

/* Detaches a fully unmapped expandable segment; its reservation goes into the batch. */
static void expandable_drop(expseg_allocator *a, segment_t *s, release_batch_t *rb) {
  block_t *b = s->first;
  expseg_assert(b->next == NULL && !b->mapped);
  _expseg_unmapped_remove(a, b);
  _expseg_block_delete(a, b);
  segment_unlink(a, s);
  _expseg_stat_pool_add(a->stats.segment, s->pool, -1);
  _expseg_stat_add(&a->stats.reserved_va_bytes, -(int64_t)s->va_size);
  _expseg_batch_push(a, rb, (release_item_t){.va = s->base, .size_va = s->va_size});
  free(s->pages);
  free(s);
}

/* ---- mapping and unmapping pages ---- */

/* Unmaps the whole pages [lo, hi) of free mapped block b (indexed) into the page cache.
 * b is split around them; the unmapped middle merges with unmapped neighbours. On a
 * failed unmap the pages already unmapped stay so and the rest stay mapped. Returns the
 * pages unmapped. */
size_t _expseg_unmap_pages(expseg_allocator *a, block_t *b, uintptr_t lo, uintptr_t hi,
                           expseg_status *st) {
  segment_t *s = b->seg;
  expseg_assert(s->expandable && b->state == BLOCK_FREE && b->mapped && b->indexed);
  expseg_assert(lo >= b->ptr && hi <= b->ptr + b->size && lo < hi);
  *st = EXPSEG_OK;
  /* block structs first (up to three splits), so nothing has to be undone for want of one */
  block_t *spare[3] = {_expseg_block_new(a), _expseg_block_new(a), _expseg_block_new(a)};
  bool ok = spare[0] && spare[1] && spare[2];
  for (int i = 0; i < 3; i++)
    if (spare[i]) _expseg_block_delete(a, spare[i]);
  if (!ok) {
    *st = _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY, "out of host memory for block bookkeeping");
    return 0;
  }
  _expseg_free_remove(a, b);
  block_t *head = NULL, *mid = b, *tail = NULL;
  if (lo > b->ptr) {
    head = b;
    mid = _expseg_block_split(a, b, lo - b->ptr);
  }
  if (hi < mid->ptr + mid->size) tail = _expseg_block_split(a, mid, hi - mid->ptr);
  size_t done = 0, n = (hi - lo) / a->page;
  for (; done < n; done++) {
    uintptr_t addr = lo + done * a->page;
    size_t idx = (addr - s->base) / a->page;
    *st = _expseg_vmm_unmap(a->drv, addr, a->page);
    if (*st != EXPSEG_OK) break;
    if (!_expseg_cache_push(a, s->pages[idx].h, s->pool)) {
      /* no room to remember the chunk: give it back now */
      _expseg_stat_pool_add(a->stats.reserved_bytes, s->pool, -(int64_t)a->page);
      a->stats.released_bytes += (int64_t)a->page;
      _expseg_release_now(a, (release_item_t){.h = s->pages[idx].h, .size_h = a->page, .pool = s->pool});
    }
    s->pages[idx].mapped = false;
  }
  if (done == 0) { /* nothing unmapped: put the block back whole */
    _expseg_free_insert(a, _expseg_block_coalesce(a, mid));
    return 0;
  }
  block_t *rest = done < n ? _expseg_block_split(a, mid, done * a->page) : NULL;
  size_t bytes = done * a->page;
  mid->mapped = false;
  s->mapped_bytes -= bytes;
  _expseg_stat_add(&a->stats.mapped_bytes, -(int64_t)bytes);
  a->stats.num_device_free++;
  EXPSEG_HIST(a, HIST_SEGMENT_UNMAP, lo, bytes, s->stream);
  if (rest != NULL) { /* still mapped after a failed unmap: joins the free tail */
    _expseg_free_insert(a, _expseg_block_coalesce(a, rest));
    tail = NULL;
  }
  if (head) _expseg_free_insert(a, head);
  if (tail) _expseg_free_insert(a, tail);
  _expseg_unmapped_insert(a, _expseg_block_coalesce(a, mid));
  return done;
}

/* Maps k pages from the cache at [lo, lo + k*page) of unmapped block u (indexed), one
 * set_access for the range. Returns the new free mapped block, merged with free mapped
 * neighbours and not indexed; NULL on failure (nothing changed, chunks back in the cache). */
static block_t *map_pages(expseg_allocator *a, block_t *u, uintptr_t lo, size_t k,
                          expseg_status *st) {
  segment_t *s = u->seg;
  expseg_assert(lo == u->ptr && k * a->page <= u->size && a->cache_count >= k);
  size_t first = (lo - s->base) / a->page;
  if (!pages_reserve(s, first + k)) {
    *st = _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY, "out of host memory for page bookkeeping");
    return NULL;
  }
  block_t *rest = NULL;
  if (k * a->page < u->size) {
    rest = _expseg_block_new(a);
    if (rest == NULL) {
      *st = _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY, "out of host memory for block bookkeeping");
      return NULL;
    }
    _expseg_block_delete(a, rest); /* the split below takes it back from the free list */
  }
  size_t done = 0;
  for (; done < k; done++) {
    expseg_vmm_handle h = _expseg_cache_pop(a, s->pool);
    *st = _expseg_vmm_map(a->drv, lo + done * a->page, a->page, h, 0);
    if (*st != EXPSEG_OK) {
      if (!_expseg_cache_push(a, h, s->pool)) {
        _expseg_stat_pool_add(a->stats.reserved_bytes, s->pool, -(int64_t)a->page);
        a->stats.released_bytes += (int64_t)a->page;
        _expseg_release_now(a, (release_item_t){.h = h, .size_h = a->page, .pool = s->pool});
      }
      break;
    }
    s->pages[first + done] = (page_t){.h = h, .mapped = true};
  }
  if (done == k) *st = _expseg_vmm_set_access(a->drv, lo, k * a->page);
  if (done == k && *st == EXPSEG_OK && a->peers) *st = _expseg_peers_grant(a, lo, k * a->page);
  if (done < k || *st != EXPSEG_OK) {
    expseg_status keep = *st;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", expseg_last_error());
    for (size_t i = done; i-- > 0;) {
      expseg_vmm_handle h = s->pages[first + i].h;
      uintptr_t at = lo + i * a->page;
      s->pages[first + i].mapped = false;
      bool unmapped = _expseg_vmm_unmap(a->drv, at, a->page) == EXPSEG_OK;
      if (unmapped && _expseg_cache_push(a, h, s->pool)) continue;
      /* the undo was refused (or no room in the cache): the mapping and the chunk go on
       * the retry list, still counted in reserved_bytes, retried before the next growth
       * (which could otherwise map over it) and before the reservation around it */
      _expseg_stat_pool_add(a->stats.reserved_bytes, s->pool, -(int64_t)a->page);
      a->stats.released_bytes += (int64_t)a->page;
      release_item_t it = {.h = h, .size_h = a->page, .pool = s->pool};
      if (!unmapped) {
        it.map_va = at;
        it.size_map = a->page;
      }
      _expseg_release_keep(a, it);
    }
    *st = _expseg_error_set(keep, "%s", msg);
    return NULL;
  }
  _expseg_unmapped_remove(a, u);
  if (k * a->page < u->size) {
    rest = _expseg_block_split(a, u, k * a->page);
    _expseg_unmapped_insert(a, rest);
  }
  u->mapped = true;
  size_t bytes = k * a->page;
  s->mapped_bytes += bytes;
  _expseg_stat_add(&a->stats.mapped_bytes, (int64_t)bytes);
  a->stats.num_device_alloc++;
  EXPSEG_HIST(a, HIST_SEGMENT_MAP, lo, bytes, s->stream);
  return _expseg_block_coalesce(a, u);
}

/* ---- moving idle pages ---- */

/* Has the work queued on `stream` completed? An event recorded now tells. blocking: wait. */
bool _expseg_stream_idle(expseg_allocator *a, expseg_stream stream, bool blocking,
                         stream_seen_t *seen, size_t *n_seen, size_t max_seen) {
  for (size_t i = 0; i < *n_seen; i++)
    if (seen[i].s == stream) return seen[i].done;
  bool done = false;
  expseg_vmm_event ev;
  if (_expseg_event_get(a, &ev) == EXPSEG_OK) {
    if (_expseg_vmm_event_record(a->drv, ev, stream) == EXPSEG_OK) {
      if (_expseg_vmm_event_query(a->drv, ev, &done) != EXPSEG_OK) done = false;
    }
    _expseg_event_put(a, ev);
  }
  if (!done && blocking) done = _expseg_vmm_stream_synchronize(a->drv, stream) == EXPSEG_OK;
  if (*n_seen < max_seen) seen[(*n_seen)++] = (stream_seen_t){stream, done};
  return done;
}

/* Moves up to `want` idle pages into the page cache for a request of (pool, stream): first
 * from the same pool's idle list (any stream), then from the other pool's (unless that pool
 * took pages from this one just now; always when blocking, on the out-of-memory path);
 * oldest blocks first, never ex1/ex2, and only once an event shows their stream's work is
 * done. Pages are taken from the top of each block. Returns pages moved. */
static size_t steal_pages(expseg_allocator *a, int pool, size_t want, const block_t *ex1,
                          const block_t *ex2, bool blocking) {
  stream_seen_t seen[SEEN_MAX];
  size_t n_seen = 0, got = 0;
  for (int pass = 0; pass < 2 && got < want; pass++) {
    int p = pass == 0 ? pool : 1 - pool;
    if (pass == 1 && !blocking && !_expseg_may_take_back(a->robbed[pool], a->tick)) break;
    block_t *b = a->idle_head[p];
    while (b != NULL && got < want) {
      block_t *next = b->idle_next;
      if (b != ex1 && b != ex2 && _expseg_stream_idle(a, b->stream, blocking, seen, &n_seen, SEEN_MAX)) {
        uintptr_t first;
        size_t n = _expseg_block_whole_pages(a, b, &first);
        size_t take = n < want - got ? n : want - got;
        uintptr_t lo = first + (n - take) * a->page;
        expseg_status st;
        /* unmapping may merge b away; the list's next entry is not b's neighbour (free
         * mapped neighbours are always merged), so `next` stays valid */
        size_t moved = _expseg_unmap_pages(a, b, lo, lo + take * a->page, &st);
        got += moved;
        a->stats.pages_moved += (int64_t)moved;
        if (pass == 1 && moved > 0) a->robbed[p] = a->tick ? a->tick : 1;
        if (st != EXPSEG_OK) return got;
      }
      b = next;
    }
  }
  return got;
}

/* ---- growth ---- */

typedef struct place_s {
  block_t *u, *prefix, *suffix;
  size_t pages; /* to map at u->ptr */
} place_t;

static bool free_mapped(const block_t *b) {
  return b != NULL && b->state == BLOCK_FREE && b->mapped;
}

static bool find_place(expseg_allocator *a, int pool, expseg_stream stream, size_t rounded,
                       place_t *pl) {
  const tree_t *t = &a->unmapped_idx[pool];
  for (block_t *u = _expseg_tree_lower_bound(t, stream, 0, 0); u && u->stream == stream;
       u = _expseg_tree_next(t, u)) {
    block_t *prefix = free_mapped(u->prev) ? u->prev : NULL;
    block_t *suffix = free_mapped(u->next) ? u->next : NULL;
    uintptr_t start = prefix ? prefix->ptr : u->ptr;
    uintptr_t uend = u->ptr + u->size;
    uintptr_t end = uend + (suffix ? suffix->size : 0);
    if (rounded > end - start) continue;
    uintptr_t need = start + rounded;
    if (need <= u->ptr) continue; /* the prefix alone fits: best fit would have found it */
    size_t grow = _expseg_grow_bytes(need - u->ptr, u->seg->mapped_bytes);
    uintptr_t hi = grow >= uend - u->ptr ? uend : u->ptr + _expseg_round_up(grow, a->page);
    if (a->model_pytorch) hi = _expseg_model_map_end(a, u, pool, need);
    *pl = (place_t){u, prefix, suffix, (hi - u->ptr) / a->page};
    return true;
  }
  return false;
}

static bool cap_allows(const expseg_allocator *a, size_t more) {
  size_t held = held_bytes(a) + a->inflight;
  return a->allowed == SIZE_MAX || (held <= a->allowed && more <= a->allowed - held);
}

static expseg_status cap_error(const expseg_allocator *a, size_t more) {
  char b1[32], b2[32], b3[32];
  return _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY,
                           "memory fraction cap: holding %s, %s more would pass the %s allowed",
                           _expseg_format_size(b1, held_bytes(a) + a->inflight),
                           _expseg_format_size(b2, more), _expseg_format_size(b3, a->allowed));
}

/* Creates n chunks with the lock dropped and puts them in the cache. */
static expseg_status create_pages(expseg_allocator *a, int pool, size_t n) {
  size_t bytes = n * a->page;
  if (!cap_allows(a, bytes)) return cap_error(a, bytes);
  expseg_vmm_handle local[64];
  expseg_vmm_handle *hs = n <= 64 ? local : malloc(n * sizeof *hs);
  if (hs == NULL) return _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY, "out of host memory");
  a->inflight += bytes;
  a->unlocked_ops++;
  pthread_mutex_unlock(&a->lock);
  size_t made = 0;
  expseg_status st = EXPSEG_OK;
  for (; made < n; made++) {
    st = _expseg_vmm_create(a->drv, a->page, &hs[made]);
    if (st != EXPSEG_OK) break;
  }
  pthread_mutex_lock(&a->lock);
  a->unlocked_ops--;
  a->inflight -= bytes;
  for (size_t i = 0; i < made; i++) {
    _expseg_stat_pool_add(a->stats.reserved_bytes, pool, (int64_t)a->page);
    a->stats.created_bytes += (int64_t)a->page;
    if (!_expseg_cache_push(a, hs[i], pool)) {
      _expseg_stat_pool_add(a->stats.reserved_bytes, pool, -(int64_t)a->page);
      a->stats.released_bytes += (int64_t)a->page;
      _expseg_release_now(a, (release_item_t){.h = hs[i], .size_h = a->page, .pool = (uint8_t)pool});
    }
  }
  if (hs != local) free(hs);
  return st;
}

static block_t *grow_expandable(expseg_allocator *a, int pool, expseg_stream stream,
                                size_t rounded, bool blocking, expseg_status *st) {
  size_t created = 0; /* pages created for this request so far */
  for (int round = 0; round < 8; round++) {
    place_t pl;
    if (!find_place(a, pool, stream, rounded, &pl)) {
      if (expandable_new(a, pool, stream, rounded, st) == NULL) return NULL;
      if (!find_place(a, pool, stream, rounded, &pl)) {
        *st = _expseg_error_set(EXPSEG_ERR_DRIVER, "internal: new segment cannot place %zu bytes",
                                rounded);
        return NULL;
      }
    }
    if (a->cache_count < pl.pages && !a->model_pytorch) /* PyTorch moves no page */
      steal_pages(a, pool, pl.pages - a->cache_count, pl.prefix, pl.suffix, blocking);
    if (a->cache_count >= pl.pages && _expseg_zombie_mapped_in(a, pl.u->ptr, pl.pages * a->page)) {
      *st = _expseg_error_set(EXPSEG_ERR_DRIVER,
                              "growth at %#lx waits for an unmap the driver refused (kept on "
                              "the retry list and tried again before the next growth)",
                              (unsigned long)pl.u->ptr);
      return NULL;
    }
    if (a->cache_count >= pl.pages) {
      /* stealing never touches u, its prefix or suffix: the place still holds */
      block_t *b = map_pages(a, pl.u, pl.u->ptr, pl.pages, st);
      if (b != NULL && pl.pages > created) a->stats.page_cache_hits += (int64_t)(pl.pages - created);
      return b;
    }
    size_t want = pl.pages - a->cache_count;
    *st = create_pages(a, pool, want);
    if (*st != EXPSEG_OK) return NULL;
    created += want;
    /* the lock was dropped: place again */
  }
  *st = _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY,
                          "pages created for this request kept being taken by other threads");
  return NULL;
}

/* exact: a segment of rounded bytes (single-chunk), else the policy's classic size. */
static block_t *grow_classic(expseg_allocator *a, int pool, expseg_stream stream, size_t rounded,
                             bool exact, expseg_status *st) {
  size_t size = _expseg_round_up(
      exact ? rounded : _expseg_classic_segment_size(&a->cfg, rounded), a->granularity);
  if (!cap_allows(a, size)) {
    *st = cap_error(a, size);
    return NULL;
  }
  block_t *b;
  segment_t *s = segment_new(a, &b, st);
  if (s == NULL) return NULL;
  a->inflight += size;
  a->unlocked_ops++;
  pthread_mutex_unlock(&a->lock);
  uintptr_t base = 0;
  expseg_vmm_handle h = 0;
  bool reserved = false, created = false, mapped = false;
  *st = _expseg_vmm_reserve(a->drv, size, 0, &base);
  if (*st == EXPSEG_OK) {
    reserved = true;
    *st = _expseg_vmm_create(a->drv, size, &h);
  }
  if (*st == EXPSEG_OK) {
    created = true;
    *st = _expseg_vmm_map(a->drv, base, size, h, 0);
  }
  if (*st == EXPSEG_OK) {
    mapped = true;
    *st = _expseg_vmm_set_access(a->drv, base, size);
  }
  pthread_mutex_lock(&a->lock);
  a->unlocked_ops--;
  a->inflight -= size;
  if (*st == EXPSEG_OK && a->peers) *st = _expseg_peers_grant(a, base, size); /* lock held */
  if (*st != EXPSEG_OK) {
    if (!reserved && *st == EXPSEG_ERR_OUT_OF_MEMORY) a->oom_kind = OOM_ADDRESS_SPACE;
    /* undo in reverse, keeping the first failure's message; a refused step goes on the
     * retry list with its accounting */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", expseg_last_error());
    release_item_t it = {.pool = (uint8_t)pool};
    if (mapped) it = (release_item_t){.map_va = base, .size_map = size, .pool = (uint8_t)pool};
    if (created) it.h = h, it.size_h = size;
    if (reserved) it.va = base, it.size_va = size;
    _expseg_release_orphan(a, it);
    _expseg_error_set(*st, "%s", msg);
    free(s);
    _expseg_block_delete(a, b);
    return NULL;
  }
  segment_attach(a, s, b, base, size, pool, stream, false);
  s->handle = h;
  s->mapped_bytes = size;
  _expseg_stat_pool_add(a->stats.reserved_bytes, pool, (int64_t)size);
  s->oversize = _expseg_is_oversize(&a->cfg, size);
  if (s->oversize) _expseg_stat_add(&a->stats.oversize_segments, 1);
  a->stats.num_device_alloc++;
  a->stats.created_bytes += (int64_t)size;
  EXPSEG_HIST(a, HIST_SEGMENT_ALLOC, base, size, stream);
  return b;
}

block_t *_expseg_grow(expseg_allocator *a, int pool, expseg_stream stream, size_t rounded,
                      bool blocking, expseg_status *st) {
  if (a->n_zombies > 0) { /* refused releases first: a mapping left there blocks growth */
    release_batch_t rb = {0};
    _expseg_zombies_retry(a, &rb);
    _expseg_batch_flush(a, &rb);
  }
  if (a->cfg.expandable_segments) return grow_expandable(a, pool, stream, rounded, blocking, st);
  return grow_classic(a, pool, stream, rounded, false, st);
}


block_t *_expseg_grow_single(expseg_allocator *a, int pool, expseg_stream stream,
                             size_t rounded, expseg_status *st) {
  /* Single-chunk segments serve only their own size: cached ones of other sizes in this
   * pool go back before a new one is made (docs/benchmarks.md measures the trade). */
  release_batch_t rb = {0};
  if (a->n_zombies > 0) _expseg_zombies_retry(a, &rb);
  stream_seen_t seen[SEEN_MAX];
  size_t n_seen = 0;
  for (segment_t *s = a->segments, *next; s; s = next) {
    next = s->next_all;
    if (s->single && s->pool == pool && _expseg_classic_is_free(s))
      (void)_expseg_classic_release(a, s, &rb, false, seen, &n_seen);
  }
  _expseg_batch_flush(a, &rb);
  block_t *b = grow_classic(a, pool, stream, rounded, true, st);
  if (b != NULL) b->seg->single = true;
  return b;
}

/* ---- giving memory back ---- */

/* Gives a free classic segment back, but only once the work queued on its stream is done
 * (an event, or with `blocking` a wait): unmapping memory that queued kernels still use
 * would be a use-after-free on the device. false: kept (its stream is busy, or the unmap
 * was refused). */
bool _expseg_classic_release(expseg_allocator *a, segment_t *s, release_batch_t *rb,
                             bool blocking, stream_seen_t *seen, size_t *n_seen) {
  block_t *b = s->first;
  expseg_assert(!s->expandable && b->next == NULL && b->state == BLOCK_FREE);
  if (!_expseg_stream_idle(a, s->stream, blocking, seen, n_seen, SEEN_MAX)) return false;
  _expseg_free_remove(a, b);
  if (_expseg_vmm_unmap(a->drv, s->base, s->va_size) != EXPSEG_OK) {
    _expseg_warn("unmapping a classic segment failed, keeping it: %s", expseg_last_error());
    _expseg_free_insert(a, b);
    return false;
  }
  EXPSEG_HIST(a, HIST_SEGMENT_FREE, s->base, s->va_size, s->stream);
  _expseg_block_delete(a, b);
  segment_unlink(a, s);
  _expseg_stat_pool_add(a->stats.segment, s->pool, -1);
  _expseg_stat_pool_add(a->stats.reserved_bytes, s->pool, -(int64_t)s->va_size);
  _expseg_stat_add(&a->stats.reserved_va_bytes, -(int64_t)s->va_size);
  if (s->oversize) _expseg_stat_add(&a->stats.oversize_segments, -1);
  a->stats.num_device_free++;
  a->stats.released_bytes += (int64_t)s->va_size;
  _expseg_batch_push(a, rb, (release_item_t){.h = s->handle, .size_h = s->va_size, .va = s->base,
                                     .size_va = s->va_size, .pool = s->pool});
  free(s);
  return true;
}

bool _expseg_classic_is_free(const segment_t *s) {
  return !s->expandable && s->first->next == NULL && s->first->state == BLOCK_FREE;
}

size_t _expseg_release_cached(expseg_allocator *a, bool keep_pages) {
  size_t before = held_bytes(a);
  release_batch_t rb = {0};
  _expseg_zombies_retry(a, &rb);
  stream_seen_t seen[SEEN_MAX];
  size_t n_seen = 0;
  for (segment_t *s = a->segments, *next; s; s = next) {
    next = s->next_all;
    if (_expseg_classic_is_free(s)) (void)_expseg_classic_release(a, s, &rb, true, seen, &n_seen);
  }
  if (keep_pages) {
    _expseg_batch_flush(a, &rb);
    return before - held_bytes(a);
  }
  /* every idle page: its stream is synchronized if needed */
  steal_pages(a, POOL_LARGE, SIZE_MAX, NULL, NULL, true);
  for (segment_t *s = a->segments, *next; s; s = next) {
    next = s->next_all;
    if (s->expandable && s->first->next == NULL && !s->first->mapped) expandable_drop(a, s, &rb);
  }
  _expseg_cache_release_oldest(a, a->cache_count, &rb);
  _expseg_batch_flush(a, &rb);
  return before - held_bytes(a);
}

/* Destroy: no accounting any more; a refusal is tried once more, then reported. */
static void destroy_release(expseg_vmm_t *drv, release_item_t it) {
  release_item_t left = _expseg_release_do(drv, it);
  if (left.size_h == 0 && left.size_va == 0) return;
  left = _expseg_release_do(drv, left);
  if (left.size_h > 0 || left.size_va > 0)
    _expseg_warn("destroy: the driver kept %zu bytes of memory and %zu of address space",
                 left.size_h, left.size_va);
}

static void destroy_unmap(expseg_vmm_t *drv, uintptr_t addr, size_t size, release_item_t it) {
  if (_expseg_vmm_unmap(drv, addr, size) == EXPSEG_OK ||
      _expseg_vmm_unmap(drv, addr, size) == EXPSEG_OK) {
    destroy_release(drv, it);
    return;
  }
  _expseg_warn("destroy: unmapping %#lx failed: %s", (unsigned long)addr, expseg_last_error());
}

void _expseg_segments_destroy(expseg_allocator *a) {
  /* memory goes back only after the work queued on its stream is done (a wait); a stream
   * that cannot be waited for is reported, and its memory is given back all the same:
   * the allocator is going away */
  stream_seen_t seen[SEEN_MAX];
  size_t n_seen = 0;
  for (segment_t *s = a->segments; s; s = s->next_all) {
    size_t known = n_seen;
    if (!_expseg_stream_idle(a, s->stream, true, seen, &n_seen, SEEN_MAX) && n_seen > known)
      _expseg_warn("destroy: work queued on stream %#llx could not be waited for (%s); its "
                   "memory is given back anyway",
                   (unsigned long long)s->stream, expseg_last_error());
  }
  /* the retry list first: a refused unmap inside a live segment must go before that
   * segment's reservation can */
  release_item_t *z = a->zombies;
  for (size_t i = 0; i < a->n_zombies; i++) destroy_release(a->drv, z[i]);
  free(a->zombies);
  a->zombies = NULL;
  a->n_zombies = a->cap_zombies = 0;
  for (segment_t *s = a->segments, *next; s; s = next) {
    next = s->next_all;
    if (s->expandable) {
      for (size_t i = 0; i < s->pages_cap; i++)
        if (s->pages[i].mapped)
          destroy_unmap(a->drv, s->base + i * a->page, a->page,
                        (release_item_t){.h = s->pages[i].h, .size_h = a->page});
      destroy_release(a->drv, (release_item_t){.va = s->base, .size_va = s->va_size});
      free(s->pages);
    } else {
      destroy_unmap(a->drv, s->base, s->va_size,
                    (release_item_t){.h = s->handle, .size_h = s->va_size, .va = s->base,
                                     .size_va = s->va_size});
    }
    free(s);
  }
  a->segments = NULL;
  a->n_segments = 0;
  for (size_t i = 0; i < a->cache_count; i++)
    destroy_release(a->drv, (release_item_t){.h = a->cache[i].h, .size_h = a->page});
  a->cache_count = 0;
  free(a->cache);
  a->cache = NULL;
}

static size_t tree_max(const block_t *n) {
  if (n == NULL) return 0;
  size_t m = n->size, l = tree_max(n->t.l), r = tree_max(n->t.r);
  if (l > m) m = l;
  return r > m ? r : m;
}

size_t _expseg_largest_free(const expseg_allocator *a) {
  size_t m = _expseg_fidx_largest(&a->free_idx);
  for (int p = 0; p < POOL_COUNT; p++) {
    size_t x = tree_max(a->free_idx.single[p].root);
    if (x > m) m = x;
  }
  return m;
}
