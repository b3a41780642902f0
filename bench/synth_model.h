/* synth_model.h: the replay tool's models and warm start (bench/synth_model.c). Internal
 * to the tools; not installed. */
#ifndef EXPSEG_SYNTH_MODEL_H
#define EXPSEG_SYNTH_MODEL_H

#include "trace.h"

#include <stddef.h>

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
/* Rebuilds the recorded allocator's state at the start of the window in a fresh
 * allocator a (t->start_segs; no-op without them); ptr[id] receives each pre-live block
 * placed. 0 on success, -1 with why set (the allocator then holds a partial state). */
int _expseg_model_warm_start(expseg_allocator *a, const expseg_trace_t *t, void **ptr,
                             char *why, size_t wlen);

#ifdef __cplusplus
}
#endif
#endif
