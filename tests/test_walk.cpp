// SPDX-License-Identifier: Apache-2.0
// test_walk.cpp: expseg_walk, the allocator's segments, blocks and history as C structs.
// Checked against the statistics (seeded random workloads with pending frees on held
// streams, classic and expandable segments), against the snapshot pickle (same segments
// and blocks, read back by Python's pickle), and the history's events and times.
#include "expseg.h"
#include "expseg_testing.h"

#include <gtest/gtest.h>

#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "snapshot_check.h"
#include "test_seed.h"

namespace {

struct Block {
  uint64_t address, size, requested;
  expseg_block_state state;
};
struct Segment {
  expseg_walk_segment s;
  std::vector<Block> blocks;
};
struct Event {
  std::string action;
  uint64_t addr, size, stream, time_us, pool;
};
struct Walk {
  std::vector<Segment> segs;
  std::vector<Event> events;
};

Walk walk(expseg_allocator *a) {
  Walk w;
  EXPECT_EQ(expseg_walk(
                a,
                [](void *ctx, const expseg_walk_segment *s) {
                  Segment seg{*s, {}};
                  for (size_t i = 0; i < s->n_blocks; i++)
                    seg.blocks.push_back({s->blocks[i].address, s->blocks[i].size,
                                          s->blocks[i].requested_size, s->blocks[i].state});
                  seg.s.blocks = nullptr; // valid only during the call
                  static_cast<Walk *>(ctx)->segs.push_back(seg);
                },
                [](void *ctx, const expseg_walk_event *e) {
                  static_cast<Walk *>(ctx)->events.push_back(
                      {e->action, e->addr, e->size, e->stream, e->time_us, e->pool});
                },
                &w),
            EXPSEG_OK)
      << expseg_last_error();
  return w;
}

int64_t stat(expseg_allocator *a, const char *key) {
  int64_t v = -1;
  EXPECT_EQ(expseg_stat(a, key, &v), EXPSEG_OK) << key;
  return v;
}

// A seeded workload on three streams; stream 2 is held, so its cross-stream frees stay
// pending. Returns the live pointers.
std::vector<void *> workload(expseg_allocator *a, uint64_t seed) {
  TestRng rng(seed);
  std::vector<void *> live;
  EXPECT_EQ(expseg_testing_hold_stream(a, 2, true), EXPSEG_OK);
  for (int i = 0; i < 300; i++) {
    if (!live.empty() && rng.chance(0.45)) {
      size_t k = rng.below(live.size());
      if (rng.chance(0.3)) {
        EXPECT_EQ(expseg_record_stream(a, live[k], 2), EXPSEG_OK);
      }
      EXPECT_EQ(expseg_free(a, live[k]), EXPSEG_OK);
      live.erase(live.begin() + (long)k);
      continue;
    }
    size_t size = rng.chance(0.5) ? 1 + rng.below(1 << 20) : (1 << 20) + rng.below(24 << 20);
    void *p = nullptr;
    if (expseg_malloc(a, size, rng.below(2), &p) == EXPSEG_OK) live.push_back(p);
  }
  return live;
}

void check_against_stats(expseg_allocator *a, const Walk &w, bool expandable) {
  int64_t allocated = 0, active = 0, requested_active = 0, total = 0, n_alloc = 0, n_pending = 0;
  int64_t small_allocated = 0;
  uint64_t prev_end = 0;
  for (const Segment &seg : w.segs) {
    const expseg_walk_segment &s = seg.s;
    EXPECT_GE(s.address, prev_end) << "segments overlap or are out of order";
    prev_end = s.address + s.total_size;
    EXPECT_EQ(s.is_expandable, expandable);
    ASSERT_FALSE(seg.blocks.empty());
    uint64_t at = s.address, seg_alloc = 0, seg_active = 0, seg_req = 0;
    for (const Block &b : seg.blocks) {
      EXPECT_EQ(b.address, at) << "blocks do not tile the segment";
      at += b.size;
      if (b.state == EXPSEG_BLOCK_ALLOCATED) seg_alloc += b.size, n_alloc++;
      if (b.state == EXPSEG_BLOCK_PENDING_FREE) n_pending++;
      if (b.state != EXPSEG_BLOCK_INACTIVE) {
        seg_active += b.size;
        seg_req += b.requested;
        EXPECT_GT(b.requested, 0u);
        EXPECT_LE(b.requested, b.size);
      } else {
        EXPECT_EQ(b.requested, 0u);
      }
    }
    EXPECT_EQ(at, s.address + s.total_size);
    EXPECT_EQ(s.allocated_size, seg_alloc);
    EXPECT_EQ(s.active_size, seg_active);
    EXPECT_EQ(s.requested_size, seg_req);
    allocated += (int64_t)s.allocated_size;
    active += (int64_t)s.active_size;
    requested_active += (int64_t)s.requested_size;
    total += (int64_t)s.total_size;
    if (!s.is_large) small_allocated += (int64_t)s.allocated_size;
  }
  EXPECT_EQ(allocated, stat(a, "allocated_bytes.all.current"));
  EXPECT_EQ(small_allocated, stat(a, "allocated_bytes.small_pool.current"));
  EXPECT_EQ(active, stat(a, "active_bytes.all.current"));
  EXPECT_EQ(requested_active, stat(a, "requested_bytes.all.current"));
  EXPECT_EQ(n_alloc, stat(a, "allocation.all.current"));
  EXPECT_EQ(n_pending, stat(a, "active.all.current") - stat(a, "allocation.all.current"));
  EXPECT_GT(n_pending, 0) << "the workload should leave pending frees";
  if (expandable)
    EXPECT_EQ(total, stat(a, "expseg.mapped_bytes.current"));
  else
    EXPECT_EQ(total, stat(a, "reserved_bytes.all.current"));
}

class WalkStats : public ::testing::TestWithParam<bool> {};

TEST_P(WalkStats, SegmentsAndBlocksAgreeWithTheStatistics) {
  EXPSEG_SEEDED(seed, 5);
  const bool expandable = GetParam();
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("host:capacity=1G", 0,
                          expandable ? "expandable_segments:True" : "expandable_segments:False", &a),
            EXPSEG_OK)
      << expseg_last_error();
  std::vector<void *> live = workload(a, seed);
  Walk w = walk(a);
  ASSERT_FALSE(w.segs.empty());
  check_against_stats(a, w, expandable);
  EXPECT_TRUE(w.events.empty()); // no history recorded
  for (void *p : live) EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
  EXPECT_EQ(expseg_testing_hold_stream(a, 2, false), EXPSEG_OK);
  expseg_destroy(a);
}

INSTANTIATE_TEST_SUITE_P(Kinds, WalkStats, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool> &i) {
                           return std::string(i.param ? "Expandable" : "Classic");
                         });

// The walk and the snapshot pickle report the same segments and blocks.
TEST(Walk, SameSegmentsAndBlocksAsTheSnapshot) {
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 is needed to read the pickle";
  EXPSEG_SEEDED(seed, 8);
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("host:capacity=1G", 0, "", &a), EXPSEG_OK) << expseg_last_error();
  std::vector<void *> live = workload(a, seed);
  Walk w = walk(a);
  std::string expect;
  for (const Segment &seg : w.segs) {
    const expseg_walk_segment &s = seg.s;
    expect += std::to_string(s.address) + " " + std::to_string(s.total_size) + " " +
              std::to_string(s.allocated_size) + " " + std::to_string(s.active_size) + " " +
              std::to_string(s.requested_size) + " " + std::to_string(s.stream) + " " +
              (s.is_large ? "large" : "small") + " " + (s.is_expandable ? "1" : "0") + "\n";
    static const char *names[] = {"inactive", "active_allocated", "active_pending_free"};
    for (const Block &b : seg.blocks)
      expect += " " + std::to_string(b.address) + " " + std::to_string(b.size) + " " +
                std::to_string(b.requested) + " " + names[b.state] + "\n";
  }
  char path[] = "/tmp/expseg_walk_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_EQ(expseg_snapshot_dump(a, path), EXPSEG_OK) << expseg_last_error();
  std::string out;
  const std::string py =
      "import pickle,sys\n"
      "d=pickle.load(open(sys.argv[1],'rb'))\n"
      "for s in d['segments']:\n"
      "  print(s['address'],s['total_size'],s['allocated_size'],s['active_size'],"
      "s['requested_size'],s['stream'],s['segment_type'],int(s['is_expandable']))\n"
      "  for b in s['blocks']: print('',b['address'],b['size'],b['requested_size'],b['state'])\n";
  FILE *f = fopen((std::string(path) + ".py").c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs(py.c_str(), f);
  fclose(f);
  ASSERT_EQ(snapshot_run("python3 " + std::string(path) + ".py " + path, &out), 0) << out;
  EXPECT_EQ(out, expect);
  unlink(path);
  unlink((std::string(path) + ".py").c_str());
  for (void *p : live) EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
  EXPECT_EQ(expseg_testing_hold_stream(a, 2, false), EXPSEG_OK);
  expseg_destroy(a);
}

uint64_t now_us() {
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  return (uint64_t)tv.tv_sec * 1000000u + (uint64_t)tv.tv_usec;
}

TEST(Walk, HistoryEventsInOrderWithTheirTimes) {
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("host:capacity=256M", 0, "", &a), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, 0), EXPSEG_OK);
  uint64_t t0 = now_us();
  void *p = nullptr;
  ASSERT_EQ(expseg_malloc(a, 3 << 20, 7, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  Walk w = walk(a);
  uint64_t t1 = now_us();
  ASSERT_GE(w.events.size(), 4u);
  std::vector<std::string> actions;
  for (const Event &e : w.events) {
    actions.push_back(e.action);
    EXPECT_GE(e.time_us + 1000, t0) << e.action; // a clock read once per event, scaled
    EXPECT_LE(e.time_us, t1 + 1000) << e.action;
  }
  auto at = [&](const char *name) {
    for (size_t i = 0; i < actions.size(); i++)
      if (actions[i] == name) return (long)i;
    return -1L;
  };
  ASSERT_GE(at("alloc"), 0);
  EXPECT_LT(at("alloc"), at("free_requested"));
  EXPECT_LE(at("free_requested"), at("free_completed"));
  EXPECT_EQ(actions.back(), "snapshot"); // the walk records one, as a snapshot does
  const Event &alloc = w.events[(size_t)at("alloc")];
  EXPECT_EQ(alloc.addr, (uint64_t)(uintptr_t)p);
  EXPECT_EQ(alloc.size, 3u << 20);
  EXPECT_EQ(alloc.stream, 7u);
  for (size_t i = 1; i < w.events.size(); i++)
    EXPECT_GE(w.events[i].time_us, w.events[i - 1].time_us);
  expseg_destroy(a);
}

// Each segment and each event names its private pool (0 = the general cache), a released
// pool's too while it drains; a pool's segment reports the stream, not the pool's key.
class WalkPools : public ::testing::TestWithParam<const char *> {};

TEST_P(WalkPools, SegmentsAndEventsNameTheirPool) {
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create(GetParam(), 0, "", &a), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, 0), EXPSEG_OK);
  expseg_pool_id p1 = 0, p2 = 0;
  ASSERT_EQ(expseg_pool_create(a, &p1), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_create(a, &p2), EXPSEG_OK);
  ASSERT_NE(p1, p2);
  void *g = nullptr, *x = nullptr, *y = nullptr, *z = nullptr;
  ASSERT_EQ(expseg_malloc(a, 3 << 20, 5, &g), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_malloc_pool(a, 3 << 20, 5, p1, &x), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_malloc_pool(a, 4096, 6, p2, &y), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_malloc_pool(a, 5 << 20, 6, p2, &z), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_pool_release(a, p2), EXPSEG_OK); // draining: y and z are live
  Walk w = walk(a);
  auto seg_of = [&](void *p) -> const Segment * {
    for (const Segment &s : w.segs)
      for (const Block &b : s.blocks)
        if (b.address == (uint64_t)(uintptr_t)p) return &s;
    return nullptr;
  };
  struct Want {
    void *p;
    expseg_pool_id pool;
    expseg_stream stream;
  } wants[] = {{g, 0, 5}, {x, p1, 5}, {y, p2, 6}, {z, p2, 6}};
  for (const Want &want : wants) {
    const Segment *s = seg_of(want.p);
    ASSERT_NE(s, nullptr) << want.p;
    EXPECT_EQ(s->s.pool, want.pool) << want.p;
    EXPECT_EQ(s->s.stream, want.stream) << want.p;
    int allocs = 0;
    for (const Event &e : w.events)
      if (e.addr == (uint64_t)(uintptr_t)want.p && e.action == "alloc") {
        ++allocs;
        EXPECT_EQ(e.pool, want.pool) << want.p;
        EXPECT_EQ(e.stream, want.stream) << want.p;
      }
    EXPECT_EQ(allocs, 1) << want.p;
  }
  int pool_segment_events = 0;
  for (const Event &e : w.events)
    if (e.action == "segment_alloc" || e.action == "segment_map")
      pool_segment_events += e.pool == p1 || e.pool == p2;
  EXPECT_GE(pool_segment_events, 2); // each pool's segment event names it
  // once drained the released pool's segments are gone; the history keeps its id
  ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, z), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  w = walk(a);
  for (const Segment &s : w.segs) EXPECT_NE(s.s.pool, p2);
  bool freed_in_p2 = false;
  for (const Event &e : w.events)
    freed_in_p2 = freed_in_p2 || (e.action == "free_completed" && e.pool == p2 &&
                                  e.addr == (uint64_t)(uintptr_t)z);
  EXPECT_TRUE(freed_in_p2);
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, g), EXPSEG_OK);
  expseg_destroy(a);
}

INSTANTIATE_TEST_SUITE_P(Drivers, WalkPools,
                         ::testing::Values("host:capacity=256M", "sim:capacity=8G"),
                         [](const ::testing::TestParamInfo<const char *> &p) {
                           return std::string(p.param).substr(0, 4) == "host" ? "host" : "sim";
                         });

TEST(Walk, NullAllocatorIsRefusedAndNullCallbacksAreFine) {
  EXPECT_EQ(expseg_walk(nullptr, nullptr, nullptr, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("NULL"), std::string::npos);
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("host:capacity=64M", 0, "", &a), EXPSEG_OK);
  EXPECT_EQ(expseg_walk(a, nullptr, nullptr, nullptr), EXPSEG_OK);
  expseg_destroy(a);
}

} // namespace
