// SPDX-License-Identifier: Apache-2.0
// test_adv_pools.cpp: adversarial tests of the private pools (expseg_pool_*, expseg_malloc_pool,
// expseg_pool_of) through the public API only (expseg.h, expseg_testing.h), on the host and sim
// drivers with expandable segments on and off. Every failed call must change nothing (all
// statistics identical, expseg_check passes) and name the value and what is accepted; every
// allocator must give everything back at the end (driver counts zero). A seeded random run
// checks the allocator against a small model of which pool each live pointer belongs to.
#include "test_adv_pools_common.h"


TEST_P(AdvPools, EveryCallRefusesIdsZeroMaxAndReleased) {
  expseg_pool_id rel = create();
  ASSERT_EQ(expseg_pool_release(a, rel), EXPSEG_OK);
  for (expseg_pool_id bad : {(expseg_pool_id)0, (expseg_pool_id)UINT64_MAX, rel, rel + 1000}) {
    const std::string id = std::to_string(bad);
    int n = -7;
    expect_refused("retain", [&] { return expseg_pool_retain(a, bad); },
                   EXPSEG_ERR_INVALID_ARGUMENT, id);
    expect_refused("use_count", [&] { return expseg_pool_use_count(a, bad, &n); },
                   EXPSEG_ERR_INVALID_ARGUMENT, id);
    EXPECT_EQ(n, -7) << "use_count wrote through out on failure";
    expect_refused("begin", [&] { return expseg_pool_begin(a, bad, nullptr, nullptr); },
                   EXPSEG_ERR_INVALID_ARGUMENT, id);
    expect_refused("end", [&] { return expseg_pool_end(a, bad); }, EXPSEG_ERR_INVALID_ARGUMENT,
                   id);
    expect_refused("release", [&] { return expseg_pool_release(a, bad); },
                   EXPSEG_ERR_INVALID_ARGUMENT, id);
    expect_refused("empty_cache", [&] { return expseg_pool_empty_cache(a, bad); },
                   EXPSEG_ERR_INVALID_ARGUMENT, id);
    if (bad != 0) {
      void *p = (void *)1;
      expect_refused("malloc_pool", [&] { return expseg_malloc_pool(a, 4096, 0, bad, &p); },
                     EXPSEG_ERR_INVALID_ARGUMENT, id);
      EXPECT_EQ(p, nullptr);
    }
  }
  // 0 is the general cache for malloc_pool
  void *g = alloc(4096, 0, 0);
  EXPECT_EQ(pool_of(g), 0u);
  EXPECT_EQ(expseg_free(a, g), EXPSEG_OK);
}

TEST_P(AdvPools, BeginEndNesting) {
  expseg_pool_id p = create(), q = create();
  // end without begin, end of the wrong pool
  expect_refused("end unbegun", [&] { return expseg_pool_end(a, p); },
                 EXPSEG_ERR_INVALID_ARGUMENT, std::to_string(p));
  ASSERT_EQ(expseg_pool_begin(a, p, nullptr, nullptr), EXPSEG_OK);
  expect_refused("end wrong", [&] { return expseg_pool_end(a, q); },
                 EXPSEG_ERR_INVALID_ARGUMENT, std::to_string(q));
  // begin twice, with q between: p, q, p
  ASSERT_EQ(expseg_pool_begin(a, q, nullptr, nullptr), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_begin(a, p, nullptr, nullptr), EXPSEG_OK);
  void *x = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4096, 3, &x), EXPSEG_OK);
  EXPECT_EQ(pool_of(x), p);
  ASSERT_EQ(expseg_pool_end(a, p), EXPSEG_OK); // the newest p: q is in force
  void *y = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4096, 3, &y), EXPSEG_OK);
  EXPECT_EQ(pool_of(y), q);
  // releasing p while it is still begun once: refused at count 1, fine above
  ASSERT_EQ(expseg_pool_retain(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  expect_refused("release begun", [&] { return expseg_pool_release(a, p); },
                 EXPSEG_ERR_INVALID_ARGUMENT, std::to_string(p), "expseg_pool_end");
  ASSERT_EQ(expseg_pool_end(a, q), EXPSEG_OK);
  void *z = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4096, 3, &z), EXPSEG_OK);
  EXPECT_EQ(pool_of(z), p) << "the older begin of p is in force again";
  ASSERT_EQ(expseg_pool_end(a, p), EXPSEG_OK);
  expect_refused("end twice", [&] { return expseg_pool_end(a, p); },
                 EXPSEG_ERR_INVALID_ARGUMENT, std::to_string(p));
  void *w = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4096, 3, &w), EXPSEG_OK);
  EXPECT_EQ(pool_of(w), 0u);
  // filters that accept nothing, everything
  ASSERT_EQ(expseg_pool_begin(a, q, accept_all, nullptr), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_begin(a, p, accept_none, nullptr), EXPSEG_OK);
  void *u = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4096, 9, &u), EXPSEG_OK);
  EXPECT_EQ(pool_of(u), q) << "a filter that accepts nothing routes nothing";
  ASSERT_EQ(expseg_pool_end(a, q), EXPSEG_OK);
  void *v = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4096, 9, &v), EXPSEG_OK);
  EXPECT_EQ(pool_of(v), 0u);
  ASSERT_EQ(expseg_pool_end(a, p), EXPSEG_OK);
  for (void *b : {x, y, z, w, u, v}) ASSERT_EQ(expseg_free(a, b), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, q), EXPSEG_OK);
  expect_refused("release below zero", [&] { return expseg_pool_release(a, q); },
                 EXPSEG_ERR_INVALID_ARGUMENT, std::to_string(q));
  EXPECT_FALSE(has_stat(a, pool_key(p))) << "released, all free: given back";
  EXPECT_FALSE(has_stat(a, pool_key(q)));
}

TEST_P(AdvPools, PoolOfForeignInteriorFreedPointers) {
  expseg_pool_id p = create();
  char *x = static_cast<char *>(alloc(3 * MiB, 1, p));
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(pool_of(x), p);
  expseg_pool_id out = 77;
  for (const void *bad : {(const void *)(x + 1), (const void *)(x + 4096), (const void *)nullptr}) {
    StatMap before = all_stats(a);
    EXPECT_EQ(expseg_pool_of(a, bad, &out), EXPSEG_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(expseg_last_error()).find("accepted"), std::string::npos)
        << expseg_last_error();
    EXPECT_EQ(out, 77u) << "out written on failure";
    EXPECT_EQ(all_stats(a), before);
  }
  // another allocator's pointer
  expseg_allocator *b = nullptr;
  ASSERT_EQ(expseg_create(GetParam().driver, 0, GetParam().config, &b), EXPSEG_OK);
  void *f = nullptr;
  ASSERT_EQ(expseg_malloc(b, 4096, 0, &f), EXPSEG_OK);
  if (f != x) {
    EXPECT_EQ(expseg_pool_of(a, f, &out), EXPSEG_ERR_INVALID_ARGUMENT);
  }
  EXPECT_EQ(expseg_free(b, f), EXPSEG_OK);
  expseg_destroy(b);
  // freed
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  EXPECT_EQ(expseg_pool_of(a, x, &out), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_free(a, x), EXPSEG_ERR_INVALID_ARGUMENT) << "double free";
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
}

TEST_P(AdvPools, FreeAfterReleaseGivesMemoryBack) {
  expseg_pool_id p = create();
  void *x = alloc(3 * MiB, 1, p), *y = alloc(1000, 1, p);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  int n;
  EXPECT_EQ(expseg_pool_use_count(a, p, &n), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pool_of(x), p) << "a released pool's live block still names it";
  EXPECT_TRUE(has_stat(a, pool_key(p))) << "still draining";
  void *g = nullptr;
  ASSERT_EQ(expseg_malloc(a, 3 * MiB, 1, &g), EXPSEG_OK);
  EXPECT_EQ(pool_of(g), 0u);
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
  EXPECT_FALSE(has_stat(a, pool_key(p))) << "the last free gives the pool's memory back";
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), stat_of(a, "reserved_bytes.all.current"));
  ASSERT_EQ(expseg_free(a, g), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
}

TEST_P(AdvPools, RecordedOnHeldStreamThenReleased) {
  expseg_pool_id p = create();
  void *x = alloc(3 * MiB, 1, p);
  ASSERT_EQ(expseg_testing_hold_stream(a, 2, true), EXPSEG_OK);
  ASSERT_EQ(expseg_record_stream(a, x, 2), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  EXPECT_TRUE(has_stat(a, pool_key(p))) << "its memory waits for stream 2";
  // a general allocation on the same stream must not get that memory
  void *g = nullptr;
  ASSERT_EQ(expseg_malloc(a, 3 * MiB, 1, &g), EXPSEG_OK);
  EXPECT_EQ(pool_of(g), 0u);
  EXPECT_NE(g, x) << "memory still used by stream 2 was handed out";
  // many calls while the stream stays held: no crash, nothing given back
  for (int i = 0; i < 3000; i++) {
    void *t = nullptr;
    ASSERT_EQ(expseg_malloc(a, 512, 1, &t), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, t), EXPSEG_OK);
  }
  EXPECT_TRUE(has_stat(a, pool_key(p)));
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_synchronize(a), EXPSEG_ERR_DRIVER) << "a held stream: would wait forever";
  ASSERT_EQ(expseg_testing_hold_stream(a, 2, false), EXPSEG_OK);
  ASSERT_EQ(expseg_synchronize(a), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_FALSE(has_stat(a, pool_key(p)));
  ASSERT_EQ(expseg_free(a, g), EXPSEG_OK);
}

TEST_P(AdvPools, EmptyCacheWhileBegun) {
  expseg_pool_id p = create();
  void *g = nullptr;
  ASSERT_EQ(expseg_malloc(a, 3 * MiB, 0, &g), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, g), EXPSEG_OK);
  void *x = alloc(3 * MiB, 0, p);
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  int64_t pool = stat_of(a, pool_key(p));
  ASSERT_GT(pool, 0);
  int64_t total = stat_of(a, "reserved_bytes.all.current"); // growth may take general pages
  ASSERT_EQ(expseg_pool_begin(a, p, nullptr, nullptr), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), total) << "nothing given back while begun";
  ASSERT_EQ(expseg_pool_end(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), pool) << "the live pool's memory stays";
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
}

TEST_P(AdvPools, FractionBelowPoolsAndOomWithPoolFreeMemory) {
  expseg_info info;
  ASSERT_EQ(expseg_get_info(a, &info), EXPSEG_OK);
  if (info.total_memory > 1024 * MiB) GTEST_SKIP() << "needs a small device";
  expseg_pool_id p = create();
  const size_t big = info.total_memory / 2;
  void *x = alloc(big, 0, p);
  ASSERT_NE(x, nullptr);
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_set_memory_fraction(a, 0.25), EXPSEG_OK);
  // the general cache cannot have what the live pool holds free
  void *g = (void *)1;
  StatMap before = all_stats(a);
  EXPECT_EQ(expseg_malloc(a, big, 0, &g), EXPSEG_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(g, nullptr);
  EXPECT_EQ(stat_of(a, pool_key(p)), before[pool_key(p)]) << "a live pool's memory was taken";
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  // the pool itself reuses its cached block even above the fraction
  void *y = alloc(big, 0, p);
  EXPECT_EQ(y, x);
  ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
  ASSERT_EQ(expseg_set_memory_fraction(a, 1.0), EXPSEG_OK);
  // without a fraction: OOM path with the live pool's memory held free
  void *h = (void *)1;
  EXPECT_EQ(expseg_malloc(a, info.total_memory - big / 2, 0, &h), EXPSEG_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(h, nullptr);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  // a released pool's memory is given back to the OOM path
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, info.total_memory - big / 2, 0, &h), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_free(a, h), EXPSEG_OK);
}

TEST_P(AdvPools, ConfigureExpandableWhilePoolsHoldSegments) {
  expseg_pool_id p = create();
  void *x = alloc(3 * MiB, 1, p), *s = alloc(4000, 1, p);
  ASSERT_EQ(expseg_free(a, s), EXPSEG_OK);
  const bool exp = std::strstr(GetParam().config, "True") != nullptr;
  ASSERT_EQ(expseg_configure(a, exp ? "expandable_segments:False" : "expandable_segments:True"),
            EXPSEG_OK)
      << expseg_last_error();
  void *y = alloc(5 * MiB, 1, p), *z = alloc(4000, 1, p), *g = alloc(5 * MiB, 1, 0);
  EXPECT_EQ(pool_of(y), p);
  EXPECT_EQ(pool_of(g), 0u);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_configure(a, exp ? "expandable_segments:True" : "expandable_segments:False"),
            EXPSEG_OK);
  ASSERT_EQ(expseg_pool_empty_cache(a, p), EXPSEG_OK);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, z), EXPSEG_OK);
  EXPECT_FALSE(has_stat(a, pool_key(p)));
  ASSERT_EQ(expseg_free(a, g), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
}

TEST_P(AdvPools, IpcExportOfAPoolBlock) {
  if (std::strncmp(GetParam().driver, "host", 4) != 0) GTEST_SKIP() << "export needs host";
  expseg_pool_id p = create();
  void *x = alloc(3 * MiB, 1, p);
  expseg_ipc_handle h;
  std::memset(&h, 0, sizeof h);
  ASSERT_EQ(expseg_ipc_export(a, x, &h), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  EXPECT_TRUE(has_stat(a, pool_key(p))) << "the exported block holds its pool";
  void *g = alloc(3 * MiB, 1, 0);
  EXPECT_NE(g, x);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  expseg_ipc_handle_free(&h);
  size_t held = 99;
  ASSERT_EQ(expseg_ipc_poll(a, &held), EXPSEG_OK);
  EXPECT_EQ(held, 0u);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_FALSE(has_stat(a, pool_key(p))) << "given back once the export is gone";
  ASSERT_EQ(expseg_free(a, g), EXPSEG_OK);
}

TEST_P(AdvPools, SnapshotAfterReleaseIsValid) {
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 with pickle is needed";
  ASSERT_EQ(expseg_record_history(a, true, 10000), EXPSEG_OK);
  expseg_pool_id p = create(), q = create();
  void *x = alloc(3 * MiB, 1, p), *y = alloc(1000, 2, q), *g = alloc(2 * MiB, 1, 0);
  ASSERT_EQ(expseg_record_stream(a, y, 5), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, q), EXPSEG_OK); // y still live: q drains
  expseg_pool_id r = create();
  void *z = alloc(5 * MiB, 3, r);
  for (int round = 0; round < 2; round++) {
    char path[] = "/tmp/expseg_adv_snapXXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    close(fd);
    ASSERT_EQ(expseg_snapshot_dump(a, path), EXPSEG_OK) << expseg_last_error();
    std::string out;
    EXPECT_EQ(snapshot_check(path, "", false, &out), 0) << "round " << round << ": " << out;
    unlink(path);
    // walk agrees: every segment's pool is live or draining, blocks tile it
    struct W {
      std::set<expseg_pool_id> pools;
      bool tiled = true;
    } w;
    ASSERT_EQ(expseg_walk(
                  a,
                  [](void *c, const expseg_walk_segment *s) {
                    W *w = static_cast<W *>(c);
                    w->pools.insert(s->pool);
                    uint64_t at = s->address;
                    for (size_t i = 0; i < s->n_blocks; i++) {
                      w->tiled = w->tiled && s->blocks[i].address == at;
                      at += s->blocks[i].size;
                    }
                    w->tiled = w->tiled && at == s->address + s->total_size;
                  },
                  nullptr, &w),
              EXPSEG_OK);
    EXPECT_TRUE(w.tiled);
    EXPECT_EQ(w.pools.count(p), 0u) << "released and free: gone";
    EXPECT_EQ(w.pools.count(r), round == 0 ? 1u : 0u);
    EXPECT_EQ(w.pools.count(q), round == 0 ? 1u : 0u) << "a draining pool's segment names it";
    if (round == 0) {
      ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
      ASSERT_EQ(expseg_free(a, z), EXPSEG_OK);
      ASSERT_EQ(expseg_pool_release(a, r), EXPSEG_OK);
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
      z = alloc(1000, 3, 0);
    }
  }
  ASSERT_EQ(expseg_free(a, z), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, g), EXPSEG_OK);
  ASSERT_EQ(expseg_record_history(a, false, 0), EXPSEG_OK);
}

TEST_P(AdvPools, StatsAcrossResetsWithPoolsComingAndGoing) {
  expseg_pool_id p = create();
  void *x = alloc(3 * MiB, 1, p);
  expseg_reset_peak_stats(a);
  expseg_pool_id q = create();
  void *y = alloc(5 * MiB, 1, q);
  EXPECT_EQ(stat_of(a, pool_key(q, "all.peak")), stat_of(a, pool_key(q)));
  ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, q), EXPSEG_OK);
  EXPECT_FALSE(has_stat(a, pool_key(q)));
  expseg_reset_accumulated_stats(a);
  EXPECT_EQ(stat_of(a, pool_key(p, "all.allocated")), 0);
  EXPECT_EQ(stat_of(a, pool_key(p, "all.freed")), 0);
  EXPECT_EQ(stat_of(a, pool_key(p, "all.peak")), stat_of(a, pool_key(p)));
  expseg_reset_peak_stats(a);
  EXPECT_GE(stat_of(a, "reserved_bytes.all.peak"), stat_of(a, "reserved_bytes.all.current"));
  EXPECT_GE(stat_of(a, "allocated_bytes.all.peak"), stat_of(a, "allocated_bytes.all.current"));
  EXPECT_EQ(stat_of(a, pool_key(p, "all.peak")), stat_of(a, pool_key(p)));
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  expseg_reset_peak_stats(a);
  expseg_reset_accumulated_stats(a);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), stat_of(a, "reserved_bytes.all.peak"));
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
}

TEST_P(AdvPools, ThousandsOfPoolsSlotsReusedIdsNot) {
  expseg_pool_id last = 0;
  std::vector<void *> keep;
  // more than 65535 creations: released slots must be reused
  for (int i = 0; i < 70000; i++) {
    expseg_pool_id id = 0;
    ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << i << ": " << expseg_last_error();
    ASSERT_GT(id, last);
    last = id;
    if (i % 5000 == 0) {
      void *x = alloc(1000, (expseg_stream)i, id);
      keep.push_back(x);
    }
    ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_OK);
  }
  size_t keys = all_stats(a).size();
  for (void *x : keep) ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  EXPECT_LT(all_stats(a).size(), keys) << "draining pools' keys go once drained";
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
}

TEST_P(AdvPools, StreamsNear2To48) {
  expseg_pool_id p = create();
  const expseg_stream top = ((expseg_stream)1 << 48) - 1;
  void *x = alloc(3 * MiB, top, p), *y = alloc(3 * MiB, top, 0), *z = alloc(100, top - 1, p);
  EXPECT_EQ(pool_of(x), p);
  EXPECT_EQ(pool_of(y), 0u);
  ASSERT_EQ(expseg_record_stream(a, y, top - 1), EXPSEG_OK);
  for (expseg_stream bad : {(expseg_stream)1 << 48, ((expseg_stream)1 << 48) | 1,
                            ((expseg_stream)p << 48) | 1, (expseg_stream)UINT64_MAX}) {
    void *q = (void *)1;
    expect_refused("malloc_pool", [&] { return expseg_malloc_pool(a, 4096, bad, p, &q); },
                   EXPSEG_ERR_INVALID_ARGUMENT, "2^48", nullptr);
    EXPECT_EQ(q, nullptr);
    expect_refused("malloc", [&] { return expseg_malloc(a, 4096, bad, &q); },
                   EXPSEG_ERR_INVALID_ARGUMENT, "2^48", nullptr);
  }
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, z), EXPSEG_OK);
  // the freed pool blocks are reused by the pool on that stream, not by the general cache
  void *g = alloc(3 * MiB, top, 0);
  EXPECT_NE(g, x);
  void *x2 = alloc(3 * MiB, top, p);
  EXPECT_EQ(x2, x);
  for (void *b : {y, g, x2}) ASSERT_EQ(expseg_free(a, b), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
}

TEST_P(AdvPools, RecordStreamRefusesStreamsAbove2To48) {
  // a stream value of 2^48 or more is refused by malloc; record_stream must refuse it too
  // (it would otherwise be a pool's key: recorded work that is never waited for)
  expseg_pool_id p = create();
  void *x = alloc(3 * MiB, 1, p);
  const expseg_stream key_of_own = ((expseg_stream)1 << 48) | 1; // stream 1 in some pool
  expect_refused("record_stream", [&] { return expseg_record_stream(a, x, key_of_own); },
                 EXPSEG_ERR_INVALID_ARGUMENT, "2^48", nullptr);
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
}

TEST_P(AdvPools, DrainOfABusyStreamIsRetriedByLaterCalls) {
  // a released pool whose blocks are all free but whose stream still has work queued: its
  // memory goes back by a later call once the work is done, without empty_cache
  expseg_pool_id p = create();
  void *x = alloc(3 * MiB, 7, p);
  ASSERT_EQ(expseg_testing_hold_stream(a, 7, true), EXPSEG_OK);
  ASSERT_EQ(expseg_record_stream(a, x, 8), EXPSEG_OK);
  ASSERT_EQ(expseg_testing_hold_stream(a, 8, true), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  void *g = alloc(4096, 0, 0);
  ASSERT_EQ(expseg_free(a, g), EXPSEG_OK);
  const bool held_back = has_stat(a, pool_key(p));
  ASSERT_EQ(expseg_testing_hold_stream(a, 8, false), EXPSEG_OK);
  ASSERT_EQ(expseg_testing_hold_stream(a, 7, false), EXPSEG_OK);
  for (int i = 0; i < 5000 && has_stat(a, pool_key(p)); i++) {
    void *t = nullptr;
    ASSERT_EQ(expseg_malloc(a, 4096, 0, &t), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, t), EXPSEG_OK);
  }
  EXPECT_FALSE(has_stat(a, pool_key(p)))
      << "held back while busy: " << held_back << "; never given back by later calls";
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
}

TEST_P(AdvPools, PoolStatisticKeysAreExact) {
  expseg_pool_id p = create();
  void *x = alloc(3 * MiB, 1, p);
  const std::string id = std::to_string(p);
  EXPECT_GT(stat_of(a, pool_key(p)), 0);
  // only the key as foreach lists it: no sign, space, leading zero, or other spelling
  for (const std::string &bad :
       {"reserved_bytes_by_private_pools.0_+" + id + ".all.current",
        "reserved_bytes_by_private_pools.0_ " + id + ".all.current",
        "reserved_bytes_by_private_pools.0_0" + id + ".all.current",
        "reserved_bytes_by_private_pools.0_" + id + ".all.current.",
        "reserved_bytes_by_private_pools.0_" + id + ".all",
        "reserved_bytes_by_private_pools.0_" + id + "x.all.current",
        "reserved_bytes_by_private_pools.1_" + id + ".all.current",
        "reserved_bytes_by_private_pools.0_-" + id + ".all.current",
        std::string("reserved_bytes_by_private_pools.0_18446744073709551616.all.current")}) {
    int64_t v = -5;
    EXPECT_EQ(expseg_stat(a, bad.c_str(), &v), EXPSEG_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(v, -5) << bad;
  }
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
}

TEST_P(AdvPools, PoolLimitThenSlotReuse) {
  // 65535 pools may exist (or drain) at once; the next is refused with a message and
  // nothing changed; releasing one makes room again, with a new id. No pool call walks the
  // pool table, so this takes milliseconds (it took seconds when each call scanned it).
  std::vector<expseg_pool_id> ids;
  expseg_pool_id id = 0;
  expseg_status st = EXPSEG_OK;
  while ((st = expseg_pool_create(a, &id)) == EXPSEG_OK) {
    ids.push_back(id);
    ASSERT_LE(ids.size(), 70000u) << "no limit";
  }
  // a limit of the allocator, not of memory: an out-of-memory status would read as the
  // device's (PyTorch's route raises torch.OutOfMemoryError for it)
  EXPECT_EQ(st, EXPSEG_ERR_UNSUPPORTED);
  EXPECT_EQ(id, 0u);
  EXPECT_EQ(ids.size(), 65535u);
  EXPECT_NE(std::string(expseg_last_error()).find("65535 private pools"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(stat_of(a, "num_ooms"), 0);
  void *x = alloc(4096, 1, ids[100]);
  ASSERT_EQ(expseg_pool_release(a, ids[100]), EXPSEG_OK); // draining: its slot is held
  EXPECT_EQ(expseg_pool_create(a, &id), EXPSEG_ERR_UNSUPPORTED);
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK); // drained: its slot is free
  ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << expseg_last_error();
  EXPECT_GT(id, ids.back()) << "ids are never reused";
  void *y = alloc(4096, 1, id);
  EXPECT_EQ(pool_of(y), id);
  ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_OK);
  for (expseg_pool_id p : ids) {
    if (p != ids[100]) {
      ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
    }
  }
}

TEST_P(AdvPools, SingleChunkPendingAndPoolEmptyCacheUnderHeldStream) {
  expseg_pool_id p = create();
  ASSERT_EQ(expseg_pool_begin(a, p, nullptr, nullptr), EXPSEG_OK);
  void *s1 = nullptr, *g = nullptr;
  ASSERT_EQ(expseg_malloc_ex(a, 3 * MiB, 4, EXPSEG_MALLOC_SINGLE_CHUNK, &s1), EXPSEG_OK)
      << expseg_last_error();
  EXPECT_EQ(pool_of(s1), p) << "a begun pool routes malloc_ex too";
  g = alloc(3 * MiB, 4, 0);
  EXPECT_EQ(pool_of(g), 0u) << "malloc_pool(0) ignores the begun pool";
  ASSERT_EQ(expseg_pool_end(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_testing_hold_stream(a, 6, true), EXPSEG_OK);
  ASSERT_EQ(expseg_record_stream(a, s1, 6), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, s1), EXPSEG_OK);
  int64_t before = stat_of(a, pool_key(p));
  ASSERT_EQ(expseg_pool_empty_cache(a, p), EXPSEG_OK); // cannot wait for stream 6
  EXPECT_EQ(stat_of(a, pool_key(p)), before) << "memory still used by stream 6 was given back";
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  void *t = nullptr;
  ASSERT_EQ(expseg_malloc_ex(a, 3 * MiB, 4, EXPSEG_MALLOC_SINGLE_CHUNK, &t), EXPSEG_OK);
  EXPECT_NE(t, s1) << "a pending single chunk was handed out";
  EXPECT_EQ(pool_of(t), 0u);
  ASSERT_EQ(expseg_testing_hold_stream(a, 6, false), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_empty_cache(a, p), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, pool_key(p)), 0);
  for (void *b : {g, t}) ASSERT_EQ(expseg_free(a, b), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
}

// Driver failures inside a pool: a failed growth changes no pool figure and leaks nothing; a
// release whose unmap fails keeps the pool draining and gives it back on a later try.
TEST_P(AdvPools, SizeZeroStillChecksPoolAndStream) {
  // size 0 gives NULL and OK (as cudaMalloc), but an unknown pool or a refused stream is
  // still an error: the answer must not depend on the size
  expseg_pool_id p = create();
  ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
  for (expseg_pool_id bad : {p, p + 100, (expseg_pool_id)UINT64_MAX}) {
    void *q = (void *)1;
    expect_refused("malloc_pool size 0", [&] { return expseg_malloc_pool(a, 0, 0, bad, &q); },
                   EXPSEG_ERR_INVALID_ARGUMENT, std::to_string(bad));
    EXPECT_EQ(q, nullptr);
  }
  void *q = (void *)1;
  expect_refused("malloc size 0, stream 2^48",
                 [&] { return expseg_malloc(a, 0, (expseg_stream)1 << 48, &q); },
                 EXPSEG_ERR_INVALID_ARGUMENT, "2^48", nullptr);
  EXPECT_EQ(q, nullptr);
  expseg_pool_id live = create();
  ASSERT_EQ(expseg_malloc_pool(a, 0, 3, live, &q), EXPSEG_OK);
  EXPECT_EQ(q, nullptr);
  ASSERT_EQ(expseg_malloc_pool(a, 0, 3, 0, &q), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 0, 3, &q), EXPSEG_OK);
  EXPECT_EQ(q, nullptr);
  ASSERT_EQ(expseg_pool_release(a, live), EXPSEG_OK);
}

TEST(AdvPoolFaults, FailedGrowthAndFailedGiveBack) {
  for (const char *cfg : {"expandable_segments:True", "expandable_segments:False"}) {
    SCOPED_TRACE(cfg);
    expseg_allocator *a = nullptr;
    ASSERT_EQ(expseg_create("fault:fail=;host:capacity=256M", 0, cfg, &a), EXPSEG_OK)
        << expseg_last_error();
    expseg_pool_id p = 0;
    ASSERT_EQ(expseg_pool_create(a, &p), EXPSEG_OK);
    for (const char *rule : {"create@1", "map@1", "reserve@1", "set_access@1", "create@1:oom"}) {
      SCOPED_TRACE(rule);
      ASSERT_EQ(expseg_testing_set_faults(a, rule), EXPSEG_OK) << expseg_last_error();
      int64_t before = 0;
      ASSERT_EQ(expseg_stat(a, pool_key(p).c_str(), &before), EXPSEG_OK);
      void *x = (void *)1;
      const uint64_t injected = expseg_testing_faults_injected(a);
      expseg_status st = expseg_malloc_pool(a, 5 * MiB, 1, p, &x);
      if (expseg_testing_faults_injected(a) == injected || // the rule's call was not needed
          (st == EXPSEG_OK && std::strstr(rule, ":oom"))) { // or the OOM path's retry served it
        ASSERT_EQ(st, EXPSEG_OK);
        ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
        continue;
      }
      EXPECT_NE(st, EXPSEG_OK);
      EXPECT_EQ(x, nullptr);
      int64_t after = -1;
      ASSERT_EQ(expseg_stat(a, pool_key(p).c_str(), &after), EXPSEG_OK);
      EXPECT_EQ(after, before);
      EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
      ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK);
      ASSERT_EQ(expseg_malloc_pool(a, 5 * MiB, 1, p, &x), EXPSEG_OK) << expseg_last_error();
      ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
      ASSERT_EQ(expseg_pool_empty_cache(a, p), EXPSEG_OK);
    }
    void *y = nullptr;
    ASSERT_EQ(expseg_malloc_pool(a, 5 * MiB, 1, p, &y), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
    // giving back fails: the pool stays draining, its memory counted, then goes
    ASSERT_EQ(expseg_testing_set_faults(a, "unmap@1..,release@1..,unreserve@1.."), EXPSEG_OK);
    const uint64_t injected = expseg_testing_faults_injected(a);
    ASSERT_EQ(expseg_pool_release(a, p), EXPSEG_OK);
    EXPECT_GT(expseg_testing_faults_injected(a), injected) << "the give-back was tried";
    EXPECT_TRUE(has_stat(a, pool_key(p))) << "memory the driver kept is still counted";
    EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK);
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    EXPECT_FALSE(has_stat(a, pool_key(p))) << "given back once the driver lets it";
    expseg_testing_driver_counts left;
    expseg_testing_destroy(a, &left);
    EXPECT_EQ(left.live_chunks, 0);
    EXPECT_EQ(left.live_reservations, 0);
    EXPECT_EQ(left.mapped_bytes, 0);
  }
}

EXPSEG_ADV_POOLS_INSTANTIATE();
