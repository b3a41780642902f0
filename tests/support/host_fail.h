// SPDX-License-Identifier: Apache-2.0
// host_fail.h: host memory that runs out on demand. Include it in ONE source file of a test
// binary: it defines malloc, calloc and realloc for the whole process (the library's and
// libexpseg_torch.so's calls land here too), forwarding to glibc until a test sets
// g_fail_host (every call returns NULL while it is true) or g_countdown (that many calls
// succeed, then g_fail_host). Not under a sanitizer, whose allocator must stay the only one:
// there EXPSEG_TEST_HOST_FAIL is not defined and tests that need it skip.
#ifndef EXPSEG_TESTS_HOST_FAIL_H
#define EXPSEG_TESTS_HOST_FAIL_H
#include <cerrno>
#include <cstddef>

#include "sanitized.h"

inline bool g_fail_host = false; // while true every malloc/calloc/realloc returns NULL
inline long g_countdown = -1;    // >= 0: that many host allocations succeed, then g_fail_host

inline bool host_fails() {
  if (g_countdown >= 0 && g_countdown-- == 0) g_fail_host = true;
  if (g_fail_host) errno = ENOMEM; // as glibc's malloc sets it
  return g_fail_host;
}

#ifndef EXPSEG_TEST_SANITIZED
#define EXPSEG_TEST_HOST_FAIL 1
extern "C" {
void *__libc_malloc(size_t);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void *malloc(size_t n) { return host_fails() ? nullptr : __libc_malloc(n); }
void *calloc(size_t a, size_t b) { return host_fails() ? nullptr : __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { return host_fails() ? nullptr : __libc_realloc(p, n); }
}
#endif
#endif
