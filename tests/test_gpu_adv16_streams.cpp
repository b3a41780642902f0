// SPDX-License-Identifier: Apache-2.0
// test_gpu_adv16_streams.cpp: expseg_stream_destroy of streams that still have frees pending
// on them (recorded with expseg_record_stream, held by the test so their work cannot
// complete) and of streams that own cached and live memory, on cuda against the CUDA driver
// double (label gpu; skipped where the double is not the loaded driver). The destroy lets
// the held work finish and waits for it: the pending free then completes, busy memory is
// never handed out before, and nothing is lost or left in the driver.
#include "alloc_support.h"
#include "cudadouble.h"

#include <gtest/gtest.h>

namespace {

constexpr size_t MiB = 1024 * 1024;

bool overlaps(void *p, void *q, size_t n) {
  return (char *)p < (char *)q + n && (char *)q < (char *)p + n;
}

TEST(GpuAdv16Streams, DestroyWithPendingFreesAndCachedMemory) {
  cudadouble_api api;
  if (!cudadouble_load(&api) || !_expseg_cuda_usable(0))
    GTEST_SKIP() << "needs the CUDA driver double (tests/cuda_double)";
  ASSERT_EQ(0, api.configure("capacity=1G,granularity=2M,recommended=2M")) << api.last_message();
  for (const char *cfg : {"expandable_segments:True", "expandable_segments:False"}) {
    SCOPED_TRACE(cfg);
    expseg_allocator *a = nullptr;
    ASSERT_EQ(expseg_create("cuda", 0, cfg, &a), EXPSEG_OK) << expseg_last_error();
    expseg_stream s1 = 0, s2 = 0;
    ASSERT_EQ(expseg_stream_create(a, &s1), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_stream_create(a, &s2), EXPSEG_OK) << expseg_last_error();
    void *p = nullptr;
    ASSERT_EQ(expseg_malloc(a, 8 * MiB, s1, &p), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_record_stream(a, p, s2), EXPSEG_OK);
    ASSERT_EQ(expseg_testing_hold_stream(a, s2, true), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
    EXPECT_EQ(stat_of(a, "expseg.pending_free_blocks.current"), 1);
    // busy for everyone while s2 is held, its own stream included
    void *q = nullptr, *r = nullptr;
    ASSERT_EQ(expseg_malloc(a, 8 * MiB, s1, &q), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_malloc(a, 8 * MiB, 0, &r), EXPSEG_OK) << expseg_last_error();
    EXPECT_FALSE(overlaps(p, q, 8 * MiB));
    EXPECT_FALSE(overlaps(p, r, 8 * MiB));
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    EXPECT_EQ(stat_of(a, "expseg.pending_free_blocks.current"), 1);
    // destroying the held stream lets its work finish: the pending free completes
    ASSERT_EQ(expseg_stream_destroy(a, s2), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    EXPECT_EQ(stat_of(a, "expseg.pending_free_blocks.current"), 0);
    EXPECT_EQ(stat_of(a, "active.all.current"), 2);
    EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
    // s1 held with a block freed on it, then destroyed with a live block and cached memory
    void *t = nullptr;
    ASSERT_EQ(expseg_malloc(a, 4 * MiB, s1, &t), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_testing_hold_stream(a, s1, true), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, t), EXPSEG_OK);
    void *u = nullptr;
    ASSERT_EQ(expseg_malloc(a, 4 * MiB, 0, &u), EXPSEG_OK) << expseg_last_error();
    EXPECT_FALSE(overlaps(t, u, 4 * MiB)) << "memory freed on held s1 handed to stream 0";
    ASSERT_EQ(expseg_stream_destroy(a, s1), EXPSEG_OK) << expseg_last_error();
    // a new stream (maybe the same handle): the destroyed stream's memory is usable again
    expseg_stream s3 = 0;
    ASSERT_EQ(expseg_stream_create(a, &s3), EXPSEG_OK) << expseg_last_error();
    void *v = nullptr;
    ASSERT_EQ(expseg_malloc(a, 4 * MiB, s3, &v), EXPSEG_OK) << expseg_last_error();
    for (void *x : {q, r, u, v}) ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
    ASSERT_EQ(expseg_stream_destroy(a, s3), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    EXPECT_EQ(stat_of(a, "active.all.current"), 0);
    EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
    EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
    expect_nothing_left(a, cfg);
    cudadouble_state st;
    api.counts(&st);
    EXPECT_EQ(0, st.handles + st.reservations + st.mappings + st.streams + st.events)
        << "the double holds what expseg should have given back";
  }
  ASSERT_EQ(0, api.configure("")) << api.last_message();
}

} // namespace
