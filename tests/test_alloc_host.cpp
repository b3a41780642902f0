// SPDX-License-Identifier: Apache-2.0
// test_alloc_host.cpp: fragmentation on the host driver (real memory). Fill the device with
// 8 MiB blocks, free every other one, ask for more than any hole: expandable segments serve
// it (the freed pages move), classic segments fail with an out-of-memory message that states
// the request, the rounding, the device, what is allocated and cached, the largest free
// block, and suggests expandable_segments:True (and in expandable mode never does). The
// memory fraction cap is named; OOM observers run once per OOM, outside the lock.
#include "alloc_support.h"
#include "chunk_support.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;
const char *const kHost = "host:capacity=1G,granularity=2M";

bool has(const std::string &s, const char *needle) { return s.find(needle) != std::string::npos; }

struct Filled {
  AllocPtr a;
  std::vector<void *> blocks;
};

// Fills with 8 MiB blocks until OOM, then frees every other block.
Filled fill_and_punch(const char *config) {
  Filled f{make_alloc(kHost, config), {}};
  expseg_allocator *A = f.a.get();
  for (int i = 0; i < 1000; i++) {
    void *p = nullptr;
    expseg_status st = expseg_malloc(A, 8 * MiB, 0, &p);
    if (st == EXPSEG_ERR_OUT_OF_MEMORY) break;
    EXPECT_EQ(st, EXPSEG_OK) << expseg_last_error();
    std::memset(p, 0x5a, 4096);  // real memory
    f.blocks.push_back(p);
  }
  EXPECT_GE(f.blocks.size(), 100u) << config;
  for (size_t i = 0; i < f.blocks.size(); i += 2) {
    EXPECT_EQ(expseg_free(A, f.blocks[i]), EXPSEG_OK);
    f.blocks[i] = nullptr;
  }
  EXPECT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
  return f;
}

void free_all(Filled &f) {
  for (void *p : f.blocks) {
    if (p) {
      EXPECT_EQ(expseg_free(f.a.get(), p), EXPSEG_OK);
    }
  }
  EXPECT_EQ(expseg_empty_cache(f.a.get()), EXPSEG_OK);
  EXPECT_EQ(stat_of(f.a.get(), "reserved_bytes.all.current"), 0);
}

TEST(AllocHost, ExpandableServesRequestLargerThanAnyHole) {
  Filled f = fill_and_punch("expandable_segments:True");
  expseg_allocator *A = f.a.get();
  EXPECT_EQ(stat_of(A, "num_ooms"), 1);  // the fill's last request
  int64_t largest = stat_of(A, "expseg.largest_free_block");
  EXPECT_LE(largest, (int64_t)(16 * MiB)) << "holes should be 8 MiB (or a tail)";
  void *p = nullptr;
  ASSERT_EQ(expseg_malloc(A, 64 * MiB, 0, &p), EXPSEG_OK) << expseg_last_error();
  std::memset(p, 0xa5, 64 * MiB);  // every page is really there
  EXPECT_GE(stat_of(A, "expseg.pages_moved"), 32);
  EXPECT_EQ(stat_of(A, "num_ooms"), 1);
  // the remaining live blocks still hold their bytes
  for (void *q : f.blocks) {
    if (q) {
      EXPECT_EQ(static_cast<unsigned char *>(q)[0], 0x5a);
      EXPECT_EQ(static_cast<unsigned char *>(q)[4095], 0x5a);
    }
  }
  EXPECT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_free(A, p), EXPSEG_OK);
  free_all(f);
}

TEST(AllocHost, ClassicFailsWithUsefulMessage) {
  Filled f = fill_and_punch("expandable_segments:False");
  expseg_allocator *A = f.a.get();
  int64_t ooms = stat_of(A, "num_ooms");
  void *p = reinterpret_cast<void *>(0x1);
  ASSERT_EQ(expseg_malloc(A, 64 * MiB + 1, 0, &p), EXPSEG_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(stat_of(A, "num_ooms"), ooms + 1);
  std::string m = expseg_last_error();
  EXPECT_TRUE(has(m, "67108865")) << "request size in bytes: " << m;
  EXPECT_TRUE(has(m, "64.00 MiB")) << "request size: " << m;
  EXPECT_TRUE(has(m, "rounded to 64.00 MiB")) << "rounded size: " << m;
  EXPECT_TRUE(has(m, "1.00 GiB") || has(m, "1024.00 MiB")) << "device total: " << m;
  EXPECT_TRUE(has(m, "free")) << m;
  EXPECT_TRUE(has(m, "allocated")) << m;
  EXPECT_TRUE(has(m, "cached")) << m;
  EXPECT_TRUE(has(m, "largest free block")) << m;
  EXPECT_TRUE(has(m, "expandable_segments:True")) << "classic must suggest it: " << m;
  char largest[64];
  std::snprintf(largest, sizeof largest, "largest free block %.2f MiB",
                (double)stat_of(A, "expseg.largest_free_block") / MiB);
  EXPECT_TRUE(has(m, largest)) << largest << " in " << m;
  // the allocator still works after the OOM
  void *q = nullptr;
  ASSERT_EQ(expseg_malloc(A, 4 * MiB, 0, &q), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_free(A, q), EXPSEG_OK);
  EXPECT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
  free_all(f);
}

TEST(AllocHost, ExpandableOomNeverSuggestsExpandable) {
  AllocPtr a = make_alloc(kHost, "expandable_segments:True");
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(expseg_malloc(a.get(), 600 * MiB, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a.get(), 600 * MiB, 0, &q), EXPSEG_ERR_OUT_OF_MEMORY);
  std::string m = expseg_last_error();
  EXPECT_FALSE(has(m, "expandable_segments:True")) << m;
  EXPECT_TRUE(has(m, "600.00 MiB")) << m;
  EXPECT_EQ(expseg_free(a.get(), p), EXPSEG_OK);
}

TEST(AllocHost, MemoryFractionCapIsNamed) {
  AllocPtr a = make_alloc(kHost, "");
  ASSERT_EQ(expseg_set_memory_fraction(a.get(), 0.25), EXPSEG_OK);
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(expseg_malloc(a.get(), 200 * MiB, 0, &p), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_malloc(a.get(), 100 * MiB, 0, &q), EXPSEG_ERR_OUT_OF_MEMORY);
  std::string m = expseg_last_error();
  EXPECT_TRUE(has(m, "256.00 MiB")) << "the cap: " << m;
  EXPECT_TRUE(has(m, "0.25")) << "the fraction: " << m;
  EXPECT_EQ(expseg_free(a.get(), p), EXPSEG_OK);
  // raising the cap serves it
  ASSERT_EQ(expseg_set_memory_fraction(a.get(), 0.5), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a.get(), 300 * MiB, 0, &q), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_free(a.get(), q), EXPSEG_OK);
  // fraction 0: nothing can be created
  ASSERT_EQ(expseg_empty_cache(a.get()), EXPSEG_OK);
  ASSERT_EQ(expseg_set_memory_fraction(a.get(), 0.0), EXPSEG_OK);
  EXPECT_EQ(expseg_malloc(a.get(), 512, 0, &q), EXPSEG_ERR_OUT_OF_MEMORY);
}

// A request that fails leaves the device as it found it: pages created for it before the
// device ran out are given back (PyTorch's ExpandableSegment::map releases the handles it
// created when cuMemCreate runs out of memory), so other users of the device, the OOM
// message and the observers see the memory that is really free.
TEST(AllocHost, FailedRequestLeavesNoCachedPages) {
  AllocPtr a = make_alloc(kHost, "");
  expseg_allocator *A = a.get();
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(expseg_malloc(A, 700 * MiB, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(A, 500 * MiB, 1, &q), EXPSEG_ERR_OUT_OF_MEMORY);
  std::string m = expseg_last_error();
  // the figures are those of the failure (the driver's own words in the cause agree), then
  // what the give-back left free: 320 MiB of the growth's chunks (policy: chunk_support.h)
  // were made, the next did not fit in the 4 MiB left
  size_t made = 0, next = 0;
  for (size_t c : growth_chunk_sizes(500 * MiB, 500 * MiB)) {
    if (made + c > 324 * MiB) {
      next = c;
      break;
    }
    made += c;
  }
  ASSERT_EQ(made, 320 * MiB) << "the chunk sizes this test was written for";
  EXPECT_TRUE(has(m, "1.00 GiB in total, 4.00 MiB free")) << m;
  EXPECT_TRUE(has(m, "320.00 MiB cached")) << m;
  char asked[64];
  snprintf(asked, sizeof asked, "asked %.2f MiB", (double)next / MiB);
  EXPECT_TRUE(has(m, asked)) << m;
  EXPECT_TRUE(has(m, "Then 320.00 MiB of cached pages went back to the device (now 324.00 MiB "
                     "free)"))
      << m;
  EXPECT_EQ(stat_of(A, "expseg.cached_physical_bytes.current"), 0);
  EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), (int64_t)(700 * MiB));
  EXPECT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_free(A, p), EXPSEG_OK);
}

struct ObserverLog {
  expseg_allocator *a;
  int calls = 0;
  int device = -1;
  size_t alloc_size = 0, allowed_or_total = 0, device_free = 0;
  bool lock_free = false;
  int64_t ooms_seen = -1;
};

void observer(void *ctx, int device, size_t alloc_size, size_t allowed_or_total,
              size_t device_free) {
  auto *o = static_cast<ObserverLog *>(ctx);
  o->calls++;
  o->device = device;
  o->alloc_size = alloc_size;
  o->allowed_or_total = allowed_or_total;
  o->device_free = device_free;
  o->lock_free = alloc_test_lock_is_free(o->a);
  int64_t v = -1;
  if (expseg_stat(o->a, "num_ooms", &v) == EXPSEG_OK) o->ooms_seen = v;  // would deadlock under the lock
}

TEST(AllocHost, OomObserversRunOncePerOomWithoutTheLock) {
  AllocPtr a = make_alloc(kHost, "");
  expseg_allocator *A = a.get();
  ObserverLog o1{A}, o2{A};
  ASSERT_EQ(expseg_add_oom_observer(A, observer, &o1), EXPSEG_OK);
  ASSERT_EQ(expseg_add_oom_observer(A, observer, &o2), EXPSEG_OK);
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(expseg_malloc(A, 700 * MiB, 0, &p), EXPSEG_OK);
  EXPECT_EQ(o1.calls, 0);
  ASSERT_EQ(expseg_malloc(A, 500 * MiB + 3, 1, &q), EXPSEG_ERR_OUT_OF_MEMORY);
  for (ObserverLog *o : {&o1, &o2}) {
    EXPECT_EQ(o->calls, 1);
    EXPECT_EQ(o->device, 0);
    EXPECT_EQ(o->alloc_size, 500 * MiB + 512) << "the rounded size";
    EXPECT_EQ(o->allowed_or_total, GiB) << "no cap: the device total";
    EXPECT_EQ(o->device_free, GiB - 700 * MiB);
    EXPECT_TRUE(o->lock_free) << "observer ran under the allocator's lock";
    EXPECT_EQ(o->ooms_seen, 1);
  }
  // the message is intact after observers ran (they may set their own errors)
  EXPECT_TRUE(has(expseg_last_error(), "out of memory")) << expseg_last_error();
  ASSERT_EQ(expseg_set_memory_fraction(A, 0.75), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(A, 100 * MiB, 0, &q), EXPSEG_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(o1.calls, 2);
  EXPECT_EQ(o1.allowed_or_total, (size_t)(0.75 * (double)GiB)) << "the cap";
  EXPECT_EQ(o1.alloc_size, 100 * MiB);
  EXPECT_EQ(o1.ooms_seen, 2);
  EXPECT_EQ(expseg_free(A, p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(A, 100 * MiB, 0, &q), EXPSEG_OK);
  EXPECT_EQ(o1.calls, 2) << "no OOM, no call";
  EXPECT_EQ(expseg_free(A, q), EXPSEG_OK);
  (void)KiB;
}

}  // namespace
