/* SPDX-License-Identifier: Apache-2.0 */
/* pickle.c: a small, defensive unpickler for PyTorch memory snapshots.
 *
 * It accepts the opcodes of protocols 2-5 that plain trees of dict/list/tuple/str/bytes/
 * int/float/bool/None use (the set the memory viewer's own unpickler reads, plus
 * BINUNICODE8, the BINBYTES family and LONG4) and nothing that names a class or calls code.
 * Values live in one array and refer to each other by index, so shared and even
 * self-referencing values (through the memo) cost nothing and freeing never recurses.
 * Strings point into the input. Limits keep any input, malformed or crafted, to time and
 * memory linear in its size: every length is checked against the bytes left, memo indices
 * stay below the input length and sparse ones go to a hash map (a dense array sized by the
 * largest index would cost four bytes per input byte for one LONG_BINPUT), MARKs nest at
 * most EXPSEG_PICKLE_MAX_MARKS deep, and the first error stops with the byte offset and the
 * reason. A dict read through the memo may be looked up once per reference, so dicts with
 * more than EXPSEG_PICKLE_SCAN_KEYS keys get a hash table once loaded (its size is bounded
 * by the dict's own items): every lookup is O(1), whatever the sharing. */
#include "trace_internal.h"


#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* opcodes */
enum {
  OP_MARK = '(', OP_STOP = '.', OP_BININT = 'J', OP_BININT1 = 'K', OP_BININT2 = 'M',
  OP_NONE = 'N', OP_BINUNICODE = 'X', OP_APPEND = 'a', OP_APPENDS = 'e', OP_BINGET = 'h',
  OP_LONG_BINGET = 'j', OP_EMPTY_LIST = ']', OP_LIST = 'l', OP_BINPUT = 'q',
  OP_LONG_BINPUT = 'r', OP_SETITEM = 's', OP_TUPLE = 't', OP_EMPTY_TUPLE = ')',
  OP_SETITEMS = 'u', OP_BINFLOAT = 'G', OP_EMPTY_DICT = '}', OP_DICT = 'd',
  OP_BINBYTES = 'B', OP_SHORT_BINBYTES = 'C',
  OP_PROTO = 0x80, OP_TUPLE1 = 0x85, OP_TUPLE2 = 0x86, OP_TUPLE3 = 0x87, OP_NEWTRUE = 0x88,
  OP_NEWFALSE = 0x89, OP_LONG1 = 0x8a, OP_LONG4 = 0x8b, OP_SHORT_BINUNICODE = 0x8c,
  OP_BINUNICODE8 = 0x8d, OP_BINBYTES8 = 0x8e, OP_MEMOIZE = 0x94, OP_FRAME = 0x95
};

typedef struct up_s {
  const char *name;
  const unsigned char *buf;
  size_t len, pos, op_pos;
  uint8_t op;
  _expseg_pickle_t *pk;
  uint32_t *stack;            /* value indices */
  size_t sn, scap;
  size_t marks[EXPSEG_PICKLE_MAX_MARKS];
  int nmarks;
  uint32_t *memo;             /* memo index -> value index (0 = unset), dense part */
  size_t memo_cap, memo_count;
  _expseg_map_t memo_sparse;  /* indices far beyond the dense part -> value index */
} up_t;

static expseg_status fail(up_t *u, const char *fmt, ...) EXPSEG_PRINTF(2, 3);
static expseg_status fail(up_t *u, const char *fmt, ...) {
  char why[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: byte %zu (opcode 0x%02x): %s",
                           u->name, u->op_pos, u->op, why);
}

static expseg_status oom(up_t *u) { return fail(u, "out of host memory"); }

static bool need(up_t *u, size_t n) { return u->len - u->pos >= n; }

static uint64_t rd_le(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* A new value of the given kind; 0 when out of memory. */
static uint32_t new_value(up_t *u, uint8_t kind) {
  _expseg_pickle_t *pk = u->pk;
  if (pk->n == pk->cap) {
    if (pk->cap >= UINT32_MAX / 2) return 0;
    uint32_t cap = pk->cap ? pk->cap * 2 : 1024;
    _expseg_pv_t *v = realloc(pk->v, (size_t)cap * sizeof *v);
    if (!v) return 0;
    pk->v = v;
    pk->cap = cap;
  }
  _expseg_pv_t *v = &pk->v[pk->n];
  memset(v, 0, sizeof *v);
  v->kind = kind;
  v->off = (uint32_t)u->op_pos;
  return pk->n++;
}

static bool push(up_t *u, uint32_t v) {
  if (v == 0) return false;
  if (u->sn == u->scap) {
    size_t cap = u->scap ? u->scap * 2 : 256;
    uint32_t *s = realloc(u->stack, cap * sizeof *s);
    if (!s) return false;
    u->stack = s;
    u->scap = cap;
  }
  u->stack[u->sn++] = v;
  return true;
}

/* stack[from..sn) appended to container c */
static bool add_items(up_t *u, uint32_t c, size_t from) {
  size_t n = u->sn - from;
  if (n == 0) return true;
  _expseg_pv_t *v = &u->pk->v[c];
  if (n > UINT32_MAX - 1 - v->u.c.n) return false;
  if (v->u.c.n + n > v->u.c.cap) {
    size_t cap = v->u.c.cap ? v->u.c.cap : 4;
    while (cap < v->u.c.n + n) cap *= 2;
    if (cap > UINT32_MAX) cap = UINT32_MAX;
    uint32_t *it = realloc(v->u.c.items, cap * sizeof *it);
    if (!it) return false;
    v->u.c.items = it;
    v->u.c.cap = (uint32_t)cap;
  }
  memcpy(v->u.c.items + v->u.c.n, u->stack + from, n * sizeof *u->stack);
  v->u.c.n += (uint32_t)n;
  return true;
}

/* The stack position of the innermost MARK (items above it are its contents). */
static expseg_status pop_mark(up_t *u, size_t *at) {
  if (u->nmarks == 0) return fail(u, "needs a MARK, but there is none");
  *at = u->marks[--u->nmarks];
  return EXPSEG_OK;
}

static expseg_status make_container(up_t *u, uint8_t kind, size_t from) {
  size_t n = u->sn - from;
  if (kind == EXPSEG_PV_DICT && n % 2)
    return fail(u, "DICT over an odd number of items (%zu)", n);
  uint32_t c = new_value(u, kind);
  if (!c || !add_items(u, c, from)) return oom(u);
  u->sn = from;
  return push(u, c) ? EXPSEG_OK : oom(u);
}

static const char *kind_name(uint8_t k) {
  static const char *const names[] = {"None", "bool", "int", "float", "str", "bytes", "list",
                                      "tuple", "dict"};
  return k < sizeof names / sizeof names[0] ? names[k] : "?";
}

/* Appends stack[from..] to the container at stack[from-1], which must be of kind. */
static expseg_status extend(up_t *u, size_t from, uint8_t kind, const char *opname) {
  if (from == 0) return fail(u, "%s with no %s below its items", opname, kind_name(kind));
  uint32_t c = u->stack[from - 1];
  if (u->pk->v[c].kind != kind)
    return fail(u, "%s onto a %s, expected a %s", opname, kind_name(u->pk->v[c].kind),
                kind_name(kind));
  size_t n = u->sn - from;
  if (kind == EXPSEG_PV_DICT && n % 2) return fail(u, "%s with an odd number of items (%zu)",
                                                   opname, n);
  if (!add_items(u, c, from)) return oom(u);
  u->sn = from;
  return EXPSEG_OK;
}

static expseg_status memo_put(up_t *u, uint64_t idx) {
  if (u->sn == 0) return fail(u, "memo store with an empty stack");
  if (idx >= u->len) return fail(u, "memo index %" PRIu64 " is beyond the limit (%zu)", idx,
                                 u->len);
  /* the dense array grows only while at least a quarter of it is used */
  if (idx >= u->memo_cap && idx < 4 * (u->memo_count + 1024)) {
    size_t cap = u->memo_cap ? u->memo_cap : 1024;
    while (cap <= idx) cap *= 2;
    uint32_t *m = realloc(u->memo, cap * sizeof *m);
    if (!m) return oom(u);
    memset(m + u->memo_cap, 0, (cap - u->memo_cap) * sizeof *m);
    u->memo = m;
    u->memo_cap = cap;
  }
  uint32_t v = u->stack[u->sn - 1];
  if (idx < u->memo_cap) {
    if (!u->memo[idx] && !_expseg_map_get(&u->memo_sparse, idx)) u->memo_count++;
    u->memo[idx] = v;
    return EXPSEG_OK;
  }
  if (!_expseg_map_get(&u->memo_sparse, idx)) u->memo_count++;
  return _expseg_map_put(&u->memo_sparse, idx, v) ? EXPSEG_OK : oom(u);
}

static expseg_status memo_get(up_t *u, uint64_t idx) {
  uint32_t v = idx < u->memo_cap ? u->memo[idx] : 0;
  if (!v) {
    const uint64_t *sp = _expseg_map_get(&u->memo_sparse, idx);
    if (sp) v = (uint32_t)*sp;
  }
  if (!v) return fail(u, "memo index %" PRIu64 " was never stored", idx);
  return push(u, v) ? EXPSEG_OK : oom(u);
}

static expseg_status push_int(up_t *u, int64_t iv, uint8_t big) {
  uint32_t v = new_value(u, EXPSEG_PV_INT);
  if (!v) return oom(u);
  u->pk->v[v].u.iv = iv;
  u->pk->v[v].big = big;
  return push(u, v) ? EXPSEG_OK : oom(u);
}

/* LONG1/LONG4 payload: little-endian two's complement of n bytes. */
static expseg_status push_long(up_t *u, const unsigned char *p, uint64_t n) {
  if (n == 0) return push_int(u, 0, 0);
  if (n > 8) {
    /* fits when the extra bytes only repeat the sign of byte 7 */
    uint8_t fill = (p[7] & 0x80) ? 0xff : 0;
    for (uint64_t i = 8; i < n; i++)
      if (p[i] != fill) return push_int(u, 0, 1);
    n = 8;
  }
  uint64_t v = rd_le(p, (int)n);
  if (n < 8 && (p[n - 1] & 0x80)) v |= ~UINT64_C(0) << (8 * n);  /* sign-extend */
  return push_int(u, (int64_t)v, 0);
}

static expseg_status push_str(up_t *u, uint8_t kind, uint64_t n) {
  if (!need(u, n))
    return fail(u, "string of %" PRIu64 " bytes, but only %zu bytes are left", n,
                u->len - u->pos);
  uint32_t v = new_value(u, kind);
  if (!v) return oom(u);
  u->pk->v[v].u.s.p = (const char *)u->buf + u->pos;
  u->pk->v[v].u.s.len = n;
  u->pos += n;
  return push(u, v) ? EXPSEG_OK : oom(u);
}

/* Reads the n-byte little-endian argument of the current opcode. */
static expseg_status arg(up_t *u, int n, uint64_t *out) {
  if (!need(u, (size_t)n))
    return fail(u, "truncated: needs %d argument bytes, %zu left", n, u->len - u->pos);
  *out = rd_le(u->buf + u->pos, n);
  u->pos += (size_t)n;
  return EXPSEG_OK;
}

static expseg_status step(up_t *u, bool *stop) {
  uint64_t a = 0;
  expseg_status s = EXPSEG_OK;
  size_t from = 0;
  switch (u->op) {
  case OP_PROTO:
    if ((s = arg(u, 1, &a)) != EXPSEG_OK) return s;
    if (a < 2 || a > 5) return fail(u, "pickle protocol %" PRIu64 ": accepted are 2 to 5", a);
    return EXPSEG_OK;
  case OP_FRAME:
    if ((s = arg(u, 8, &a)) != EXPSEG_OK) return s;
    if (a > u->len - u->pos)
      return fail(u, "frame of %" PRIu64 " bytes, but only %zu bytes are left", a,
                  u->len - u->pos);
    return EXPSEG_OK;
  case OP_STOP:
    if (u->nmarks) return fail(u, "STOP with %d MARK(s) still open", u->nmarks);
    if (u->sn != 1) return fail(u, "STOP with %zu values on the stack, expected 1", u->sn);
    u->pk->root = u->stack[0];
    *stop = true;
    return EXPSEG_OK;
  case OP_MARK:
    if (u->nmarks == EXPSEG_PICKLE_MAX_MARKS)
      return fail(u, "MARKs nested deeper than %d", EXPSEG_PICKLE_MAX_MARKS);
    u->marks[u->nmarks++] = u->sn;
    return EXPSEG_OK;
  case OP_MEMOIZE:
    return memo_put(u, u->memo_count);
  case OP_BINPUT:
  case OP_LONG_BINPUT:
    if ((s = arg(u, u->op == OP_BINPUT ? 1 : 4, &a)) != EXPSEG_OK) return s;
    return memo_put(u, a);
  case OP_BINGET:
  case OP_LONG_BINGET:
    if ((s = arg(u, u->op == OP_BINGET ? 1 : 4, &a)) != EXPSEG_OK) return s;
    return memo_get(u, a);
  case OP_EMPTY_DICT:
  case OP_EMPTY_LIST:
  case OP_EMPTY_TUPLE:
  case OP_NONE:
  case OP_NEWTRUE:
  case OP_NEWFALSE: {
    uint8_t k = u->op == OP_EMPTY_DICT ? EXPSEG_PV_DICT : u->op == OP_EMPTY_LIST ? EXPSEG_PV_LIST
              : u->op == OP_EMPTY_TUPLE ? EXPSEG_PV_TUPLE : u->op == OP_NONE ? EXPSEG_PV_NONE
              : EXPSEG_PV_BOOL;
    uint32_t v = new_value(u, k);
    if (!v) return oom(u);
    u->pk->v[v].u.iv = u->op == OP_NEWTRUE;
    return push(u, v) ? EXPSEG_OK : oom(u);
  }
  case OP_DICT:
  case OP_LIST:
  case OP_TUPLE:
    if ((s = pop_mark(u, &from)) != EXPSEG_OK) return s;
    return make_container(u, u->op == OP_DICT ? EXPSEG_PV_DICT : u->op == OP_LIST
                          ? EXPSEG_PV_LIST : EXPSEG_PV_TUPLE, from);
  case OP_TUPLE1:
  case OP_TUPLE2:
  case OP_TUPLE3: {
    size_t n = (size_t)(u->op - OP_TUPLE1 + 1);
    if (u->sn < n) return fail(u, "TUPLE%zu with %zu values on the stack", n, u->sn);
    if (u->nmarks && u->marks[u->nmarks - 1] > u->sn - n)
      return fail(u, "TUPLE%zu takes values from below the open MARK", n);
    return make_container(u, EXPSEG_PV_TUPLE, u->sn - n);
  }
  case OP_APPEND:
  case OP_SETITEM: {
    size_t n = u->op == OP_APPEND ? 1 : 2;
    size_t floor = u->nmarks ? u->marks[u->nmarks - 1] : 0;
    if (u->sn < floor + n + 1)
      return fail(u, "%s needs a container and %zu value(s) above the last MARK",
                  u->op == OP_APPEND ? "APPEND" : "SETITEM", n);
    return extend(u, u->sn - n, u->op == OP_APPEND ? EXPSEG_PV_LIST : EXPSEG_PV_DICT,
                  u->op == OP_APPEND ? "APPEND" : "SETITEM");
  }
  case OP_APPENDS:
  case OP_SETITEMS:
    if ((s = pop_mark(u, &from)) != EXPSEG_OK) return s;
    if (u->nmarks && from <= u->marks[u->nmarks - 1])
      return fail(u, "%s with its container below an enclosing MARK",
                  u->op == OP_APPENDS ? "APPENDS" : "SETITEMS");
    return extend(u, from, u->op == OP_APPENDS ? EXPSEG_PV_LIST : EXPSEG_PV_DICT,
                  u->op == OP_APPENDS ? "APPENDS" : "SETITEMS");
  case OP_BININT:
    if ((s = arg(u, 4, &a)) != EXPSEG_OK) return s;
    return push_int(u, (int64_t)(int32_t)(uint32_t)a, 0);
  case OP_BININT1:
  case OP_BININT2:
    if ((s = arg(u, u->op == OP_BININT1 ? 1 : 2, &a)) != EXPSEG_OK) return s;
    return push_int(u, (int64_t)a, 0);
  case OP_LONG1:
  case OP_LONG4: {
    if ((s = arg(u, u->op == OP_LONG1 ? 1 : 4, &a)) != EXPSEG_OK) return s;
    if (!need(u, a))
      return fail(u, "integer of %" PRIu64 " bytes, but only %zu bytes are left", a,
                  u->len - u->pos);
    const unsigned char *p = u->buf + u->pos;
    u->pos += a;
    return push_long(u, p, a);
  }
  case OP_BINFLOAT: {
    if ((s = arg(u, 8, &a)) != EXPSEG_OK) return s;
    uint64_t be = 0;
    for (int i = 0; i < 8; i++) be = be << 8 | ((a >> (8 * i)) & 0xff);  /* big-endian */
    uint32_t v = new_value(u, EXPSEG_PV_FLOAT);
    if (!v) return oom(u);
    memcpy(&u->pk->v[v].u.fv, &be, sizeof be);
    return push(u, v) ? EXPSEG_OK : oom(u);
  }
  case OP_SHORT_BINUNICODE:
  case OP_BINUNICODE:
  case OP_BINUNICODE8:
    if ((s = arg(u, u->op == OP_SHORT_BINUNICODE ? 1 : u->op == OP_BINUNICODE ? 4 : 8, &a)) !=
        EXPSEG_OK)
      return s;
    return push_str(u, EXPSEG_PV_STR, a);
  case OP_SHORT_BINBYTES:
  case OP_BINBYTES:
  case OP_BINBYTES8:
    if ((s = arg(u, u->op == OP_SHORT_BINBYTES ? 1 : u->op == OP_BINBYTES ? 4 : 8, &a)) !=
        EXPSEG_OK)
      return s;
    return push_str(u, EXPSEG_PV_BYTES, a);
  default:
    return fail(u, "opcode not accepted in a memory snapshot (only plain dict/list/tuple/str/"
                   "bytes/int/float/bool/None values of protocols 2-5)");
  }
}

void _expseg_pickle_free(_expseg_pickle_t *p) {
  if (!p) return;
  for (uint32_t i = 1; i < p->n; i++) {
    uint8_t k = p->v[i].kind;
    if (k == EXPSEG_PV_LIST || k == EXPSEG_PV_TUPLE || k == EXPSEG_PV_DICT)
      free(p->v[i].u.c.items);
  }
  free(p->v);
  free(p->dslot);
  _expseg_map_free(&p->dindex);
  memset(p, 0, sizeof *p);
}

static uint64_t key_hash(const char *k, size_t n) {
  uint64_t h = UINT64_C(0xcbf29ce484222325); /* FNV-1a */
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)k[i]) * UINT64_C(0x100000001b3);
  return h ^ h >> 29;
}

static bool same_key(const _expseg_pv_t *k, const char *key, size_t klen) {
  return k->kind == EXPSEG_PV_STR && k->u.s.len == klen && memcmp(k->u.s.p, key, klen) == 0;
}

/* The hash tables of the large dicts: one pass over their items, a table of at most twice
 * their string keys each (so at most 8 bytes per key, and a key costs at least 2 input
 * bytes). false: out of host memory. */
static bool index_dicts(_expseg_pickle_t *p) {
  size_t total = 0;
  for (uint32_t i = 1; i < p->n; i++) {
    const _expseg_pv_t *d = &p->v[i];
    if (d->kind != EXPSEG_PV_DICT || d->u.c.n / 2 <= EXPSEG_PICKLE_SCAN_KEYS) continue;
    size_t cap = 64;
    while (cap < (size_t)d->u.c.n) cap *= 2;  /* n = 2 x keys: at most half full */
    total += cap;
  }
  if (total == 0) return true;
  if (!(p->dslot = calloc(total, sizeof *p->dslot))) return false;
  size_t off = 0;
  for (uint32_t i = 1; i < p->n; i++) {
    const _expseg_pv_t *d = &p->v[i];
    if (d->kind != EXPSEG_PV_DICT || d->u.c.n / 2 <= EXPSEG_PICKLE_SCAN_KEYS) continue;
    size_t cap = 64;
    unsigned bits = 6;
    while (cap < (size_t)d->u.c.n) cap *= 2, bits++;
    if (!_expseg_map_put(&p->dindex, i, (uint64_t)off << 6 | bits)) return false;
    uint32_t *t = p->dslot + off;
    for (uint32_t j = 0; j < d->u.c.n / 2; j++) {
      const _expseg_pv_t *k = &p->v[d->u.c.items[2 * j]];
      if (k->kind != EXPSEG_PV_STR) continue;
      size_t h = (size_t)key_hash(k->u.s.p, k->u.s.len) & (cap - 1);
      while (t[h] && !same_key(&p->v[d->u.c.items[2 * (t[h] - 1)]], k->u.s.p, k->u.s.len))
        h = (h + 1) & (cap - 1);
      t[h] = j + 1; /* a repeated key: the later one wins, as in Python */
    }
    off += cap;
  }
  return true;
}

expseg_status _expseg_pickle_load(const char *name, const unsigned char *buf, size_t len,
                                  _expseg_pickle_t *out) {
  memset(out, 0, sizeof *out);
  up_t u;
  memset(&u, 0, sizeof u);
  u.name = name ? name : "pickle";
  u.buf = buf ? buf : (const unsigned char *)"";
  u.len = buf ? len : 0;
  u.pk = out;
  if (u.len >= (size_t)1 << 31)
    return _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: %zu bytes: snapshot pickles "
                             "above 2 GiB are not read", u.name, u.len);
  out->v = calloc(1024, sizeof *out->v);  /* index 0 stays unused: it means "no value" */
  if (!out->v) return oom(&u);
  out->cap = 1024;
  out->n = 1;
  expseg_status s = EXPSEG_OK;
  bool stop = false;
  while (!stop && s == EXPSEG_OK) {
    u.op_pos = u.pos;
    if (u.pos >= u.len) {
      u.op = 0;
      s = _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: byte %zu: truncated: the pickle "
                            "ends before its STOP opcode", u.name, u.pos);
      break;
    }
    u.op = u.buf[u.pos++];
    s = step(&u, &stop);
  }
  if (s == EXPSEG_OK && u.pos != u.len)
    s = _expseg_trace_error(EXPSEG_ERR_INVALID_ARGUMENT, "%s: byte %zu: %zu bytes after the STOP "
                          "opcode", u.name, u.pos, u.len - u.pos);
  free(u.stack);
  free(u.memo);
  _expseg_map_free(&u.memo_sparse);
  u.stack = u.memo = NULL;
  if (s == EXPSEG_OK && !index_dicts(out)) s = oom(&u);
  if (s != EXPSEG_OK) _expseg_pickle_free(out);
  return s;
}

uint32_t _expseg_pickle_dict_get(const _expseg_pickle_t *p, uint32_t dict, const char *key) {
  if (dict == 0 || dict >= p->n || p->v[dict].kind != EXPSEG_PV_DICT) return 0;
  const _expseg_pv_t *d = &p->v[dict];
  size_t klen = strlen(key);
  const uint64_t *e = d->u.c.n / 2 > EXPSEG_PICKLE_SCAN_KEYS ? _expseg_map_get(&p->dindex, dict)
                                                             : NULL;
  if (e) {
    const uint32_t *t = p->dslot + (*e >> 6);
    size_t mask = ((size_t)1 << (*e & 63)) - 1;
    for (size_t h = (size_t)key_hash(key, klen) & mask; t[h]; h = (h + 1) & mask)
      if (same_key(&p->v[d->u.c.items[2 * (t[h] - 1)]], key, klen))
        return d->u.c.items[2 * (t[h] - 1) + 1];
    return 0;
  }
  for (uint32_t i = d->u.c.n; i >= 2; i -= 2)
    if (same_key(&p->v[d->u.c.items[i - 2]], key, klen)) return d->u.c.items[i - 1];
  return 0;
}
