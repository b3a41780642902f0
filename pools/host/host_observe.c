/* SPDX-License-Identifier: Apache-2.0 */
/* host_observe.c: the pinned host pool's state as walk segments, for the snapshot's
 * host_segments (pools/observe/snapshot.c; docs/snapshots.md, "Pinned host memory").
 *
 * A segment is one driver chunk, as PyTorch's host segments are one cudaHostAlloc each: a
 * power-of-two or oversize block's own chunk (one block), a carve segment (its blocks in
 * address order, through their segment links) or the reserve segment (its slices sorted by
 * address, then its unused tail as one free block). Everything is gathered under the pool's
 * lock into arrays made here, so the writer walks plain structs; the lock stays held while
 * the writer runs, so the history it reads cannot move. */
#include "host_pool.h"

#include <stdlib.h>
#include <string.h>

static int by_ptr(const void *x, const void *y) {
  uintptr_t a = (*(const hblock_t *const *)x)->ptr, b = (*(const hblock_t *const *)y)->ptr;
  return a < b ? -1 : a > b;
}

static int by_address(const void *x, const void *y) {
  uint64_t a = ((const expseg_walk_segment *)x)->address,
           b = ((const expseg_walk_segment *)y)->address;
  return a < b ? -1 : a > b;
}

static expseg_block_state walk_state(uint8_t s) {
  return s == HB_ALLOCATED ? EXPSEG_BLOCK_ALLOCATED
         : s == HB_PENDING ? EXPSEG_BLOCK_PENDING_FREE
                           : EXPSEG_BLOCK_INACTIVE;
}

static void add_block(expseg_walk_segment *s, expseg_walk_block *out, uintptr_t ptr, size_t size,
                      size_t requested, uint8_t state) {
  out->address = ptr;
  out->size = size;
  out->state = walk_state(state);
  out->requested_size = state == HB_FREE ? 0 : requested;
  s->total_size += size;
  if (state == HB_ALLOCATED) s->allocated_size += size;
  if (state != HB_FREE) {
    s->active_size += size;
    s->requested_size += out->requested_size;
  }
  s->n_blocks++;
}

static void begin(expseg_walk_segment *s, const expseg_walk_block *first, uintptr_t address) {
  memset(s, 0, sizeof *s);
  s->address = address;
  s->is_large = true;
  s->blocks = first;
}

bool _expseg_host_observe(expseg_host_pool *h,
                          void (*fn)(void *ctx, const history_t *hist,
                                     const expseg_walk_segment *segs, size_t n),
                          void *ctx) {
  pthread_mutex_lock(&h->lock);
  EXPSEG_HOST_HIST(h, HIST_SNAPSHOT, 0, h->st.allocated_bytes.current);
  size_t n_all = 0, n_reserve = 0;
  for (const hblock_t *b = h->all; b; b = b->next_all) {
    n_all++;
    n_reserve += b->in_reserve;
  }
  /* blocks: every block, plus the reserve's tail; segments: at most one per block, plus the
   * reserve */
  expseg_walk_block *blocks = malloc((n_all + 1) * sizeof *blocks);
  expseg_walk_segment *segs = malloc((n_all + 1) * sizeof *segs);
  hblock_t **slices = malloc((n_reserve + 1) * sizeof *slices);
  if (!blocks || !segs || !slices) {
    pthread_mutex_unlock(&h->lock);
    free(blocks);
    free(segs);
    free(slices);
    return false;
  }
  size_t nb = 0, ns = 0, nr = 0;
  for (hblock_t *b = h->all; b; b = b->next_all) {
    if (b->in_reserve) {
      slices[nr++] = b;
    } else if (!b->carve) { /* its own chunk */
      expseg_walk_segment *s = &segs[ns++];
      begin(s, &blocks[nb], b->ptr);
      add_block(s, &blocks[nb++], b->ptr, b->size, b->requested, b->state);
    } else if (!b->seg_prev) { /* the first block of a carve segment */
      expseg_walk_segment *s = &segs[ns++];
      begin(s, &blocks[nb], b->ptr);
      for (const hblock_t *c = b; c; c = c->seg_next)
        add_block(s, &blocks[nb++], c->ptr, c->size, c->requested, c->state);
    }
  }
  if (h->reserve.ptr) {
    qsort(slices, nr, sizeof *slices, by_ptr);
    expseg_walk_segment *s = &segs[ns++];
    begin(s, &blocks[nb], (uintptr_t)h->reserve.ptr);
    for (size_t i = 0; i < nr; i++)
      add_block(s, &blocks[nb++], slices[i]->ptr, slices[i]->size, slices[i]->requested,
                slices[i]->state);
    if (h->reserve_used < h->reserve.size)
      add_block(s, &blocks[nb++], (uintptr_t)h->reserve.ptr + h->reserve_used,
                h->reserve.size - h->reserve_used, 0, HB_FREE);
  }
  /* the segments point into blocks, which does not move: sorting moves the headers only */
  qsort(segs, ns, sizeof *segs, by_address);
  fn(ctx, h->hist, segs, ns);
  pthread_mutex_unlock(&h->lock);
  free(blocks);
  free(segs);
  free(slices);
  return true;
}
