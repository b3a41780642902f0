/* SPDX-License-Identifier: Apache-2.0 */
/* tool_args.h: the tools' one command-line parser (bench_hit.c, bench_host.c,
 * bench_driver.c, bench_grow.c). A tool describes its options in a table; the parser reads
 * `--name value` pairs (and value-less flags) into the table's destinations, checks each
 * value (decimal through base/dec.h, a range, a list's length, a choice) and refuses
 * anything else with one message naming the option, the value and what is accepted. */
#ifndef EXPSEG_TOOL_ARGS_H
#define EXPSEG_TOOL_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
  ARG_FLAG,   /* no value: *(int *)dst = 1 */
  ARG_STR,    /* *(const char **)dst = the value */
  ARG_U64,    /* *(uint64_t *)dst: a decimal in [min, max] */
  ARG_SIZE,   /* *(uint64_t *)dst: a decimal with an optional K, M, G or T (binary, either case), in [min, max] */
  ARG_LIST,   /* ((uint64_t *)dst)[0 .. *n): comma-separated decimals in [min, max], 1 to cap */
  ARG_STRS,   /* ((const char **)dst)[*n++]: the option may repeat, up to cap times */
  ARG_CHOICE, /* *(int *)dst: the index of the value in choices (NULL-terminated) */
} _expseg_arg_kind;

typedef struct _expseg_arg_s {
  const char *name; /* "--seed" */
  _expseg_arg_kind kind;
  void *dst;
  uint64_t min, max;          /* ARG_U64, ARG_SIZE, ARG_LIST items */
  size_t *n, cap;             /* ARG_LIST, ARG_STRS */
  const char *const *choices; /* ARG_CHOICE */
} _expseg_arg_t;

/* Table rows (designated, so each names only what its kind uses). */
#define ARG_FLAG_(nm, d) {.name = (nm), .kind = ARG_FLAG, .dst = (d)}
#define ARG_STR_(nm, d) {.name = (nm), .kind = ARG_STR, .dst = (d)}
#define ARG_U64_(nm, d, lo, hi) {.name = (nm), .kind = ARG_U64, .dst = (d), .min = (lo), .max = (hi)}
#define ARG_SIZE_(nm, d, lo, hi) {.name = (nm), .kind = ARG_SIZE, .dst = (d), .min = (lo), .max = (hi)}
#define ARG_LIST_(nm, d, lo, hi, count, c) \
  {.name = (nm), .kind = ARG_LIST, .dst = (d), .min = (lo), .max = (hi), .n = (count), .cap = (c)}
#define ARG_STRS_(nm, d, count, c) {.name = (nm), .kind = ARG_STRS, .dst = (d), .n = (count), .cap = (c)}
#define ARG_CHOICE_(nm, d, ch) {.name = (nm), .kind = ARG_CHOICE, .dst = (d), .choices = (ch)}

/* Parses argv[1 .. argc) by the table t[0 .. n). 0, or -1 after one line on stderr
 * ("TOOL: --name 'value': accepted: ..."). --help and -h print usage to stdout and exit 0;
 * an unknown option prints usage to stderr. A list or repeated option given again starts
 * over (ARG_LIST) or adds (ARG_STRS). */
int _expseg_args_parse(const char *tool, int argc, char **argv, const _expseg_arg_t *t, size_t n,
                       void (*usage)(FILE *f));

#endif
