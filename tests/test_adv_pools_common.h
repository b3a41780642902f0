/* SPDX-License-Identifier: Apache-2.0 */
// test_adv_pools_common.h: the fixture of the adversarial private-pool suites
// (test_adv_pools.cpp, test_adv_pools_random.cpp): the drivers and configurations they run on,
// an allocator per test that must give everything back, and expect_refused (a failed call
// changes no statistic, keeps expseg_check passing, and names the value and what is accepted).
#pragma once

#include "expseg_testing.h"
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

struct Param {
  const char *driver;
  const char *config;
};

std::string name_of(const testing::TestParamInfo<Param> &p) {
  std::string d(p.param.driver);
  return d.substr(0, d.find(':')) + (std::strstr(p.param.config, "True") ? "_expandable" : "_classic");
}

// what gtest prints for GetParam() (else the struct's bytes)
inline void PrintTo(const Param &p, std::ostream *os) { *os << p.driver << " " << p.config; }

using Stats = std::map<std::string, int64_t>;

Stats all_stats(const expseg_allocator *a) {
  Stats m;
  expseg_stats_foreach(
      a, [](void *ctx, const char *k, int64_t v) { (*static_cast<Stats *>(ctx))[k] = v; }, &m);
  // times move on their own
  for (auto it = m.begin(); it != m.end();)
    it = it->first.find("time") != std::string::npos ? m.erase(it) : std::next(it);
  return m;
}

inline int64_t stat(const expseg_allocator *a, const std::string &key) {
  int64_t v = INT64_MIN;
  EXPECT_EQ(expseg_stat(a, key.c_str(), &v), EXPSEG_OK) << key << ": " << expseg_last_error();
  return v;
}

inline bool has_stat(const expseg_allocator *a, const std::string &key) {
  int64_t v;
  return expseg_stat(a, key.c_str(), &v) == EXPSEG_OK;
}

inline std::string pool_key(expseg_pool_id id, const char *rest = "all.current") {
  return "reserved_bytes_by_private_pools.0_" + std::to_string(id) + "." + rest;
}

class AdvPools : public testing::TestWithParam<Param> {
protected:
  void SetUp() override {
    ASSERT_EQ(expseg_create(GetParam().driver, 0, GetParam().config, &a), EXPSEG_OK)
        << expseg_last_error();
  }
  void TearDown() override {
    if (a == nullptr) return;
    EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
    expseg_testing_driver_counts left;
    expseg_testing_destroy(a, &left);
    EXPECT_EQ(left.live_chunks, 0);
    EXPECT_EQ(left.live_reservations, 0);
    EXPECT_EQ(left.mapped_bytes, 0);
    EXPECT_EQ(left.live_events, 0);
  }
  expseg_pool_id create() {
    expseg_pool_id id = 0;
    EXPECT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << expseg_last_error();
    return id;
  }
  void *alloc(size_t size, expseg_stream s, expseg_pool_id pool) {
    void *p = nullptr;
    EXPECT_EQ(expseg_malloc_pool(a, size, s, pool, &p), EXPSEG_OK) << expseg_last_error();
    return p;
  }
  expseg_pool_id pool_of(const void *p) {
    expseg_pool_id id = 999999;
    EXPECT_EQ(expseg_pool_of(a, p, &id), EXPSEG_OK) << expseg_last_error();
    return id;
  }
  // A failed call: the status, a message naming `value` and saying what is accepted, and
  // nothing changed.
  template <class F>
  void expect_refused(const char *what, F call, expseg_status want, const std::string &value,
                      const char *accepted = "accepted") {
    Stats before = all_stats(a);
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
  expseg_allocator *a = nullptr;
};

inline bool accept_none(void *, expseg_stream) { return false; }
inline bool accept_all(void *, expseg_stream) { return true; }

} // namespace

// host and sim, expandable segments on and off
#define EXPSEG_ADV_POOLS_INSTANTIATE()                                                        \
  INSTANTIATE_TEST_SUITE_P(                                                                  \
      Drivers, AdvPools,                                                                      \
      testing::Values(Param{"host:capacity=256M", "expandable_segments:True"},                \
                      Param{"host:capacity=256M", "expandable_segments:False"},               \
                      Param{"sim:capacity=512M", "expandable_segments:True"},                 \
                      Param{"sim:capacity=512M", "expandable_segments:False"}),               \
      name_of)
