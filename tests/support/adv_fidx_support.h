/* SPDX-License-Identifier: Apache-2.0 */
/* adv_fidx_support.h: corruptions of a live allocator's free index (pools/fidx.c), for
 * tests/test_adv_fidx.cpp to prove that expseg_check notices each of them. */
#ifndef EXPSEG_TEST_ADV_FIDX_SUPPORT_H
#define EXPSEG_TEST_ADV_FIDX_SUPPORT_H

#include "expseg.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
  ADV_CORRUPT_COUNT = 0,     /* a size node's count one higher */
  ADV_CORRUPT_DROP_CHILD,    /* a heap root loses its children (blocks vanish from the index) */
  ADV_CORRUPT_DROP_LAST,     /* the last-insert slot forgets its block */
  ADV_CORRUPT_TREAP_ORDER,   /* a treap node's children swapped */
  ADV_CORRUPT_EMPTY_LIST,    /* an empty indexed node taken off the empty list */
  ADV_CORRUPT_LOSE_SPARE,    /* a spare node lost and n_nodes lowered with it: fewer nodes
                                than block structs, so a later free may find none */
  ADV_CORRUPT_HEAP_ORDER,    /* a heap's root and its first child exchange places */
  ADV_CORRUPT_COUNT_KINDS
};

/* Applies corruption `kind` to a's free index; false when the index has nothing it applies
 * to (the test then builds a richer state). The allocator must not be used afterwards
 * except by expseg_check and adv_fidx_undo. */
bool adv_fidx_corrupt(expseg_allocator *a, int kind);
/* Undoes the last adv_fidx_corrupt (so that destroy is safe). */
void adv_fidx_undo(expseg_allocator *a);

#ifdef __cplusplus
}
#endif

#endif
