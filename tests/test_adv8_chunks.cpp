// SPDX-License-Identifier: Apache-2.0
// test_adv8_chunks.cpp: large requests that grow an expandable segment by more than one
// physical chunk (their whole pages get chunks of their own, mapped first under them), seen
// from the public API.
// - Random: a seeded mix of odd sizes (just above and below multiples of 8 and 64 MiB, above
//   64 MiB, small ones between), frees in random order, several streams, private pools, a
//   region put to sleep and woken, empty_cache, the memory fraction and option changes, on
//   host and sim, pages of 2 to 128 MiB: after every call expseg_check passes, allocated <=
//   active <= reserved in every pool, each `all` row is the sum of its pools, reserved_bytes
//   is what the driver holds, no two live blocks overlap and (host) every live block keeps
//   the pattern written into its pages.
// - Faults: create, map and set_access failing at each position of a multi-chunk growth;
//   SleepFaults: the same, and copy, in the wake of a region of such requests. The call fails
//   with the injected status, nothing is half done, the request (or wake) succeeds once the
//   faults stop, and after destroy the driver holds nothing.
// - Threads: concurrent multi-chunk growths, frees and empty_cache are all served.
// - PlacementP: after any growth above a chunk, the pages wholly under the request are
//   unmapped and given back once it is freed, though a block placed after it shares the
//   growth's last page (fails without the request's chunks or with the `lead` reorder off).
// - HostMemory: host memory running out at each of expseg's own allocations in such a growth
//   is EXPSEG_ERR_HOST_OUT_OF_MEMORY, with no device out-of-memory report.
// - OomHint: free memory in a live private pool or a region names expseg_pool_empty_cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "alloc_support.h"
#include "block_pattern.h"
#include "expseg.h"
#include "expseg_testing.h"
#include "host_fail.h"
#include "policy.h"  // EXPSEG_CHUNK_MAX

namespace {

constexpr size_t KiB = 1024, MiB = KiB * 1024;

std::string err() { return expseg_last_error(); }

struct Blk {
  char *p;
  size_t size;
  uint64_t tag;
  expseg_pool_id pool;
  bool region;
};

// One word per `g_stride` bytes (the random runs: every OS page; the fault runs, where
// hundreds of allocators map the same sizes: 16 per 2 MiB granule) and the last 8 bytes.
size_t g_stride = 4 * KiB;

void put(const Blk &b, bool bytes) {
  if (bytes) pattern_put(b.p, b.size, b.tag, g_stride);
}

bool verify(const Blk &b, bool bytes, std::string *why) {
  return !bytes || pattern_ok(b.p, b.size, b.tag, g_stride, why);
}

// A size near the chunk bounds: k * 8 MiB or k * 64 MiB, a little over or under, never a
// page multiple; or anything up to 200 MiB; or a small one.
size_t odd_size(TestRng &rng) {
  const size_t jitter = 1 + rng.below(3 * MiB);
  switch (rng.below(6)) {
    case 0: return (1 + rng.below(12)) * 8 * MiB + jitter;
    case 1: return (1 + rng.below(12)) * 8 * MiB - jitter;
    case 2: return (1 + rng.below(2)) * 64 * MiB + jitter;
    case 3: return (1 + rng.below(2)) * 64 * MiB - jitter;
    case 4: return 1 + rng.below(200 * MiB);
    default: return 1 + rng.below(MiB);
  }
}

void check_all(expseg_allocator *a, const std::vector<Blk> &live, bool asleep, bool bytes,
               bool verify_bytes, const std::string &where) {
  ASSERT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << err();
  StatMap m = stat_map(a);
  for (const char *base : {"allocated_bytes", "reserved_bytes", "active_bytes", "segment",
                           "allocation", "requested_bytes"})
    for (const char *metric : {"current", "peak", "allocated", "freed"}) {
      std::string b = base;
      if (std::string(metric) == "peak") continue;  // peaks of the pools need not add up
      EXPECT_EQ(m[b + ".all." + metric],
                m[b + ".small_pool." + metric] + m[b + ".large_pool." + metric])
          << where << ": " << b << ".*." << metric;
    }
  for (const char *pool : {"all", "small_pool", "large_pool"}) {
    std::string p = std::string(".") + pool + ".current";
    EXPECT_LE(m["allocated_bytes" + p], m["active_bytes" + p]) << where << p;
    if (!asleep) {
      EXPECT_LE(m["active_bytes" + p], m["reserved_bytes" + p]) << where << p;
    }
  }
  expseg_testing_driver_counts d{};
  ASSERT_EQ(expseg_testing_driver_counts_get(a, &d), EXPSEG_OK) << err();
  EXPECT_EQ(m["reserved_bytes.all.current"], d.live_chunk_bytes)
      << where << ": what the allocator counts as reserved is what the driver holds";
  std::vector<std::pair<uintptr_t, size_t>> r;
  for (const Blk &b : live) r.push_back({(uintptr_t)b.p, b.size});
  std::sort(r.begin(), r.end());
  for (size_t i = 1; i < r.size(); i++)
    ASSERT_LE(r[i - 1].first + r[i - 1].second, r[i].first) << where << ": live blocks overlap";
  if (verify_bytes)
    for (const Blk &b : live) {
      if (asleep && b.region) continue;
      std::string why;
      ASSERT_TRUE(verify(b, bytes, &why))
          << where << ": block " << (void *)b.p << " of " << b.size << " bytes: " << why;
    }
}

// Wakes region "r"; while that is out of memory, raises the fraction, empties the cache
// and frees live blocks outside the region, as a caller would.
expseg_status wake_making_room(expseg_allocator *a, std::vector<Blk> &live) {
  expseg_status st;
  while ((st = expseg_wake(a, "r")) == EXPSEG_ERR_OUT_OF_MEMORY) {
    if (expseg_set_memory_fraction(a, 1.0) != EXPSEG_OK || expseg_empty_cache(a) != EXPSEG_OK)
      return EXPSEG_ERR_DRIVER;
    if ((st = expseg_wake(a, "r")) != EXPSEG_ERR_OUT_OF_MEMORY) break;
    size_t k = 0;
    while (k < live.size() && live[k].region) k++;
    if (k == live.size()) return st;
    if (expseg_free(a, live[k].p) != EXPSEG_OK) return EXPSEG_ERR_DRIVER;
    live[k] = live.back();
    live.pop_back();
  }
  return st;
}

struct Random : ::testing::TestWithParam<const char *> {};

TEST_P(Random, LargeOddRequestsKeepEveryByteAndTheBooks) {
  EXPSEG_SEEDED(seed, 8008);
  TestRng rng(seed);
  QuietLog quiet;
  const bool bytes = std::strncmp(GetParam(), "host", 4) == 0;
  g_stride = 4 * KiB;
  // "DRIVER|OPTIONS"
  const std::string param = GetParam(), driver = param.substr(0, param.find('|'));
  const std::string conf = "expandable_segments:True" +
                           (param.find('|') == std::string::npos
                                ? std::string()
                                : "," + param.substr(param.find('|') + 1));
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create(driver.c_str(), 0, conf.c_str(), &a), EXPSEG_OK) << err();
  std::vector<Blk> live;
  std::vector<expseg_pool_id> pools;
  bool asleep = false, region_discarded = false;
  uint64_t tags = seed << 20;
  const long ops = (long)test_ops(bytes ? 250 : 1500);
  for (long i = 0; i < ops; i++) {
    const unsigned op = (unsigned)rng.below(100);
    const std::string where = "op " + std::to_string(i) + " (" + std::to_string(op) + ")";
    if (op < 45) {
      const size_t size = odd_size(rng);
      const expseg_stream s = rng.below(4);
      Blk b{nullptr, size, ++tags, 0, false};
      void *x = nullptr;
      expseg_status st;
      const unsigned to = (unsigned)rng.below(10);
      if (to == 0 && !pools.empty()) {
        b.pool = pools[rng.below(pools.size())];
        st = expseg_malloc_pool(a, size, s, b.pool, &x);
      } else if (to == 1 && !asleep) {
        ASSERT_EQ(expseg_region_begin(a, "r"), EXPSEG_OK) << err();
        st = expseg_malloc(a, size, s, &x);
        ASSERT_EQ(expseg_region_end(a, "r"), EXPSEG_OK) << err();
        expseg_region_info info{};
        ASSERT_EQ(expseg_region_get_info(a, "r", &info), EXPSEG_OK) << err();
        b.pool = info.pool;
        b.region = true;
      } else if (to == 2) {
        st = expseg_malloc_ex(a, size, s, EXPSEG_MALLOC_SINGLE_CHUNK, &x);
      } else {
        st = expseg_malloc(a, size, s, &x);
      }
      if (st == EXPSEG_OK) {
        b.p = (char *)x;
        put(b, bytes);
        live.push_back(b);
      } else {
        ASSERT_EQ(st, EXPSEG_ERR_OUT_OF_MEMORY) << where << ": " << err();
      }
    } else if (op < 75) {
      if (live.empty()) continue;
      const size_t k = rng.below(live.size());
      if (live[k].region && asleep) continue;
      std::string why;
      ASSERT_TRUE(verify(live[k], bytes, &why)) << where << ": freed block: " << why;
      if (rng.below(4) == 0) {
        EXPECT_EQ(expseg_record_stream(a, live[k].p, 1 + rng.below(5)), EXPSEG_OK) << err();
      }
      ASSERT_EQ(expseg_free(a, live[k].p), EXPSEG_OK) << where << ": " << err();
      live[k] = live.back();
      live.pop_back();
    } else if (op < 80) {
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << where << ": " << err();
    } else if (op < 83) {
      if (pools.size() < 3) {
        expseg_pool_id id = 0;
        ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << err();
        pools.push_back(id);
      } else {
        expseg_pool_id id = pools[rng.below(pools.size())];
        ASSERT_EQ(expseg_pool_empty_cache(a, id), EXPSEG_OK) << where << ": " << err();
      }
    } else if (op < 87) {
      const double f = rng.below(3) == 0 ? 1.0 : 0.2 + 0.8 * rng.unit();
      ASSERT_EQ(expseg_set_memory_fraction(a, f), EXPSEG_OK) << err();
    } else if (op < 93) {
      static const char *const texts[] = {
          "garbage_collection_threshold:0.5", "garbage_collection_threshold:0.9",
          "page_cache_max_mb:0",              "page_cache_max_mb:100",
          "max_split_size_mb:40",             "max_split_size_mb:17592186044415",
          "expandable_segments:False",        "expandable_segments:True",
          "expandable_segments:True",         "single_chunk_min_mb:70",
          "single_chunk_min_mb:17592186044415", "roundup_power2_divisions:4"};
      const char *t = texts[rng.below(sizeof texts / sizeof *texts)];
      ASSERT_EQ(expseg_configure(a, t), EXPSEG_OK) << t << ": " << err();
    } else {
      if (asleep) {
        // memory taken while it slept (or a fraction lowered): the caller makes room
        const expseg_status st = wake_making_room(a, live);
        ASSERT_EQ(st, EXPSEG_OK) << where << ": wake: " << err();
        asleep = false;
        if (region_discarded)
          for (Blk &b : live)
            if (b.region) put(b, bytes);
      } else {
        bool any = false;
        for (const Blk &b : live) any |= b.region;
        if (!any) continue;
        region_discarded = rng.below(3) == 0;
        expseg_status st =
            expseg_sleep(a, "r", region_discarded ? EXPSEG_SLEEP_DISCARD : EXPSEG_SLEEP_OFFLOAD);
        ASSERT_EQ(st, EXPSEG_OK) << where << ": sleep: " << err();
        asleep = true;
      }
    }
    check_all(a, live, asleep, bytes, i % 16 == 0, where);
    if (HasFatalFailure()) break;
  }
  if (asleep) {
    ASSERT_EQ(wake_making_room(a, live), EXPSEG_OK) << err();
    if (region_discarded)
      for (Blk &b : live)
        if (b.region) put(b, bytes);
  }
  check_all(a, live, false, bytes, true, "end");
  for (const Blk &b : live) ASSERT_EQ(expseg_free(a, b.p), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
  for (expseg_pool_id id : pools) ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_OK) << err();
  check_all(a, {}, false, bytes, true, "all freed");
  expect_nothing_left(a, "end");
}

// Pages of 20 MiB (not a divisor of a chunk), 6 MiB, 128 MiB (above a request's chunk),
// and granules of 64 KiB (chunks of many pages).
INSTANTIATE_TEST_SUITE_P(Drivers, Random,
                         ::testing::Values("host:capacity=1G", "sim:capacity=2G",
                                           "sim:capacity=2G|page_size_mb:20",
                                           "sim:capacity=2G|page_size_mb:6",
                                           "sim:capacity=3G|page_size_mb:128",
                                           "sim:capacity=2G,granularity=64K|page_size_mb:0",
                                           "host:capacity=1G|page_size_mb:20",
                                           "sim:capacity=2G|va_reserve_mb:70"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                           std::string n = i.param[0] == 'h' ? "host" : "sim";
                           const char *pg = std::strstr(i.param, "page_size_mb:");
                           if (pg) n += std::string("_page") + (pg + 13);
                           if (std::strstr(i.param, "granularity")) n += "_gran64K";
                           if (std::strstr(i.param, "va_reserve")) n += "_va70M";
                           return n;
                         });

}  // namespace

namespace {

// The state before the failing growth: a few blocks on two streams, one freed (a free mapped
// block before the unmapped range, or chunks in the page cache after an empty_cache).
void prepare(expseg_allocator *a, int variant, std::vector<Blk> &live, bool bytes) {
  void *x = nullptr;
  uint64_t tag = 77;
  const size_t sizes[] = {3 * MiB + 5, 20 * MiB + 7, 70 * MiB - 3};
  for (size_t s : sizes) {
    ASSERT_EQ(expseg_malloc(a, s, 0, &x), EXPSEG_OK) << err();
    live.push_back({(char *)x, s, ++tag, 0, false});
    put(live.back(), bytes);
  }
  if (variant >= 1) {  // the last one freed: a free mapped block at the end of the mapping
    ASSERT_EQ(expseg_free(a, live.back().p), EXPSEG_OK) << err();
    live.pop_back();
  }
  if (variant >= 2) {  // and unmapped: its chunks wait in the page cache
    ASSERT_EQ(expseg_configure(a, "page_cache_max_mb:1000"), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
  }
}

struct Faults : ::testing::TestWithParam<const char *> {};

// Every create, map and set_access of a growth by many chunks (the request's own and the
// surplus) fails in turn, once or from there on, with either status: the request fails
// with that status or succeeds (the out-of-memory retry), the books hold, the same request
// is served once the faults stop, and nothing is left with the driver at the end.
TEST_P(Faults, AFailureInAMultiChunkGrowthLeavesNothingBehind) {
  QuietLog quiet;
  const bool bytes = std::strncmp(GetParam(), "fault;host", 10) == 0;
  g_stride = 128 * KiB;
  const size_t big = 150 * MiB + 12345;  // two 64 MiB chunks of its own, then the rest
  int failed = 0;
  for (const char *kind : {"create", "map", "set_access"})
    for (int n = 1; n <= (bytes ? 6 : 8); n++)
      for (int variant = 0; variant < 3; variant++)
        for (const char *how : {"", "..", ":oom", "..:oom"}) {
          if (bytes && std::strstr(how, "oom")) continue;  // host: one status checks the bytes
          const std::string rule = std::string(kind) + "@" + std::to_string(n) +
                                   (how[0] == '.' ? ".." : "") +
                                   (std::strstr(how, "oom") ? ":oom" : "");
          const std::string where = rule + " variant " + std::to_string(variant);
          expseg_allocator *a = nullptr;
          ASSERT_EQ(expseg_create(GetParam(), 0, "expandable_segments:True", &a), EXPSEG_OK)
              << err();
          std::vector<Blk> live;
          prepare(a, variant, live, bytes);
          if (HasFatalFailure()) return;
          ASSERT_EQ(expseg_testing_set_faults(a, rule.c_str()), EXPSEG_OK) << err();
          void *x = nullptr;
          expseg_status st = expseg_malloc(a, big, 1, &x);
          const expseg_status injected =
              std::strstr(how, "oom") ? EXPSEG_ERR_OUT_OF_MEMORY : EXPSEG_ERR_DRIVER;
          if (st != EXPSEG_OK) {
            failed++;
            EXPECT_EQ(st, injected) << where << ": " << err();
          } else {
            live.push_back({(char *)x, big, 999, 0, false});
            put(live.back(), bytes);
          }
          check_all(a, live, false, bytes, true, where + ": after the faulted growth");
          ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK) << err();
          st = expseg_malloc(a, big, 1, &x);
          ASSERT_EQ(st, EXPSEG_OK) << where << ": once the faults stop: " << err();
          live.push_back({(char *)x, big, 1000, 0, false});
          put(live.back(), bytes);
          check_all(a, live, false, bytes, true, where + ": served again");
          for (const Blk &b : live) ASSERT_EQ(expseg_free(a, b.p), EXPSEG_OK) << err();
          ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
          check_all(a, {}, false, bytes, false, where + ": all freed");
          EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0) << where;
          expect_nothing_left(a, where);
          if (HasFailure()) return;
        }
  EXPECT_GT(failed, 0) << "some growth failed";
}

INSTANTIATE_TEST_SUITE_P(Drivers, Faults,
                         ::testing::Values("fault;sim:capacity=2G", "fault;host:capacity=1G"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                           return std::string(i.param[6] == 'h' ? "host" : "sim");
                         });

}  // namespace

namespace {

// Threads growing by many chunks at once while others free, empty the cache and collect
// garbage: with memory to spare every request is served (the chunks a growth creates may
// be taken by another thread while the lock is let go, never lost), and at the end the
// books hold and nothing is left with the driver.
TEST(Threads, ConcurrentMultiChunkGrowthsAreServedAndLeaveNothing) {
  EXPSEG_SEEDED(seed, 8118);
  QuietLog quiet;
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim:capacity=64G", 0,
                          "expandable_segments:True,garbage_collection_threshold:0.01", &a),
            EXPSEG_OK)
      << err();
  const int kThreads = 4;
  const long ops = (long)test_ops(5000);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> th;
  for (int t = 0; t < kThreads; t++)
    th.emplace_back([&, t] {
      TestRng rng(seed * 31 + (uint64_t)t);
      std::vector<void *> mine;
      for (long i = 0; i < ops && errors[t].empty(); i++) {
        const unsigned op = (unsigned)rng.below(10);
        if (op < 5) {
          void *x = nullptr;
          const size_t size = odd_size(rng);
          if (expseg_malloc(a, size, (expseg_stream)(t % 2), &x) != EXPSEG_OK)
            errors[t] = "malloc " + std::to_string(size) + " at op " + std::to_string(i) + ": " +
                        err();
          else
            mine.push_back(x);
        } else if (op < 9) {
          if (mine.empty()) continue;
          const size_t k = rng.below(mine.size());
          if (expseg_free(a, mine[k]) != EXPSEG_OK) errors[t] = "free: " + err();
          mine[k] = mine.back();
          mine.pop_back();
        } else if (expseg_empty_cache(a) != EXPSEG_OK) {
          errors[t] = "empty_cache: " + err();
        }
        if (mine.size() > 12) {  // keep the live set bounded
          if (expseg_free(a, mine.front()) != EXPSEG_OK) errors[t] = "free: " + err();
          mine.erase(mine.begin());
        }
      }
      for (void *x : mine)
        if (expseg_free(a, x) != EXPSEG_OK) errors[t] = "free: " + err();
    });
  for (std::thread &x : th) x.join();
  for (int t = 0; t < kThreads; t++) EXPECT_EQ(errors[t], "") << "thread " << t;
  check_all(a, {}, false, false, false, "joined");
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
  expect_nothing_left(a, "threads");
}

}  // namespace

namespace {

// Chunks of a request's own, seen from outside: after a growth that gives them chunks of their
// own (above one chunk, or a request of a chunk or more with a surplus), the pages
// wholly under the request go back once it is freed (empty_cache), though a block placed
// after it (of the large pool: above 1 MiB) shares the growth's last page, whatever the
// request's size, the growth floor
// (set by what the segment maps already: a base block of up to 3 GiB, ending inside a page
// so that the request starts in a free prefix) and the order the page cache hands out the
// chunks (the request's own are mapped first, under it, before larger surplus chunks):
// none of them is still mapped, and what stays held is at most the rest of the growth.
struct PlacementP : ::testing::TestWithParam<const char *> {};

TEST_P(PlacementP, ARequestsWholePagesGoBackAfterAnyGrowthAboveAChunk) {
  EXPSEG_SEEDED(seed, 8228);
  TestRng rng(seed);
  int checked = 0;
  const long trials = (long)test_ops(300);
  for (long i = 0; i < trials; i++) {
    AllocPtr p = make_alloc("sim:capacity=16G", GetParam());
    expseg_allocator *a = p.get();
    ASSERT_NE(a, nullptr);
    const size_t pg = alloc_test_page(a);
    // on a stream, or in a private pool, of its own
    const expseg_stream s = rng.below(3);
    expseg_pool_id pool = 0;
    if (rng.below(3) == 0) {
      ASSERT_EQ(expseg_pool_create(a, &pool), EXPSEG_OK) << err();
    }
    auto get = [&](size_t n, void **x) { return expseg_malloc_pool(a, n, s, pool, x); };
    void *base = nullptr, *r = nullptr, *b = nullptr;
    const size_t base_size = rng.below(4) == 0 ? 0 : 1 + rng.below(3 * 1024 * MiB);
    if (base_size) {
      ASSERT_EQ(get(base_size, &base), EXPSEG_OK) << err();
    }
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
    if (pool) {
      ASSERT_EQ(expseg_pool_empty_cache(a, pool), EXPSEG_OK) << err();
    }
    const int64_t before = stat_of(a, "reserved_bytes.all.current");
    const unsigned pick = (unsigned)rng.below(3);
    const size_t size = pick == 0   ? 1 + rng.below(9 * MiB)
                        : pick == 1 ? odd_size(rng)
                                    : 1 + rng.below(4 * pg);
    ASSERT_EQ(get(size, &r), EXPSEG_OK) << err();
    const int64_t own_growth = stat_of(a, "reserved_bytes.all.current") - before;
    ASSERT_EQ(get(MiB + 1 + rng.below(MiB), &b), EXPSEG_OK) << err();
    const int64_t growth = stat_of(a, "reserved_bytes.all.current") - before;
    // pages count from the segment's start (a page need not divide the address): the base
    // block's, else the request's
    const uintptr_t seg = (uintptr_t)(base ? base : r), end = (uintptr_t)r + size;
    const uintptr_t lo = seg + ((uintptr_t)r - seg + pg - 1) / pg * pg;
    const int64_t whole = end > lo ? (int64_t)((end - lo) / pg * pg) : 0;
    // the policy keeps the growth one chunk (policy.h: _expseg_request_pages): nothing to see
    if (whole == 0 || _expseg_request_pages((size_t)own_growth / pg, (size_t)whole / pg, pg,
                                                (size + 511) / 512 * 512) == 0)
      continue;
    checked++;
    ASSERT_EQ(expseg_free(a, r), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
    if (pool) {
      ASSERT_EQ(expseg_pool_empty_cache(a, pool), EXPSEG_OK) << err();
    }
    const int64_t kept = stat_of(a, "reserved_bytes.all.current") - before;
    ASSERT_LE(kept, growth - whole)
        << "trial " << i << ": base " << base_size << ", request " << size << " at +"
        << ((uintptr_t)r - seg) % pg << " in its page: a growth of " << growth << " bytes, "
        << whole << " of them wholly under the request, kept " << kept << " once it was freed";
    // and none of those pages is still mapped (expseg_walk: one segment per mapped run)
    std::vector<std::pair<uint64_t, uint64_t>> runs;
    ASSERT_EQ(expseg_walk(
                  a,
                  [](void *ctx, const expseg_walk_segment *sg) {
                    static_cast<std::vector<std::pair<uint64_t, uint64_t>> *>(ctx)->push_back(
                        {sg->address, sg->address + sg->total_size});
                  },
                  nullptr, &runs),
              EXPSEG_OK)
        << err();
    for (const auto &run : runs)
      ASSERT_TRUE(run.second <= lo || run.first >= lo + (uint64_t)whole)
          << "trial " << i << ": base " << base_size << ", request " << size << " at +"
          << ((uintptr_t)r - seg) % pg << ": [" << (int64_t)(run.first - lo) << ", "
          << (int64_t)(run.second - lo)
          << ") from its first whole page is still mapped once it was freed, of " << whole
          << " bytes wholly under it";
    ASSERT_EQ(expseg_check(a), EXPSEG_OK) << err();
  }
  EXPECT_GT(checked, trials / 20) << "growths above a chunk checked";
}

// Pages of 2 MiB, 6 MiB, 20 MiB (above a chunk: every growth is), 128 MiB (above a
// request's chunk: one page each).
INSTANTIATE_TEST_SUITE_P(Pages, PlacementP,
                         ::testing::Values("expandable_segments:True",
                                           "expandable_segments:True,page_size_mb:6",
                                           "expandable_segments:True,page_size_mb:20",
                                           "expandable_segments:True,page_size_mb:128"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                           const char *pg = std::strstr(i.param, "page_size_mb:");
                           return std::string("page") + (pg ? pg + 13 : "2");
                         });

}  // namespace

namespace {

// Host memory running out at each of expseg's own host allocations in turn while a request
// grows a segment by many chunks (more than 64: the chunk tables leave the stack): the
// request fails with EXPSEG_ERR_HOST_OUT_OF_MEMORY (the driver's own bookkeeping too) or is
// served, the books hold, the same request is served once host memory is back, and nothing
// is left with the driver.
TEST(HostMemory, RunningOutInAMultiChunkGrowthLeavesNothingBehind) {
#ifndef EXPSEG_TEST_HOST_FAIL
  GTEST_SKIP() << "malloc cannot be replaced under a sanitizer";
#else
  QuietLog quiet;
  // 80 chunks of its own, then the rest; or a few (the tables on the stack)
  for (const size_t big : {5 * 1024 * MiB + 12345, 100 * MiB + 12345}) {
  int refused = 0;
  bool served = false;
  for (long c = 0; c < 400 && !served; c++) {
    const std::string where = std::to_string(big) + " bytes, countdown " + std::to_string(c);
    expseg_allocator *a = nullptr;
    ASSERT_EQ(expseg_create("sim:capacity=16G", 0, "expandable_segments:True", &a), EXPSEG_OK)
        << err();
    std::vector<Blk> live;
    prepare(a, (int)(c % 3), live, false);
    if (HasFatalFailure()) return;
    void *x = nullptr;
    g_countdown = c;
    const expseg_status st = expseg_malloc(a, big, 1, &x);
    g_countdown = -1;
    g_fail_host = false;
    if (st == EXPSEG_OK) {
      served = true;
      live.push_back({(char *)x, big, 1, 0, false});
    } else {
      refused++;
      ASSERT_EQ(st, EXPSEG_ERR_HOST_OUT_OF_MEMORY)
          << where << ": " << expseg_status_name(st) << ": " << err();
      EXPECT_EQ(stat_of(a, "num_ooms"), 0) << where << ": host memory is not the device's";
    }
    check_all(a, live, false, false, false, where + ": after");
    if (!served) {
      ASSERT_EQ(expseg_malloc(a, big, 1, &x), EXPSEG_OK) << where << ": " << err();
      live.push_back({(char *)x, big, 1, 0, false});
    }
    check_all(a, live, false, false, false, where + ": served");
    for (const Blk &b : live) ASSERT_EQ(expseg_free(a, b.p), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
    EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0) << where;
    expect_nothing_left(a, where);
    if (HasFailure()) return;
  }
  EXPECT_TRUE(served) << "the countdown ran past every host allocation of the request";
  EXPECT_GT(refused, 0);
  }
#endif
}

}  // namespace

namespace {

// Free memory in a private pool still in use (a MemPool's, or a region's, whose pool is
// never released) cannot serve a general request, and expseg_empty_cache does not reach
// it: the out-of-memory report names expseg_pool_empty_cache, which gives it back at once
// with the pool's live blocks kept, and the same request is then served.
TEST(OomHint, FreeMemoryInALivePoolNamesThePoolsEmptyCache) {
  QuietLog quiet;
  for (const bool region : {false, true}) {
    SCOPED_TRACE(region ? "region" : "private pool");
    AllocPtr p = make_alloc("sim:capacity=1G", "expandable_segments:True");
    expseg_allocator *a = p.get();
    ASSERT_NE(a, nullptr);
    expseg_pool_id pool = 0;
    void *big = nullptr, *keep = nullptr, *r = nullptr;
    if (region) {
      ASSERT_EQ(expseg_region_begin(a, "w"), EXPSEG_OK) << err();
      ASSERT_EQ(expseg_malloc(a, 600 * MiB, 0, &big), EXPSEG_OK) << err();
      ASSERT_EQ(expseg_malloc(a, 2 * MiB, 0, &keep), EXPSEG_OK) << err();
      ASSERT_EQ(expseg_region_end(a, "w"), EXPSEG_OK) << err();
      expseg_region_info info{};
      ASSERT_EQ(expseg_region_get_info(a, "w", &info), EXPSEG_OK) << err();
      pool = info.pool;
    } else {
      ASSERT_EQ(expseg_pool_create(a, &pool), EXPSEG_OK) << err();
      ASSERT_EQ(expseg_malloc_pool(a, 600 * MiB, 0, pool, &big), EXPSEG_OK) << err();
      ASSERT_EQ(expseg_malloc_pool(a, 2 * MiB, 0, pool, &keep), EXPSEG_OK) << err();
    }
    ASSERT_EQ(expseg_free(a, big), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_malloc(a, 500 * MiB, 0, &r), EXPSEG_ERR_OUT_OF_MEMORY);
    const std::string m = err();
    EXPECT_NE(m.find("is free in private pools still in use"), std::string::npos) << m;
    EXPECT_NE(m.find("expseg_pool_empty_cache"), std::string::npos) << m;
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_malloc(a, 500 * MiB, 0, &r), EXPSEG_ERR_OUT_OF_MEMORY)
        << "expseg_empty_cache does not reach a live pool's memory";
    ASSERT_EQ(expseg_pool_empty_cache(a, pool), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_malloc(a, 500 * MiB, 0, &r), EXPSEG_OK) << "the advice served it: " << err();
    EXPECT_EQ(expseg_check(a), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_free(a, r), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_free(a, keep), EXPSEG_OK) << err();
  }
}

}  // namespace

namespace {

// A region holding requests of many chunks (64 MiB ones of their own among them) put to
// sleep, then a wake whose create, map, set_access or copy fails at each position: the wake
// fails with the injected status and leaves the region asleep and intact, the next wake
// restores every byte, and nothing is left with the driver at the end.
TEST(SleepFaults, AWakeFailingInTurnKeepsTheRegionIntact) {
  QuietLog quiet;
  g_stride = 128 * KiB;
  int failed = 0;
  for (const char *kind : {"create", "map", "set_access", "copy"})
    for (int n = 1; n <= 3; n++) {
      const std::string rule = std::string(kind) + "@" + std::to_string(n);
      expseg_allocator *a = nullptr;
      ASSERT_EQ(expseg_create("fault;host:capacity=256M", 0, "expandable_segments:True", &a),
                EXPSEG_OK)
          << err();
      std::vector<Blk> live;
      ASSERT_EQ(expseg_region_begin(a, "r"), EXPSEG_OK) << err();
      uint64_t tag = 5;
      for (size_t size : {40 * MiB + 12345, 3 * MiB + 1, 9 * MiB - 5}) {
        void *x = nullptr;
        ASSERT_EQ(expseg_malloc(a, size, 0, &x), EXPSEG_OK) << err();
        live.push_back({(char *)x, size, ++tag, 0, true});
        put(live.back(), true);
      }
      ASSERT_EQ(expseg_region_end(a, "r"), EXPSEG_OK) << err();
      ASSERT_EQ(expseg_sleep(a, "r", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << err();
      check_all(a, live, true, true, false, rule + ": asleep");
      ASSERT_EQ(expseg_testing_set_faults(a, rule.c_str()), EXPSEG_OK) << err();
      const expseg_status st = expseg_wake(a, "r");
      ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK) << err();
      expseg_region_info info{};
      ASSERT_EQ(expseg_region_get_info(a, "r", &info), EXPSEG_OK) << err();
      if (st != EXPSEG_OK) {
        failed++;
        EXPECT_EQ(st, EXPSEG_ERR_DRIVER) << rule << ": " << err();
        EXPECT_TRUE(info.asleep) << rule;
        check_all(a, live, true, true, false, rule + ": the wake failed");
        ASSERT_EQ(expseg_wake(a, "r"), EXPSEG_OK) << rule << ": " << err();
      }
      check_all(a, live, false, true, true, rule + ": awake");
      for (const Blk &b : live) ASSERT_EQ(expseg_free(a, b.p), EXPSEG_OK) << err();
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
      expect_nothing_left(a, rule);
      if (HasFailure()) return;
    }
  EXPECT_GE(failed, 9) << "wakes failed";
}

}  // namespace
