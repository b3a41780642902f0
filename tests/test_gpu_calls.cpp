// SPDX-License-Identifier: Apache-2.0
// test_gpu_calls.cpp: call sequences of the cuda backend, read from the CUDA driver double's
// call log (label gpu; skips unless libcuda.so.1 is the double, tests/cuda_double/): one
// cuMemSetAccess per newly mapped range, no cuMemUnmap of a range whose stream still has
// work, every cuMemCreate released by expseg_destroy, and no handle left behind when a
// cuMemMap fails. The double's control calls are found with dlsym (cudadouble.h), so this
// file does not include cuda.h.
#include "alloc_support.h"
#include "cudadouble.h"

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kOutOfMemory = 2; // CUDA_ERROR_OUT_OF_MEMORY
constexpr int kNotReady = 600;   // CUDA_ERROR_NOT_READY

struct Double {
  cudadouble_api api{};
  bool ok = false;
  Double() { ok = cudadouble_load(&api) && _expseg_cuda_usable(0); }
  std::vector<cudadouble_call> log() const {
    std::vector<cudadouble_call> v(api.log_count());
    for (size_t i = 0; i < v.size(); i++) EXPECT_EQ(0, api.log_get(i, &v[i]));
    return v;
  }
  cudadouble_state state() const {
    cudadouble_state s{};
    api.counts(&s);
    return s;
  }
};

#define NEED_DOUBLE(d)                                                                  \
  Double d;                                                                             \
  if (!d.ok)                                                                            \
    GTEST_SKIP() << "needs the CUDA driver double (tests/cuda_double): the test reads its call log"

bool is(const cudadouble_call &c, const char *name) { return c.result == 0 && c.name == std::string(name); }
bool overlaps(const cudadouble_call &c, uint64_t a, uint64_t n) {
  return c.addr < a + n && a < c.addr + c.size;
}

expseg_allocator *make(const char *conf) {
  expseg_allocator *a = nullptr;
  EXPECT_EQ(EXPSEG_OK, expseg_create("cuda", 0, conf, &a)) << expseg_last_error();
  return a;
}

// Every range cuMemMap maps gets exactly one cuMemSetAccess that covers it before it is
// unmapped, and set-access calls are never more than map calls.
TEST(GpuCalls, OneSetAccessPerNewlyMappedRange) {
  NEED_DOUBLE(d);
  EXPSEG_SEEDED(seed, 11);
  TestRng rng(seed);
  expseg_allocator *a = make("expandable_segments:True");
  ASSERT_NE(nullptr, a);
  d.api.log_clear();
  std::vector<void *> live;
  for (int i = 0; i < 400; i++) {
    if (live.empty() || rng.next() % 3) {
      void *p = nullptr;
      size_t n = (size_t)(1 + rng.next() % 24) << 20;
      ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, n, 0, &p)) << expseg_last_error();
      live.push_back(p);
    } else {
      size_t k = rng.next() % live.size();
      ASSERT_EQ(EXPSEG_OK, expseg_free(a, live[k]));
      live.erase(live.begin() + (long)k);
    }
    if (i % 100 == 99) {
      ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
    }
  }
  for (void *p : live) ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  auto log = d.log();
  struct Open {
    uint64_t size;
    int grants;
  };
  std::map<uint64_t, Open> mapped; // by address, until unmapped
  size_t maps = 0, grants = 0;
  for (const auto &c : log) {
    if (is(c, "cuMemMap")) {
      mapped[c.addr] = {c.size, 0};
      maps++;
    } else if (is(c, "cuMemSetAccess")) {
      grants++;
      for (auto &m : mapped)
        if (overlaps(c, m.first, m.second.size)) m.second.grants++;
    } else if (is(c, "cuMemUnmap")) {
      for (auto it = mapped.begin(); it != mapped.end();) {
        if (overlaps(c, it->first, it->second.size)) {
          EXPECT_EQ(1, it->second.grants) << "mapping at 0x" << std::hex << it->first;
          it = mapped.erase(it);
        } else {
          ++it;
        }
      }
    }
  }
  EXPECT_GT(maps, 10u) << "the workload must map often to say anything";
  EXPECT_LE(grants, maps);
  EXPECT_TRUE(mapped.empty()) << mapped.size() << " mapping(s) left after empty_cache";
  expseg_destroy(a);
}

// Memory freed on a stream with unfinished work is not unmapped until the work is done.
// Held by expseg_testing_hold_stream (cuda.c's cuStreamWaitValue32 hold, which the
// allocator knows of: empty_cache leaves the memory alone), then by the double's control
// call, released by another thread 300 ms later (as a long kernel would end: empty_cache
// waits for the stream, then unmaps).
TEST(GpuCalls, NoUnmapWhileTheStreamIsBusy) {
  NEED_DOUBLE(d);
  for (bool hook : {true, false}) {
    SCOPED_TRACE(hook ? "expseg_testing_hold_stream" : "cudadouble_hold_stream");
    expseg_allocator *a = make("expandable_segments:True");
    ASSERT_NE(nullptr, a);
    expseg_stream s = 0;
    ASSERT_EQ(EXPSEG_OK, expseg_stream_create(a, &s)) << expseg_last_error();
    const size_t n = 64u << 20;
    void *p = nullptr;
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, n, s, &p));
    if (hook) {
      ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(a, s, true));
    } else {
      ASSERT_EQ(0, d.api.hold_stream((void *)(uintptr_t)s, 1));
    }
    d.api.log_clear();
    ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
    if (hook) {
      ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
      for (const auto &c : d.log()) {
        EXPECT_FALSE(is(c, "cuMemUnmap") && overlaps(c, (uintptr_t)p, n))
            << "unmapped while the stream is held";
        EXPECT_FALSE(is(c, "cuMemRelease")) << "a handle released while its stream is busy";
      }
      ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(a, s, false));
      ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
    } else {
      std::thread later([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        d.api.hold_stream((void *)(uintptr_t)s, 0);
      });
      EXPECT_EQ(EXPSEG_OK, expseg_empty_cache(a));
      later.join();
    }
    bool unmapped = false;
    for (const auto &c : d.log()) {
      if (is(c, "cuMemUnmap") && overlaps(c, (uintptr_t)p, n)) {
        unmapped = true;
        EXPECT_EQ(0, c.busy_streams) << "unmapped while a stream had work";
      }
    }
    EXPECT_TRUE(unmapped) << "once the stream is done, empty_cache gives the memory back";
    ASSERT_EQ(EXPSEG_OK, expseg_stream_destroy(a, s));
    expseg_destroy(a);
  }
}

// Every handle cuMemCreate made is released by expseg_destroy, with nothing left mapped or
// reserved, no event and no retained context (classic and expandable segments, two streams).
TEST(GpuCalls, EveryCreateIsReleasedByDestroy) {
  NEED_DOUBLE(d);
  EXPSEG_SEEDED(seed, 5);
  TestRng rng(seed);
  for (const char *conf : {"expandable_segments:True", "expandable_segments:False"}) {
    SCOPED_TRACE(conf);
    d.api.log_clear();
    expseg_allocator *a = make(conf);
    ASSERT_NE(nullptr, a);
    expseg_stream s[2] = {0, 0};
    ASSERT_EQ(EXPSEG_OK, expseg_stream_create(a, &s[1]));
    std::vector<void *> live;
    for (int i = 0; i < 300; i++) {
      if (live.empty() || rng.next() % 2) {
        void *p = nullptr;
        size_t n = (size_t)(1 + rng.next() % (8u << 20));
        ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, n, s[rng.next() % 2], &p)) << expseg_last_error();
        live.push_back(p);
      } else {
        size_t k = rng.next() % live.size();
        ASSERT_EQ(EXPSEG_OK, expseg_free(a, live[k]));
        live.erase(live.begin() + (long)k);
      }
    }
    for (void *p : live) ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
    ASSERT_EQ(EXPSEG_OK, expseg_stream_destroy(a, s[1]));
    expseg_destroy(a);
    std::set<uint64_t> created, released;
    for (const auto &c : d.log()) {
      // no call fails: not on the stream destroyed before expseg_destroy either
      EXPECT_TRUE(c.result == 0 || (c.name == std::string("cuEventQuery") && c.result == kNotReady))
          << c.name << " failed with " << c.result << ": " << d.api.last_message();
      if (is(c, "cuMemCreate")) created.insert(c.handle);
      if (is(c, "cuMemRelease")) {
        EXPECT_TRUE(released.insert(c.handle).second) << "released twice";
      }
    }
    EXPECT_FALSE(created.empty());
    EXPECT_EQ(created, released);
    cudadouble_state st = d.state();
    EXPECT_EQ(0, st.handles + st.freed_late);
    EXPECT_EQ(0, st.mappings);
    EXPECT_EQ(0, st.reservations);
    EXPECT_EQ(0, st.events);
    EXPECT_EQ(0, st.streams);
    EXPECT_EQ(0, st.primary_retains);
    EXPECT_EQ(0, st.used_bytes);
  }
}

// A cuMemMap that fails (injected, at each map of a growth) leaves no handle behind: every
// handle the double holds is one the allocator's driver counts as live (expandable segments
// keep unmapped chunks cached for reuse), the handle of the failed map is released by
// expseg_destroy at the latest, and the allocator stays consistent and usable.
TEST(GpuCalls, NoHandleLeakedAfterAFailedMap) {
  NEED_DOUBLE(d);
  auto workload = [](expseg_allocator *a, std::vector<void *> &got) {
    for (int i = 0; i < 8; i++) {
      void *p = nullptr;
      if (expseg_malloc(a, (size_t)(3 + 5 * i) << 20, 0, &p) == EXPSEG_OK) got.push_back(p);
    }
  };
  for (const char *conf : {"expandable_segments:True", "expandable_segments:False"}) {
    // the number of maps the workload makes without a failure
    unsigned maps = 0;
    {
      expseg_allocator *a = make(conf);
      ASSERT_NE(nullptr, a);
      d.api.log_clear();
      std::vector<void *> got;
      workload(a, got);
      for (const auto &c : d.log()) maps += is(c, "cuMemMap");
      for (void *p : got) ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
      expseg_destroy(a);
    }
    ASSERT_GE(maps, 3u);
    for (unsigned nth = 1; nth <= maps; nth++) {
      SCOPED_TRACE(std::string(conf) + ", map #" + std::to_string(nth) + " fails");
      expseg_allocator *a = make(conf);
      ASSERT_NE(nullptr, a);
      d.api.log_clear();
      ASSERT_EQ(0, d.api.fail("cuMemMap", nth, kOutOfMemory));
      std::vector<void *> got;
      workload(a, got);
      ASSERT_EQ(EXPSEG_OK, expseg_check(a)) << expseg_last_error();
      expseg_testing_driver_counts mine{};
      ASSERT_EQ(EXPSEG_OK, expseg_testing_driver_counts_get(a, &mine));
      cudadouble_state st = d.state();
      EXPECT_EQ(mine.live_chunks, st.handles + st.freed_late)
          << "the double holds handles the allocator does not know of";
      uint64_t failed = 0;
      for (const auto &c : d.log())
        if (c.name == std::string("cuMemMap") && c.injected) failed = c.handle;
      ASSERT_NE(0u, failed) << "the failure was not reached";
      for (void *p : got) ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
      expseg_testing_driver_counts left;
      expseg_testing_destroy(a, &left);
      EXPECT_EQ(0, left.live_chunks);
      bool released = false;
      for (const auto &c : d.log()) released |= is(c, "cuMemRelease") && c.handle == failed;
      EXPECT_TRUE(released) << "handle 0x" << std::hex << failed << " of the failed map";
      st = d.state();
      EXPECT_EQ(0, st.handles + st.freed_late);
      EXPECT_EQ(0, st.mappings);
      ASSERT_EQ(0, d.api.fail("cuMemMap", 0, 0));
    }
  }
}

} // namespace
