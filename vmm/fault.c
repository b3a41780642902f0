/* SPDX-License-Identifier: Apache-2.0 */
/* fault.c: a pass-through driver that fails chosen calls, for tests of every error path.
 *
 * _expseg_fault_new(inner) returns a new expseg_vmm_t whose backend forwards each call to
 * the inner driver's *backend* (inner->ops->X(inner->st, ...)), not to its wrapper, so a
 * call is checked and counted once, by the outer wrapper. A rule {call, nth, count, status}
 * fails calls nth .. nth+count-1 of that kind (1-based, counted as they reach this backend)
 * with `status` and a message, without calling the inner backend.
 *
 * Counters kept:
 *  - the outer expseg_vmm_t (the one the allocator holds) counts every call, injected
 *    failures included, as any wrapper does;
 *  - the inner expseg_vmm_t counts exactly what reached its backend (calls[], failures[])
 *    and keeps its gauges (chunks, bytes, reservations, mapped, events) for what its backend
 *    holds; so outer.calls[k] == inner.calls[k] + injected failures of kind k, and the
 *    gauges of both agree. To move inner's live_chunk_bytes on release (whose backend op has
 *    no size) this wrapper remembers each live chunk's size in a hash map (base/map.h);
 *  - _expseg_fault_seen(): calls of each kind that reached this backend.
 * Thread-safe: seen[] are atomics; rules and the size table are under a mutex. */
#include "map.h"
#include "vmm_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  expseg_vmm_t *inner;
  _Atomic uint64_t seen[EXPSEG_VMM_CALL_COUNT];
  _Atomic uint64_t injected; /* calls failed by a rule so far */
  pthread_mutex_t mu;
  expseg_fault_rule_t *rules;
  size_t nrules;
  _expseg_map_t sizes; /* live chunk handle -> its size (base/map.h) */
} fault_t;

/* ---- injection ---- */

/* Counts the call; when a rule says so, sets the message and returns its status. */
static expseg_status inject(fault_t *f, expseg_vmm_call c) {
  uint64_t n = atomic_fetch_add(&f->seen[c], 1) + 1;
  expseg_status s = EXPSEG_OK;
  pthread_mutex_lock(&f->mu);
  for (size_t i = 0; i < f->nrules; i++) {
    const expseg_fault_rule_t *r = &f->rules[i];
    uint64_t count = r->count ? r->count : 1;
    if (r->call == c && n >= r->nth && n - r->nth < count && r->status != EXPSEG_OK) {
      s = r->status;
      break;
    }
  }
  pthread_mutex_unlock(&f->mu);
  if (s != EXPSEG_OK) {
    atomic_fetch_add(&f->injected, 1);
    _expseg_error_set(s, "fault driver: injected %s on %s call #%llu (inner driver: %s)",
                      _expseg_status_name(s), _expseg_vmm_call_name(c), (unsigned long long)n,
                      f->inner->ops->name);
  }
  return s;
}

#define INNER(f) ((f)->inner->ops)
#define IST(f) ((f)->inner->st)

/* A forwarder: fails the call if a rule says so (the inner backend never sees it), else
 * calls the inner backend and counts the call in the inner driver, with `bytes` for the
 * gauges (0 where the call moves none). */
#define FORWARD(call, bytes, params, args)                                                 \
  static expseg_status fault_##call params {                                              \
    fault_t *f = st;                                                                      \
    expseg_status s = inject(f, EXPSEG_VMM_CALL_##call);                                  \
    if (s) return s;                                                                      \
    s = INNER(f)->call args;                                                              \
    _expseg_vmm_account(f->inner, EXPSEG_VMM_CALL_##call, s, bytes);                      \
    return s;                                                                             \
  }

FORWARD(reserve, size, (void *st, size_t size, size_t align, uintptr_t *addr),
        (IST(f), size, align, addr))

FORWARD(unreserve, size, (void *st, uintptr_t addr, size_t size), (IST(f), addr, size))

static expseg_status remember(fault_t *f, expseg_vmm_call c, expseg_vmm_handle h, size_t size) {
  pthread_mutex_lock(&f->mu);
  bool ok = _expseg_map_put(&f->sizes, h, size);
  pthread_mutex_unlock(&f->mu);
  if (ok) return EXPSEG_OK;
  INNER(f)->release(IST(f), h);
  _expseg_vmm_account(f->inner, c, EXPSEG_ERR_HOST_OUT_OF_MEMORY, 0);
  return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "fault driver: %s: out of host memory",
                           _expseg_vmm_call_name(c));
}

static expseg_status fault_create(void *st, size_t size, expseg_vmm_handle *h) {
  fault_t *f = st;
  expseg_status s = inject(f, EXPSEG_VMM_CALL_create);
  if (s) return s;
  s = INNER(f)->create(IST(f), size, h);
  if (s == EXPSEG_OK && (s = remember(f, EXPSEG_VMM_CALL_create, *h, size))) return s;
  _expseg_vmm_account(f->inner, EXPSEG_VMM_CALL_create, s, size);
  return s;
}

static expseg_status fault_import_fd(void *st, int fd, size_t offset, size_t size,
                                     expseg_vmm_handle *h) {
  fault_t *f = st;
  expseg_status s = inject(f, EXPSEG_VMM_CALL_import_fd);
  if (s) return s;
  s = INNER(f)->import_fd(IST(f), fd, offset, size, h);
  if (s == EXPSEG_OK && (s = remember(f, EXPSEG_VMM_CALL_import_fd, *h, size))) return s;
  _expseg_vmm_account(f->inner, EXPSEG_VMM_CALL_import_fd, s, size);
  return s;
}

static expseg_status fault_release(void *st, expseg_vmm_handle h) {
  fault_t *f = st;
  expseg_status s = inject(f, EXPSEG_VMM_CALL_release);
  if (s) return s;
  s = INNER(f)->release(IST(f), h);
  uint64_t size = 0; /* 0 when unknown */
  if (s == EXPSEG_OK) {
    pthread_mutex_lock(&f->mu);
    (void)_expseg_map_take(&f->sizes, h, &size);
    pthread_mutex_unlock(&f->mu);
  }
  _expseg_vmm_account(f->inner, EXPSEG_VMM_CALL_release, s, size);
  return s;
}

FORWARD(map, size, (void *st, uintptr_t addr, size_t size, expseg_vmm_handle h, size_t offset),
        (IST(f), addr, size, h, offset))

FORWARD(unmap, size, (void *st, uintptr_t addr, size_t size), (IST(f), addr, size))

FORWARD(set_access, 0, (void *st, uintptr_t addr, size_t size, int device),
        (IST(f), addr, size, device))

FORWARD(event_create, 0, (void *st, expseg_vmm_event *ev), (IST(f), ev))

FORWARD(event_destroy, 0, (void *st, expseg_vmm_event ev), (IST(f), ev))

FORWARD(event_record, 0, (void *st, expseg_vmm_event ev, expseg_stream strm),
        (IST(f), ev, strm))

FORWARD(event_query, 0, (void *st, expseg_vmm_event ev, bool *done), (IST(f), ev, done))

FORWARD(event_synchronize, 0, (void *st, expseg_vmm_event ev), (IST(f), ev))

FORWARD(stream_synchronize, 0, (void *st, expseg_stream strm), (IST(f), strm))

static expseg_status fault_device_synchronize(void *st) {
  fault_t *f = st;
  expseg_status s = inject(f, EXPSEG_VMM_CALL_device_synchronize);
  if (s) return s;
  return _expseg_vmm_device_synchronize(f->inner); /* counted there; NULL op: unsupported */
}

FORWARD(export_fd, 0, (void *st, expseg_vmm_handle h, int *fd, size_t *offset),
        (IST(f), h, fd, offset))

FORWARD(host_alloc, c->size, (void *st, expseg_host_chunk_t *c), (IST(f), c))

FORWARD(host_free, c->size, (void *st, const expseg_host_chunk_t *c), (IST(f), c))

/* A copy the inner driver has no bytes for (sim) is its UNSUPPORTED, as without the wrapper. */
static expseg_status fault_copy(void *st, uintptr_t dev, void *host, size_t size,
                                bool to_device) {
  fault_t *f = st;
  expseg_status s = inject(f, EXPSEG_VMM_CALL_copy);
  if (s) return s;
  if (!INNER(f)->copy)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                             "%s driver: %s: the driver has no bytes to copy (host and cuda do)",
                             INNER(f)->name, to_device ? "copy_in" : "copy_out");
  s = INNER(f)->copy(IST(f), dev, host, size, to_device);
  _expseg_vmm_account(f->inner, EXPSEG_VMM_CALL_copy, s, 0);
  return s;
}

static expseg_status fault_copy_async(void *st, uintptr_t dev, void *host, size_t size,
                                      bool to_device, expseg_stream strm) {
  fault_t *f = st;
  if (!INNER(f)->copy_async) return fault_copy(st, dev, host, size, to_device);
  expseg_status s = inject(f, EXPSEG_VMM_CALL_copy);
  if (s) return s;
  s = INNER(f)->copy_async(IST(f), dev, host, size, to_device, strm);
  _expseg_vmm_account(f->inner, EXPSEG_VMM_CALL_copy, s, 0);
  return s;
}

static int fault_host_numa(void *st) {
  fault_t *f = st;
  return _expseg_vmm_host_numa(f->inner); /* the inner spec's numa=N counts */
}

static size_t fault_granularity(void *st) { return ((fault_t *)st)->inner->granularity; }

static void fault_mem_info(void *st, size_t *free_bytes, size_t *total_bytes) {
  fault_t *f = st;
  INNER(f)->mem_info(IST(f), free_bytes, total_bytes);
}

static uint64_t fault_now_ns(void *st) {
  fault_t *f = st;
  return INNER(f)->now_ns(IST(f));
}

static void fault_hold_stream(void *st, expseg_stream strm, bool hold) {
  fault_t *f = st;
  INNER(f)->hold_stream(IST(f), strm, hold);
}

/* Streams the inner driver creates (cuda); never failed by rules (not a call kind). */
static expseg_status fault_stream_create(void *st, expseg_stream *strm) {
  return _expseg_vmm_stream_create(((fault_t *)st)->inner, strm);
}

static expseg_status fault_stream_destroy(void *st, expseg_stream strm) {
  return _expseg_vmm_stream_destroy(((fault_t *)st)->inner, strm);
}

/* The access record of the inner driver (a test hook; never failed by rules). */
static expseg_status fault_has_access(void *st, uintptr_t addr, size_t size, int device,
                                      int *state) {
  return _expseg_vmm_has_access(((fault_t *)st)->inner, addr, size, device, state);
}

static expseg_status fault_check_peer(void *st, int peer) {
  return _expseg_vmm_check_peer(((fault_t *)st)->inner, peer);
}

static void fault_destroy(void *st) {
  fault_t *f = st;
  if (!f) return;
  _expseg_vmm_close(f->inner);
  pthread_mutex_destroy(&f->mu);
  free(f->rules);
  _expseg_map_free(&f->sizes);
  free(f);
}

#define FAULT_OPS(hold)                                                                    \
  {                                                                                        \
    .name = "fault", .reserve = fault_reserve, .unreserve = fault_unreserve,               \
    .create = fault_create, .release = fault_release, .map = fault_map,                    \
    .unmap = fault_unmap, .set_access = fault_set_access,                                  \
    .event_create = fault_event_create, .event_destroy = fault_event_destroy,              \
    .event_record = fault_event_record, .event_query = fault_event_query,                  \
    .event_synchronize = fault_event_synchronize,                                          \
    .stream_synchronize = fault_stream_synchronize, .export_fd = fault_export_fd,          \
    .import_fd = fault_import_fd, .granularity = fault_granularity,                        \
    .mem_info = fault_mem_info, .now_ns = fault_now_ns, .hold_stream = hold,               \
    .host_alloc = fault_host_alloc, .host_free = fault_host_free,                          \
    .host_numa = fault_host_numa, .device_synchronize = fault_device_synchronize,          \
    .copy = fault_copy, .copy_async = fault_copy_async,                                    \
    .stream_create = fault_stream_create,                                                  \
    .stream_destroy = fault_stream_destroy, .has_access = fault_has_access,                \
    .check_peer = fault_check_peer,                                                        \
    .destroy = fault_destroy,                                                              \
  }

/* Two tables: hold_stream stays NULL when the inner driver has none (cuda). */
static const expseg_vmm_ops_t fault_ops_hold = FAULT_OPS(fault_hold_stream);
static const expseg_vmm_ops_t fault_ops_nohold = FAULT_OPS(NULL);

static fault_t *fault_of(expseg_vmm_t *v) {
  return (v && (v->ops == &fault_ops_hold || v->ops == &fault_ops_nohold)) ? v->st : NULL;
}

expseg_status _expseg_fault_new(expseg_vmm_t *inner, expseg_vmm_t **out) {
  if (!inner || !out) {
    _expseg_vmm_close(inner);
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "fault driver: NULL inner or out");
  }
  *out = NULL;
  fault_t *f = calloc(1, sizeof *f);
  if (!f) {
    _expseg_vmm_close(inner);
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "fault driver: out of host memory");
  }
  pthread_mutex_init(&f->mu, NULL);
  f->inner = inner;
  return _expseg_vmm_wrap(inner->ops->hold_stream ? &fault_ops_hold : &fault_ops_nohold, f,
                          inner->device, out);
}

void _expseg_fault_set_rules(expseg_vmm_t *fault, const expseg_fault_rule_t *rules, size_t n) {
  fault_t *f = fault_of(fault);
  if (!f) return;
  expseg_fault_rule_t *copy = n ? malloc(n * sizeof *copy) : NULL;
  if (n && !copy) {
    _expseg_warn("fault driver: set_rules: out of host memory; rules unchanged");
    return;
  }
  if (n) memcpy(copy, rules, n * sizeof *copy);
  pthread_mutex_lock(&f->mu);
  free(f->rules);
  f->rules = copy;
  f->nrules = n;
  pthread_mutex_unlock(&f->mu);
}

uint64_t _expseg_fault_seen(expseg_vmm_t *fault, expseg_vmm_call call) {
  fault_t *f = fault_of(fault);
  if (!f || (unsigned)call >= EXPSEG_VMM_CALL_COUNT) return 0;
  return atomic_load(&f->seen[call]);
}

expseg_vmm_t *_expseg_fault_inner(expseg_vmm_t *fault) {
  fault_t *f = fault_of(fault);
  return f ? f->inner : NULL;
}

uint64_t _expseg_fault_injected(expseg_vmm_t *fault) {
  fault_t *f = fault_of(fault);
  return f ? atomic_load(&f->injected) : 0;
}

/* ---- rules as text: KIND@N[..[M]][:oom|:driver], comma-separated ---- */

static expseg_status rule_error(const char *text, size_t len, const char *at, const char *why) {
  char kinds[400];
  size_t n = 0;
  kinds[0] = '\0';
  for (int c = 0; c < EXPSEG_VMM_CALL_COUNT && n < sizeof kinds; c++) {
    int w = snprintf(kinds + n, sizeof kinds - n, "%s%s", c ? ", " : "",
                     _expseg_vmm_call_name((expseg_vmm_call)c));
    if (w > 0) n += (size_t)w;
  }
  const char *end = memchr(at, ',', (size_t)(text + len - at));
  size_t wlen = end ? (size_t)(end - at) : (size_t)(text + len - at);
  return _expseg_error_set(EXPSEG_ERR_CONFIG,
                           "fault rules '%.*s': %s at position %zu ('%.*s'); expected KIND@N, "
                           "KIND@N..M or KIND@N.. (every call from N on), optionally :oom or "
                           ":driver (the status; default driver), comma-separated; KIND is one "
                           "of %s",
                           (int)(len > 200 ? 200 : len), text, why, (size_t)(at - text) + 1,
                           (int)(wlen > 60 ? 60 : wlen), at, kinds);
}

static expseg_status parse_rule(const char *text, size_t len, const char *p, const char *end,
                                expseg_fault_rule_t *r) {
  const char *at = memchr(p, '@', (size_t)(end - p));
  if (!at) return rule_error(text, len, p, "no '@'");
  int kind = -1;
  for (int c = 0; c < EXPSEG_VMM_CALL_COUNT; c++) {
    const char *name = _expseg_vmm_call_name((expseg_vmm_call)c);
    if (strlen(name) == (size_t)(at - p) && memcmp(name, p, (size_t)(at - p)) == 0) kind = c;
  }
  if (kind < 0) return rule_error(text, len, p, "unknown call kind");
  const char *q = at + 1;
  uint64_t nth, last;
  if (!_expseg_dec_u64(&q, end, &nth) || nth == 0) return rule_error(text, len, at + 1, "N must be >= 1");
  uint64_t count = 1;
  if (end - q >= 2 && q[0] == '.' && q[1] == '.') {
    q += 2;
    if (q == end || *q == ':') {
      count = UINT64_MAX - nth + 1;
    } else {
      const char *m = q;
      if (!_expseg_dec_u64(&q, end, &last) || last < nth)
        return rule_error(text, len, m, "M must be a number >= N");
      count = last - nth + 1;
    }
  }
  expseg_status status = EXPSEG_ERR_DRIVER;
  if (q < end && *q == ':') {
    q++;
    if ((size_t)(end - q) == 3 && memcmp(q, "oom", 3) == 0) status = EXPSEG_ERR_OUT_OF_MEMORY;
    else if ((size_t)(end - q) == 6 && memcmp(q, "driver", 6) == 0) status = EXPSEG_ERR_DRIVER;
    else return rule_error(text, len, q, "the status must be oom or driver");
    q = end;
  }
  if (q != end) return rule_error(text, len, q, "unexpected text");
  *r = (expseg_fault_rule_t){(expseg_vmm_call)kind, nth, count, status};
  return EXPSEG_OK;
}

expseg_status _expseg_fault_set_rules_text(expseg_vmm_t *fault, const char *text, size_t len,
                                           bool relative) {
  fault_t *f = fault_of(fault);
  if (!f)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "fault rules: the driver is not a fault driver (create the "
                             "allocator on a spec such as \"fault:fail=map@3;host\")");
  size_t n = 0;
  for (size_t i = 0; i < len; i++) n += text[i] == ',';
  n += len > 0;
  expseg_fault_rule_t *rules = n ? calloc(n, sizeof *rules) : NULL;
  if (n && !rules) return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "fault rules: out of host memory");
  const char *p = text, *end = text + len;
  for (size_t i = 0; i < n; i++) {
    const char *comma = memchr(p, ',', (size_t)(end - p));
    const char *e = comma ? comma : end;
    expseg_status st = parse_rule(text, len, p, e, &rules[i]);
    if (st != EXPSEG_OK) {
      free(rules);
      return st;
    }
    if (relative) { /* N counts from the calls seen so far */
      uint64_t seen = atomic_load(&f->seen[rules[i].call]);
      rules[i].nth = rules[i].nth > UINT64_MAX - seen ? UINT64_MAX : rules[i].nth + seen;
    }
    p = e + 1;
  }
  pthread_mutex_lock(&f->mu);
  free(f->rules);
  f->rules = rules;
  f->nrules = n;
  pthread_mutex_unlock(&f->mu);
  return EXPSEG_OK;
}
