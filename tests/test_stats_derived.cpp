// SPDX-License-Identifier: Apache-2.0
// test_stats_derived.cpp: the statistics as a reader sees them, whatever the storage
// (pools/internal.h keeps the pools only and derives `all` and `freed` on read). Under a
// seeded random workload with resets, memory pressure (pages moved between pools) and
// cross-stream frees, after every step: `all` is the sum of the pools (current, allocated
// and freed, also in reserved_bytes when pages move between pools, as in PyTorch), current = current at the last reset_accumulated + allocated - freed,
// allocated and freed never fall and are 0 after reset_accumulated, peak never falls and
// equals current after reset_peak, peak >= current, and all.peak >= each pool's peak and
// every `all` current seen since the last reset_peak.
#include "alloc_support.h"

#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;

const char *const kArrays[] = {"active",         "active_bytes",         "allocated_bytes",
                               "allocation",     "inactive_split",       "inactive_split_bytes",
                               "requested_bytes", "reserved_bytes",      "segment"};
const char *const kPools[] = {"all", "small_pool", "large_pool"};

// Every key with the four PyTorch metrics: its base (up to ".current").
std::vector<std::string> four_metric_bases(const StatMap &s) {
  std::vector<std::string> out;
  const std::string suffix = ".current";
  for (const auto &kv : s) {
    const std::string &k = kv.first;
    if (k.size() > suffix.size() && k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0) {
      std::string b = k.substr(0, k.size() - suffix.size());
      if (s.count(b + ".freed")) out.push_back(b);
    }
  }
  return out;
}

struct Checker {
  StatMap prev, base;           // the last reading; current at the last reset_accumulated
  std::map<std::string, int64_t> all_seen;  // max `all` current since the last reset_peak
  int64_t moved_seen = 0;     // reserved_bytes counted in two pools (pages moved)
  std::vector<std::string> bases;

  void start(const StatMap &s) {
    bases = four_metric_bases(s);
    ASSERT_GE(bases.size(), 9u * 3 + 2) << "the nine arrays and the two oversize StatMap";
    prev = s;
    base.clear();
    all_seen.clear();
    for (const auto &b : bases) base[b] = s.at(b + ".current");
  }

  void step(const StatMap &s, bool reset_peak, bool reset_accum, const std::string &where) {
    for (const auto &b : bases) {
      const int64_t cur = s.at(b + ".current"), peak = s.at(b + ".peak"),
                    al = s.at(b + ".allocated"), fr = s.at(b + ".freed");
      if (reset_accum) {
        ASSERT_EQ(al, 0) << where << ": " << b << ".allocated after reset_accumulated";
        ASSERT_EQ(fr, 0) << where << ": " << b << ".freed after reset_accumulated";
        base[b] = cur;
      } else {
        ASSERT_GE(al, prev.at(b + ".allocated")) << where << ": " << b << ".allocated fell";
        ASSERT_GE(fr, prev.at(b + ".freed")) << where << ": " << b << ".freed fell";
      }
      ASSERT_EQ(cur, base[b] + al - fr) << where << ": " << b << ": current != base + allocated - freed";
      ASSERT_GE(peak, cur) << where << ": " << b << ".peak below current";
      if (reset_peak) {
        ASSERT_EQ(peak, cur) << where << ": " << b << ".peak after reset_peak";
      } else {
        ASSERT_GE(peak, prev.at(b + ".peak")) << where << ": " << b << ".peak fell";
      }
    }
    for (const char *arr : kArrays) {
      const std::string n = arr;
      auto v = [&](int p, const char *m) { return s.at(n + "." + kPools[p] + "." + m); };
      ASSERT_EQ(v(0, "current"), v(1, "current") + v(2, "current")) << where << ": " << n;
      const int64_t da = v(0, "allocated") - v(1, "allocated") - v(2, "allocated"),
                    df = v(0, "freed") - v(1, "freed") - v(2, "freed");
      ASSERT_EQ(da, 0) << where << ": " << n << ".all.allocated is not the pools' sum";
      ASSERT_EQ(df, 0) << where << ": " << n << ".all.freed is not the pools' sum";
      int64_t &seen = all_seen[n];
      if (reset_peak || v(0, "current") > seen) seen = v(0, "current");
      ASSERT_GE(v(0, "peak"), seen) << where << ": " << n << ".all.peak below a current seen";
      ASSERT_GE(v(0, "peak"), v(1, "peak")) << where << ": " << n << ".all.peak < small's";
      ASSERT_GE(v(0, "peak"), v(2, "peak")) << where << ": " << n << ".all.peak < large's";
    }
    // Pages mapped again for the other pool count as freed there and allocated here, in
    // `all` too (as PyTorch's update_stat_array moves both); what `all` allocated beyond the
    // chunks created is what moved.
    const int64_t moved = s.at("reserved_bytes.all.allocated") - s.at("expseg.created_bytes");
    ASSERT_GE(moved, 0) << where << ": reserved bytes allocated without a chunk created";
    if (moved > moved_seen) moved_seen = moved;
    prev = s;
  }
};

size_t random_size(TestRng &r) {
  switch (r.below(4)) {
  case 0: return 1 + r.below(4 * KiB);              // small pool
  case 1: return 512 * KiB + r.below(512 * KiB);    // small pool, up to 1 MiB
  case 2: return 1 * MiB + 1 + r.below(8 * MiB);    // large pool
  default: return 16 * MiB + r.below(24 * MiB);     // large pool, big
  }
}

void run(const char *driver, const char *config, uint64_t seed, int steps) {
  AllocPtr own = make_alloc(driver, config);
  expseg_allocator *a = own.get();
  ASSERT_NE(a, nullptr);
  QuietLog quiet;  // out-of-memory warnings under pressure are expected
  TestRng r(seed);
  Checker c;
  c.start(stat_map(a));
  std::vector<void *> live;
  for (int i = 0; i < steps && !::testing::Test::HasFatalFailure(); i++) {
    const std::string where = std::string(config) + " step " + std::to_string(i);
    const uint64_t op = r.below(100);
    bool rp = false, ra = false;
    if (op < 50 || live.empty()) {
      void *p = nullptr;
      const expseg_status st = expseg_malloc(a, random_size(r), r.below(3), &p);
      ASSERT_TRUE(st == EXPSEG_OK || st == EXPSEG_ERR_OUT_OF_MEMORY) << where << ": " << expseg_last_error();
      if (st == EXPSEG_OK) live.push_back(p);
    } else if (op < 90) {
      const size_t k = r.below(live.size());
      if (r.chance(0.2)) {
        ASSERT_EQ(expseg_record_stream(a, live[k], 7), EXPSEG_OK) << where;
      }
      ASSERT_EQ(expseg_free(a, live[k]), EXPSEG_OK) << where << ": " << expseg_last_error();
      live[k] = live.back();
      live.pop_back();
    } else if (op < 94) {
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << where;
    } else if (op < 97) {
      expseg_reset_peak_stats(a);
      rp = true;
    } else {
      expseg_reset_accumulated_stats(a);
      ra = true;
    }
    c.step(stat_map(a), rp, ra, where);
  }
  for (void *p : live) ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  c.step(stat_map(a), false, false, std::string(config) + " at the end");
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  std::printf("%s: reserved bytes moved between pools, at most %" PRId64 " at a time\n",
              config, c.moved_seen);
  if (std::string(config).find("expandable_segments:True") != std::string::npos) {
    EXPECT_GT(c.moved_seen, 0) << "the workload must move pages between pools";
  }
}

TEST(StatsDerived, ExpandableUnderPressure) {
  EXPSEG_SEEDED(seed, 13);
  run("sim:capacity=160M", "expandable_segments:True", seed, 4000);
}

TEST(StatsDerived, ClassicSegments) {
  EXPSEG_SEEDED(seed, 14);
  run("sim:capacity=160M", "expandable_segments:False", seed, 4000);
}

}  // namespace
