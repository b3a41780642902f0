/* SPDX-License-Identifier: Apache-2.0 */
/* fidx.h: the free index's hit path, inline (the rest is in fidx.c).
 *
 * Best fit over free mapped blocks keyed (stream, size, address), as one ordered set would
 * give it, in two levels: a size node per (pool, stream, size) holding that size's blocks
 * as a pairing heap on the address (so its root is the lowest address), found directly by
 * a hash table when the request's size has a free block, else by a treap of the sizes.
 * So the block chosen is always the one the single ordered set chooses (the smallest size
 * that fits, then the lowest address: PyTorch's rule), and memory is laid out exactly as
 * it was before this index; what changes is the cost: a repeat request of a size is a
 * hash probe and the pop of a heap root, a free a probe and a link of two roots. */
#ifndef EXPSEG_POOLS_FIDX_H
#define EXPSEG_POOLS_FIDX_H

#include "internal.h"

static inline size_t fidx_key(size_t size, int pool) { return size << 1 | (size_t)pool; }

static inline size_t fidx_slot(const fidx_t *f, size_t key, expseg_stream s) {
  uint64_t h = ((uint64_t)key ^ (uint64_t)s * 0xC2B2AE3D27D4EB4Full) * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> 32 ^ h) & (f->cap - 1);
}

/* The indexed node of (pool, stream, size), or NULL. */
static inline szn_t *fidx_node(const fidx_t *f, int pool, expseg_stream s, size_t size) {
  if (f->cap == 0) return NULL;
  const size_t key = fidx_key(size, pool);
  for (size_t i = fidx_slot(f, key, s);; i = (i + 1) & (f->cap - 1)) {
    const fslot_t *sl = &f->slots[i];
    if (sl->key == key && sl->stream == s) return sl->node;
    if (sl->key == 0) return NULL;
  }
}

/* Two heap roots linked: the higher address becomes the first child of the lower. */
static inline block_t *fidx_link(block_t *x, block_t *y) {
  if (y->ptr < x->ptr) {
    block_t *t = x;
    x = y;
    y = t;
  }
  y->t.r = x->t.l;
  if (x->t.l != NULL) x->t.l->hprev = y;
  y->hprev = x;
  x->t.l = y;
  x->t.r = x->hprev = NULL;
  return x;
}

/* The owners entry of (pool, s): where it is, or the empty entry where it would go. */
static inline fown_t *fidx_owner(const fidx_t *f, int pool, expseg_stream s) {
  for (size_t i = fidx_slot(f, (size_t)pool + 1, s);; i = (i + 1) & (f->cap - 1)) {
    fown_t *o = &f->owners[i];
    if (o->blocks == 0 || (o->stream == s && o->pool == pool)) return o;
  }
}

/* A free block of (pool, s) entered the index / left it: the streams count follows. The
 * home stream's blocks are a count (the hit path's case); the others' go to the table. */
void _expseg_fidx_own_add_other(fidx_t *f, int pool, expseg_stream s);
void _expseg_fidx_own_sub_other(fidx_t *f, int pool, expseg_stream s);
static inline void fidx_own_add(fidx_t *f, int pool, expseg_stream s) {
  if (s != f->home[pool]) _expseg_fidx_own_add_other(f, pool, s);
  else if (f->home_blocks[pool]++ == 0) f->streams[pool]++;
}
static inline void fidx_own_sub(fidx_t *f, int pool, expseg_stream s) {
  if (s != f->home[pool]) _expseg_fidx_own_sub_other(f, pool, s);
  else if (--f->home_blocks[pool] == 0) f->streams[pool]--;
}

/* ---- fidx.c ---- */
void _expseg_fidx_init(fidx_t *f);
void _expseg_fidx_destroy(fidx_t *f);
/* At least `blocks` size nodes made and the table sized for them, so that an insert never
 * needs host memory (every free block needs at most one node). false: out of host memory. */
bool _expseg_fidx_reserve(fidx_t *f, size_t blocks);
/* The node for a block of (pool, s, size) about to be linked, given what the table found:
 * made (NULL) or taken off the empty list (count 0). Never fails (the reserve). */
szn_t *_expseg_fidx_node_ready(fidx_t *f, szn_t *n, int pool, expseg_stream s, size_t size);
/* b out of n's heap (n's count not changed). */
void _expseg_fidx_cut(szn_t *n, block_t *b);
/* n (its last block gone) onto the empty list: it stays indexed until best fit meets it or
 * a size needs it. */
void _expseg_fidx_emptied(fidx_t *f, szn_t *n);
/* The root of the heap of the smallest size >= size on the stream (empty sizes met on the
 * way are taken back), or NULL: the treap walk of best fit. */
block_t *_expseg_fidx_fit(fidx_t *f, int pool, expseg_stream s, size_t size);
/* The same on the first stream at or after `from` (in stream order) that has a free block
 * of at least `size` bytes in the heaps (the last insert is not looked at), or NULL. */
block_t *_expseg_fidx_fit_from(fidx_t *f, int pool, expseg_stream from, size_t size);
size_t _expseg_fidx_largest(const fidx_t *f);
/* expseg_check: nodes, heaps, the table, the treaps and the lists agree; blocks[p] gets the
 * free blocks the heaps of pool p hold. */
expseg_status _expseg_fidx_check(const fidx_t *f, int64_t blocks[POOL_COUNT]);

static inline void _expseg_fidx_heap_insert(fidx_t *f, block_t *b) {
  const int pool = b->seg->pool;
  szn_t *n = fidx_node(f, pool, b->stream, b->size);
  if (n == NULL || n->count == 0) n = _expseg_fidx_node_ready(f, n, pool, b->stream, b->size);
  b->t.l = b->t.r = b->hprev = NULL;
  n->heap = n->heap == NULL ? b : fidx_link(n->heap, b);
  n->count++;
  f->blocks[pool]++;
}

static inline void _expseg_fidx_heap_remove(fidx_t *f, block_t *b) {
  const int pool = b->seg->pool;
  szn_t *n = fidx_node(f, pool, b->stream, b->size);
  expseg_assert(n != NULL && n->count > 0);
  if (n->heap == b && b->t.l == NULL) n->heap = NULL; /* the root alone */
  else _expseg_fidx_cut(n, b);
  b->t.l = b->t.r = b->hprev = NULL;
  f->blocks[pool]--;
  if (--n->count == 0) _expseg_fidx_emptied(f, n);
}

/* The first free block at or after (stream, size) in (size, address) order on the pool's
 * stream (not removed), or NULL. The last insert is compared with what the heaps give. */
static inline block_t *_expseg_fidx_best(fidx_t *f, int pool, expseg_stream s, size_t size) {
  block_t *l = f->last[pool];
  const bool fits = l != NULL && l->stream == s && l->size >= size;
  if (fits && l->size == size) { /* exact: only a lower address of that size beats it */
    const szn_t *e = fidx_node(f, pool, s, size);
    return e != NULL && e->heap != NULL && e->heap->ptr < l->ptr ? e->heap : l;
  }
  block_t *h = NULL;
  if (f->blocks[pool] > 0) {
    const szn_t *e = fidx_node(f, pool, s, size); /* the exact size: nothing fits better */
    h = e != NULL && e->heap != NULL ? e->heap : _expseg_fidx_fit(f, pool, s, size);
  }
  if (fits && (h == NULL || l->size < h->size || (l->size == h->size && l->ptr < h->ptr)))
    return l;
  return h;
}

/* Whether b (free, mapped, not of a single-chunk segment) is where the index would keep it:
 * the pool's last insert, or a block of a size node that holds blocks (expseg_check then
 * proves membership by the heaps' walk and the counts). */
static inline bool _expseg_fidx_may_hold(const fidx_t *f, const block_t *b) {
  if (f->last[b->seg->pool] == b) return true;
  const szn_t *n = fidx_node(f, b->seg->pool, b->stream, b->size);
  return n != NULL && n->count > 0;
}

/* b (free, mapped, not of a single-chunk segment) into the index: it becomes the pool's
 * last insert, and the previous one goes into its heap. */
static inline void _expseg_fidx_insert(fidx_t *f, block_t *b) {
  block_t **last = &f->last[b->seg->pool], *old = *last;
  b->t.l = b->t.r = b->hprev = NULL;
  *last = b;
  if (old != NULL) _expseg_fidx_heap_insert(f, old);
  fidx_own_add(f, b->seg->pool, b->stream);
}

static inline void _expseg_fidx_remove(fidx_t *f, block_t *b) {
  block_t **last = &f->last[b->seg->pool];
  if (*last == b) *last = NULL;
  else _expseg_fidx_heap_remove(f, b);
  fidx_own_sub(f, b->seg->pool, b->stream);
}

/* How many streams own free blocks in the pool's index (lending a tighter fit asks only
 * when another stream than the requester's can have one: policy.h). */
static inline size_t _expseg_fidx_streams(const fidx_t *f, int pool) { return f->streams[pool]; }

#endif
