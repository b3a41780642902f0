// SPDX-License-Identifier: Apache-2.0
// test_adv16_streams.cpp: adversarial tests of the stream guarantee (docs/api.md "The stream
// guarantee") through the public API and the testing hooks, on the sim driver (bare or under
// the fault wrapper). A model of busy memory: a block freed while a stream that used it (its
// allocation stream, or one recorded with expseg_record_stream) is held stays busy until that
// stream is released; busy for every other stream, and for its own stream too while a
// recorded stream is held. Any allocation overlapping busy memory fails, and busy memory must
// stay mapped (covered by a segment of expseg_walk) through empty_cache and lending.
// Statistics are compared with the walk (pending_free_blocks, active, allocated, requested,
// reserved). The random run mixes private pools, single-chunk allocations, reserve classes,
// empty_cache and synchronize, over classic, expandable, garbage-collection, page-cache and
// fault-injection configurations. Hand-picked cases: record_stream on freed, interior,
// foreign pointers and own / repeated streams, lending between held streams, event faults at
// the free, hundreds of streams, a released pool and a region sleep waiting for a held stream.
// EXPSEG_TEST_SEED: the seed (printed); EXPSEG_TEST_OPS scales the random run.
#include "alloc_support.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;

struct Busy {
  uint64_t lo, hi;                // requested range
  expseg_stream own;              // allocation stream
  std::set<expseg_stream> others; // recorded streams (not own) still held
  bool own_held;                  // own stream still held
};

struct Live {
  size_t size;
  expseg_stream stream;
  std::set<expseg_stream> recorded;
};

struct WalkView {
  std::vector<std::pair<uint64_t, uint64_t>> mapped; // segment ranges
  int64_t pending = 0, allocated = 0, active_bytes = 0, allocated_bytes = 0, requested = 0;
  int64_t segment_bytes = 0;
};
void walk_seg(void *ctx, const expseg_walk_segment *s) {
  auto *w = static_cast<WalkView *>(ctx);
  w->mapped.push_back({s->address, s->address + s->total_size});
  w->segment_bytes += (int64_t)s->total_size;
  for (size_t i = 0; i < s->n_blocks; i++) {
    const expseg_walk_block &b = s->blocks[i];
    if (b.state == EXPSEG_BLOCK_PENDING_FREE) w->pending++;
    if (b.state == EXPSEG_BLOCK_ALLOCATED) {
      w->allocated++;
      w->allocated_bytes += (int64_t)b.size;
    }
    if (b.state != EXPSEG_BLOCK_INACTIVE) w->active_bytes += (int64_t)b.size;
    if (b.state != EXPSEG_BLOCK_INACTIVE) w->requested += (int64_t)b.requested_size;
  }
}

bool covered(const WalkView &w, uint64_t lo, uint64_t hi) {
  for (const auto &m : w.mapped)
    if (m.first <= lo && lo < m.second) {
      if (hi <= m.second) return true;
      lo = m.second; // a neighbouring run may continue it
    }
  for (const auto &m : w.mapped)
    if (m.first <= lo && hi <= m.second) return true;
  return false;
}

struct Model {
  expseg_allocator *a;
  std::map<uint64_t, Live> live;
  std::vector<Busy> busy;
  std::set<expseg_stream> held;

  bool busy_for(const Busy &b, expseg_stream t) const {
    return !b.others.empty() || (b.own_held && t != b.own);
  }
  // A new allocation [p, p+size) on t: overlaps no live block and no memory busy for t.
  void check_new(uint64_t p, size_t size, expseg_stream t, const std::string &where) {
    for (const Busy &b : busy)
      ASSERT_FALSE(p < b.hi && b.lo < p + size && busy_for(b, t))
          << where << ": malloc on stream " << t << " got " << ptr_text((void *)p) << "+" << size
          << " overlapping memory freed on stream " << b.own << " (held: " << b.own_held
          << ", recorded held: " << b.others.size() << ")";
    auto it = live.upper_bound(p);
    if (it != live.end()) {
      ASSERT_LE(p + size, it->first) << where << ": overlaps a live block";
    }
    if (it != live.begin()) {
      --it;
      ASSERT_LE(it->first + it->second.size, p) << where << ": overlaps a live block";
    }
  }
  void freed(uint64_t p) {
    const Live &l = live.at(p);
    Busy b{p, p + l.size, l.stream, {}, held.count(l.stream) > 0};
    for (expseg_stream r : l.recorded)
      if (r != l.stream && held.count(r)) b.others.insert(r);
    if (b.own_held || !b.others.empty()) busy.push_back(b);
    live.erase(p);
  }
  void release(expseg_stream s) {
    held.erase(s);
    for (Busy &b : busy) {
      b.others.erase(s);
      if (b.own == s) b.own_held = false;
    }
    std::vector<Busy> keep;
    for (Busy &b : busy)
      if (b.own_held || !b.others.empty()) keep.push_back(b);
    busy.swap(keep);
  }
  // Statistics against the walk; busy memory still mapped.
  void check(const std::string &where) {
    ASSERT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << expseg_last_error();
    WalkView w;
    ASSERT_EQ(expseg_walk(a, walk_seg, nullptr, &w), EXPSEG_OK) << where;
    ASSERT_EQ(stat_of(a, "allocation.all.current"), (int64_t)live.size()) << where;
    ASSERT_EQ(w.allocated, (int64_t)live.size()) << where;
    ASSERT_EQ(stat_of(a, "expseg.pending_free_blocks.current"), w.pending) << where;
    ASSERT_EQ(stat_of(a, "active.all.current"), w.allocated + w.pending) << where;
    ASSERT_EQ(stat_of(a, "active_bytes.all.current"), w.active_bytes) << where;
    ASSERT_EQ(stat_of(a, "allocated_bytes.all.current"), w.allocated_bytes) << where;
    ASSERT_EQ(stat_of(a, "requested_bytes.all.current"), w.requested) << where;
    ASSERT_EQ(stat_of(a, "reserved_bytes.all.current"),
              w.segment_bytes + stat_of(a, "expseg.cached_physical_bytes.current"))
        << where;
    for (const Busy &b : busy)
      ASSERT_TRUE(covered(w, b.lo, b.hi))
          << where << ": memory freed on held stream " << b.own << " at "
          << ptr_text((void *)b.lo) << " is no longer mapped";
  }
};

void hold(Model &m, expseg_stream s, bool on) {
  ASSERT_EQ(expseg_testing_hold_stream(m.a, s, on), EXPSEG_OK) << expseg_last_error();
  if (on) m.held.insert(s);
  else m.release(s);
}

// Everything back at the end: no lost block, nothing left in the driver.
void drain(Model &m, const std::string &where) {
  std::set<expseg_stream> h = m.held;
  for (expseg_stream s : h) hold(m, s, false);
  while (!m.live.empty()) {
    ASSERT_EQ(expseg_free(m.a, (void *)m.live.begin()->first), EXPSEG_OK) << where;
    m.live.erase(m.live.begin());
  }
  ASSERT_EQ(expseg_synchronize(m.a), EXPSEG_OK) << where;
  ASSERT_EQ(expseg_empty_cache(m.a), EXPSEG_OK) << where;
  EXPECT_EQ(stat_of(m.a, "expseg.pending_free_blocks.current"), 0) << where;
  EXPECT_EQ(stat_of(m.a, "active.all.current"), 0) << where;
  EXPECT_EQ(stat_of(m.a, "requested_bytes.all.current"), 0) << where;
  EXPECT_EQ(stat_of(m.a, "reserved_bytes.all.current"), 0) << where;
  EXPECT_EQ(stat_of(m.a, "inactive_split.all.current"), 0) << where;
  expseg_allocator *a = m.a;
  m.a = nullptr;
  expect_nothing_left(a, where);
}

void random_run(const char *driver, const char *config, uint64_t dflt_seed, bool faults) {
  EXPSEG_SEEDED(seed, dflt_seed);
  std::printf("seed %llu (%s / %s)\n", (unsigned long long)seed, driver, config);
  TestRng rng(seed);
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create(driver, 0, config, &a), EXPSEG_OK) << expseg_last_error();
  Model m{a, {}, {}, {}};
  // 8 hot streams (held and released) and 300 others.
  std::vector<expseg_stream> streams;
  for (expseg_stream s = 0; s < 8; s++) streams.push_back(s);
  for (size_t i = 0; i < 300; i++) streams.push_back(0x7f0000100000ull + 0x40 * i);
  auto pick = [&]() { return rng.below(3) ? streams[rng.below(8)] : streams[rng.below(308)]; };
  const uint64_t ops = test_ops(100000, 25000);
  int ooms = 0;
  std::vector<expseg_pool_id> pools;
  for (uint64_t step = 0; step < ops; step++) {
    const std::string where = "step " + std::to_string(step);
    const uint64_t r = rng.below(100);
    if (faults && rng.below(50) == 0) {
      static const char *const kinds[] = {"event_create", "event_record", "event_query",
                                          "stream_synchronize", "event_synchronize", "map",
                                          "create", "unmap", "release"};
      std::string rule = std::string(kinds[rng.below(9)]) + "@" + std::to_string(1 + rng.below(3));
      if (rng.below(3) == 0) rule += ".." + std::to_string(4 + rng.below(6));
      ASSERT_EQ(expseg_testing_set_faults(a, rule.c_str()), EXPSEG_OK) << rule;
    }
    if (r < 42 || m.live.empty()) {
      expseg_stream s = pick();
      size_t size = rng.below(3) ? 1 + rng.below(MiB) : MiB + rng.below(30 * MiB);
      void *p = nullptr;
      const uint64_t how = rng.below(8);
      expseg_status st =
          how == 0 ? expseg_malloc_ex(a, size, s, EXPSEG_MALLOC_SINGLE_CHUNK, &p)
          : how == 1 && !pools.empty()
              ? expseg_malloc_pool(a, size, s, pools[rng.below(pools.size())], &p)
              : expseg_malloc(a, size, s, &p);
      if (st == EXPSEG_OK) {
        m.check_new((uint64_t)p, size, s, where);
        if (::testing::Test::HasFatalFailure()) return;
        m.live[(uint64_t)p] = Live{size, s, {}};
      } else {
        if (!(faults && st == EXPSEG_ERR_DRIVER)) {
          ASSERT_EQ(st, EXPSEG_ERR_OUT_OF_MEMORY) << where << ": " << expseg_last_error();
        }
        ooms++;
      }
    } else if (r < 78) {
      auto it = m.live.begin();
      std::advance(it, (long)rng.below(m.live.size()));
      uint64_t p = it->first;
      expseg_status st = expseg_free(a, (void *)p);
      ASSERT_EQ(st, EXPSEG_OK) << where << ": " << expseg_last_error();
      m.freed(p);
    } else if (r < 88) {
      auto it = m.live.begin();
      std::advance(it, (long)rng.below(m.live.size()));
      expseg_stream s = rng.below(4) ? pick() : it->second.stream;
      ASSERT_EQ(expseg_record_stream(a, (void *)it->first, s), EXPSEG_OK)
          << where << ": " << expseg_last_error();
      it->second.recorded.insert(s);
    } else if (r < 95) {
      expseg_stream s = streams[1 + rng.below(7)];
      if (rng.below(4) == 0) { // a reserve class changes where the stream's next segments go
        static const char *const cls[] = {"small", "big", "unlisted", nullptr};
        ASSERT_EQ(expseg_stream_set_reserve_class(a, s, cls[rng.below(4)]), EXPSEG_OK) << where;
      } else {
        hold(m, s, !m.held.count(s));
      }
    } else if (r < 97) {
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << where << ": " << expseg_last_error();
    } else if (r < 98) { // private pools: create, empty, release (live blocks stay valid)
      uint64_t k = rng.below(3);
      if (k == 0 && pools.size() < 3) {
        expseg_pool_id id;
        ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << where;
        pools.push_back(id);
      } else if (k == 1 && !pools.empty()) {
        ASSERT_EQ(expseg_pool_empty_cache(a, pools[rng.below(pools.size())]), EXPSEG_OK) << where;
      } else if (!pools.empty()) {
        size_t i = rng.below(pools.size());
        ASSERT_EQ(expseg_pool_release(a, pools[i]), EXPSEG_OK) << where << expseg_last_error();
        pools.erase(pools.begin() + (long)i);
      }
    } else {
      expseg_status st = expseg_synchronize(a);
      if (m.held.empty() && !faults) {
        ASSERT_EQ(st, EXPSEG_OK) << where << expseg_last_error();
      }
      if (!m.held.empty()) {
        ASSERT_EQ(st, EXPSEG_ERR_DRIVER) << where;
      }
    }
    if (step % 16 == 0 || r >= 95) {
      m.check(where);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  std::printf("%llu ops, %d out-of-memory answers, lent %lld\n", (unsigned long long)ops, ooms,
              (long long)stat_of(a, "expseg.num_lent"));
  if (faults) {
    ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK);
  }
  for (expseg_pool_id id : pools) ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_OK);
  drain(m, "end");
}

TEST(Adv16Streams, RandomBusyExpandable) {
  random_run("sim:capacity=512M", "expandable_segments:True", 16001, false);
}
TEST(Adv16Streams, RandomBusyClassic) {
  random_run("sim:capacity=512M", "expandable_segments:False", 16002, false);
}
TEST(Adv16Streams, RandomBusyGarbageCollection) {
  random_run("sim:capacity=512M",
             "expandable_segments:False,garbage_collection_threshold:0.5,max_split_size_mb:40,"
             "per_process_memory_fraction:0.8",
             16005, false);
}
TEST(Adv16Streams, RandomBusySingleChunkPageCache) {
  random_run("sim:capacity=384M", "expandable_segments:True,single_chunk_min_mb:8,page_cache_max_mb:64",
             16006, false);
}
TEST(Adv16Streams, RandomBusyReserveClasses) {
  random_run("sim:capacity=512M",
             "expandable_segments:True,expandable_segments_reserve_by_class:[small:0.05,big:1G]",
             16007, false);
}
TEST(Adv16Streams, RandomBusyFaults) {
  random_run("fault:fail=;sim:capacity=512M", "expandable_segments:True", 16003, true);
}

// record_stream on what is not a live pointer of this allocator: a clear error, no change.
TEST(Adv16Streams, RecordStreamRefusals) {
  AllocPtr ap = make_alloc("sim:capacity=256M", "expandable_segments:True");
  AllocPtr bp = make_alloc("sim:capacity=256M", "expandable_segments:True");
  expseg_allocator *a = ap.get(), *b = bp.get();
  void *p = nullptr, *q = nullptr, *f = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4 * MiB, 1, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 4 * MiB, 1, &f), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(b, 4 * MiB, 1, &q), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, f), EXPSEG_OK);
  StatMap before = without_times(stat_map(a));
  struct Case {
    void *ptr;
    const char *what;
  } cases[] = {{f, "freed"}, {(char *)p + 512, "interior"}, {q, "foreign"}};
  for (const Case &c : cases) {
    EXPECT_EQ(expseg_record_stream(a, c.ptr, 2), EXPSEG_ERR_INVALID_ARGUMENT) << c.what;
    EXPECT_NE(std::string(expseg_last_error()).find(ptr_text(c.ptr)), std::string::npos)
        << c.what << ": " << expseg_last_error();
  }
  EXPECT_EQ(expseg_record_stream(a, p, UINT64_C(1) << 48), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_record_stream(a, nullptr, 2), EXPSEG_OK);
  EXPECT_EQ(without_times(stat_map(a)), before);
  // own stream, twice: nothing recorded, the free is not pending even with stream 1 held
  ASSERT_EQ(expseg_record_stream(a, p, 1), EXPSEG_OK);
  ASSERT_EQ(expseg_record_stream(a, p, 1), EXPSEG_OK);
  ASSERT_EQ(expseg_testing_hold_stream(a, 1, true), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "expseg.pending_free_blocks.current"), 0);
  void *r = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4 * MiB, 1, &r), EXPSEG_OK); // own stream: reused at once
  EXPECT_EQ(r, p);
  void *o = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4 * MiB, 2, &o), EXPSEG_OK);
  EXPECT_NE(o, f) << "memory freed on held stream 1 handed to stream 2";
  ASSERT_EQ(expseg_testing_hold_stream(a, 1, false), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, r), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, o), EXPSEG_OK);
  ASSERT_EQ(expseg_free(b, q), EXPSEG_OK);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
}

// The same stream recorded twice and held: one pending block, reused by no stream (its own
// included), kept through empty_cache and lending, completed once the stream is released.
TEST(Adv16Streams, RecordedTwiceHeldThroughEmptyCache) {
  for (const char *cfg : {"expandable_segments:True", "expandable_segments:False"}) {
    SCOPED_TRACE(cfg);
    expseg_allocator *a = nullptr;
    ASSERT_EQ(expseg_create("sim:capacity=256M", 0, cfg, &a), EXPSEG_OK);
    Model m{a, {}, {}, {}};
    void *p = nullptr;
    ASSERT_EQ(expseg_malloc(a, 8 * MiB, 1, &p), EXPSEG_OK);
    m.live[(uint64_t)p] = Live{8 * MiB, 1, {5}};
    ASSERT_EQ(expseg_record_stream(a, p, 5), EXPSEG_OK);
    ASSERT_EQ(expseg_record_stream(a, p, 5), EXPSEG_OK);
    hold(m, 5, true);
    ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
    m.freed((uint64_t)p);
    EXPECT_EQ(stat_of(a, "expseg.pending_free_blocks.current"), 1);
    EXPECT_EQ(stat_of(a, "active.all.current"), 1);
    EXPECT_EQ(stat_of(a, "allocation.all.current"), 0);
    EXPECT_EQ(stat_of(a, "requested_bytes.all.current"), (int64_t)(8 * MiB));
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    EXPECT_EQ(expseg_synchronize(a), EXPSEG_ERR_DRIVER);
    m.check("after empty_cache");
    for (expseg_stream s : {1, 5, 9, 1, 5, 9}) {
      void *q = nullptr;
      ASSERT_EQ(expseg_malloc(a, 8 * MiB, s, &q), EXPSEG_OK);
      m.check_new((uint64_t)q, 8 * MiB, s, "stream " + std::to_string(s));
      m.live[(uint64_t)q] = Live{8 * MiB, s, {}};
      m.check("malloc");
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
    hold(m, 5, false);
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    EXPECT_EQ(stat_of(a, "expseg.pending_free_blocks.current"), 0);
    m.check("released");
    drain(m, cfg);
  }
}

// Lending: memory freed on a held stream is not lent; once released it may be; the borrower's
// free waits for the borrower's work before the lender (or anyone) reuses it.
TEST(Adv16Streams, LendingWaitsForBothStreams) {
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim:capacity=256M", 0, "expandable_segments:True", &a), EXPSEG_OK);
  Model m{a, {}, {}, {}};
  auto mal = [&](size_t size, expseg_stream s) -> uint64_t {
    void *p = nullptr;
    EXPECT_EQ(expseg_malloc(a, size, s, &p), EXPSEG_OK) << expseg_last_error();
    m.check_new((uint64_t)p, size, s, "malloc on " + std::to_string(s));
    m.live[(uint64_t)p] = Live{size, s, {}};
    return (uint64_t)p;
  };
  auto fre = [&](uint64_t p) {
    ASSERT_EQ(expseg_free(a, (void *)p), EXPSEG_OK);
    m.freed(p);
  };
  uint64_t p1 = mal(64 * MiB, 1);
  hold(m, 1, true);
  fre(p1);
  uint64_t p2 = mal(64 * MiB, 2);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  m.check("stream 1 held");
  hold(m, 1, false);
  fre(p2);
  int64_t lent0 = stat_of(a, "expseg.num_lent");
  uint64_t p3 = mal(32 * MiB, 3); // may borrow either
  hold(m, 3, true);
  fre(p3);
  for (expseg_stream s : {1, 2, 4}) {
    uint64_t q = mal(32 * MiB, s);
    ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "stream " << s;
    fre(q);
  }
  m.check("stream 3 held");
  std::printf("lent %lld\n", (long long)(stat_of(a, "expseg.num_lent") - lent0));
  drain(m, "lending");
}

// Event creation or record failing at the free while the recorded stream is held: the block
// is neither lost nor reused before the stream's work completes.
TEST(Adv16Streams, EventFaultsAtFree) {
  for (const char *rule : {"event_create@1..100", "event_record@1..100",
                           "event_create@1..100,stream_synchronize@1..100"}) {
    SCOPED_TRACE(rule);
    expseg_allocator *a = nullptr;
    ASSERT_EQ(expseg_create("fault:fail=;sim:capacity=256M", 0, "expandable_segments:True", &a),
              EXPSEG_OK);
    Model m{a, {}, {}, {}};
    void *p = nullptr;
    ASSERT_EQ(expseg_malloc(a, 16 * MiB, 1, &p), EXPSEG_OK);
    m.live[(uint64_t)p] = Live{16 * MiB, 1, {2}};
    ASSERT_EQ(expseg_record_stream(a, p, 2), EXPSEG_OK);
    hold(m, 2, true);
    ASSERT_EQ(expseg_testing_set_faults(a, rule), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, p), EXPSEG_OK) << expseg_last_error();
    m.freed((uint64_t)p);
    m.check("after free");
    for (expseg_stream s : {1, 2, 3}) {
      void *q = nullptr;
      ASSERT_EQ(expseg_malloc(a, 16 * MiB, s, &q), EXPSEG_OK) << expseg_last_error();
      m.check_new((uint64_t)q, 16 * MiB, s, "stream " + std::to_string(s));
      m.live[(uint64_t)q] = Live{16 * MiB, s, {}};
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
      m.check("malloc");
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
    ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK);
    EXPECT_EQ(stat_of(a, "expseg.pending_free_blocks.current"), 1);
    drain(m, rule);
  }
}

// Hundreds of streams, each block recorded on its neighbours, a third of them held, freed in
// an interleaved order: pending counts follow the walk, nothing reused while busy.
TEST(Adv16Streams, HundredsOfStreamsInterleaved) {
  EXPSEG_SEEDED(seed, 16004);
  std::printf("seed %llu\n", (unsigned long long)seed);
  TestRng rng(seed);
  for (const char *cfg : {"expandable_segments:True", "expandable_segments:False"}) {
    SCOPED_TRACE(cfg);
    expseg_allocator *a = nullptr;
    ASSERT_EQ(expseg_create("sim:capacity=8G", 0, cfg, &a), EXPSEG_OK);
    Model m{a, {}, {}, {}};
    const size_t n = 400;
    std::vector<uint64_t> ptrs;
    for (size_t i = 0; i < n; i++) {
      size_t size = (i % 3 == 0) ? 2 * MiB + 512 * (i + 1) : 4096 + 512 * i;
      void *p = nullptr;
      ASSERT_EQ(expseg_malloc(a, size, 100 + i, &p), EXPSEG_OK) << expseg_last_error();
      m.live[(uint64_t)p] = Live{size, 100 + i, {}};
      ptrs.push_back((uint64_t)p);
    }
    for (size_t i = 0; i < n; i++)
      for (size_t k : {i + 1, i + 7}) {
        expseg_stream s = 100 + (k % n);
        ASSERT_EQ(expseg_record_stream(a, (void *)ptrs[i], s), EXPSEG_OK);
        m.live[ptrs[i]].recorded.insert(s);
      }
    for (size_t i = 0; i < n; i += 3) hold(m, 100 + i, true);
    for (size_t i = n; i-- > 1;) std::swap(ptrs[i], ptrs[rng.below(i + 1)]);
    for (size_t i = 0; i < n; i++) {
      ASSERT_EQ(expseg_free(a, (void *)ptrs[i]), EXPSEG_OK);
      m.freed(ptrs[i]);
      expseg_stream s = 100 + rng.below(n);
      size_t size = 4096 + rng.below(3 * MiB);
      void *q = nullptr;
      ASSERT_EQ(expseg_malloc(a, size, s, &q), EXPSEG_OK) << expseg_last_error();
      m.check_new((uint64_t)q, size, s, "after free " + std::to_string(i));
      m.live[(uint64_t)q] = Live{size, s, {}};
      if (i % 50 == 0) {
        if (rng.below(2)) {
          ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
        }
        m.check("free " + std::to_string(i));
      }
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      if (i % 40 == 39) { // release a few held streams part way
        std::vector<expseg_stream> h(m.held.begin(), m.held.end());
        for (size_t k = 0; k < 5 && k < h.size(); k++) {
          expseg_stream s2 = h[rng.below(h.size())];
          if (m.held.count(s2)) hold(m, s2, false);
        }
      }
    }
    m.check("end");
    drain(m, cfg);
  }
}

} // namespace

namespace {

// A private pool released while its only block waits for a held recorded stream: its memory
// stays mapped and unused by anyone until the stream is released; then empty_cache gives it
// back. A region cannot sleep while a stream it must wait for is held.
TEST(Adv16Streams, ReleasedPoolAndSleepWaitForHeldStream) {
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim:capacity=256M", 0, "expandable_segments:True", &a), EXPSEG_OK);
  Model m{a, {}, {}, {}};
  expseg_pool_id pool = 0;
  ASSERT_EQ(expseg_pool_create(a, &pool), EXPSEG_OK);
  void *p = nullptr;
  ASSERT_EQ(expseg_malloc_pool(a, 24 * MiB, 1, pool, &p), EXPSEG_OK);
  m.live[(uint64_t)p] = Live{24 * MiB, 1, {7}};
  ASSERT_EQ(expseg_record_stream(a, p, 7), EXPSEG_OK);
  hold(m, 7, true);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  m.freed((uint64_t)p);
  ASSERT_EQ(expseg_pool_release(a, pool), EXPSEG_OK) << expseg_last_error();
  for (int i = 0; i < 3; i++) {
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    for (expseg_stream s : {1, 7, 8}) {
      void *q = nullptr;
      ASSERT_EQ(expseg_malloc(a, 24 * MiB, s, &q), EXPSEG_OK) << expseg_last_error();
      m.check_new((uint64_t)q, 24 * MiB, s, "stream " + std::to_string(s));
      m.live[(uint64_t)q] = Live{24 * MiB, s, {}};
    }
    m.check("pool released, stream 7 held");
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
  }
  // a region whose block stream 7 used cannot sleep while 7 is held
  ASSERT_EQ(expseg_region_begin(a, "adv16s"), EXPSEG_OK);
  void *r = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4 * MiB, 2, &r), EXPSEG_OK);
  ASSERT_EQ(expseg_region_end(a, "adv16s"), EXPSEG_OK);
  ASSERT_EQ(expseg_record_stream(a, r, 7), EXPSEG_OK);
  m.live[(uint64_t)r] = Live{4 * MiB, 2, {7}};
  EXPECT_NE(expseg_sleep(a, "adv16s", EXPSEG_SLEEP_DISCARD), EXPSEG_OK);
  m.check("sleep refused");
  hold(m, 7, false);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "expseg.pending_free_blocks.current"), 0);
  m.check("released");
  expseg_pool_id region = 0; // a region's memory goes back with its pool's empty_cache
  ASSERT_EQ(expseg_pool_of(a, r, &region), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, r), EXPSEG_OK);
  m.freed((uint64_t)r);
  ASSERT_EQ(expseg_pool_empty_cache(a, region), EXPSEG_OK);
  drain(m, "pool");
}

} // namespace
