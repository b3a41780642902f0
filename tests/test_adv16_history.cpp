// SPDX-License-Identifier: Apache-2.0
// test_adv16_history.cpp: the history calls attacked from their contract
// (docs/snapshots.md): pushed frames deeper than 256 then popped back, pops past the
// bottom; the event ring at bounds 1, 2, 3, 7, 1023, 1025, re-enabled with other bounds and
// toggled off, against a reference run kept whole; the annotation ring at odd bounds and
// annotations from several threads in time order; a lent block's events on the stream that
// asked; tracebacks of freed, interior and foreign pointers; refusals; oom, snapshot and
// mapping events against the statistics; the history switched on and off while other
// threads use it; and host memory running out at every allocation the history calls make
// (snapshots themselves: test_adv16_snapshot.cpp).
#include <gtest/gtest.h>

#include "alloc_support.h"
#include "expseg.h"
#include "host_fail.h"
#include "snapshot_check.h"
#include "test_adv16_history_common.h"
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
