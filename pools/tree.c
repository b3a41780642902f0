/* SPDX-License-Identifier: Apache-2.0 */
/* tree.c: the ordered block indexes that are plain treaps of blocks (base/treap.h): the
 * unmapped blocks of each pool keyed (stream, address), so growth finds the lowest free
 * place, and the free blocks of single-chunk segments keyed (stream, size, address).
 * Keys are unique because addresses are. O(log n) expected for every operation; nodes are
 * the blocks themselves (no allocation). (The free index of ordinary blocks is fidx.c.) */
#include "internal.h"

typedef struct bkey_s {
  expseg_stream stream;
  size_t size;
  uintptr_t ptr;
} bkey_t;

static inline bkey_t key_sized(const block_t *b) { return (bkey_t){b->stream, b->size, b->ptr}; }
static inline bkey_t key_addr(const block_t *b) { return (bkey_t){b->stream, 0, b->ptr}; }
static inline bool key_less(bkey_t x, bkey_t y) {
  if (x.stream != y.stream) return x.stream < y.stream;
  if (x.size != y.size) return x.size < y.size;
  return x.ptr < y.ptr;
}
EXPSEG_TREAP_DEFINE(sized, block_t, t, bkey_t, key_sized, key_less)
EXPSEG_TREAP_DEFINE(addr, block_t, t, bkey_t, key_addr, key_less)

void _expseg_tree_insert(tree_t *t, block_t *b, uint32_t prio) {
  b->t.l = b->t.r = NULL;
  b->t.prio = prio;
  if (t->by_size) sized_insert(&t->root, b);
  else addr_insert(&t->root, b);
  t->count++;
}

void _expseg_tree_remove(tree_t *t, block_t *b) {
  expseg_assert(_expseg_tree_contains(t, b));
  if (t->by_size) sized_remove(&t->root, b);
  else addr_remove(&t->root, b);
  t->count--;
}

block_t *_expseg_tree_lower_bound(const tree_t *t, expseg_stream s, size_t size, uintptr_t ptr) {
  const bkey_t k = {s, t->by_size ? size : 0, ptr};
  return t->by_size ? sized_lower_bound(t->root, k) : addr_lower_bound(t->root, k);
}

block_t *_expseg_tree_next(const tree_t *t, const block_t *b) {
  return t->by_size ? sized_next(t->root, b) : addr_next(t->root, b);
}

bool _expseg_tree_contains(const tree_t *t, const block_t *b) {
  const block_t *n = t->by_size ? sized_find(t->root, key_sized(b)) : addr_find(t->root, key_addr(b));
  return n == b;
}
