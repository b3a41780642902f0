// SPDX-License-Identifier: Apache-2.0
// test_alloc_pools.cpp: private memory pools (expseg_pool_*, expseg_malloc_pool), each call
// and each error, on the host and sim drivers, with expandable segments on and off: routing
// (filters, newest begun first), isolation (no block crosses pools, reuse only inside a pool,
// no trimming of a live pool's memory), release (memory back only once every block is free
// and its streams' work is done), statistics (reserved_bytes_by_private_pools) and
// snapshots (segment_pool_id). The random run is in test_alloc_busy.cpp.
#include "alloc_support.h"
#include "pool_support.h"
#include "snapshot_check.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;

class Pools : public PoolCalls {
protected:
  void SetUp() override {
    a_ = make_alloc(GetParam().driver, GetParam().config);
    ASSERT_NE(a_, nullptr);
    a = a_.get();
  }
  int64_t pool_reserved(expseg_pool_id id) { return stat_of(a, pool_key(id)); }
  AllocPtr a_;
};

bool only_stream_1(void *, expseg_stream s) { return s == 1; }
bool in_set(void *ctx, expseg_stream s) { return static_cast<std::set<expseg_stream> *>(ctx)->count(s) > 0; }

} // namespace

TEST_P(Pools, UseCountsAndIds) {
  expseg_pool_id p = create(), q = create();
  EXPECT_GE(p, 1u);
  EXPECT_GT(q, p);
  int n = 0;
  ASSERT_EQ(expseg_pool_use_count(a, p, &n), EXPSEG_OK);
  EXPECT_EQ(n, 1);
  ASSERT_EQ(expseg_pool_retain(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_use_count(a, p, &n), EXPSEG_OK);
  EXPECT_EQ(n, 2);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_use_count(a, p, &n), EXPSEG_OK);
  EXPECT_EQ(n, 1);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  EXPECT_EQ(expseg_pool_use_count(a, p, &n), EXPSEG_ERR_INVALID_ARGUMENT) << "released: unknown";
  EXPECT_EQ(expseg_pool_release(a, p), EXPSEG_ERR_INVALID_ARGUMENT) << "below zero";
  expseg_pool_id r = create();
  EXPECT_GT(r, q) << "ids are never reused";
  ASSERT_EQ(expseg_pool_use_count(a, q, &n), EXPSEG_OK);
  EXPECT_EQ(n, 1) << "other pools untouched";
  expect_consistent(a, "use counts");
}

TEST_P(Pools, ErrorsNameTheIdAndChangeNothing) {
  expseg_pool_id p = create();
  const expseg_pool_id bad = p + 41;
  const std::string id = std::to_string(bad);
  int n = 0;
  void *ptr = nullptr;
  struct Case {
    const char *what;
    expseg_status st;
  } cases[] = {
      {"retain", expseg_pool_retain(a, bad)},
      {"use_count", expseg_pool_use_count(a, bad, &n)},
      {"begin", expseg_pool_begin(a, bad, nullptr, nullptr)},
      {"end", expseg_pool_end(a, bad)},
      {"release", expseg_pool_release(a, bad)},
      {"empty_cache", expseg_pool_empty_cache(a, bad)},
      {"malloc_pool", expseg_malloc_pool(a, 4096, 0, bad, &ptr)},
  };
  for (const Case &c : cases) {
    EXPECT_EQ(c.st, EXPSEG_ERR_INVALID_ARGUMENT) << c.what;
  }
  // each message names the id (checked call by call: the message is the last call's)
  EXPECT_EQ(expseg_pool_retain(a, bad), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find(id), std::string::npos) << expseg_last_error();
  EXPECT_NE(std::string(expseg_last_error()).find("accepted"), std::string::npos);
  EXPECT_EQ(expseg_pool_end(a, p), EXPSEG_ERR_INVALID_ARGUMENT) << "not begun";
  EXPECT_NE(std::string(expseg_last_error()).find(std::to_string(p)), std::string::npos);
  EXPECT_EQ(expseg_malloc_pool(a, 4096, 0, bad, &ptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ptr, nullptr);
  EXPECT_NE(std::string(expseg_last_error()).find(id), std::string::npos);
  EXPECT_EQ(expseg_pool_retain(a, 0), EXPSEG_ERR_INVALID_ARGUMENT) << "0 is the general cache";
  EXPECT_EQ(expseg_pool_create(a, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_pool_use_count(a, p, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_pool_of(a, nullptr, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  expseg_pool_id out;
  int local;
  EXPECT_EQ(expseg_pool_of(a, &local, &out), EXPSEG_ERR_INVALID_ARGUMENT) << "not ours";
  EXPECT_EQ(expseg_pool_create(nullptr, &out), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(out, 0u);
  EXPECT_EQ(expseg_pool_retain(nullptr, p), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_pool_use_count(nullptr, p, &n), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_pool_begin(nullptr, p, nullptr, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_pool_end(nullptr, p), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_pool_release(nullptr, p), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_pool_empty_cache(nullptr, p), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_malloc_pool(nullptr, 4096, 0, p, &ptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_pool_of(nullptr, &local, &out), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_malloc_pool(a, 4096, 0, UINT64_MAX, &ptr), EXPSEG_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(expseg_pool_use_count(a, p, &n), EXPSEG_OK);
  EXPECT_EQ(n, 1) << "no failed call changed the count";
  // releasing to 0 while begun is refused, the count unchanged
  ASSERT_EQ(expseg_pool_begin(a, p, nullptr, nullptr), EXPSEG_OK);
  EXPECT_EQ(expseg_pool_release(a, p), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("expseg_pool_end"), std::string::npos);
  ASSERT_EQ(expseg_pool_use_count(a, p, &n), EXPSEG_OK);
  EXPECT_EQ(n, 1);
  ASSERT_EQ(expseg_pool_end(a, p), EXPSEG_OK);
  EXPECT_EQ(expseg_pool_end(a, p), EXPSEG_ERR_INVALID_ARGUMENT) << "ended once only";
  // stream values a pool key would use are refused, pools or not
  EXPECT_EQ(expseg_malloc(a, 4096, (expseg_stream)1 << 48, &ptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("2^48"), std::string::npos);
  expect_consistent(a, "errors");
}

TEST_P(Pools, RoutingByFilterNewestFirst) {
  expseg_pool_id p = create(), q = create();
  ASSERT_EQ(expseg_pool_begin(a, p, only_stream_1, nullptr), EXPSEG_OK);
  void *x1 = nullptr, *x2 = nullptr, *y1 = nullptr, *y2 = nullptr, *z = nullptr;
  ASSERT_EQ(expseg_malloc(a, 100 * KiB, 1, &x1), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 100 * KiB, 2, &x2), EXPSEG_OK);
  EXPECT_EQ(pool_of(x1), p) << "the filter accepts stream 1";
  EXPECT_EQ(pool_of(x2), 0u) << "the filter refuses stream 2: general cache";
  std::set<expseg_stream> streams = {1, 2};
  ASSERT_EQ(expseg_pool_begin(a, q, in_set, &streams), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 3 * MiB, 1, &y1), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 3 * MiB, 2, &y2), EXPSEG_OK);
  EXPECT_EQ(pool_of(y1), q) << "the newest begun pool that accepts the stream wins";
  EXPECT_EQ(pool_of(y2), q);
  z = alloc(3 * MiB, 2, 0);
  EXPECT_EQ(pool_of(z), 0u) << "malloc_pool ignores the begun pools";
  ASSERT_EQ(expseg_pool_end(a, q), EXPSEG_OK);
  void *w = nullptr;
  ASSERT_EQ(expseg_malloc(a, 3 * MiB, 1, &w), EXPSEG_OK);
  EXPECT_EQ(pool_of(w), p) << "q ended: p again";
  ASSERT_EQ(expseg_pool_end(a, p), EXPSEG_OK);
  for (void *ptr : {x1, x2, y1, y2, z, w}) ASSERT_EQ(expseg_free(a, ptr), EXPSEG_OK);
  expect_consistent(a, "routing");
}

TEST_P(Pools, FreedBlocksAreReusedOnlyInsideTheirPool) {
  expseg_pool_id p = create(), q = create();
  for (size_t size : {64 * KiB, 3 * MiB, 24 * MiB}) {
    const std::string S = std::to_string(size) + " bytes: ";
    void *x = alloc(size, 0, p);
    EXPECT_EQ(pool_of(x), p) << S;
    ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
    void *g = alloc(size, 0, 0), *o = alloc(size, 0, q);
    EXPECT_NE(g, x) << S << "the general cache took a private pool's free block";
    EXPECT_NE(o, x) << S << "another pool took a private pool's free block";
    EXPECT_EQ(pool_of(g), 0u) << S;
    EXPECT_EQ(pool_of(o), q) << S;
    void *again = alloc(size, 0, p);
    EXPECT_EQ(again, x) << S << "the pool's own free block is reused";
    ASSERT_EQ(expseg_free(a, g), EXPSEG_OK);
    void *o2 = alloc(size, 0, q);
    EXPECT_NE(o2, g) << S << "a pool took the general cache's free block";
    for (void *ptr : {o, again, o2}) ASSERT_EQ(expseg_free(a, ptr), EXPSEG_OK);
    expect_consistent(a, S);
  }
}

TEST_P(Pools, EmptyCacheKeepsLivePoolsAndPoolEmptyCacheEmptiesOne) {
  expseg_pool_id p = create(), q = create();
  ASSERT_EQ(expseg_free(a, alloc(5 * MiB, 0, p)), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, alloc(5 * MiB, 0, q)), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, alloc(5 * MiB, 0, 0)), EXPSEG_OK);
  const int64_t rp = pool_reserved(p), rq = pool_reserved(q);
  EXPECT_GT(rp, 0);
  EXPECT_GT(rq, 0);
  EXPECT_GE(stat_of(a, "reserved_bytes.all.current"), rp + rq) << "reserved counts the pools";
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(pool_reserved(p), rp) << "empty_cache keeps a live pool's free memory";
  EXPECT_EQ(pool_reserved(q), rq);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), rp + rq) << "the general cache emptied";
  ASSERT_EQ(expseg_pool_empty_cache(a, p), EXPSEG_OK);
  EXPECT_EQ(pool_reserved(p), 0);
  EXPECT_EQ(pool_reserved(q), rq) << "only the pool named";
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), rq);
  EXPECT_EQ(stat_of(a, "expseg.cached_physical_bytes.current"), 0) << "its chunks went back";
  // while a pool is begun, empty_cache keeps the general cache (as PyTorch)
  ASSERT_EQ(expseg_free(a, alloc(5 * MiB, 0, 0)), EXPSEG_OK);
  const int64_t with_general = stat_of(a, "reserved_bytes.all.current");
  ASSERT_EQ(expseg_pool_begin(a, q, only_stream_1, nullptr), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), with_general);
  ASSERT_EQ(expseg_pool_end(a, q), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), rq);
  expect_consistent(a, "empty_cache");
}

TEST_P(Pools, ReleaseGivesMemoryBackOnlyWhenEmptyAndIdle) {
  expseg_pool_id p = create();
  void *x = alloc(2 * MiB, 3, p), *y = alloc(200 * KiB, 3, p);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  int n;
  EXPECT_EQ(expseg_pool_use_count(a, p, &n), EXPSEG_ERR_INVALID_ARGUMENT) << "unknown at once";
  EXPECT_EQ(pool_of(x), p) << "a live block still says where it is";
  EXPECT_GT(pool_reserved(p), 0) << "live blocks: nothing given back";
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_GT(pool_reserved(p), 0) << "one block still live";
  // the last block freed while its stream's work is unfinished: kept until it is done
  ASSERT_EQ(expseg_testing_hold_stream(a, 3, true), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
  EXPECT_GT(pool_reserved(p), 0) << "stream 3 is held: its memory may still be in use";
  ASSERT_EQ(expseg_testing_hold_stream(a, 3, false), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_FALSE(has_stat(a, pool_key(p)))
      << "drained: the pool's statistics are gone";
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
  // a pending free (record_stream on a held stream) completes, then the pool drains at once
  expseg_pool_id q = create();
  void *z = alloc(1 * MiB, 0, q);
  ASSERT_EQ(expseg_record_stream(a, z, 4), EXPSEG_OK);
  ASSERT_EQ(expseg_testing_hold_stream(a, 4, true), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, z), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, q), EXPSEG_OK);
  EXPECT_GT(pool_reserved(q), 0) << "pending free on held stream 4";
  ASSERT_EQ(expseg_testing_hold_stream(a, 4, false), EXPSEG_OK);
  void *g = alloc(4 * KiB, 0, 0); // a malloc completes the events and reaps the pool
  EXPECT_FALSE(has_stat(a, pool_key(q)));
  ASSERT_EQ(expseg_free(a, g), EXPSEG_OK);
  // released with nothing live: given back at once
  expseg_pool_id r = create();
  ASSERT_EQ(expseg_free(a, alloc(8 * MiB, 0, r)), EXPSEG_OK);
  EXPECT_GT(pool_reserved(r), 0);
  ASSERT_EQ(expseg_pool_release(a, r), EXPSEG_OK);
  EXPECT_FALSE(has_stat(a, pool_key(r)));
  expect_consistent(a, "release");
}

TEST_P(Pools, PoolMemoryIsNotTakenForOthersUnderPressure) {
  // a cap of 64 MiB: a pool holding 40 MiB free keeps it; the general cache runs out
  expseg_info info;
  ASSERT_EQ(expseg_get_info(a, &info), EXPSEG_OK);
  ASSERT_EQ(expseg_set_memory_fraction(a, 64.0 * MiB / (double)info.total_memory), EXPSEG_OK)
      << expseg_last_error();
  expseg_pool_id p = create();
  ASSERT_EQ(expseg_free(a, alloc(40 * MiB, 0, p)), EXPSEG_OK);
  const int64_t held = pool_reserved(p);
  QuietLog quiet;
  void *big = nullptr;
  EXPECT_EQ(expseg_malloc(a, 40 * MiB, 0, &big), EXPSEG_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(pool_reserved(p), held) << "the pool's free memory was taken for the general cache";
  ASSERT_EQ(expseg_pool_empty_cache(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 40 * MiB, 0, &big), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(pool_of(big), 0u);
  ASSERT_EQ(expseg_free(a, big), EXPSEG_OK);
  expect_consistent(a, "pressure");
}

TEST_P(Pools, StatisticsFamily) {
  expseg_pool_id p = create();
  const std::string k = "reserved_bytes_by_private_pools.0_" + std::to_string(p);
  void *x = alloc(3 * MiB, 0, p), *s = alloc(4 * KiB, 0, p);
  const int64_t all = stat_of(a, k + ".all.current");
  EXPECT_EQ(all, stat_of(a, k + ".small_pool.current") + stat_of(a, k + ".large_pool.current"));
  EXPECT_GT(stat_of(a, k + ".small_pool.current"), 0);
  EXPECT_GE(stat_of(a, k + ".large_pool.current"), (int64_t)(3 * MiB));
  EXPECT_EQ(stat_of(a, k + ".all.peak"), all);
  EXPECT_EQ(stat_of(a, k + ".all.allocated"), all);
  EXPECT_EQ(stat_of(a, k + ".all.freed"), 0);
  EXPECT_GE(stat_of(a, "allocated_bytes.large_pool.current"), (int64_t)(3 * MiB))
      << "pool blocks count in the all/small/large arrays";
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, s), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_empty_cache(a, p), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, k + ".all.current"), 0);
  EXPECT_EQ(stat_of(a, k + ".all.peak"), all);
  EXPECT_EQ(stat_of(a, k + ".all.freed"), all);
  expseg_reset_peak_stats(a);
  EXPECT_EQ(stat_of(a, k + ".all.peak"), 0);
  expseg_reset_accumulated_stats(a);
  EXPECT_EQ(stat_of(a, k + ".all.allocated"), 0);
  EXPECT_EQ(stat_of(a, k + ".all.freed"), 0);
  int64_t v;
  EXPECT_EQ(expseg_stat(a, ("reserved_bytes_by_private_pools.0_" + std::to_string(p + 7) +
                            ".all.current").c_str(), &v),
            EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_stat(a, (k + ".all.nothing").c_str(), &v), EXPSEG_ERR_INVALID_ARGUMENT);
  // foreach: sorted, every key of the family once, the fixed keys still there
  expseg_pool_id q = create();
  struct Seen {
    std::vector<std::string> keys;
  } seen;
  expseg_stats_foreach(a, [](void *ctx, const char *key, int64_t) {
    static_cast<Seen *>(ctx)->keys.push_back(key);
  }, &seen);
  EXPECT_TRUE(std::is_sorted(seen.keys.begin(), seen.keys.end()));
  int fam = 0;
  for (const std::string &key : seen.keys) fam += key.rfind("reserved_bytes_by_private_pools.", 0) == 0;
  EXPECT_EQ(fam, 24) << "12 keys for each of 2 pools";
  EXPECT_NE(std::find(seen.keys.begin(), seen.keys.end(),
                      "reserved_bytes_by_private_pools.0_" + std::to_string(q) + ".large_pool.freed"),
            seen.keys.end());
  EXPECT_NE(std::find(seen.keys.begin(), seen.keys.end(), "reserved_bytes.all.current"),
            seen.keys.end());
  expect_consistent(a, "statistics");
}

TEST_P(Pools, SnapshotCarriesSegmentPoolId) {
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 with pickle is needed";
  ASSERT_EQ(expseg_record_history(a, true, 1000), EXPSEG_OK);
  expseg_pool_id p = create();
  void *x = alloc(3 * MiB, 5, p), *g = alloc(3 * MiB, 0, 0);
  char path[] = "/tmp/expseg_pools_snapXXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_EQ(expseg_snapshot_dump(a, path), EXPSEG_OK) << expseg_last_error();
  std::string out;
  int rc = snapshot_run("python3 -c \"import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); "
                        "print(sorted(set((s['segment_pool_id'], s['stream']) for s in "
                        "d['segments'])), sorted(set(e['stream'] for e in d['device_traces'][0])))\" " +
                            std::string(path),
                        &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "[((0, 0), 0), ((0, " + std::to_string(p) + "), 5)] [0, 5]\n")
      << "segment_pool_id is (0, 0) for the general cache, (0, id) for a pool; the streams of "
         "segments and trace events are the streams, not pool keys";
  std::string check;
  EXPECT_EQ(snapshot_check(path, "", false, &check), 0) << check;
  unlink(path);
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, g), EXPSEG_OK);
}

INSTANTIATE_TEST_SUITE_P(Drivers, Pools,
                         testing::Values(PoolsParam{"host:capacity=512M", "expandable_segments:True"},
                                         PoolsParam{"host:capacity=512M", "expandable_segments:False"},
                                         PoolsParam{"sim:capacity=8G", "expandable_segments:True"},
                                         PoolsParam{"sim:capacity=8G", "expandable_segments:False"}),
                         pools_param_name);
