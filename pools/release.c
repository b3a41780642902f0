/* SPDX-License-Identifier: Apache-2.0 */
/* release.c: memory going back to the driver (release.h): release items given back in
 * batches with the lock dropped, the retry list of what the driver refused (kept with its
 * accounting, so a refusal never leaks and statistics stay true), and the page cache of
 * unmapped chunks (each of its segment's page size) with its bound. */
#include "error.h"
#include "release.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool batch_add(release_batch_t *rb, release_item_t it) {
  if (rb->n == rb->cap) {
    size_t cap = rb->cap ? rb->cap * 2 : 16;
    release_item_t *p = realloc(rb->items, cap * sizeof *p);
    if (p == NULL) return false;
    rb->items = p;
    rb->cap = cap;
  }
  rb->items[rb->n++] = it;
  return true;
}

/* Gives the item back to the driver; what the driver refused is returned (sizes 0 = all
 * done). No accounting: callable with the lock dropped. */
release_item_t _expseg_release_do(expseg_vmm_t *drv, release_item_t it) {
  if (it.size_map > 0) {
    if (_expseg_vmm_unmap(drv, it.map_va, it.size_map) != EXPSEG_OK) {
      _expseg_warn("unmapping %zu bytes at %#lx failed; kept to retry: %s", it.size_map,
                   (unsigned long)it.map_va, expseg_last_error());
      return it; /* nothing under a mapping can go */
    }
    it.size_map = 0;
  }
  if (it.size_h > 0) {
    if (_expseg_vmm_release(drv, it.h, it.size_h) != EXPSEG_OK) {
      _expseg_warn("releasing a %zu-byte chunk failed; kept to retry: %s", it.size_h,
                   expseg_last_error());
    } else {
      it.size_h = 0;
    }
  }
  if (it.size_va > 0) {
    if (_expseg_vmm_unreserve(drv, it.va, it.size_va) != EXPSEG_OK) {
      _expseg_warn("freeing a %zu-byte reservation failed; kept to retry: %s", it.size_va,
                   expseg_last_error());
    } else {
      it.size_va = 0;
    }
  }
  return it;
}

static bool item_done(release_item_t it) {
  return it.size_map == 0 && it.size_h == 0 && it.size_va == 0;
}

static bool zombie_add(expseg_allocator *a, release_item_t it) {
  if (a->n_zombies == a->cap_zombies) {
    size_t cap = a->cap_zombies ? a->cap_zombies * 2 : 8;
    void *p = realloc(a->zombies, cap * sizeof(release_item_t));
    if (p == NULL) return false;
    a->zombies = p;
    a->cap_zombies = cap;
  }
  ((release_item_t *)a->zombies)[a->n_zombies++] = it;
  return true;
}


/* Does a mapping the driver refused to remove (on the retry list) lie in [lo, lo+len)? */
bool _expseg_zombie_mapped_in(const expseg_allocator *a, uintptr_t lo, size_t len) {
  const release_item_t *z = a->zombies;
  for (size_t i = 0; i < a->n_zombies; i++)
    if (z[i].size_map > 0 && z[i].map_va < lo + len && lo < z[i].map_va + z[i].size_map)
      return true;
  return false;
}

/* Lock held: what the driver refused to take back is memory still held. Its accounting
 * comes back (reserved_bytes, address space); a page-sized chunk alone goes back to the
 * page cache; anything else waits in the retry list for the next empty_cache, OOM retry
 * or destroy. */
void _expseg_release_keep(expseg_allocator *a, release_item_t f) {
  if (item_done(f)) return;
  if (f.size_h > 0) {
    _expseg_stat_pool_add(a->stats.reserved_bytes, f.pool, (int64_t)f.size_h);
    a->stats.released_bytes -= (int64_t)f.size_h;
  }
  if (f.size_va > 0) _expseg_stat_add(&a->stats.reserved_va_bytes, (int64_t)f.size_va);
  if (f.size_va == 0 && f.size_map == 0 && f.size_h % _expseg_pool_page(a, f.pool) == 0 &&
      _expseg_cache_push(a, f.h, f.pool, f.size_h))
    return;
  if (!zombie_add(a, f)) { /* still held by the driver: counted, never retried */
    _expseg_warn("out of host memory: a release the driver refused cannot be kept for a "
                 "retry; its %zu bytes of memory and %zu of address space stay held until "
                 "the process ends", f.size_h, f.size_va);
    a->lost_mapped += (int64_t)f.size_map;
    if (f.size_h > 0) {
      a->lost_reserved[f.pool] += (int64_t)f.size_h;
      a->lost_chunks++;
    }
    a->lost_va += (int64_t)f.size_va;
  }
}

/* Lock held. */
void _expseg_release_now(expseg_allocator *a, release_item_t it) {
  _expseg_release_keep(a, _expseg_release_do(a->drv, it));
}

/* Lock held. Memory the driver gave this allocator that no segment owns (the undo of a
 * failed growth): counted as created, then given back like any release, so a refused step
 * lands on the retry list with its accounting instead of being lost. */
void _expseg_release_orphan(expseg_allocator *a, release_item_t it) {
  if (it.size_h > 0) {
    a->stats.created_bytes += (int64_t)it.size_h;
    a->stats.released_bytes += (int64_t)it.size_h;
  }
  _expseg_release_now(a, it);
}

void _expseg_batch_push(expseg_allocator *a, release_batch_t *rb, release_item_t it) {
  if (!batch_add(rb, it)) _expseg_release_now(a, it);
}

/* Drops the lock, releases everything, retakes the lock and keeps what was refused. */
void _expseg_batch_flush(expseg_allocator *a, release_batch_t *rb) {
  if (rb->n > 0) {
    a->unlocked_ops++;
    pthread_mutex_unlock(&a->lock);
    for (size_t i = 0; i < rb->n; i++) rb->items[i] = _expseg_release_do(a->drv, rb->items[i]);
    pthread_mutex_lock(&a->lock);
    a->unlocked_ops--;
    for (size_t i = 0; i < rb->n; i++) _expseg_release_keep(a, rb->items[i]);
  }
  free(rb->items);
  rb->items = NULL;
  rb->n = rb->cap = 0;
}

/* Moves the retry list into the batch (its accounting leaves with it), in the order the
 * items were kept: a refused mapping is retried before the reservation around it. */
void _expseg_zombies_retry(expseg_allocator *a, release_batch_t *rb) {
  release_item_t *z = a->zombies;
  size_t n = a->n_zombies;
  a->n_zombies = 0;
  for (size_t i = 0; i < n; i++) {
    if (z[i].size_h > 0) {
      _expseg_stat_pool_add(a->stats.reserved_bytes, z[i].pool, -(int64_t)z[i].size_h);
      a->stats.released_bytes += (int64_t)z[i].size_h;
    }
    if (z[i].size_va > 0) _expseg_stat_add(&a->stats.reserved_va_bytes, -(int64_t)z[i].size_va);
    _expseg_batch_push(a, rb, z[i]);
  }
}

/* ---- the page cache ---- */

bool _expseg_cache_push(expseg_allocator *a, expseg_vmm_handle h, int pool, size_t size) {
  if (a->cache_count == a->cache_cap) {
    size_t cap = a->cache_cap ? a->cache_cap * 2 : 64;
    chunk_t *c = realloc(a->cache, cap * sizeof *c);
    if (c == NULL) return false;
    a->cache = c;
    a->cache_cap = cap;
  }
  a->cache[a->cache_count++] =
      (chunk_t){.h = h, .size = size, .pool = (uint8_t)pool, .idle_since = a->now_ns};
  _expseg_stat_add(&a->stats.cached_physical_bytes, (int64_t)size);
  return true;
}

chunk_t _expseg_cache_take(expseg_allocator *a, size_t i, int pool) {
  expseg_assert(i < a->cache_count);
  chunk_t c = a->cache[i];
  memmove(a->cache + i, a->cache + i + 1, (a->cache_count - i - 1) * sizeof *a->cache);
  a->cache_count--;
  _expseg_stat_add(&a->stats.cached_physical_bytes, -(int64_t)c.size);
  if (c.pool != pool) {
    stat_move(a->stats.reserved_bytes, c.pool, pool, (int64_t)c.size);
  }
  return c;
}

void _expseg_cache_take_set(expseg_allocator *a, const size_t *idx, size_t m, int pool) {
  if (m == 0) return;
  for (size_t i = 0; i < m; i++) { /* marked by a size of 0 (never a cached size) */
    chunk_t *c = &a->cache[idx[i]];
    _expseg_stat_add(&a->stats.cached_physical_bytes, -(int64_t)c->size);
    if (c->pool != pool) stat_move(a->stats.reserved_bytes, c->pool, pool, (int64_t)c->size);
    c->size = 0;
  }
  size_t k = 0;
  for (size_t i = 0; i < a->cache_count; i++)
    if (a->cache[i].size != 0) a->cache[k++] = a->cache[i];
  a->cache_count = k;
}

void _expseg_cache_release_at(expseg_allocator *a, size_t i, release_batch_t *rb) {
  chunk_t c = _expseg_cache_take(a, i, a->cache[i].pool);
  _expseg_stat_pool_add(a->stats.reserved_bytes, c.pool, -(int64_t)c.size);
  a->stats.released_bytes += (int64_t)c.size;
  _expseg_batch_push(a, rb, (release_item_t){.h = c.h, .size_h = c.size, .pool = c.pool});
}

/* Removes the n oldest cached chunks into the batch. */
size_t _expseg_cache_release_oldest(expseg_allocator *a, size_t n, release_batch_t *rb) {
  if (n > a->cache_count) n = a->cache_count;
  size_t bytes = 0;
  for (size_t i = 0; i < n; i++) {
    chunk_t c = a->cache[i];
    bytes += c.size;
    _expseg_stat_add(&a->stats.cached_physical_bytes, -(int64_t)c.size);
    _expseg_stat_pool_add(a->stats.reserved_bytes, c.pool, -(int64_t)c.size);
    a->stats.released_bytes += (int64_t)c.size;
    _expseg_batch_push(a, rb, (release_item_t){.h = c.h, .size_h = c.size, .pool = c.pool});
  }
  if (n == 0) return 0;
  memmove(a->cache, a->cache + n, (a->cache_count - n) * sizeof *a->cache);
  a->cache_count -= n;
  return bytes;
}

size_t _expseg_cache_trim(expseg_allocator *a, size_t keep_bytes) {
  size_t have = (size_t)a->stats.cached_physical_bytes.current;
  if (have <= keep_bytes) return 0;
  release_batch_t rb = {0};
  size_t n = 0;
  for (size_t over = have - keep_bytes, got = 0; got < over && n < a->cache_count; n++)
    got += a->cache[n].size; /* oldest first */
  size_t freed = _expseg_cache_release_oldest(a, n, &rb);
  _expseg_batch_flush(a, &rb);
  return freed;
}

void _expseg_zombie_totals(const expseg_allocator *a, int64_t reserved[3], int64_t *va,
                           int64_t *chunks, int64_t *mapped) {
  for (int p = 0; p < POOL_COUNT; p++) {
    reserved[STAT_ALL] += a->lost_reserved[p];
    reserved[stat_pool(p)] += a->lost_reserved[p];
  }
  *va += a->lost_va;
  *chunks += a->lost_chunks;
  *mapped += a->lost_mapped;
  const release_item_t *z = a->zombies;
  for (size_t i = 0; i < a->n_zombies; i++) {
    *mapped += (int64_t)z[i].size_map;
    if (z[i].size_h > 0) {
      reserved[STAT_ALL] += (int64_t)z[i].size_h;
      reserved[stat_pool(z[i].pool)] += (int64_t)z[i].size_h;
      (*chunks)++;
    }
    *va += (int64_t)z[i].size_va;
  }
}

