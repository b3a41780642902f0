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

#ifdef __cplusplus
}
#endif

#endif
