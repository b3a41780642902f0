/* SPDX-License-Identifier: Apache-2.0 */
/* trace.h: allocation histories in memory, and the readers that build them.
 *
 * Every reader (memtrace v1 text, RMM logging_resource_adaptor CSV, PyTorch snapshot
 * pickles) and the synthetic workload generator produce the same thing: one
 * expseg_trace_t per device history, a flat array of events with dense allocation ids, in
 * replay order (pre-live allocations first). The replay tool consumes only this.
 * Formats: ../shared/traces/README.md and docs/formats.md. */
#ifndef EXPSEG_TRACE_H
#define EXPSEG_TRACE_H

#include "expseg.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum expseg_trace_kind {
  EXPSEG_TR_PRELIVE = 'p',   /* allocation live when recording started: id, size, stream */
  EXPSEG_TR_ALLOC = 'a',     /* allocate size requested bytes on stream as id */
  EXPSEG_TR_FREE = 'f',      /* id becomes free (reusable now) */
  EXPSEG_TR_FREE_REQ = 'r',  /* free requested; another stream still uses id until its 'f' */
  EXPSEG_TR_EMPTY = 'E',     /* explicit empty_cache */
  /* what the recorded allocator did: baseline only, never replayed */
  EXPSEG_TR_SEG_ALLOC = 'M', EXPSEG_TR_SEG_FREE = 'X',
  EXPSEG_TR_MAP = 'm', EXPSEG_TR_UNMAP = 'u', EXPSEG_TR_OOM = 'O'
} expseg_trace_kind;

typedef struct expseg_trace_event_s {
  uint8_t kind;      /* expseg_trace_kind */
  uint32_t stream;   /* dense stream index, 0 = default stream, in order of first use */
  uint64_t id;       /* dense allocation id from 0 (alloc/free kinds); address for M X m u */
  uint64_t size;     /* requested bytes (device_free for O is in `extra`) */
  uint64_t extra;    /* O: device_free; otherwise 0 */
} expseg_trace_event_t;

typedef struct expseg_trace_baseline_s {
  int present;       /* 1 when the file carries the recorded allocator's figures */
  uint64_t start_reserved, peak_reserved, end_reserved;
  uint64_t segment_alloc, segment_free, map, unmap, oom;
} expseg_trace_baseline_t;

/* One segment the recorded allocator held when recording started (pickles only): rebuilt
 * backwards from the end state through the window's segment events (docs/formats.md). */
typedef struct expseg_trace_segment_s {
  uint64_t addr, size;
  uint32_t stream;   /* dense stream index, as in the events */
  uint8_t small;     /* 1: small pool (2 MiB segment), 0: large pool */
} expseg_trace_segment_t;

/* A stack frame of an allocation (snapshot pickles that recorded them): the file and
 * function names are offsets of NUL-terminated strings in the trace's frame_text. */
typedef struct expseg_trace_frame_s {
  uint32_t filename, name;
  int32_t line;
} expseg_trace_frame_t;

typedef struct expseg_trace_s {
  char name[256];          /* file name without directory and extension, e.g. "x.dev0" */
  int device;
  expseg_trace_event_t *events;
  size_t n_events, cap_events;
  uint64_t n_ids;          /* ids are 0 .. n_ids-1 */
  uint32_t n_streams;
  uint64_t peak_live_requested; /* computed by the reader from the events */
  expseg_trace_baseline_t baseline;
  /* The recorded allocator's state at the start of the window (pickles; NULL otherwise):
   * its segments, and the block address of each pre-live id (ids 0 .. n_start_addr-1 are
   * the 'p' events, in address order). */
  expseg_trace_segment_t *start_segs;
  size_t n_start_segs;
  uint64_t *start_addr;
  size_t n_start_addr;
  /* The recorded run's allocator setting in PYTORCH_CUDA_ALLOC_CONF grammar, rebuilt from
   * the snapshot's allocator_settings, or from its events (maps mean expandable segments);
   * empty when the file says nothing (memtrace, CSV, synthetic). */
  char recorded_conf[256];
  /* Where each allocation came from (pickles with frames; all NULL otherwise): the frames of
   * id i are frames[frame_start[i] .. frame_start[i + 1]), innermost first as the snapshot
   * lists them (frame_start has n_ids + 1 entries). expseg_trace_frames_of hands them out. */
  uint64_t *frame_start;
  expseg_trace_frame_t *frames;
  size_t n_frames;
  char *frame_text;
  size_t frame_text_len;
} expseg_trace_t;

typedef struct expseg_trace_set_s {
  expseg_trace_t *traces;
  size_t n;
} expseg_trace_set_t;

/* The trace library's own error reporting (bench/replay/trace_error.c): what the last failed call
 * of this library on this thread said (readers, writers, synth, cost files). The library's
 * expseg_last_error() is the allocator's, untouched by these calls. */
const char *expseg_trace_last_error(void);

/* Reads any supported file, chosen by content (pickle: first byte 0x80; memtrace: first
 * line "# memtrace v1"; RMM CSV: header "Thread,Time,Action,Pointer,Size,Stream").
 * Errors are EXPSEG_ERR_INVALID_ARGUMENT with a message naming the file, the line or byte
 * offset, and the reason; nothing is leaked. */
expseg_status expseg_trace_read_file(const char *path, expseg_trace_set_t *out);
/* The same from memory (name is used in messages and as the trace name). */
expseg_status expseg_trace_read_memtrace(const char *name, const char *buf, size_t len,
                                         expseg_trace_set_t *out);
expseg_status expseg_trace_read_rmm_csv(const char *name, const char *buf, size_t len,
                                        expseg_trace_set_t *out);
expseg_status expseg_trace_read_pickle(const char *name, const unsigned char *buf, size_t len,
                                       expseg_trace_set_t *out);
/* Writes a trace as memtrace v1 (to compare with the reference files). */
expseg_status expseg_trace_write_memtrace(const expseg_trace_t *t, const char *path);
void expseg_trace_set_free(expseg_trace_set_t *s);

/* Synthetic workloads (bench/replay/synth.c), seeded and deterministic:
 * "train" (transformer steps, sequence length changing per step), "infer" (KV cache grown
 * and released per request), "streams8" (8 streams exchanging buffers with record_stream,
 * emitted as 'r' then 'f'), "generate" (a torch.cat K/V cache grown a token a step after
 * large weights). scale 1.0 = the default size (peak around 2 GiB; generate's 14 GiB). */
expseg_status expseg_trace_synth(const char *workload, uint64_t seed, double scale,
                                 expseg_trace_t *out);
void expseg_trace_free(expseg_trace_t *t);
/* The innermost (at most max) frames of allocation id, outermost first, as
 * expseg_history_push_frames takes them (the strings live as long as the trace); 0 when the
 * trace has none for it. */
size_t expseg_trace_frames_of(const expseg_trace_t *t, uint64_t id, expseg_frame *out,
                              size_t max);

#ifdef __cplusplus
}
#endif
#endif
