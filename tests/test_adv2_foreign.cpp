// SPDX-License-Identifier: Apache-2.0
// test_adv2_foreign.cpp: two allocators live at once, on the same driver kind and device, as
// two CUDA allocators would be: a pointer of one is foreign to the other (free, record_stream,
// pool_of, annotate, traceback refuse it and change nothing), on `host` and on `sim` (whose
// fake address spaces must not coincide); one sim allocator at a time keeps its addresses.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>

#include "alloc_support.h"
#include "expseg.h"

namespace {

class Adv2Foreign : public ::testing::TestWithParam<const char *> {};

TEST_P(Adv2Foreign, PointersOfAnotherAllocatorAreRefused) {
  AllocPtr owner_a = make_alloc(GetParam(), ""), owner_b = make_alloc(GetParam(), "");
  ASSERT_TRUE(owner_a && owner_b);
  expseg_allocator *a = owner_a.get(), *b = owner_b.get();
  ASSERT_EQ(expseg_record_history(b, true, 100), EXPSEG_OK);
  void *pa = nullptr, *pb = nullptr;
  ASSERT_EQ(expseg_malloc(a, 1 << 20, 0, &pa), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(b, 1 << 20, 0, &pb), EXPSEG_OK);
  EXPECT_NE(pa, pb) << "two live allocators handed out the same address";
  StatMap before = stat_map(b);
  EXPECT_EQ(expseg_free(b, pa), EXPSEG_ERR_INVALID_ARGUMENT) << "b freed a's pointer";
  EXPECT_EQ(expseg_record_stream(b, pa, 3), EXPSEG_ERR_INVALID_ARGUMENT);
  expseg_pool_id id = 99;
  EXPECT_EQ(expseg_pool_of(b, pa, &id), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_history_annotate(b, pa, "x"), EXPSEG_ERR_INVALID_ARGUMENT);
  char buf[64];
  size_t need = 0;
  EXPECT_EQ(expseg_allocation_traceback(b, pa, buf, sizeof buf, &need),
            EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(stat_map(b), before) << "a refused foreign pointer changed b";
  EXPECT_EQ(stat_map(b)["allocation.all.current"], 1);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_check(b), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_free(b, pb), EXPSEG_OK) << "b's own block is still live";
  EXPECT_EQ(expseg_free(a, pa), EXPSEG_OK) << "a's own block is still live";
}

INSTANTIATE_TEST_SUITE_P(Drivers, Adv2Foreign,
                         ::testing::Values("host:capacity=64M", "sim", "sim:capacity=1G,va=4096T"));

TEST(Adv2ForeignSim, OneAtATimeKeepsItsAddresses) {
  void *first = nullptr;
  for (int round = 0; round < 3; round++) {
    expseg_allocator *a = nullptr;
    ASSERT_EQ(expseg_create("sim", 0, "", &a), EXPSEG_OK) << expseg_last_error();
    void *p = nullptr;
    ASSERT_EQ(expseg_malloc(a, 4096, 0, &p), EXPSEG_OK);
    if (round == 0) first = p;
    EXPECT_EQ(p, first) << "round " << round << ": a lone sim allocator's addresses moved";
    expseg_destroy(a);
  }
}

// Many live at once: every one gets addresses of its own (up to the spaces that fit).
TEST(Adv2ForeignSim, ManyLiveAllocatorsNeverShareAnAddress) {
  std::vector<expseg_allocator *> as;
  std::map<uintptr_t, int> seen;
  for (int i = 0; i < 40; i++) {
    expseg_allocator *a = nullptr;
    ASSERT_EQ(expseg_create("sim:capacity=1G", 0, "", &a), EXPSEG_OK) << expseg_last_error();
    as.push_back(a);
    void *p = nullptr;
    ASSERT_EQ(expseg_malloc(a, 4096, 0, &p), EXPSEG_OK);
    EXPECT_EQ(seen.count((uintptr_t)p), 0u) << "allocator " << i << " shares " << p;
    EXPECT_LT((uintptr_t)p, (uintptr_t)1 << 62) << "addresses stay below 2^62";
    seen[(uintptr_t)p] = i;
  }
  for (expseg_allocator *a : as) expseg_destroy(a);
}

} // namespace
