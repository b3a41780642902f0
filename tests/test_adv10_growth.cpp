// SPDX-License-Identifier: Apache-2.0
// test_adv10_growth.cpp: the large pool's minimum growth (16 MiB while the memory held after
// it stays within 1.005 x allocated + 8 MiB; a growth of at most 16 MiB is one chunk, a
// request of 8 MiB or more keeping a chunk of its own), seen from the public API.
// - Random: seeded mixes of requests clustered around 1, 2, 7.99/8/8.01 and 15.99/16/16.01
//   MiB and page multiples, on several streams and private pools, with frees (some after
//   record_stream), empty_cache, pool_empty_cache and memory-fraction changes: after every
//   step expseg_check passes, allocated <= reserved, every `all` row is small + large,
//   reserved is what expseg_walk sees mapped plus the page cache, created - released bytes
//   is reserved, no two live blocks overlap and (host) every live block keeps its pattern.
// - Movable: a device filled with blocks of 8 MiB or more, every other one freed, serves a
//   request of half the free memory (the requests' own chunks move); with blocks below
//   8 MiB the 16 MiB chunks pair them, and what the policy implies is checked instead.
// - Faults: create, map and set_access failing at each position of a growth that takes the
//   minimum (16 MiB: an 8 MiB chunk of the request's own and an 8 MiB surplus chunk).
// - Capacity: on devices whose capacity is not a multiple of 16 MiB, requests that fit
//   are all served, to the last page.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "alloc_support.h"
#include "block_pattern.h"
#include "expseg.h"
#include "expseg_testing.h"
#include "policy.h"  // EXPSEG_LARGE_GROW_MIN, EXPSEG_CHUNK_MAX

namespace {

constexpr size_t KiB = 1024, MiB = KiB * 1024;

std::string err() { return expseg_last_error(); }

struct Blk {
  char *p;
  size_t size;
  uint64_t tag;
};

// One word per OS page and the last word of each block (block_pattern.h).
void put(const Blk &b) { pattern_put(b.p, b.size, b.tag, 4 * KiB); }

bool verify(const Blk &b, std::string *why) { return pattern_ok(b.p, b.size, b.tag, 4 * KiB, why); }

int64_t walk_mapped(expseg_allocator *a) {
  int64_t sum = 0;
  EXPECT_EQ(expseg_walk(
                a,
                [](void *ctx, const expseg_walk_segment *s) {
                  if (!s->asleep) *static_cast<int64_t *>(ctx) += (int64_t)s->total_size;
                },
                nullptr, &sum),
            EXPSEG_OK)
      << err();
  return sum;
}

// The books of an expandable-only allocator, and (bytes) every live block's pattern.
void books(expseg_allocator *a, const std::vector<Blk> &live, bool bytes,
           const std::string &where) {
  ASSERT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << err();
  StatMap m = stat_map(a);
  for (const char *base : {"allocated_bytes", "reserved_bytes", "active_bytes", "segment",
                           "allocation"})
    for (const char *metric : {"current", "allocated", "freed"}) {
      const std::string b = base;
      EXPECT_EQ(m[b + ".all." + metric],
                m[b + ".small_pool." + metric] + m[b + ".large_pool." + metric])
          << where << ": " << b << ".*." << metric;
    }
  for (const char *pool : {"all", "small_pool", "large_pool"}) {
    const std::string p = std::string(".") + pool + ".current";
    EXPECT_LE(m["allocated_bytes" + p], m["reserved_bytes" + p]) << where << p;
  }
  const int64_t reserved = m["reserved_bytes.all.current"];
  EXPECT_EQ(reserved, m["expseg.mapped_bytes.current"] + m["expseg.cached_physical_bytes.current"])
      << where;
  EXPECT_EQ(walk_mapped(a), m["expseg.mapped_bytes.current"])
      << where << ": expseg_walk sees what is mapped";
  EXPECT_EQ(m["expseg.created_bytes"] - m["expseg.released_bytes"], reserved) << where;
  expseg_testing_driver_counts d{};
  ASSERT_EQ(expseg_testing_driver_counts_get(a, &d), EXPSEG_OK) << err();
  EXPECT_EQ(reserved, (int64_t)d.live_chunk_bytes) << where << ": the driver holds reserved";
  std::vector<std::pair<uintptr_t, size_t>> r;
  for (const Blk &b : live) r.push_back({(uintptr_t)b.p, b.size});
  std::sort(r.begin(), r.end());
  for (size_t i = 1; i < r.size(); i++)
    ASSERT_LE(r[i - 1].first + r[i - 1].second, r[i].first) << where << ": live blocks overlap";
  if (bytes)
    for (const Blk &b : live) {
      std::string why;
      ASSERT_TRUE(verify(b, &why)) << where << ": block " << (void *)b.p << " of " << b.size
                                   << " bytes: " << why;
    }
}

// Sizes around the minimum growth and the chunk: 1 and 2 MiB, 7.99/8/8.01 MiB,
// 15.99/16/16.01 MiB (give or take a byte or a few KiB), page multiples, small ones.
size_t clustered(TestRng &rng) {
  static const size_t centers[] = {MiB, 2 * MiB, 8 * MiB - 10 * KiB, 8 * MiB, 8 * MiB + 10 * KiB,
                                   16 * MiB - 10 * KiB, 16 * MiB, 16 * MiB + 10 * KiB};
  switch (rng.below(5)) {
    case 0: return (1 + rng.below(12)) * 2 * MiB;
    case 1: return 1 + rng.below(MiB);
    default: {
      const size_t c = centers[rng.below(sizeof centers / sizeof *centers)];
      const unsigned j = (unsigned)rng.below(3);
      return j == 0 ? c : j == 1 ? c + 1 : c - 1 - rng.below(4 * KiB);
    }
  }
}

struct Random : ::testing::TestWithParam<const char *> {};

TEST_P(Random, BusyMemoryIsNeverHandedOutAndTheBooksHold) {
  EXPSEG_SEEDED(seed, 10010);
  TestRng rng(seed);
  QuietLog quiet;
  const bool bytes = std::strncmp(GetParam(), "host", 4) == 0;
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create(GetParam(), 0, "expandable_segments:True", &a), EXPSEG_OK) << err();
  std::vector<Blk> live;
  std::vector<expseg_pool_id> pools;
  std::vector<expseg_pool_id> of;  // the pool of live[k]
  uint64_t tags = seed << 20;
  const long ops = (long)test_ops(bytes ? 600 : 3000);
  for (long i = 0; i < ops; i++) {
    const unsigned op = (unsigned)rng.below(100);
    const std::string where = "op " + std::to_string(i) + " (" + std::to_string(op) + ")";
    if (op < 50) {
      const size_t size = clustered(rng);
      const expseg_stream s = rng.below(3);
      expseg_pool_id pool = 0;
      if (!pools.empty() && rng.below(4) == 0) pool = pools[rng.below(pools.size())];
      void *x = nullptr;
      const expseg_status st = expseg_malloc_pool(a, size, s, pool, &x);
      if (st == EXPSEG_OK) {
        live.push_back({(char *)x, size, ++tags});
        of.push_back(pool);
        if (bytes) put(live.back());
      } else {
        ASSERT_EQ(st, EXPSEG_ERR_OUT_OF_MEMORY) << where << ": " << err();
      }
    } else if (op < 82) {
      if (live.empty()) continue;
      const size_t k = rng.below(live.size());
      if (rng.below(4) == 0) {
        EXPECT_EQ(expseg_record_stream(a, live[k].p, 1 + rng.below(4)), EXPSEG_OK) << err();
      }
      ASSERT_EQ(expseg_free(a, live[k].p), EXPSEG_OK) << where << ": " << err();
      live[k] = live.back();
      live.pop_back();
      of[k] = of.back();
      of.pop_back();
    } else if (op < 87) {
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << where << ": " << err();
    } else if (op < 90) {
      if (pools.size() < 2) {
        expseg_pool_id id = 0;
        ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << err();
        pools.push_back(id);
      } else {
        ASSERT_EQ(expseg_pool_empty_cache(a, pools[rng.below(pools.size())]), EXPSEG_OK)
            << where << ": " << err();
      }
    } else {
      const double f = rng.below(3) == 0 ? 1.0 : 0.1 + 0.9 * rng.unit();
      ASSERT_EQ(expseg_set_memory_fraction(a, f), EXPSEG_OK) << err();
    }
    books(a, live, bytes, where);
    if (HasFatalFailure() || HasFailure()) break;
  }
  for (const Blk &b : live) ASSERT_EQ(expseg_free(a, b.p), EXPSEG_OK) << err();
  for (expseg_pool_id id : pools) ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
  books(a, {}, bytes, "all freed");
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
  expect_nothing_left(a, "end");
}

INSTANTIATE_TEST_SUITE_P(Drivers, Random,
                         ::testing::Values("host:capacity=512M", "sim:capacity=1G",
                                           "sim:capacity=600M,granularity=64K"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                           std::string n = i.param[0] == 'h' ? "host" : "sim";
                           if (std::strstr(i.param, "granularity")) n += "_gran64K";
                           return n;
                         });

}  // namespace

namespace {

// Allocates blocks of the sizes in turn (one stream) until the device is full; returns them.
std::vector<Blk> fill(expseg_allocator *a, const std::vector<size_t> &sizes) {
  std::vector<Blk> out;
  for (size_t i = 0;; i++) {
    void *x = nullptr;
    const size_t size = sizes[i % sizes.size()];
    const expseg_status st = expseg_malloc(a, size, 0, &x);
    if (st != EXPSEG_OK) {
      EXPECT_EQ(st, EXPSEG_ERR_OUT_OF_MEMORY) << err();
      break;
    }
    out.push_back({(char *)x, size, i});
  }
  return out;
}

// Frees every other block and returns the bytes the device then has free: its capacity
// less what blocks still in use hold (their sizes rounded up to the 512-byte unit).
int64_t free_every_other(expseg_allocator *a, std::vector<Blk> &blocks, int64_t capacity) {
  std::vector<Blk> kept;
  for (size_t i = 0; i < blocks.size(); i++)
    if (i % 2 == 1) {
      EXPECT_EQ(expseg_free(a, blocks[i].p), EXPSEG_OK) << err();
    } else {
      kept.push_back(blocks[i]);
    }
  blocks = kept;
  int64_t used = 0;
  for (const Blk &b : blocks) used += (int64_t)((b.size + 511) / 512 * 512);
  return capacity - used;
}

struct Movable : ::testing::TestWithParam<std::vector<size_t>> {};

// Blocks of 8 MiB or more each get chunks of their own (the growth's minimum never pairs
// them with the next block): freed, every other one gives its whole pages back, so a
// request of half the free memory is served by moving them.
TEST_P(Movable, FreedRequestsOfAChunkOrMoreServeALargerOne) {
  QuietLog quiet;
  for (const char *driver : {"sim:capacity=1G", "sim:capacity=1000M", "host:capacity=300M"}) {
    SCOPED_TRACE(driver);
    AllocPtr p = make_alloc(driver, "expandable_segments:True");
    expseg_allocator *a = p.get();
    ASSERT_NE(a, nullptr);
    const int64_t capacity = std::strstr(driver, "1G")     ? 1024 * (int64_t)MiB
                             : std::strstr(driver, "1000") ? 1000 * (int64_t)MiB
                                                           : 300 * (int64_t)MiB;
    std::vector<Blk> blocks = fill(a, GetParam());
    ASSERT_GT(blocks.size(), 6u);
    const int64_t free_bytes = free_every_other(a, blocks, capacity);
    const size_t want = (size_t)free_bytes / 2;
    void *x = nullptr;
    ASSERT_EQ(expseg_malloc(a, want, 0, &x), EXPSEG_OK)
        << "a request of " << want << " bytes, half of the " << free_bytes
        << " free, with " << blocks.size() << " blocks in use: " << err();
    std::vector<Blk> live = blocks;
    live.push_back({(char *)x, want, 999});
    books(a, live, false, "served");
    ASSERT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
    for (const Blk &b : blocks) ASSERT_EQ(expseg_free(a, b.p), EXPSEG_OK) << err();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, Movable,
    ::testing::Values(std::vector<size_t>{8 * MiB}, std::vector<size_t>{12 * MiB},
                      std::vector<size_t>{20 * MiB},
                      std::vector<size_t>{8 * MiB + 1, 12 * MiB, 20 * MiB},
                      std::vector<size_t>{12 * MiB - 1, 8 * MiB + 1, 20 * MiB},
                      std::vector<size_t>{20 * MiB, 8 * MiB, 12 * MiB - 1, 16 * MiB + 1}),
    [](const ::testing::TestParamInfo<std::vector<size_t>> &i) {
      std::string n;
      for (size_t s : i.param)
        n += (n.empty() ? "" : "_") + std::to_string(s / MiB) + (s % MiB ? "p" : "") + "M";
      return n;
    });

// The minimum only within its bound: a request on a stream of its own, beside a block of
// `base` bytes, grows by 16 MiB when the memory held after it stays within
// 1.02 x allocated + 8 MiB, else by what it lacks (the segment is new: no floor): both
// happen. (Allocated only grows here: the peak is the bytes allocated now.)
TEST(Bound, TheMinimumOnlyWithinTheBound) {
  QuietLog quiet;
  int taken = 0, refused = 0;
  for (const size_t base_mib : {32, 64, 128, 256, 512, 1024})
    for (const size_t small : {2 * MiB, 4 * MiB - 512, 6 * MiB}) {
      AllocPtr p = make_alloc("sim:capacity=8G", "expandable_segments:True");
      expseg_allocator *a = p.get();
      ASSERT_NE(a, nullptr);
      void *big = nullptr, *x = nullptr;
      ASSERT_EQ(expseg_malloc(a, base_mib * MiB, 0, &big), EXPSEG_OK) << err();
      const int64_t held = stat_of(a, "reserved_bytes.all.current");
      ASSERT_EQ(held, (int64_t)(base_mib * MiB));
      ASSERT_EQ(expseg_malloc(a, small, 1, &x), EXPSEG_OK) << err();
      const double allocated = (double)(base_mib * MiB + small);
      const bool within =
          (double)held + (double)EXPSEG_LARGE_GROW_MIN <= 1.02 * allocated + 8.0 * MiB;
      const int64_t grew = stat_of(a, "reserved_bytes.all.current") - held;
      EXPECT_EQ(grew, within ? (int64_t)EXPSEG_LARGE_GROW_MIN
                             : (int64_t)((small + 2 * MiB - 1) / (2 * MiB) * (2 * MiB)))
          << base_mib << " MiB beside, a request of " << small;
      (within ? taken : refused)++;
      ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
      ASSERT_EQ(expseg_free(a, big), EXPSEG_OK);
    }
  EXPECT_GT(taken, 0);
  EXPECT_GT(refused, 0);
}

// The minimum's bound is of the peak, for the allocator's life: after a 1 GiB peak is
// freed and given back, a 2 MiB request grows by the minimum (nothing held + 16 MiB is
// within 1.02 x 1 GiB + 8 MiB; against the 2 MiB allocated now it would pass
// 1.02 x 10 + 8 MiB), and still so after reset_peak_memory_stats. A request of a chunk,
// before it, gets no minimum.
TEST(Bound, TheMinimumIsWeighedAgainstThePeak) {
  QuietLog quiet;
  for (const char *driver : {"sim:capacity=8G", "host:capacity=1200M"}) {
    SCOPED_TRACE(driver);
    AllocPtr p = make_alloc(driver, "expandable_segments:True");
    expseg_allocator *a = p.get();
    ASSERT_NE(a, nullptr);
    void *big = nullptr;
    ASSERT_EQ(expseg_malloc(a, 1024 * MiB, 1, &big), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_free(a, big), EXPSEG_OK) << err();
    for (int round = 0; round < 3; round++) {
      SCOPED_TRACE(round);
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
      ASSERT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
      void *x = nullptr, *y = nullptr;
      ASSERT_EQ(expseg_malloc(a, EXPSEG_CHUNK_MAX, 0, &y), EXPSEG_OK) << err();
      EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), (int64_t)EXPSEG_CHUNK_MAX)
          << "a request of a chunk: its own bytes";
      ASSERT_EQ(expseg_malloc(a, 2 * MiB, 0, &x), EXPSEG_OK) << err();
      EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"),
                (int64_t)(EXPSEG_CHUNK_MAX + EXPSEG_LARGE_GROW_MIN))
          << "a 2 MiB request after a 1 GiB peak: the minimum";
      ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
      ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
      if (round == 0) expseg_reset_peak_stats(a);
      if (round == 1) {
        expseg_reset_peak_stats(a);
        expseg_reset_peak_stats(a);
      }
      EXPECT_LE(stat_of(a, "allocated_bytes.all.peak"), (int64_t)(1024 * MiB));
    }
    EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0);
  }
}

// Blocks of 8 MiB + 1 byte laid end to end: each shares a page with each neighbour, but
// its growth (16 MiB: a chunk of its own for its whole pages, and a surplus chunk holding
// its last bytes and the next block's first) maps its own chunk under it, so a freed
// block's whole pages go back and half the free memory is served. (It was out of memory
// while a growth placed again after creating its chunks counted them as memory held, took
// less than it had created, and mapped the surplus chunk under the request instead.)
TEST(Pinned, BlocksOfAChunkAndAByteEndToEndGiveTheirWholePagesBack) {
  QuietLog quiet;
  AllocPtr p = make_alloc("sim:capacity=1G", "expandable_segments:True");
  expseg_allocator *a = p.get();
  ASSERT_NE(a, nullptr);
  std::vector<Blk> blocks = fill(a, {8 * MiB + 1});
  ASSERT_GT(blocks.size(), 100u);
  const int64_t free_bytes = free_every_other(a, blocks, 1024 * (int64_t)MiB);
  const int64_t released0 = stat_of(a, "expseg.released_bytes");
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
  EXPECT_GE(stat_of(a, "expseg.released_bytes") - released0, free_bytes / 2)
      << "the freed blocks' whole pages go back";
  void *x = nullptr;
  EXPECT_EQ(expseg_malloc(a, (size_t)free_bytes / 2, 0, &x), EXPSEG_OK) << err();
  if (x != nullptr) {
    ASSERT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
  }
  books(a, blocks, false, "end to end");
  for (const Blk &b : blocks) ASSERT_EQ(expseg_free(a, b.p), EXPSEG_OK) << err();
}

// Blocks below a chunk (8 MiB): a 16 MiB growth is one chunk holding two or more of them,
// so with every other one freed each chunk still holds a live block: nothing can move, and
// a request larger than the largest free run is out of memory (the policy trades this for
// one handle per growth). What still moves is only a chunk no live block touches.
TEST(Pinned, FreedRequestsBelowAChunkPinEachOtherInTheirGrowth) {
  QuietLog quiet;
  AllocPtr p = make_alloc("sim:capacity=4G", "expandable_segments:True");
  expseg_allocator *a = p.get();
  ASSERT_NE(a, nullptr);
  std::vector<Blk> blocks = fill(a, {3 * MiB + 1, 5 * MiB, 2 * MiB + 5});
  ASSERT_GT(blocks.size(), 100u);
  const int64_t created = stat_of(a, "expseg.driver.create"), n = (int64_t)blocks.size();
  const int64_t free_bytes = free_every_other(a, blocks, 4096 * (int64_t)MiB);
  std::printf("%lld blocks, %lld chunks created\n", (long long)n, (long long)created);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
  const int64_t released = stat_of(a, "expseg.released_bytes");
  const size_t largest = (size_t)stat_of(a, "expseg.largest_free_block");
  // Growths took the minimum (16 MiB, one chunk) while the surplus stayed within half a
  // percent: far fewer chunks than blocks.
  EXPECT_LT(created, n / 2) << "one chunk per 16 MiB growth";
  // Only chunks wholly under freed blocks went back: the near-capacity growths (exact)
  // may make such chunks; they are at most what the freed blocks hold.
  EXPECT_LT(released, free_bytes / 4) << "most freed memory is pinned by its chunk's neighbours";
  void *x = nullptr;
  const size_t want = (size_t)free_bytes / 2;
  ASSERT_GT(want, largest + (size_t)released);
  EXPECT_EQ(expseg_malloc(a, want, 0, &x), EXPSEG_ERR_OUT_OF_MEMORY)
      << "half the free memory, " << want << " bytes, more than can move";
  books(a, blocks, false, "pinned");
  for (const Blk &b : blocks) ASSERT_EQ(expseg_free(a, b.p), EXPSEG_OK) << err();
}

}  // namespace

namespace {

// A growth that takes the minimum: a request of 6 MiB (below a chunk) on a stream of its
// own, after a 64 MiB peak was freed and given back and with a chunk (8 MiB) held on
// another stream (16 MiB more stays within 1.02 x the 64 MiB peak + 8 MiB), grown by
// 16 MiB: one chunk.
// Each create, map and set_access of it fails in turn (once, or from there on; driver or
// out-of-memory status): the request fails with the injected status or is served (the
// retry maps what is lacking), the books hold, nothing leaks once freed (reserved is what
// it was after empty_cache), and the allocator serves the request once the faults stop.
// Raises the allocator's peak to 64 MiB and gives the memory back, then holds a chunk on
// stream 1 (no minimum for it: its growth is its own 8 MiB), in `x`.
void peak_then_a_chunk(expseg_allocator *a, void **x) {
  void *p = nullptr;
  ASSERT_EQ(expseg_malloc(a, 64 * MiB, 1, &p), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_malloc(a, EXPSEG_CHUNK_MAX, 1, x), EXPSEG_OK) << err();
}

TEST(Faults, AFailureInAMinimumGrowthLeavesNothingBehind) {
  QuietLog quiet;
  const size_t req = 6 * MiB;
  static_assert(6 * MiB < EXPSEG_CHUNK_MAX, "a request below a chunk");
  for (const char *driver : {"fault;sim:capacity=1G", "fault;host:capacity=256M"}) {
    const bool bytes = driver[6] == 'h';
    // without faults: the growth is the minimum, two chunks, one grant
    {
      expseg_allocator *a = nullptr;
      ASSERT_EQ(expseg_create(driver, 0, "expandable_segments:True", &a), EXPSEG_OK) << err();
      void *x = nullptr, *y = nullptr;
      peak_then_a_chunk(a, &x);
      ASSERT_EQ(stat_of(a, "reserved_bytes.all.current"), (int64_t)EXPSEG_CHUNK_MAX);
      const int64_t r0 = stat_of(a, "reserved_bytes.all.current");
      const int64_t c0 = stat_of(a, "expseg.driver.create");
      ASSERT_EQ(expseg_malloc(a, req, 0, &y), EXPSEG_OK) << err();
      EXPECT_EQ(stat_of(a, "reserved_bytes.all.current") - r0, (int64_t)EXPSEG_LARGE_GROW_MIN)
          << driver;
      EXPECT_EQ(stat_of(a, "expseg.driver.create") - c0, 1) << driver << ": one chunk";
      ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
      ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
      expect_nothing_left(a, "plain");
    }
    int failed = 0;
    for (const char *kind : {"create", "map", "set_access"})
      for (int n = 1; n <= (std::strcmp(kind, "map") == 0 ? 9 : 3); n++)
        for (const char *how : {"", "..", ":oom", "..:oom"}) {
          const std::string rule = std::string(kind) + "@" + std::to_string(n) + how;
          const std::string where = std::string(driver) + " " + rule;
          expseg_allocator *a = nullptr;
          ASSERT_EQ(expseg_create(driver, 0, "expandable_segments:True", &a), EXPSEG_OK)
              << err();
          std::vector<Blk> live;
          void *x = nullptr;
          peak_then_a_chunk(a, &x);
          live.push_back({(char *)x, EXPSEG_CHUNK_MAX, 1});
          if (bytes) put(live.back());
          ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
          const int64_t before = stat_of(a, "reserved_bytes.all.current");
          ASSERT_EQ(expseg_testing_set_faults(a, rule.c_str()), EXPSEG_OK) << err();
          expseg_status st = expseg_malloc(a, req, 0, &x);
          ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK) << err();
          if (st != EXPSEG_OK) {
            failed++;
            EXPECT_EQ(st, std::strstr(how, "oom") ? EXPSEG_ERR_OUT_OF_MEMORY : EXPSEG_ERR_DRIVER)
                << where << ": " << err();
          } else {
            live.push_back({(char *)x, req, 2});
            if (bytes) put(live.back());
          }
          books(a, live, bytes, where + ": after the faulted growth");
          if (st == EXPSEG_OK) {
            ASSERT_EQ(expseg_free(a, live.back().p), EXPSEG_OK) << err();
            live.pop_back();
          }
          ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
          EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), before)
              << where << ": what the growth made went back";
          EXPECT_EQ(stat_of(a, "expseg.cached_physical_bytes.current"), 0) << where;
          ASSERT_EQ(expseg_malloc(a, req, 0, &x), EXPSEG_OK)
              << where << ": once the faults stop: " << err();
          live.push_back({(char *)x, req, 3});
          if (bytes) put(live.back());
          books(a, live, bytes, where + ": served again");
          for (const Blk &b : live) ASSERT_EQ(expseg_free(a, b.p), EXPSEG_OK) << err();
          ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
          EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0) << where;
          expect_nothing_left(a, where);
          if (HasFailure()) return;
        }
    // at least the first call of each kind failing from there on (3 kinds x 2 statuses)
    EXPECT_GE(failed, 6) << driver << ": growths failed";
  }
}

}  // namespace

namespace {

// Devices whose capacity is not a multiple of 16 MiB: requests of page multiples whose sum
// is the capacity are all served (the minimum never takes what a later request that fits
// needs: the out-of-memory retry maps only what is lacking), on one stream or several, to
// the last page; then one more byte is out of memory.
TEST(Capacity, RequestsThatFitAreServedToTheLastPage) {
  EXPSEG_SEEDED(seed, 10020);
  TestRng rng(seed);
  QuietLog quiet;
  for (const size_t cap_mib : {1000, 1030, 202, 18, 34}) {
    for (int streams = 1; streams <= 3; streams += 2) {
      const bool host = cap_mib <= 202;
      const std::string driver =
          std::string(host ? "host" : "sim") + ":capacity=" + std::to_string(cap_mib) + "M";
      const std::string where = driver + ", " + std::to_string(streams) + " streams";
      SCOPED_TRACE(where);
      AllocPtr p = make_alloc(driver.c_str(), "expandable_segments:True");
      expseg_allocator *a = p.get();
      ASSERT_NE(a, nullptr);
      std::vector<Blk> live;
      size_t left = cap_mib * MiB;
      while (left > 0) {
        size_t size = std::min(left, (size_t)(1 + rng.below(9)) * 2 * MiB);
        void *x = nullptr;
        const expseg_stream s = rng.below(streams);
        ASSERT_EQ(expseg_malloc(a, size, s, &x), EXPSEG_OK)
            << size << " bytes with " << left << " left: " << err();
        live.push_back({(char *)x, size, live.size() + 7});
        if (host) put(live.back());
        left -= size;
        books(a, live, host, where);
        if (HasFatalFailure()) return;
      }
      void *x = nullptr;
      EXPECT_EQ(expseg_malloc(a, 2 * MiB, 0, &x), EXPSEG_ERR_OUT_OF_MEMORY);
      EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), (int64_t)(cap_mib * MiB));
      // everything freed (in random order): one request of the whole device is served
      while (!live.empty()) {
        const size_t k = rng.below(live.size());
        ASSERT_EQ(expseg_free(a, live[k].p), EXPSEG_OK) << err();
        live[k] = live.back();
        live.pop_back();
      }
      ASSERT_EQ(expseg_malloc(a, cap_mib * MiB, 0, &x), EXPSEG_OK) << "the whole device: " << err();
      live.push_back({(char *)x, cap_mib * MiB, 5});
      if (host) put(live.back());
      books(a, live, host, where + ": the whole device");
      ASSERT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
    }
  }
}

}  // namespace
