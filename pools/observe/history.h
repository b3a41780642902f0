/* SPDX-License-Identifier: Apache-2.0 */
/* history.h: the allocation history (history.c), the snapshot builder (snapshot.c), the
 * pickle writer (pickle_write.c) and the readable summary (summary.c), as seen by the rest
 * of pools/. The allocator's hooks are one line each: EXPSEG_HIST(a, ...), one predictable
 * branch when recording is off. */
#ifndef EXPSEG_POOLS_HISTORY_H
#define EXPSEG_POOLS_HISTORY_H

#include "expseg.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* PyTorch's TraceEntry actions, in the order of their names in _expseg_hist_action_name. */
enum {
  HIST_ALLOC, HIST_FREE_REQUESTED, HIST_FREE_COMPLETED, HIST_SEGMENT_ALLOC, HIST_SEGMENT_FREE,
  HIST_SEGMENT_MAP, HIST_SEGMENT_UNMAP, HIST_OOM, HIST_SNAPSHOT, HIST_ANNOTATE,
  HIST_SLEEP, HIST_WAKE, /* expseg's own (sleep.c): PyTorch's viewers pass over them */
  HIST_ACTION_COUNT
};
#define HIST_C_MAX 16    /* C frames kept per event */
#define HIST_HOST_MAX 16 /* innermost pushed frames kept per event */

typedef struct hist_event_s {
  uint64_t ticks;        /* when: _expseg_hist_time_us turns it into µs since the epoch */
  uint64_t addr;         /* oom: device free bytes (as PyTorch's TraceEntry) */
  uint64_t size;         /* alloc/free: requested bytes; segment: range; oom: rounded request */
  expseg_stream stream;
  expseg_pool_id pool;   /* the private pool of the block or segment (0: general cache) */
  uint8_t action, n_c, n_host;
  uint32_t note;         /* the user_metadata text's id in the frame table: annotate's
                          * text; sleep's and wake's region tag; else the allocator's user
                          * metadata when the event was recorded (0: none) */
  uint32_t compile;      /* the compile context's text id (0: none, written "N/A") */
  void *c[HIST_C_MAX];           /* return addresses, innermost first */
  uint32_t host[HIST_HOST_MAX];  /* pushed frame ids, innermost first */
} hist_event_t;

/* One external annotation (PyTorch's recordAnnotation; annotations.c): n key/value pairs in
 * one allocation: kv[0..n) the keys, kv[n..2n) the values, the strings after them. */
typedef struct hist_ann_s {
  uint64_t ticks;
  size_t n;
  const char **kv;
} hist_ann_t;

typedef struct history_s {
  hist_event_t *ring;
  hist_ann_t *ann;   /* the external annotations: a ring of the newest max (annotations.c) */
  size_t ann_cap, ann_head, ann_count;
  size_t cap, max;   /* allocated entries; the bound asked for */
  size_t head, count; /* oldest entry; entries held */
  uint64_t total;    /* events recorded since recording started */
  unsigned flags;    /* EXPSEG_HISTORY_*: C stacks; skipped actions (bit 8 + action) */
  uint64_t ticks0, ns0; /* a tick count and CLOCK_REALTIME (ns) taken together */
} history_t;

struct expseg_allocator;

/* Lock held. Appends one event (the ring keeps the newest max); NULL when the action is
 * skipped (EXPSEG_HISTORY_SKIP_*). */
hist_event_t *_expseg_hist_add(struct expseg_allocator *a, int action, uint64_t addr,
                               uint64_t size, expseg_stream stream);
#define EXPSEG_HIST(a, action, addr, size, stream)                                        \
  do {                                                                                    \
    if (__builtin_expect((a)->hist != NULL, 0))                                           \
      _expseg_hist_add((a), (action), (uint64_t)(addr), (uint64_t)(size), (stream));      \
  } while (0)

void _expseg_hist_destroy(struct expseg_allocator *a);
/* The same for a history of its own (the pinned host pool's): no allocator, pool 0. */
hist_event_t *_expseg_hist_push(history_t *h, int action, uint64_t addr, uint64_t size,
                                expseg_stream stream);
/* expseg_record_history's checks of its arguments (fn names the caller in the message). */
expseg_status _expseg_hist_check(const char *fn, bool enabled, size_t max_entries,
                                 unsigned flags);
/* A new empty history (NULL: out of host memory); _keep copies into it the newest events of
 * old that fit, unless flags hold EXPSEG_HISTORY_CLEAR. */
history_t *_expseg_hist_new(size_t max_entries, unsigned flags);
void _expseg_hist_keep(history_t *h, const history_t *old, unsigned flags);
void _expseg_hist_free(history_t *h);
const char *_expseg_hist_action_name(int action);
/* annotations.c: moves old's external annotations into h (the newest that fit), unless flags
 * hold EXPSEG_HISTORY_CLEAR; frees a history's annotations; annotation i (0 = oldest). */
void _expseg_hist_ann_move(history_t *h, history_t *old, unsigned flags);
void _expseg_hist_ann_free(history_t *h);
const hist_ann_t *_expseg_hist_ann_at(const history_t *h, size_t i);
/* The current tick count (history.c), as events take it. */
uint64_t _expseg_hist_ticks(void);
/* µs since the Unix epoch of a tick count: ticks are the CPU's time-stamp counter where
 * there is one (read in ~17 ns against ~35 ns for clock_gettime on the VM measured), scaled
 * by two (ticks, CLOCK_REALTIME) samples: one when recording started, one now. */
double _expseg_hist_scale(const history_t *h); /* ns per tick, measured now */
uint64_t _expseg_hist_time_us(const history_t *h, double scale, uint64_t ticks);
/* Event i (0 = oldest held). */
const hist_event_t *_expseg_hist_at(const history_t *h, size_t i);
/* Frame k of an event as (filename, name, line), C frames first then pushed frames; the
 * strings live in buf (len bytes) or in the frame table (valid for the process). */
void _expseg_hist_frame(const hist_event_t *e, size_t k, const char **filename,
                        const char **name, int *line, char *buf, size_t len);
/* An annotation's text: its id (0 when out of host memory), and the text of an id. */
uint32_t _expseg_hist_note(const char *text);
const char *_expseg_hist_note_text(uint32_t id);

/* ---- pickle_write.c: a pickle (protocol 4) writer using only the opcodes that PyTorch's
 * memory viewer (MemoryViz.js) unpickles ---- */
typedef struct pkw_s {
  unsigned char *p;
  size_t n, cap;
  bool failed;  /* out of host memory: the output is incomplete */
  uint32_t memo; /* memo entries written */
} pkw_t;
void _expseg_pkw_begin(pkw_t *w);
void _expseg_pkw_end(pkw_t *w);
void _expseg_pkw_int(pkw_t *w, int64_t v);
void _expseg_pkw_uint(pkw_t *w, uint64_t v);
void _expseg_pkw_float(pkw_t *w, double v);
void _expseg_pkw_bool(pkw_t *w, bool v);
void _expseg_pkw_none(pkw_t *w);
void _expseg_pkw_str(pkw_t *w, const char *s); /* UTF-8; invalid bytes become U+FFFD */
void _expseg_pkw_dict(pkw_t *w); /* EMPTY_DICT MARK: then key, value pairs, then _setitems */
void _expseg_pkw_setitems(pkw_t *w);
void _expseg_pkw_list(pkw_t *w); /* EMPTY_LIST MARK: then items, then _appends */
void _expseg_pkw_appends(pkw_t *w);
void _expseg_pkw_tuple2(pkw_t *w);
uint32_t _expseg_pkw_memoize(pkw_t *w); /* remembers the top object; returns its index */
void _expseg_pkw_get(pkw_t *w, uint32_t index);
/* key/value helpers for dicts */
void _expseg_pkw_kint(pkw_t *w, const char *key, int64_t v);
void _expseg_pkw_kuint(pkw_t *w, const char *key, uint64_t v);
void _expseg_pkw_kstr(pkw_t *w, const char *key, const char *v);
void _expseg_pkw_kbool(pkw_t *w, const char *key, bool v);

/* ---- summary.c: the figures of expseg_memory_summary and the out-of-memory message ---- */
typedef struct memfig_s {
  uint64_t reserved, allocated, active; /* reserved_bytes, allocated_bytes, active_bytes */
  uint64_t mapped;     /* classic segments + mapped expandable pages */
  uint64_t cached;     /* unmapped physical pages in the page cache */
  uint64_t va;         /* address space reserved by all segments */
  uint64_t largest_free;
  uint64_t asleep; /* allocated bytes of sleeping regions: counted allocated, none held */
  double fragmentation; /* free bytes inside mapped memory / mapped bytes (0 when none) */
} memfig_t;
/* Lock held. */
memfig_t _expseg_memfig(const struct expseg_allocator *a);

#endif
