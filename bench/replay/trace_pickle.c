/* SPDX-License-Identifier: Apache-2.0 */
/* trace_pickle.c: device histories out of a PyTorch memory snapshot pickle.
 *
 * The snapshot holds the end state (`segments` with their blocks) and, per device, the
 * recorded events (`device_traces`). Recording usually starts mid-run, so the live set at
 * the start is rebuilt by walking the history backwards from the end state: blocks that are
 * active at the end are live, an `alloc` removes its address, a `free_completed` adds it
 * back. The start set becomes 'p' events in address order, then every event is converted
 * in order: alloc -> 'a', free_requested -> 'r' unless the next event completes it,
 * free_completed -> 'f', segment_alloc/free/map/unmap -> M/X/m/u, oom -> O; snapshot,
 * annotate and user_defined are skipped. The recorded allocator's reserved bytes come from
 * the segments' total size at the end, walked backwards through the segment events to the
 * start and then forwards for the peak. This reproduces ../shared/traces/memtrace exactly;
 * the rules are in docs/formats.md.
 *
 * Cost: linear in the input, whatever the memo shares. The segments are validated and
 * sorted by device once (each device then walks only its own), dict lookups are O(1)
 * (pickle.c), and a list that would be walked twice in the same role is refused: a
 * non-empty history shared by two devices, a non-empty block list shared by two segments,
 * two segments at one address. A shared event or block dict costs O(1) per reference. */
#include "trace_internal.h"


#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ex_s {
  const char *name;
  const _expseg_pickle_t *pk;
  int device;
  char where[96];      /* "segments[3].blocks[2]" etc. */
  char why[320];
} ex_t;

static expseg_status failv(ex_t *x, uint32_t at, const char *fmt, ...) EXPSEG_PRINTF(3, 4);
static expseg_status failv(ex_t *x, uint32_t at, const char *fmt, ...) {
  char why[240];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: byte %" PRIu32 ": %s%s%s", x->name,
                           at < x->pk->n ? x->pk->v[at].off : 0, x->where,
                           x->where[0] ? ": " : "", why);
}

static const _expseg_pv_t *val(const ex_t *x, uint32_t v) { return &x->pk->v[v]; }

static bool is_str(const ex_t *x, uint32_t v, const char *s) {
  const _expseg_pv_t *p = val(x, v);
  size_t n = strlen(s);
  return p->kind == EXPSEG_PV_STR && p->u.s.len == n && memcmp(p->u.s.p, s, n) == 0;
}

/* dict[key] as an integer; min_zero rejects negative values. */
static expseg_status get_int(ex_t *x, uint32_t dict, const char *key, bool min_zero,
                             int64_t *out) {
  uint32_t v = _expseg_pickle_dict_get(x->pk, dict, key);
  if (!v) return failv(x, dict, "'%s' is missing", key);
  const _expseg_pv_t *p = val(x, v);
  if (p->kind != EXPSEG_PV_INT || p->big)
    return failv(x, v, "'%s' is not a 64-bit integer", key);
  if (min_zero && p->u.iv < 0)
    return failv(x, v, "'%s' is %" PRId64 ", expected a non-negative integer", key, p->u.iv);
  *out = p->u.iv;
  return EXPSEG_OK;
}

static expseg_status get_list(ex_t *x, uint32_t dict, const char *key, uint32_t *out) {
  uint32_t v = _expseg_pickle_dict_get(x->pk, dict, key);
  if (!v) return failv(x, dict, "'%s' is missing", key);
  uint8_t k = val(x, v)->kind;
  if (k != EXPSEG_PV_LIST && k != EXPSEG_PV_TUPLE) return failv(x, v, "'%s' is not a list", key);
  *out = v;
  return EXPSEG_OK;
}

static expseg_status want_dict(ex_t *x, uint32_t v) {
  return val(x, v)->kind == EXPSEG_PV_DICT ? EXPSEG_OK
                                           : failv(x, v, "expected a dict");
}

/* The state of one device while converting. */
typedef struct dev_s {
  _expseg_map_t live_size;    /* backwards walk: address -> requested size */
  _expseg_map_t live_stream;  /* address -> stream handle */
  _expseg_map_t ids;          /* forwards: live address -> id */
  _expseg_map_t seg_size;     /* backwards: segment address -> total size */
  _expseg_map_t seg_stream;   /* segment address -> stream handle */
  _expseg_map_t seg_small;    /* segment address -> 1 small pool, 0 large */
  _expseg_map_t end_block;    /* live block address at the end -> its dict (its frames) */
  _expseg_map_t text_at;      /* string value -> offset in the trace's frame_text + 1 */
  size_t cap_start, cap_frames, cap_text; /* of the trace's frame arrays */
  bool mapped;                   /* expandable segments: is_expandable, or maps/unmaps */
  _expseg_streams_t streams;
  _expseg_trace_check_t chk;
} devst_t;

static void dev_free(devst_t *d) {
  _expseg_map_free(&d->live_size);
  _expseg_map_free(&d->live_stream);
  _expseg_map_free(&d->ids);
  _expseg_map_free(&d->seg_size);
  _expseg_map_free(&d->seg_stream);
  _expseg_map_free(&d->seg_small);
  _expseg_map_free(&d->end_block);
  _expseg_map_free(&d->text_at);
  _expseg_streams_free(&d->streams);
  _expseg_trace_check_free(&d->chk);
}

static expseg_status oom(ex_t *x) {
  return _expseg_trace_error(EXPSEG_ERR_OUT_OF_MEMORY, "%s: out of host memory", x->name);
}

/* PyTorch's small-pool segment size (kSmallBuffer): a freed segment of at most this size
 * was a small-pool one. */
#define SMALL_SEGMENT (UINT64_C(2) << 20)

/* The segments, validated and sorted by device once (segidx_of). */
typedef struct segref_s {
  int64_t dev;
  uint32_t i;
} segref_t;

static int cmp_segref(const void *a, const void *b) {
  const segref_t *x = a, *y = b;
  if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
  return x->i < y->i ? -1 : x->i > y->i;
}

static expseg_status seg_fields(ex_t *x, uint32_t seg, int64_t *dev, int64_t *addr,
                                int64_t *size, int64_t *stream, uint32_t *blocks) {
  expseg_status s;
  if ((s = want_dict(x, seg)) != EXPSEG_OK || (s = get_int(x, seg, "device", true, dev)) ||
      (s = get_int(x, seg, "address", true, addr)) ||
      (s = get_int(x, seg, "total_size", true, size)) ||
      (s = get_int(x, seg, "stream", false, stream)) ||
      (s = get_list(x, seg, "blocks", blocks)))
    return s;
  return EXPSEG_OK;
}

/* Every segment checked once; *out (freed by the caller) sorted by device. A non-empty
 * block list that two segments share is refused: a block belongs to one segment. */
static expseg_status segidx_of(ex_t *x, uint32_t segments, segref_t **out) {
  const _expseg_pv_t *sl = val(x, segments);
  _expseg_map_t seen;
  _expseg_map_init(&seen, 0);
  segref_t *r = malloc((sl->u.c.n ? sl->u.c.n : 1) * sizeof *r);
  expseg_status s = r ? EXPSEG_OK : oom(x);
  for (uint32_t i = 0; i < sl->u.c.n && s == EXPSEG_OK; i++) {
    uint32_t seg = sl->u.c.items[i], blocks = 0;
    int64_t dev = 0, addr = 0, size = 0, stream = 0;
    snprintf(x->where, sizeof x->where, "segments[%" PRIu32 "]", i);
    if ((s = seg_fields(x, seg, &dev, &addr, &size, &stream, &blocks)) != EXPSEG_OK) break;
    if (val(x, blocks)->u.c.n > 0) {
      const uint64_t *was = _expseg_map_get(&seen, blocks);
      if (was) {
        s = failv(x, blocks, "'blocks' is the same list as segments[%" PRIu64 "]'s: a block "
                  "belongs to one segment", *was);
        break;
      }
      if (!_expseg_map_put(&seen, blocks, i)) s = oom(x);
    }
    r[i].dev = dev;
    r[i].i = i;
  }
  _expseg_map_free(&seen);
  if (s != EXPSEG_OK) {
    free(r);
    return s;
  }
  x->where[0] = 0;
  qsort(r, sl->u.c.n, sizeof *r, cmp_segref);
  *out = r;
  return EXPSEG_OK;
}

/* PyTorch 2.0 wrote no requested_size: an active block's 'history' starts with its current
 * allocation ({addr, real_size, frames}, newest first). That entry when it is one (its
 * address the block's, real_size a size), else 0. */
static uint32_t newest_history(ex_t *x, uint32_t block, uint64_t addr) {
  uint32_t h = _expseg_pickle_dict_get(x->pk, block, "history"), e, a, r;
  if (!h || val(x, h)->kind != EXPSEG_PV_LIST || val(x, h)->u.c.n == 0) return 0;
  e = val(x, h)->u.c.items[0];
  if (val(x, e)->kind != EXPSEG_PV_DICT || !(r = _expseg_pickle_dict_get(x->pk, e, "real_size")))
    return 0;
  a = _expseg_pickle_dict_get(x->pk, e, "addr");
  const _expseg_pv_t *rv = val(x, r), *av = a ? val(x, a) : NULL;
  if (rv->kind != EXPSEG_PV_INT || rv->big || rv->u.iv < 0 ||
      (uint64_t)rv->u.iv > EXPSEG_TRACE_MAX_SIZE ||
      (av && (av->kind != EXPSEG_PV_INT || av->big || (uint64_t)av->u.iv != addr)))
    return 0;
  return e;
}

/* Blocks active at the end -> dev->live_*; the segments' total size -> *end_reserved.
 * Only this device's segments are walked (a range of the sorted index). */
static expseg_status end_state(ex_t *x, uint32_t segments, const segref_t *sr, devst_t *d,
                               uint64_t *end_reserved) {
  const _expseg_pv_t *sl = val(x, segments);
  uint64_t total = 0;
  size_t lo = 0, hi = sl->u.c.n;
  while (lo < hi) { /* the first of this device */
    size_t mid = lo + (hi - lo) / 2;
    if (sr[mid].dev < x->device) lo = mid + 1; else hi = mid;
  }
  for (size_t k = lo; k < sl->u.c.n && sr[k].dev == x->device; k++) {
    uint32_t i = sr[k].i;
    uint32_t seg = sl->u.c.items[i], blocks = 0;
    int64_t dev = 0, addr = 0, size = 0, stream = 0;
    expseg_status s;
    snprintf(x->where, sizeof x->where, "segments[%" PRIu32 "]", i);
    if ((s = seg_fields(x, seg, &dev, &addr, &size, &stream, &blocks)) != EXPSEG_OK) return s;
    if (_expseg_map_get(&d->seg_size, (uint64_t)addr))
      return failv(x, seg, "two segments at address 0x%" PRIx64, (uint64_t)addr);
    if ((uint64_t)size > EXPSEG_TRACE_MAX_SIZE)
      return failv(x, seg, "total_size %" PRId64 " is above the 2^50 bytes accepted", size);
    total += (uint64_t)size;
    uint32_t ex = _expseg_pickle_dict_get(x->pk, seg, "is_expandable");
    if (ex && val(x, ex)->kind == EXPSEG_PV_BOOL && val(x, ex)->u.iv) d->mapped = true;
    uint32_t ty = _expseg_pickle_dict_get(x->pk, seg, "segment_type");
    uint64_t small = ty ? is_str(x, ty, "small") : (uint64_t)size <= SMALL_SEGMENT;
    if (!_expseg_map_put(&d->seg_size, (uint64_t)addr, (uint64_t)size) ||
        !_expseg_map_put(&d->seg_stream, (uint64_t)addr, (uint64_t)stream) ||
        !_expseg_map_put(&d->seg_small, (uint64_t)addr, small))
      return oom(x);
    uint64_t off = (uint64_t)addr;
    const _expseg_pv_t *bl = val(x, blocks);
    for (uint32_t j = 0; j < bl->u.c.n; j++) {
      uint32_t b = bl->u.c.items[j], sv = 0;
      int64_t bsize = 0, req = 0, baddr = 0;
      snprintf(x->where, sizeof x->where, "segments[%" PRIu32 "].blocks[%" PRIu32 "]", i, j);
      if ((s = want_dict(x, b)) != EXPSEG_OK || (s = get_int(x, b, "size", true, &bsize)))
        return s;
      if ((uint64_t)bsize > EXPSEG_TRACE_MAX_SIZE)
        return failv(x, b, "size %" PRId64 " is above the 2^50 bytes accepted", bsize);
      if (_expseg_pickle_dict_get(x->pk, b, "address")) {
        if ((s = get_int(x, b, "address", true, &baddr)) != EXPSEG_OK) return s;
      } else {
        baddr = (int64_t)off;  /* the oldest format: implied by the running offset */
      }
      off += (uint64_t)bsize;
      if (!(sv = _expseg_pickle_dict_get(x->pk, b, "state")) || val(x, sv)->kind != EXPSEG_PV_STR)
        return failv(x, b, "'state' is missing or not a string");
      if (is_str(x, sv, "inactive")) continue;
      if (!is_str(x, sv, "active_allocated") && !is_str(x, sv, "active_pending_free") &&
          !is_str(x, sv, "active_awaiting_free")) /* the name torch's docstring gives it */
        return failv(x, sv, "unknown block state '%.*s': accepted are active_allocated, "
                     "active_pending_free (or active_awaiting_free) and inactive",
                     (int)(val(x, sv)->u.s.len < 40 ? val(x, sv)->u.s.len : 40),
                     val(x, sv)->u.s.p);
      uint32_t holder = b; /* the dict with the allocation's size and frames */
      if (_expseg_pickle_dict_get(x->pk, b, "requested_size")) {
        if ((s = get_int(x, b, "requested_size", true, &req)) != EXPSEG_OK) return s;
      } else if ((holder = newest_history(x, b, (uint64_t)baddr)) != 0) {
        req = val(x, _expseg_pickle_dict_get(x->pk, holder, "real_size"))->u.iv;
      } else {
        holder = b;
        req = bsize;
      }
      if (_expseg_map_get(&d->live_size, (uint64_t)baddr))
        return failv(x, b, "two active blocks at address 0x%" PRIx64, (uint64_t)baddr);
      if (!_expseg_map_put(&d->live_size, (uint64_t)baddr, (uint64_t)req) ||
          !_expseg_map_put(&d->live_stream, (uint64_t)baddr, (uint64_t)stream) ||
          !_expseg_map_put(&d->end_block, (uint64_t)baddr, holder))
        return oom(x);
    }
  }
  x->where[0] = 0;
  *end_reserved = total;
  return EXPSEG_OK;
}

enum { A_ALLOC, A_FREE_REQ, A_FREE_DONE, A_SEG_ALLOC, A_SEG_FREE, A_MAP, A_UNMAP, A_OOM,
       A_SKIP };

static expseg_status action_of(ex_t *x, uint32_t ev, int *out) {
  static const char *const names[] = {"alloc", "free_requested", "free_completed",
                                      "segment_alloc", "segment_free", "segment_map",
                                      "segment_unmap", "oom", "snapshot", "annotate",
                                      "user_defined", "sleep", "wake"}; /* from "snapshot"
                                      on: nothing to replay (user_defined: an annotation) */
  expseg_status s = want_dict(x, ev);
  if (s != EXPSEG_OK) return s;
  uint32_t a = _expseg_pickle_dict_get(x->pk, ev, "action");
  if (!a || val(x, a)->kind != EXPSEG_PV_STR)
    return failv(x, ev, "'action' is missing or not a string");
  for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++) {
    if (is_str(x, a, names[i])) {
      *out = i < A_SKIP ? i : A_SKIP;
      return EXPSEG_OK;
    }
  }
  const _expseg_pv_t *p = val(x, a);
  return failv(x, a, "unknown action '%.*s'", (int)(p->u.s.len < 40 ? p->u.s.len : 40), p->u.s.p);
}

typedef struct evf_s {
  int action;
  uint64_t addr, size, stream, device_free;
} evf_t;

static expseg_status fields_of(ex_t *x, uint32_t ev, evf_t *f) {
  f->addr = f->size = f->stream = f->device_free = 0; /* also for skipped actions */
  expseg_status s = action_of(x, ev, &f->action);
  if (s != EXPSEG_OK || f->action == A_SKIP) return s;
  int64_t v;
  if (f->action == A_OOM) {
    const char *k = _expseg_pickle_dict_get(x->pk, ev, "device_free") ? "device_free" : "addr";
    if ((s = get_int(x, ev, k, true, &v)) != EXPSEG_OK) return s;
    f->device_free = (uint64_t)v;
  } else {
    if ((s = get_int(x, ev, "addr", true, &v)) != EXPSEG_OK) return s;
    f->addr = (uint64_t)v;
  }
  if ((s = get_int(x, ev, "size", true, &v)) != EXPSEG_OK) return s;
  f->size = (uint64_t)v;
  if ((s = get_int(x, ev, "stream", false, &v)) != EXPSEG_OK) return s;
  f->stream = (uint64_t)v;
  return EXPSEG_OK;
}

static expseg_status emit(ex_t *x, uint32_t at, devst_t *d, expseg_trace_t *t, uint8_t kind,
                          uint64_t handle, uint64_t id, uint64_t size, uint64_t extra) {
  uint32_t stream = _expseg_streams_index(&d->streams, handle);
  if (stream == UINT32_MAX) return failv(x, at, "too many streams, or out of host memory");
  expseg_trace_event_t e = {kind, stream, id, size, extra};
  const char *why = _expseg_trace_check(&d->chk, &e, x->why, sizeof x->why);
  if (why) return failv(x, at, "%s", why);
  return _expseg_trace_push(t, kind, stream, id, size, extra);
}

/* ---- where allocations came from: their frames, carried into the trace ---- */

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t c = *cap ? *cap : 256;
  while (c < need) c *= 2;
  void *q = realloc(*p, c * elem);
  if (!q) return false;
  *p = q;
  *cap = c;
  return true;
}

/* The offset of string value v in t->frame_text (each string stored once). */
static bool frame_text(ex_t *x, devst_t *d, expseg_trace_t *t, uint32_t v, uint32_t *off) {
  const uint64_t *have = _expseg_map_get(&d->text_at, v);
  if (have) {
    *off = (uint32_t)(*have - 1);
    return true;
  }
  const _expseg_pv_t *p = val(x, v);
  size_t n = p->u.s.len;
  if (t->frame_text_len + n + 1 > UINT32_MAX ||
      !grow((void **)&t->frame_text, &d->cap_text, t->frame_text_len + n + 1, 1))
    return false;
  *off = (uint32_t)t->frame_text_len;
  memcpy(t->frame_text + t->frame_text_len, p->u.s.p, n);
  t->frame_text[t->frame_text_len + n] = '\0';
  t->frame_text_len += n + 1;
  return _expseg_map_put(&d->text_at, v, (uint64_t)*off + 1);
}

/* The frames of the allocation just given the next id, from holder's "frames" (an event or
 * a block dict; 0: none). Frames are decoration: a malformed one is left out, not refused. */
static expseg_status add_frames(ex_t *x, devst_t *d, expseg_trace_t *t, uint32_t holder) {
  size_t ids = d->chk.n_ids; /* the new id is ids - 1; frame_start gets entry ids */
  if (!grow((void **)&t->frame_start, &d->cap_start, ids + 1, sizeof *t->frame_start))
    return oom(x);
  if (ids == 1) t->frame_start[0] = 0;
  uint32_t fl = holder ? _expseg_pickle_dict_get(x->pk, holder, "frames") : 0;
  const _expseg_pv_t *l = fl ? val(x, fl) : NULL;
  for (uint32_t k = 0; l && l->kind == EXPSEG_PV_LIST && k < l->u.c.n; k++) {
    uint32_t fr = l->u.c.items[k], fn, nm, ln;
    if (val(x, fr)->kind != EXPSEG_PV_DICT || !(fn = _expseg_pickle_dict_get(x->pk, fr, "filename")) ||
        !(nm = _expseg_pickle_dict_get(x->pk, fr, "name")) ||
        !(ln = _expseg_pickle_dict_get(x->pk, fr, "line")) || val(x, fn)->kind != EXPSEG_PV_STR ||
        val(x, nm)->kind != EXPSEG_PV_STR || val(x, ln)->kind != EXPSEG_PV_INT)
      continue;
    expseg_trace_frame_t f = {0, 0, (int32_t)val(x, ln)->u.iv};
    if (!grow((void **)&t->frames, &d->cap_frames, t->n_frames + 1, sizeof *t->frames) ||
        !frame_text(x, d, t, fn, &f.filename) || !frame_text(x, d, t, nm, &f.name))
      return oom(x);
    t->frames[t->n_frames++] = f;
  }
  t->frame_start[ids] = t->n_frames;
  return EXPSEG_OK;
}

/* A trace whose allocations have no frames keeps none. */
static void drop_empty_frames(expseg_trace_t *t) {
  if (t->n_frames > 0) return;
  free(t->frame_start);
  free(t->frame_text);
  free(t->frames);
  t->frame_start = NULL;
  t->frame_text = NULL;
  t->frames = NULL;
  t->frame_text_len = 0;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The segments held at the start (classic segments only: a window with maps leaves
 * start_segs empty), in address order, with provisional stream indices. */
static expseg_status start_segments(ex_t *x, devst_t *d, expseg_trace_t *t) {
  if (d->mapped || _expseg_map_count(&d->seg_size) == 0) return EXPSEG_OK;
  size_t n = _expseg_map_count(&d->seg_size);
  uint64_t *addrs = malloc(n * sizeof *addrs);
  t->start_segs = calloc(n, sizeof *t->start_segs);
  if (!addrs || !t->start_segs) {
    free(addrs);
    return oom(x);
  }
  _expseg_map_keys(&d->seg_size, addrs);
  qsort(addrs, n, sizeof *addrs, cmp_u64);
  for (size_t i = 0; i < n; i++) {
    expseg_trace_segment_t *g = &t->start_segs[i];
    uint32_t st = _expseg_streams_index(&d->streams, *_expseg_map_get(&d->seg_stream, addrs[i]));
    if (st == UINT32_MAX) {
      free(addrs);
      return failv(x, 0, "too many streams, or out of host memory");
    }
    g->addr = addrs[i];
    g->size = *_expseg_map_get(&d->seg_size, addrs[i]);
    g->stream = st;
    g->small = (uint8_t)*_expseg_map_get(&d->seg_small, addrs[i]);
  }
  t->n_start_segs = n;
  free(addrs);
  return EXPSEG_OK;
}

static expseg_status convert(ex_t *x, uint32_t segments, const segref_t *sr, uint32_t events,
                             devst_t *d, expseg_trace_t *t) {
  const _expseg_pv_t *el = val(x, events);
  uint32_t n = el->u.c.n;
  expseg_status s;
  evf_t f;
  uint64_t end_reserved = 0;
  if ((s = end_state(x, segments, sr, d, &end_reserved)) != EXPSEG_OK) return s;

  /* backwards: the live set at the start, and the reserved bytes at the start */
  int64_t reserved = (int64_t)end_reserved;
  for (uint32_t i = n; i-- > 0;) {
    uint32_t ev = el->u.c.items[i];
    snprintf(x->where, sizeof x->where, "device_traces[%d][%" PRIu32 "]", x->device, i);
    if ((s = fields_of(x, ev, &f)) != EXPSEG_OK) return s;
    if (f.size > EXPSEG_TRACE_MAX_SIZE)
      return failv(x, ev, "size %" PRIu64 " is above the 2^50 bytes accepted", f.size);
    switch (f.action) {
    case A_ALLOC:
      if (!_expseg_map_take(&d->live_size, f.addr, NULL))
        return failv(x, ev, "alloc at 0x%" PRIx64 ", but that address is not live after it "
                     "(the history does not match the end state)", f.addr);
      _expseg_map_take(&d->live_stream, f.addr, NULL);
      _expseg_map_take(&d->end_block, f.addr, NULL); /* that block is this allocation */
      break;
    case A_FREE_DONE:
      _expseg_map_take(&d->end_block, f.addr, NULL); /* a later allocation's block */
      if (_expseg_map_get(&d->live_size, f.addr))
        return failv(x, ev, "free_completed at 0x%" PRIx64 ", but that address is live again "
                     "after it with no alloc between", f.addr);
      if (!_expseg_map_put(&d->live_size, f.addr, f.size) ||
          !_expseg_map_put(&d->live_stream, f.addr, f.stream))
        return oom(x);
      break;
    case A_SEG_ALLOC:
      _expseg_map_take(&d->seg_size, f.addr, NULL);
      reserved -= (int64_t)f.size;
      break;
    case A_SEG_FREE:
      if (!_expseg_map_put(&d->seg_size, f.addr, f.size) ||
          !_expseg_map_put(&d->seg_stream, f.addr, f.stream) ||
          !_expseg_map_put(&d->seg_small, f.addr, f.size <= SMALL_SEGMENT))
        return oom(x);
      reserved += (int64_t)f.size;
      break;
    case A_MAP: d->mapped = true; reserved -= (int64_t)f.size; break;
    case A_UNMAP: d->mapped = true; reserved += (int64_t)f.size; break;
    default: break;
    }
  }
  x->where[0] = 0;
  expseg_trace_baseline_t *b = &t->baseline;
  b->present = 1;
  b->end_reserved = end_reserved;
  b->start_reserved = reserved > 0 ? (uint64_t)reserved : 0;
  b->peak_reserved = b->start_reserved;

  /* the start set, in address order */
  size_t np = _expseg_map_count(&d->live_size);
  uint64_t *addrs = malloc((np ? np : 1) * sizeof *addrs);
  if (!addrs) return oom(x);
  _expseg_map_keys(&d->live_size, addrs);
  qsort(addrs, np, sizeof *addrs, cmp_u64);
  for (size_t i = 0; i < np && s == EXPSEG_OK; i++) {
    uint64_t id = d->chk.n_ids;
    s = emit(x, segments, d, t, 'p', *_expseg_map_get(&d->live_stream, addrs[i]), id,
             *_expseg_map_get(&d->live_size, addrs[i]), 0);
    const uint64_t *blk = _expseg_map_get(&d->end_block, addrs[i]); /* live until the end */
    if (s == EXPSEG_OK) s = add_frames(x, d, t, blk ? (uint32_t)*blk : 0);
    if (s == EXPSEG_OK && !_expseg_map_put(&d->ids, addrs[i], id)) s = oom(x);
  }
  if (s == EXPSEG_OK && np > 0 && d->chk.n_ids == np) { /* ids 0 .. np-1, address order */
    t->start_addr = addrs;
    t->n_start_addr = np;
    addrs = NULL;
  }
  free(addrs);
  if (s != EXPSEG_OK) return s;

  /* forwards */
  uint64_t res = b->start_reserved;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t ev = el->u.c.items[i];
    uint64_t *id;
    snprintf(x->where, sizeof x->where, "device_traces[%d][%" PRIu32 "]", x->device, i);
    if ((s = fields_of(x, ev, &f)) != EXPSEG_OK) return s;
    switch (f.action) {
    case A_ALLOC: {
      uint64_t nid = d->chk.n_ids;
      if (_expseg_map_get(&d->ids, f.addr))
        return failv(x, ev, "alloc at 0x%" PRIx64 ", which is already live", f.addr);
      if ((s = emit(x, ev, d, t, 'a', f.stream, nid, f.size, 0)) != EXPSEG_OK ||
          (s = add_frames(x, d, t, ev)) != EXPSEG_OK)
        return s;
      if (!_expseg_map_put(&d->ids, f.addr, nid)) return oom(x);
      break;
    }
    case A_FREE_REQ: {
      if (!(id = _expseg_map_get(&d->ids, f.addr)))
        return failv(x, ev, "free_requested at 0x%" PRIx64 ", which is not live", f.addr);
      evf_t next = {A_SKIP, 0, 0, 0, 0};
      if (i + 1 < n) {
        snprintf(x->where, sizeof x->where, "device_traces[%d][%" PRIu32 "]", x->device, i + 1);
        if ((s = fields_of(x, el->u.c.items[i + 1], &next)) != EXPSEG_OK) return s;
        snprintf(x->where, sizeof x->where, "device_traces[%d][%" PRIu32 "]", x->device, i);
      }
      if (next.action == A_FREE_DONE && next.addr == f.addr) break;  /* plain free */
      if ((s = emit(x, ev, d, t, 'r', f.stream, *id, f.size, 0)) != EXPSEG_OK) return s;
      break;
    }
    case A_FREE_DONE:
      if (!(id = _expseg_map_get(&d->ids, f.addr)))
        return failv(x, ev, "free_completed at 0x%" PRIx64 ", which is not live", f.addr);
      if ((s = emit(x, ev, d, t, 'f', f.stream, *id, f.size, 0)) != EXPSEG_OK) return s;
      _expseg_map_take(&d->ids, f.addr, NULL);
      break;
    case A_SEG_ALLOC:
    case A_MAP:
      res += f.size;
      if (res > b->peak_reserved) b->peak_reserved = res;
      if (f.action == A_SEG_ALLOC) b->segment_alloc++; else b->map++;
      if ((s = emit(x, ev, d, t, f.action == A_SEG_ALLOC ? 'M' : 'm', f.stream, f.addr, f.size,
                    0)) != EXPSEG_OK)
        return s;
      break;
    case A_SEG_FREE:
    case A_UNMAP:
      res = res > f.size ? res - f.size : 0;
      if (f.action == A_SEG_FREE) b->segment_free++; else b->unmap++;
      if ((s = emit(x, ev, d, t, f.action == A_SEG_FREE ? 'X' : 'u', f.stream, f.addr, f.size,
                    0)) != EXPSEG_OK)
        return s;
      break;
    case A_OOM:
      b->oom++;
      if ((s = emit(x, ev, d, t, 'O', f.stream, 0, f.size, f.device_free)) != EXPSEG_OK)
        return s;
      break;
    default:
      break;
    }
  }
  x->where[0] = 0;
  if ((s = start_segments(x, d, t)) != EXPSEG_OK) return s;
  _expseg_streams_finish(&d->streams, t);
  if ((s = _expseg_trace_mark_empty_cache(t)) != EXPSEG_OK) return s;
  t->n_ids = d->chk.n_ids;
  t->peak_live_requested = d->chk.peak;
  drop_empty_frames(t);
  return EXPSEG_OK;
}

/* t->recorded_conf: the recorded PYTORCH_CUDA_ALLOC_CONF when allocator_settings has it,
 * with expandable_segments made explicit (from allocator_settings, else from the events:
 * maps mean expandable segments were on). */
static void recorded_conf(ex_t *x, uint32_t root, bool mapped, expseg_trace_t *t) {
  uint32_t st = _expseg_pickle_dict_get(x->pk, root, "allocator_settings"), v;
  const char *env = "";
  int envlen = 0;
  bool expandable = mapped;
  if (st && val(x, st)->kind == EXPSEG_PV_DICT) {
    if ((v = _expseg_pickle_dict_get(x->pk, st, "PYTORCH_CUDA_ALLOC_CONF")) &&
        val(x, v)->kind == EXPSEG_PV_STR && val(x, v)->u.s.len < 200) {
      env = val(x, v)->u.s.p;
      envlen = (int)val(x, v)->u.s.len;
    }
    if ((v = _expseg_pickle_dict_get(x->pk, st, "expandable_segments")) &&
        val(x, v)->kind == EXPSEG_PV_BOOL)
      expandable = val(x, v)->u.iv != 0;
  }
  /* the recorded text first (the keys expseg reads: a newer PyTorch's would make every
   * pytorch row refuse the setting), then the setting the run had (the last key wins) */
  char text[200], known[200];
  snprintf(text, sizeof text, "%.*s", envlen, env);
  _expseg_config_known(text, known, sizeof known);
  snprintf(t->recorded_conf, sizeof t->recorded_conf, "%s%sexpandable_segments:%s", known,
           known[0] ? "," : "", expandable ? "True" : "False");
}

expseg_status expseg_trace_read_pickle(const char *name, const unsigned char *buf, size_t len,
                                       expseg_trace_set_t *out) {
  if (!out) return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "pickle read: out is NULL");
  out->traces = NULL;
  out->n = 0;
  if (!name) name = "snapshot";
  if (!buf && len)
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: buffer is NULL", name);
  _expseg_pickle_t pk;
  expseg_status s = _expseg_pickle_load(name, buf, len, &pk);
  if (s != EXPSEG_OK) return s;
  ex_t x;
  memset(&x, 0, sizeof x);
  x.name = name;
  x.pk = &pk;
  uint32_t segments = 0, traces = 0;
  if (val(&x, pk.root)->kind != EXPSEG_PV_DICT) {
    s = failv(&x, pk.root, "the snapshot is a %s, expected a dict with 'segments' and "
              "'device_traces' (a bare list of segments has no history to replay)",
              val(&x, pk.root)->kind == EXPSEG_PV_LIST ? "list" : "value of another type");
  } else if ((s = get_list(&x, pk.root, "segments", &segments)) == EXPSEG_OK) {
    s = get_list(&x, pk.root, "device_traces", &traces);
  }
  size_t n_hist = 0;
  segref_t *sr = NULL;
  if (s == EXPSEG_OK) {
    const _expseg_pv_t *tl = val(&x, traces);
    _expseg_map_t seen; /* a history is walked once: one list per device */
    _expseg_map_init(&seen, 0);
    for (uint32_t i = 0; i < tl->u.c.n && s == EXPSEG_OK; i++) {
      uint32_t hv = tl->u.c.items[i];
      const _expseg_pv_t *h = val(&x, hv);
      const uint64_t *was;
      if (h->kind != EXPSEG_PV_LIST) {
        s = failv(&x, hv, "device_traces[%" PRIu32 "] is not a list", i);
      } else if (h->u.c.n > 0 && i >= EXPSEG_PICKLE_MAX_DEVICES) {
        s = failv(&x, hv, "device index %" PRIu32 " is too large (accepted are 0 to %d)", i,
                  EXPSEG_PICKLE_MAX_DEVICES - 1);
      } else if (h->u.c.n > 0 && (was = _expseg_map_get(&seen, hv))) {
        s = failv(&x, hv, "device_traces[%" PRIu32 "] is the same list as device_traces[%" PRIu64
                  "]: each device has its own history", i, *was);
      } else if (h->u.c.n > 0) {
        n_hist++;
        if (!_expseg_map_put(&seen, hv, i)) s = oom(&x);
      }
    }
    _expseg_map_free(&seen);
    if (s == EXPSEG_OK && n_hist == 0)
      s = failv(&x, traces, "no device has recorded events (device_traces is empty): record "
                "with torch.cuda.memory._record_memory_history() before _dump_snapshot()");
  }
  if (s == EXPSEG_OK) s = segidx_of(&x, segments, &sr);
  expseg_trace_t *ts = NULL;
  if (s == EXPSEG_OK && !(ts = calloc(n_hist, sizeof *ts))) s = oom(&x);
  size_t k = 0;
  if (s == EXPSEG_OK) {
    const _expseg_pv_t *tl = val(&x, traces);
    for (uint32_t i = 0; i < tl->u.c.n && s == EXPSEG_OK; i++) {
      uint32_t h = tl->u.c.items[i];
      if (val(&x, h)->u.c.n == 0) continue;
      expseg_trace_t *t = &ts[k++];
      char suffix[32];
      snprintf(suffix, sizeof suffix, ".dev%" PRIu32, i);
      _expseg_trace_set_name(t, name, suffix);
      t->device = (int)i;
      x.device = (int)i;
      devst_t d;
      memset(&d, 0, sizeof d);
      s = convert(&x, segments, sr, h, &d, t);
      if (s == EXPSEG_OK) recorded_conf(&x, pk.root, d.mapped, t);
      dev_free(&d);
    }
  }
  if (s == EXPSEG_OK) {
    out->traces = ts;
    out->n = n_hist;
  } else if (ts) {
    for (size_t i = 0; i < k; i++) expseg_trace_free(&ts[i]);
    free(ts);
  }
  free(sr);
  _expseg_pickle_free(&pk);
  return s;
}
