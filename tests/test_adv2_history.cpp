// SPDX-License-Identifier: Apache-2.0
// test_adv2_history.cpp: the history and snapshot calls pushed where callers rarely go:
// skip_actions that keep everything or nothing, tracebacks after the skip flags changed
// (an older allocation at the same address must never lend its frames), annotations and
// frames with empty, very long and non-UTF-8 text (the snapshot must still load in Python),
// pops past the bottom of the pushed frames, and snapshots without traces.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "alloc_support.h"
#include "expseg.h"
#include "snapshot_check.h"

namespace {

std::vector<std::string> walk_actions(expseg_allocator *a) {
  std::vector<std::string> v;
  EXPECT_EQ(expseg_walk(
                a, nullptr,
                [](void *ctx, const expseg_walk_event *e) {
                  static_cast<std::vector<std::string> *>(ctx)->push_back(e->action);
                },
                &v),
            EXPSEG_OK);
  return v;
}

TEST(Adv2History, SkipEverythingOrNothing) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  const unsigned all = EXPSEG_HISTORY_SKIP_ALLOC | EXPSEG_HISTORY_SKIP_FREE_REQUESTED |
                       EXPSEG_HISTORY_SKIP_FREE_COMPLETED | EXPSEG_HISTORY_SKIP_SEGMENT_ALLOC |
                       EXPSEG_HISTORY_SKIP_SEGMENT_FREE | EXPSEG_HISTORY_SKIP_OOM |
                       EXPSEG_HISTORY_SKIP_SNAPSHOT;
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, all), EXPSEG_OK) << expseg_last_error();
  void *p;
  ASSERT_EQ(expseg_malloc(a, 3 << 20, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  void *q = nullptr;
  EXPECT_EQ(expseg_malloc(a, (size_t)1 << 59, 0, &q), EXPSEG_ERR_OUT_OF_MEMORY);
  std::vector<std::string> got = walk_actions(a);
  for (const std::string &s : got)
    EXPECT_TRUE(s == "segment_map" || s == "segment_unmap") << "skipped action recorded: " << s;
  // an annotation is not one of the skippable actions
  ASSERT_EQ(expseg_history_annotate(a, nullptr, "mark"), EXPSEG_OK);
  got = walk_actions(a);
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.back(), "annotate");

  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, EXPSEG_HISTORY_CLEAR), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 3 << 20, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  got = walk_actions(a);
  std::string joined;
  for (const std::string &s : got) joined += s + ",";
  for (const char *want : {"alloc", "free_requested", "free_completed", "snapshot"})
    EXPECT_NE(joined.find(want), std::string::npos) << want << " missing: " << joined;
  EXPECT_EQ(expseg_record_history_ex(a, true, 1000, 1u << 13), EXPSEG_ERR_INVALID_ARGUMENT)
      << "a skip bit of no action is refused";
  EXPECT_NE(std::string(expseg_last_error()).find("0x2000"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(expseg_check(a), EXPSEG_OK);
}

// The flags change between two allocations at the same address; the frees of the first were
// not recorded. The traceback of the second must not be the first one's.
TEST(Adv2History, TracebackNeverLendsAnOlderAllocationsFrames) {
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 100, EXPSEG_HISTORY_SKIP_FREE_COMPLETED),
            EXPSEG_OK);
  expseg_frame old_frames[1] = {{"old.py", "first_owner", 1}};
  ASSERT_EQ(expseg_history_push_frames(old_frames, 1), EXPSEG_OK);
  void *p, *r;
  ASSERT_EQ(expseg_malloc(a, 4096, 0, &p), EXPSEG_OK);
  expseg_history_pop_frames(1);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK); // free_requested recorded, free_completed not
  // allocs are skipped from now on (the events so far are kept)
  ASSERT_EQ(expseg_record_history_ex(a, true, 100,
                                     EXPSEG_HISTORY_SKIP_ALLOC | EXPSEG_HISTORY_SKIP_FREE_COMPLETED),
            EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 4096, 0, &r), EXPSEG_OK);
  ASSERT_EQ(r, p) << "the same address is handed out again";
  char buf[256] = "";
  size_t need = 0;
  expseg_status st = expseg_allocation_traceback(a, r, buf, sizeof buf, &need);
  EXPECT_EQ(std::string(buf).find("first_owner"), std::string::npos)
      << "the traceback of the new allocation names the freed one's frames: " << buf;
  EXPECT_EQ(st, EXPSEG_ERR_INVALID_ARGUMENT);
  // and the message says why: alloc events are skipped, not dropped from the ring
  EXPECT_NE(std::string(expseg_last_error()).find("SKIP_ALLOC"), std::string::npos)
      << expseg_last_error();
  ASSERT_EQ(expseg_free(a, r), EXPSEG_OK);
  // freed, interior and foreign pointers
  EXPECT_EQ(expseg_allocation_traceback(a, r, buf, sizeof buf, &need), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("not a live allocation"), std::string::npos);
  ASSERT_EQ(expseg_record_history_ex(a, true, 100, 0), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 8192, 0, &r), EXPSEG_OK);
  EXPECT_EQ(expseg_allocation_traceback(a, static_cast<char *>(r) + 512, buf, sizeof buf, &need),
            EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_allocation_traceback(a, r, nullptr, 0, &need), EXPSEG_OK)
      << "sizing call with no buffer";
  EXPECT_EQ(expseg_allocation_traceback(a, r, nullptr, 8, &need), EXPSEG_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(expseg_free(a, r), EXPSEG_OK);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK);
}

TEST(Adv2History, OddTextStillMakesALoadableSnapshot) {
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 with pickle is needed";
  AllocPtr al = make_alloc("sim", "");
  ASSERT_TRUE(al);
  expseg_allocator *a = al.get();
  ASSERT_EQ(expseg_record_history_ex(a, true, 1000, 0), EXPSEG_OK);
  // more pops than pushes: the stack is empty, not wrapped
  expseg_history_pop_frames(5);
  expseg_frame f[3] = {{"", "", 0}, {"caf\xc3\xa9.py", "\xff\xfe bad", -1},
                       {"dir/\xe2\x82", "trunc\xe2", 2147483647}};
  ASSERT_EQ(expseg_history_push_frames(f, 3), EXPSEG_OK);
  EXPECT_EQ(expseg_history_push_frames(nullptr, 1), EXPSEG_ERR_INVALID_ARGUMENT);
  void *p;
  ASSERT_EQ(expseg_malloc(a, 1000, 0, &p), EXPSEG_OK);
  expseg_history_pop_frames(1000); // unbalanced: more than pushed
  std::string longtext(100000, 'x');
  ASSERT_EQ(expseg_history_annotate(a, p, ""), EXPSEG_OK);
  ASSERT_EQ(expseg_history_annotate(a, p, longtext.c_str()), EXPSEG_OK);
  ASSERT_EQ(expseg_history_annotate(a, nullptr, "\x80\x81\xc0\xaf"), EXPSEG_OK);
  EXPECT_EQ(expseg_history_annotate(a, p, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  int local;
  EXPECT_EQ(expseg_history_annotate(a, &local, "x"), EXPSEG_ERR_INVALID_ARGUMENT);
  void *after;
  ASSERT_EQ(expseg_malloc(a, 2000, 0, &after), EXPSEG_OK); // recorded with no frames
  char buf[4096];
  size_t need = 0;
  ASSERT_EQ(expseg_allocation_traceback(a, after, buf, sizeof buf, &need), EXPSEG_OK);
  EXPECT_STREQ(buf, "") << "frames popped past the bottom come back";

  std::string path = ::testing::TempDir() + "adv2_history.pickle";
  for (unsigned flags : {0u, (unsigned)EXPSEG_SNAPSHOT_NO_TRACES}) {
    ASSERT_EQ(expseg_snapshot_dump_ex(a, path.c_str(), flags), EXPSEG_OK) << expseg_last_error();
    std::string out;
    int rc = snapshot_run(
        "python3 -c \"import pickle,sys; d=pickle.load(open(sys.argv[1],'rb')); "
        "t=[e for tr in d['device_traces'] for e in tr]; "
        "ann=[e for e in t if e['action']=='annotate']; "
        "print(len(t), len(ann), sorted(len(e.get('user_metadata','')) for e in ann), "
        "sum(1 for e in t for fr in e.get('frames',[]) if '\\ufffd' in fr['filename']+fr['name']))"
        "\" '" + path + "'",
        &out);
    ASSERT_EQ(rc, 0) << "flags " << flags << ": the snapshot does not load: " << out;
    if (flags == 0) {
      EXPECT_NE(out.find(" 3 [0, 4"), std::string::npos)
          << "three annotations (empty, replaced bytes, long): " << out;
      EXPECT_NE(out.find("100000]"), std::string::npos) << "the long text kept whole: " << out;
    } else {
      EXPECT_EQ(out.rfind("0 0 [] 0", 0), 0u) << "no traces: " << out;
    }
    std::string chk;
    EXPECT_EQ(snapshot_check(path, "", false, &chk), 0) << chk;
  }
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, after), EXPSEG_OK);
}

} // namespace
