/* SPDX-License-Identifier: Apache-2.0 */
/* walk.h: the segments as snapshots report them (walk.c), shared by the snapshot pickle
 * (snapshot.c) and expseg_walk, so both report the same segments. */
#ifndef EXPSEG_POOLS_WALK_H
#define EXPSEG_POOLS_WALK_H

#include "internal.h"

#include <stdbool.h>

/* Lock held. Calls fn for every reported segment in address order: a classic segment whole
 * (first = its first block, end = NULL), an expandable one once per contiguous run of mapped
 * blocks [first, end). False (nothing called) when out of host memory. */
bool _expseg_reported_segments(const expseg_allocator *a,
                               void (*fn)(void *ctx, const segment_t *s, const block_t *first,
                                          const block_t *end),
                               void *ctx);

#endif
