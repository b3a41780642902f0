// SPDX-License-Identifier: Apache-2.0
// test_adv13_moves.cpp: moving idle chunks only near the bound of the peak (policy.h,
// _expseg_move_first), attacked from the public API on the sim and host drivers.
// - Busy: seeded programs on streams 0..4 with record_stream, frees of blocks other streams
//   still use and held streams (their work pending), near the bound and under a memory
//   fraction: no byte of a live or pending block is ever handed out again or unmapped
//   (pattern bytes on host, no overlap of live blocks), the checker passes after each step,
//   the books hold (all = small + large, created - released = reserved), nothing is left.
// - Fallback: the memory fraction set right at what is held, or a device that has nothing
//   left: a request that idle chunks can serve is served without the out-of-memory retry;
//   one that nothing can serve fails cleanly with a message and leaves the allocator usable.
// - Peak: after reset_peak_memory_stats a growth still weighs the most bytes allocated
//   before it (it creates within the bound rather than moving), in the general cache and in
//   a private pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "alloc_support.h"
#include "block_pattern.h"
#include "driver_param.h"
#include "expseg.h"
#include "expseg_testing.h"

namespace {

constexpr size_t KiB = 1024, MiB = KiB * 1024;
constexpr size_t kStride = 32 * KiB;

std::string err() { return expseg_last_error(); }

int64_t moved(const expseg_allocator *a) { return stat_of(a, "expseg.pages_moved"); }
int64_t held(const expseg_allocator *a) { return stat_of(a, "reserved_bytes.all.current"); }
int64_t retries(const expseg_allocator *a) { return stat_of(a, "num_alloc_retries"); }

// all = small + large for the byte statistics, reserved >= allocated, and the chunks created
// less those released are what is held.
void expect_books(const expseg_allocator *a, const std::string &where) {
  for (const char *k : {"allocated_bytes", "reserved_bytes", "active_bytes"}) {
    const std::string s = k;
    EXPECT_EQ(stat_of(a, s + ".all.current"),
              stat_of(a, s + ".small_pool.current") + stat_of(a, s + ".large_pool.current"))
        << where << ": " << s;
  }
  EXPECT_GE(held(a), stat_of(a, "allocated_bytes.all.current")) << where;
  EXPECT_EQ(stat_of(a, "expseg.created_bytes") - stat_of(a, "expseg.released_bytes"), held(a))
      << where;
  expect_consistent(a, where);
}

struct Blk {
  char *p;
  size_t size;
  uint64_t tag;
  expseg_stream stream;
  std::set<expseg_stream> used_by;  // streams recorded on it (record_stream)
};

// A freed block whose memory is still in use: `users` (held streams recorded on it) may
// still read it, so nothing may get it; or only its own stream is held (its work pending),
// so no other stream may get it.
struct Guard {
  Blk b;
  std::set<expseg_stream> users;
  bool owner_held;
};

bool overlaps(const char *p, size_t n, const char *q, size_t m) { return p < q + m && q < p + n; }

// ---- Busy ----

struct Busy : ::testing::TestWithParam<DriverParam> {};

TEST_P(Busy, NoBusyByteIsEverMovedOrHandedOut) {
  EXPSEG_SEEDED(seed, 1313);
  TestRng rng(seed);
  QuietLog quiet;
  const DriverParam prm = GetParam();
  const bool host = std::string(prm.driver).rfind("host", 0) == 0;
  const size_t cap = 384 * MiB;
  const std::string drv = std::string(prm.driver) + ":capacity=" + std::to_string(cap / MiB) + "M";
  AllocPtr ap = make_alloc(drv.c_str(), prm.config);
  expseg_allocator *a = ap.get();
  ASSERT_NE(a, nullptr);
  std::vector<Blk> live;
  std::vector<Guard> guards;
  std::vector<expseg_pool_id> pools;
  bool hold[5] = {false, false, false, false, false};
  uint64_t tag = 1;
  int served = 0, refused = 0;
  const int64_t moved0 = moved(a);
  const int ops = (int)test_ops(4000, 4000);

  auto check_guards = [&](const std::string &where) {
    for (const Guard &g : guards) {
      if (g.users.empty() || !host) continue;
      std::string why;
      ASSERT_TRUE(pattern_ok(g.b.p, g.b.size, g.b.tag, kStride, &why))
          << where << ": a freed block still used by a held stream, " << (void *)g.b.p << " of "
          << g.b.size << " bytes, changed: " << why;
    }
  };
  auto check_live = [&](const std::string &where) {
    if (!host) return;
    for (const Blk &b : live) {
      std::string why;
      ASSERT_TRUE(pattern_ok(b.p, b.size, b.tag, kStride, &why))
          << where << ": live block " << (void *)b.p << " of " << b.size << " bytes: " << why;
    }
  };
  auto alloc = [&](size_t size, expseg_stream s, expseg_pool_id pool, const std::string &where) {
    void *x = nullptr;
    const expseg_status st =
        pool ? expseg_malloc_pool(a, size, s, pool, &x) : expseg_malloc(a, size, s, &x);
    if (st == EXPSEG_ERR_OUT_OF_MEMORY) {
      EXPECT_FALSE(err().empty()) << where << ": an out-of-memory error without a message";
      refused++;
      return;
    }
    ASSERT_EQ(st, EXPSEG_OK) << where << ": " << size << ": " << err();
    char *c = (char *)x;
    for (const Blk &b : live)
      ASSERT_FALSE(overlaps(c, size, b.p, b.size))
          << where << ": " << (void *)c << " overlaps live block " << (void *)b.p;
    for (size_t i = 0; i < guards.size();) {
      const Guard &g = guards[i];
      if (overlaps(c, size, g.b.p, g.b.size)) {
        ASSERT_TRUE(g.users.empty()) << where << ": " << (void *)c << " on stream " << s
                                     << " is a freed block a held stream still uses";
        ASSERT_EQ(s, g.b.stream) << where << ": " << (void *)c << " on stream " << s
                                 << " is a block freed on busy stream " << g.b.stream;
        guards[i] = guards.back(); // its own stream reuses it: stream order
        guards.pop_back();
        continue;
      }
      i++;
    }
    live.push_back({c, size, tag++, s, {}});
    served++;
    if (host) pattern_put(c, size, live.back().tag, kStride);
  };
  auto free_at = [&](size_t k, const std::string &where) {
    Blk b = live[k];
    live[k] = live.back();
    live.pop_back();
    ASSERT_EQ(expseg_free(a, b.p), EXPSEG_OK) << where << ": " << err();
    Guard g{b, {}, hold[b.stream]};
    for (expseg_stream u : b.used_by)
      if (hold[u]) g.users.insert(u);
    if (!g.users.empty() || g.owner_held) guards.push_back(g);
  };
  auto set_hold = [&](expseg_stream s, bool h) {
    ASSERT_EQ(alloc_test_hold(a, s, h), EXPSEG_OK) << err();
    hold[s] = h;
    if (h) return;
    for (size_t i = 0; i < guards.size();) {
      Guard &g = guards[i];
      g.users.erase(s);
      if (g.b.stream == s) g.owner_held = false;
      if (g.users.empty() && !g.owner_held) {
        guards[i] = guards.back();
        guards.pop_back();
        continue;
      }
      i++;
    }
  };

  for (int op = 0; op < ops; op++) {
    const std::string where = "op " + std::to_string(op);
    const uint64_t r = rng.below(1000);
    const expseg_stream s = rng.below(5);
    if (r < 470 || live.empty()) {
      // mostly large blocks (expandable growths), some small
      const size_t size = rng.chance(0.3)   ? 1 + rng.below(MiB)
                          : rng.chance(0.5) ? (1 + rng.below(8)) * 2 * MiB - rng.below(2) * 4096
                                            : (4 + rng.below(36)) * MiB;
      const expseg_pool_id pool =
          !pools.empty() && rng.chance(0.15) ? pools[rng.below(pools.size())] : 0;
      alloc(size, s, pool, where);
    } else if (r < 900) {
      free_at(rng.below(live.size()), where);
    } else if (r < 940) {
      Blk &b = live[rng.below(live.size())];
      const expseg_stream u = 1 + rng.below(4);
      ASSERT_EQ(expseg_record_stream(a, b.p, u), EXPSEG_OK) << where << ": " << err();
      if (u != b.stream) b.used_by.insert(u);
    } else if (r < 970) {
      const expseg_stream u = 1 + rng.below(4);
      set_hold(u, !hold[u]);
    } else if (r < 978) {
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << where << ": " << err();
    } else if (r < 984) {
      expseg_reset_peak_stats(a);
    } else if (r < 992) {
      // a cap right at what is held (creating refused: idle chunks must serve), or none
      const double f = rng.chance(0.5) ? 1.0 : std::min(1.0, (double)held(a) / (double)cap);
      ASSERT_EQ(expseg_set_memory_fraction(a, f), EXPSEG_OK) << where << ": " << err();
    } else if (r < 996 && pools.size() < 3) {
      expseg_pool_id id = 0;
      ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << err();
      pools.push_back(id);
    } else if (!pools.empty()) {
      ASSERT_EQ(expseg_pool_empty_cache(a, pools[rng.below(pools.size())]), EXPSEG_OK) << err();
    }
    if (HasFatalFailure()) return;
    ASSERT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << err();
    check_guards(where);
    if (HasFatalFailure()) return;
    if (op % 100 == 0) {
      check_live(where);
      if (HasFatalFailure()) return;
      expect_books(a, where);
    }
  }
  check_live("the end");
  check_guards("the end");
  if (HasFatalFailure()) return;
  std::printf("%d served, %d refused, %lld pages moved\n", served, refused,
              (long long)(moved(a) - moved0));
  EXPECT_GT(served, ops / 4);
  EXPECT_GT(moved(a), moved0) << "the program never moved a chunk: it tests nothing";
  for (expseg_stream u = 1; u < 5; u++)
    if (hold[u]) set_hold(u, false);
  while (!live.empty()) free_at(live.size() - 1, "the end");
  if (HasFatalFailure()) return;
  for (expseg_pool_id id : pools) ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
  EXPECT_EQ(held(a), 0) << "everything freed and emptied";
  expect_books(a, "the end");
  expect_nothing_left(ap.release(), "the end");
}

INSTANTIATE_TEST_SUITE_P(
    Drivers, Busy,
    ::testing::Values(DriverParam{"host", "expandable_segments:True"},
                      DriverParam{"sim", "expandable_segments:True"},
                      DriverParam{"host", "expandable_segments:True,chunk_max_mb:4"},
                      DriverParam{"host", "expandable_segments:True,garbage_collection_threshold:0.6"},
                      DriverParam{"sim", "expandable_segments:True,page_size_mb:4"}));

// ---- Fallback ----

// The fraction set right at what is held (not a byte more), after a peak that puts the
// growth well within the bound: requests that 16 MiB idle holes can serve by moving are
// served, on other streams too, without the retry; changed again mid-program (none, then
// at held again) the same holds; a request larger than every idle byte fails cleanly with a
// message, and the allocator serves afterwards. Nothing is left at the end.
TEST(Fallback, AFractionRightAtHeldIsServedByIdleChunks) {
  QuietLog quiet;
  for (const char *driver : {"sim:capacity=4G", "host:capacity=1200M"}) {
    SCOPED_TRACE(driver);
    AllocPtr p = make_alloc(driver, "expandable_segments:True");
    expseg_allocator *a = p.get();
    ASSERT_NE(a, nullptr);
    size_t free_b = 0, total = 0;
    ASSERT_EQ(expseg_mem_get_info(a, &free_b, &total), EXPSEG_OK) << err();
    void *peak = nullptr;
    ASSERT_EQ(expseg_malloc(a, 1024 * MiB, 0, &peak), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_free(a, peak), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
    std::vector<void *> live = alloc_holes(a, 16, 16 * MiB);
    ASSERT_EQ(held(a), (int64_t)(512 * MiB));
    const int64_t retries0 = retries(a), moved0 = moved(a);
    std::vector<void *> got;
    for (int i = 0; i < 4; i++) {
      SCOPED_TRACE("request " + std::to_string(i));
      // at held exactly: the fraction changed between requests
      ASSERT_EQ(expseg_set_memory_fraction(a, (double)held(a) / (double)total), EXPSEG_OK)
          << err();
      const int64_t h0 = held(a);
      void *x = nullptr;
      ASSERT_EQ(expseg_malloc(a, 24 * MiB, (expseg_stream)i, &x), EXPSEG_OK) << err();
      got.push_back(x);
      EXPECT_EQ(retries(a), retries0) << "no out-of-memory retry";
      EXPECT_EQ(stat_of(a, "num_ooms"), 0);
      EXPECT_LE(held(a), h0) << "nothing created past the cap";
      if (i == 1) {  // no cap for a moment, then at held again
        ASSERT_EQ(expseg_set_memory_fraction(a, 1.0), EXPSEG_OK) << err();
      }
      expect_books(a, "request " + std::to_string(i));
    }
    EXPECT_GT(moved(a), moved0);
    // idle: 16 holes of 16 MiB less 4 x 24 MiB; 512 MiB cannot be served
    ASSERT_EQ(expseg_set_memory_fraction(a, (double)held(a) / (double)total), EXPSEG_OK) << err();
    void *big = nullptr;
    EXPECT_EQ(expseg_malloc(a, 512 * MiB, 0, &big), EXPSEG_ERR_OUT_OF_MEMORY);
    EXPECT_NE(err().find("fraction"), std::string::npos) << err();
    EXPECT_EQ(big, nullptr);
    expect_books(a, "after the refusal");
    void *y = nullptr;
    ASSERT_EQ(expseg_set_memory_fraction(a, 1.0), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_malloc(a, 40 * MiB, 2, &y), EXPSEG_OK) << "usable after: " << err();
    got.push_back(y);
    free_blocks(a, got);
    free_blocks(a, live);
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
    expect_books(a, "the end");
    expect_nothing_left(p.release(), "the end");
  }
}

// A device with nothing left (everything it has held by the allocator): a request that idle
// holes can serve is served without the retry; with the idle holes on a stream whose work is
// pending (held), they cannot move: the request fails cleanly (out of memory, a message) and,
// once the stream's work is done, is served.
TEST(Fallback, ADeviceWithNothingLeft) {
  QuietLog quiet;
  for (const char *driver : {"sim:capacity=512M", "host:capacity=512M"}) {
    SCOPED_TRACE(driver);
    AllocPtr p = make_alloc(driver, "expandable_segments:True");
    expseg_allocator *a = p.get();
    ASSERT_NE(a, nullptr);
    std::vector<void *> live = alloc_holes(a, 16, 16 * MiB);
    ASSERT_EQ(held(a), (int64_t)(512 * MiB));
    const int64_t retries0 = retries(a);
    void *x = nullptr;
    ASSERT_EQ(expseg_malloc(a, 24 * MiB, 1, &x), EXPSEG_OK) << err();
    EXPECT_EQ(retries(a), retries0) << "no out-of-memory retry";
    EXPECT_EQ(stat_of(a, "num_ooms"), 0);
    ASSERT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
    free_blocks(a, live);
    expect_books(a, "served");
    // the idle memory is stream 3's, its work pending
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
    ASSERT_EQ(held(a), 0);
    std::vector<void *> all(32, nullptr);
    for (void *&b : all) ASSERT_EQ(expseg_malloc(a, 16 * MiB, 3, &b), EXPSEG_OK) << err();
    ASSERT_EQ(alloc_test_hold(a, 3, true), EXPSEG_OK);
    for (size_t i = 0; i < all.size(); i += 2) ASSERT_EQ(expseg_free(a, all[i]), EXPSEG_OK);
    for (size_t i = 1; i < all.size(); i += 2) live.push_back(all[i]);
    EXPECT_EQ(expseg_malloc(a, 24 * MiB, 1, &x), EXPSEG_ERR_OUT_OF_MEMORY);
    EXPECT_FALSE(err().empty());
    expect_books(a, "refused");
    ASSERT_EQ(alloc_test_hold(a, 3, false), EXPSEG_OK);
    ASSERT_EQ(expseg_malloc(a, 24 * MiB, 1, &x), EXPSEG_OK) << "stream 3 done: " << err();
    ASSERT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
    free_blocks(a, live);
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
    expect_books(a, "the end");
    expect_nothing_left(p.release(), "the end");
  }
}

// Seeded: blocks of whole pages (chunks of one page) on streams 0..2 (none busy), allocated
// and freed at random;
// now and then the fraction is set right at what is held and a request of whole pages no
// larger than every free byte held is made: it must be served at once (idle chunks move in,
// no out-of-memory retry); one a page larger than that must fail cleanly, with a message, and
// the allocator goes on.
// Eight programs, seeds `seed` to `seed` + 7 (a failure names its own).
TEST(Fallback, RandomRequestsAtTheCapAreServedByWhatIsIdle) {
  EXPSEG_SEEDED(seed0, 1);
  QuietLog quiet;
  for (uint64_t seed = seed0; seed < seed0 + 8; seed++)
  for (const char *driver : {"sim:capacity=4G", "host:capacity=1G"}) {
    SCOPED_TRACE(std::string(driver) + ", program " + test_seed_note(seed));
    TestRng rng(seed * 2 + (driver[0] == 'h'));
    // chunks of one page: every free whole page can move (none pinned by a shared chunk)
    AllocPtr p = make_alloc(driver, "expandable_segments:True,chunk_max_mb:2");
    expseg_allocator *a = p.get();
    ASSERT_NE(a, nullptr);
    const size_t pg = alloc_test_page(a);
    ASSERT_EQ(pg, 2 * MiB);
    size_t free_b = 0, total = 0;
    ASSERT_EQ(expseg_mem_get_info(a, &free_b, &total), EXPSEG_OK) << err();
    std::vector<void *> live;
    int served = 0, refused = 0;
    for (int step = 0; step < 400; step++) {
      const std::string where = "step " + std::to_string(step);
      SCOPED_TRACE(where);
      if (live.empty() || rng.chance(0.55)) {
        void *x = nullptr;
        const size_t size = (1 + rng.below(20)) * pg;
        if (expseg_malloc(a, size, rng.below(3), &x) == EXPSEG_OK) live.push_back(x);
      } else {
        const size_t k = rng.below(live.size());
        ASSERT_EQ(expseg_free(a, live[k]), EXPSEG_OK) << err();
        live[k] = live.back();
        live.pop_back();
      }
      if (step % 10 != 9) continue;
      if (held(a) < 64 * (int64_t)MiB) continue;
      ASSERT_EQ(expseg_set_memory_fraction(a, (double)held(a) / (double)total), EXPSEG_OK) << err();
      const size_t idle = (size_t)(held(a) - stat_of(a, "allocated_bytes.all.current"));
      const int64_t retries0 = retries(a), h0 = held(a);
      void *x = nullptr;
      if (idle >= pg) {
        const size_t size = (1 + rng.below(idle / pg)) * pg;
        ASSERT_EQ(expseg_malloc(a, size, rng.below(3), &x), EXPSEG_OK)
            << size << " of " << idle << " idle bytes: " << err();
        EXPECT_EQ(retries(a), retries0) << "served by idle chunks without the retry";
        EXPECT_LE(held(a), h0);
        live.push_back(x);
        served++;
      }
      x = nullptr;
      // a page more than every free byte held: nothing can serve it under the cap
      const size_t more =
          (size_t)(held(a) - stat_of(a, "allocated_bytes.all.current")) + pg;
      EXPECT_EQ(expseg_malloc(a, more, rng.below(3), &x), EXPSEG_ERR_OUT_OF_MEMORY) << more;
      EXPECT_FALSE(err().empty());
      if (x != nullptr) live.push_back(x);
      refused++;
      expect_books(a, where);
      ASSERT_EQ(expseg_set_memory_fraction(a, 1.0), EXPSEG_OK) << err();
      if (HasFatalFailure()) return;
    }
    std::printf("program %llu, %s: %d served at the cap, %d refused\n", (unsigned long long)seed,
                driver, served, refused);
    EXPECT_GT(served, 10);
    free_blocks(a, live);
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
    expect_books(a, "the end");
    expect_nothing_left(p.release(), "the end");
  }
}

// ---- Peak ----

// A 1 GiB peak, freed and given back, then reset_peak_memory_stats: 512 MiB held in 16 MiB
// blocks, every other one freed. A 24 MiB growth is within 1.012 x the high water (1 GiB)
// + 8 MiB: its pages are created, no chunk moves, though the peak statistic now says 512
// MiB (against which it would be near the bound). The same in a private pool.
TEST(Peak, AfterAResetGrowthStillWeighsTheHighWater) {
  QuietLog quiet;
  for (const bool private_pool : {false, true}) {
    SCOPED_TRACE(private_pool ? "private pool" : "general cache");
    AllocPtr p = make_alloc("sim:capacity=4G", "expandable_segments:True");
    expseg_allocator *a = p.get();
    ASSERT_NE(a, nullptr);
    void *peak = nullptr;
    ASSERT_EQ(expseg_malloc(a, 1024 * MiB, 0, &peak), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_free(a, peak), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
    expseg_reset_peak_stats(a);
    expseg_pool_id id = 0;
    if (private_pool) {
      ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << err();
      ASSERT_EQ(expseg_pool_begin(a, id, nullptr, nullptr), EXPSEG_OK) << err();
    }
    std::vector<void *> live = alloc_holes(a, 16, 16 * MiB);
    ASSERT_EQ(held(a), (int64_t)(512 * MiB));
    EXPECT_EQ(stat_of(a, "allocated_bytes.all.peak"), (int64_t)(512 * MiB));
    const int64_t moved0 = moved(a);
    void *x = nullptr;
    ASSERT_EQ(expseg_malloc(a, 24 * MiB, 0, &x), EXPSEG_OK) << err();
    EXPECT_EQ(moved(a), moved0) << "no chunk moved: the high water is 1 GiB";
    EXPECT_EQ(held(a), (int64_t)(536 * MiB)) << "the 24 MiB it lacked, created";
    if (private_pool) {
      expseg_pool_id of = 0;
      ASSERT_EQ(expseg_pool_of(a, x, &of), EXPSEG_OK) << err();
      EXPECT_EQ(of, id);
      ASSERT_EQ(expseg_pool_end(a, id), EXPSEG_OK) << err();
    }
    expect_books(a, "grown");
    ASSERT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
    free_blocks(a, live);
    if (private_pool) {
      ASSERT_EQ(expseg_pool_empty_cache(a, id), EXPSEG_OK) << err();
      ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_OK) << err();
    }
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
    expect_books(a, "the end");
    expect_nothing_left(p.release(), "the end");
  }
}

}  // namespace
