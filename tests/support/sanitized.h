// SPDX-License-Identifier: Apache-2.0
// Whether this test binary runs under AddressSanitizer or ThreadSanitizer (gcc defines
// __SANITIZE_*__, clang answers __has_feature): tests that cannot observe something under a
// sanitizer (an interposed symbol, mlock) skip, and long randomized runs take fewer steps.
#ifndef EXPSEG_TESTS_SANITIZED_H
#define EXPSEG_TESTS_SANITIZED_H
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EXPSEG_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define EXPSEG_TEST_SANITIZED 1
#endif
#endif
#endif
