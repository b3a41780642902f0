// SPDX-License-Identifier: Apache-2.0
// test_gpu_streams.cpp: streams the cuda driver creates (expseg_stream_create/destroy), as
// expseg-replay --driver cuda uses them for a history's streams, and the device-wide wait
// (expseg_synchronize) of the PyTorch plug's safe mode (label gpu). Skips where no
// CUDA device with virtual memory management is usable.
#include <gtest/gtest.h>

extern "C" {
#include "expseg.h"
#include "vmm.h"
}

TEST(GpuStreams, CreatedStreamsCarryAllocationsAndAreDestroyed) {
  if (!_expseg_cuda_usable(0)) GTEST_SKIP() << "no usable CUDA device";
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("cuda", 0, "expandable_segments:True", &a), EXPSEG_OK)
      << expseg_last_error();
  expseg_stream s1 = 0, s2 = 0;
  ASSERT_EQ(expseg_stream_create(a, &s1), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_stream_create(a, &s2), EXPSEG_OK) << expseg_last_error();
  EXPECT_NE(s1, 0u);
  EXPECT_NE(s1, s2);
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4 << 20, s1, &p), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_malloc(a, 4 << 20, s2, &q), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_record_stream(a, p, s2), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
  EXPECT_EQ(expseg_free(a, q), EXPSEG_OK);
  // a device-wide wait (cuCtxSynchronize), counted
  int64_t syncs = -1;
  EXPECT_EQ(expseg_synchronize(a), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_stat(a, "expseg.driver.device_synchronize", &syncs), EXPSEG_OK);
  EXPECT_EQ(syncs, 1);
  EXPECT_EQ(expseg_empty_cache(a), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_stream_destroy(a, s1), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_stream_destroy(a, s2), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  expseg_destroy(a);
}
