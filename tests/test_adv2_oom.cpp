// SPDX-License-Identifier: Apache-2.0
// test_adv2_oom.cpp: the out-of-memory report, cause by cause, read back against the
// statistics and the OOM observer: what was asked (bytes, stream), the device's total, what
// the allocator held and had allocated, the fraction and its cap, the hint; num_ooms and
// num_oom_rejections counted as docs/stats.md says; nothing the caller holds changed and
// the checker passes after each failure.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "alloc_support.h"
#include "expseg.h"

namespace {

constexpr size_t MiB = 1 << 20;

// Sizes as the report writes them: bytes below 1 KiB, else two decimals of the largest unit
// that keeps the figure below 1024.
std::string fmt(uint64_t n) {
  char b[64];
  if (n < 1024) {
    std::snprintf(b, sizeof b, "%llu bytes", (unsigned long long)n);
    return b;
  }
  const char *units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = (double)n / 1024;
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, u++;
  std::snprintf(b, sizeof b, "%.2f %s", v, units[u]);
  return b;
}

struct Seen {
  int calls = 0;
  int device = -1;
  size_t size = 0, cap = 0, dev_free = 0;
};

void observer(void *ctx, int device, size_t size, size_t cap, size_t dev_free) {
  Seen *s = static_cast<Seen *>(ctx);
  s->calls++;
  s->device = device;
  s->size = size;
  s->cap = cap;
  s->dev_free = dev_free;
}

struct Fixture {
  expseg_allocator *a = nullptr;
  Seen seen;
  explicit Fixture(const char *cfg) {
    EXPECT_EQ(expseg_create("sim:capacity=1G", 0, cfg, &a), EXPSEG_OK) << expseg_last_error();
    if (a) {
      EXPECT_EQ(expseg_add_oom_observer(a, observer, &seen), EXPSEG_OK);
    }
  }
  ~Fixture() { expseg_destroy(a); }
};

void expect_has(const std::string &msg, const std::string &part) {
  EXPECT_NE(msg.find(part), std::string::npos) << "lacks '" << part << "': " << msg;
}

TEST(Adv2Oom, FractionCapNamesTheCapAndWhatIsHeld) {
  Fixture f("expandable_segments:True,throw_on_cudamalloc_oom:True");
  expseg_allocator *a = f.a;
  ASSERT_EQ(expseg_set_memory_fraction(a, 0.25), EXPSEG_OK);
  std::vector<void *> live;
  void *p = nullptr;
  while (expseg_malloc(a, 60 * MiB, 3, &p) == EXPSEG_OK) live.push_back(p);
  std::string msg = expseg_last_error();
  ASSERT_EQ(live.size(), 4u) << msg;
  EXPECT_EQ(p, nullptr);
  expect_has(msg, "tried to allocate " + fmt(60 * MiB) + " (" + std::to_string(60 * MiB) + " bytes");
  expect_has(msg, "stream 0x3");
  expect_has(msg, "device has " + fmt(1 << 30) + " in total");
  expect_has(msg, fmt(256 * MiB) + " allowed (memory fraction 0.25)");
  expect_has(msg, "holds " + fmt((uint64_t)stat_of(a, "reserved_bytes.all.current")) + ": " +
                      fmt((uint64_t)stat_of(a, "allocated_bytes.all.current")) + " allocated");
  expect_has(msg, "Hint: the memory fraction 0.25 caps this allocator at " + fmt(256 * MiB));
  EXPECT_EQ(stat_of(a, "num_ooms"), 1);
  EXPECT_EQ(stat_of(a, "num_oom_rejections"), 1) << "refused by the fraction before the driver";
  EXPECT_EQ(stat_of(a, "allocation.all.current"), 4);
  EXPECT_EQ(f.seen.calls, 1);
  EXPECT_EQ(f.seen.device, 0);
  EXPECT_EQ(f.seen.size, 60 * MiB);
  EXPECT_EQ(f.seen.cap, 256 * MiB) << "the observer is told the cap";
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  // fraction 0: every growth is refused, and the message says 0
  ASSERT_EQ(expseg_set_memory_fraction(a, 0.0), EXPSEG_OK);
  EXPECT_EQ(expseg_malloc(a, 1 * MiB, 3, &p), EXPSEG_ERR_OUT_OF_MEMORY);
  msg = expseg_last_error();
  expect_has(msg, "0 bytes allowed (memory fraction 0)");
  EXPECT_EQ(stat_of(a, "num_ooms"), 2);
  EXPECT_EQ(stat_of(a, "num_oom_rejections"), 2);
  for (void *q : live) EXPECT_EQ(expseg_free(a, q), EXPSEG_OK);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
}

TEST(Adv2Oom, DeviceFullAndTooLarge) {
  Fixture f("expandable_segments:True");
  expseg_allocator *a = f.a;
  std::vector<void *> live;
  void *p = nullptr;
  while (expseg_malloc(a, 100 * MiB, 1, &p) == EXPSEG_OK) live.push_back(p);
  std::string msg = expseg_last_error();
  ASSERT_EQ(live.size(), 10u) << msg;
  expect_has(msg, "tried to allocate " + fmt(100 * MiB));
  expect_has(msg, fmt((uint64_t)stat_of(a, "allocated_bytes.all.current")) + " allocated");
  expect_has(msg, "nothing cached can serve it");
  EXPECT_EQ(stat_of(a, "num_ooms"), 1);
  EXPECT_EQ(stat_of(a, "num_oom_rejections"), 0) << "the driver refused, not the fraction";
  EXPECT_EQ(f.seen.calls, 1);
  EXPECT_EQ(f.seen.cap, (size_t)1 << 30) << "no cap: the observer is told the device total";
  int64_t largest = stat_of(a, "expseg.oom_largest_free_block");
  expect_has(msg, "largest free block " + fmt((uint64_t)largest));
  // larger than the whole device
  EXPECT_EQ(expseg_malloc(a, (size_t)3 << 30, 1, &p), EXPSEG_ERR_OUT_OF_MEMORY);
  msg = expseg_last_error();
  expect_has(msg, "larger than the whole device (" + fmt(1 << 30) + ")");
  EXPECT_EQ(stat_of(a, "num_ooms"), 2);
  // 2^60 and more: refused at once, not counted, observers not called
  EXPECT_EQ(expseg_malloc(a, (size_t)1 << 60, 1, &p), EXPSEG_ERR_OUT_OF_MEMORY);
  expect_has(expseg_last_error(), std::to_string((size_t)1 << 60));
  EXPECT_EQ(stat_of(a, "num_ooms"), 2);
  EXPECT_EQ(f.seen.calls, 2);
  EXPECT_EQ(stat_of(a, "allocation.all.current"), 10);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  // after freeing, the same request works again
  ASSERT_EQ(expseg_free(a, live.back()), EXPSEG_OK);
  live.pop_back();
  ASSERT_EQ(expseg_malloc(a, 100 * MiB, 1, &p), EXPSEG_OK) << expseg_last_error();
  live.push_back(p);
  for (void *q : live) EXPECT_EQ(expseg_free(a, q), EXPSEG_OK);
  expseg_reset_accumulated_stats(a);
  EXPECT_EQ(stat_of(a, "num_ooms"), 0);
  EXPECT_EQ(stat_of(a, "expseg.oom_largest_free_block"), 0);
}

// Classic segments: memory held but split so that no segment can serve the request.
TEST(Adv2Oom, StrandedClassicMemoryIsNamed) {
  Fixture f("expandable_segments:False");
  expseg_allocator *a = f.a;
  std::vector<void *> keep, drop;
  void *p = nullptr;
  // 20 MiB classic segments (large_segment_size_mb) cut into 4 MiB blocks; every other freed
  for (int i = 0; expseg_malloc(a, 4 * MiB, 0, &p) == EXPSEG_OK; i++) (i % 2 ? drop : keep).push_back(p);
  for (void *q : drop) ASSERT_EQ(expseg_free(a, q), EXPSEG_OK);
  int64_t held = stat_of(a, "reserved_bytes.all.current"), allocated = stat_of(a, "allocated_bytes.all.current");
  ASSERT_GT(held - allocated, 100 * (int64_t)MiB) << "enough memory stranded";
  EXPECT_EQ(expseg_malloc(a, 12 * MiB, 0, &p), EXPSEG_ERR_OUT_OF_MEMORY);
  std::string msg = expseg_last_error();
  expect_has(msg, fmt((uint64_t)allocated) + " allocated");
  expect_has(msg, "held but unallocated, split across segments");
  expect_has(msg, "expandable_segments:True");
  EXPECT_EQ(stat_of(a, "allocation.all.current"), (int64_t)keep.size());
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  for (void *q : keep) EXPECT_EQ(expseg_free(a, q), EXPSEG_OK);
}

} // namespace
