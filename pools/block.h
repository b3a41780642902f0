/* SPDX-License-Identifier: Apache-2.0 */
/* block.h: the blocks' hit-path half, inline (block.c has the rest).
 *
 * A cache hit most often takes the front of the pool's last insert (fidx.h: the block
 * inserted last waits outside the heaps, so its address and size may change in place) and
 * its free gives that front back. So the split of the hit path hands out a new block for
 * the front and leaves the rest where it is, and the free of a block next to the last
 * insert grows that block in place: the same free blocks, the same last insert and the
 * same idle list as removing, splitting or merging and inserting again would leave, with no
 * index work. Block structs come from a free list (a slab is made out of line). */
#ifndef EXPSEG_POOLS_BLOCK_H
#define EXPSEG_POOLS_BLOCK_H

#include "fidx.h"
#include "internal.h"

#include <stdlib.h>

/* ---- block.c ---- */
/* Another slab of block structs on the free list (the free index's node reserve first).
 * false: out of host memory. */
bool _expseg_block_refill(expseg_allocator *a);
/* b (free, mapped, not indexed) merged with its free neighbours, one of which is the last
 * insert: that one takes the run in place. Returns it. */
block_t *_expseg_block_absorb(expseg_allocator *a, block_t *b);
/* b (free, mapped, of a single-chunk segment) into the single-chunk index. */
void _expseg_single_insert(expseg_allocator *a, block_t *b);

/* A block struct with its bookkeeping fields cleared (the caller sets the address, size,
 * segment, stream, state and neighbours), or NULL when out of host memory. */
static inline block_t *_expseg_block_new(expseg_allocator *a) {
  if (a->block_free == NULL && !_expseg_block_refill(a)) return NULL;
  block_t *b = a->block_free;
  a->block_free = b->next;
  b->requested = 0;
  b->t.l = b->t.r = b->hprev = NULL;
  b->n_uses = 0;
  b->oversize = b->indexed = b->idle = false;
  b->idle_prev = b->idle_next = NULL;
  b->event_count = 0;
  b->uses = b->uses_inline;
  b->uses_cap = 2;
  return b;
}

static inline void _expseg_block_delete(expseg_allocator *a, block_t *b) {
  if (b->uses != b->uses_inline) free(b->uses);
  b->uses = b->uses_inline;
  b->next = a->block_free;
  a->block_free = b;
}

/* ---- the idle list: free blocks holding a whole page, oldest first ---- */

static inline void _expseg_idle_push(expseg_allocator *a, block_t *b) {
  const int p = b->seg->pool;
  b->idle = true;
  b->idle_next = NULL;
  b->idle_prev = a->idle_tail[p];
  if (a->idle_tail[p]) a->idle_tail[p]->idle_next = b;
  else a->idle_head[p] = b;
  a->idle_tail[p] = b;
}

static inline void _expseg_idle_unlink(expseg_allocator *a, block_t *b) {
  const int p = b->seg->pool;
  if (b->idle_prev) b->idle_prev->idle_next = b->idle_next;
  else a->idle_head[p] = b->idle_next;
  if (b->idle_next) b->idle_next->idle_prev = b->idle_prev;
  else a->idle_tail[p] = b->idle_prev;
  b->idle_prev = b->idle_next = NULL;
  b->idle = false;
}

/* b (indexed, changed in place) as a fresh insert would leave it on the idle list: its time
 * now, at the tail if it holds a whole page, off the list if not. */
static inline void _expseg_idle_renew(expseg_allocator *a, block_t *b) {
  b->idle_since = a->now_ns;
  const bool whole = _expseg_block_whole_pages(a, b, NULL) > 0;
  if (b->idle && (!whole || b->idle_next != NULL)) _expseg_idle_unlink(a, b);
  if (whole && !b->idle) _expseg_idle_push(a, b);
}

/* ---- the free sets of mapped blocks ---- */

/* b (free, mapped, not indexed) into its free set (the free index, or the single-chunk
 * index) and onto the idle list if it holds a whole page. */
static inline void _expseg_free_insert(expseg_allocator *a, block_t *b) {
  expseg_assert(b->state == BLOCK_FREE && b->mapped && !b->indexed);
  b->idle_since = a->now_ns;
  if (b->seg->single) _expseg_single_insert(a, b);
  else _expseg_fidx_insert(&a->free_idx, b);
  b->indexed = true;
  if (_expseg_block_whole_pages(a, b, NULL) > 0) _expseg_idle_push(a, b);
}

static inline void _expseg_free_remove(expseg_allocator *a, block_t *b) {
  expseg_assert(b->indexed && b->mapped);
  if (b->seg->single) _expseg_tree_remove(&a->free_idx.single[b->seg->pool], b);
  else _expseg_fidx_remove(&a->free_idx, b);
  b->indexed = false;
  if (b->idle) _expseg_idle_unlink(a, b);
}

/* ---- the hit path's split and merge ---- */

/* The split of b, its pool's last insert: a new block gets b's first `size` bytes and is
 * returned (free, not indexed); b keeps the rest and its place. NULL when out of host
 * memory (b untouched). */
static inline block_t *_expseg_block_split_front(expseg_allocator *a, block_t *b, size_t size) {
  expseg_assert(size > 0 && size < b->size);
  expseg_assert2(b == a->free_idx.last[b->seg->pool]);
  block_t *m = _expseg_block_new(a);
  if (m == NULL) return NULL;
  m->ptr = b->ptr;
  m->size = size;
  m->stream = b->stream;
  m->seg = b->seg;
  m->state = BLOCK_FREE;
  m->mapped = true;
  m->prev = b->prev;
  m->next = b;
  if (b->prev) b->prev->next = m;
  else b->seg->first = m;
  b->prev = m;
  b->ptr += size;
  b->size -= size;
  _expseg_idle_renew(a, b);
  return m;
}

/* b (free, mapped, not indexed) merged with its free neighbours and indexed; returns the
 * merged block. When a neighbour is the pool's last insert and the other neighbour is not
 * free (the hit path: the rest just split off), that neighbour takes b in place and b's
 * struct is gone. */
EXPSEG_HOT block_t *_expseg_block_release(expseg_allocator *a, block_t *b) {
  block_t *l = a->free_idx.last[b->seg->pool], *p = b->prev, *n = b->next;
  if (l == n && l != NULL && (p == NULL || p->state != BLOCK_FREE)) {
    l->ptr = b->ptr;
    l->size += b->size;
    l->prev = p;
    if (p) p->next = l;
    else l->seg->first = l;
  } else if (l == p && l != NULL && (n == NULL || n->state != BLOCK_FREE)) {
    l->size += b->size;
    l->next = n;
    if (n) n->prev = l;
  } else if (l != NULL && (l == p || l == n)) {
    return _expseg_block_absorb(a, b);
  } else { /* no neighbour is the last insert: merged (if a neighbour is free) and inserted */
    const bool merge = (p != NULL && p->state == BLOCK_FREE && p->mapped) ||
                       (n != NULL && n->state == BLOCK_FREE && n->mapped);
    block_t *m = merge ? _expseg_block_coalesce(a, b) : b;
    _expseg_free_insert(a, m);
    return m;
  }
  expseg_assert(b->mapped && !b->indexed);
  _expseg_block_delete(a, b);
  _expseg_idle_renew(a, l);
  return l;
}

#endif
