// SPDX-License-Identifier: Apache-2.0
// test_alloc_api.cpp: the public API on bad input (each call returns the right status with a
// message naming the value, and the allocator keeps working), size 0 and sizes that overflow
// when rounded, many streams on a big device without exhausting the address space, the
// device-wide wait (expseg_synchronize), and
// physical pages reused across streams (created once, one set_access per new range).
#include "alloc_support.h"
#include "chunk_support.h"
#include "policy.h" // EXPSEG_CHUNK_MAX

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

bool msg_has(const char *needle) { return std::strstr(expseg_last_error(), needle) != nullptr; }

// The allocator still serves a request and passes its checker.
void still_works(expseg_allocator *a, const char *after) {
  void *p = nullptr;
  ASSERT_EQ(expseg_malloc(a, 12345, 3, &p), EXPSEG_OK) << after << ": " << expseg_last_error();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(expseg_free(a, p), EXPSEG_OK) << after;
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << after << ": " << expseg_last_error();
}

TEST(AllocApi, NullAllocator) {
  void *p = reinterpret_cast<void *>(0x1234);
  EXPECT_EQ(expseg_malloc(nullptr, 10, 0, &p), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr) << "*out must be cleared on failure";
  EXPECT_TRUE(msg_has("NULL")) << expseg_last_error();
  EXPECT_EQ(expseg_free(nullptr, &p), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_record_stream(nullptr, &p, 1), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_empty_cache(nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_set_memory_fraction(nullptr, 0.5), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_configure(nullptr, "expandable_segments:False"), EXPSEG_ERR_INVALID_ARGUMENT);
  int64_t v = 0;
  EXPECT_EQ(expseg_stat(nullptr, "num_ooms", &v), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_check(nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_add_oom_observer(nullptr, [](void *, int, size_t, size_t, size_t) {}, nullptr),
            EXPSEG_ERR_INVALID_ARGUMENT);
  char buf[8] = "x";
  EXPECT_EQ(expseg_config_string(nullptr, buf, sizeof buf), 0u);
  expseg_destroy(nullptr);  // no-op
  expseg_reset_peak_stats(nullptr);
  expseg_reset_accumulated_stats(nullptr);
  expseg_stats_foreach(nullptr, [](void *, const char *, int64_t) { FAIL(); }, nullptr);
}

TEST(AllocApi, NullOutPointers) {
  EXPECT_EQ(expseg_create("sim", 0, "", nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(msg_has("out")) << expseg_last_error();
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  EXPECT_EQ(expseg_malloc(a.get(), 100, 0, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(msg_has("out")) << expseg_last_error();
  int64_t v = 0;
  EXPECT_EQ(expseg_stat(a.get(), "num_ooms", nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_stat(a.get(), nullptr, &v), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_configure(a.get(), nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_add_oom_observer(a.get(), nullptr, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(stat_of(a.get(), "num_ooms"), 0);
  still_works(a.get(), "NULL out-pointers");
}

TEST(AllocApi, NegativeDevice) {
  expseg_allocator *a = reinterpret_cast<expseg_allocator *>(0x1);
  EXPECT_EQ(expseg_create("sim", -1, "", &a), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(a, nullptr);
  EXPECT_TRUE(msg_has("-1")) << expseg_last_error();
}

TEST(AllocApi, FreeOfForeignFreedAndInteriorPointers) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  expseg_allocator *A = a.get();
  void *p = nullptr;
  ASSERT_EQ(expseg_malloc(A, 4096, 0, &p), EXPSEG_OK);
  int local = 0;
  char want[64];
  snprintf(want, sizeof want, "%p", static_cast<void *>(&local));
  EXPECT_EQ(expseg_free(A, &local), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(msg_has(want)) << expseg_last_error();
  void *interior = static_cast<char *>(p) + 512;
  snprintf(want, sizeof want, "%p", interior);
  EXPECT_EQ(expseg_free(A, interior), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(msg_has(want)) << expseg_last_error();
  EXPECT_EQ(stat_of(A, "allocation.all.current"), 1) << "a bad free must not change the stats";
  EXPECT_EQ(expseg_free(A, p), EXPSEG_OK);
  snprintf(want, sizeof want, "%p", p);
  EXPECT_EQ(expseg_free(A, p), EXPSEG_ERR_INVALID_ARGUMENT);  // double free
  EXPECT_TRUE(msg_has(want)) << expseg_last_error();
  EXPECT_EQ(stat_of(A, "allocation.all.current"), 0);
  EXPECT_EQ(expseg_free(A, nullptr), EXPSEG_OK);  // freeing NULL is OK
  // a pointer of another allocator is foreign here
  AllocPtr b = make_alloc("sim:capacity=8G", "");
  void *q = nullptr;
  ASSERT_EQ(expseg_malloc(b.get(), 4096, 0, &q), EXPSEG_OK);
  if (q != p) {  // sim address spaces may coincide between allocators
    EXPECT_EQ(expseg_free(A, q), EXPSEG_ERR_INVALID_ARGUMENT);
  }
  EXPECT_EQ(expseg_free(b.get(), q), EXPSEG_OK);
  still_works(A, "bad frees");
}

TEST(AllocApi, RecordStreamOnUnknownPointer) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  expseg_allocator *A = a.get();
  int local = 0;
  char want[64];
  snprintf(want, sizeof want, "%p", static_cast<void *>(&local));
  EXPECT_EQ(expseg_record_stream(A, &local, 5), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(msg_has(want)) << expseg_last_error();
  void *p = nullptr;
  ASSERT_EQ(expseg_malloc(A, 4096, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);
  EXPECT_EQ(expseg_record_stream(A, p, 5), EXPSEG_ERR_INVALID_ARGUMENT);  // freed
  EXPECT_EQ(expseg_record_stream(A, nullptr, 5), EXPSEG_OK);  // ignored, as in PyTorch
  still_works(A, "bad record_stream");
}

TEST(AllocApi, SizeZeroReturnsNull) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  void *p = reinterpret_cast<void *>(0x1);
  EXPECT_EQ(expseg_malloc(a.get(), 0, 0, &p), EXPSEG_OK);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(stat_of(a.get(), "allocation.all.allocated"), 0);
  EXPECT_EQ(stat_of(a.get(), "reserved_bytes.all.current"), 0);
  still_works(a.get(), "size 0");
}

TEST(AllocApi, SizesThatOverflowWhenRounded) {
  AllocPtr a = make_alloc("sim:capacity=8G", "roundup_power2_divisions:4");
  expseg_allocator *A = a.get();
  // PyTorch refuses 1 EiB (2^60) and more as out of memory before calling the driver, and
  // does not count it in num_ooms
  for (size_t size : {SIZE_MAX, SIZE_MAX - 511, (size_t)1 << 61, ((size_t)1 << 60) + 1,
                      (size_t)1 << 60}) {
    void *p = reinterpret_cast<void *>(0x1);
    EXPECT_EQ(expseg_malloc(A, size, 0, &p), EXPSEG_ERR_OUT_OF_MEMORY) << size;
    EXPECT_EQ(p, nullptr);
    EXPECT_TRUE(msg_has(std::to_string(size).c_str())) << expseg_last_error();
    EXPECT_TRUE(msg_has("1 EiB")) << expseg_last_error();
  }
  EXPECT_EQ(stat_of(A, "num_ooms"), 0) << "the 1 EiB guard is not counted as an OOM";
  EXPECT_EQ(stat_of(A, "num_device_alloc"), 0) << "refused before any driver call";
  // just below the 1 EiB guard: a plain OOM
  void *p = nullptr;
  EXPECT_EQ(expseg_malloc(A, ((size_t)1 << 60) - 512, 0, &p), EXPSEG_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(stat_of(A, "num_ooms"), 1);
  still_works(A, "huge sizes");
}

TEST(AllocApi, FractionsOutsideRange) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  expseg_allocator *A = a.get();
  char before[512], after[512];
  expseg_config_string(A, before, sizeof before);
  struct {
    double f;
    const char *text;
  } bad[] = {{-0.1, "-0.1"}, {1.5, "1.5"}, {NAN, "nan"}, {INFINITY, "inf"}, {-INFINITY, "-inf"}};
  for (auto &c : bad) {
    EXPECT_EQ(expseg_set_memory_fraction(A, c.f), EXPSEG_ERR_INVALID_ARGUMENT) << c.text;
    EXPECT_TRUE(msg_has(c.text)) << expseg_last_error();
    EXPECT_TRUE(msg_has("[0, 1]")) << expseg_last_error();
  }
  expseg_config_string(A, after, sizeof after);
  EXPECT_STREQ(before, after);
  EXPECT_EQ(expseg_set_memory_fraction(A, 0.0), EXPSEG_OK);
  EXPECT_EQ(expseg_set_memory_fraction(A, 1.0), EXPSEG_OK);
  still_works(A, "bad fractions");
}

TEST(AllocApi, ConfigureWithBadTextLeavesConfigUnchanged) {
  AllocPtr a = make_alloc("sim:capacity=8G", "max_split_size_mb:64,expandable_segments:False");
  expseg_allocator *A = a.get();
  char before[1024], after[1024];
  size_t n = expseg_config_string(A, before, sizeof before);
  ASSERT_LT(n, sizeof before);
  struct {
    const char *text;
    const char *named;
  } bad[] = {
      {"expandable_segments:Maybe", "Maybe"},
      {"no_such_key:1", "no_such_key"},
      {"max_split_size_mb:5", "5"},  // below the accepted 20
      {"max_split_size_mb:100,garbage_collection_threshold:1.5", "1.5"},
      {"expandable_segments:True,roundup_power2_divisions:3", "3"},
      {"page_size_mb:4", "page_size_mb"},  // only at creation
      {"expandable_segments", "expandable_segments"},
  };
  for (auto &c : bad) {
    EXPECT_EQ(expseg_configure(A, c.text), EXPSEG_ERR_CONFIG) << c.text;
    EXPECT_TRUE(msg_has(c.named)) << c.text << " -> " << expseg_last_error();
    expseg_config_string(A, after, sizeof after);
    EXPECT_STREQ(before, after) << "config changed by rejected text " << c.text;
  }
  EXPECT_EQ(stat_of(A, "max_split_size"), (int64_t)(64 * MiB));
  still_works(A, "bad configure");
  // a good one takes effect, partially: only the keys given
  ASSERT_EQ(expseg_configure(A, "expandable_segments:True"), EXPSEG_OK) << expseg_last_error();
  expseg_config_string(A, after, sizeof after);
  EXPECT_NE(std::strstr(after, "max_split_size_mb:64"), nullptr) << after;
  EXPECT_EQ(stat_of(A, "max_split_size"), (int64_t)(64 * MiB));
  // the printed string parses back to itself
  AllocPtr b = make_alloc("sim:capacity=8G", after);
  char again[1024];
  expseg_config_string(b.get(), again, sizeof again);
  EXPECT_STREQ(after, again);
}

TEST(AllocApi, UnknownDriverSpec) {
  for (const char *spec : {"bogus", "sim:capacity=lots", "sim:nosuch=1", "host:granularity=3"}) {
    expseg_allocator *a = reinterpret_cast<expseg_allocator *>(0x1);
    EXPECT_EQ(expseg_create(spec, 0, "", &a), EXPSEG_ERR_CONFIG) << spec;
    EXPECT_EQ(a, nullptr) << spec;
    std::string s(spec);
    std::string part = s.find('=') != std::string::npos ? s.substr(s.find(':') + 1) : s;
    part = part.substr(0, part.find('='));
    EXPECT_TRUE(msg_has(part.c_str())) << spec << " -> " << expseg_last_error();
  }
  expseg_allocator *a = reinterpret_cast<expseg_allocator *>(0x1);
  EXPECT_EQ(expseg_create("sim:capacity=8G", 0, "nonsense_key:1", &a), EXPSEG_ERR_CONFIG);
  EXPECT_EQ(a, nullptr);
  EXPECT_TRUE(msg_has("nonsense_key")) << expseg_last_error();
}

// 1,000 streams on an 80 GiB device, each with a small and a large block: every malloc
// succeeds and the address space reserved stays far below the 128 TiB a process has.
TEST(AllocApi, ThousandStreamsDoNotExhaustAddressSpace) {
  AllocPtr a = make_alloc("sim:capacity=80G", "");
  expseg_allocator *A = a.get();
  std::vector<void *> ps;
  for (expseg_stream s = 1; s <= 1000; s++) {
    void *p = nullptr, *q = nullptr;
    ASSERT_EQ(expseg_malloc(A, 64 * KiB, s, &p), EXPSEG_OK) << "stream " << s << ": "
                                                           << expseg_last_error();
    ASSERT_EQ(expseg_malloc(A, 40 * MiB, s, &q), EXPSEG_OK) << "stream " << s << ": "
                                                           << expseg_last_error();
    ps.push_back(p);
    ps.push_back(q);
  }
  int64_t va = stat_of(A, "expseg.reserved_va_bytes.current");
  const int64_t limit = (int64_t)128 << 40;
  std::printf("1000 streams: %.2f TiB of address space reserved, %lld segments\n",
              (double)va / (double)((int64_t)1 << 40), (long long)stat_of(A, "segment.all.current"));
  EXPECT_LT(va, limit / 4) << "reserved VA " << va;
  EXPECT_EQ(stat_of(A, "allocation.all.current"), 2000);
  EXPECT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
  for (void *p : ps) ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "expseg.reserved_va_bytes.current"), 0);
}

// Physical pages are created once. A growth creates its pages as chunks (policy.h; the
// request's own pages as chunks of at most EXPSEG_REQUEST_CHUNK_MAX: 100 MiB is two), each
// created and mapped with one call. Freed on stream 1 they serve 100 MiB on stream 2 without a driver call
// (the free block is lent: reuse before growth); what no free block can serve whole grows
// where the fewest pages are missing, and the pages come from idle chunks moved there, not
// from the driver.
TEST(AllocApi, PhysicalPagesAreReusedAcrossStreams) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  expseg_allocator *A = a.get();
  auto chunks = [](size_t n) { return (int64_t)growth_chunk_sizes(n, n).size(); };
  void *p = nullptr;
  ASSERT_EQ(expseg_malloc(A, 100 * MiB, 1, &p), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "expseg.created_bytes"), (int64_t)(100 * MiB));
  EXPECT_EQ(stat_of(A, "expseg.driver.set_access"), 1);
  EXPECT_EQ(stat_of(A, "expseg.driver.create"), chunks(100 * MiB));
  EXPECT_EQ(stat_of(A, "expseg.driver.map"), chunks(100 * MiB));
  ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);
  void *q = nullptr;
  ASSERT_EQ(expseg_malloc(A, 100 * MiB, 2, &q), EXPSEG_OK);
  EXPECT_EQ(q, p) << "stream 1's free block, lent";
  EXPECT_EQ(stat_of(A, "expseg.num_lent"), 1);
  EXPECT_EQ(stat_of(A, "expseg.driver.create"), chunks(100 * MiB));
  EXPECT_EQ(stat_of(A, "expseg.driver.map"), chunks(100 * MiB));
  EXPECT_EQ(stat_of(A, "expseg.driver.set_access"), 1);
  ASSERT_EQ(expseg_free(A, q), EXPSEG_OK);
  // Freed blocks of 64 and 40 MiB with a live one between: 70 MiB on stream 3 grows at the
  // end of stream 1's segment after the 40 MiB (30 MiB missing there, 70 in a segment of
  // its own) and takes those pages from the 64 MiB block's idle chunks, each moved whole
  // (as many as cover 30 MiB): nothing is created.
  void *x = nullptr, *keep = nullptr, *y = nullptr, *z = nullptr;
  ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);
  ASSERT_EQ(stat_of(A, "reserved_bytes.all.current"), 0);
  ASSERT_EQ(expseg_malloc(A, 64 * MiB, 1, &x), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(A, 20 * MiB, 1, &keep), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(A, 40 * MiB, 1, &y), EXPSEG_OK);
  const int64_t created = stat_of(A, "expseg.created_bytes"), moved = stat_of(A, "expseg.pages_moved");
  ASSERT_EQ(created, (int64_t)(224 * MiB));
  ASSERT_EQ(expseg_free(A, x), EXPSEG_OK);
  ASSERT_EQ(expseg_free(A, y), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(A, 70 * MiB, 3, &z), EXPSEG_OK);
  EXPECT_EQ(z, y) << "grown after stream 1's free block";
  EXPECT_EQ(stat_of(A, "expseg.created_bytes"), created) << "pages were not reused";
  size_t moved_bytes = 0; // the 64 MiB block's chunks, whole, until 30 MiB are covered
  for (size_t c : growth_chunk_sizes(64 * MiB, 64 * MiB)) {
    if (moved_bytes >= 30 * MiB) break;
    moved_bytes += c;
  }
  EXPECT_EQ(stat_of(A, "expseg.pages_moved") - moved, (int64_t)(moved_bytes / (2 * MiB)))
      << "whole chunks of the 64 MiB block, enough for 30 MiB";
  EXPECT_EQ(stat_of(A, "expseg.num_lent"), 2);
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), (int64_t)(124 * MiB));
  for (void *v : {keep, z}) ASSERT_EQ(expseg_free(A, v), EXPSEG_OK);
  expect_consistent(A, "page reuse");
}

// A small request on another stream borrows from a large idle block instead of moving its
// chunk (a chunk moves only whole): a block of one chunk (CHUNK_MAX - 4 MiB) freed on stream
// 0 lends 3 MiB to stream 1, the small pool creates its own few pages for 1 KiB, and the
// block asked again on stream 0 grows only by what the lent 3 MiB took (4 MiB of pages).
// Moving the chunk would have held twice the block.
TEST(AllocApi, SmallGrowthDoesNotMoveALargeIdleChunk) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  expseg_allocator *A = a.get();
  const size_t big = EXPSEG_CHUNK_MAX - 4 * MiB;
  ASSERT_GE(big, 4 * MiB);
  void *p = nullptr, *q = nullptr, *s = nullptr;
  ASSERT_EQ(expseg_malloc(A, big, 0, &p), EXPSEG_OK);
  ASSERT_EQ(stat_of(A, "expseg.driver.create"), 1) << "one chunk";
  ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(A, 3 * MiB, 1, &q), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "expseg.num_lent"), 1);
  ASSERT_EQ(expseg_malloc(A, 1024, 0, &s), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "expseg.pages_moved"), 0);
  ASSERT_EQ(expseg_malloc(A, big, 0, &p), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "expseg.pages_moved"), 0);
  EXPECT_EQ(stat_of(A, "reserved_bytes.large_pool.current"), (int64_t)(big + 4 * MiB));
  EXPECT_EQ(stat_of(A, "reserved_bytes.small_pool.current"), (int64_t)(4 * MiB));
  for (void *x : {p, q, s}) ASSERT_EQ(expseg_free(A, x), EXPSEG_OK);
  expect_consistent(A, "small growth");
}

// A large growth takes the small pool's idle chunks even when they cover only part of what
// the growth lacks (the rest is created): the idle memory is not held beside new memory.
// (When the other pool's chunks were taken only if they covered the whole growth, the
// small pool's memory stayed idle and the large pool created all 20 MiB.) Ten 1 MiB
// blocks freed leave more than 8 MiB idle in the small pool, so holding it beside 20 MiB
// more would pass 1.012 x the 20 MiB peak + 8 MiB: the growth moves idle chunks
// (_expseg_move_first; below that bound it creates its pages and leaves them be).
TEST(AllocApi, GrowthTakesTheOtherPoolsIdleChunkThatCoversPartOfIt) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  expseg_allocator *A = a.get();
  std::vector<void *> s(10, nullptr);
  for (void *&x : s) ASSERT_EQ(expseg_malloc(A, MiB, 0, &x), EXPSEG_OK);
  const int64_t small = stat_of(A, "reserved_bytes.small_pool.current");
  ASSERT_GT(small, (int64_t)(8 * MiB + 20 * MiB / 1000 * 12));
  ASSERT_LT(small, (int64_t)(20 * MiB));
  for (void *x : s) ASSERT_EQ(expseg_free(A, x), EXPSEG_OK);
  void *p = nullptr;
  ASSERT_EQ(expseg_malloc(A, 20 * MiB, 0, &p), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "expseg.pages_moved"), small / (int64_t)(2 * MiB));
  EXPECT_EQ(stat_of(A, "reserved_bytes.small_pool.current"), 0);
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), (int64_t)(20 * MiB)) << "no idle memory held";
  EXPECT_EQ(stat_of(A, "expseg.created_bytes"), (int64_t)(20 * MiB)) << "only what was lacking";
  ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);
  expect_consistent(A, "partial take");
}

// A held stream's pages do not move: the request creates new memory instead.
TEST(AllocApi, PagesOfBusyStreamDoNotMove) {
  AllocPtr a = make_alloc("sim:capacity=8G", "");
  expseg_allocator *A = a.get();
  ASSERT_EQ(alloc_test_hold(A, 1, true), EXPSEG_OK);
  void *p = nullptr;
  ASSERT_EQ(expseg_malloc(A, 20 * MiB, 1, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(A, 20 * MiB, 2, &p), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "expseg.pages_moved"), 0);
  EXPECT_EQ(stat_of(A, "expseg.created_bytes"), (int64_t)(40 * MiB));
  ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);
  ASSERT_EQ(alloc_test_hold(A, 1, false), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(A, 40 * MiB, 3, &p), EXPSEG_OK);  // now both may move
  EXPECT_EQ(stat_of(A, "expseg.created_bytes"), (int64_t)(40 * MiB));
  ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);
  expect_consistent(A, "busy stream");
  (void)GiB;
}

}  // namespace

// page_cache_max_mb bounds the unmapped chunks kept for re-mapping. Chunks land in the cache
// when a growth is undone (here: the map of a 6 MiB request's one 6 MiB chunk fails); a
// bound set then with expseg_configure gives back what is over it at once, in whole chunks,
// oldest first: a bound of 4 MiB cannot keep part of a 6 MiB chunk.
TEST(AllocApi, PageCacheBoundIsEnforced) {
  for (int bound_mb : {0, 4, -1}) {
    SCOPED_TRACE(bound_mb);
    expseg_vmm_t *sim = nullptr, *fault = nullptr;
    ASSERT_EQ(_expseg_vmm_open("sim:capacity=8G", 0, &sim), EXPSEG_OK);
    ASSERT_EQ(_expseg_fault_new(sim, &fault), EXPSEG_OK);
    expseg_allocator *A = nullptr;
    ASSERT_EQ(alloc_test_create(fault, "", &A), EXPSEG_OK) << expseg_last_error();
    AllocPtr own(A);
    void *p = nullptr, *keep = nullptr;
    // kept live: the small pool's 4 MiB chunk is not idle, so the growth below does not
    // take it and creates its 6 MiB as one chunk
    ASSERT_EQ(expseg_malloc(A, 1000, 0, &keep), EXPSEG_OK) << expseg_last_error();
    expseg_fault_rule_t rule = {EXPSEG_VMM_CALL_map, 2, 1, EXPSEG_ERR_DRIVER};
    _expseg_fault_set_rules(fault, &rule, 1);
    static_assert(EXPSEG_CHUNK_MAX >= ((size_t)6 << 20), "6 MiB is one chunk");
    EXPECT_EQ(expseg_malloc(A, 6 * MiB, 0, &p), EXPSEG_ERR_DRIVER);
    EXPECT_EQ(stat_of(A, "expseg.cached_physical_bytes.current"), (int64_t)(6 * MiB))
        << "the chunk created for the request waits in the cache";
    _expseg_fault_set_rules(fault, nullptr, 0);
    if (bound_mb >= 0) {
      ASSERT_EQ(expseg_configure(A, ("page_cache_max_mb:" + std::to_string(bound_mb)).c_str()),
                EXPSEG_OK)
          << expseg_last_error();
    }
    int64_t left = bound_mb < 0 ? (int64_t)(6 * MiB) : 0;
    EXPECT_EQ(stat_of(A, "expseg.cached_physical_bytes.current"), left);
    EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), (int64_t)(4 * MiB) + left);
    expect_consistent(A, "after the bound");
    ASSERT_EQ(expseg_malloc(A, 1000, 0, &p), EXPSEG_OK) << expseg_last_error();
    EXPECT_EQ(expseg_free(A, p), EXPSEG_OK);
    EXPECT_EQ(expseg_free(A, keep), EXPSEG_OK);
  }
}

// expseg_synchronize: a device-wide wait, refused while a stream is held (host and sim would
// wait forever), counted, and a clear message for a NULL allocator.
TEST(AllocApi, SynchronizeWaitsForEveryStream) {
  for (const char *spec : {"host:capacity=64M", "sim:capacity=1G"}) {
    expseg_allocator *a = nullptr;
    ASSERT_EQ(expseg_create(spec, 0, nullptr, &a), EXPSEG_OK) << expseg_last_error();
    EXPECT_EQ(expseg_synchronize(a), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_testing_hold_stream(a, 5, true), EXPSEG_OK);
    EXPECT_EQ(expseg_synchronize(a), EXPSEG_ERR_DRIVER) << spec;
    EXPECT_TRUE(msg_has("device_synchronize would block forever: stream 0x5 is held"))
        << expseg_last_error();
    ASSERT_EQ(expseg_testing_hold_stream(a, 5, false), EXPSEG_OK);
    EXPECT_EQ(expseg_synchronize(a), EXPSEG_OK) << expseg_last_error();
    int64_t n = -1;
    ASSERT_EQ(expseg_stat(a, "expseg.driver.device_synchronize", &n), EXPSEG_OK);
    EXPECT_EQ(n, 3) << spec;
    expseg_destroy(a);
  }
  EXPECT_EQ(expseg_synchronize(nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(msg_has("expseg_synchronize: the allocator is NULL")) << expseg_last_error();
}

// Which option keys PyTorch accepts, from the option table (docs/config.md).
TEST(AllocApi, OptionKeysArePytorchsOrExpsegsOwn) {
  auto is = [](const char *k) { return expseg_option_pytorch(k, strlen(k)); };
  EXPECT_EQ(is("expandable_segments"), 1);
  EXPECT_EQ(is("max_split_size_mb"), 1);
  EXPECT_EQ(is("page_size_mb"), 0);
  EXPECT_EQ(is("single_chunk_min_mb"), 0);
  EXPECT_EQ(is("chunk_max_mb"), 0) << "expseg's own: PyTorch refuses it";
  EXPECT_EQ(is("verbose"), 0);
  EXPECT_EQ(is("expandable"), -1) << "a prefix is not a key";
  EXPECT_EQ(is("no_such_key"), -1);
  EXPECT_EQ(expseg_option_pytorch("page_size_mb:2", 12), 0) << "len bounds the key";
  EXPECT_EQ(expseg_option_pytorch(nullptr, 0), -1);
}

// expandable_segments_reserve_by_class with expseg_stream_set_reserve_class: a tagged
// stream's segments reserve the class's share of device memory; other streams and an
// untagged one keep the usual reserve; a class the option does not list changes nothing;
// runtime configuration applies to the segments that follow; bad names are refused, naming
// the byte.
TEST(AllocApi, ReserveClassSizesTheSegmentsOfTaggedStreams) {
  const int64_t GiB = (int64_t)1 << 30;
  AllocPtr a = make_alloc("sim:capacity=80G",
                          "expandable_segments:True,"
                          "expandable_segments_reserve_by_class:[tiny:0.05,fixed:3G]");
  auto va_of = [&](expseg_stream s, size_t size) {
    int64_t before = stat_of(a.get(), "expseg.reserved_va_bytes.current");
    void *p;
    EXPECT_EQ(expseg_malloc(a.get(), size, s, &p), EXPSEG_OK) << expseg_last_error();
    return stat_of(a.get(), "expseg.reserved_va_bytes.current") - before;
  };
  ASSERT_EQ(expseg_stream_set_reserve_class(a.get(), 5, "tiny"), EXPSEG_OK);
  ASSERT_EQ(expseg_stream_set_reserve_class(a.get(), 6, "fixed"), EXPSEG_OK);
  ASSERT_EQ(expseg_stream_set_reserve_class(a.get(), 7, "unlisted"), EXPSEG_OK);
  const int64_t usual = (int64_t)EXPSEG_VA_FIRST; /* any device */
  EXPECT_EQ(va_of(5, 32 << 20), 80 * GiB / 20) << "tiny: 0.05 of device memory";
  EXPECT_EQ(va_of(5, 5 * GiB), 5 * GiB) << "a request above the reserve: a segment its size";
  EXPECT_EQ(va_of(5, 32 << 20), 0) << "room left in the first segment";
  EXPECT_EQ(va_of(6, 32 << 20), 3 * GiB);
  EXPECT_EQ(va_of(7, 32 << 20), usual) << "a class not listed: the usual reserve";
  EXPECT_EQ(va_of(8, 32 << 20), usual) << "untagged";
  // the tag moves: stream 8 becomes tiny, its next segment follows
  ASSERT_EQ(expseg_stream_set_reserve_class(a.get(), 8, "tiny"), EXPSEG_OK);
  EXPECT_EQ(va_of(8, usual + 1), usual + (2 << 20)) << "larger than both: its own size";
  EXPECT_EQ(va_of(8, 64 << 20), 0) << "room in the untagged segment";
  // untagging: the usual reserve again, doubled for the stream's second segment
  ASSERT_EQ(expseg_stream_set_reserve_class(a.get(), 6, nullptr), EXPSEG_OK);
  EXPECT_EQ(va_of(6, 4 * GiB), 2 * usual) << "untagged: the usual reserve, doubled";
  // the configuration is read when a segment is made
  ASSERT_EQ(expseg_configure(a.get(), "expandable_segments_reserve_by_class:[unlisted:2G]"),
            EXPSEG_OK)
      << expseg_last_error();
  EXPECT_EQ(va_of(7, usual), usual)
      << "listed now (2G): a larger request gets its own size, not the doubled usual reserve";
  ASSERT_EQ(expseg_stream_set_reserve_class(a.get(), 10, "unlisted"), EXPSEG_OK);
  EXPECT_EQ(va_of(10, 32 << 20), 2 * GiB) << "a new stream of the class: its 2G";
  EXPECT_EQ(expseg_stream_set_reserve_class(a.get(), 9, "a:b"), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(strstr(expseg_last_error(), "':' at byte 1"), nullptr) << expseg_last_error();
  EXPECT_EQ(expseg_stream_set_reserve_class(a.get(), 9, std::string(64, 'x').c_str()),
            EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(strstr(expseg_last_error(), "1 to 63 bytes"), nullptr) << expseg_last_error();
  EXPECT_EQ(expseg_stream_set_reserve_class(a.get(), (expseg_stream)1 << 50, "tiny"),
            EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_stream_set_reserve_class(nullptr, 9, "tiny"), EXPSEG_ERR_INVALID_ARGUMENT);
  expect_consistent(a.get(), "reserve classes");
}
