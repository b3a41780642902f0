/* SPDX-License-Identifier: Apache-2.0 */
/* host_carve.c: exact-size pinned blocks carved from large segments. Design:
 * docs/host_pool.md, "Exact sizes".
 *
 * Above pinned_max_round_threshold_mb (and at most pinned_max_cached_size_mb) a request
 * gets a block of its page-rounded size, cut from a carve segment: a driver chunk of at
 * least 1/32 of the carve segments held so far (2 MiB to 256 MiB, never less than the
 * request; policy: _expseg_carve_segment_size), so the unused tail of the newest segment
 * stays a small share of what is held. The blocks of a segment are linked in address order;
 * a free block merges with its free neighbours at once and waits on one best-fit list
 * (with pinned_carve_strict a whole free segment larger than a fresh one is passed over:
 * _expseg_carve_may_take); a segment whose memory is all free is given back by empty_cache,
 * by the next carve miss and on the out-of-memory path. Power-of-two blocks trade up to
 * 2x the memory asked for a list pop; carving trades a walk of the free list for memory held
 * close to what is live. Lock held in every function here unless said otherwise. */
#include "error.h"
#include "host_pool.h"

#include <stdlib.h>
#include <string.h>

size_t _expseg_host_carve_segment_size(const expseg_host_pool *h, size_t cls) {
  return _expseg_carve_segment_size(h->carve_reserved, cls, h->page);
}

static void drop(hblock_t *b) {
  if (b->streams != b->streams_inline) free(b->streams);
  free(b);
}

static void list_remove(expseg_host_pool *h, hblock_t *b) {
  hblock_t **pp = &h->carve_free;
  while (*pp && *pp != b) pp = &(*pp)->next_free;
  if (*pp) *pp = b->next_free;
  b->next_free = NULL;
}

static void list_push(expseg_host_pool *h, hblock_t *b) {
  b->next_free = h->carve_free;
  h->carve_free = b;
}

/* Cuts b (taken, not on the list) down to cls bytes; the rest becomes a free block that
 * follows it in its segment. No host memory for the rest: b keeps its whole size. */
static void split(expseg_host_pool *h, hblock_t *b, size_t cls) {
  if (b->size - cls < h->page) return;
  hblock_t *r = calloc(1, sizeof *r);
  if (!r) return;
  r->streams = r->streams_inline;
  r->cap_streams = 2;
  r->carve = b->carve;
  r->ptr = b->ptr + cls;
  r->size = b->size - cls;
  r->state = HB_FREE;
  r->seg_prev = b;
  r->seg_next = b->seg_next;
  if (b->seg_next) b->seg_next->seg_prev = r;
  b->seg_next = r;
  b->size = cls;
  _expseg_host_link_block(h, r);
  list_push(h, r);
  _expseg_stat_add(&h->st.cached_bytes, (int64_t)r->size);
}

hblock_t *_expseg_host_carve_take(expseg_host_pool *h, size_t cls) {
  hblock_t *best = NULL;
  const size_t fresh = _expseg_host_carve_segment_size(h, cls);
  for (hblock_t *b = h->carve_free; b; b = b->next_free)
    if (b->size >= cls && (!best || b->size < best->size) &&
        _expseg_carve_may_take(h->cfg.pinned_carve_strict, b->size, !b->seg_prev && !b->seg_next,
                               fresh)) {
      best = b;
      if (b->size == cls) break;
    }
  if (!best) return NULL;
  list_remove(h, best);
  _expseg_stat_add(&h->st.cached_bytes, -(int64_t)best->size);
  split(h, best, cls);
  return best;
}

/* Lists seg among the carve segments and makes one block of all of it (NULL: no host memory
 * for the block struct; the segment stays listed, so destroy frees it). */
static hblock_t *adopt(expseg_host_pool *h, hcarve_t *seg) {
  seg->next = h->carve_segs;
  h->carve_segs = seg;
  h->carve_reserved += seg->chunk.size;
  hblock_t *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->streams = b->streams_inline;
  b->cap_streams = 2;
  b->carve = seg;
  b->ptr = (uintptr_t)seg->chunk.ptr;
  b->size = seg->chunk.size;
  _expseg_host_link_block(h, b);
  return b;
}

hblock_t *_expseg_host_carve_new(expseg_host_pool *h, hcarve_t *seg, size_t cls) {
  hblock_t *b = adopt(h, seg);
  if (b) split(h, b, cls);
  return b;
}

/* Merges b into a free neighbour n that follows it; n leaves the list and is deleted. */
static void absorb(expseg_host_pool *h, hblock_t *b, hblock_t *n) {
  list_remove(h, n);
  b->size += n->size;
  b->seg_next = n->seg_next;
  if (n->seg_next) n->seg_next->seg_prev = b;
  _expseg_host_unlink_block(h, n);
  drop(n);
}

void _expseg_host_carve_put(expseg_host_pool *h, hblock_t *b) {
  if (b->seg_next && b->seg_next->state == HB_FREE) absorb(h, b, b->seg_next);
  hblock_t *p = b->seg_prev;
  if (p && p->state == HB_FREE) {
    absorb(h, p, b); /* b was not on the list: absorb's removal finds nothing */
    return;
  }
  list_push(h, b);
}

size_t _expseg_host_carve_release(expseg_host_pool *h) {
  hblock_t *gone = NULL;
  for (hblock_t **pp = &h->carve_free; *pp;) {
    hblock_t *b = *pp;
    if (b->seg_prev || b->seg_next) { /* part of a segment still in use */
      pp = &b->next_free;
      continue;
    }
    /* off the list; still listed among the segments, walked (snapshots) and counted in
     * cached_bytes until the give-back succeeds (a failed one keeps it) */
    *pp = b->next_free;
    b->next_free = gone;
    gone = b;
  }
  size_t freed = 0;
  while (gone) {
    hblock_t *b = gone;
    gone = b->next_free;
    b->next_free = NULL;
    hcarve_t *seg = b->carve;
    uint64_t us = 0;
    pthread_mutex_unlock(&h->lock);
    expseg_status s = _expseg_host_chunk_free(h, &seg->chunk, &us);
    pthread_mutex_lock(&h->lock);
    if (s != EXPSEG_OK) {
      _expseg_warn("host pool: giving back carve segment %p failed (%s); it stays cached",
                   seg->chunk.ptr, expseg_last_error());
      list_push(h, b); /* kept (expseg_host_destroy frees every segment listed), whole and free */
      continue;
    }
    _expseg_host_unlink_block(h, b);
    drop(b);
    for (hcarve_t **sp = &h->carve_segs; *sp; sp = &(*sp)->next)
      if (*sp == seg) {
        *sp = seg->next;
        break;
      }
    h->carve_reserved -= seg->chunk.size;
    _expseg_stat_add(&h->st.cached_bytes, -(int64_t)seg->chunk.size); /* the whole segment */
    _expseg_host_note_chunk_free(h, &seg->chunk, us);
    freed += seg->chunk.size;
    free(seg);
  }
  return freed;
}
