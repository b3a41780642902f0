/* SPDX-License-Identifier: Apache-2.0 */
/* fidx_support.h: a harness over the free index (pools/fidx.c) alone, for
 * tests/test_fidx.cpp: blocks are plain structs of two fake segments (one per pool), so a
 * test can insert, remove and ask best fit directly and compare with a reference set. */
#ifndef EXPSEG_TEST_FIDX_SUPPORT_H
#define EXPSEG_TEST_FIDX_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fidx_harness fidx_harness;

/* n block slots; NULL when out of memory. */
fidx_harness *fidx_h_new(size_t n);
void fidx_h_free(fidx_harness *h);
/* Block slot i (not in the index) gets the key and goes into the index. */
void fidx_h_insert(fidx_harness *h, size_t i, int pool, uint64_t stream, size_t size,
                   uintptr_t ptr);
void fidx_h_remove(fidx_harness *h, size_t i); /* slot i leaves the index */
/* The slot best fit gives for (pool, stream, size), or -1. */
long fidx_h_best(const fidx_harness *h, int pool, uint64_t stream, size_t size);
/* 0 when the index's own check passes, else -1 (the message in expseg_last_error()). */
int fidx_h_check(const fidx_harness *h);
size_t fidx_h_largest(const fidx_harness *h);

#ifdef __cplusplus
}
#endif

#endif
