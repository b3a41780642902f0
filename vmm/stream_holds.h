/* SPDX-License-Identifier: Apache-2.0 */
/* stream_holds.h: the bookkeeping of the cuda driver's hold_stream test hook and of the
 * streams it destroyed, apart from the driver calls (vmm/cuda.c makes those). Why apart:
 * none of it needs CUDA's types, and only vmm/cuda.c includes cuda.h.
 *
 * A held stream waits on its own 32-bit word of a registered host page (`page`, one word
 * per slot) until the word reaches the hold's generation; releasing writes the generation
 * (generations only grow: a word is never reset). `held_now` counts the holds in force, so
 * the driver's waits can skip the lock when none is. `retired`: streams destroyed through
 * the driver, which the allocator's records may still name (their work was waited for at
 * the destroy). `mu` guards the slots and the retired set. */
#ifndef EXPSEG_VMM_STREAM_HOLDS_H
#define EXPSEG_VMM_STREAM_HOLDS_H

#include "expseg.h"
#include "map.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#define EXPSEG_HOLD_PAGE 4096
#define EXPSEG_HOLD_SLOTS (EXPSEG_HOLD_PAGE / 4)

typedef struct {
  pthread_mutex_t mu;
  uint32_t *page; /* NULL until the first hold */
  struct {
    expseg_stream stream;
    uint32_t gen; /* the stream waits for word >= gen; release writes gen */
    bool held;
  } slot[EXPSEG_HOLD_SLOTS];
  int n, held_now;
  _expseg_map_t retired; /* stream -> 1 */
} _expseg_holds_t;

void _expseg_holds_init(_expseg_holds_t *h);
void _expseg_holds_fini(_expseg_holds_t *h);
/* The slot of stream s, -1 when it has none (mu held). */
int _expseg_holds_slot(const _expseg_holds_t *h, expseg_stream s);
/* Is s held now (takes mu only while some hold is in force)? */
bool _expseg_holds_held(_expseg_holds_t *h, expseg_stream s);
/* Releases slot i if held: writes its generation into its word (mu held). */
void _expseg_holds_release(_expseg_holds_t *h, int i);
/* Is s a destroyed stream (with remove: forget it, a new stream took the handle)? */
bool _expseg_holds_retired(_expseg_holds_t *h, expseg_stream s, bool remove);
/* Remembers s as destroyed; EXPSEG_ERR_OUT_OF_MEMORY with a message when the set can't grow. */
expseg_status _expseg_holds_retire(_expseg_holds_t *h, expseg_stream s);

#endif
