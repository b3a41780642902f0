/* SPDX-License-Identifier: Apache-2.0 */
/* dec.h: the one decimal reader of expseg, header-only so every layer uses the same one
 * (the driver spec and fault rules in vmm/, the configuration's integers in policy/,
 * EXPSEG_CHECK_EVERY in pools/, the trace readers' fields and the tools' arguments in
 * bench/). Unsigned digits only: no sign, no space, no base prefix; overflow is refused,
 * never wrapped or saturated. Callers add their own rules around it (units, a required
 * end, PyTorch's signs and junk flags). */
#ifndef EXPSEG_BASE_DEC_H
#define EXPSEG_BASE_DEC_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reads the digits at *p (before end) into *v and moves *p past them. false, *p and *v
 * unchanged: no digit at *p, or the value is above UINT64_MAX. */
static inline bool _expseg_dec_u64(const char **p, const char *end, uint64_t *v) {
  const char *q = *p;
  uint64_t x = 0;
  if (q == end || *q < '0' || *q > '9') return false;
  for (; q < end && *q >= '0' && *q <= '9'; q++) {
    const uint64_t d = (uint64_t)(*q - '0');
    if (x > (UINT64_MAX - d) / 10) return false;
    x = x * 10 + d;
  }
  *p = q;
  *v = x;
  return true;
}

/* The whole of s[0, n) is an unsigned decimal: its value in *v. */
static inline bool _expseg_dec_all(const char *s, size_t n, uint64_t *v) {
  const char *q = s;
  return _expseg_dec_u64(&q, s + n, v) && q == s + n;
}

/* The whole NUL-terminated string s is an unsigned decimal (NULL is not). */
static inline bool _expseg_dec_str(const char *s, uint64_t *v) {
  return s != NULL && _expseg_dec_all(s, strlen(s), v);
}

/* The whole of s[0, n) is a size: an unsigned decimal with an optional binary unit K, M, G
 * or T (either case; 2^10 .. 2^40), not over 64 bits: its bytes in *v. The one size reader
 * of driver specs (vmm.c) and the tools' options (bench/tool_args.c). */
static inline bool _expseg_dec_size(const char *s, size_t n, uint64_t *v) {
  const char *q = s;
  uint64_t x = 0;
  if (!_expseg_dec_u64(&q, s + n, &x)) return false;
  const size_t i = (size_t)(q - s);
  if (i == n) return *v = x, true;
  if (i + 1 != n) return false;
  const char u = s[i];
  const unsigned shift = u == 'K' || u == 'k'   ? 10
                         : u == 'M' || u == 'm' ? 20
                         : u == 'G' || u == 'g' ? 30
                         : u == 'T' || u == 't' ? 40
                                                : 0;
  if (shift == 0 || x > (UINT64_MAX >> shift)) return false;
  *v = x << shift;
  return true;
}

#ifdef __cplusplus
}
#endif

#endif
