// SPDX-License-Identifier: Apache-2.0
// test_adv14_host.cpp: the pinned host pool (expseg_host_*) under seeded random programs and
// targeted cases, on the sim and host drivers: sizes straddling the page, the round
// threshold and the cached size (power-of-two, carved and own-chunk blocks), frees,
// record_stream on held streams, empty_cache and reset_peak_stats interleaved, over option
// combinations. After every step: no two live or stream-busy blocks overlap, the bytes
// written into each live block survive, the statistics keep the rules docs/host_pool.md
// states, and the pool's walk (the snapshot's host_segments) shows every live block once,
// with the address and size malloc gave. Then the driver's host_alloc / host_free failing at
// random points (fault wrapper), and bad input.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "alloc_support.h"
#include "expseg.h"
#include "host_pool_support.h"
#include "test_seed.h"

// pools/internal.h declares it without C linkage for C++: bound here by its symbol.
extern "C" bool adv14_host_observe(expseg_host_pool *h,
                                   void (*fn)(void *ctx, const history_t *hist,
                                              const expseg_walk_segment *segs, size_t n),
                                   void *ctx) __asm__("_expseg_host_observe");

extern "C" const hist_event_t *adv14_hist_at(const history_t *h, size_t i)
    __asm__("_expseg_hist_at");

namespace {

struct Live {
  size_t size;
  uint8_t tag;
  std::set<expseg_stream> streams;
};

struct Busy {
  size_t size;
  std::set<expseg_stream> held; // held streams it waits on
};

// The walk of the pool (what host_segments is written from), copied out.
struct WalkBlock {
  uint64_t address, size, requested;
  expseg_block_state state;
};
struct WalkSeg {
  uint64_t address, total;
  std::vector<WalkBlock> blocks;
};
// The pool's history as the snapshot reads it: its bound, and the blocks its alloc events
// say are live (an alloc with no later free_requested of its address), with their sizes.
struct HistView {
  bool on = false;
  size_t count = 0, max = 0;
  uint64_t total = 0;
  int newest = -1;
  std::map<uint64_t, uint64_t> open_allocs;
};
struct WalkOut {
  std::vector<WalkSeg> segs;
  HistView hist;
};

void walk_cb(void *ctx, const history_t *hist, const expseg_walk_segment *segs, size_t n) {
  auto *wo = static_cast<WalkOut *>(ctx);
  auto *out = &wo->segs;
  if (hist) {
    HistView &v = wo->hist;
    v.on = true;
    v.count = hist->count;
    v.max = hist->max;
    v.total = hist->total;
    for (size_t i = 0; i < hist->count; i++) {
      const hist_event_t *e = adv14_hist_at(hist, i);
      if (e->action == HIST_ALLOC) v.open_allocs[e->addr] = e->size;
      else if (e->action == HIST_FREE_REQUESTED) v.open_allocs.erase(e->addr);
      v.newest = e->action;
    }
  }
  for (size_t i = 0; i < n; i++) {
    WalkSeg s{segs[i].address, segs[i].total_size, {}};
    for (size_t j = 0; j < segs[i].n_blocks; j++) {
      const expseg_walk_block &b = segs[i].blocks[j];
      s.blocks.push_back({b.address, b.size, b.requested_size, b.state});
    }
    out->push_back(s);
  }
}

WalkOut walk(expseg_host_pool *h) {
  WalkOut w;
  EXPECT_TRUE(adv14_host_observe(h, walk_cb, &w));
  return w;
}

uint8_t pat(uint8_t tag, size_t off) { return (uint8_t)(tag * 31u + (off >> 12) * 7u + 1u); }

// Offsets written and checked in a block of n bytes: its first and last bytes, each page
// start, capped to keep huge blocks cheap.
std::vector<size_t> probe_offsets(size_t n) {
  std::vector<size_t> o;
  size_t step = n > 64 * 4096 ? n / 64 & ~size_t(4095) : 4096;
  if (step == 0) step = 4096;
  for (size_t off = 0; off < n; off += step) o.push_back(off);
  o.push_back(n - 1);
  return o;
}

void fill(void *p, size_t n, uint8_t tag) {
  for (size_t off : probe_offsets(n)) static_cast<uint8_t *>(p)[off] = pat(tag, off);
}

bool intact(const void *p, size_t n, uint8_t tag) {
  for (size_t off : probe_offsets(n))
    if (static_cast<const uint8_t *>(p)[off] != pat(tag, off)) return false;
  return true;
}

// The rules of docs/host_pool.md "Statistics" against what the test knows is live.
void expect_stats(expseg_host_pool *h, const std::map<uintptr_t, Live> &live,
                  const std::string &where) {
  StatMap s = host_stat_map(h);
  for (const char *k : {"allocation", "allocated_bytes", "segment", "reserved_bytes",
                        "expseg.cached_bytes", "expseg.pending_blocks"}) {
    std::string cur = std::string(k) + ".current", peak = std::string(k) + ".peak";
    std::string al = std::string(k) + ".allocated", fr = std::string(k) + ".freed";
    EXPECT_GE(s[cur], 0) << where << ": " << cur;
    EXPECT_LE(s[cur], s[peak]) << where << ": " << cur << " above its peak";
    EXPECT_EQ(s[al] - s[fr], s[cur]) << where << ": " << k << " allocated - freed != current";
  }
  // allocation: blocks held by callers or pending
  EXPECT_EQ(s["allocation.current"],
            (int64_t)live.size() + s["expseg.pending_blocks.current"]) << where;
  int64_t asked = 0;
  for (const auto &kv : live) asked += (int64_t)((kv.second.size + 4095) / 4096 * 4096);
  EXPECT_GE(s["allocated_bytes.current"], asked) << where << ": live bytes above allocated";
  EXPECT_LE(s["allocated_bytes.current"] + s["expseg.cached_bytes.current"],
            s["reserved_bytes.current"]) << where << ": allocated + cached above reserved";
  EXPECT_EQ(s["expseg.locked_bytes"] + s["expseg.unlocked_bytes"], s["reserved_bytes.current"])
      << where;
  EXPECT_EQ(s["num_host_alloc"] - s["num_host_free"], s["segment.current"]) << where;
  EXPECT_EQ(s["host_alloc_time.count"], s["num_host_alloc"]) << where;
  EXPECT_EQ(s["host_free_time.count"], s["num_host_free"]) << where;
}

// The walk against the statistics and the live set: every live block once, as allocated,
// at the address with the requested size malloc was given; segments tiled by their blocks.
void expect_walk(expseg_host_pool *h, const std::map<uintptr_t, Live> &live,
                 const std::string &where) {
  // the walk and the statistics are read under two takings of the lock: a background
  // thread may process events or give chunks back between them, so read until the
  // statistics (num_host_alloc and num_host_free among them, which only grow) did not move
  auto steady = [](StatMap m) {
    m = without_times(m);
    m.erase("expseg.background_passes");
    return m;
  };
  WalkOut wo;
  StatMap s;
  for (int tries = 0; tries < 100; tries++) {
    StatMap before = steady(host_stat_map(h));
    wo = walk(h);
    s = steady(host_stat_map(h));
    if (s == before) break;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const std::vector<WalkSeg> &w = wo.segs;
  const HistView &hv = wo.hist;
  if (hv.on) {
    EXPECT_LE(hv.count, hv.max) << where << ": history above its bound";
    EXPECT_EQ(hv.newest, HIST_SNAPSHOT) << where << ": the walk's snapshot event is not newest";
    for (const auto &kv : hv.open_allocs) {
      auto it = live.find(kv.first);
      if (it == live.end()) {
        ADD_FAILURE() << where << ": history has 0x" << std::hex << kv.first
                      << " allocated and never freed, but it is not live";
        continue;
      }
      EXPECT_EQ(kv.second, it->second.size) << where << ": alloc event size";
    }
  }
  int64_t total = 0, alloc_bytes = 0, free_bytes = 0, n_alloc = 0, n_pending = 0;
  std::map<uint64_t, const WalkBlock *> seen;
  for (const WalkSeg &g : w) {
    total += (int64_t)g.total;
    uint64_t at = g.address, sum = 0;
    for (const WalkBlock &b : g.blocks) {
      EXPECT_EQ(b.address, at) << where << ": segment 0x" << std::hex << g.address
                               << " not tiled by its blocks";
      at = b.address + b.size;
      sum += b.size;
      if (b.state == EXPSEG_BLOCK_ALLOCATED) {
        n_alloc++;
        alloc_bytes += (int64_t)b.size;
        EXPECT_TRUE(seen.emplace(b.address, &b).second) << where << ": block listed twice";
      } else if (b.state == EXPSEG_BLOCK_PENDING_FREE) {
        n_pending++;
        alloc_bytes += (int64_t)b.size;
      } else {
        free_bytes += (int64_t)b.size;
      }
    }
    EXPECT_EQ(sum, g.total) << where;
  }
  EXPECT_EQ(total, s["reserved_bytes.current"]) << where << ": walk total != reserved";
  EXPECT_EQ(alloc_bytes, s["allocated_bytes.current"]) << where;
  EXPECT_EQ(n_pending, s["expseg.pending_blocks.current"]) << where;
  EXPECT_EQ(free_bytes, s["expseg.cached_bytes.current"] + s["expseg.reserve_segment_bytes"] -
                            s["expseg.reserve_segment_used_bytes"])
      << where << ": free blocks != cached + the reserve's unused tail";
  EXPECT_EQ(n_alloc, (int64_t)live.size()) << where;
  for (const auto &kv : live) {
    auto it = seen.find(kv.first);
    if (it == seen.end()) {
      ADD_FAILURE() << where << ": live block 0x" << std::hex << kv.first << " not in the walk";
      continue;
    }
    EXPECT_EQ(it->second->requested, kv.second.size) << where;
    EXPECT_GE(it->second->size, kv.second.size) << where;
  }
}

bool overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn) { return a < b + bn && b < a + an; }

struct Program {
  expseg_host_pool *h;
  bool patterns;
  TestRng rng;
  size_t thr, maxc; // bytes; SIZE_MAX = off
  std::map<uintptr_t, Live> live;
  std::map<uintptr_t, Busy> busy;
  std::set<expseg_stream> held;
  uint8_t next_tag = 1;
  bool can_hold = true;
  FaultPool *faults = nullptr; // set: host_alloc / host_free fail at random points
  expseg_allocator *snap = nullptr; // set: expseg_snapshot_with_host now and then
  uint64_t failed_mallocs = 0;
  int64_t mallocs = 0; // of 1 byte or more: each one hit, reserve slice or miss

  Program(expseg_host_pool *hp, bool pat_on, uint64_t seed, size_t t, size_t m)
      : h(hp), patterns(pat_on), rng(seed), thr(t), maxc(m) {}

  size_t pick_size() {
    const size_t pg = 4096;
    std::vector<size_t> edges = {1, pg - 1, pg, pg + 1, 3 * pg + 17, 64 * KiB, 100 * KiB,
                                 1 * MiB - 1, 1 * MiB, 1 * MiB + 1, 6 * MiB, 20 * MiB};
    for (size_t base : {thr, maxc}) {
      if (base == SIZE_MAX || base > 16 * MiB) continue;
      if (base > 0) edges.push_back(base - 1);
      edges.push_back(base);
      edges.push_back(base + 1);
      edges.push_back(base + pg);
      if (base > pg) edges.push_back(base - pg + 1);
    }
    if (rng.chance(0.6)) return edges[rng.below(edges.size())];
    return 1 + rng.below(rng.chance(0.7) ? 512 * KiB : 6 * MiB);
  }

  void check_new(uintptr_t p, size_t n, const std::string &where) {
    for (const auto &kv : live)
      EXPECT_FALSE(overlaps(p, n, kv.first, kv.second.size))
          << where << ": new block 0x" << std::hex << p << "+" << n << " overlaps live 0x"
          << kv.first << "+" << kv.second.size;
    for (const auto &kv : busy)
      EXPECT_FALSE(overlaps(p, n, kv.first, kv.second.size))
          << where << ": new block 0x" << std::hex << p << "+" << n
          << " overlaps a block still used by a stream 0x" << kv.first;
  }

  // Now and then the next calls of one kind fail (out of memory or a driver error), counted
  // from the calls the wrapper has seen: host_alloc, host_free, and the event and wait calls
  // a free with streams makes (a block whose event and wait both fail is kept out of use).
  void inject() {
    if (!rng.chance(0.3)) return;
    static const expseg_vmm_call kinds[] = {
        EXPSEG_VMM_CALL_host_alloc,   EXPSEG_VMM_CALL_host_alloc,  EXPSEG_VMM_CALL_host_alloc,
        EXPSEG_VMM_CALL_host_alloc,   EXPSEG_VMM_CALL_host_free,   EXPSEG_VMM_CALL_host_free,
        EXPSEG_VMM_CALL_event_record, EXPSEG_VMM_CALL_event_create,
        EXPSEG_VMM_CALL_event_query,  EXPSEG_VMM_CALL_stream_synchronize};
    expseg_vmm_call c = kinds[rng.below(sizeof kinds / sizeof *kinds)];
    uint64_t nth = _expseg_fault_seen(faults->fault, c) + 1 + rng.below(2);
    faults->fail(c, nth, 1 + rng.below(3),
                 rng.chance(0.5) ? EXPSEG_ERR_OUT_OF_MEMORY : EXPSEG_ERR_DRIVER);
  }

  uintptr_t any_live() {
    auto it = live.begin();
    std::advance(it, (long)rng.below(live.size()));
    return it->first;
  }

  void release(expseg_stream s) {
    hold(h, s, false);
    held.erase(s);
    for (auto it = busy.begin(); it != busy.end();) {
      it->second.held.erase(s);
      it = it->second.held.empty() ? busy.erase(it) : std::next(it);
    }
  }

  void free_one(uintptr_t p, const std::string &where) {
    if (faults) inject();
    Live &l = live[p];
    if (patterns) {
      EXPECT_TRUE(intact((void *)p, l.size, l.tag)) << where << ": bytes of 0x" << std::hex << p
                                                    << " changed";
    }
    Busy b{l.size, {}};
    for (expseg_stream s : l.streams)
      if (held.count(s)) b.held.insert(s);
    live.erase(p);
    ASSERT_EQ(expseg_host_free(h, (void *)p), EXPSEG_OK) << where << ": " << expseg_last_error();
    if (!b.held.empty()) busy[p] = b;
  }

  // One step; returns false on a fatal failure.
  void step(uint64_t i) {
    std::string where = "step " + std::to_string(i);
    uint64_t r = rng.below(100);
    int64_t live_bytes = 0;
    for (const auto &kv : live) live_bytes += (int64_t)kv.second.size;
    if (r < 45 && live_bytes < 96 * (int64_t)MiB) {
      size_t n = rng.chance(0.02) ? 0 : pick_size();
      void *p = nullptr;
      if (faults) inject();
      expseg_status st = expseg_host_malloc(h, n, &p);
      mallocs += n > 0;
      if (faults && st != EXPSEG_OK) {
        std::string msg = expseg_last_error();
        EXPECT_TRUE(st == EXPSEG_ERR_OUT_OF_MEMORY || st == EXPSEG_ERR_DRIVER)
            << where << ": " << msg;
        EXPECT_NE(msg.find("expseg_host_malloc(size="), std::string::npos) << where << ": " << msg;
        EXPECT_NE(msg.find("host_alloc"), std::string::npos) << where << ": " << msg;
        EXPECT_EQ(p, nullptr) << where;
        failed_mallocs++;
        expect_stats(h, live, where);
        return;
      }
      ASSERT_EQ(st, EXPSEG_OK) << where << " size " << n << ": " << expseg_last_error();
      if (n == 0) {
        EXPECT_EQ(p, nullptr);
        return;
      }
      ASSERT_NE(p, nullptr);
      EXPECT_EQ((uintptr_t)p % 4096, 0u) << where;
      check_new((uintptr_t)p, n, where + " size " + std::to_string(n));
      uint8_t tag = next_tag++;
      if (patterns) fill(p, n, tag);
      live[(uintptr_t)p] = Live{n, tag, {}};
    } else if (r < 80 && !live.empty()) {
      free_one(any_live(), where);
    } else if (r < 90 && !live.empty()) {
      expseg_stream s = 1 + rng.below(3);
      if (can_hold && !held.count(s) && rng.chance(0.5)) {
        hold(h, s, true);
        held.insert(s);
      }
      uintptr_t p = any_live();
      ASSERT_EQ(expseg_host_record_stream(h, (void *)p, s), EXPSEG_OK) << where;
      live[p].streams.insert(s);
    } else if (r < 94 && !held.empty()) {
      auto it = held.begin();
      std::advance(it, (long)rng.below(held.size()));
      release(*it);
    } else if (r < 97) {
      ASSERT_EQ(expseg_host_empty_cache(h), EXPSEG_OK) << where;
    } else if (r < 99) {
      expseg_host_reset_peak_stats(h);
    } else {
      bool on = rng.chance(0.7);
      ASSERT_EQ(expseg_host_record_history(h, on, 1 + rng.below(40), 0), EXPSEG_OK) << where;
    }
    if (snap && rng.chance(0.02)) {
      unsigned char *buf = nullptr;
      size_t len = 0;
      ASSERT_EQ(expseg_snapshot_with_host(snap, h, rng.chance(0.5) ? EXPSEG_SNAPSHOT_NO_TRACES : 0,
                                          &buf, &len),
                EXPSEG_OK)
          << where << ": " << expseg_last_error();
      EXPECT_GT(len, 0u);
      expseg_snapshot_free(buf);
    }
    expect_stats(h, live, where);
    EXPECT_EQ(hstat(h, "expseg.hits") + hstat(h, "expseg.misses") +
                  hstat(h, "expseg.reserve_allocs"),
              mallocs) << where << ": a malloc not counted once as hit, reserve slice or miss";
    if (i % 16 == 0) expect_walk(h, live, where);
  }

  // Frees everything, releases every stream, empties the cache: what stays is the reserve.
  void finish() {
    while (!live.empty()) free_one(live.begin()->first, "finish");
    while (!held.empty()) release(*held.begin());
    ASSERT_EQ(expseg_host_empty_cache(h), EXPSEG_OK);
    expect_stats(h, live, "finish");
    expect_walk(h, live, "finish");
    int64_t reserve = hstat(h, "expseg.reserve_segment_bytes");
    EXPECT_EQ(hstat(h, "reserved_bytes.current"), reserve);
    EXPECT_EQ(hstat(h, "segment.current"), reserve ? 1 : 0);
    EXPECT_EQ(hstat(h, "allocation.current"), 0);
    EXPECT_EQ(hstat(h, "expseg.pending_blocks.current"), 0);
    EXPECT_EQ(hstat(h, "expseg.pending_events"), 0);
  }
};

struct Combo {
  const char *config;
  size_t thr, maxc;
};

const Combo kCombos[] = {
    {"", SIZE_MAX, SIZE_MAX},
    {"pinned_max_round_threshold_mb:1,pinned_max_cached_size_mb:8", 1 * MiB, 8 * MiB},
    {"pinned_max_round_threshold_mb:1,pinned_max_cached_size_mb:8,pinned_carve_strict:True",
     1 * MiB, 8 * MiB},
    {"pinned_max_round_threshold_mb:0", 0, SIZE_MAX},
    {"pinned_max_round_threshold_mb:0,pinned_carve_strict:True,pinned_huge_pages:False", 0,
     SIZE_MAX},
    {"pinned_max_round_threshold_mb:1,pinned_max_cached_size_mb:0", 1 * MiB, 0},
    {"pinned_max_round_threshold_mb:5,pinned_max_cached_size_mb:3", 5 * MiB, 3 * MiB},
    {"pinned_max_round_threshold_mb:3,pinned_max_cached_size_mb:7,pinned_reserve_segment_size_mb:5",
     3 * MiB, 7 * MiB},
    {"pinned_max_round_threshold_mb:1,pinned_reserve_segment_size_mb:3,"
     "pinned_use_background_threads:True",
     1 * MiB, SIZE_MAX},
    {"pinned_max_cached_size_mb:2,pinned_use_background_threads:True", SIZE_MAX, 2 * MiB},
    {"pinned_max_round_threshold_mb:2,pinned_max_cached_size_mb:4,pinned_use_cuda_host_register:"
     "True,pinned_num_register_threads:4,pinned_huge_pages:False",
     2 * MiB, 4 * MiB},
};

void run_random(const char *driver, uint64_t seed, uint64_t ops) {
  for (const Combo &c : kCombos) {
    SCOPED_TRACE(std::string(driver) + " / '" + c.config + "'");
    PoolPtr p = make_pool(driver, c.config);
    ASSERT_TRUE(p);
    // the test's own view of the thresholds must be the pool's
    ASSERT_EQ(p->cfg.pinned_max_round_threshold, c.thr);
    ASSERT_EQ(p->cfg.pinned_max_cached_size, c.maxc);
    Program prog(p.get(), true, seed, c.thr, c.maxc);
    AllocPtr a = make_alloc("sim", "");
    prog.snap = a.get();
    for (uint64_t i = 0; i < ops && !testing::Test::HasFatalFailure(); i++) prog.step(i);
    if (!testing::Test::HasFatalFailure()) prog.finish();
    if (testing::Test::HasFailure()) return; // one combination's failures are enough
  }
}

// host_alloc and host_free failing at random points: a failed malloc says which request
// and which driver call, the pool keeps working with its statistics consistent, and once
// the driver works again everything goes back (failed give-backs were kept and retried).
TEST(Adv14Host, RandomDriverFailures) {
  QuietLog quiet; // a failed give-back warns
  EXPSEG_SEEDED(seed, 1403);
  uint64_t failed = 0, stuck = 0;
  for (size_t k : {0, 1, 2, 3, 5, 6, 7, 8}) {
    const Combo &c = kCombos[k];
    SCOPED_TRACE(std::string("fault(sim) / '") + c.config + "'");
    FaultPool f(c.config, "sim");
    ASSERT_TRUE(f.h);
    Program prog(f.h.get(), true, seed + k, c.thr, c.maxc);
    prog.faults = &f;
    for (uint64_t i = 0; i < test_ops(600) && !HasFatalFailure(); i++) prog.step(i);
    prog.faults = nullptr; // no more failures: everything must go back now
    _expseg_fault_set_rules(f.fault, nullptr, 0);
    stuck += hstat(f.h.get(), "expseg.stream_syncs") > 0;
    if (!HasFatalFailure()) prog.finish();
    EXPECT_EQ(hstat(f.h.get(), "expseg.stuck_blocks"), 0);
    failed += prog.failed_mallocs;
    if (HasFailure()) return;
  }
  std::printf("%llu mallocs failed; %llu runs waited for a stream\n", (unsigned long long)failed,
              (unsigned long long)stuck);
  EXPECT_GT(stuck, 0u) << "no event failed: the injection missed";
  EXPECT_GT(failed, 0u) << "no malloc failed: the injection missed";
}

TEST(Adv14Host, RandomProgramsSim) {
  EXPSEG_SEEDED(seed, 1401);
  run_random("sim", seed, test_ops(1500));
}

TEST(Adv14Host, RandomProgramsHost) {
  QuietLog quiet; // mlock past RLIMIT_MEMLOCK warns once
  EXPSEG_SEEDED(seed, 1402);
  run_random("host", seed, test_ops(1000));
}

// Sizes at and above the 2^60 bound, NULL pools, and pointers freed while a stream still
// holds them (pending), merged away, or whose segment went back: each refused with its value
// named and nothing changed; the pool then works as before.
TEST(Adv14Host, BadInputNamesTheValueAndChangesNothing) {
  QuietLog quiet;
  for (const char *driver : {"sim", "host"}) {
    SCOPED_TRACE(driver);
    PoolPtr p = make_pool(driver, "pinned_max_round_threshold_mb:1,pinned_max_cached_size_mb:8");
    expseg_host_pool *h = p.get();
    void *a = nullptr, *b = nullptr, *c = nullptr, *x = nullptr;
    ASSERT_EQ(expseg_host_malloc(h, 7 * MiB, &x), EXPSEG_OK); // a carve segment of 7 MiB
    ASSERT_EQ(expseg_host_free(h, x), EXPSEG_OK);
    ASSERT_EQ(expseg_host_malloc(h, 2 * MiB + 1, &a), EXPSEG_OK); // carved from it
    ASSERT_EQ(expseg_host_malloc(h, 3 * MiB, &b), EXPSEG_OK);     // carved, after a
    ASSERT_EQ((uintptr_t)b, (uintptr_t)a + 2 * MiB + 4096);
    ASSERT_EQ(expseg_host_malloc(h, 5000, &c), EXPSEG_OK);        // a power of two
    fill(a, 2 * MiB + 1, 1);
    fill(b, 3 * MiB, 2);
    StatMap before = host_stat_map(h);
    void *o = &before;
    const size_t bound = size_t(1) << 60;
    for (size_t n : {SIZE_MAX, SIZE_MAX - 4095, bound + 1, SIZE_MAX / 2}) {
      o = &before;
      expect_host_refused(h, expseg_host_malloc(h, n, &o), EXPSEG_ERR_INVALID_ARGUMENT, before,
                          {std::to_string(n), "2^60"}, "malloc of " + std::to_string(n));
      EXPECT_EQ(o, nullptr) << n;
    }
    // NULL pool at every entry point: the call named
    expect_host_refused(h, expseg_host_malloc(nullptr, 64, &o), EXPSEG_ERR_INVALID_ARGUMENT, before,
                        {"expseg_host_malloc", "NULL"}, "malloc on NULL");
    expect_host_refused(h, expseg_host_free(nullptr, a), EXPSEG_ERR_INVALID_ARGUMENT, before,
                        {"expseg_host_free", "NULL"}, "free on NULL");
    expect_host_refused(h, expseg_host_record_stream(nullptr, a, 1), EXPSEG_ERR_INVALID_ARGUMENT,
                        before, {"expseg_host_record_stream", "NULL"}, "record on NULL");
    expect_host_refused(h, expseg_host_empty_cache(nullptr), EXPSEG_ERR_INVALID_ARGUMENT, before,
                        {"expseg_host_empty_cache", "NULL"}, "empty_cache on NULL");
    int64_t v = 0;
    expect_host_refused(h, expseg_host_stat(nullptr, "allocation.current", &v),
                        EXPSEG_ERR_INVALID_ARGUMENT, before, {"expseg_host_stat", "NULL"},
                        "stat on NULL");
    expect_host_refused(h, expseg_host_record_history(nullptr, true, 4, 0),
                        EXPSEG_ERR_INVALID_ARGUMENT, before, {"expseg_host_record_history", "NULL"},
                        "record_history on NULL");
    expect_host_refused(h, expseg_host_record_history(h, true, 0, 0), EXPSEG_ERR_INVALID_ARGUMENT,
                        before, {"max_entries"}, "history of 0 entries");
    expect_host_refused(h, expseg_host_record_history(h, true, 4, 0x80000000u),
                        EXPSEG_ERR_INVALID_ARGUMENT, before, {"0x80000000"},
                        "unknown history flag");
    expect_host_refused(h, expseg_host_stat(h, "allocation.nope", &v), EXPSEG_ERR_INVALID_ARGUMENT,
                        before, {"allocation.nope"}, "unknown key");
    expect_host_refused(h, expseg_host_stat(h, nullptr, &v), EXPSEG_ERR_INVALID_ARGUMENT, before,
                        {"NULL"}, "NULL key");
    expseg_host_reset_peak_stats(nullptr);
    expseg_host_stats_foreach(nullptr, stat_map_put, &before);
    expseg_host_stats_foreach(h, nullptr, nullptr);

    // a freed while stream 5 is held: pending; freeing or recording it again is refused
    hold(h, 5, true);
    ASSERT_EQ(expseg_host_record_stream(h, a, 5), EXPSEG_OK);
    ASSERT_EQ(expseg_host_free(h, a), EXPSEG_OK);
    EXPECT_EQ(hstat(h, "expseg.pending_blocks.current"), 1);
    before = host_stat_map(h);
    expect_host_refused(h, expseg_host_free(h, a), EXPSEG_ERR_INVALID_ARGUMENT, before,
                        {ptr_text(a), "already freed"}, "free of a pending block");
    expect_host_refused(h, expseg_host_record_stream(h, a, 6), EXPSEG_ERR_INVALID_ARGUMENT, before,
                        {ptr_text(a), "already freed"}, "record_stream on a pending block");
    // the same size again while a is pending: never a's bytes
    void *d = nullptr;
    ASSERT_EQ(expseg_host_malloc(h, 2 * MiB + 1, &d), EXPSEG_OK);
    EXPECT_FALSE(overlaps((uintptr_t)d, 2 * MiB + 1, (uintptr_t)a, 2 * MiB + 1));
    // b freed next to pending a: b merges with the free tail, not with a, so 6 MiB does not
    // fit in the segment
    ASSERT_EQ(expseg_host_free(h, b), EXPSEG_OK);
    void *e = nullptr;
    ASSERT_EQ(expseg_host_malloc(h, 6 * MiB, &e), EXPSEG_OK);
    EXPECT_FALSE(overlaps((uintptr_t)e, 6 * MiB, (uintptr_t)a, 2 * MiB + 1))
        << "a block still used by a stream was merged and handed out";
    hold(h, 5, false);
    void *f = nullptr; // a malloc processes the events: a's block is free, still cached
    ASSERT_EQ(expseg_host_malloc(h, 100, &f), EXPSEG_OK);
    ASSERT_EQ(expseg_host_free(h, f), EXPSEG_OK);
    EXPECT_EQ(hstat(h, "expseg.pending_blocks.current"), 0);
    before = host_stat_map(h);
    expect_host_refused(h, expseg_host_free(h, a), EXPSEG_ERR_INVALID_ARGUMENT, before,
                        {ptr_text(a), "already freed"}, "free of a completed block");
    // every carved block gone and the cache emptied: the segments went back; a's pointer is
    // no longer the pool's
    ASSERT_EQ(expseg_host_free(h, d), EXPSEG_OK);
    ASSERT_EQ(expseg_host_free(h, e), EXPSEG_OK);
    ASSERT_EQ(expseg_host_empty_cache(h), EXPSEG_OK);
    EXPECT_EQ(hstat(h, "reserved_bytes.current"), hstat(h, "allocated_bytes.current") +
                                                      hstat(h, "expseg.cached_bytes.current"));
    before = host_stat_map(h);
    expect_host_refused(h, expseg_host_free(h, a), EXPSEG_ERR_INVALID_ARGUMENT, before,
                        {ptr_text(a), "not a pointer this host pool handed out"},
                        "free after the segment went back");
    expect_host_refused(h, expseg_host_record_stream(h, a, 1), EXPSEG_ERR_INVALID_ARGUMENT, before,
                        {ptr_text(a), "expseg_record_stream"},
                        "record after the segment went back");
    // another pool's pointer, sent to it
    PoolPtr q = make_pool(driver, "");
    void *qa = nullptr;
    ASSERT_EQ(expseg_host_malloc(q.get(), 100, &qa), EXPSEG_OK);
    expect_host_refused(h, expseg_host_free(h, qa), EXPSEG_ERR_INVALID_ARGUMENT, before,
                        {ptr_text(qa), "another host pool"}, "free of another pool's pointer");
    EXPECT_EQ(expseg_host_free(q.get(), qa), EXPSEG_OK);
    // the pool still works
    ASSERT_EQ(expseg_host_free(h, c), EXPSEG_OK);
    ASSERT_EQ(expseg_host_malloc(h, 2 * MiB + 1, &a), EXPSEG_OK);
    fill(a, 2 * MiB + 1, 9);
    EXPECT_TRUE(intact(a, 2 * MiB + 1, 9));
    ASSERT_EQ(expseg_host_free(h, a), EXPSEG_OK);
  }
}

// 2^60 bytes is accepted as a request and refused by the driver: out of memory, with the
// size named, and the pool goes on.
TEST(Adv14Host, LargestRequestIsRefusedByTheDriver) {
  QuietLog quiet;
  for (const char *config : {"", "pinned_max_round_threshold_mb:0",
                             "pinned_max_cached_size_mb:1"}) {
    for (const char *driver : {"sim", "host"}) {
      SCOPED_TRACE(std::string(driver) + " / " + config);
      PoolPtr p = make_pool(driver, config);
      void *o = nullptr;
      expseg_status st = expseg_host_malloc(p.get(), size_t(1) << 60, &o);
      std::string msg = expseg_last_error();
      EXPECT_TRUE(st == EXPSEG_ERR_OUT_OF_MEMORY || st == EXPSEG_ERR_DRIVER) << msg;
      EXPECT_EQ(o, nullptr);
      EXPECT_NE(msg.find("expseg_host_malloc(size="), std::string::npos) << msg;
      expect_stats(p.get(), {}, "after 2^60");
      EXPECT_EQ(hstat(p.get(), "reserved_bytes.current"), 0);
      ASSERT_EQ(expseg_host_malloc(p.get(), 3 * MiB, &o), EXPSEG_OK);
      EXPECT_EQ(expseg_host_free(p.get(), o), EXPSEG_OK);
    }
  }
}

// Four threads on one pool (carved, power-of-two and own-chunk sizes; with and without the
// background thread; empty_cache and snapshots from any thread): a block another thread holds
// is never handed out, and each thread's bytes survive.
TEST(Adv14Host, ThreadsNeverShareABlock) {
  EXPSEG_SEEDED(seed, 1404);
  for (const char *config :
       {"pinned_max_round_threshold_mb:1,pinned_max_cached_size_mb:6",
        "pinned_max_round_threshold_mb:0,pinned_carve_strict:True,"
        "pinned_use_background_threads:True",
        "pinned_max_round_threshold_mb:1,pinned_max_cached_size_mb:2,"
        "pinned_reserve_segment_size_mb:3,pinned_use_background_threads:True"}) {
    SCOPED_TRACE(config);
    PoolPtr p = make_pool("sim", config);
    expseg_host_pool *h = p.get();
    std::mutex mu; // guards ranges: every block some thread holds now
    std::map<uintptr_t, size_t> ranges;
    std::atomic<int> bad{0};
    auto worker = [&](uint64_t tseed) {
      TestRng rng(tseed);
      std::vector<std::pair<void *, size_t>> mine;
      for (uint64_t i = 0; i < test_ops(600); i++) {
        uint64_t r = rng.below(100);
        if (r < 50 && mine.size() < 24) {
          size_t n = rng.chance(0.5) ? 1 + rng.below(1 * MiB + 4096) : 1 + rng.below(7 * MiB);
          void *q = nullptr;
          if (expseg_host_malloc(h, n, &q) != EXPSEG_OK) {
            bad++;
            continue;
          }
          {
            std::lock_guard<std::mutex> g(mu);
            auto it = ranges.upper_bound((uintptr_t)q);
            if (it != ranges.end() && it->first < (uintptr_t)q + n) bad++;
            if (it != ranges.begin() && std::prev(it)->first + std::prev(it)->second > (uintptr_t)q)
              bad++;
            ranges[(uintptr_t)q] = n;
          }
          fill(q, n, (uint8_t)tseed);
          mine.push_back({q, n});
        } else if (r < 90 && !mine.empty()) {
          size_t k = rng.below(mine.size());
          auto [q, n] = mine[k];
          if (!intact(q, n, (uint8_t)tseed)) bad++;
          if (rng.chance(0.3)) (void)expseg_host_record_stream(h, q, 1 + rng.below(3));
          {
            std::lock_guard<std::mutex> g(mu);
            ranges.erase((uintptr_t)q);
          }
          if (expseg_host_free(h, q) != EXPSEG_OK) bad++;
          mine[k] = mine.back();
          mine.pop_back();
        } else if (r < 95) {
          (void)expseg_host_empty_cache(h);
        } else {
          std::vector<WalkSeg> w = walk(h).segs;
          (void)w;
        }
      }
      for (auto [q, n] : mine) {
        if (!intact(q, n, (uint8_t)tseed)) bad++;
        {
          std::lock_guard<std::mutex> g(mu);
          ranges.erase((uintptr_t)q);
        }
        if (expseg_host_free(h, q) != EXPSEG_OK) bad++;
      }
    };
    std::vector<std::thread> ts;
    for (uint64_t t = 0; t < 4; t++) ts.emplace_back(worker, seed * 16 + t + 1);
    for (std::thread &t : ts) t.join();
    EXPECT_EQ(bad.load(), 0) << "overlaps, changed bytes or failed calls";
    ASSERT_EQ(expseg_host_empty_cache(h), EXPSEG_OK);
    expect_stats(h, {}, "after the threads");
    expect_walk(h, {}, "after the threads");
    EXPECT_EQ(hstat(h, "reserved_bytes.current"), hstat(h, "expseg.reserve_segment_bytes"));
  }
}

// A block kept out of use (no event, and the wait failed: its stream is still busy) when
// the driver then runs out of memory: the retry waits for the block's stream again, which
// fails again; the caller's message is still the driver's out-of-memory, not that wait's.
TEST(Adv14Host, OutOfMemoryMessageSurvivesTheRetryOfAStuckBlock) {
  QuietLog quiet;
  for (const char *config : {"", "pinned_max_round_threshold_mb:0"}) {
    SCOPED_TRACE(config);
    FaultPool f(config, "sim");
    expseg_host_pool *h = f.h.get();
    void *a = nullptr, *b = nullptr;
    ASSERT_EQ(expseg_host_malloc(h, 100 * KiB, &a), EXPSEG_OK);
    hold(h, 1, true);
    ASSERT_EQ(expseg_host_record_stream(h, a, 1), EXPSEG_OK);
    f.fail(EXPSEG_VMM_CALL_event_record,
           _expseg_fault_seen(f.fault, EXPSEG_VMM_CALL_event_record) + 1, 1, EXPSEG_ERR_DRIVER);
    ASSERT_EQ(expseg_host_free(h, a), EXPSEG_OK);
    EXPECT_EQ(hstat(h, "expseg.stuck_blocks"), 1);
    f.fail(EXPSEG_VMM_CALL_host_alloc, _expseg_fault_seen(f.fault, EXPSEG_VMM_CALL_host_alloc) + 1,
           2, EXPSEG_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(expseg_host_malloc(h, 3 * MiB, &b), EXPSEG_ERR_OUT_OF_MEMORY);
    std::string msg = expseg_last_error();
    EXPECT_NE(msg.find("expseg_host_malloc(size=3.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("host_alloc"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("stream_synchronize"), std::string::npos) << msg;
    EXPECT_EQ(hstat(h, "expseg.stuck_blocks"), 1) << "the block's stream is still held";
    EXPECT_EQ(b, nullptr);
    hold(h, 1, false);
    ASSERT_EQ(expseg_host_empty_cache(h), EXPSEG_OK);
    EXPECT_EQ(hstat(h, "expseg.stuck_blocks"), 0);
    EXPECT_EQ(hstat(h, "allocation.current"), 0);
    EXPECT_EQ(hstat(h, "reserved_bytes.current"), 0);
  }
}

// While one thread's frees give chunks back (blocks above pinned_max_cached_size_mb, and carve
// segments emptied by empty_cache), the pool's walk from another thread shows every chunk
// reserved_bytes counts: a chunk on its way back is still the pool's until the driver took it.
TEST(Adv14Host, ChunksBeingGivenBackStayInTheWalk) {
  for (const char *config : {"pinned_max_cached_size_mb:1",
                             "pinned_max_round_threshold_mb:0,pinned_carve_strict:True"}) {
    SCOPED_TRACE(config);
    PoolPtr p = make_pool("sim", config);
    expseg_host_pool *h = p.get();
    std::atomic<bool> stop{false};
    std::thread churn([&] {
      while (!stop) {
        void *q = nullptr;
        if (expseg_host_malloc(h, 2 * MiB + 4096, &q) != EXPSEG_OK) continue;
        (void)expseg_host_free(h, q);
        (void)expseg_host_empty_cache(h);
      }
    });
    int mismatches = 0, reads = 0;
    auto t_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
    while (std::chrono::steady_clock::now() < t_end && mismatches == 0) {
      // num_host_alloc and num_host_free only grow: unchanged, no chunk was made or given
      // back between the reads
      int64_t made = hstat(h, "num_host_alloc"), gone = hstat(h, "num_host_free");
      int64_t before = hstat(h, "reserved_bytes.current");
      WalkOut w = walk(h);
      if (hstat(h, "num_host_alloc") != made || hstat(h, "num_host_free") != gone) continue;
      int64_t total = 0;
      for (const WalkSeg &g : w.segs) total += (int64_t)g.total;
      reads++;
      if (total != before) {
        mismatches++;
        ADD_FAILURE() << "the walk holds " << total << " bytes, reserved_bytes " << before;
      }
    }
    stop = true;
    churn.join();
    int64_t given_back = hstat(h, "num_host_free");
    std::printf("%d steady reads, %lld chunks given back\n", reads, (long long)given_back);
    EXPECT_GT(reads, 0);
    if (mismatches == 0) {
      EXPECT_GT(given_back, 10) << "the churning thread hardly ran";
    }
    expect_walk(h, {}, "after the churn");
  }
}

} // namespace
