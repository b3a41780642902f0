// SPDX-License-Identifier: Apache-2.0
// expseg_create on the cuda backend with host memory running out at each allocation (label
// gpu: the CUDA driver double, or a real device; skips without a usable one): the backend's
// own state and the driver layer's tables short of host memory are
// EXPSEG_ERR_HOST_OUT_OF_MEMORY, never the device's out of memory, and leave no allocator.
// A failure inside the driver library's own calls (its mallocs fail too) may be a driver
// error; what is checked is that it is never reported as device memory running out.
#include "alloc_support.h"
#include "host_fail.h"

TEST(GpuHostMemory, CreateShortOfHostMemoryIsNeverDeviceOutOfMemory) {
#ifndef EXPSEG_TEST_HOST_FAIL
  GTEST_SKIP() << "malloc cannot be replaced under a sanitizer";
#else
  if (!_expseg_cuda_usable(0)) GTEST_SKIP() << "no usable CUDA device";
  QuietLog quiet;
  bool served = false;
  int host_refusals = 0;
  for (long c = 0; c < 2000 && !served; c++) {
    expseg_allocator *a = nullptr;
    g_countdown = c;
    const expseg_status st = expseg_create("cuda", 0, "", &a);
    g_countdown = -1;
    g_fail_host = false;
    if (st == EXPSEG_OK) {
      served = true;
      expseg_destroy(a);
    } else {
      EXPECT_EQ(a, nullptr);
      EXPECT_NE(st, EXPSEG_ERR_OUT_OF_MEMORY)
          << "countdown " << c << ": " << expseg_status_name(st) << ": " << expseg_last_error();
      host_refusals += st == EXPSEG_ERR_HOST_OUT_OF_MEMORY;
    }
    if (HasFailure()) return;
  }
  EXPECT_TRUE(served);
  EXPECT_GT(host_refusals, 0) << "no allocation of the cuda backend was refused";
#endif
}
