/* SPDX-License-Identifier: Apache-2.0 */
/* treap.h: the one treap of expseg, intrusive and generated per node type, header-only so
 * every layer can use it (vmm/ledger.c: mappings by address; meant for pools/' block
 * indexes too). A treap is a binary search tree kept balanced in expectation by random
 * priorities (a heap on them): O(log n) expected per operation, nodes owned by the caller
 * (no allocation here), priorities drawn by the caller (no state here) with
 * _expseg_treap_prio from a generator state the caller keeps.
 *
 * A node type embeds EXPSEG_TREAP_LINK(type) under some member name; then
 *   EXPSEG_TREAP_DEFINE(prefix, type, member, key_type, KEY, LESS)
 * defines static functions prefix_insert, _remove, _find, _lower_bound, _pred, _next,
 * _first, _split, _join over `type *root` pointers, for nodes ordered by KEY(node) (an
 * expression of key_type) under LESS(a, b) (keys; a strict weak order; keys unique in a
 * tree). Like BSD's RB_GENERATE: one copy per node type, compared inline. */
#ifndef EXPSEG_BASE_TREAP_H
#define EXPSEG_BASE_TREAP_H

#include "rand.h"

#include <stddef.h>
#include <stdint.h>

/* The links a node carries: children and the heap priority (higher nearer the root). */
#define EXPSEG_TREAP_LINK(type) \
  struct {                      \
    type *l, *r;                \
    uint32_t prio;              \
  }

/* A node's priority, drawn from the caller's generator state (base/rand.h). */
static inline uint32_t _expseg_treap_prio(uint64_t *state) {
  return (uint32_t)(_expseg_splitmix64(state) >> 32);
}

#if defined(__GNUC__)
#define EXPSEG_TREAP_UNUSED __attribute__((unused))
#else
#define EXPSEG_TREAP_UNUSED
#endif

#define EXPSEG_TREAP_DEFINE(P, T, M, K, KEY, LESS)                                              \
  /* Splits t into the nodes with keys < k (*lt) and >= k (*ge). */                            \
  EXPSEG_TREAP_UNUSED static void P##_split(T *t, K k, T **lt, T **ge) {                       \
    while (t != NULL) {                                                                        \
      if (LESS(KEY(t), k)) {                                                                   \
        *lt = t;                                                                               \
        lt = &t->M.r;                                                                          \
        t = t->M.r;                                                                            \
      } else {                                                                                 \
        *ge = t;                                                                               \
        ge = &t->M.l;                                                                          \
        t = t->M.l;                                                                            \
      }                                                                                        \
    }                                                                                          \
    *lt = *ge = NULL;                                                                          \
  }                                                                                            \
  /* Joins a and b, every key of a below every key of b. */                                    \
  EXPSEG_TREAP_UNUSED static T *P##_join(T *a, T *b) {                                         \
    T *root = NULL, **at = &root;                                                              \
    while (a != NULL && b != NULL) {                                                           \
      if (a->M.prio > b->M.prio) {                                                             \
        *at = a;                                                                               \
        at = &a->M.r;                                                                          \
        a = a->M.r;                                                                            \
      } else {                                                                                 \
        *at = b;                                                                               \
        at = &b->M.l;                                                                          \
        b = b->M.l;                                                                            \
      }                                                                                        \
    }                                                                                          \
    *at = a != NULL ? a : b;                                                                   \
    return root;                                                                               \
  }                                                                                            \
  /* Inserts n (its M.prio set by the caller; its key not in the tree). */                     \
  EXPSEG_TREAP_UNUSED static void P##_insert(T **root, T *n) {                                 \
    T **at = root;                                                                             \
    while (*at != NULL && (*at)->M.prio >= n->M.prio)                                          \
      at = LESS(KEY(n), KEY(*at)) ? &(*at)->M.l : &(*at)->M.r;                                 \
    P##_split(*at, KEY(n), &n->M.l, &n->M.r);                                                  \
    *at = n;                                                                                   \
  }                                                                                            \
  /* Removes n, which is in the tree. */                                                       \
  EXPSEG_TREAP_UNUSED static void P##_remove(T **root, T *n) {                                 \
    T **at = root;                                                                             \
    while (*at != n) at = LESS(KEY(n), KEY(*at)) ? &(*at)->M.l : &(*at)->M.r;                  \
    *at = P##_join(n->M.l, n->M.r);                                                            \
    n->M.l = n->M.r = NULL;                                                                    \
  }                                                                                            \
  /* The node with key k, or NULL. */                                                          \
  EXPSEG_TREAP_UNUSED static T *P##_find(T *t, K k) {                                          \
    while (t != NULL) {                                                                        \
      if (LESS(k, KEY(t))) t = t->M.l;                                                         \
      else if (LESS(KEY(t), k)) t = t->M.r;                                                    \
      else return t;                                                                           \
    }                                                                                          \
    return NULL;                                                                               \
  }                                                                                            \
  /* The node with the least key >= k, or NULL. */                                             \
  EXPSEG_TREAP_UNUSED static T *P##_lower_bound(T *t, K k) {                                   \
    T *best = NULL;                                                                            \
    while (t != NULL) {                                                                        \
      if (LESS(KEY(t), k)) {                                                                   \
        t = t->M.r;                                                                            \
      } else {                                                                                 \
        best = t;                                                                              \
        t = t->M.l;                                                                            \
      }                                                                                        \
    }                                                                                          \
    return best;                                                                               \
  }                                                                                            \
  /* The node with the greatest key < k, or NULL. */                                           \
  EXPSEG_TREAP_UNUSED static T *P##_pred(T *t, K k) {                                          \
    T *best = NULL;                                                                            \
    while (t != NULL) {                                                                        \
      if (LESS(KEY(t), k)) {                                                                   \
        best = t;                                                                              \
        t = t->M.r;                                                                            \
      } else {                                                                                 \
        t = t->M.l;                                                                            \
      }                                                                                        \
    }                                                                                          \
    return best;                                                                               \
  }                                                                                            \
  /* The node after n in key order (a walk from the root), or NULL. */                         \
  EXPSEG_TREAP_UNUSED static T *P##_next(T *root, const T *n) {                                \
    T *best = NULL;                                                                            \
    if (n->M.r != NULL) {                                                                      \
      for (best = n->M.r; best->M.l != NULL;) best = best->M.l;                                \
      return best;                                                                             \
    }                                                                                          \
    for (T *t = root; t != NULL && t != n;) {                                                  \
      if (LESS(KEY(n), KEY(t))) {                                                              \
        best = t;                                                                              \
        t = t->M.l;                                                                            \
      } else {                                                                                 \
        t = t->M.r;                                                                            \
      }                                                                                        \
    }                                                                                          \
    return best;                                                                               \
  }                                                                                            \
  /* The node with the least key, or NULL. */                                                  \
  EXPSEG_TREAP_UNUSED static T *P##_first(T *t) {                                              \
    while (t != NULL && t->M.l != NULL) t = t->M.l;                                            \
    return t;                                                                                  \
  }

#endif
