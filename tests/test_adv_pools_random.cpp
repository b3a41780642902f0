// SPDX-License-Identifier: Apache-2.0
// test_adv_pools_random.cpp: the seeded random differential run of the private pools against
// a small model of which pool each live pointer belongs to (fixture: test_adv_pools_common.h).
#include "test_adv_pools_common.h"

// The random differential run: a model of which pool each live pointer belongs to, which
// pools are live/begun, and which memory may be handed out (never a live block's range).
TEST_P(AdvPools, RandomDifferential) {
  EXPSEG_SEEDED(seed, 20261126);
  TestRng rng(seed);
  struct Live {
    size_t size;
    expseg_pool_id pool;
    expseg_stream stream;
    expseg_stream used; // recorded on this stream too (0: none)
  };
  std::map<uintptr_t, Live> live;
  // memory that may not be handed out: freed while a stream recorded on it is held
  // (guard.used) or cached by a live private pool (another pool may not have it until that
  // pool is emptied or released)
  struct Guard {
    uintptr_t at;
    size_t size;
    expseg_stream used;
    expseg_pool_id pool;
  };
  std::vector<Guard> guards;
  std::set<expseg_stream> held;
  auto unguard_pool = [&](expseg_pool_id id) {
    for (auto &g : guards)
      if (g.used == 0 && g.pool == id) g.size = 0;
  };
  std::map<expseg_pool_id, int> count;     // live pools and their use counts
  std::vector<expseg_pool_id> begun;       // newest last
  std::set<expseg_pool_id> released;       // ids that must stay refused
  const size_t sizes[] = {512, 4000, 100 * KiB, 1 * MiB + 1, 3 * MiB, 12 * MiB};
  expseg_info info;
  ASSERT_EQ(expseg_get_info(a, &info), EXPSEG_OK);
  for (int step = 0; step < 4000; step++) {
    SCOPED_TRACE("step " + std::to_string(step));
    int op = (int)rng.below(100);
    if (op < 6) {
      expseg_pool_id id = 0;
      ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK);
      ASSERT_EQ(count.count(id) + released.count(id), 0u) << "id reused";
      count[id] = 1;
    } else if (op < 9 && !count.empty()) {
      auto it = std::next(count.begin(), (long)rng.below(count.size()));
      ASSERT_EQ(expseg_pool_retain(a, it->first), EXPSEG_OK);
      it->second++;
    } else if (op < 15 && !count.empty()) {
      auto it = std::next(count.begin(), (long)rng.below(count.size()));
      bool is_begun = false;
      for (auto b : begun) is_begun = is_begun || b == it->first;
      expseg_status st = expseg_pool_release(a, it->first);
      if (it->second == 1 && is_begun) {
        ASSERT_EQ(st, EXPSEG_ERR_INVALID_ARGUMENT);
      } else {
        ASSERT_EQ(st, EXPSEG_OK) << expseg_last_error();
        if (--it->second == 0) {
          unguard_pool(it->first);
          released.insert(it->first);
          count.erase(it);
        }
      }
    } else if (op < 19 && !count.empty()) {
      auto it = std::next(count.begin(), (long)rng.below(count.size()));
      ASSERT_EQ(expseg_pool_begin(a, it->first, nullptr, nullptr), EXPSEG_OK);
      begun.push_back(it->first);
    } else if (op < 23 && !begun.empty()) {
      size_t i = rng.below(begun.size());
      ASSERT_EQ(expseg_pool_end(a, begun[i]), EXPSEG_OK);
      // the newest begin of that id goes
      for (size_t j = begun.size(); j > 0; j--)
        if (begun[j - 1] == begun[i]) {
          begun.erase(begun.begin() + (long)(j - 1));
          break;
        }
    } else if (op < 25 && !released.empty()) {
      auto it = std::next(released.begin(), (long)rng.below(released.size()));
      void *q = (void *)1;
      ASSERT_EQ(expseg_malloc_pool(a, 4096, 0, *it, &q), EXPSEG_ERR_INVALID_ARGUMENT);
      ASSERT_EQ(q, nullptr);
      ASSERT_EQ(expseg_pool_retain(a, *it), EXPSEG_ERR_INVALID_ARGUMENT);
    } else if (op < 27) {
      if (rng.chance(0.5)) {
        ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
      } else if (!count.empty()) {
        auto it = std::next(count.begin(), (long)rng.below(count.size()));
        ASSERT_EQ(expseg_pool_empty_cache(a, it->first), EXPSEG_OK);
        unguard_pool(it->first);
      }
    } else if (op < 29) {
      expseg_stream s = 10 + rng.below(2);
      bool hold = !held.count(s);
      ASSERT_EQ(expseg_testing_hold_stream(a, s, hold), EXPSEG_OK);
      if (hold) {
        held.insert(s);
      } else {
        held.erase(s);
        for (auto &g : guards)
          if (g.used == s) g.size = 0;
      }
    } else if (op < 62) {
      size_t size = sizes[rng.below(6)];
      expseg_stream s = rng.below(3);
      expseg_pool_id want = 0;
      void *p = nullptr;
      expseg_status st;
      if (rng.chance(0.5) && !count.empty()) {
        want = std::next(count.begin(), (long)rng.below(count.size()))->first;
        st = expseg_malloc_pool(a, size, s, want, &p);
      } else {
        want = begun.empty() ? 0 : begun.back();
        st = expseg_malloc(a, size, s, &p);
      }
      if (st == EXPSEG_ERR_OUT_OF_MEMORY) continue;
      ASSERT_EQ(st, EXPSEG_OK) << expseg_last_error();
      ASSERT_EQ(pool_of(p), want);
      uintptr_t u = (uintptr_t)p;
      auto nx = live.lower_bound(u);
      ASSERT_TRUE(nx == live.end() || nx->first >= u + size) << "overlaps a live block";
      if (nx != live.begin()) {
        auto pv = std::prev(nx);
        ASSERT_LE(pv->first + pv->second.size, u) << "overlaps a live block";
      }
      for (const Guard &g : guards) {
        bool overlap = g.size != 0 && u < g.at + g.size && g.at < u + size;
        ASSERT_FALSE(overlap && g.used != 0) << "memory freed under held stream " << g.used;
        ASSERT_FALSE(overlap && g.used == 0 && g.pool != want)
            << "pool " << want << " got memory cached by live pool " << g.pool;
      }
      live[u] = {size, want, s, 0};
      if (rng.chance(0.15)) {
        expseg_stream use = rng.chance(0.5) ? 10 + rng.below(2) : s + 1;
        ASSERT_EQ(expseg_record_stream(a, p, use), EXPSEG_OK);
        live[u].used = use;
      }
    } else if (!live.empty()) {
      auto it = std::next(live.begin(), (long)rng.below(live.size()));
      ASSERT_EQ(pool_of((void *)it->first), it->second.pool);
      ASSERT_EQ(expseg_free(a, (void *)it->first), EXPSEG_OK);
      if (held.count(it->second.used))
        guards.push_back({it->first, it->second.size, it->second.used, it->second.pool});
      if (it->second.pool != 0 && count.count(it->second.pool))
        guards.push_back({it->first, it->second.size, 0, it->second.pool});
      live.erase(it);
    }
    // model checks: use counts, released ids refused
    if (step % 50 == 0) {
      for (auto &c : count) {
        int n = 0;
        ASSERT_EQ(expseg_pool_use_count(a, c.first, &n), EXPSEG_OK);
        ASSERT_EQ(n, c.second);
      }
      for (auto r : released) {
        int n;
        ASSERT_EQ(expseg_pool_use_count(a, r, &n), EXPSEG_ERR_INVALID_ARGUMENT);
      }
      ASSERT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
      ASSERT_EQ(stat_of(a, "allocation.all.current"), (int64_t)live.size());
    }
  }
  for (expseg_stream s : held) ASSERT_EQ(expseg_testing_hold_stream(a, s, false), EXPSEG_OK);
  while (!begun.empty()) {
    ASSERT_EQ(expseg_pool_end(a, begun.back()), EXPSEG_OK);
    begun.pop_back();
  }
  for (auto &l : live) ASSERT_EQ(expseg_free(a, (void *)l.first), EXPSEG_OK);
  for (auto &c : count) {
    for (int i = 0; i < c.second; i++) ASSERT_EQ(expseg_pool_release(a, c.first), EXPSEG_OK);
  }
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
}

EXPSEG_ADV_POOLS_INSTANTIATE();
