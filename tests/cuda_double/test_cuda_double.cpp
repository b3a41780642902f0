// SPDX-License-Identifier: Apache-2.0
// test_cuda_double.cpp: the CUDA driver double's own rules (label gpu; built only with the
// double, linked to it directly). A test of the test double, so it includes cuda.h: each
// rule the double enforces (docs/driver.md, "The CUDA driver double") is driven here with
// the driver's own error codes. Each test leaves nothing live, so the configuration can be
// replaced between tests (cudadouble_configure).
#include <cuda.h>
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cudadouble.h"

extern "C" {
int cudadouble_configure(const char *spec);
const char *cudadouble_last_message(void);
int cudadouble_fail(const char *name, unsigned nth, int result);
int cudadouble_hold_stream(void *stream, int hold);
void cudadouble_counts(cudadouble_state *out);
size_t cudadouble_log_count(void);
int cudadouble_log_get(size_t i, cudadouble_call *out);
void cudadouble_log_clear(void);
void cudadouble_shutdown(void);
}

namespace {

constexpr size_t MiB = 1u << 20;

#define OK(x) ASSERT_EQ(CUDA_SUCCESS, (x)) << cudadouble_last_message()
#define REFUSED(code, x)                                 \
  do {                                                   \
    EXPECT_EQ((code), (x));                              \
    EXPECT_STRNE("", cudadouble_last_message());         \
  } while (0)

// Each test: a fresh configuration, device 0's primary context current; TearDown checks
// that the test gave everything back.
class Double : public ::testing::Test {
protected:
  CUcontext ctx = nullptr;
  void SetUp() override { start("devices=2,capacity=64M,granularity=2M,recommended=4M"); }
  void start(const char *spec) {
    ASSERT_EQ(0, cudadouble_configure(spec)) << cudadouble_last_message();
    OK(cuInit(0));
    OK(cuDevicePrimaryCtxRetain(&ctx, 0));
    OK(cuCtxSetCurrent(ctx));
  }
  void stop() {
    if (!ctx) return;
    EXPECT_EQ(CUDA_SUCCESS, cuCtxSetCurrent(nullptr));
    EXPECT_EQ(CUDA_SUCCESS, cuDevicePrimaryCtxRelease(0));
    ctx = nullptr;
  }
  void TearDown() override {
    stop();
    cudadouble_state s{};
    cudadouble_counts(&s);
    EXPECT_EQ(0, s.handles + s.freed_late + s.reservations + s.mappings + s.events + s.streams +
                     s.host_registrations + s.primary_retains)
        << "the test left something live";
  }
  CUmemAllocationProp prop(int dev = 0) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return p;
  }
  CUmemAccessDesc rw(int dev = 0, bool on = true) {
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = dev;
    d.flags = on ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return d;
  }
  // `bytes` of address space with `bytes` of device 0's memory mapped there (no access set
  // yet); give_back undoes it. Call them under ASSERT_NO_FATAL_FAILURE.
  void map_fresh(size_t bytes, CUdeviceptr *va, CUmemGenericAllocationHandle *h) {
    CUmemAllocationProp p = prop();
    OK(cuMemAddressReserve(va, bytes, 0, 0, 0));
    OK(cuMemCreate(h, bytes, &p, 0));
    OK(cuMemMap(*va, bytes, 0, *h, 0));
  }
  void give_back(size_t bytes, CUdeviceptr va, CUmemGenericAllocationHandle h) {
    OK(cuMemUnmap(va, bytes));
    OK(cuMemRelease(h));
    OK(cuMemAddressFree(va, bytes));
  }
};

TEST(DoubleInit, CallsBeforeCuInitAreNotInitialized) {
  // ctest runs each test in a process of its own; run alone, this one comes first
  size_t fr = 0, tot = 0;
  EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, cuMemGetInfo(&fr, &tot));
  int n = 0;
  EXPECT_EQ(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGetCount(&n));
  int v = 0;
  EXPECT_EQ(CUDA_SUCCESS, cuDriverGetVersion(&v));
  EXPECT_EQ(CUDA_VERSION, v);
}

TEST_F(Double, ProcAddressAnswersKnownNamesAndRefusesOthers) {
  void *fn = nullptr;
  CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
  OK(cuGetProcAddress("cuMemMap", &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &q));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SUCCESS, q);
  EXPECT_EQ((void *)&cuMemMap, fn);
  OK(cuGetProcAddress("cuMemGetInfo", &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &q));
  EXPECT_EQ((void *)&cuMemGetInfo_v2, fn) << "base names give the newest version";
  // CUDA 12+: a name the driver lacks is CUDA_SUCCESS, a NULL pointer and the status
  fn = &fn;
  EXPECT_EQ(CUDA_SUCCESS,
            cuGetProcAddress("cuLaunchKernel", &fn, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &q));
  EXPECT_EQ(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, q);
  EXPECT_EQ(nullptr, fn);
}

// cuGetProcAddress (cuda.h): "If the specified CUDA version is greater than the driver
// version, the API will return CUDA_ERROR_INVALID_VALUE"; flags outside
// CUdriverProcAddress_flags are refused; a name found only in newer versions than asked is
// CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT with a NULL pointer.
TEST_F(Double, ProcAddressRefusesVersionsNewerThanTheDriver) {
  stop();
  ASSERT_EQ(0, cudadouble_configure("driver=12040")) << cudadouble_last_message();
  int v = 0;
  OK(cuDriverGetVersion(&v));
  EXPECT_EQ(12040, v);
  void *fn = &fn;
  CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;
  REFUSED(CUDA_ERROR_INVALID_VALUE,
          cuGetProcAddress("cuMemMap", &fn, 12050, CU_GET_PROC_ADDRESS_DEFAULT, &q));
  EXPECT_EQ(nullptr, fn);
  OK(cuGetProcAddress("cuMemMap", &fn, 12040, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &q));
  EXPECT_EQ((void *)&cuMemMap, fn);
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuGetProcAddress("cuMemMap", &fn, 12040, 8, &q));
#if CUDA_VERSION >= 13000
  ASSERT_EQ(0, cudadouble_configure("")) << cudadouble_last_message();
  fn = &fn;
  OK(cuGetProcAddress("cuCtxSynchronize", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q));
  EXPECT_EQ((void *)&cuCtxSynchronize, fn);
#endif
  ASSERT_EQ(0, cudadouble_configure("")) << cudadouble_last_message();
  start("devices=2,capacity=64M,granularity=2M,recommended=4M");
}

// CUdevice is a handle from cuDeviceGet, CUmemLocation.id a device ordinal ("Location is a
// device location, thus id is a device ordinal"): with device_base=16 they differ, and each
// is refused where the other belongs.
TEST_F(Double, DeviceHandlesAreNotOrdinals) {
  stop();
  ASSERT_EQ(0, cudadouble_configure("device_base=16")) << cudadouble_last_message();
  CUdevice d1 = -1;
  OK(cuDeviceGet(&d1, 1));
  EXPECT_EQ(17, d1);
  int vmm = 0;
  REFUSED(CUDA_ERROR_INVALID_DEVICE,
          cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1));
  OK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, d1));
  REFUSED(CUDA_ERROR_INVALID_DEVICE, cuDevicePrimaryCtxRetain(&ctx, 1));
  OK(cuDevicePrimaryCtxRetain(&ctx, d1));
  OK(cuCtxSetCurrent(ctx));
  CUdevice got = -1;
  OK(cuCtxGetDevice(&got));
  EXPECT_EQ(d1, got);
  CUmemAllocationProp p = prop(1);
  CUmemGenericAllocationHandle h = 0;
  OK(cuMemCreate(&h, 2 * MiB, &p, 0)); // location.id: the ordinal
  OK(cuMemRelease(h));
  p.location.id = d1; // the handle is not an ordinal
  REFUSED(CUDA_ERROR_INVALID_DEVICE, cuMemCreate(&h, 2 * MiB, &p, 0));
  OK(cuCtxSetCurrent(nullptr));
  OK(cuDevicePrimaryCtxRelease(d1));
  ctx = nullptr;
  ASSERT_EQ(0, cudadouble_configure("")) << cudadouble_last_message();
  start("devices=2,capacity=64M,granularity=2M,recommended=4M");
}

// Every call lists CUDA_ERROR_DEINITIALIZED ("the CUDA driver is in the process of shutting
// down"): after cudadouble_shutdown every call that needs the driver returns it; error names
// still answer. Irreversible, so in a child process.
TEST(DoubleShutdown, EveryCallIsDeinitialized) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        if (cudadouble_configure("") != 0 || cuInit(0) != CUDA_SUCCESS) std::_Exit(2);
        CUcontext c = nullptr;
        if (cuDevicePrimaryCtxRetain(&c, 0) != CUDA_SUCCESS) std::_Exit(3);
        cudadouble_shutdown();
        int n = 0;
        size_t fr = 0;
        size_t tot = 0;
        const char *name = nullptr;
        bool ok = cuInit(0) == CUDA_ERROR_DEINITIALIZED &&
                  cuDeviceGetCount(&n) == CUDA_ERROR_DEINITIALIZED &&
                  cuCtxGetCurrent(&c) == CUDA_ERROR_DEINITIALIZED &&
                  cuMemGetInfo(&fr, &tot) == CUDA_ERROR_DEINITIALIZED &&
                  cuDevicePrimaryCtxRelease(0) == CUDA_ERROR_DEINITIALIZED &&
                  cuGetErrorName(CUDA_ERROR_DEINITIALIZED, &name) == CUDA_SUCCESS &&
                  std::string(name) == "CUDA_ERROR_DEINITIALIZED";
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

#if CUDA_VERSION >= 13000
// CUDA 13.0 gave cuCtxSynchronize a context argument under the same name: asked for at 13000
// the double hands out the new one (which refuses a context that is not live, as the driver
// does), asked for at 12000 the one cuda.h declares under the plain name.
TEST_F(Double, ProcAddressHandsOutTheVersionAskedFor) {
  void *fn = nullptr;
  OK(cuGetProcAddress("cuCtxSynchronize", &fn, 13000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr));
  EXPECT_EQ((void *)&cuCtxSynchronize_v2, fn);
  OK(cuGetProcAddress("cuCtxSynchronize", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr));
  EXPECT_EQ((void *)&cuCtxSynchronize, fn);
  CUcontext ctx = nullptr;
  OK(cuDevicePrimaryCtxRetain(&ctx, 0));
  OK(cuCtxSetCurrent(ctx));
  OK(cuCtxSynchronize_v2(ctx));
  OK(cuCtxSynchronize_v2(nullptr)); // the current one
  int junk = 0;
  EXPECT_EQ(CUDA_ERROR_CONTEXT_IS_DESTROYED, cuCtxSynchronize_v2((CUcontext)&junk));
  OK(cuCtxSetCurrent(nullptr));
  OK(cuDevicePrimaryCtxRelease(0));
}
#endif

TEST_F(Double, ContextsAreRetainedCountedAndPerThread) {
  CUmemGenericAllocationHandle h = 0;
  CUmemAllocationProp p = prop();
  std::atomic<int> other{-1};
  std::thread([&] { other = cuMemCreate(&h, 2 * MiB, &p, 0); }).join();
  EXPECT_EQ(CUDA_ERROR_INVALID_CONTEXT, other.load()) << "another thread has no current context";
  CUcontext c1 = nullptr, cur = nullptr;
  OK(cuDevicePrimaryCtxRetain(&c1, 1));
  OK(cuCtxSetCurrent(c1));
  OK(cuCtxGetCurrent(&cur));
  EXPECT_EQ(c1, cur);
  OK(cuDevicePrimaryCtxRelease(1));
  size_t fr, tot;
  REFUSED(CUDA_ERROR_INVALID_CONTEXT, cuMemGetInfo(&fr, &tot)); // its context was released
  REFUSED(CUDA_ERROR_INVALID_CONTEXT, cuCtxSetCurrent(c1));
  REFUSED(CUDA_ERROR_INVALID_CONTEXT, cuDevicePrimaryCtxRelease(1));
  OK(cuCtxSetCurrent(ctx));
  OK(cuMemGetInfo(&fr, &tot));
  EXPECT_EQ(64 * MiB, tot);
  REFUSED(CUDA_ERROR_INVALID_DEVICE, cuDevicePrimaryCtxRetain(&c1, 2));
}

TEST_F(Double, GranularityAndCapacity) {
  CUmemAllocationProp p = prop();
  size_t mn = 0, rec = 0;
  OK(cuMemGetAllocationGranularity(&mn, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  OK(cuMemGetAllocationGranularity(&rec, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT_EQ(2 * MiB, mn);
  EXPECT_EQ(4 * MiB, rec);
  CUmemGenericAllocationHandle h = 0, big = 0;
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, 3 * MiB, &p, 0));
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemCreate(&h, 2 * MiB, &p, 1));
  OK(cuMemCreate(&h, 2 * MiB, &p, 0));
  size_t fr = 0, tot = 0;
  OK(cuMemGetInfo(&fr, &tot));
  EXPECT_EQ(62 * MiB, fr);
  REFUSED(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&big, 64 * MiB, &p, 0));
  OK(cuMemRelease(h));
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemRelease(h)); // released twice
  OK(cuMemCreate(&big, 64 * MiB, &p, 0));
  OK(cuMemRelease(big));
  CUdeviceptr va = 0;
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemAddressReserve(&va, 4 * MiB, 3 * MiB, 0, 0));
  OK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
  EXPECT_EQ(0u, va % (2 * MiB)) << "reservations are aligned to the minimum granularity";
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(va, 4 * MiB)); // size must match
  OK(cuMemAddressFree(va, 8 * MiB));
}

TEST_F(Double, MapUnmapAndAccessRules) {
  CUmemAllocationProp p = prop();
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  OK(cuMemAddressReserve(&va, 16 * MiB, 0, 0, 0));
  OK(cuMemCreate(&h, 4 * MiB, &p, 0));
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemMap(va + 14 * MiB, 4 * MiB, 0, h, 0)); // past the range
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemMap(va + 1 * MiB, 2 * MiB, 0, h, 0));  // unaligned
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, 6 * MiB, 0, h, 0));            // past the handle
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, 2 * MiB, 2 * MiB, h, 0));      // offset
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemMap(0x10000000, 2 * MiB, 0, h, 0));   // not reserved
  OK(cuMemMap(va, 4 * MiB, 0, h, 0));
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemMap(va + 2 * MiB, 2 * MiB, 0, h, 0)); // mapped already
  std::vector<unsigned char> buf(4 * MiB, 0x5a), back(4 * MiB, 0);
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoD(va, buf.data(), buf.size())); // no access yet
  CUmemAccessDesc d = rw();
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(va, 8 * MiB, &d, 1)); // a hole
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemSetAccess(va, 2 * MiB, &d, 1)); // part of a mapping
  OK(cuMemSetAccess(va, 4 * MiB, &d, 1));
  OK(cuMemcpyHtoD(va, buf.data(), buf.size()));
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemUnmap(va, 2 * MiB)); // a sub-range
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemAddressFree(va, 16 * MiB)); // still mapped
  // from pageable memory the copy's DMA may still run: no unmap until a synchronizing call
  REFUSED(CUDA_ERROR_ILLEGAL_STATE, cuMemUnmap(va, 4 * MiB));
  OK(cuStreamSynchronize(nullptr));
  OK(cuMemUnmap(va, 4 * MiB));
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemcpyDtoH(back.data(), va, back.size())); // unmapped
  // data written before the unmap is there after a map elsewhere
  OK(cuMemMap(va + 8 * MiB, 4 * MiB, 0, h, 0));
  OK(cuMemSetAccess(va + 8 * MiB, 4 * MiB, &d, 1));
  OK(cuMemcpyDtoH(back.data(), va + 8 * MiB, back.size()));
  EXPECT_EQ(buf, back);
  // release while mapped: freed at the last unmap
  OK(cuMemRelease(h));
  cudadouble_state s{};
  cudadouble_counts(&s);
  EXPECT_EQ(1, s.freed_late);
  EXPECT_EQ(int64_t(4 * MiB), s.used_bytes);
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemMap(va, 4 * MiB, 0, h, 0)); // the handle is gone
  OK(cuMemsetD8(va + 8 * MiB, 7, 4 * MiB));
  OK(cuMemUnmap(va + 8 * MiB, 4 * MiB));
  cudadouble_counts(&s);
  EXPECT_EQ(0, s.freed_late);
  EXPECT_EQ(0, s.used_bytes);
  OK(cuMemAddressFree(va, 16 * MiB));
}

// cuMemcpyHtoDAsync / DtoHAsync: page-locked host memory only, a live stream; the copy lands
// only when its stream (or the context) is synchronized, so a reader that skipped the sync
// sees the old bytes, and neither side may be unmapped before.
TEST_F(Double, AsyncCopiesLandAtTheStreamSync) {
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  ASSERT_NO_FATAL_FAILURE(map_fresh(4 * MiB, &va, &h));
  CUmemAccessDesc d = rw();
  OK(cuMemSetAccess(va, 4 * MiB, &d, 1));
  std::vector<unsigned char> old(MiB, 1), back(MiB, 0);
  OK(cuMemcpyHtoD(va, old.data(), old.size()));
  OK(cuStreamSynchronize(nullptr));
  CUstream s = nullptr, other = nullptr;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  OK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  REFUSED(CUDA_ERROR_INVALID_VALUE, cuMemcpyHtoDAsync(va, old.data(), MiB, s)); // pageable
  REFUSED(CUDA_ERROR_INVALID_HANDLE, cuMemcpyHtoDAsync(va, old.data(), MiB, (CUstream)&back));
  void *pinned = aligned_alloc(4096, MiB);
  ASSERT_NE(pinned, nullptr);
  OK(cuMemHostRegister(pinned, MiB, 0));
  memset(pinned, 2, MiB);
  OK(cuMemcpyHtoDAsync(va, pinned, MiB, s));
  OK(cuMemcpyDtoH(back.data(), va, MiB)); // no sync of s: the old bytes
  EXPECT_EQ(back, old);
  OK(cuStreamSynchronize(other)); // another stream's sync does not land it
  OK(cuMemcpyDtoH(back.data(), va, MiB));
  EXPECT_EQ(back, old);
  REFUSED(CUDA_ERROR_ILLEGAL_STATE, cuMemUnmap(va, 4 * MiB));
  OK(cuStreamSynchronize(s));
  OK(cuMemcpyDtoH(back.data(), va, MiB));
  EXPECT_EQ(back, std::vector<unsigned char>(MiB, 2));
  // device -> host: the pinned buffer changes at the context's sync
  memset(pinned, 3, MiB);
  OK(cuMemcpyDtoHAsync(pinned, va, MiB, s));
  EXPECT_EQ(((unsigned char *)pinned)[0], 3);
  OK(cuCtxSynchronize());
  EXPECT_EQ(((unsigned char *)pinned)[MiB - 1], 2);
  ASSERT_NO_FATAL_FAILURE(give_back(4 * MiB, va, h));
  OK(cuMemHostUnregister(pinned));
  free(pinned);
  OK(cuStreamDestroy(s));
  OK(cuStreamDestroy(other));
}

TEST_F(Double, PeerAccessAndItsAbsence) {
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  ASSERT_NO_FATAL_FAILURE(map_fresh(4 * MiB, &va, &h));
  CUmemAccessDesc d[2] = {rw(0), rw(1)};
  OK(cuMemSetAccess(va, 4 * MiB, d, 2));
  unsigned long long flags = 0;
  OK(cuMemGetAccess(&flags, &d[1].location, va));
  EXPECT_EQ((unsigned long long)CU_MEM_ACCESS_FLAGS_PROT_READWRITE, flags);
  d[1] = rw(1, false);
  OK(cuMemSetAccess(va, 4 * MiB, &d[1], 1));
  OK(cuMemGetAccess(&flags, &d[1].location, va));
  EXPECT_EQ(0u, flags);
  ASSERT_NO_FATAL_FAILURE(give_back(4 * MiB, va, h));
  stop();
  ASSERT_EQ(0, cudadouble_configure("devices=2,peer=0"));
  start("devices=2,peer=0");
  ASSERT_NO_FATAL_FAILURE(map_fresh(4 * MiB, &va, &h));
  d[1] = rw(1);
  REFUSED(CUDA_ERROR_INVALID_DEVICE, cuMemSetAccess(va, 4 * MiB, &d[1], 1));
  ASSERT_NO_FATAL_FAILURE(give_back(4 * MiB, va, h));
}

TEST_F(Double, EventsCompleteInStreamOrder) {
  CUstream s = nullptr;
  CUevent e1 = nullptr, e2 = nullptr;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  OK(cuEventCreate(&e1, CU_EVENT_DISABLE_TIMING));
  OK(cuEventCreate(&e2, CU_EVENT_DISABLE_TIMING));
  OK(cuEventRecord(e1, s));
  ASSERT_EQ(0, cudadouble_hold_stream(s, 1));
  OK(cuEventRecord(e2, s));
  EXPECT_EQ(CUDA_SUCCESS, cuEventQuery(e1));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, cuEventQuery(e2));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, cuStreamQuery(s));
  ASSERT_EQ(0, cudadouble_hold_stream(s, 0));
  EXPECT_EQ(CUDA_SUCCESS, cuEventQuery(e2));
  // a wait on a registered host word, and a write after it
  alignas(64) static volatile uint32_t words[1024];
  words[0] = 0;
  words[1] = 0;
  OK(cuMemHostRegister((void *)words, sizeof words, CU_MEMHOSTREGISTER_DEVICEMAP));
  REFUSED(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
          cuMemHostRegister((void *)&words[8], 64, CU_MEMHOSTREGISTER_DEVICEMAP));
  CUdeviceptr dw = 0;
  OK(cuMemHostGetDevicePointer(&dw, (void *)words, 0));
  OK(cuStreamWaitValue32(s, dw, 1, CU_STREAM_WAIT_VALUE_GEQ));
  OK(cuStreamWriteValue32(s, dw + 4, 42, CU_STREAM_WRITE_VALUE_DEFAULT));
  OK(cuEventRecord(e1, s));
  EXPECT_EQ(CUDA_ERROR_NOT_READY, cuEventQuery(e1));
  EXPECT_EQ(0u, words[1]) << "the write waits behind the wait";
  std::thread([&] {
    usleep(50000);
    __atomic_store_n(&words[0], 1u, __ATOMIC_RELEASE);
  }).detach();
  OK(cuEventSynchronize(e1)); // waits until another thread writes the word
  EXPECT_EQ(42u, words[1]);
  REFUSED(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, cuMemHostUnregister((void *)&words[8]));
  OK(cuMemHostUnregister((void *)words));
  OK(cuEventDestroy(e1));
  OK(cuEventDestroy(e2));
  REFUSED(CUDA_ERROR_INVALID_HANDLE, cuEventQuery(e2));
  OK(cuStreamDestroy(s));
  REFUSED(CUDA_ERROR_INVALID_HANDLE, cuStreamSynchronize(s));
}

TEST_F(Double, SynchronizeOnAHeldStreamTimesOutAndSaysSo) {
  stop();
  ASSERT_EQ(0, cudadouble_configure("sync_timeout=50"));
  start("sync_timeout=50");
  CUstream s = nullptr;
  OK(cuStreamCreate(&s, 0));
  ASSERT_EQ(0, cudadouble_hold_stream(s, 1));
  EXPECT_EQ(CUDA_ERROR_LAUNCH_TIMEOUT, cuStreamSynchronize(s));
  EXPECT_NE(nullptr, strstr(cudadouble_last_message(), "wait forever")) << cudadouble_last_message();
  ASSERT_EQ(0, cudadouble_hold_stream(s, 0));
  OK(cuStreamSynchronize(s));
  OK(cuStreamDestroy(s));
}

TEST_F(Double, ExportedFdWorksInAnotherProcess) {
  CUmemAllocationProp p = prop();
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  OK(cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0));
  OK(cuMemCreate(&h, 4 * MiB, &p, 0));
  int fd = -1;
  OK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  pid_t pid = fork();
  if (pid == 0) { // a copy of this process: import, map elsewhere, write
    CUmemGenericAllocationHandle mine = 0;
    CUdeviceptr at = 0;
    CUmemAccessDesc d = rw();
    unsigned char b[16];
    memset(b, 0xab, sizeof b);
    bool ok = cuMemImportFromShareableHandle(&mine, (void *)(uintptr_t)fd,
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0 &&
              cuMemAddressReserve(&at, 4 * MiB, 0, 0, 0) == 0 &&
              cuMemMap(at, 4 * MiB, 0, mine, 0) == 0 && cuMemSetAccess(at, 4 * MiB, &d, 1) == 0 &&
              cuMemcpyHtoD(at + 1000, b, sizeof b) == 0;
    _exit(ok ? 0 : 1);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(pid, waitpid(pid, &status, 0));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  OK(cuMemMap(va, 4 * MiB, 0, h, 0));
  CUmemAccessDesc d = rw();
  OK(cuMemSetAccess(va, 4 * MiB, &d, 1));
  unsigned char b[16] = {};
  OK(cuMemcpyDtoH(b, va + 1000, sizeof b));
  EXPECT_EQ(0xab, b[0]);
  EXPECT_EQ(0xab, b[15]);
  CUmemGenericAllocationHandle other = 0;
  REFUSED(CUDA_ERROR_INVALID_VALUE,
          cuMemImportFromShareableHandle(&other, (void *)(uintptr_t)0,
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)); // stdin
  close(fd);
  ASSERT_NO_FATAL_FAILURE(give_back(4 * MiB, va, h));
  CUmemAllocationProp none = prop();
  none.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
  OK(cuMemCreate(&h, 2 * MiB, &none, 0));
  REFUSED(CUDA_ERROR_INVALID_VALUE,
          cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  OK(cuMemRelease(h));
}

TEST_F(Double, TheLogRecordsCallsAndInjectedFailures) {
  CUmemAllocationProp p = prop();
  CUmemGenericAllocationHandle h = 0;
  cudadouble_log_clear();
  ASSERT_EQ(0, cudadouble_fail("cuMemCreate", 2, CUDA_ERROR_OUT_OF_MEMORY));
  OK(cuMemCreate(&h, 2 * MiB, &p, 0));
  CUmemGenericAllocationHandle h2 = 0;
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, cuMemCreate(&h2, 2 * MiB, &p, 0));
  OK(cuMemRelease(h));
  ASSERT_EQ(3u, cudadouble_log_count());
  cudadouble_call c[3];
  for (size_t i = 0; i < 3; i++) ASSERT_EQ(0, cudadouble_log_get(i, &c[i]));
  EXPECT_STREQ("cuMemCreate", c[0].name);
  EXPECT_EQ(h, c[0].handle);
  EXPECT_EQ(2 * MiB, c[0].size);
  EXPECT_EQ(0, c[0].device);
  EXPECT_EQ(CUDA_ERROR_OUT_OF_MEMORY, c[1].result);
  EXPECT_EQ(1, c[1].injected);
  EXPECT_STREQ("cuMemRelease", c[2].name);
  EXPECT_EQ(h, c[2].handle);
  EXPECT_LT(c[0].seq, c[2].seq);
  EXPECT_NE(0, cudadouble_fail("cuNoSuchCall", 1, 1));
}

TEST_F(Double, ConfigurationIsCheckedAndRefusedWhileLive) {
  EXPECT_NE(0, cudadouble_configure("devices=1")) << "a context is retained";
  stop();
  for (const char *bad : {"devices=9", "capacity=8X", "granularity=3M", "recommended=1M",
                          "colour=blue", "devices"}) {
    EXPECT_EQ(CUDA_ERROR_INVALID_VALUE, cudadouble_configure(bad)) << bad;
    EXPECT_NE(nullptr, strstr(cudadouble_last_message(), "configuration")) << bad;
  }
  start("devices=1,capacity=16M,granularity=64K,recommended=2M");
  int n = 0;
  OK(cuDeviceGetCount(&n));
  EXPECT_EQ(1, n);
  CUmemAllocationProp p = prop();
  size_t mn = 0;
  OK(cuMemGetAllocationGranularity(&mn, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT_EQ(64u << 10, mn);
}

} // namespace
