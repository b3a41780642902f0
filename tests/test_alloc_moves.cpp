// SPDX-License-Identifier: Apache-2.0
// test_alloc_moves.cpp: when a growth moves idle chunks (unmaps them from a free block and
// maps them where it grows) and when it creates its missing pages (policy.h,
// _expseg_move_first), seen from the public API on the sim and host drivers:
// - a torch.cat cache (buffers that grow by a token a step, layer after layer) after large
//   weights moves no chunk per request, and memory held stays within the bound of its peak;
// - near the bound of the peak, a growth moves idle chunks and memory held stays flat;
// - within it, the missing pages are created and no chunk moves;
// - where the memory fraction or the device refuses to create them, idle chunks move in
//   without the out-of-memory retry (which waits for every stream and empties the cache);
//   where nothing is idle, the refused create is not asked for a second time.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "alloc_support.h"
#include "expseg.h"
#include "policy.h"  // EXPSEG_MOVE_PERMILLE

namespace {

constexpr size_t KiB = 1024, MiB = KiB * 1024;

std::string err() { return expseg_last_error(); }

int64_t moved(const expseg_allocator *a) { return stat_of(a, "expseg.pages_moved"); }
int64_t held(const expseg_allocator *a) { return stat_of(a, "reserved_bytes.all.current"); }

// holes(a): 32 blocks of 16 MiB (512 MiB, each its own chunk), every other one freed: 16
// idle holes of 16 MiB that a request of 24 MiB does not fit. Returns the live blocks.
std::vector<void *> holes(expseg_allocator *a) { return alloc_holes(a, 16, 16 * MiB); }

}  // namespace

// Generation with a torch.cat K/V cache after 12 GiB of weights (as `expseg-replay --synth
// generate`, smaller): requests one after another, of batches 8, 2, 4, 1 and 8; every decode
// step reallocates each layer's K and V one token larger (the new buffer allocated before
// the old one is freed), with small temporaries. Memory held stays within the bound of the
// peak, so the growths create what they lack and move no chunk; moving idle chunks there
// (as before) moved a freed buffer's chunks to the next growth and left its room unmapped
// for the layer after it, which then moved another's.
TEST(Moves, ATorchCatCacheMovesNoChunkPerStep) {
  QuietLog quiet;
  AllocPtr p = make_alloc("sim:capacity=32G", "expandable_segments:True");
  expseg_allocator *a = p.get();
  ASSERT_NE(a, nullptr);
  std::vector<void *> weights(96, nullptr);
  for (void *&w : weights) ASSERT_EQ(expseg_malloc(a, 128 * MiB, 0, &w), EXPSEG_OK) << err();
  const int layers = 32;
  const size_t batches[] = {8, 2, 4, 1, 8}, prompts[] = {600, 900, 300, 1000, 800};
  for (int r = 0; r < 5; r++) {
    const size_t b = batches[r], tok = b * 8 * KiB;  // K (or V) of one token, 32 heads of 128
    size_t tokens = prompts[r];
    std::vector<void *> cache(2 * layers, nullptr);
    for (void *&c : cache) ASSERT_EQ(expseg_malloc(a, tokens * tok, 0, &c), EXPSEG_OK) << err();
    for (int step = 0; step < 100; step++) {
      tokens++;
      for (int l = 0; l < layers; l++) {
        for (int k = 0; k < 2; k++) {
          void *t = nullptr, *grown = nullptr;
          ASSERT_EQ(expseg_malloc(a, tok, 0, &t), EXPSEG_OK) << err();
          ASSERT_EQ(expseg_malloc(a, tokens * tok, 0, &grown), EXPSEG_OK) << err();
          ASSERT_EQ(expseg_free(a, cache[2 * l + k]), EXPSEG_OK) << err();
          ASSERT_EQ(expseg_free(a, t), EXPSEG_OK) << err();
          cache[2 * l + k] = grown;
        }
        for (size_t bytes : {b * 32 * tokens * 2, b * 11008 * 4}) {  // scores, MLP
          void *t = nullptr;
          ASSERT_EQ(expseg_malloc(a, bytes, 0, &t), EXPSEG_OK) << err();
          ASSERT_EQ(expseg_free(a, t), EXPSEG_OK) << err();
        }
      }
    }
    for (void *c : cache) ASSERT_EQ(expseg_free(a, c), EXPSEG_OK) << err();
  }
  EXPECT_LE(moved(a), 8) << "pages moved in 16,000 growing reallocations";
  const double bound = 1.02 * (double)stat_of(a, "requested_bytes.all.peak") + 8.0 * MiB;
  EXPECT_LE((double)stat_of(a, "reserved_bytes.all.peak"), bound)
      << "peak held against 1.02 x the peak live + 8 MiB";
  free_blocks(a, weights);
  expect_consistent(a, "torch.cat cache");
}

// Near the bound of the peak (holding 512 MiB with 512 MiB allocated at most, 24 MiB more
// would pass 1.012 x 512 + 8 = 526 MiB), a growth that 16 MiB holes do not fit moves idle
// chunks: memory held stays 512 MiB.
TEST(Moves, NearTheBoundAGrowthMovesIdleChunks) {
  QuietLog quiet;
  AllocPtr p = make_alloc("sim:capacity=4G", "expandable_segments:True");
  expseg_allocator *a = p.get();
  ASSERT_NE(a, nullptr);
  std::vector<void *> live = holes(a);
  ASSERT_EQ(held(a), (int64_t)(512 * MiB));
  const int64_t moved0 = moved(a);
  void *x = nullptr;
  ASSERT_EQ(expseg_malloc(a, 24 * MiB, 0, &x), EXPSEG_OK) << err();
  EXPECT_EQ(held(a), (int64_t)(512 * MiB)) << "the pages came from idle chunks";
  EXPECT_GE(moved(a) - moved0, (int64_t)(24 * MiB / alloc_test_page(a)));
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
  free_blocks(a, live);
  expect_consistent(a, "near the bound");
}

// Within the bound of the peak (a 1 GiB peak; 512 MiB held after empty_cache), a growth
// creates its missing pages and moves no chunk: held grows by the 24 MiB it lacked.
TEST(Moves, WithinTheBoundMissingPagesAreCreated) {
  QuietLog quiet;
  AllocPtr p = make_alloc("sim:capacity=4G", "expandable_segments:True");
  expseg_allocator *a = p.get();
  ASSERT_NE(a, nullptr);
  void *peak = nullptr;
  ASSERT_EQ(expseg_malloc(a, 1024 * MiB, 0, &peak), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_free(a, peak), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
  std::vector<void *> live = holes(a);
  ASSERT_EQ(held(a), (int64_t)(512 * MiB));
  const int64_t moved0 = moved(a);
  void *x = nullptr;
  ASSERT_EQ(expseg_malloc(a, 24 * MiB, 0, &x), EXPSEG_OK) << err();
  EXPECT_EQ(moved(a), moved0) << "no chunk moved";
  EXPECT_EQ(held(a), (int64_t)(536 * MiB)) << "the 24 MiB it lacked, created";
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
  free_blocks(a, live);
  expect_consistent(a, "within the bound");
}

// Within the bound, but the memory fraction (held is about all it allows) or the device
// (18 MiB left on it) refuses the missing pages: the growth moves
// idle chunks instead, with no out-of-memory retry and no out-of-memory error.
TEST(Moves, ARefusedCreationMovesIdleChunksWithoutTheRetry) {
  QuietLog quiet;
  for (const char *how : {"fraction", "device"}) {
    SCOPED_TRACE(how);
    const bool fraction = std::string(how) == "fraction";
    // fraction: a 1 GiB peak on a 4 GiB device, then at most 513 MiB allowed; device: a
    // 528 MiB peak on a 530 MiB device (24 MiB more within 1.012 x 528 + 8 MiB)
    AllocPtr p = make_alloc(fraction ? "sim:capacity=4G" : "sim:capacity=530M",
                            "expandable_segments:True");
    expseg_allocator *a = p.get();
    ASSERT_NE(a, nullptr);
    void *peak = nullptr;
    ASSERT_EQ(expseg_malloc(a, (fraction ? 1024 : 528) * MiB, 0, &peak), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_free(a, peak), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
    std::vector<void *> live = holes(a);
    ASSERT_EQ(held(a), (int64_t)(512 * MiB));
    if (fraction) {
      ASSERT_EQ(expseg_set_memory_fraction(a, (512.0 + 1.0) / 4096.0), EXPSEG_OK) << err();
    }
    const int64_t moved0 = moved(a), retries0 = stat_of(a, "num_alloc_retries"),
                  held0 = held(a);
    void *x = nullptr;
    ASSERT_EQ(expseg_malloc(a, 24 * MiB, 0, &x), EXPSEG_OK) << err();
    EXPECT_GT(moved(a), moved0) << "idle chunks moved in";
    EXPECT_EQ(stat_of(a, "num_alloc_retries"), retries0) << "no out-of-memory retry";
    EXPECT_EQ(stat_of(a, "num_ooms"), 0);
    EXPECT_LE(held(a), held0) << "nothing created";
    ASSERT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
    free_blocks(a, live);
    expect_consistent(a, how);
  }
}

// A creation the device refuses where nothing is idle: no idle chunk could move in, so the
// growth is not placed again to move first (that would only repeat the refused create, a
// driver call on a device near capacity). The device is full of blocks in use, none free;
// a request that does not fit fails with the device's out-of-memory, after the one create
// the growth asked for and the retry's own.
TEST(Moves, ARefusedCreationWithNothingIdleIsNotTriedTwice) {
  QuietLog quiet;
  AllocPtr p = make_alloc("sim:capacity=64M", "expandable_segments:True");
  expseg_allocator *a = p.get();
  ASSERT_NE(a, nullptr);
  std::vector<void *> live;
  for (int i = 0; i < 32; i++) {
    void *x = nullptr;
    ASSERT_EQ(expseg_malloc(a, 2 * MiB, 0, &x), EXPSEG_OK) << err() << " block " << i;
    live.push_back(x);
  }
  ASSERT_EQ(held(a), (int64_t)(64 * MiB));
  ASSERT_EQ(stat_of(a, "inactive_split_bytes.all.current"), 0);
  const int64_t creates0 = stat_of(a, "expseg.driver.create");
  void *x = nullptr;
  EXPECT_EQ(expseg_malloc(a, 4 * MiB, 0, &x), EXPSEG_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(stat_of(a, "num_ooms"), 1);
  EXPECT_EQ(stat_of(a, "expseg.driver.create") - creates0, 2)
      << "one refused create for the growth and one for the retry";
  free_blocks(a, live);
  expect_consistent(a, "full device");
}
