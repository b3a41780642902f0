// SPDX-License-Identifier: Apache-2.0
// The driver contract against the cuda backend (label gpu). Skips where no CUDA device with
// virtual memory management is usable. Same suite as test_vmm_contract.cpp.
#define EXPSEG_VMM_CONTRACT_GPU 1
#include "test_vmm_contract.cpp"
#include "cudadouble.h"

namespace {

TEST(VmmCuda, DeviceMemoryAndOffsetRule) {
  if (!_expseg_cuda_usable(0)) GTEST_SKIP() << "no usable CUDA device";
  expseg_vmm_t *v = nullptr;
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_open("cuda", 0, &v)) << expseg_last_error();
  size_t g = v->granularity, fr = 0, tot = 0;
  _expseg_vmm_mem_info(v, &fr, &tot);
  EXPECT_GT(tot, 0u);
  EXPECT_LE(fr, tot);
  uintptr_t va = 0;
  expseg_vmm_handle h = 0;
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_reserve(v, 2 * g, 0, &va)) << expseg_last_error();
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_create(v, 2 * g, &h)) << expseg_last_error();
  EXPECT_EQ(EXPSEG_ERR_UNSUPPORTED, _expseg_vmm_map(v, va, g, h, g));
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_map(v, va, 2 * g, h, 0)) << expseg_last_error();
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_set_access(v, va, 2 * g)) << expseg_last_error();
  size_t fr2 = 0;
  _expseg_vmm_mem_info(v, &fr2, &tot);
  // Other processes on the same GPU (ctest -j) free memory too: a few fresh pairs of
  // readings around creating and mapping 2 pages; one of them must not see free memory rise.
  for (int i = 0; i < 10 && fr2 > fr; i++) {
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_unmap(v, va, 2 * g)) << expseg_last_error();
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_release(v, h, 2 * g)) << expseg_last_error();
    _expseg_vmm_mem_info(v, &fr, &tot);
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_create(v, 2 * g, &h)) << expseg_last_error();
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_map(v, va, 2 * g, h, 0)) << expseg_last_error();
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_set_access(v, va, 2 * g)) << expseg_last_error();
    _expseg_vmm_mem_info(v, &fr2, &tot);
  }
  EXPECT_LE(fr2, fr);
  // Asking for more than the device has is OUT_OF_MEMORY, with the call named.
  size_t huge = (tot + 16 * g) & ~(g - 1);
  expseg_vmm_handle big = 0;
  EXPECT_EQ(EXPSEG_ERR_OUT_OF_MEMORY, _expseg_vmm_create(v, huge, &big));
  EXPECT_NE(nullptr, strstr(expseg_last_error(), "cuMemCreate")) << expseg_last_error();
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_unmap(v, va, 2 * g)) << expseg_last_error();
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_release(v, h, 2 * g)) << expseg_last_error();
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_unreserve(v, va, 2 * g)) << expseg_last_error();
  char why[64];
  EXPECT_TRUE(vmm_test_is_idle(v, why, sizeof why)) << why;
  _expseg_vmm_close(v);
}

// Against the CUDA driver double, the mapping-table rules the backend leaves to the driver
// come back as the driver's errors (EXPSEG_ERR_DRIVER naming the call and the CUDA error),
// nothing changes on a refusal, and data survives an unmap and a map elsewhere.
TEST(VmmCuda, TheDriversRefusalsComeBackAsDriverErrors) {
  cudadouble_api api;
  if (!cudadouble_load(&api) || !_expseg_cuda_usable(0))
    GTEST_SKIP() << "needs the CUDA driver double (tests/cuda_double)";
  expseg_vmm_t *v = nullptr;
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_open("cuda", 0, &v)) << expseg_last_error();
  const size_t g = v->granularity;
  uintptr_t va = 0;
  expseg_vmm_handle a = 0, b = 0;
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_reserve(v, 8 * g, 0, &va));
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_create(v, 2 * g, &a));
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_create(v, 2 * g, &b));
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_map(v, va + 2 * g, 2 * g, a, 0));
  auto driver_error = [&](expseg_status st, const char *call) {
    EXPECT_EQ(EXPSEG_ERR_DRIVER, st);
    EXPECT_NE(nullptr, strstr(expseg_last_error(), call)) << expseg_last_error();
    EXPECT_NE(nullptr, strstr(expseg_last_error(), "CUDA_ERROR_INVALID_VALUE"))
        << expseg_last_error();
  };
  driver_error(_expseg_vmm_map(v, va + 2 * g, 2 * g, b, 0), "cuMemMap");   // mapped already
  driver_error(_expseg_vmm_map(v, va + 3 * g, 2 * g, b, 0), "cuMemMap");   // overlaps
  driver_error(_expseg_vmm_unmap(v, va + 2 * g, g), "cuMemUnmap");         // part of a mapping
  driver_error(_expseg_vmm_unmap(v, va, g), "cuMemUnmap");                 // not mapped
  driver_error(_expseg_vmm_set_access(v, va + 2 * g, 3 * g), "cuMemSetAccess"); // a hole
  driver_error(_expseg_vmm_unreserve(v, va, 8 * g), "cuMemAddressFree");   // still mapped
  // the legal sequence still works, and data written before an unmap is there after a map
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_set_access(v, va + 2 * g, 2 * g)) << expseg_last_error();
  unsigned char *p = (unsigned char *)(va + 2 * g);
  for (size_t i = 0; i < 2 * g; i += 4096) p[i] = (unsigned char)(i / 4096 + 1);
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_unmap(v, va + 2 * g, 2 * g));
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_map(v, va + 6 * g, 2 * g, a, 0));
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_set_access(v, va + 6 * g, 2 * g));
  const unsigned char *q = (const unsigned char *)(va + 6 * g);
  for (size_t i = 0; i < 2 * g; i += 4096) ASSERT_EQ((unsigned char)(i / 4096 + 1), q[i]);
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_unmap(v, va + 6 * g, 2 * g));
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_release(v, a, 2 * g));
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_release(v, b, 2 * g));
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_unreserve(v, va, 8 * g));
  _expseg_vmm_close(v);
  cudadouble_state st{};
  api.counts(&st);
  EXPECT_EQ(0, st.handles + st.freed_late + st.mappings + st.reservations);
}

} // namespace
