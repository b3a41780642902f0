// SPDX-License-Identifier: Apache-2.0
// test_policy_gc.cpp: garbage-collection decisions (policy/gc.c) with a fake clock: when GC is
// active, how much it reclaims, which idle items go first (oldest first, ties by larger
// bytes), that it stops once the target is reached, and that held memory ends at or under
// threshold x allowed over a seeded random workload.
#include <gtest/gtest.h>

#include "test_seed.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <random>
#include <vector>

#include "test_policy_common.h"

using policy_test::defaults;

using policy_test::conf;

namespace {

constexpr size_t MiB = size_t(1) << 20, GiB = size_t(1) << 30;

TEST(PolicyGc, TargetOnlyWhenActive) {
  // inactive: no threshold, or no fraction below 1 (as PyTorch 2.9+)
  expseg_config_t off = defaults();
  EXPECT_EQ(_expseg_gc_target(&off, 100 * GiB, 10 * GiB), 0u);
  expseg_config_t nofrac = conf("garbage_collection_threshold:0.5");
  EXPECT_EQ(_expseg_gc_target(&nofrac, 100 * GiB, SIZE_MAX), 0u);
  EXPECT_EQ(_expseg_gc_target(&nofrac, 100 * GiB, 10 * GiB), 0u);
  expseg_config_t nothr = conf("per_process_memory_fraction:0.5");
  EXPECT_EQ(_expseg_gc_target(&nothr, 100 * GiB, 10 * GiB), 0u);
  // active: held - threshold x allowed, when held exceeds it
  expseg_config_t c = conf("per_process_memory_fraction:0.5,garbage_collection_threshold:0.8");
  EXPECT_EQ(_expseg_gc_target(&c, 9 * GiB, 10 * GiB), 9 * GiB - 8 * GiB);
  EXPECT_EQ(_expseg_gc_target(&c, 8 * GiB, 10 * GiB), 0u);
  EXPECT_EQ(_expseg_gc_target(&c, 8 * GiB + 1, 10 * GiB), 1u);
  EXPECT_EQ(_expseg_gc_target(&c, 0, 10 * GiB), 0u);
  EXPECT_EQ(_expseg_gc_target(&c, 5, 0), 5u);
}

std::vector<uintptr_t> tags(const expseg_gc_item_t *it, size_t n) {
  std::vector<uintptr_t> t;
  for (size_t i = 0; i < n; i++) t.push_back(it[i].tag);
  return t;
}

TEST(PolicyGc, OldestFirstUntilTarget) {
  // fake clock in ns; tag = item id
  const uint64_t now = 1000000;
  expseg_gc_item_t items[] = {
      {20 * MiB, now - 10, 1, 0},      // idle 10 ns
      {2 * MiB, now - 500000, 2, 0},   // the oldest
      {64 * MiB, now - 300000, 3, 0},  // second oldest
      {8 * MiB, now - 300000, 4, 0},   // same age as 3, smaller: after 3
      {4 * MiB, now + 50, 5, 0},       // idle since "later than now": age 0
      {6 * MiB, now, 6, 0},            // age 0, larger than 5: before 5
  };
  const size_t n = sizeof items / sizeof items[0];
  // target 1 byte: only the oldest
  expseg_gc_item_t a[n];
  std::copy(items, items + n, a);
  EXPECT_EQ(_expseg_gc_select(a, n, 1, now), 1u);
  EXPECT_EQ(a[0].tag, 2u);
  // target 66 MiB: 2 MiB + 64 MiB reach it exactly; nothing more is taken
  std::copy(items, items + n, a);
  EXPECT_EQ(_expseg_gc_select(a, n, 66 * MiB, now), 2u);
  EXPECT_EQ(tags(a, 2), (std::vector<uintptr_t>{2, 3}));
  // target 67 MiB: the next one (same age, smaller) too
  std::copy(items, items + n, a);
  EXPECT_EQ(_expseg_gc_select(a, n, 67 * MiB, now), 3u);
  EXPECT_EQ(tags(a, 3), (std::vector<uintptr_t>{2, 3, 4}));
  // more than everything: all, in the full order
  std::copy(items, items + n, a);
  EXPECT_EQ(_expseg_gc_select(a, n, 10 * GiB, now), n);
  EXPECT_EQ(tags(a, n), (std::vector<uintptr_t>{2, 3, 4, 1, 6, 5}));
  // target 0: nothing
  std::copy(items, items + n, a);
  EXPECT_EQ(_expseg_gc_select(a, n, 0, now), 0u);
  EXPECT_EQ(_expseg_gc_select(nullptr, 0, 5, now), 0u);
  // the same items are there afterwards (reordered, untouched)
  std::copy(items, items + n, a);
  _expseg_gc_select(a, n, 30 * MiB, now);
  std::vector<uintptr_t> t = tags(a, n);
  std::sort(t.begin(), t.end());
  EXPECT_EQ(t, (std::vector<uintptr_t>{1, 2, 3, 4, 5, 6}));
  for (size_t i = 0; i < n; i++) EXPECT_EQ(a[i].bytes, items[a[i].tag - 1].bytes);
}

// Items of the same age and size go in the order they were listed, whatever their tags
// (pools/ passes struct addresses as tags: a tie by tag made the victims depend on where
// the host heap put the structs).
TEST(PolicyGc, TiesGoInListingOrderNotByTag) {
  const uint64_t now = 1000;
  expseg_gc_item_t items[] = {{2 * MiB, 10, 900, 0}, {2 * MiB, 10, 300, 0}, {2 * MiB, 10, 600, 0},
                              {2 * MiB, 5, 1000, 0}};
  EXPECT_EQ(_expseg_gc_select(items, 4, 5 * MiB, now), 3u);
  EXPECT_EQ(tags(items, 3), (std::vector<uintptr_t>{1000, 900, 300}));
}

// A cache of idle items (classic segments, mapped idle pages, cached physical pages alike)
// under a fake clock: allocations make memory idle at known times, then GC runs.
TEST(PolicyGc, HeldEndsUnderThresholdRandom) {
  EXPSEG_SEEDED(seed, 20261122);
  std::mt19937_64 rng(seed);
  expseg_config_t c = conf("per_process_memory_fraction:0.5,garbage_collection_threshold:0.6");
  const size_t allowed = _expseg_allowed_bytes(c.per_process_memory_fraction, 80 * GiB);
  ASSERT_EQ(allowed, 40 * GiB);
  const size_t limit = (size_t)(0.6 * (double)allowed);
  for (int round = 0; round < 300; round++) {
    uint64_t clock = 1000;  // fake clock
    std::vector<expseg_gc_item_t> idle;
    size_t active = rng() % (10 * GiB);  // memory in use: never a victim
    size_t n = 1 + rng() % 400;
    for (size_t i = 0; i < n; i++) {
      clock += rng() % 1000000;
      idle.push_back({(size_t)(1 + rng() % 8) * ((rng() & 1) ? 2 * MiB : 20 * MiB) +
                          (size_t)(rng() % 4) * 512 * MiB,
                      clock, (uintptr_t)i, 0});
    }
    size_t held = active;
    for (auto &it : idle) held += it.bytes;
    size_t target = _expseg_gc_target(&c, held, allowed);
    std::vector<expseg_gc_item_t> before = idle;
    size_t k = _expseg_gc_select(idle.data(), idle.size(), target, clock);
    size_t freed = 0;
    for (size_t i = 0; i < k; i++) freed += idle[i].bytes;
    if (held <= limit) {
      EXPECT_EQ(target, 0u);
      EXPECT_EQ(k, 0u);
      continue;
    }
    EXPECT_EQ(target, held - limit);
    size_t total_idle = held - active;
    if (total_idle >= target) {
      EXPECT_LE(held - freed, limit) << "held must end at or under the threshold";
      EXPECT_LT(freed - idle[k - 1].bytes, target) << "no victim beyond the target";
    } else {
      EXPECT_EQ(k, idle.size());  // everything idle goes, and it is still not enough
    }
    // victims are the oldest: every victim idle since no later than every survivor
    for (size_t i = 0; i < k; i++) {
      if (i) {
        EXPECT_LE(idle[i - 1].idle_since_ns, idle[i].idle_since_ns);
      }
      for (size_t j = k; j < idle.size(); j++)
        ASSERT_LE(idle[i].idle_since_ns, idle[j].idle_since_ns);
    }
    // the same multiset of items
    auto by_tag = [](const expseg_gc_item_t &a, const expseg_gc_item_t &b) { return a.tag < b.tag; };
    std::sort(idle.begin(), idle.end(), by_tag);
    for (size_t i = 0; i < idle.size(); i++) {
      EXPECT_EQ(idle[i].tag, before[i].tag);
      EXPECT_EQ(idle[i].bytes, before[i].bytes);
    }
  }
}

// A time line: segments freed at t=1..4 s; at t=5 s the allocator holds too much and GC
// releases the ones idle longest; later frees then go before the newer survivors.
TEST(PolicyGc, FakeClockTimeline) {
  const uint64_t s = 1000000000ull;
  expseg_config_t c = conf("per_process_memory_fraction:0.25,garbage_collection_threshold:0.5");
  const size_t allowed = _expseg_allowed_bytes(0.25, 64 * GiB);  // 16 GiB; threshold 8 GiB
  std::vector<expseg_gc_item_t> cache = {{2 * GiB, 1 * s, 'A', 0},
                                         {3 * GiB, 2 * s, 'B', 0},
                                         {1 * GiB, 3 * s, 'C', 0},
                                         {2 * GiB, 4 * s, 'D', 0}};
  size_t in_use = 3 * GiB;
  size_t held = in_use + 8 * GiB;  // 11 GiB > 8 GiB
  size_t target = _expseg_gc_target(&c, held, allowed);
  EXPECT_EQ(target, 3 * GiB);
  size_t k = _expseg_gc_select(cache.data(), cache.size(), target, 5 * s);
  ASSERT_EQ(k, 2u);  // A (oldest, 2 GiB) then B (3 GiB): 5 GiB >= 3 GiB
  EXPECT_EQ(cache[0].tag, (uintptr_t)'A');
  EXPECT_EQ(cache[1].tag, (uintptr_t)'B');
  held -= cache[0].bytes + cache[1].bytes;
  EXPECT_LE(held, 8 * GiB);
  cache.erase(cache.begin(), cache.begin() + 2);
  // t = 6 s: 4 GiB more freed and held grows again
  cache.push_back({4 * GiB, 6 * s, 'E', 0});
  held += 4 * GiB;  // 10 GiB
  target = _expseg_gc_target(&c, held, allowed);
  EXPECT_EQ(target, 2 * GiB);
  k = _expseg_gc_select(cache.data(), cache.size(), target, 7 * s);
  ASSERT_EQ(k, 2u);  // C (1 GiB, t=3) then D (2 GiB, t=4); E (newest) stays
  EXPECT_EQ(cache[0].tag, (uintptr_t)'C');
  EXPECT_EQ(cache[1].tag, (uintptr_t)'D');
  EXPECT_EQ(cache[2].tag, (uintptr_t)'E');
}

}  // namespace
