// SPDX-License-Identifier: Apache-2.0
// test_adv16_snapshot.cpp: snapshots attacked from their contract (docs/snapshots.md):
// seeded random snapshots that must agree with the statistics per pool class, private
// pool, region and stream (record_stream frees pending, sleeping regions, expandable
// segments after empty_cache); snapshots while other threads allocate; odd and huge text
// opened by both viewers' unpicklers and _memory_viz.py; dumps to paths that cannot be
// written; memory_summary's frame past a million allocations; frames never lent by an older
// allocation at the same address; a higher device (the history calls:
// test_adv16_history.cpp).
#include <gtest/gtest.h>

#include "alloc_support.h"
#include "expseg.h"
#include "snapshot_check.h"
#include "test_adv16_history_common.h"
#include "test_seed.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

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
// another stream: it stays in its owner's segment, under the owner's stream); there the
// segments are counted too.
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
  if (per_stream) { // classic segments: one snapshot entry each, as PyTorch counts them
    int64_t n_large = 0, n_small = 0;
    for (const SnapSeg &g : segs) (g.large ? n_large : n_small)++;
    EXPECT_EQ(n_large, stat_of(a, "segment.large_pool.current")) << where << ": large segments";
    EXPECT_EQ(n_small, stat_of(a, "segment.small_pool.current")) << where << ": small segments";
    EXPECT_EQ(got_stream, want_stream) << where << ": live requested bytes per stream (general cache)";
  }
}

TEST(Adv16Snapshot, RandomSnapshotsAgreeWithTheStatisticsPerPoolAndStream) {
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

TEST(Adv16Snapshot, SnapshotsWhileOtherThreadsAllocateStayWhole) {
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

TEST(Adv16Snapshot, OddAndHugeTextOpensInBothViewersAndMemoryViz) {
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

TEST(Adv16Snapshot, DumpsThatCannotBeWrittenRecordNothingAndLeaveNothing) {
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

TEST(Adv16Snapshot, SummaryKeepsItsFrameWithCountsPastAMillion) {
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
TEST(Adv16Snapshot, SnapshotNeverLendsAnOlderAllocationsFrames) {
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
TEST(Adv16Snapshot, AHigherDevicesSnapshotAndSummary) {
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

} // namespace
