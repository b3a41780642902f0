// SPDX-License-Identifier: Apache-2.0
// Several devices and peer access on the cuda backend (label gpu; skips without a usable
// CUDA device, the peer test without two). Checks that a call on one device's allocator
// leaves the calling thread's current context alone, and that enabling a peer makes
// cuMemGetAccess report read-write access for it on every mapped range (and disabling
// takes it away). Driver entry points are looked up with dlsym so that only vmm/cuda.c
// includes cuda.h.
#include "alloc_support.h"

#include <dlfcn.h>

#include <thread>
#include <vector>

namespace {

struct Loc {
  int type; // CU_MEM_LOCATION_TYPE_DEVICE = 1
  int id;
};

struct Cu {
  int (*init)(unsigned) = nullptr;
  int (*count)(int *) = nullptr;
  int (*dev_get)(int *, int) = nullptr;
  int (*retain)(void **, int) = nullptr;
  int (*set_current)(void *) = nullptr;
  int (*get_current)(void **) = nullptr;
  int (*get_access)(unsigned long long *, const Loc *, unsigned long long) = nullptr;
  bool load() {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return false;
    init = (int (*)(unsigned))dlsym(lib, "cuInit");
    count = (int (*)(int *))dlsym(lib, "cuDeviceGetCount");
    dev_get = (int (*)(int *, int))dlsym(lib, "cuDeviceGet");
    retain = (int (*)(void **, int))dlsym(lib, "cuDevicePrimaryCtxRetain");
    set_current = (int (*)(void *))dlsym(lib, "cuCtxSetCurrent");
    get_current = (int (*)(void **))dlsym(lib, "cuCtxGetCurrent");
    get_access = (int (*)(unsigned long long *, const Loc *, unsigned long long))dlsym(
        lib, "cuMemGetAccess");
    return init && count && dev_get && retain && set_current && get_current && get_access &&
           init(0) == 0;
  }
  int devices() {
    int n = 0;
    return count(&n) == 0 ? n : 0;
  }
  void *primary(int ordinal) {
    int dev = 0;
    void *ctx = nullptr;
    return dev_get(&dev, ordinal) == 0 && retain(&ctx, dev) == 0 ? ctx : nullptr;
  }
};

TEST(GpuDevices, CallsLeaveTheCallersContextAlone) {
  if (!_expseg_cuda_usable(0)) GTEST_SKIP() << "no usable CUDA device";
  Cu cu;
  ASSERT_TRUE(cu.load());
  int n = cu.devices();
  std::vector<expseg_allocator *> a(n, nullptr);
  for (int d = 0; d < n; d++)
    ASSERT_EQ(EXPSEG_OK, expseg_create("cuda", d, nullptr, &a[d])) << expseg_last_error();
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; t++) {
    ts.emplace_back([&, t] {
      void *mine = cu.primary(t % n);
      ASSERT_EQ(0, cu.set_current(mine));
      for (int i = 0; i < 50; i++) {
        expseg_allocator *A = a[(t + i) % n]; // often another device than the current one
        void *p = nullptr;
        ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, (size_t)(1 + i % 7) << 20, 0, &p));
        ASSERT_EQ(EXPSEG_OK, expseg_free(A, p));
        void *now = nullptr;
        ASSERT_EQ(0, cu.get_current(&now));
        ASSERT_EQ(now, mine) << "device " << (t + i) % n << "'s call changed the context";
      }
    });
  }
  for (auto &t : ts) t.join();
  for (int d = 0; d < n; d++) {
    EXPECT_EQ(stat_of(a[d], "allocation.all.current"), 0);
    ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a[d]));
    expseg_destroy(a[d]);
  }
}

TEST(GpuDevices, PeerAccessOnEveryRange) {
  if (!_expseg_cuda_usable(0) || !_expseg_cuda_usable(1)) GTEST_SKIP() << "needs two GPUs";
  Cu cu;
  ASSERT_TRUE(cu.load());
  expseg_allocator *A = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_create("cuda", 0, nullptr, &A)) << expseg_last_error();
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 64u << 20, 0, &p));
  int peer = 0;
  ASSERT_EQ(0, cu.dev_get(&peer, 1));
  Loc loc = {1, peer};
  unsigned long long flags = 99;
  ASSERT_EQ(0, cu.get_access(&flags, &loc, (unsigned long long)(uintptr_t)p));
  EXPECT_EQ(flags, 0u) << "no access before enabling";
  expseg_status st = expseg_enable_peer_access(A, 1);
  if (st != EXPSEG_OK) {
    expseg_destroy(A);
    GTEST_SKIP() << "the devices cannot access each other: " << expseg_last_error();
  }
  ASSERT_EQ(0, cu.get_access(&flags, &loc, (unsigned long long)(uintptr_t)p));
  EXPECT_EQ(flags, 3u) << "read-write after enabling";
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 64u << 20, 0, &q));
  ASSERT_EQ(0, cu.get_access(&flags, &loc, (unsigned long long)(uintptr_t)q));
  EXPECT_EQ(flags, 3u) << "mapped later: granted too";
  ASSERT_EQ(EXPSEG_OK, expseg_disable_peer_access(A, 1)) << expseg_last_error();
  ASSERT_EQ(0, cu.get_access(&flags, &loc, (unsigned long long)(uintptr_t)q));
  EXPECT_EQ(flags, 0u) << "revoked";
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, p));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, q));
  expseg_destroy(A);
}

// A peer ordinal past the machine's devices is refused when enabled, also while nothing is
// mapped yet (it used to be accepted then, and every later malloc failed granting it).
TEST(GpuDevices, PeerPastTheDeviceCountIsRefusedAtEnable) {
  if (!_expseg_cuda_usable(0)) GTEST_SKIP() << "no usable CUDA device";
  Cu cu;
  ASSERT_TRUE(cu.load());
  const int n = cu.devices();
  if (n >= 64) GTEST_SKIP() << "no ordinal in [0, 63] past the device count";
  expseg_allocator *A = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_create("cuda", 0, "expandable_segments:True", &A));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_enable_peer_access(A, n));
  const std::string msg = expseg_last_error();
  EXPECT_NE(msg.find("peer device " + std::to_string(n)), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(n) + " device"), std::string::npos) << msg;
  void *p = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 4u << 20, 0, &p)) << "the peer was not enabled: "
                                                          << expseg_last_error();
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_enable_peer_access(A, n)) << "mapped now";
  EXPECT_EQ(EXPSEG_OK, expseg_disable_peer_access(A, n)) << "never enabled: nothing to do";
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, p));
  expseg_destroy(A);
}

} // namespace
