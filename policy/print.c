/* SPDX-License-Identifier: Apache-2.0 */
/* print.c: the canonical printer, the no-effect report and the output buffer they write
 * with (snprintf semantics: the length wanted is returned even when the buffer is short).
 *
 * The canonical string names every key in table order with its canonical spelling (no
 * aliases, no whitespace) and parses back to the same configuration: it is the clean form
 * that expseg_config_string and the parser's warnings show. Values that no option text can
 * express (an "off" default outside the accepted range, SIZE_MAX = "unlimited" defaults) are
 * left out; parsed over the defaults the string gives the same configuration. */
#include "dec.h"
#include "text.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

void _expseg_out_raw(out_t *o, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++, o->pos++)
    if (o->pos + 1 < o->len) o->buf[o->pos] = s[i];
}
void _expseg_out_str(out_t *o, const char *s) { _expseg_out_raw(o, s, strlen(s)); }
void _expseg_out_u64(out_t *o, uint64_t v) {
  char t[24];
  int n = 0;
  do t[sizeof t - 1 - n++] = (char)('0' + v % 10);
  while (v /= 10);
  _expseg_out_raw(o, t + sizeof t - n, (size_t)n);
}
size_t _expseg_out_end(out_t *o) {
  if (o->len) o->buf[o->pos < o->len ? o->pos : o->len - 1] = '\0';
  return o->pos;
}

static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }

void _expseg_out_double(out_t *o, double x) {
  if (!(x == x) || x < 0 || x > 1e300) { /* not a valid config value; print something */
    char t[40];
    snprintf(t, sizeof t, "%g", x);
    _expseg_out_str(o, t);
    return;
  }
  if (x == 0) {
    _expseg_out_str(o, "0");
    return;
  }
  char best[64] = "";
  for (int prec = 0; prec <= 16; prec++) {
    char t[48], d[24];
    snprintf(t, sizeof t, "%.*e", prec, x);
    /* the digits before 'e' (whatever the decimal point is), then the exponent */
    int nd = 0;
    const char *p = t;
    for (; *p && *p != 'e'; p++)
      if (is_digit(*p) && nd < 20) d[nd++] = *p;
    long ex = 0;
    bool neg = false;
    if (*p == 'e') p++;
    if (*p == '+' || *p == '-') neg = *p++ == '-';
    uint64_t e = 0;
    (void)_expseg_dec_u64(&p, p + strlen(p), &e); /* the exponent snprintf wrote */
    ex = neg ? -(long)e : (long)e;
    while (nd > 1 && d[nd - 1] == '0') nd--;
    d[nd] = '\0';
    /* value = d[0].d[1..] x 10^ex */
    char s[64];
    size_t k = 0;
    if (ex < -5 || ex >= 17) {
      s[k++] = d[0];
      if (nd > 1) {
        s[k++] = '.';
        for (int i = 1; i < nd; i++) s[k++] = d[i];
      }
      k += (size_t)snprintf(s + k, sizeof s - k, "e%ld", ex);
    } else if (ex < 0) {
      s[k++] = '0';
      s[k++] = '.';
      for (long i = 0; i < -ex - 1; i++) s[k++] = '0';
      for (int i = 0; i < nd; i++) s[k++] = d[i];
      s[k] = '\0';
    } else {
      for (long i = 0; i <= ex; i++) s[k++] = i < nd ? d[i] : '0';
      if (nd > ex + 1) {
        s[k++] = '.';
        for (int i = (int)ex + 1; i < nd; i++) s[k++] = d[i];
      }
      s[k] = '\0';
    }
    memcpy(best, s, k + 1);
    double back;
    unsigned fl;
    if (_expseg_read_double(s, &back, &fl) == NUM_OK && fl == 0 && back == x) break;
  }
  _expseg_out_str(o, best);
}

void _expseg_out_stod(out_t *o, double x) {
  if (x > 0 && x < DBL_MIN) { /* subnormal: every decimal is ERANGE to strtod, the exact hex not */
    char t[40];
    snprintf(t, sizeof t, "0x%llxp-1074", (unsigned long long)ldexp(x, 1074));
    _expseg_out_str(o, t);
    return;
  }
  _expseg_out_double(o, x);
}

static bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

/* `N` when every interval holds the same power of two; else a list in PyTorch's rules: the
 * first entry fills every interval below it, '>' every interval after the last entry. */
static void print_divisions(out_t *o, const uint64_t *d) {
  const int n = EXPSEG_ROUNDUP_INTERVALS;
  int k = 0; /* end of the first run */
  while (k + 1 < n && d[k + 1] == d[0]) k++;
  if (k == n - 1 && is_pow2(d[0])) {
    _expseg_out_u64(o, d[0]);
    return;
  }
  int j = n - 1; /* start of the last run */
  while (j > 0 && d[j - 1] == d[n - 1]) j--;
  _expseg_out_str(o, "[");
  if (k == n - 1) { /* one run of 0: '>' first fills intervals 1..15, 0 was reset to 0 */
    _expseg_out_str(o, ">:");
    _expseg_out_u64(o, d[0]);
    _expseg_out_str(o, "]");
    return;
  }
  _expseg_out_u64(o, (uint64_t)1 << k);
  _expseg_out_str(o, ":");
  _expseg_out_u64(o, d[k]);
  for (int i = k + 1; i < j; i++) {
    _expseg_out_str(o, ",");
    _expseg_out_u64(o, (uint64_t)1 << i);
    _expseg_out_str(o, ":");
    _expseg_out_u64(o, d[i]);
  }
  _expseg_out_str(o, ",>:");
  _expseg_out_u64(o, d[j]);
  _expseg_out_str(o, "]");
}

/* False when the value cannot be written. */
static bool printable(const option_t *o, const expseg_config_t *c) {
  switch (o->kind) {
  case K_MB: {
    size_t b = FIELD(c, o, size_t);
    /* 0 below the range is an "off" default (pinned_reserve_segment_size_mb); other values
     * below it are max_split / max_non_split over a small large_segment_size_mb */
    return b != SIZE_MAX && (b / MiB >= o->ilo || b != 0);
  }
  case K_DOUBLE_OPEN: {
    double d = FIELD(c, o, double);
    return d > o->dlo && d < o->dhi;
  }
  case K_RESERVE: return c->expandable_segments_reserve > 0;
  case K_RESERVE_CLASSES: return true;
  default: return true;
  }
}

size_t _expseg_config_print_keys(const expseg_config_t *c, uint64_t mask, char *buf, size_t len) {
  out_t o = {buf, len, 0};
  bool any = false;
  for (int i = 0; i < EXPSEG_OPT_COUNT; i++) {
    const option_t *op = &_expseg_option_table[i];
    if (!(mask >> i & 1) || !printable(op, c)) continue;
    if (any) _expseg_out_str(&o, ",");
    any = true;
    _expseg_out_str(&o, op->key);
    _expseg_out_str(&o, ":");
    switch (op->kind) {
    case K_BOOL: _expseg_out_str(&o, FIELD(c, op, bool) ? "True" : "False"); break;
    case K_MB: _expseg_out_u64(&o, FIELD(c, op, size_t) / MiB); break;
    case K_DOUBLE:
    case K_DOUBLE_OPEN: _expseg_out_stod(&o, FIELD(c, op, double)); break;
    case K_UINT:
    case K_POW2: _expseg_out_u64(&o, FIELD(c, op, uint32_t)); break;
    case K_DIVISIONS: print_divisions(&o, c->roundup_power2_divisions); break;
    case K_BACKEND: _expseg_out_str(&o, "native"); break;
    case K_RESERVE:
      _expseg_out_double(&o, c->expandable_segments_reserve);
      if (c->expandable_segments_reserve_gib) _expseg_out_str(&o, "G");
      break;
    case K_RESERVE_CLASSES:
      _expseg_out_str(&o, "[");
      _expseg_out_str(&o, c->expandable_segments_reserve_by_class);
      _expseg_out_str(&o, "]");
      break;
    }
  }
  return _expseg_out_end(&o);
}

size_t _expseg_config_print(const expseg_config_t *c, char *buf, size_t len) {
  return _expseg_config_print_keys(c, UINT64_MAX, buf, len);
}

/* Is option i at its default in c (compared through its printed form)? */
static bool at_default(const expseg_config_t *c, int i) {
  expseg_config_t d;
  _expseg_config_defaults(&d);
  char x[512], y[512];
  size_t nx = _expseg_config_print_keys(c, (uint64_t)1 << i, x, sizeof x);
  size_t ny = _expseg_config_print_keys(&d, (uint64_t)1 << i, y, sizeof y);
  return nx == ny && nx < sizeof x && strcmp(x, y) == 0;
}

size_t _expseg_config_no_effect(const expseg_config_t *c, char *buf, size_t len) {
  out_t o = {buf, len, 0};
  bool any = false;
  for (int i = 0; i < EXPSEG_OPT_COUNT; i++) {
    /* named when given with a value other than its default (the canonical form, which
     * writes every key, parses back without this warning) */
    if (_expseg_option_table[i].pytorch != 2 || !(c->given & ((uint64_t)1 << i))) continue;
    if (at_default(c, i)) continue;
    _expseg_out_str(&o, any ? ", " : "accepted for PyTorch compatibility, but without effect in expseg: ");
    _expseg_out_str(&o, _expseg_option_table[i].key);
    any = true;
  }
  return _expseg_out_end(&o);
}
