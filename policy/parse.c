/* SPDX-License-Identifier: Apache-2.0 */
/* parse.c: the option table, the defaults and the config parser.
 *
 * Everything here is generated from policy/options.def: one descriptor per row (key, alias,
 * kind, field offset, default, range), and the parser dispatches on the descriptor's kind to
 * one typed, range-checked handler per kind. No other list of option names exists.
 *
 * The verdict and the values are PyTorch main's (2026; c10/core/AllocatorConfig.cpp and
 * c10/cuda/CUDAAllocatorConfig.cpp, see docs/config.md). PyTorch tokenizes the text into
 * words and the separators , : [ ] (whitespace dropped) and walks the tokens three times:
 * for large_segment_size_mb wherever it stands, then its generic parser and its CUDA parser,
 * each skipping the other's keys and refusing a key neither knows. Its separator checks
 * return a result nobody reads, so any single token stands where ':' or ',' belongs. expseg
 * walks the same tokens the same three times (a cursor with one token of look-ahead) and so
 * accepts exactly what PyTorch accepts, with PyTorch's values. Where PyTorch's reading is an
 * accident of its parser (junk after a number, a sign, a wrong separator, a trailing ',', an
 * empty list), one warning line names each place, the value taken and the clean form.
 * Whatever PyTorch refuses is refused with a message naming the source, the byte position,
 * the key, the value and what is accepted.
 *
 * Pure: reads only its arguments, writes only *out, err and warn, keeps no globals, never
 * allocates, does not use the locale. A key given twice: the last one wins, except that
 * roundup_power2_divisions lists merge (PyTorch's fill rules). Any error leaves *out
 * untouched. */
#include "text.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ---- the table ---- */

/* Each field must have the type its kind stores (checked at compile time). */
#define FIELD_IS_BOOL(f) _Generic((f), bool: 1, default: 0)
#define FIELD_IS_MB(f) _Generic((f), size_t: 1, default: 0)
#define FIELD_IS_DOUBLE(f) _Generic((f), double: 1, default: 0)
#define FIELD_IS_DOUBLE_OPEN(f) _Generic((f), double: 1, default: 0)
#define FIELD_IS_UINT(f) _Generic((f), uint32_t: 1, default: 0)
#define FIELD_IS_POW2(f) _Generic((f), uint32_t: 1, default: 0)
#define FIELD_IS_DIVISIONS(f) _Generic((f), uint64_t *: 1, default: 0)
#define FIELD_IS_BACKEND(f) _Generic((f), int: 1, default: 0)
#define FIELD_IS_RESERVE(f) _Generic((f), double: 1, default: 0)
#define FIELD_IS_RESERVE_CLASSES(f) _Generic((f), char *: 1, default: 0)
#define EXPSEG_OPTION(key, alias, kind, field, def, lo, hi, pt, help)                        \
  _Static_assert(FIELD_IS_##kind(((expseg_config_t *)0)->field),                             \
                 "options.def: field " #field " has the wrong type for kind " #kind);
#include "options.def"
#undef EXPSEG_OPTION

const option_t _expseg_option_table[EXPSEG_OPT_COUNT] = {
#define EXPSEG_OPTION(key, alias, kind, field, def, lo, hi, pt, help)                        \
  {#key, alias, K_##kind, offsetof(expseg_config_t, field), (uint64_t)(lo), (uint64_t)(hi),   \
   (double)(lo), (double)(hi), pt},
#include "options.def"
#undef EXPSEG_OPTION
};
#define options _expseg_option_table

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
  for (int i_ = 0; i_ < EXPSEG_ROUNDUP_INTERVALS; i_++) (f)[i_] = (uint64_t)(v)
#define DEF_BACKEND(f, v) (f) = (int)(v)
#define DEF_RESERVE(f, v) (f) = (double)(v)
#define DEF_RESERVE_CLASSES(f, v) memset((f), (v), sizeof(f))

void _expseg_config_defaults(expseg_config_t *c) {
  memset(c, 0, sizeof *c);
#define EXPSEG_OPTION(key, alias, kind, field, def, lo, hi, pt, help) DEF_##kind(c->field, def);
#include "options.def"
#undef EXPSEG_OPTION
  c->given = 0;
}

/* The keys of PyTorch's generic parser (AcceleratorAllocatorConfig); every other key is
 * the CUDA parser's (expseg's own keys too). */
static bool generic_key(int id) {
  switch (id) {
  case EXPSEG_OPT_max_split_size_mb:
  case EXPSEG_OPT_max_non_split_rounding_mb:
  case EXPSEG_OPT_garbage_collection_threshold:
  case EXPSEG_OPT_roundup_power2_divisions:
  case EXPSEG_OPT_expandable_segments:
  case EXPSEG_OPT_large_segment_size_mb:
  case EXPSEG_OPT_pinned_use_background_threads:
  case EXPSEG_OPT_pinned_max_round_threshold_mb:
  case EXPSEG_OPT_pinned_max_cached_size_mb: return true;
  default: return false;
  }
}

/* ---- tokenizer ---- */

static bool is_space(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}
static bool is_sep(char ch) { return ch == ',' || ch == ':' || ch == '[' || ch == ']'; }
static bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
static unsigned log2_floor(uint64_t v) {
  unsigned r = 0;
  while (v >>= 1) r++;
  return r;
}

typedef enum tt_e { T_END, T_WORD, T_COMMA, T_COLON, T_OPEN, T_CLOSE } tt_t;

typedef struct tok_s {
  tt_t type;
  size_t at;             /* byte offset of the token's first character */
  char w[TOK_TEXT_MAX];  /* the word without whitespace, or the separator */
  size_t n;              /* its length (may exceed TOK_TEXT_MAX - 1: then w is cut) */
} tok_t;

typedef enum pass_e { PASS_LARGE, PASS_GENERIC, PASS_DEVICE } pass_t;

typedef struct parser_s {
  const char *text;
  size_t pos;
  const char *source;
  char *err;
  size_t errlen;
  const char *key; /* the key being parsed, as written */
  pass_t pass;
  out_t warn;      /* accidents, "; "-separated */
  bool divisions_seen;
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
    t->n = 1;
    return;
  }
  t->type = T_WORD;
  for (; s[p->pos] && !is_sep(s[p->pos]); p->pos++) {
    if (is_space(s[p->pos])) continue;
    if (t->n < TOK_TEXT_MAX - 1) t->w[t->n] = s[p->pos];
    t->n++;
  }
  t->w[t->n < TOK_TEXT_MAX - 1 ? t->n : TOK_TEXT_MAX - 1] = '\0';
}

static tt_t peek(parser_t *p, tok_t *t) {
  size_t keep = p->pos;
  next(p, t);
  p->pos = keep;
  return t->type;
}

/* The token as shown in a message: quoted, non-printable bytes escaped, cut after max
 * characters. */
#define SHOWN_MAX 48
static const char *shown(const tok_t *t, char q[SHOWN_MAX * 4 + 8]) {
  size_t k = 0, i = 0;
  q[k++] = '\'';
  for (const char *s = t->w; *s && i < SHOWN_MAX; s++, i++) {
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
  if (t->n > SHOWN_MAX) {
    memcpy(q + k, "...", 3);
    k += 3;
  }
  q[k++] = '\'';
  q[k] = '\0';
  return q;
}
typedef char shown_t[SHOWN_MAX * 4 + 8];

#if defined(__GNUC__)
#define PRINTF_3_4 __attribute__((format(printf, 3, 4)))
#else
#define PRINTF_3_4
#endif

/* One error line: "<source>: position <n>: <what>". Always returns EXPSEG_ERR_CONFIG. */
PRINTF_3_4 static expseg_status fail(parser_t *p, size_t at, const char *fmt, ...) {
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

/* One accident, appended to the warning: "position <n>: <what>". */
PRINTF_3_4 static void note(parser_t *p, size_t at, const char *fmt, ...) {
  char line[320];
  int n = snprintf(line, sizeof line, "%sposition %zu: ", p->warn.pos ? "; " : "", at + 1);
  va_list ap;
  va_start(ap, fmt);
  if (n >= 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  _expseg_out_str(&p->warn, line);
}

/* What an option accepts, for messages. */
static void accepted(const option_t *o, char *buf, size_t len) {
  switch (o->kind) {
  case K_BOOL: snprintf(buf, len, "True or False (exactly; case-sensitive)"); break;
  case K_MB:
    if (o == &options[EXPSEG_OPT_max_split_size_mb] ||
        o == &options[EXPSEG_OPT_max_non_split_rounding_mb])
      snprintf(buf, len,
               "an integer number of MB >= large_segment_size_mb (20 unless set; values of %llu "
               "and above are clamped to it and mean unlimited)",
               (unsigned long long)MB_CEIL);
    else if (o->ihi == MB_CEIL)
      snprintf(buf, len,
               "an integer number of MB >= %llu (values of %llu and above are clamped to it)",
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
             "a power of two N (1 = no rounding, at most 2^63), or a list [K:N,...,>:N] with K "
             "a power of two in MB and N a power of two or 0");
    break;
  case K_BACKEND: snprintf(buf, len, "native (expseg implements the native allocator only)"); break;
  case K_RESERVE:
    snprintf(buf, len, "a positive fraction of device memory (0.5) or a size in GiB (40G)");
    break;
  case K_RESERVE_CLASSES:
    snprintf(buf, len, "a list [name:R,...] with R a fraction (0.25) or GiB (8G)");
    break;
  }
}

static expseg_status bad_value(parser_t *p, const option_t *o, const tok_t *v,
                               const char *problem) {
  char acc[256];
  shown_t q;
  accepted(o, acc, sizeof acc);
  return fail(p, v->at, "%s value %s %s; accepted: %s", p->key ? p->key : o->key, shown(v, q),
              problem, acc);
}

/* The value token is missing or a separator where a word is needed. */
static expseg_status no_value(parser_t *p, const option_t *o, const tok_t *v) {
  char acc[256];
  shown_t q;
  accepted(o, acc, sizeof acc);
  return fail(p, v->at, "%s has no value (found %s); accepted: %s", p->key ? p->key : o->key,
              v->type == T_END ? "the end of the text" : shown(v, q), acc);
}

/* A list the text ends in before its ']'. */
static expseg_status no_close(parser_t *p, const option_t *o, size_t at) {
  char acc[256];
  accepted(o, acc, sizeof acc);
  return fail(p, at, "%s: the list has no closing ']'; accepted: %s", p->key, acc);
}

/* Notes what the number's flags say about how it was written. */
static void note_number(parser_t *p, const tok_t *v, unsigned fl, const char *taken) {
  if (!fl) return;
  shown_t q;
  note(p, v->at, "%s value %s read as %s (%s); write %s", p->key, shown(v, q), taken,
       fl & NUMF_WRAPPED ? "a negative number wraps around, as PyTorch's stoull does"
       : fl & NUMF_JUNK  ? "PyTorch ignores what follows the number"
       : fl & NUMF_FORM  ? "PyTorch reads it with strtod"
                         : "a sign is not part of the clean form",
       taken);
}

static void note_u64(parser_t *p, const tok_t *v, unsigned fl, uint64_t u) {
  char taken[32];
  snprintf(taken, sizeof taken, "%llu", (unsigned long long)u);
  note_number(p, v, fl, taken);
}

/* Notes a separator that stands where `want` belongs. */
static void note_sep(parser_t *p, const tok_t *t, char want) {
  if (t->type == T_END || t->w[0] == want) return;
  shown_t q;
  note(p, t->at, "%s taken as '%c'", shown(t, q), want);
}

static const char *num_problem(num_t r) {
  return r == NUM_OVERFLOW ? "is out of range (PyTorch's stoull/stod throw)" : "is not a number";
}

/* ---- typed handlers: v is the value token (whatever it is) ---- */

static expseg_status mb_value(parser_t *p, const option_t *o, const tok_t *v, expseg_config_t *c) {
  uint64_t u;
  unsigned fl;
  if (v->type != T_WORD) return no_value(p, o, v);
  if (v->n >= TOK_TEXT_MAX) return bad_value(p, o, v, "is too long");
  num_t r = _expseg_read_u64(v->w, &u, &fl);
  if (r != NUM_OK) return bad_value(p, o, v, num_problem(r));
  uint64_t lo = o->ilo;
  if (o == &options[EXPSEG_OPT_max_split_size_mb] ||
      o == &options[EXPSEG_OPT_max_non_split_rounding_mb])
    lo = c->large_segment_size / MiB;
  if (u < lo) {
    char what[96];
    snprintf(what, sizeof what, "is too small (at least %llu)", (unsigned long long)lo);
    return bad_value(p, o, v, what);
  }
  if (o->ihi != MB_CEIL && u > o->ihi) return bad_value(p, o, v, "is too large");
  if (u > MB_CEIL) u = MB_CEIL;
  note_u64(p, v, fl, u);
  FIELD(c, o, size_t) = (size_t)u * MiB;
  return EXPSEG_OK;
}

static expseg_status word_value(parser_t *p, const option_t *o, const tok_t *v,
                                expseg_config_t *c) {
  uint64_t u;
  double d;
  unsigned fl;
  num_t r;
  char taken[48];
  if (o->kind == K_MB) return mb_value(p, o, v, c);
  if (v->type != T_WORD) return no_value(p, o, v);
  if (v->n >= TOK_TEXT_MAX) return bad_value(p, o, v, "is too long");
  switch (o->kind) {
  case K_BOOL:
    if (strcmp(v->w, "True") && strcmp(v->w, "False"))
      return bad_value(p, o, v, "is not a boolean");
    FIELD(c, o, bool) = v->w[0] == 'T';
    return EXPSEG_OK;
  case K_DOUBLE:
  case K_DOUBLE_OPEN:
    if ((r = _expseg_read_double(v->w, &d, &fl)) != NUM_OK) return bad_value(p, o, v, num_problem(r));
    if (o->kind == K_DOUBLE ? !(d >= o->dlo && d <= o->dhi) : !(d > o->dlo && d < o->dhi))
      return bad_value(p, o, v, "is out of range");
    if (d == 0) d = 0.0; /* -0 is 0 */
    {
      out_t t = {taken, sizeof taken, 0};
      _expseg_out_stod(&t, d);
      _expseg_out_end(&t);
    }
    note_number(p, v, fl, taken);
    FIELD(c, o, double) = d;
    return EXPSEG_OK;
  case K_UINT:
  case K_POW2:
    if ((r = _expseg_read_u64(v->w, &u, &fl)) != NUM_OK) return bad_value(p, o, v, num_problem(r));
    if (o->kind == K_POW2 && !is_pow2(u)) return bad_value(p, o, v, "is not a power of two");
    if (u < o->ilo || u > o->ihi) return bad_value(p, o, v, "is out of range");
    note_u64(p, v, fl, u);
    FIELD(c, o, uint32_t) = (uint32_t)u;
    return EXPSEG_OK;
  case K_DIVISIONS:
    if ((r = _expseg_read_u64(v->w, &u, &fl)) != NUM_OK) return bad_value(p, o, v, num_problem(r));
    if (u == 0) return bad_value(p, o, v, "is 0 (the single-number form needs a power of two; 1 = no rounding)");
    if (!is_pow2(u)) return bad_value(p, o, v, "is not a power of two");
    note_u64(p, v, fl, u);
    for (int i = 0; i < EXPSEG_ROUNDUP_INTERVALS; i++) c->roundup_power2_divisions[i] = u;
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
  default: break;
  }
  return bad_value(p, o, v, "is not accepted");
}

/* A reserve value as PyTorch's parseReserveSpec reads it: a positive finite number, GiB when
 * it ends in G or g, else a fraction of device memory. */
static bool reserve_spec(const tok_t *v, double *value, bool *gib) {
  if (v->type != T_WORD || v->n >= TOK_TEXT_MAX || v->n == 0) return false;
  size_t n = v->n;
  *gib = v->w[n - 1] == 'G' || v->w[n - 1] == 'g';
  if (*gib) n--;
  return n > 0 && _expseg_read_stream_double(v->w, n, value) && *value > 0;
}

static void out_reserve(out_t *o, double value, bool gib) {
  _expseg_out_double(o, value);
  if (gib) _expseg_out_str(o, "G");
}

/* roundup_power2_divisions list, after '[' (PyTorch's generic parser): each entry K:N sets
 * interval log2(K) (clamped to 15) and the first numeric one also every interval below it;
 * '>:N' sets every interval after the last one set (after interval 0 when none was), and
 * may stand anywhere; intervals not reached keep their value. */
static expseg_status divisions_list(parser_t *p, const option_t *o, expseg_config_t *c) {
  uint64_t *div = c->roundup_power2_divisions;
  bool first = true, any = false;
  size_t last = 0;
  tok_t k, t, v;
  shown_t q;
  char acc[256];
  accepted(o, acc, sizeof acc);
  for (;;) {
    next(p, &k);
    if (k.type == T_END)
      return no_close(p, o, k.at);
    if (k.type == T_CLOSE) break;
    next(p, &t);
    if (t.type == T_END)
      return fail(p, t.at, "%s: list entry %s has no ':N' (the text ends); accepted: %s", p->key,
                  shown(&k, q), acc);
    next(p, &v);
    if (v.type == T_END)
      return fail(p, v.at, "%s: list entry %s has no value N (the text ends); accepted: %s",
                  p->key, shown(&k, q), acc);
    uint64_t n, kmb;
    unsigned fl, fk;
    num_t r = v.type != T_WORD ? NUM_NOT_NUMBER : _expseg_read_u64(v.w, &n, &fl);
    if (v.type == T_WORD && v.n >= TOK_TEXT_MAX) return bad_value(p, o, &v, "is too long");
    if (r != NUM_OK) return bad_value(p, o, &v, num_problem(r));
    if (n != 0 && !is_pow2(n)) return bad_value(p, o, &v, "is not a power of two or 0");
    note_sep(p, &t, ':');
    note_u64(p, &v, fl, n);
    if (k.type == T_WORD && !strcmp(k.w, ">")) {
      if (!any && n != 0)
        note(p, k.at,
             "%s: '>' as the first entry sets the intervals from 2 MiB up and leaves sizes "
             "below 2 MiB unrounded (PyTorch's rule); write [1:0,>:%llu] to say so, or %llu to "
             "round every size",
             p->key, (unsigned long long)n, (unsigned long long)n);
      for (size_t i = last + 1; i < EXPSEG_ROUNDUP_INTERVALS; i++) div[i] = n;
    } else {
      r = k.type != T_WORD ? NUM_NOT_NUMBER : _expseg_read_u64(k.w, &kmb, &fk);
      if (k.type == T_WORD && k.n >= TOK_TEXT_MAX) return bad_value(p, o, &k, "is too long");
      if (r != NUM_OK) return bad_value(p, o, &k, num_problem(r));
      if (!is_pow2(kmb)) return bad_value(p, o, &k, "is not a power of two (interval K in MB)");
      note_u64(p, &k, fk, kmb);
      size_t idx = log2_floor(kmb);
      if (idx >= EXPSEG_ROUNDUP_INTERVALS) idx = EXPSEG_ROUNDUP_INTERVALS - 1;
      if (first)
        for (size_t i = 0; i < idx; i++) div[i] = n;
      first = false;
      div[idx] = n;
      last = idx;
    }
    any = true;
    if (peek(p, &t) == T_END)
      return no_close(p, o, t.at);
    if (t.type != T_CLOSE) {
      next(p, &t);
      note_sep(p, &t, ',');
      tok_t u;
      if (peek(p, &u) == T_CLOSE) note(p, t.at, "%s: trailing %s in the list ignored", p->key, shown(&t, q));
    }
  }
  if (!any) note(p, k.at - 1, "%s: empty list [] sets nothing (no rounding); write [>:0]", p->key);
  return EXPSEG_OK;
}

/* Removes class `name` from the list kept so far in b ("a:0.5,b:8G"); true if it was there. */
static bool drop_class(out_t *b, const char *name) {
  char *s = b->buf;
  const size_t len = b->pos, n = strlen(name);
  for (size_t i = 0, end; i < len; i = end + 1) {
    for (end = i; end < len && s[end] != ',';) end++;
    if (end - i <= n || s[i + n] != ':' || memcmp(s + i, name, n) != 0) continue;
    size_t from = i > 0 && end == len ? i - 1 : i, to = end < len ? end + 1 : end; /* a ',' */
    memmove(s + from, s + to, len - to);
    s[b->pos = len - (to - from)] = '\0';
    return true;
  }
  return false;
}

/* expandable_segments_reserve_by_class (PyTorch's CUDA parser): the token after ':' is taken
 * as '[' whatever it is; entries name:R follow until a ']' stands where a name would. Bad
 * values are ignored with a warning, as PyTorch does. */
static expseg_status reserve_classes(parser_t *p, const option_t *o, const tok_t *open,
                                     expseg_config_t *c) {
  char cls[EXPSEG_RESERVE_CLASSES_MAX];
  out_t b = {cls, sizeof cls, 0};
  tok_t name, t, v;
  shown_t q;
  char acc[256];
  accepted(o, acc, sizeof acc);
  note_sep(p, open, '[');
  for (;;) {
    if (peek(p, &t) == T_END)
      return no_close(p, o, t.at);
    if (t.type == T_CLOSE) break;
    next(p, &name);
    next(p, &t);
    next(p, &v);
    if (t.type == T_END || v.type == T_END)
      return fail(p, v.at, "%s: list entry %s has no value (the text ends); accepted: %s",
                  p->key, shown(&name, q), acc);
    note_sep(p, &t, ':');
    double value;
    bool gib;
    if (name.type != T_WORD || name.n >= TOK_TEXT_MAX) {
      note(p, name.at, "%s: entry named %s dropped (not a name)", p->key, shown(&name, q));
    } else if (!reserve_spec(&v, &value, &gib)) {
      note(p, v.at, "%s: value %s of class %s ignored, as PyTorch ignores it; accepted: %s",
           p->key, shown(&v, q), name.w, acc);
    } else {
      if (drop_class(&b, name.w)) /* as a key given twice: the last one wins */
        note(p, name.at, "%s: class %s given twice: the last value wins", p->key, name.w);
      size_t keep = b.pos;
      if (b.pos) _expseg_out_str(&b, ",");
      _expseg_out_str(&b, name.w);
      _expseg_out_str(&b, ":");
      out_reserve(&b, value, gib);
      if (b.pos >= sizeof cls) {
        b.pos = keep;
        note(p, name.at, "%s: class %s dropped: expseg keeps %d bytes of classes (its streams keep the usual reserve)",
             p->key, name.w, EXPSEG_RESERVE_CLASSES_MAX - 1);
      }
    }
    if (peek(p, &t) == T_END)
      return no_close(p, o, t.at);
    if (t.type == T_COMMA) {
      next(p, &t);
      tok_t u;
      if (peek(p, &u) == T_CLOSE) note(p, t.at, "%s: trailing ',' in the list ignored", p->key);
    } else if (t.type != T_CLOSE) {
      note(p, t.at, "%s: %s read as the next class name", p->key, shown(&t, q));
    }
  }
  next(p, &t); /* the ']' */
  _expseg_out_end(&b);
  memset(c->expandable_segments_reserve_by_class, 0, sizeof c->expandable_segments_reserve_by_class);
  memcpy(c->expandable_segments_reserve_by_class, cls, strlen(cls));
  return EXPSEG_OK;
}

/* Parses option o whose key token is k: the separator slot, the value, the handler. */
static expseg_status parse_option(parser_t *p, const option_t *o, expseg_config_t *c) {
  tok_t t, v;
  shown_t q;
  next(p, &t);
  if (t.type == T_END) return no_value(p, o, &t);
  next(p, &v);
  if (v.type == T_END) return no_value(p, o, &v);
  note_sep(p, &t, ':');
  switch (o->kind) {
  case K_DIVISIONS:
    if (!p->divisions_seen) /* PyTorch resets the divisions once per parse; keys then merge */
      memset(c->roundup_power2_divisions, 0, sizeof c->roundup_power2_divisions);
    p->divisions_seen = true;
    return v.type == T_OPEN ? divisions_list(p, o, c) : word_value(p, o, &v, c);
  case K_RESERVE: {
    double value;
    bool gib;
    if (reserve_spec(&v, &value, &gib)) {
      c->expandable_segments_reserve = value;
      c->expandable_segments_reserve_gib = gib;
    } else {
      char acc[256];
      accepted(o, acc, sizeof acc);
      note(p, v.at, "%s value %s ignored, as PyTorch ignores it (the value in force stays); "
           "accepted: %s", p->key, shown(&v, q), acc);
    }
    return EXPSEG_OK;
  }
  case K_RESERVE_CLASSES: return reserve_classes(p, o, &v, c);
  default: return word_value(p, o, &v, c);
  }
}

/* PyTorch's skipKey: a separator slot, a value; a value '[' runs to the first ']'. 0 when
 * done, else where the text ended (in *t): 1 in place of the slot or the value, 2 in a list. */
static int skip_key(parser_t *p, tok_t *t) {
  next(p, t);
  if (t->type != T_END) next(p, t);
  if (t->type == T_END) return 1;
  if (t->type == T_OPEN)
    do next(p, t);
    while (t->type != T_CLOSE && t->type != T_END);
  return t->type == T_END ? 2 : 0;
}

static expseg_status skip_option(parser_t *p, const option_t *o) {
  tok_t t;
  int r = skip_key(p, &t);
  return r == 1 ? no_value(p, o, &t) : r == 2 ? no_close(p, o, t.at) : EXPSEG_OK;
}

/* ---- unknown keys ---- */

/* Edit distance, for "did you mean"; SIZE_MAX once it is certainly above 3. */
static size_t distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  if (la >= 64 || lb >= 64) return SIZE_MAX;
  if (la > lb + 3 || lb > la + 3) return SIZE_MAX; /* too far to suggest anyway */
  size_t row[64];
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

/* The message names the suggestion first, then every key (PyTorch's, then expseg's own; an
 * alias as "key (or alias)"). The shown key is cut at SHOWN_MAX characters, so the whole
 * line always fits in EXPSEG_CONFIG_MSG_MAX (tests/test_policy_table.cpp checks it). */
static expseg_status unknown_key(parser_t *p, const tok_t *t) {
  char keys[800];
  shown_t q;
  out_t o = {keys, sizeof keys, 0};
  const char *near = NULL;
  size_t best = SIZE_MAX;
  for (int own = 0; own < 2; own++) {
    bool any = false;
    if (own) _expseg_out_str(&o, "; expseg's own: ");
    for (int i = 0; i < EXPSEG_OPT_COUNT; i++) {
      if ((options[i].pytorch == 0) != (own == 1)) continue;
      if (any) _expseg_out_str(&o, ", ");
      any = true;
      _expseg_out_str(&o, options[i].key);
      size_t d = t->n < TOK_TEXT_MAX ? distance(t->w, options[i].key) : SIZE_MAX;
      if (d < best) best = d, near = options[i].key;
      if (options[i].alias) {
        _expseg_out_str(&o, " (or ");
        _expseg_out_str(&o, options[i].alias);
        _expseg_out_str(&o, ")");
        d = t->n < TOK_TEXT_MAX ? distance(t->w, options[i].alias) : SIZE_MAX;
        if (d < best) best = d, near = options[i].alias;
      }
    }
  }
  _expseg_out_end(&o);
  if (near && best <= 3)
    return fail(p, t->at, "unknown key %s (did you mean '%s'?); accepted keys: %s", shown(t, q),
                near, keys);
  return fail(p, t->at, "unknown key %s; accepted keys: %s", shown(t, q), keys);
}

static const option_t *find_option(const tok_t *t) {
  if (t->type != T_WORD || t->n >= TOK_TEXT_MAX) return NULL;
  for (int i = 0; i < EXPSEG_OPT_COUNT; i++)
    if (!strcmp(t->w, options[i].key) || (options[i].alias && !strcmp(t->w, options[i].alias)))
      return &options[i];
  return NULL;
}

/* ---- the walks ---- */

/* PyTorch's first walk: every token equal to large_segment_size_mb, wherever it stands. */
static expseg_status walk_large(parser_t *p, expseg_config_t *c) {
  const option_t *o = &options[EXPSEG_OPT_large_segment_size_mb];
  tok_t k;
  p->pass = PASS_LARGE;
  p->pos = 0;
  for (next(p, &k); k.type != T_END; next(p, &k)) {
    if (k.type != T_WORD || strcmp(k.w, o->key)) continue;
    p->key = o->key;
    expseg_status s = parse_option(p, o, c);
    if (s != EXPSEG_OK) return s;
    c->given |= (uint64_t)1 << EXPSEG_OPT_large_segment_size_mb;
  }
  return EXPSEG_OK;
}

/* The generic or the CUDA walk: key, separator slot, value, one token taken as ','. */
static expseg_status walk(parser_t *p, pass_t pass, expseg_config_t *c) {
  tok_t k, t;
  shown_t q, q2;
  p->pass = pass;
  p->pos = 0;
  next(p, &k);
  while (k.type != T_END) {
    const option_t *o = find_option(&k);
    if (!o) {
      if (k.type == T_COMMA)
        return fail(p, k.at, "empty option before ','; accepted: key:value pairs separated by ','");
      if (k.type != T_WORD)
        return fail(p, k.at, "expected a key but found %s; accepted: key:value pairs separated by ','",
                    shown(&k, q));
      return unknown_key(p, &k);
    }
    int id = (int)(o - options);
    p->key = !strcmp(k.w, o->key) ? o->key : o->alias;
    bool mine = id != EXPSEG_OPT_large_segment_size_mb && generic_key(id) == (pass == PASS_GENERIC);
    expseg_status s = mine ? parse_option(p, o, c) : skip_option(p, o);
    if (s != EXPSEG_OK) return s;
    if (mine) c->given |= (uint64_t)1 << id;
    next(p, &t);
    if (t.type == T_END) break;
    next(p, &k);
    if (pass != PASS_DEVICE) continue; /* separators are noted once, in the last walk */
    if (k.type == T_END)
      note(p, t.at, "trailing %s after %s ignored", shown(&t, q), p->key);
    else if (t.type == T_WORD)
      note(p, t.at, "%s after %s ignored where ',' belongs", shown(&t, q2), p->key);
    else
      note_sep(p, &t, ',');
  }
  return EXPSEG_OK;
}

expseg_status _expseg_config_parse_warn(const char *text, const char *source,
                                        const expseg_config_t *base, expseg_config_t *out,
                                        char *err, size_t errlen, char *warn, size_t warnlen) {
  char wbuf[EXPSEG_CONFIG_MSG_MAX];
  parser_t p = {text ? text : "", 0, source, err, errlen, NULL, PASS_LARGE,
                {wbuf, sizeof wbuf, 0}, false};
  expseg_config_t c;
  if (base)
    c = *base;
  else
    _expseg_config_defaults(&c);
  c.given = 0;
  if (err && errlen) err[0] = '\0';
  if (warn && warnlen) warn[0] = '\0';
  expseg_status s = walk_large(&p, &c);
  /* PyTorch: every parse sets max_non_split_rounding to the large segment size; expseg does
   * so when the text sets large_segment_size_mb (other keys not given keep their values) */
  if (s == EXPSEG_OK && (c.given >> EXPSEG_OPT_large_segment_size_mb & 1))
    c.max_non_split_rounding = c.large_segment_size;
  if (s == EXPSEG_OK) s = walk(&p, PASS_GENERIC, &c);
  if (s == EXPSEG_OK) s = walk(&p, PASS_DEVICE, &c);
  if (s != EXPSEG_OK) return s;
  _expseg_out_end(&p.warn);
  if (p.warn.pos && warn && warnlen) {
    char clean[EXPSEG_CONFIG_MSG_MAX];
    _expseg_config_print_keys(&c, c.given, clean, sizeof clean);
    out_t w = {warn, warnlen, 0};
    _expseg_out_str(&w, source ? source : "config");
    _expseg_out_str(&w, ": accepted as PyTorch's parser reads it; write it as ");
    _expseg_out_str(&w, clean[0] ? clean : "\"\""); /* "": nothing to write, the key is off */
    _expseg_out_str(&w, " (");
    _expseg_out_str(&w, wbuf);
    _expseg_out_str(&w, ")");
    _expseg_out_end(&w);
  }
  *out = c;
  return EXPSEG_OK;
}

expseg_status _expseg_config_parse(const char *text, const char *source,
                                   const expseg_config_t *base, expseg_config_t *out,
                                   char *err, size_t errlen) {
  return _expseg_config_parse_warn(text, source, base, out, err, errlen, NULL, 0);
}
