/* SPDX-License-Identifier: Apache-2.0 */
/* text.h: policy/'s internal text helpers, shared by parse.c, number.c and print.c only:
 * numbers read as PyTorch's parser reads them (std::stoull / std::stod, without the C
 * locale), the clean decimal form the printer writes, and an output buffer with snprintf
 * semantics. Not part of policy.h: nothing outside policy/ reads option text. */
#ifndef EXPSEG_POLICY_TEXT_H
#define EXPSEG_POLICY_TEXT_H

#include "policy.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest word kept from the text (longer ones are cut and reported as too long). */
#define TOK_TEXT_MAX 256

/* What std::stoull / std::stod do with a word: a value, no conversion at all
 * (std::invalid_argument), or a value out of range (std::out_of_range, errno ERANGE). */
typedef enum num_e { NUM_OK, NUM_NOT_NUMBER, NUM_OVERFLOW } num_t;

/* How a number was written, beyond its value; 0 = the clean form (plain decimal digits, for
 * doubles an optional fraction and exponent). */
enum {
  NUMF_SIGN = 1,    /* a leading '+' or '-' */
  NUMF_WRAPPED = 2, /* a '-' on an unsigned value: stoull wraps it modulo 2^64 */
  NUMF_JUNK = 4,    /* characters after the number, ignored by stoull/stod */
  NUMF_FORM = 8     /* hexadecimal, inf or nan (stod reads them) */
};

/* std::stoull(s) (base 10): optional sign, at least one digit, junk after ignored, a
 * magnitude above 2^64 - 1 is NUM_OVERFLOW, a '-' wraps. */
num_t _expseg_read_u64(const char *s, uint64_t *v, unsigned *flags);
/* std::stod(s) as glibc's strtod reads it in the C locale: decimal, hexadecimal (0x1p-1),
 * inf/infinity, nan[(...)], junk after ignored; overflow and underflow (a result below
 * DBL_MIN from non-zero digits) are NUM_OVERFLOW, as ERANGE makes stod throw. */
num_t _expseg_read_double(const char *s, double *v, unsigned *flags);
/* The istream >> double reading of expandable_segments_reserve values: the whole word must
 * be [+-]digits[.digits][e[+-]digits] (or .digits); false otherwise or if not finite. */
bool _expseg_read_stream_double(const char *s, size_t n, double *v);

typedef struct out_s {
  char *buf;
  size_t len, pos; /* pos counts every byte wanted, even past len */
} out_t;
void _expseg_out_raw(out_t *o, const char *s, size_t n);
void _expseg_out_str(out_t *o, const char *s);
void _expseg_out_u64(out_t *o, uint64_t v);
/* Shortest decimal (at most 17 significant digits) that _expseg_read_double reads back as x
 * with no flags. */
void _expseg_out_double(out_t *o, double x);
/* As _expseg_out_double, for a value read as std::stod reads it: a subnormal, which no decimal
 * gives (strtod's ERANGE), is written as its exact hexadecimal (0x1p-1074). */
void _expseg_out_stod(out_t *o, double x);
size_t _expseg_out_end(out_t *o);

/* The option table (parse.c), generated from options.def. */
typedef enum kind_e {
  K_BOOL, K_MB, K_DOUBLE, K_DOUBLE_OPEN, K_UINT, K_POW2, K_DIVISIONS, K_BACKEND, K_RESERVE,
  K_RESERVE_CLASSES
} kind_t;
typedef struct option_s {
  const char *key, *alias;
  kind_t kind;
  size_t offset;     /* of the field in expseg_config_t */
  uint64_t ilo, ihi; /* integer kinds: accepted range (MB for K_MB) */
  double dlo, dhi;   /* double kinds */
  int pytorch;       /* 0 expseg's own, 1 PyTorch key, 2 PyTorch key without effect here */
} option_t;
extern const option_t _expseg_option_table[EXPSEG_OPT_COUNT];
#define MiB ((size_t)1 << 20)
#define MB_CEIL (SIZE_MAX / MiB) /* PyTorch clamps MB values to this many MiB */
#define FIELD(c, o, type) (*(type *)(void *)((char *)(c) + (o)->offset))

/* Prints the keys whose bit is set in mask (print.c). */
size_t _expseg_config_print_keys(const expseg_config_t *c, uint64_t mask, char *buf, size_t len);

#endif /* EXPSEG_POLICY_TEXT_H */
