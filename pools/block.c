/* SPDX-License-Identifier: Apache-2.0 */
/* block.c: block structs (recycled from slabs), the free sets, splitting and merging; the
 * hit path's part is inline in block.h.
 *
 * Every change of a block's membership in a free set goes through _expseg_free_insert /
 * _expseg_free_remove (free mapped blocks) or _expseg_unmapped_insert / _remove, so the
 * index and the idle list can never disagree. (inactive_split is kept where blocks turn
 * busy or free: isplit_change in internal.h.) */
#include "block.h"
#include "fidx.h"

#include <stdlib.h>
#include <string.h>

bool _expseg_block_refill(expseg_allocator *a) {
  /* the free index's nodes first: never fewer than block structs (fidx.c) */
  if (!_expseg_fidx_reserve(&a->free_idx, (a->n_slabs + 1) * EXPSEG_SLAB_BLOCKS)) return false;
  if (a->n_slabs == a->cap_slabs) {
    size_t cap = a->cap_slabs ? a->cap_slabs * 2 : 16;
    void **s = realloc(a->slabs, cap * sizeof *s);
    if (s == NULL) return false;
    a->slabs = s;
    a->cap_slabs = cap;
  }
  block_t *slab = malloc(EXPSEG_SLAB_BLOCKS * sizeof *slab);
  if (slab == NULL) return false;
  a->slabs[a->n_slabs++] = slab;
  for (size_t i = 0; i < EXPSEG_SLAB_BLOCKS; i++) {
    slab[i].uses = slab[i].uses_inline; /* destroy frees only heap arrays */
    slab[i].next = a->block_free;
    a->block_free = &slab[i];
  }
  return true;
}

void _expseg_blocks_destroy(expseg_allocator *a) {
  /* blocks still in use at destroy (live or pending ones) may hold a heap array of the
   * streams recorded on them */
  for (size_t i = 0; i < a->n_slabs; i++) {
    block_t *slab = a->slabs[i];
    for (size_t j = 0; j < EXPSEG_SLAB_BLOCKS; j++)
      if (slab[j].uses != slab[j].uses_inline) free(slab[j].uses);
  }
  for (size_t i = 0; i < a->n_slabs; i++) free(a->slabs[i]);
  free(a->slabs);
  a->slabs = NULL;
  a->n_slabs = a->cap_slabs = 0;
  a->block_free = NULL;
}

void _expseg_single_insert(expseg_allocator *a, block_t *b) {
  _expseg_tree_insert(&a->free_idx.single[b->seg->pool], b, _expseg_treap_prio(&a->rng));
}

void _expseg_unmapped_insert(expseg_allocator *a, block_t *b) {
  expseg_assert(!b->mapped && !b->indexed);
  _expseg_tree_insert(&a->unmapped_idx[b->seg->pool], b, _expseg_treap_prio(&a->rng));
  b->indexed = true;
}

void _expseg_unmapped_remove(expseg_allocator *a, block_t *b) {
  expseg_assert(!b->mapped && b->indexed);
  _expseg_tree_remove(&a->unmapped_idx[b->seg->pool], b);
  b->indexed = false;
}

block_t *_expseg_block_split(expseg_allocator *a, block_t *b, size_t offset) {
  expseg_assert(offset > 0 && offset < b->size);
  block_t *n = _expseg_block_new(a);
  if (n == NULL) return NULL;
  n->ptr = b->ptr + offset;
  n->size = b->size - offset;
  n->stream = b->stream;
  n->seg = b->seg;
  n->state = b->state;
  n->mapped = b->mapped;
  n->prev = b;
  n->next = b->next;
  if (b->next) b->next->prev = n;
  b->next = n;
  b->size = offset;
  return n;
}

static bool same_kind(const block_t *x, const block_t *y) {
  return x->state == BLOCK_FREE && y->state == BLOCK_FREE && x->mapped == y->mapped;
}

static void take_out(expseg_allocator *a, block_t *n) {
  if (!n->indexed) return;
  if (n->mapped) _expseg_free_remove(a, n);
  else _expseg_unmapped_remove(a, n);
}

block_t *_expseg_block_coalesce(expseg_allocator *a, block_t *b) {
  expseg_assert(!b->indexed);
  block_t *p = b->prev;
  if (p != NULL && same_kind(p, b)) {
    take_out(a, p);
    b->ptr = p->ptr;
    b->size += p->size;
    b->prev = p->prev;
    if (p->prev) p->prev->next = b;
    else b->seg->first = b;
    _expseg_block_delete(a, p);
  }
  block_t *n = b->next;
  if (n != NULL && same_kind(n, b)) {
    take_out(a, n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    _expseg_block_delete(a, n);
  }
  return b;
}

block_t *_expseg_block_absorb(expseg_allocator *a, block_t *b) {
  expseg_assert(b->state == BLOCK_FREE && b->mapped && !b->indexed);
  block_t *l = a->free_idx.last[b->seg->pool], *p = b->prev, *n = b->next;
  expseg_assert(l != NULL && (l == p || l == n));
  /* a neighbour is the pool's last insert (free, mapped, outside the heaps): it takes the
   * run in place, which is what removing it and inserting the merged block would give */
  block_t *first = p != NULL && same_kind(p, b) ? p : b;
  block_t *top = n != NULL && same_kind(n, b) ? n : b, *end = top->next;
  const uintptr_t lo = first->ptr, hi = top->ptr + top->size;
  block_t *before = first->prev;
  for (block_t *x = first, *nx; x != end; x = nx) {
    nx = x->next;
    if (x == l) continue;
    take_out(a, x);
    _expseg_block_delete(a, x);
  }
  l->ptr = lo;
  l->size = hi - lo;
  l->prev = before;
  l->next = end;
  if (before) before->next = l;
  else l->seg->first = l;
  if (end) end->prev = l;
  _expseg_idle_renew(a, l);
  return l;
}
