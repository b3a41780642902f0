// SPDX-License-Identifier: Apache-2.0
// test_alloc_sleep.cpp: tagged regions, sleep and wake (pools/sleep.c). Data is written and
// read back through the driver's data-check hook, so the same tests run on `host` (real
// memory) and, from test_gpu_sleep.cpp, on `cuda` (the CUDA driver double or a real GPU). Every
// allocator is built over a fault wrapper ("fault;DRIVER"): the fault test makes each driver
// call of a sleep and a wake fail in turn, at every position, and checks that the region is
// then either awake or asleep (never between), that its bytes come back bit for bit once
// the faults stop, that expseg_check passes after every step and that nothing is left in
// the driver at the end. The fixture: test_alloc_sleep_common.h; more cycles, the host
// copies' sizes, streams and the copies' order: test_alloc_sleep_cycles.cpp.
#include "test_alloc_sleep_common.h"

namespace {

TEST_P(Sleep, OffloadKeepsAddressesAndBytes) {
  if (a_ == nullptr) return;
  void *general = alloc(2 * MiB);
  fill_region();
  const size_t region_blocks = live_.size() - 1;
  expseg_pool_id pool = 0;
  ASSERT_EQ(expseg_pool_of(a_, live_[1].p, &pool), EXPSEG_OK);
  EXPECT_EQ(info("w").pool, pool);
  EXPECT_NE(pool, 0u);
  // tags never share a segment or a page: a second region's blocks are in other pages
  ASSERT_EQ(expseg_region_begin(a_, "kv"), EXPSEG_OK);
  void *kv = nullptr;
  ASSERT_EQ(expseg_malloc(a_, 1000, 0, &kv), EXPSEG_OK);
  ASSERT_EQ(expseg_region_end(a_, "kv"), EXPSEG_OK);
  for (size_t i = 1; i <= region_blocks; i++) {
    const uintptr_t lo = (uintptr_t)live_[i].p / (2 * MiB), hi = ((uintptr_t)live_[i].p + live_[i].size - 1) / (2 * MiB);
    EXPECT_TRUE((uintptr_t)kv / (2 * MiB) < lo || (uintptr_t)kv / (2 * MiB) > hi) << "kv shares a page";
    const uintptr_t g_lo = (uintptr_t)general / (2 * MiB), g_hi = ((uintptr_t)general + 2 * MiB - 1) / (2 * MiB);
    EXPECT_TRUE(g_hi < lo || g_lo > hi) << "the general cache shares a page with the region";
  }
  const int64_t mapped_before = driver_mapped();
  const int64_t reserved_before = stat_of(a_, "reserved_bytes.all.current");
  const expseg_region_info awake = info("w");
  EXPECT_GE(awake.device_bytes, awake.live_bytes);
  EXPECT_GT(awake.live_bytes, 95 * MiB);

  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  check("asleep");
  const expseg_region_info s = info("w");
  EXPECT_TRUE(s.asleep);
  EXPECT_EQ(s.device_bytes, 0u);
  EXPECT_EQ(s.asleep_bytes, awake.device_bytes);
  EXPECT_GE(s.host_bytes, awake.live_bytes);
  EXPECT_EQ(s.sleeps, 1u);
  EXPECT_EQ(driver_mapped(), mapped_before - (int64_t)awake.device_bytes);
  EXPECT_EQ(stat_of(a_, "reserved_bytes.all.current"), reserved_before - (int64_t)awake.device_bytes);
  // the walk and the snapshot show the sleeping segments, at their addresses
  struct Seen {
    size_t asleep = 0, awake_in_pool = 0;
    expseg_pool_id pool;
  } seen{0, 0, pool};
  ASSERT_EQ(expseg_walk(a_,
                        [](void *ctx, const expseg_walk_segment *sg) {
                          Seen *v = (Seen *)ctx;
                          if (sg->asleep) v->asleep++;
                          if (sg->pool == v->pool && !sg->asleep) v->awake_in_pool++;
                        },
                        nullptr, &seen),
            EXPSEG_OK);
  EXPECT_GT(seen.asleep, 0u);
  EXPECT_EQ(seen.awake_in_pool, 0u);
  unsigned char *snap = nullptr;
  size_t snap_len = 0;
  ASSERT_EQ(expseg_snapshot(a_, &snap, &snap_len), EXPSEG_OK);
  EXPECT_NE(std::string((const char *)snap, snap_len).find("expseg.asleep"), std::string::npos);
  expseg_snapshot_free(snap);
  // the rest of the allocator works on: the general block keeps its bytes, empty_cache
  // leaves the sleeping region alone, a new general allocation is served
  const expseg_region_info before_empty = info("w");
  EXPECT_EQ(expseg_empty_cache(a_), EXPSEG_OK);
  check("empty_cache asleep");
  EXPECT_EQ(info("w").asleep_bytes, s.asleep_bytes);
  EXPECT_EQ(info("w").host_bytes, before_empty.host_bytes); // its host copies stay too
  EXPECT_EQ(info("w").device_bytes, 0u);
  void *other = nullptr;
  ASSERT_EQ(expseg_malloc(a_, 4 * MiB, 0, &other), EXPSEG_OK);
  EXPECT_EQ(expseg_free(a_, other), EXPSEG_OK);
  // allocating into the sleeping region is refused, naming it
  ASSERT_EQ(expseg_region_begin(a_, "w"), EXPSEG_OK);
  void *p = nullptr;
  EXPECT_EQ(expseg_malloc(a_, 1000, 0, &p), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("\"w\" is asleep"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(p, nullptr);
  ASSERT_EQ(expseg_region_end(a_, "w"), EXPSEG_OK);
  // so is an allocation naming its pool
  EXPECT_EQ(expseg_malloc_pool(a_, 1000, 0, pool, &p), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("\"w\" is asleep"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(p, nullptr);
  // sleeping twice is OK and changes nothing
  EXPECT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK);
  EXPECT_EQ(info("w").sleeps, 1u);

  const int64_t mapped_asleep = driver_mapped();
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  check("awake");
  const expseg_region_info w = info("w");
  EXPECT_FALSE(w.asleep);
  EXPECT_EQ(w.device_bytes, awake.device_bytes);
  EXPECT_EQ(w.host_bytes, 0u);
  EXPECT_EQ(w.wakes, 1u);
  EXPECT_EQ(driver_mapped(), mapped_asleep + (int64_t)awake.device_bytes);
  // captured-graph style: the addresses recorded before the sleep hold the same bytes
  expect_data("after wake");
  for (size_t i = 1; i <= region_blocks; i++) {
    expseg_pool_id q = 0;
    EXPECT_EQ(expseg_pool_of(a_, live_[i].p, &q), EXPSEG_OK);
    EXPECT_EQ(q, pool);
  }
  // and the region serves allocations again
  ASSERT_EQ(expseg_region_begin(a_, "w"), EXPSEG_OK);
  alloc(1 * MiB);
  ASSERT_EQ(expseg_region_end(a_, "w"), EXPSEG_OK);
  expect_data("after a new allocation");
  ASSERT_EQ(expseg_snapshot(a_, &snap, &snap_len), EXPSEG_OK);
  EXPECT_EQ(std::string((const char *)snap, snap_len).find("expseg.asleep"), std::string::npos);
  expseg_snapshot_free(snap);
  EXPECT_EQ(expseg_wake(a_, "w"), EXPSEG_OK); // awake already: OK
  EXPECT_EQ(expseg_free(a_, general), EXPSEG_OK);
  EXPECT_EQ(expseg_free(a_, kv), EXPSEG_OK);
  check("end");
}

TEST_P(Sleep, DiscardGivesMemoryBackWithoutCopies) {
  if (a_ == nullptr) return;
  fill_region();
  const expseg_region_info awake = info("w");
  const uint64_t copies = seen(a_, EXPSEG_VMM_CALL_copy), hosts = seen(a_, EXPSEG_VMM_CALL_host_alloc);
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_DISCARD), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(info("w").host_bytes, 0u);
  EXPECT_EQ(info("w").device_bytes, 0u);
  EXPECT_EQ(info("w").asleep_bytes, awake.device_bytes);
  check("asleep");
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_copy), copies) << "a discarding sleep and its wake copy nothing";
  EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_host_alloc), hosts);
  EXPECT_EQ(info("w").last_sleep_copy_us, 0u);
  EXPECT_EQ(info("w").device_bytes, awake.device_bytes);
  for (Live &l : live_) put(l.p, l.data); // usable at the same addresses
  expect_data("rewritten after wake");
  check("awake");
}

// A copy that fails leaves nothing half done: a sleep whose copy out fails leaves the region
// awake with every byte in place; a wake whose copy back fails after other bytes were
// already restored leaves it asleep, its host copies kept and no device memory held, and
// the next wake restores every byte.
TEST_P(Sleep, FailedCopyLeavesNothingHalfRestored) {
  if (a_ == nullptr) return;
  if (!bytes()) GTEST_SKIP() << "sim copies nothing (SimOffloadCountsHostCopiesItNeverMakes)";
  fill_region();
  const expseg_region_info awake = info("w");
  ASSERT_EQ(expseg_testing_set_faults(a_, "copy@2"), EXPSEG_OK);
  EXPECT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_ERR_DRIVER);
  EXPECT_NE(std::string(expseg_last_error()).find("the region is awake, nothing changed"),
            std::string::npos)
      << expseg_last_error();
  ASSERT_EQ(expseg_testing_set_faults(a_, ""), EXPSEG_OK);
  EXPECT_FALSE(info("w").asleep);
  EXPECT_EQ(info("w").device_bytes, awake.device_bytes);
  EXPECT_EQ(info("w").sleeps, 0u);
  check("after a failed copy out");
  expect_data("after a failed copy out");
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  const expseg_region_info asleep = info("w");
  ASSERT_GT(asleep.host_bytes, 0u);
  ASSERT_EQ(expseg_testing_set_faults(a_, "copy@2"), EXPSEG_OK);
  EXPECT_EQ(expseg_wake(a_, "w"), EXPSEG_ERR_DRIVER);
  EXPECT_NE(std::string(expseg_last_error()).find("the region is asleep, its bytes kept"),
            std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(expseg_testing_faults_injected(a_), 2u);
  ASSERT_EQ(expseg_testing_set_faults(a_, ""), EXPSEG_OK);
  const expseg_region_info failed = info("w");
  EXPECT_TRUE(failed.asleep);
  EXPECT_EQ(failed.host_bytes, asleep.host_bytes);
  EXPECT_EQ(failed.device_bytes, 0u);
  EXPECT_EQ(failed.asleep_bytes, asleep.asleep_bytes);
  EXPECT_EQ(failed.wakes, 0u);
  check("after a failed copy back");
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(info("w").wakes, 1u);
  EXPECT_EQ(info("w").device_bytes, awake.device_bytes);
  expect_data("after a failed copy back and a wake");
  check("awake");
}

TEST_P(Sleep, FreeWhileAsleepIsDoneAtWake) {
  if (a_ == nullptr) return;
  fill_region();
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  const int64_t allocated = stat_of(a_, "allocated_bytes.all.current");
  const Live gone = live_[3];
  live_.erase(live_.begin() + 3);
  EXPECT_EQ(expseg_free(a_, gone.p), EXPSEG_OK);
  EXPECT_EQ(expseg_free(a_, gone.p), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("already freed"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(info("w").deferred_frees, 1u);
  EXPECT_EQ(stat_of(a_, "allocated_bytes.all.current"), allocated); // no memory touched
  check("asleep, one free deferred");
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(info("w").deferred_frees, 0u);
  EXPECT_LT(stat_of(a_, "allocated_bytes.all.current"), allocated);
  EXPECT_EQ(expseg_free(a_, gone.p), EXPSEG_ERR_INVALID_ARGUMENT);
  expect_data("after wake");
  check("awake");
}

TEST_P(Sleep, DestroyWhileAsleepLeavesNothing) {
  if (a_ == nullptr) return;
  fill_region();
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  // TearDown destroys it asleep and checks the driver holds nothing
}

TEST_P(Sleep, BadArgumentsNameTheValue) {
  if (a_ == nullptr) return;
  fill_region();
  auto msg = [] { return std::string(expseg_last_error()); };
  EXPECT_EQ(expseg_sleep(a_, "nope", EXPSEG_SLEEP_OFFLOAD), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("no region is tagged \"nope\""), std::string::npos) << msg();
  EXPECT_NE(msg().find("\"w\""), std::string::npos) << msg();
  EXPECT_EQ(expseg_wake(a_, "nope"), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_sleep(a_, "w", (expseg_sleep_mode)7), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("mode 7"), std::string::npos) << msg();
  EXPECT_EQ(expseg_sleep(a_, nullptr, EXPSEG_SLEEP_OFFLOAD), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_region_begin(a_, ""), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("1 to 63 bytes"), std::string::npos) << msg();
  EXPECT_EQ(expseg_region_end(a_, "nope"), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_sleep(nullptr, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_ERR_INVALID_ARGUMENT);
  expseg_region_info i;
  EXPECT_EQ(expseg_region_get_info(a_, "w", nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_region_get_info(a_, "x", &i), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_FALSE(info("w").asleep);
  check("after refusals");
}

TEST_P(Sleep, HostCopiesAreKeptForTheNextOffload) {
  if (a_ == nullptr) return;
  fill_region();
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  const uint64_t host_bytes = info("w").host_bytes;
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  // awake, the host copies stay, counted
  expseg_region_info w = info("w");
  EXPECT_EQ(w.host_bytes, 0u);
  EXPECT_EQ(w.host_kept_bytes, host_bytes);
  EXPECT_EQ(stat_of(a_, "expseg.sleep_host_kept_bytes.current"), (int64_t)host_bytes);
  // the next offload reuses them: no host_alloc, none given back
  const uint64_t alloc0 = seen(a_, EXPSEG_VMM_CALL_host_alloc), free0 = seen(a_, EXPSEG_VMM_CALL_host_free);
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_host_alloc), alloc0);
  EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_host_free), free0);
  EXPECT_EQ(info("w").host_bytes, host_bytes);
  EXPECT_EQ(info("w").host_kept_bytes, 0u);
  EXPECT_EQ(stat_of(a_, "expseg.sleep_host_kept_bytes.current"), 0);
  check("asleep on kept copies");
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  expect_data("after a wake from kept copies");
  // empty_cache gives them back
  ASSERT_EQ(expseg_empty_cache(a_), EXPSEG_OK);
  EXPECT_EQ(info("w").host_kept_bytes, 0u);
  EXPECT_EQ(stat_of(a_, "expseg.sleep_host_kept_bytes.current"), 0);
  EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_host_free) > free0, bytes()); // sim: none was made
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_host_alloc) > alloc0, bytes());
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  expect_data("after a wake from fresh copies");
  // a discarding sleep gives them back too
  EXPECT_GT(info("w").host_kept_bytes, 0u);
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_DISCARD), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(info("w").host_bytes, 0u);
  EXPECT_EQ(info("w").host_kept_bytes, 0u);
  EXPECT_EQ(stat_of(a_, "expseg.sleep_host_kept_bytes.current"), 0);
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  check("end");
}

// A wake takes physical memory from the page cache first: a chunk of the size it needs,
// left there by a general allocation whose map failed, is mapped instead of created (and so
// passes a memory-fraction cap that leaves no room beyond what is held).
TEST_P(Sleep, WakeTakesThePageCacheFirst) {
  if (a_ == nullptr) return;
  if (!expandable())
    GTEST_SKIP() << "the test fills the page cache through a failed growth of an expandable segment";
  ASSERT_EQ(expseg_region_begin(a_, "p"), EXPSEG_OK);
  alloc(16 * MiB); // one chunk of 16 MiB (the large pool's minimum growth: no surplus)
  ASSERT_EQ(expseg_region_end(a_, "p"), EXPSEG_OK);
  ASSERT_EQ(expseg_sleep(a_, "p", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(info("p").asleep_bytes, 16 * MiB);
  // a 16 MiB chunk into the page cache: created, its map refused
  ASSERT_EQ(expseg_testing_set_faults(a_, "map@1"), EXPSEG_OK);
  void *p = nullptr;
  EXPECT_NE(expseg_malloc(a_, 16 * MiB, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_testing_set_faults(a_, ""), EXPSEG_OK);
  ASSERT_EQ(stat_of(a_, "expseg.cached_physical_bytes.current"), (int64_t)(16 * MiB));
  const int64_t hits = stat_of(a_, "expseg.page_cache_hits"), reserved = stat_of(a_, "reserved_bytes.all.current");
  const uint64_t creates = seen(a_, EXPSEG_VMM_CALL_create);
  // a cap with no room beyond what is held: the cached chunk is held already, so the wake,
  // which creates nothing, stays within it
  size_t free_b = 0, total = 0;
  ASSERT_EQ(expseg_mem_get_info(a_, &free_b, &total), EXPSEG_OK);
  ASSERT_EQ(expseg_set_memory_fraction(a_, (double)(reserved + 1 * MiB) / total), EXPSEG_OK);
  ASSERT_EQ(expseg_wake(a_, "p"), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_create), creates);
  EXPECT_EQ(stat_of(a_, "expseg.cached_physical_bytes.current"), 0);
  EXPECT_EQ(stat_of(a_, "expseg.page_cache_hits"), hits + (int64_t)(16 * MiB / alloc_test_page(a_)));
  EXPECT_EQ(stat_of(a_, "reserved_bytes.all.current"), reserved); // moved, not created
  EXPECT_EQ(info("p").device_bytes, 16 * MiB);
  expect_data("after a wake on cached memory");
  check("end");
}

// The memory fraction caps a wake as it caps growth: lowered while the region sleeps below
// what its wake would map, the wake is refused naming the cap, before any driver call, and
// the region stays asleep with its host copies; raised again (still below 1), it wakes.
TEST_P(Sleep, WakeKeepsToTheMemoryFraction) {
  if (a_ == nullptr) return;
  fill_region();
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  const expseg_region_info asleep = info("w");
  ASSERT_GT(asleep.asleep_bytes, 64 * MiB);
  size_t free_b = 0, total = 0;
  ASSERT_EQ(expseg_mem_get_info(a_, &free_b, &total), EXPSEG_OK);
  const double held = (double)stat_of(a_, "reserved_bytes.all.current");
  const uint64_t creates = seen(a_, EXPSEG_VMM_CALL_create), maps = seen(a_, EXPSEG_VMM_CALL_map);
  // room for half of what the wake maps again
  ASSERT_EQ(expseg_set_memory_fraction(a_, (held + asleep.asleep_bytes / 2) / total), EXPSEG_OK);
  EXPECT_EQ(expseg_wake(a_, "w"), EXPSEG_ERR_OUT_OF_MEMORY);
  const std::string m = expseg_last_error();
  EXPECT_NE(m.find("memory fraction cap: waking needs"), std::string::npos) << m;
  EXPECT_NE(m.find("expseg_set_memory_fraction"), std::string::npos) << m;
  EXPECT_NE(m.find("the region is asleep, its bytes kept"), std::string::npos) << m;
  EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_create), creates) << "refused before any driver call";
  EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_map), maps);
  const expseg_region_info refused = info("w");
  EXPECT_TRUE(refused.asleep);
  EXPECT_EQ(refused.device_bytes, 0u);
  EXPECT_EQ(refused.host_bytes, asleep.host_bytes);
  EXPECT_EQ(refused.wakes, 0u);
  EXPECT_EQ(stat_of(a_, "reserved_bytes.all.current"), (int64_t)held);
  check("asleep after a refused wake");
  // room for all of it (and a page more), still capped
  ASSERT_EQ(expseg_set_memory_fraction(a_, (held + asleep.asleep_bytes + 4 * MiB) / total),
            EXPSEG_OK);
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(info("w").wakes, 1u);
  expect_data("after the wake within the raised cap");
  check("awake");
}

TEST_P(Sleep, WakeGrantsAccessOncePerMappedRange) {
  if (a_ == nullptr) return;
  fill_region();
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  struct Count {
    expseg_pool_id pool;
    size_t segs;
  } n{info("w").pool, 0};
  ASSERT_EQ(expseg_walk(a_,
                        [](void *ctx, const expseg_walk_segment *sg) {
                          Count *c = (Count *)ctx;
                          if (sg->pool == c->pool && sg->asleep) c->segs++;
                        },
                        nullptr, &n),
            EXPSEG_OK);
  const uint64_t acc0 = seen(a_, EXPSEG_VMM_CALL_set_access), cr0 = seen(a_, EXPSEG_VMM_CALL_create);
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  const uint64_t acc = seen(a_, EXPSEG_VMM_CALL_set_access) - acc0, cr = seen(a_, EXPSEG_VMM_CALL_create) - cr0;
  // each sleeping segment's chunks are one contiguous range: one set_access each
  EXPECT_GT(n.segs, 0u);
  EXPECT_EQ(acc, n.segs) << cr << " chunks created";
  if (expandable()) {
    EXPECT_GT(cr, acc) << "expected segments of several chunks";
  }
  expect_data("after wake");
  check("awake");
}

TEST_P(Sleep, HistoryAndTimesOfSleepAndWake) {
  if (a_ == nullptr) return;
  ASSERT_EQ(expseg_record_history_ex(a_, true, 10000, 0), EXPSEG_OK);
  fill_region();
  const expseg_region_info awake = info("w");
  EXPECT_EQ(awake.last_sleep_at_us, 0u);
  EXPECT_EQ(awake.last_wake_at_us, 0u);
  auto now_us = [] {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
  };
  const uint64_t t0 = now_us();
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  const uint64_t t1 = now_us();
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  const uint64_t t2 = now_us();
  const expseg_region_info w = info("w");
  EXPECT_GE(w.last_sleep_at_us, t0);
  EXPECT_LE(w.last_sleep_at_us, t1);
  EXPECT_GE(w.last_wake_at_us, t1);
  EXPECT_LE(w.last_wake_at_us, t2);
  // the copy time is part of each, and there is one where there are bytes to copy
  EXPECT_LE(w.last_sleep_copy_us, w.last_sleep_us);
  EXPECT_LE(w.last_wake_copy_us, w.last_wake_us);
  EXPECT_LE(w.last_sleep_us, t1 - t0);
  EXPECT_LE(w.last_wake_us, t2 - t1);
  if (bytes()) {
    EXPECT_GT(w.last_sleep_copy_us, 0u);
    EXPECT_GT(w.last_wake_copy_us, 0u);
  } else {
    EXPECT_EQ(w.last_sleep_copy_us, 0u);
    EXPECT_EQ(w.last_wake_copy_us, 0u);
  }
  // a second sleep and wake of nothing new: no events for the no-op calls
  EXPECT_EQ(expseg_wake(a_, "w"), EXPSEG_OK);
  struct Ev {
    std::vector<std::string> actions;
    std::vector<uint64_t> sizes;
    std::vector<expseg_pool_id> pools;
  } ev;
  ASSERT_EQ(expseg_walk(a_, nullptr,
                        [](void *ctx, const expseg_walk_event *e) {
                          Ev *v = (Ev *)ctx;
                          std::string act = e->action;
                          if (act != "sleep" && act != "wake") return;
                          v->actions.push_back(act);
                          v->sizes.push_back(e->size);
                          v->pools.push_back(e->pool);
                        },
                        &ev),
            EXPSEG_OK);
  ASSERT_EQ(ev.actions, (std::vector<std::string>{"sleep", "wake"}));
  EXPECT_EQ(ev.sizes[0], awake.device_bytes); // the physical memory given back, mapped again
  EXPECT_EQ(ev.sizes[1], awake.device_bytes);
  EXPECT_EQ(ev.pools[0], awake.pool);
  EXPECT_EQ(ev.pools[1], awake.pool);
  // the snapshot names the region in the events' user_metadata
  ASSERT_EQ(expseg_region_begin(a_, "sleep-history-tag"), EXPSEG_OK);
  alloc(3 * MiB);
  ASSERT_EQ(expseg_region_end(a_, "sleep-history-tag"), EXPSEG_OK);
  ASSERT_EQ(expseg_sleep(a_, "sleep-history-tag", EXPSEG_SLEEP_DISCARD), EXPSEG_OK);
  unsigned char *snap = nullptr;
  size_t snap_len = 0;
  ASSERT_EQ(expseg_snapshot(a_, &snap, &snap_len), EXPSEG_OK);
  const std::string text((const char *)snap, snap_len);
  expseg_snapshot_free(snap);
  const size_t at = text.find("\x8c\x05sleep");
  EXPECT_NE(at, std::string::npos);
  EXPECT_NE(text.find("sleep-history-tag", at), std::string::npos);
  ASSERT_EQ(expseg_wake(a_, "sleep-history-tag"), EXPSEG_OK);
  live_.pop_back(); // discarded
  expect_data("end");
}

// The copies are made with the allocator's lock let go: once a sleep has made its host
// copies (a host_alloc seen) and before it is asleep, and once a wake has created memory
// and before it is awake, another thread's calls go through; a sleep or wake of the same
// region meanwhile is refused, saying why.
TEST_P(Sleep, OtherThreadsGoOnDuringTheCopies) {
  if (a_ == nullptr) return;
  if (!bytes()) GTEST_SKIP() << "sim has no bytes to copy";
  // on a real GPU a wake's queued copies may be done before its lock is let go, leaving the
  // other thread no window to be seen in
  EXPSEG_SLEEP_NEEDS_DOUBLE("its copies land only inside the synchronize, which polls, so "
                            "another thread always gets a window during them");
  fill_region();
  void *warm = alloc(1 << 20); // the other thread's blocks come from the cache: no create
  ASSERT_EQ(expseg_free(a_, warm), EXPSEG_OK);
  live_.pop_back();
  const uint64_t h0 = seen(a_, EXPSEG_VMM_CALL_host_alloc), c0 = seen(a_, EXPSEG_VMM_CALL_create);
  std::atomic<bool> stop{false};
  struct Seen {
    bool in_sleep = false, in_wake = false;
    expseg_status wake_in_sleep = EXPSEG_OK, sleep_in_wake = EXPSEG_OK;
    std::string why_sleep, why_wake;
  } v;
  auto wait_for = [&](expseg_vmm_call k, uint64_t from) {
    while (!stop.load() && seen(a_, k) == from) std::this_thread::yield();
  };
  std::thread other([&] {
    void *p = nullptr;
    wait_for(EXPSEG_VMM_CALL_host_alloc, h0); // the sleep is under way
    if (expseg_malloc(a_, 1 << 20, 0, &p) != EXPSEG_OK || expseg_free(a_, p) != EXPSEG_OK) return;
    v.wake_in_sleep = expseg_wake(a_, "w");
    v.why_sleep = expseg_last_error();
    v.in_sleep = !info("w").asleep; // all of that before the sleep ended
    wait_for(EXPSEG_VMM_CALL_create, c0); // the wake is under way
    if (expseg_malloc(a_, 1 << 20, 0, &p) != EXPSEG_OK || expseg_free(a_, p) != EXPSEG_OK) return;
    v.sleep_in_wake = expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD);
    v.why_wake = expseg_last_error();
    v.in_wake = info("w").asleep; // all of that before the wake ended
  });
  const expseg_status s1 = expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD);
  const expseg_status s2 = expseg_wake(a_, "w");
  stop = true;
  other.join();
  ASSERT_EQ(s1, EXPSEG_OK);
  ASSERT_EQ(s2, EXPSEG_OK);
  EXPECT_TRUE(v.in_sleep) << "another thread's malloc waited for the whole sleep";
  EXPECT_TRUE(v.in_wake) << "another thread's malloc waited for the whole wake";
  EXPECT_EQ(v.wake_in_sleep, EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(v.why_sleep.find("in progress on another thread"), std::string::npos) << v.why_sleep;
  EXPECT_EQ(v.sleep_in_wake, EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(v.why_wake.find("in progress on another thread"), std::string::npos) << v.why_wake;
  EXPECT_FALSE(info("w").asleep);
  expect_data("after wake");
  check("end");
}

// ---- every driver call of a sleep and a wake fails in turn ----

const char *const kFaultKinds[] = {"create",     "map",       "set_access",         "unmap", "release",
                                   "host_alloc", "host_free", "stream_synchronize", "copy"};

// Three ways in: an offload whose host copies are made afresh (empty_cache gave the kept
// ones back), an offload on the copies kept from the last one, and a discarding sleep that
// gives the kept copies back.
enum Variant { kFresh, kKept, kDiscard };

// no_sync: stream_synchronize is not failed (on a real GPU). An injected failure leaves the
// copies queued; the library then synchronizes the device before it undoes (tested on the
// double: FailedCopySynchronizeIsFollowedByADeviceSynchronize), but that has not yet run on
// a GPU, where a copy left in flight would land in memory given back.
void FaultAtEveryCallPosition(Sleep *t, expseg_allocator *a, Variant v, bool no_sync, size_t *runs) {
  const expseg_sleep_mode mode = v == kDiscard ? EXPSEG_SLEEP_DISCARD : EXPSEG_SLEEP_OFFLOAD;
  auto prepare = [&] { // the state the variant starts from: kept copies or none
    if (v == kFresh) {
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    } else if (t->info("w").host_kept_bytes == 0) {
      ASSERT_EQ(expseg_sleep(a, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
      ASSERT_EQ(expseg_wake(a, "w"), EXPSEG_OK) << expseg_last_error();
    }
  };
  expseg_vmm_t *drv = alloc_test_driver(a);
  prepare();
  std::vector<uint64_t> before;
  for (int k = 0; k < EXPSEG_VMM_CALL_COUNT; k++) before.push_back(_expseg_fault_seen(drv, (expseg_vmm_call)k));
  ASSERT_EQ(expseg_sleep(a, "w", mode), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_wake(a, "w"), EXPSEG_OK) << expseg_last_error();
  std::vector<uint64_t> calls; // of one clean sleep and wake, by kind
  for (int k = 0; k < EXPSEG_VMM_CALL_COUNT; k++)
    calls.push_back(_expseg_fault_seen(drv, (expseg_vmm_call)k) - before[k]);
  if (v == kDiscard) t->rewrite();
  const std::string kinds_text[] = {"reserve", "unreserve", "create", "release", "map", "unmap", "set_access",
                                    "event_create", "event_destroy", "event_record", "event_query",
                                    "event_synchronize", "stream_synchronize", "export_fd", "import_fd",
                                    "host_alloc", "host_free", "device_synchronize", "copy"};
  const bool bytes = _expseg_vmm_has_bytes(drv); // sim: no host copies, no copies
  EXPECT_EQ(calls[EXPSEG_VMM_CALL_host_alloc] > 0, v == kFresh && bytes) << "host_alloc";
  EXPECT_EQ(calls[EXPSEG_VMM_CALL_host_free] > 0, v == kDiscard && bytes) << "host_free";
  EXPECT_EQ(calls[EXPSEG_VMM_CALL_copy] > 0, v != kDiscard && bytes) << "copy";
  for (const char *kind : kFaultKinds) {
    if (no_sync && std::string(kind) == "stream_synchronize") continue;
    int k = 0;
    while (kinds_text[k] != kind) k++;
    const uint64_t n_calls = calls[k];
    for (uint64_t n = 1; n <= n_calls; n++) {
      for (const char *how : {"", ":oom", ".."}) {
        const std::string rule = std::string(kind) + "@" + std::to_string(n) + how;
        SCOPED_TRACE(rule);
        ++*runs;
        prepare();
        ASSERT_EQ(expseg_testing_set_faults(a, rule.c_str()), EXPSEG_OK) << expseg_last_error();
        const expseg_status s1 = expseg_sleep(a, "w", mode);
        const bool asleep1 = t->info("w").asleep;
        if (s1 == EXPSEG_OK) {
          EXPECT_TRUE(asleep1);
        }
        t->check("after the sleep");
        expseg_status s2 = expseg_wake(a, "w");
        t->check("after the wake");
        if (s2 != EXPSEG_OK) {
          EXPECT_TRUE(t->info("w").asleep) << "a failed wake left it awake";
        }
        ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK);
        // faults off: a region left asleep wakes now, whole
        for (int i = 0; i < 2 && t->info("w").asleep; i++) s2 = expseg_wake(a, "w");
        ASSERT_EQ(s2, EXPSEG_OK) << expseg_last_error();
        EXPECT_FALSE(t->info("w").asleep);
        if (v == kDiscard) t->rewrite();
        t->expect_data("after " + rule);
        t->check("awake again");
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

TEST_P(Sleep, FaultAtEveryCallPosition) {
  if (a_ == nullptr) return;
  fill_region(false);
  size_t runs = 0;
  for (Variant v : {kFresh, kKept, kDiscard}) {
    SCOPED_TRACE(v == kFresh ? "fresh host copies" : v == kKept ? "kept host copies" : "discard");
    FaultAtEveryCallPosition(this, a_, v, real_gpu(), &runs);
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(runs, 60u);
  EXPECT_GT(expseg_testing_faults_injected(a_), 0u);
}

EXPSEG_SLEEP_INSTANTIATE();

} // namespace
