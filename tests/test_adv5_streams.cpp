// SPDX-License-Identifier: Apache-2.0
// test_adv5_streams.cpp: adversarial tests of the free index's count of the streams that
// own free blocks per pool (pools/fidx.c: the home stream counted beside the pool, the
// others in an open-addressing table with backward-shift deletion), driven only through
// the public API: hundreds of stream values (0, values a power of two apart that crowd the
// table's probe runs, values just under 2^48), streams used again after their blocks are
// gone, record_stream, held streams, empty_cache, private pools and their release, regions
// put to sleep and woken, and thousands of free blocks (the table grown). expseg_check
// recounts the table after every step; the count of streams per pool is also recomputed
// from expseg_walk's free blocks and compared.
#include "alloc_support.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;

// The (private pool, stream) pairs that own an inactive block, per
// pool kind, recounted from expseg_walk (a sleeping region's free pieces stay indexed).
struct FreeOwners {
  std::set<std::pair<uint64_t, expseg_stream>> small, large;
};
void owners_put(void *ctx, const expseg_walk_segment *s) {
  auto *o = static_cast<FreeOwners *>(ctx);
  for (size_t i = 0; i < s->n_blocks; i++)
    if (s->blocks[i].state == EXPSEG_BLOCK_INACTIVE)
      (s->is_large ? o->large : o->small).insert({s->pool, s->stream});
}

// The stream values the tests use: 0, a run a power of two apart, hundreds of odd values,
// and a few just under 2^48.
std::vector<expseg_stream> stream_values(size_t n) {
  std::vector<expseg_stream> v{0};
  for (size_t i = 1; v.size() < n / 3; i++) v.push_back((expseg_stream)i << 12);
  for (size_t i = 0; v.size() < 2 * n / 3; i++) v.push_back(0x7f0000001001ull + 2 * i);
  for (size_t i = 1; v.size() < n; i++) v.push_back((UINT64_C(1) << 48) - i);
  return v;
}

void check(expseg_allocator *a, const std::string &where) {
  ASSERT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << expseg_last_error();
  FreeOwners o;
  ASSERT_EQ(expseg_walk(a, owners_put, nullptr, &o), EXPSEG_OK) << where;
  ASSERT_EQ(alloc_test_free_streams(a, true), o.small.size()) << where << ": small pool";
  ASSERT_EQ(alloc_test_free_streams(a, false), o.large.size()) << where << ": large pool";
}

// Randomized: malloc, free, record_stream, hold and release of streams, empty_cache,
// private pools (create, allocate, release), a region slept and woken, on ~300 stream
// values; expseg_check after every step.
void random_streams(const char *config, uint64_t dflt_seed, bool lends) {
  EXPSEG_SEEDED(seed, dflt_seed);
  TestRng rng(seed);
  AllocPtr ap = make_alloc("sim", config);
  expseg_allocator *a = ap.get();
  ASSERT_NE(a, nullptr);
  const std::vector<expseg_stream> streams = stream_values(300);
  std::map<void *, expseg_stream> live;
  std::vector<expseg_pool_id> pools;
  std::set<expseg_stream> held;
  bool region_open = false, asleep = false;
  int sleeps = 0;
  const int ops = test_ops(4000);
  for (int step = 0; step < ops; step++) {
    const std::string where = "step " + std::to_string(step);
    const uint64_t r = rng.below(100);
    const expseg_stream s = streams[rng.below(streams.size())];
    if (r < 45 || live.empty()) {
      size_t size = rng.below(4) ? 1 + rng.below(MiB) : MiB + rng.below(24 * MiB);
      void *p = nullptr;
      expseg_status st;
      if (!pools.empty() && rng.below(4) == 0)
        st = expseg_malloc_pool(a, size, s, pools[rng.below(pools.size())], &p);
      else
        st = expseg_malloc(a, size, s, &p);
      if (st == EXPSEG_OK) {
        live[p] = s;
      } else if (!asleep || !region_open) {
        ASSERT_EQ(st, EXPSEG_ERR_OUT_OF_MEMORY) << where << ": " << expseg_last_error();
      }
    } else if (r < 80) {
      auto it = live.begin();
      std::advance(it, rng.below(live.size()));
      ASSERT_EQ(expseg_free(a, it->first), EXPSEG_OK) << where << ": " << expseg_last_error();
      live.erase(it);
    } else if (r < 87) {
      auto it = live.begin();
      std::advance(it, rng.below(live.size()));
      ASSERT_EQ(expseg_record_stream(a, it->first, s), EXPSEG_OK)
          << where << ": " << expseg_last_error();
    } else if (r < 90) {
      bool h = !held.count(s);
      ASSERT_EQ(expseg_testing_hold_stream(a, s, h), EXPSEG_OK) << where;
      if (h) held.insert(s);
      else held.erase(s);
    } else if (r < 92) {
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << where << ": " << expseg_last_error();
    } else if (r < 94) {
      if (pools.size() < 4 || rng.below(2)) {
        expseg_pool_id id;
        ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << where;
        pools.push_back(id);
      } else {
        size_t k = rng.below(pools.size());
        ASSERT_EQ(expseg_pool_release(a, pools[k]), EXPSEG_OK) << where;
        pools.erase(pools.begin() + (long)k);
      }
    } else if (r < 96 && !pools.empty()) {
      ASSERT_EQ(expseg_pool_empty_cache(a, pools[rng.below(pools.size())]), EXPSEG_OK) << where;
    } else if (r < 98) {
      if (!region_open && !asleep) {
        ASSERT_EQ(expseg_region_begin(a, "adv5"), EXPSEG_OK) << where << ": " << expseg_last_error();
        region_open = true;
      } else if (region_open) {
        ASSERT_EQ(expseg_region_end(a, "adv5"), EXPSEG_OK) << where;
        region_open = false;
      }
    } else {
      for (expseg_stream h : held) ASSERT_EQ(expseg_testing_hold_stream(a, h, false), EXPSEG_OK);
      held.clear();
      if (!asleep && !region_open) {
        expseg_status st = expseg_sleep(a, "adv5", rng.below(2) ? EXPSEG_SLEEP_OFFLOAD
                                                                : EXPSEG_SLEEP_DISCARD);
        if (st == EXPSEG_OK) {
          asleep = true;
          sleeps++;
        }
        else ASSERT_EQ(st, EXPSEG_ERR_INVALID_ARGUMENT) << where << ": " << expseg_last_error();
      } else if (asleep) {
        ASSERT_EQ(expseg_wake(a, "adv5"), EXPSEG_OK) << where << ": " << expseg_last_error();
        asleep = false;
      }
    }
    check(a, where);
    if (::testing::Test::HasFatalFailure()) return;
  }
  const int64_t lent = stat_of(a, "expseg.num_lent");
  std::printf("lent %lld, sleeps %d\n", (long long)lent, sleeps);
  if (ops >= 4000) { // the default run covers lending between streams and sleep/wake
    EXPECT_GT(sleeps, 0);
    if (lends) {
      EXPECT_GT(lent, 0);
    }
  }
  for (expseg_stream h : held) ASSERT_EQ(expseg_testing_hold_stream(a, h, false), EXPSEG_OK);
  if (asleep) {
    ASSERT_EQ(expseg_wake(a, "adv5"), EXPSEG_OK) << expseg_last_error();
  }
  for (auto &kv : live) ASSERT_EQ(expseg_free(a, kv.first), EXPSEG_OK);
  check(a, "all freed");
  for (expseg_pool_id id : pools) ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  check(a, "emptied");
}

TEST(Adv5Streams, RandomManyStreamsExpandable) {
  random_streams("expandable_segments:True", 501, true);
}
TEST(Adv5Streams, RandomManyStreamsFixedSegments) {
  random_streams("expandable_segments:False", 502, false);
}

// Thousands of free blocks on hundreds of streams: the index (and the owners' table with
// it) grows while entries are in it; every stream's free blocks then go one by one (the
// deletions shift runs back) and the count follows down to 0.
TEST(Adv5Streams, GrowthAndDrainOfHundredsOfStreams) {
  AllocPtr ap = make_alloc("sim", "expandable_segments:True");
  expseg_allocator *a = ap.get();
  const std::vector<expseg_stream> streams = stream_values(400);
  std::vector<std::pair<void *, expseg_stream>> blocks;
  for (int round = 0; round < 8; round++)
    for (expseg_stream s : streams) {
      void *p = nullptr;
      ASSERT_EQ(expseg_malloc(a, 512 * (1 + (size_t)round), s, &p), EXPSEG_OK);
      blocks.push_back({p, s});
    }
  check(a, "all allocated");
  // every other block freed: no merges, so each stream owns 4 free blocks
  for (size_t i = 0; i < blocks.size(); i += 2) ASSERT_EQ(expseg_free(a, blocks[i].first), EXPSEG_OK);
  check(a, "half freed");
  // the rest, stream by stream in reverse order of first use
  for (size_t k = streams.size(); k-- > 0;) {
    for (size_t i = 1; i < blocks.size(); i += 2)
      if (blocks[i].second == streams[k]) {
        ASSERT_EQ(expseg_free(a, blocks[i].first), EXPSEG_OK);
      }
    check(a, "stream " + std::to_string(k) + " freed");
  }
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  check(a, "emptied");
  EXPECT_EQ(alloc_test_free_streams(a, true), 0u);
  // the same stream values again after their blocks are gone
  for (expseg_stream s : streams) {
    void *p = nullptr;
    ASSERT_EQ(expseg_malloc(a, 4 * KiB, s, &p), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  }
  check(a, "reused");
}

// (pool, stream) keys that hash to the owners' table's last, second-to-last, first and
// second entries at every table size up to 2^20 (found with a copy of fidx_slot's mix, pools/fidx.h, and of the private
// pools' stream key, the pool's slot from bit 48 up, pools/internal.h: if either changes
// this test only loses its edge): one private pool per key, so that emptying a pool's
// cache removes that key's entry alone; the entries' run wraps from the table's end to its
// start, and removing them in several orders exercises the backward shift across the wrap.
uint64_t owner_mix(int pool, uint64_t key) {
  uint64_t h = (((uint64_t)pool + 1) ^ (key * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull;
  return h >> 32 ^ h;
}

TEST(Adv5Streams, OwnersRunWrappingTheTableEnd) {
  const uint64_t mask = (1u << 20) - 1;
  const int n = 6;
  // homes: two at the table's second-to-last entry (the second spills into the last),
  // one at the first (it must stay there when the first is removed and the second shifts
  // back), two at the last (their run wraps), one at the second
  const uint64_t homes[n] = {mask - 1, mask - 1, 0, mask, mask, 1};
  std::vector<expseg_stream> wrap; // wrap[k]: the stream of pool slot k + 1
  for (int k = 1; k <= n; k++)
    for (expseg_stream s = 1;; s++)
      if ((owner_mix(0, s | (uint64_t)k << 48) & mask) == homes[k - 1]) {
        wrap.push_back(s);
        break;
      }
  for (int order = 0; order < n; order++) {
    AllocPtr ap = make_alloc("sim", "expandable_segments:False");
    expseg_allocator *a = ap.get();
    void *home = nullptr; // stream 0 in the general cache: the home stream, no entry
    ASSERT_EQ(expseg_malloc(a, 512, 0, &home), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, home), EXPSEG_OK);
    std::vector<expseg_pool_id> ids(n);
    for (int k = 0; k < n; k++) {
      ASSERT_EQ(expseg_pool_create(a, &ids[k]), EXPSEG_OK);
      void *p = nullptr;
      ASSERT_EQ(expseg_malloc_pool(a, 512, wrap[k], ids[k], &p), EXPSEG_OK);
      ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
      check(a, "order " + std::to_string(order) + ", pool " + std::to_string(k));
    }
    EXPECT_EQ(alloc_test_free_streams(a, true), (size_t)n + 1);
    for (int i = 0; i < n; i++) {
      ASSERT_EQ(expseg_pool_empty_cache(a, ids[(i * 5 + order) % n]), EXPSEG_OK);
      check(a, "order " + std::to_string(order) + ", emptied " + std::to_string(i));
    }
    EXPECT_EQ(alloc_test_free_streams(a, true), 1u);
  }
}

} // namespace
