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

TEST(StatsDocs, BaseNameRule) {
  EXPECT_EQ(base_name("allocated_bytes.large_pool.peak"), "allocated_bytes");
  EXPECT_EQ(base_name("oversize_segments.freed"), "oversize_segments");
  EXPECT_EQ(base_name("expseg.mapped_bytes.current"), "expseg.mapped_bytes");
  EXPECT_EQ(base_name("expseg.driver.map"), "expseg.driver.map");
  EXPECT_EQ(base_name("num_ooms"), "num_ooms");
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
