/* SPDX-License-Identifier: Apache-2.0 */
/* tool_args.c: the tools' one command-line parser (tool_args.h): a table of options, each
 * value read and checked here, one message per refusal naming what is accepted. */
#include "tool_args.h"

#include "dec.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* A decimal in [min, max], with a binary unit (K, M, G or T) allowed when `units`
 * (base/dec.h: _expseg_dec_size); the whole of s[0, len). */
static bool read_u64(const char *s, size_t len, bool units, uint64_t min, uint64_t max,
                     uint64_t *out) {
  uint64_t v = 0;
  if (!(units ? _expseg_dec_size(s, len, &v) : _expseg_dec_all(s, len, &v))) return false;
  if (v < min || v > max) return false;
  *out = v;
  return true;
}

static void accepted(const _expseg_arg_t *a, char *buf, size_t len) {
  switch (a->kind) {
  case ARG_U64:
  case ARG_SIZE:
    snprintf(buf, len, "an integer from %" PRIu64 " to %" PRIu64 "%s", a->min, a->max,
             a->kind == ARG_SIZE ? " (bytes, or with K, M, G or T)" : "");
    break;
  case ARG_LIST:
    snprintf(buf, len, "1 to %zu comma-separated integers from %" PRIu64 " to %" PRIu64, a->cap,
             a->min, a->max);
    break;
  case ARG_STRS: snprintf(buf, len, "at most %zu of them", a->cap); break;
  case ARG_CHOICE: {
    size_t k = (size_t)snprintf(buf, len, "one of");
    for (size_t i = 0; a->choices[i] != NULL && k < len; i++)
      k += (size_t)snprintf(buf + k, len - k, "%s %s", i ? "," : "", a->choices[i]);
    break;
  }
  default: snprintf(buf, len, "a value"); break;
  }
}

static bool take(const _expseg_arg_t *a, const char *v) {
  switch (a->kind) {
  case ARG_STR: *(const char **)a->dst = v; return true;
  case ARG_U64:
  case ARG_SIZE:
    return read_u64(v, strlen(v), a->kind == ARG_SIZE, a->min, a->max, (uint64_t *)a->dst);
  case ARG_LIST: {
    uint64_t *out = (uint64_t *)a->dst;
    size_t k = 0;
    for (const char *p = v;; p++) {
      const char *e = strchr(p, ',');
      const size_t len = e ? (size_t)(e - p) : strlen(p);
      if (k == a->cap || !read_u64(p, len, false, a->min, a->max, &out[k])) return false;
      k++;
      if (e == NULL) break;
      p = e;
    }
    *a->n = k;
    return true;
  }
  case ARG_STRS:
    if (*a->n == a->cap) return false;
    ((const char **)a->dst)[(*a->n)++] = v;
    return true;
  case ARG_CHOICE:
    for (int i = 0; a->choices[i] != NULL; i++)
      if (strcmp(v, a->choices[i]) == 0) return *(int *)a->dst = i, true;
    return false;
  default: return false;
  }
}

int _expseg_args_parse(const char *tool, int argc, char **argv, const _expseg_arg_t *t, size_t n,
                       void (*usage)(FILE *f)) {
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i];
    if (strcmp(k, "--help") == 0 || strcmp(k, "-h") == 0) {
      usage(stdout);
      exit(0);
    }
    const _expseg_arg_t *a = NULL;
    for (size_t j = 0; j < n && a == NULL; j++)
      if (strcmp(k, t[j].name) == 0) a = &t[j];
    if (a == NULL) {
      fprintf(stderr, "%s: unknown option '%s'\n", tool, k);
      usage(stderr);
      return -1;
    }
    if (a->kind == ARG_FLAG) {
      *(int *)a->dst = 1;
      continue;
    }
    char what[256];
    accepted(a, what, sizeof what);
    if (i + 1 >= argc) {
      fprintf(stderr, "%s: %s needs a value: %s\n", tool, k, what);
      return -1;
    }
    const char *v = argv[++i];
    if (!take(a, v)) {
      fprintf(stderr, "%s: %s '%s': accepted: %s\n", tool, k, v, what);
      return -1;
    }
  }
  return 0;
}
