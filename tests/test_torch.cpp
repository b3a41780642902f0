// SPDX-License-Identifier: Apache-2.0
// libexpseg_torch.so (plugin/expseg_torch.c) as PyTorch uses it: loaded with dlopen, every entry
// point resolved by name, driven from 8 threads on two device ordinals of the host driver
// (chosen through $EXPSEG_DRIVER, as a PyTorch user would), statistics checked per device,
// NULL with the message kept on out-of-memory, foreign frees ignored without a crash.
// test_gpu_torch.cpp runs the same on the cuda backend against the CUDA driver double.
#include <gtest/gtest.h>

#include "host_fail.h"
#include "test_seed.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "expseg.h"
#ifdef EXPSEG_TORCH_GPU
#include "cudadouble.h"
#endif

namespace {

#ifndef EXPSEG_TORCH_GPU
#define TORCH_SUITE Torch
const char *const kDriver = "host";
// Before anything creates an allocator: every device of this process runs on host memory.
const int kEnvSet = [] {
  setenv("EXPSEG_DRIVER", "host:capacity=256M", 1);
  unsetenv("EXPSEG_ALLOC_CONF");
  unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  unsetenv("PYTORCH_ALLOC_CONF");
  return 0;
}();

// Stream k (0..2) of a device: any value is a stream on host.
void *stream_of(int, int k) { return reinterpret_cast<void *>((uintptr_t)k * 0x1000); }
#define NEED_DRIVER() (void)0
#else
#define TORCH_SUITE GpuTorch // test names must differ from test_torch's
const char *const kDriver = "cuda";
// test_gpu_torch.cpp: every device runs on the cuda backend against the CUDA driver double,
// configured (before its first use) as the host run's devices: 256 MiB, 2 MiB pages.
const int kEnvSet = [] {
  setenv("EXPSEG_DRIVER", "cuda", 1);
  setenv("EXPSEG_CUDA_DOUBLE", "capacity=256M,granularity=2M,recommended=2M", 1);
  unsetenv("EXPSEG_ALLOC_CONF");
  unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  unsetenv("PYTORCH_ALLOC_CONF");
  return 0;
}();

// Stream k (0..2) of a device: 0 is the default stream, 1 and 2 are CUstreams made on the
// device's primary context (through dlsym: only vmm/cuda.c includes cuda.h).
void *stream_of(int dev, int k) {
  static void *made[2][3];
  static std::once_flag once;
  std::call_once(once, [] {
    void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(nullptr, cu) << dlerror();
    auto init = (int (*)(unsigned))dlsym(cu, "cuInit");
    auto retain = (int (*)(void **, int))dlsym(cu, "cuDevicePrimaryCtxRetain");
    auto set_current = (int (*)(void *))dlsym(cu, "cuCtxSetCurrent");
    auto create = (int (*)(void **, unsigned))dlsym(cu, "cuStreamCreate");
    ASSERT_TRUE(init && retain && set_current && create);
    ASSERT_EQ(0, init(0));
    for (int d = 0; d < 2; d++) {
      void *ctx = nullptr;
      ASSERT_EQ(0, retain(&ctx, d)); // kept: the streams live as long as the process
      ASSERT_EQ(0, set_current(ctx));
      for (int i = 1; i < 3; i++) ASSERT_EQ(0, create(&made[d][i], 1 /* NON_BLOCKING */));
    }
    ASSERT_EQ(0, set_current(nullptr));
  });
  return made[dev][k];
}
// the tests assume the devices configured above: a real GPU is not them
#define NEED_DRIVER()                                                    \
  cudadouble_api api_;                                                   \
  if (!cudadouble_load(&api_))                                           \
    GTEST_SKIP() << "needs the CUDA driver double (tests/cuda_double): the tests use its two " \
                    "devices of 256 MiB"
#endif

struct Lib {
  void *h = nullptr;
  void *(*alloc)(size_t, int, void *);
  void (*free)(void *, size_t, int, void *);
  void (*init)(int);
  void (*reset)();
  void (*memory_fraction)(double, int);
  void (*record_stream)(void *, void *);
  const char *(*last_error)(int);
  const char *(*driver_name)(int);
  int (*get_info)(int, expseg_info *);
  int (*mem_get_info)(int, size_t *, size_t *);
  int (*stat)(int, const char *, int64_t *);
  int (*stats_foreach)(int, void (*)(void *, const char *, int64_t), void *);
  size_t (*stats_json)(int, char *, size_t);
  int (*reset_peak_stats)(int);
  int (*reset_accumulated_stats)(int);
  int (*empty_cache)(int);
  int (*snapshot_dump)(int, const char *);
  int (*set_safe_free)(int);
  int (*deferred)(int, size_t *, size_t *);
  int (*synchronize)(int);
  expseg_allocator *(*allocator)(int, int);
  void *(*alloc_raising)(size_t, int, void *);
  int (*alloc_status)(void);

  template <class F> void resolve(F &f, const char *name) {
    void *p = dlsym(h, name);
    ASSERT_NE(nullptr, p) << name << " is not exported by " << EXPSEG_TORCH_LIB;
    memcpy(&f, &p, sizeof p);
  }
  void load() {
    h = dlopen(EXPSEG_TORCH_LIB, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(nullptr, h) << dlerror();
#define R(n) resolve(n, "expseg_torch_" #n)
    R(alloc); R(free); R(init); R(reset); R(memory_fraction); R(record_stream);
    R(last_error); R(driver_name); R(get_info); R(mem_get_info); R(stat); R(stats_foreach);
    R(stats_json); R(reset_peak_stats); R(reset_accumulated_stats); R(empty_cache);
    R(snapshot_dump); R(set_safe_free); R(deferred); R(synchronize); R(allocator);
    R(alloc_raising); R(alloc_status);
#undef R
  }
  int64_t get(int device, const char *key) {
    int64_t v = -1;
    EXPECT_EQ(EXPSEG_OK, stat(device, key, &v)) << key << ": " << last_error(device);
    return v;
  }
};

Lib &lib() {
  static Lib l;
  if (!l.h) l.load();
  return l;
}

TEST(TORCH_SUITE, EveryEntryPointResolvesByName) {
  NEED_DRIVER();
  (void)kEnvSet;
  ASSERT_NO_FATAL_FAILURE(lib());
  EXPECT_STREQ(kDriver, lib().driver_name(0));
  EXPECT_STREQ(kDriver, lib().driver_name(1));
}

// The Python route's alloc function: a failure throws (PyTorch's pluggable allocator does not
// check the pointer and turns the exception into a Python RuntimeError); size 0 is NULL, as
// cudaMalloc; success is an ordinary block the C free takes back.
TEST(TORCH_SUITE, RaisingAllocThrowsWhereTheCOneReturnsNull) {
  NEED_DRIVER();
  Lib &L = lib();
  const int64_t live0 = L.get(0, "allocation.all.current");
  EXPECT_EQ(nullptr, L.alloc_raising(0, 0, nullptr));
  void *p = L.alloc_raising(1u << 20, 0, stream_of(0, 0));
  EXPECT_EQ(live0 + 1, L.get(0, "allocation.all.current"));
  ASSERT_NE(nullptr, p) << L.last_error(0);
  EXPECT_EQ(EXPSEG_OK, L.alloc_status());
  L.free(p, 1u << 20, 0, stream_of(0, 0));
  try {
    L.alloc_raising(size_t(1) << 40, 0, stream_of(0, 0)); // a TiB: more than the device has
    ADD_FAILURE() << "no exception for a TiB";
  } catch (const std::runtime_error &e) {
    const std::string m = e.what();
    EXPECT_NE(std::string::npos, m.find("CUDA out of memory (expseg): expseg_torch_alloc(")) << m;
    EXPECT_NE(std::string::npos, m.find("1099511627776 bytes, device 0")) << m;
    EXPECT_EQ(EXPSEG_ERR_OUT_OF_MEMORY, L.alloc_status());
  }
  try {
    L.alloc_raising(16, 64, nullptr);
    ADD_FAILURE() << "no exception for device 64";
  } catch (const std::runtime_error &e) {
    const std::string m = e.what();
    EXPECT_NE(std::string::npos, m.find("device 64")) << m;
    // not memory running out: the status is named, "out of memory" is not said
    EXPECT_NE(std::string::npos,
              m.find("expseg could not allocate (EXPSEG_ERR_INVALID_ARGUMENT): ")) << m;
    EXPECT_EQ(std::string::npos, m.find("out of memory")) << m;
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, L.alloc_status());
  }
  EXPECT_EQ(live0, L.get(0, "allocation.all.current")) << "a failure leaves nothing allocated";
}

// Host memory running out (expseg's own bookkeeping) is not the device's: the status the
// Python route reads says so (EXPSEG_ERR_HOST_OUT_OF_MEMORY, not EXPSEG_ERR_OUT_OF_MEMORY, so
// no "CUDA out of memory" and no torch.cuda.OutOfMemoryError), the message says host memory,
// no out-of-memory is counted, and with host memory back the same request is served.
TEST(TORCH_SUITE, HostMemoryRunningOutIsNotDeviceOutOfMemory) {
  NEED_DRIVER();
#ifndef EXPSEG_TEST_HOST_FAIL
  GTEST_SKIP() << "host allocations cannot be failed under a sanitizer";
#else
  Lib &L = lib();
  ASSERT_EQ(EXPSEG_OK, L.empty_cache(0)) << L.last_error(0);
  const int64_t ooms = L.get(0, "num_ooms");
  void *const fresh = stream_of(0, 2); // a stream with nothing cached: the request must grow
  const size_t size = 40u << 20;
  g_fail_host = true; // no host allocation succeeds inside the call
  void *p = L.alloc(size, 0, fresh);
  const int st = L.alloc_status();
  g_fail_host = false;
  EXPECT_EQ(nullptr, p);
  EXPECT_EQ(EXPSEG_ERR_HOST_OUT_OF_MEMORY, st) << L.last_error(0);
  const std::string m = L.last_error(0);
  EXPECT_NE(std::string::npos, m.find("host memory")) << m;
  EXPECT_EQ(std::string::npos, m.find("out of memory: tried to allocate")) << "a device report: " << m;
  EXPECT_EQ(ooms, L.get(0, "num_ooms"));
  p = L.alloc(size, 0, fresh);
  ASSERT_NE(nullptr, p) << L.last_error(0);
  EXPECT_EQ(EXPSEG_OK, L.alloc_status());
  L.free(p, size, 0, fresh);
#endif
}

// The accessor the C++ backend uses: the same allocator every entry point serves.
TEST(Torch, AllocatorAccessorSharesTheDevicesAllocator) {
  ASSERT_NO_FATAL_FAILURE(lib());
  EXPECT_EQ(nullptr, lib().allocator(5, 0)); // never made: not made by asking
  EXPECT_EQ(nullptr, lib().allocator(-1, 1));
  EXPECT_NE(std::string(lib().last_error(-1)).find("device -1"), std::string::npos);
  expseg_allocator *a = lib().allocator(0, 1);
  ASSERT_NE(nullptr, a) << lib().last_error(0);
  EXPECT_EQ(a, lib().allocator(0, 0));
  int64_t before = lib().get(0, "allocation.all.allocated");
  void *p = lib().alloc(4096, 0, nullptr);
  ASSERT_NE(nullptr, p);
  int64_t v = 0;
  ASSERT_EQ(EXPSEG_OK, expseg_stat(a, "allocation.all.allocated", &v));
  EXPECT_EQ(v, before + 1);
  lib().free(p, 4096, 0, nullptr);
}

// 8 threads, threads 0,2,4,6 on device 0 and 1,3,5,7 on device 1, random sizes and streams
// (seeded), frees in random order; each thread keeps some blocks until the end, and the
// statistics of each device must count exactly that device's live blocks.
TEST(TORCH_SUITE, EightThreadsTwoDevicesKeepTheirOwnStatistics) {
  NEED_DRIVER();
  Lib &L = lib();
  EXPSEG_SEEDED(seed, 20261122u);
  for (int d = 0; d < 2; d++) ASSERT_EQ(EXPSEG_OK, L.empty_cache(d)) << L.last_error(d);
  const int64_t base_alloc[2] = {L.get(0, "allocation.all.current"),
                                 L.get(1, "allocation.all.current")};
  const int64_t base_req[2] = {L.get(0, "requested_bytes.all.current"),
                               L.get(1, "requested_bytes.all.current")};
  struct Kept {
    void *p;
    size_t size;
  };
  std::vector<std::vector<Kept>> kept(8);
  std::vector<std::thread> threads;
  std::vector<int> failures(8, 0);
  (void)stream_of(0, 0); // the streams are made before the threads start
  for (int t = 0; t < 8; t++) {
    threads.emplace_back([&, t] {
      const int dev = t % 2;
      std::mt19937 rng(seed + (unsigned)t);
      std::vector<Kept> live;
      for (int i = 0; i < 3000; i++) {
        if (live.empty() || rng() % 3 != 0) {
          size_t size = rng() % 4 == 0 ? 1 + rng() % (1u << 20) : 1 + rng() % 20000;
          void *stream = stream_of(dev, (int)(rng() % 3));
          void *p = L.alloc(size, dev, stream);
          if (!p) {
            failures[t]++;
            continue;
          }
          memset(p, t, size < 64 ? size : 64); // host driver: real memory
          live.push_back({p, size});
        } else {
          size_t k = rng() % live.size();
          L.free(live[k].p, live[k].size, dev, nullptr);
          live[k] = live.back();
          live.pop_back();
        }
        if (live.size() > 24) { // bound the working set: 4 threads x 25 x 1 MiB per device
          L.free(live.front().p, live.front().size, dev, nullptr);
          live.erase(live.begin());
        }
      }
      kept[t] = live;
    });
  }
  for (auto &th : threads) th.join();
  for (int t = 0; t < 8; t++) EXPECT_EQ(0, failures[t]) << "thread " << t << ": "
                                                          << L.last_error(t % 2);
  for (int d = 0; d < 2; d++) {
    int64_t n = 0, bytes = 0;
    for (int t = d; t < 8; t += 2)
      for (const Kept &k : kept[t]) n++, bytes += (int64_t)k.size;
    EXPECT_EQ(base_alloc[d] + n, L.get(d, "allocation.all.current")) << "device " << d;
    EXPECT_EQ(base_req[d] + bytes, L.get(d, "requested_bytes.all.current")) << "device " << d;
    EXPECT_GE(L.get(d, "allocated_bytes.all.current"), bytes);
    EXPECT_LE(L.get(d, "allocated_bytes.all.current"), L.get(d, "reserved_bytes.all.current"));
  }
  for (int t = 0; t < 8; t++)
    for (const Kept &k : kept[t]) L.free(k.p, k.size, t % 2, nullptr);
  for (int d = 0; d < 2; d++) {
    EXPECT_EQ(base_alloc[d], L.get(d, "allocation.all.current"));
    EXPECT_EQ(base_req[d], L.get(d, "requested_bytes.all.current"));
    EXPECT_GT(L.get(d, "allocation.all.allocated"), 1000) << "device " << d << " was used";
  }
}

TEST(TORCH_SUITE, OutOfMemoryIsNullWithTheMessageKeptAndPrinted) {
  NEED_DRIVER();
  Lib &L = lib();
  testing::internal::CaptureStderr();
  void *p = L.alloc(1ull << 30, 1, nullptr); // device capacity is 256 MiB
  std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_EQ(nullptr, p);
  std::string m = L.last_error(1);
  EXPECT_NE(std::string::npos, m.find("out of memory")) << m;
  EXPECT_NE(std::string::npos, m.find("tried to allocate")) << m; // expseg's own OOM text
  EXPECT_NE(std::string::npos, m.find("device 1")) << m;
  EXPECT_NE(std::string::npos, printed.find(m)) << "stderr: " << printed;
  EXPECT_EQ(1u, (size_t)std::count(printed.begin(), printed.end(), '\n')) << printed;
  // the message is the device's, readable from any thread; device 0 is untouched by it
  std::string other;
  std::thread([&] { other = L.last_error(1); }).join();
  EXPECT_EQ(m, other);
  EXPECT_EQ(std::string::npos, std::string(L.last_error(0)).find("1073741824"));
  EXPECT_GE(L.get(1, "num_ooms"), 1);
  // and the allocator still works
  p = L.alloc(1000, 1, nullptr);
  ASSERT_NE(nullptr, p) << L.last_error(1);
  L.free(p, 1000, 1, nullptr);
}

TEST(TORCH_SUITE, ForeignFreesAreIgnoredWithAMessage) {
  NEED_DRIVER();
  Lib &L = lib();
  void *mine = L.alloc(4096, 0, nullptr);
  ASSERT_NE(nullptr, mine) << L.last_error(0);
  void *foreign = malloc(64);
  testing::internal::CaptureStderr();
  L.free(foreign, 64, 0, nullptr);          // not expseg's
  L.free(foreign, 64, 40, nullptr);         // a device without an allocator
  L.free(foreign, 64, -3, nullptr);         // no such device
  L.free(mine, 4096, 1, nullptr);           // the wrong device's allocator
  L.free(nullptr, 0, 0, nullptr);           // nothing
  std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_NE(std::string::npos, std::string(L.last_error(1)).find("ignored")) << L.last_error(1);
  EXPECT_NE(std::string::npos, std::string(L.last_error(40)).find("no expseg allocator"))
      << L.last_error(40);
  EXPECT_NE(std::string::npos, printed.find("ignored")) << printed;
  free(foreign);
  L.free(mine, 4096, 0, nullptr); // still live on device 0: freed properly now
  EXPECT_EQ(0, L.get(0, "allocation.all.current"));
}

TEST(TORCH_SUITE, StatisticsResetsCacheAndHooks) {
  NEED_DRIVER();
  Lib &L = lib();
  void *p = L.alloc(5u << 20, 0, nullptr);
  ASSERT_NE(nullptr, p) << L.last_error(0);
  // JSON: every key of foreach, in the same order, with the same values
  std::vector<std::pair<std::string, int64_t>> keys;
  ASSERT_EQ(EXPSEG_OK, L.stats_foreach(0,
                                       [](void *ctx, const char *k, int64_t v) {
                                         static_cast<decltype(keys) *>(ctx)->emplace_back(k, v);
                                       },
                                       &keys));
  ASSERT_GT(keys.size(), 50u);
  size_t need = L.stats_json(0, nullptr, 0);
  std::string json(need + 1, '\0');
  ASSERT_EQ(need, L.stats_json(0, &json[0], json.size()));
  json.resize(need);
  std::string want = "{";
  for (size_t i = 0; i < keys.size(); i++)
    want += (i ? ", \"" : "\"") + keys[i].first + "\": " + std::to_string(keys[i].second);
  want += "}";
  EXPECT_EQ(want, json);
  char small[8];
  EXPECT_EQ(need, L.stats_json(0, small, sizeof small));
  EXPECT_EQ(7u, strlen(small)) << "truncated, NUL-terminated";

  int64_t peak = L.get(0, "allocated_bytes.all.peak");
  EXPECT_GE(peak, 5 << 20);
  L.record_stream(p, stream_of(0, 2));
  L.free(p, 5u << 20, 0, nullptr);
  EXPECT_EQ(EXPSEG_OK, L.reset_peak_stats(0));
  EXPECT_EQ(L.get(0, "allocated_bytes.all.current"), L.get(0, "allocated_bytes.all.peak"));
  EXPECT_EQ(EXPSEG_OK, L.reset_accumulated_stats(0));
  EXPECT_EQ(0, L.get(0, "allocation.all.allocated"));
  EXPECT_GT(L.get(0, "reserved_bytes.all.current"), 0);
  L.reset(); // set_reset_fn: empty_cache everywhere
  EXPECT_EQ(0, L.get(0, "reserved_bytes.all.current"));
  EXPECT_EQ(EXPSEG_OK, L.empty_cache(-1));

  expseg_info info;
  ASSERT_EQ(EXPSEG_OK, L.get_info(0, &info));
  EXPECT_STREQ(kDriver, info.driver);
  EXPECT_EQ(256u << 20, info.total_memory);
  size_t fr = 0, tot = 0;
  ASSERT_EQ(EXPSEG_OK, L.mem_get_info(0, &fr, &tot));
  EXPECT_EQ(256u << 20, tot);
  EXPECT_EQ(tot, fr);

  // memory fraction: an eighth of 256 MiB refuses 40 MiB, then lifting it allows it
  L.memory_fraction(0.125, 0);
  EXPECT_EQ(nullptr, L.alloc(40u << 20, 0, nullptr));
  L.memory_fraction(1.0, 0);
  p = L.alloc(40u << 20, 0, nullptr);
  EXPECT_NE(nullptr, p) << L.last_error(0);
  L.free(p, 40u << 20, 0, nullptr);
  L.memory_fraction(2.0, 0);
  EXPECT_NE(std::string::npos, std::string(L.last_error(0)).find("outside [0, 1]"))
      << L.last_error(0);
  L.record_stream(reinterpret_cast<void *>(0x10), nullptr); // nobody's pointer: ignored
  EXPECT_NE(std::string::npos, std::string(L.last_error(-1)).find("record_stream"));

  int st = L.snapshot_dump(0, "/tmp/expseg-torch-test.pickle");
  EXPECT_TRUE(st == EXPSEG_OK || st == EXPSEG_ERR_UNSUPPORTED) << L.last_error(0);
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, L.stat(0, "no.such.key", &peak));
  EXPECT_EQ(nullptr, L.alloc(10, -1, nullptr));
  EXPECT_EQ(nullptr, L.alloc(10, 64, nullptr));
  EXPECT_NE(std::string::npos, std::string(L.last_error(64)).find("device 64"));
  EXPECT_EQ(nullptr, L.alloc(0, 0, nullptr)) << "size 0: NULL, as cudaMalloc";
  // init: the device count bounds the ordinals afterwards
  L.init(2);
  EXPECT_EQ(nullptr, L.alloc(10, 2, nullptr));
  EXPECT_NE(std::string::npos, std::string(L.last_error(2)).find("expseg_torch_init"))
      << L.last_error(2);
}

// Safe mode from 4 threads on device 1: frees are deferred (still counted as allocated)
// until a batch of 16 completes after a device-wide synchronization; turning the mode off
// completes the rest; the statistics end where they began.
TEST(Torch, SafeModeDefersFreesFromManyThreads) {
  NEED_DRIVER(); // device 1 and made-up streams: the double's devices, not a real GPU's
  Lib &L = lib();
  EXPSEG_SEEDED(seed, 20261126u);
  ASSERT_EQ(EXPSEG_OK, L.synchronize(1)) << L.last_error(1);
  const int64_t base = L.get(1, "allocation.all.current");
  const int64_t syncs0 = L.get(1, "expseg.driver.device_synchronize");
  ASSERT_EQ(EXPSEG_OK, L.set_safe_free(16));
  void *p = L.alloc(1u << 20, 1, nullptr);
  ASSERT_NE(nullptr, p) << L.last_error(1);
  L.free(p, 1u << 20, 1, nullptr);
  size_t n = 0, bytes = 0;
  ASSERT_EQ(EXPSEG_OK, L.deferred(1, &n, &bytes));
  EXPECT_EQ(1u, n);
  EXPECT_EQ(1u << 20, bytes);
  EXPECT_EQ(base + 1, L.get(1, "allocation.all.current")) << "a deferred block is not free yet";
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; t++)
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed + (unsigned)t);
      for (int i = 0; i < 200; i++) {
        size_t size = 512 + rng() % (2u << 20);
        void *q = L.alloc(size, 1, reinterpret_cast<void *>(uintptr_t(t + 1)));
        if (!q) {
          failures[t]++;
          continue;
        }
        L.free(q, size, 1, nullptr);
      }
    });
  for (auto &th : threads) th.join();
  for (int t = 0; t < 4; t++) EXPECT_EQ(0, failures[t]) << "thread " << t << ": " << L.last_error(1);
  EXPECT_GT(L.get(1, "expseg.driver.device_synchronize"), syncs0 + 800 / 16 / 2);
  ASSERT_EQ(EXPSEG_OK, L.deferred(1, &n, &bytes));
  EXPECT_LT(n, 16u);
  ASSERT_EQ(EXPSEG_OK, L.set_safe_free(0)); // off: completes what is left
  ASSERT_EQ(EXPSEG_OK, L.deferred(1, &n, &bytes));
  EXPECT_EQ(0u, n);
  EXPECT_EQ(0u, bytes);
  EXPECT_EQ(base, L.get(1, "allocation.all.current"));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, L.set_safe_free(-1));
  EXPECT_NE(std::string::npos, std::string(L.last_error(-1)).find("set_safe_free(-1)"))
      << L.last_error(-1);
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, L.deferred(64, &n, &bytes));
}

// expseg_torch_region_info_json as a hostile caller uses it: NULL buffer, len 0, 1 and one
// short of the text (truncated and NUL-terminated, nothing written past len), NULL needed,
// NULL, empty, overlong and non-ASCII tags, unknown devices (an error, "" and needed 0),
// a region asleep and a region freed of all its blocks.
TEST(Torch, RegionInfoJsonBuffersTagsAndDevices) {
  NEED_DRIVER();
  Lib &L = lib();
  int (*region)(int, const char *, int);
  int (*sleep)(int, const char *, int);
  int (*wake)(int, const char *);
  int (*info)(int, const char *, char *, size_t, size_t *);
  L.resolve(region, "expseg_torch_region");
  L.resolve(sleep, "expseg_torch_sleep");
  L.resolve(wake, "expseg_torch_wake");
  L.resolve(info, "expseg_torch_region_info_json");
  ASSERT_EQ(EXPSEG_OK, region(0, "adv5info", 1)) << L.last_error(0);
  void *p = L.alloc(1u << 20, 0, nullptr);
  ASSERT_EQ(EXPSEG_OK, region(0, "adv5info", 0)) << L.last_error(0);
  ASSERT_NE(nullptr, p) << L.last_error(0);
  size_t need = 7;
  ASSERT_EQ(EXPSEG_OK, info(0, "adv5info", nullptr, 0, &need)) << L.last_error(0);
  ASSERT_GT(need, 2u);
  std::string whole(need + 16, '#');
  ASSERT_EQ(EXPSEG_OK, info(0, "adv5info", &whole[0], need, nullptr));
  EXPECT_EQ(need - 1, strlen(whole.c_str()));
  EXPECT_EQ('#', whole[need]) << "nothing written past len";
  EXPECT_NE(std::string::npos, whole.find("\"live_bytes\": 1048576")) << whole;
  EXPECT_NE(std::string::npos, whole.find("\"asleep\": false")) << whole;
  EXPECT_EQ('}', whole[need - 2]);
  for (size_t len : {size_t(0), size_t(1), size_t(2), need - 1}) {
    std::string b(need + 16, '#');
    size_t n = 0;
    ASSERT_EQ(EXPSEG_OK, info(0, "adv5info", &b[0], len, &n)) << len;
    EXPECT_EQ(need, n) << len;
    if (len == 0) {
      EXPECT_EQ('#', b[0]) << "len 0: nothing written";
    } else {
      EXPECT_EQ(len - 1, strlen(b.c_str())) << len;
      EXPECT_EQ(0, memcmp(b.c_str(), whole.c_str(), len - 1)) << len;
      EXPECT_EQ('#', b[len]) << "len " << len << ": nothing written past len";
    }
  }
  ASSERT_EQ(EXPSEG_OK, info(0, "adv5info", nullptr, 100, nullptr)) << "NULL buffer, len 100";
  std::string big64(64, 'x'), big(100000, 'x');
  for (const char *tag : {(const char *)nullptr, "", "w\xc3\xa9", "tab\there", big64.c_str(),
                          big.c_str(), "adv5-never-made"}) {
    char b[32];
    memset(b, '#', sizeof b);
    size_t n = 7;
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, info(0, tag, b, sizeof b, &n))
        << (tag ? std::string(tag).substr(0, 40) : "NULL");
    EXPECT_EQ('\0', b[0]);
    EXPECT_EQ(0u, n);
    std::string e = L.last_error(0);
    EXPECT_NE(std::string::npos, e.find("expseg_torch_region_info_json")) << e;
    EXPECT_LT(e.size(), 400u) << "the message names at most a part of a huge tag";
  }
  for (int dev : {-1, 64, 1 << 20}) {
    char b[32];
    memset(b, '#', sizeof b);
    size_t n = 7;
    EXPECT_NE(EXPSEG_OK, info(dev, "adv5info", b, sizeof b, &n)) << dev;
    EXPECT_EQ('\0', b[0]) << dev;
    EXPECT_EQ(0u, n) << dev;
  }
  // asleep, then freed of its one block while asleep, then woken
  ASSERT_EQ(EXPSEG_OK, sleep(0, "adv5info", 0)) << L.last_error(0);
  std::string b(4096, '\0');
  ASSERT_EQ(EXPSEG_OK, info(0, "adv5info", &b[0], b.size(), &need));
  EXPECT_NE(std::string::npos, b.find("\"asleep\": true")) << b;
  L.free(p, 1u << 20, 0, nullptr);
  ASSERT_EQ(EXPSEG_OK, info(0, "adv5info", &b[0], b.size(), &need));
  EXPECT_NE(std::string::npos, b.find("\"deferred_frees\": 1")) << b;
  ASSERT_EQ(EXPSEG_OK, wake(0, "adv5info")) << L.last_error(0);
  ASSERT_EQ(EXPSEG_OK, info(0, "adv5info", &b[0], b.size(), &need));
  EXPECT_NE(std::string::npos, b.find("\"live_bytes\": 0,")) << b;
  EXPECT_NE(std::string::npos, b.find("\"asleep\": false")) << b;
}

} // namespace
