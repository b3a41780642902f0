/* SPDX-License-Identifier: Apache-2.0 */
/* pickle_craft.c: crafted snapshot pickles whose cost depends on how the reader treats memo
 * sharing, for the cost tests, the fuzzer's seeds and expseg-bench-pickle.
 *
 * A pickle can name a value already built (BINGET) in a few bytes, so a reader that walks
 * or scans a shared value once per reference costs time quadratic in the file. Each shape
 * aims at one such walk, n scaling the file linearly:
 *   wide    - one history of n references to one 'oom' event dict that has n more keys
 *             after the four it needs (a reader that scans dicts pays n per lookup);
 *   shared  - device_traces is one history shared n times and segments one segment shared n
 *             times (a reader that walks the end state and the history per device pays n^2;
 *             a correct one refuses the shared history);
 *   devices - up to EXPSEG_PICKLE_MAX_DEVICES devices with their own one-event history, and
 *             n references to a segment of a device with no history (a reader that walks
 *             every segment per device pays devices x n);
 *   memo    - n events, each its own dict, stored at sparse memo indices near the file's
 *             length and read back (a dense memo sized by the largest index costs four bytes
 *             per input byte, or more).
 * The writer is a small emitter of protocol 2 opcodes (memo by LONG_BINPUT/LONG_BINGET). */
#include "trace_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct wbuf_s {
  unsigned char *p;
  size_t n, cap;
  bool bad;
} wbuf_t;

static void put(wbuf_t *w, const void *b, size_t n) {
  if (w->bad) return;
  if (w->n + n > w->cap) {
    size_t cap = w->cap ? w->cap : 4096;
    while (cap < w->n + n) cap *= 2;
    unsigned char *p = realloc(w->p, cap);
    if (!p) {
      w->bad = true;
      return;
    }
    w->p = p;
    w->cap = cap;
  }
  memcpy(w->p + w->n, b, n);
  w->n += n;
}

static void op(wbuf_t *w, unsigned char c) { put(w, &c, 1); }

static void op_u32(wbuf_t *w, unsigned char c, uint32_t v) {
  unsigned char b[5] = {c, (unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                        (unsigned char)(v >> 24)};
  put(w, b, 5);
}

static void str(wbuf_t *w, const char *s) {
  size_t n = strlen(s);
  unsigned char b[2] = {0x8c, (unsigned char)n}; /* SHORT_BINUNICODE */
  put(w, b, 2);
  put(w, s, n);
}

static void i32(wbuf_t *w, int32_t v) { op_u32(w, 'J', (uint32_t)v); } /* BININT */
static void memo_put(wbuf_t *w, uint32_t i) { op_u32(w, 'r', i); }    /* LONG_BINPUT */
static void memo_get(wbuf_t *w, uint32_t i) { op_u32(w, 'j', i); }    /* LONG_BINGET */

/* {'action': 'oom', 'device_free': 0, 'size': 1, 'stream': 0, then `extra` filler keys} */
static void oom_event(wbuf_t *w, size_t extra) {
  op(w, '}');
  op(w, '(');
  str(w, "action");
  str(w, "oom");
  str(w, "device_free");
  i32(w, 0);
  str(w, "size");
  i32(w, 1);
  str(w, "stream");
  i32(w, 0);
  char k[24];
  for (size_t i = 0; i < extra; i++) {
    snprintf(k, sizeof k, "k%zu", i);
    str(w, k);
    op(w, 'N');
  }
  op(w, 'u'); /* SETITEMS */
}

static void segment(wbuf_t *w, int32_t device) {
  op(w, '}');
  op(w, '(');
  str(w, "device");
  i32(w, device);
  str(w, "address");
  i32(w, 4096);
  str(w, "total_size");
  i32(w, 2 << 20);
  str(w, "stream");
  i32(w, 0);
  str(w, "blocks");
  op(w, ']');
  op(w, 'u');
}

unsigned char *_expseg_pickle_craft(const char *shape, size_t n, size_t *len) {
  wbuf_t w = {NULL, 0, 0, false};
  const unsigned char head[] = {0x80, 2};
  put(&w, head, 2);
  op(&w, '}');
  op(&w, '(');
  str(&w, "segments");
  op(&w, ']');
  if (strcmp(shape, "wide") == 0) {
    str(&w, "device_traces");
    op(&w, ']');
    op(&w, ']');
    op(&w, '(');
    oom_event(&w, n);
    memo_put(&w, 1);
    for (size_t i = 1; i < n; i++) memo_get(&w, 1);
    op(&w, 'e');
    op(&w, 'a');
  } else if (strcmp(shape, "shared") == 0) {
    op(&w, '(');
    segment(&w, 0);
    memo_put(&w, 1);
    for (size_t i = 1; i < n; i++) memo_get(&w, 1);
    op(&w, 'e');
    str(&w, "device_traces");
    op(&w, ']');
    op(&w, '(');
    op(&w, ']');
    oom_event(&w, 0);
    op(&w, 'a');
    memo_put(&w, 2);
    for (size_t i = 1; i < n; i++) memo_get(&w, 2);
    op(&w, 'e');
  } else if (strcmp(shape, "devices") == 0) {
    op(&w, '(');
    segment(&w, EXPSEG_PICKLE_MAX_DEVICES + 1); /* a device with no history */
    memo_put(&w, 1);
    for (size_t i = 1; i < n; i++) memo_get(&w, 1);
    op(&w, 'e');
    str(&w, "device_traces");
    op(&w, ']');
    op(&w, '(');
    size_t nd = n < EXPSEG_PICKLE_MAX_DEVICES ? n : EXPSEG_PICKLE_MAX_DEVICES;
    for (size_t i = 0; i < nd; i++) {
      op(&w, ']');
      if (i == 0) {
        oom_event(&w, 0);
        memo_put(&w, 2);
      } else {
        memo_get(&w, 2);
      }
      op(&w, 'a');
    }
    op(&w, 'e');
  } else if (strcmp(shape, "memo") == 0) {
    str(&w, "device_traces");
    op(&w, ']');
    op(&w, ']');
    op(&w, '(');
    uint32_t base = (uint32_t)(n * 32); /* below the file's length, beyond a dense memo */
    for (size_t i = 0; i < n; i++) {
      oom_event(&w, 0);
      memo_put(&w, base + (uint32_t)i);
      memo_get(&w, base + (uint32_t)i); /* the list gets each event twice */
    }
    op(&w, 'e');
    op(&w, 'a');
  } else {
    free(w.p);
    return NULL;
  }
  op(&w, 'u');
  op(&w, '.');
  if (w.bad) {
    free(w.p);
    return NULL;
  }
  *len = w.n;
  return w.p;
}
