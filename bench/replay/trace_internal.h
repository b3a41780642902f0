/* SPDX-License-Identifier: Apache-2.0 */
/* trace_internal.h: what the trace readers share (bench/replay/trace*.c, pickle.c).
 *
 * - base/map.h's map from 64-bit keys to 64-bit values (addresses -> ids, stream handles
 *   -> dense indices), included here;
 * - the event checker: every reader feeds its events through one checker, which enforces
 *   the rules of a well-formed trace (dense new ids, frees of live ids only, matching sizes,
 *   dense streams, no absurd sizes) and computes peak_live_requested, so every reader
 *   produces traces that the others (and the replay tool) accept;
 * - the snapshot unpickler's value tree (pickle.c), read by trace_pickle.c.
 * Nothing here is part of the public API. */
#ifndef EXPSEG_TRACE_INTERNAL_H
#define EXPSEG_TRACE_INTERNAL_H

#include "map.h"
#include "rand.h" /* _expseg_splitmix64, the tools' generator too */
#include "trace.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sizes above this are rejected by every reader (1 PiB: no device has that much). */
#define EXPSEG_TRACE_MAX_SIZE (UINT64_C(1) << 50)
/* Distinct streams per trace. */
#define EXPSEG_TRACE_MAX_STREAMS (UINT32_C(1) << 20)

/* ---- trace.c: fields, arguments, the clock (the u64 -> u64 map is base/map.h) ---- */
/* A field of a text line (not NUL-terminated). */
typedef struct _expseg_field_s {
  const char *p;
  size_t len;
} _expseg_field_t;
/* Unsigned decimal; false on anything else (signs, spaces, empty) or overflow. */
bool _expseg_field_dec(_expseg_field_t f, uint64_t *out);
/* 1 to 16 hexadecimal digits, with or without 0x; false on anything else. */
bool _expseg_field_hex(_expseg_field_t f, uint64_t *out);
bool _expseg_field_is(_expseg_field_t f, const char *s);
/* A command-line number (tools): 0 when s is an unsigned decimal, -1 otherwise. */
int _expseg_arg_u64(const char *s, uint64_t *v);
/* The benchmarks' clock (base/clock.h's, ns) and qsort order for uint64_t timings. */
#ifndef EXPSEG_PRINTF
#if defined(__GNUC__)
#define EXPSEG_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define EXPSEG_PRINTF(f, a)
#endif
#endif
/* Sets this thread's trace-library message (printf-style) and returns s (trace_error.c). */
expseg_status _expseg_trace_error(expseg_status s, const char *fmt, ...) EXPSEG_PRINTF(2, 3);
uint64_t _expseg_bench_now_ns(void);
int _expseg_u64_cmp(const void *a, const void *b);

/* ---- synth_capture.c: what expseg-replay --snapshot / --report capture ---- */
typedef struct capture_s {
  int64_t at;           /* capture after this event; -1: first pass, find the peak; -2: none */
  int at_end;           /* the snapshot after the last event (--snapshot-at end) */
  const char *snapshot; /* --snapshot path, or NULL */
  int report;           /* --report */
  FILE *out;            /* where the report goes */
  /* --report FILE.html: called with each segment at the peak (expseg_walk), or NULL */
  void (*walk)(void *ctx, const expseg_walk_segment *s);
  void *walk_ctx;
} capture_t;
/* At the peak (end = 0): the report and, unless at_end, the snapshot; at the end: the
 * snapshot. 0 on success, 1 after printing why to err. */
int _expseg_replay_capture(expseg_allocator *a, const char *name, const capture_t *c,
                           size_t event, int end, FILE *err);
/* --timeline rows: a sample every N events (sample = 1), plus the event at which a running
 * peak (reserved or allocated bytes) last rose before each sample, so that the peak of the
 * statistics is a row of the file, not a maximum of samples. */
#define EXPSEG_TIMELINE_HEADER \
  "trace,event,live_requested,reserved,allocated,cached,reserved_peak,allocated_peak"
typedef struct timeline_row_s {
  int pending;           /* not yet written */
  size_t event;
  uint64_t live;
  int64_t v[5];          /* reserved, allocated, cached, reserved_peak, allocated_peak */
} timeline_row_t;
typedef struct timeline_s {
  int64_t rpeak, apeak;  /* running peaks seen */
  timeline_row_t at[2];  /* where each peak last rose */
} timeline_t;
void _expseg_timeline_step(timeline_t *tl, FILE *f, const char *name, const expseg_allocator *a,
                           size_t event, uint64_t live, int sample);
void _expseg_timeline_flush(timeline_t *tl, FILE *f, const char *name);

/* ---- trace.c: the event checker ---- */
typedef struct _expseg_trace_check_s {
  uint64_t *size;      /* per id: requested bytes */
  uint8_t *state;      /* per id: 1 live, 2 free requested, 3 freed */
  uint64_t cap;        /* entries of size/state */
  uint64_t n_ids;
  uint32_t n_streams;
  bool seen_event;     /* an event other than 'p' was seen */
  uint64_t n_prelive;
  uint64_t live, peak; /* live requested bytes now, and their maximum */
  uint64_t counts[5];  /* M X m u O lines */
} _expseg_trace_check_t;

/* Checks one event and updates the state. Returns NULL when it is acceptable, else the
 * reason (written into why, which has why_len bytes). Out of host memory is a reason too. */
const char *_expseg_trace_check(_expseg_trace_check_t *c, const expseg_trace_event_t *e,
                                char *why, size_t why_len);
void _expseg_trace_check_free(_expseg_trace_check_t *c);

/* ---- trace.c: building traces ---- */
/* Appends an event; EXPSEG_ERR_OUT_OF_MEMORY (message set) when the host is out of memory. */
expseg_status _expseg_trace_push(expseg_trace_t *t, uint8_t kind, uint32_t stream, uint64_t id,
                                 uint64_t size, uint64_t extra);
/* The program's empty_cache() calls: before every run of recorded segment frees/unmaps
 * (X/u) that does not follow an OOM (O) or an explicit E, inserts an E event, which the
 * replay feeds to the allocator under test (docs/formats.md: the rule and its limits). */
expseg_status _expseg_trace_mark_empty_cache(expseg_trace_t *t);
/* Sets t->name to the last path component of name without its extension, then suffix. */
void _expseg_trace_set_name(expseg_trace_t *t, const char *name, const char *suffix);
/* Maps stream handles to dense indices: handle 0 (the default stream) is index 0 when it
 * occurs at all, the others are numbered in order of first use. Streams are first given
 * provisional indices in order of first use; _expseg_streams_finish renumbers the events. */
typedef struct _expseg_streams_s {
  _expseg_map_t map;  /* handle -> provisional index */
  uint32_t n;
} _expseg_streams_t;
/* Provisional index of handle (new ones get the next); UINT32_MAX when out of memory or
 * there are too many streams. */
uint32_t _expseg_streams_index(_expseg_streams_t *s, uint64_t handle);
void _expseg_streams_finish(_expseg_streams_t *s, expseg_trace_t *t);
/* The final index of provisional index p (what _expseg_streams_finish applies). */
uint32_t _expseg_streams_final(const _expseg_streams_t *s, uint32_t p);
void _expseg_streams_free(_expseg_streams_t *s);

/* ---- pickle.c: a safe unpickler for snapshot files ---- */
typedef enum _expseg_pv_kind {
  EXPSEG_PV_NONE, EXPSEG_PV_BOOL, EXPSEG_PV_INT, EXPSEG_PV_FLOAT, EXPSEG_PV_STR,
  EXPSEG_PV_BYTES, EXPSEG_PV_LIST, EXPSEG_PV_TUPLE, EXPSEG_PV_DICT
} _expseg_pv_kind;

typedef struct _expseg_pv_s {
  uint8_t kind;       /* _expseg_pv_kind */
  uint8_t big;        /* INT: the value does not fit in int64 (iv is meaningless) */
  uint32_t off;       /* byte offset of the opcode that made it (for messages) */
  union {
    int64_t iv;       /* BOOL, INT */
    double fv;        /* FLOAT */
    struct { const char *p; uint64_t len; } s;          /* STR, BYTES: points into the input */
    struct { uint32_t *items; uint32_t n, cap; } c;     /* LIST, TUPLE, DICT (key, value, ...) */
  } u;
} _expseg_pv_t;

typedef struct _expseg_pickle_s {
  _expseg_pv_t *v;    /* every value made; index 0 is unused */
  uint32_t n, cap;
  uint32_t root;      /* the value STOP returned */
  /* dicts with more than EXPSEG_PICKLE_SCAN_KEYS keys are hashed: dict value -> (offset of
   * its table in dslot) << 6 | log2(table size); a slot holds 1 + the key's pair index */
  _expseg_map_t dindex;
  uint32_t *dslot;
} _expseg_pickle_t;

/* Limits: the input below 2 GiB, MARKs nested at most 64 deep, memo indices below the
 * input length. Errors (EXPSEG_ERR_INVALID_ARGUMENT) name the byte offset and the reason.
 * The tree points into buf, which must outlive it. */
#define EXPSEG_PICKLE_MAX_MARKS 64
/* Dicts up to this many keys are scanned; larger ones get a hash table when loaded, so a
 * lookup costs O(1) however often a shared dict is read. */
#define EXPSEG_PICKLE_SCAN_KEYS 16
/* Device indices with a recorded history in a snapshot: 0 to this - 1 (one trace each). */
#define EXPSEG_PICKLE_MAX_DEVICES 1024
expseg_status _expseg_pickle_load(const char *name, const unsigned char *buf, size_t len,
                                  _expseg_pickle_t *out);
void _expseg_pickle_free(_expseg_pickle_t *p);
/* A crafted snapshot (pickle_craft.c) of shape "wide", "shared", "devices" or "memo",
 * about n times a few bytes long (malloc'ed, *len bytes); NULL for an unknown shape or out
 * of host memory. */
unsigned char *_expseg_pickle_craft(const char *shape, size_t n, size_t *len);
/* The value of a string key in a dict, or 0 when absent (the last one wins); O(1). */
uint32_t _expseg_pickle_dict_get(const _expseg_pickle_t *p, uint32_t dict, const char *key);
/* The entries of the option string s whose key is an allocator option (expseg_option_pytorch
 * knows it) into buf, comma-separated: a recorded PYTORCH_CUDA_ALLOC_CONF without the keys of
 * a newer PyTorch that expseg would refuse (trace_config.c). Returns the entries left out. */
int _expseg_config_known(const char *s, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
