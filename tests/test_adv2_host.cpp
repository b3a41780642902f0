// SPDX-License-Identifier: Apache-2.0
// test_adv2_host.cpp: the pinned host pool (expseg_host_*) driven through its public API
// the way a hostile caller would: NULL, foreign, interior and twice-freed pointers (also
// after carved blocks merged), every failed call leaving the statistics as they were,
// empty_cache under live blocks (their bytes intact), the exact-size options at their
// edges, the pool's history bounds and a snapshot with host segments read back by Python.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "alloc_support.h"
#include "expseg.h"
#include "host_pool_support.h"
#include "snapshot_check.h"
#include "test_seed.h"

namespace {

// The pool's invariants that hold after any sequence of calls.
void expect_sane(const expseg_host_pool *h, const std::string &where) {
  StatMap s = host_stat_map(h);
  for (const char *k : {"allocation", "allocated_bytes", "segment", "reserved_bytes",
                        "expseg.cached_bytes", "expseg.pending_blocks"}) {
    std::string cur = std::string(k) + ".current", peak = std::string(k) + ".peak";
    EXPECT_GE(s[cur], 0) << where << ": " << cur;
    EXPECT_LE(s[cur], s[peak]) << where << ": " << cur << " above its peak";
  }
  EXPECT_LE(s["allocated_bytes.current"] + s["expseg.cached_bytes.current"],
            s["reserved_bytes.current"])
      << where << ": allocated + cached above reserved";
  EXPECT_EQ(s["expseg.locked_bytes"] + s["expseg.unlocked_bytes"], s["reserved_bytes.current"])
      << where;
  EXPECT_EQ(s["num_host_alloc"] - s["num_host_free"], s["segment.current"]) << where;
}

TEST(Adv2Host, BadPointersAreRefusedAndChangeNothing) {
  PoolPtr p = make_pool("host", "");
  expseg_host_pool *h = p.get();
  void *a = nullptr, *b = nullptr;
  ASSERT_EQ(expseg_host_malloc(h, 100 * KiB, &a), EXPSEG_OK);
  ASSERT_EQ(expseg_host_malloc(h, 3 * KiB, &b), EXPSEG_OK);
  std::memset(a, 0xa5, 100 * KiB);
  StatMap before = host_stat_map(h);

  EXPECT_EQ(expseg_host_free(h, nullptr), EXPSEG_OK);
  EXPECT_EQ(expseg_host_record_stream(h, nullptr, 7), EXPSEG_OK);
  int on_stack = 0;
  expect_host_refused(h, expseg_host_free(h, &on_stack), EXPSEG_ERR_INVALID_ARGUMENT, before,
                      {ptr_text(&on_stack), "expseg_free"}, "free of a stack address");
  expect_host_refused(h, expseg_host_record_stream(h, &on_stack, 1), EXPSEG_ERR_INVALID_ARGUMENT,
                      before, {ptr_text(&on_stack)}, "record_stream of a stack address");
  void *inner = static_cast<char *>(a) + 4096;
  expect_host_refused(h, expseg_host_free(h, inner), EXPSEG_ERR_INVALID_ARGUMENT, before,
                      {ptr_text(inner), ptr_text(a)}, "free of an interior pointer");
  expect_host_refused(h, expseg_host_record_stream(h, inner, 3), EXPSEG_ERR_INVALID_ARGUMENT,
                      before, {ptr_text(inner)}, "record_stream of an interior pointer");
  expect_host_refused(h, expseg_host_free(nullptr, a), EXPSEG_ERR_INVALID_ARGUMENT, before,
                      {"NULL"}, "free with a NULL pool");
  void *o = &on_stack;
  expect_host_refused(h, expseg_host_malloc(h, 1, nullptr), EXPSEG_ERR_INVALID_ARGUMENT, before,
                      {"NULL"}, "malloc with a NULL out");
  expect_host_refused(h, expseg_host_malloc(h, SIZE_MAX, &o), EXPSEG_ERR_INVALID_ARGUMENT, before,
                      {"2^60"}, "malloc of SIZE_MAX");
  EXPECT_EQ(o, nullptr) << "a failed malloc leaves *out NULL";
  int64_t v = 0;
  expect_host_refused(h, expseg_host_stat(h, "allocation.nope", &v), EXPSEG_ERR_INVALID_ARGUMENT,
                      before, {"allocation.nope"}, "unknown key");

  // the block survived every refused call
  for (size_t i = 0; i < 100 * KiB; i++)
    ASSERT_EQ(static_cast<unsigned char *>(a)[i], 0xa5) << "byte " << i;
  ASSERT_EQ(expseg_host_free(h, a), EXPSEG_OK);
  StatMap after_free = host_stat_map(h);
  expect_host_refused(h, expseg_host_free(h, a), EXPSEG_ERR_INVALID_ARGUMENT, after_free,
                      {ptr_text(a), "already freed"}, "double free");
  expect_host_refused(h, expseg_host_record_stream(h, a, 5), EXPSEG_ERR_INVALID_ARGUMENT,
                      after_free, {ptr_text(a), "already freed"}, "record_stream after free");
  // an allocator's device pointer is foreign to the pool
  expseg_allocator *dev = nullptr;
  ASSERT_EQ(expseg_create("host", 0, "", &dev), EXPSEG_OK) << expseg_last_error();
  void *d = nullptr;
  ASSERT_EQ(expseg_malloc(dev, 1 * MiB, 0, &d), EXPSEG_OK);
  expect_host_refused(h, expseg_host_free(h, d), EXPSEG_ERR_INVALID_ARGUMENT, after_free,
                      {ptr_text(d), "expseg_free"}, "free of a device pointer");
  // and the pool's pointer is foreign to the allocator, which says where it belongs
  EXPECT_EQ(expseg_free(dev, b), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("expseg_host_free"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(expseg_check(dev), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_free(dev, d), EXPSEG_OK);
  expseg_destroy(dev);
  EXPECT_EQ(expseg_host_free(h, b), EXPSEG_OK);
  expect_sane(h, "end");
  EXPECT_EQ(hstat(h, "allocation.current"), 0);
}

// Carved blocks merge with their free neighbours at once: a second free of a block whose
// memory merged into the block before it must still be reported as a double free, not as a
// pointer "inside" a block the caller never saw.
TEST(Adv2Host, DoubleFreeOfAMergedCarvedBlockSaysAlreadyFreed) {
  PoolPtr p = make_pool("host", "pinned_max_round_threshold_mb:0");
  expseg_host_pool *h = p.get();
  void *x = nullptr, *y = nullptr, *z = nullptr;
  ASSERT_EQ(expseg_host_malloc(h, 12 * KiB, &x), EXPSEG_OK);
  ASSERT_EQ(expseg_host_malloc(h, 20 * KiB, &y), EXPSEG_OK);
  ASSERT_EQ(expseg_host_malloc(h, 28 * KiB, &z), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(h, x), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(h, y), EXPSEG_OK); // merges into x's free block if adjacent
  StatMap before = host_stat_map(h);
  expect_host_refused(h, expseg_host_free(h, y), EXPSEG_ERR_INVALID_ARGUMENT, before,
                      {ptr_text(y), "already freed"}, "double free of a merged carved block");
  expect_host_refused(h, expseg_host_record_stream(h, y, 2), EXPSEG_ERR_INVALID_ARGUMENT, before,
                      {ptr_text(y), "already freed"}, "record_stream of a merged carved block");
  // an interior pointer of a live carved block still names the block
  void *in_z = static_cast<char *>(z) + 8 * KiB;
  expect_host_refused(h, expseg_host_free(h, in_z), EXPSEG_ERR_INVALID_ARGUMENT, before,
                      {ptr_text(in_z), ptr_text(z)}, "interior of a live carved block");
  EXPECT_EQ(expseg_host_free(h, z), EXPSEG_OK);
  expect_sane(h, "end");
}

TEST(Adv2Host, EmptyCacheWithLiveBlocksKeepsThemIntact) {
  for (const char *cfg : {"", "pinned_max_round_threshold_mb:0",
                          "pinned_reserve_segment_size_mb:4", "pinned_max_cached_size_mb:0",
                          "pinned_max_round_threshold_mb:0,pinned_carve_strict:True"}) {
    SCOPED_TRACE(cfg);
    PoolPtr p = make_pool("host", cfg);
    expseg_host_pool *h = p.get();
    std::vector<std::pair<unsigned char *, size_t>> live;
    for (size_t i = 0; i < 24; i++) {
      size_t n = (i * 7919 % 200 + 1) * KiB + i;
      void *q = nullptr;
      ASSERT_EQ(expseg_host_malloc(h, n, &q), EXPSEG_OK) << expseg_last_error();
      std::memset(q, (int)(i + 1), n);
      live.push_back({static_cast<unsigned char *>(q), n});
    }
    for (size_t i = 0; i < live.size(); i += 2) {
      ASSERT_EQ(expseg_host_free(h, live[i].first), EXPSEG_OK);
      live[i].first = nullptr;
    }
    int64_t alloc_before = hstat(h, "allocated_bytes.current");
    ASSERT_EQ(expseg_host_empty_cache(h), EXPSEG_OK);
    expect_sane(h, "after empty_cache");
    EXPECT_EQ(hstat(h, "allocated_bytes.current"), alloc_before);
    EXPECT_EQ(hstat(h, "allocation.current"), 12);
    for (size_t i = 1; i < live.size(); i += 2)
      for (size_t k = 0; k < live[i].second; k++)
        ASSERT_EQ(live[i].first[k], (unsigned char)(i + 1)) << "block " << i << " byte " << k;
    // new blocks never overlap live ones
    for (size_t i = 0; i < 12; i++) {
      void *q = nullptr;
      size_t n = (i * 31 % 90 + 1) * KiB;
      ASSERT_EQ(expseg_host_malloc(h, n, &q), EXPSEG_OK);
      auto *c = static_cast<unsigned char *>(q);
      for (size_t j = 1; j < live.size(); j += 2)
        EXPECT_TRUE(c + n <= live[j].first || live[j].first + live[j].second <= c)
            << "new block overlaps live block " << j;
      std::memset(q, 0, n);
      ASSERT_EQ(expseg_host_free(h, q), EXPSEG_OK);
    }
    for (size_t i = 1; i < live.size(); i += 2)
      for (size_t k = 0; k < live[i].second; k++)
        ASSERT_EQ(live[i].first[k], (unsigned char)(i + 1)) << "block " << i << " byte " << k;
    for (size_t i = 1; i < live.size(); i += 2) ASSERT_EQ(expseg_host_free(h, live[i].first), EXPSEG_OK);
    ASSERT_EQ(expseg_host_empty_cache(h), EXPSEG_OK);
    expect_sane(h, "all freed");
    EXPECT_EQ(hstat(h, "allocation.current"), 0);
    EXPECT_EQ(hstat(h, "allocated_bytes.current"), 0);
    EXPECT_EQ(hstat(h, "expseg.cached_bytes.current"),
              hstat(h, "expseg.reserve_segment_bytes") ? hstat(h, "expseg.reserve_segment_used_bytes")
                                                    : 0);
    int64_t res = hstat(h, "expseg.reserve_segment_bytes");
    EXPECT_EQ(hstat(h, "reserved_bytes.current"), res) << "only the reserve segment stays";
  }
}

TEST(Adv2Host, CachedSizeZeroGivesEveryBlockBack) {
  PoolPtr p = make_pool("host", "pinned_max_cached_size_mb:0");
  expseg_host_pool *h = p.get();
  for (int i = 0; i < 5; i++) {
    void *q = nullptr;
    ASSERT_EQ(expseg_host_malloc(h, 5000 + 1000 * (size_t)i, &q), EXPSEG_OK);
    ASSERT_EQ(expseg_host_free(h, q), EXPSEG_OK);
    EXPECT_EQ(hstat(h, "segment.current"), 0) << "round " << i;
    EXPECT_EQ(hstat(h, "reserved_bytes.current"), 0) << "round " << i;
    EXPECT_EQ(hstat(h, "expseg.cached_bytes.current"), 0) << "round " << i;
  }
  EXPECT_EQ(hstat(h, "num_host_alloc"), 5);
  EXPECT_EQ(hstat(h, "num_host_free"), 5);
  expect_sane(h, "end");
}

// The reserve segment is sliced before the driver is asked, for exact (carved) sizes too: a
// pool made with pinned_max_round_threshold_mb:0 must not hold its reserve idle and make
// carve segments beside it.
TEST(Adv2Host, ReserveSegmentServesExactSizes) {
  for (const char *cfg : {"pinned_reserve_segment_size_mb:4",
                          "pinned_reserve_segment_size_mb:4,pinned_max_round_threshold_mb:0",
                          "pinned_reserve_segment_size_mb:4,pinned_max_cached_size_mb:0"}) {
    SCOPED_TRACE(cfg);
    PoolPtr p = make_pool("host", cfg);
    expseg_host_pool *h = p.get();
    void *q[4];
    for (int round = 0; round < 2; round++) {
      for (int i = 0; i < 4; i++) ASSERT_EQ(expseg_host_malloc(h, 100000 + (size_t)i, &q[i]), EXPSEG_OK);
      EXPECT_EQ(hstat(h, "segment.current"), 1) << "round " << round << ": only the reserve segment";
      EXPECT_EQ(hstat(h, "reserved_bytes.current"), 4 * (int64_t)MiB) << "round " << round;
      EXPECT_EQ(hstat(h, "expseg.reserve_allocs"), 4) << "round " << round << ": slices reused";
      for (int i = 0; i < 4; i++) ASSERT_EQ(expseg_host_free(h, q[i]), EXPSEG_OK);
    }
    EXPECT_EQ(hstat(h, "num_host_alloc"), 1);
    expect_sane(h, "end");
  }
}

TEST(Adv2Host, ResetPeakThenPeaksFollowCurrent) {
  PoolPtr p = make_pool("host", "pinned_max_round_threshold_mb:1");
  expseg_host_pool *h = p.get();
  void *big = nullptr, *small = nullptr;
  ASSERT_EQ(expseg_host_malloc(h, 3 * MiB, &big), EXPSEG_OK);
  ASSERT_EQ(expseg_host_malloc(h, 4 * KiB, &small), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(h, big), EXPSEG_OK);
  EXPECT_GT(hstat(h, "allocated_bytes.peak"), hstat(h, "allocated_bytes.current"));
  expseg_host_reset_peak_stats(h);
  StatMap s = host_stat_map(h);
  for (auto &kv : s)
    if (kv.first.size() > 5 && kv.first.compare(kv.first.size() - 5, 5, ".peak") == 0 &&
        kv.first.find("_time") == std::string::npos) {
      std::string cur = kv.first.substr(0, kv.first.size() - 5) + ".current";
      EXPECT_EQ(kv.second, s[cur]) << kv.first;
    }
  expseg_host_reset_peak_stats(nullptr); // no crash
  ASSERT_EQ(expseg_host_free(h, small), EXPSEG_OK);
  expect_sane(h, "end");
}

// Threads share one pool (with the background thread, carving, a reserve and a cached-size
// cap): every block keeps its pattern until its free, and the pool balances at the end.
TEST(Adv2Host, ThreadsShareAPoolWithoutLosingBytes) {
  EXPSEG_SEEDED(seed, 77);
  for (const char *cfg :
       {"pinned_use_background_threads:True,pinned_max_round_threshold_mb:0,"
        "pinned_reserve_segment_size_mb:2",
        "pinned_use_background_threads:True,pinned_max_round_threshold_mb:1,"
        "pinned_max_cached_size_mb:1,pinned_carve_strict:True"}) {
    SCOPED_TRACE(cfg);
    PoolPtr p = make_pool("host", cfg);
    expseg_host_pool *h = p.get();
    std::vector<std::thread> ts;
    std::vector<int> bad(4, 0);
    for (int t = 0; t < 4; t++)
      ts.emplace_back([h, t, seed, &bad] {
        TestRng r(seed * 8 + (uint64_t)t);
        std::vector<std::pair<unsigned char *, size_t>> mine;
        for (int i = 0; i < 1500; i++) {
          if (mine.empty() || (mine.size() < 24 && r.chance(0.55))) {
            size_t n = 1 + r.below(r.chance(0.9) ? 96 * KiB : 2 * MiB);
            void *q = nullptr;
            if (expseg_host_malloc(h, n, &q) != EXPSEG_OK) {
              bad[t]++;
              continue;
            }
            std::memset(q, t * 16 + (int)(n & 15), n);
            mine.push_back({static_cast<unsigned char *>(q), n});
            if (r.chance(0.3)) (void)expseg_host_record_stream(h, q, r.below(4));
          } else {
            size_t k = r.below(mine.size());
            auto b = mine[k];
            for (size_t j = 0; j < b.second; j++)
              if (b.first[j] != (unsigned char)(t * 16 + (int)(b.second & 15))) {
                bad[t]++;
                break;
              }
            if (expseg_host_free(h, b.first) != EXPSEG_OK) bad[t]++;
            mine[k] = mine.back();
            mine.pop_back();
          }
          if (i % 500 == 499) (void)expseg_host_empty_cache(h);
        }
        for (auto &b : mine)
          if (expseg_host_free(h, b.first) != EXPSEG_OK) bad[t]++;
      });
    for (auto &t : ts) t.join();
    for (int t = 0; t < 4; t++) EXPECT_EQ(bad[t], 0) << "thread " << t;
    ASSERT_EQ(expseg_host_empty_cache(h), EXPSEG_OK);
    expect_sane(h, "end");
    EXPECT_EQ(hstat(h, "allocation.current"), 0);
    EXPECT_EQ(hstat(h, "expseg.pending_blocks.current"), 0);
    EXPECT_EQ(hstat(h, "reserved_bytes.current"), hstat(h, "expseg.reserve_segment_bytes"));
  }
}

// Python reads the snapshot: host_segments' allocated blocks are what the statistics say, and
// host_traces holds what the history bound allows.
std::string host_summary(expseg_allocator *a, expseg_host_pool *h, unsigned flags,
                         const std::string &path) {
  unsigned char *buf = nullptr;
  size_t len = 0;
  EXPECT_EQ(expseg_snapshot_with_host(a, h, flags, &buf, &len), EXPSEG_OK) << expseg_last_error();
  if (!buf) return "";
  FILE *f = std::fopen(path.c_str(), "wb");
  std::fwrite(buf, 1, len, f);
  std::fclose(f);
  expseg_snapshot_free(buf);
  std::string out;
  int rc = snapshot_run(
      "python3 -c \"import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); "
      "s=d['host_segments']; t=d['host_traces']; "
      "al=sum(b['size'] for g in s for b in g['blocks'] if b['state']=='active_allocated'); "
      "tot=sum(g['total_size'] for g in s); "
      "bad=[g['address'] for g in s if sum(b['size'] for b in g['blocks'])!=g['total_size'] or "
      "any(b['address']!=g['address']+sum(c['size'] for c in g['blocks'][:i]) "
      "for i,b in enumerate(g['blocks']))]; "
      "bad and sys.exit('host segments not tiled by their blocks: %s' % bad); "
      "print(len(s), tot, al, len(t), ','.join(e['action'] for e in t))\" '" + path + "'",
      &out);
  EXPECT_EQ(rc, 0) << out;
  return out;
}

// Every kind of host segment at once (reserve slices of exact and power-of-two sizes, carve
// segments, chunks of their own above the cached size), with live, free and cached blocks:
// the snapshot's host segments are tiled by their blocks and agree with the statistics.
TEST(Adv2Host, SnapshotOfEveryKindOfSegment) {
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 with pickle is needed";
  PoolPtr p = make_pool("host", "pinned_reserve_segment_size_mb:1,pinned_max_round_threshold_mb:0,"
                 "pinned_max_cached_size_mb:2");
  expseg_host_pool *h = p.get();
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim", 0, "", &a), EXPSEG_OK);
  std::vector<void *> live;
  const size_t sizes[] = {100000, 5000, 300000, 700000, 3 * MiB, 64 * KiB, 9000, 1500000};
  for (size_t n : sizes) {
    void *q = nullptr;
    ASSERT_EQ(expseg_host_malloc(h, n, &q), EXPSEG_OK) << expseg_last_error();
    live.push_back(q);
  }
  ASSERT_EQ(expseg_host_free(h, live[1]), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(h, live[3]), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(h, live[4]), EXPSEG_OK); // above the cached size: given back
  std::string path = ::testing::TempDir() + "adv2_host_kinds.pickle";
  std::string out = host_summary(a, h, 0, path);
  int nseg = -1, ntr = -1;
  long long tot = -1, al = -1;
  ASSERT_GE(std::sscanf(out.c_str(), "%d %lld %lld %d", &nseg, &tot, &al, &ntr), 4) << out;
  EXPECT_EQ(nseg, hstat(h, "segment.current")) << out;
  EXPECT_EQ(tot, hstat(h, "reserved_bytes.current")) << out;
  EXPECT_EQ(al, hstat(h, "allocated_bytes.current")) << out;
  std::string chk;
  EXPECT_EQ(snapshot_check(path, "", false, &chk), 0) << chk;
  for (size_t i : {0, 2, 5, 6, 7}) ASSERT_EQ(expseg_host_free(h, live[i]), EXPSEG_OK);
  expect_sane(h, "end");
  expseg_destroy(a);
}

TEST(Adv2Host, HistoryBoundsAndSnapshotAgreeWithStatistics) {
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 with pickle is needed";
  PoolPtr p = make_pool("host", "pinned_max_round_threshold_mb:0");
  expseg_host_pool *h = p.get();
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("host", 0, "", &a), EXPSEG_OK) << expseg_last_error();
  std::string path = ::testing::TempDir() + "adv2_host.pickle";

  StatMap before = host_stat_map(h);
  expect_host_refused(h, expseg_host_record_history(h, true, 0, 0), EXPSEG_ERR_INVALID_ARGUMENT,
                      before, {"max_entries", "0"}, "history of 0 entries");
  expect_host_refused(h, expseg_host_record_history(h, true, 4, 1u << 30),
                      EXPSEG_ERR_INVALID_ARGUMENT, before, {"flags"}, "unknown history flag");
  EXPECT_EQ(expseg_host_record_history(nullptr, true, 4, 0), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_host_record_history(h, false, 0, 0), EXPSEG_OK) << "disabling takes 0";

  // max_entries 1: only the newest event
  ASSERT_EQ(expseg_host_record_history(h, true, 1, 0), EXPSEG_OK);
  void *x = nullptr, *y = nullptr;
  ASSERT_EQ(expseg_host_malloc(h, 10 * KiB, &x), EXPSEG_OK);
  ASSERT_EQ(expseg_host_malloc(h, 30 * KiB, &y), EXPSEG_OK);
  std::string out = host_summary(a, h, 0, path);
  int nseg = -1, ntr = -1;
  long long tot = -1, al = -1;
  char actions[512] = "";
  ASSERT_GE(std::sscanf(out.c_str(), "%d %lld %lld %d %511s", &nseg, &tot, &al, &ntr, actions), 4)
      << out;
  EXPECT_EQ(nseg, hstat(h, "segment.current")) << out;
  EXPECT_EQ(tot, hstat(h, "reserved_bytes.current")) << out;
  EXPECT_EQ(al, hstat(h, "allocated_bytes.current")) << out;
  EXPECT_EQ(ntr, 1) << "max_entries 1 keeps one event: " << out;
  EXPECT_STREQ(actions, "snapshot") << "the snapshot is the newest event: " << out;

  // huge bound: every event; skip alloc: none of those
  ASSERT_EQ(expseg_host_record_history(h, true, SIZE_MAX,
                                       EXPSEG_HISTORY_CLEAR | EXPSEG_HISTORY_SKIP_ALLOC),
            EXPSEG_OK);
  void *z = nullptr;
  ASSERT_EQ(expseg_host_malloc(h, 50 * KiB, &z), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(h, x), EXPSEG_OK);
  out = host_summary(a, h, 0, path);
  actions[0] = '\0';
  ASSERT_GE(std::sscanf(out.c_str(), "%d %lld %lld %d %511s", &nseg, &tot, &al, &ntr, actions), 4)
      << out;
  EXPECT_EQ(std::string(actions).find("alloc,"), std::string::npos) << out;
  EXPECT_NE(std::string(actions).find("free_requested"), std::string::npos) << out;
  EXPECT_EQ(al, hstat(h, "allocated_bytes.current")) << out;
  EXPECT_EQ(nseg, hstat(h, "segment.current")) << out;

  // NO_TRACES: state only
  out = host_summary(a, h, EXPSEG_SNAPSHOT_NO_TRACES, path);
  ASSERT_GE(std::sscanf(out.c_str(), "%d %lld %lld %d", &nseg, &tot, &al, &ntr), 4) << out;
  EXPECT_EQ(ntr, 0) << out;
  EXPECT_EQ(al, hstat(h, "allocated_bytes.current")) << out;

  // off clears; the full snapshot still validates
  ASSERT_EQ(expseg_host_record_history(h, false, 0, 0), EXPSEG_OK);
  out = host_summary(a, h, 0, path);
  ASSERT_GE(std::sscanf(out.c_str(), "%d %lld %lld %d", &nseg, &tot, &al, &ntr), 4) << out;
  EXPECT_EQ(ntr, 0) << "history off: " << out;
  std::string chk;
  EXPECT_EQ(snapshot_check(path, "", false, &chk), 0) << chk;
  EXPECT_EQ(expseg_snapshot_with_host(a, h, 0, nullptr, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(expseg_host_free(h, y), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(h, z), EXPSEG_OK);
  expect_sane(h, "end");
  expseg_destroy(a);
}

} // namespace
