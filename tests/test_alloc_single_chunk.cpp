// SPDX-License-Identifier: Apache-2.0
// Single-chunk allocations (issue 14): EXPSEG_MALLOC_SINGLE_CHUNK and single_chunk_min_mb
// give an allocation one physical chunk of its own, mapped contiguously, even under
// expandable segments (whose allocations are otherwise built of many page-sized chunks).
#include "alloc_support.h"
#include "chunk_support.h"

namespace {

struct Del {
  void operator()(expseg_allocator *a) const { expseg_destroy(a); }
};
using Alloc = std::unique_ptr<expseg_allocator, Del>;

Alloc make(const char *config) {
  expseg_allocator *a = nullptr;
  EXPECT_EQ(EXPSEG_OK, expseg_create("sim", 0, config, &a)) << expseg_last_error();
  return Alloc(a);
}

TEST(SingleChunk, FlagGivesOneChunk) {
  Alloc a = make("expandable_segments:True");
  expseg_allocator *A = a.get();
  const size_t size = 50u << 20;
  uint64_t creates = alloc_test_calls(A, EXPSEG_VMM_CALL_create);
  uint64_t maps = alloc_test_calls(A, EXPSEG_VMM_CALL_map);
  void *p = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc_ex(A, size, 0, EXPSEG_MALLOC_SINGLE_CHUNK, &p));
  EXPECT_EQ(alloc_test_calls(A, EXPSEG_VMM_CALL_create) - creates, 1u) << "one chunk";
  EXPECT_EQ(alloc_test_calls(A, EXPSEG_VMM_CALL_map) - maps, 1u) << "one contiguous mapping";
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), (int64_t)size) << "exactly its size";
  EXPECT_EQ(stat_of(A, "allocated_bytes.all.current"), (int64_t)size) << "never split";
  // Without the flag, the same request is built of the growth's chunks (policy.h: its own
  // chunks of at most EXPSEG_REQUEST_CHUNK_MAX) in an expandable segment, which later
  // requests share.
  void *q = nullptr;
  creates = alloc_test_calls(A, EXPSEG_VMM_CALL_create);
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, size, 0, &q));
  EXPECT_EQ(alloc_test_calls(A, EXPSEG_VMM_CALL_create) - creates,
            growth_chunk_sizes(size, size).size());
  EXPECT_EQ(stat_of(A, "segment.large_pool.current"), 2) << "the single chunk's and one expandable";
  // A freed single chunk serves the next single-chunk request of its size.
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, p));
  creates = alloc_test_calls(A, EXPSEG_VMM_CALL_create);
  void *r = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc_ex(A, size - 4096, 0, EXPSEG_MALLOC_SINGLE_CHUNK, &r));
  EXPECT_EQ(r, p);
  EXPECT_EQ(alloc_test_calls(A, EXPSEG_VMM_CALL_create), creates) << "cached, not created";
  // Small requests get a chunk of their own too (rounded to the granularity).
  void *s = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc_ex(A, 1000, 0, EXPSEG_MALLOC_SINGLE_CHUNK, &s));
  EXPECT_EQ(stat_of(A, "segment.small_pool.current"), 1);
  void *t = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 1000, 0, &t));
  EXPECT_TRUE((uintptr_t)t < (uintptr_t)s || (uintptr_t)t >= (uintptr_t)s + (2u << 20))
      << "no other allocation shares a single chunk while it is allocated";
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  for (void *x : {q, r, s, t}) ASSERT_EQ(EXPSEG_OK, expseg_free(A, x));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_malloc_ex(A, 10, 0, 6u, &p));
  EXPECT_NE(std::string(expseg_last_error()).find("unknown bits 0x6"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(p, nullptr);
}

TEST(SingleChunk, OptionFromASize) {
  Alloc a = make("expandable_segments:True,single_chunk_min_mb:16");
  expseg_allocator *A = a.get();
  uint64_t creates = alloc_test_calls(A, EXPSEG_VMM_CALL_create);
  void *big = nullptr, *small = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 16u << 20, 0, &big));
  EXPECT_EQ(alloc_test_calls(A, EXPSEG_VMM_CALL_create) - creates, 1u) << "at the size: one chunk";
  creates = alloc_test_calls(A, EXPSEG_VMM_CALL_create);
  int64_t segs = stat_of(A, "segment.large_pool.current");
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, (16u << 20) - 1, 0, &small));
  EXPECT_EQ(alloc_test_calls(A, EXPSEG_VMM_CALL_create) - creates,
            growth_chunk_sizes(16u << 20, 16u << 20).size()) // rounded to 512 bytes: 16 MiB
      << "the growth's chunks";
  EXPECT_EQ(stat_of(A, "segment.large_pool.current"), segs + 1)
      << "below it: an expandable segment";
  char cfg[1024];
  expseg_config_string(A, cfg, sizeof cfg);
  EXPECT_NE(std::string(cfg).find("single_chunk_min_mb:16"), std::string::npos) << cfg;
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, big));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, small));
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  expseg_allocator *bad = nullptr;
  EXPECT_EQ(EXPSEG_ERR_CONFIG, expseg_create("sim", 0, "single_chunk_min_mb:0", &bad));
}

// Out of memory for a single chunk while idle expandable pages hold the memory: the pages
// go back and the request succeeds.
TEST(SingleChunk, IdlePagesMakeRoom) {
  expseg_allocator *A = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_create("sim:capacity=64M", 0, "expandable_segments:True", &A));
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 40u << 20, 0, &p));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, p));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc_ex(A, 40u << 20, 0, EXPSEG_MALLOC_SINGLE_CHUNK, &q))
      << expseg_last_error();
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), 40 << 20) << "the pages went back";
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, q));
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  expseg_destroy(A);
}

} // namespace
