// SPDX-License-Identifier: Apache-2.0
// test_stats_docs.cpp: docs/stats.md names every statistic key's base name, written as
// `base` (the rule is stated in docs/stats.md: strip .current/.peak/.allocated/.freed, then
// .all/.small_pool/.large_pool).
#include "expseg.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string strip(std::string key, std::initializer_list<const char *> suffixes) {
  for (const char *s : suffixes) {
    std::string suf = std::string(".") + s;
    if (key.size() > suf.size() && key.compare(key.size() - suf.size(), suf.size(), suf) == 0)
      return key.substr(0, key.size() - suf.size());
  }
  return key;
}

std::string base_name(const std::string &key) {
  return strip(strip(key, {"current", "peak", "allocated", "freed"}),
               {"all", "small_pool", "large_pool"});
}

// The rule docs/stats.md states holds for the library's keys: a key ending in a metric has
// its siblings (all four for PyTorch's keys, current and peak for expseg's gauges), and a key naming a pool has all three pools (so stripping them gives one
// base per statistic, and a reader can rebuild every key from the base).
TEST(StatsDocs, BaseNameRule) {
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim:capacity=1G", 0, "", &a), EXPSEG_OK) << expseg_last_error();
  std::set<std::string> keys;
  expseg_stats_foreach(
      a, [](void *ctx, const char *key, int64_t) {
        static_cast<std::set<std::string> *>(ctx)->insert(key);
      },
      &keys);
  expseg_destroy(a);
  ASSERT_FALSE(keys.empty());
  size_t with_metric = 0, with_pool = 0;
  for (const std::string &k : keys) {
    std::string m = strip(k, {"current", "peak", "allocated", "freed"});
    if (m != k) {
      with_metric++;
      // PyTorch's Stat has all four; expseg's gauges at least current and peak
      bool torch = k.rfind("expseg.", 0) != 0;
      for (const char *x : {"current", "peak", "allocated", "freed"})
        if (torch || x[0] == 'c' || x[0] == 'p') {
          EXPECT_TRUE(keys.count(m + "." + x)) << k << ": no " << m << "." << x;
        }
    }
    std::string p = strip(m, {"all", "small_pool", "large_pool"});
    if (p != m) {
      with_pool++;
      for (const char *x : {"all", "small_pool", "large_pool"})
        EXPECT_TRUE(keys.count(p + "." + x + k.substr(m.size()))) << k << ": no pool " << x;
    }
    EXPECT_EQ(base_name(k), p) << k;
  }
  EXPECT_GE(with_metric, 9u * 3 * 4 + 2 * 4) << "PyTorch's metric keys";
  EXPECT_GE(with_pool, 9u * 3 * 4) << "PyTorch's pooled keys";
}

TEST(StatsDocs, EveryKeyIsDocumented) {
  std::ifstream in(std::string(EXPSEG_SOURCE_DIR) + "/docs/stats.md");
  ASSERT_TRUE(in.good()) << "cannot read docs/stats.md";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim:capacity=1G", 0, "", &a), EXPSEG_OK) << expseg_last_error();
  std::set<std::string> bases;
  expseg_stats_foreach(
      a, [](void *ctx, const char *key, int64_t) {
        static_cast<std::set<std::string> *>(ctx)->insert(base_name(key));
      },
      &bases);
  expseg_destroy(a);
  EXPECT_GE(bases.size(), 17u + 10u + 15u) << "torch keys, expseg gauges/counters, driver calls";
  for (const std::string &b : bases)
    EXPECT_NE(doc.find("`" + b + "`"), std::string::npos) << "docs/stats.md does not name `" << b << "`";
}

}  // namespace
