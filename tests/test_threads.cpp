// SPDX-License-Identifier: Apache-2.0
// test_threads.cpp: 8 threads on one allocator. Each mallocs and frees random sizes on its
// own stream and on shared ones, records blocks on other streams, hands some blocks to other
// threads to free, and now and then empties the cache, reads statistics or runs the checker.
// Afterwards the allocator must be consistent and give everything back. Seeded
// (EXPSEG_TEST_SEED); EXPSEG_TEST_OPS scales the operations per thread (default 200000 / 10).
// Meant to run under ThreadSanitizer too (-DEXPSEG_SANITIZE=thread); the borrow-driver run
// also covers the tests' own driver (tests/support), which the fault and random suites share.
#include "alloc_support.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <thread>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;

using Rng = TestRng;

size_t random_size(Rng &r) {
  switch (r.below(4)) {
  case 0: return 1 + r.below(4 * KiB);
  case 1: return 4 * KiB + r.below(MiB);
  case 2: return MiB + r.below(9 * MiB);
  default: return 10 * MiB + r.below(30 * MiB);
  }
}

struct Shared {
  expseg_allocator *a;
  std::mutex mu;
  std::vector<void *> handoff;  // blocks another thread will free
  std::atomic<int> errors{0};
  std::atomic<uint64_t> ooms{0}, mallocs{0};
};

void worker(Shared *sh, int id, uint64_t seed, size_t ops) {
  Rng r(seed + (uint64_t)id * 1000003u);
  expseg_allocator *a = sh->a;
  std::vector<void *> mine;
  const expseg_stream own = 1 + (expseg_stream)id;
  auto fail = [&](const char *what) {
    if (sh->errors.fetch_add(1) < 5)
      ADD_FAILURE() << "thread " << id << ": " << what << ": " << expseg_last_error();
  };
  for (size_t i = 0; i < ops; i++) {
    uint64_t op = r.below(1000);
    if (op < 430 || mine.size() > 64) {
      if (!mine.empty() && (op < 380 || mine.size() > 64)) {
        size_t k = r.below(mine.size());
        void *p = mine[k];
        mine[k] = mine.back();
        mine.pop_back();
        if (r.below(10) == 0) {  // used on a shared stream too
          if (expseg_record_stream(a, p, 100 + r.below(2)) != EXPSEG_OK) fail("record_stream");
        }
        if (r.below(8) == 0) {  // another thread frees it
          std::lock_guard<std::mutex> g(sh->mu);
          sh->handoff.push_back(p);
        } else if (expseg_free(a, p) != EXPSEG_OK) {
          fail("free");
        }
        continue;
      }
    }
    if (op < 850) {
      expseg_stream s = r.below(3) == 0 ? 100 + r.below(2) : own;
      void *p = nullptr;
      expseg_status st = expseg_malloc(a, random_size(r), s, &p);
      sh->mallocs.fetch_add(1, std::memory_order_relaxed);
      if (st == EXPSEG_OK) mine.push_back(p);
      else if (st == EXPSEG_ERR_OUT_OF_MEMORY) sh->ooms.fetch_add(1, std::memory_order_relaxed);
      else fail("malloc");
    } else if (op < 900) {  // free what others handed over
      std::vector<void *> take;
      {
        std::lock_guard<std::mutex> g(sh->mu);
        take.swap(sh->handoff);
      }
      for (void *p : take)
        if (expseg_free(a, p) != EXPSEG_OK) fail("free of a handed-over block");
    } else if (op < 950) {
      int64_t v = 0;
      if (expseg_stat(a, "allocated_bytes.all.current", &v) != EXPSEG_OK || v < 0) fail("stat");
      if (expseg_stat(a, "expseg.largest_free_block", &v) != EXPSEG_OK) fail("stat");
    } else if (op < 960) {
      if (expseg_empty_cache(a) != EXPSEG_OK) fail("empty_cache");
    } else if (op < 970) {
      if (expseg_check(a) != EXPSEG_OK) fail("check (concurrent)");
    } else if (op < 975) {
      expseg_stats_foreach(a, [](void *, const char *, int64_t) {}, nullptr);
    } else if (op < 977) {
      expseg_reset_peak_stats(a);
    } else {  // a burst on the cache-hit path
      size_t size = random_size(r);
      for (int k = 0; k < 4; k++) {
        void *p = nullptr;
        if (expseg_malloc(a, size, own, &p) == EXPSEG_OK && expseg_free(a, p) != EXPSEG_OK)
          fail("free (burst)");
      }
    }
  }
  for (void *p : mine)
    if (expseg_free(a, p) != EXPSEG_OK) fail("final free");
}

// borrow: the allocator runs on alloc_test_borrow(driver) instead of its own driver, and
// the driver below must be idle after expseg_destroy.
void run_threads(const char *driver, const char *config, bool borrow = false) {
  EXPSEG_SEEDED(seed, 4242);
  size_t ops = test_ops(20000);
  expseg_vmm_t *inner = nullptr;
  AllocPtr a;
  if (borrow) {
    expseg_vmm_t *b = nullptr;
    expseg_allocator *raw = nullptr;
    ASSERT_EQ(_expseg_vmm_open(driver, 0, &inner), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(alloc_test_borrow(inner, &b), EXPSEG_OK);
    ASSERT_EQ(alloc_test_create(b, config, &raw), EXPSEG_OK) << expseg_last_error();
    a.reset(raw);
  } else {
    a = make_alloc(driver, config);
  }
  ASSERT_TRUE(a);
  Shared sh;
  sh.a = a.get();
  std::vector<std::thread> ts;
  for (int i = 0; i < 8; i++) ts.emplace_back(worker, &sh, i, seed, ops);
  for (auto &t : ts) t.join();
  for (void *p : sh.handoff) EXPECT_EQ(expseg_free(a.get(), p), EXPSEG_OK);
  std::printf("%s %s: 8 threads x %zu ops, %llu mallocs, %llu OOMs\n", driver, config, ops,
              (unsigned long long)sh.mallocs.load(), (unsigned long long)sh.ooms.load());
  EXPECT_EQ(sh.errors.load(), 0);
  EXPECT_EQ(expseg_check(a.get()), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(stat_of(a.get(), "allocation.all.current"), 0);
  ASSERT_EQ(expseg_empty_cache(a.get()), EXPSEG_OK);
  EXPECT_EQ(stat_of(a.get(), "active.all.current"), 0);
  EXPECT_EQ(stat_of(a.get(), "reserved_bytes.all.current"), 0);
  EXPECT_EQ(stat_of(a.get(), "segment.all.current"), 0);
  EXPECT_EQ(expseg_check(a.get()), EXPSEG_OK) << expseg_last_error();
  if (inner) {
    a.reset();
    char why[128];
    EXPECT_TRUE(vmm_test_is_idle(inner, why, sizeof why)) << why;
    _expseg_vmm_close(inner);
  }
}

TEST(Threads, EightThreadsExpandable) { run_threads("sim:capacity=4G", ""); }

TEST(Threads, EightThreadsClassic) {
  run_threads("sim:capacity=4G", "expandable_segments:False,max_split_size_mb:64");
}

TEST(Threads, EightThreadsHostWithCap) {
  run_threads("host:capacity=1G,granularity=2M", "per_process_memory_fraction:0.5");
}

// The borrow driver of tests/support forwards from 8 threads at once (it used to read its
// chunk count outside its mutex: ThreadSanitizer reported it).
TEST(Threads, EightThreadsThroughBorrowDriver) {
  run_threads("host:capacity=1G,granularity=2M", "per_process_memory_fraction:0.5", true);
}

}  // namespace
