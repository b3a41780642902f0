/* SPDX-License-Identifier: Apache-2.0 */
/* vmm.c: construction of a driver from its spec, and the checked, counting wrappers.
 *
 * Every driver call from pools/ goes through a wrapper here. A wrapper checks what can be
 * checked cheaply (granularity alignment, non-zero sizes, NULL out-pointers, ranges inside
 * one live reservation: the wrapper keeps its own small sorted table of reservations),
 * calls the backend, then counts the call by kind (calls[] / failures[]) and moves the
 * gauges on success. Backends never count. Checks that need the mapping table (double map,
 * partial unmap, release of a mapped chunk, unreserve with mappings) are the ledger's job in
 * host and sim (ledger.c) and the driver's own in cuda.
 *
 * The reservation table lives in a private extension of expseg_vmm_t (every expseg_vmm_t is
 * allocated by _expseg_vmm_wrap), guarded by a mutex: reservations are few, lookups are a
 * binary search.
 *
 * Spec grammar (docs/driver.md): NAME [":" KEY "=" VALUE ("," KEY "=" VALUE)*]. */
#include "vmm_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  uintptr_t addr;
  size_t size;
} span_t;

typedef struct {
  expseg_vmm_t pub; /* first: an expseg_vmm_t* is a vmm_full_t* */
  pthread_mutex_t mu;
  span_t *resv; /* sorted by addr */
  size_t nresv, capresv;
} vmm_full_t;

static vmm_full_t *full(expseg_vmm_t *v) { return (vmm_full_t *)v; }

static const char *const call_names[] = {
#define EXPSEG_VMM_CALL_NAME_(n) #n,
    EXPSEG_VMM_CALLS(EXPSEG_VMM_CALL_NAME_)
#undef EXPSEG_VMM_CALL_NAME_
};

const char *_expseg_vmm_call_name(expseg_vmm_call c) {
  return (unsigned)c < EXPSEG_VMM_CALL_COUNT ? call_names[c] : "unknown";
}

/* ---- counting ---- */

#define RLX memory_order_relaxed

void _expseg_vmm_account(expseg_vmm_t *v, expseg_vmm_call c, expseg_status s, uint64_t bytes) {
  atomic_fetch_add_explicit(&v->calls[c], 1, RLX);
  if (s != EXPSEG_OK) {
    atomic_fetch_add_explicit(&v->failures[c], 1, RLX);
    return;
  }
  int64_t b = (int64_t)bytes;
  switch (c) {
  case EXPSEG_VMM_CALL_reserve:
    atomic_fetch_add_explicit(&v->live_reservations, 1, RLX);
    atomic_fetch_add_explicit(&v->reserved_va_bytes, b, RLX);
    break;
  case EXPSEG_VMM_CALL_unreserve:
    atomic_fetch_sub_explicit(&v->live_reservations, 1, RLX);
    atomic_fetch_sub_explicit(&v->reserved_va_bytes, b, RLX);
    break;
  case EXPSEG_VMM_CALL_create:
    atomic_fetch_add_explicit(&v->created_bytes, b, RLX);
    /* fall through */
  case EXPSEG_VMM_CALL_import_fd:
    atomic_fetch_add_explicit(&v->live_chunks, 1, RLX);
    atomic_fetch_add_explicit(&v->live_chunk_bytes, b, RLX);
    break;
  case EXPSEG_VMM_CALL_release:
    atomic_fetch_sub_explicit(&v->live_chunks, 1, RLX);
    atomic_fetch_sub_explicit(&v->live_chunk_bytes, b, RLX);
    break;
  case EXPSEG_VMM_CALL_map:
    atomic_fetch_add_explicit(&v->mapped_bytes, b, RLX);
    break;
  case EXPSEG_VMM_CALL_unmap:
    atomic_fetch_sub_explicit(&v->mapped_bytes, b, RLX);
    break;
  case EXPSEG_VMM_CALL_event_create:
    atomic_fetch_add_explicit(&v->live_events, 1, RLX);
    break;
  case EXPSEG_VMM_CALL_event_destroy:
    atomic_fetch_sub_explicit(&v->live_events, 1, RLX);
    break;
  default:
    break;
  }
}

/* A precondition failure: counted as a failed call, the backend is not called. */
static expseg_status refuse(expseg_vmm_t *v, expseg_vmm_call c) {
  _expseg_vmm_account(v, c, EXPSEG_ERR_INVALID_ARGUMENT, 0);
  return EXPSEG_ERR_INVALID_ARGUMENT;
}

static expseg_status bad_arg(expseg_vmm_t *v, expseg_vmm_call c, uintptr_t addr, size_t size,
                             const char *what) {
  char b[32], g[32];
  _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                    "%s driver: %s(addr=0x%llx, size=%s): %s (granularity %s)", v->ops->name,
                    call_names[c], (unsigned long long)addr, _expseg_format_size(b, size), what,
                    _expseg_format_size(g, v->granularity));
  return refuse(v, c);
}

static expseg_status null_out(expseg_vmm_t *v, expseg_vmm_call c) {
  _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "%s driver: %s: the out-pointer is NULL",
                    v->ops->name, call_names[c]);
  return refuse(v, c);
}

/* Checks addr and size against the granularity and the reservation table. */
static bool range_ok(expseg_vmm_t *v, expseg_vmm_call c, uintptr_t addr, size_t size) {
  size_t g = v->granularity;
  if (size == 0) return bad_arg(v, c, addr, size, "size is 0"), false;
  if ((addr | size) & (g - 1))
    return bad_arg(v, c, addr, size, "address or size is not a multiple of the granularity"),
           false;
  vmm_full_t *f = full(v);
  pthread_mutex_lock(&f->mu);
  size_t lo = 0, hi = f->nresv;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (f->resv[mid].addr <= addr) lo = mid + 1;
    else hi = mid;
  }
  bool inside = false;
  if (lo > 0) {
    const span_t *r = &f->resv[lo - 1];
    inside = addr - r->addr < r->size && size <= r->size - (addr - r->addr);
  }
  pthread_mutex_unlock(&f->mu);
  if (!inside) bad_arg(v, c, addr, size, "the range is not inside one live reservation");
  return inside;
}

/* ---- construction ---- */

expseg_status _expseg_vmm_wrap(const expseg_vmm_ops_t *ops, void *st, int device,
                               expseg_vmm_t **out) {
  if (!out || !ops) {
    if (ops && ops->destroy) ops->destroy(st);
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "vmm_wrap: NULL ops or out-pointer");
  }
  *out = NULL;
  vmm_full_t *f = calloc(1, sizeof *f);
  if (!f) {
    ops->destroy(st);
    return _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY, "vmm_wrap: out of host memory");
  }
  pthread_mutex_init(&f->mu, NULL);
  f->pub.ops = ops;
  f->pub.st = st;
  f->pub.device = device;
  f->pub.numa_override = -1;
  f->pub.granularity = ops->granularity(st);
  size_t g = f->pub.granularity;
  if (g == 0 || (g & (g - 1))) {
    _expseg_vmm_close(&f->pub);
    return _expseg_error_set(EXPSEG_ERR_DRIVER,
                             "%s driver: granularity %zu is not a power of two", ops->name, g);
  }
  *out = &f->pub;
  return EXPSEG_OK;
}

void _expseg_vmm_close(expseg_vmm_t *v) {
  if (!v) return;
  vmm_full_t *f = full(v);
  if (v->ops && v->ops->destroy) v->ops->destroy(v->st);
  pthread_mutex_destroy(&f->mu);
  free(f->resv);
  free(f);
}

/* ---- spec parsing ---- */

enum { OPT_SIZE, OPT_INT };

typedef struct {
  const char *key;
  int kind;
  const char *help; /* what is accepted */
} optdef_t;

static const optdef_t host_opts[] = {
    {"capacity", OPT_SIZE, "SIZE > 0"},
    {"granularity", OPT_SIZE, "SIZE, a power of two multiple of the OS page"},
    {"numa", OPT_INT, "a NUMA node number >= 0"},
};
static const optdef_t sim_opts[] = {
    {"capacity", OPT_SIZE, "SIZE > 0"},
    {"granularity", OPT_SIZE, "SIZE, a power of two from 4K to 1G"},
    {"va", OPT_SIZE, "SIZE from the granularity to 4096T"},
    {"top_down", OPT_INT, "0 (reserve hands out the lowest free addresses) or 1 (the highest)"},
};
static const optdef_t cuda_opts[] = {
    {"numa", OPT_INT, "a NUMA node number >= 0 (pinned host memory)"},
};

enum { MAX_OPTS = 4 };

#define SPEC_FMT "driver spec '%.*s': "
#define SPEC_ARG (int)(speclen > 120 ? 120 : speclen), spec

static bool parse_int(const char *s, size_t n, uint64_t *out) {
  return n <= 9 && _expseg_dec_all(s, n, out);
}

static void accepted_keys(char *buf, size_t cap, const optdef_t *defs, size_t ndefs) {
  size_t p = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < ndefs && p < cap; i++)
    p += (size_t)snprintf(buf + p, cap - p, "%s%s=%s", i ? ", " : "", defs[i].key,
                          defs[i].kind == OPT_SIZE ? "SIZE" : "N");
}

/* Parses the option list after ':' into vals[] (seen[] marks given keys). */
static expseg_status parse_opts(const char *spec, size_t speclen, const char *name,
                                const char *p, const optdef_t *defs, size_t ndefs,
                                uint64_t vals[MAX_OPTS], bool seen[MAX_OPTS]) {
  char acc[160];
  accepted_keys(acc, sizeof acc, defs, ndefs);
  if (ndefs == 0)
    return _expseg_error_set(EXPSEG_ERR_CONFIG,
                             SPEC_FMT "the %s driver takes no options (write just '%s')",
                             SPEC_ARG, name, name);
  if (*p == '\0')
    return _expseg_error_set(EXPSEG_ERR_CONFIG,
                             SPEC_FMT "empty option list after ':'; accepted: %s", SPEC_ARG, acc);
  for (;;) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == 0)
      return _expseg_error_set(EXPSEG_ERR_CONFIG,
                               SPEC_FMT "empty option at offset %zu (a doubled, leading or "
                               "trailing comma); accepted: %s",
                               SPEC_ARG, (size_t)(p - spec), acc);
    const char *eq = memchr(p, '=', n);
    size_t klen = eq ? (size_t)(eq - p) : n;
    int which = -1;
    for (size_t i = 0; i < ndefs; i++)
      if (strlen(defs[i].key) == klen && memcmp(defs[i].key, p, klen) == 0) which = (int)i;
    if (which < 0)
      return _expseg_error_set(EXPSEG_ERR_CONFIG,
                               SPEC_FMT "unknown option '%.*s' for the %s driver; accepted: %s",
                               SPEC_ARG, (int)(klen > 64 ? 64 : klen), p, name, acc);
    const optdef_t *d = &defs[which];
    const char *val = eq ? eq + 1 : NULL;
    size_t vlen = eq ? n - klen - 1 : 0;
    if (!eq || vlen == 0)
      return _expseg_error_set(EXPSEG_ERR_CONFIG,
                               SPEC_FMT "option '%s' has no value (write %s=%s)", SPEC_ARG,
                               d->key, d->key, d->kind == OPT_SIZE ? "SIZE, e.g. 8G" : "N");
    if (seen[which])
      return _expseg_error_set(EXPSEG_ERR_CONFIG, SPEC_FMT "option '%s' is given twice",
                               SPEC_ARG, d->key);
    bool ok = d->kind == OPT_SIZE ? _expseg_dec_size(val, vlen, &vals[which])
                                  : parse_int(val, vlen, &vals[which]);
    if (!ok)
      return _expseg_error_set(
          EXPSEG_ERR_CONFIG, SPEC_FMT "bad value '%.*s' for '%s': expected %s", SPEC_ARG,
          (int)(vlen > 64 ? 64 : vlen), val, d->key,
          d->kind == OPT_SIZE ? "an integer with an optional K, M, G or T suffix (binary "
                                "units, e.g. 8G or 512K)"
                              : "a non-negative integer");
    seen[which] = true;
    if (!end) break;
    p = end + 1;
  }
  return EXPSEG_OK;
}

static expseg_status open_spec(const char *spec, int device, expseg_vmm_t **out);

/* "fault[:fail=RULES];INNER": the fault wrapper over the driver INNER names. */
static expseg_status open_fault(const char *spec, int device, expseg_vmm_t **out) {
  size_t speclen = strlen(spec);
  const char *semi = strchr(spec, ';');
  if (!semi || !semi[1])
    return _expseg_error_set(EXPSEG_ERR_CONFIG,
                             SPEC_FMT "the fault driver wraps another: write "
                             "fault:fail=RULES;DRIVER, e.g. fault:fail=map@3..5;host:capacity=64M",
                             SPEC_ARG);
  const char *rules = NULL;
  size_t rlen = 0;
  if (spec[5] == ':') {
    const char *o = spec + 6;
    if ((size_t)(semi - o) < 5 || memcmp(o, "fail=", 5) != 0)
      return _expseg_error_set(EXPSEG_ERR_CONFIG,
                               SPEC_FMT "unknown option '%.*s' for the fault driver; accepted: "
                               "fail=RULES",
                               SPEC_ARG, (int)(semi - o > 64 ? 64 : semi - o), o);
    rules = o + 5;
    rlen = (size_t)(semi - rules);
  }
  expseg_vmm_t *inner = NULL;
  expseg_status st = open_spec(semi + 1, device, &inner);
  if (st != EXPSEG_OK) return st;
  st = _expseg_fault_new(inner, out);
  if (st == EXPSEG_OK && rules && (st = _expseg_fault_set_rules_text(*out, rules, rlen, false))) {
    _expseg_vmm_close(*out);
    *out = NULL;
  }
  return st;
}

static expseg_status open_spec(const char *spec, int device, expseg_vmm_t **out) {
  if (strncmp(spec, "fault", 5) == 0 && (spec[5] == ':' || spec[5] == ';'))
    return open_fault(spec, device, out);
  size_t speclen = strlen(spec);
  const char *colon = strchr(spec, ':');
  size_t nlen = colon ? (size_t)(colon - spec) : speclen;
  const char *opts = colon ? colon + 1 : NULL;
  uint64_t vals[MAX_OPTS] = {0};
  bool seen[MAX_OPTS] = {false};
  expseg_status st;
  if (nlen == 4 && memcmp(spec, "host", 4) == 0) {
    if (opts && (st = parse_opts(spec, speclen, "host", opts, host_opts, 3, vals, seen)))
      return st;
    if (seen[0] && vals[0] == 0)
      return _expseg_error_set(EXPSEG_ERR_CONFIG, SPEC_FMT "capacity=0: expected SIZE > 0",
                               SPEC_ARG);
    expseg_host_opts_t o = {0, 2u << 20, -1}; /* capacity 0 = the default */
    if (seen[0]) o.capacity = vals[0];
    if (seen[1]) o.granularity = vals[1];
    if (seen[2]) o.numa_node = (int)vals[2];
    st = _expseg_host_new(&o, device, out);
    if (st == EXPSEG_OK) (*out)->numa_override = o.numa_node;
  } else if (nlen == 3 && memcmp(spec, "sim", 3) == 0) {
    if (opts && (st = parse_opts(spec, speclen, "sim", opts, sim_opts, 4, vals, seen)))
      return st;
    if (seen[3] && vals[3] > 1)
      return _expseg_error_set(EXPSEG_ERR_CONFIG, SPEC_FMT "top_down=%llu: expected 0 or 1",
                               SPEC_ARG, (unsigned long long)vals[3]);
    expseg_sim_opts_t o = {80ull << 30, 2u << 20, 128ull << 40, false};
    if (seen[0]) o.capacity = vals[0];
    if (seen[1]) o.granularity = vals[1];
    if (seen[2]) o.va_size = vals[2];
    if (seen[3]) o.top_down = vals[3] == 1;
    st = _expseg_sim_new(&o, device, out);
  } else if (nlen == 4 && memcmp(spec, "cuda", 4) == 0) {
    if (opts && (st = parse_opts(spec, speclen, "cuda", opts, cuda_opts, 1, vals, seen)))
      return st;
    if (seen[0] && (vals[0] > INT32_MAX || !_expseg_topo_node_exists((int)vals[0])))
      return _expseg_error_set(EXPSEG_ERR_CONFIG,
                               SPEC_FMT "numa=%llu: no such NUMA node (this machine has %d)",
                               SPEC_ARG, (unsigned long long)vals[0], _expseg_topo_numa_count());
    st = _expseg_cuda_new(device, out);
    if (st == EXPSEG_OK && seen[0]) (*out)->numa_override = (int)vals[0];
  } else {
    return _expseg_error_set(EXPSEG_ERR_CONFIG,
                             SPEC_FMT "unknown driver '%.*s'; accepted: cuda, host, sim, fault "
                             "(options after ':', e.g. host:capacity=8G; "
                             "fault:fail=map@3;host wraps host)",
                             SPEC_ARG, (int)(nlen > 64 ? 64 : nlen), spec);
  }
  if (st == EXPSEG_ERR_CONFIG) _expseg_error_prefix(SPEC_FMT "rejected", SPEC_ARG);
  return st;
}

/* No driver named anywhere: cuda, and never a silent fallback to host memory. Whatever made
 * cuda unusable (no libcuda, no device, no VMM support, built without CUDA) is reported as
 * EXPSEG_ERR_UNSUPPORTED with the way to pick host or sim on purpose. */
static expseg_status open_default(int device, expseg_vmm_t **out) {
  expseg_status st = _expseg_cuda_new(device, out);
  if (st == EXPSEG_OK) return st;
  char why[768];
  snprintf(why, sizeof why, "%s", _expseg_error_message());
  return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                           "no driver given and $EXPSEG_DRIVER unset or empty, so the cuda driver was "
                           "asked for device %d and it is not usable: %s. To use host memory or "
                           "the bookkeeping-only simulator on purpose, pass the driver \"host\" "
                           "or \"sim\" to expseg_create, or set EXPSEG_DRIVER=host (or sim)",
                           device, why);
}

expseg_status _expseg_vmm_open(const char *spec, int device, expseg_vmm_t **out) {
  if (!out) return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "vmm_open: out is NULL");
  *out = NULL;
  if (device < 0)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "vmm_open: device %d: expected a device ordinal >= 0", device);
  if (spec) return open_spec(spec, device, out);
  const char *env = getenv("EXPSEG_DRIVER");
  if (env && *env) {
    expseg_status st = open_spec(env, device, out);
    if (st) _expseg_error_prefix("$EXPSEG_DRIVER");
    return st;
  }
  return open_default(device, out);
}

/* ---- the wrappers ---- */

expseg_status _expseg_vmm_reserve(expseg_vmm_t *v, size_t size, size_t align, uintptr_t *addr) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_reserve;
  if (!addr) return null_out(v, c);
  size_t g = v->granularity;
  if (size == 0 || (size & (g - 1))) return bad_arg(v, c, 0, size, "size is 0 or not a multiple of the granularity");
  if (align && ((align & (align - 1)) || (align & (g - 1)))) {
    char b[32];
    _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                      "%s driver: reserve(size=%s, align=%zu): align must be 0 or a power of "
                      "two multiple of the granularity %zu",
                      v->ops->name, _expseg_format_size(b, size), align, g);
    return refuse(v, c);
  }
  uintptr_t a = 0;
  expseg_status st = v->ops->reserve(v->st, size, align, &a);
  if (st == EXPSEG_OK) {
    vmm_full_t *f = full(v);
    pthread_mutex_lock(&f->mu);
    if (f->nresv == f->capresv) {
      size_t cap = f->capresv ? f->capresv * 2 : 16;
      span_t *n = realloc(f->resv, cap * sizeof *n);
      if (!n) {
        pthread_mutex_unlock(&f->mu);
        v->ops->unreserve(v->st, a, size);
        st = _expseg_error_set(EXPSEG_ERR_HOST_OUT_OF_MEMORY,
                               "%s driver: reserve: out of host memory for the table",
                               v->ops->name);
        _expseg_vmm_account(v, c, st, 0);
        return st;
      }
      f->resv = n;
      f->capresv = cap;
    }
    size_t i = f->nresv;
    while (i > 0 && f->resv[i - 1].addr > a) i--;
    memmove(&f->resv[i + 1], &f->resv[i], (f->nresv - i) * sizeof *f->resv);
    f->resv[i] = (span_t){a, size};
    f->nresv++;
    pthread_mutex_unlock(&f->mu);
    *addr = a;
  }
  _expseg_vmm_account(v, c, st, size);
  return st;
}

expseg_status _expseg_vmm_unreserve(expseg_vmm_t *v, uintptr_t addr, size_t size) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_unreserve;
  vmm_full_t *f = full(v);
  pthread_mutex_lock(&f->mu);
  size_t i = 0;
  while (i < f->nresv && f->resv[i].addr != addr) i++; /* reservations are few */
  bool exact = i < f->nresv && f->resv[i].size == size;
  pthread_mutex_unlock(&f->mu);
  if (!exact) return bad_arg(v, c, addr, size, "not exactly one live reservation");
  expseg_status st = v->ops->unreserve(v->st, addr, size);
  if (st == EXPSEG_OK) {
    pthread_mutex_lock(&f->mu);
    for (i = 0; i < f->nresv && f->resv[i].addr != addr; i++) {
    }
    if (i < f->nresv) {
      memmove(&f->resv[i], &f->resv[i + 1], (f->nresv - i - 1) * sizeof *f->resv);
      f->nresv--;
    }
    pthread_mutex_unlock(&f->mu);
  }
  _expseg_vmm_account(v, c, st, size);
  return st;
}

expseg_status _expseg_vmm_create(expseg_vmm_t *v, size_t size, expseg_vmm_handle *h) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_create;
  if (!h) return null_out(v, c);
  if (size == 0 || (size & (v->granularity - 1)))
    return bad_arg(v, c, 0, size, "size is 0 or not a multiple of the granularity");
  expseg_status st = v->ops->create(v->st, size, h);
  _expseg_vmm_account(v, c, st, size);
  return st;
}

expseg_status _expseg_vmm_release(expseg_vmm_t *v, expseg_vmm_handle h, size_t size) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_release;
  if (h == 0) {
    _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "%s driver: release: handle 0 is never live",
                      v->ops->name);
    return refuse(v, c);
  }
  expseg_status st = v->ops->release(v->st, h);
  _expseg_vmm_account(v, c, st, size);
  return st;
}

expseg_status _expseg_vmm_map(expseg_vmm_t *v, uintptr_t addr, size_t size, expseg_vmm_handle h,
                              size_t offset) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_map;
  if (offset & (v->granularity - 1))
    return bad_arg(v, c, addr, size, "offset is not a multiple of the granularity");
  if (!range_ok(v, c, addr, size)) return EXPSEG_ERR_INVALID_ARGUMENT;
  expseg_status st = v->ops->map(v->st, addr, size, h, offset);
  _expseg_vmm_account(v, c, st, size);
  return st;
}

expseg_status _expseg_vmm_unmap(expseg_vmm_t *v, uintptr_t addr, size_t size) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_unmap;
  if (!range_ok(v, c, addr, size)) return EXPSEG_ERR_INVALID_ARGUMENT;
  expseg_status st = v->ops->unmap(v->st, addr, size);
  _expseg_vmm_account(v, c, st, size);
  return st;
}

expseg_status _expseg_vmm_set_access(expseg_vmm_t *v, uintptr_t addr, size_t size) {
  return _expseg_vmm_set_access_dev(v, addr, size, v->device);
}

expseg_status _expseg_vmm_set_access_dev(expseg_vmm_t *v, uintptr_t addr, size_t size,
                                         int device) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_set_access;
  if (!range_ok(v, c, addr, size)) return EXPSEG_ERR_INVALID_ARGUMENT;
  expseg_status st = v->ops->set_access(v->st, addr, size, device);
  _expseg_vmm_account(v, c, st, 0);
  return st;
}

/* copy_in / copy_out: one checked, counted path (a fault wrapper's copy may fail it, then
 * passes it to its inner driver). */
static expseg_status vmm_copy(expseg_vmm_t *v, uintptr_t dev, void *host, size_t size,
                              bool to_device, const expseg_stream *stream) {
  const char *what = to_device ? "copy_in" : "copy_out";
  if (size == 0 || !host || dev + size < dev)
    return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                             "%s driver: %s(device 0x%llx, host %p, size %zu): accepted are a "
                             "size > 0, a host pointer and a range that does not wrap",
                             v->ops->name, what, (unsigned long long)dev, host, size);
  if (!v->ops->copy)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                             "%s driver: %s: the driver has no bytes to copy (host and cuda do)",
                             v->ops->name, what);
  expseg_status st = stream && v->ops->copy_async
                         ? v->ops->copy_async(v->st, dev, host, size, to_device, *stream)
                         : v->ops->copy(v->st, dev, host, size, to_device);
  _expseg_vmm_account(v, EXPSEG_VMM_CALL_copy, st, 0);
  return st;
}

bool _expseg_vmm_copies_async(expseg_vmm_t *v) {
  expseg_vmm_t *inner = _expseg_fault_inner(v);
  return (inner ? inner : v)->ops->copy_async != NULL;
}

bool _expseg_vmm_has_bytes(expseg_vmm_t *v) {
  expseg_vmm_t *inner = _expseg_fault_inner(v);
  return (inner ? inner : v)->ops->copy != NULL;
}

expseg_status _expseg_vmm_copy_async(expseg_vmm_t *v, uintptr_t dev, void *host, size_t size,
                                     bool to_device, expseg_stream stream) {
  return vmm_copy(v, dev, host, size, to_device, &stream);
}

expseg_status _expseg_vmm_copy_in(expseg_vmm_t *v, uintptr_t dst, const void *src, size_t size) {
  return vmm_copy(v, dst, (void *)(uintptr_t)src, size, true, NULL);
}

expseg_status _expseg_vmm_copy_out(expseg_vmm_t *v, void *dst, uintptr_t src, size_t size) {
  return vmm_copy(v, src, dst, size, false, NULL);
}

expseg_status _expseg_vmm_has_access(expseg_vmm_t *v, uintptr_t addr, size_t size, int device,
                                     int *state) {
  if (!v->ops->has_access)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                             "%s driver: has_access is a test hook of the host and sim drivers",
                             v->ops->name);
  return v->ops->has_access(v->st, addr, size, device, state);
}

expseg_status _expseg_vmm_check_peer(expseg_vmm_t *v, int peer) {
  return v->ops->check_peer ? v->ops->check_peer(v->st, peer) : EXPSEG_OK;
}

static expseg_status no_event(expseg_vmm_t *v, expseg_vmm_call c) {
  _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "%s driver: %s: event 0 is never live",
                    v->ops->name, call_names[c]);
  return refuse(v, c);
}

expseg_status _expseg_vmm_event_create(expseg_vmm_t *v, expseg_vmm_event *ev) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_event_create;
  if (!ev) return null_out(v, c);
  expseg_status st = v->ops->event_create(v->st, ev);
  _expseg_vmm_account(v, c, st, 0);
  return st;
}

expseg_status _expseg_vmm_event_destroy(expseg_vmm_t *v, expseg_vmm_event ev) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_event_destroy;
  if (!ev) return no_event(v, c);
  expseg_status st = v->ops->event_destroy(v->st, ev);
  _expseg_vmm_account(v, c, st, 0);
  return st;
}

expseg_status _expseg_vmm_event_record(expseg_vmm_t *v, expseg_vmm_event ev, expseg_stream s) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_event_record;
  if (!ev) return no_event(v, c);
  expseg_status st = v->ops->event_record(v->st, ev, s);
  _expseg_vmm_account(v, c, st, 0);
  return st;
}

expseg_status _expseg_vmm_event_query(expseg_vmm_t *v, expseg_vmm_event ev, bool *done) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_event_query;
  if (!done) return null_out(v, c);
  if (!ev) return no_event(v, c);
  expseg_status st = v->ops->event_query(v->st, ev, done);
  _expseg_vmm_account(v, c, st, 0);
  return st;
}

expseg_status _expseg_vmm_event_synchronize(expseg_vmm_t *v, expseg_vmm_event ev) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_event_synchronize;
  if (!ev) return no_event(v, c);
  expseg_status st = v->ops->event_synchronize(v->st, ev);
  _expseg_vmm_account(v, c, st, 0);
  return st;
}

expseg_status _expseg_vmm_stream_synchronize(expseg_vmm_t *v, expseg_stream s) {
  expseg_status st = v->ops->stream_synchronize(v->st, s);
  _expseg_vmm_account(v, EXPSEG_VMM_CALL_stream_synchronize, st, 0);
  return st;
}

expseg_status _expseg_vmm_device_synchronize(expseg_vmm_t *v) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_device_synchronize;
  expseg_status st =
      v->ops->device_synchronize
          ? v->ops->device_synchronize(v->st)
          : _expseg_error_set(EXPSEG_ERR_UNSUPPORTED, "%s driver: device_synchronize is not "
                                                      "provided", v->ops->name);
  _expseg_vmm_account(v, c, st, 0);
  return st;
}

expseg_status _expseg_vmm_export_fd(expseg_vmm_t *v, expseg_vmm_handle h, int *fd,
                                    size_t *offset) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_export_fd;
  if (!fd || !offset) return null_out(v, c);
  *offset = 0;
  expseg_status st = v->ops->export_fd(v->st, h, fd, offset);
  _expseg_vmm_account(v, c, st, 0);
  return st;
}

expseg_status _expseg_vmm_import_fd(expseg_vmm_t *v, int fd, size_t offset, size_t size,
                                    expseg_vmm_handle *h) {
  const expseg_vmm_call c = EXPSEG_VMM_CALL_import_fd;
  if (!h) return null_out(v, c);
  if (fd < 0) {
    _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "%s driver: import_fd: fd %d is not valid",
                      v->ops->name, fd);
    return refuse(v, c);
  }
  if (size == 0 || (size & (v->granularity - 1)))
    return bad_arg(v, c, 0, size, "size is 0 or not a multiple of the granularity");
  if (offset + size < offset) return bad_arg(v, c, 0, size, "offset + size overflows");
  expseg_status st = v->ops->import_fd(v->st, fd, offset, size, h);
  _expseg_vmm_account(v, c, st, size);
  return st;
}

void _expseg_vmm_mem_info(expseg_vmm_t *v, size_t *free_bytes, size_t *total_bytes) {
  size_t fr = 0, tot = 0;
  v->ops->mem_info(v->st, &fr, &tot);
  if (free_bytes) *free_bytes = fr;
  if (total_bytes) *total_bytes = tot;
}

uint64_t _expseg_vmm_now_ns(expseg_vmm_t *v) { return v->ops->now_ns(v->st); }

expseg_status _expseg_vmm_stream_create(expseg_vmm_t *v, expseg_stream *s) {
  if (!s) return _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT, "stream_create: out is NULL");
  if (!v->ops->stream_create)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                             "%s driver: no streams to create (any value is a stream here)",
                             v->ops->name);
  return v->ops->stream_create(v->st, s);
}

expseg_status _expseg_vmm_stream_destroy(expseg_vmm_t *v, expseg_stream s) {
  if (!v->ops->stream_destroy)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                             "%s driver: no streams to destroy (any value is a stream here)",
                             v->ops->name);
  return v->ops->stream_destroy(v->st, s);
}

expseg_status _expseg_vmm_hold_stream(expseg_vmm_t *v, expseg_stream s, bool hold) {
  if (!v->ops->hold_stream)
    return _expseg_error_set(EXPSEG_ERR_UNSUPPORTED,
                             "%s driver: hold_stream is a test hook this driver does not have",
                             v->ops->name);
  v->ops->hold_stream(v->st, s, hold);
  return EXPSEG_OK;
}

/* ---- pinned host memory ---- */

expseg_status _expseg_vmm_host_alloc(expseg_vmm_t *v, expseg_host_chunk_t *c) {
  const expseg_vmm_call k = EXPSEG_VMM_CALL_host_alloc;
  if (!c) return null_out(v, k);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uint32_t t = c->fault_threads;
  char b[32];
  if (c->size == 0 || c->size % page ||
      (c->numa_node != -1 && !_expseg_topo_node_exists(c->numa_node)) || t == 0 ||
      (t & (t - 1)) || t > 128) {
    _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                      "%s driver: host_alloc(size=%s, numa_node=%d, fault_threads=%u): size "
                      "must be a non-zero multiple of the OS page (%zu), the node -1 or one of "
                      "this machine's %d node(s), the threads a power of two from 1 to 128",
                      v->ops->name, _expseg_format_size(b, c->size), c->numa_node, t, page,
                      _expseg_topo_numa_count());
    return refuse(v, k);
  }
  if (!v->ops->host_alloc) {
    _expseg_error_set(EXPSEG_ERR_UNSUPPORTED, "%s driver: no pinned host memory",
                      v->ops->name);
    _expseg_vmm_account(v, k, EXPSEG_ERR_UNSUPPORTED, 0);
    return EXPSEG_ERR_UNSUPPORTED;
  }
  c->ptr = NULL;
  c->locked = c->placed = false;
  c->method = 0;
  c->threads_used = 0;
  c->handle = 0;
  expseg_status st = v->ops->host_alloc(v->st, c);
  _expseg_vmm_account(v, k, st, c->size);
  return st;
}

expseg_status _expseg_vmm_host_free(expseg_vmm_t *v, const expseg_host_chunk_t *c) {
  const expseg_vmm_call k = EXPSEG_VMM_CALL_host_free;
  if (!c || !c->ptr || !c->method || !v->ops->host_free) {
    _expseg_error_set(EXPSEG_ERR_INVALID_ARGUMENT,
                      "%s driver: host_free: not a chunk made by host_alloc", v->ops->name);
    return refuse(v, k);
  }
  expseg_status st = v->ops->host_free(v->st, c);
  _expseg_vmm_account(v, k, st, c->size);
  return st;
}

int _expseg_vmm_host_numa(expseg_vmm_t *v) {
  if (v->numa_override >= 0) return v->numa_override;
  int n = v->ops->host_numa ? v->ops->host_numa(v->st) : -1;
  if (n < 0 && _expseg_topo_numa_count() == 1) n = 0;
  return n;
}
