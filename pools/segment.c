/* SPDX-License-Identifier: Apache-2.0 */
/* segment.c: where memory comes from and goes back to. Classic segments (one chunk each)
 * and expandable segments (a reservation whose pages are mapped on demand), and deciding
 * what to give back.
 *
 * Growth of an expandable segment (docs/design.md):
 *  1. place: the lowest-address unmapped range of the stream's segments that, with the free
 *     mapped block just before it (and after it), fits the request; else a new reservation;
 *  2. chunks: from the page cache; else idle chunks moved from free blocks anywhere (any
 *     stream, any pool, once an event shows their stream's work is done); else created
 *     new, sized from what the growth still needs (_expseg_chunk_pages), with the lock
 *     dropped, within the memory-fraction cap;
 *  3. map each chunk with one call, then ONE set_access for the whole new range (pages.c).
 * Physical memory is thus created once and reused; it goes back to the driver only on
 * empty_cache, garbage collection, the out-of-memory path, the page-cache bound, or destroy,
 * and only once the work queued on its stream is done. How it goes back (batches with the
 * lock dropped, the retry list of refusals, the page cache) is release.c's; what garbage
 * collection gives back, gc.c's. */
#include "block.h"
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

/* A segment struct and its first block, or NULL (message set) when out of host memory. */
static segment_t *segment_new(expseg_allocator *a, block_t **first, expseg_status *st) {
  segment_t *s = calloc(1, sizeof *s);
  block_t *b = _expseg_block_new(a);
  if (s == NULL || b == NULL) {
    free(s);
    if (b) _expseg_block_delete(a, b);
    *st = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "out of host memory for segment bookkeeping");
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
  const size_t existing = _expseg_segcount_of(a, pool, stream); /* O(1): segcount.c */
  const size_t page = _expseg_pool_page(a, pool);
  /* PyTorch reserves 9/8 of device memory for every segment */
  size_t va = a->model_pytorch
                  ? _expseg_round_up(a->total_mem + a->total_mem / 8, page)
                  : _expseg_segment_va(&a->cfg, pool == POOL_SMALL, existing, need,
                                       a->total_mem, page,
                                       _expseg_reserve_class_of(a, skey_stream(stream)));
  if (va < need) va = _expseg_round_up(need, page);
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
  _expseg_segcount_add(a, s, 1);
  s->page = page;
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
  _expseg_segcount_add(a, s, -1);
  _expseg_stat_pool_add(a->stats.segment, s->pool, -1);
  _expseg_stat_add(&a->stats.reserved_va_bytes, -(int64_t)s->va_size);
  _expseg_batch_push(a, rb, (release_item_t){.va = s->base, .size_va = s->va_size});
  free(s->pages);
  free(s);
}

/* ---- streams ---- */

/* Has the work queued on `stream` completed? An event recorded now tells. blocking: wait. */
bool _expseg_stream_idle(expseg_allocator *a, expseg_stream stream, bool blocking,
                         stream_seen_t *seen, size_t *n_seen, size_t max_seen) {
  stream = skey_stream(stream); /* a private pool's stream key: its stream */
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

/* ---- growth ---- */

typedef struct place_s {
  block_t *u, *prefix, *suffix;
  size_t pages;  /* to map at u->ptr */
  bool surplus;  /* pages beyond the request's (the floor or the minimum) among them */
} place_t;

/* The most bytes allocated at once in the allocator's life, `rounded` more than now
 * included: the peak that the growth policy measures memory held against (a reset of the
 * peak statistics does not lower it). */
static size_t allocated_most_bytes(const expseg_allocator *a, size_t rounded) {
  int64_t m = a->stats.allocated_bytes[STAT_ALL].peak;
  if (a->allocated_most > m) m = a->allocated_most;
  const size_t now = (size_t)stat_all_current(a->stats.allocated_bytes) + rounded;
  return (size_t)m > now ? (size_t)m : now;
}

static bool free_mapped(const block_t *b) {
  return b != NULL && b->state == BLOCK_FREE && b->mapped;
}

/* The place unmapped range u gives a request of `rounded` bytes: with the free mapped block
 * just before it (and after it), the pages to map at u->ptr. false: it does not fit. */
static bool place_at(expseg_allocator *a, block_t *u, int pool, size_t rounded, bool exact,
                     size_t ours, place_t *pl) {
  block_t *prefix = free_mapped(u->prev) ? u->prev : NULL;
  block_t *suffix = free_mapped(u->next) ? u->next : NULL;
  uintptr_t start = prefix ? prefix->ptr : u->ptr;
  uintptr_t uend = u->ptr + u->size;
  uintptr_t end = uend + (suffix ? suffix->size : 0);
  if (rounded > end - start) return false;
  uintptr_t need = start + rounded;
  if (need <= u->ptr) return false; /* the prefix alone fits: best fit would have found it */
  const size_t pg = u->seg->page;
  /* exact (memory is short: the out-of-memory retry): no floor or minimum; else the
   * policy's (_expseg_grow_for: none either near the bound of memory held). Held: less the
   * `ours` bytes created for this request and cached, which this growth maps (counted in
   * held, they would shrink a growth placed again after creating them, and its chunks would
   * no longer be the ones created for it) */
  const size_t held = held_bytes(a);
  size_t grow = exact ? need - u->ptr
                      : _expseg_grow_for(need - u->ptr, pg, u->seg->mapped_bytes,
                                         pool == POOL_SMALL, held > ours ? held - ours : 0,
                                         allocated_most_bytes(a, rounded), rounded);
  uintptr_t hi = grow >= uend - u->ptr ? uend : u->ptr + _expseg_round_up(grow, pg);
  if (a->model_pytorch) hi = _expseg_model_map_end(a, u, pool, need);
  /* a mapping the driver refused to remove (on the retry list) blocks this range: grow
   * elsewhere, a new reservation if need be */
  if (_expseg_zombie_mapped_in(a, u->ptr, hi - u->ptr)) return false;
  *pl = (place_t){u, prefix, suffix, (hi - u->ptr) / pg,
                  hi - u->ptr > _expseg_round_up(need - u->ptr, pg)};
  return true;
}

/* Pages of idle free block b (NULL: none) that a growth into a place of `room` pages of
 * `pg` bytes could move there: whole chunks of that page size from the block's top, none
 * larger than the room (as _expseg_steal_pages takes them). */
static size_t movable_in(const expseg_allocator *a, const block_t *b, size_t pg, size_t room) {
  uintptr_t lo, hi;
  if (b == NULL || !b->idle || b->seg->page != pg || _expseg_block_chunks(a, b, &lo, &hi) == 0)
    return 0;
  return (hi - _expseg_chunks_top(b->seg, lo, hi, SIZE_MAX, room, false)) / pg;
}

/* The same over the idle blocks of both pools (the retry's growth takes from both) that a
 * growth of private-pool tag `tag` may take (as _expseg_steal_pages takes them). */
static size_t movable_pages(const expseg_allocator *a, uint32_t tag, size_t pg, size_t room) {
  size_t n = 0;
  for (int p = 0; p < POOL_COUNT; p++)
    for (const block_t *f = a->idle_head[p]; f != NULL; f = f->idle_next)
      if (seg_tag(f->seg) == tag || _expseg_seg_general(a, f->seg)) n += movable_in(a, f, pg, room);
  return n;
}

/* Where a growth for `stream` maps (policy: reuse before growth, _expseg_place_better): the
 * lowest-address place of the stream's own unmapped ranges that fits (in the out-of-memory
 * retry every one is weighed: _expseg_place_fewest_pages, _expseg_place_fewer); then the place of
 * another stream of the same pool whose queued work is done that needs the fewest new
 * pages, when it needs fewer (its free blocks around the range serve more of the request).
 * The block mapped there is that stream's and is lent (streams.c). Not under PyTorch's
 * model, nor while blocks the stream freed wait for its work. */
static bool find_place(expseg_allocator *a, int pool, expseg_stream stream, size_t rounded,
                       bool exact, size_t ours, place_t *pl) {
  const tree_t *t = &a->unmapped_idx[pool];
  bool found = false;
  const bool weigh = !a->model_pytorch && _expseg_place_fewest_pages(exact);
  /* every idle chunk of page size all_pg, and their pages: a place with at least that room
   * takes them all, a smaller one counts those that fit it */
  size_t all_pg = 0, all = 0, best_missing = 0;
  /* a smaller place recounts (a walk of the idle blocks) at most RECOUNTS times: beyond,
   * it is taken to have what it needs elsewhere, so the retry stays linear in the blocks */
  enum { RECOUNTS = 64 };
  unsigned recounts = 0;
  for (block_t *u = _expseg_tree_lower_bound(t, stream, 0, 0); u && u->stream == stream;
       u = _expseg_tree_next(t, u)) {
    place_t here;
    if (!place_at(a, u, pool, rounded, exact, ours, &here)) continue;
    if (!weigh) {
      *pl = here;
      found = true;
      break;
    }
    /* what idle chunks elsewhere could bring (the place's own neighbours stay put) */
    const size_t pg = here.u->seg->page, room = here.u->size / pg;
    if (pg != all_pg) {
      all_pg = pg;
      all = movable_pages(a, skey_tag(stream), pg, SIZE_MAX);
    }
    const size_t idle = room >= all || recounts >= RECOUNTS
                            ? all
                            : (recounts++, movable_pages(a, skey_tag(stream), pg, room));
    const size_t near = movable_in(a, here.prefix, pg, room) + movable_in(a, here.suffix, pg, room);
    const size_t other = idle > near ? idle - near : 0;
    const size_t missing = here.pages > other ? here.pages - other : 0;
    if (!found || _expseg_place_fewer(missing, here.pages, best_missing, pl->pages)) {
      *pl = here;
      best_missing = missing;
    }
    found = true;
  }
  /* not while blocks this stream freed still wait for its work: on a GPU with a deep queue
   * each growth there would be lent again and wait again, where the stream's own memory is
   * reusable on it at once */
  if (a->model_pytorch || _expseg_stream_frees_pending(a, skey_stream(stream))) return found;
  const bool own = found;
  const size_t own_pages = found ? pl->pages : 0;
  stream_seen_t seen[SEEN_MAX];
  size_t n_seen = 0, scan = EXPSEG_LEND_SCAN;
  /* another stream's place with a free block before it: the oldest idle blocks (policy.h) */
  for (block_t *f = a->idle_head[pool]; f != NULL && scan > 0; f = f->idle_next, scan--) {
    block_t *u = f->next;
    place_t other;
    if (u == NULL || u->mapped || u->stream == stream || seg_tag(u->seg) != skey_tag(stream) ||
        !place_at(a, u, pool, rounded, exact, ours, &other) ||
        !_expseg_place_better(own, own_pages, other.pages) ||
        (found && pl->u->stream != stream && other.pages >= pl->pages) ||
        !_expseg_stream_idle(a, u->stream, false, seen, &n_seen, SEEN_MAX))
      continue;
    *pl = other;
    found = true;
  }
  return found;
}

bool _expseg_cap_allows(const expseg_allocator *a, size_t more) {
  size_t held = held_bytes(a) + a->inflight;
  return a->allowed == SIZE_MAX || (held <= a->allowed && more <= a->allowed - held);
}

static expseg_status cap_error(expseg_allocator *a, size_t more) {
  char b1[32], b2[32], b3[32];
  a->oom_kind = OOM_FRACTION; /* refused before any driver call (num_oom_rejections) */
  return _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY,
                           "memory fraction cap: holding %s, %s more would pass the %s allowed",
                           _expseg_format_size(b1, held_bytes(a) + a->inflight),
                           _expseg_format_size(b2, more), _expseg_format_size(b3, a->allowed));
}

/* Pages of the next chunk when `left` of `pages` are still to create, the first `req` of
 * them a request's own (policy: _expseg_chunk_pages, _expseg_request_pages), bounded by
 * chunk_max_mb (_expseg_chunk_limit). */
static size_t next_chunk(const expseg_allocator *a, size_t pages, size_t req, size_t left,
                         size_t pg) {
  const size_t done = pages - left;
  return _expseg_chunk_limit(done < req
                                 ? _expseg_chunk_pages(a->model_pytorch, req - done, pg, true, pages)
                                 : _expseg_chunk_pages(a->model_pytorch, left, pg, false, pages),
                             a->cfg.chunk_max, pg);
}

/* Creates chunks for `pages` pages of pg bytes with the lock dropped, the first `req` of
 * them the request's own, and puts them in the cache (a chunk it has no host memory to keep
 * is given back: EXPSEG_ERR_HOST_OUT_OF_MEMORY); *made_pages: the pages it put there, all
 * of them or those created before a failure. */
static expseg_status create_chunks(expseg_allocator *a, int pool, size_t pages, size_t req,
                                   size_t pg, size_t *made_pages) {
  size_t bytes = pages * pg, n = 0;
  *made_pages = 0;
  if (!_expseg_cap_allows(a, bytes)) return cap_error(a, bytes);
  for (size_t left = pages; left > 0; n++) left -= next_chunk(a, pages, req, left, pg);
  expseg_vmm_handle local_h[64];
  size_t local_s[64];
  expseg_vmm_handle *hs = n <= 64 ? local_h : malloc(n * sizeof *hs);
  size_t *sz = n <= 64 ? local_s : malloc(n * sizeof *sz);
  if (hs == NULL || sz == NULL) {
    if (hs != local_h) free(hs);
    if (sz != local_s) free(sz);
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "out of host memory");
  }
  for (size_t i = 0, left = pages; i < n; i++) {
    size_t k = next_chunk(a, pages, req, left, pg);
    sz[i] = k * pg;
    left -= k;
  }
  a->inflight += bytes;
  a->unlocked_ops++;
  pthread_mutex_unlock(&a->lock);
  size_t made = 0;
  expseg_status st = EXPSEG_OK;
  for (; made < n; made++) {
    st = _expseg_vmm_create(a->drv, sz[made], &hs[made]);
    if (st != EXPSEG_OK) break;
  }
  pthread_mutex_lock(&a->lock);
  a->unlocked_ops--;
  a->inflight -= bytes;
  for (size_t i = 0; i < made; i++) {
    _expseg_stat_pool_add(a->stats.reserved_bytes, pool, (int64_t)sz[i]);
    a->stats.created_bytes += (int64_t)sz[i];
    if (_expseg_cache_push(a, hs[i], pool, sz[i])) {
      *made_pages += sz[i] / pg;
    } else { /* no room to keep it: given back */
      _expseg_stat_pool_add(a->stats.reserved_bytes, pool, -(int64_t)sz[i]);
      a->stats.released_bytes += (int64_t)sz[i];
      _expseg_release_now(a, (release_item_t){.h = hs[i], .size_h = sz[i], .pool = (uint8_t)pool});
      if (st == EXPSEG_OK) /* else placing again finds the pages missing, round after round */
        st = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                               "out of host memory for the page cache of a growth");
    }
  }
  if (hs != local_h) free(hs);
  if (sz != local_s) free(sz);
  return st;
}

static block_t *grow_expandable(expseg_allocator *a, int pool, expseg_stream stream,
                                size_t rounded, bool blocking, expseg_status *st) {
  size_t created = 0, ours = 0; /* pages, and bytes, created for this request so far */
  size_t lead = 0;    /* pages of the first chunk created as the request's own */
  /* only what the request lacks (no floor or minimum): memory is short (the retry), or a
   * growth with the floor's or minimum's pages did not fit under the cap or on the device,
   * where the request's own may (placed again below, before any out-of-memory retry; not
   * under PyTorch's model, whose growth maps its 20 MiB pages either way) */
  bool exact = blocking;
  /* move idle chunks whatever the memory held (_expseg_move_first): memory is short, or
   * creating was refused */
  bool move_any = blocking;
  for (int round = 0; round < 8; round++) {
    place_t pl;
    if (!find_place(a, pool, stream, rounded, exact, ours, &pl)) {
      if (expandable_new(a, pool, stream, rounded, st) == NULL) return NULL;
      if (!find_place(a, pool, stream, rounded, exact, ours, &pl)) {
        *st = _expseg_error_set(EXPSEG_ERR_DRIVER, "internal: new segment cannot place %zu bytes",
                                rounded);
        return NULL;
      }
    }
    const size_t pg = pl.u->seg->page, room = pl.u->size / pg;
    /* where the request ends, from the place on (into the suffix, perhaps) */
    const uintptr_t end = (pl.prefix ? pl.prefix->ptr : pl.u->ptr) + rounded;
    size_t have = 0;
    bool known = _expseg_cache_cover(a, pg, pl.pages, room, &have);
    if (known && have < pl.pages && !a->model_pytorch && /* PyTorch moves no page */
        (move_any || _expseg_move_first(held_bytes(a), (pl.pages - have) * pg,
                                        allocated_most_bytes(a, rounded)))) {
      const size_t keep = _expseg_suffix_keep(
          move_any, pl.suffix && end > pl.suffix->ptr ? end - pl.suffix->ptr : 0);
      _expseg_steal_pages(a, pool, pg, pl.pages - have, room, pl.prefix, pl.suffix, keep,
                          blocking, skey_tag(stream), true);
      known = _expseg_cache_cover(a, pg, pl.pages, room, &have);
    }
    if (!known) { /* not knowing what the cache holds, creating more would only add to it */
      *st = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                              "out of host memory choosing cached pages for the growth");
      return NULL;
    }
    if (have >= pl.pages && _expseg_zombie_mapped_in(a, pl.u->ptr, have * pg)) {
      *st = _expseg_error_set(EXPSEG_ERR_DRIVER,
                              "growth at %#lx waits for an unmap the driver refused (kept on "
                              "the retry list and tried again before the next growth)",
                              (unsigned long)pl.u->ptr);
      return NULL;
    }
    if (have >= pl.pages) {
      /* stealing never touches u, its prefix, nor the suffix's lowest chunk and what the
       * request needs of it: the place still holds */
      block_t *b = _expseg_map_cached(a, pl.u, pl.pages, lead, st);
      if (b != NULL && have > created) a->stats.page_cache_hits += (int64_t)(have - created);
      return b;
    }
    size_t want = pl.pages - have;
    /* the request's whole pages from the place on, less those the cache covers */
    size_t mine = end > pl.u->ptr ? (end - pl.u->ptr) / pg : 0;
    mine = a->model_pytorch ? 0 : _expseg_request_pages(want, mine > have ? mine - have : 0, pg,
                                                            rounded);
    if (mine > 0)
      lead = _expseg_chunk_limit(_expseg_chunk_pages(false, mine, pg, true, want), a->cfg.chunk_max,
                                 pg);
    size_t made = 0; /* pages created: all of them, or those before a refusal */
    *st = create_chunks(a, pool, want, mine, pg, &made);
    created += made; /* this request's pages, not page-cache hits, wherever they are mapped */
    ours += made * pg;
    if (*st == EXPSEG_ERR_OUT_OF_MEMORY && !move_any && !a->model_pytorch &&
        (a->idle_head[POOL_SMALL] != NULL || a->idle_head[POOL_LARGE] != NULL)) {
      move_any = true; /* the cap or the device refused: idle chunks (the suffix's too) first */
      a->oom_kind = OOM_MEMORY;
      continue;
    }
    if (*st == EXPSEG_ERR_OUT_OF_MEMORY && !exact && pl.surplus && !a->model_pytorch) {
      exact = true; /* the pages created stay cached: placed again, the growth maps them */
      a->oom_kind = OOM_MEMORY; /* what refused the surplus may not refuse the rest */
      continue;
    }
    if (*st != EXPSEG_OK) return NULL;
    /* the lock was dropped: place again */
  }
  *st = _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY,
                          "pages created for this request kept being taken by other threads");
  return NULL;
}

/* exact: a segment of rounded bytes (single-chunk), else the policy's classic size. */
static block_t *grow_classic(expseg_allocator *a, int pool, expseg_stream stream, size_t rounded,
                             bool exact, expseg_status *st) {
  const size_t want = exact ? rounded : _expseg_classic_segment_size(&a->cfg, rounded);
  size_t size = _expseg_round_up(want, a->granularity);
  if (size == 0 || size > a->total_mem) { /* large_segment_size_mb beyond the device: no call */
    char b1[32], b2[32];
    *st = _expseg_error_set(EXPSEG_ERR_OUT_OF_MEMORY,
                            "a classic segment of %s%s is larger than the whole device (%s)",
                            _expseg_format_size(b1, want),
                            want == a->cfg.large_segment_size ? " (large_segment_size_mb)" : "",
                            _expseg_format_size(b2, a->total_mem));
    return NULL;
  }
  if (!_expseg_cap_allows(a, size)) {
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
  _expseg_ppool_reserved(a, s, (int64_t)size);
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
    if (s->single && s->pool == pool && _expseg_classic_is_free(s) &&
        (seg_tag(s) == 0 || seg_tag(s) == skey_tag(stream)))
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
  _expseg_ppool_reserved(a, s, -(int64_t)s->va_size);
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
  if (a->model_pytorch) keep_pages = false; /* PyTorch's OOM retry unmaps every free page */
  size_t before = held_bytes(a);
  release_batch_t rb = {0};
  _expseg_zombies_retry(a, &rb);
  stream_seen_t seen[SEEN_MAX];
  size_t n_seen = 0;
  for (segment_t *s = a->segments, *next; s; s = next) {
    next = s->next_all;
    if (_expseg_classic_is_free(s) && _expseg_seg_general(a, s))
      (void)_expseg_classic_release(a, s, &rb, true, seen, &n_seen);
  }
  if (keep_pages) {
    _expseg_batch_flush(a, &rb);
    return before - held_bytes(a);
  }
  /* PyTorch gives a segment's reservation back only when unmapping a free block left it
   * wholly unmapped (release_blocks): one that mapped nothing stays */
  for (segment_t *s = a->segments; s; s = s->next_all)
    s->keep_va = a->model_pytorch && s->expandable && s->mapped_bytes == 0;
  /* every idle page: its stream is synchronized if needed */
  _expseg_steal_pages(a, POOL_LARGE, 0, SIZE_MAX, SIZE_MAX, NULL, NULL, 0, true, 0, true);
  for (segment_t *s = a->segments, *next; s; s = next) {
    next = s->next_all;
    if (s->expandable && !s->keep_va && s->first->next == NULL && !s->first->mapped &&
        _expseg_seg_general(a, s))
      expandable_drop(a, s, &rb);
  }
  _expseg_cache_release_oldest(a, a->cache_count, &rb);
  _expseg_batch_flush(a, &rb);
  return before - held_bytes(a);
}

bool _expseg_release_pool_memory(expseg_allocator *a, uint32_t tag, bool blocking) {
  release_batch_t rb = {0};
  stream_seen_t seen[SEEN_MAX];
  size_t n_seen = 0, left = 0;
  for (segment_t *s = a->segments, *next; s; s = next) {
    next = s->next_all;
    if (seg_tag(s) == tag && _expseg_classic_is_free(s))
      (void)_expseg_classic_release(a, s, &rb, blocking, seen, &n_seen);
  }
  /* its idle pages go to the top of the page cache, and from there to the driver: the
   * small ones in a pass of their own (a steal's second pass, the other size, is held back
   * for a while after a move between sizes; a pool's give-back must not be) */
  const size_t top = a->cache_count;
  for (int p = POOL_LARGE; p >= POOL_SMALL; p--)
    _expseg_steal_pages(a, p, 0, SIZE_MAX, SIZE_MAX, NULL, NULL, 0, blocking, tag, false);
  while (a->cache_count > top) _expseg_cache_release_at(a, a->cache_count - 1, &rb);
  for (segment_t *s = a->segments, *next; s; s = next) {
    next = s->next_all;
    if (seg_tag(s) != tag) continue;
    if (s->expandable && s->first->next == NULL && !s->first->mapped) expandable_drop(a, s, &rb);
    else left++;
  }
  _expseg_batch_flush(a, &rb);
  return left == 0;
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
        if (s->pages[i].mapped && s->pages[i].off == 0) { /* one chunk, mapped whole */
          const size_t bytes = s->pages[i].n * s->page;
          destroy_unmap(a->drv, s->base + i * s->page, bytes,
                        (release_item_t){.h = s->pages[i].h, .size_h = bytes});
        }
      destroy_release(a->drv, (release_item_t){.va = s->base, .size_va = s->va_size});
      free(s->pages);
    } else if (s->mapped_bytes == 0) { /* its region slept: nothing mapped (sleep.c) */
      destroy_release(a->drv, (release_item_t){.va = s->base, .size_va = s->va_size});
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
    destroy_release(a->drv, (release_item_t){.h = a->cache[i].h, .size_h = a->cache[i].size});
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
