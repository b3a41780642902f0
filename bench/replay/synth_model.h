/* SPDX-License-Identifier: Apache-2.0 */
/* synth_model.h: the replay tool's models and warm start (bench/replay/synth_model.c). Internal
 * to the tools; not installed. */
#ifndef EXPSEG_SYNTH_MODEL_H
#define EXPSEG_SYNTH_MODEL_H

#include "trace.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { EXPSEG_MODEL_EXPSEG = 0, EXPSEG_MODEL_PYTORCH = 1 };

/* "expseg" / "pytorch" -> *model; -1 on anything else. */
int _expseg_model_parse(const char *s, int *model);
const char *_expseg_model_name(int model);
/* 1 / 0 when conf's last expandable_segments key says True / False, -1 when it has none. */
int _expseg_conf_expandable(const char *conf);
/* The configuration text a model replays with: expseg -> user as given (NULL = the
 * environment); pytorch -> PyTorch's defaults, then user (else the recorded run's
 * setting), written into buf. */
const char *_expseg_model_conf(int model, const char *user, const expseg_trace_t *t,
                               char *buf, size_t len);
/* Switches a fresh allocator to the model's behaviour where PyTorch differs from expseg
 * (pools/model.c: no page moves, GC skips expandable memory, oversize rules on expandable
 * blocks). */
expseg_status _expseg_model_apply(expseg_allocator *a, int model);
/* Rebuilds the recorded allocator's state at the start of the window in a fresh
 * allocator a (t->start_segs; no-op without them); streams maps trace stream indices to
 * handles (NULL: the index itself); ptr[id] receives each pre-live block placed. 0 on success, -1 with why set (the allocator then holds a partial state). */
int _expseg_model_warm_start(expseg_allocator *a, const expseg_trace_t *t,
                             const expseg_stream *streams, void **ptr, char *why, size_t wlen);

/* The recorded allocator's figures over events [0, n) of t (b->present = 0 when the
 * trace carries none): what --limit compares with. */
void _expseg_window_baseline(const expseg_trace_t *t, size_t n, expseg_trace_baseline_t *b);
/* The recorded allocator's reserved bytes after event e, given res before it: segment
 * allocations and maps add, segment frees and unmaps take away (the baseline's and
 * --report's recorded line). */
static inline uint64_t _expseg_baseline_reserved(uint64_t res, const expseg_trace_event_t *e) {
  switch (e->kind) {
  case EXPSEG_TR_SEG_ALLOC: case EXPSEG_TR_MAP: return res + e->size;
  case EXPSEG_TR_SEG_FREE: case EXPSEG_TR_UNMAP: return res > e->size ? res - e->size : 0;
  default: return res;
  }
}

/* ---- synth_cost.c: priced driver work ---- */
enum { EXPSEG_COST_RESERVE, EXPSEG_COST_CREATE, EXPSEG_COST_RELEASE, EXPSEG_COST_MAP,
       EXPSEG_COST_UNMAP, EXPSEG_COST_SET_ACCESS, EXPSEG_COST_CUDA_MALLOC,
       EXPSEG_COST_CUDA_FREE, EXPSEG_COST_N };
extern const char *const _expseg_cost_names[EXPSEG_COST_N];
typedef struct expseg_costs_s {
  double call_us[EXPSEG_COST_N]; /* per call */
  double page_us[EXPSEG_COST_N]; /* per 2 MiB the call covers */
} expseg_costs_t;
typedef struct expseg_calls_s {
  uint64_t calls[EXPSEG_COST_N];
  uint64_t pages[EXPSEG_COST_N]; /* 2 MiB units */
} expseg_calls_t;
void _expseg_costs_default(expseg_costs_t *c);
/* The defaults, then every "KIND[.page] MICROSECONDS" line of path (at most 64 KiB) or of
 * buf; errors (EXPSEG_ERR_INVALID_ARGUMENT) name the file and line. */
expseg_status _expseg_costs_read(const char *path, expseg_costs_t *c);
expseg_status _expseg_costs_parse(const char *name, const char *buf, size_t len,
                                  expseg_costs_t *c);
double _expseg_costs_ms(const expseg_costs_t *c, const expseg_calls_t *n);
/* The recorded run's driver calls over events [0, n): M/X as cudaMalloc/cudaFree, m/u as
 * PyTorch's expandable segments make them (per page create+map, one set_access; per page
 * unmap+release). */
void _expseg_recorded_calls(const expseg_trace_t *t, size_t n, expseg_calls_t *out);

#ifdef __cplusplus
}
#endif
#endif
