/* SPDX-License-Identifier: Apache-2.0 */
/* pickle_write.c: a pickle writer for snapshots (snapshot.c). Protocol 4 (PROTO 4, no
 * FRAME: framing is optional) using only opcodes that PyTorch's memory viewer's own
 * unpickler (MemoryViz.js) accepts: EMPTY_DICT, EMPTY_LIST, MARK, SETITEMS, APPENDS,
 * TUPLE2, BININT1/BININT2/BININT (integers of 32 bits), LONG1 (wider integers, two's
 * complement little-endian, at most 8 bytes: an older viewer refuses wider ones),
 * BINFLOAT, NEWTRUE/NEWFALSE, NONE, SHORT_BINUNICODE/BINUNICODE (UTF-8), LONG_BINPUT/LONG_BINGET (shared frame records) and
 * STOP. Output grows in one buffer; out of host memory sets `failed` and the caller
 * reports it. */
#include "history.h"

#include <stdlib.h>
#include <string.h>

static bool ensure(pkw_t *w, size_t more) {
  if (w->failed) return false;
  if (w->n + more <= w->cap) return true;
  size_t cap = w->cap ? w->cap : 4096;
  while (cap < w->n + more) cap *= 2;
  unsigned char *p = realloc(w->p, cap);
  if (p == NULL) {
    w->failed = true;
    return false;
  }
  w->p = p;
  w->cap = cap;
  return true;
}

static void put(pkw_t *w, const void *b, size_t n) {
  if (!ensure(w, n)) return;
  memcpy(w->p + w->n, b, n);
  w->n += n;
}

static void op(pkw_t *w, unsigned char c) { put(w, &c, 1); }

static void le(pkw_t *w, uint64_t v, size_t bytes) {
  unsigned char b[8];
  for (size_t i = 0; i < bytes; i++) b[i] = (unsigned char)(v >> (8 * i));
  put(w, b, bytes);
}

void _expseg_pkw_begin(pkw_t *w) {
  memset(w, 0, sizeof *w);
  op(w, 0x80); /* PROTO */
  op(w, 4);
}

void _expseg_pkw_end(pkw_t *w) { op(w, '.'); } /* STOP */

void _expseg_pkw_int(pkw_t *w, int64_t v) {
  if (v >= 0 && v < 256) {
    op(w, 'K'); /* BININT1 */
    le(w, (uint64_t)v, 1);
  } else if (v >= 0 && v < 65536) {
    op(w, 'M'); /* BININT2 */
    le(w, (uint64_t)v, 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    op(w, 'J'); /* BININT */
    le(w, (uint64_t)v, 4);
  } else {
    size_t n = 8; /* fewest bytes whose sign bit matches v */
    while (n > 1) {
      int64_t hi = v >> (8 * (n - 1) - 1);
      if (hi != 0 && hi != -1) break;
      n--;
    }
    op(w, 0x8a); /* LONG1 */
    op(w, (unsigned char)n);
    le(w, (uint64_t)v, n);
  }
}

void _expseg_pkw_uint(pkw_t *w, uint64_t v) {
  /* at most 8 bytes, as PyTorch writes its unsigned values (int64_t casts): the older
   * viewer refuses wider integers. Callers turn "no bound" into -1 themselves. */
  _expseg_pkw_int(w, (int64_t)v);
}

void _expseg_pkw_float(pkw_t *w, double v) {
  uint64_t bits;
  memcpy(&bits, &v, sizeof bits);
  unsigned char b[8];
  for (int i = 0; i < 8; i++) b[i] = (unsigned char)(bits >> (8 * (7 - i))); /* big-endian */
  op(w, 'G'); /* BINFLOAT */
  put(w, b, 8);
}

void _expseg_pkw_bool(pkw_t *w, bool v) { op(w, v ? 0x88 : 0x89); }
void _expseg_pkw_none(pkw_t *w) { op(w, 'N'); }

/* Length of the valid UTF-8 sequence at s (1..4), or 0. */
static size_t utf8_len(const unsigned char *s, size_t left) {
  unsigned char c = s[0];
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || n > left) return 0;
  for (size_t i = 1; i < n; i++)
    if ((s[i] & 0xc0) != 0x80) return 0;
  if (n == 2 && c < 0xc2) return 0;                                /* overlong */
  if (n == 3) {
    unsigned cp = ((c & 15u) << 12) | ((s[1] & 63u) << 6) | (s[2] & 63u);
    if (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)) return 0;     /* overlong, surrogate */
  }
  if (n == 4) {
    unsigned cp = ((c & 7u) << 18) | ((s[1] & 63u) << 12) | ((s[2] & 63u) << 6) | (s[3] & 63u);
    if (cp < 0x10000 || cp > 0x10ffff) return 0;
  }
  return n;
}

void _expseg_pkw_str(pkw_t *w, const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  size_t len = strlen(s), out = 0;
  for (size_t i = 0; i < len;) { /* length once invalid bytes become U+FFFD (3 bytes) */
    size_t k = utf8_len(u + i, len - i);
    out += k ? k : 3;
    i += k ? k : 1;
  }
  if (out < 256) {
    op(w, 0x8c); /* SHORT_BINUNICODE */
    op(w, (unsigned char)out);
  } else {
    op(w, 'X'); /* BINUNICODE */
    le(w, out, 4);
  }
  if (out == len) {
    put(w, s, len);
    return;
  }
  static const unsigned char repl[3] = {0xef, 0xbf, 0xbd};
  for (size_t i = 0; i < len;) {
    size_t k = utf8_len(u + i, len - i);
    if (k) put(w, u + i, k);
    else put(w, repl, 3);
    i += k ? k : 1;
  }
}

void _expseg_pkw_dict(pkw_t *w) {
  op(w, '}'); /* EMPTY_DICT */
  op(w, '('); /* MARK */
}
void _expseg_pkw_setitems(pkw_t *w) { op(w, 'u'); }
void _expseg_pkw_list(pkw_t *w) {
  op(w, ']'); /* EMPTY_LIST */
  op(w, '(');
}
void _expseg_pkw_appends(pkw_t *w) { op(w, 'e'); }
void _expseg_pkw_tuple2(pkw_t *w) { op(w, 0x86); }

uint32_t _expseg_pkw_memoize(pkw_t *w) {
  op(w, 'r'); /* LONG_BINPUT */
  le(w, w->memo, 4);
  return w->memo++;
}

void _expseg_pkw_get(pkw_t *w, uint32_t index) {
  op(w, 'j'); /* LONG_BINGET */
  le(w, index, 4);
}

void _expseg_pkw_kint(pkw_t *w, const char *key, int64_t v) {
  _expseg_pkw_str(w, key);
  _expseg_pkw_int(w, v);
}
void _expseg_pkw_kuint(pkw_t *w, const char *key, uint64_t v) {
  _expseg_pkw_str(w, key);
  _expseg_pkw_uint(w, v);
}
void _expseg_pkw_kstr(pkw_t *w, const char *key, const char *v) {
  _expseg_pkw_str(w, key);
  _expseg_pkw_str(w, v);
}
void _expseg_pkw_kbool(pkw_t *w, const char *key, bool v) {
  _expseg_pkw_str(w, key);
  _expseg_pkw_bool(w, v);
}
