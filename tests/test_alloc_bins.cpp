// test_alloc_bins.cpp: the exact-size bins (pools/bins.c) seen from the API: a freed block
// is handed out again to the next request of its size (the hit); binned blocks do not stop
// empty_cache, a request that needs them merged, or an out-of-memory retry from using their
// memory; PyTorch's inactive_split values hold while blocks sit in bins; expseg_check
// passes throughout. Randomized part seeded (fixed default, printed).
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

// Bins are opt-in (hit_bins:True, docs/config.md): every test here turns them on.
static std::string with_bins(const std::string &conf) {
  return conf.empty() ? "hit_bins:True" : "hit_bins:True," + conf;
}

TEST(AllocBins, FreedBlockIsTheNextHitOfItsSize) {
  AllocPtr a = make_alloc("sim:capacity=8G", with_bins("").c_str());
  void *keep = must_alloc(a.get(), 100 * KiB); // the block's neighbour stays live
  void *p = must_alloc(a.get(), 300 * KiB);
  void *keep2 = must_alloc(a.get(), 100 * KiB);
  ASSERT_EQ(expseg_free(a.get(), p), EXPSEG_OK);
  EXPECT_EQ(expseg_check(a.get()), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(stat_of(a.get(), "active_bytes.all.current"), (int64_t)(200 * KiB))
      << "a binned block is inactive at once";
  void *q = must_alloc(a.get(), 300 * KiB - 100); // rounds to the same size
  EXPECT_EQ(q, p) << "the bin of that size hands the block out again";
  void *r = must_alloc(a.get(), 300 * KiB, /*stream*/ 7);
  EXPECT_NE(r, p) << "bins are per stream";
  EXPECT_EQ(expseg_check(a.get()), EXPSEG_OK) << expseg_last_error();
  for (void *x : {keep, keep2, q, r}) ASSERT_EQ(expseg_free(a.get(), x), EXPSEG_OK);
  EXPECT_EQ(expseg_check(a.get()), EXPSEG_OK) << expseg_last_error();
}

TEST(AllocBins, EmptyCacheGivesBackBinnedMemory) {
  for (const char *conf : {"", "expandable_segments:False"}) {
    AllocPtr a = make_alloc("sim:capacity=8G", with_bins(conf).c_str());
    std::vector<void *> ps;
    for (int i = 0; i < 64; i++) ps.push_back(must_alloc(a.get(), (size_t)(i % 7 + 1) * 3 * MiB));
    for (void *p : ps) ASSERT_EQ(expseg_free(a.get(), p), EXPSEG_OK);
    EXPECT_EQ(expseg_check(a.get()), EXPSEG_OK) << conf << ": " << expseg_last_error();
    ASSERT_EQ(expseg_empty_cache(a.get()), EXPSEG_OK);
    EXPECT_EQ(stat_of(a.get(), "reserved_bytes.all.current"), 0) << conf;
    EXPECT_EQ(expseg_check(a.get()), EXPSEG_OK) << conf << ": " << expseg_last_error();
  }
}

// Binned neighbours merge before growing: with the device full of freed 64 MiB blocks of one
// expandable segment, a request of twice that is served from them at the first miss.
// (Classic segments of 64 MiB never merge with each other: that case is the OOM retry's.)
TEST(AllocBins, MissMergesBinnedBlocksBeforeGrowing) {
  for (const char *conf : {""}) {
    AllocPtr a = make_alloc("sim:capacity=1G", with_bins(conf).c_str());
    std::vector<void *> ps;
    void *p = nullptr;
    while (ps.size() < 64 && expseg_malloc(a.get(), 64 * MiB, 0, &p) == EXPSEG_OK) ps.push_back(p);
    ASSERT_GE(ps.size(), 4u) << conf;
    for (void *x : ps) ASSERT_EQ(expseg_free(a.get(), x), EXPSEG_OK);
    const int64_t reserved = stat_of(a.get(), "reserved_bytes.all.current");
    const int64_t ooms = stat_of(a.get(), "num_ooms");
    const int64_t retries = stat_of(a.get(), "num_alloc_retries");
    void *big = nullptr;
    ASSERT_EQ(expseg_malloc(a.get(), 128 * MiB, 0, &big), EXPSEG_OK)
        << conf << ": " << expseg_last_error();
    EXPECT_EQ(stat_of(a.get(), "num_ooms"), ooms) << conf;
    EXPECT_EQ(stat_of(a.get(), "num_alloc_retries"), retries)
        << conf << ": served at the first miss, not by the out-of-memory retry";
    EXPECT_LE(stat_of(a.get(), "reserved_bytes.all.current"), reserved) << conf;
    EXPECT_EQ(expseg_check(a.get()), EXPSEG_OK) << conf << ": " << expseg_last_error();
    ASSERT_EQ(expseg_free(a.get(), big), EXPSEG_OK);
  }
}

// Classic segment of 20 MiB cut in four 5 MiB blocks: freeing the middle two leaves them
// binned and unmerged, but inactive_split reports one run of 10 MiB, as PyTorch would.
TEST(AllocBins, InactiveSplitCountsRunsNotBinnedBlocks) {
  AllocPtr a = make_alloc("sim:capacity=8G", with_bins("expandable_segments:False").c_str());
  expseg_allocator *A = a.get();
  void *b[4];
  for (auto &x : b) x = must_alloc(A, 5 * MiB);
  ASSERT_EQ(stat_of(A, "segment.large_pool.current"), 1);
  ASSERT_EQ(expseg_free(A, b[1]), EXPSEG_OK);
  ASSERT_EQ(expseg_free(A, b[2]), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "inactive_split.large_pool.current"), 1);
  EXPECT_EQ(stat_of(A, "inactive_split_bytes.large_pool.current"), (int64_t)(10 * MiB));
  EXPECT_EQ(stat_of(A, "expseg.largest_free_block"), (int64_t)(10 * MiB));
  EXPECT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_free(A, b[0]), EXPSEG_OK);
  ASSERT_EQ(expseg_free(A, b[3]), EXPSEG_OK);
  EXPECT_EQ(stat_of(A, "inactive_split.large_pool.current"), 0) << "the whole segment is free";
  EXPECT_EQ(stat_of(A, "inactive_split_bytes.large_pool.current"), 0);
  // PyTorch: -1 when b[3] took the last piece whole, -1 when the segment became whole free;
  // the frees in between are net 0 (merge -1, still split +1) or +1 (b[1], first free)
  EXPECT_EQ(stat_of(A, "inactive_split.large_pool.freed"), 2) << "net rule";
  EXPECT_EQ(stat_of(A, "inactive_split.large_pool.allocated"), 2) << "net rule";
  EXPECT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
}

// Random sizes, streams and frees; the checker after every step.
TEST(AllocBins, RandomStaysConsistent) {
  uint64_t seed = 13;
  if (const char *e = std::getenv("EXPSEG_TEST_SEED")) seed = std::strtoull(e, nullptr, 10);
  std::printf("seed %llu (EXPSEG_TEST_SEED)\n", (unsigned long long)seed);
  for (const char *conf : {"", "expandable_segments:False"}) {
    AllocPtr a = make_alloc("sim:capacity=4G", with_bins(conf).c_str());
    uint64_t s = seed;
    auto next = [&s]() {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      return s;
    };
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
