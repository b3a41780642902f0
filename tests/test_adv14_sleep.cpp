// SPDX-License-Identifier: Apache-2.0
// test_adv14_sleep.cpp: sleep and wake (pools/sleep.c) attacked from outside, against the
// header's and docs/api.md's promises. A seeded random program mixes several regions (tags
// with odd but accepted characters), private pools, the general cache, streams and
// record_stream with sleeps (both modes), wakes and frees while asleep; after every step no
// two live blocks overlap (nothing is handed out over a sleeping block), the checker passes,
// and every block of an awake region holds its bytes (those of a discarded one rewritten).
// Targeted cases: every allocator call made while a region sleeps, with the statistics of
// docs/api.md ("While a region sleeps"); tag edge cases and no-op sleeps and wakes; a block
// whose free is pending on a stream that cannot finish; a failure at every driver call of a
// sleep retried by a second sleep, and at every call of a wake with frees deferred to it; a
// wake on a device, or under a memory-fraction cap, filled by the general cache's free
// memory (given back for the wake, as for a malloc). The fixture: test_alloc_sleep_common.h.
#include "test_alloc_sleep_common.h"

#include <map>

namespace {

struct Blk {
  void *p;
  size_t size;
  std::string region; // "" : the general cache or a private pool
  std::vector<unsigned char> data;
  bool known; // data holds its bytes (false: discarded and not yet rewritten)
};

bool overlaps(const Blk &x, const Blk &y) {
  const uintptr_t a = (uintptr_t)x.p, b = (uintptr_t)y.p;
  return a < b + y.size && b < a + x.size;
}

// Random program: regions, private pools, the general cache, three streams; sleeps, wakes,
// frees (also while asleep), record_stream. Seeded (printed).
TEST_P(Sleep, Adv14RandomProgramKeepsPointersAndBytes) {
  if (a_ == nullptr) return;
  EXPSEG_SEEDED(seed, 1401);
  TestRng rng(seed);
  const std::vector<std::string> tags = {"w", "kv cache #1", "a\"b\\c/{}[]~", std::string(63, 'z')};
  std::map<std::string, bool> asleep;
  std::map<std::string, bool> discarded; // the current sleep is a discard
  for (const auto &t : tags) {
    ASSERT_EQ(expseg_region_begin(a_, t.c_str()), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_region_end(a_, t.c_str()), EXPSEG_OK);
    asleep[t] = false;
  }
  expseg_pool_id priv = 0;
  ASSERT_EQ(expseg_pool_create(a_, &priv), EXPSEG_OK);
  const expseg_stream streams[] = {0, 7, 9};
  std::vector<Blk> blk;
  auto rand_size = [&]() -> size_t {
    switch (rng.next() % 4) {
    case 0: return 1 + rng.next() % 4096;
    case 1: return 1 + rng.next() % (1 * MiB);
    case 2: return 1 * MiB + rng.next() % (8 * MiB);
    default: return 8 * MiB + rng.next() % (16 * MiB);
    }
  };
  auto bytes_live = [&] {
    size_t n = 0;
    for (const Blk &b : blk) n += b.size;
    return n;
  };
  auto verify = [&](const std::string &where) {
    check(where);
    if (::testing::Test::HasFailure()) return;
    for (size_t i = 0; i < blk.size(); i++)
      for (size_t j = i + 1; j < blk.size(); j++)
        ASSERT_FALSE(overlaps(blk[i], blk[j]))
            << where << ": " << blk[i].p << " (" << blk[i].size << ", region '" << blk[i].region
            << "') overlaps " << blk[j].p << " (" << blk[j].size << ", region '" << blk[j].region << "')";
    if (!bytes()) return;
    for (const Blk &b : blk) {
      if (!b.known || (!b.region.empty() && asleep[b.region])) continue;
      ASSERT_TRUE(get(b.p, b.size) == b.data)
          << where << ": bytes at " << b.p << " (" << b.size << ", region '" << b.region << "') changed";
    }
  };
  const int steps = 300;
  for (int step = 0; step < steps; step++) {
    const std::string where = "step " + std::to_string(step);
    SCOPED_TRACE(where);
    const unsigned op = rng.next() % 100;
    const std::string &tag = tags[rng.next() % tags.size()];
    const expseg_stream s = streams[rng.next() % 3];
    if (op < 40) { // allocate: a region, the private pool or the general cache
      if (bytes_live() > 160 * MiB) continue;
      const size_t n = rand_size();
      const unsigned where_to = rng.next() % 3;
      void *p = nullptr;
      expseg_status st;
      if (where_to == 0) {
        ASSERT_EQ(expseg_region_begin(a_, tag.c_str()), EXPSEG_OK);
        st = expseg_malloc(a_, n, s, &p);
        ASSERT_EQ(expseg_region_end(a_, tag.c_str()), EXPSEG_OK);
        if (asleep[tag]) {
          EXPECT_EQ(st, EXPSEG_ERR_INVALID_ARGUMENT) << "allocated in a sleeping region";
          EXPECT_NE(std::string(expseg_last_error()).find("is asleep"), std::string::npos)
              << expseg_last_error();
          EXPECT_EQ(p, nullptr);
          continue;
        }
      } else if (where_to == 1) {
        st = expseg_malloc_pool(a_, n, s, priv, &p);
      } else {
        st = expseg_malloc(a_, n, s, &p);
      }
      ASSERT_EQ(st, EXPSEG_OK) << expseg_last_error();
      Blk b{p, n, where_to == 0 ? tag : "", std::vector<unsigned char>(n), true};
      for (auto &c : b.data) c = (unsigned char)rng.next();
      put(p, b.data);
      blk.push_back(std::move(b));
    } else if (op < 60) { // free (deferred while its region sleeps)
      if (blk.empty()) continue;
      const size_t i = rng.next() % blk.size();
      ASSERT_EQ(expseg_free(a_, blk[i].p), EXPSEG_OK) << expseg_last_error();
      if (!blk[i].region.empty() && asleep[blk[i].region]) {
        EXPECT_EQ(expseg_free(a_, blk[i].p), EXPSEG_ERR_INVALID_ARGUMENT) << "freed twice";
      }
      blk.erase(blk.begin() + (long)i);
    } else if (op < 70) { // record_stream (accepted asleep too)
      if (blk.empty()) continue;
      const size_t i = rng.next() % blk.size();
      ASSERT_EQ(expseg_record_stream(a_, blk[i].p, streams[rng.next() % 3]), EXPSEG_OK)
          << expseg_last_error();
    } else if (op < 82) { // sleep
      const bool discard = rng.next() % 3 == 0;
      ASSERT_EQ(expseg_sleep(a_, tag.c_str(), discard ? EXPSEG_SLEEP_DISCARD : EXPSEG_SLEEP_OFFLOAD),
                EXPSEG_OK)
          << expseg_last_error();
      if (!asleep[tag]) discarded[tag] = discard; // sleeping twice keeps the first mode
      asleep[tag] = true;
      const expseg_region_info i = info(tag.c_str());
      EXPECT_TRUE(i.asleep);
      EXPECT_EQ(i.device_bytes, 0u);
    } else if (op < 96) { // wake
      ASSERT_EQ(expseg_wake(a_, tag.c_str()), EXPSEG_OK) << expseg_last_error();
      if (asleep[tag] && discarded[tag])
        for (Blk &b : blk)
          if (b.region == tag) {
            put(b.p, b.data); // contents undefined after a discard: written again
            b.known = true;
          }
      asleep[tag] = false;
      EXPECT_FALSE(info(tag.c_str()).asleep);
    } else { // give back what is cached
      ASSERT_EQ(expseg_empty_cache(a_), EXPSEG_OK) << expseg_last_error();
    }
    verify(where);
    if (::testing::Test::HasFailure()) return;
  }
  for (const auto &t : tags) {
    ASSERT_EQ(expseg_wake(a_, t.c_str()), EXPSEG_OK) << expseg_last_error();
    if (asleep[t] && discarded[t])
      for (Blk &b : blk)
        if (b.region == t) put(b.p, b.data);
    asleep[t] = false;
  }
  verify("all awake");
  for (const Blk &b : blk) EXPECT_EQ(expseg_free(a_, b.p), EXPSEG_OK);
  EXPECT_EQ(expseg_pool_release(a_, priv), EXPSEG_OK);
  EXPECT_EQ(stat_of(a_, "allocated_bytes.all.current"), 0);
  check("end");
}

// The segments of pool `pool` (address ranges), and whether they are asleep.
struct SegRange {
  uintptr_t lo, hi;
  bool asleep;
};
std::vector<SegRange> segs_of(expseg_allocator *a, expseg_pool_id pool) {
  struct Ctx {
    expseg_pool_id pool;
    std::vector<SegRange> out;
  } c{pool, {}};
  EXPECT_EQ(expseg_walk(a,
                        [](void *ctx, const expseg_walk_segment *sg) {
                          Ctx *v = (Ctx *)ctx;
                          if (sg->pool == v->pool)
                            v->out.push_back({(uintptr_t)sg->address,
                                              (uintptr_t)(sg->address + sg->total_size), sg->asleep});
                        },
                        nullptr, &c),
            EXPSEG_OK);
  return c.out;
}

// Every call of the allocator made while a region sleeps does what docs/api.md says, and
// nothing is handed out inside the sleeping segments' addresses.
TEST_P(Sleep, Adv14EveryCallWhileAsleep) {
  if (a_ == nullptr) return;
  fill_region();
  const expseg_pool_id pool = info("w").pool;
  const std::string pp = "reserved_bytes_by_private_pools.0_" + std::to_string(pool) + ".all.current";
  const expseg_region_info awake = info("w");
  const int64_t alloc0 = stat_of(a_, "allocated_bytes.all.current"),
                active0 = stat_of(a_, "active_bytes.all.current"),
                segs0 = stat_of(a_, "segment.all.current"),
                res0 = stat_of(a_, "reserved_bytes.all.current"), pres0 = stat_of(a_, pp),
                map0 = stat_of(a_, "expseg.mapped_bytes.current");
  size_t free0 = 0, total = 0;
  ASSERT_EQ(expseg_mem_get_info(a_, &free0, &total), EXPSEG_OK);
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  const uint64_t gone = info("w").asleep_bytes;
  ASSERT_EQ(gone, awake.device_bytes);
  // statistics: reserved and mapped drop by what was given back, allocated / active /
  // segments do not change
  EXPECT_EQ(stat_of(a_, "allocated_bytes.all.current"), alloc0);
  EXPECT_EQ(stat_of(a_, "active_bytes.all.current"), active0);
  EXPECT_EQ(stat_of(a_, "segment.all.current"), segs0);
  EXPECT_EQ(stat_of(a_, "reserved_bytes.all.current"), res0 - (int64_t)gone);
  EXPECT_EQ(stat_of(a_, pp), pres0 - (int64_t)gone);
  if (expandable()) { // expandable segments' mapped bytes only (docs/stats.md)
    EXPECT_EQ(stat_of(a_, "expseg.mapped_bytes.current"), map0 - (int64_t)gone);
  }
  size_t free1 = 0;
  ASSERT_EQ(expseg_mem_get_info(a_, &free1, &total), EXPSEG_OK);
  EXPECT_EQ(free1, free0 + gone) << "the device's free memory grows by what the sleep gave back";
  const std::vector<SegRange> sleeping = segs_of(a_, pool);
  ASSERT_FALSE(sleeping.empty());
  for (const SegRange &r : sleeping) EXPECT_TRUE(r.asleep);
  auto outside = [&](void *p, size_t n, const std::string &what) {
    for (const SegRange &r : sleeping)
      EXPECT_TRUE((uintptr_t)p + n <= r.lo || (uintptr_t)p >= r.hi)
          << what << ": " << p << " is inside a sleeping segment";
  };
  // the general cache and a private pool are served, outside the sleeping addresses, even
  // with the cache emptied, the fraction lowered and raised, and the peaks reset
  EXPECT_EQ(expseg_empty_cache(a_), EXPSEG_OK);
  EXPECT_EQ(expseg_pool_empty_cache(a_, pool), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(info("w").asleep_bytes, gone);
  EXPECT_EQ(info("w").host_bytes > 0, true);
  expseg_reset_peak_stats(a_);
  EXPECT_EQ(stat_of(a_, "reserved_bytes.all.peak"), res0 - (int64_t)gone);
  ASSERT_EQ(expseg_set_memory_fraction(a_, 0.5), EXPSEG_OK);
  expseg_pool_id priv = 0;
  ASSERT_EQ(expseg_pool_create(a_, &priv), EXPSEG_OK);
  std::vector<void *> others;
  for (size_t n : {size_t{512}, 2 * MiB, 40 * MiB, 100 * MiB}) {
    void *p = nullptr;
    ASSERT_EQ(expseg_malloc(a_, n, 0, &p), EXPSEG_OK) << expseg_last_error();
    outside(p, n, "general " + std::to_string(n));
    others.push_back(p);
    ASSERT_EQ(expseg_malloc_pool(a_, n, 9, priv, &p), EXPSEG_OK) << expseg_last_error();
    outside(p, n, "private " + std::to_string(n));
    others.push_back(p);
  }
  check("asleep, others allocated");
  EXPECT_EQ(segs_of(a_, pool).size(), sleeping.size()) << "the sleeping region's segments changed";
  // the region's pool cannot be released; allocating in it is refused
  EXPECT_EQ(expseg_pool_release(a_, pool), EXPSEG_ERR_INVALID_ARGUMENT);
  void *p = nullptr;
  EXPECT_EQ(expseg_malloc_pool(a_, 64, 0, pool, &p), EXPSEG_ERR_INVALID_ARGUMENT);
  // record_stream on a sleeping block is accepted; freeing it is deferred
  EXPECT_EQ(expseg_record_stream(a_, live_[1].p, 9), EXPSEG_OK) << expseg_last_error();
  const Live gone_blk = live_[2];
  live_.erase(live_.begin() + 2);
  EXPECT_EQ(expseg_free(a_, gone_blk.p), EXPSEG_OK);
  // snapshot and the stats work
  unsigned char *snap = nullptr;
  size_t snap_len = 0;
  ASSERT_EQ(expseg_snapshot(a_, &snap, &snap_len), EXPSEG_OK);
  expseg_snapshot_free(snap);
  // give the others back: the sleeping region is left as it was
  for (void *q : others) ASSERT_EQ(expseg_free(a_, q), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a_), EXPSEG_OK);
  EXPECT_EQ(expseg_pool_release(a_, priv), EXPSEG_OK);
  EXPECT_EQ(stat_of(a_, "reserved_bytes.all.current"), res0 - (int64_t)gone);
  EXPECT_EQ(stat_of(a_, "allocated_bytes.all.current"), alloc0) << "the deferred free is not done yet";
  ASSERT_EQ(expseg_set_memory_fraction(a_, 1.0), EXPSEG_OK);
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(stat_of(a_, "allocated_bytes.all.current"), alloc0 - (int64_t)gone_blk.size);
  EXPECT_GE(stat_of(a_, "reserved_bytes.all.peak"), stat_of(a_, "reserved_bytes.all.current"));
  expect_data("after wake");
  check("end");
}

// Tags: every printable ASCII character is accepted (63 bytes at most); waking what never
// slept, sleeping an empty region, sleeping and waking twice are OK; bad tags are refused.
TEST_P(Sleep, Adv14TagsAndNoOps) {
  if (a_ == nullptr) return;
  std::string all;
  for (char c = 0x20; c < 0x7f; c++) all += c;
  for (const std::string &t : {all.substr(0, 63), all.substr(63), std::string(" "), std::string("%s%n")}) {
    SCOPED_TRACE(t);
    ASSERT_EQ(expseg_region_begin(a_, t.c_str()), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_region_end(a_, t.c_str()), EXPSEG_OK);
    EXPECT_EQ(expseg_wake(a_, t.c_str()), EXPSEG_OK) << "waking what never slept";
    EXPECT_EQ(expseg_sleep(a_, t.c_str(), EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
    EXPECT_TRUE(info(t.c_str()).asleep);
    EXPECT_EQ(info(t.c_str()).asleep_bytes, 0u);
    EXPECT_EQ(expseg_sleep(a_, t.c_str(), EXPSEG_SLEEP_DISCARD), EXPSEG_OK);
    EXPECT_EQ(expseg_wake(a_, t.c_str()), EXPSEG_OK) << expseg_last_error();
    EXPECT_EQ(expseg_wake(a_, t.c_str()), EXPSEG_OK);
    EXPECT_EQ(info(t.c_str()).sleeps, 1u);
    EXPECT_EQ(info(t.c_str()).wakes, 1u);
  }
  for (const std::string &t : {std::string(64, 'x'), std::string("tab\there"), std::string("\x7f"),
                               std::string("caf\xc3\xa9"), std::string("nl\n")}) {
    SCOPED_TRACE(t);
    EXPECT_EQ(expseg_region_begin(a_, t.c_str()), EXPSEG_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(expseg_sleep(a_, t.c_str(), EXPSEG_SLEEP_OFFLOAD), EXPSEG_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(expseg_wake(a_, t.c_str()), EXPSEG_ERR_INVALID_ARGUMENT);
  }
  // a region emptied before its sleep gives its cached memory back and holds nothing
  ASSERT_EQ(expseg_region_begin(a_, "emptied"), EXPSEG_OK);
  void *p = nullptr;
  ASSERT_EQ(expseg_malloc(a_, 30 * MiB, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_region_end(a_, "emptied"), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a_, p), EXPSEG_OK);
  ASSERT_EQ(expseg_sleep(a_, "emptied", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(info("emptied").device_bytes, 0u);
  EXPECT_EQ(info("emptied").host_bytes, 0u);
  ASSERT_EQ(expseg_wake(a_, "emptied"), EXPSEG_OK) << expseg_last_error();
  // a discarding first sleep stays one when slept again in offload mode: no host copies
  fill_region(false);
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_DISCARD), EXPSEG_OK);
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK);
  EXPECT_EQ(info("w").host_bytes, 0u) << "the mode of the first sleep stays";
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK);
  rewrite();
  expect_data("rewritten");
  check("end");
}

// A block of the region freed while its stream's work cannot finish is pending, its memory
// still in use: a sleep must not copy or unmap it. It is refused, the region awake.
TEST_P(Sleep, Adv14PendingFreeOnABusyStreamIsWaitedFor) {
  if (a_ == nullptr) return;
  if (driver() == "cuda") GTEST_SKIP() << "a held stream on cuda is waited for, not refused";
  fill_region(false);
  ASSERT_EQ(expseg_region_begin(a_, "w"), EXPSEG_OK);
  void *p = alloc(3 * MiB, 0);
  ASSERT_EQ(expseg_region_end(a_, "w"), EXPSEG_OK);
  live_.pop_back();
  ASSERT_EQ(expseg_record_stream(a_, p, 11), EXPSEG_OK);
  ASSERT_EQ(expseg_testing_hold_stream(a_, 11, true), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a_, p), EXPSEG_OK);
  ASSERT_GT(stat_of(a_, "expseg.pending_free_blocks.current"), 0);
  const int64_t mapped = driver_mapped();
  EXPECT_NE(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << "slept over work in flight";
  EXPECT_NE(std::string(expseg_last_error()).find("the region is awake, nothing changed"),
            std::string::npos)
      << expseg_last_error();
  EXPECT_FALSE(info("w").asleep);
  EXPECT_EQ(driver_mapped(), mapped) << "memory in use was given back";
  check("refused");
  ASSERT_EQ(expseg_testing_hold_stream(a_, 11, false), EXPSEG_OK);
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(stat_of(a_, "expseg.pending_free_blocks.current"), 0);
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  expect_data("after wake");
  check("end");
}

const char *const kSleepKinds[] = {"unmap", "release", "host_alloc", "host_free", "copy",
                                   "stream_synchronize", "event_synchronize"};
const char *const kWakeKinds[] = {"create", "map", "set_access", "copy", "stream_synchronize"};

// Calls of `kind` made by f (faults off).
template <class F> uint64_t calls_of(expseg_allocator *a, const char *kind, F f) {
  static const std::map<std::string, expseg_vmm_call> k = {
      {"create", EXPSEG_VMM_CALL_create},     {"map", EXPSEG_VMM_CALL_map},
      {"set_access", EXPSEG_VMM_CALL_set_access}, {"unmap", EXPSEG_VMM_CALL_unmap},
      {"release", EXPSEG_VMM_CALL_release},   {"host_alloc", EXPSEG_VMM_CALL_host_alloc},
      {"host_free", EXPSEG_VMM_CALL_host_free}, {"copy", EXPSEG_VMM_CALL_copy},
      {"stream_synchronize", EXPSEG_VMM_CALL_stream_synchronize},
      {"event_synchronize", EXPSEG_VMM_CALL_event_synchronize}};
  const uint64_t c0 = seen(a, k.at(kind));
  f();
  return seen(a, k.at(kind)) - c0;
}

// A sleep failing at every driver call: then a second sleep (the header's retry) completes,
// holding no device memory, and the wake restores every byte; a discard and the kept host
// copies (second round) too.
TEST_P(Sleep, Adv14FailedSleepIsRetriedBySleepingAgain) {
  if (a_ == nullptr) return;
  fill_region(false);
  const uint64_t dev = info("w").device_bytes;
  size_t runs = 0;
  for (expseg_sleep_mode mode : {EXPSEG_SLEEP_OFFLOAD, EXPSEG_SLEEP_DISCARD})
    for (const char *kind : kSleepKinds) {
      const uint64_t n_calls = calls_of(a_, kind, [&] {
        ASSERT_EQ(expseg_sleep(a_, "w", mode), EXPSEG_OK);
        ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK);
      });
      if (mode == EXPSEG_SLEEP_DISCARD) rewrite();
      for (uint64_t n = 1; n <= n_calls; n++) {
        const std::string rule = std::string(kind) + "@" + std::to_string(n);
        SCOPED_TRACE(rule + (mode ? " discard" : " offload"));
        ASSERT_EQ(expseg_testing_set_faults(a_, rule.c_str()), EXPSEG_OK);
        const expseg_status s1 = expseg_sleep(a_, "w", mode);
        ASSERT_EQ(expseg_testing_set_faults(a_, ""), EXPSEG_OK);
        runs++;
        check("after the failed sleep");
        if (s1 != EXPSEG_OK) {
          EXPECT_NE(std::string(expseg_last_error()).find("the region is"), std::string::npos)
              << expseg_last_error();
        }
        // retry by sleeping again
        ASSERT_EQ(expseg_sleep(a_, "w", mode), EXPSEG_OK) << expseg_last_error();
        EXPECT_TRUE(info("w").asleep);
        EXPECT_EQ(info("w").device_bytes, 0u) << "the retried sleep left memory held";
        EXPECT_EQ(info("w").asleep_bytes, dev);
        check("asleep after the retry");
        ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
        EXPECT_EQ(info("w").device_bytes, dev);
        if (mode == EXPSEG_SLEEP_DISCARD) rewrite();
        expect_data("after " + rule);
        if (::testing::Test::HasFailure()) return;
      }
    }
  EXPECT_GT(runs, 5u);
}

// A wake failing at every driver call while frees made asleep wait for it: the region stays
// asleep with the frees still deferred (the blocks allocated in every statistic), the next
// wake does each free once and restores the rest.
TEST_P(Sleep, Adv14FailedWakeKeepsDeferredFrees) {
  if (a_ == nullptr) return;
  fill_region(false);
  size_t runs = 0;
  for (const char *kind : kWakeKinds) {
    uint64_t n_calls = 0;
    ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK);
    n_calls = calls_of(a_, kind, [&] { ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK); });
    for (uint64_t n = 1; n <= n_calls; n++) {
      const std::string rule = std::string(kind) + "@" + std::to_string(n);
      SCOPED_TRACE(rule);
      // a block to free while asleep
      ASSERT_EQ(expseg_region_begin(a_, "w"), EXPSEG_OK);
      void *extra = alloc(200 * KiB, other_);
      ASSERT_EQ(expseg_region_end(a_, "w"), EXPSEG_OK);
      live_.pop_back();
      ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
      ASSERT_EQ(expseg_free(a_, extra), EXPSEG_OK);
      const int64_t allocated = stat_of(a_, "allocated_bytes.all.current");
      ASSERT_EQ(expseg_testing_set_faults(a_, rule.c_str()), EXPSEG_OK);
      const expseg_status s = expseg_wake(a_, "w");
      ASSERT_EQ(expseg_testing_set_faults(a_, ""), EXPSEG_OK);
      runs++;
      check("after the failed wake");
      if (s != EXPSEG_OK) {
        EXPECT_TRUE(info("w").asleep);
        EXPECT_EQ(info("w").deferred_frees, 1u);
        EXPECT_EQ(info("w").device_bytes, 0u);
        EXPECT_EQ(stat_of(a_, "allocated_bytes.all.current"), allocated);
        EXPECT_EQ(expseg_free(a_, extra), EXPSEG_ERR_INVALID_ARGUMENT) << "freed twice";
        ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
      }
      EXPECT_EQ(info("w").deferred_frees, 0u);
      EXPECT_EQ(stat_of(a_, "allocated_bytes.all.current"), allocated - (int64_t)(200 * KiB));
      EXPECT_EQ(expseg_free(a_, extra), EXPSEG_ERR_INVALID_ARGUMENT) << "freed twice";
      expect_data("after " + rule);
      if (::testing::Test::HasFailure()) return;
    }
  }
  EXPECT_GT(runs, 3u);
}

// A wake on a full device while the general cache holds free memory: as a malloc would, the
// wake gives that cached memory back and creates again, instead of failing with the
// allocator's own cache in the way. A block freed while asleep may still be recorded on a
// stream (accepted, docs/api.md).
TEST_P(Sleep, Adv14WakeOnAFullDeviceGivesTheCacheBack) {
  if (a_ == nullptr) return;
  fill_region();
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  const Live g = live_[1];
  live_.erase(live_.begin() + 1);
  ASSERT_EQ(expseg_free(a_, g.p), EXPSEG_OK);
  EXPECT_EQ(expseg_record_stream(a_, g.p, 9), EXPSEG_OK) << expseg_last_error();
  std::vector<void *> v; // the device filled by the general cache, then all freed (cached)
  for (;;) {
    void *p = nullptr;
    if (expseg_malloc(a_, 50 * MiB, 0, &p) != EXPSEG_OK) break;
    v.push_back(p);
  }
  ASSERT_GT(v.size(), 10u);
  for (void *p : v) ASSERT_EQ(expseg_free(a_, p), EXPSEG_OK);
  check("asleep, device full of cached memory");
  const int64_t reserved = stat_of(a_, "reserved_bytes.all.current");
  const uint64_t need = info("w").asleep_bytes;
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  EXPECT_FALSE(info("w").asleep);
  EXPECT_EQ(info("w").deferred_frees, 0u);
  EXPECT_LT(stat_of(a_, "reserved_bytes.all.current"), reserved + (int64_t)need)
      << "cached memory was given back for the wake";
  expect_data("after a wake on a full device");
  check("end");
}

// The same under the memory-fraction cap: the general cache's free memory fills the room
// up to the cap while the region sleeps; a malloc there would give it back and be served,
// and so is the wake, keeping to the cap.
TEST_P(Sleep, Adv14WakeUnderTheCapGivesTheCacheBack) {
  if (a_ == nullptr) return;
  fill_region();
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  std::vector<void *> v;
  for (int i = 0; i < 10; i++) {
    void *p = nullptr;
    ASSERT_EQ(expseg_malloc(a_, 50 * MiB, 0, &p), EXPSEG_OK) << expseg_last_error();
    v.push_back(p);
  }
  for (void *p : v) ASSERT_EQ(expseg_free(a_, p), EXPSEG_OK);
  size_t free_b = 0, total = 0;
  ASSERT_EQ(expseg_mem_get_info(a_, &free_b, &total), EXPSEG_OK);
  const double held = (double)stat_of(a_, "reserved_bytes.all.current");
  const double allowed = held + 4 * MiB;
  ASSERT_LT(info("w").asleep_bytes + 4 * MiB, 500 * MiB); // the cache freed holds more
  ASSERT_EQ(expseg_set_memory_fraction(a_, allowed / total), EXPSEG_OK);
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  EXPECT_LE((double)stat_of(a_, "reserved_bytes.all.current"), allowed);
  expect_data("after a wake under the cap");
  check("end");
}

EXPSEG_SLEEP_INSTANTIATE();

} // namespace
