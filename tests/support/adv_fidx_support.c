/* SPDX-License-Identifier: Apache-2.0 */
/* adv_fidx_support.c: the corruptions of adv_fidx_support.h, each saved for its undo. */
#include "adv_fidx_support.h"

#include "fidx.h"

#include <string.h>

static fidx_t saved;           /* the index's head before the corruption */
static szn_t saved_node, *node_at;
static block_t saved_blk[2], *blk_at[2];
static szn_t *lost;            /* ADV_CORRUPT_LOSE_SPARE */

static szn_t *find_node(fidx_t *f, bool (*ok)(const szn_t *)) {
  for (size_t i = 0; i < f->cap; i++)
    if (f->slots[i].key != 0 && ok(f->slots[i].node)) return f->slots[i].node;
  return NULL;
}
static bool with_children(const szn_t *n) { return n->heap != NULL && n->heap->t.l != NULL; }
static bool nonempty(const szn_t *n) { return n->count > 0; }
static bool two_kids(const szn_t *n) { return n->t.l != NULL || n->t.r != NULL; }
static bool is_empty(const szn_t *n) { return n->count == 0; }

bool adv_fidx_corrupt(expseg_allocator *a, int kind) {
  fidx_t *f = &a->free_idx;
  saved = *f;
  node_at = NULL;
  blk_at[0] = blk_at[1] = NULL;
  lost = NULL;
  szn_t *n = NULL;
  switch (kind) {
  case ADV_CORRUPT_COUNT:
    if ((n = find_node(f, nonempty)) == NULL) return false;
    saved_node = *n, node_at = n;
    n->count++;
    return true;
  case ADV_CORRUPT_DROP_CHILD:
    if ((n = find_node(f, with_children)) == NULL) return false;
    blk_at[0] = n->heap, saved_blk[0] = *n->heap;
    n->heap->t.l = NULL;
    return true;
  case ADV_CORRUPT_DROP_LAST:
    for (int p = 0; p < POOL_COUNT; p++)
      if (f->last[p] != NULL) {
        f->last[p] = NULL;
        return true;
      }
    return false;
  case ADV_CORRUPT_TREAP_ORDER:
    if ((n = find_node(f, two_kids)) == NULL) return false;
    saved_node = *n, node_at = n;
    szn_t *t = n->t.l;
    n->t.l = n->t.r;
    n->t.r = t;
    return true;
  case ADV_CORRUPT_EMPTY_LIST:
    if ((n = find_node(f, is_empty)) == NULL || f->empty == NULL) return false;
    n = f->empty; /* the head: unlinking it is one pointer */
    saved_node = *n, node_at = n;
    f->empty = n->enext;
    if (f->empty) {
      blk_at[0] = NULL;
      f->empty->eprev = NULL; /* restored from saved_node's enext on undo */
    }
    return true;
  case ADV_CORRUPT_LOSE_SPARE:
    if (f->spare == NULL) return false;
    lost = f->spare;
    f->spare = lost->enext;
    f->n_nodes--;
    return true;
  case ADV_CORRUPT_HEAP_ORDER: {
    if ((n = find_node(f, with_children)) == NULL) return false;
    block_t *r = n->heap, *c = r->t.l;
    blk_at[0] = r, saved_blk[0] = *r;
    blk_at[1] = c, saved_blk[1] = *c;
    saved_node = *n, node_at = n;
    /* c becomes the root with r as its first child; r takes c's children */
    block_t *r_kids = c->t.l, *c_sib = c->t.r;
    c->hprev = NULL;
    c->t.r = NULL;
    c->t.l = r;
    r->hprev = c;
    r->t.r = c_sib;
    if (c_sib) c_sib->hprev = r;
    r->t.l = r_kids;
    if (r_kids) r_kids->hprev = r;
    n->heap = c;
    return true;
  }
  default: return false;
  }
}

void adv_fidx_undo(expseg_allocator *a) {
  fidx_t *f = &a->free_idx;
  if (blk_at[1] != NULL) { /* HEAP_ORDER: relink the neighbours first */
    block_t *r = blk_at[0], *c = blk_at[1];
    if (r->t.r) r->t.r->hprev = c;
    if (r->t.l) r->t.l->hprev = c;
  }
  for (int i = 0; i < 2; i++)
    if (blk_at[i] != NULL) *blk_at[i] = saved_blk[i];
  if (node_at != NULL) {
    *node_at = saved_node;
    if (node_at->enext) node_at->enext->eprev = node_at;
  }
  if (lost != NULL) f->spare = lost;
  *f = saved;
}
