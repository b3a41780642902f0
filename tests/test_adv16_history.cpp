// SPDX-License-Identifier: Apache-2.0
// test_adv16_history.cpp: the history and snapshot calls attacked from their contract
// (docs/snapshots.md): pushed frames deeper than the thread's ring then popped back, pops
// past the bottom; the event ring at bounds 1, 2, 3, 7 and odd sizes, re-enabled with
// other bounds and toggled off, against a reference run kept whole; snapshots that must
// agree with the statistics per pool and per stream (private pools, record_stream,
// sleeping regions, expandable segments after empty_cache) in a seeded random program;
// snapshots taken while other threads allocate; odd and huge text opened by both viewers'
// unpicklers and _memory_viz.py; tracebacks of freed, interior and foreign pointers;
// dumps to paths that cannot be written; memory_summary's frame with counts past a
// million; and host memory running out at every allocation a snapshot, a dump or a walk
// makes.
#include <gtest/gtest.h>

#include "alloc_support.h"
#include "expseg.h"
#include "host_fail.h"
#include "snapshot_check.h"
#include "test_seed.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

const std::string kViewerDir = EXPSEG_SOURCE_DIR "/../shared/reference/pytorch-viewer";

struct Ev {
  std::string action;
  uint64_t addr = 0, size = 0, stream = 0;
  std::string frames; // "file:line:name;" each, innermost first
};

// The events of the newest device list of the snapshot at path, read by Python's pickle.
std::vector<Ev> pickle_events(const std::string &path, std::string *err) {
  std::string out;
  int rc = snapshot_run(
      "python3 -c \"import pickle,sys\n"
      "d=pickle.load(open(sys.argv[1],'rb'))\n"
      "for e in d['device_traces'][-1]:\n"
      "  fr=';'.join('%s:%d:%s'%(f['filename'],f['line'],f['name']) for f in e['frames'])\n"
      "  print(e['action'], e.get('addr', e.get('device_free')), e['size'], e['stream'], fr+';')\n"
      "\" '" + path + "'",
      &out);
  std::vector<Ev> v;
  if (rc != 0) {
    *err = out;
    return v;
  }
  std::istringstream in(out);
  Ev e;
  while (in >> e.action >> e.addr >> e.size >> e.stream >> e.frames) v.push_back(e);
  return v;
}

// The walk's events (action, addr, size, stream; no frames).
std::vector<Ev> walk_events(expseg_allocator *a) {
  std::vector<Ev> v;
  EXPECT_EQ(expseg_walk(
                a, nullptr,
                [](void *ctx, const expseg_walk_event *e) {
                  Ev x;
                  x.action = e->action;
                  x.addr = e->addr;
                  x.size = e->size;
                  x.stream = e->stream;
                  static_cast<std::vector<Ev> *>(ctx)->push_back(x);
                },
                &v),
            EXPSEG_OK)
      << expseg_last_error();
  return v;
}

std::string ev_text(const Ev &e) {
  return e.action + " " + std::to_string(e.size) + " " + std::to_string(e.stream);
}

std::string tmp_path(const std::string &name) {
  return ::testing::TempDir() + "adv16_" + std::to_string(getpid()) + "_" + name;
}

// ---- pushed frames ----

// A thread pushes deeper than its ring of pushed frames (256), pops back to a shallow
// depth: the events after carry the frames pushed at that depth, not later ones.
TEST(Adv16History, FramesPoppedBackFromADeepPushAreTheShallowOnes) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, 0), EXPSEG_OK);
  std::vector<std::string> names;
  for (int i = 0; i < 300; i++) names.push_back("fn" + std::to_string(i));
  std::vector<expseg_frame> f;
  for (int i = 0; i < 300; i++) f.push_back({"deep.py", names[i].c_str(), i});
  ASSERT_EQ(expseg_history_push_frames(f.data(), 300), EXPSEG_OK) << expseg_last_error();
  void *deep, *shallow;
  ASSERT_EQ(expseg_malloc(a, 4096, 0, &deep), EXPSEG_OK);
  expseg_history_pop_frames(297); // three left: fn0 (outermost), fn1, fn2
  ASSERT_EQ(expseg_malloc(a, 8192, 0, &shallow), EXPSEG_OK);
  expseg_history_pop_frames(3);
  char buf[8192];
  size_t need = 0;
  ASSERT_EQ(expseg_allocation_traceback(a, deep, buf, sizeof buf, &need), EXPSEG_OK)
      << expseg_last_error();
  EXPECT_EQ(std::string(buf).substr(0, 38), "deep.py:299:fn299\ndeep.py:298:fn298\nde")
      << buf;
  ASSERT_EQ(expseg_allocation_traceback(a, shallow, buf, sizeof buf, &need), EXPSEG_OK);
  EXPECT_STREQ(buf, "deep.py:2:fn2\ndeep.py:1:fn1\ndeep.py:0:fn0\n")
      << "popped back to depth 3 after pushing 300";
  EXPECT_EQ(expseg_free(a, deep), EXPSEG_OK);
  EXPECT_EQ(expseg_free(a, shallow), EXPSEG_OK);
}

// Pops with nothing pushed, then balanced pushes: the events carry exactly what is pushed.
TEST(Adv16History, UnbalancedPopsLeaveAnEmptyStack) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, 0), EXPSEG_OK);
  expseg_history_pop_frames(1);
  expseg_history_pop_frames(SIZE_MAX);
  EXPECT_EQ(expseg_history_push_frames(nullptr, 0), EXPSEG_OK);
  expseg_frame f[2] = {{"a.py", "outer", 1}, {"b.py", "inner", 2}};
  ASSERT_EQ(expseg_history_push_frames(f, 2), EXPSEG_OK);
  void *p;
  ASSERT_EQ(expseg_malloc(a, 512, 0, &p), EXPSEG_OK);
  char buf[1024];
  size_t need = 0;
  ASSERT_EQ(expseg_allocation_traceback(a, p, buf, sizeof buf, &need), EXPSEG_OK);
  EXPECT_STREQ(buf, "b.py:2:inner\na.py:1:outer\n");
  EXPECT_EQ(need, strlen(buf) + 1);
  expseg_history_pop_frames(5);
  void *q;
  ASSERT_EQ(expseg_malloc(a, 512, 0, &q), EXPSEG_OK);
  ASSERT_EQ(expseg_allocation_traceback(a, q, buf, sizeof buf, &need), EXPSEG_OK);
  EXPECT_STREQ(buf, "");
  EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
  EXPECT_EQ(expseg_free(a, q), EXPSEG_OK);
}

// ---- the ring against a reference run ----

// One deterministic program; `bounds` (empty: SIZE_MAX throughout) re-enables the history
// with each bound at the op index given. Returns the walk's events at the end.
std::vector<Ev> ring_program(const std::vector<std::pair<int, size_t>> &bounds, bool toggle,
                             std::vector<Ev> *pickled, std::string *err) {
  AllocPtr al = make_alloc("sim", "expandable_segments:True");
  expseg_allocator *a = al.get();
  EXPECT_EQ(expseg_record_history_ex(a, true, SIZE_MAX, 0), EXPSEG_OK);
  TestRng r(1616);
  std::vector<void *> live;
  for (int op = 0; op < 400; op++) {
    for (auto &b : bounds) {
      if (b.first == op) {
        EXPECT_EQ(expseg_record_history_ex(a, true, b.second, 0), EXPSEG_OK);
      }
    }
    if (toggle && op == 200) {
      EXPECT_EQ(expseg_record_history(a, false, 0), EXPSEG_OK);
      EXPECT_EQ(expseg_record_history_ex(a, true, SIZE_MAX, 0), EXPSEG_OK);
    }
    uint64_t k = r.below(10);
    if (k < 5 || live.empty()) {
      void *p;
      size_t sz = r.chance(0.3) ? (size_t)(1 + r.below(8)) << 20 : 1 + r.below(100000);
      EXPECT_EQ(expseg_malloc(a, sz, r.below(3), &p), EXPSEG_OK);
      live.push_back(p);
    } else if (k < 9) {
      size_t i = r.below(live.size());
      EXPECT_EQ(expseg_free(a, live[i]), EXPSEG_OK);
      live.erase(live.begin() + (long)i);
    } else if (k == 9) {
      EXPECT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    }
  }
  std::string path = tmp_path("ring.pickle");
  EXPECT_EQ(expseg_snapshot_dump(a, path.c_str()), EXPSEG_OK) << expseg_last_error();
  *pickled = pickle_events(path, err);
  unlink(path.c_str());
  std::vector<Ev> w = walk_events(a);
  for (void *p : live) EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
  return w;
}

void expect_suffix(const std::vector<Ev> &full, const std::vector<Ev> &got, size_t want_n,
                   const std::string &where) {
  ASSERT_EQ(got.size(), want_n) << where;
  ASSERT_LE(got.size(), full.size()) << where;
  size_t off = full.size() - got.size();
  for (size_t i = 0; i < got.size(); i++) {
    ASSERT_EQ(ev_text(got[i]), ev_text(full[off + i]))
        << where << ": kept event " << i << " of " << got.size() << " is not the reference's "
        << off + i;
  }
}

TEST(Adv16History, RingKeepsTheNewestEventsAtEveryBound) {
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 with pickle is needed";
  std::vector<Ev> ref_pickle, got_pickle;
  std::string err;
  std::vector<Ev> ref = ring_program({}, false, &ref_pickle, &err);
  ASSERT_TRUE(err.empty()) << err;
  ASSERT_GT(ref.size(), 500u);
  // the walk sees one more snapshot event than the pickle (each records one)
  ASSERT_EQ(ref_pickle.size() + 1, ref.size());
  for (size_t bound : {(size_t)1, (size_t)2, (size_t)3, (size_t)7, (size_t)1023, (size_t)1025}) {
    SCOPED_TRACE("bound " + std::to_string(bound));
    std::vector<Ev> got = ring_program({{0, bound}}, false, &got_pickle, &err);
    ASSERT_TRUE(err.empty()) << err;
    expect_suffix(ref, got, std::min(bound, ref.size()), "walk");
    std::vector<Ev> ref_p(ref.begin(), ref.end() - 1);
    expect_suffix(ref_p, got_pickle, std::min(bound, ref_p.size()), "pickle");
  }
  // re-enabled with a smaller bound, a larger one, then an odd one: each keeps the newest
  std::vector<Ev> got =
      ring_program({{100, 5}, {150, 3000}, {300, 777}}, false, &got_pickle, &err);
  ASSERT_TRUE(err.empty()) << err;
  EXPECT_LE(got.size(), 777u);
  EXPECT_GT(got.size(), 5u);
  expect_suffix(ref, got, got.size(), "re-enabled 5, 3000, 777");
  got = ring_program({{100, 2}, {101, SIZE_MAX}}, false, &got_pickle, &err);
  ASSERT_TRUE(err.empty()) << err;
  ASSERT_LT(got.size(), ref.size());
  expect_suffix(ref, got, got.size(), "shrunk to 2 then unbounded");
  // toggled off and on mid-run: only what came after (a suffix, shorter than the whole)
  got = ring_program({}, true, &got_pickle, &err);
  ASSERT_LT(got.size(), ref.size());
  expect_suffix(ref, got, got.size(), "toggled");
}


// ---- snapshots against the statistics ----

struct SnapBlock {
  uint64_t pool, stream;
  bool asleep, large;
  std::string state;
  uint64_t size, requested;
};
struct SnapSeg {
  uint64_t pool, stream, total;
  bool asleep, large;
};

// The segments and blocks of the snapshot in buf, read by Python's pickle.
bool read_state(const unsigned char *buf, size_t len, std::vector<SnapSeg> *segs,
                std::vector<SnapBlock> *blocks, std::string *err) {
  std::string path = tmp_path("state.pickle");
  FILE *f = fopen(path.c_str(), "wb");
  if (!f || fwrite(buf, 1, len, f) != len) {
    *err = "cannot write " + path;
    if (f) fclose(f);
    return false;
  }
  fclose(f);
  std::string out;
  int rc = snapshot_run(
      "python3 -c \"import pickle,sys\n"
      "d=pickle.load(open(sys.argv[1],'rb'))\n"
      "for s in d['segments']:\n"
      "  a=int(s.get('expseg.asleep',False)); l=int(s['segment_type']=='large')\n"
      "  print('S', s['segment_pool_id'][1], s['stream'], a, l, s['total_size'], 'x', 0, 0)\n"
      "  for b in s['blocks']:\n"
      "    print('B', s['segment_pool_id'][1], s['stream'], a, l, b['size'], b['state'], "
      "b['requested_size'], len(b['frames']))\n"
      "\" '" + path + "'",
      &out);
  unlink(path.c_str());
  if (rc != 0) {
    *err = out;
    return false;
  }
  std::istringstream in(out);
  std::string kind, state;
  uint64_t pool, stream, asleep, large, size, req, nf;
  while (in >> kind >> pool >> stream >> asleep >> large >> size >> state >> req >> nf) {
    if (kind == "S")
      segs->push_back({pool, stream, size, asleep != 0, large != 0});
    else
      blocks->push_back({pool, stream, asleep != 0, large != 0, state, size, req});
  }
  return true;
}

struct Live {
  size_t req;
  expseg_stream stream;
  expseg_pool_id pool;
};

// per_stream: classic segments only (an expandable segment's free block may be lent to
// another stream: it stays in its owner's segment, under the owner's stream).
void expect_snapshot_matches_stats(expseg_allocator *a, const std::map<void *, Live> &live,
                                   bool per_stream, const std::string &where) {
  unsigned char *buf = nullptr;
  size_t len = 0;
  ASSERT_EQ(expseg_snapshot_ex(a, EXPSEG_SNAPSHOT_NO_TRACES, &buf, &len), EXPSEG_OK)
      << where << ": " << expseg_last_error();
  std::vector<SnapSeg> segs;
  std::vector<SnapBlock> blocks;
  std::string err;
  bool ok = read_state(buf, len, &segs, &blocks, &err);
  expseg_snapshot_free(buf);
  ASSERT_TRUE(ok) << where << ": " << err;
  const char *kinds[3] = {"all", "large_pool", "small_pool"};
  for (int k = 0; k < 3; k++) {
    int64_t alloc = 0, active = 0, req = 0, n_alloc = 0, n_active = 0;
    for (const SnapBlock &b : blocks) {
      if (k == 1 && !b.large) continue;
      if (k == 2 && b.large) continue;
      if (b.state == "active_allocated") alloc += (int64_t)b.size, n_alloc++;
      if (b.state != "inactive") active += (int64_t)b.size, req += (int64_t)b.requested, n_active++;
    }
    std::string p = std::string(".") + kinds[k] + ".current";
    EXPECT_EQ(alloc, stat_of(a, "allocated_bytes" + p)) << where << ": allocated_bytes" << p;
    EXPECT_EQ(active, stat_of(a, "active_bytes" + p)) << where << ": active_bytes" << p;
    EXPECT_EQ(req, stat_of(a, "requested_bytes" + p)) << where << ": requested_bytes" << p;
    EXPECT_EQ(n_alloc, stat_of(a, "allocation" + p)) << where << ": allocation" << p;
    EXPECT_EQ(n_active, stat_of(a, "active" + p)) << where << ": active" << p;
  }
  // mapped memory: segments of awake regions, plus the page cache, are reserved_bytes
  int64_t mapped = 0;
  for (const SnapSeg &g : segs)
    if (!g.asleep) mapped += (int64_t)g.total;
  EXPECT_EQ(mapped + stat_of(a, "expseg.cached_physical_bytes.current"),
            stat_of(a, "reserved_bytes.all.current"))
      << where << ": awake segments + cached pages vs reserved_bytes";
  // per pool and per stream: the live requests the program holds
  std::map<uint64_t, uint64_t> want_pool, got_pool, want_stream, got_stream;
  for (auto &kv : live) {
    want_pool[kv.second.pool] += kv.second.req;
    if (kv.second.pool == 0) want_stream[kv.second.stream] += kv.second.req;
  }
  for (const SnapBlock &b : blocks) {
    if (b.state != "active_allocated") continue;
    got_pool[b.pool] += b.requested;
    if (b.pool == 0) got_stream[b.stream] += b.requested;
  }
  EXPECT_EQ(got_pool, want_pool) << where << ": live requested bytes per pool";
  if (per_stream) {
    EXPECT_EQ(got_stream, want_stream) << where << ": live requested bytes per stream (general cache)";
  }
}

TEST(Adv16History, RandomSnapshotsAgreeWithTheStatisticsPerPoolAndStream) {
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 with pickle is needed";
  EXPSEG_SEEDED(seed, 16001);
  QuietLog quiet; // waits on the held stream warn
  for (int run = 0; run < 4; run++) {
    TestRng r(seed + (uint64_t)run);
    const bool expandable = run % 2 == 0;
    SCOPED_TRACE("run " + std::to_string(run) + (expandable ? " expandable" : " classic"));
    AllocPtr al = make_alloc("sim", expandable ? "expandable_segments:True" : "expandable_segments:False");
    ASSERT_TRUE(al);
    expseg_allocator *a = al.get();
    ASSERT_EQ(expseg_record_history_ex(a, true, 1 + r.below(200), 0), EXPSEG_OK);
    // work on stream 7 stays queued (its record_stream frees pending) until released
    ASSERT_EQ(alloc_test_hold(a, 7, true), EXPSEG_OK);
    std::map<void *, Live> live;
    std::vector<expseg_pool_id> pools;
    bool region_asleep = false;
    void *region_ptr = nullptr;
    for (int op = 0; op < 600; op++) {
      uint64_t k = r.below(100);
      std::string where = "op " + std::to_string(op);
      if (k < 40 || live.empty()) {
        size_t sz = r.chance(0.3) ? (size_t)(1 + r.below(12)) << 20 : 1 + r.below(300000);
        expseg_stream st = r.below(3);
        expseg_pool_id pool = 0;
        if (!pools.empty() && r.chance(0.3)) pool = pools[r.below(pools.size())];
        void *p = nullptr;
        ASSERT_EQ(expseg_malloc_pool(a, sz, st, pool, &p), EXPSEG_OK) << expseg_last_error();
        live[p] = {sz, st, pool};
      } else if (k < 70) {
        auto it = live.begin();
        std::advance(it, (long)r.below(live.size()));
        if (it->first == region_ptr) continue;
        if (r.chance(0.3)) {
          ASSERT_EQ(expseg_record_stream(a, it->first, 7), EXPSEG_OK);
        }
        ASSERT_EQ(expseg_free(a, it->first), EXPSEG_OK);
        live.erase(it);
      } else if (k < 74) {
        ASSERT_EQ(alloc_test_hold(a, 7, false), EXPSEG_OK);
        ASSERT_EQ(expseg_synchronize(a), EXPSEG_OK);
        ASSERT_EQ(alloc_test_hold(a, 7, true), EXPSEG_OK);
      } else if (k < 77) {
        ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
      } else if (k < 79 && pools.size() < 4) {
        expseg_pool_id id;
        ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK);
        pools.push_back(id);
      } else if (k < 81 && !pools.empty()) {
        ASSERT_EQ(expseg_pool_empty_cache(a, pools[r.below(pools.size())]), EXPSEG_OK);
      } else if (k < 83 && expandable) {
        if (region_ptr == nullptr) {
          ASSERT_EQ(expseg_region_begin(a, "weights"), EXPSEG_OK) << expseg_last_error();
          ASSERT_EQ(expseg_malloc(a, (size_t)(1 + r.below(6)) << 20, 0, &region_ptr), EXPSEG_OK);
          ASSERT_EQ(expseg_region_end(a, "weights"), EXPSEG_OK);
          expseg_pool_id rp;
          ASSERT_EQ(expseg_pool_of(a, region_ptr, &rp), EXPSEG_OK);
          expseg_region_info info;
          ASSERT_EQ(expseg_region_get_info(a, "weights", &info), EXPSEG_OK);
          live[region_ptr] = {(size_t)info.live_bytes, 0, rp};
          // the requested size: what malloc was asked (read back from the walk below)
        }
        ASSERT_EQ(alloc_test_hold(a, 7, false), EXPSEG_OK); // a sleep waits for every stream
        if (!region_asleep) {
          ASSERT_EQ(expseg_sleep(a, "weights", EXPSEG_SLEEP_DISCARD), EXPSEG_OK)
              << expseg_last_error();
        } else {
          ASSERT_EQ(expseg_wake(a, "weights"), EXPSEG_OK) << expseg_last_error();
        }
        ASSERT_EQ(alloc_test_hold(a, 7, true), EXPSEG_OK);
        region_asleep = !region_asleep;
      } else if (k < 86) {
        ASSERT_EQ(expseg_record_history_ex(a, true, 1 + r.below(50),
                                           r.chance(0.5) ? EXPSEG_HISTORY_CLEAR : 0),
                  EXPSEG_OK);
      } else if (k < 98) {
        continue;
      } else {
        expect_snapshot_matches_stats(a, live, !expandable, where);
        if (::testing::Test::HasFailure()) return;
      }
    }
    expect_snapshot_matches_stats(a, live, !expandable, "end");
    ASSERT_EQ(alloc_test_hold(a, 7, false), EXPSEG_OK);
    expect_consistent(a, "end");
  }
}

// ---- snapshots while other threads allocate ----

TEST(Adv16History, SnapshotsWhileOtherThreadsAllocateStayWhole) {
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 with pickle is needed";
  EXPSEG_SEEDED(seed, 16002);
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 3001, 0), EXPSEG_OK);
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 3; t++)
    workers.emplace_back([&, t] {
      TestRng r(seed + 100 + (uint64_t)t);
      std::string fn = "worker" + std::to_string(t);
      expseg_frame f = {"thread.py", fn.c_str(), t};
      if (expseg_history_push_frames(&f, 1) != EXPSEG_OK) failures++;
      std::vector<void *> mine;
      while (!stop.load()) {
        if (mine.size() < 50 && (mine.empty() || r.chance(0.6))) {
          void *p;
          if (expseg_malloc(a, 1 + r.below(3 << 20), (expseg_stream)t, &p) != EXPSEG_OK)
            failures++;
          else
            mine.push_back(p);
          if (r.chance(0.05) && expseg_history_annotate(a, p, fn.c_str()) != EXPSEG_OK)
            failures++;
        } else {
          size_t i = r.below(mine.size());
          if (expseg_free(a, mine[i]) != EXPSEG_OK) failures++;
          mine.erase(mine.begin() + (long)i);
        }
      }
      for (void *p : mine)
        if (expseg_free(a, p) != EXPSEG_OK) failures++;
      expseg_history_pop_frames(1);
    });
  std::string path = tmp_path("threads.pickle");
  for (int i = 0; i < 3; i++) {
    usleep(20000);
    ASSERT_EQ(expseg_snapshot_dump_ex(a, path.c_str(), i % 2 ? EXPSEG_SNAPSHOT_NO_TRACES : 0),
              EXPSEG_OK)
        << expseg_last_error();
    std::string out;
    int rc = snapshot_check(path, "", false, &out);
    EXPECT_EQ(rc, 0) << "snapshot " << i << ": " << out;
    // every thread's events carry that thread's frame only
    std::string err;
    std::vector<Ev> ev = pickle_events(path, &err);
    ASSERT_TRUE(err.empty()) << err;
    for (const Ev &e : ev) {
      if (e.action != "alloc") continue;
      std::string want = "thread.py:" + std::to_string(e.stream) + ":worker" +
                         std::to_string(e.stream) + ";";
      EXPECT_EQ(e.frames, want) << "an alloc on stream " << e.stream;
    }
  }
  stop = true;
  for (auto &w : workers) w.join();
  unlink(path.c_str());
  EXPECT_EQ(failures.load(), 0);
  expect_consistent(a, "after the threads");
}

// ---- odd and huge text, opened by PyTorch's tools ----

TEST(Adv16History, OddAndHugeTextOpensInBothViewersAndMemoryViz) {
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 with pickle is needed";
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 100, 0), EXPSEG_OK);
  std::string huge(1 << 20, 'h');
  huge[7] = '\xff';
  huge[1000] = '\xc3'; // a cut two-byte sequence
  std::string four = "emoji \xf0\x9f\x98\x80 and past U+10FFFF \xf4\x90\x80\x80 surrogate \xed\xa0\x80";
  ASSERT_EQ(expseg_history_set_user_metadata(a, four.c_str()), EXPSEG_OK);
  ASSERT_EQ(expseg_history_push_compile_context(a, "\x80\x80 ctx"), EXPSEG_OK);
  expseg_frame f[2] = {{huge.c_str(), four.c_str(), -5}, {"\xc0\xaf", "", 0}};
  ASSERT_EQ(expseg_history_push_frames(f, 2), EXPSEG_OK);
  void *p;
  ASSERT_EQ(expseg_malloc(a, 5 << 20, 0, &p), EXPSEG_OK);
  expseg_history_pop_frames(2);
  ASSERT_EQ(expseg_history_annotate(a, p, huge.c_str()), EXPSEG_OK);
  const char *keys[3] = {"name", "\xfe", "device"};
  const char *vals[3] = {huge.c_str(), four.c_str(), "not the device"};
  ASSERT_EQ(expseg_history_record_annotation(a, keys, vals, 3), EXPSEG_OK);
  ASSERT_EQ(expseg_history_pop_compile_context(a), EXPSEG_OK);
  ASSERT_EQ(expseg_history_pop_compile_context(a), EXPSEG_OK); // one more than pushed
  ASSERT_EQ(expseg_history_set_user_metadata(a, ""), EXPSEG_OK);
  std::string path = tmp_path("odd.pickle");
  ASSERT_EQ(expseg_snapshot_dump(a, path.c_str()), EXPSEG_OK) << expseg_last_error();
  std::string out;
  EXPECT_EQ(snapshot_check(path, "", false, &out), 0) << out;
  int rc = snapshot_run(
      "python3 -c \"import pickle,sys\n"
      "d=pickle.load(open(sys.argv[1],'rb'))\n"
      "t=d['device_traces'][0]\n"
      "al=[e for e in t if e['action']=='alloc'][0]\n"
      "an=[e for e in t if e['action']=='annotate'][0]\n"
      "x=d['external_annotations'][0]\n"
      "print('A', len(al['frames'][-1]['filename']), al['compile_context'], al['user_metadata'].count('\\ufffd'))\n"
      "print('N', len(an['user_metadata']), an['user_metadata'][7]=='\\ufffd')\n"
      "print('X', sorted(x.keys()), len(x['name']))\n"
      "print('S', t[-1]['action'], t[-1]['compile_context'], repr(t[-1]['user_metadata']))\n"
      "\" '" + path + "'",
      &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("A 1048576 \xef\xbf\xbd\xef\xbf\xbd ctx"), std::string::npos) << out;
  EXPECT_NE(out.find("N 1048576 True"), std::string::npos) << out;
  // PyTorch writes the annotation's own pairs, then device and time_us
  EXPECT_NE(out.find("X ['device', 'name', 'time_us', '\xef\xbf\xbd'] 1048576"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("S snapshot N/A ''"), std::string::npos) << out;
  struct stat st;
  if (stat((kViewerDir + "/MemoryViz_v1.js").c_str(), &st) != 0) {
    unlink(path.c_str());
    GTEST_SKIP() << "PyTorch's viewer files are missing: expected " << kViewerDir;
  }
  if (system("node --version >/dev/null 2>&1") == 0) {
    for (const char *v : {"MemoryViz_v1.js", "MemoryViz_v2.js"}) {
      rc = snapshot_run("node " EXPSEG_SOURCE_DIR "/tests/check_viewers.js '" + kViewerDir + "/" +
                            v + "' '" + path + "'",
                        &out);
      EXPECT_EQ(rc, 0) << v << ": " << out;
    }
  }
  rc = snapshot_run("python3 " EXPSEG_SOURCE_DIR "/tests/check_memory_viz.py '" + kViewerDir +
                        "/_memory_viz.py' '" + path + "' '" + path + "'",
                    &out);
  EXPECT_EQ(rc, 0) << out;
  unlink(path.c_str());
  EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
}

// ---- tracebacks ----

TEST(Adv16History, TracebackRefusesFreedInteriorAndForeignPointers) {
  AllocPtr al = make_alloc("sim", ""), other = make_alloc("sim", "");
  ASSERT_TRUE(al && other);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 100, 0), EXPSEG_OK);
  ASSERT_EQ(expseg_record_history_ex(other.get(), true, 100, 0), EXPSEG_OK);
  expseg_frame f = {"t.py", "make", 3};
  ASSERT_EQ(expseg_history_push_frames(&f, 1), EXPSEG_OK);
  void *p, *q, *foreign;
  ASSERT_EQ(expseg_malloc(a, 10000, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 10000, 0, &q), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(other.get(), 10000, 0, &foreign), EXPSEG_OK);
  expseg_history_pop_frames(1);
  char buf[256];
  size_t need = 0;
  ASSERT_EQ(expseg_allocation_traceback(a, p, buf, sizeof buf, &need), EXPSEG_OK);
  EXPECT_STREQ(buf, "t.py:3:make\n");
  // snprintf semantics: a short buffer holds a prefix, needed the whole
  char small[5];
  ASSERT_EQ(expseg_allocation_traceback(a, p, small, sizeof small, &need), EXPSEG_OK);
  EXPECT_STREQ(small, "t.py");
  EXPECT_EQ(need, strlen("t.py:3:make\n") + 1);
  struct Case {
    const void *ptr;
    const char *why;
  } cases[] = {{(char *)p + 1, "not a live allocation"},
               {(char *)p + 512, "not a live allocation"},
               {foreign, "not a live allocation"},
               {nullptr, "not a live allocation"}};
  for (const Case &c : cases) {
    need = 99;
    EXPECT_EQ(expseg_allocation_traceback(a, c.ptr, buf, sizeof buf, &need),
              EXPSEG_ERR_INVALID_ARGUMENT)
        << c.ptr;
    EXPECT_NE(std::string(expseg_last_error()).find(c.why), std::string::npos)
        << expseg_last_error();
    EXPECT_STREQ(buf, "");
    EXPECT_EQ(need, 1u);
  }
  ASSERT_EQ(expseg_free(a, q), EXPSEG_OK);
  EXPECT_EQ(expseg_allocation_traceback(a, q, buf, sizeof buf, &need), EXPSEG_ERR_INVALID_ARGUMENT);
  // a new allocation at q's address, made with no frames: q's frames are not lent
  void *r;
  ASSERT_EQ(expseg_malloc(a, 10000, 0, &r), EXPSEG_OK);
  ASSERT_EQ(r, q) << "the freed block is reused";
  ASSERT_EQ(expseg_allocation_traceback(a, r, buf, sizeof buf, &need), EXPSEG_OK);
  EXPECT_STREQ(buf, "");
  // the history stopped: refused, saying so
  ASSERT_EQ(expseg_record_history(a, false, 0), EXPSEG_OK);
  EXPECT_EQ(expseg_allocation_traceback(a, p, buf, sizeof buf, &need), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("history is off"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
  EXPECT_EQ(expseg_free(a, r), EXPSEG_OK);
  EXPECT_EQ(expseg_free(other.get(), foreign), EXPSEG_OK);
}

// ---- dumps that cannot be written ----

size_t files_in(const std::string &dir) {
  size_t n = 0;
  DIR *d = opendir(dir.c_str());
  if (!d) return 0;
  while (struct dirent *e = readdir(d))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

TEST(Adv16History, DumpsThatCannotBeWrittenRecordNothingAndLeaveNothing) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 100, 0), EXPSEG_OK);
  char tmpl[] = "/tmp/adv16_dump_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  ASSERT_EQ(mkdir((dir + "/sub").c_str(), 0755), 0);
  size_t before = walk_events(a).size(); // the walk records its own snapshot event
  struct Case {
    std::string path;
    const char *says;
  } cases[] = {{dir + "/missing/x.pickle", "No such file"},
               {dir + "/sub", "a directory"},
               {dir + "/sub/", "a directory"},
               {"", "empty"}};
  for (const Case &c : cases) {
    for (unsigned flags : {0u, (unsigned)EXPSEG_SNAPSHOT_NO_TRACES}) {
      EXPECT_EQ(expseg_snapshot_dump_ex(a, c.path.c_str(), flags), EXPSEG_ERR_INVALID_ARGUMENT)
          << c.path;
      EXPECT_NE(std::string(expseg_last_error()).find(c.says), std::string::npos)
          << c.path << ": " << expseg_last_error();
    }
  }
  EXPECT_EQ(expseg_snapshot_dump(a, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(walk_events(a).size(), before + 1) << "a failed dump recorded a snapshot event";
  EXPECT_EQ(files_in(dir), 1u) << "a temporary file was left in " << dir;
  EXPECT_EQ(files_in(dir + "/sub"), 0u);
  std::string ok = dir + "/ok.pickle";
  EXPECT_EQ(expseg_snapshot_dump(a, ok.c_str()), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(files_in(dir), 2u);
  unlink(ok.c_str());
  rmdir((dir + "/sub").c_str());
  rmdir(dir.c_str());
}

// ---- memory_summary ----

TEST(Adv16History, SummaryKeepsItsFrameWithCountsPastAMillion) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  void *keep;
  ASSERT_EQ(expseg_malloc(a, (size_t)900 << 30, 0, &keep), EXPSEG_ERR_OUT_OF_MEMORY);
  ASSERT_EQ(expseg_malloc(a, (size_t)70 << 30, 0, &keep), EXPSEG_OK) << expseg_last_error();
  for (int i = 0; i < 1200000; i++) {
    void *p;
    ASSERT_EQ(expseg_malloc(a, 512, 0, &p), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  }
  size_t need = expseg_memory_summary(a, nullptr, 0, false);
  std::string text(need, '\0');
  ASSERT_EQ(expseg_memory_summary(a, &text[0], need, false), need);
  text.resize(need - 1);
  std::istringstream in(text);
  std::string line;
  int n = 0;
  bool alloc_row = false, mem_row = false;
  while (std::getline(in, line)) {
    n++;
    EXPECT_EQ(line.size(), 77u) << "line " << n << ": '" << line << "'";
    EXPECT_EQ(line.front(), '|');
    EXPECT_EQ(line.back(), '|');
    // PyTorch's _format_count: 1,200,001 allocations are 1200 K; the current 1 stays
    if (line.rfind("| Allocations ", 0) == 0) {
      alloc_row = true;
      EXPECT_EQ(line, "| Allocations           |       1    |       2    |    1200 K  |    1200 K  |");
    }
    if (line.rfind("| Allocated memory ", 0) == 0) {
      mem_row = true;
      // 70 GiB is 71680 MiB: below 768 GiB it stays in MiB (PyTorch's _format_size)
      EXPECT_EQ(line.substr(0, 38), "| Allocated memory      |  71680 MiB |") << line;
    }
  }
  EXPECT_TRUE(alloc_row && mem_row) << text;
  EXPECT_EQ(expseg_free(a, keep), EXPSEG_OK);
}

// A block lent to another stream: its events carry the stream that asked, as PyTorch's do
// (a replay of the history allocates there); the snapshot keeps it in its owner's segment.
TEST(Adv16History, ALentBlocksEventsCarryTheStreamThatAsked) {
  AllocPtr al = make_alloc("sim", "expandable_segments:True");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, 0), EXPSEG_OK);
  void *p, *q;
  ASSERT_EQ(expseg_malloc(a, 6 << 20, 1, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  int64_t lent0 = stat_of(a, "expseg.num_lent");
  ASSERT_EQ(expseg_malloc(a, 6 << 20, 2, &q), EXPSEG_OK);
  ASSERT_EQ(stat_of(a, "expseg.num_lent"), lent0 + 1) << "stream 1's free block was not lent";
  ASSERT_EQ(expseg_history_annotate(a, q, "lent"), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, q), EXPSEG_OK);
  std::vector<Ev> ev = walk_events(a);
  std::string seen;
  for (const Ev &e : ev) {
    if (e.addr != (uint64_t)(uintptr_t)q || e.action.rfind("segment", 0) == 0) continue;
    seen += e.action + "@" + std::to_string(e.stream) + " ";
  }
  EXPECT_EQ(seen,
            "alloc@1 free_requested@1 free_completed@1 alloc@2 annotate@2 free_requested@2 "
            "free_completed@2 ");
}

// ---- host memory running out inside the history calls ----

// Each call is run with host memory failing at its k-th allocation, for every k until it
// needs no more: it succeeds or says it ran out of host memory, and the allocator, the
// history and the next snapshot stay whole.
TEST(Adv16History, HostMemoryRunningOutAtEveryAllocationOfTheHistoryCalls) {
#ifndef EXPSEG_TEST_HOST_FAIL
  GTEST_SKIP() << "host memory failures are not injected under a sanitizer";
#else
  AllocPtr al = make_alloc("sim", "expandable_segments:True");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 500, 0), EXPSEG_OK);
  std::vector<void *> live;
  for (int i = 0; i < 40; i++) {
    void *p;
    ASSERT_EQ(expseg_malloc(a, (size_t)(i + 1) * 70000, (expseg_stream)(i % 3), &p), EXPSEG_OK);
    if (i % 4 == 0) {
      ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
    } else {
      live.push_back(p);
    }
  }
  const char *k1[1] = {"name"}, *v1[1] = {"step"};
  std::string dir = ::testing::TempDir();
  std::string path = tmp_path("fault.pickle");
  std::string fresh_frame = "fresh";
  struct Call {
    const char *name;
    std::function<expseg_status()> run;
  };
  int fresh = 0;
  std::vector<Call> calls = {
      {"snapshot",
       [&] {
         unsigned char *b = nullptr;
         size_t n = 0;
         expseg_status st = expseg_snapshot(a, &b, &n);
         expseg_snapshot_free(b);
         return st;
       }},
      {"snapshot_dump", [&] { return expseg_snapshot_dump(a, path.c_str()); }},
      {"walk",
       [&] {
         return expseg_walk(
             a, [](void *, const expseg_walk_segment *) {}, [](void *, const expseg_walk_event *) {},
             nullptr);
       }},
      {"record_history", [&] { return expseg_record_history_ex(a, true, 400 + fresh % 7, 0); }},
      {"record_annotation", [&] { return expseg_history_record_annotation(a, k1, v1, 1); }},
      {"push_frames",
       [&] {
         std::string name = fresh_frame + std::to_string(fresh++);
         expseg_frame f = {"fault.py", name.c_str(), fresh};
         expseg_status st = expseg_history_push_frames(&f, 1);
         if (st == EXPSEG_OK) expseg_history_pop_frames(1);
         return st;
       }},
      {"annotate",
       [&] { return expseg_history_annotate(a, live[0], (fresh_frame + std::to_string(fresh++)).c_str()); }},
      {"summary",
       [&] {
         char b[8192];
         return expseg_memory_summary(a, b, sizeof b, false) > 1 ? EXPSEG_OK : EXPSEG_ERR_CONFIG;
       }},
  };
  for (const Call &c : calls) {
    SCOPED_TRACE(c.name);
    bool passed = false;
    for (long k = 0; k < 200 && !passed; k++) {
      g_countdown = k;
      expseg_status st = c.run();
      g_countdown = -1;
      g_fail_host = false;
      passed = st == EXPSEG_OK && k > 0;
      ASSERT_TRUE(st == EXPSEG_OK || st == EXPSEG_ERR_HOST_OUT_OF_MEMORY)
          << "allocation " << k << " failing: " << expseg_status_name(st) << ": "
          << expseg_last_error();
      if (st != EXPSEG_OK) {
        std::string m = expseg_last_error();
        EXPECT_TRUE(m.find("host memory") != std::string::npos ||
                    m.find(strerror(ENOMEM)) != std::string::npos)
            << m;
      }
      ASSERT_EQ(expseg_check(a), EXPSEG_OK) << "after allocation " << k << " failed: "
                                            << expseg_last_error();
      // no temporary file left by a dump that ran out
      DIR *d = opendir(dir.c_str());
      ASSERT_NE(d, nullptr);
      while (struct dirent *e = readdir(d))
        EXPECT_EQ(strstr(e->d_name, "fault.pickle.tmp."), nullptr)
            << "allocation " << k << ": left " << e->d_name;
      closedir(d);
    }
    EXPECT_TRUE(passed) << "never succeeded";
  }
  unlink(path.c_str());
  if (snapshot_have_python()) {
    ASSERT_EQ(expseg_snapshot_dump(a, path.c_str()), EXPSEG_OK) << expseg_last_error();
    std::string out;
    EXPECT_EQ(snapshot_check(path, "", false, &out), 0) << out;
    unlink(path.c_str());
  }
  for (void *p : live) EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
  expect_consistent(a, "after the faults");
#endif
}

// ---- external annotations, oom and snapshot events, refusals ----

std::vector<std::pair<std::string, uint64_t>> annotations_of(expseg_allocator *a) {
  std::vector<std::pair<std::string, uint64_t>> v;
  EXPECT_EQ(expseg_history_annotations(
                a,
                [](void *ctx, const expseg_annotation *e) {
                  std::string t;
                  for (size_t i = 0; i < e->n; i++) t += std::string(e->keys[i]) + "=" + e->values[i] + ",";
                  static_cast<std::vector<std::pair<std::string, uint64_t>> *>(ctx)->push_back(
                      {t, e->time_us});
                },
                &v),
            EXPSEG_OK);
  return v;
}

std::string annotation_names(expseg_allocator *a) {
  std::string s;
  for (auto &e : annotations_of(a)) s += e.first;
  return s;
}

void record_named(expseg_allocator *a, int i) {
  std::string v = std::to_string(i);
  const char *k[1] = {"n"}, *vals[1] = {v.c_str()};
  ASSERT_EQ(expseg_history_record_annotation(a, k, vals, 1), EXPSEG_OK);
}

TEST(Adv16History, AnnotationRingAtOddBoundsKeepsTheNewestInOrder) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 3, 0), EXPSEG_OK);
  for (int i = 0; i < 10; i++) record_named(a, i);
  EXPECT_EQ(annotation_names(a), "n=7,n=8,n=9,");
  ASSERT_EQ(expseg_record_history_ex(a, true, 2, 0), EXPSEG_OK);
  EXPECT_EQ(annotation_names(a), "n=8,n=9,");
  record_named(a, 10);
  EXPECT_EQ(annotation_names(a), "n=9,n=10,");
  ASSERT_EQ(expseg_record_history_ex(a, true, 5, 0), EXPSEG_OK);
  for (int i = 11; i < 14; i++) record_named(a, i);
  EXPECT_EQ(annotation_names(a), "n=9,n=10,n=11,n=12,n=13,");
  record_named(a, 14);
  EXPECT_EQ(annotation_names(a), "n=10,n=11,n=12,n=13,n=14,");
  ASSERT_EQ(expseg_record_history_ex(a, true, 1, 0), EXPSEG_OK);
  EXPECT_EQ(annotation_names(a), "n=14,");
  record_named(a, 15);
  EXPECT_EQ(annotation_names(a), "n=15,");
  ASSERT_EQ(expseg_record_history_ex(a, true, 4, EXPSEG_HISTORY_CLEAR), EXPSEG_OK);
  EXPECT_EQ(annotation_names(a), "");
  record_named(a, 16);
  ASSERT_EQ(expseg_record_history(a, false, 0), EXPSEG_OK);
  record_named(a, 17); // off: not kept
  ASSERT_EQ(expseg_record_history_ex(a, true, 4, 0), EXPSEG_OK);
  EXPECT_EQ(annotation_names(a), "");
}

// Annotations recorded by several threads at once come out oldest first: their times never
// go backwards (the viewer draws them on the events' time axis).
TEST(Adv16History, AnnotationsFromManyThreadsAreInTimeOrder) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, SIZE_MAX, 0), EXPSEG_OK);
  std::vector<std::thread> t;
  for (int k = 0; k < 4; k++)
    t.emplace_back([a, k] {
      std::string big(4000, (char)('a' + k)); // copying it takes a while, outside the lock
      const char *keys[2] = {"name", "stage"}, *vals[2] = {big.c_str(), "START"};
      for (int i = 0; i < 3000; i++) (void)expseg_history_record_annotation(a, keys, vals, 2);
    });
  for (auto &x : t) x.join();
  std::vector<std::pair<std::string, uint64_t>> v = annotations_of(a);
  ASSERT_EQ(v.size(), 12000u);
  size_t back = 0;
  for (size_t i = 1; i < v.size(); i++)
    if (v[i].second < v[i - 1].second) back++;
  EXPECT_EQ(back, 0u) << "annotations whose time_us is before the one kept before them";
}

TEST(Adv16History, OomAndSnapshotEventsMatchTheStatistics) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, 0), EXPSEG_OK);
  void *p, *q;
  ASSERT_EQ(expseg_malloc(a, 5000, 0, &p), EXPSEG_OK);
  for (int i = 0; i < 3; i++)
    EXPECT_EQ(expseg_malloc(a, ((size_t)1 << 40) + 1, 0, &q), EXPSEG_ERR_OUT_OF_MEMORY);
  int64_t active = stat_of(a, "active_bytes.all.current");
  std::vector<Ev> ev = walk_events(a);
  size_t ooms = 0;
  for (const Ev &e : ev)
    if (e.action == "oom") {
      ooms++;
      EXPECT_GE(e.size, ((uint64_t)1 << 40) + 1) << "an oom event's size is the rounded request";
    }
  EXPECT_EQ((int64_t)ooms, stat_of(a, "num_ooms"));
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev.back().action, "snapshot");
  EXPECT_EQ((int64_t)ev.back().size, active) << "a snapshot event's size is the active bytes";
  // skipped: none recorded, the statistics still count them
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, EXPSEG_HISTORY_CLEAR | EXPSEG_HISTORY_SKIP_OOM |
                                                        EXPSEG_HISTORY_SKIP_SNAPSHOT),
            EXPSEG_OK);
  EXPECT_EQ(expseg_malloc(a, ((size_t)1 << 40) + 1, 0, &q), EXPSEG_ERR_OUT_OF_MEMORY);
  for (const Ev &e : walk_events(a)) EXPECT_TRUE(e.action != "oom" && e.action != "snapshot") << e.action;
  EXPECT_EQ(stat_of(a, "num_ooms"), (int64_t)ooms + 1);
  EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
}

TEST(Adv16History, RefusalsNameWhatIsWrong) {
  unsigned flag = 77;
  EXPECT_EQ(expseg_history_skip_action("segment_map", &flag), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(flag, 0u);
  std::string m = expseg_last_error();
  EXPECT_NE(m.find("'segment_map'"), std::string::npos) << m;
  EXPECT_NE(m.find(expseg_history_skip_action_names()), std::string::npos) << m;
  EXPECT_EQ(expseg_history_skip_action(nullptr, &flag), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_history_skip_action("", &flag), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_history_skip_action("ALLOC", &flag), EXPSEG_ERR_INVALID_ARGUMENT)
      << "names are PyTorch's, case and all";
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  EXPECT_EQ(expseg_record_history_ex(a, true, 0, 0), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_record_history_ex(a, true, 10, 1u << 13), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("0x2000"), std::string::npos)
      << expseg_last_error();
  // refusals leave the history as it was
  ASSERT_EQ(expseg_record_history_ex(a, true, 2, 0), EXPSEG_OK);
  void *p, *q, *r;
  ASSERT_EQ(expseg_malloc(a, 100, 0, &p), EXPSEG_OK);
  EXPECT_EQ(expseg_record_history_ex(a, true, 0, 0), EXPSEG_ERR_INVALID_ARGUMENT);
  char buf[256];
  size_t need;
  EXPECT_EQ(expseg_allocation_traceback(a, p, buf, sizeof buf, &need), EXPSEG_OK);
  // the alloc event dropped from a ring of 2: refused, saying a larger bound keeps more
  ASSERT_EQ(expseg_malloc(a, 100, 0, &q), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 100, 0, &r), EXPSEG_OK);
  EXPECT_EQ(expseg_allocation_traceback(a, p, buf, sizeof buf, &need), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("max_entries"), std::string::npos)
      << expseg_last_error();
  for (void *x : {p, q, r}) EXPECT_EQ(expseg_free(a, x), EXPSEG_OK);
}

// The snapshot's frames of a live block follow the traceback's rule: an older allocation at
// the same address never lends its frames, even when the skipped actions changed between
// them (its free_completed skipped, the new block's alloc skipped).
TEST(Adv16History, SnapshotNeverLendsAnOlderAllocationsFrames) {
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 with pickle is needed";
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, 0), EXPSEG_OK);
  expseg_frame f = {"old.py", "older", 1};
  ASSERT_EQ(expseg_history_push_frames(&f, 1), EXPSEG_OK);
  void *p, *q, *pend, *pend2;
  ASSERT_EQ(expseg_malloc(a, 100000, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 200000, 0, &pend), EXPSEG_OK);
  expseg_history_pop_frames(1);
  ASSERT_EQ(alloc_test_hold(a, 9, true), EXPSEG_OK);
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000,
                                     EXPSEG_HISTORY_SKIP_FREE_COMPLETED | EXPSEG_HISTORY_SKIP_ALLOC),
            EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 100000, 0, &q), EXPSEG_OK);
  ASSERT_EQ(q, p) << "the freed block is reused";
  // a block freed while work on another stream is queued stays pending with its frames
  ASSERT_EQ(expseg_record_stream(a, pend, 9), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, pend), EXPSEG_OK);
  (void)pend2;
  std::string path = tmp_path("lend.pickle");
  ASSERT_EQ(expseg_snapshot_dump(a, path.c_str()), EXPSEG_OK) << expseg_last_error();
  std::string out;
  int rc = snapshot_run(
      "python3 -c \"import pickle,sys\n"
      "d=pickle.load(open(sys.argv[1],'rb'))\n"
      "for s in d['segments']:\n"
      "  for b in s['blocks']:\n"
      "    if b['state']!='inactive': print(hex(b['address']), b['state'], "
      "[f['name'] for f in b['frames']])\n"
      "\" '" + path + "'",
      &out);
  unlink(path.c_str());
  ASSERT_EQ(rc, 0) << out;
  char want_q[128], want_pend[128];
  snprintf(want_q, sizeof want_q, "%s active_allocated []", ptr_text(q).c_str());
  snprintf(want_pend, sizeof want_pend, "%s active_pending_free ['older']", ptr_text(pend).c_str());
  EXPECT_NE(out.find(want_q), std::string::npos) << "want " << want_q << " in\n" << out;
  EXPECT_NE(out.find(want_pend), std::string::npos) << "want " << want_pend << " in\n" << out;
  char buf[256];
  size_t need;
  EXPECT_EQ(expseg_allocation_traceback(a, q, buf, sizeof buf, &need), EXPSEG_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(alloc_test_hold(a, 9, false), EXPSEG_OK);
  EXPECT_EQ(expseg_free(a, q), EXPSEG_OK);
}

// A higher device: lower devices' trace lists are empty, every segment, annotation and the
// summary's header name the device; the summary is cut as snprintf cuts.
TEST(Adv16History, AHigherDevicesSnapshotAndSummary) {
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 with pickle is needed";
  expseg_allocator *raw = nullptr;
  ASSERT_EQ(expseg_create("sim", 3, "", &raw), EXPSEG_OK) << expseg_last_error();
  AllocPtr al(raw);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 100, 0), EXPSEG_OK);
  void *p;
  ASSERT_EQ(expseg_malloc(a, 3 << 20, 0, &p), EXPSEG_OK);
  const char *k[1] = {"name"}, *v[1] = {"fwd"};
  ASSERT_EQ(expseg_history_record_annotation(a, k, v, 1), EXPSEG_OK);
  std::string path = tmp_path("dev3.pickle");
  ASSERT_EQ(expseg_snapshot_dump(a, path.c_str()), EXPSEG_OK) << expseg_last_error();
  std::string out;
  EXPECT_EQ(snapshot_check(path, "{\"device\": 3}", true, &out), 0) << out;
  int rc = snapshot_run(
      "python3 -c \"import pickle,sys\n"
      "d=pickle.load(open(sys.argv[1],'rb'))\n"
      "print([len(t) for t in d['device_traces']][:3], len(d['device_traces']), "
      "sorted({s['device'] for s in d['segments']}), "
      "[x['device'] for x in d['external_annotations']])\n"
      "\" '" + path + "'",
      &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("[0, 0, 0] 4 [3] [3]"), std::string::npos) << out;
  unlink(path.c_str());
  (void)unlink((path + ".expect.json").c_str());
  size_t need = expseg_memory_summary(a, nullptr, 0, true);
  std::string whole(need, '\0');
  ASSERT_EQ(expseg_memory_summary(a, &whole[0], need, true), need);
  EXPECT_NE(whole.find("PyTorch CUDA memory summary, device ID 3 "), std::string::npos) << whole;
  char cut[10];
  memset(cut, 'x', sizeof cut);
  EXPECT_EQ(expseg_memory_summary(a, cut, sizeof cut, true), need);
  EXPECT_EQ(std::string(cut), whole.substr(0, 9));
  EXPECT_EQ(expseg_memory_summary(a, nullptr, 5, true), need) << "no buffer: the length only";
  EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
}

// "segment_alloc + segment_map events = num_device_alloc, segment_free + segment_unmap =
// num_device_free, oom = num_ooms" for a history kept whole, with every kind of traffic:
// classic and expandable, empty_cache, a private pool released, a region put to sleep and
// woken, OOMs.
TEST(Adv16History, MappingEventsCountTheDriverCalls) {
  for (const char *conf : {"expandable_segments:True", "expandable_segments:False"}) {
    SCOPED_TRACE(conf);
    AllocPtr al = make_alloc("sim", conf);
    ASSERT_TRUE(al);
    expseg_allocator *a = al.get();
    ASSERT_EQ(expseg_record_history_ex(a, true, SIZE_MAX, 0), EXPSEG_OK);
    TestRng r(1603);
    std::vector<void *> live;
    expseg_pool_id pool;
    ASSERT_EQ(expseg_pool_create(a, &pool), EXPSEG_OK);
    for (int i = 0; i < 300; i++) {
      void *p;
      size_t sz = r.chance(0.3) ? (size_t)(1 + r.below(30)) << 20 : 1 + r.below(500000);
      ASSERT_EQ(expseg_malloc_pool(a, sz, r.below(2), i % 5 == 0 ? pool : 0, &p), EXPSEG_OK);
      live.push_back(p);
      if (r.chance(0.5)) {
        size_t k = r.below(live.size());
        ASSERT_EQ(expseg_free(a, live[k]), EXPSEG_OK);
        live.erase(live.begin() + (long)k);
      }
      if (i % 50 == 49) {
        ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
      }
    }
    void *q;
    EXPECT_EQ(expseg_malloc(a, (size_t)1 << 45, 0, &q), EXPSEG_ERR_OUT_OF_MEMORY);
    if (std::string(conf) == "expandable_segments:True") {
      void *w;
      ASSERT_EQ(expseg_region_begin(a, "w"), EXPSEG_OK);
      ASSERT_EQ(expseg_malloc(a, 40 << 20, 0, &w), EXPSEG_OK);
      ASSERT_EQ(expseg_region_end(a, "w"), EXPSEG_OK);
      ASSERT_EQ(expseg_sleep(a, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
      ASSERT_EQ(expseg_wake(a, "w"), EXPSEG_OK) << expseg_last_error();
      ASSERT_EQ(expseg_sleep(a, "w", EXPSEG_SLEEP_DISCARD), EXPSEG_OK) << expseg_last_error();
      ASSERT_EQ(expseg_wake(a, "w"), EXPSEG_OK) << expseg_last_error();
      live.push_back(w);
    }
    for (void *p : live) {
      expseg_pool_id of;
      ASSERT_EQ(expseg_pool_of(a, p, &of), EXPSEG_OK);
      if (of == pool) {
        ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
      }
    }
    ASSERT_EQ(expseg_pool_release(a, pool), EXPSEG_OK);
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    std::map<std::string, int64_t> n;
    for (const Ev &e : walk_events(a)) n[e.action]++;
    EXPECT_EQ(n["segment_alloc"] + n["segment_map"], stat_of(a, "num_device_alloc"));
    EXPECT_EQ(n["segment_free"] + n["segment_unmap"], stat_of(a, "num_device_free"));
    EXPECT_EQ(n["oom"], stat_of(a, "num_ooms"));
    for (void *p : live) {
      expseg_pool_id of;
      if (expseg_pool_of(a, p, &of) == EXPSEG_OK && of != pool) {
        EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
      }
    }
  }
}

// The history switched on, off, cleared and rebounded while other threads allocate,
// annotate, snapshot, walk and ask for tracebacks: every call succeeds or refuses cleanly
// and the allocator stays whole.
TEST(Adv16History, HistorySwitchedWhileOtherThreadsUseIt) {
  EXPSEG_SEEDED(seed, 16004);
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::thread sw([&] {
    TestRng r(seed);
    for (int i = 0; i < 400; i++) {
      unsigned flags = (unsigned)r.below(2) | (r.chance(0.3) ? EXPSEG_HISTORY_CLEAR : 0u) |
                       (r.chance(0.2) ? EXPSEG_HISTORY_SKIP_ALLOC : 0u);
      expseg_status st = r.chance(0.2) ? expseg_record_history(a, false, 0)
                                       : expseg_record_history_ex(a, true, 1 + r.below(64), flags);
      if (st != EXPSEG_OK) bad++;
      usleep(100);
    }
    stop = true;
  });
  std::thread user([&] {
    TestRng r(seed + 1);
    std::vector<void *> mine;
    const char *k[1] = {"name"}, *v[1] = {"step"};
    while (!stop.load()) {
      void *p;
      if (expseg_malloc(a, 1 + r.below(1 << 20), r.below(2), &p) != EXPSEG_OK) {
        bad++;
        continue;
      }
      mine.push_back(p);
      if (expseg_history_annotate(a, p, "x") != EXPSEG_OK) bad++;
      if (expseg_history_record_annotation(a, k, v, 1) != EXPSEG_OK) bad++;
      char buf[512];
      size_t need;
      expseg_status st = expseg_allocation_traceback(a, p, buf, sizeof buf, &need);
      if (st != EXPSEG_OK && st != EXPSEG_ERR_INVALID_ARGUMENT) bad++;
      if (mine.size() > 20) {
        if (expseg_free(a, mine.front()) != EXPSEG_OK) bad++;
        mine.erase(mine.begin());
      }
    }
    for (void *p : mine)
      if (expseg_free(a, p) != EXPSEG_OK) bad++;
  });
  int snaps = 0;
  while (!stop.load()) {
    unsigned char *buf = nullptr;
    size_t len = 0;
    if (expseg_snapshot_ex(a, snaps % 2 ? EXPSEG_SNAPSHOT_NO_TRACES : 0, &buf, &len) != EXPSEG_OK)
      bad++;
    expseg_snapshot_free(buf);
    size_t n = 0;
    if (expseg_walk(
            a, nullptr, [](void *ctx, const expseg_walk_event *) { ++*static_cast<size_t *>(ctx); },
            &n) != EXPSEG_OK)
      bad++;
    if (n > 64) bad++; // never more than the largest bound
    snaps++;
  }
  sw.join();
  user.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(snaps, 0);
  expect_consistent(a, "after the switching");
}

} // namespace
