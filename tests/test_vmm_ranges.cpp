// SPDX-License-Identifier: Apache-2.0
// test_vmm_ranges.cpp: the free-range set (vmm/ranges.c) that sim's address space and the
// host arenas share, against a model (one bool per unit): random takes at random alignments
// and gives-back in random order (seeded, seed printed). After each step the set is sorted,
// never adjacent (coalesced), and covers exactly the model's free units; a take succeeds
// exactly when the first-fit position the model finds exists, at that position; a top-down
// take (sim's top_down=1) exactly at the highest aligned position the model finds.
#include <gtest/gtest.h>

#include "test_seed.h"

#include <cstdio>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "vmm_impl.h"

namespace {

void expect_matches(const expseg_ranges_t &s, const std::vector<bool> &free_unit, uint64_t base) {
  std::vector<bool> seen(free_unit.size(), false);
  for (size_t i = 0; i < s.n; i++) {
    ASSERT_GT(s.r[i].len, 0u);
    if (i > 0) {
      ASSERT_LT(s.r[i - 1].start + s.r[i - 1].len, s.r[i].start) << "not coalesced";
    }
    for (uint64_t u = s.r[i].start; u < s.r[i].start + s.r[i].len; u++) seen[u - base] = true;
  }
  ASSERT_EQ(seen, free_unit);
}

void RandomTakesAndGivesBack(bool top) {
  EXPSEG_SEEDED(seed, 31337);
  const uint64_t base = 1000, units = 512;
  std::mt19937_64 rng(seed);
  expseg_ranges_t s{};
  ASSERT_TRUE(_expseg_ranges_put(&s, base, units));
  std::vector<bool> free_unit(units, true);
  std::vector<std::pair<uint64_t, uint64_t>> taken;
  for (int step = 0; step < 20000; step++) {
    if (taken.empty() || rng() % 2) {
      uint64_t size = 1 + rng() % 24, align = uint64_t(1) << (rng() % 4);
      // The model's first fit: lowest aligned start whose units are all free (top: the
      // highest).
      uint64_t want = UINT64_MAX;
      for (uint64_t a = (base + align - 1) / align * align; a + size <= base + units; a += align) {
        bool ok = true;
        for (uint64_t u = a; u < a + size && ok; u++) ok = free_unit[u - base];
        if (ok) {
          want = a;
          if (!top) break;
        }
      }
      uint64_t got = 0;
      int r = top ? _expseg_ranges_take_top(&s, size, align, &got)
                  : _expseg_ranges_take(&s, size, align, &got);
      ASSERT_GE(r, 0) << "step " << step;
      ASSERT_EQ(r == 1, want != UINT64_MAX) << "step " << step << " size " << size;
      if (r == 1) {
        ASSERT_EQ(want, got) << "step " << step << (top ? ": not the last fit" : ": not the first fit");
        for (uint64_t u = got; u < got + size; u++) free_unit[u - base] = false;
        taken.push_back({got, size});
      }
    } else {
      size_t k = rng() % taken.size();
      auto t = taken[k];
      taken[k] = taken.back();
      taken.pop_back();
      ASSERT_TRUE(_expseg_ranges_put(&s, t.first, t.second));
      for (uint64_t u = t.first; u < t.first + t.second; u++) free_unit[u - base] = true;
    }
    expect_matches(s, free_unit, base);
    if (::testing::Test::HasFatalFailure()) {
      ADD_FAILURE() << "at step " << step;
      break;
    }
  }
  for (auto &t : taken) ASSERT_TRUE(_expseg_ranges_put(&s, t.first, t.second));
  ASSERT_EQ(1u, s.n);
  EXPECT_EQ(base, s.r[0].start);
  EXPECT_EQ(units, s.r[0].len);
  _expseg_ranges_free(&s);
  EXPECT_EQ(0u, s.n);
}

TEST(VmmRanges, MatchesAModelUnderRandomTakesAndGivesBack) { RandomTakesAndGivesBack(false); }
TEST(VmmRanges, TopDownTakesMatchAModel) { RandomTakesAndGivesBack(true); }

} // namespace
