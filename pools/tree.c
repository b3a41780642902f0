/* tree.c: the ordered block indexes, as treaps (binary search trees kept balanced in
 * expectation by random priorities). Free mapped blocks are keyed (stream, size, address)
 * so best fit is one lower_bound; unmapped blocks are keyed (stream, address) so growth
 * finds the lowest free place. Keys are unique because addresses are. O(log n) expected
 * for every operation; nodes are the blocks themselves (no allocation). */
#include "internal.h"

static inline bool key_less(bool by_size, expseg_stream s, size_t size, uintptr_t ptr,
                            const block_t *b) {
  if (s != b->stream) return s < b->stream;
  if (by_size && size != b->size) return size < b->size;
  return ptr < b->ptr;
}

static inline bool block_less(bool by_size, const block_t *x, const block_t *y) {
  return key_less(by_size, x->stream, x->size, x->ptr, y);
}

static block_t *rot_right(block_t *n) {
  block_t *l = n->left;
  n->left = l->right;
  l->right = n;
  return l;
}

static block_t *rot_left(block_t *n) {
  block_t *r = n->right;
  n->right = r->left;
  r->left = n;
  return r;
}

static block_t *insert_at(block_t *root, block_t *b, bool by_size) {
  if (root == NULL) return b;
  if (block_less(by_size, b, root)) {
    root->left = insert_at(root->left, b, by_size);
    if (root->left->prio > root->prio) root = rot_right(root);
  } else {
    root->right = insert_at(root->right, b, by_size);
    if (root->right->prio > root->prio) root = rot_left(root);
  }
  return root;
}

static block_t *join(block_t *l, block_t *r) {
  if (l == NULL) return r;
  if (r == NULL) return l;
  if (l->prio > r->prio) {
    l->right = join(l->right, r);
    return l;
  }
  r->left = join(l, r->left);
  return r;
}

static block_t *remove_at(block_t *root, block_t *b, bool by_size, bool *found) {
  if (root == NULL) return NULL;
  if (root == b) {
    *found = true;
    return join(b->left, b->right);
  }
  if (block_less(by_size, b, root))
    root->left = remove_at(root->left, b, by_size, found);
  else
    root->right = remove_at(root->right, b, by_size, found);
  return root;
}

void _expseg_tree_insert(tree_t *t, block_t *b, uint32_t prio) {
  b->left = b->right = NULL;
  b->prio = prio;
  t->root = insert_at(t->root, b, t->by_size);
  t->count++;
}

void _expseg_tree_remove(tree_t *t, block_t *b) {
  bool found = false;
  t->root = remove_at(t->root, b, t->by_size, &found);
  expseg_assert(found);
  if (found) t->count--;
  b->left = b->right = NULL;
}

block_t *_expseg_tree_lower_bound(const tree_t *t, expseg_stream s, size_t size, uintptr_t ptr) {
  block_t *n = t->root, *best = NULL;
  while (n != NULL) {
    if (key_less(t->by_size, s, size, ptr, n) ||
        (n->stream == s && (!t->by_size || n->size == size) && n->ptr == ptr)) {
      best = n;
      n = n->left;
    } else {
      n = n->right;
    }
  }
  return best;
}

block_t *_expseg_tree_next(const tree_t *t, const block_t *b) {
  if (b->ptr == UINTPTR_MAX) return NULL;
  return _expseg_tree_lower_bound(t, b->stream, b->size, b->ptr + 1);
}

bool _expseg_tree_contains(const tree_t *t, const block_t *b) {
  const block_t *n = t->root;
  while (n != NULL) {
    if (n == b) return true;
    n = block_less(t->by_size, b, n) ? n->left : n->right;
  }
  return false;
}
