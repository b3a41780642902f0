// SPDX-License-Identifier: Apache-2.0
// test_host_pool_faults.cpp: the pinned host memory pool (expseg_host_*) when things go wrong
// or get busy: driver failures through the fault wrapper (a failed chunk, a missing event, a
// failed give-back, warnings under the lock), seeded random operations on the host and sim
// backends (no reuse before recorded streams complete, no overlap, contents kept), and
// concurrent callers. The pool's ordinary behaviour: test_host_pool.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "alloc_support.h"
#include "host_pool_support.h"

namespace {

// ---- driver failures (the fault wrapper) ----

TEST(HostPoolFault, FailedChunkIsReportedAndCacheGivenBackFirst) {
  QuietLog quiet;
  FaultPool f("");
  ASSERT_TRUE(f.h);
  void *a = nullptr, *b = nullptr;
  f.fail(EXPSEG_VMM_CALL_host_alloc, 1, 1, EXPSEG_ERR_DRIVER);
  EXPECT_EQ(expseg_host_malloc(f.h.get(), 1 * MiB, &a), EXPSEG_ERR_DRIVER);
  EXPECT_NE(std::string(expseg_last_error()).find("expseg_host_malloc(size="),
            std::string::npos) << expseg_last_error();
  EXPECT_NE(std::string(expseg_last_error()).find("host_alloc"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(a, nullptr);
  ASSERT_EQ(expseg_host_malloc(f.h.get(), 1 * MiB, &a), EXPSEG_OK);  // call #2 works
  ASSERT_EQ(expseg_host_free(f.h.get(), a), EXPSEG_OK);
  // out of memory with 1 MiB cached: the cache goes back and the chunk is asked again
  f.fail(EXPSEG_VMM_CALL_host_alloc, 3, 1, EXPSEG_ERR_OUT_OF_MEMORY);
  ASSERT_EQ(expseg_host_malloc(f.h.get(), 2 * MiB, &b), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(hstat(f.h.get(), "num_host_free"), 1);
  EXPECT_EQ(hstat(f.h.get(), "segment.current"), 1);
  // nothing cached any more: the out-of-memory reaches the caller
  f.fail(EXPSEG_VMM_CALL_host_alloc, 5, 1, EXPSEG_ERR_OUT_OF_MEMORY);
  void *c = nullptr;
  EXPECT_EQ(expseg_host_malloc(f.h.get(), 4 * MiB, &c), EXPSEG_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(expseg_host_free(f.h.get(), b), EXPSEG_OK);
  EXPECT_EQ(hstat(f.h.get(), "allocation.current"), 0);
}

// The public fault spec reaches the pool's calls too.
TEST(HostPoolFault, FaultSpecFailsHostAlloc) {
  QuietLog quiet;
  PoolPtr h = make_pool("fault:fail=host_alloc@1;host", "");
  ASSERT_TRUE(h);
  void *p = nullptr;
  EXPECT_NE(expseg_host_malloc(h.get(), 64 * KiB, &p), EXPSEG_OK);
  EXPECT_EQ(p, nullptr);
  ASSERT_EQ(expseg_host_malloc(h.get(), 64 * KiB, &p), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_host_free(h.get(), p), EXPSEG_OK);
}

TEST(HostPoolFault, NoEventMeansAWaitAndNoWaitMeansNoReuse) {
  QuietLog quiet;
  for (expseg_vmm_call kind : {EXPSEG_VMM_CALL_event_create, EXPSEG_VMM_CALL_event_record}) {
    SCOPED_TRACE(_expseg_vmm_call_name(kind));
    FaultPool f("");
    ASSERT_TRUE(f.h);
    f.fail(kind, 1, 1000, EXPSEG_ERR_DRIVER);
    void *p = nullptr, *q = nullptr;
    // the stream is idle: the wait works and the block is free at once
    ASSERT_EQ(expseg_host_malloc(f.h.get(), 64 * KiB, &p), EXPSEG_OK);
    ASSERT_EQ(expseg_host_record_stream(f.h.get(), p, 4), EXPSEG_OK);
    ASSERT_EQ(expseg_host_free(f.h.get(), p), EXPSEG_OK);
    EXPECT_EQ(hstat(f.h.get(), "expseg.stream_syncs"), 1);
    ASSERT_EQ(expseg_host_malloc(f.h.get(), 64 * KiB, &q), EXPSEG_OK);
    EXPECT_EQ(q, p);
    // the stream is busy and cannot be waited for: the block is never handed out again
    hold(f.h.get(), 4, true);
    ASSERT_EQ(expseg_host_record_stream(f.h.get(), q, 4), EXPSEG_OK);
    ASSERT_EQ(expseg_host_free(f.h.get(), q), EXPSEG_OK);
    EXPECT_EQ(hstat(f.h.get(), "expseg.stuck_blocks"), 1);
    EXPECT_GE(quiet.lines, 1);
    for (int i = 0; i < 3; i++) {
      void *r = nullptr;
      ASSERT_EQ(expseg_host_malloc(f.h.get(), 64 * KiB, &r), EXPSEG_OK);
      EXPECT_NE(r, p);
      hold(f.h.get(), 4, false);
    }
    // the stream can be waited for now: empty_cache retries the stuck block, which goes back
    // on its free list (and from there to the driver)
    EXPECT_EQ(hstat(f.h.get(), "expseg.pending_blocks.current"), 1);
    ASSERT_EQ(expseg_host_empty_cache(f.h.get()), EXPSEG_OK);
    EXPECT_EQ(hstat(f.h.get(), "expseg.stuck_blocks"), 0);
    EXPECT_EQ(hstat(f.h.get(), "expseg.pending_blocks.current"), 0);
  }
}

// Warnings raised under the pool's lock reach the log sink only once it is let go: a sink
// may call back into the pool.
TEST(HostPoolFault, LogSinkRunsWithoutThePoolLock) {
  FaultPool f("");
  ASSERT_TRUE(f.h);
  struct Ctx {
    expseg_host_pool *h;
    int lines = 0, under_lock = 0;
  } ctx{f.h.get()};
  expseg_set_log_sink(
      [](void *c, const char *) {
        auto *x = static_cast<Ctx *>(c);
        x->lines++;
        if (pthread_mutex_trylock(&x->h->lock) != 0) x->under_lock++;
        else pthread_mutex_unlock(&x->h->lock);
      },
      &ctx);
  f.fail(EXPSEG_VMM_CALL_event_record, 1, 1000, EXPSEG_ERR_DRIVER);
  hold(f.h.get(), 6, true);
  void *p = nullptr;
  ASSERT_EQ(expseg_host_malloc(f.h.get(), 64 * KiB, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_host_record_stream(f.h.get(), p, 6), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(f.h.get(), p), EXPSEG_OK);  // stuck: warns under the lock
  expseg_set_log_sink(nullptr, nullptr);
  EXPECT_GE(ctx.lines, 1);
  EXPECT_EQ(ctx.under_lock, 0);
}

TEST(HostPoolFault, FailedGiveBackKeepsTheBlockCached) {
  QuietLog quiet;
  FaultPool f("");
  ASSERT_TRUE(f.h);
  void *p = nullptr;
  ASSERT_EQ(expseg_host_malloc(f.h.get(), 1 * MiB, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(f.h.get(), p), EXPSEG_OK);
  f.fail(EXPSEG_VMM_CALL_host_free, 1, 1, EXPSEG_ERR_DRIVER);
  EXPECT_EQ(expseg_host_empty_cache(f.h.get()), EXPSEG_OK);
  EXPECT_EQ(hstat(f.h.get(), "segment.current"), 1);
  EXPECT_EQ(hstat(f.h.get(), "expseg.cached_bytes.current"), int64_t(1 * MiB));
  EXPECT_EQ(quiet.lines, 1);
  EXPECT_EQ(expseg_host_empty_cache(f.h.get()), EXPSEG_OK);
  EXPECT_EQ(hstat(f.h.get(), "segment.current"), 0);
  EXPECT_EQ(hstat(f.h.get(), "num_host_free"), 1);
}

// A failed give-back leaves the cache's books as they were: the block never left the cache,
// so expseg.cached_bytes counts it once in .allocated and not in .freed (for a power-of-two
// block and for a carve segment, whose release is a second path), and a later give-back
// that succeeds counts it freed once.
TEST(HostPoolFault, FailedGiveBackCountsTheCachedBytesOnce) {
  for (const char *config : {"", "pinned_max_round_threshold_mb:0"}) {
    SCOPED_TRACE(config);
    QuietLog quiet;
    FaultPool f(config);
    ASSERT_TRUE(f.h);
    void *p = nullptr;
    ASSERT_EQ(expseg_host_malloc(f.h.get(), 3 * MiB, &p), EXPSEG_OK);
    ASSERT_EQ(expseg_host_free(f.h.get(), p), EXPSEG_OK);
    const int64_t cached = hstat(f.h.get(), "expseg.cached_bytes.current");
    ASSERT_GE(cached, int64_t(3 * MiB));
    EXPECT_EQ(hstat(f.h.get(), "expseg.cached_bytes.allocated"), cached);
    EXPECT_EQ(hstat(f.h.get(), "expseg.cached_bytes.freed"), 0);
    f.fail(EXPSEG_VMM_CALL_host_free, 1, 1, EXPSEG_ERR_DRIVER);
    EXPECT_EQ(expseg_host_empty_cache(f.h.get()), EXPSEG_OK);
    EXPECT_EQ(quiet.lines, 1);  // the give-back failed and said so
    EXPECT_EQ(hstat(f.h.get(), "expseg.cached_bytes.current"), cached);
    EXPECT_EQ(hstat(f.h.get(), "expseg.cached_bytes.allocated"), cached);
    EXPECT_EQ(hstat(f.h.get(), "expseg.cached_bytes.freed"), 0);
    EXPECT_EQ(hstat(f.h.get(), "expseg.cached_bytes.peak"), cached);
    EXPECT_EQ(expseg_host_empty_cache(f.h.get()), EXPSEG_OK);  // now it goes
    EXPECT_EQ(hstat(f.h.get(), "expseg.cached_bytes.current"), 0);
    EXPECT_EQ(hstat(f.h.get(), "expseg.cached_bytes.allocated"), cached);
    EXPECT_EQ(hstat(f.h.get(), "expseg.cached_bytes.freed"), cached);
  }
}

// ---- random operations ----

// Seeded random malloc / record_stream / free / hold / release / empty_cache on two pools
// (host and sim). A block freed while one of its streams is held must not come back before
// that stream is released; every live block keeps its contents (each is filled with its
// own tag and checked before it is freed); the books agree with what the test holds.
TEST(HostPoolRandom, NoReuseBeforeStreamsAndNoOverlap) {
  EXPSEG_SEEDED(seed, 20261122);
  for (const char *drv : {"host", "sim"}) {
    SCOPED_TRACE(drv);
    for (const char *cfg : {"", "pinned_use_background_threads:True,pinned_reserve_segment_size_mb:2",
                            "pinned_max_round_threshold_mb:0",
                            "pinned_max_round_threshold_mb:0,pinned_max_cached_size_mb:1,pinned_use_background_threads:True"}) {
      SCOPED_TRACE(cfg);
      PoolPtr h = make_pool(drv, cfg);
      ASSERT_TRUE(h);
      uint64_t x = seed;
      auto next = [&x] {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        return x;
      };
      struct Live {
        void *p;
        size_t size;
        uint8_t tag;
        std::vector<expseg_stream> streams;
      };
      std::vector<Live> live;
      // freed blocks that must stay out of use: pointer -> streams still held at free
      struct Fence {
        void *first;
        size_t size;
        std::vector<expseg_stream> second;
      };
      std::vector<Fence> fenced;
      // carved blocks start anywhere: ranges, not pointers, must not meet
      auto meet = [](const void *p, size_t n, const void *q, size_t m) {
        auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
        return a < b + m && b < a + n;
      };
      bool held[4] = {};
      uint8_t tag = 0;
      for (int op = 0; op < 4000 && !HasFailure(); op++) {
        uint64_t r = next() % 100;
        if (r < 40 || live.empty()) {
          size_t size = size_t(1) << (8 + next() % 12);  // 256 B .. 512 KiB
          void *p = nullptr;
          ASSERT_EQ(expseg_host_malloc(h.get(), size, &p), EXPSEG_OK) << expseg_last_error();
          for (auto &f : fenced)
            ASSERT_FALSE(meet(f.first, f.size, p, size)) << "op " << op << ": reused before its streams";
          for (auto &l : live) ASSERT_FALSE(meet(l.p, l.size, p, size)) << "op " << op << ": handed out twice";
          tag++;
          std::memset(p, tag, size);
          live.push_back({p, size, tag, {}});
        } else if (r < 60) {
          Live &l = live[next() % live.size()];
          expseg_stream s = 1 + next() % 4;
          ASSERT_EQ(expseg_host_record_stream(h.get(), l.p, s), EXPSEG_OK);
          l.streams.push_back(s);
        } else if (r < 90) {
          size_t i = next() % live.size();
          Live l = live[i];
          live.erase(live.begin() + (long)i);
          const uint8_t *b = static_cast<const uint8_t *>(l.p);
          for (size_t k = 0; k < l.size; k += 97) ASSERT_EQ(b[k], l.tag) << "op " << op << ": overwritten";
          std::vector<expseg_stream> busy;
          for (expseg_stream s : l.streams)
            if (held[s - 1]) busy.push_back(s);
          ASSERT_EQ(expseg_host_free(h.get(), l.p), EXPSEG_OK);
          if (!busy.empty()) fenced.push_back({l.p, l.size, busy});
        } else if (r < 97) {
          expseg_stream s = 1 + next() % 4;
          held[s - 1] = !held[s - 1];
          hold(h.get(), s, held[s - 1]);
          if (!held[s - 1]) {  // its fences fall; a block is free once none of its streams is held
            for (auto &f : fenced)
              f.second.erase(std::remove(f.second.begin(), f.second.end(), s), f.second.end());
            fenced.erase(std::remove_if(fenced.begin(), fenced.end(),
                                        [](const auto &f) { return f.second.empty(); }),
                         fenced.end());
          }
        } else {
          ASSERT_EQ(expseg_host_empty_cache(h.get()), EXPSEG_OK);
        }
        // one snapshot: the background thread may move blocks between two lookups
        std::map<std::string, int64_t> snap;
        expseg_host_stats_foreach(
            h.get(),
            [](void *c, const char *k, int64_t v) {
              (*static_cast<std::map<std::string, int64_t> *>(c))[k] = v;
            },
            &snap);
        ASSERT_EQ(snap["allocation.current"] - snap["expseg.pending_blocks.current"],
                  (int64_t)live.size()) << "op " << op;
      }
      for (int s = 1; s <= 4; s++) hold(h.get(), s, false);
      for (auto &l : live) ASSERT_EQ(expseg_host_free(h.get(), l.p), EXPSEG_OK);
      ASSERT_EQ(expseg_host_empty_cache(h.get()), EXPSEG_OK);
      EXPECT_EQ(hstat(h.get(), "allocation.current"), 0);
      EXPECT_EQ(hstat(h.get(), "expseg.pending_events"), 0);
      const bool reserve = std::strstr(cfg, "pinned_reserve_segment_size_mb") != nullptr;
      EXPECT_EQ(hstat(h.get(), "segment.current"), reserve ? 1 : 0);
      EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), reserve ? int64_t(2 * MiB) : 0);
    }
  }
}

// ---- threads ----

TEST(HostPool, ConcurrentCallersKeepTheBooks) {
  for (const char *cfg : {"", "pinned_use_background_threads:True"}) {
    SCOPED_TRACE(cfg);
    PoolPtr h = make_pool("host", cfg);
    ASSERT_TRUE(h);
    std::atomic<int> failures{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; t++)
      ts.emplace_back([&, t] {
        uint32_t x = 12345u + (uint32_t)t;  // fixed seeds: the run is reproducible per thread
        std::vector<void *> mine;
        for (int i = 0; i < 2000; i++) {
          x = x * 1103515245u + 12345u;
          if (mine.size() < 8 && (x >> 16) % 3) {
            void *p = nullptr;
            size_t size = size_t(1) << (12 + (x >> 8) % 6);
            if (expseg_host_malloc(h.get(), size, &p) != EXPSEG_OK) failures++;
            else {
              std::memset(p, t, 64);
              if ((x >> 4) % 2) (void)expseg_host_record_stream(h.get(), p, 1 + t);
              mine.push_back(p);
            }
          } else if (!mine.empty()) {
            if (expseg_host_free(h.get(), mine.back()) != EXPSEG_OK) failures++;
            mine.pop_back();
          }
        }
        for (void *p : mine)
          if (expseg_host_free(h.get(), p) != EXPSEG_OK) failures++;
      });
    for (auto &t : ts) t.join();
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(expseg_host_empty_cache(h.get()), EXPSEG_OK);
    EXPECT_EQ(hstat(h.get(), "allocation.current"), 0);
    EXPECT_EQ(hstat(h.get(), "segment.current"), 0);
    EXPECT_EQ(hstat(h.get(), "expseg.pending_events"), 0);
    EXPECT_EQ(hstat(h.get(), "num_host_alloc"), hstat(h.get(), "num_host_free"));
  }
}

}  // namespace
