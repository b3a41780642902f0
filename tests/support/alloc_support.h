/* SPDX-License-Identifier: Apache-2.0 */
/* alloc_support.h: C helpers for the allocator-core tests (tests/test_alloc_*.cpp,
 * test_stats_*.cpp, test_threads.cpp). They reach the allocator's internals (its driver,
 * held streams) so that the C++ tests need only expseg.h and this header, and they build a
 * non-owning "borrow" driver so that a test can keep the drivers below the allocator alive
 * after expseg_destroy and check that everything was given back. The C++ part holds what
 * the allocator suites would otherwise each write again: statistics by key or as a map,
 * creation that fails the test with the message, and the check that a destroyed allocator
 * left nothing with its driver. */
#ifndef EXPSEG_ALLOC_SUPPORT_H
#define EXPSEG_ALLOC_SUPPORT_H

#include "expseg_testing.h"
#include "vmm_support.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The driver the allocator holds (a->drv). */
expseg_vmm_t *alloc_test_driver(expseg_allocator *a);
/* Holds (or releases) a stream of the allocator's driver: events recorded on a held stream
 * stay incomplete until it is released. */
expseg_status alloc_test_hold(expseg_allocator *a, expseg_stream s, bool hold);
/* A driver that forwards every call to `inner` through its checked, counting wrappers and
 * does NOT close inner when closed: give it to _expseg_create_with_driver, destroy the
 * allocator, then inspect inner (vmm_test_is_idle) and close it yourself. */
expseg_status alloc_test_borrow(expseg_vmm_t *inner, expseg_vmm_t **out);
/* _expseg_create_with_driver (pools/internal.h), reachable from C++. */
expseg_status alloc_test_create(expseg_vmm_t *drv, const char *config, expseg_allocator **out);
/* The allocator's expandable page size and driver granularity. */
size_t alloc_test_page(const expseg_allocator *a);
/* How many streams own free blocks in the free index of the small or the large pool (the
 * count that gates lending a tighter fit, policy.h). */
size_t alloc_test_free_streams(expseg_allocator *a, bool small);
/* Driver calls of kind c made by the allocator's driver so far (all, not reset). */
uint64_t alloc_test_calls(expseg_allocator *a, expseg_vmm_call c);

/* Whether the allocator's lock is free right now (trylock + unlock): OOM observers use it
 * to prove they run without the lock. */
bool alloc_test_lock_is_free(expseg_allocator *a);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
/* C++ helpers shared by the allocator-core suites. */
#include <gtest/gtest.h>

#include "test_seed.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

/* A statistic by key; a failed lookup is a test failure (and yields INT64_MIN). */
inline int64_t stat_of(const expseg_allocator *a, const std::string &key) {
  int64_t v = INT64_MIN;
  expseg_status st = expseg_stat(a, key.c_str(), &v);
  EXPECT_EQ(st, EXPSEG_OK) << key << ": " << expseg_last_error();
  return v;
}

/* Every statistic by key (expseg_stats_foreach / expseg_host_stats_foreach). */
using StatMap = std::map<std::string, int64_t>;
inline void stat_map_put(void *ctx, const char *key, int64_t v) {
  (*static_cast<StatMap *>(ctx))[key] = v;
}
inline StatMap stat_map(const expseg_allocator *a) {
  StatMap m;
  expseg_stats_foreach(a, stat_map_put, &m);
  return m;
}
inline StatMap host_stat_map(const expseg_host_pool *h) {
  StatMap m;
  expseg_host_stats_foreach(h, stat_map_put, &m);
  return m;
}
/* m without the timings (every key holding "time"): they move with the clock, not with the
 * calls, so they are left out where a test compares statistics before and after a call. */
inline StatMap without_times(StatMap m) {
  for (auto it = m.begin(); it != m.end();)
    it = it->first.find("time") != std::string::npos ? m.erase(it) : std::next(it);
  return m;
}

/* A pinned host pool call that failed: the status, a message holding every piece of
 * `names`, and the pool's statistics (timings aside) equal to `before`. */
inline void expect_host_refused(expseg_host_pool *h, expseg_status got, expseg_status want,
                                const StatMap &before, const std::vector<std::string> &names,
                                const std::string &what) {
  std::string msg = expseg_last_error();
  EXPECT_EQ(got, want) << what << ": " << msg;
  for (const std::string &n : names)
    EXPECT_NE(msg.find(n), std::string::npos) << what << ": message lacks '" << n << "': " << msg;
  EXPECT_EQ(without_times(host_stat_map(h)), without_times(before)) << what << " changed stats";
}

/* A pointer as messages print it (%p). */
inline std::string ptr_text(const void *p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

struct AllocDeleter {
  void operator()(expseg_allocator *a) const { expseg_destroy(a); }
};
using AllocPtr = std::unique_ptr<expseg_allocator, AllocDeleter>;

inline AllocPtr make_alloc(const char *driver, const char *config) {
  expseg_allocator *a = nullptr;
  expseg_status st = expseg_create(driver, 0, config, &a);
  EXPECT_EQ(st, EXPSEG_OK) << driver << " / " << (config ? config : "(env)") << ": "
                           << expseg_last_error();
  return AllocPtr(a);
}

/* allocated_bytes <= active_bytes <= reserved_bytes in every pool, and the checker passes. */
inline void expect_consistent(const expseg_allocator *a, const std::string &where) {
  for (const char *pool : {"all", "small_pool", "large_pool"}) {
    std::string p = std::string(".") + pool + ".current";
    int64_t al = stat_of(a, "allocated_bytes" + p), ac = stat_of(a, "active_bytes" + p),
            re = stat_of(a, "reserved_bytes" + p);
    EXPECT_LE(al, ac) << where << ": allocated_bytes" << p << " > active_bytes";
    EXPECT_LE(ac, re) << where << ": active_bytes" << p << " > reserved_bytes";
    EXPECT_LE(stat_of(a, "allocation" + p), stat_of(a, "active" + p)) << where;
  }
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << expseg_last_error();
}

/* Destroys a (expseg_testing_destroy) and expects its driver to hold nothing afterwards. */
inline void expect_nothing_left(expseg_allocator *a, const std::string &where) {
  expseg_testing_driver_counts left;
  expseg_testing_destroy(a, &left);
  EXPECT_EQ(left.live_chunks, 0) << where;
  EXPECT_EQ(left.live_chunk_bytes, 0) << where;
  EXPECT_EQ(left.live_reservations, 0) << where;
  EXPECT_EQ(left.reserved_va_bytes, 0) << where;
  EXPECT_EQ(left.mapped_bytes, 0) << where;
  EXPECT_EQ(left.live_events, 0) << where;
}

/* 2 * n blocks of `each` bytes on stream 0, every other one freed: n idle holes, each
 * between two live blocks. Returns the live ones. */
inline std::vector<void *> alloc_holes(expseg_allocator *a, size_t n, size_t each) {
  std::vector<void *> all(2 * n, nullptr), live;
  for (void *&p : all)
    EXPECT_EQ(expseg_malloc(a, each, 0, &p), EXPSEG_OK) << expseg_last_error();
  for (size_t i = 0; i < all.size(); i++) {
    if (i % 2 == 0) {
      EXPECT_EQ(expseg_free(a, all[i]), EXPSEG_OK) << expseg_last_error();
    } else {
      live.push_back(all[i]);
    }
  }
  return live;
}

/* Frees every block of v and empties it. */
inline void free_blocks(expseg_allocator *a, std::vector<void *> &v) {
  for (void *p : v) EXPECT_EQ(expseg_free(a, p), EXPSEG_OK) << expseg_last_error();
  v.clear();
}

/* Log sink that counts warnings instead of printing them. */
struct QuietLog {
  int lines = 0;
  std::string last;
  QuietLog() { expseg_set_log_sink(&QuietLog::sink, this); }
  ~QuietLog() { expseg_set_log_sink(nullptr, nullptr); }
  static void sink(void *ctx, const char *line) {
    auto *q = static_cast<QuietLog *>(ctx);
    q->lines++;
    q->last = line;
    if (std::getenv("EXPSEG_TEST_SHOW_WARNINGS")) std::fprintf(stderr, "%s\n", line);
  }
};
#endif
#endif
