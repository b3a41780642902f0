// SPDX-License-Identifier: Apache-2.0
// test_alloc_oom_why.cpp: the out-of-memory report says why, on each cause: the free memory
// split by how usable it was for the request (whole free pages and the rest at its own
// place, other streams, other pools), the address space reserved but unmapped, and what
// would have served it (releasing other pools, waiting for busy streams, a lower
// page_size_mb, a lower chunk_max_mb where free whole pages are pinned); the same figures as the expseg.oom_* statistics. On the sim driver.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "alloc_support.h"

namespace {

constexpr size_t MiB = 1u << 20;

bool has(const std::string &m, const char *s) { return m.find(s) != std::string::npos; }

// Every case: 64 MiB of sim memory, expandable segments in a 128 MiB reservation, and the
// log kept off the test's output (the OOM path warns nothing).
class OomWhy : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = make_alloc("sim:capacity=64M", "expandable_segments:True,va_reserve_mb:128");
    ASSERT_TRUE(a_);
    A = a_.get();
  }
  QuietLog q_;
  AllocPtr a_;
  expseg_allocator *A = nullptr;
};

// Free memory cached by a private pool in use cannot serve the general cache, and
// empty_cache cannot give it back: the report counts it in other pools and names releasing
// that pool, not empty_cache.
TEST_F(OomWhy, FreeMemoryInOtherPools) {
  expseg_pool_id pool = 0;
  ASSERT_EQ(expseg_pool_create(A, &pool), EXPSEG_OK);
  void *p = nullptr, *r = nullptr;
  ASSERT_EQ(expseg_malloc_pool(A, 40 * MiB, 0, pool, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);  // cached in the pool, which is still in use
  ASSERT_EQ(expseg_malloc(A, 40 * MiB, 0, &r), EXPSEG_ERR_OUT_OF_MEMORY);
  std::string m = expseg_last_error();
  EXPECT_TRUE(has(m, "40.00 MiB in other pools")) << m;
  EXPECT_TRUE(has(m, "40.00 MiB is free in private pools still in use")) << m;
  EXPECT_TRUE(has(m, "expseg_empty_cache cannot give it back; release those pools")) << m;
  EXPECT_FALSE(has(m, "or give cached memory back (expseg_empty_cache)")) << m;
  EXPECT_GE(stat_of(A, "expseg.oom_free_other_pool_bytes"), int64_t(40 * MiB));
  EXPECT_EQ(stat_of(A, "expseg.oom_free_other_stream_bytes"), 0);
  EXPECT_GE(stat_of(A, "expseg.oom_largest_free_block"), int64_t(40 * MiB));
  ASSERT_EQ(expseg_pool_release(A, pool), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(A, 40 * MiB, 0, &r), EXPSEG_OK) << "served once the pool is released";
  ASSERT_EQ(expseg_free(A, r), EXPSEG_OK);
}

// Free memory on a stream whose work is still running is not lent: the report counts it on
// other streams and says to wait for them.
TEST_F(OomWhy, FreeMemoryOnBusyStreams) {
  void *p = nullptr, *r = nullptr;
  ASSERT_EQ(expseg_malloc(A, 40 * MiB, 1, &p), EXPSEG_OK);
  ASSERT_EQ(alloc_test_hold(A, 1, true), EXPSEG_OK);
  ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);  // free on stream 1, whose work is held
  ASSERT_EQ(expseg_malloc(A, 40 * MiB, 2, &r), EXPSEG_ERR_OUT_OF_MEMORY);
  std::string m = expseg_last_error();
  EXPECT_TRUE(has(m, "40.00 MiB on other streams")) << m;
  EXPECT_TRUE(has(m, "is free on other streams whose work is still running")) << m;
  EXPECT_GE(stat_of(A, "expseg.oom_free_other_stream_bytes"), int64_t(40 * MiB));
  EXPECT_EQ(stat_of(A, "expseg.oom_free_other_pool_bytes"), 0);
  ASSERT_EQ(alloc_test_hold(A, 1, false), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(A, 40 * MiB, 2, &r), EXPSEG_OK) << "served once stream 1 is done";
  ASSERT_EQ(expseg_free(A, r), EXPSEG_OK);
}

// Free blocks that share pages with live ones: the retry before the report unmaps the whole
// free pages into the page cache (reported as unmapped pages), and what stays is free memory
// in partly used pages, which the report counts apart and for which it names page_size_mb.
TEST_F(OomWhy, FreeMemoryInPartlyUsedPages) {
  std::vector<void *> blocks;
  for (int i = 0; i < 25; i++) {  // 2.5 MiB each: 62.5 MiB over the 2 MiB pages
    void *p = nullptr;
    ASSERT_EQ(expseg_malloc(A, 5 * MiB / 2, 0, &p), EXPSEG_OK) << i;
    blocks.push_back(p);
  }
  for (int i = 1; i < 25; i += 2) ASSERT_EQ(expseg_free(A, blocks[i]), EXPSEG_OK);  // 30 MiB
  void *r = nullptr;
  ASSERT_EQ(expseg_malloc(A, 16 * MiB, 0, &r), EXPSEG_ERR_OUT_OF_MEMORY);
  std::string m = expseg_last_error();
  // 30 MiB freed + the 1.5 MiB tail of the last page = 12 MiB of whole pages (unmapped by
  // the retry, now cached) + 19.5 MiB in pages shared with live blocks
  EXPECT_TRUE(has(m, "31.50 MiB cached (12.00 MiB as unmapped pages)")) << m;
  EXPECT_EQ(stat_of(A, "expseg.oom_free_whole_page_bytes"), 0) << m;
  EXPECT_EQ(stat_of(A, "expseg.oom_free_partial_bytes"), int64_t(39 * MiB / 2)) << m;
  EXPECT_TRUE(has(m, "in partly used pages or classic segments")) << m;
  EXPECT_TRUE(has(m, "a lower page_size_mb leaves less of it stranded")) << m;
  EXPECT_EQ(stat_of(A, "expseg.oom_largest_free_block"), int64_t(5 * MiB / 2));
  for (int i = 0; i < 25; i += 2) ASSERT_EQ(expseg_free(A, blocks[i]), EXPSEG_OK);
}

// Free whole pages in a chunk shared with a block in use cannot move: a 40 MiB request's
// pages are one chunk, a 4 MiB block placed where it was freed pins the other 36 MiB. A
// request those pinned pages plus the device's free memory would have served names
// chunk_max_mb, and the statistic counts them; with chunk_max_mb:8 the same program runs.
// A request larger than that does not name it.
TEST_F(OomWhy, FreeWholePagesPinnedByASharedChunk) {
  for (const char *conf : {"", "chunk_max_mb:8"}) {
    SCOPED_TRACE(conf);
    ASSERT_EQ(expseg_configure(A, conf), EXPSEG_OK) << expseg_last_error();
    void *big = nullptr, *keep = nullptr, *b = nullptr, *r = nullptr;
    ASSERT_EQ(expseg_malloc(A, 40 * MiB, 0, &big), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_malloc(A, 16 * MiB, 0, &keep), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_free(A, big), EXPSEG_OK);
    ASSERT_EQ(expseg_malloc(A, 4 * MiB, 0, &b), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(b, big) << "placed where the 40 MiB block was";
    // 8 MiB free on the device, 36 MiB free in whole pages after b
    const expseg_status st = expseg_malloc(A, 40 * MiB, 0, &r);
    std::string m = expseg_last_error();
    if (*conf) {
      EXPECT_EQ(st, EXPSEG_OK) << "8 MiB chunks: 32 MiB of them move to the request\n" << m;
      ASSERT_EQ(expseg_free(A, r), EXPSEG_OK);
    } else {
      ASSERT_EQ(st, EXPSEG_ERR_OUT_OF_MEMORY);
      EXPECT_EQ(stat_of(A, "expseg.oom_free_pinned_bytes"), int64_t(36 * MiB)) << m;
      EXPECT_EQ(stat_of(A, "expseg.oom_free_whole_page_bytes"), int64_t(36 * MiB)) << m;
      EXPECT_TRUE(has(m, "36.00 MiB is free in whole pages that chunks shared with blocks in use "
                         "pin: chunk_max_mb:8 (smaller chunks) leaves less of it pinned")) << m;
      EXPECT_TRUE(has(m, "expseg-replay --fit")) << m;
      // 56 MiB: 36 pinned + 8 free on the device would not have served it either
      ASSERT_EQ(expseg_malloc(A, 56 * MiB, 0, &r), EXPSEG_ERR_OUT_OF_MEMORY);
      m = expseg_last_error();
      EXPECT_EQ(stat_of(A, "expseg.oom_free_pinned_bytes"), int64_t(36 * MiB)) << m;
      EXPECT_FALSE(has(m, "chunk_max_mb")) << m;
    }
    for (void *x : {b, keep}) ASSERT_EQ(expseg_free(A, x), EXPSEG_OK);
    ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);
  }
}

// Memory simply full: the split is all zero but the address space left in the segment, and
// no second remedy is named; reset_accumulated clears the figures.
TEST_F(OomWhy, MemoryFullNamesNothingElse) {
  void *p = nullptr, *r = nullptr;
  ASSERT_EQ(expseg_malloc(A, 60 * MiB, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(A, 8 * MiB, 0, &r), EXPSEG_ERR_OUT_OF_MEMORY);
  std::string m = expseg_last_error();
  EXPECT_TRUE(has(m, "Free: 0 bytes in whole pages, 0 bytes in partly used pages")) << m;
  EXPECT_FALSE(has(m, "is free in other pools")) << m;
  EXPECT_FALSE(has(m, "is free on other streams")) << m;
  EXPECT_FALSE(has(m, "page_size_mb")) << m;
  EXPECT_FALSE(has(m, "chunk_max_mb")) << m;
  EXPECT_EQ(stat_of(A, "expseg.oom_free_pinned_bytes"), 0);
  EXPECT_EQ(stat_of(A, "expseg.oom_unmapped_va_bytes"), int64_t(68 * MiB))
      << "128 MiB reserved, 60 MiB mapped";
  expseg_reset_accumulated_stats(A);
  EXPECT_EQ(stat_of(A, "expseg.oom_unmapped_va_bytes"), 0);
  ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);
}

}  // namespace
