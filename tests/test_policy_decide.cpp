// SPDX-License-Identifier: Apache-2.0
// test_policy_decide.cpp: the decisions moved out of pools/ into policy/decide.c (oversize,
// the page-cache bound, the out-of-memory hint) and the shared helpers of policy.h
// (_expseg_round_up, _expseg_log2_floor), each against its rule written out here.
#include <gtest/gtest.h>

#include "test_policy_common.h"

using policy_test::conf;

namespace {

constexpr size_t MiB = size_t(1) << 20;

TEST(PolicyDecide, OversizeIsAtOrAboveMaxSplitSize) {
  expseg_config_t c = conf("max_split_size_mb:40");
  EXPECT_FALSE(_expseg_is_oversize(&c, 40 * MiB - 1));
  EXPECT_TRUE(_expseg_is_oversize(&c, 40 * MiB));
  EXPECT_TRUE(_expseg_is_oversize(&c, 41 * MiB));
  expseg_config_t d = conf("");  // unlimited: nothing is oversize
  EXPECT_FALSE(_expseg_is_oversize(&d, SIZE_MAX - 1));
  // the oversize rule of cached blocks uses the same test: a small request never takes an
  // oversize block, an oversize one takes at most max_non_split_rounding more
  expseg_config_t e = conf("max_split_size_mb:40,max_non_split_rounding_mb:20");
  EXPECT_FALSE(_expseg_oversize_ok(&e, 20 * MiB, 40 * MiB));
  EXPECT_TRUE(_expseg_oversize_ok(&e, 20 * MiB, 39 * MiB));
  EXPECT_TRUE(_expseg_oversize_ok(&e, 40 * MiB, 59 * MiB));
  EXPECT_FALSE(_expseg_oversize_ok(&e, 40 * MiB, 60 * MiB));
}

TEST(PolicyDecide, PageCacheExcessIsWhatPassesTheBound) {
  expseg_config_t c = conf("");
  c.page_cache_max = 8 * MiB;
  EXPECT_EQ(_expseg_page_cache_excess(&c, 0), 0u);
  EXPECT_EQ(_expseg_page_cache_excess(&c, 8 * MiB), 0u);
  EXPECT_EQ(_expseg_page_cache_excess(&c, 10 * MiB), 2 * MiB);
  c.page_cache_max = 0;
  EXPECT_EQ(_expseg_page_cache_excess(&c, 2 * MiB), 2 * MiB);
}

// One thread per 256 MiB of a sleeping region's host copy, at most the CPUs and the cap, a
// power of two (the driver refuses any other count), never none.
TEST(PolicyDecide, SleepFaultThreadsGrowWithTheCopyUpToTheCpus) {
  static_assert(EXPSEG_SLEEP_FAULT_MAX >= 4, "the cases below assume a cap of at least 4");
  EXPECT_EQ(_expseg_sleep_fault_threads(0, 8), 1u);
  EXPECT_EQ(_expseg_sleep_fault_threads(4096, 8), 1u);
  EXPECT_EQ(_expseg_sleep_fault_threads(256 * MiB - 1, 8), 1u);
  EXPECT_EQ(_expseg_sleep_fault_threads(512 * MiB, 8), 2u);
  EXPECT_EQ(_expseg_sleep_fault_threads(768 * MiB, 8), 2u) << "3 rounds down to a power of two";
  EXPECT_EQ(_expseg_sleep_fault_threads(1024 * MiB, 8), 4u);
  EXPECT_EQ(_expseg_sleep_fault_threads(16384 * MiB, 2), 2u) << "no more than the CPUs";
  EXPECT_EQ(_expseg_sleep_fault_threads(16384 * MiB, 3), 2u);
  EXPECT_EQ(_expseg_sleep_fault_threads(16384 * MiB, 1), 1u);
  EXPECT_EQ(_expseg_sleep_fault_threads(16384 * MiB, 64), EXPSEG_SLEEP_FAULT_MAX);
  EXPECT_EQ(_expseg_sleep_fault_threads(SIZE_MAX, 1000), EXPSEG_SLEEP_FAULT_MAX);
  EXPECT_EQ(_expseg_sleep_fault_threads(16384 * MiB, 0), EXPSEG_SLEEP_FAULT_MAX)
      << "CPUs unknown (sysconf failed): the cap alone";
  EXPECT_EQ(_expseg_sleep_fault_threads(16384 * MiB, -1), EXPSEG_SLEEP_FAULT_MAX);
  for (size_t b = 0; b < (size_t(64) << 30); b += 97 * MiB) {
    uint32_t n = _expseg_sleep_fault_threads(b, 12);
    ASSERT_TRUE(n >= 1 && n <= 12 && n <= EXPSEG_SLEEP_FAULT_MAX && (n & (n - 1)) == 0)
        << b << " bytes: " << n;
  }
}

// What else would have served the request: other pools first (releasing the live private
// pools among them when empty_cache cannot reach enough), then busy streams, then
// (expandable only) a lower page size; nothing when the hint names the only remedy.
TEST(PolicyDecide, OomHelpByWhereMemoryWasFree) {
  expseg_oom_facts_t f{};
  f.rounded = 20 * MiB;
  f.total = 1024 * MiB;
  f.expandable = true;
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_NONE);
  f.partial = 20 * MiB;
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_PAGE_SIZE);
  f.expandable = false;  // classic: the stranded hint says it
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_NONE);
  f.other_streams = 20 * MiB;
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_OTHER_STREAMS);
  f.other_pools = 20 * MiB;
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_OTHER_POOLS);
  f.other_pools_live = 1;  // empty_cache would reach too little of it: the live pools' part
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_LIVE_POOLS);
  f.other_pools = 30 * MiB;  // enough outside the live pools
  f.other_pools_live = 10 * MiB;
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_OTHER_POOLS);
  f.other_pools_live = 0;
  f.other_pools = 20 * MiB - 1;  // not enough there alone
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_OTHER_STREAMS);
  f.address_space = true;
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_NONE);
}

// Pinned whole pages (in chunks shared with blocks in use): a lower chunk_max_mb is named
// only when what was missing beyond the movable pages and the device's free memory is at
// most what is pinned, after the other remedies.
TEST(PolicyDecide, OomHelpChunkMaxWhenPinnedPagesCoverWhatWasMissing) {
  expseg_oom_facts_t f{};
  f.rounded = 40 * MiB;
  f.total = 1024 * MiB;
  f.expandable = true;
  f.whole = f.pinned = 36 * MiB;
  f.device_free = 8 * MiB;  // missing 32 <= 36 pinned
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_CHUNK_MAX);
  f.device_free = 3 * MiB;  // missing 37 > 36
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_NONE);
  f.whole = 40 * MiB;  // 4 MiB more that can move: missing 33
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_CHUNK_MAX);
  f.device_free = 40 * MiB;  // enough without the pinned pages: not the cause
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_NONE);
  f.device_free = 8 * MiB;
  f.pinned = 0;
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_NONE);
  f.pinned = 36 * MiB;
  f.partial = 40 * MiB;  // partly used pages alone would serve it: page_size_mb first
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_PAGE_SIZE);
  f.partial = 0;
  f.other_streams = 40 * MiB;
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_OTHER_STREAMS);
  f.other_streams = 0;
  f.expandable = false;
  EXPECT_EQ(_expseg_oom_help(&f), EXPSEG_HELP_NONE);
}

TEST(PolicyDecide, OomHintByWhatRanOut) {
  expseg_oom_facts_t f{};
  f.held = 100 * MiB;
  f.allocated = 90 * MiB;
  f.rounded = 20 * MiB;
  EXPECT_EQ(_expseg_oom_hint(&f), EXPSEG_HINT_FULL);
  f.capped = true;
  EXPECT_EQ(_expseg_oom_hint(&f), EXPSEG_HINT_FRACTION);
  f.rounded = 10 * MiB;  // 10 MiB held unallocated would serve it, were it in one piece
  EXPECT_EQ(_expseg_oom_hint(&f), EXPSEG_HINT_STRANDED);
  f.expandable = true;  // expandable segments do not strand memory that way
  EXPECT_EQ(_expseg_oom_hint(&f), EXPSEG_HINT_FRACTION);
  f.address_space = true;
  EXPECT_EQ(_expseg_oom_hint(&f), EXPSEG_HINT_ADDRESS_SPACE);
  f.too_large = true;  // the strongest fact wins
  EXPECT_EQ(_expseg_oom_hint(&f), EXPSEG_HINT_TOO_LARGE);
  expseg_oom_facts_t g{};
  g.held = 1;  // held below allocated (never, but no wrap-around)
  g.allocated = 2;
  g.rounded = 1;
  EXPECT_EQ(_expseg_oom_hint(&g), EXPSEG_HINT_FULL);
}

TEST(PolicyDecide, RoundUpAndLog2) {
  EXPECT_EQ(_expseg_round_up(0, 512), 0u);
  EXPECT_EQ(_expseg_round_up(1, 512), 512u);
  EXPECT_EQ(_expseg_round_up(512, 512), 512u);
  EXPECT_EQ(_expseg_round_up(513, 512), 1024u);
  EXPECT_EQ(_expseg_round_up(SIZE_MAX - 10, 512), 0u) << "overflow gives 0";
  for (unsigned k = 0; k < 64; k++) {
    size_t p = size_t(1) << k;
    EXPECT_EQ(_expseg_log2_floor(p), k);
    if (k > 1) {
      EXPECT_EQ(_expseg_log2_floor(p - 1), k - 1);
    }
    EXPECT_EQ(_expseg_log2_floor(p | (p >> 1)), k);
  }
}

}  // namespace
