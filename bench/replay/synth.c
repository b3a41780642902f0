/* SPDX-License-Identifier: Apache-2.0 */
/* synth.c: seeded synthetic allocation histories with realistic shapes, for replaying
 * with no input file.
 *
 * Each workload is a small model of a program's allocation pattern, emitted as a trace
 * (trace.h) exactly as a recorded one would be: pre-live allocations first ('p'), then
 * 'a'/'f' events with dense ids, 'r' then 'f' for buffers another stream still uses.
 *   train    transformer training: weights and AdamW states pre-live; each step draws a
 *            sequence length, the forward pass keeps per-layer activations (sized by it)
 *            and frees temporaries, the backward pass frees activations layer by layer
 *            while gradients appear, the optimizer step uses temporaries, gradients are
 *            dropped (zero_grad(set_to_none=True)).
 *   infer    continuous-batching inference: weights pre-live; each request prefills, then
 *            its per-layer K/V buffers grow by reallocation in chunks of tokens as it
 *            decodes, and are released when it finishes; small per-step temporaries.
 *   streams8 an 8-stage pipeline, one stream per stage: activations cross from stage i to
 *            i+1 (forward) and gradients back (backward); a buffer consumed by another
 *            stream is freed with 'r' and becomes reusable ('f') a little later.
 *   generate text generation with a torch.cat K/V cache (a DynamicCache): weights
 *            pre-live; requests one after another, each of a random batch, prompt and
 *            length; every decode step reallocates each layer's K and V one token larger
 *            (the new buffer before the old one is freed), with small temporaries.
 * Sizes are multiplied by `scale` (the event count does not depend on it). The PRNG is
 * splitmix64, seeded by the caller: the same (workload, seed, scale) gives the same trace
 * on every machine. Figures for the defaults are in docs/replay.md. */
#include "trace.h"
#include "trace_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------ */
/* PRNG and the trace being built                                                        */

typedef struct gen_s {
  expseg_trace_t *t;
  uint64_t rng;
  double scale;
  uint64_t *sizes;      /* requested size per id (for frees and the live sum) */
  uint32_t *streams;    /* allocating stream per id */
  uint64_t cap_ids;
  uint64_t live, peak;  /* live requested bytes */
  int failed;
} gen_t;

static uint64_t rnd(gen_t *g) { return _expseg_splitmix64(&g->rng); }

/* uniform in [lo, hi] */
static uint64_t rnd_range(gen_t *g, uint64_t lo, uint64_t hi) {
  return lo + rnd(g) % (hi - lo + 1);
}

static void push(gen_t *g, uint8_t kind, uint32_t stream, uint64_t id, uint64_t size) {
  expseg_trace_t *t = g->t;
  if (g->failed) return;
  if (t->n_events == t->cap_events) {
    size_t cap = t->cap_events ? t->cap_events * 2 : 4096;
    expseg_trace_event_t *e = realloc(t->events, cap * sizeof *e);
    if (!e) { g->failed = 1; return; }
    t->events = e;
    t->cap_events = cap;
  }
  expseg_trace_event_t *e = &t->events[t->n_events++];
  e->kind = kind;
  e->stream = stream;
  e->id = id;
  e->size = size;
  e->extra = 0;
  if (stream + 1 > t->n_streams) t->n_streams = stream + 1;
}

/* Bytes for a tensor of `elems` elements of `elem` bytes, multiplied by the scale
 * (at least one element). */
static uint64_t tensor(const gen_t *g, double elems, unsigned elem) {
  double b = elems * g->scale;
  uint64_t n = b < 1.0 ? 1 : (uint64_t)b;
  return n * elem;
}

static uint64_t alloc_kind(gen_t *g, uint8_t kind, uint32_t stream, uint64_t size) {
  if (g->failed) return 0;
  uint64_t id = g->t->n_ids;
  if (id == g->cap_ids) {
    uint64_t cap = g->cap_ids ? g->cap_ids * 2 : 1024;
    uint64_t *s = realloc(g->sizes, cap * sizeof *s);
    if (!s) { g->failed = 1; return 0; }
    g->sizes = s;
    uint32_t *st = realloc(g->streams, cap * sizeof *st);
    if (!st) { g->failed = 1; return 0; }
    g->streams = st;
    g->cap_ids = cap;
  }
  g->t->n_ids = id + 1;
  g->sizes[id] = size;
  g->streams[id] = stream;
  g->live += size;
  if (g->live > g->peak) g->peak = g->live;
  push(g, kind, stream, id, size);
  return id;
}

static uint64_t alloc(gen_t *g, uint32_t stream, uint64_t size) {
  return alloc_kind(g, EXPSEG_TR_ALLOC, stream, size);
}

static void release(gen_t *g, uint64_t id) {
  if (g->failed) return;
  g->live -= g->sizes[id];
  push(g, EXPSEG_TR_FREE, g->streams[id], id, g->sizes[id]);
}

/* free requested while another stream still uses the buffer; release() follows later */
static void release_req(gen_t *g, uint64_t id) {
  if (g->failed) return;
  push(g, EXPSEG_TR_FREE_REQ, g->streams[id], id, g->sizes[id]);
}

/* a short-lived temporary: allocated and freed at once */
static void temp(gen_t *g, uint32_t stream, uint64_t size) { release(g, alloc(g, stream, size)); }

/* ------------------------------------------------------------------------------------ */
/* train                                                                                 */

enum { TR_LAYERS = 12, TR_D = 512, TR_VOCAB = 32000, TR_BATCH = 5, TR_STEPS = 14,
       TR_PARAMS_PER_LAYER = 12, TR_SAVED_PER_LAYER = 10 };

static void synth_train(gen_t *g) {
  const double d = TR_D;
  /* parameter shapes (elements): embedding, per layer 12 tensors, final norm */
  double shapes[1 + TR_LAYERS * TR_PARAMS_PER_LAYER + 2];
  size_t np = 0;
  shapes[np++] = (double)TR_VOCAB * d;
  for (int l = 0; l < TR_LAYERS; l++) {
    const double per[TR_PARAMS_PER_LAYER] = {d, d, 3 * d * d, 3 * d, d * d, d,
                                             d, d, 4 * d * d, 4 * d, 4 * d * d, d};
    for (int k = 0; k < TR_PARAMS_PER_LAYER; k++) shapes[np++] = per[k];
  }
  shapes[np++] = d;
  shapes[np++] = d;
  /* weights, then AdamW exp_avg and exp_avg_sq, all live before recording (fp32) */
  for (int copy = 0; copy < 3; copy++)
    for (size_t i = 0; i < np; i++) alloc_kind(g, EXPSEG_TR_PRELIVE, 0, tensor(g, shapes[i], 4));

  uint64_t saved[TR_LAYERS][TR_SAVED_PER_LAYER];
  uint64_t grads[sizeof shapes / sizeof shapes[0]];
  for (int step = 0; step < TR_STEPS && !g->failed; step++) {
    /* sequence length: 64 .. 512 in steps of 8, different every step */
    const double s = (double)(8 * rnd_range(g, 8, 64));
    const double bs = TR_BATCH * s, bsd = bs * d;
    uint64_t ids = alloc(g, 0, tensor(g, bs, 8));    /* token ids (int64) */
    uint64_t labels = alloc(g, 0, tensor(g, bs, 8));
    uint64_t x = alloc(g, 0, tensor(g, bsd, 4));     /* embedding output */
    /* forward: per layer, keep what backward needs, free temporaries */
    for (int l = 0; l < TR_LAYERS; l++) {
      const double keep[TR_SAVED_PER_LAYER] = {bsd, bs, 3 * bsd, bsd, bs * 8,
                                               bsd, bsd, bs, 4 * bsd, 4 * bsd};
      for (int k = 0; k < TR_SAVED_PER_LAYER; k++) {
        saved[l][k] = alloc(g, 0, tensor(g, keep[k], 4));
        if (k == 3) { /* attention: scores and softmax per head, one head at a time */
          for (int h = 0; h < 8; h++) {
            uint64_t sc = alloc(g, 0, tensor(g, TR_BATCH * s * s, 4));
            temp(g, 0, tensor(g, TR_BATCH * s, 4));
            release(g, sc);
          }
        }
        if (k % 3 == 2) temp(g, 0, tensor(g, bsd, 4)); /* elementwise temporaries */
      }
      uint64_t nx = alloc(g, 0, tensor(g, bsd, 4)); /* residual output */
      release(g, x);
      x = nx;
    }
    /* loss: logits (fp32), log-softmax, scalar loss */
    uint64_t logits = alloc(g, 0, tensor(g, bs * TR_VOCAB, 4));
    uint64_t lsm = alloc(g, 0, tensor(g, bs * TR_VOCAB, 4));
    uint64_t loss = alloc(g, 0, 4);
    release(g, logits);
    /* backward: gradient of logits, then layers in reverse */
    uint64_t glog = alloc(g, 0, tensor(g, bs * TR_VOCAB, 4));
    release(g, lsm);
    size_t gi = np;
    for (int k = 0; k < 2; k++) { /* final norm */
      gi--;
      grads[gi] = alloc(g, 0, tensor(g, shapes[gi], 4));
    }
    uint64_t gx = alloc(g, 0, tensor(g, bsd, 4));
    release(g, glog);
    release(g, x);
    for (int l = TR_LAYERS - 1; l >= 0; l--) {
      for (int k = TR_SAVED_PER_LAYER - 1; k >= 0; k--) {
        uint64_t gt = alloc(g, 0, tensor(g, (k >= 8 ? 4 : 1) * bsd, 4));
        if (k == 3)
          for (int h = 0; h < 8; h++) temp(g, 0, tensor(g, TR_BATCH * s * s, 4));
        release(g, saved[l][k]);
        release(g, gt);
      }
      for (int k = TR_PARAMS_PER_LAYER - 1; k >= 0; k--) {
        gi--;
        grads[gi] = alloc(g, 0, tensor(g, shapes[gi], 4));
        if (k % 2 == 0) temp(g, 0, tensor(g, shapes[gi], 4)); /* weight-grad GEMM output */
      }
      uint64_t ngx = alloc(g, 0, tensor(g, bsd, 4));
      release(g, gx);
      gx = ngx;
    }
    gi--;
    grads[gi] = alloc(g, 0, tensor(g, shapes[gi], 4)); /* embedding gradient */
    release(g, gx);
    release(g, ids);
    release(g, labels);
    release(g, loss);
    /* optimizer: foreach AdamW temporaries in groups of 8 tensors, then drop grads */
    for (size_t i = 0; i < np; i += 8) {
      uint64_t tmp[8];
      size_t n = np - i < 8 ? np - i : 8;
      for (size_t k = 0; k < n; k++) tmp[k] = alloc(g, 0, tensor(g, shapes[i + k], 4));
      for (size_t k = 0; k < n; k++) release(g, tmp[k]);
    }
    for (size_t i = 0; i < np; i++) release(g, grads[i]);
  }
}

/* ------------------------------------------------------------------------------------ */
/* infer                                                                                 */

enum { IN_LAYERS = 16, IN_D = 1536, IN_VOCAB = 32000, IN_REQUESTS = 28, IN_SLOTS = 8,
       IN_CHUNK = 128 };

typedef struct request_s {
  int active;
  uint64_t tokens, end, cap; /* tokens so far, tokens at completion, K/V capacity */
  uint64_t kv[IN_LAYERS][2];
} request_t;

/* fp16 K or V for `tokens` tokens of one layer */
static uint64_t kv_bytes(const gen_t *g, uint64_t tokens) {
  return tensor(g, (double)tokens * IN_D, 2);
}

static void kv_grow(gen_t *g, request_t *r, uint64_t need) {
  uint64_t cap = (need + IN_CHUNK - 1) / IN_CHUNK * IN_CHUNK;
  for (int l = 0; l < IN_LAYERS; l++)
    for (int k = 0; k < 2; k++) {
      uint64_t nb = alloc(g, 0, kv_bytes(g, cap)); /* torch.cat into a larger buffer */
      if (r->cap) release(g, r->kv[l][k]);
      r->kv[l][k] = nb;
    }
  r->cap = cap;
}

static void synth_infer(gen_t *g) {
  const double d = IN_D;
  alloc_kind(g, EXPSEG_TR_PRELIVE, 0, tensor(g, (double)IN_VOCAB * d, 2));
  for (int l = 0; l < IN_LAYERS; l++) {
    const double per[6] = {3 * d * d, d * d, 4 * d * d, 4 * d * d, 2 * d, 2 * d};
    for (int k = 0; k < 6; k++) alloc_kind(g, EXPSEG_TR_PRELIVE, 0, tensor(g, per[k], 2));
  }
  request_t slot[IN_SLOTS];
  memset(slot, 0, sizeof slot);
  int started = 0, done = 0;
  while (done < IN_REQUESTS && !g->failed) {
    /* admit new requests into free slots: prefill */
    for (int i = 0; i < IN_SLOTS; i++) {
      request_t *r = &slot[i];
      if (r->active || started == IN_REQUESTS) continue;
      started++;
      memset(r, 0, sizeof *r);
      r->active = 1;
      uint64_t prompt = rnd_range(g, 32, 1024);
      r->tokens = prompt;
      r->end = prompt + rnd_range(g, 16, 640);
      kv_grow(g, r, prompt);
      const double p = (double)prompt;
      for (int l = 0; l < IN_LAYERS; l++) {
        uint64_t h = alloc(g, 0, tensor(g, p * d, 2));
        uint64_t qkv = alloc(g, 0, tensor(g, 3 * p * d, 2));
        temp(g, 0, tensor(g, 12 * p * p, 2)); /* attention scores, 12 heads */
        temp(g, 0, tensor(g, 4 * p * d, 2)); /* MLP hidden */
        release(g, qkv);
        release(g, h);
      }
      temp(g, 0, tensor(g, IN_VOCAB, 4)); /* last-token logits */
    }
    /* one decode step for the batch of active requests */
    uint64_t b = 0;
    for (int i = 0; i < IN_SLOTS; i++) b += slot[i].active;
    uint64_t hid = alloc(g, 0, tensor(g, (double)b * d, 2));
    for (int l = 0; l < IN_LAYERS; l += 4) { /* fused kernels: a few temporaries */
      temp(g, 0, tensor(g, 3 * (double)b * d, 2));
      temp(g, 0, tensor(g, 4 * (double)b * d, 2));
    }
    uint64_t logits = alloc(g, 0, tensor(g, (double)b * IN_VOCAB, 4));
    temp(g, 0, tensor(g, (double)b * 8, 8)); /* sampled token ids */
    release(g, logits);
    release(g, hid);
    for (int i = 0; i < IN_SLOTS; i++) {
      request_t *r = &slot[i];
      if (!r->active) continue;
      r->tokens++;
      if (r->tokens > r->cap) kv_grow(g, r, r->tokens);
      if (r->tokens == r->end) { /* finished: release its cache */
        for (int l = 0; l < IN_LAYERS; l++)
          for (int k = 0; k < 2; k++) release(g, r->kv[l][k]);
        r->active = 0;
        done++;
      }
    }
  }
}

/* ------------------------------------------------------------------------------------ */
/* generate                                                                              */

enum { GE_LAYERS = 32, GE_D = 4096, GE_HEADS = 32, GE_KV_HEADS = 32, GE_HEAD_DIM = 128,
       GE_FF = 11008, GE_VOCAB = 32000, GE_REQUESTS = 5 };

static void synth_generate(gen_t *g) {
  const double d = GE_D, kv = (double)GE_KV_HEADS * GE_HEAD_DIM;
  alloc_kind(g, EXPSEG_TR_PRELIVE, 0, tensor(g, (double)GE_VOCAB * d, 2));
  for (int l = 0; l < GE_LAYERS; l++) {
    const double per[9] = {d * d, d * kv, d * kv, d * d, d * GE_FF, d * GE_FF, d * GE_FF, d, d};
    for (int k = 0; k < 9; k++) alloc_kind(g, EXPSEG_TR_PRELIVE, 0, tensor(g, per[k], 2));
  }
  uint64_t cache[GE_LAYERS][2];
  for (int req = 0; req < GE_REQUESTS && !g->failed; req++) {
    const double b = (double)(1u << rnd_range(g, 0, 3));
    const uint64_t prompt = rnd_range(g, 128, 1024), steps = rnd_range(g, 64, 384);
    const double p = (double)prompt;
    /* prefill: the prompt's K and V per layer are kept, the rest are temporaries */
    uint64_t x = alloc(g, 0, tensor(g, b * p * d, 2));
    for (int l = 0; l < GE_LAYERS; l++) {
      uint64_t q = alloc(g, 0, tensor(g, b * p * d, 2));
      cache[l][0] = alloc(g, 0, tensor(g, b * p * kv, 2));
      cache[l][1] = alloc(g, 0, tensor(g, b * p * kv, 2));
      temp(g, 0, tensor(g, b * GE_HEADS * p * p, 2)); /* attention scores */
      uint64_t o = alloc(g, 0, tensor(g, b * p * d, 2));
      release(g, q);
      temp(g, 0, tensor(g, 2 * b * p * GE_FF, 2)); /* MLP gate and up */
      release(g, o);
    }
    release(g, x);
    temp(g, 0, tensor(g, b * GE_VOCAB, 4)); /* last-token logits */
    /* decode: each layer's K and V grow by the step's token (torch.cat into a new buffer) */
    for (uint64_t s = 1; s <= steps && !g->failed; s++) {
      const double t = p + (double)s;
      uint64_t h = alloc(g, 0, tensor(g, b * d, 2));
      for (int l = 0; l < GE_LAYERS; l++) {
        for (int k = 0; k < 2; k++) {
          uint64_t tok = alloc(g, 0, tensor(g, b * kv, 2));
          uint64_t grown = alloc(g, 0, tensor(g, b * t * kv, 2));
          release(g, cache[l][k]);
          release(g, tok);
          cache[l][k] = grown;
        }
        temp(g, 0, tensor(g, b * GE_HEADS * t, 2)); /* attention scores */
        temp(g, 0, tensor(g, 2 * b * GE_FF, 2));    /* MLP gate and up */
      }
      temp(g, 0, tensor(g, b * GE_VOCAB, 4));
      release(g, h);
    }
    for (int l = 0; l < GE_LAYERS; l++)
      for (int k = 0; k < 2; k++) release(g, cache[l][k]);
  }
}

/* ------------------------------------------------------------------------------------ */
/* streams8                                                                              */

enum { ST_STAGES = 8, ST_MICRO = 8, ST_ITERS = 20, ST_D = 1024, ST_BATCH = 2,
       ST_PARAM_TENSORS = 8, ST_SAVED = 4 };

typedef struct pending_s {
  uint64_t id;
  int due; /* tick at which the consumer's work is done */
} pending_t;

static void flush_pending(gen_t *g, pending_t *p, size_t *n, int now) {
  size_t w = 0;
  for (size_t i = 0; i < *n; i++) {
    if (p[i].due <= now) release(g, p[i].id);
    else p[w++] = p[i];
  }
  *n = w;
}

static void synth_streams8(gen_t *g) {
  const double d = ST_D;
  /* each stage's weights (bf16), on the stage's stream */
  for (uint32_t s = 0; s < ST_STAGES; s++)
    for (int k = 0; k < ST_PARAM_TENSORS; k++)
      alloc_kind(g, EXPSEG_TR_PRELIVE, s, tensor(g, (k % 2 ? 4 : 1) * d * d, 2));
  pending_t pend[ST_STAGES * ST_MICRO * 4];
  size_t npend = 0;
  int tick = 0;
  uint64_t saved[ST_STAGES][ST_MICRO][ST_SAVED];
  uint64_t link[ST_STAGES + 1][ST_MICRO]; /* buffer handed from stage i-1 to i */
  for (int it = 0; it < ST_ITERS && !g->failed; it++) {
    double seq[ST_MICRO];
    for (int m = 0; m < ST_MICRO; m++) seq[m] = (double)(64 * rnd_range(g, 2, 16));
    /* forward, GPipe order: at tick t stage s runs micro-batch t - s */
    for (int t = 0; t < ST_MICRO + ST_STAGES - 1; t++, tick++) {
      for (uint32_t s = 0; s < ST_STAGES; s++) {
        int m = t - (int)s;
        if (m < 0 || m >= ST_MICRO) continue;
        const double bsd = ST_BATCH * seq[m] * d;
        if (s == 0) link[0][m] = alloc(g, 0, tensor(g, bsd, 2)); /* embedded input */
        for (int k = 0; k < ST_SAVED; k++)
          saved[s][m][k] = alloc(g, s, tensor(g, (k == 2 ? 4 : 1) * bsd, 2));
        temp(g, s, tensor(g, 4 * bsd, 2));
        temp(g, s, tensor(g, ST_BATCH * seq[m] * 16, 4));
        link[s + 1][m] = alloc(g, s, tensor(g, bsd, 2));
        /* the input came from stream s-1 (or 0): free requested now, reusable when this
         * stage's work on it completes */
        release_req(g, link[s][m]);
        if (npend < sizeof pend / sizeof pend[0])
          pend[npend++] = (pending_t){link[s][m], tick + 1 + (int)(rnd(g) % 3)};
        else
          release(g, link[s][m]);
      }
      flush_pending(g, pend, &npend, tick);
    }
    /* loss on the last stage */
    for (int m = 0; m < ST_MICRO; m++) {
      temp(g, ST_STAGES - 1, tensor(g, ST_BATCH * seq[m] * 8000, 4));
      release(g, link[ST_STAGES][m]);
    }
    /* backward, reverse order: gradients travel from stage s to s-1 */
    uint64_t gin[ST_MICRO];
    for (int t = 0; t < ST_MICRO + ST_STAGES - 1; t++, tick++) {
      for (int s = ST_STAGES - 1; s >= 0; s--) {
        int m = t - (ST_STAGES - 1 - s);
        if (m < 0 || m >= ST_MICRO) continue;
        const double bsd = ST_BATCH * seq[m] * d;
        if (s == ST_STAGES - 1) gin[m] = alloc(g, (uint32_t)s, tensor(g, bsd, 2));
        uint64_t gt = alloc(g, (uint32_t)s, tensor(g, 4 * bsd, 2));
        for (int k = ST_SAVED - 1; k >= 0; k--) release(g, saved[s][m][k]);
        release(g, gt);
        uint64_t gout = alloc(g, (uint32_t)s, tensor(g, bsd, 2));
        /* gin[m] was produced on stream s+1 (or s at the last stage) */
        release_req(g, gin[m]);
        if (npend < sizeof pend / sizeof pend[0])
          pend[npend++] = (pending_t){gin[m], tick + 1 + (int)(rnd(g) % 3)};
        else
          release(g, gin[m]);
        gin[m] = gout;
      }
      flush_pending(g, pend, &npend, tick);
    }
    for (int m = 0; m < ST_MICRO; m++) release(g, gin[m]);
    flush_pending(g, pend, &npend, tick + 16);
    /* weight gradients reduced and applied per stage: temporaries on each stream */
    for (uint32_t s = 0; s < ST_STAGES; s++)
      for (int k = 0; k < ST_PARAM_TENSORS; k++)
        temp(g, s, tensor(g, (k % 2 ? 4 : 1) * d * d, 2));
  }
}

/* ------------------------------------------------------------------------------------ */

typedef struct workload_s {
  const char *name;
  void (*fn)(gen_t *g);
} workload_t;

static const workload_t workloads[] = {
    {"train", synth_train},
    {"infer", synth_infer},
    {"streams8", synth_streams8},
    {"generate", synth_generate},
};

expseg_status expseg_trace_synth(const char *workload, uint64_t seed, double scale,
                                 expseg_trace_t *out) {
  if (!out)
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_trace_synth: out is NULL");
  memset(out, 0, sizeof *out);
  const workload_t *w = NULL;
  for (size_t i = 0; workload && i < sizeof workloads / sizeof workloads[0]; i++)
    if (strcmp(workload, workloads[i].name) == 0) w = &workloads[i];
  if (!w)
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_trace_synth: unknown workload '%s'; accepted: train, "
                             "infer, streams8, generate",
                             workload ? workload : "(null)");
  if (!(scale > 0.0) || !isfinite(scale) || scale > 1e6)
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT,
                             "expseg_trace_synth: scale %g for '%s' is out of range; accepted: "
                             "a number in (0, 1e6]",
                             scale, w->name);
  gen_t g;
  memset(&g, 0, sizeof g);
  g.t = out;
  g.rng = seed;
  g.scale = scale;
  out->n_streams = 1;
  w->fn(&g);
  free(g.sizes);
  free(g.streams);
  if (g.failed) {
    free(out->events);
    memset(out, 0, sizeof *out);
    return _expseg_trace_error(EXPSEG_ERR_OUT_OF_MEMORY,
                             "expseg_trace_synth: out of host memory building '%s'", w->name);
  }
  snprintf(out->name, sizeof out->name, "synth-%s", w->name);
  out->device = 0;
  out->peak_live_requested = g.peak;
  out->baseline.present = 0;
  return EXPSEG_OK;
}
