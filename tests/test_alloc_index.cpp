// SPDX-License-Identifier: Apache-2.0
// test_alloc_index.cpp: the free index (pools/fidx.c) seen from the API. Best fit is the
// smallest free size that fits on the request's stream and, among blocks of that size, the
// lowest address (PyTorch's rule, and what the single ordered set gave before the two-level
// index): pinned on layouts built by hand. A freed block is the next hit of its size; many
// distinct sizes (size nodes made, left empty, taken back) and random traffic keep
// expseg_check clean. Randomized parts seeded (fixed default, printed).
#include "alloc_support.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;

void *must_alloc(expseg_allocator *a, size_t size, expseg_stream s = 0) {
  void *p = nullptr;
  EXPECT_EQ(expseg_malloc(a, size, s, &p), EXPSEG_OK) << size << ": " << expseg_last_error();
  return p;
}

const char *const kConfs[] = {"", "expandable_segments:False"};

TEST(AllocIndex, FreedBlockIsTheNextHitOfItsSize) {
  for (const char *conf : kConfs) {
    AllocPtr a = make_alloc("sim:capacity=8G", conf);
    void *keep = must_alloc(a.get(), 100 * KiB); // the block's neighbours stay live
    void *p = must_alloc(a.get(), 300 * KiB);
    void *keep2 = must_alloc(a.get(), 100 * KiB);
    ASSERT_EQ(expseg_free(a.get(), p), EXPSEG_OK);
    EXPECT_EQ(expseg_check(a.get()), EXPSEG_OK) << expseg_last_error();
    void *q = must_alloc(a.get(), 300 * KiB - 100); // rounds to the same size
    EXPECT_EQ(q, p) << conf << ": the free block of that size is handed out again";
    ASSERT_EQ(expseg_free(a.get(), q), EXPSEG_OK); // free again: only the stream differs now
    // stream 0 busy: it lends nothing to stream 7 (lending: docs/design.md, "Reuse before
    // growth"), so the index alone answers
    ASSERT_EQ(alloc_test_hold(a.get(), 0, true), EXPSEG_OK);
    void *r = must_alloc(a.get(), 300 * KiB, /*stream*/ 7);
    ASSERT_EQ(alloc_test_hold(a.get(), 0, false), EXPSEG_OK);
    EXPECT_NE(r, p) << conf << ": free blocks are per stream";
    void *t = must_alloc(a.get(), 300 * KiB);
    EXPECT_EQ(t, p) << conf << ": still there for its own stream";
    EXPECT_EQ(expseg_check(a.get()), EXPSEG_OK) << expseg_last_error();
    for (void *x : {keep, keep2, t, r}) ASSERT_EQ(expseg_free(a.get(), x), EXPSEG_OK);
    EXPECT_EQ(expseg_check(a.get()), EXPSEG_OK) << expseg_last_error();
  }
}

// Holes of one size freed in the order high, low, middle: requests of that size take them
// lowest address first, whatever the order of the frees.
TEST(AllocIndex, EqualSizesGoLowestAddressFirst) {
  for (const char *conf : kConfs) {
    AllocPtr a = make_alloc("sim:capacity=8G", conf);
    expseg_allocator *A = a.get();
    std::vector<void *> keep;
    void *h[3];
    for (auto &x : h) {
      keep.push_back(must_alloc(A, 64 * KiB));
      x = must_alloc(A, 256 * KiB);
    }
    keep.push_back(must_alloc(A, 64 * KiB));
    ASSERT_LT(h[0], h[1]);
    ASSERT_LT(h[1], h[2]);
    for (int i : {2, 0, 1}) ASSERT_EQ(expseg_free(A, h[i]), EXPSEG_OK);
    EXPECT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
    for (int i : {0, 1, 2}) EXPECT_EQ(must_alloc(A, 256 * KiB), h[i]) << conf << ": hole " << i;
    // again, freed low to high and taken back one at a time between frees
    ASSERT_EQ(expseg_free(A, h[1]), EXPSEG_OK);
    ASSERT_EQ(expseg_free(A, h[0]), EXPSEG_OK);
    EXPECT_EQ(must_alloc(A, 256 * KiB), h[0]) << conf;
    ASSERT_EQ(expseg_free(A, h[2]), EXPSEG_OK);
    EXPECT_EQ(must_alloc(A, 256 * KiB), h[1]) << conf;
    EXPECT_EQ(must_alloc(A, 256 * KiB), h[2]) << conf;
    for (void *x : keep) ASSERT_EQ(expseg_free(A, x), EXPSEG_OK);
    for (void *x : h) ASSERT_EQ(expseg_free(A, x), EXPSEG_OK);
    EXPECT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
  }
}

// Holes of 512, 384 and 448 KiB (in that address order): a 400 KiB request takes the 448
// KiB hole (the smallest that fits, not the first nor the largest), a 300 KiB one the 384
// KiB hole, and a 500 KiB one the 512 KiB hole; each is cut at its start.
TEST(AllocIndex, SmallestSizeThatFitsWins) {
  for (const char *conf : kConfs) {
    AllocPtr a = make_alloc("sim:capacity=8G", conf);
    expseg_allocator *A = a.get();
    const size_t sizes[3] = {512 * KiB, 384 * KiB, 448 * KiB};
    std::vector<void *> keep;
    void *h[3];
    for (int i = 0; i < 3; i++) {
      keep.push_back(must_alloc(A, 64 * KiB));
      h[i] = must_alloc(A, sizes[i]);
    }
    keep.push_back(must_alloc(A, 64 * KiB));
    for (void *x : h) ASSERT_EQ(expseg_free(A, x), EXPSEG_OK);
    void *p = must_alloc(A, 400 * KiB), *q = must_alloc(A, 300 * KiB), *r = must_alloc(A, 500 * KiB);
    EXPECT_EQ(p, h[2]) << conf;
    EXPECT_EQ(q, h[1]) << conf;
    EXPECT_EQ(r, h[0]) << conf;
    EXPECT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
    for (void *x : {p, q, r}) ASSERT_EQ(expseg_free(A, x), EXPSEG_OK);
    for (void *x : keep) ASSERT_EQ(expseg_free(A, x), EXPSEG_OK);
    EXPECT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
  }
}

// Thousands of distinct sizes freed, merged and taken again: size nodes are made, left
// empty, and taken back (by best fit and when a new size needs one), and the index never
// needs host memory on a free. The checker runs throughout.
TEST(AllocIndex, ManyDistinctSizes) {
  for (const char *conf : kConfs) {
    AllocPtr a = make_alloc("sim:capacity=16G", conf);
    expseg_allocator *A = a.get();
    std::vector<void *> live;
    for (int round = 0; round < 3; round++) {
      for (size_t i = 0; i < 3000; i++) live.push_back(must_alloc(A, (i * 7 % 2999 + 1) * 512));
      for (size_t i = 0; i < live.size(); i += 2) ASSERT_EQ(expseg_free(A, live[i]), EXPSEG_OK);
      ASSERT_EQ(expseg_check(A), EXPSEG_OK) << conf << ": " << expseg_last_error();
      for (size_t i = 0; i < live.size(); i += 2) live[i] = must_alloc(A, (i * 13 % 1999 + 1) * 512);
      for (void *p : live) ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);
      live.clear();
      ASSERT_EQ(expseg_check(A), EXPSEG_OK) << conf << ": " << expseg_last_error();
    }
    ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);
    EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), 0) << conf;
  }
}

// Random sizes, streams and frees; the checker after every step.
TEST(AllocIndex, RandomStaysConsistent) {
  EXPSEG_SEEDED(seed, 13);
  for (const char *conf : {"", "expandable_segments:False"}) {
    AllocPtr a = make_alloc("sim:capacity=4G", conf);
    TestRng rng(seed);
    auto next = [&rng]() { return rng.next(); };
    std::vector<void *> live;
    for (int i = 0; i < 3000; i++) {
      if (live.empty() || next() % 3 != 0) {
        size_t size = (size_t)(next() % 6 == 0 ? next() % (24 * MiB) : next() % (600 * KiB)) + 1;
        void *p = nullptr;
        if (expseg_malloc(a.get(), size, next() % 3, &p) == EXPSEG_OK) live.push_back(p);
      } else {
        size_t k = next() % live.size();
        ASSERT_EQ(expseg_free(a.get(), live[k]), EXPSEG_OK);
        live[k] = live.back();
        live.pop_back();
      }
      if (i % 97 == 0 && next() % 4 == 0) {
        ASSERT_EQ(expseg_empty_cache(a.get()), EXPSEG_OK);
      }
      ASSERT_EQ(expseg_check(a.get()), EXPSEG_OK)
          << conf << ", step " << i << ", seed " << seed << ": " << expseg_last_error();
    }
    for (void *p : live) ASSERT_EQ(expseg_free(a.get(), p), EXPSEG_OK);
    ASSERT_EQ(expseg_empty_cache(a.get()), EXPSEG_OK);
    EXPECT_EQ(stat_of(a.get(), "reserved_bytes.all.current"), 0) << conf << ", seed " << seed;
  }
}

} // namespace
