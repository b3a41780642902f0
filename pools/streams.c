/* SPDX-License-Identifier: Apache-2.0 */
/* streams.c: blocks used on other streams. record_stream adds a stream to a block's uses;
 * freeing such a block records one event per used stream (events come from a pool and are
 * never recorded on the plain same-stream path) and leaves the block pending until all of
 * them complete. Each used stream has its own FIFO of events, polled at the start of
 * malloc (no head-of-line blocking across streams), drained with synchronization on
 * empty_cache and on the out-of-memory path.
 *
 * Lending (reuse before growth): a request that finds no free block on its own stream may
 * take a free block another stream of the same pool holds once that stream's queued work is
 * done (an event says so), instead of mapping or creating memory. The block stays its
 * owner's (segment and free index), the borrower is recorded as a use, so its free waits
 * for the borrower's work and then returns it to the owner: stream-ordered reuse on either
 * stream stays safe, and no driver call moves memory between streams. */
#include "block.h"
#include "error.h"
#include "fidx.h"
#include "internal.h"
#include "release.h"

#include <stdlib.h>
#include <string.h>

expseg_status _expseg_block_add_use(block_t *b, expseg_stream s) {
  /* its own stream (internal.h: key); a lent block's owner is another stream to the one
   * that allocated it, and is recorded like any */
  if (s == skey_stream(b->stream) && !b->lent) return EXPSEG_OK;
  for (uint32_t i = 0; i < b->n_uses; i++)
    if (b->uses[i] == s) return EXPSEG_OK;
  if (b->n_uses == b->uses_cap) {
    uint32_t cap = b->uses_cap * 2;
    expseg_stream *u = malloc(cap * sizeof *u);
    if (u == NULL) return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "out of host memory");
    memcpy(u, b->uses, b->n_uses * sizeof *u);
    if (b->uses != b->uses_inline) free(b->uses);
    b->uses = u;
    b->uses_cap = cap;
  }
  b->uses[b->n_uses++] = s;
  return EXPSEG_OK;
}

expseg_status _expseg_event_get(expseg_allocator *a, expseg_vmm_event *ev) {
  if (a->n_event_pool > 0) {
    *ev = a->event_pool[--a->n_event_pool];
    return EXPSEG_OK;
  }
  return _expseg_vmm_event_create(a->drv, ev);
}

void _expseg_event_put(expseg_allocator *a, expseg_vmm_event ev) {
  if (a->n_event_pool == a->cap_event_pool) {
    size_t cap = a->cap_event_pool ? a->cap_event_pool * 2 : 16;
    expseg_vmm_event *p = realloc(a->event_pool, cap * sizeof *p);
    if (p == NULL) {
      (void)_expseg_vmm_event_destroy(a->drv, ev);
      return;
    }
    a->event_pool = p;
    a->cap_event_pool = cap;
  }
  a->event_pool[a->n_event_pool++] = ev;
}

static stream_queue_t *queue_for(expseg_allocator *a, expseg_stream s) {
  const uint64_t *i = _expseg_map_get(&a->queue_of, s);
  if (i != NULL) return &a->queues[*i];
  if (!_expseg_map_put(&a->queue_of, s, a->n_queues)) return NULL;
  if (a->n_queues == a->cap_queues) {
    size_t cap = a->cap_queues ? a->cap_queues * 2 : 8;
    stream_queue_t *q = realloc(a->queues, cap * sizeof *q);
    if (q == NULL) {
      (void)_expseg_map_take(&a->queue_of, s, NULL);
      return NULL;
    }
    a->queues = q;
    a->cap_queues = cap;
  }
  stream_queue_t *q = &a->queues[a->n_queues++];
  memset(q, 0, sizeof *q);
  q->stream = s;
  return q;
}

static bool queue_push(stream_queue_t *q, pending_t p) {
  if (q->count == q->cap) {
    size_t cap = q->cap ? q->cap * 2 : 16;
    pending_t *items = malloc(cap * sizeof *items);
    if (items == NULL) return false;
    for (size_t i = 0; i < q->count; i++) items[i] = q->items[(q->head + i) % q->cap];
    free(q->items);
    q->items = items;
    q->head = 0;
    q->cap = cap;
  }
  q->items[(q->head + q->count) % q->cap] = p;
  q->count++;
  return true;
}

static pending_t queue_pop(stream_queue_t *q) {
  pending_t p = q->items[q->head];
  q->head = (q->head + 1) % q->cap;
  q->count--;
  return p;
}

bool _expseg_insert_events(expseg_allocator *a, block_t *b) {
  expseg_vmm_event local[8];
  expseg_vmm_event *evs = b->n_uses <= 8 ? local : malloc(b->n_uses * sizeof *evs);
  if (evs == NULL) return false;
  uint32_t n = 0;
  bool ok = true;
  for (; n < b->n_uses; n++) {
    if (_expseg_event_get(a, &evs[n]) != EXPSEG_OK) {
      ok = false;
      break;
    }
    if (_expseg_vmm_event_record(a->drv, evs[n], b->uses[n]) != EXPSEG_OK) {
      _expseg_event_put(a, evs[n]);
      ok = false;
      break;
    }
  }
  for (uint32_t i = 0; ok && i < n; i++) /* create the queues first (may move them) */
    if (queue_for(a, b->uses[i]) == NULL) ok = false;
  /* queues exist now; pushing can still fail on memory: undo the pushes then */
  uint32_t pushed = 0;
  while (ok && pushed < n) {
    stream_queue_t *q = queue_for(a, b->uses[pushed]);
    if (!queue_push(q, (pending_t){evs[pushed], b})) {
      ok = false;
      break;
    }
    pushed++;
  }
  if (!ok) {
    for (uint32_t i = pushed; i-- > 0;) { /* remove from the queue tails again */
      stream_queue_t *q = queue_for(a, b->uses[i]);
      q->count--;
    }
    for (uint32_t i = 0; i < n; i++) _expseg_event_put(a, evs[i]);
  } else {
    b->event_count = n;
    a->n_pending_events += n;
  }
  if (evs != local) free(evs);
  return ok;
}

/* One event of b completed. */
static void event_done(expseg_allocator *a, pending_t p) {
  _expseg_event_put(a, p.ev);
  a->n_pending_events--;
  if (--p.b->event_count == 0) _expseg_free_block(a, p.b);
}

bool _expseg_orphan_add(expseg_allocator *a, block_t *b) {
  if (a->n_orphans == a->cap_orphans) {
    size_t cap = a->cap_orphans ? a->cap_orphans * 2 : 8;
    block_t **o = realloc(a->orphans, cap * sizeof *o);
    if (o == NULL) return false;
    a->orphans = o;
    a->cap_orphans = cap;
  }
  a->orphans[a->n_orphans++] = b;
  return true;
}

/* Orphans whose events can be recorded now become ordinary pending blocks; with wait, an
 * orphan whose streams can all be waited for is freed. */
static void retry_orphans(expseg_allocator *a, bool wait) {
  size_t kept = 0;
  for (size_t i = 0; i < a->n_orphans; i++) {
    block_t *b = a->orphans[i];
    if (_expseg_insert_events(a, b)) continue;
    bool done = wait;
    for (uint32_t u = 0; done && u < b->n_uses; u++)
      done = _expseg_vmm_stream_synchronize(a->drv, b->uses[u]) == EXPSEG_OK;
    if (done) _expseg_free_block(a, b);
    else a->orphans[kept++] = b;
  }
  a->n_orphans = kept;
}

/* Pops the completed events at the head of stream s's queue. */
static void poll_queue(expseg_allocator *a, expseg_stream s) {
  const uint64_t *i = _expseg_map_get(&a->queue_of, s);
  if (i == NULL) return;
  stream_queue_t *q = &a->queues[*i];
  while (q->count > 0) {
    bool done = false;
    if (_expseg_vmm_event_query(a->drv, q->items[q->head].ev, &done) != EXPSEG_OK || !done)
      break;
    event_done(a, queue_pop(q));
  }
}

bool _expseg_stream_frees_pending(const expseg_allocator *a, expseg_stream s) {
  const uint64_t *i = _expseg_map_get(&a->queue_of, s);
  return i != NULL && a->queues[*i].count > 0;
}

void _expseg_poll_uses(expseg_allocator *a, block_t *b) {
  expseg_stream local[8];
  const uint32_t n = b->n_uses < 8 ? b->n_uses : 8; /* b may be freed while polling */
  memcpy(local, b->uses, n * sizeof *local);
  for (uint32_t i = 0; i < n; i++) poll_queue(a, local[i]);
}

void _expseg_process_events(expseg_allocator *a) {
  if (a->n_orphans > 0) retry_orphans(a, false);
  for (size_t i = 0; i < a->n_queues; i++) {
    stream_queue_t *q = &a->queues[i];
    while (q->count > 0) {
      bool done = false;
      if (_expseg_vmm_event_query(a->drv, q->items[q->head].ev, &done) != EXPSEG_OK || !done)
        break;
      event_done(a, queue_pop(q));
    }
  }
}

void _expseg_sync_all_events(expseg_allocator *a) {
  a->stats.num_sync_all_streams++;
  if (a->n_orphans > 0) retry_orphans(a, true);
  for (size_t i = 0; i < a->n_queues; i++) {
    stream_queue_t *q = &a->queues[i];
    while (q->count > 0) {
      if (_expseg_vmm_event_synchronize(a->drv, q->items[q->head].ev) != EXPSEG_OK) {
        if (!a->warned_sync) /* once per allocator: it can repeat at every OOM */
          _expseg_warn("waiting for stream %#llx failed; its blocks stay pending: %s",
                       (unsigned long long)q->stream, expseg_last_error());
        a->warned_sync = true;
        break;
      }
      event_done(a, queue_pop(q));
    }
  }
}

void _expseg_streams_destroy(expseg_allocator *a) {
  for (size_t i = 0; i < a->n_queues; i++) {
    stream_queue_t *q = &a->queues[i];
    while (q->count > 0) (void)_expseg_vmm_event_destroy(a->drv, queue_pop(q).ev);
    free(q->items);
  }
  free(a->queues);
  a->queues = NULL;
  _expseg_map_free(&a->queue_of);
  free(a->orphans);
  a->orphans = NULL;
  a->n_orphans = a->cap_orphans = 0;
  a->n_queues = a->cap_queues = 0;
  for (size_t i = 0; i < a->n_event_pool; i++)
    (void)_expseg_vmm_event_destroy(a->drv, a->event_pool[i]);
  free(a->event_pool);
  a->event_pool = NULL;
  a->n_event_pool = a->cap_event_pool = 0;
}

/* Whether b may be lent to key for a request of `rounded` bytes, fitting it tighter than
 * key's own best fit of `own` bytes (0: none). */
static bool lend_fits(const block_t *b, expseg_stream key, size_t rounded, size_t own) {
  return b != NULL && b->stream != key && b->size >= rounded && b->seg->expandable &&
         _expseg_lend_tighter(own, b->size) && seg_tag(b->seg) == skey_tag(key);
}

/* Is x a tighter fit than y: the smaller, and of equal sizes the higher address (measured,
 * docs/benchmarks.md, "Free pieces of other streams")? */
static bool lend_before(const block_t *x, const block_t *y) {
  return x->size != y->size ? x->size < y->size : x->ptr > y->ptr;
}

block_t *_expseg_lend_tighter_find(expseg_allocator *a, int pool, expseg_stream key,
                                   size_t rounded, size_t own) {
  fidx_t *f = &a->free_idx;
  block_t *cand[EXPSEG_LEND_SCAN + 1];
  size_t n = 0;
  if (lend_fits(f->last[pool], key, rounded, own)) cand[n++] = f->last[pool];
  /* the best fit of each stream in turn, from the size treap (the last insert is outside
   * it), at most EXPSEG_LEND_SCAN streams (policy.h) */
  expseg_stream s = 0;
  for (size_t scan = EXPSEG_LEND_SCAN; scan > 0; scan--) {
    block_t *b = _expseg_fidx_fit_from(f, pool, s, rounded);
    if (b == NULL) break;
    if (lend_fits(b, key, rounded, own)) cand[n++] = b;
    if (b->stream == UINT64_MAX) break;
    s = b->stream + 1;
  }
  /* the tightest whose stream's queued work is done: one event per stream asked, and only
   * until one is */
  stream_seen_t seen[SEEN_MAX];
  size_t n_seen = 0;
  while (n > 0) {
    size_t i = 0;
    for (size_t j = 1; j < n; j++)
      if (lend_before(cand[j], cand[i])) i = j;
    block_t *b = cand[i];
    if (_expseg_stream_idle(a, b->stream, false, seen, &n_seen, SEEN_MAX)) {
      _expseg_free_remove(a, b);
      return b;
    }
    cand[i] = cand[--n];
  }
  return NULL;
}

block_t *_expseg_lend_find(expseg_allocator *a, int pool, expseg_stream key, size_t rounded) {
  block_t *best = _expseg_lend_tighter_find(a, pool, key, rounded, 0);
  if (best != NULL) return best;
  stream_seen_t seen[SEEN_MAX];
  size_t n_seen = 0;
  const uint32_t tag = skey_tag(key);
  /* the idle list holds every free mapped expandable block with a whole page, any stream,
   * oldest first: the first EXPSEG_LEND_SCAN of them (policy.h) */
  size_t scan = EXPSEG_LEND_SCAN;
  for (block_t *b = a->idle_head[pool]; b != NULL && scan > 0; b = b->idle_next, scan--) {
    if (b->size < rounded || (best != NULL && b->size >= best->size) || b->stream == key ||
        seg_tag(b->seg) != tag)
      continue;
    if (!_expseg_stream_idle(a, b->stream, false, seen, &n_seen, SEEN_MAX)) continue;
    best = b;
    if (b->size == rounded) break;
  }
  if (best != NULL) _expseg_free_remove(a, best);
  return best;
}
