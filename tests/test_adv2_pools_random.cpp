// SPDX-License-Identifier: Apache-2.0
// test_adv2_pools_random.cpp: seeded random runs mixing private pools (create, begin / end,
// release, malloc_pool, pool_empty_cache), regions (begin / end, sleep in both modes, wake),
// held streams with record_stream, empty_cache, memory fractions, statistic resets and
// snapshots. After every step: `all` equals `small_pool + large_pool` for every array
// statistic (current, allocated, freed), no gauge above its peak or below zero, the private
// pools' reserved bytes within the total, expseg_check passes; at the end the driver holds
// nothing. EXPSEG_TEST_SEED overrides the seed (printed).
#include <gtest/gtest.h>

#include <cstdarg>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "expseg.h"
#include "alloc_support.h"
#include "driver_param.h"
#include "expseg_testing.h"
#include "test_seed.h"

namespace {

std::string fmt(const char *f, ...) {
  char b[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(b, sizeof b, f, ap);
  va_end(ap);
  return b;
}

void check(expseg_allocator *a, int step, const char *what, int &fails) {
  StatMap s = stat_map(a);
  const char *arr[] = {"active",          "active_bytes",   "allocated_bytes",
                       "allocation",      "inactive_split", "inactive_split_bytes",
                       "requested_bytes", "reserved_bytes", "segment"};
  for (auto k : arr)
    for (auto f : {".current", ".allocated", ".freed"}) {
      std::string b = k;
      if (s[b + ".all" + f] != s[b + ".small_pool" + f] + s[b + ".large_pool" + f]) {
        if (fails++ < 10)
          ADD_FAILURE() << fmt("step %d (%s): %s%s all %lld != %lld + %lld\n", step, what, k, f,
                               (long long)s[b + ".all" + f], (long long)s[b + ".small_pool" + f],
                               (long long)s[b + ".large_pool" + f]);
      }
    }
  int64_t priv = 0;
  for (auto &kv : s)
    if (kv.first.rfind("reserved_bytes_by_private_pools.", 0) == 0 &&
        kv.first.find(".all.current") != std::string::npos)
      priv += kv.second;
  if (priv > s["reserved_bytes.all.current"]) {
    if (fails++ < 10)
      ADD_FAILURE() << fmt("step %d (%s): private %lld > reserved %lld\n", step, what,
                           (long long)priv, (long long)s["reserved_bytes.all.current"]);
  }
  for (auto &kv : s)
    if (kv.first.size() > 8 && kv.first.compare(kv.first.size() - 8, 8, ".current") == 0) {
      std::string pk = kv.first.substr(0, kv.first.size() - 8) + ".peak";
      if (s.count(pk) && kv.second > s[pk]) {
        if (fails++ < 10)
          ADD_FAILURE() << fmt("step %d (%s): %s %lld > peak %lld\n", step, what, kv.first.c_str(),
                               (long long)kv.second, (long long)s[pk]);
      }
      if (kv.second < 0 && kv.first.find("numa") == std::string::npos) {
        if (fails++ < 10)
          ADD_FAILURE() << fmt("step %d (%s): %s negative %lld\n", step, what, kv.first.c_str(),
                               (long long)kv.second);
      }
    }
  if (expseg_check(a) != EXPSEG_OK && fails++ < 10)
    ADD_FAILURE() << fmt("step %d (%s): check: %s\n", step, what, expseg_last_error());
}
using Case = DriverParam;

class Adv2PoolsRandom : public ::testing::TestWithParam<Case> {};

TEST_P(Adv2PoolsRandom, InvariantsHoldThroughPoolsRegionsAndSleeps) {
  EXPSEG_SEEDED(seed, 4242);
  TestRng rng(seed);
  auto R = [&rng]() { return (int)(rng.next() >> 33); };
  QuietLog quiet;
  AllocPtr owner = make_alloc(GetParam().driver, GetParam().config);
  ASSERT_TRUE(owner);
  expseg_allocator *a = owner.get();
  int fails = 0;
  std::vector<void *> live;
  std::vector<expseg_pool_id> pools;
  std::vector<expseg_pool_id> begun;
  const char *tags[] = {"w", "kv"};
  bool asleep[2] = {};
  int in_region = -1;
  for (int i = 0; i < 2500; i++) {
    int op = R() % 100;
    const char *what = "";
    if (op < 35) {
      what = "malloc";
      void *p;
      size_t n = R() % 3 ? R() % 2000000 + 1 : R() % 30000000 + 1;
      expseg_pool_id pid = pools.empty() || R() % 2 ? 0 : pools[R() % pools.size()];
      expseg_status st = R() % 3 == 0 ? expseg_malloc_pool(a, n, R() % 3, pid, &p)
                                      : expseg_malloc(a, n, R() % 3, &p);
      if (st == EXPSEG_OK && p) live.push_back(p);
    } else if (op < 60) {
      what = "free";
      if (!live.empty()) {
        size_t k = R() % live.size();
        if (R() % 4 == 0) (void)expseg_record_stream(a, live[k], 7);
        expseg_free(a, live[k]);
        live[k] = live.back();
        live.pop_back();
      }
    } else if (op < 65) {
      what = "pool_create";
      expseg_pool_id id;
      if (expseg_pool_create(a, &id) == EXPSEG_OK) pools.push_back(id);
    } else if (op < 69) {
      what = "pool_release";
      if (!pools.empty()) {
        size_t k = R() % pools.size();
        bool b = false;
        for (auto x : begun) b |= x == pools[k];
        if (!b) {
          expseg_pool_release(a, pools[k]);
          pools[k] = pools.back();
          pools.pop_back();
        }
      }
    } else if (op < 73) {
      what = "pool_begin/end";
      if (!begun.empty() && R() % 2) {
        expseg_pool_end(a, begun.back());
        begun.pop_back();
      } else if (!pools.empty()) {
        auto id = pools[R() % pools.size()];
        if (expseg_pool_begin(a, id, nullptr, nullptr) == EXPSEG_OK) begun.push_back(id);
      }
    } else if (op < 76) {
      what = "empty_cache";
      expseg_empty_cache(a);
    } else if (op < 78) {
      what = "pool_empty_cache";
      if (!pools.empty()) expseg_pool_empty_cache(a, pools[R() % pools.size()]);
    } else if (op < 82) {
      what = "region";
      int t = R() % 2;
      if (in_region >= 0) {
        expseg_region_end(a, tags[in_region]);
        in_region = -1;
      } else if (begun.empty() && !asleep[t]) {
        if (expseg_region_begin(a, tags[t]) == EXPSEG_OK) in_region = t;
      }
    } else if (op < 86) {
      what = "sleep/wake";
      int t = R() % 2;
      if (in_region != t) {
        if (asleep[t]) {
          if (expseg_wake(a, tags[t]) == EXPSEG_OK) asleep[t] = false;
        } else {
          expseg_status st =
              expseg_sleep(a, tags[t], R() % 2 ? EXPSEG_SLEEP_OFFLOAD : EXPSEG_SLEEP_DISCARD);
          if (st == EXPSEG_OK) asleep[t] = true;
        }
      }
    } else if (op < 88) {
      what = "fraction";
      expseg_set_memory_fraction(a, (R() % 5) / 4.0);
    } else if (op < 90) {
      what = "reset";
      if (R() % 2)
        expseg_reset_peak_stats(a);
      else
        expseg_reset_accumulated_stats(a);
    } else if (op < 93) {
      what = "hold";
      expseg_testing_hold_stream(a, 7, R() % 2);
    } else {
      what = "snapshot";
      unsigned char *b;
      size_t n;
      if (expseg_snapshot_ex(a, EXPSEG_SNAPSHOT_NO_TRACES, &b, &n) == EXPSEG_OK)
        expseg_snapshot_free(b);
    }
    check(a, i, what, fails);
    if (fails > 10) break;
  }
  EXPECT_EQ(fails, 0);
  EXPECT_EQ(expseg_testing_hold_stream(a, 7, false), EXPSEG_OK);
  expect_nothing_left(owner.release(), "after the run");
}

const char *const kCaseNames[] = {"host_expandable", "sim_classic", "host_gc_split"};

INSTANTIATE_TEST_SUITE_P(Configs, Adv2PoolsRandom,
                         ::testing::Values(Case{"host:capacity=256M", "expandable_segments:True"},
                                           Case{"sim:capacity=512M", "expandable_segments:False"},
                                           Case{"host:capacity=128M",
                                                "expandable_segments:True,"
                                                "garbage_collection_threshold:0.6,"
                                                "max_split_size_mb:20"}),
                         [](const ::testing::TestParamInfo<Case> &i) {
                           return std::string(kCaseNames[i.index]);
                         });

}  // namespace
