// The driver contract against the cuda backend (label gpu). Skips where no CUDA device with
// virtual memory management is usable. Same suite as test_vmm_contract.cpp.
#define EXPSEG_VMM_CONTRACT_GPU 1
#include "test_vmm_contract.cpp"

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

} // namespace
