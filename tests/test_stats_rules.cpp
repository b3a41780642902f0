// SPDX-License-Identifier: Apache-2.0
// test_stats_rules.cpp: PyTorch's statistic update rules (reference/pytorch-allocator.md §4.3),
// case by case, and expseg's documented differences (docs/stats.md): rounding, splits and
// inactive_split (classic only, net change after merges), pending frees, oversize, retries,
// OOMs, syncs, device alloc/free counts, segments of expandable memory, reserved bytes with
// the page cache and page moves, resets, the key table.
#include "alloc_support.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

void *must_malloc(expseg_allocator *a, size_t size, expseg_stream s) {
  void *p = nullptr;
  EXPECT_EQ(expseg_malloc(a, size, s, &p), EXPSEG_OK) << size << ": " << expseg_last_error();
  EXPECT_NE(p, nullptr);
  return p;
}

void must_free(expseg_allocator *a, void *p) {
  EXPECT_EQ(expseg_free(a, p), EXPSEG_OK) << expseg_last_error();
}

TEST(StatsRules, RoundingAllocatedCountsRoundedRequestedCountsRequest) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  void *p = must_malloc(a.get(), 1000, 1);
  EXPECT_EQ(stat_of(a.get(), "allocation.all.current"), 1);
  EXPECT_EQ(stat_of(a.get(), "allocation.small_pool.current"), 1);
  EXPECT_EQ(stat_of(a.get(), "allocation.large_pool.current"), 0);
  EXPECT_EQ(stat_of(a.get(), "allocated_bytes.small_pool.current"), 1024);
  EXPECT_EQ(stat_of(a.get(), "requested_bytes.small_pool.current"), 1000);
  EXPECT_EQ(stat_of(a.get(), "active_bytes.small_pool.current"), 1024);
  // a small-pool segment maps at least 4 MiB (policy/round.c: _expseg_grow_for)
  EXPECT_EQ(stat_of(a.get(), "reserved_bytes.small_pool.current"), (int64_t)(4 * MiB));
  void *q = must_malloc(a.get(), 3 * MiB + 1, 1);  // rounded to 3 MiB + 512, two pages
  EXPECT_EQ(stat_of(a.get(), "allocated_bytes.large_pool.current"), (int64_t)(3 * MiB + 512));
  EXPECT_EQ(stat_of(a.get(), "requested_bytes.large_pool.current"), (int64_t)(3 * MiB + 1));
  EXPECT_EQ(stat_of(a.get(), "allocated_bytes.all.current"), (int64_t)(3 * MiB + 512 + 1024));
  EXPECT_EQ(stat_of(a.get(), "reserved_bytes.large_pool.current"), (int64_t)(4 * MiB));
  expect_consistent(a.get(), "after two mallocs");
  must_free(a.get(), p);
  must_free(a.get(), q);
  EXPECT_EQ(stat_of(a.get(), "allocated_bytes.all.current"), 0);
  EXPECT_EQ(stat_of(a.get(), "requested_bytes.all.current"), 0);
  EXPECT_EQ(stat_of(a.get(), "requested_bytes.all.allocated"), (int64_t)(3 * MiB + 1 + 1000));
  EXPECT_EQ(stat_of(a.get(), "requested_bytes.all.freed"), (int64_t)(3 * MiB + 1 + 1000));
  EXPECT_EQ(stat_of(a.get(), "allocated_bytes.all.peak"), (int64_t)(3 * MiB + 512 + 1024));
  EXPECT_EQ(stat_of(a.get(), "reserved_bytes.all.current"), (int64_t)(8 * MiB));  // cached
  expect_consistent(a.get(), "after frees");
}

TEST(StatsRules, RoundupPower2Divisions) {
  AllocPtr a = make_alloc("sim:capacity=8G", "roundup_power2_divisions:4");
  void *p = must_malloc(a.get(), 9000, 0);  // reference §2.3: 9000 B with 4 divisions -> 10240
  EXPECT_EQ(stat_of(a.get(), "allocated_bytes.all.current"), 10240);
  void *q = must_malloc(a.get(), 1200, 0);  // 1200 <= 512 x 4: plain rounding -> 1536
  EXPECT_EQ(stat_of(a.get(), "allocated_bytes.all.current"), 10240 + 1536);
  void *r = must_malloc(a.get(), GiB + GiB / 5, 0);  // 1.2 GiB -> 1.25 GiB
  EXPECT_EQ(stat_of(a.get(), "allocated_bytes.large_pool.current"), (int64_t)(GiB + GiB / 4));
  expect_consistent(a.get(), "divisions");
  must_free(a.get(), p);
  must_free(a.get(), q);
  must_free(a.get(), r);
}

// Classic split: inactive_split counts free remnants of split classic segments; the current
// values after each step, and PyTorch's accumulators (net change per free, shrink of an
// already split block = bytes decrease only).
TEST(StatsRules, InactiveSplitClassicCurrent) {
  AllocPtr a = make_alloc("sim:capacity=8G", "expandable_segments:False");
  expseg_allocator *A = a.get();
  void *p1 = must_malloc(A, 1536 * KiB, 0);  // 20 MiB segment split 1.5 + 18.5
  EXPECT_EQ(stat_of(A, "segment.large_pool.current"), 1);
  EXPECT_EQ(stat_of(A, "reserved_bytes.large_pool.current"), (int64_t)(20 * MiB));
  EXPECT_EQ(stat_of(A, "inactive_split.large_pool.current"), 1);
  EXPECT_EQ(stat_of(A, "inactive_split_bytes.large_pool.current"), (int64_t)(18 * MiB + 512 * KiB));
  void *p2 = must_malloc(A, 1536 * KiB, 0);  // shrinks the remnant to 17 MiB
  EXPECT_EQ(stat_of(A, "inactive_split.large_pool.current"), 1);
  EXPECT_EQ(stat_of(A, "inactive_split_bytes.large_pool.current"), (int64_t)(17 * MiB));
  must_free(A, p1);  // no free neighbour: +1 block, +1.5 MiB
  EXPECT_EQ(stat_of(A, "inactive_split.large_pool.current"), 2);
  EXPECT_EQ(stat_of(A, "inactive_split_bytes.large_pool.current"), (int64_t)(18 * MiB + 512 * KiB));
  EXPECT_EQ(stat_of(A, "inactive_split.all.current"), 2);
  EXPECT_EQ(stat_of(A, "inactive_split.small_pool.current"), 0);
  must_free(A, p2);  // merges both neighbours: the segment is whole again
  EXPECT_EQ(stat_of(A, "inactive_split.large_pool.current"), 0);
  EXPECT_EQ(stat_of(A, "inactive_split_bytes.large_pool.current"), 0);
  EXPECT_EQ(stat_of(A, "segment.large_pool.current"), 1);
  // small pool: 2 MiB segments, split at 512 B granularity
  void *s = must_malloc(A, 4000, 0);
  EXPECT_EQ(stat_of(A, "inactive_split.small_pool.current"), 1);
  EXPECT_EQ(stat_of(A, "inactive_split_bytes.small_pool.current"), (int64_t)(2 * MiB - 4096));
  must_free(A, s);
  EXPECT_EQ(stat_of(A, "inactive_split.small_pool.current"), 0);
  expect_consistent(A, "classic split");
}

TEST(StatsRules, InactiveSplitAccumulatorsFollowNetRule) {
  // PyTorch (reference §4.3, free_block / alloc_found_block): a free adds the NET change
  // after merges; taking part of an already split free block only decreases the bytes.
  // Sequence: p1 = 1.5 MiB (new 20 MiB segment; remnant 18.5 inactive: +1, +18.5 MiB),
  // p2 = 1.5 MiB (remnant shrinks: bytes -1.5 MiB), free p1 (+1, +1.5 MiB),
  // free p2 (merges p1 and the remnant, result unsplit: net -2, -18.5 MiB).
  AllocPtr a = make_alloc("sim:capacity=8G", "expandable_segments:False");
  expseg_allocator *A = a.get();
  void *p1 = must_malloc(A, 1536 * KiB, 0);
  void *p2 = must_malloc(A, 1536 * KiB, 0);
  must_free(A, p1);
  must_free(A, p2);
  EXPECT_EQ(stat_of(A, "inactive_split.large_pool.allocated"), 2);
  EXPECT_EQ(stat_of(A, "inactive_split.large_pool.freed"), 2);
  EXPECT_EQ(stat_of(A, "inactive_split_bytes.large_pool.allocated"), (int64_t)(20 * MiB));
  EXPECT_EQ(stat_of(A, "inactive_split_bytes.large_pool.freed"), (int64_t)(20 * MiB));
  EXPECT_EQ(stat_of(A, "inactive_split.large_pool.peak"), 2);
}

TEST(StatsRules, InactiveSplitNeverCountsExpandableBlocks) {
  AllocPtr a = make_alloc("sim:capacity=8G", "expandable_segments:True");
  expseg_allocator *A = a.get();
  std::vector<void *> ps;
  for (int i = 0; i < 6; i++) ps.push_back(must_malloc(A, (i + 1) * 700 * KiB, 0));
  for (int i = 0; i < 6; i += 2) must_free(A, ps[i]);
  for (const char *k : {"inactive_split.all.current", "inactive_split.all.allocated",
                        "inactive_split_bytes.all.current", "inactive_split_bytes.all.peak"})
    EXPECT_EQ(stat_of(A, k), 0) << k;
  for (int i = 1; i < 6; i += 2) must_free(A, ps[i]);
  expect_consistent(A, "expandable");
}

TEST(StatsRules, PendingFreeDropsAllocationAtFreeAndActiveAtCompletion) {
  for (const char *conf : {"expandable_segments:True", "expandable_segments:False"}) {
    SCOPED_TRACE(conf);
    AllocPtr a = make_alloc("sim:capacity=8G", conf);
    expseg_allocator *A = a.get();
    ASSERT_EQ(alloc_test_hold(A, 7, true), EXPSEG_OK);
    void *p = must_malloc(A, 5 * MiB, 1);
    ASSERT_EQ(expseg_record_stream(A, p, 7), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_record_stream(A, p, 1), EXPSEG_OK);  // own stream: ignored
    must_free(A, p);
    EXPECT_EQ(stat_of(A, "allocation.all.current"), 0);
    EXPECT_EQ(stat_of(A, "allocated_bytes.all.current"), 0);
    EXPECT_EQ(stat_of(A, "active.all.current"), 1);
    EXPECT_EQ(stat_of(A, "active_bytes.large_pool.current"), (int64_t)(5 * MiB));
    EXPECT_EQ(stat_of(A, "requested_bytes.large_pool.current"), (int64_t)(5 * MiB));
    EXPECT_EQ(stat_of(A, "expseg.pending_free_blocks.current"), 1);
    expect_consistent(A, "pending");
    // still held: a malloc polls events but the block stays pending and is not reused
    void *q = must_malloc(A, 5 * MiB, 1);
    EXPECT_NE(q, p) << "a pending block was handed out again before its event completed";
    EXPECT_EQ(stat_of(A, "active.all.current"), 2);
    // empty_cache while held: the block stays pending (its event cannot complete)
    {
      QuietLog quiet;
      ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);
    }
    EXPECT_EQ(stat_of(A, "active.all.current"), 2);
    EXPECT_EQ(stat_of(A, "expseg.pending_free_blocks.current"), 1);
    expect_consistent(A, "pending after empty_cache");
    ASSERT_EQ(alloc_test_hold(A, 7, false), EXPSEG_OK);
    void *r = must_malloc(A, 512, 1);  // processes the completed event
    EXPECT_EQ(stat_of(A, "active.large_pool.current"), 1);
    EXPECT_EQ(stat_of(A, "active_bytes.large_pool.current"), (int64_t)(5 * MiB));
    EXPECT_EQ(stat_of(A, "requested_bytes.large_pool.current"), (int64_t)(5 * MiB));
    EXPECT_EQ(stat_of(A, "expseg.pending_free_blocks.current"), 0);
    must_free(A, q);
    must_free(A, r);
    expect_consistent(A, "after completion");
  }
}

TEST(StatsRules, PendingFreeCompletedByEmptyCache) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  expseg_allocator *A = a.get();
  ASSERT_EQ(alloc_test_hold(A, 9, true), EXPSEG_OK);
  void *p = must_malloc(A, 3 * MiB, 2);
  ASSERT_EQ(expseg_record_stream(A, p, 9), EXPSEG_OK);
  must_free(A, p);
  EXPECT_EQ(stat_of(A, "active.all.current"), 1);
  ASSERT_EQ(alloc_test_hold(A, 9, false), EXPSEG_OK);
  int64_t syncs = stat_of(A, "num_sync_all_streams");
  ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "num_sync_all_streams"), syncs + 1);
  EXPECT_EQ(stat_of(A, "active.all.current"), 0);
  EXPECT_EQ(stat_of(A, "requested_bytes.all.current"), 0);
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(stat_of(A, "segment.all.current"), 0);
  expect_consistent(A, "empty_cache completed it");
}

TEST(StatsRules, OversizeClassic) {
  AllocPtr a = make_alloc("sim:capacity=8G", "max_split_size_mb:20,expandable_segments:False");
  expseg_allocator *A = a.get();
  EXPECT_EQ(stat_of(A, "max_split_size"), (int64_t)(20 * MiB));
  void *p = must_malloc(A, 25 * MiB, 0);  // 26 MiB segment, never split: the block is 26 MiB
  EXPECT_EQ(stat_of(A, "allocated_bytes.all.current"), (int64_t)(26 * MiB));
  EXPECT_EQ(stat_of(A, "requested_bytes.all.current"), (int64_t)(25 * MiB));
  EXPECT_EQ(stat_of(A, "oversize_allocations.current"), 1);
  EXPECT_EQ(stat_of(A, "oversize_segments.current"), 1);
  EXPECT_EQ(stat_of(A, "inactive_split.all.current"), 0);
  must_free(A, p);
  EXPECT_EQ(stat_of(A, "oversize_allocations.current"), 0);
  EXPECT_EQ(stat_of(A, "oversize_allocations.freed"), 1);
  EXPECT_EQ(stat_of(A, "oversize_segments.current"), 1);  // cached
  // a request below max_split_size may not take the cached oversize block; its own
  // 20 MiB segment (large_segment_size) is itself >= max_split_size: oversize too
  void *q = must_malloc(A, 5 * MiB, 0);
  EXPECT_EQ(stat_of(A, "segment.all.current"), 2);
  EXPECT_EQ(stat_of(A, "oversize_segments.current"), 2);
  // a request >= max_split_size may take it when within max_non_split_rounding (20 MiB)
  void *r = must_malloc(A, 24 * MiB, 0);
  EXPECT_EQ(r, p);
  EXPECT_EQ(stat_of(A, "segment.all.current"), 2);
  EXPECT_EQ(stat_of(A, "oversize_allocations.current"), 1);
  EXPECT_EQ(stat_of(A, "oversize_allocations.allocated"), 2);
  must_free(A, q);
  must_free(A, r);
  ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "oversize_segments.current"), 0);
  EXPECT_EQ(stat_of(A, "oversize_segments.freed"), 2);
  EXPECT_EQ(stat_of(A, "segment.all.current"), 0);
  expect_consistent(A, "oversize");
}

TEST(StatsRules, OversizeExpandableCountsAllocationsButNoSegments) {
  AllocPtr a = make_alloc("sim:capacity=8G", "max_split_size_mb:20");
  expseg_allocator *A = a.get();
  void *p = must_malloc(A, 25 * MiB, 0);
  EXPECT_EQ(stat_of(A, "allocated_bytes.all.current"), (int64_t)(25 * MiB));
  EXPECT_EQ(stat_of(A, "oversize_allocations.current"), 1);
  EXPECT_EQ(stat_of(A, "oversize_segments.current"), 0);
  must_free(A, p);
  // no oversize trap for expandable blocks: a small request is served from the freed range
  void *q = must_malloc(A, 5 * MiB, 0);
  EXPECT_EQ(q, p);
  EXPECT_EQ(stat_of(A, "segment.all.current"), 1);
  must_free(A, q);
  expect_consistent(A, "oversize expandable");
}

TEST(StatsRules, RetryAfterReleasingCacheCountsRetryNotOom) {
  AllocPtr a = make_alloc("sim:capacity=1G", "expandable_segments:False");
  expseg_allocator *A = a.get();
  void *p = must_malloc(A, 600 * MiB, 0);
  must_free(A, p);  // cached, 600 MiB held
  void *q = must_malloc(A, 700 * MiB, 0);  // needs the cache released first
  EXPECT_EQ(stat_of(A, "num_alloc_retries"), 1);
  EXPECT_EQ(stat_of(A, "num_ooms"), 0);
  EXPECT_GE(stat_of(A, "num_sync_all_streams"), 1);
  EXPECT_EQ(stat_of(A, "num_device_free"), 1);
  EXPECT_EQ(stat_of(A, "num_device_alloc"), 2);
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), (int64_t)(700 * MiB));
  must_free(A, q);
  expect_consistent(A, "retry");
}

TEST(StatsRules, OomCountsOomAndRetry) {
  for (const char *conf : {"expandable_segments:True", "expandable_segments:False"}) {
    SCOPED_TRACE(conf);
    AllocPtr a = make_alloc("sim:capacity=1G", conf);
    expseg_allocator *A = a.get();
    void *p = must_malloc(A, 512 * MiB, 0);
    void *q = nullptr;
    EXPECT_EQ(expseg_malloc(A, 600 * MiB, 0, &q), EXPSEG_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(q, nullptr);
    EXPECT_EQ(stat_of(A, "num_ooms"), 1);
    EXPECT_EQ(stat_of(A, "num_alloc_retries"), 1);
    EXPECT_EQ(expseg_malloc(A, 700 * MiB, 3, &q), EXPSEG_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(stat_of(A, "num_ooms"), 2);
    EXPECT_EQ(stat_of(A, "allocation.all.current"), 1);
    must_free(A, p);
    expect_consistent(A, "after OOM");
  }
}

// num_oom_rejections (PyTorch 2.12): counted only with throw_on_cudamalloc_oom:True, and only
// for requests the memory fraction refused, not for the device running out.
TEST(StatsRules, OomRejectionsCountFractionRefusalsUnderThrowOnOom) {
  for (bool on : {true, false}) {
    SCOPED_TRACE(on);
    std::string conf = std::string("per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:") +
                       (on ? "True" : "False");
    AllocPtr a = make_alloc("sim:capacity=1G", conf.c_str());
    expseg_allocator *A = a.get();
    void *p = must_malloc(A, 100 * MiB, 0);  // within the fraction: no rejection
    EXPECT_EQ(stat_of(A, "num_oom_rejections"), 0);
    void *q = nullptr;
    EXPECT_EQ(expseg_malloc(A, 600 * MiB, 0, &q), EXPSEG_ERR_OUT_OF_MEMORY);  // > 512 MiB
    EXPECT_EQ(stat_of(A, "num_ooms"), 1);
    EXPECT_EQ(stat_of(A, "num_oom_rejections"), on ? 1 : 0);
    must_free(A, p);
  }
  // the device itself running out is no rejection
  AllocPtr b = make_alloc("sim:capacity=1G", "throw_on_cudamalloc_oom:True");
  void *held = must_malloc(b.get(), 600 * MiB, 0), *q = nullptr;
  EXPECT_EQ(expseg_malloc(b.get(), 600 * MiB, 0, &q), EXPSEG_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(stat_of(b.get(), "num_ooms"), 1);
  EXPECT_EQ(stat_of(b.get(), "num_oom_rejections"), 0);
  must_free(b.get(), held);
}

TEST(StatsRules, NumSyncAllStreamsCountsEmptyCache) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  EXPECT_EQ(stat_of(a.get(), "num_sync_all_streams"), 0);
  ASSERT_EQ(expseg_empty_cache(a.get()), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a.get()), EXPSEG_OK);
  EXPECT_EQ(stat_of(a.get(), "num_sync_all_streams"), 2);
}

TEST(StatsRules, DeviceAllocFreeClassicPerSegment) {
  AllocPtr a = make_alloc("sim:capacity=8G", "expandable_segments:False");
  expseg_allocator *A = a.get();
  void *p = must_malloc(A, 3 * MiB, 0);   // 20 MiB segment
  void *q = must_malloc(A, 30 * MiB, 0);  // 30 MiB segment
  void *r = must_malloc(A, 3 * MiB, 0);   // fits the first segment
  EXPECT_EQ(stat_of(A, "num_device_alloc"), 2);
  EXPECT_EQ(stat_of(A, "segment.large_pool.current"), 2);
  EXPECT_EQ(stat_of(A, "reserved_bytes.large_pool.current"), (int64_t)(50 * MiB));
  EXPECT_EQ(stat_of(A, "expseg.driver.create"), 2);
  must_free(A, p);
  must_free(A, q);
  must_free(A, r);
  EXPECT_EQ(stat_of(A, "num_device_free"), 0);
  ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "num_device_free"), 2);
  EXPECT_EQ(stat_of(A, "segment.large_pool.current"), 0);
  EXPECT_EQ(stat_of(A, "segment.large_pool.freed"), 2);
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), 0);
  expect_consistent(A, "classic device calls");
}

TEST(StatsRules, DeviceAllocFreeExpandablePerRange) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  expseg_allocator *A = a.get();
  void *p = must_malloc(A, 3 * MiB, 0);  // maps 2 pages, one chunk: one range
  EXPECT_EQ(stat_of(A, "num_device_alloc"), 1);
  EXPECT_EQ(stat_of(A, "expseg.driver.map"), 1);
  EXPECT_EQ(stat_of(A, "expseg.driver.set_access"), 1);
  void *q = must_malloc(A, 3 * MiB, 0);  // 1 MiB tail + 1 more page: one more range
  EXPECT_EQ(stat_of(A, "num_device_alloc"), 2);
  EXPECT_EQ(stat_of(A, "expseg.driver.set_access"), 2);
  EXPECT_EQ(stat_of(A, "reserved_bytes.large_pool.current"), (int64_t)(6 * MiB));
  EXPECT_EQ(stat_of(A, "expseg.mapped_bytes.current"), (int64_t)(6 * MiB));
  // expseg's rule: an expandable reservation is one segment
  EXPECT_EQ(stat_of(A, "segment.large_pool.current"), 1);
  must_free(A, p);
  must_free(A, q);
  ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);  // one merged free block: one unmapped range
  EXPECT_EQ(stat_of(A, "num_device_free"), 1);
  EXPECT_EQ(stat_of(A, "segment.large_pool.current"), 0);  // reservation freed
  EXPECT_EQ(stat_of(A, "segment.large_pool.allocated"), 1);
  EXPECT_EQ(stat_of(A, "segment.large_pool.freed"), 1);
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(stat_of(A, "expseg.reserved_va_bytes.current"), 0);
  expect_consistent(A, "expandable device calls");
}

TEST(StatsRules, ReservedBytesFollowPagesAcrossStreamsAndPools) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  expseg_allocator *A = a.get();
  void *s = must_malloc(A, 1000, 1);  // small pool: one 4 MiB chunk (its least growth)
  must_free(A, s);
  EXPECT_EQ(stat_of(A, "reserved_bytes.small_pool.current"), (int64_t)(4 * MiB));
  // large pool, other stream: the memory fraction allows nothing beyond the 4 MiB held, so
  // the chunk moves whole (within the bound of the peak a growth would create its pages
  // and leave idle chunks be: _expseg_move_first) and is mapped whole
  ASSERT_EQ(expseg_set_memory_fraction(A, 4.0 / 8192.0), EXPSEG_OK);
  void *l = must_malloc(A, 2 * MiB, 2);
  EXPECT_EQ(stat_of(A, "expseg.pages_moved"), 2);
  EXPECT_EQ(stat_of(A, "expseg.created_bytes"), (int64_t)(4 * MiB));
  EXPECT_EQ(stat_of(A, "reserved_bytes.small_pool.current"), 0);
  EXPECT_EQ(stat_of(A, "reserved_bytes.large_pool.current"), (int64_t)(4 * MiB));
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), (int64_t)(4 * MiB));
  EXPECT_EQ(stat_of(A, "segment.all.current"), 2);  // the small reservation is still there
  expect_consistent(A, "moved");
  must_free(A, l);
  void *m = must_malloc(A, 4 * MiB, 3);  // stream 2's free block is lent: nothing created
  EXPECT_EQ(stat_of(A, "expseg.created_bytes"), (int64_t)(4 * MiB));
  EXPECT_EQ(stat_of(A, "expseg.pages_moved"), 2) << "nor moved";
  EXPECT_EQ(stat_of(A, "expseg.num_lent"), 1);
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), (int64_t)(4 * MiB));
  ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "segment.all.current"), 1);
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), (int64_t)(4 * MiB));
  must_free(A, m);
  ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(stat_of(A, "expseg.released_bytes"), (int64_t)(4 * MiB));
  expect_consistent(A, "released");
}

// reserved_bytes includes the page cache: pages created for a request whose mapping then
// failed (a driver error, not a lack of memory) stay cached, and counted, and serve the next
// request without being created again.
TEST(StatsRules, ReservedBytesCountsPageCache) {
  expseg_vmm_t *sim = nullptr, *fault = nullptr;
  ASSERT_EQ(_expseg_vmm_open("sim:capacity=8G", 0, &sim), EXPSEG_OK);
  ASSERT_EQ(_expseg_fault_new(sim, &fault), EXPSEG_OK);
  expseg_allocator *A = nullptr;
  ASSERT_EQ(alloc_test_create(fault, "", &A), EXPSEG_OK) << expseg_last_error();
  AllocPtr own(A);
  QuietLog quiet;
  expseg_fault_rule_t rule = {EXPSEG_VMM_CALL_map, 1, 1000, EXPSEG_ERR_DRIVER};
  _expseg_fault_set_rules(fault, &rule, 1);
  void *p = nullptr;
  EXPECT_EQ(expseg_malloc(A, 4 * MiB, 0, &p), EXPSEG_ERR_DRIVER);
  _expseg_fault_set_rules(fault, nullptr, 0);
  int64_t cached = stat_of(A, "expseg.cached_physical_bytes.current");
  EXPECT_EQ(cached, (int64_t)(4 * MiB)) << "a chunk of two pages was created before its map failed";
  EXPECT_EQ(stat_of(A, "expseg.mapped_bytes.current"), 0);
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), cached);
  EXPECT_EQ(stat_of(A, "reserved_bytes.large_pool.current"), cached);
  expect_consistent(A, "cache after failure");
  // the cached pages serve the next request
  p = must_malloc(A, 4 * MiB, 0);
  EXPECT_EQ(stat_of(A, "expseg.page_cache_hits"), 2);
  EXPECT_EQ(stat_of(A, "expseg.created_bytes"), (int64_t)(4 * MiB));
  EXPECT_EQ(stat_of(A, "expseg.cached_physical_bytes.current"), 0);
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), (int64_t)(4 * MiB));
  must_free(A, p);
  ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), 0);
}

TEST(StatsRules, MaxSplitSizeRefreshedByConfigure) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  EXPECT_EQ(stat_of(a.get(), "max_split_size"), -1);
  ASSERT_EQ(expseg_configure(a.get(), "max_split_size_mb:100"), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(stat_of(a.get(), "max_split_size"), (int64_t)(100 * MiB));
}

struct Collected {
  std::vector<std::string> keys;
  std::vector<int64_t> values;
};

void collect(void *ctx, const char *key, int64_t v) {
  auto *c = static_cast<Collected *>(ctx);
  c->keys.push_back(key);
  c->values.push_back(v);
}

bool ends_with(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

TEST(StatsRules, ResetPeakSetsPeakToCurrent) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  expseg_allocator *A = a.get();
  void *p = must_malloc(A, 50 * MiB, 0);
  void *q = must_malloc(A, 1000, 0);
  must_free(A, p);
  EXPECT_EQ(stat_of(A, "allocated_bytes.all.peak"), (int64_t)(50 * MiB + 1024));
  expseg_reset_peak_stats(A);
  Collected c;
  expseg_stats_foreach(A, collect, &c);
  size_t peaks = 0;
  for (size_t i = 0; i < c.keys.size(); i++) {
    if (!ends_with(c.keys[i], ".peak")) continue;
    peaks++;
    std::string cur = c.keys[i].substr(0, c.keys[i].size() - 5) + ".current";
    EXPECT_EQ(c.values[i], stat_of(A, cur)) << c.keys[i];
  }
  EXPECT_GE(peaks, 9u * 3 + 2);
  EXPECT_EQ(stat_of(A, "allocated_bytes.all.peak"), 1024);
  void *r = must_malloc(A, 2048, 0);
  EXPECT_EQ(stat_of(A, "allocated_bytes.all.peak"), 1024 + 2048);
  must_free(A, q);
  must_free(A, r);
}

TEST(StatsRules, ResetAccumulatedZeroesAllocatedFreedCountersAndDriverCalls) {
  AllocPtr a = make_alloc("sim:capacity=1G", "");
  expseg_allocator *A = a.get();
  void *p = must_malloc(A, 50 * MiB, 0);
  void *q = nullptr;
  EXPECT_EQ(expseg_malloc(A, 2 * GiB, 0, &q), EXPSEG_ERR_OUT_OF_MEMORY);
  must_free(A, p);
  ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);
  EXPECT_GT(stat_of(A, "num_ooms"), 0);
  EXPECT_GT(stat_of(A, "expseg.driver.map"), 0);
  p = must_malloc(A, 1000, 0);
  int64_t cur = stat_of(A, "allocated_bytes.all.current"), peak = stat_of(A, "allocated_bytes.all.peak");
  expseg_reset_accumulated_stats(A);
  Collected c;
  expseg_stats_foreach(A, collect, &c);
  static const char *const zeroed[] = {"num_alloc_retries", "num_ooms", "num_oom_rejections", "num_sync_all_streams",
                                       "num_device_alloc", "num_device_free"};
  for (size_t i = 0; i < c.keys.size(); i++) {
    const std::string &k = c.keys[i];
    bool must_zero = ends_with(k, ".allocated") || ends_with(k, ".freed") ||
                     k.rfind("expseg.driver.", 0) == 0;
    for (const char *z : zeroed) {
      if (k == z) must_zero = true;
    }
    for (const char *z : {"expseg.created_bytes", "expseg.released_bytes", "expseg.page_cache_hits",
                          "expseg.pages_moved", "expseg.gc_released_bytes"}) {
      if (k == z) must_zero = true;
    }
    if (must_zero) {
      EXPECT_EQ(c.values[i], 0) << k;
    }
  }
  EXPECT_EQ(stat_of(A, "allocated_bytes.all.current"), cur);
  EXPECT_EQ(stat_of(A, "allocated_bytes.all.peak"), peak);
  EXPECT_EQ(stat_of(A, "max_split_size"), -1);
  // driver counts start again from the reset
  void *r = must_malloc(A, 8 * MiB, 0);
  EXPECT_EQ(stat_of(A, "expseg.driver.set_access"), 1);
  EXPECT_EQ(stat_of(A, "num_device_alloc"), 1);
  must_free(A, p);
  must_free(A, r);
  expect_consistent(A, "after resets");
}

TEST(StatsRules, ForeachSortedAndHasEveryTorchKey) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  Collected c;
  expseg_stats_foreach(a.get(), collect, &c);
  ASSERT_FALSE(c.keys.empty());
  for (size_t i = 1; i < c.keys.size(); i++)
    EXPECT_LT(c.keys[i - 1], c.keys[i]) << "not strictly sorted at " << i;
  std::set<std::string> have(c.keys.begin(), c.keys.end());
  std::vector<std::string> torch;
  for (const char *arr : {"allocation", "segment", "active", "inactive_split", "allocated_bytes",
                          "reserved_bytes", "active_bytes", "inactive_split_bytes",
                          "requested_bytes"})
    for (const char *pool : {"all", "large_pool", "small_pool"})
      for (const char *m : {"current", "peak", "allocated", "freed"})
        torch.push_back(std::string(arr) + "." + pool + "." + m);
  for (const char *single : {"oversize_allocations", "oversize_segments"})
    for (const char *m : {"current", "peak", "allocated", "freed"})
      torch.push_back(std::string(single) + "." + m);
  for (const char *k : {"num_alloc_retries", "num_ooms", "num_oom_rejections", "num_sync_all_streams",
                        "num_device_alloc", "num_device_free", "max_split_size"})
    torch.push_back(k);
  // the library's PyTorch-named keys (everything outside expseg.*) are exactly these: a key
  // dropped or added by mistake fails here
  std::set<std::string> want(torch.begin(), torch.end());
  for (const std::string &k : c.keys)
    if (k.rfind("expseg.", 0) != 0) {
      EXPECT_TRUE(want.count(k)) << "key " << k << " is not PyTorch's";
    }
  for (const std::string &k : torch) {
    EXPECT_TRUE(have.count(k)) << "missing torch key " << k;
    int64_t v = -7;
    EXPECT_EQ(expseg_stat(a.get(), k.c_str(), &v), EXPSEG_OK) << k;
  }
  // every key foreach visits can be read back with expseg_stat, same value on a quiet allocator
  for (size_t i = 0; i < c.keys.size(); i++) EXPECT_EQ(stat_of(a.get(), c.keys[i]), c.values[i]);
  for (const char *k : {"expseg.mapped_bytes.current", "expseg.cached_physical_bytes.peak",
                        "expseg.reserved_va_bytes.current", "expseg.largest_free_block",
                        "expseg.driver.create", "expseg.driver.set_access",
                        "expseg.pending_free_blocks.current"})
    EXPECT_TRUE(have.count(k)) << "missing expseg key " << k;
}

TEST(StatsRules, UnknownKeyIsInvalidArgumentNamingIt) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  int64_t v = 5;
  EXPECT_EQ(expseg_stat(a.get(), "allocated_bytes.all.currnet", &v), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(expseg_last_error(), "allocated_bytes.all.currnet"), nullptr)
      << expseg_last_error();
  EXPECT_EQ(expseg_stat(a.get(), "", &v), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_stat(a.get(), "allocated_bytes.all", &v), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_stat(a.get(), "expseg.driver", &v), EXPSEG_ERR_INVALID_ARGUMENT);
}

TEST(StatsRules, LargestFreeBlock) {
  AllocPtr a = make_alloc("sim:capacity=8G", "expandable_segments:False");
  expseg_allocator *A = a.get();
  EXPECT_EQ(stat_of(A, "expseg.largest_free_block"), 0);
  void *p = must_malloc(A, 3 * MiB, 0);
  EXPECT_EQ(stat_of(A, "expseg.largest_free_block"), (int64_t)(17 * MiB));
  must_free(A, p);
  EXPECT_EQ(stat_of(A, "expseg.largest_free_block"), (int64_t)(20 * MiB));
}

}  // namespace
