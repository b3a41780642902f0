/* SPDX-License-Identifier: Apache-2.0 */
/* sleep_copy.c: the copies of a sleep and a wake (pools/sleep.c): a region's live bytes to
 * their pinned host copies and back, in pieces of at most 64 MiB, so a large block is never
 * one long call and the driver's copy engine gets work queued in pieces. Where the driver
 * queues copies (cuda: cuMemcpyDtoHAsync / HtoDAsync, which need pinned host memory, as the
 * host copies are) they go on one stream the allocator makes at the first copy, and each
 * batch ends with one synchronize of that stream, also after a failure, so nothing is in
 * flight when the caller unmaps memory or hands it out (a failed synchronize is followed
 * by one of the device); a wake thus returns with its bytes
 * in place for work queued afterwards on any stream. Elsewhere (host) the copies are
 * synchronous; sim has no bytes, and a sleep there never gets here. */
#include "sleep.h"

enum { COPY_PIECE = 64u << 20 };

/* Copies the live bytes of segs[0..n) out to their host copies (in: back in), in pieces of
 * at most COPY_PIECE; queued on *stream where it is not NULL, then that stream synchronized
 * (also after a failure: nothing is left in flight), unless pending is not NULL: then
 * *pending is set when a copy was queued and the caller synchronizes. No lock needed: it reads the records of
 * a busy region, which no other call changes, and the driver copies with its own. *no_bytes:
 * the driver has no bytes (sim; known before the sleep): nothing is copied. */
expseg_status _expseg_sleep_copy_segs(expseg_vmm_t *drv, const sseg_t *segs, size_t n, bool in,
                                      bool *no_bytes, const expseg_stream *stream,
                                      bool *pending) {
  expseg_status st = EXPSEG_OK;
  bool queued = false;
  for (size_t i = 0; i < n && !*no_bytes && st == EXPSEG_OK; i++) {
    const sseg_t *g = &segs[i];
    for (size_t k = 0; k < g->n_pieces && g->has_host && !*no_bytes && st == EXPSEG_OK; k++) {
      const piece_t *p = &g->pieces[k];
      for (size_t off = 0; off < p->size && st == EXPSEG_OK; off += COPY_PIECE) {
        const size_t len = p->size - off < COPY_PIECE ? p->size - off : COPY_PIECE;
        char *host = (char *)g->host.ptr + p->off + off;
        if (stream)
          queued |= (st = _expseg_vmm_copy_async(drv, p->addr + off, host, len, in, *stream)) ==
                    EXPSEG_OK;
        else
          st = in ? _expseg_vmm_copy_in(drv, p->addr + off, host, len)
                  : _expseg_vmm_copy_out(drv, host, p->addr + off, len);
      }
    }
  }
  if (pending != NULL) {
    *pending |= queued; /* the caller synchronizes */
  } else if (queued) {
    const expseg_status s2 = _expseg_sleep_sync_copies(drv, *stream);
    if (st == EXPSEG_OK) st = s2;
  }
  return st;
}

expseg_status _expseg_sleep_sync_copies(expseg_vmm_t *drv, expseg_stream stream) {
  const expseg_status st = _expseg_vmm_stream_synchronize(drv, stream);
  if (st == EXPSEG_OK) return st;
  char cause[512];
  snprintf(cause, sizeof cause, "%s", _expseg_error_message());
  (void)_expseg_vmm_device_synchronize(drv); /* nothing in flight when the caller undoes */
  return _expseg_error_set(st, "%s", cause);
}

/* The allocator's stream for queued copies, made at the first copy; NULL where the driver
 * copies synchronously only (or could not make one: then copies are synchronous). */
const expseg_stream *_expseg_sleep_copy_stream(expseg_allocator *a) {
  struct sleep_state_s *ss = a->sleep;
  if (ss->copy_stream_state == 0)
    ss->copy_stream_state = _expseg_vmm_copies_async(a->drv) &&
                                    _expseg_vmm_stream_create(a->drv, &ss->copy_stream) == EXPSEG_OK
                                ? 1
                                : -1;
  return ss->copy_stream_state == 1 ? &ss->copy_stream : NULL;
}

