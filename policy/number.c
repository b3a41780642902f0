/* SPDX-License-Identifier: Apache-2.0 */
/* number.c: numbers as PyTorch's configuration parser reads them, without the C locale.
 *
 * PyTorch reads integers with std::stoull and decimals with std::stod (glibc strtod), so it
 * accepts a sign, junk after the number, hexadecimal floats, inf and nan. expseg takes the
 * same values (see docs/config.md) and reports with flags where the text left the clean form,
 * so the parser can warn and say how to write it. Everything is read by hand: a process that
 * set LC_NUMERIC to a comma locale still reads "0.5" as one half. Integer digits go through
 * base/dec.h's reader (the one of every layer); a decimal's mantissa and exponent are read
 * here, strtod's way (digits past 19 scale, exponents saturate). */
#include "dec.h"
#include "text.h"

#include <float.h>
#include <math.h>
#include <string.h>

static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }
static int hex_value(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}
static char lower(char ch) { return ch >= 'A' && ch <= 'Z' ? (char)(ch - 'A' + 'a') : ch; }
static bool prefix_ci(const char *s, const char *p) {
  for (; *p; s++, p++)
    if (lower(*s) != *p) return false;
  return true;
}

num_t _expseg_read_u64(const char *s, uint64_t *v, unsigned *flags) {
  *flags = 0;
  bool neg = false;
  if (*s == '+' || *s == '-') {
    neg = *s++ == '-';
    *flags |= NUMF_SIGN;
  }
  if (!is_digit(*s)) return NUM_NOT_NUMBER;
  uint64_t x = 0;
  if (!_expseg_dec_u64(&s, s + strlen(s), &x)) return NUM_OVERFLOW; /* base/dec.h */
  if (*s) *flags |= NUMF_JUNK;
  if (neg && x) {
    x = (uint64_t)0 - x;
    *flags |= NUMF_WRAPPED;
  }
  *v = x;
  return NUM_OK;
}

/* An exponent after p: mark (either case), an optional sign, digits (saturated); added to
 * *e. Returns the end, or p itself when no digit follows (strtod leaves "1e" at the e). */
static const char *read_exponent(const char *p, char mark, long *e) {
  if (lower(*p) != mark) return p;
  const char *q = p + 1;
  bool neg = false;
  if (*q == '+' || *q == '-') neg = *q++ == '-';
  if (!is_digit(*q)) return p;
  long x = 0;
  for (; is_digit(*q); q++)
    if (x < 100000) x = x * 10 + (*q - '0');
  *e += neg ? -x : x;
  return q;
}

/* Decimal digits [. digits] [e [+-] digits]; *end after what was read (s if nothing).
 * Up to 19 significant digits are kept and scaled in long double. */
static long double read_decimal(const char *s, const char **end, bool *nonzero) {
  static const long double p10[] = {1e0L,  1e1L,  1e2L,  1e3L,  1e4L,  1e5L,  1e6L,
                                     1e7L,  1e8L,  1e9L,  1e10L, 1e11L, 1e12L, 1e13L,
                                     1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L, 1e20L,
                                     1e21L, 1e22L, 1e23L, 1e24L, 1e25L, 1e26L, 1e27L};
  const char *p = s;
  uint64_t m = 0;
  int kept = 0, digits = 0;
  long e10 = 0;
  *nonzero = false;
  for (; is_digit(*p); p++, digits++) {
    if (*p != '0') *nonzero = true;
    if (kept < 19) {
      m = m * 10 + (uint64_t)(*p - '0');
      if (m) kept++;
    } else {
      e10++;
    }
  }
  if (*p == '.') {
    const char *q = p + 1;
    int frac = 0;
    for (; is_digit(*q); q++, frac++) {
      if (*q != '0') *nonzero = true;
      if (kept < 19) {
        m = m * 10 + (uint64_t)(*q - '0');
        if (m) kept++;
        e10--;
      }
    }
    if (digits || frac) p = q;
    digits += frac;
  }
  if (!digits) {
    *end = s;
    return 0;
  }
  p = read_exponent(p, 'e', &e10);
  *end = p;
  if (m == 0) return 0;
  long double v = (long double)m;
  if (e10 > 400) return (long double)INFINITY;
  if (e10 < -400) return 0;
  for (; e10 > 27; e10 -= 27) v *= p10[27];
  for (; e10 < -27; e10 += 27) v /= p10[27];
  return e10 >= 0 ? v * p10[e10] : v / p10[-e10];
}

/* 0x hexdigits [. hexdigits] [p [+-] digits] after the "0x"; *end after what was read;
 * *nonzero: a digit other than 0 was read; *dropped: a nonzero digit past the bits kept was. */
static long double read_hex(const char *s, const char **end, bool *nonzero, bool *dropped) {
  const char *p = s;
  uint64_t m = 0;
  long e2 = 0;
  bool any = false;
  *nonzero = *dropped = false;
  for (; hex_value(*p) >= 0; p++) {
    any = true;
    int d = hex_value(*p);
    if (d) *nonzero = true;
    if (m >> 56) {
      e2 += 4;
      *dropped |= d != 0;
    } else {
      m = m * 16 + (uint64_t)d;
    }
  }
  if (*p == '.') {
    const char *q = p + 1;
    for (; hex_value(*q) >= 0; q++) {
      any = true;
      int d = hex_value(*q);
      if (d) *nonzero = true;
      if (!(m >> 56)) {
        m = m * 16 + (uint64_t)d;
        e2 -= 4;
      } else {
        *dropped |= d != 0;
      }
    }
    p = q;
  }
  if (!any) {
    *end = s;
    return 0;
  }
  p = read_exponent(p, 'p', &e2);
  *end = p;
  if (e2 > 5000) e2 = 5000;
  if (e2 < -5000) e2 = -5000;
  return ldexpl((long double)m, (int)e2);
}

/* Whether glibc's strtod sets ERANGE (so std::stod throws) for the nonzero value x, plus a
 * nonzero tail below x's bits when `tail`. glibc (strtod_l.c, round_and_return) calls a value
 * below DBL_MIN tiny unless its 53-bit mantissa is all ones with the 54th bit set (it then
 * rounds to DBL_MIN), and sets ERANGE for a tiny value only when a bit is lost: one of the
 * mantissa's low bits shifted out to make it subnormal, or a bit below the 54th (the 54th
 * itself is not looked at). So an exact subnormal (0x1p-1074) is read without an error;
 * every decimal one is inexact. */
static bool strtod_underflows(long double x, bool tail) {
  if (x == 0) return true; /* below the smallest subnormal */
  int e;
  long double f = frexpl(fabsl(x), &e); /* x = f * 2^e, f in [0.5, 1) */
  e -= 1;                                /* x = 1.xxx * 2^e */
  if (e >= DBL_MIN_EXP - 1) return false;
  if (e < DBL_MIN_EXP - 1 - DBL_MANT_DIG) return true;
  long double scaled = ldexpl(f, 64);
  uint64_t bits = (uint64_t)scaled;
  tail |= (long double)bits != scaled;
  uint64_t mant = bits >> (64 - DBL_MANT_DIG);
  bool bit54 = (bits >> (63 - DBL_MANT_DIG)) & 1;
  tail |= (bits & ((1ull << (63 - DBL_MANT_DIG)) - 1)) != 0;
  int shift = DBL_MIN_EXP - 1 - e; /* 1 .. 53 */
  uint64_t all_ones = (1ull << DBL_MANT_DIG) - 1;
  if (shift == 1 && mant == all_ones && bit54) return false; /* rounds to DBL_MIN: not tiny */
  return (mant & ((1ull << shift) - 1)) != 0 || tail;
}

num_t _expseg_read_double(const char *s, double *v, unsigned *flags) {
  *flags = 0;
  bool neg = false;
  if (*s == '+' || *s == '-') {
    neg = *s++ == '-';
    *flags |= NUMF_SIGN;
  }
  const char *end = s;
  long double x = 0;
  bool nonzero = false, dropped = true; /* a decimal below DBL_MIN is never exact */
  if (prefix_ci(s, "inf")) {
    end = s + (prefix_ci(s, "infinity") ? 8 : 3);
    x = (long double)INFINITY;
    *flags |= NUMF_FORM;
  } else if (prefix_ci(s, "nan")) {
    end = s + 3;
    if (*end == '(') {
      const char *q = end + 1;
      while ((*q >= '0' && *q <= '9') || (lower(*q) >= 'a' && lower(*q) <= 'z') || *q == '_') q++;
      if (*q == ')') end = q + 1;
    }
    *v = NAN;
    *flags |= NUMF_FORM | (*end ? NUMF_JUNK : 0);
    return NUM_OK;
  } else if (s[0] == '0' && lower(s[1]) == 'x' &&
             (hex_value(s[2]) >= 0 || (s[2] == '.' && hex_value(s[3]) >= 0))) {
    x = read_hex(s + 2, &end, &nonzero, &dropped);
    *flags |= NUMF_FORM;
  } else {
    x = read_decimal(s, &end, &nonzero);
    if (end == s) return NUM_NOT_NUMBER;
  }
  if (*end) *flags |= NUMF_JUNK;
  double d = (double)x;
  if (!(*flags & NUMF_FORM) || nonzero) {
    if (isinf(d)) return NUM_OVERFLOW;                     /* ERANGE: too large */
    if (nonzero && strtod_underflows(x, dropped)) return NUM_OVERFLOW; /* ERANGE: tiny */
  }
  if (nonzero && fabs(d) < DBL_MIN) *flags &= ~NUMF_FORM; /* a subnormal has no other form */
  *v = neg ? -d : d;
  return NUM_OK;
}

bool _expseg_read_stream_double(const char *s, size_t n, double *v) {
  const char *p = s, *e = s + n;
  if (p < e && (*p == '+' || *p == '-')) p++;
  size_t digits = 0;
  for (; p < e && is_digit(*p); p++) digits++;
  if (p < e && *p == '.')
    for (p++; p < e && is_digit(*p); p++) digits++;
  if (!digits) return false;
  if (p < e && (*p == 'e' || *p == 'E')) {
    p++;
    if (p < e && (*p == '+' || *p == '-')) p++;
    if (p >= e || !is_digit(*p)) return false;
    while (p < e && is_digit(*p)) p++;
  }
  if (p != e) return false;
  char t[TOK_TEXT_MAX];
  if (n >= sizeof t) return false;
  memcpy(t, s, n);
  t[n] = '\0';
  bool nonzero;
  const char *end;
  const char *q = t + (t[0] == '+' || t[0] == '-');
  long double x = read_decimal(q, &end, &nonzero);
  double d = (double)x;
  if (!isfinite(d)) return false;
  *v = t[0] == '-' ? -d : d;
  return true;
}
