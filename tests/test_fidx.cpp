// SPDX-License-Identifier: Apache-2.0
// test_fidx.cpp: the free index (pools/fidx.c) against a reference ordered set. Random
// inserts, removes and best-fit queries over few streams, both pools and sizes with many
// ties, at random unique addresses; best fit must be exactly the reference's lower_bound of (pool, stream, size, 0)
// (the smallest size that fits, then the lowest address), and the index's own check must
// pass throughout. Few block slots against many sizes, so size nodes run out and empty
// ones are taken back. Seeded (fixed default, printed).
#include "expseg.h"
#include "fidx_support.h"
#include "test_seed.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

namespace {

using Key = std::tuple<int, uint64_t, size_t, uintptr_t, size_t>; // pool, stream, size, ptr, slot

TEST(Fidx, BestFitMatchesAnOrderedSet) {
  const uint64_t seed = test_seed(7);
  for (size_t slots : {64, 600, 3000}) {
    fidx_harness *h = fidx_h_new(slots);
    ASSERT_NE(h, nullptr);
    TestRng rng(seed + slots);
    auto next = [&rng]() { return rng.next(); };
    std::set<Key> ref;
    std::vector<Key> where(slots);
    std::vector<bool> in(slots, false);
    std::set<uintptr_t> used; // addresses of the blocks in, unique
    for (int step = 0; step < 40000; step++) {
      const size_t i = next() % slots;
      const int pool = (int)(next() % 2);
      const uint64_t stream = next() % 3;
      // sizes: few (ties) or many (node churn)
      const size_t size = (next() % 2 ? next() % 8 + 1 : next() % 5000 + 1) * 512;
      if (!in[i] && next() % 3 != 0) {
        // a random unique address, so a block inserted later may lie below the heaps' roots
        // (the last insert is not always the highest address)
        uintptr_t addr;
        do addr = (uintptr_t)(next() % (1u << 20) + 1) * 512;
        while (!used.insert(addr).second);
        fidx_h_insert(h, i, pool, stream, size, addr);
        where[i] = Key{pool, stream, size, addr, i};
        ref.insert(where[i]);
        in[i] = true;
      } else if (in[i]) {
        fidx_h_remove(h, i);
        used.erase(std::get<3>(where[i]));
        ref.erase(where[i]);
        in[i] = false;
      }
      auto it = ref.lower_bound(Key{pool, stream, size, 0, 0});
      long want = (it != ref.end() && std::get<0>(*it) == pool && std::get<1>(*it) == stream)
                      ? (long)std::get<4>(*it) : -1;
      ASSERT_EQ(fidx_h_best(h, pool, stream, size), want)
          << "step " << step << ", slots " << slots << ", " << test_seed_note(seed) << ": best fit of "
          << size << " B on pool " << pool << ", stream " << stream;
      if (step % 500 == 0 || slots == 64) {
        ASSERT_EQ(fidx_h_check(h), 0) << "step " << step << ", " << test_seed_note(seed) << ": "
                                      << expseg_last_error();
      }
    }
    size_t largest = 0;
    for (const Key &k : ref) largest = std::max(largest, std::get<2>(k));
    EXPECT_EQ(fidx_h_largest(h), largest) << test_seed_note(seed);
    for (size_t i = 0; i < slots; i++) {
      if (in[i]) fidx_h_remove(h, i);
    }
    EXPECT_EQ(fidx_h_check(h), 0) << expseg_last_error();
    EXPECT_EQ(fidx_h_best(h, 0, 0, 512), -1);
    fidx_h_free(h);
  }
}

} // namespace
