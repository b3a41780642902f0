// SPDX-License-Identifier: Apache-2.0
// test_history_args.cpp: the history's newer PyTorch arguments and calls: the `annotate`
// action (expseg_history_annotate, PyTorch's _annotate_memory), clear_history
// (EXPSEG_HISTORY_CLEAR), skip_actions (EXPSEG_HISTORY_SKIP_*), include_traces=False
// (EXPSEG_SNAPSHOT_NO_TRACES) and the allocation traceback of one pointer
// (expseg_allocation_traceback). Events are read back with expseg_walk, snapshots with
// Python's pickle (skipped without python3).
#include <gtest/gtest.h>

#include "alloc_support.h"
#include "expseg.h"
#include "snapshot_check.h"

#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

namespace {

struct Ev {
  std::string action;
  uint64_t addr, size;
  expseg_stream stream;
};

std::vector<Ev> Events(expseg_allocator *a) {
  std::vector<Ev> v;
  EXPECT_EQ(expseg_walk(
                a, nullptr,
                [](void *ctx, const expseg_walk_event *e) {
                  static_cast<std::vector<Ev> *>(ctx)->push_back({e->action, e->addr, e->size, e->stream});
                },
                &v),
            EXPSEG_OK);
  return v;  // the walk's own snapshot event last
}

size_t Count(const std::vector<Ev> &v, const char *action) {
  size_t n = 0;
  for (const Ev &e : v) n += e.action == action;
  return n;
}

std::string TmpPath(const char *name) {
  return std::string("/tmp/expseg_history_args_") + std::to_string(getpid()) + "_" + name;
}

// Python's reading of a snapshot: one line per event ("action addr size user_metadata"),
// then "segments N framed_blocks M".
std::string PyRead(const std::string &path) {
  std::string out;
  int rc = snapshot_run(
      "python3 -c \"import pickle,sys\n"
      "s = pickle.load(open(sys.argv[1], 'rb'))\n"
      "for t in s['device_traces']:\n"
      "  for e in t: print(e['action'], e['addr'], e['size'], repr(e['user_metadata']))\n"
      "print('segments', len(s['segments']), 'framed_blocks', "
      "sum(1 for g in s['segments'] for b in g['blocks'] if b['frames']))\" '" + path + "'",
      &out);
  EXPECT_EQ(rc, 0) << out;
  return out;
}

TEST(HistoryArgs, AnnotateRecordsTheTextOnTheAllocationOrAsAMark) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  void *p;
  ASSERT_EQ(expseg_malloc(a, 1000, 7, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_history_annotate(a, p, "off"), EXPSEG_OK);  // not recording: nothing
  ASSERT_EQ(expseg_record_history_ex(a, true, 100, 0), EXPSEG_OK);
  ASSERT_EQ(expseg_history_annotate(a, p, "weights of layer 3"), EXPSEG_OK);
  ASSERT_EQ(expseg_history_annotate(a, nullptr, "step 1"), EXPSEG_OK);
  int x;
  EXPECT_EQ(expseg_history_annotate(a, &x, "bad"), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("not a live allocation"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(expseg_history_annotate(a, p, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  std::vector<Ev> ev = Events(a);
  ASSERT_EQ(Count(ev, "annotate"), 2u);
  EXPECT_EQ(ev[0].action, "annotate");
  EXPECT_EQ(ev[0].addr, (uint64_t)(uintptr_t)p);
  EXPECT_EQ(ev[0].size, 1000u);
  EXPECT_EQ(ev[0].stream, 7u);
  EXPECT_EQ(ev[1].addr, 0u);
  EXPECT_EQ(ev[1].size, 0u);
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 is not on PATH: the pickle was not read";
  std::string path = TmpPath("annotate.pickle");
  ASSERT_EQ(expseg_snapshot_dump(a, path.c_str()), EXPSEG_OK) << expseg_last_error();
  std::string text = PyRead(path);
  EXPECT_NE(text.find("annotate " + std::to_string((uintptr_t)p) + " 1000 'weights of layer 3'"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("annotate 0 0 'step 1'"), std::string::npos) << text;
  size_t snap = text.find("snapshot 0 ");  // other events' user_metadata is empty
  ASSERT_NE(snap, std::string::npos) << text;
  EXPECT_EQ(text.substr(text.find('\n', snap) - 2, 2), "''") << text;
  std::string out;
  EXPECT_EQ(snapshot_check(path, "", false, &out), 0) << out;
  unlink(path.c_str());
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
}

TEST(HistoryArgs, SkipActionsAreNotRecordedAndOthersAreRefused) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000,
                                     EXPSEG_HISTORY_SKIP_ALLOC | EXPSEG_HISTORY_SKIP_SNAPSHOT),
            EXPSEG_OK);
  void *p;
  ASSERT_EQ(expseg_malloc(a, 4096, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  std::vector<Ev> ev = Events(a);
  EXPECT_EQ(Count(ev, "alloc"), 0u);
  EXPECT_EQ(Count(ev, "snapshot"), 0u);
  EXPECT_EQ(Count(ev, "free_requested"), 1u);
  EXPECT_EQ(Count(ev, "free_completed"), 1u);
  EXPECT_GE(Count(ev, "segment_alloc") + Count(ev, "segment_map"), 1u);
  // segment_map/unmap are not PyTorch's skip_actions: refused, the history untouched
  EXPECT_EQ(expseg_record_history_ex(a, true, 1000, 1u << 13), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("unknown flags 0x2000"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(Events(a).size(), ev.size());
}

// The one table of PyTorch's skip_actions names (the Python helper and the C++ backend read
// it), walked through expseg_history_skip_action_names: each name gives its own public
// EXPSEG_HISTORY_SKIP_* flag (one bit each, no two alike, all seven covered), any other
// name is refused and named; each flag leaves out the event of its name.
std::vector<std::string> split_names(const std::string &list) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= list.size();) {
    size_t end = list.find(", ", at);
    if (end == std::string::npos) end = list.size();
    out.push_back(list.substr(at, end - at));
    at = end + 2;
  }
  return out;
}

TEST(HistoryArgs, SkipActionTableNamesEachFlag) {
  const unsigned all = EXPSEG_HISTORY_SKIP_ALLOC | EXPSEG_HISTORY_SKIP_FREE_REQUESTED |
                       EXPSEG_HISTORY_SKIP_FREE_COMPLETED | EXPSEG_HISTORY_SKIP_SEGMENT_ALLOC |
                       EXPSEG_HISTORY_SKIP_SEGMENT_FREE | EXPSEG_HISTORY_SKIP_OOM |
                       EXPSEG_HISTORY_SKIP_SNAPSHOT;
  const std::string names = expseg_history_skip_action_names();
  const std::vector<std::string> want = split_names(names);
  ASSERT_EQ(want.size(), 7u) << names;
  unsigned seen = 0;
  for (const std::string &w : want) {
    unsigned f = 0;
    EXPECT_EQ(expseg_history_skip_action(w.c_str(), &f), EXPSEG_OK) << w;
    EXPECT_TRUE(f != 0 && (f & (f - 1)) == 0) << w << ": one flag, got " << f;
    EXPECT_EQ(f & ~all, 0u) << w << ": not a public EXPSEG_HISTORY_SKIP_* flag";
    EXPECT_EQ(f & seen, 0u) << w << ": a flag another name gave";
    seen |= f;
  }
  EXPECT_EQ(seen, all) << names;
  // "oom" is the one whose event the loop at the end cannot bring about
  unsigned oom = 0;
  EXPECT_EQ(expseg_history_skip_action("oom", &oom), EXPSEG_OK);
  EXPECT_EQ(oom, EXPSEG_HISTORY_SKIP_OOM);
  for (const char *bad : {"segment_map", "Alloc", "", "alloc "}) {
    unsigned f = 7;
    EXPECT_EQ(expseg_history_skip_action(bad, &f), EXPSEG_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_EQ(f, 0u);
    std::string m = expseg_last_error();
    EXPECT_NE(m.find("'" + std::string(bad) + "'"), std::string::npos) << m;
    EXPECT_NE(m.find(names), std::string::npos) << m;
  }
  unsigned f = 0;
  EXPECT_EQ(expseg_history_skip_action(nullptr, &f), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_history_skip_action("alloc", nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  // each flag, recorded with the others off, leaves out its own action only
  for (const std::string &w : want) {
    if (w == "oom") continue; // no out-of-memory here
    expseg_allocator *a = nullptr; // classic segments: segment_alloc and segment_free
    ASSERT_EQ(expseg_create("sim", 0, "expandable_segments:False", &a), EXPSEG_OK);
    ASSERT_EQ(expseg_history_skip_action(w.c_str(), &f), EXPSEG_OK);
    ASSERT_EQ(expseg_record_history_ex(a, true, 1000, f), EXPSEG_OK);
    void *p;
    ASSERT_EQ(expseg_malloc(a, 4096, 0, &p), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    std::vector<Ev> ev = Events(a); // takes a snapshot
    for (const std::string &act : want) {  // the events are named as the actions
      if (act != "oom") {
        EXPECT_EQ(Count(ev, act.c_str()) == 0, act == w) << w << " " << act;
      }
    }
    expseg_destroy(a);
  }
}

// PyTorch's pushCompileContext / popCompileContext / setUserMetadata: each later event
// carries the top of the stack and the metadata, in the walk and in the pickle; both are
// kept while the history is off; an annotate event's text replaces the metadata.
TEST(HistoryArgs, CompileContextAndUserMetadataReachEachLaterEvent) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_history_push_compile_context(a, "before"), EXPSEG_OK); // history off
  ASSERT_EQ(expseg_history_set_user_metadata(a, "run 7"), EXPSEG_OK);
  ASSERT_EQ(expseg_record_history_ex(a, true, 100, 0), EXPSEG_OK);
  void *p, *q, *r;
  ASSERT_EQ(expseg_malloc(a, 1000, 0, &p), EXPSEG_OK);                // before / run 7
  ASSERT_EQ(expseg_history_push_compile_context(a, "graph 2"), EXPSEG_OK);
  ASSERT_EQ(expseg_history_set_user_metadata(a, ""), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 2000, 0, &q), EXPSEG_OK);                // graph 2 / ""
  ASSERT_EQ(expseg_history_annotate(a, q, "note"), EXPSEG_OK);         // graph 2 / note
  ASSERT_EQ(expseg_history_pop_compile_context(a), EXPSEG_OK);
  ASSERT_EQ(expseg_history_pop_compile_context(a), EXPSEG_OK);
  ASSERT_EQ(expseg_history_pop_compile_context(a), EXPSEG_OK);        // empty: nothing
  ASSERT_EQ(expseg_malloc(a, 3000, 0, &r), EXPSEG_OK);                // N/A / ""
  char buf[16];
  ASSERT_EQ(expseg_history_set_user_metadata(a, "after"), EXPSEG_OK);
  EXPECT_EQ(expseg_history_user_metadata(a, buf, sizeof buf), 6u);
  EXPECT_STREQ(buf, "after");
  EXPECT_EQ(expseg_history_user_metadata(a, buf, 3), 6u);
  EXPECT_STREQ(buf, "af");
  EXPECT_EQ(expseg_history_push_compile_context(a, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_history_set_user_metadata(nullptr, "x"), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_history_pop_compile_context(nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  struct W {
    std::string action, compile, meta;
    uint64_t size;
  };
  std::vector<W> ev;
  ASSERT_EQ(expseg_walk(
                a, nullptr,
                [](void *ctx, const expseg_walk_event *e) {
                  static_cast<std::vector<W> *>(ctx)->push_back(
                      {e->action, e->compile_context, e->user_metadata, e->size});
                },
                &ev),
            EXPSEG_OK);
  std::vector<std::string> got;
  for (const W &e : ev)
    if (e.action == "alloc" || e.action == "annotate")
      got.push_back(e.action + " " + std::to_string(e.size) + " " + e.compile + " '" + e.meta + "'");
  EXPECT_EQ(got, (std::vector<std::string>{"alloc 1000 before 'run 7'", "alloc 2000 graph 2 ''",
                                           "annotate 2000 graph 2 'note'",
                                           "alloc 3000 N/A ''"}));
  EXPECT_EQ(ev.back().meta, "after"); // the walk's own snapshot event
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 is not on PATH: the pickle was not read";
  std::string path = TmpPath("compile_context.pickle");
  ASSERT_EQ(expseg_snapshot_dump(a, path.c_str()), EXPSEG_OK) << expseg_last_error();
  std::string out;
  int rc = snapshot_run(
      "python3 -c \"import pickle,sys\n"
      "s = pickle.load(open(sys.argv[1], 'rb'))\n"
      "for e in s['device_traces'][0]:\n"
      "  if e['action'] in ('alloc', 'annotate'): print(e['action'], e['size'], "
      "e['compile_context'], repr(e['user_metadata']))\" '" + path + "'",
      &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "alloc 1000 before 'run 7'\nalloc 2000 graph 2 ''\nannotate 2000 graph 2 'note'\n"
                 "alloc 3000 N/A ''\n");
  unlink(path.c_str());
  for (void *x : {p, q, r}) ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
}

TEST(HistoryArgs, ClearHistoryDropsWhatWasRecordedAndPlainReenablingKeepsIt) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, 0), EXPSEG_OK);
  void *p;
  ASSERT_EQ(expseg_malloc(a, 4096, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, 0), EXPSEG_OK);
  EXPECT_EQ(Count(Events(a), "alloc"), 1u);
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, EXPSEG_HISTORY_CLEAR), EXPSEG_OK);
  std::vector<Ev> ev = Events(a);
  ASSERT_EQ(ev.size(), 1u);  // the walk's own snapshot event only
  EXPECT_EQ(ev[0].action, "snapshot");
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  EXPECT_EQ(Count(Events(a), "free_completed"), 1u);  // still recording after the clear
}

TEST(HistoryArgs, SnapshotWithoutTracesKeepsTheStateAndItsFrames) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, 0), EXPSEG_OK);
  expseg_frame f = {"model.py", "forward", 42};
  ASSERT_EQ(expseg_history_push_frames(&f, 1), EXPSEG_OK);
  void *p, *q;
  ASSERT_EQ(expseg_malloc(a, 4096, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 3 << 20, 0, &q), EXPSEG_OK);
  expseg_history_pop_frames(1);
  unsigned char *buf;
  size_t len;
  EXPECT_EQ(expseg_snapshot_ex(a, 2, &buf, &len), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("unknown flags 0x2"), std::string::npos);
  ASSERT_EQ(expseg_snapshot_ex(a, EXPSEG_SNAPSHOT_NO_TRACES, &buf, &len), EXPSEG_OK);
  unsigned char *full;
  size_t full_len;
  ASSERT_EQ(expseg_snapshot(a, &full, &full_len), EXPSEG_OK);
  EXPECT_LT(len, full_len);
  expseg_snapshot_free(buf);
  expseg_snapshot_free(full);
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 is not on PATH: the pickle was not read";
  std::string path = TmpPath("no_traces.pickle");
  ASSERT_EQ(expseg_snapshot_dump_ex(a, path.c_str(), EXPSEG_SNAPSHOT_NO_TRACES), EXPSEG_OK);
  std::string text = PyRead(path);
  EXPECT_EQ(text.find("alloc"), std::string::npos) << text;  // no event at all
  EXPECT_NE(text.find("framed_blocks 2"), std::string::npos) << text;
  unlink(path.c_str());
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, q), EXPSEG_OK);
}

TEST(HistoryArgs, AllocationTracebackOfOnePointer) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  void *early;
  ASSERT_EQ(expseg_malloc(a, 512, 0, &early), EXPSEG_OK);
  char buf[256];
  size_t need = 0;
  EXPECT_EQ(expseg_allocation_traceback(a, early, buf, sizeof buf, &need),
            EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("the history is off"), std::string::npos)
      << expseg_last_error();
  ASSERT_EQ(expseg_record_history_ex(a, true, 4, 0), EXPSEG_OK);
  expseg_frame f[2] = {{"train.py", "main", 10}, {"model.py", "forward", 42}};
  ASSERT_EQ(expseg_history_push_frames(f, 2), EXPSEG_OK);
  void *p;
  ASSERT_EQ(expseg_malloc(a, 4096, 0, &p), EXPSEG_OK);
  expseg_history_pop_frames(2);
  ASSERT_EQ(expseg_allocation_traceback(a, p, buf, sizeof buf, &need), EXPSEG_OK)
      << expseg_last_error();
  const std::string want = "model.py:42:forward\ntrain.py:10:main\n";  // innermost first
  EXPECT_EQ(std::string(buf), want);
  EXPECT_EQ(need, want.size() + 1);
  char small[8];
  ASSERT_EQ(expseg_allocation_traceback(a, p, small, sizeof small, &need), EXPSEG_OK);
  EXPECT_EQ(std::string(small), want.substr(0, 7));  // truncated, terminated
  EXPECT_EQ(need, want.size() + 1);
  EXPECT_EQ(expseg_allocation_traceback(a, early, buf, sizeof buf, &need),
            EXPSEG_ERR_INVALID_ARGUMENT);  // made before recording started
  EXPECT_NE(std::string(expseg_last_error()).find("no longer holds its alloc event"),
            std::string::npos)
      << expseg_last_error();
  int x;
  EXPECT_EQ(expseg_allocation_traceback(a, &x, buf, sizeof buf, &need),
            EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("not a live allocation"), std::string::npos);
  // a freed address reused: the traceback is the new allocation's, not the old one's
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  void *r;
  ASSERT_EQ(expseg_malloc(a, 4096, 0, &r), EXPSEG_OK);
  ASSERT_EQ(r, p);
  ASSERT_EQ(expseg_allocation_traceback(a, r, buf, sizeof buf, &need), EXPSEG_OK);
  EXPECT_EQ(std::string(buf), "");  // no frames pushed this time
  ASSERT_EQ(expseg_free(a, r), EXPSEG_OK);
  // reused while allocs are skipped: the older allocation's frames are not this one's
  ASSERT_EQ(expseg_record_history_ex(a, true, 100, EXPSEG_HISTORY_SKIP_ALLOC), EXPSEG_OK);
  ASSERT_EQ(expseg_history_push_frames(f, 2), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 4096, 0, &r), EXPSEG_OK);
  expseg_history_pop_frames(2);
  ASSERT_EQ(expseg_free(a, r), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 4096, 0, &r), EXPSEG_OK);  // not recorded
  ASSERT_EQ(r, p);
  EXPECT_EQ(expseg_allocation_traceback(a, r, buf, sizeof buf, &need),
            EXPSEG_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(expseg_free(a, r), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, early), EXPSEG_OK);
}

// A snapshot written to a path that cannot be opened records nothing (no `snapshot` event,
// on the device's history or the host pool's) and returns the error naming the path.
TEST(HistoryArgs, SnapshotToAPathThatCannotBeOpenedRecordsNothing) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, 0), EXPSEG_OK);
  void *p;
  ASSERT_EQ(expseg_malloc(a, 1 << 20, 0, &p), EXPSEG_OK);
  const size_t before = Count(Events(a), "snapshot");  // the walk's own included
  const std::string bad = TmpPath("no_such_dir") + "/s.pickle";
  for (unsigned flags : {0u, EXPSEG_SNAPSHOT_NO_TRACES}) {
    EXPECT_EQ(expseg_snapshot_dump_ex(a, bad.c_str(), flags), EXPSEG_ERR_INVALID_ARGUMENT);
    const std::string msg = expseg_last_error();
    EXPECT_NE(msg.find(bad), std::string::npos) << msg;
    EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  }
  // one more: the second walk's own; none from the failed dumps
  EXPECT_EQ(Count(Events(a), "snapshot"), before + 1);
  // the host pool's history too
  expseg_host_pool *h = nullptr;
  ASSERT_EQ(expseg_host_create("sim", 0, "", &h), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_host_record_history(h, true, 100, 0), EXPSEG_OK);
  EXPECT_EQ(expseg_snapshot_dump_with_host(a, h, bad.c_str(), 0), EXPSEG_ERR_INVALID_ARGUMENT);
  const std::string good = TmpPath("host.pickle");
  ASSERT_EQ(expseg_snapshot_dump_with_host(a, h, good.c_str(), 0), EXPSEG_OK)
      << expseg_last_error();
  EXPECT_EQ(Count(Events(a), "snapshot"), before + 3);  // the good dump's and this walk's
  if (snapshot_have_python()) {
    std::string out;
    ASSERT_EQ(snapshot_run("python3 -c \"import pickle,sys\n"
                           "s = pickle.load(open(sys.argv[1], 'rb'))\n"
                           "print([e['action'] for e in s['host_traces']])\" '" + good + "'",
                           &out),
              0)
        << out;
    EXPECT_EQ(out, "['snapshot']\n");  // the good dump's only
  }
  unlink(good.c_str());
  expseg_host_destroy(h);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
}

}  // namespace
