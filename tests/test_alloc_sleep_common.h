// SPDX-License-Identifier: Apache-2.0
// test_alloc_sleep_common.h: the fixture of the sleep and wake suites (test_alloc_sleep.cpp,
// test_alloc_sleep_cycles.cpp; on `cuda` through test_gpu_sleep.cpp and
// test_gpu_sleep_cycles.cpp, which define EXPSEG_SLEEP_GPU): the drivers, an allocator per
// test over a fault wrapper ("fault;DRIVER") that must give everything back, live blocks
// whose bytes are written and read back through the driver's data-check hook, and
// EXPSEG_SLEEP_INSTANTIATE() that runs a suite on every driver and segment kind. On `cuda`
// the suites run against the CUDA driver double (configured to 1 GiB, 2 MiB pages) when
// libcuda.so.1 is the double, else against the real driver when it finds a usable GPU (a
// test whose assertion needs the double skips alone, via EXPSEG_SLEEP_NEEDS_DOUBLE), else
// they skip.
#pragma once
#include "alloc_support.h"
#include "driver_param.h"

#ifdef EXPSEG_SLEEP_GPU
#include "cudadouble.h"
#endif

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <unistd.h>
#include <ctime>
#include <ostream>
#include <string>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;

#ifdef EXPSEG_SLEEP_GPU
const char *const kDrivers[] = {"cuda"};
#else
const char *const kDrivers[] = {"host", "sim"};
#endif

struct Live {
  void *p;
  size_t size;
  std::vector<unsigned char> data;
};

// One run of a suite: the driver and the configuration (printed as its text).
using SleepCase = DriverParam;

// Every driver with expandable segments and without.
inline std::vector<SleepCase> sleep_cases() {
  std::vector<SleepCase> out;
  for (const char *d : kDrivers)
    for (const char *cfg : {"expandable_segments:True", "expandable_segments:False"})
      out.push_back({d, cfg});
  return out;
}

class Sleep : public ::testing::TestWithParam<SleepCase> {
public: // the fault test's helper uses them
  void rewrite() { // every live block's bytes written again (after a discarding sleep)
    for (Live &l : live_) put(l.p, l.data);
  }

protected:
  expseg_allocator *a_ = nullptr;
  TestRng rng_{0};
  std::vector<Live> live_;
  expseg_stream other_ = 7; // a second stream (cuda: one the driver made)
  bool on_double_ = false;  // cuda: libcuda.so.1 is the CUDA driver double, not a real GPU
  bool real_gpu() const { return driver() == "cuda" && !on_double_; }
  std::string driver() const { return GetParam().driver; }
  bool expandable() const {
    return std::string(GetParam().config).find("True") != std::string::npos;
  }
  bool bytes() const { return driver() != "sim"; }

  void SetUp() override {
    rng_ = TestRng(test_seed(27));
    std::string spec = "fault;" + driver();
#ifdef EXPSEG_SLEEP_GPU
    cudadouble_api api{};
    on_double_ = cudadouble_load(&api) != 0;
    if (!_expseg_cuda_usable(0))
      GTEST_SKIP() << "no CUDA driver: libcuda.so.1 is neither the CUDA driver double "
                      "(tests/cuda_double) nor a driver that finds a usable GPU";
    if (on_double_) {
      ASSERT_EQ(0, api.configure("capacity=1G,granularity=2M,recommended=2M")) << api.last_message();
    }
#else
    spec += ":capacity=1G";
#endif
    ASSERT_EQ(expseg_create(spec.c_str(), 0, GetParam().config, &a_), EXPSEG_OK)
        << expseg_last_error();
  }
  void TearDown() override {
    if (a_ == nullptr) return;
    expseg_testing_driver_counts left;
    (void)expseg_testing_set_faults(a_, "");
    if (driver() == "cuda" && other_ != 7) {
      EXPECT_EQ(expseg_stream_destroy(a_, other_), EXPSEG_OK);
    }
    expseg_testing_destroy(a_, &left);
    EXPECT_EQ(left.live_chunks, 0);
    EXPECT_EQ(left.live_reservations, 0);
    EXPECT_EQ(left.mapped_bytes, 0);
  }

  void put(void *p, const std::vector<unsigned char> &d) {
    if (!bytes()) return;
    ASSERT_EQ(_expseg_vmm_copy_in(alloc_test_driver(a_), (uintptr_t)p, d.data(), d.size()),
              EXPSEG_OK)
        << expseg_last_error();
  }
  std::vector<unsigned char> get(void *p, size_t n) {
    std::vector<unsigned char> d(n);
    if (!bytes()) return d;
    EXPECT_EQ(_expseg_vmm_copy_out(alloc_test_driver(a_), d.data(), (uintptr_t)p, n), EXPSEG_OK)
        << expseg_last_error();
    return d;
  }
  void *alloc(size_t n, expseg_stream s = 0) {
    void *p = nullptr;
    EXPECT_EQ(expseg_malloc(a_, n, s, &p), EXPSEG_OK) << expseg_last_error();
    if (p == nullptr) return p;
    std::vector<unsigned char> d(n);
    for (auto &c : d) c = (unsigned char)rng_.next();
    put(p, d);
    live_.push_back({p, n, d});
    return p;
  }
public:
  // every live block holds its bytes, at the address it was given
  void expect_data(const std::string &where) {
    if (!bytes()) return;
    for (const Live &l : live_)
      EXPECT_TRUE(get(l.p, l.size) == l.data) << where << ": bytes at " << l.p << " (" << l.size
                                              << ") changed";
  }
  void check(const std::string &where) {
    EXPECT_EQ(expseg_check(a_), EXPSEG_OK) << where << ": " << expseg_last_error();
  }
  expseg_region_info info(const char *tag) {
    expseg_region_info i;
    EXPECT_EQ(expseg_region_get_info(a_, tag, &i), EXPSEG_OK) << expseg_last_error();
    return i;
  }
  // a region "w" of several sizes (small pool, a chunk, several chunks), and a general block
  void fill_region(bool big = true) {
    ASSERT_EQ(expseg_region_begin(a_, "w"), EXPSEG_OK) << expseg_last_error();
    for (size_t n : {size_t{1000}, 300 * KiB, 3 * MiB, 17 * MiB, 70 * MiB})
      if (big || n < 10 * MiB) alloc(n);
    if (driver() == "cuda" && other_ == 7) {
      ASSERT_EQ(expseg_stream_create(a_, &other_), EXPSEG_OK) << expseg_last_error();
    }
    alloc(5 * MiB, other_); // another stream
    ASSERT_EQ(expseg_region_end(a_, "w"), EXPSEG_OK);
  }
protected:
  int64_t driver_mapped() {
    expseg_testing_driver_counts c;
    EXPECT_EQ(expseg_testing_driver_counts_get(a_, &c), EXPSEG_OK);
    return c.mapped_bytes;
  }
};

// A test whose assertion holds only against the CUDA driver double skips on a real GPU,
// saying what it needs (`why`).
#define EXPSEG_SLEEP_NEEDS_DOUBLE(why)                                                          \
  do {                                                                                          \
    if (real_gpu()) GTEST_SKIP() << "needs the CUDA driver double (tests/cuda_double): " << why; \
  } while (0)

uint64_t seen(expseg_allocator *a, expseg_vmm_call k) {
  return _expseg_fault_seen(alloc_test_driver(a), k);
}

} // namespace

// Runs the suite Sleep of the including file on every driver, with expandable segments and
// without.
#define EXPSEG_SLEEP_INSTANTIATE()                                                              \
  INSTANTIATE_TEST_SUITE_P(                                                                     \
      Drivers, Sleep, ::testing::ValuesIn(sleep_cases()),                                       \
      [](const ::testing::TestParamInfo<SleepCase> &i) {                                        \
        return std::string(i.param.driver) +                                                    \
               (std::string(i.param.config).find("True") != std::string::npos ? "_expandable"  \
                                                                               : "_classic");  \
      })
