/* parse.c: the option table, the defaults, the config parser and the canonical printer.
 *
 * Everything here is generated from policy/options.def: one descriptor per row (key, alias,
 * kind, field offset, default, range), and the parser dispatches on the descriptor's kind to
 * one typed, range-checked handler per kind. No other list of option names exists.
 *
 * The parser is pure: it reads only its arguments, writes only *out and err, keeps no
 * globals, never allocates, and does not use the locale (numbers are read and written by
 * hand, so a process that set LC_NUMERIC to a comma locale still parses "0.5").
 * Grammar (PyTorch's, see docs/config.md):
 *   config := [ pair (',' pair)* ]      pair := key ':' value
 *   value  := word | '[' item (',' item)* ']'       item := word ':' word
 * Whitespace anywhere is dropped (as PyTorch's tokenizer does). A key given twice: the last
 * one wins (PyTorch's behaviour; scripts append overrides to an existing variable). Any error
 * leaves *out untouched. */
#include "policy.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MiB ((size_t)1 << 20)
#define MB_CEIL (SIZE_MAX / MiB) /* an MB value at or above this means SIZE_MAX bytes */
#define DIV_MAX ((uint64_t)1 << 30) /* largest division count (PyTorch reads it with stoi) */
#define TOK_MAX 96                  /* longest word kept; longer ones are an error */

/* ---- the table ---- */

typedef enum kind_e { K_BOOL, K_MB, K_DOUBLE, K_DOUBLE_OPEN, K_UINT, K_POW2, K_DIVISIONS, K_BACKEND } kind_t;

typedef struct option_s {
  const char *key, *alias;
  kind_t kind;
  size_t offset;    /* of the field in expseg_config_t */
  uint64_t ilo, ihi; /* integer kinds: accepted range (MB for K_MB) */
  double dlo, dhi;   /* double kinds */
  int pytorch;      /* 0 expseg's own, 1 PyTorch key, 2 PyTorch key without effect here */
} option_t;

/* Each field must have the type its kind stores (checked at compile time). */
#define FIELD_IS_BOOL(f) _Generic((f), bool: 1, default: 0)
#define FIELD_IS_MB(f) _Generic((f), size_t: 1, default: 0)
#define FIELD_IS_DOUBLE(f) _Generic((f), double: 1, default: 0)
#define FIELD_IS_DOUBLE_OPEN(f) _Generic((f), double: 1, default: 0)
#define FIELD_IS_UINT(f) _Generic((f), uint32_t: 1, default: 0)
#define FIELD_IS_POW2(f) _Generic((f), uint32_t: 1, default: 0)
#define FIELD_IS_DIVISIONS(f) _Generic((f), uint32_t *: 1, default: 0)
#define FIELD_IS_BACKEND(f) _Generic((f), int: 1, default: 0)
#define EXPSEG_OPTION(key, alias, kind, field, def, lo, hi, pt, help)                        \
  _Static_assert(FIELD_IS_##kind(((expseg_config_t *)0)->field),                             \
                 "options.def: field " #field " has the wrong type for kind " #kind);
#include "options.def"
#undef EXPSEG_OPTION

static const option_t options[EXPSEG_OPT_COUNT] = {
#define EXPSEG_OPTION(key, alias, kind, field, def, lo, hi, pt, help)                        \
  {#key, alias, K_##kind, offsetof(expseg_config_t, field), (uint64_t)(lo), (uint64_t)(hi),   \
   (double)(lo), (double)(hi), pt},
#include "options.def"
#undef EXPSEG_OPTION
};

const expseg_option_info_t _expseg_options[EXPSEG_OPT_COUNT] = {
#define EXPSEG_OPTION(key, alias, kind, field, def, lo, hi, pt, help) {#key, alias, #kind, help, pt != 0},
#include "options.def"
#undef EXPSEG_OPTION
};

#define DEF_BOOL(f, v) (f) = ((v) != 0)
#define DEF_MB(f, v) (f) = (size_t)(v)
#define DEF_DOUBLE(f, v) (f) = (double)(v)
#define DEF_DOUBLE_OPEN(f, v) (f) = (double)(v)
#define DEF_UINT(f, v) (f) = (uint32_t)(v)
#define DEF_POW2(f, v) (f) = (uint32_t)(v)
#define DEF_DIVISIONS(f, v)                                                                   \
  for (int i_ = 0; i_ < EXPSEG_ROUNDUP_INTERVALS; i_++) (f)[i_] = (uint32_t)(v)
#define DEF_BACKEND(f, v) (f) = (int)(v)

void _expseg_config_defaults(expseg_config_t *c) {
  memset(c, 0, sizeof *c);
#define EXPSEG_OPTION(key, alias, kind, field, def, lo, hi, pt, help) DEF_##kind(c->field, def);
#include "options.def"
#undef EXPSEG_OPTION
  c->given = 0;
}

/* ---- small helpers (locale-free) ---- */

static bool is_space(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}
static bool is_sep(char ch) { return ch == ',' || ch == ':' || ch == '[' || ch == ']'; }
static bool is_digit(char ch) { return ch >= '0' && ch <= '9'; }
static bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
static unsigned log2_floor(uint64_t v) {
  unsigned r = 0;
  while (v >>= 1) r++;
  return r;
}

typedef enum num_e { NUM_OK, NUM_NOT_NUMBER, NUM_SIGN, NUM_OVERFLOW } num_t;

/* Digits only: no sign, no spaces, no suffix, no hex; overflow is an error. */
static num_t parse_u64(const char *s, uint64_t *out) {
  if (*s == '+' || *s == '-') return NUM_SIGN;
  if (!*s) return NUM_NOT_NUMBER;
  uint64_t v = 0;
  for (; *s; s++) {
    if (!is_digit(*s)) return NUM_NOT_NUMBER;
    unsigned d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) {
      for (s++; *s; s++)
        if (!is_digit(*s)) return NUM_NOT_NUMBER;
      return NUM_OVERFLOW;
    }
    v = v * 10 + d;
  }
  *out = v;
  return NUM_OK;
}

/* Decimal number: digits [. digits] [e [+-] digits], at least one mantissa digit; no sign,
 * no inf/nan/hex. Up to 19 significant digits are kept and scaled in long double, which
 * reads back every string the printer writes exactly. */
static num_t parse_decimal(const char *s, double *out) {
  static const long double p10[] = {1e0L,  1e1L,  1e2L,  1e3L,  1e4L,  1e5L,  1e6L,
                                     1e7L,  1e8L,  1e9L,  1e10L, 1e11L, 1e12L, 1e13L,
                                     1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L, 1e20L,
                                     1e21L, 1e22L, 1e23L, 1e24L, 1e25L, 1e26L, 1e27L};
  if (*s == '+' || *s == '-') return NUM_SIGN;
  uint64_t m = 0;
  int kept = 0, digits = 0;
  long e10 = 0;
  for (; is_digit(*s); s++, digits++) {
    if (kept < 19) {
      m = m * 10 + (uint64_t)(*s - '0');
      if (m) kept++;
    } else {
      e10++;
    }
  }
  if (*s == '.') {
    for (s++; is_digit(*s); s++, digits++) {
      if (kept < 19) {
        m = m * 10 + (uint64_t)(*s - '0');
        if (m) kept++;
        e10--;
      }
    }
  }
  if (!digits) return NUM_NOT_NUMBER;
  if (*s == 'e' || *s == 'E') {
    s++;
    bool neg = false;
    if (*s == '+' || *s == '-') neg = *s++ == '-';
    if (!is_digit(*s)) return NUM_NOT_NUMBER;
    long x = 0;
    for (; is_digit(*s); s++)
      if (x < 100000) x = x * 10 + (*s - '0');
    e10 += neg ? -x : x;
  }
  if (*s) return NUM_NOT_NUMBER;
  long double v = (long double)m;
  if (m == 0) {
    v = 0;
  } else if (e10 > 400) {
    return NUM_OVERFLOW;
  } else if (e10 < -400) {
    v = 0;
  } else {
    for (; e10 > 27; e10 -= 27) v *= p10[27];
    for (; e10 < -27; e10 += 27) v /= p10[27];
    v = e10 >= 0 ? v * p10[e10] : v / p10[-e10];
  }
  *out = (double)v;
  return NUM_OK;
}

/* ---- output buffer with snprintf semantics ---- */

typedef struct out_s {
  char *buf;
  size_t len, pos; /* pos counts every byte wanted, even past len */
} out_t;

static void out_raw(out_t *o, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++, o->pos++)
    if (o->pos + 1 < o->len) o->buf[o->pos] = s[i];
}
static void out_str(out_t *o, const char *s) { out_raw(o, s, strlen(s)); }
static void out_u64(out_t *o, uint64_t v) {
  char t[24];
  int n = 0;
  do t[sizeof t - 1 - n++] = (char)('0' + v % 10);
  while (v /= 10);
  out_raw(o, t + sizeof t - n, (size_t)n);
}
static size_t out_end(out_t *o) {
  if (o->len) o->buf[o->pos < o->len ? o->pos : o->len - 1] = '\0';
  return o->pos;
}

/* Shortest decimal (at most 17 significant digits) that parse_decimal reads back as x. */
static void out_double(out_t *o, double x) {
  if (!(x == x) || x < 0 || x > 1e300) { /* not a valid config value; print something */
    char t[40];
    snprintf(t, sizeof t, "%g", x);
    out_str(o, t);
    return;
  }
  if (x == 0) {
    out_str(o, "0");
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
    for (; is_digit(*p); p++) ex = ex * 10 + (*p - '0');
    if (neg) ex = -ex;
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
    if (parse_decimal(s, &back) == NUM_OK && back == x) break;
  }
  out_str(o, best);
}

/* ---- tokenizer ---- */

typedef enum tt_e { T_END, T_WORD, T_COMMA, T_COLON, T_OPEN, T_CLOSE } tt_t;

typedef struct tok_s {
  tt_t type;
  size_t at;        /* byte offset of the token's first character */
  char w[TOK_MAX];  /* the word without whitespace (T_WORD) */
  size_t n;         /* its length (may exceed TOK_MAX - 1: then w is cut) */
} tok_t;

typedef struct parser_s {
  const char *text;
  size_t pos;
  const char *source;
  char *err;
  size_t errlen;
  const char *key; /* the key being parsed, as written */
} parser_t;

static void next(parser_t *p, tok_t *t) {
  const char *s = p->text;
  while (s[p->pos] && is_space(s[p->pos])) p->pos++;
  t->at = p->pos;
  t->n = 0;
  t->w[0] = '\0';
  char ch = s[p->pos];
  if (!ch) {
    t->type = T_END;
    return;
  }
  if (is_sep(ch)) {
    p->pos++;
    t->type = ch == ',' ? T_COMMA : ch == ':' ? T_COLON : ch == '[' ? T_OPEN : T_CLOSE;
    t->w[0] = ch;
    t->w[1] = '\0';
    return;
  }
  t->type = T_WORD;
  for (; s[p->pos] && !is_sep(s[p->pos]); p->pos++) {
    if (is_space(s[p->pos])) continue;
    if (t->n < TOK_MAX - 1) t->w[t->n] = s[p->pos];
    t->n++;
  }
  t->w[t->n < TOK_MAX - 1 ? t->n : TOK_MAX - 1] = '\0';
}

/* The token as shown in a message: quoted, non-printable bytes escaped, long ones cut. */
static const char *shown(const tok_t *t, char q[TOK_MAX * 4 + 8]) {
  size_t k = 0;
  q[k++] = '\'';
  for (const char *s = t->w; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch >= 0x20 && ch < 0x7f && ch != '\'' && ch != '\\') {
      q[k++] = (char)ch;
    } else {
      static const char hex[] = "0123456789abcdef";
      q[k++] = '\\';
      q[k++] = 'x';
      q[k++] = hex[ch >> 4];
      q[k++] = hex[ch & 15];
    }
  }
  if (t->n >= TOK_MAX) {
    memcpy(q + k, "...", 3);
    k += 3;
  }
  q[k++] = '\'';
  q[k] = '\0';
  return q;
}

/* One error line: "<source>: position <n>: <what>". Always returns EXPSEG_ERR_CONFIG. */
static expseg_status fail(parser_t *p, size_t at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static expseg_status fail(parser_t *p, size_t at, const char *fmt, ...) {
  if (p->err && p->errlen) {
    int n = snprintf(p->err, p->errlen, "%s: position %zu: ", p->source ? p->source : "config",
                     at + 1);
    if (n >= 0 && (size_t)n < p->errlen) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
      va_end(ap);
    }
  }
  return EXPSEG_ERR_CONFIG;
}

/* What an option accepts, for messages. */
static void accepted(const option_t *o, char *buf, size_t len) {
  switch (o->kind) {
  case K_BOOL: snprintf(buf, len, "True or False (exactly; case-sensitive)"); break;
  case K_MB:
    if (o->ihi == MB_CEIL)
      snprintf(buf, len,
               "an integer number of MB >= %llu (values of %llu and above mean unlimited)",
               (unsigned long long)o->ilo, (unsigned long long)MB_CEIL);
    else
      snprintf(buf, len, "an integer number of MB in [%llu, %llu]",
               (unsigned long long)o->ilo, (unsigned long long)o->ihi);
    break;
  case K_DOUBLE:
    snprintf(buf, len, "a decimal number in [%g, %g], such as 0.5", o->dlo, o->dhi);
    break;
  case K_DOUBLE_OPEN:
    snprintf(buf, len, "a decimal number in (%g, %g), both ends excluded, such as 0.8", o->dlo,
             o->dhi);
    break;
  case K_UINT:
    snprintf(buf, len, "an integer in [%llu, %llu]", (unsigned long long)o->ilo,
             (unsigned long long)o->ihi);
    break;
  case K_POW2:
    snprintf(buf, len, "a power of two in [%llu, %llu]", (unsigned long long)o->ilo,
             (unsigned long long)o->ihi);
    break;
  case K_DIVISIONS:
    snprintf(buf, len,
             "a power of two N in [1, %llu] (1 = no rounding), or a list [K:N,...,>:N] with K "
             "a power of two in MB and N a power of two or 0",
             (unsigned long long)DIV_MAX);
    break;
  case K_BACKEND: snprintf(buf, len, "native (expseg implements the native allocator only)"); break;
  }
}

static const char *num_problem(num_t r) {
  return r == NUM_SIGN ? "has a sign" : r == NUM_OVERFLOW ? "is too large" : "is not a number";
}

/* Edit distance, for "did you mean"; SIZE_MAX once it is certainly above 3. */
static size_t distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la >= TOK_MAX || lb >= TOK_MAX) return SIZE_MAX;
  if (la > lb + 3 || lb > la + 3) return SIZE_MAX; /* too far to suggest anyway */
  size_t row[TOK_MAX];
  for (size_t j = 0; j <= lb; j++) row[j] = j;
  for (size_t i = 1; i <= la; i++) {
    size_t diag = row[0], low = i;
    row[0] = i;
    for (size_t j = 1; j <= lb; j++) {
      size_t up = row[j];
      size_t best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      if (best < low) low = best;
      diag = up;
    }
    if (low > 3) return SIZE_MAX; /* the distance only grows from here */
  }
  return row[lb];
}

static expseg_status unknown_key(parser_t *p, const tok_t *t) {
  char q[TOK_MAX * 4 + 8], keys[700];
  out_t o = {keys, sizeof keys, 0};
  const char *near = NULL;
  size_t best = SIZE_MAX;
  for (int i = 0; i < EXPSEG_OPT_COUNT; i++) {
    if (i) out_str(&o, ", ");
    out_str(&o, options[i].key);
    size_t d = distance(t->w, options[i].key);
    if (d < best) best = d, near = options[i].key;
    if (options[i].alias) {
      out_str(&o, ", ");
      out_str(&o, options[i].alias);
      d = distance(t->w, options[i].alias);
      if (d < best) best = d, near = options[i].alias;
    }
  }
  out_end(&o);
  if (near && best <= 3)
    return fail(p, t->at, "unknown key %s (did you mean '%s'?); accepted keys: %s", shown(t, q),
                near, keys);
  return fail(p, t->at, "unknown key %s; accepted keys: %s", shown(t, q), keys);
}

/* ---- typed handlers ---- */

#define FIELD(c, o, type) (*(type *)(void *)((char *)(c) + (o)->offset))

/* The key is named as written (the HIP alias stays the HIP alias). */
static expseg_status bad_value(parser_t *p, const option_t *o, const tok_t *v,
                               const char *problem) {
  char q[TOK_MAX * 4 + 8], acc[256];
  accepted(o, acc, sizeof acc);
  return fail(p, v->at, "%s value %s %s; accepted: %s", p->key ? p->key : o->key, shown(v, q),
              problem, acc);
}

static expseg_status word_value(parser_t *p, const option_t *o, const tok_t *v,
                                expseg_config_t *c) {
  uint64_t u;
  double d;
  num_t r;
  if (v->n >= TOK_MAX) return bad_value(p, o, v, "is too long");
  switch (o->kind) {
  case K_BOOL:
    if (strcmp(v->w, "True") && strcmp(v->w, "False"))
      return bad_value(p, o, v, "is not a boolean");
    FIELD(c, o, bool) = v->w[0] == 'T';
    return EXPSEG_OK;
  case K_MB:
    if ((r = parse_u64(v->w, &u)) != NUM_OK) return bad_value(p, o, v, num_problem(r));
    if (u < o->ilo) return bad_value(p, o, v, "is too small");
    if (o->ihi == MB_CEIL && u >= MB_CEIL) {
      FIELD(c, o, size_t) = SIZE_MAX;
      return EXPSEG_OK;
    }
    if (u > o->ihi) return bad_value(p, o, v, "is too large");
    FIELD(c, o, size_t) = (size_t)u * MiB;
    return EXPSEG_OK;
  case K_DOUBLE:
  case K_DOUBLE_OPEN:
    if ((r = parse_decimal(v->w, &d)) != NUM_OK) return bad_value(p, o, v, num_problem(r));
    if (o->kind == K_DOUBLE ? (d < o->dlo || d > o->dhi) : (d <= o->dlo || d >= o->dhi))
      return bad_value(p, o, v, "is out of range");
    FIELD(c, o, double) = d;
    return EXPSEG_OK;
  case K_UINT:
  case K_POW2:
    if ((r = parse_u64(v->w, &u)) != NUM_OK) return bad_value(p, o, v, num_problem(r));
    if (o->kind == K_POW2 && !is_pow2(u)) return bad_value(p, o, v, "is not a power of two");
    if (u < o->ilo || u > o->ihi) return bad_value(p, o, v, "is out of range");
    FIELD(c, o, uint32_t) = (uint32_t)u;
    return EXPSEG_OK;
  case K_DIVISIONS:
    if ((r = parse_u64(v->w, &u)) != NUM_OK) return bad_value(p, o, v, num_problem(r));
    if (u == 0) return bad_value(p, o, v, "is 0 (the single-number form needs a power of two; 1 = no rounding)");
    if (!is_pow2(u)) return bad_value(p, o, v, "is not a power of two");
    if (u > DIV_MAX) return bad_value(p, o, v, "is too large");
    for (int i = 0; i < EXPSEG_ROUNDUP_INTERVALS; i++) c->roundup_power2_divisions[i] = (uint32_t)u;
    return EXPSEG_OK;
  case K_BACKEND:
    if (!strcmp(v->w, "native")) {
      FIELD(c, o, int) = 0;
      return EXPSEG_OK;
    }
    if (!strcmp(v->w, "cudaMallocAsync") || !strcmp(v->w, "hipMallocAsync"))
      return bad_value(p, o, v,
                       "is not available: expseg implements PyTorch's native caching allocator "
                       "only (remove the key; cudaMallocAsync is PyTorch's other backend)");
    return bad_value(p, o, v, "is unknown");
  }
  return bad_value(p, o, v, "is not accepted");
}

/* roundup_power2_divisions list form, after '['. Entries apply in order: K (MB, a power of
 * two) sets interval log2(K) (clamped to 15), the first one also every interval below it;
 * '>' sets every interval after the last explicit one (every interval if none came before)
 * and must be the last entry. Intervals not reached stay 0. */
static expseg_status divisions_list(parser_t *p, const option_t *o, const tok_t *open,
                                    expseg_config_t *c) {
  uint32_t div[EXPSEG_ROUNDUP_INTERVALS] = {0};
  bool first = true, closed_by_gt = false;
  int last = -1;
  char q[TOK_MAX * 4 + 8], q2[TOK_MAX * 4 + 8], acc[256];
  accepted(o, acc, sizeof acc);
  tok_t k, t, v;
  next(p, &k);
  if (k.type == T_CLOSE)
    return fail(p, k.at, "%s: empty list '[]'; accepted: %s", o->key, acc);
  for (;;) {
    if (k.type != T_WORD)
      return fail(p, k.at, "%s: malformed list: expected an entry K:N but found %s; accepted: %s",
                  o->key, k.type == T_END ? "the end of the text" : shown(&k, q), acc);
    if (closed_by_gt)
      return fail(p, k.at, "%s: list entry %s after '>:N'; '>' must be the last entry", o->key,
                  shown(&k, q));
    next(p, &t);
    if (t.type != T_COLON)
      return fail(p, t.at, "%s: malformed list: entry %s has no ':N'; accepted: %s", o->key,
                  shown(&k, q), acc);
    next(p, &v);
    if (v.type != T_WORD)
      return fail(p, v.at, "%s: malformed list: entry %s has no value N; accepted: %s", o->key,
                  shown(&k, q), acc);
    uint64_t n, kmb;
    num_t r = v.n >= TOK_MAX ? NUM_OVERFLOW : parse_u64(v.w, &n);
    if (r != NUM_OK) return bad_value(p, o, &v, num_problem(r));
    if (n != 0 && !is_pow2(n)) return bad_value(p, o, &v, "is not a power of two or 0");
    if (n > DIV_MAX) return bad_value(p, o, &v, "is too large");
    if (!strcmp(k.w, ">")) {
      for (int i = last + 1; i < EXPSEG_ROUNDUP_INTERVALS; i++) div[i] = (uint32_t)n;
      closed_by_gt = true;
    } else {
      r = k.n >= TOK_MAX ? NUM_OVERFLOW : parse_u64(k.w, &kmb);
      if (r != NUM_OK) return bad_value(p, o, &k, num_problem(r));
      if (!is_pow2(kmb)) return bad_value(p, o, &k, "is not a power of two (interval K in MB)");
      unsigned idx = log2_floor(kmb);
      if (idx >= EXPSEG_ROUNDUP_INTERVALS) idx = EXPSEG_ROUNDUP_INTERVALS - 1;
      if (first)
        for (unsigned i = 0; i < idx; i++) div[i] = (uint32_t)n;
      first = false;
      div[idx] = (uint32_t)n;
      last = (int)idx;
    }
    next(p, &t);
    if (t.type == T_CLOSE) break;
    if (t.type != T_COMMA)
      return fail(p, t.at, "%s: malformed list: expected ',' or ']' after entry %s but found %s",
                  o->key, shown(&k, q), t.type == T_END ? "the end of the text" : shown(&t, q2));
    next(p, &k);
    if (k.type == T_CLOSE)
      return fail(p, t.at, "%s: malformed list: trailing ',' before ']'; accepted: %s", o->key,
                  acc);
  }
  (void)open;
  memcpy(c->roundup_power2_divisions, div, sizeof div);
  return EXPSEG_OK;
}

static const option_t *find_option(const char *w) {
  for (int i = 0; i < EXPSEG_OPT_COUNT; i++)
    if (!strcmp(w, options[i].key) || (options[i].alias && !strcmp(w, options[i].alias)))
      return &options[i];
  return NULL;
}

expseg_status _expseg_config_parse(const char *text, const char *source,
                                   const expseg_config_t *base, expseg_config_t *out,
                                   char *err, size_t errlen) {
  parser_t p = {text ? text : "", 0, source, err, errlen, NULL};
  expseg_config_t c;
  if (base)
    c = *base;
  else
    _expseg_config_defaults(&c);
  c.given = 0;
  if (err && errlen) err[0] = '\0';
  char q[TOK_MAX * 4 + 8], q2[TOK_MAX * 4 + 8];
  tok_t k, t, v;
  next(&p, &k);
  if (k.type == T_END) goto done;
  for (;;) {
    if (k.type != T_WORD) {
      if (k.type == T_COMMA)
        return fail(&p, k.at, "empty option before ','; accepted: key:value pairs separated by ','");
      return fail(&p, k.at, "expected a key but found %s; accepted: key:value pairs separated by ','",
                  shown(&k, q));
    }
    const option_t *o = k.n < TOK_MAX ? find_option(k.w) : NULL;
    if (!o) return unknown_key(&p, &k);
    p.key = !strcmp(k.w, o->key) ? o->key : o->alias;
    next(&p, &t);
    if (t.type != T_COLON)
      return fail(&p, t.at, "%s has no value (expected ':' after the key, found %s)", p.key,
                  t.type == T_END ? "the end of the text" : shown(&t, q));
    next(&p, &v);
    expseg_status s;
    if (v.type == T_WORD) {
      s = word_value(&p, o, &v, &c);
    } else if (v.type == T_OPEN && o->kind == K_DIVISIONS) {
      s = divisions_list(&p, o, &v, &c);
    } else if (v.type == T_OPEN) {
      char acc[256];
      accepted(o, acc, sizeof acc);
      s = fail(&p, v.at, "%s value is a list, but only roundup_power2_divisions takes one; accepted: %s",
               p.key, acc);
    } else {
      char acc[256];
      accepted(o, acc, sizeof acc);
      s = fail(&p, v.at, "%s has no value (found %s after ':'); accepted: %s", p.key,
               v.type == T_END ? "the end of the text" : shown(&v, q), acc);
    }
    if (s != EXPSEG_OK) return s;
    c.given |= (uint64_t)1 << (o - options);
    next(&p, &t);
    if (t.type == T_END) break;
    if (t.type != T_COMMA)
      return fail(&p, t.at, "expected ',' after %s:%s but found %s", p.key,
                  v.type == T_WORD ? shown(&v, q2) : "[...]", shown(&t, q));
    next(&p, &k);
    if (k.type == T_END)
      return fail(&p, t.at, "trailing ',' after %s:%s; remove it", p.key,
                  v.type == T_WORD ? shown(&v, q2) : "[...]");
  }
done:
  *out = c;
  return EXPSEG_OK;
}

/* ---- the canonical printer ---- */

static void print_divisions(out_t *o, const uint32_t *d) {
  const int n = EXPSEG_ROUNDUP_INTERVALS;
  int k = 0; /* end of the first run */
  while (k + 1 < n && d[k + 1] == d[0]) k++;
  if (k == n - 1 && is_pow2(d[0])) {
    out_u64(o, d[0]);
    return;
  }
  int j = n - 1; /* start of the last run */
  while (j > 0 && d[j - 1] == d[n - 1]) j--;
  out_str(o, "[");
  if (k == n - 1) { /* one run of a value that is not a power of two (0): '>' fills all */
    out_str(o, ">:");
    out_u64(o, d[0]);
    out_str(o, "]");
    return;
  }
  out_u64(o, (uint64_t)1 << k); /* the first entry fills every interval below it */
  out_str(o, ":");
  out_u64(o, d[k]);
  for (int i = k + 1; i < j; i++) {
    out_str(o, ",");
    out_u64(o, (uint64_t)1 << i);
    out_str(o, ":");
    out_u64(o, d[i]);
  }
  out_str(o, ",>:"); /* the last run: every interval after the last explicit one */
  out_u64(o, d[j]);
  out_str(o, "]");
}

/* False when the value cannot be written (an "off" default outside the accepted range). */
static bool printable(const option_t *o, const expseg_config_t *c) {
  switch (o->kind) {
  case K_MB: {
    size_t b = FIELD(c, o, size_t);
    uint64_t mb = b == SIZE_MAX ? MB_CEIL : b / MiB;
    return mb >= o->ilo;
  }
  case K_DOUBLE_OPEN: {
    double d = FIELD(c, o, double);
    return d > o->dlo && d < o->dhi;
  }
  default: return true;
  }
}

size_t _expseg_config_print(const expseg_config_t *c, char *buf, size_t len) {
  out_t o = {buf, len, 0};
  bool any = false;
  for (int i = 0; i < EXPSEG_OPT_COUNT; i++) {
    const option_t *op = &options[i];
    if (!printable(op, c)) continue;
    if (any) out_str(&o, ",");
    any = true;
    out_str(&o, op->key);
    out_str(&o, ":");
    switch (op->kind) {
    case K_BOOL: out_str(&o, FIELD(c, op, bool) ? "True" : "False"); break;
    case K_MB: {
      size_t b = FIELD(c, op, size_t);
      out_u64(&o, b == SIZE_MAX ? MB_CEIL : b / MiB);
      break;
    }
    case K_DOUBLE:
    case K_DOUBLE_OPEN: out_double(&o, FIELD(c, op, double)); break;
    case K_UINT:
    case K_POW2: out_u64(&o, FIELD(c, op, uint32_t)); break;
    case K_DIVISIONS: print_divisions(&o, c->roundup_power2_divisions); break;
    case K_BACKEND: out_str(&o, "native"); break;
    }
  }
  return out_end(&o);
}

size_t _expseg_config_no_effect(const expseg_config_t *c, char *buf, size_t len) {
  out_t o = {buf, len, 0};
  bool any = false;
  for (int i = 0; i < EXPSEG_OPT_COUNT; i++) {
    if (options[i].pytorch != 2 || !(c->given & ((uint64_t)1 << i))) continue;
    out_str(&o, any ? ", " : "accepted for PyTorch compatibility, but without effect in expseg: ");
    out_str(&o, options[i].key);
    any = true;
  }
  return out_end(&o);
}
