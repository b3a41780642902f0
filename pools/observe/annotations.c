/* SPDX-License-Identifier: Apache-2.0 */
/* annotations.c: the external annotations of the history (PyTorch's recordAnnotation, which
 * its record_function scopes call with {"name": ..., "stage": "START"/"END"} while the
 * history is recorded), written as the snapshot's external_annotations. One log for every
 * route into PyTorch: the C++ backend and the Python route both record here.
 *
 * They live in the history (history_t), so they follow its rules without a second switch:
 * nothing is kept while it is off, the ring keeps the newest `max` (the history's bound),
 * re-enabling keeps them, EXPSEG_HISTORY_CLEAR and stopping drop them. Each entry is one
 * allocation (pointers, then the strings); time is the history's tick count, turned into
 * microseconds when read, as the events are. */
#include "error.h"
#include "history.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static void ann_drop(hist_ann_t *e) {
  free((void *)e->kv);
  e->kv = NULL;
  e->n = 0;
}

const hist_ann_t *_expseg_hist_ann_at(const history_t *h, size_t i) {
  size_t j = h->ann_head + i;
  if (j >= h->ann_cap) j -= h->ann_cap;
  return &h->ann[j];
}

/* Makes room for one more entry (dropping the oldest when max are held); the slot, or NULL
 * when out of host memory with nothing held to drop. */
static hist_ann_t *ann_slot(history_t *h) {
  if (h->ann_count == h->ann_cap && h->ann_cap < h->max) { /* grow, in order */
    size_t cap = h->ann_cap ? h->ann_cap * 2 : 16;
    if (cap > h->max) cap = h->max;
    hist_ann_t *p = malloc(cap * sizeof *p);
    if (p != NULL) {
      for (size_t i = 0; i < h->ann_count; i++) p[i] = *_expseg_hist_ann_at(h, i);
      free(h->ann);
      h->ann = p;
      h->ann_cap = cap;
      h->ann_head = 0;
    }
  }
  if (h->ann_count < h->ann_cap) {
    size_t j = h->ann_head + h->ann_count++;
    return &h->ann[j >= h->ann_cap ? j - h->ann_cap : j];
  }
  if (h->ann_cap == 0) return NULL;
  hist_ann_t *e = &h->ann[h->ann_head]; /* full: the oldest goes */
  ann_drop(e);
  h->ann_head = h->ann_head + 1 == h->ann_cap ? 0 : h->ann_head + 1;
  size_t j = h->ann_head + h->ann_count - 1;
  return &h->ann[j >= h->ann_cap ? j - h->ann_cap : j];
}

void _expseg_hist_ann_free(history_t *h) {
  if (h == NULL) return;
  for (size_t i = 0; i < h->ann_count; i++) ann_drop((hist_ann_t *)_expseg_hist_ann_at(h, i));
  free(h->ann);
  h->ann = NULL;
  h->ann_cap = h->ann_head = h->ann_count = 0;
}

void _expseg_hist_ann_move(history_t *h, history_t *old, unsigned flags) {
  if (h == NULL || old == NULL || (flags & EXPSEG_HISTORY_CLEAR) || old->ann_count == 0) return;
  size_t keep = old->ann_count < h->max ? old->ann_count : h->max;
  hist_ann_t *p = malloc(keep * sizeof *p);
  if (p == NULL) return; /* old's are freed with it */
  size_t skip = old->ann_count - keep;
  for (size_t i = 0; i < keep; i++) {
    hist_ann_t *e = (hist_ann_t *)_expseg_hist_ann_at(old, skip + i);
    p[i] = *e;
    e->kv = NULL; /* moved: old no longer owns it */
    e->n = 0;
  }
  h->ann = p;
  h->ann_cap = h->ann_count = keep;
  h->ann_head = 0;
}

expseg_status expseg_history_record_annotation(expseg_allocator *a, const char *const *keys,
                                               const char *const *values, size_t n) {
  static const char fn[] = "expseg_history_record_annotation";
  if (a == NULL) return _expseg_null_allocator(fn);
  if (n > 0 && (keys == NULL || values == NULL))
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "%s: n is %zu but %s is NULL", fn, n,
                             keys == NULL ? "keys" : "values");
  size_t bytes = 2 * n * sizeof(char *);
  for (size_t i = 0; i < n; i++) {
    if (keys[i] == NULL || values[i] == NULL)
      return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                               "%s: %s[%zu] is NULL; every key and value must be a string", fn,
                               keys[i] == NULL ? "keys" : "values", i);
    bytes += strlen(keys[i]) + strlen(values[i]) + 2;
  }
  const char **kv = malloc(bytes ? bytes : 1); /* copied before the lock */
  if (kv == NULL)
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "%s: out of host memory", fn);
  char *s = (char *)(kv + 2 * n);
  for (size_t i = 0; i < 2 * n; i++) {
    const char *src = i < n ? keys[i] : values[i - n];
    size_t len = strlen(src) + 1;
    memcpy(s, src, len);
    kv[i] = s;
    s += len;
  }
  api_lock(a);
  hist_ann_t *e = a->hist != NULL ? ann_slot(a->hist) : NULL;
  if (e != NULL) {
    /* under the lock, and never before the annotation kept before it: the time-stamp counter
     * of another CPU (a VM's vCPUs) may read a little behind this one's */
    e->ticks = _expseg_hist_ticks();
    if (a->hist->ann_count >= 2) {
      uint64_t prev = _expseg_hist_ann_at(a->hist, a->hist->ann_count - 2)->ticks;
      if (e->ticks < prev) e->ticks = prev;
    }
    e->n = n;
    e->kv = kv;
    kv = NULL;
  }
  api_unlock(a);
  free((void *)kv); /* not kept: history off (or no room at all) */
  return EXPSEG_OK;
}

expseg_status expseg_history_annotations(expseg_allocator *a,
                                         void (*fn)(void *ctx, const expseg_annotation *e),
                                         void *ctx) {
  if (a == NULL || fn == NULL)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "expseg_history_annotations: %s is NULL",
                             a == NULL ? "the allocator" : "fn");
  api_lock(a);
  const history_t *h = a->hist;
  double scale = h != NULL ? _expseg_hist_scale(h) : 0.0;
  for (size_t i = 0; h != NULL && i < h->ann_count; i++) {
    const hist_ann_t *e = _expseg_hist_ann_at(h, i);
    expseg_annotation out = {a->device, _expseg_hist_time_us(h, scale, e->ticks), e->n,
                             e->kv, e->kv + e->n};
    fn(ctx, &out);
  }
  api_unlock(a);
  return EXPSEG_OK;
}
