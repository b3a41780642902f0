/* SPDX-License-Identifier: Apache-2.0 */
/* fidx_support.c: the harness of fidx_support.h. */
#include "fidx_support.h"

#include "fidx.h"

#include <stdlib.h>

struct fidx_harness {
  fidx_t f;
  segment_t seg[POOL_COUNT];
  block_t *blocks;
  size_t n;
};

fidx_harness *fidx_h_new(size_t n) {
  fidx_harness *h = calloc(1, sizeof *h);
  if (h == NULL) return NULL;
  h->blocks = calloc(n, sizeof *h->blocks);
  h->n = n;
  _expseg_fidx_init(&h->f);
  if (h->blocks == NULL || !_expseg_fidx_reserve(&h->f, n)) {
    fidx_h_free(h);
    return NULL;
  }
  for (int p = 0; p < POOL_COUNT; p++) h->seg[p].pool = (uint8_t)p;
  return h;
}

void fidx_h_free(fidx_harness *h) {
  if (h == NULL) return;
  _expseg_fidx_destroy(&h->f);
  free(h->blocks);
  free(h);
}

void fidx_h_insert(fidx_harness *h, size_t i, int pool, uint64_t stream, size_t size,
                   uintptr_t ptr) {
  block_t *b = &h->blocks[i];
  b->seg = &h->seg[pool];
  b->stream = (expseg_stream)stream;
  b->size = size;
  b->ptr = ptr;
  b->state = BLOCK_FREE;
  b->mapped = true;
  b->indexed = true;
  _expseg_fidx_insert(&h->f, b);
}

void fidx_h_remove(fidx_harness *h, size_t i) {
  _expseg_fidx_remove(&h->f, &h->blocks[i]);
  h->blocks[i].indexed = false;
}

long fidx_h_best(const fidx_harness *h, int pool, uint64_t stream, size_t size) {
  block_t *b = _expseg_fidx_best((fidx_t *)&h->f, pool, (expseg_stream)stream, size);
  return b == NULL ? -1 : (long)(b - h->blocks);
}

int fidx_h_check(const fidx_harness *h) {
  int64_t blocks[POOL_COUNT];
  return _expseg_fidx_check(&h->f, blocks) == EXPSEG_OK ? 0 : -1;
}

size_t fidx_h_largest(const fidx_harness *h) { return _expseg_fidx_largest(&h->f); }
