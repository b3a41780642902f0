// SPDX-License-Identifier: Apache-2.0
// test_adv12_peak.cpp: the growth of expandable segments weighed against the peak of
// allocated bytes (the large pool's 16 MiB minimum for a request below a chunk, only while
// memory held stays within 1.02 x the most bytes allocated at once + 8 MiB; near that bound
// only what the request lacks), seen from the public API on the sim and host drivers.
// - Books: seeded programs with big early peaks, then small steady states, with
//   reset_peak_memory_stats, empty_cache, several streams, record_stream, private pools
//   (routed and named) and memory fraction changes: every live block's bytes intact (host),
//   the checker passes, nothing is left after freeing all and empty_cache.
// - Capacity: after a peak, a request whose own pages are all that fits under the memory
//   fraction or on the device is served, without the out-of-memory retry; chunks created
//   before the surplus was refused are the request's, not page-cache hits.
// - Bound: the same program run again after its peak stays within 1.02 x the peak + 8 MiB
//   + a page per segment; a program that allocates again what it freed, in another order,
//   can pass it (best fit leaves a request no block that fits), but a growth past it maps
//   only the request's own pages (no floor, no minimum).
// - Private pools: they grow by the minimum against the allocator's peak, and all of them
//   together stay within its bound.
// - Edges: requests of EXPSEG_CHUNK_MAX and just below it, a peak of 1 TiB on a device of
//   2^60 bytes, requests past the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "alloc_support.h"
#include "block_pattern.h"
#include "driver_param.h"
#include "expseg.h"
#include "expseg_testing.h"
#include "policy.h" // EXPSEG_LARGE_GROW_MIN, EXPSEG_CHUNK_MAX, EXPSEG_TIGHT_SLACK

namespace {

constexpr size_t KiB = 1024, MiB = KiB * 1024;

std::string err() { return expseg_last_error(); }

int64_t reserved(const expseg_allocator *a) { return stat_of(a, "reserved_bytes.all.current"); }

struct Blk {
  char *p;
  size_t size;
  uint64_t tag;
  expseg_pool_id pool;
};

constexpr size_t kStride = 64 * KiB;

void put(const Blk &b) { pattern_put(b.p, b.size, b.tag, kStride); }

void expect_intact(const std::vector<Blk> &live, const std::string &where) {
  for (const Blk &b : live) {
    std::string why;
    ASSERT_TRUE(pattern_ok(b.p, b.size, b.tag, kStride, &why))
        << where << ": block " << (void *)b.p << " of " << b.size << " bytes: " << why;
  }
}

// ---- Books ----

struct Books : ::testing::TestWithParam<DriverParam> {};

// Phases of one program: a peak (large blocks to about half the device, most freed at
// once), then a steady state of small blocks; in between, at random, the calls that change
// what the rule measures (reset_peak_memory_stats, empty_cache, the memory fraction) and
// what it weighs (private pools, other streams, record_stream).
TEST_P(Books, PeaksThenSteadyStatesKeepBytesAndBooks) {
  EXPSEG_SEEDED(seed, 1212);
  TestRng rng(seed);
  QuietLog quiet;
  const DriverParam prm = GetParam();
  const bool host = std::string(prm.driver).rfind("host", 0) == 0;
  const size_t cap = host ? 512 * MiB : 4096 * MiB;
  const std::string drv = std::string(prm.driver) + ":capacity=" + std::to_string(cap / MiB) + "M";
  AllocPtr p = make_alloc(drv.c_str(), prm.config);
  expseg_allocator *a = p.get();
  ASSERT_NE(a, nullptr);
  std::vector<Blk> live;
  std::vector<expseg_pool_id> pools;
  uint64_t tag = 1;
  int64_t most = 0; // the most bytes allocated at once, over every reset
  int served = 0, refused = 0;
  const int rounds = (int)test_ops(40, 40);
  auto alloc = [&](size_t size, expseg_stream s, expseg_pool_id pool) {
    void *x = nullptr;
    const expseg_status st = pool ? expseg_malloc_pool(a, size, s, pool, &x)
                                  : expseg_malloc(a, size, s, &x);
    if (st == EXPSEG_ERR_OUT_OF_MEMORY) { // the device full, or a lowered fraction
      refused++;
      return;
    }
    ASSERT_EQ(st, EXPSEG_OK) << size << ": " << err();
    live.push_back({(char *)x, size, tag++, pool});
    served++;
    if (host) put(live.back());
    if (rng.chance(0.2)) {
      ASSERT_EQ(expseg_record_stream(a, x, 1 + rng.below(3)), EXPSEG_OK) << err();
    }
    most = std::max(most, stat_of(a, "allocated_bytes.all.current"));
  };
  auto free_at = [&](size_t k) {
    ASSERT_EQ(expseg_free(a, live[k].p), EXPSEG_OK) << err();
    live[k] = live.back();
    live.pop_back();
  };
  for (int round = 0; round < rounds; round++) {
    const std::string where = "round " + std::to_string(round);
    SCOPED_TRACE(where);
    if (rng.chance(0.3)) {
      expseg_pool_id id = 0;
      ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << err();
      pools.push_back(id);
    }
    // the peak: large blocks to about half the device, on a few streams
    const size_t target = cap / 4 + rng.below(cap / 4);
    size_t sum = 0;
    while (sum < target) {
      const size_t size = rng.chance(0.5) ? (1 + rng.below(24)) * MiB - rng.below(2) * 512
                                          : EXPSEG_CHUNK_MAX - rng.below(2) * 512;
      alloc(size, rng.below(3), pools.empty() || rng.chance(0.7) ? 0 : pools[rng.below(pools.size())]);
      if (HasFatalFailure()) return;
      sum += size;
    }
    if (host) expect_intact(live, where + ", peak");
    if (HasFatalFailure()) return;
    expect_consistent(a, where + ", peak");
    // most of it freed
    for (size_t n = live.size() * 4 / 5; n > 0; n--) {
      free_at(rng.below(live.size()));
      if (HasFatalFailure()) return;
    }
    if (rng.chance(0.5)) expseg_reset_peak_stats(a);
    if (rng.chance(0.4)) {
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
    }
    if (rng.chance(0.4)) {
      // a cap just above what is held now, or none
      const double f = rng.chance(0.5) ? 1.0
                                       : std::min(1.0, ((double)reserved(a) + (double)(rng.below(64) * MiB)) /
                                                           (double)cap);
      ASSERT_EQ(expseg_set_memory_fraction(a, f), EXPSEG_OK) << err();
    }
    // the steady state: small blocks, some routed to a private pool
    const bool routed = !pools.empty() && rng.chance(0.5);
    const expseg_pool_id rp = routed ? pools[rng.below(pools.size())] : 0;
    if (routed) {
      ASSERT_EQ(expseg_pool_begin(a, rp, nullptr, nullptr), EXPSEG_OK) << err();
    }
    for (int i = 0; i < 300; i++) {
      if (!live.empty() && rng.chance(0.48)) {
        free_at(rng.below(live.size()));
      } else {
        const size_t size = rng.chance(0.5) ? 1 + rng.below(MiB) : (1 + rng.below(12)) * 512 * KiB;
        alloc(size, rng.below(4), 0);
      }
      if (HasFatalFailure()) return;
      if (i % 50 == 0) expect_consistent(a, where + ", steady");
    }
    if (routed) {
      ASSERT_EQ(expseg_pool_end(a, rp), EXPSEG_OK) << err();
    }
    if (host) expect_intact(live, where + ", steady");
    if (HasFatalFailure()) return;
    expect_consistent(a, where + ", steady");
    EXPECT_GE(most, stat_of(a, "allocated_bytes.all.peak")) << "the peak counted here";
    ASSERT_EQ(expseg_set_memory_fraction(a, 1.0), EXPSEG_OK) << err();
  }
  std::printf("%d requests served, %d refused (out of memory)\n", served, refused);
  EXPECT_GT(served, 1000);
  while (!live.empty()) {
    free_at(live.size() - 1);
    if (HasFatalFailure()) return;
  }
  for (expseg_pool_id id : pools) ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
  EXPECT_EQ(reserved(a), 0) << "everything freed and emptied";
  expect_consistent(a, "the end");
  expect_nothing_left(p.release(), "the end");
}

INSTANTIATE_TEST_SUITE_P(Drivers, Books,
                         ::testing::Values(DriverParam{"sim", "expandable_segments:True"},
                                           DriverParam{"host", "expandable_segments:True"},
                                           DriverParam{"sim", "expandable_segments:True,page_size_mb:4"},
                                           DriverParam{"host", "expandable_segments:True,chunk_max_mb:2"}));

// ---- Capacity ----

// After a 1 GiB peak, freed and given back, the memory fraction (expseg_set_memory_fraction,
// or the option per_process_memory_fraction) leaves room for exactly one more page beyond
// `keep` bytes held: a 2 MiB request fits, and must be served at once. The
// minimum (16 MiB, within 1.02 x the peak) does not fit under the cap: it must not send the
// request to the out-of-memory retry (which waits for every stream and gives back cached
// memory) nor fail it.
TEST(Capacity, AFittingRequestAfterAPeakIsServedWithoutTheRetry) {
  QuietLog quiet;
  for (const char *driver : {"sim:capacity=2G", "host:capacity=1100M"}) {
    for (const size_t keep : {(size_t)0, 100 * MiB}) {
      SCOPED_TRACE(std::string(driver) + ", " + std::to_string(keep / MiB) + " MiB kept");
      AllocPtr p = make_alloc(driver, "expandable_segments:True");
      expseg_allocator *a = p.get();
      ASSERT_NE(a, nullptr);
      void *big = nullptr, *k = nullptr, *x = nullptr;
      ASSERT_EQ(expseg_malloc(a, 1024 * MiB, 0, &big), EXPSEG_OK) << err();
      ASSERT_EQ(expseg_free(a, big), EXPSEG_OK) << err();
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
      if (keep) {
        ASSERT_EQ(expseg_malloc(a, keep, 1, &k), EXPSEG_OK) << err();
      }
      const int64_t held = reserved(a);
      size_t free_b = 0, total = 0;
      ASSERT_EQ(expseg_mem_get_info(a, &free_b, &total), EXPSEG_OK) << err();
      const double f = ((double)held + 2.5 * MiB) / (double)total;
      if (keep) { // by the option, as PYTORCH_CUDA_ALLOC_CONF would set it
        char opt[96];
        std::snprintf(opt, sizeof opt, "per_process_memory_fraction:%.17g", f);
        ASSERT_EQ(expseg_configure(a, opt), EXPSEG_OK) << opt << ": " << err();
      } else {
        ASSERT_EQ(expseg_set_memory_fraction(a, f), EXPSEG_OK) << err();
      }
      ASSERT_EQ(expseg_malloc(a, 2 * MiB, 0, &x), EXPSEG_OK) << "its own page fits: " << err();
      EXPECT_EQ(reserved(a), held + (int64_t)(2 * MiB));
      EXPECT_EQ(stat_of(a, "num_alloc_retries"), 0) << "a request that fits needs no retry";
      EXPECT_EQ(stat_of(a, "num_ooms"), 0);
      expect_consistent(a, "served");
      ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
      if (k) {
        ASSERT_EQ(expseg_free(a, k), EXPSEG_OK);
      }
      expect_nothing_left(p.release(), "capacity");
    }
  }
}

// The same on a device nearly full: 1 GiB live on a device of 1 GiB + 2 MiB, a 2 MiB
// request, whose page is the device's last, is served without the retry (the minimum is
// within 1.02 x the peak, but the device has one page left).
TEST(Capacity, TheDevicesLastPageAfterAPeakIsServed) {
  QuietLog quiet;
  for (const char *driver : {"sim:capacity=1026M", "host:capacity=1026M"}) {
    SCOPED_TRACE(driver);
    AllocPtr p = make_alloc(driver, "expandable_segments:True");
    expseg_allocator *a = p.get();
    ASSERT_NE(a, nullptr);
    void *big = nullptr, *x = nullptr;
    ASSERT_EQ(expseg_malloc(a, 1024 * MiB, 0, &big), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_malloc(a, 2 * MiB, 0, &x), EXPSEG_OK) << "its own page fits: " << err();
    EXPECT_EQ(reserved(a), (int64_t)(1026 * MiB));
    EXPECT_EQ(stat_of(a, "num_ooms"), 0);
    EXPECT_EQ(stat_of(a, "num_alloc_retries"), 0) << "a request that fits needs no retry";
    expect_consistent(a, "served");
    ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, big), EXPSEG_OK);
    expect_nothing_left(p.release(), "last page");
  }
}

// A floor growth after a 4 GiB block (1/128 of 4 GiB: 32 MiB; the request's own page a chunk
// of its own, first, then the surplus in chunks) whose second create runs out of memory: the
// request is placed again with only its page, mapped from the chunk the failed growth
// created. That chunk was created for this request: it is not a
// page-cache hit (expseg.page_cache_hits counts pages mapped from the cache instead of
// created), and it is not counted as held against the bound when the growth is placed again.
TEST(Capacity, ChunksCreatedBeforeARefusedSurplusAreNoCacheHits) {
  QuietLog quiet;
  AllocPtr p = make_alloc("fault;sim:capacity=8G", "expandable_segments:True");
  expseg_allocator *a = p.get();
  ASSERT_NE(a, nullptr);
  void *big = nullptr, *x = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4096 * MiB, 0, &big), EXPSEG_OK) << err();
  const int64_t hits0 = stat_of(a, "expseg.page_cache_hits");
  const int64_t created0 = stat_of(a, "expseg.created_bytes");
  ASSERT_EQ(expseg_testing_set_faults(a, "create@2..:oom"), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_malloc(a, 2 * MiB, 0, &x), EXPSEG_OK) << "its own page fits: " << err();
  ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK) << err();
  EXPECT_EQ(stat_of(a, "expseg.created_bytes") - created0, (int64_t)(2 * MiB))
      << "one chunk created before the refusal: the request's own page, first";
  EXPECT_EQ(stat_of(a, "expseg.page_cache_hits") - hits0, 0)
      << "the chunk created for the request is no cache hit";
  EXPECT_EQ(stat_of(a, "num_alloc_retries"), 0);
  expect_consistent(a, "served");
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, big), EXPSEG_OK);
  expect_nothing_left(p.release(), "after the refused surplus");
}

// ---- Bound ----

// Sizes of the large pool around the minimum and the chunk, and small ones.
size_t mixed_size(TestRng &rng) {
  switch (rng.below(4)) {
    case 0: return 1 + rng.below(MiB);                           // the small pool
    case 1: return (1 + rng.below(8)) * MiB - rng.below(3) * 512; // below a chunk
    case 2: return EXPSEG_CHUNK_MAX - rng.below(2) * 512;
    default: return (1 + rng.below(40)) * MiB + rng.below(MiB);   // larger
  }
}

// One stream: a growing phase to a peak (memory held stays within 1.02 x allocated + 8 MiB
// and a page per segment, the small and the large one), then rounds that free a random part
// and allocate the same sizes again in another order, with reset_peak_memory_stats and
// empty_cache between. Best fit may then leave a request no free block that fits (a smaller
// one took a larger block), so memory held can pass the bound of the peak; but a growth that
// leaves memory held past 1.02 x the peak + 8 MiB + a page maps no more than the request's
// own pages (no floor, no minimum).
TEST(Bound, PastThePeaksBoundAGrowthMapsOnlyTheRequestsPages) {
  EXPSEG_SEEDED(seed, 1213);
  TestRng rng(seed);
  QuietLog quiet;
  for (const char *config : {"expandable_segments:True", "expandable_segments:True,page_size_mb:4"}) {
    SCOPED_TRACE(config);
    AllocPtr p = make_alloc("sim:capacity=8G", config);
    expseg_allocator *a = p.get();
    ASSERT_NE(a, nullptr);
    const size_t page = alloc_test_page(a);
    std::vector<std::pair<void *, size_t>> live;
    size_t sum = 0;
    const size_t target = 256 * MiB + rng.below(768 * MiB);
    while (sum < target) {
      const size_t size = mixed_size(rng);
      void *x = nullptr;
      ASSERT_EQ(expseg_malloc(a, size, 0, &x), EXPSEG_OK) << err();
      live.push_back({x, size});
      sum += size;
      const double al = (double)stat_of(a, "allocated_bytes.all.current");
      ASSERT_LE((double)reserved(a), 1.02 * al + (double)EXPSEG_TIGHT_SLACK + 2.0 * (double)page)
          << "growing, " << live.size() << " blocks";
    }
    const double peak = (double)stat_of(a, "allocated_bytes.all.peak");
    const double bound = 1.02 * peak + (double)EXPSEG_TIGHT_SLACK + (double)page;
    double most = (double)reserved(a);
    int past = 0; // requests served with memory held past the bound
    const int rounds = (int)test_ops(400, 400);
    for (int round = 0; round < rounds; round++) {
      std::vector<size_t> sizes;
      for (size_t n = 1 + rng.below(live.size() / 2); n > 0; n--) {
        const size_t k = rng.below(live.size());
        ASSERT_EQ(expseg_free(a, live[k].first), EXPSEG_OK) << err();
        sizes.push_back(live[k].second);
        live[k] = live.back();
        live.pop_back();
      }
      if (rng.chance(0.2)) expseg_reset_peak_stats(a);
      if (rng.chance(0.1)) {
        ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
      }
      for (size_t i = sizes.size(); i > 1; i--) std::swap(sizes[i - 1], sizes[rng.below(i)]);
      for (size_t size : sizes) {
        void *x = nullptr;
        const int64_t before = reserved(a);
        ASSERT_EQ(expseg_malloc(a, size, 0, &x), EXPSEG_OK) << err();
        live.push_back({x, size});
        const int64_t grew = reserved(a) - before;
        most = std::max(most, (double)reserved(a));
        if ((double)reserved(a) > bound) {
          past++;
          ASSERT_LE(grew, (int64_t)((size + page - 1) / page * page))
              << "round " << round << ": the peak " << peak / MiB << " MiB, held "
              << (double)reserved(a) / MiB << " MiB, a request of " << size << " bytes";
        }
      }
    }
    std::printf("%s: peak allocated %.1f MiB, most held after it %.1f MiB (bound %.1f MiB), "
                "%d requests served past the bound\n",
                config, peak / MiB, most / MiB, bound / MiB, past);
    expect_consistent(a, "bound");
    for (auto &b : live) ASSERT_EQ(expseg_free(a, b.first), EXPSEG_OK);
    expect_nothing_left(p.release(), "bound");
  }
}

// The same program twice: once to its peak, all freed, given back (empty_cache) and the
// peak statistics reset; then again, on 1 or 3 streams. The second time the minimum is
// allowed from the first request on (the peak is known), yet memory held never passes
// 1.02 x the peak + 8 MiB + a page per segment (the small and the large one of each
// stream: their last pages are shared with no later request of another stream).
TEST(Bound, TheSameProgramAfterItsPeakStaysWithinTheBound) {
  EXPSEG_SEEDED(seed, 1214);
  QuietLog quiet;
  for (const int streams : {1, 3}) {
    SCOPED_TRACE(std::to_string(streams) + " streams");
    TestRng rng(seed + (uint64_t)streams);
    std::vector<std::pair<size_t, expseg_stream>> program;
    for (size_t sum = 0; sum < 600 * MiB;) {
      program.push_back({mixed_size(rng), (expseg_stream)rng.below(streams)});
      sum += program.back().first;
    }
    AllocPtr p = make_alloc("sim:capacity=8G", "expandable_segments:True");
    expseg_allocator *a = p.get();
    ASSERT_NE(a, nullptr);
    const size_t page = alloc_test_page(a);
    std::vector<void *> live;
    int64_t first_most = 0;
    for (int pass = 0; pass < 2; pass++) {
      for (const auto &r : program) {
        void *x = nullptr;
        ASSERT_EQ(expseg_malloc(a, r.first, r.second, &x), EXPSEG_OK) << err();
        live.push_back(x);
        if (pass == 1) {
          const double bound = 1.02 * (double)first_most + (double)EXPSEG_TIGHT_SLACK +
                               2.0 * streams * (double)page;
          ASSERT_LE((double)reserved(a), bound) << "request " << live.size();
        }
      }
      if (pass == 0) first_most = stat_of(a, "allocated_bytes.all.peak");
      std::printf("pass %d, %d streams: %lld MiB allocated, %lld MiB held\n", pass, streams,
                  (long long)stat_of(a, "allocated_bytes.all.current") >> 20,
                  (long long)reserved(a) >> 20);
      expect_consistent(a, "pass");
      for (void *x : live) ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
      live.clear();
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
      expseg_reset_peak_stats(a);
      ASSERT_EQ(reserved(a), 0);
    }
    expect_nothing_left(p.release(), "same program");
  }
}

// Past the bound the floor is dropped: 512 blocks of 2 MiB (a 1 GiB peak in one segment),
// every other one freed (512 MiB allocated, 1 GiB held in 2 MiB holes), then 4 MiB
// requests, which no hole fits, grow at the segment's end. A surplus (the minimum, or the
// floor: 1/128 of the segment, 8 MiB) is mapped while memory held stays within
// 1.02 x the peak + 8 MiB; past it, each growth maps only the request's own 4 MiB.
TEST(Bound, PastThePeaksBoundTheFloorIsDropped) {
  QuietLog quiet;
  AllocPtr p = make_alloc("sim:capacity=8G", "expandable_segments:True");
  expseg_allocator *a = p.get();
  ASSERT_NE(a, nullptr);
  std::vector<void *> twos(512), fours;
  for (void *&x : twos) ASSERT_EQ(expseg_malloc(a, 2 * MiB, 0, &x), EXPSEG_OK) << err();
  for (size_t i = 0; i < twos.size(); i += 2) ASSERT_EQ(expseg_free(a, twos[i]), EXPSEG_OK);
  const double bound = 1.02 * (double)stat_of(a, "allocated_bytes.all.peak") +
                       (double)EXPSEG_TIGHT_SLACK;
  int surplus = 0, tight = 0;
  for (int i = 0; i < 100; i++) {
    void *x = nullptr;
    const int64_t before = reserved(a);
    ASSERT_EQ(expseg_malloc(a, 4 * MiB, 0, &x), EXPSEG_OK) << err();
    fours.push_back(x);
    const int64_t grew = reserved(a) - before;
    if ((double)reserved(a) > bound) {
      EXPECT_LE(grew, (int64_t)(4 * MiB)) << "request " << i << ": past the bound";
      tight += grew > 0;
    } else {
      surplus += grew > (int64_t)(4 * MiB);
    }
  }
  EXPECT_GT(surplus, 0) << "a surplus within the bound";
  EXPECT_GT(tight, 50) << "growths past the bound";
  expect_consistent(a, "floor");
  for (size_t i = 1; i < twos.size(); i += 2) ASSERT_EQ(expseg_free(a, twos[i]), EXPSEG_OK);
  for (void *x : fours) ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  expect_nothing_left(p.release(), "floor");
}

// ---- Private pools ----

// A private pool's growth is weighed against the allocator's peak (the general cache's
// 1 GiB here, freed and given back): its first 2 MiB request grows by the minimum. Many
// pools then each hold a minimum's surplus (that no other pool can use) until memory held
// reaches 1.02 x the peak + 8 MiB; from there each maps only its request's page.
TEST(PrivatePools, GrowAgainstTheAllocatorsPeakAndStayWithinItsBoundTogether) {
  QuietLog quiet;
  AllocPtr p = make_alloc("sim:capacity=4G", "expandable_segments:True");
  expseg_allocator *a = p.get();
  ASSERT_NE(a, nullptr);
  void *big = nullptr;
  ASSERT_EQ(expseg_malloc(a, 1024 * MiB, 0, &big), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_free(a, big), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
  expseg_reset_peak_stats(a);
  const double bound = 1.02 * 1024.0 * MiB + (double)EXPSEG_TIGHT_SLACK;
  std::vector<expseg_pool_id> pools;
  std::vector<void *> live;
  int minimum = 0, exact = 0;
  for (int i = 0; i < 100; i++) {
    expseg_pool_id id = 0;
    ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << err();
    pools.push_back(id);
    void *x = nullptr;
    const int64_t before = reserved(a);
    ASSERT_EQ(expseg_malloc_pool(a, 2 * MiB, 0, id, &x), EXPSEG_OK) << err();
    live.push_back(x);
    const int64_t grew = reserved(a) - before;
    if (i == 0) {
      EXPECT_EQ(grew, (int64_t)EXPSEG_LARGE_GROW_MIN) << "the peak counts for a pool";
    }
    EXPECT_TRUE(grew == (int64_t)EXPSEG_LARGE_GROW_MIN || grew == (int64_t)(2 * MiB)) << grew;
    (grew == (int64_t)EXPSEG_LARGE_GROW_MIN ? minimum : exact)++;
    if (grew > (int64_t)(2 * MiB)) {
      EXPECT_LE((double)reserved(a), bound) << "pool " << i << ": the minimum within the bound";
    } else {
      EXPECT_GT((double)(before + (int64_t)EXPSEG_LARGE_GROW_MIN), bound)
          << "pool " << i << ": the minimum refused only past the bound";
    }
  }
  std::printf("100 pools: %d grew by the minimum, %d by their page; %lld MiB held for 200 MiB\n",
              minimum, exact, (long long)reserved(a) >> 20);
  EXPECT_GT(minimum, 1);
  EXPECT_GT(exact, 0);
  expect_consistent(a, "pools");
  for (void *x : live) ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  for (expseg_pool_id id : pools) ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
  EXPECT_EQ(reserved(a), 0);
  expect_nothing_left(p.release(), "pools");
}

// ---- Edges ----

// The minimum switches at a chunk: a request of EXPSEG_CHUNK_MAX - 512 bytes (below a
// chunk) grows by the minimum, one of EXPSEG_CHUNK_MAX by its own bytes, after a small peak
// and after one of 1 TiB on a device of 2^60 bytes (the sim driver's address space stops at
// 4 PiB, and a peak of 2 PiB needs more host memory for its pages' books than a test has). Requests past the device, or of nearly 2^64 bytes, are refused, the books unchanged.
TEST(Edges, TheMinimumSwitchesAtAChunkAfterAHugePeak) {
  QuietLog quiet;
  const size_t huge = (size_t)1 << 60;
  for (const size_t peak : {64 * MiB, ((size_t)1 << 40) - 64 * MiB}) {
    SCOPED_TRACE(peak);
    const std::string drv = "sim:capacity=" + std::to_string(huge) + ",va=4096T";
    AllocPtr p = make_alloc(drv.c_str(), "expandable_segments:True");
    expseg_allocator *a = p.get();
    ASSERT_NE(a, nullptr);
    void *big = nullptr, *x = nullptr, *y = nullptr;
    ASSERT_EQ(expseg_malloc(a, peak, 0, &big), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_free(a, big), EXPSEG_OK);
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_malloc(a, EXPSEG_CHUNK_MAX, 1, &y), EXPSEG_OK) << err();
    EXPECT_EQ(reserved(a), (int64_t)EXPSEG_CHUNK_MAX) << "a chunk: its own bytes";
    ASSERT_EQ(expseg_malloc(a, EXPSEG_CHUNK_MAX - 512, 2, &x), EXPSEG_OK) << err();
    EXPECT_EQ(reserved(a), (int64_t)(EXPSEG_CHUNK_MAX + EXPSEG_LARGE_GROW_MIN))
        << "below a chunk: the minimum";
    void *z = nullptr;
    EXPECT_EQ(expseg_malloc(a, huge + 1, 0, &z), EXPSEG_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(expseg_malloc(a, SIZE_MAX - 4096, 0, &z), EXPSEG_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(z, nullptr);
    EXPECT_EQ(reserved(a), (int64_t)(EXPSEG_CHUNK_MAX + EXPSEG_LARGE_GROW_MIN));
    expect_consistent(a, "edges");
    ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
    expect_nothing_left(p.release(), "edges");
  }
}

} // namespace
