// SPDX-License-Identifier: Apache-2.0
// test_policy_round.cpp: the size policy (policy/round.c) against PyTorch's observable
// behaviour: round_size with roundup_power2_divisions (both forms, the 512-byte rule, the
// list-form intervals) checked on the reference's examples and against a model of PyTorch's
// code on random sizes (seeded); pool choice, classic segment sizes, the split rule and the
// oversize rules on the reference's worked examples (section 2.6); page size and the
// memory-fraction cap.
#include <gtest/gtest.h>

#include "test_seed.h"

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "test_policy_common.h"

using policy_test::defaults;

using policy_test::conf;

namespace {

constexpr size_t KiB = size_t(1) << 10, MiB = size_t(1) << 20, GiB = size_t(1) << 30;

// PyTorch's round_size, written from its code (CUDACachingAllocator.cpp / AllocatorConfig).
size_t model_round(const expseg_config_t &c, size_t size) {
  if (size >= EXPSEG_MAX_REQUEST) return 0;
  if (size < 512) return 512;
  int lg = 63 - __builtin_clzll(size);
  int idx = std::max(0, std::min(lg - 20, 15));
  size_t div = c.roundup_power2_divisions[idx];
  if (div > 1 && size > 512 * div) {
    if ((size & (size - 1)) == 0) return size;
    size_t floor2 = size_t(1) << lg;
    size_t step = floor2 >> (63 - __builtin_clzll(div));
    if (step == 0) return 2 * floor2;
    size_t fl = size & ~(step - 1);
    return fl == size ? size : fl + step;
  }
  return 512 * ((size + 511) / 512);
}

TEST(PolicyRound, PlainRounding) {
  expseg_config_t c = defaults();
  struct { size_t in, out; } k[] = {{0, 512}, {1, 512}, {511, 512}, {512, 512}, {513, 1024},
                                     {1200, 1536}, {9000, 9216}, {MiB, MiB}, {MiB + 1, MiB + 512},
                                     {EXPSEG_MAX_REQUEST - 1023, EXPSEG_MAX_REQUEST - 512},
                                     {EXPSEG_MAX_REQUEST - 511, EXPSEG_MAX_REQUEST}};
  for (auto &x : k) EXPECT_EQ(_expseg_round_size(&c, x.in), x.out) << x.in;
}

TEST(PolicyRound, Overflow) {
  expseg_config_t c = conf("roundup_power2_divisions:4");
  for (const expseg_config_t *p : {&c}) {
    EXPECT_EQ(_expseg_round_size(p, EXPSEG_MAX_REQUEST + 1), 0u);
    EXPECT_EQ(_expseg_round_size(p, SIZE_MAX), 0u);
    EXPECT_EQ(_expseg_round_size(p, SIZE_MAX - 100), 0u);
    EXPECT_EQ(_expseg_round_size(p, EXPSEG_MAX_REQUEST), 0u);  // PyTorch: >= 1 EiB refused
  }
  expseg_config_t d = defaults();
  EXPECT_EQ(_expseg_round_size(&d, EXPSEG_MAX_REQUEST + 1), 0u);
  EXPECT_EQ(_expseg_round_size(&d, EXPSEG_MAX_REQUEST), 0u);
  EXPECT_EQ(_expseg_round_size(&d, EXPSEG_MAX_REQUEST - 1), EXPSEG_MAX_REQUEST);
}

TEST(PolicyRound, DivisionsAsPyTorchCodeDoes) {
  expseg_config_t c = conf("roundup_power2_divisions:4");
  EXPECT_EQ(_expseg_round_size(&c, 1200), 1536u);       // not 1280: size <= 512 x 4
  EXPECT_EQ(_expseg_round_size(&c, 9000), 10240u);      // step 2048 above 8192
  EXPECT_EQ(_expseg_round_size(&c, 2048), 2048u);       // 512 x 4: plain rounding
  EXPECT_EQ(_expseg_round_size(&c, 2049), 2560u);       // 2048 < 2049, step 512
  EXPECT_EQ(_expseg_round_size(&c, 8192), 8192u);       // a power of two stays
  size_t g12 = (size_t)(1.2 * (double)GiB);
  EXPECT_EQ(_expseg_round_size(&c, g12), GiB + GiB / 4);  // 1.2 GiB -> 1.25 GiB
  EXPECT_EQ(_expseg_round_size(&c, 40 * GiB + 1), 48 * GiB);  // interval 15 covers >= 32 GiB
  expseg_config_t one = conf("roundup_power2_divisions:1");  // 1 = plain rounding
  EXPECT_EQ(_expseg_round_size(&one, 9000), 9216u);
}

TEST(PolicyRound, ListFormIntervals) {
  // key K applies to sizes in [K, 2K) MB; the first entry also below it; '>' after the last
  expseg_config_t c = conf("roundup_power2_divisions:[64:8,256:4,1024:4,>:1]");
  EXPECT_EQ(_expseg_round_size(&c, 600 * KiB), 640 * KiB);        // interval 0 (first fills below): 8
  EXPECT_EQ(_expseg_round_size(&c, MiB + 1), MiB + 128 * KiB);    // interval 0: 8
  EXPECT_EQ(_expseg_round_size(&c, 100 * MiB + 1), 104 * MiB);    // [64, 128) MB: 8
  EXPECT_EQ(_expseg_round_size(&c, 200 * MiB + 1), 200 * MiB + 512);  // [128, 256): 0
  EXPECT_EQ(_expseg_round_size(&c, 300 * MiB + 1), 320 * MiB);    // [256, 512): 4
  EXPECT_EQ(_expseg_round_size(&c, 1100 * MiB), 1280 * MiB);      // [1024, 2048): 4
  EXPECT_EQ(_expseg_round_size(&c, 3 * GiB + 1), 3 * GiB + 512);  // '>' = 1
  // 2.9+ '>' rule: it starts after the last explicit entry, which keeps its own value
  expseg_config_t d = conf("roundup_power2_divisions:[256:4,>:1]");
  EXPECT_EQ(_expseg_round_size(&d, 300 * MiB + 1), 320 * MiB);
  EXPECT_EQ(_expseg_round_size(&d, 600 * MiB + 1), 600 * MiB + 512);
  EXPECT_EQ(_expseg_round_size(&d, 100 * MiB + 1), 112 * MiB);  // below: the first entry's 4
  // a single entry: intervals above it stay off
  expseg_config_t e = conf("roundup_power2_divisions:[2:2]");
  EXPECT_EQ(_expseg_round_size(&e, 3 * MiB + 1), 4 * MiB);
  EXPECT_EQ(_expseg_round_size(&e, 5 * MiB + 1), 5 * MiB + 512);
}

TEST(PolicyRound, MatchesModelOnRandomSizes) {
  EXPSEG_SEEDED(seed, 20261122);
  std::mt19937_64 rng(seed);
  for (int cfg = 0; cfg < 200; cfg++) {
    expseg_config_t c = defaults();
    for (uint64_t &d : c.roundup_power2_divisions) d = rng() % 3 == 0 ? 0 : uint64_t(1) << (rng() % 64);
    for (int i = 0; i < 2000; i++) {
      size_t size = (size_t)(rng() >> (rng() % 64));
      if (size >= EXPSEG_MAX_REQUEST) size >>= 4;
      ASSERT_EQ(_expseg_round_size(&c, size), model_round(c, size)) << size;
      size_t r = _expseg_round_size(&c, size);
      ASSERT_GE(r, size);
      // PyTorch's steps get below 512 B only for sizes >= 2^55 with divisions >= 2^47
      if (size < (size_t(1) << 55)) {
        ASSERT_EQ(r % 512, 0u) << size;
      }
    }
  }
}

TEST(PolicyRound, PoolAndClassicSegmentSize) {
  expseg_config_t c = defaults();
  EXPECT_TRUE(_expseg_is_small(MiB));
  EXPECT_FALSE(_expseg_is_small(MiB + 512));
  EXPECT_EQ(_expseg_classic_segment_size(&c, 512), 2 * MiB);
  EXPECT_EQ(_expseg_classic_segment_size(&c, MiB), 2 * MiB);
  EXPECT_EQ(_expseg_classic_segment_size(&c, MiB + 512), 20 * MiB);
  EXPECT_EQ(_expseg_classic_segment_size(&c, 10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(_expseg_classic_segment_size(&c, 10 * MiB), 10 * MiB);
  EXPECT_EQ(_expseg_classic_segment_size(&c, 11 * MiB + 512), 12 * MiB);
  EXPECT_EQ(_expseg_classic_segment_size(&c, SIZE_MAX - 511), 0u);  // overflow
  expseg_config_t l = conf("large_segment_size_mb:32");
  EXPECT_EQ(_expseg_classic_segment_size(&l, 3 * MiB), 32 * MiB);
}

// Reference section 2.6, non-expandable: pool, segment, split.
TEST(PolicyRound, WorkedExamples) {
  expseg_config_t c = conf("expandable_segments:False");
  struct {
    size_t req;
    bool small;
    size_t segment;
    bool split;
    size_t remainder;
  } ex[] = {{300 * KiB, true, 2 * MiB, true, 2 * MiB - 300 * KiB},
            {MiB + MiB / 2, false, 20 * MiB, true, 18 * MiB + MiB / 2},
            {12 * MiB, false, 12 * MiB, false, 0}};
  for (auto &e : ex) {
    size_t r = _expseg_round_size(&c, e.req);
    EXPECT_EQ(r, e.req);
    EXPECT_EQ(_expseg_is_small(r), e.small);
    size_t seg = _expseg_classic_segment_size(&c, r);
    EXPECT_EQ(seg, e.segment);
    EXPECT_EQ(_expseg_should_split(&c, e.small, false, seg, r), e.split) << e.req;
    if (e.split) {
      EXPECT_EQ(seg - r, e.remainder);
    }
  }
}

TEST(PolicyRound, ShouldSplit) {
  expseg_config_t c = conf("max_split_size_mb:100");
  // small pool: remaining >= 512
  EXPECT_TRUE(_expseg_should_split(&c, true, false, 2 * MiB, 2 * MiB - 512));
  EXPECT_FALSE(_expseg_should_split(&c, true, false, 2 * MiB, 2 * MiB));
  // classic large: rounded < max_split and remaining > 1 MiB
  EXPECT_FALSE(_expseg_should_split(&c, false, false, 20 * MiB, 19 * MiB));
  EXPECT_TRUE(_expseg_should_split(&c, false, false, 20 * MiB, 19 * MiB - 512));
  EXPECT_FALSE(_expseg_should_split(&c, false, false, 300 * MiB, 100 * MiB));  // >= max_split
  EXPECT_TRUE(_expseg_should_split(&c, false, false, 300 * MiB, 100 * MiB - 512));
  // expandable: remaining >= 512 whatever max_split says
  EXPECT_TRUE(_expseg_should_split(&c, false, true, 300 * MiB, 100 * MiB));
  EXPECT_TRUE(_expseg_should_split(&c, false, true, 20 * MiB, 20 * MiB - 512));
  EXPECT_FALSE(_expseg_should_split(&c, false, true, 20 * MiB, 20 * MiB));
  EXPECT_FALSE(_expseg_should_split(&c, false, true, 20 * MiB, 21 * MiB));  // block too small
}

TEST(PolicyRound, OversizeRules) {
  expseg_config_t d = defaults();  // unlimited max_split: everything may serve
  EXPECT_TRUE(_expseg_oversize_ok(&d, 2 * MiB, 4 * GiB));
  expseg_config_t c = conf("max_split_size_mb:100,max_non_split_rounding_mb:20");
  EXPECT_TRUE(_expseg_oversize_ok(&c, 50 * MiB, 99 * MiB));
  EXPECT_FALSE(_expseg_oversize_ok(&c, 50 * MiB, 100 * MiB));   // small request, oversize block
  EXPECT_TRUE(_expseg_oversize_ok(&c, 512 * MiB, 531 * MiB));   // within the 20 MiB window
  EXPECT_FALSE(_expseg_oversize_ok(&c, 512 * MiB, 532 * MiB));
  EXPECT_TRUE(_expseg_oversize_ok(&c, 100 * MiB, 119 * MiB));
  EXPECT_FALSE(_expseg_oversize_ok(&c, 100 * MiB, 120 * MiB));
  expseg_config_t h = conf("max_split_size_mb:100,max_non_split_rounding_mb:17592186044415");
  EXPECT_TRUE(_expseg_oversize_ok(&h, 512 * MiB, SIZE_MAX));  // no overflow in request + window
}

TEST(PolicyRound, PageSize) {
  expseg_config_t c = defaults();  // page_size_mb:2
  EXPECT_EQ(_expseg_page_size(&c, 2 * MiB), 2 * MiB);
  EXPECT_EQ(_expseg_page_size(&c, 64 * KiB), 2 * MiB);
  EXPECT_EQ(_expseg_page_size(&c, 0), 2 * MiB);
  expseg_config_t z = conf("page_size_mb:0");
  EXPECT_EQ(_expseg_page_size(&z, 2 * MiB), 2 * MiB);
  EXPECT_EQ(_expseg_page_size(&z, 64 * KiB), 64 * KiB);
  expseg_config_t t = conf("page_size_mb:3");
  EXPECT_EQ(_expseg_page_size(&t, 2 * MiB), 4 * MiB);
  EXPECT_EQ(_expseg_page_size(&t, 3 * MiB), 3 * MiB);
}

TEST(PolicyRound, AllowedBytes) {
  EXPECT_EQ(_expseg_allowed_bytes(1.0, 80 * GiB), SIZE_MAX);
  EXPECT_EQ(_expseg_allowed_bytes(1.5, 80 * GiB), SIZE_MAX);
  EXPECT_EQ(_expseg_allowed_bytes(0.5, 80 * GiB), 40 * GiB);
  EXPECT_EQ(_expseg_allowed_bytes(0.0, 80 * GiB), 0u);
  EXPECT_EQ(_expseg_allowed_bytes(-1.0, 80 * GiB), 0u);
  EXPECT_EQ(_expseg_allowed_bytes(std::nan(""), 80 * GiB), 0u);
  EXPECT_EQ(_expseg_allowed_bytes(0.25, 1000), 250u);
  EXPECT_EQ(_expseg_allowed_bytes(0.999999, SIZE_MAX), (size_t)(0.999999 * (double)SIZE_MAX));
}

}  // namespace

TEST(PolicyRound, ExpandableGrowthIsProportional) {
  const size_t MiB = (size_t)1 << 20;
  EXPECT_EQ(_expseg_grow_bytes(3 * MiB, 0), 3 * MiB) << "an empty segment maps what is needed";
  EXPECT_EQ(_expseg_grow_bytes(3 * MiB, 128 * MiB), 3 * MiB) << "need above 1/128";
  EXPECT_EQ(_expseg_grow_bytes(512, 1024 * MiB), 8 * MiB) << "at least 1/128 of what is mapped";
  EXPECT_EQ(_expseg_grow_bytes(9 * MiB, 1024 * MiB), 9 * MiB);
}

// _expseg_grow_for(need, page, segment_mapped, small, held, allocated, request); held ==
// allocated:
// no free memory held, far below every bound
TEST(PolicyRound, SmallPoolGrowsAtLeastFourMiB) {
  const size_t MiB = (size_t)1 << 20, GiB = 1024 * MiB, pg = 2 * MiB;
  EXPECT_EQ(_expseg_grow_for(MiB, pg, 0, true, GiB, GiB, MiB), EXPSEG_SMALL_GROW_MIN);
  EXPECT_EQ(EXPSEG_SMALL_GROW_MIN, 4 * MiB);
  EXPECT_EQ(_expseg_grow_for(6 * MiB, pg, 0, true, GiB, GiB, MiB), 6 * MiB) << "a minimum, not a cap";
  EXPECT_EQ(_expseg_grow_for(MiB, pg, 0, true, 0, 0, MiB), EXPSEG_SMALL_GROW_MIN)
      << "within the slack: the small pool's minimum at the first growth";
}

// The large pool's minimum growth applies only to a request below a chunk, and only while
// the memory held after it stays within EXPSEG_GROW_MIN_PERMILLE / 1000 of the most bytes
// allocated at once so far (`allocated`) + EXPSEG_TIGHT_SLACK
TEST(PolicyRound, LargePoolMinimumGrowthOnlyWithinTheBoundOfThePeak) {
  const size_t MiB = (size_t)1 << 20, GiB = 1024 * MiB, pg = 2 * MiB;
  const size_t least = EXPSEG_LARGE_GROW_MIN;
  EXPECT_EQ(least, 16 * MiB);
  EXPECT_EQ(EXPSEG_GROW_MIN_PERMILLE, 1020u);
  EXPECT_EQ(EXPSEG_CHUNK_MAX, 8 * MiB);
  const size_t A = 4 * GiB; // bound: 4096 x 1.02 + 8 = 4185.92 MiB
  EXPECT_EQ(_expseg_grow_for(MiB, pg, 0, false, A - MiB, A, MiB), least)
      << "far below: the minimum";
  EXPECT_EQ(_expseg_grow_for(least + MiB, pg, 0, false, A, A, 2 * MiB), least + MiB)
      << "a minimum, not a cap";
  EXPECT_EQ(_expseg_grow_for(MiB, pg, 0, false, 4168 * MiB, A, MiB), least)
      << "4184 MiB: within";
  EXPECT_EQ(_expseg_grow_for(MiB, pg, 0, false, 4170 * MiB, A, MiB), MiB)
      << "4186 MiB: past 2 %, what is needed";
  EXPECT_EQ(_expseg_grow_for(512, pg, 4 * GiB, false, A, A, 512), 32 * MiB)
      << "the larger of the floor and the minimum";
  EXPECT_EQ(_expseg_grow_for(MiB, pg, 0, false, 0, MiB, MiB), MiB)
      << "a first small request: 16 MiB would pass 8 MiB of slack";
  EXPECT_EQ(_expseg_grow_for(7 * MiB, pg, 0, false, 0, 64 * MiB, 7 * MiB), least)
      << "a request of 7 MiB, below a chunk: the minimum";
  // a request of a chunk or more: no minimum, wherever the bound is
  EXPECT_EQ(_expseg_grow_for(MiB, pg, 0, false, 0, A, EXPSEG_CHUNK_MAX), MiB)
      << "a request of a chunk that lacks 1 MiB here: what it lacks";
  EXPECT_EQ(_expseg_grow_for(MiB, pg, 0, false, 0, A, EXPSEG_CHUNK_MAX - 512), least)
      << "one unit below a chunk: the minimum";
  EXPECT_EQ(_expseg_grow_for(8 * MiB, pg, 0, false, 0, 64 * MiB, 8 * MiB), 8 * MiB)
      << "a request of 8 MiB, a chunk: what it lacks";
  // the bound is of the peak: a growth after frees weighs held against the peak, not the
  // bytes allocated now (the caller passes the peak when it is the larger)
  EXPECT_EQ(_expseg_grow_for(MiB, pg, 0, false, 0, GiB, MiB), least)
      << "nothing held, a 1 GiB peak: the minimum";
  // the minimum rounded to pages: 64 MiB pages make it 64 MiB, within only with room for it
  EXPECT_EQ(_expseg_grow_for(MiB, 64 * MiB, 0, false, A, A, MiB), least)
      << "a 64 MiB page: within 2 % of 4 GiB + 8 MiB (the caller maps the page)";
  EXPECT_EQ(_expseg_grow_for(MiB, 64 * MiB, 0, false, 4140 * MiB, A, MiB), MiB)
      << "a 64 MiB page: 4204 MiB passes the bound";
}

TEST(PolicyRound, GrowthNearTheBoundDropsTheFloorAndMinimum) {
  const size_t MiB = (size_t)1 << 20, GiB = 1024 * MiB;
  EXPECT_EQ(EXPSEG_TIGHT_PERMILLE, 1020u);
  EXPECT_EQ(EXPSEG_TIGHT_SLACK, 8 * MiB);
  // bound for 1 GiB allocated: 1.02 x 1024 + 8 = 1052.48 MiB
  EXPECT_FALSE(_expseg_grow_tight(1000 * MiB, GiB, 2 * MiB, 10 * MiB)) << "far below: the floor";
  EXPECT_TRUE(_expseg_grow_tight(1044 * MiB, GiB, 2 * MiB, 10 * MiB)) << "the floor passes it";
  EXPECT_TRUE(_expseg_grow_tight(1050 * MiB, GiB, 2 * MiB, 10 * MiB));
  EXPECT_TRUE(_expseg_grow_tight(1051 * MiB, GiB, 2 * MiB, 10 * MiB))
      << "past it either way: the surplus would only add to it";
  EXPECT_FALSE(_expseg_grow_tight(1042 * MiB, GiB, 2 * MiB, 10 * MiB)) << "1052 MiB: within";
  EXPECT_FALSE(_expseg_grow_tight(1044 * MiB, GiB, 10 * MiB, 10 * MiB)) << "no floor to drop";
  EXPECT_TRUE(_expseg_grow_tight(7 * MiB, 0, 1, 2 * MiB)) << "the slack alone: 8 MiB";
  EXPECT_TRUE(_expseg_grow_tight(8 * MiB, 0, 1, 2 * MiB)) << "8 MiB + 1 byte: past it";
  EXPECT_FALSE(_expseg_grow_tight(6 * MiB, 0, 1, 2 * MiB)) << "8 MiB: within";
  // no wrap at the ends of size_t
  EXPECT_TRUE(_expseg_grow_tight(SIZE_MAX - MiB, GiB, 2 * MiB, 10 * MiB));
  EXPECT_TRUE(_expseg_grow_tight(0, (size_t)1 << 59, 2 * MiB, SIZE_MAX)) << "2^59 x 1.02";
  EXPECT_FALSE(_expseg_grow_tight((size_t)1 << 59, (size_t)1 << 59, 2 * MiB, 4 * MiB));
  EXPECT_TRUE(_expseg_grow_tight(0, 0, 2 * MiB, SIZE_MAX));
  // through _expseg_grow_for: near the bound only what is needed, in either pool
  EXPECT_EQ(_expseg_grow_for(MiB, 2 * MiB, 1024 * MiB, false, 1051 * MiB, GiB, MiB), MiB);
  EXPECT_EQ(_expseg_grow_for(MiB, 2 * MiB, 0, true, 1051 * MiB, GiB, MiB), MiB);
  EXPECT_EQ(_expseg_grow_for(MiB, 2 * MiB, 1024 * MiB, false, 1030 * MiB, GiB, MiB), 16 * MiB)
      << "1046 MiB after it, within 2 %: the minimum";
  EXPECT_EQ(_expseg_grow_for(MiB, 2 * MiB, 1024 * MiB, false, 1040 * MiB, GiB, MiB), 8 * MiB)
      << "the minimum would pass 1052.48 MiB, the floor (1048 MiB) does not";
}

TEST(PolicyRound, ChunksAreSizedFromTheGrowth) {
  const size_t MiB = (size_t)1 << 20, pg = 2 * MiB, most = EXPSEG_CHUNK_MAX / pg;
  const size_t req_most = EXPSEG_REQUEST_CHUNK_MAX / pg, grow_min = EXPSEG_LARGE_GROW_MIN / pg;
  const size_t big = 100; // pages of a growth larger than one chunk
  ASSERT_GE(most, 2u);
  ASSERT_GT(req_most, most) << "a request's own chunks are the larger";
  ASSERT_GT(grow_min, most) << "the minimum growth is more than one chunk";
  EXPECT_EQ(_expseg_chunk_pages(false, most - 1, pg, false, big), most - 1) << "what is left";
  EXPECT_EQ(_expseg_chunk_pages(false, most + 3, pg, false, big), most) << "at most CHUNK_MAX";
  EXPECT_EQ(_expseg_chunk_pages(false, grow_min, pg, false, grow_min), grow_min)
      << "a growth of at most the minimum: one chunk";
  EXPECT_EQ(_expseg_chunk_pages(false, grow_min - 4, pg, false, grow_min), grow_min - 4)
      << "its pages past the request's own: one chunk";
  EXPECT_EQ(_expseg_chunk_pages(false, grow_min + 1, pg, false, grow_min + 1), most)
      << "a growth above the minimum: chunks of at most CHUNK_MAX";
  EXPECT_EQ(_expseg_chunk_pages(false, most + 3, pg, true, big), most + 3)
      << "a request's own: larger";
  EXPECT_EQ(_expseg_chunk_pages(false, req_most + 1, pg, true, big), req_most)
      << "at most REQUEST_CHUNK_MAX";
  EXPECT_EQ(_expseg_chunk_pages(true, 5, pg, false, 5), 1u) << "PyTorch: a chunk per page";
  EXPECT_EQ(_expseg_chunk_pages(true, 5, pg, true, 5), 1u) << "PyTorch: a chunk per page";
  EXPECT_EQ(_expseg_chunk_pages(false, 0, pg, false, big), 0u);
  EXPECT_EQ(_expseg_chunk_pages(false, 3, EXPSEG_CHUNK_MAX * 2, false, big), 1u)
      << "a page above CHUNK_MAX is still one page";
}

TEST(PolicyRound, ChunkMaxBoundsEveryChunkInWholePages) {
  const size_t MiB = (size_t)1 << 20, pg = 2 * MiB;
  EXPECT_EQ(_expseg_chunk_limit(32, SIZE_MAX, pg), 32u) << "off: the policy's own size";
  EXPECT_EQ(_expseg_chunk_limit(32, 8 * MiB, pg), 4u) << "8 MiB: four pages of 2 MiB";
  EXPECT_EQ(_expseg_chunk_limit(3, 8 * MiB, pg), 3u) << "never more than the policy chose";
  EXPECT_EQ(_expseg_chunk_limit(32, 9 * MiB, pg), 4u) << "rounded down to whole pages";
  EXPECT_EQ(_expseg_chunk_limit(32, 1 * MiB, pg), 1u) << "at least one page";
  EXPECT_EQ(_expseg_chunk_limit(32, 1024 * MiB, pg), 32u);
  EXPECT_EQ(_expseg_chunk_limit(600, 1024 * MiB, pg), 512u) << "the largest setting";
  EXPECT_EQ(_expseg_chunk_limit(32, 8 * MiB, 20 * MiB), 1u) << "a page above the cap: one page";
  EXPECT_EQ(_expseg_chunk_limit(0, 8 * MiB, pg), 0u) << "nothing left: nothing";
  EXPECT_EQ(_expseg_chunk_limit(7, 8 * MiB, 0), 7u) << "no page size: as chosen";
  // applied to the policy's sizes: a request's own 64 MiB chunk becomes 8 MiB ones
  EXPECT_EQ(_expseg_chunk_limit(_expseg_chunk_pages(false, 50, pg, true, 60), 8 * MiB, pg), 4u);
}

TEST(PolicyRound, ARequestsOwnPagesGetChunksOfTheirOwnOnlyInGrowthsAboveAChunk) {
  const size_t MiB = (size_t)1 << 20, pg = 2 * MiB, most = EXPSEG_CHUNK_MAX / pg;
  const size_t one = EXPSEG_LARGE_GROW_MIN / pg; // pages a growth may map as one chunk
  EXPECT_EQ(_expseg_request_pages(one, most - 1, pg, (most - 1) * pg), 0u)
      << "one chunk, a request below a chunk: stays one";
  EXPECT_EQ(_expseg_request_pages(one, most, pg, most * pg), most)
      << "a request of a chunk in a growth of the minimum: a chunk of its own";
  EXPECT_EQ(_expseg_request_pages(most, most, pg, most * pg), 0u) << "no surplus: one chunk";
  EXPECT_EQ(_expseg_request_pages(one + 1, 1, pg, pg), 1u) << "above one chunk: the request's page";
  EXPECT_EQ(_expseg_request_pages(one + 5, most + 2, pg, (most + 2) * pg), most + 2);
  EXPECT_EQ(_expseg_request_pages(one + 5, one + 9, pg, (one + 9) * pg), one + 5)
      << "never above the growth";
  EXPECT_EQ(_expseg_request_pages(one + 5, 0, pg, 0), 0u) << "no whole page under the request";
  EXPECT_EQ(_expseg_request_pages(10, 3, 0, 0), 0u) << "no page size: nothing";
  // a request of a chunk or more starting in memory mapped before: its pages in the growth
  // (fewer than a chunk) are still a chunk of their own
  EXPECT_EQ(_expseg_request_pages(one, most - 1, pg, EXPSEG_CHUNK_MAX), most - 1)
      << "a request of a chunk, part of it in the growth";
  EXPECT_EQ(_expseg_request_pages(one, 1, pg, 12 * MiB), 1u);
  EXPECT_EQ(_expseg_request_pages(one, most - 1, pg, EXPSEG_CHUNK_MAX - 512), 0u)
      << "below a chunk: one chunk";
}

TEST(PolicyRound, AnotherStreamsPlaceOnlyWhenItNeedsFewerPages) {
  EXPECT_TRUE(_expseg_place_better(false, 0, 100)) << "no place of its own: any fitting place";
  EXPECT_TRUE(_expseg_place_better(true, 10, 9));
  EXPECT_FALSE(_expseg_place_better(true, 10, 10)) << "a tie stays on the stream's own place";
  EXPECT_FALSE(_expseg_place_better(true, 10, 11));
}

// Memory short: every place of the stream is weighed, by the pages the device must still
// give (those no idle chunk elsewhere can bring), then by pages; a tie keeps the first.
TEST(PolicyRound, MemoryShortPlacesWeighPagesTheDeviceMustGive) {
  EXPECT_TRUE(_expseg_place_fewest_pages(true));
  EXPECT_FALSE(_expseg_place_fewest_pages(false)) << "the common growth: the lowest place";
  EXPECT_TRUE(_expseg_place_fewer(3, 35, 18, 18)) << "more pages, but fewer from the device";
  EXPECT_FALSE(_expseg_place_fewer(18, 18, 3, 35));
  EXPECT_TRUE(_expseg_place_fewer(0, 20, 0, 30)) << "all covered: fewer pages";
  EXPECT_FALSE(_expseg_place_fewer(5, 30, 5, 30)) << "a tie keeps the lower address";
}

TEST(PolicyRound, LendsATighterFitOnlyWhenItsOwnFitWastesAPage) {
  const size_t MiB = size_t(1) << 20, r = 3 * MiB;
  EXPECT_TRUE(_expseg_lend_look(2, r, 0)) << "no fit of its own: look at other streams";
  EXPECT_FALSE(_expseg_lend_look(2, r, r)) << "an exact fit of its own";
  EXPECT_FALSE(_expseg_lend_look(2, r, r + EXPSEG_LEND_WASTE - 1));
  EXPECT_TRUE(_expseg_lend_look(2, r, r + EXPSEG_LEND_WASTE));
  EXPECT_TRUE(_expseg_lend_look(2, r, 64 * MiB)) << "its segment's large free end";
  EXPECT_TRUE(_expseg_lend_look(9, r, 64 * MiB));
  EXPECT_EQ(EXPSEG_LEND_WASTE, 2 * MiB);
  EXPECT_TRUE(_expseg_lend_tighter(0, 64 * MiB)) << "no fit of its own: any";
  EXPECT_TRUE(_expseg_lend_tighter(64 * MiB, r));
  EXPECT_FALSE(_expseg_lend_tighter(r + 1, r + 1)) << "a tie stays on its own stream";
  EXPECT_FALSE(_expseg_lend_tighter(r, 64 * MiB));
}

// The gate: with fewer than two streams owning free blocks in the pool there is nothing
// to lend, however much the own fit wastes.
TEST(PolicyRound, LendsOnlyWhereAnotherStreamOwnsAFreeBlock) {
  const size_t MiB = size_t(1) << 20, r = 4 * MiB;
  EXPECT_FALSE(_expseg_lend_look(1, r, 100 * MiB)) << "one stream: nothing to lend";
  EXPECT_FALSE(_expseg_lend_look(0, r, 100 * MiB));
  EXPECT_FALSE(_expseg_lend_look(1, r, 0)) << "no fit and no other stream's block";
  EXPECT_TRUE(_expseg_lend_look(2, r, 100 * MiB)) << "a second stream owns a free block";
  EXPECT_FALSE(_expseg_lend_look(2, r, r + 1)) << "the gate open, the own fit tight";
}

TEST(PolicyRound, NoImmediateTakeBackBetweenPools) {
  EXPECT_TRUE(_expseg_may_take_back(0, 5)) << "never robbed";
  EXPECT_FALSE(_expseg_may_take_back(100, 100 + EXPSEG_NO_TAKE_BACK - 1));
  EXPECT_TRUE(_expseg_may_take_back(100, 100 + EXPSEG_NO_TAKE_BACK));
}

TEST(PolicyRound, PrivatePoolMemoryIsTakenOnlyWhenFreeable) {
  EXPECT_TRUE(_expseg_pool_may_take(0, 0, 0, 0)) << "the general cache's own";
  EXPECT_TRUE(_expseg_pool_may_take(3, 0, 0, 0)) << "a pool may take the general cache's";
  EXPECT_TRUE(_expseg_pool_may_take(3, 3, 1, 5)) << "its own, busy or not";
  EXPECT_FALSE(_expseg_pool_may_take(0, 3, 1, 0)) << "a live pool's, all free: kept";
  EXPECT_FALSE(_expseg_pool_may_take(4, 3, 2, 0)) << "another pool's: kept";
  EXPECT_FALSE(_expseg_pool_may_take(0, 3, 0, 1)) << "released, a block still busy: kept";
  EXPECT_TRUE(_expseg_pool_may_take(0, 3, 0, 0)) << "released and all free";
  EXPECT_TRUE(_expseg_pool_may_take(4, 3, 0, 0));
}

TEST(PolicyRound, SegmentAddressSpaceGrowsPerSegment) {
  const size_t MiB = (size_t)1 << 20, GiB = MiB << 10, page = 2 * MiB, total = 80 * GiB;
  expseg_config_t c;
  _expseg_config_defaults(&c);
  EXPECT_EQ(_expseg_segment_va(&c, false, 0, MiB, total, page, nullptr), 8 * GiB) << "EXPSEG_VA_FIRST";
  EXPECT_EQ(_expseg_segment_va(&c, true, 0, MiB, total, page, nullptr), 1 * GiB) << "small: / 8";
  EXPECT_EQ(_expseg_segment_va(&c, false, 1, MiB, total, page, nullptr), 16 * GiB) << "doubles";
  EXPECT_EQ(_expseg_segment_va(&c, false, 3, MiB, total, page, nullptr), 64 * GiB);
  EXPECT_EQ(_expseg_segment_va(&c, false, 9, MiB, total, page, nullptr), 128 * GiB) << "4 doublings";
  EXPECT_EQ(_expseg_segment_va(&c, false, 0, 33 * GiB + 1, total, page, nullptr), 33 * GiB + page)
      << "never less than the request";
  EXPECT_EQ(_expseg_segment_va(&c, true, 0, MiB, 8 * GiB, page, nullptr), 1 * GiB) << "any device";
  EXPECT_EQ(_expseg_segment_va(&c, true, 0, MiB, 8 * GiB, 64 * MiB, nullptr), 4 * GiB) << "64 pages";
  // The default does not depend on the device's size: a device just large enough for a
  // program's peak lays its segments out as a larger one does, so it holds the same memory
  // and does not run out (replay --fit answers at most the peak plus one chunk).
  for (size_t n = 0; n < 6; n++)
    for (bool small : {false, true}) {
      const size_t on80 = _expseg_segment_va(&c, small, n, MiB, total, page, nullptr);
      for (size_t t : {8 * GiB, 78 * GiB + 3 * page, 157 * GiB, 1024 * GiB})
        EXPECT_EQ(_expseg_segment_va(&c, small, n, MiB, t, page, nullptr), on80)
            << "segment " << n << (small ? " small" : " large") << " on " << t;
    }
  c.va_reserve = 3 * GiB;
  EXPECT_EQ(_expseg_segment_va(&c, false, 0, MiB, total, page, nullptr), 3 * GiB);
  EXPECT_EQ(_expseg_segment_va(&c, false, 9, MiB, total, page, nullptr), 48 * GiB)
      << "a size the user set: doubled while under 9/8 of total / 2";
  // expandable_segments_reserve (PyTorch main): used when va_reserve_mb is 0; a fraction of
  // device memory or GiB, at most 9/8 of device memory; va_reserve_mb wins
  expseg_config_t r = defaults();
  char err[256];
  ASSERT_EQ(_expseg_config_parse("expandable_segments_reserve:0.25", "t", nullptr, &r, err, sizeof err),
            EXPSEG_OK);
  EXPECT_EQ(_expseg_segment_va(&r, false, 0, MiB, total, page, nullptr), total / 4);
  EXPECT_EQ(_expseg_segment_va(&r, true, 0, MiB, total, page, nullptr), total / 32) << "small: / 8";
  ASSERT_EQ(_expseg_config_parse("expandable_segments_reserve:40G", "t", nullptr, &r, err, sizeof err),
            EXPSEG_OK);
  EXPECT_EQ(_expseg_segment_va(&r, false, 0, MiB, total, page, nullptr), 40 * GiB);
  ASSERT_EQ(_expseg_config_parse("expandable_segments_reserve:1e6G", "t", nullptr, &r, err, sizeof err),
            EXPSEG_OK);
  EXPECT_EQ(_expseg_segment_va(&r, false, 0, MiB, total, page, nullptr), total + total / 8) << "bounded";
  ASSERT_EQ(_expseg_config_parse("expandable_segments_reserve:1e300G", "t", nullptr, &r, err, sizeof err),
            EXPSEG_OK);
  EXPECT_EQ(_expseg_segment_va(&r, false, 0, MiB, total, page, nullptr), total + total / 8) << "saturates";
  r.va_reserve = 3 * GiB;
  EXPECT_EQ(_expseg_segment_va(&r, false, 0, MiB, total, page, nullptr), 3 * GiB);
}

// expandable_segments_reserve_by_class (PyTorch main): a stream tagged with a listed class
// reserves the class's reserve for every segment (a fraction of device memory or GiB, at
// most 9/8 of it; never doubled; the small pool an eighth); a class not listed, or no
// class, keeps the usual reserve; the class wins over va_reserve_mb and
// expandable_segments_reserve (PyTorch: over its global reserve)
TEST(PolicyRound, ReserveClassSetsTheSegmentsOfItsStreams) {
  const size_t MiB = (size_t)1 << 20, GiB = MiB << 10, page = 2 * MiB, total = 80 * GiB;
  expseg_config_t r = defaults();
  char err[256];
  ASSERT_EQ(_expseg_config_parse("expandable_segments_reserve:0.9,expandable_segments_reserve_by_"
                                 "class:[serving:0.25,ads_sparse:8G,huge:1e9G,tiny:1e-9]",
                                 "t", nullptr, &r, err, sizeof err),
            EXPSEG_OK)
      << err;
  size_t b = 0;
  EXPECT_TRUE(_expseg_class_reserve(&r, "serving", total, &b));
  EXPECT_EQ(b, total / 4);
  EXPECT_TRUE(_expseg_class_reserve(&r, "ads_sparse", total, &b));
  EXPECT_EQ(b, 8 * GiB);
  EXPECT_FALSE(_expseg_class_reserve(&r, "other", total, &b));
  EXPECT_FALSE(_expseg_class_reserve(&r, "serv", total, &b)) << "a prefix is another name";
  EXPECT_FALSE(_expseg_class_reserve(&r, "", total, &b));
  EXPECT_FALSE(_expseg_class_reserve(&r, nullptr, total, &b));
  EXPECT_EQ(_expseg_segment_va(&r, false, 0, MiB, total, page, "serving"), total / 4);
  EXPECT_EQ(_expseg_segment_va(&r, false, 3, MiB, total, page, "serving"), total / 4)
      << "never doubled";
  EXPECT_EQ(_expseg_segment_va(&r, true, 2, MiB, total, page, "serving"), total / 32)
      << "small: / 8";
  EXPECT_EQ(_expseg_segment_va(&r, false, 0, MiB, total, page, "ads_sparse"), 8 * GiB);
  EXPECT_EQ(_expseg_segment_va(&r, false, 0, MiB, total, page, "huge"), total + total / 8)
      << "bounded to 9/8";
  EXPECT_EQ(_expseg_segment_va(&r, false, 0, MiB, total, page, "tiny"), 64 * page)
      << "at least 64 pages";
  EXPECT_EQ(_expseg_segment_va(&r, false, 0, 9 * GiB, total, page, "ads_sparse"), 9 * GiB)
      << "never less than the request";
  EXPECT_EQ(_expseg_segment_va(&r, false, 0, MiB, total, page, "other"), (total / 10) * 9)
      << "an unlisted class: the global reserve";
  r.va_reserve = 3 * GiB;
  EXPECT_EQ(_expseg_segment_va(&r, false, 0, MiB, total, page, "serving"), total / 4)
      << "the class wins over va_reserve_mb";
  EXPECT_EQ(_expseg_segment_va(&r, false, 0, MiB, total, page, "other"), 3 * GiB);
}

// The pinned host pool's carve segments: 1/32 of what carve segments hold, within 2 MiB to
// 256 MiB, page-rounded, never below the request; and pinned_carve_strict's rule: a whole
// free segment larger than a fresh one is passed over, any other free block is taken.
TEST(PolicyRound, CarveSegmentSizeAndStrictReuse) {
  const size_t MiB = (size_t)1 << 20, page = 4096;
  EXPECT_EQ(_expseg_carve_segment_size(0, MiB, page), 2 * MiB) << "at least 2 MiB";
  EXPECT_EQ(_expseg_carve_segment_size(3200 * MiB, MiB, page), 100 * MiB) << "1/32 of held";
  EXPECT_EQ(_expseg_carve_segment_size(3200 * MiB + 3200, MiB, page), 100 * MiB + page)
      << "page-rounded";
  EXPECT_EQ(_expseg_carve_segment_size(64000 * MiB, MiB, page), 256 * MiB) << "at most 256 MiB";
  EXPECT_EQ(_expseg_carve_segment_size(64 * MiB, 9 * MiB, page), 9 * MiB) << "never below cls";
  // not strict: any free block that fits
  EXPECT_TRUE(_expseg_carve_may_take(false, 64 * MiB, true, 2 * MiB));
  // strict: a whole segment larger than a fresh one is passed over; one no larger, and any
  // free block inside a segment in use, are taken
  EXPECT_FALSE(_expseg_carve_may_take(true, 64 * MiB, true, 2 * MiB));
  EXPECT_FALSE(_expseg_carve_may_take(true, 2 * MiB + page, true, 2 * MiB));
  EXPECT_TRUE(_expseg_carve_may_take(true, 2 * MiB, true, 2 * MiB));
  EXPECT_TRUE(_expseg_carve_may_take(true, 64 * MiB, false, 2 * MiB));
}

// Idle chunks move only where creating the missing bytes would pass 1.012 x the most bytes
// allocated at once + 8 MiB: 1000 MiB at most allocated, the bound is 1012 + 8 = 1020 MiB.
TEST(PolicyRound, IdleChunksMoveOnlyNearTheBound) {
  const size_t MiB = (size_t)1 << 20;
  EXPECT_EQ(EXPSEG_MOVE_PERMILLE, 1012u);
  EXPECT_FALSE(_expseg_move_first(1000 * MiB, 20 * MiB, 1000 * MiB)) << "1020 MiB: within";
  EXPECT_TRUE(_expseg_move_first(1000 * MiB, 20 * MiB + 1, 1000 * MiB)) << "a byte past";
  EXPECT_TRUE(_expseg_move_first(1021 * MiB, 0, 1000 * MiB)) << "already past";
  EXPECT_FALSE(_expseg_move_first(0, 8 * MiB, 0)) << "nothing allocated yet: the slack";
  EXPECT_TRUE(_expseg_move_first(0, 8 * MiB + 1, 0));
  EXPECT_FALSE(_expseg_move_first(500 * MiB, 520 * MiB, 1000 * MiB))
      << "weighed against the peak, not against what is held";
  const size_t huge = (size_t)1 << 60;  // no wrap
  EXPECT_TRUE(_expseg_move_first(huge, huge, 0));
  EXPECT_FALSE(_expseg_move_first(0, huge, huge));
  // the free block after a growth's place gives chunks only where memory is short or
  // creating was refused, and then keeps what the request needs of it
  EXPECT_EQ(_expseg_suffix_keep(false, 0), SIZE_MAX);
  EXPECT_EQ(_expseg_suffix_keep(false, 3 * MiB), SIZE_MAX);
  EXPECT_EQ(_expseg_suffix_keep(true, 3 * MiB), 3 * MiB);
  EXPECT_EQ(_expseg_suffix_keep(true, 0), 0u);
}
