// SPDX-License-Identifier: Apache-2.0
// test_alloc_placement.cpp: reuse before growth. A request that free memory already mapped
// can serve must not map or create more: its own stream's free blocks first, then a free
// block another stream holds once that stream's work is done (lending, pools/streams.c),
// which waits for the borrower's work when it is freed and then goes back to its owner;
// and such a block when it fits much tighter than the stream's own (lending a tighter fit).
// Also a seeded workload of variable large requests near the device's capacity: no
// out-of-memory error, and peak reserved within 2 % (+ 8 MiB) of the peak requested; and
// growth near that bound (policy: _expseg_grow_tight), which maps only what a request lacks
// where the growth floor alone would pass the bound.
#include "alloc_support.h"
#include "policy.h" // _expseg_grow_for

#include <algorithm>
#include <random>
#include <vector>

namespace {

struct Del {
  void operator()(expseg_allocator *a) const { expseg_destroy(a); }
};
using Alloc = std::unique_ptr<expseg_allocator, Del>;

Alloc make(const char *driver, const char *config) {
  expseg_allocator *a = nullptr;
  EXPECT_EQ(EXPSEG_OK, expseg_create(driver, 0, config, &a)) << expseg_last_error();
  return Alloc(a);
}

constexpr size_t MiB = size_t(1) << 20;

uint64_t grow_calls(expseg_allocator *a) {
  return alloc_test_calls(a, EXPSEG_VMM_CALL_create) + alloc_test_calls(a, EXPSEG_VMM_CALL_map);
}

TEST(Placement, AnotherStreamsIdleFreeBlockIsLentInsteadOfGrowing) {
  Alloc a = make("sim", "expandable_segments:True");
  expseg_allocator *A = a.get();
  const expseg_stream s1 = 0x1000, s2 = 0x2000; // sim: any value is a stream
  void *p = nullptr, *keep = nullptr, *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 64 * MiB, s1, &p));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, s1, &keep)); // p is not the segment's end
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, p));
  const int64_t reserved = stat_of(A, "reserved_bytes.all.current");
  const uint64_t calls = grow_calls(A);
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 40 * MiB, s2, &q));
  EXPECT_EQ(grow_calls(A), calls) << "served by stream 1's free block: nothing mapped";
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), reserved);
  EXPECT_EQ(stat_of(A, "expseg.num_lent"), 1);
  EXPECT_TRUE((uintptr_t)q >= (uintptr_t)p && (uintptr_t)q < (uintptr_t)p + 64 * MiB);
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  // Freed while stream 2's work is unfinished: the block waits for it, and stream 1 (its
  // owner) does not get it back meanwhile.
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(A, s2, true));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, q));
  EXPECT_EQ(stat_of(A, "expseg.pending_free_blocks.current"), 1);
  void *r = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 64 * MiB, s1, &r));
  EXPECT_TRUE((uintptr_t)r + 64 * MiB <= (uintptr_t)q || (uintptr_t)r >= (uintptr_t)q + 40 * MiB)
      << "the lent block went back while its borrower's work was pending";
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, r));
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(A, s2, false));
  // Once stream 2's work is done the block is stream 1's free memory again, merged whole.
  void *t = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, 0, &t)); // a malloc polls the events
  EXPECT_EQ(stat_of(A, "expseg.pending_free_blocks.current"), 0);
  const uint64_t before = grow_calls(A);
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 64 * MiB, s1, &r));
  EXPECT_EQ(grow_calls(A), before);
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  for (void *x : {keep, r, t}) ASSERT_EQ(EXPSEG_OK, expseg_free(A, x));
}

// Lending a tighter fit (policy.h): a request whose own best fit is a much larger block
// (here its segment's 64 MiB of free memory) takes an idle stream's free piece that fits it
// closely, even one too small to hold a whole page, and its own block stays whole for a
// request of its size; not from a stream whose work is still queued.
TEST(Placement, AnIdleStreamsTighterFreePieceIsLentBeforeItsOwnLargeBlock) {
  Alloc a = make("sim", "expandable_segments:True");
  expseg_allocator *A = a.get();
  const expseg_stream s1 = 0x1000, s2 = 0x2000; // sim: any value is a stream
  const size_t piece = 3 * MiB / 2;
  void *p = nullptr, *keep = nullptr, *x = nullptr, *y = nullptr, *q = nullptr, *r = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 64 * MiB, s1, &p));
  // 16 MiB: the large pool's minimum growth, so no surplus block after keep
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 16 * MiB, s1, &keep));
  // stream 2 gets segments of its own (stream 1 busy: nothing of it is lent meanwhile)
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(A, s1, true));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, piece, s2, &x));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, s2, &y)); // after x: x's free stays a piece
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(A, s1, false));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, x));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, p));
  ASSERT_EQ(stat_of(A, "expseg.num_lent"), 0);
  const uint64_t calls = grow_calls(A);
  const int64_t reserved = stat_of(A, "reserved_bytes.all.current");
  // stream 2 busy: its piece is not lent; stream 1's own block serves
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(A, s2, true));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, piece, s1, &q));
  EXPECT_TRUE((uintptr_t)q >= (uintptr_t)p && (uintptr_t)q < (uintptr_t)p + 64 * MiB);
  EXPECT_EQ(stat_of(A, "expseg.num_lent"), 0);
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, q));
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(A, s2, false));
  // stream 2 idle: its piece serves stream 1, whose 64 MiB stay whole
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, piece, s1, &q));
  EXPECT_EQ(q, x) << "stream 2's free piece fits tighter than stream 1's 64 MiB";
  EXPECT_EQ(stat_of(A, "expseg.num_lent"), 1);
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 64 * MiB, s1, &r));
  EXPECT_EQ(r, p) << "stream 1's free block stayed whole";
  EXPECT_EQ(grow_calls(A), calls) << "nothing mapped or created";
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), reserved);
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  for (void *z : {q, r, keep, y}) ASSERT_EQ(EXPSEG_OK, expseg_free(A, z));
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
}

// Lending a tighter fit is asked only when another stream owns a free block in the pool
// (the free index counts those streams): a single-stream program's request cut from a much
// larger free block of its own stays on the hit path (nothing to lend, no search); once a
// second stream holds a free block the request leaves it to look there, and when that
// stream's free blocks are gone again it stays on it.
TEST(Placement, ASingleStreamsRequestFromALargeFreeBlockStaysOnTheHitPath) {
  Alloc a = make("sim", "expandable_segments:True");
  expseg_allocator *A = a.get();
  const expseg_stream s1 = 0x1000, s2 = 0x2000;
  void *big = nullptr, *keep = nullptr, *p = nullptr, *x = nullptr, *y = nullptr;
  EXPECT_EQ(alloc_test_free_streams(A, false), 0u);
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 100 * MiB, s1, &big));
  // 16 MiB: the large pool's minimum growth, so no surplus block after keep
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 16 * MiB, s1, &keep));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, big)); // 100 MiB free, before keep
  EXPECT_EQ(alloc_test_free_streams(A, false), 1u);
  const uint64_t calls = grow_calls(A), slow = expseg_testing_slow_mallocs(A);
  for (int i = 0; i < 3; i++) {
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 4 * MiB, s1, &p));
    EXPECT_EQ(p, big) << "cut from the front of its stream's 100 MiB";
    ASSERT_EQ(EXPSEG_OK, expseg_free(A, p));
  }
  EXPECT_EQ(expseg_testing_slow_mallocs(A), slow)
      << "one stream: every 4 MiB request out of 100 MiB free is a hit";
  EXPECT_EQ(grow_calls(A), calls);
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  // stream 2 gets a free piece of its own (stream 1 held meanwhile: nothing of it is lent)
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(A, s1, true));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 6 * MiB, s2, &x));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, s2, &y));
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(A, s1, false));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, x));
  EXPECT_EQ(alloc_test_free_streams(A, false), 2u);
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  const uint64_t slow2 = expseg_testing_slow_mallocs(A);
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 4 * MiB, s1, &p));
  EXPECT_EQ(expseg_testing_slow_mallocs(A), slow2 + 1)
      << "two streams own free blocks: the request leaves the hit path to look at the other";
  EXPECT_EQ(p, x) << "stream 2's 6 MiB fits tighter than stream 1's 100 MiB";
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  // stream 2 frees and empties its cache: its segment and free blocks go, and so does the
  // second owner; stream 1's requests are hits again
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, p));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, y));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 100 * MiB, s1, &big)); // stream 1's block kept whole
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(A));
  EXPECT_EQ(alloc_test_free_streams(A, false), 0u);
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, big));
  EXPECT_EQ(alloc_test_free_streams(A, false), 1u);
  const uint64_t slow3 = expseg_testing_slow_mallocs(A);
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 4 * MiB, s1, &p));
  EXPECT_EQ(expseg_testing_slow_mallocs(A), slow3) << "back on the hit path";
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  for (void *z : {p, keep}) ASSERT_EQ(EXPSEG_OK, expseg_free(A, z));
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
}

TEST(Placement, ABusyStreamsFreeBlockIsNotLent) {
  Alloc a = make("sim", "expandable_segments:True");
  expseg_allocator *A = a.get();
  const expseg_stream s1 = 0x1000, s2 = 0x2000; // sim: any value is a stream
  void *p = nullptr, *keep = nullptr, *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 64 * MiB, s1, &p));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, s1, &keep));
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(A, s1, true)); // its kernels still run
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, p));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 40 * MiB, s2, &q));
  EXPECT_TRUE((uintptr_t)q + 40 * MiB <= (uintptr_t)p || (uintptr_t)q >= (uintptr_t)p + 64 * MiB)
      << "memory stream 1 may still be using was handed to stream 2";
  EXPECT_EQ(stat_of(A, "expseg.num_lent"), 0);
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(A, s1, false));
  for (void *x : {keep, q}) ASSERT_EQ(EXPSEG_OK, expseg_free(A, x));
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
}

TEST(Placement, PrivatePoolsNeitherLendNorBorrow) {
  Alloc a = make("sim", "expandable_segments:True");
  expseg_allocator *A = a.get();
  const expseg_stream s1 = 0x1000, s2 = 0x2000; // sim: any value is a stream
  expseg_pool_id pool = 0;
  ASSERT_EQ(EXPSEG_OK, expseg_pool_create(A, &pool));
  void *p = nullptr, *keep = nullptr, *q = nullptr, *r = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc_pool(A, 64 * MiB, s1, pool, &p));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc_pool(A, 8 * MiB, s1, pool, &keep));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, p));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 40 * MiB, s2, &q)); // the general cache
  EXPECT_TRUE((uintptr_t)q + 40 * MiB <= (uintptr_t)p || (uintptr_t)q >= (uintptr_t)p + 64 * MiB)
      << "a private pool's free block went to the general cache";
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, q));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc_pool(A, 40 * MiB, s2, pool, &r)); // same pool: lent
  EXPECT_TRUE((uintptr_t)r >= (uintptr_t)p && (uintptr_t)r < (uintptr_t)p + 64 * MiB);
  for (void *x : {keep, r}) ASSERT_EQ(EXPSEG_OK, expseg_free(A, x));
  ASSERT_EQ(EXPSEG_OK, expseg_pool_release(A, pool));
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
}

// A stream with no place of its own grows at an idle stream's place where that stream's
// free memory serves part of the request; not while blocks it freed wait for its own work
// (on a GPU each such growth would be lent and wait again): then it grows its own.
TEST(Placement, GrowthAtAnotherStreamsPlaceOnlyWithoutPendingFrees) {
  Alloc a = make("sim", "expandable_segments:True");
  expseg_allocator *A = a.get();
  const expseg_stream s1 = 0x1000, s2 = 0x2000;
  void *p1 = nullptr, *p2 = nullptr, *p3 = nullptr, *q = nullptr, *r = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, s1, &p1));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, s1, &p2));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, p2));
  const int64_t created = stat_of(A, "expseg.created_bytes");
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 20 * MiB, s2, &q));
  EXPECT_EQ(q, p2) << "grown after stream 1's free 8 MiB";
  // 12 MiB lacking after the free 8 MiB; the minimum growth is within its bound here (16 MiB
  // held, 28 MiB allocated): policy.h, _expseg_grow_for
  EXPECT_EQ(stat_of(A, "expseg.created_bytes") - created,
            (int64_t)_expseg_grow_for(12 * MiB, 2 * MiB, 16 * MiB, false, 16 * MiB, 28 * MiB,
                                      20 * MiB));
  EXPECT_EQ(stat_of(A, "expseg.num_lent"), 1);
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(A, s2, true));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, q)); // waits for stream 2's work
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, s1, &p3)); // after q
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, p3)); // a free block before an unmapped range again
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 20 * MiB, s2, &r));
  EXPECT_EQ(stat_of(A, "expseg.num_lent"), 1) << "a segment of its own this time";
  EXPECT_NE(r, p3);
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(A, s2, false));
  for (void *x : {p1, r}) ASSERT_EQ(EXPSEG_OK, expseg_free(A, x));
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
}

// 48 blocks of 1.5 MiB, then 1,000 MiB, all in one segment: 1,072 MiB held and allocated,
// the peak. `freed` of the small ones freed (every other one: pieces no 2 MiB request
// fits), then `n` requests of 2 MiB: the reserved bytes each one grew by (0: served from
// memory held).
std::vector<int64_t> growths_for_2MiB(int freed, int n) {
  Alloc a = make("sim", "expandable_segments:True");
  expseg_allocator *A = a.get();
  std::vector<void *> small(48), all;
  for (void *&p : small) {
    EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 3 * MiB / 2, 0, &p)) << expseg_last_error();
  }
  void *big = nullptr;
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 1000 * MiB, 0, &big)) << expseg_last_error();
  all.push_back(big);
  for (int i = 0; i < 48; i++) {
    if (i % 2 == 0 && i / 2 < freed) EXPECT_EQ(EXPSEG_OK, expseg_free(A, small[i]));
    else all.push_back(small[i]);
  }
  std::vector<int64_t> grown;
  for (int i = 0; i < n; i++) {
    const int64_t before = stat_of(A, "reserved_bytes.all.current");
    void *r = nullptr;
    EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 2 * MiB, 0, &r)) << expseg_last_error();
    all.push_back(r);
    grown.push_back(stat_of(A, "reserved_bytes.all.current") - before);
  }
  EXPECT_EQ(stat_of(A, "allocated_bytes.all.peak"), int64_t(1072 * MiB)) << "the peak stands";
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  for (void *x : all) EXPECT_EQ(EXPSEG_OK, expseg_free(A, x));
  return grown;
}

// Growth near the bound (policy.h: _expseg_grow_for, _expseg_grow_tight), weighed against
// the peak: 24 pieces freed (36 MiB; 1,036 MiB allocated, the peak 1,072), so the bound is
// 1.02 x 1,072 + 8 = 1,101.44 MiB. The first 2 MiB request takes the minimum (1,072 + 16 =
// 1,088 MiB held), which serves eight; the ninth passes the bound with the minimum but not
// with the floor (1/128 of 1,088 MiB mapped: 10 MiB in pages; 1,098 MiB held), which serves
// five; then the floor would pass the bound (1,108 MiB), so each growth maps the 2 MiB it
// lacks, also past the bound (1,102, 1,104 MiB). Against the bytes allocated now
// (1.02 x 1,038 + 8 MiB < 1,072 MiB held) every one of them would map only 2 MiB.
TEST(Placement, AGrowthNearTheBoundMapsOnlyWhatIsMissing) {
  const std::vector<int64_t> want = {16, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 0, 2, 2, 2};
  std::vector<int64_t> got = growths_for_2MiB(24, (int)want.size());
  for (int64_t &g : got) g /= (int64_t)MiB;
  EXPECT_EQ(got, want);
}

// Chunks that move together are created together: a growth above one chunk gives the
// request's whole pages chunks of their own, so once it is freed they go back whole, though
// a block placed after it shares the growth's last page.
TEST(Placement, ARequestsOwnPagesGoBackWholeThoughABlockFollowsIt) {
  Alloc a = make("sim", "expandable_segments:True");
  expseg_allocator *A = a.get();
  void *big = nullptr, *after = nullptr;
  const uint64_t creates = alloc_test_calls(A, EXPSEG_VMM_CALL_create);
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 20 * MiB + MiB / 2, 0, &big)) << expseg_last_error();
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), int64_t(22 * MiB));
  EXPECT_EQ(alloc_test_calls(A, EXPSEG_VMM_CALL_create) - creates, 2u)
      << "the request's 10 whole pages, then the page it shares";
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, MiB + MiB / 2, 0, &after)) << expseg_last_error();
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), int64_t(22 * MiB)) << "placed in the rest";
  EXPECT_EQ((char *)after, (char *)big + 20 * MiB + MiB / 2);
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, big));
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(A)) << expseg_last_error();
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), int64_t(2 * MiB))
      << "all 20 MiB under the freed request went back, none pinned by the block after it";
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, after));
  // a growth of at most one chunk stays one chunk
  const uint64_t c2 = alloc_test_calls(A, EXPSEG_VMM_CALL_create);
  void *small = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 5 * MiB + MiB / 2, 0, &small)) << expseg_last_error();
  EXPECT_LE(alloc_test_calls(A, EXPSEG_VMM_CALL_create) - c2, 1u);
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, small));
}

// The same where the growth floor's surplus makes larger chunks than the request's own:
// the request's chunk is still mapped first, under it. 2.5 GiB mapped: a floor of 20 MiB.
TEST(Placement, ARequestsOwnChunkIsMappedUnderItBeforeLargerSurplusChunks) {
  Alloc a = make("sim", "expandable_segments:True");
  expseg_allocator *A = a.get();
  void *base = nullptr, *r = nullptr, *b = nullptr, *c = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 2560 * MiB, 0, &base)) << expseg_last_error();
  const int64_t before = stat_of(A, "reserved_bytes.all.current");
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 5 * MiB, 0, &r)) << expseg_last_error();
  ASSERT_EQ(stat_of(A, "reserved_bytes.all.current") - before, int64_t(20 * MiB)) << "the floor";
  ASSERT_EQ((char *)r, (char *)base + 2560 * MiB);
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 3 * MiB / 2, 0, &b)) << expseg_last_error();
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 27 * MiB / 2, 0, &c)) << expseg_last_error();
  ASSERT_EQ(stat_of(A, "reserved_bytes.all.current") - before, int64_t(20 * MiB)) << "no growth";
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, r));
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(A)) << expseg_last_error();
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current") - before, int64_t(16 * MiB))
      << "the request's two whole pages were one chunk of their own, at its address";
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  for (void *x : {b, c, base}) EXPECT_EQ(EXPSEG_OK, expseg_free(A, x));
}

// chunk_max_mb caps every chunk: a 100 MiB request's own pages become chunks of at most
// 8 MiB, so a 70 MiB block placed where it was, once freed, pins only the chunk it ends in:
// expseg_empty_cache gives back the rest, where the default's large chunks stay pinned.
TEST(Placement, ChunkMaxLeavesOnlyTheSharedChunkPinned) {
  for (const char *conf : {"expandable_segments:True,chunk_max_mb:8", "expandable_segments:True"}) {
    SCOPED_TRACE(conf);
    const bool capped = strstr(conf, "chunk_max_mb") != nullptr;
    Alloc a = make("sim", conf);
    expseg_allocator *A = a.get();
    void *big = nullptr, *mid = nullptr;
    const uint64_t creates = alloc_test_calls(A, EXPSEG_VMM_CALL_create);
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 100 * MiB, 0, &big)) << expseg_last_error();
    const int64_t made = stat_of(A, "expseg.created_bytes");
    const uint64_t n = alloc_test_calls(A, EXPSEG_VMM_CALL_create) - creates;
    if (capped)
      EXPECT_GE(n * 8 * MiB, uint64_t(made)) << n << " chunks for " << made << " bytes: one above 8 MiB";
    else
      EXPECT_LT(n * 8 * MiB, uint64_t(made)) << "the default makes chunks above 8 MiB";
    ASSERT_EQ(EXPSEG_OK, expseg_free(A, big));
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 70 * MiB, 0, &mid)) << expseg_last_error();
    EXPECT_EQ(mid, big) << "placed where the freed request was";
    ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(A)) << expseg_last_error();
    EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), int64_t((capped ? 72 : 100) * MiB))
        << (capped ? "all but the 8 MiB chunk the 70 MiB block ends in went back"
                   : "the default: a 64 MiB and a 36 MiB chunk, both under the block, stay");
    EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
    ASSERT_EQ(EXPSEG_OK, expseg_free(A, mid));
  }
}

// Variable large requests near capacity (an image model whose input size changes): each
// step allocates activations sized by its input, frees them in reverse, keeps the weights.
TEST(Placement, VariableLargeRequestsNearCapacityHoldLittle) {
  EXPSEG_SEEDED(seed, 20261126);
  std::mt19937_64 rng(seed);
  const size_t cap = 24 * 1024 * MiB;
  std::string driver = "sim:capacity=" + std::to_string(cap);
  Alloc a = make(driver.c_str(), "expandable_segments:True");
  expseg_allocator *A = a.get();
  std::vector<void *> weights;
  size_t live = 0, peak_live = 0;
  for (int i = 0; i < 40; i++) {
    void *w = nullptr;
    const size_t sz = (64 + rng() % 192) * MiB;
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, sz, 0, &w)) << expseg_last_error();
    weights.push_back(w);
    live += sz;
  }
  const size_t base = live;
  for (int step = 0; step < 60; step++) {
    const double scale = 0.3 + (rng() % 1000) / 1000.0 * 0.7; // input size of this step
    std::vector<std::pair<void *, size_t>> acts;
    const size_t budget = size_t(double(cap - base) * 0.9 * scale);
    size_t used = 0;
    while (true) {
      size_t sz = size_t(double(16 + rng() % (rng() % 6 == 0 ? 5120 : 1024)) * scale) * MiB +
                  rng() % MiB; // now and then larger than a first reservation (3 GiB)
      if (used + sz > budget) break;
      void *p = nullptr;
      ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, sz, 0, &p))
          << "step " << step << ": " << expseg_last_error();
      acts.push_back({p, sz});
      used += sz;
      live += sz;
      peak_live = std::max(peak_live, live);
      if (rng() % 4 == 0) { // a temporary
        void *t = nullptr;
        const size_t tsz = sz / 2 + 1;
        if (used + tsz <= budget) {
          ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, tsz, 0, &t)) << expseg_last_error();
          peak_live = std::max(peak_live, live + tsz);
          ASSERT_EQ(EXPSEG_OK, expseg_free(A, t));
        }
      }
    }
    for (auto it = acts.rbegin(); it != acts.rend(); ++it) {
      ASSERT_EQ(EXPSEG_OK, expseg_free(A, it->first));
      live -= it->second;
    }
  }
  const double peak = double(stat_of(A, "reserved_bytes.all.peak"));
  printf("peak reserved / requested %.4f (requested %.2f GiB)\n", peak / double(peak_live), double(peak_live) / (1 << 30));
  EXPECT_EQ(stat_of(A, "num_ooms"), 0);
  EXPECT_LE(peak, 1.02 * double(peak_live) + 8.0 * MiB)
      << "peak reserved " << peak << " for a peak of " << peak_live << " requested";
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  for (void *w : weights) ASSERT_EQ(EXPSEG_OK, expseg_free(A, w));
}

} // namespace

// Memory short: the out-of-memory retry grows where the fewest new pages are needed. The
// lowest place that fits is a 128 MiB hole between blocks in use (a 100 MiB request there
// maps 100 MiB, 88 once the one movable chunk is moved); the segment's end follows 70 MiB
// of free memory, 58 of it pinned by a chunk shared with a block in use, so the request
// there maps 30 MiB. A device with 50 MiB left serves it only at the end.
namespace {
// Builds the layout; returns reserved bytes before the request. l1 (64 MiB), a 128 MiB
// hole, l2 (8 MiB), then p's chunks (64 + 64 + 12 MiB) with q (70 MiB) in them.
int64_t fewest_pages_layout(expseg_allocator *A, std::vector<void *> &live) {
  void *l1 = nullptr, *h = nullptr, *l2 = nullptr, *p = nullptr, *q = nullptr;
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 64 * MiB, 0, &l1)) << expseg_last_error();
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 128 * MiB, 0, &h)) << expseg_last_error();
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, 0, &l2)) << expseg_last_error();
  EXPECT_EQ(EXPSEG_OK, expseg_free(A, h));
  EXPECT_EQ(EXPSEG_OK, expseg_empty_cache(A)) << expseg_last_error(); // the hole is unmapped
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 140 * MiB, 0, &p)) << expseg_last_error();
  EXPECT_EQ(EXPSEG_OK, expseg_free(A, p));
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 70 * MiB, 0, &q)) << expseg_last_error();
  EXPECT_EQ((char *)q, (char *)p) << "best fit: q in p's chunks";
  EXPECT_EQ((char *)l2, (char *)l1 + 192 * MiB);
  EXPECT_GT((char *)q, (char *)l2) << "p did not fit the hole";
  live = {l1, l2, q};
  return stat_of(A, "reserved_bytes.all.current");
}
} // namespace

namespace {
// The layout built once on an unconstrained device (to learn what it holds), then again on
// a device with `room` bytes left beyond that; *held: the bytes it holds.
using Layout = int64_t (*)(expseg_allocator *, std::vector<void *> &);
Alloc layout_with_room(Layout layout, size_t room, std::vector<void *> &live, int64_t *held) {
  int64_t peak = 0;
  {
    Alloc a = make("sim", "expandable_segments:True");
    *held = layout(a.get(), live);
    peak = stat_of(a.get(), "reserved_bytes.all.peak");
    for (void *x : live) EXPECT_EQ(EXPSEG_OK, expseg_free(a.get(), x));
  }
  EXPECT_GT(*held, 0);
  EXPECT_LE(peak, *held + int64_t(room)) << "the layout itself fits the device";
  const std::string drv = "sim:capacity=" + std::to_string(*held + int64_t(room));
  Alloc a = make(drv.c_str(), "expandable_segments:True");
  EXPECT_EQ(layout(a.get(), live), *held);
  return a;
}
} // namespace

TEST(Placement, MemoryShortGrowsWhereTheFewestPagesAreNeeded) {
  std::vector<void *> live;
  int64_t held = 0;
  Alloc a = layout_with_room(fewest_pages_layout, 50 * MiB, live, &held);
  expseg_allocator *A = a.get();
  ASSERT_FALSE(::testing::Test::HasFailure());
  void *r = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 100 * MiB, 0, &r)) << expseg_last_error();
  EXPECT_EQ((char *)r, (char *)live[2] + 70 * MiB) << "after q, in the pinned free memory";
  EXPECT_EQ(stat_of(A, "num_ooms"), 0);
  EXPECT_EQ(stat_of(A, "num_alloc_retries"), 1) << "the lowest place was tried first";
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  live.push_back(r);
  for (void *x : live) EXPECT_EQ(EXPSEG_OK, expseg_free(A, x));
}

// Pages that idle chunks elsewhere can bring count as covered. Here the place with the
// fewest new pages (a 64 MiB hole after 64 MiB of free memory in one whole chunk: 18 new
// pages for a 100 MiB request) would need them all from the device, since its own free
// neighbour cannot move into it; the segment's end (after 30 MiB that a chunk shared with a
// block in use pins) needs 35 pages, 32 of which that idle chunk brings. A device with
// 10 MiB left serves the request only there.
namespace {
int64_t movable_layout(expseg_allocator *A, std::vector<void *> &live) {
  void *l1 = nullptr, *f1 = nullptr, *h = nullptr, *l2 = nullptr, *p = nullptr, *q = nullptr;
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 64 * MiB, 0, &l1)) << expseg_last_error();
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 64 * MiB, 0, &f1)) << expseg_last_error();
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 64 * MiB, 0, &h)) << expseg_last_error();
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, 0, &l2)) << expseg_last_error();
  EXPECT_EQ(EXPSEG_OK, expseg_free(A, h));
  EXPECT_EQ(EXPSEG_OK, expseg_empty_cache(A)) << expseg_last_error(); // the hole
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 100 * MiB, 0, &p)) << expseg_last_error();
  EXPECT_EQ(EXPSEG_OK, expseg_free(A, p));
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 70 * MiB, 0, &q)) << expseg_last_error();
  EXPECT_EQ(EXPSEG_OK, expseg_free(A, f1)); // free, whole, next to the hole
  EXPECT_EQ((char *)q, (char *)p) << "best fit: q in p's chunks";
  EXPECT_EQ((char *)h, (char *)l1 + 128 * MiB);
  EXPECT_GT((char *)q, (char *)l2) << "p did not fit the hole";
  live = {l1, l2, q};
  return stat_of(A, "reserved_bytes.all.current");
}
} // namespace

TEST(Placement, MemoryShortCountsIdleChunksThatCanMoveToThePlace) {
  std::vector<void *> live;
  int64_t held = 0;
  Alloc a = layout_with_room(movable_layout, 10 * MiB, live, &held);
  expseg_allocator *A = a.get();
  ASSERT_FALSE(::testing::Test::HasFailure());
  void *r = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 100 * MiB, 0, &r)) << expseg_last_error();
  EXPECT_EQ((char *)r, (char *)live[2] + 70 * MiB) << "after q, at the segment's end";
  EXPECT_EQ(stat_of(A, "num_ooms"), 0);
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), held + int64_t(6 * MiB))
      << "the idle chunk moved; 3 pages created";
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
  live.push_back(r);
  for (void *x : live) EXPECT_EQ(EXPSEG_OK, expseg_free(A, x));
}
