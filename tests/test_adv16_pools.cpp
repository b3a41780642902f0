// SPDX-License-Identifier: Apache-2.0
// test_adv16_pools.cpp: adversarial cases on private pools against their contract (docs/api.md
// "Private pools"): a released pool's free blocks never handed to others while it drains,
// a region's pool driven through the pool calls while it sleeps, and a seeded random run
// with a model of routing (begins with stream filters), use counts and draining that checks
// after every step which pool each block's segment belongs to and that the statistics of a
// pool that drains leave reserved_bytes exactly (fixture: test_adv_pools_common.h).
#include "test_adv_pools_common.h"

#include <deque>

namespace {

struct WalkSeg {
  uint64_t address, total_size;
  expseg_pool_id pool;
  bool asleep;
  std::vector<expseg_walk_block> blocks;
};

std::vector<WalkSeg> walk_segments(expseg_allocator *a) {
  std::vector<WalkSeg> out;
  auto seg = [](void *ctx, const expseg_walk_segment *s) {
    static_cast<std::vector<WalkSeg> *>(ctx)->push_back(
        {s->address, s->total_size, s->pool, s->asleep,
         std::vector<expseg_walk_block>(s->blocks, s->blocks + s->n_blocks)});
  };
  EXPECT_EQ(expseg_walk(a, seg, nullptr, &out), EXPSEG_OK) << expseg_last_error();
  return out;
}

// The pool of the segment holding address p, per expseg_walk (~0: in no segment).
expseg_pool_id segment_pool(const std::vector<WalkSeg> &segs, uintptr_t p) {
  for (const WalkSeg &s : segs)
    if (p >= s.address && p < s.address + s.total_size) return s.pool;
  return ~(expseg_pool_id)0;
}

// accepts the streams whose bit is set in *(unsigned *)ctx
bool accept_mask(void *ctx, expseg_stream s) {
  return s < 32 && ((*static_cast<unsigned *>(ctx) >> s) & 1u);
}

} // namespace

// PyTorch keeps a released pool's memory until its blocks are freed, and no one else may be
// handed its free blocks meanwhile: not the general cache (same stream, same size), not
// another pool, not under memory pressure.
TEST_P(AdvPools, ReleasedPoolFreeBlocksStayItsOwnWhileItDrains) {
  expseg_pool_id p = create();
  // whole 2 MiB pages each, so that x's freed block holds whole chunks of its own
  const size_t big = 4 * MiB;
  void *x = alloc(big, 1, p), *y = alloc(big, 1, p), *s = alloc(600, 1, p);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  const uintptr_t yb = (uintptr_t)y;
  const int64_t pkey = stat_of(a, pool_key(p));
  EXPECT_GT(pkey, 0);
  expseg_pool_id q = create();
  std::vector<void *> got;
  for (int round = 0; round < 200; round++) {
    void *g = nullptr;
    expseg_status st = round % 3 == 2 ? expseg_malloc_pool(a, big, 1, q, &g)
                                      : expseg_malloc(a, round % 2 ? big : 600, 1, &g);
    if (st != EXPSEG_OK) {
      ASSERT_EQ(st, EXPSEG_ERR_OUT_OF_MEMORY) << expseg_last_error();
      break; // the device is full: pressure reached
    }
    got.push_back(g);
    const auto segs = walk_segments(a);
    ASSERT_NE(segment_pool(segs, (uintptr_t)g), p)
        << "round " << round << ": a block of released pool " << p
        << " (still holding live blocks) was handed to " << (round % 3 == 2 ? "pool q" : "the general cache");
    ASSERT_FALSE((uintptr_t)g < yb + big && (uintptr_t)g + 600 > yb) << "overlaps a live block";
  }
  EXPECT_EQ(pool_of(y), p);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  for (void *g : got) ASSERT_EQ(expseg_free(a, g), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_TRUE(has_stat(a, pool_key(p))) << "live blocks keep the released pool";
  EXPECT_EQ(stat_of(a, pool_key(p)), pkey) << "empty_cache gives back none of a pool with live blocks";
  ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
  const int64_t before = stat_of(a, "reserved_bytes.all.current");
  ASSERT_EQ(expseg_free(a, s), EXPSEG_OK);
  EXPECT_FALSE(has_stat(a, pool_key(p)));
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), before - pkey)
      << "the drained pool's bytes leave reserved_bytes exactly";
  ASSERT_EQ(expseg_pool_release(a, q), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
}

// A released pool whose last (small) block is freed right after its small segment grew by
// taking the general cache's idle large pages: the free gives the pool back at once, as
// the contract says, though a steal's second pass (small pages for a large request) is held
// back for a while after such a move.
TEST_P(AdvPools, ReleasedPoolSmallPagesGoBackAtItsLastFreeAfterAMoveBetweenSizes) {
  std::vector<void *> full;
  for (;;) { // the device full of general 4 MiB blocks
    void *g = nullptr;
    if (expseg_malloc(a, 4 * MiB, 0, &g) != EXPSEG_OK) break;
    full.push_back(g);
  }
  ASSERT_GT(full.size(), 2u);
  ASSERT_EQ(expseg_free(a, full.back()), EXPSEG_OK); // idle large pages of the general cache
  full.pop_back();
  expseg_pool_id p = create();
  void *s = alloc(600, 1, p); // its small segment: taken from those idle large pages
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  ASSERT_TRUE(has_stat(a, pool_key(p)));
  const int64_t before = stat_of(a, "reserved_bytes.all.current"), pkey = stat_of(a, pool_key(p));
  ASSERT_EQ(expseg_free(a, s), EXPSEG_OK);
  EXPECT_FALSE(has_stat(a, pool_key(p))) << "its last free (streams idle) gives the pool back";
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), before - pkey);
  free_blocks(a, full);
}

// A region's pool through the pool calls: retain/release above its own count, routing and
// malloc_pool refused while it sleeps, pool_empty_cache of a sleeping region loses nothing,
// and the last release (the region's own) is refused.
TEST_P(AdvPools, RegionPoolThroughPoolCallsWhileAsleep) {
  const bool bytes = std::strncmp(GetParam().driver, "host", 4) == 0; // sim keeps no bytes
  ASSERT_EQ(expseg_region_begin(a, "w"), EXPSEG_OK) << expseg_last_error();
  void *x = nullptr, *z = nullptr;
  ASSERT_EQ(expseg_malloc(a, 3 * MiB, 1, &x), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 3 * MiB, 1, &z), EXPSEG_OK);
  ASSERT_EQ(expseg_region_end(a, "w"), EXPSEG_OK);
  expseg_region_info info;
  ASSERT_EQ(expseg_region_get_info(a, "w", &info), EXPSEG_OK);
  const expseg_pool_id r = info.pool;
  EXPECT_EQ(pool_of(x), r);
  ASSERT_EQ(expseg_pool_retain(a, r), EXPSEG_OK);
  std::vector<unsigned char> pat(3 * MiB), back(3 * MiB);
  for (size_t i = 0; i < pat.size(); i++) pat[i] = (unsigned char)(i * 131 + 7);
  if (bytes) {
    ASSERT_EQ(expseg_testing_copy_in(a, x, pat.data(), pat.size()), EXPSEG_OK);
  }
  ASSERT_EQ(expseg_free(a, z), EXPSEG_OK); // free memory in the region before the sleep
  ASSERT_EQ(expseg_sleep(a, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  void *p = reinterpret_cast<void *>(1);
  EXPECT_EQ(expseg_malloc_pool(a, 4096, 1, r, &p), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  ASSERT_EQ(expseg_pool_begin(a, r, nullptr, nullptr), EXPSEG_OK);
  p = reinterpret_cast<void *>(1);
  EXPECT_EQ(expseg_malloc(a, 4096, 1, &p), EXPSEG_ERR_INVALID_ARGUMENT) << "routed to a sleeping region";
  ASSERT_EQ(expseg_pool_end(a, r), EXPSEG_OK);
  const StatMap before = all_stats(a);
  ASSERT_EQ(expseg_pool_empty_cache(a, r), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(stat_of(a, pool_key(r)), before.at(pool_key(r))) << "emptying a sleeping region";
  ASSERT_EQ(expseg_wake(a, "w"), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(pool_of(x), r);
  if (bytes) {
    ASSERT_EQ(expseg_testing_copy_out(a, back.data(), x, back.size()), EXPSEG_OK);
    EXPECT_TRUE(back == pat) << "the region's live bytes changed across pool_empty_cache while asleep";
  }
  int n = 0;
  ASSERT_EQ(expseg_pool_use_count(a, r, &n), EXPSEG_OK);
  EXPECT_EQ(n, 2);
  ASSERT_EQ(expseg_pool_release(a, r), EXPSEG_OK);
  expect_refused("last release of a region's pool", [&] { return expseg_pool_release(a, r); },
                 EXPSEG_ERR_INVALID_ARGUMENT, "\"w\"", "accepted");
  void *y = alloc(5000, 2, r);
  EXPECT_EQ(pool_of(y), r);
  ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
}

// The seeded random run: pools created, retained, released, begun with stream filters and
// ended, allocations routed or direct, frees and both empty_caches. After each step: every
// live pointer's pool (pool_of and the segment expseg_walk puts it in) is the model's,
// no segment of a pool holds a block of another, a pool's statistics exist exactly while
// it is live or holds blocks, and a pool that drains takes exactly its reserved bytes out
// of reserved_bytes.all.current. On the fault driver, growth fails now and then: the failed
// request leaves nothing behind (checked, and by the fixture's end).
TEST_P(AdvPools, RandomRoutingUseCountsAndDraining) {
  EXPSEG_SEEDED(seed, 20261128);
  TestRng rng(seed);
  // on the fault driver (the Faults instantiation) growth calls fail now and then
  const bool faults = std::strncmp(GetParam().driver, "fault:", 6) == 0;
  struct Live {
    size_t size;
    expseg_pool_id pool;
  };
  std::map<uintptr_t, Live> live;
  std::map<expseg_pool_id, int> count;           // live pools and their use counts
  std::set<expseg_pool_id> draining;             // released, blocks still live
  std::set<expseg_pool_id> gone;                 // released and given back
  struct Begin {
    expseg_pool_id id;
    unsigned *mask; // nullptr: every stream
  };
  std::vector<Begin> begun; // newest last
  std::deque<unsigned> masks;
  const size_t sizes[] = {512, 3000, 200 * KiB, 1 * MiB + 1, 3 * MiB, 9 * MiB};
  auto routed = [&](expseg_stream s) -> expseg_pool_id {
    for (size_t i = begun.size(); i-- > 0;)
      if (begun[i].mask == nullptr || accept_mask(begun[i].mask, s)) return begun[i].id;
    return 0;
  };
  auto blocks_of = [&](expseg_pool_id id) {
    size_t n = 0;
    for (auto &kv : live) n += kv.second.pool == id;
    return n;
  };
  auto pick_pool = [&]() -> expseg_pool_id {
    return count.empty() ? 0 : std::next(count.begin(), (long)rng.below(count.size()))->first;
  };
  const int steps = 1500;
  for (int step = 0; step < steps; step++) {
    SCOPED_TRACE("step " + std::to_string(step));
    const int op = (int)rng.below(100);
    // a free that drains a pool: reserved_bytes.all.current must drop by exactly its key
    expseg_pool_id drains = 0;
    int64_t drain_key = 0, reserved_before = 0;
    if (op < 5 && count.size() < 6) {
      expseg_pool_id id = create();
      ASSERT_NE(id, 0u);
      ASSERT_EQ(count.count(id) + draining.count(id) + gone.count(id), 0u) << "id reused";
      count[id] = 1;
    } else if (op < 8 && !count.empty()) {
      expseg_pool_id id = pick_pool();
      ASSERT_EQ(expseg_pool_retain(a, id), EXPSEG_OK);
      count[id]++;
    } else if (op < 14 && !count.empty()) {
      expseg_pool_id id = pick_pool();
      bool is_begun = false;
      for (auto &b : begun) is_begun = is_begun || b.id == id;
      if (count[id] == 1 && is_begun) {
        expect_refused("release of a begun pool", [&] { return expseg_pool_release(a, id); },
                       EXPSEG_ERR_INVALID_ARGUMENT, std::to_string(id), "expseg_pool_end");
        continue;
      }
      const bool last = count[id] == 1;
      if (last && blocks_of(id) == 0) {
        drains = id;
        drain_key = stat_of(a, pool_key(id));
        reserved_before = stat_of(a, "reserved_bytes.all.current");
      }
      ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_OK) << expseg_last_error();
      if (--count[id] == 0) {
        count.erase(id);
        (blocks_of(id) ? draining : gone).insert(id);
        int n;
        ASSERT_EQ(expseg_pool_use_count(a, id, &n), EXPSEG_ERR_INVALID_ARGUMENT) << "released twice";
        ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_ERR_INVALID_ARGUMENT) << "released twice";
      }
    } else if (op < 20 && !count.empty()) {
      expseg_pool_id id = pick_pool();
      unsigned *m = nullptr;
      if (rng.chance(0.7)) {
        masks.push_back((unsigned)rng.below(16));
        m = &masks.back();
      }
      ASSERT_EQ(expseg_pool_begin(a, id, m ? accept_mask : nullptr, m), EXPSEG_OK);
      begun.push_back({id, m});
    } else if (op < 27) {
      // end: a begun pool, or one not begun (refused, nothing changed)
      expseg_pool_id id = !begun.empty() && rng.chance(0.8) ? begun[rng.below(begun.size())].id
                                                             : pick_pool();
      size_t i = begun.size();
      while (i > 0 && begun[i - 1].id != id) i--;
      if (id == 0) continue;
      if (i == 0) {
        expect_refused("end without begin", [&] { return expseg_pool_end(a, id); },
                       EXPSEG_ERR_INVALID_ARGUMENT, std::to_string(id), "accepted");
      } else {
        ASSERT_EQ(expseg_pool_end(a, id), EXPSEG_OK);
        begun.erase(begun.begin() + (long)(i - 1));
      }
    } else if (op < 60) {
      const expseg_stream s = rng.below(4);
      const size_t size = sizes[rng.below(6)];
      void *p = nullptr;
      expseg_pool_id want;
      expseg_status st;
      if (faults && rng.chance(0.4)) { // the growth this request may need fails
        static const char *const rules[] = {"create@1", "map@1:driver", "reserve@1:oom",
                                            "set_access@1:driver", "create@1..3:oom"};
        ASSERT_EQ(expseg_testing_set_faults(a, rules[rng.below(5)]), EXPSEG_OK);
      }
      if (rng.chance(0.3)) { // direct: a live pool, the general cache, or a released id
        want = rng.chance(0.8) ? pick_pool() : 0;
        if (!draining.empty() && rng.chance(0.15)) {
          const expseg_pool_id dead = *std::next(draining.begin(), (long)rng.below(draining.size()));
          expect_refused("malloc_pool into a released pool",
                         [&] { return expseg_malloc_pool(a, size, s, dead, &p); },
                         EXPSEG_ERR_INVALID_ARGUMENT, std::to_string(dead), "accepted");
          ASSERT_EQ(p, nullptr);
          continue;
        }
        st = expseg_malloc_pool(a, size, s, want, &p);
      } else {
        want = routed(s);
        st = expseg_malloc(a, size, s, &p);
      }
      if (faults) {
        ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK);
      }
      if (st == EXPSEG_ERR_OUT_OF_MEMORY || (faults && st == EXPSEG_ERR_DRIVER)) {
        ASSERT_EQ(p, nullptr);
        ASSERT_EQ(expseg_check(a), EXPSEG_OK) << "a failed growth: " << expseg_last_error();
        continue;
      }
      ASSERT_EQ(st, EXPSEG_OK) << expseg_last_error();
      ASSERT_EQ(pool_of(p), want) << "stream " << s << " size " << size;
      live[(uintptr_t)p] = {size, want};
    } else if (op < 64 && !live.empty()) { // used on another stream (never held)
      auto it = std::next(live.begin(), (long)rng.below(live.size()));
      ASSERT_EQ(expseg_record_stream(a, (void *)it->first, 4 + rng.below(3)), EXPSEG_OK);
    } else if (op < 92 && !live.empty()) {
      auto it = std::next(live.begin(), (long)rng.below(live.size()));
      const expseg_pool_id id = it->second.pool;
      if (draining.count(id) && blocks_of(id) == 1) {
        drains = id;
        drain_key = stat_of(a, pool_key(id));
        reserved_before = stat_of(a, "reserved_bytes.all.current");
      }
      ASSERT_EQ(expseg_free(a, (void *)it->first), EXPSEG_OK);
      live.erase(it);
      if (drains != 0) {
        draining.erase(drains);
        gone.insert(drains);
      }
    } else if (op < 96) {
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    } else if (!count.empty()) {
      ASSERT_EQ(expseg_pool_empty_cache(a, pick_pool()), EXPSEG_OK);
    }
    // ---- after every step ----
    if (drains != 0) {
      EXPECT_FALSE(has_stat(a, pool_key(drains))) << "pool " << drains << " should have drained";
      ASSERT_EQ(stat_of(a, "reserved_bytes.all.current"), reserved_before - drain_key)
          << "pool " << drains << " drained: reserved_bytes.all.current must drop by its "
          << drain_key << " bytes";
    }
    for (auto &kv : count) ASSERT_TRUE(has_stat(a, pool_key(kv.first))) << "live pool " << kv.first;
    for (auto id : draining) ASSERT_TRUE(has_stat(a, pool_key(id))) << "draining pool " << id;
    for (auto id : gone) ASSERT_FALSE(has_stat(a, pool_key(id))) << "given-back pool " << id;
    if (step % 10 == 0 || drains != 0) {
      const auto segs = walk_segments(a);
      int64_t pools_sum = 0;
      for (auto &kv : count) pools_sum += stat_of(a, pool_key(kv.first));
      for (auto id : draining) pools_sum += stat_of(a, pool_key(id));
      ASSERT_LE(pools_sum, stat_of(a, "reserved_bytes.all.current"));
      for (const WalkSeg &sg : segs)
        for (const expseg_walk_block &b : sg.blocks) {
          if (b.state != EXPSEG_BLOCK_ALLOCATED) continue;
          auto it = live.find(b.address);
          ASSERT_NE(it, live.end()) << "walk shows an allocated block the model does not hold";
          ASSERT_EQ(it->second.pool, sg.pool)
              << "a block of pool " << it->second.pool << " in a segment of pool " << sg.pool;
        }
      for (auto &kv : live) ASSERT_EQ(pool_of((void *)kv.first), kv.second.pool);
      ASSERT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
    }
  }
  while (!begun.empty()) {
    ASSERT_EQ(expseg_pool_end(a, begun.back().id), EXPSEG_OK);
    begun.pop_back();
  }
  for (auto &kv : live) ASSERT_EQ(expseg_free(a, (void *)kv.first), EXPSEG_OK);
  for (auto &kv : count)
    for (int i = 0; i < kv.second; i++) ASSERT_EQ(expseg_pool_release(a, kv.first), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
  if (faults) {
    EXPECT_GT(expseg_testing_faults_injected(a), 0u) << "no growth failed";
  }
  for (auto id : draining) EXPECT_FALSE(has_stat(a, pool_key(id)));
}

EXPSEG_ADV_POOLS_INSTANTIATE();

// every case above on the fault driver too (no rule set but in the random run's growth)
INSTANTIATE_TEST_SUITE_P(
    Faults, AdvPools,
    testing::Values(PoolsParam{"fault:fail=;host:capacity=256M", "expandable_segments:True"},
                    PoolsParam{"fault:fail=;host:capacity=256M", "expandable_segments:False"}),
    pools_param_name);
