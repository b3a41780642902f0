// SPDX-License-Identifier: Apache-2.0
// test_adv11_nearcap.cpp: the near-capacity behaviour seen from the public API: the
// out-of-memory retry that weighs every place of the stream by the pages the device must
// still give (idle chunks elsewhere that can move there count as covered), the option
// chunk_max_mb (chunks of expandable segments no larger than it, also when changed at run
// time with blocks live), and the out-of-memory help naming it with the statistic
// expseg.oom_free_pinned_bytes.
// - Weighing: an idle chunk larger than a place's room cannot move there, and one of a
//   private pool in use cannot move at all: neither covers a place; the retry must grow
//   where the request is served.
// - Help: the pages a failed growth created count as the device's free memory; a lower
//   chunk_max_mb is named only where a lower value gives smaller chunks.
// - Random: seeded runs on the host driver that change chunk_max_mb between steps (pages of
//   2 and 4 MiB and the driver's granularity), with faults, a private pool and a sleeping
//   region, patterns in live blocks, expseg_check after each step and nothing left with
//   the driver at the end.
// - Cost: a failing request on a stream with 10,000 unmapped ranges stays fast.
// - IPC: a block of many one-page chunks is exported and imported whole; requests that
//   must be one chunk (single_chunk_min_mb) stay one under the cap.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "alloc_support.h"
#include "block_pattern.h"
#include "expseg.h"
#include "expseg_testing.h"

namespace {

constexpr size_t KiB = 1024, MiB = KiB * 1024;

std::string err() { return expseg_last_error(); }

bool has(const std::string &m, const char *s) { return m.find(s) != std::string::npos; }

// Layout (2 MiB pages, stream 0): F, 60 MiB free in whole chunks, before a 20 MiB hole (place
// A: a 70 MiB request there needs 5 new pages); l1; C, a free 64 MiB block that is one idle
// chunk; l3 in use; then the segment's end (place B). C (32 pages) cannot move into A's 10
// pages of room, but moves to B. Returns the bytes held.
int64_t room_layout(expseg_allocator *A, std::vector<void *> &live, void **c_out) {
  void *f = nullptr, *h = nullptr, *l1 = nullptr, *c = nullptr, *l3 = nullptr;
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 60 * MiB, 0, &f)) << err();
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 20 * MiB, 0, &h)) << err();
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, 0, &l1)) << err();
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 64 * MiB, 0, &c)) << err();
  EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, 0, &l3)) << err();
  EXPECT_EQ(EXPSEG_OK, expseg_free(A, h));
  EXPECT_EQ(EXPSEG_OK, expseg_empty_cache(A)) << err(); // the hole
  EXPECT_EQ(EXPSEG_OK, expseg_free(A, c));
  EXPECT_EQ(EXPSEG_OK, expseg_free(A, f));
  EXPECT_EQ((char *)h, (char *)f + 60 * MiB);
  EXPECT_EQ((char *)l1, (char *)f + 80 * MiB);
  EXPECT_EQ((char *)c, (char *)l1 + 8 * MiB);
  EXPECT_EQ((char *)l3, (char *)c + 64 * MiB);
  live = {l1, l3};
  *c_out = c;
  return stat_of(A, "reserved_bytes.all.current");
}

} // namespace

// An idle chunk larger than a place's room cannot move there (growth moves no chunk larger
// than the place takes): the retry must not count it as covering that place. Here A needs
// 5 pages and would have all of them from the device, which has none left; B needs more
// pages, all of which F and C bring. The request must be served at B.
TEST(NearCap, RetryCountsOnlyChunksThatFitThePlace) {
  std::vector<void *> live;
  void *c = nullptr;
  int64_t held = 0, peak = 0;
  {
    AllocPtr a = make_alloc("sim", "expandable_segments:True");
    held = room_layout(a.get(), live, &c);
    peak = stat_of(a.get(), "reserved_bytes.all.peak");
    for (void *x : live) EXPECT_EQ(EXPSEG_OK, expseg_free(a.get(), x));
  }
  // the layout needs `peak` on the way; then the memory fraction leaves no page beyond it
  const std::string drv = "sim:capacity=" + std::to_string(peak);
  AllocPtr a = make_alloc(drv.c_str(), "expandable_segments:True");
  expseg_allocator *A = a.get();
  ASSERT_EQ(room_layout(A, live, &c), held);
  ASSERT_EQ(EXPSEG_OK, expseg_set_memory_fraction(A, (double(held) + 0.5 * MiB) / double(peak)));
  void *r = nullptr;
  const expseg_status st = expseg_malloc(A, 70 * MiB, 0, &r);
  ASSERT_EQ(EXPSEG_OK, st) << "F and C moved to the segment's end serve it: " << err();
  EXPECT_GT((char *)r, (char *)live[1]) << "at the segment's end";
  EXPECT_EQ(stat_of(A, "num_ooms"), 0);
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << err();
  live.push_back(r);
  for (void *x : live) EXPECT_EQ(EXPSEG_OK, expseg_free(A, x));
  expect_nothing_left(a.release(), "room");
}

// chunk_max_mb:8 from the start: 64 MiB in 8 MiB chunks, then 6 MiB blocks each sharing an 8 MiB chunk with a 2 MiB
// block in use: once freed, 3 pages of each are pinned (48 MiB). A 60 MiB request grows at
// the segment's end in 8 MiB chunks: two are created from the device's 16 MiB free before
// it runs out. Those pages go back after the report, so the help must count them as the
// device's free memory: 60 - 16 = 44 MiB missing is at most what is pinned, and the help
// names chunk_max_mb:4.
TEST(NearCap, OomHelpCountsPagesTheFailedGrowthCreated) {
  QuietLog q;
  AllocPtr a = make_alloc("sim:capacity=80M", "expandable_segments:True,chunk_max_mb:8");
  expseg_allocator *A = a.get();
  std::vector<void *> six, two, eight(8);
  for (void *&t : eight) ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, 0, &t)) << err();
  for (void *t : eight) ASSERT_EQ(EXPSEG_OK, expseg_free(A, t)); // 64 MiB in 8 MiB chunks
  for (int i = 0; i < 8; i++) {
    void *p = nullptr, *g = nullptr;
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 6 * MiB, 0, &p)) << err();
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 2 * MiB, 0, &g)) << err();
    ASSERT_EQ((char *)g, (char *)p + 6 * MiB);
    six.push_back(p);
    two.push_back(g);
  }
  ASSERT_EQ(stat_of(A, "reserved_bytes.all.current"), int64_t(64 * MiB));
  for (void *p : six) ASSERT_EQ(EXPSEG_OK, expseg_free(A, p));
  void *r = nullptr;
  ASSERT_EQ(EXPSEG_ERR_OUT_OF_MEMORY, expseg_malloc(A, 60 * MiB, 0, &r));
  const std::string m = err();
  EXPECT_EQ(stat_of(A, "expseg.oom_free_pinned_bytes"), int64_t(48 * MiB)) << m;
  EXPECT_EQ(stat_of(A, "expseg.oom_free_whole_page_bytes"), int64_t(48 * MiB)) << m;
  EXPECT_TRUE(has(m, "48.00 MiB is free in whole pages that chunks shared with blocks in use "
                     "pin: chunk_max_mb:4")) << m;
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << err();
  for (void *g : two) ASSERT_EQ(EXPSEG_OK, expseg_free(A, g));
  expect_nothing_left(a.release(), "pinned");
}

// Free whole pages pinned by a chunk made before chunk_max_mb was lowered to one page: a
// lower chunk_max_mb cannot make chunks smaller than a page, so the help must not name it
// (nor must it when chunk_max_mb is 6 with 4 MiB pages: one page already). The statistic
// still counts the pinned bytes.
TEST(NearCap, OomHelpNamesNoLowerChunkMaxWhenChunksAreOnePage) {
  struct Case {
    const char *create, *later;
  };
  for (const Case &k : {Case{"expandable_segments:True,va_reserve_mb:128", "chunk_max_mb:2"},
                        Case{"expandable_segments:True,va_reserve_mb:128,page_size_mb:4",
                             "chunk_max_mb:6"}}) {
    SCOPED_TRACE(k.later);
    QuietLog q;
    AllocPtr a = make_alloc("sim:capacity=64M", k.create);
    expseg_allocator *A = a.get();
    void *big = nullptr, *keep = nullptr, *b = nullptr, *r = nullptr;
    ASSERT_EQ(expseg_malloc(A, 40 * MiB, 0, &big), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_malloc(A, 16 * MiB, 0, &keep), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_free(A, big), EXPSEG_OK);
    ASSERT_EQ(expseg_malloc(A, 4 * MiB, 0, &b), EXPSEG_OK) << err();
    ASSERT_EQ(b, big);
    ASSERT_EQ(expseg_configure(A, k.later), EXPSEG_OK) << err();
    ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK) << err(); // the device has 8 MiB free
    ASSERT_EQ(expseg_malloc(A, 40 * MiB, 0, &r), EXPSEG_ERR_OUT_OF_MEMORY);
    const std::string m = err();
    EXPECT_EQ(stat_of(A, "expseg.oom_free_pinned_bytes"), int64_t(36 * MiB)) << m;
    EXPECT_FALSE(has(m, "chunk_max_mb")) << "chunks of one page already\n" << m;
    for (void *x : {b, keep}) ASSERT_EQ(expseg_free(A, x), EXPSEG_OK);
    ASSERT_EQ(expseg_check(A), EXPSEG_OK) << err();
  }
}

// Seeded random runs on the host driver (a small device, faults at create, map and
// set_access now and then) that change chunk_max_mb between steps, with blocks on two
// streams, in a private pool and in a region that sleeps and wakes; memory short often, so
// the out-of-memory retry runs. After every step expseg_check passes, the statistics are
// consistent and every live block keeps its pattern; at the end the driver holds nothing.
TEST(NearCap, RandomChunkMaxChangesKeepBooksAndBytes) {
  const uint64_t seed = test_seed(1111);
  std::mt19937_64 rng(seed);
  QuietLog q;
  for (const char *page : {"", ",page_size_mb:4", ",page_size_mb:0"}) {
    SCOPED_TRACE(std::string(page) + " " + test_seed_note(seed));
    const std::string conf = std::string("expandable_segments:True") + page;
    AllocPtr a = make_alloc("fault:fail=;host:capacity=160M", conf.c_str());
    expseg_allocator *A = a.get();
    ASSERT_TRUE(A);
    expseg_pool_id pool = 0;
    ASSERT_EQ(EXPSEG_OK, expseg_pool_create(A, &pool)) << err();
    struct Live {
      char *p;
      size_t size;
      uint64_t tag;
      bool region;
    };
    std::vector<Live> live;
    bool asleep = false;
    uint64_t tag = 1;
    const size_t sizes[] = {512, 3 * MiB, 6 * MiB, 8 * MiB, 9 * MiB, 20 * MiB, 33 * MiB};
    for (int step = 0; step < 1500; step++) {
      const std::string where = "step " + std::to_string(step);
      const int op = int(rng() % 100);
      if (op < 45) {
        size_t sz = sizes[rng() % 7] + (rng() % 4) * 4096 * (rng() % 2);
        const int kind = int(rng() % 4);
        void *p = nullptr;
        expseg_status st;
        if (kind == 3 && !asleep) {
          EXPECT_EQ(EXPSEG_OK, expseg_region_begin(A, "w")) << err();
          st = expseg_malloc(A, sz, 0, &p);
          EXPECT_EQ(EXPSEG_OK, expseg_region_end(A, "w")) << err();
        } else if (kind == 2) {
          st = expseg_malloc_pool(A, sz, 0, pool, &p);
        } else {
          st = expseg_malloc(A, sz, expseg_stream(kind), &p);
        }
        if (st == EXPSEG_OK) {
          Live l{(char *)p, sz, tag++, kind == 3 && !asleep};
          pattern_put(l.p, l.size, l.tag, 64 * KiB);
          live.push_back(l);
        } else {
          ASSERT_TRUE(st == EXPSEG_ERR_OUT_OF_MEMORY || st == EXPSEG_ERR_DRIVER) << where << err();
        }
      } else if (op < 80 && !live.empty()) {
        const size_t i = rng() % live.size();
        std::string why;
        if (!(live[i].region && asleep)) {
          ASSERT_TRUE(pattern_ok(live[i].p, live[i].size, live[i].tag, 64 * KiB, &why))
              << where << why;
        }
        ASSERT_EQ(EXPSEG_OK, expseg_free(A, live[i].p)) << where << err();
        live.erase(live.begin() + long(i));
      } else if (op < 86) {
        static const char *caps[] = {"chunk_max_mb:1", "chunk_max_mb:2",  "chunk_max_mb:6",
                                     "chunk_max_mb:8", "chunk_max_mb:32", ""};
        const std::string c = conf + "," + caps[rng() % 6];
        ASSERT_EQ(EXPSEG_OK, expseg_configure(A, c.back() == ',' ? conf.c_str() : c.c_str()))
            << where << err();
      } else if (op < 90) {
        static const char *faults[] = {"create@1", "map@2", "set_access@1", "create@3..4", ""};
        ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(A, faults[rng() % 5])) << err();
      } else if (op < 93) {
        ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(A)) << where << err();
      } else if (op < 95) {
        ASSERT_EQ(EXPSEG_OK, expseg_pool_empty_cache(A, pool)) << where << err();
      } else if (op < 97) {
        const expseg_status st = asleep ? expseg_wake(A, "w") : expseg_sleep(A, "w", EXPSEG_SLEEP_OFFLOAD);
        if (st == EXPSEG_OK) asleep = !asleep;
        else if (st == EXPSEG_ERR_INVALID_ARGUMENT && !asleep) {} // no region yet
        else ASSERT_TRUE(st == EXPSEG_ERR_OUT_OF_MEMORY || st == EXPSEG_ERR_DRIVER) << where << err();
      } else {
        int64_t v = 0;
        EXPECT_EQ(EXPSEG_OK, expseg_stat(A, "expseg.oom_free_pinned_bytes", &v));
        EXPECT_LE(v, stat_of(A, "expseg.oom_free_whole_page_bytes")) << where;
      }
      ASSERT_EQ(EXPSEG_OK, expseg_check(A)) << where << ": " << err();
      if (!asleep) expect_consistent(A, where); // a sleeping region's blocks hold nothing
      if (::testing::Test::HasFailure()) return;
    }
    ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(A, "")) << err();
    std::printf("%s: %lld retries, %lld out of memory, %llu faults\n", conf.c_str(),
                (long long)stat_of(A, "num_alloc_retries"), (long long)stat_of(A, "num_ooms"),
                (unsigned long long)expseg_testing_faults_injected(A));
    for (int pass = 0; pass < 2; pass++) { // the others first: the wake needs room
      if (pass == 1) {
        ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(A)) << err();
        if (asleep) {
          ASSERT_EQ(EXPSEG_OK, expseg_wake(A, "w")) << err();
        }
      }
      for (const Live &l : live) {
        if (l.region != (pass == 1)) continue;
        std::string why;
        EXPECT_TRUE(pattern_ok(l.p, l.size, l.tag, 64 * KiB, &why)) << why;
        ASSERT_EQ(EXPSEG_OK, expseg_free(A, l.p)) << err();
      }
    }
    ASSERT_EQ(EXPSEG_OK, expseg_pool_release(A, pool)) << err();
    expect_nothing_left(a.release(), page);
  }
}


// Cost: 10,000 places, each an unmapped 8 MiB hole after a block in use, on a segment that
// is full (no place at its end): an 8 MiB request fits every place, and when the memory
// fraction leaves no page to create the retry weighs every place. Each failing request
// must stay under a second: a guard against cost quadratic in the places (4.6 s with the
// search made quadratic on purpose; about 1.5 ms as it is), not a timing target, so a
// loaded machine does not fail it.
TEST(NearCap, RetryOverTenThousandHolesStaysFast) {
  QuietLog q;
  AllocPtr a = make_alloc("sim:capacity=1024G", "expandable_segments:True,va_reserve_mb:240000");
  expseg_allocator *A = a.get();
  std::vector<void *> keep, holes;
  for (int i = 0; i < 10000; i++) {
    void *l = nullptr, *h = nullptr;
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 16 * MiB, 0, &l)) << err();
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, 0, &h)) << err();
    keep.push_back(l);
    holes.push_back(h);
  }
  for (void *h : holes) ASSERT_EQ(EXPSEG_OK, expseg_free(A, h));
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(A)) << err(); // the holes
  const int64_t held = stat_of(A, "reserved_bytes.all.current");
  ASSERT_EQ(stat_of(A, "segment.all.current"), 1) << "one full segment";
  ASSERT_EQ(EXPSEG_OK, expseg_set_memory_fraction(A, double(held) / double(1024ull << 30)));
  // what is free but pinned (the last growth's surplus beside a block in use) is taken
  // first, so the requests timed below find nothing free and go through the retry
  std::vector<void *> taken;
  for (void *t = nullptr; expseg_malloc(A, 8 * MiB, 0, &t) == EXPSEG_OK; t = nullptr)
    taken.push_back(t);
  ASSERT_LT(taken.size(), 100u) << "little was free";
  const int64_t retries0 = stat_of(A, "num_alloc_retries");
  double worst = 0;
  for (int i = 0; i < 3; i++) {
    void *r = nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    const expseg_status st = expseg_malloc(A, 8 * MiB, 0, &r);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    worst = std::max(worst, ms);
    EXPECT_EQ(EXPSEG_ERR_OUT_OF_MEMORY, st) << err();
    if (st == EXPSEG_OK) expseg_free(A, r);
  }
  std::printf("worst failing request: %.1f ms, %lld retries\n", worst,
              (long long)stat_of(A, "num_alloc_retries"));
  EXPECT_GE(stat_of(A, "num_alloc_retries") - retries0, 3);
  EXPECT_LT(worst, 1000.0);
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << err();
  for (void *l : keep) ASSERT_EQ(EXPSEG_OK, expseg_free(A, l));
  for (void *t : taken) ASSERT_EQ(EXPSEG_OK, expseg_free(A, t));
}

// A block of 100 one-page chunks (chunk_max_mb:2) is exported and imported whole: every
// chunk in the handle, the bytes seen through the import, and nothing left after.
TEST(NearCap, ExportOfManySmallChunks) {
  AllocPtr a = make_alloc("host:capacity=512M", "expandable_segments:True,chunk_max_mb:2");
  AllocPtr b = make_alloc("host:capacity=512M", nullptr);
  const size_t size = 200 * MiB;
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a.get(), size, 0, &p)) << err();
  pattern_put((char *)p, size, 77, 64 * KiB);
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a.get(), p, &h)) << err();
  EXPECT_EQ(h.size, 64u + 32u * 100u) << "one entry per 2 MiB chunk";
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b.get(), &h, &q)) << err();
  expseg_ipc_handle_free(&h);
  std::string why;
  EXPECT_TRUE(pattern_ok((const char *)q, size, 77, 64 * KiB, &why)) << why;
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b.get(), q)) << err();
  ASSERT_EQ(EXPSEG_OK, expseg_free(a.get(), p)) << err();
  EXPECT_EQ(EXPSEG_OK, expseg_check(a.get())) << err();
  expect_nothing_left(b.release(), "importer");
  expect_nothing_left(a.release(), "exporter");
}

// Idle chunks of a private pool still in use cannot move into the general cache's growth:
// the retry must not count them. P1 (a 30 MiB hole, lowest) needs 12 new pages for a
// 24 MiB request; P2 (12 MiB free but pinned by a block in use, then a 20 MiB hole) needs
// 6. A private pool holds an idle 24 MiB chunk that would fit P1 only. With 6 pages left
// to create, the first try at P1 fails and the retry must grow at P2.
TEST(NearCap, RetryCountsNoIdleChunkOfAnotherPool) {
  std::vector<void *> live;
  void *a1, *s1, *x, *h, *l1, *l0, *p;
  auto layout = [&](expseg_allocator *A) {
    EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 30 * MiB, 0, &a1)) << err();
    EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 16 * MiB, 0, &s1)) << err();
    EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 20 * MiB, 0, &x)) << err();
    EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 20 * MiB, 0, &h)) << err();
    EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 16 * MiB, 0, &l1)) << err();
    EXPECT_EQ(EXPSEG_OK, expseg_free(A, x));
    EXPECT_EQ(EXPSEG_OK, expseg_malloc(A, 8 * MiB, 0, &l0)) << err();
    EXPECT_EQ(l0, x) << "in x's chunk, whose other 12 MiB it pins";
    EXPECT_EQ(EXPSEG_OK, expseg_free(A, a1));
    EXPECT_EQ(EXPSEG_OK, expseg_free(A, h));
    EXPECT_EQ(EXPSEG_OK, expseg_empty_cache(A)) << err(); // the two holes
    expseg_pool_id pool = 0;
    EXPECT_EQ(EXPSEG_OK, expseg_pool_create(A, &pool)) << err();
    EXPECT_EQ(EXPSEG_OK, expseg_malloc_pool(A, 24 * MiB, 0, pool, &p)) << err();
    EXPECT_EQ(EXPSEG_OK, expseg_free(A, p)); // idle in the pool, which stays in use
    live = {s1, l1, l0};
    return stat_of(A, "reserved_bytes.all.current");
  };
  int64_t held = 0, peak = 0;
  {
    AllocPtr a = make_alloc("sim", "expandable_segments:True");
    held = layout(a.get());
    peak = stat_of(a.get(), "reserved_bytes.all.peak");
    for (void *v : live) EXPECT_EQ(EXPSEG_OK, expseg_free(a.get(), v));
  }
  ASSERT_EQ(held, int64_t(76 * MiB)) << "16 + 20 + 16 in use or pinned, 24 in the pool";
  const std::string drv = "sim:capacity=" + std::to_string(peak);
  AllocPtr a = make_alloc(drv.c_str(), "expandable_segments:True");
  expseg_allocator *A = a.get();
  ASSERT_EQ(layout(A), held);
  ASSERT_EQ(EXPSEG_OK,
            expseg_set_memory_fraction(A, (double(held) + 12.5 * MiB) / double(peak)));
  void *r = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 24 * MiB, 0, &r)) << err();
  EXPECT_EQ((char *)r, (char *)l0 + 8 * MiB) << "at P2";
  EXPECT_EQ(stat_of(A, "num_alloc_retries"), 1) << "P1 was tried first";
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << err();
  live.push_back(r);
  for (void *v : live) EXPECT_EQ(EXPSEG_OK, expseg_free(A, v));
}

// A request that must be one physical chunk (single_chunk_min_mb, EXPSEG_MALLOC_SINGLE_CHUNK)
// stays one chunk under chunk_max_mb: the cap is for expandable segments' chunks only.
TEST(NearCap, SingleChunkRequestsIgnoreTheCap) {
  AllocPtr a = make_alloc("host:capacity=256M",
                          "expandable_segments:True,chunk_max_mb:2,single_chunk_min_mb:16");
  for (size_t size : {size_t(32 * MiB), size_t(17 * MiB)}) {
    void *p = nullptr;
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(a.get(), size, 0, &p)) << err();
    expseg_ipc_handle h = {};
    ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a.get(), p, &h)) << err();
    EXPECT_EQ(h.size, 64u + 32u) << size << ": one chunk";
    expseg_ipc_handle_free(&h);
    ASSERT_EQ(EXPSEG_OK, expseg_free(a.get(), p));
  }
  void *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a.get(), 8 * MiB, 0, &q)) << err();
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a.get(), q, &h)) << err();
  EXPECT_EQ(h.size, 64u + 32u * 4u) << "below single_chunk_min_mb: 2 MiB chunks";
  expseg_ipc_handle_free(&h);
  ASSERT_EQ(EXPSEG_OK, expseg_free(a.get(), q));
  EXPECT_EQ(EXPSEG_OK, expseg_check(a.get())) << err();
  expect_nothing_left(a.release(), "single");
}
