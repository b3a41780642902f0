// SPDX-License-Identifier: Apache-2.0
// test_gpu_adv16.cpp: the cuda backend against what NVIDIA's driver API documents and a
// shipping driver happens not to show (label gpu; skips unless libcuda.so.1 is the CUDA driver
// double, tests/cuda_double/): a CUmemLocation names a device by its ordinal, not by its
// CUdevice handle; entry points are asked for at a version no newer than the driver's; and
// an allocator destroyed after the driver's own teardown at process exit
// (CUDA_ERROR_DEINITIALIZED) finishes quietly. The tests that need a driver loaded afresh
// run in a child process (death tests, threadsafe style: the child re-executes the binary).
#include "alloc_support.h"
#include "cudadouble.h"

#include <cstdlib>
#include <string>
#include <vector>

namespace {

bool have_double(cudadouble_api *api) { return cudadouble_load(api) != 0; }

#define NEED_DOUBLE(api)                                                                   \
  cudadouble_api api{};                                                                    \
  if (!have_double(&api))                                                                  \
    GTEST_SKIP() << "needs the CUDA driver double (tests/cuda_double): it configures it"

// The driver double hands out CUdevice handles 16 above the ordinals: every allocation
// property and access descriptor must carry the ordinal (cuMemCreate and cuMemSetAccess
// refuse the handle with CUDA_ERROR_INVALID_DEVICE), every CUdevice argument the handle.
TEST(GpuAdv16, LocationsNameDevicesByOrdinal) {
  NEED_DOUBLE(api);
  ASSERT_EQ(0, api.configure("device_base=16")) << api.last_message();
  for (int dev = 0; dev < 2; dev++) {
    expseg_allocator *a = nullptr;
    ASSERT_EQ(EXPSEG_OK, expseg_create("cuda", dev, "expandable_segments:True", &a))
        << expseg_last_error();
    void *p = nullptr;
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 6u << 20, 0, &p)) << expseg_last_error();
    // access for the other device: cuMemSetAccess on a peer's ordinal
    EXPECT_EQ(EXPSEG_OK, expseg_enable_peer_access(a, 1 - dev)) << expseg_last_error();
    void *q = nullptr;
    EXPECT_EQ(EXPSEG_OK, expseg_malloc(a, 40u << 20, 0, &q)) << expseg_last_error();
    EXPECT_EQ(EXPSEG_OK, expseg_disable_peer_access(a, 1 - dev)) << expseg_last_error();
    EXPECT_EQ(EXPSEG_OK, expseg_free(a, p));
    if (q) {
      EXPECT_EQ(EXPSEG_OK, expseg_free(a, q));
    }
    expseg_destroy(a);
  }
  cudadouble_state s{};
  api.counts(&s);
  EXPECT_EQ(0, s.handles + s.mappings + s.reservations + s.primary_retains);
  ASSERT_EQ(0, api.configure("")) << api.last_message();
}

// cuGetProcAddress: "If the specified CUDA version is greater than the driver version, the
// API will return CUDA_ERROR_INVALID_VALUE". A driver older than the cuda.h the library was
// built with (12.4 here) must still load: every entry point asked for at the driver's
// version. A child process, so the driver is loaded with that version.
TEST(GpuAdv16, LoadsOnADriverOlderThanItsHeader) {
  NEED_DOUBLE(api);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (api.configure("driver=12040") != 0) std::_Exit(2);
        expseg_allocator *a = nullptr;
        if (expseg_create("cuda", 0, "expandable_segments:True", &a) != EXPSEG_OK) {
          fprintf(stderr, "%s\n", expseg_last_error());
          std::_Exit(3);
        }
        void *p = nullptr;
        if (expseg_malloc(a, 8u << 20, 0, &p) != EXPSEG_OK || expseg_free(a, p) != EXPSEG_OK ||
            expseg_empty_cache(a) != EXPSEG_OK || expseg_synchronize(a) != EXPSEG_OK) {
          fprintf(stderr, "%s\n", expseg_last_error());
          std::_Exit(4);
        }
        expseg_destroy(a);
        fprintf(stderr, "loaded at 12040\n");
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "loaded at 12040");
}

// At process exit the driver tears itself down before late destructors run (a static
// allocator, a Python interpreter's last collection); from then on every call is
// CUDA_ERROR_DEINITIALIZED and the memory is gone with the process. expseg_destroy then
// finishes quietly: no warning per handle, mapping or event, no abort, no hang.
TEST(GpuAdv16, DestroyAfterTheDriverShutDownIsQuiet) {
  NEED_DOUBLE(api);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        expseg_allocator *a = nullptr;
        if (expseg_create("cuda", 0, "expandable_segments:True", &a) != EXPSEG_OK) std::_Exit(3);
        expseg_stream s1 = 0;
        expseg_stream s2 = 0;
        if (expseg_stream_create(a, &s1) != EXPSEG_OK || expseg_stream_create(a, &s2) != EXPSEG_OK)
          std::_Exit(4);
        std::vector<void *> live;
        for (int i = 0; i < 12; i++) {
          void *p = nullptr;
          if (expseg_malloc(a, (size_t)(1 + i % 5) << 20, i % 2 ? s1 : 0, &p) != EXPSEG_OK)
            std::_Exit(5);
          live.push_back(p);
        }
        // a block used on another stream (an event per free), one freed, the rest live
        if (expseg_record_stream(a, live[0], s2) != EXPSEG_OK) std::_Exit(6);
        if (expseg_free(a, live[0]) != EXPSEG_OK) std::_Exit(7);
        api.shutdown();
        expseg_destroy(a);
        fprintf(stderr, "destroyed\n");
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "^destroyed\n$");
}

} // namespace
