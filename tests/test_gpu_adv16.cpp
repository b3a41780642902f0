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
        if (expseg_record_stream(a, live[1], s2) != EXPSEG_OK) std::_Exit(8);
        api.shutdown();
        // a late destructor frees what it holds (one block used on another stream), then
        // destroys the allocator
        for (size_t i = 1; i < 4; i++)
          if (expseg_free(a, live[i]) != EXPSEG_OK) {
            fprintf(stderr, "free: %s\n", expseg_last_error());
            std::_Exit(9);
          }
        expseg_destroy(a);
        fprintf(stderr, "destroyed\n");
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "^destroyed\n$");
}

// A failed allocation-side call (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess,
// cuEventCreate, cuEventRecord), injected at each of the first calls a fixed workload makes:
// the error names the call and its CUresult; nothing is left mapped without access (a map
// whose cuMemSetAccess failed is undone); the double holds exactly the mapped bytes and
// handles the allocator counts; after expseg_destroy nothing is left.
struct Mapped {
  uint64_t addr, size;
  bool access;
};

void check_log(const cudadouble_api &api, int64_t allocator_mapped) {
  std::vector<Mapped> maps;
  for (size_t i = 0, n = api.log_count(); i < n; i++) {
    cudadouble_call c{};
    ASSERT_EQ(0, api.log_get(i, &c));
    if (c.result != 0) continue;
    std::string name = c.name;
    if (name == "cuMemMap") maps.push_back({c.addr, c.size, false});
    for (auto it = maps.begin(); it != maps.end();) {
      bool inside = it->addr >= c.addr && it->addr + it->size <= c.addr + c.size;
      if (name == "cuMemUnmap" && inside) {
        it = maps.erase(it);
        continue;
      }
      if (name == "cuMemSetAccess" && inside) it->access = true;
      ++it;
    }
  }
  int64_t bytes = 0;
  for (const Mapped &m : maps) {
    bytes += (int64_t)m.size;
    EXPECT_TRUE(m.access) << "0x" << std::hex << m.addr << " (+" << std::dec << m.size
                          << ") is mapped without access";
  }
  EXPECT_EQ(allocator_mapped, bytes) << "mapped bytes: the allocator's count vs the double's";
}

TEST(GpuAdv16, AFailedCallNamesItselfAndLeavesNothingBehind) {
  NEED_DOUBLE(api);
  if (!_expseg_cuda_usable(0)) GTEST_SKIP() << "the cuda driver does not load";
  EXPSEG_SEEDED(seed, 16);
  auto workload = [&](expseg_allocator *a, const char *call, std::vector<void *> &got,
                      expseg_stream s) {
    TestRng rng(seed);
    for (int i = 0; i < 24; i++) {
      void *p = nullptr;
      size_t n = (size_t)(1 + rng.next() % 12) << 20;
      expseg_status st = expseg_malloc(a, n, i % 3 ? 0 : s, &p);
      if (st == EXPSEG_OK) {
        got.push_back(p);
      } else {
        std::string e = expseg_last_error();
        EXPECT_NE(std::string::npos, e.find(call)) << e;
        EXPECT_NE(std::string::npos, e.find("CUDA_ERROR_")) << e;
      }
      if (got.size() > 3 && rng.next() % 2) { // used on another stream: freed behind an event
        size_t k = rng.next() % got.size();
        void *q = got[k];
        got.erase(got.begin() + (long)k);
        if (expseg_record_stream(a, q, s) != EXPSEG_OK) ADD_FAILURE() << expseg_last_error();
        expseg_status fs = expseg_free(a, q);
        if (fs != EXPSEG_OK) {
          std::string e = expseg_last_error();
          EXPECT_NE(std::string::npos, e.find(call)) << e;
        }
      }
      if (i == 12) (void)expseg_empty_cache(a);
    }
  };
  int injected = 0;
  for (const char *conf : {"expandable_segments:True", "expandable_segments:False"}) {
    for (const char *call : {"cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                             "cuEventCreate", "cuEventRecord"}) {
      unsigned calls = 0; // how many the workload makes without a failure
      {
        expseg_allocator *a = nullptr;
        ASSERT_EQ(EXPSEG_OK, expseg_create("cuda", 0, conf, &a)) << expseg_last_error();
        expseg_stream s = 0;
        ASSERT_EQ(EXPSEG_OK, expseg_stream_create(a, &s)) << expseg_last_error();
        api.log_clear();
        std::vector<void *> got;
        workload(a, "-", got, s);
        for (size_t i = 0, n = api.log_count(); i < n; i++) {
          cudadouble_call c{};
          ASSERT_EQ(0, api.log_get(i, &c));
          calls += c.name == std::string(call);
        }
        for (void *p : got) ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
        ASSERT_EQ(EXPSEG_OK, expseg_stream_destroy(a, s));
        expseg_destroy(a);
      }
      ASSERT_GE(calls, 1u) << call << " is never called by the workload (" << conf << ")";
      for (unsigned nth = 1; nth <= calls && nth <= 6; nth++) {
        SCOPED_TRACE(std::string(conf) + ": " + call + " #" + std::to_string(nth) + " fails");
        expseg_allocator *a = nullptr;
        ASSERT_EQ(EXPSEG_OK, expseg_create("cuda", 0, conf, &a)) << expseg_last_error();
        expseg_stream s = 0;
        ASSERT_EQ(EXPSEG_OK, expseg_stream_create(a, &s)) << expseg_last_error();
        api.log_clear();
        // OUT_OF_MEMORY where the driver documents it (reserve, create, map), else an error
        bool oom = std::string(call) == "cuMemAddressReserve" || std::string(call) == "cuMemCreate" ||
                   std::string(call) == "cuMemMap";
        ASSERT_EQ(0, api.fail(call, nth, oom ? 2 /* OUT_OF_MEMORY */ : 999 /* UNKNOWN */));
        std::vector<void *> got;
        workload(a, call, got, s);
        ASSERT_EQ(0, api.fail(call, 0, 0));
        bool reached = false;
        for (size_t i = 0, n = api.log_count(); i < n; i++) {
          cudadouble_call c{};
          ASSERT_EQ(0, api.log_get(i, &c));
          reached |= c.injected && c.name == std::string(call);
        }
        ASSERT_TRUE(reached) << "the failure was not reached";
        injected++;
        ASSERT_EQ(EXPSEG_OK, expseg_check(a)) << expseg_last_error();
        expseg_testing_driver_counts mine{};
        ASSERT_EQ(EXPSEG_OK, expseg_testing_driver_counts_get(a, &mine));
        cudadouble_state st{};
        api.counts(&st);
        EXPECT_EQ(mine.live_chunks, st.handles + st.freed_late);
        EXPECT_EQ(mine.live_reservations, st.reservations);
        EXPECT_EQ(mine.live_events, st.events);
        check_log(api, mine.mapped_bytes);
        for (void *p : got) ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
        ASSERT_EQ(EXPSEG_OK, expseg_stream_destroy(a, s));
        expseg_testing_driver_counts left{};
        expseg_testing_destroy(a, &left);
        EXPECT_EQ(0, left.live_chunks + left.live_reservations + left.mapped_bytes + left.live_events);
        api.counts(&st);
        EXPECT_EQ(0, st.handles + st.freed_late + st.mappings + st.reservations + st.events +
                         st.streams + st.primary_retains)
            << "the double holds what expseg_destroy should have given back";
      }
    }
  }
  printf("%d injected failures\n", injected);
}

} // namespace
