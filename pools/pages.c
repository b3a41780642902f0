/* SPDX-License-Identifier: Apache-2.0 */
/* pages.c: mapping and unmapping physical chunks in expandable segments, the page cache's
 * choice of chunks for a growth, and moving idle chunks to where they are needed.
 *
 * A segment is mapped in pages of its page size (seg->page), and each mapped page belongs
 * to one physical chunk of one or more pages, mapped by ONE map call and unmapped by ONE
 * (CUDA maps a chunk only whole, from offset 0, and unmaps only whole mappings):
 * pages[i].off is page i's index in its chunk, pages[i].n the chunk's pages. Under the
 * PyTorch model every chunk is one page (PyTorch's ExpandableSegment); expseg creates one
 * chunk sized from the growth it serves (policy: _expseg_chunk_pages), so growing by 40 MiB
 * is one create, one map and one set_access instead of twenty of each (docs/design.md,
 * "Expandable segments and pages"). What can be unmapped, moved or given back is therefore
 * whole chunks lying inside a free block; the page cache holds unmapped chunks of any size
 * (each a multiple of its segment's page). */
#include "block.h"
#include "error.h"
#include "release.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- whole chunks inside a free block ---- */

size_t _expseg_block_chunks(const expseg_allocator *a, const block_t *b, uintptr_t *lo,
                            uintptr_t *hi) {
  uintptr_t first;
  const segment_t *s = b->seg;
  const size_t pg = s->page;
  size_t n = _expseg_block_whole_pages(a, b, &first);
  if (n == 0) return 0;
  size_t i = (first - s->base) / pg, j = i + n; /* pages [i, j) */
  if (s->pages[i].off != 0) i += s->pages[i].n - s->pages[i].off; /* the next chunk's start */
  if (j > i && s->pages[j - 1].off + 1 != s->pages[j - 1].n) j -= s->pages[j - 1].off + 1;
  if (j <= i) return 0;
  *lo = s->base + i * pg;
  *hi = s->base + j * pg;
  return j - i;
}

uintptr_t _expseg_chunks_top(const segment_t *s, uintptr_t lo, uintptr_t hi, size_t want,
                             size_t max_pages, bool at_most) {
  const size_t pg = s->page;
  size_t i = (hi - s->base) / pg, stop = (lo - s->base) / pg, got = 0;
  while (i > stop && got < want) {
    const page_t *last = &s->pages[i - 1]; /* the top chunk below page i */
    if (last->n > max_pages || (at_most && got + last->n > want)) break;
    i -= last->n;
    got += last->n;
  }
  return s->base + i * pg;
}

/* ---- unmapping ---- */

/* Unmaps the chunks [lo, hi) of free mapped block b (indexed; lo and hi chunk boundaries)
 * into the page cache, or, under the PyTorch model, gives each chunk back at once. b is
 * split around them; the unmapped middle merges with unmapped neighbours. On a failed unmap
 * the chunks already unmapped stay so and the rest stay mapped. Returns the pages
 * unmapped. */
size_t _expseg_unmap_pages(expseg_allocator *a, block_t *b, uintptr_t lo, uintptr_t hi,
                           expseg_status *st) {
  segment_t *s = b->seg;
  const size_t pg = s->page;
  expseg_assert(s->expandable && b->state == BLOCK_FREE && b->mapped && b->indexed);
  expseg_assert(lo >= b->ptr && hi <= b->ptr + b->size && lo < hi);
  *st = EXPSEG_OK;
  /* block structs first (up to three splits), so nothing has to be undone for want of one */
  block_t *spare[3] = {_expseg_block_new(a), _expseg_block_new(a), _expseg_block_new(a)};
  bool ok = spare[0] && spare[1] && spare[2];
  for (int i = 0; i < 3; i++)
    if (spare[i]) _expseg_block_delete(a, spare[i]);
  if (!ok) {
    *st = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "out of host memory for block bookkeeping");
    return 0;
  }
  _expseg_free_remove(a, b);
  block_t *head = NULL, *mid = b, *tail = NULL;
  if (lo > b->ptr) {
    head = b;
    mid = _expseg_block_split(a, b, lo - b->ptr);
  }
  if (hi < mid->ptr + mid->size) tail = _expseg_block_split(a, mid, hi - mid->ptr);
  size_t done = 0, n = (hi - lo) / pg;
  while (done < n) {
    uintptr_t addr = lo + done * pg;
    size_t idx = (addr - s->base) / pg, k = s->pages[idx].n;
    expseg_assert(s->pages[idx].off == 0 && done + k <= n);
    const size_t bytes = k * pg;
    *st = _expseg_vmm_unmap(a->drv, addr, bytes);
    if (*st != EXPSEG_OK) break;
    /* PyTorch releases a page's chunk as it unmaps it (no page cache, model.c); so does
     * expseg when there is no room to remember the chunk */
    if (a->model_pytorch || !_expseg_cache_push(a, s->pages[idx].h, s->pool, bytes)) {
      _expseg_stat_pool_add(a->stats.reserved_bytes, s->pool, -(int64_t)bytes);
      a->stats.released_bytes += (int64_t)bytes;
      _expseg_release_now(a, (release_item_t){.h = s->pages[idx].h, .size_h = bytes, .pool = s->pool});
    }
    for (size_t i = 0; i < k; i++) s->pages[idx + i].mapped = false;
    done += k;
  }
  if (done == 0) { /* nothing unmapped: put the block back whole */
    _expseg_block_release(a, mid);
    return 0;
  }
  block_t *rest = done < n ? _expseg_block_split(a, mid, done * pg) : NULL;
  size_t bytes = done * pg;
  mid->mapped = false;
  s->mapped_bytes -= bytes;
  _expseg_ppool_reserved(a, s, -(int64_t)bytes);
  _expseg_stat_add(&a->stats.mapped_bytes, -(int64_t)bytes);
  a->stats.num_device_free++;
  EXPSEG_HIST(a, HIST_SEGMENT_UNMAP, lo, bytes, s->stream);
  if (rest != NULL) { /* still mapped after a failed unmap: joins the free tail */
    _expseg_block_release(a, rest);
    tail = NULL;
  }
  if (head) _expseg_free_insert(a, head);
  if (tail) _expseg_free_insert(a, tail);
  _expseg_unmapped_insert(a, _expseg_block_coalesce(a, mid));
  return done;
}

/* ---- choosing cached chunks and mapping them ---- */

/* Which cached chunks to map for k pages of pg bytes, at most room pages: the smallest
 * chunk that covers what is left, else the largest and go on (a chunk larger than needed
 * is mapped whole: the memory is held either way); among equal sizes the newest. exact
 * (the PyTorch model): chunks of one page only, k of them. Indexes into a->cache in pick[]
 * (at most cache_count), in the order to map them, their pages in *got. O(n log n) in the
 * cache's size. false: no host memory to sort the candidates (nothing picked). */
typedef struct cand_s {
  size_t pages, idx;
} cand_t;

static int cand_cmp(const void *x, const void *y) {
  const cand_t *a = x, *b = y;
  if (a->pages != b->pages) return a->pages < b->pages ? -1 : 1;
  return a->idx > b->idx ? -1 : a->idx < b->idx; /* newer (higher index) first */
}

static bool cache_pick(const expseg_allocator *a, size_t pg, size_t k, size_t room, bool exact,
                       size_t *pick, size_t *m, size_t *got_out) {
  *m = *got_out = 0;
  cand_t *c = malloc((a->cache_count ? a->cache_count : 1) * sizeof *c);
  if (c == NULL) return false;
  size_t n = 0, got = 0;
  for (size_t i = 0; i < a->cache_count; i++) {
    const size_t sz = a->cache[i].size, p = sz / pg;
    if (sz % pg == 0 && p > 0 && (!exact || p == 1) && p <= room) c[n++] = (cand_t){p, i};
  }
  qsort(c, n, sizeof *c, cand_cmp);
  size_t hi = n; /* candidates [0, hi) are unused; only the largest are ever taken before
                  * the last pick, so the unused ones stay a prefix */
  while (got < k) {
    while (hi > 0 && c[hi - 1].pages > room - got) hi--; /* no longer fits */
    if (hi == 0) break;
    const size_t r = k - got;
    size_t lo = 0, up = hi; /* the smallest chunk of at least r pages */
    while (lo < up) {
      size_t mid = lo + (up - lo) / 2;
      if (c[mid].pages < r) lo = mid + 1;
      else up = mid;
    }
    const size_t j = lo < hi ? lo : hi - 1;
    pick[(*m)++] = c[j].idx;
    got += c[j].pages;
    if (j == hi - 1) hi--;
    else break; /* it covers the rest */
  }
  free(c);
  *got_out = got;
  return true;
}

bool _expseg_cache_cover(const expseg_allocator *a, size_t pg, size_t k, size_t room,
                         size_t *have) {
  *have = 0;
  if (a->cache_count == 0) return true;
  size_t *pick = malloc(a->cache_count * sizeof *pick), m;
  const bool ok = pick != NULL && cache_pick(a, pg, k, room, a->model_pytorch, pick, &m, have);
  free(pick);
  return ok;
}

typedef struct taken_s {
  expseg_vmm_handle h;
  size_t size;
} taken_t;

/* Gives chunks taken from the cache back to it (or to the driver). */
static void put_back(expseg_allocator *a, segment_t *s, const taken_t *c, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (_expseg_cache_push(a, c[i].h, s->pool, c[i].size)) continue;
    _expseg_stat_pool_add(a->stats.reserved_bytes, s->pool, -(int64_t)c[i].size);
    a->stats.released_bytes += (int64_t)c[i].size;
    _expseg_release_now(a, (release_item_t){.h = c[i].h, .size_h = c[i].size, .pool = s->pool});
  }
}

block_t *_expseg_map_cached(expseg_allocator *a, block_t *u, size_t k, size_t lead,
                           expseg_status *st) {
  segment_t *s = u->seg;
  const size_t pg = s->page, room = u->size / pg, lo = u->ptr;
  size_t *pick = malloc((a->cache_count ? a->cache_count : 1) * sizeof *pick), m = 0;
  taken_t *c = malloc((a->cache_count ? a->cache_count : 1) * sizeof *c);
  size_t K = 0;
  const bool picked = pick && c && cache_pick(a, pg, k, room, a->model_pytorch, pick, &m, &K);
  const size_t first = (lo - s->base) / pg;
  block_t *rest = NULL;
  if (K >= k && K < room) {
    rest = _expseg_block_new(a);
    if (rest != NULL) _expseg_block_delete(a, rest); /* the split below takes it back */
  }
  if (!picked || K < k || !pages_reserve(s, first + K) || (K < room && rest == NULL)) {
    free(pick);
    free(c);
    const bool short_of_pages = picked && K < k; /* host memory was there: a bug */
    *st = _expseg_error_set(short_of_pages ? EXPSEG_ERR_DRIVER : EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                            short_of_pages ? "internal: the page cache cannot cover the growth"
                                           : "out of host memory for page bookkeeping");
    return NULL;
  }
  /* mapped in the order picked, but a chunk of `lead` pages (created as the request's own)
   * first: at the start of the place, under the request */
  for (size_t i = 0; i < m; i++) c[i] = (taken_t){a->cache[pick[i]].h, a->cache[pick[i]].size};
  for (size_t i = 1; lead > 0 && i < m; i++)
    if (c[i].size == lead * pg && c[0].size != lead * pg) {
      taken_t t = c[i];
      memmove(c + 1, c, i * sizeof *c);
      c[0] = t;
      break;
    }
  _expseg_cache_take_set(a, pick, m, s->pool);
  free(pick);
  size_t done = 0, at = 0; /* chunks mapped, pages mapped */
  *st = EXPSEG_OK;
  for (; done < m; done++) {
    const size_t p = c[done].size / pg;
    *st = _expseg_vmm_map(a->drv, lo + at * pg, c[done].size, c[done].h, 0);
    if (*st != EXPSEG_OK) break;
    for (size_t i = 0; i < p; i++)
      s->pages[first + at + i] =
          (page_t){.h = c[done].h, .mapped = true, .off = (uint32_t)i, .n = (uint32_t)p};
    at += p;
  }
  if (done == m) *st = _expseg_vmm_set_access(a->drv, lo, K * pg);
  if (done == m && *st == EXPSEG_OK && a->peers) *st = _expseg_peers_grant(a, lo, K * pg);
  if (done < m || *st != EXPSEG_OK) {
    expseg_status keep = *st;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", expseg_last_error());
    put_back(a, s, c + done, m - done); /* never mapped */
    for (size_t i = done; i-- > 0;) {
      const size_t p = c[i].size / pg;
      at -= p;
      for (size_t j = 0; j < p; j++) s->pages[first + at + j].mapped = false;
      const uintptr_t where = lo + at * pg;
      bool unmapped = _expseg_vmm_unmap(a->drv, where, c[i].size) == EXPSEG_OK;
      if (unmapped) {
        put_back(a, s, &c[i], 1);
        continue;
      }
      /* the undo was refused: the mapping and the chunk go on the retry list, still
       * counted in reserved_bytes, retried before the next growth (which could otherwise
       * map over it) and before the reservation around it */
      _expseg_stat_pool_add(a->stats.reserved_bytes, s->pool, -(int64_t)c[i].size);
      a->stats.released_bytes += (int64_t)c[i].size;
      _expseg_release_keep(a, (release_item_t){.h = c[i].h, .size_h = c[i].size, .pool = s->pool,
                                               .map_va = where, .size_map = c[i].size});
    }
    free(c);
    *st = _expseg_error_set(keep, "%s", msg);
    return NULL;
  }
  free(c);
  _expseg_unmapped_remove(a, u);
  if (K < room) _expseg_unmapped_insert(a, _expseg_block_split(a, u, K * pg));
  u->mapped = true;
  size_t bytes = K * pg;
  s->mapped_bytes += bytes;
  _expseg_ppool_reserved(a, s, (int64_t)bytes);
  _expseg_stat_add(&a->stats.mapped_bytes, (int64_t)bytes);
  a->stats.num_device_alloc++;
  EXPSEG_HIST(a, HIST_SEGMENT_MAP, lo, bytes, s->stream);
  return _expseg_block_coalesce(a, u);
}

/* ---- moving idle chunks ---- */

/* Raises *lo (a chunk start in s) to the first chunk start at or above `from`; false when
 * none is left below hi. */
static bool chunks_from(const segment_t *s, uintptr_t *lo, uintptr_t hi, uintptr_t from) {
  while (*lo < from && *lo < hi) *lo += s->pages[(*lo - s->base) / s->page].n * s->page;
  return *lo < hi;
}

size_t _expseg_steal_pages(expseg_allocator *a, int pool, size_t page, size_t want,
                           size_t max_pages, const block_t *ex1, const block_t *ex2,
                           size_t keep2, bool blocking, uint32_t tag, bool general) {
  stream_seen_t seen[SEEN_MAX];
  size_t n_seen = 0, got = 0;
  for (int pass = 0; pass < 2 && got < want; pass++) {
    int p = pass == 0 ? pool : 1 - pool;
    if (pass == 1 && !blocking && !_expseg_may_take_back(a->robbed[pool], a->tick)) break;
    block_t *b = a->idle_head[p];
    while (b != NULL && got < want) {
      block_t *next = b->idle_next;
      uintptr_t lo, hi;
      if (b != ex1 && (b != ex2 || keep2 < b->size) && (page == 0 || b->seg->page == page) &&
          (seg_tag(b->seg) == tag || (general && _expseg_seg_general(a, b->seg))) &&
          _expseg_block_chunks(a, b, &lo, &hi) > 0 &&
          (b != ex2 || chunks_from(b->seg, &lo, hi, b->ptr + (keep2 > 0 ? keep2 : 1))) &&
          _expseg_stream_idle(a, b->stream, blocking, seen, &n_seen, SEEN_MAX)) {
        /* chunks from the top of the block, none larger than the place takes */
        uintptr_t from = _expseg_chunks_top(b->seg, lo, hi, want - got, max_pages, false);
        expseg_status st;
        /* unmapping may merge b away; the list's next entry is not b's neighbour (free
         * mapped neighbours are always merged), so `next` stays valid */
        size_t moved = from < hi ? _expseg_unmap_pages(a, b, from, hi, &st) : 0;
        got += moved;
        a->stats.pages_moved += (int64_t)moved;
        if (pass == 1 && moved > 0) a->robbed[p] = a->tick ? a->tick : 1;
        if (from < hi && st != EXPSEG_OK) return got;
      }
      b = next;
    }
  }
  return got;
}
