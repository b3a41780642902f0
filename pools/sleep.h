/* SPDX-License-Identifier: Apache-2.0 */
/* sleep.h: the records of tagged regions and their sleeping segments, shared by sleep.c
 * (regions, sleep and wake) and sleep_copy.c (copying their bytes). Internal to pools/. */
#ifndef EXPSEG_POOLS_SLEEP_H
#define EXPSEG_POOLS_SLEEP_H

#include "internal.h"

typedef struct crec_s { /* one physical chunk of a sleeping segment */
  uintptr_t addr;
  size_t size, first_page; /* first_page: expandable segments */
  expseg_vmm_handle h;
  bool alive, mapped;
} crec_t;

typedef struct piece_s { /* a live block's bytes and where they sit in the host copy */
  uintptr_t addr;
  size_t size, off;
} piece_t;

typedef struct sseg_s {
  segment_t *s;
  crec_t *chunks;
  size_t n_chunks;
  piece_t *pieces;
  size_t n_pieces;
  expseg_host_chunk_t host;
  bool has_host;
} sseg_t;

typedef struct region_s {
  char name[64];
  expseg_pool_id pool;
  uint32_t tag, note; /* note: the tag in the history's text table (0: none) */
  bool asleep, no_bytes; /* no_bytes: the driver has none to copy (sim): host copies are
                          * counted, never allocated (their ptr NULL) */
  bool busy;             /* its bytes are being copied, the lock let go (copy_unlocked) */
  sseg_t *segs;
  size_t n_segs;
  block_t **deferred; /* frees made while asleep */
  size_t n_deferred, cap_deferred;
  expseg_host_chunk_t *kept; /* host copies of the last offload, kept for the next one */
  size_t n_kept, cap_kept;
  uint64_t sleeps, wakes, last_sleep_us, last_wake_us, last_sleep_at_us, last_wake_at_us;
  uint64_t copy_ns; /* of the sleep or wake in progress: time in copy_segs */
  uint64_t last_sleep_copy_us, last_wake_copy_us;
} region_t;

enum { STALE_MAX = 16 };

struct sleep_state_s {
  region_t *r;
  size_t n, cap;
  expseg_host_chunk_t stale[STALE_MAX]; /* host copies the driver refused to take back */
  size_t n_stale;
  expseg_stream copy_stream; /* queued copies (copy_stream_of) */
  int copy_stream_state;     /* 0 not made yet, 1 made, -1 none: synchronous copies */
};

/* Copies the live bytes of segs[0..n) out to their host copies (in: back in), in pieces of
 * at most 64 MiB; queued on *stream where it is not NULL, then that stream synchronized
 * (also after a failure: nothing is left in flight), unless pending is not NULL: then
 * *pending is set when a copy was queued and the caller synchronizes. *no_bytes: the driver has no bytes
 * (sim; known before the sleep): nothing is copied. */
expseg_status _expseg_sleep_copy_segs(expseg_vmm_t *drv, const sseg_t *segs, size_t n, bool in,
                                      bool *no_bytes, const expseg_stream *stream,
                                      bool *pending);
/* Waits for the copies queued on `stream`. When that synchronize fails, the device is
 * synchronized as well before returning the first failure (its message kept): the caller
 * then undoes (unmaps device memory, frees host copies), and a copy still in flight would
 * land in memory given back (cuMemUnmap does not wait for queued work). Where the device
 * cannot be synchronized either, the context has failed and runs no more copies. */
expseg_status _expseg_sleep_sync_copies(expseg_vmm_t *drv, expseg_stream stream);
/* The allocator's stream for queued copies, made at the first call (lock held); NULL where
 * the driver copies synchronously only, or could not make one (then copies are
 * synchronous). */
const expseg_stream *_expseg_sleep_copy_stream(expseg_allocator *a);

#endif
