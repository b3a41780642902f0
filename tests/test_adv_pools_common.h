/* SPDX-License-Identifier: Apache-2.0 */
// test_adv_pools_common.h: the fixture of the adversarial private-pool suites
// (test_adv_pools.cpp, test_adv_pools_random.cpp): the drivers and configurations they run on,
// an allocator per test that must give everything back, and expect_refused (a failed call
// changes no statistic, keeps expseg_check passing, and names the value and what is accepted).
#pragma once

#include "alloc_support.h"
#include "expseg_testing.h"
#include "pool_support.h"
#include "snapshot_check.h"
#include "test_seed.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;

// every statistic but the timings (they move on their own)
inline StatMap all_stats(const expseg_allocator *a) { return without_times(stat_map(a)); }

class AdvPools : public PoolCalls {
protected:
  void SetUp() override {
    ASSERT_EQ(expseg_create(GetParam().driver, 0, GetParam().config, &a), EXPSEG_OK)
        << expseg_last_error();
  }
  void TearDown() override {
    if (a == nullptr) return;
    EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
    expect_nothing_left(a, "at the end of the test");
  }
  // A failed call: the status, a message naming `value` and saying what is accepted, and
  // nothing changed.
  template <class F>
  void expect_refused(const char *what, F call, expseg_status want, const std::string &value,
                      const char *accepted = "accepted") {
    StatMap before = all_stats(a);
    expseg_status st = call();
    EXPECT_EQ(st, want) << what;
    std::string msg = expseg_last_error();
    EXPECT_NE(msg.find(value), std::string::npos) << what << ": message does not name " << value
                                                  << ": " << msg;
    if (accepted != nullptr) {
      EXPECT_NE(msg.find(accepted), std::string::npos) << what << ": " << msg;
    }
    EXPECT_EQ(all_stats(a), before) << what << " changed statistics";
    EXPECT_EQ(expseg_check(a), EXPSEG_OK) << what << ": " << expseg_last_error();
  }
};

inline bool accept_none(void *, expseg_stream) { return false; }
inline bool accept_all(void *, expseg_stream) { return true; }

} // namespace

// host and sim, expandable segments on and off
#define EXPSEG_ADV_POOLS_INSTANTIATE()                                                        \
  INSTANTIATE_TEST_SUITE_P(                                                                  \
      Drivers, AdvPools,                                                                      \
      testing::Values(PoolsParam{"host:capacity=256M", "expandable_segments:True"},                \
                      PoolsParam{"host:capacity=256M", "expandable_segments:False"},               \
                      PoolsParam{"sim:capacity=512M", "expandable_segments:True"},                 \
                      PoolsParam{"sim:capacity=512M", "expandable_segments:False"}),               \
      pools_param_name)
