// SPDX-License-Identifier: Apache-2.0
// test_trace_viewers.cpp: expseg's snapshots opened by PyTorch's own tools, as users open
// them: the memory viewer's unpickler and annotate_snapshot (MemoryViz.js, an older and a
// newer version, under node; tests/check_viewers.js) and every subcommand of
// torch/cuda/_memory_viz.py (plain python3; tests/check_memory_viz.py). The PyTorch files
// are test fixtures read from ../shared/reference/pytorch-viewer/ (the test skips, saying
// so, where they or node are absent). Snapshots of each kind: the C API with private pools,
// a configuration string, annotations (events and external_annotations) and pushed frames; a replay of a recorded history (whose frames
// must come through the replay); a snapshot with the pinned host pool (host_segments and
// host_traces, checked block by block against the pool's statistics, and run through every
// _memory_viz.py subcommand in the place of the device's segments and trace).
#include <gtest/gtest.h>

#include "trace_support.h"

#include "expseg.h"
#include "host_pool_support.h"
#include "snapshot_check.h"
#include "test_replay_common.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

extern "C" {
#include "trace.h"
int expseg_replay_main(int argc, char **argv, FILE *out, FILE *err);
}

namespace {

const std::string kViewerDir = EXPSEG_SOURCE_DIR "/../shared/reference/pytorch-viewer";
const char *const kViewers[] = {"MemoryViz_v1.js", "MemoryViz_v2.js"};

bool Exists(const std::string &p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

bool HaveNode() {
  static int ok = -1;
  if (ok < 0) ok = system("node --version >/dev/null 2>&1") == 0;
  return ok == 1;
}

std::string TmpDir() {
  char t[] = "/tmp/expseg_viewers_XXXXXX";
  EXPECT_NE(mkdtemp(t), nullptr);
  return t;
}

// Opens snap in both viewers; extra: more arguments for check_viewers.js.
void OpenInViewers(const std::string &snap, const std::string &extra) {
  for (const char *v : kViewers) {
    SCOPED_TRACE(v);
    std::string out;
    int rc = snapshot_run("node " EXPSEG_SOURCE_DIR "/tests/check_viewers.js '" + kViewerDir +
                              "/" + v + "' '" + snap + "' " + extra,
                          &out);
    EXPECT_EQ(rc, 0) << out;
    EXPECT_NE(out.find("opens in"), std::string::npos) << out;
  }
}

void RunMemoryViz(const std::string &snap, const std::string &snap2, const std::string &extra) {
  std::string out;
  int rc = snapshot_run("python3 " EXPSEG_SOURCE_DIR "/tests/check_memory_viz.py '" + kViewerDir +
                            "/_memory_viz.py' '" + snap + "' '" + snap2 + "' " + extra,
                        &out);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("every _memory_viz.py subcommand ran"), std::string::npos) << out;
}

#define REQUIRE_VIEWERS()                                                                   \
  do {                                                                                      \
    if (!Exists(kViewerDir + "/MemoryViz_v1.js"))                                           \
      GTEST_SKIP() << "PyTorch's viewer files are missing: expected " << kViewerDir         \
                   << " (../shared/reference/pytorch-viewer next to the repository)";       \
  } while (0)

// After the checks that could run: a skip that says what did not.
#define SKIP_WITHOUT_NODE_OR_PYTHON()                                                       \
  do {                                                                                      \
    if (!HaveNode())                                                                        \
      GTEST_SKIP() << "node is not on PATH (Debian: apt-get install nodejs): the viewers' " \
                      "unpickler did not run";                                              \
    if (!snapshot_have_python())                                                            \
      GTEST_SKIP() << "python3 is not on PATH: _memory_viz.py did not run";                 \
  } while (0)

int Replay(std::vector<std::string> args, std::string *out_text);

// The C API: pools, a user's configuration string, pushed frames; then a second snapshot
// after more segments came, for `compare`.
TEST(Viewers, CApiSnapshotsOpenInBothViewersAndMemoryViz) {
  REQUIRE_VIEWERS();
  const char *conf = "expandable_segments:True,garbage_collection_threshold:0.8";
  expseg_allocator *a;
  ASSERT_EQ(expseg_create("sim", 0, conf, &a), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_record_history_ex(a, true, SIZE_MAX, 0), EXPSEG_OK);
  expseg_frame f[2] = {{"train.py", "main", 10}, {"model.py", "forward", 42}};
  ASSERT_EQ(expseg_history_push_frames(f, 2), EXPSEG_OK);
  std::vector<void *> live;
  for (size_t i = 0; i < 40; i++) {
    void *p;
    ASSERT_EQ(expseg_malloc(a, (i % 7 + 1) * 300000 + i, (expseg_stream)(i % 3), &p), EXPSEG_OK);
    live.push_back(p);
  }
  expseg_history_pop_frames(2);
  expseg_pool_id pool;
  ASSERT_EQ(expseg_pool_create(a, &pool), EXPSEG_OK);
  for (size_t i = 0; i < 10; i++) {
    void *p;
    ASSERT_EQ(expseg_malloc_pool(a, (i + 1) << 20, 0, pool, &p), EXPSEG_OK);
    live.push_back(p);
  }
  // a region put to sleep and woken (expseg's own "sleep" and "wake" events)
  ASSERT_EQ(expseg_region_begin(a, "weights"), EXPSEG_OK);
  for (size_t i = 0; i < 3; i++) {
    void *p;
    ASSERT_EQ(expseg_malloc(a, (i + 3) << 20, 0, &p), EXPSEG_OK);
  }
  ASSERT_EQ(expseg_region_end(a, "weights"), EXPSEG_OK);
  ASSERT_EQ(expseg_sleep(a, "weights", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_wake(a, "weights"), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_history_annotate(a, live[1], "kv cache of request 7"), EXPSEG_OK);
  ASSERT_EQ(expseg_history_annotate(a, nullptr, "step 1"), EXPSEG_OK);
  { // record_function scopes (external_annotations), one with text the viewers must escape
    const char *k[] = {"name", "stage"};
    const char *v1[] = {"## forward ##", "START"}, *v2[] = {"say \"hi\" \u00e9", "END"};
    ASSERT_EQ(expseg_history_record_annotation(a, k, v1, 2), EXPSEG_OK);
    ASSERT_EQ(expseg_history_record_annotation(a, k, v2, 2), EXPSEG_OK);
  }
  for (size_t i = 0; i < live.size(); i += 3) ASSERT_EQ(expseg_free(a, live[i]), EXPSEG_OK);
  std::string dir = TmpDir(), one = dir + "/one.pickle", two = dir + "/two.pickle";
  ASSERT_EQ(expseg_snapshot_dump(a, one.c_str()), EXPSEG_OK) << expseg_last_error();
  // a runtime change: PyTorch's PYTORCH_CUDA_ALLOC_CONF is then the text last given
  ASSERT_EQ(expseg_configure(a, "max_split_size_mb:64"), EXPSEG_OK) << expseg_last_error();
  for (size_t i = 0; i < 5; i++) {
    void *p;
    ASSERT_EQ(expseg_malloc(a, (64u << 20) + i, 1, &p), EXPSEG_OK);
  }
  // the second snapshot shows the region asleep
  ASSERT_EQ(expseg_sleep(a, "weights", EXPSEG_SLEEP_DISCARD), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_snapshot_dump(a, two.c_str()), EXPSEG_OK) << expseg_last_error();
  expseg_destroy(a);

  if (HaveNode()) {
    OpenInViewers(one, std::string("--conf '") + conf + "' --min-framed 20");
    OpenInViewers(two, "--conf max_split_size_mb:64");
  }
  if (snapshot_have_python()) {
    RunMemoryViz(one, two, "--min-framed 20");
    RunMemoryViz(two, one, "");
    std::string out;
    for (const std::string &snap : {one, two}) { // expseg's checker, with the two new actions
      EXPECT_EQ(snapshot_check(snap, "{\"counts\": {\"sleep\": " +
                                         std::string(snap == one ? "1" : "2") +
                                         ", \"wake\": 1}}",
                               false, &out),
                0)
          << out;
    }
  }
  // expseg-replay reads its own snapshots, passing over sleep and wake
  std::string text;
  EXPECT_EQ(Replay({"--quiet", two}, &text), 0) << text;
  EXPECT_EQ(system(("rm -rf '" + dir + "'").c_str()), 0);
  SKIP_WITHOUT_NODE_OR_PYTHON();
}

// The pinned host pool next to a device allocator: blocks of every kind (a power of two's
// own chunk, carved exact sizes, reserve slices and the reserve's unused tail), a block
// pending on a held stream, freed ones, pushed frames; the history of both.
TEST(Viewers, HostPoolSnapshotsOpenInBothViewersAndMemoryViz) {
  REQUIRE_VIEWERS();
  expseg_allocator *a;
  ASSERT_EQ(expseg_create("sim", 0, "expandable_segments:True", &a), EXPSEG_OK) << expseg_last_error();
  PoolPtr h = make_pool("host", "pinned_reserve_segment_size_mb:1,pinned_max_round_threshold_mb:1");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(expseg_host_record_history(h.get(), true, 0, 0), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(strstr(expseg_last_error(), "expseg_host_record_history: max_entries is 0"), nullptr)
      << expseg_last_error();
  ASSERT_EQ(expseg_record_history_ex(a, true, SIZE_MAX, 0), EXPSEG_OK);
  ASSERT_EQ(expseg_host_record_history(h.get(), true, SIZE_MAX, 0), EXPSEG_OK);
  expseg_frame f[2] = {{"loader.py", "main", 3}, {"loader.py", "pin_batch", 17}};
  ASSERT_EQ(expseg_history_push_frames(f, 2), EXPSEG_OK);
  std::vector<void *> live;
  const size_t sizes[] = {4096, 100000, 300000, 1500000, 2600000, 3100000, 5000000, 700};
  for (size_t i = 0; i < 24; i++) {
    void *p;
    ASSERT_EQ(expseg_host_malloc(h.get(), sizes[i % 8] + i, &p), EXPSEG_OK) << expseg_last_error();
    live.push_back(p);
  }
  void *d;
  ASSERT_EQ(expseg_malloc(a, 3 << 20, 0, &d), EXPSEG_OK);
  expseg_history_pop_frames(2);
  // one freed block waits for a held stream: active_pending_free
  ASSERT_EQ(_expseg_vmm_hold_stream(_expseg_host_pool_driver(h.get()), 9, true), EXPSEG_OK);
  ASSERT_EQ(expseg_host_record_stream(h.get(), live[4], 9), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(h.get(), live[4]), EXPSEG_OK);
  size_t n_live = 0;
  for (size_t i = 0; i < live.size(); i++) {
    if (i == 4) continue;
    if (i % 3 == 0) {
      ASSERT_EQ(expseg_host_free(h.get(), live[i]), EXPSEG_OK);
    } else {
      n_live++;
    }
  }
  std::string dir = TmpDir(), one = dir + "/one.pickle", two = dir + "/two.pickle",
              three = dir + "/three.pickle";
  int64_t reserved = hstat(h.get(), "reserved_bytes.current");
  ASSERT_EQ(expseg_snapshot_dump_with_host(a, h.get(), one.c_str(), 0), EXPSEG_OK)
      << expseg_last_error();
  ASSERT_EQ(_expseg_vmm_hold_stream(_expseg_host_pool_driver(h.get()), 9, false), EXPSEG_OK);
  for (size_t i = 0; i < live.size(); i++) {
    if (i == 4 || i % 3 == 0) continue;
    ASSERT_EQ(expseg_host_free(h.get(), live[i]), EXPSEG_OK);
  }
  ASSERT_EQ(expseg_host_empty_cache(h.get()), EXPSEG_OK);
  void *q;
  ASSERT_EQ(expseg_host_malloc(h.get(), 9 << 20, &q), EXPSEG_OK);
  int64_t reserved2 = hstat(h.get(), "reserved_bytes.current");
  ASSERT_EQ(expseg_snapshot_dump_with_host(a, h.get(), two.c_str(), 0), EXPSEG_OK);
  ASSERT_EQ(expseg_snapshot_dump_with_host(a, h.get(), three.c_str(), EXPSEG_SNAPSHOT_NO_TRACES),
            EXPSEG_OK);
  EXPECT_EQ(expseg_snapshot_dump_with_host(a, nullptr, three.c_str(), 0), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(strstr(expseg_last_error(), "the host pool is NULL"), nullptr) << expseg_last_error();
  ASSERT_EQ(expseg_host_free(h.get(), q), EXPSEG_OK);
  expseg_destroy(a);

  if (HaveNode()) {
    OpenInViewers(one, "--conf expandable_segments:True");
    OpenInViewers(two, "");
  }
  if (snapshot_have_python()) {
    char arg[160];
    // the first: 1 pending block, n_live allocated, 18+ framed allocated blocks
    snprintf(arg, sizeof arg, "--host %lld %zu 1 %zu", (long long)reserved, n_live, n_live);
    RunMemoryViz(one, two, arg);
    snprintf(arg, sizeof arg, "--host %lld 1 0 0", (long long)reserved2);
    RunMemoryViz(two, one, arg);
    snprintf(arg, sizeof arg, "--host %lld 1 0 0 --no-traces", (long long)reserved2);
    RunMemoryViz(three, one, arg);
  }
  EXPECT_EQ(system(("rm -rf '" + dir + "'").c_str()), 0);
  SKIP_WITHOUT_NODE_OR_PYTHON();
}

// expseg-replay in-process: its output and its messages, together (test_replay_common.h)
int Replay(std::vector<std::string> args, std::string *out_text) {
  replay_test::Outcome o = replay_test::Replay(std::move(args));
  *out_text = o.out + o.err;
  return o.rc;
}

// A recorded PyTorch history replayed through expseg, snapshot at the end.
TEST(Viewers, ReplaySnapshotsOpenInBothViewersAndMemoryViz) {
  REQUIRE_VIEWERS();
  std::string raw = EXPSEG_TRACES_DIR "/raw/wedsonlin_medium_128_training.pickle";
  if (!Exists(raw))
    GTEST_SKIP() << "the recorded traces are missing: expected " << raw
                 << " (../shared/traces next to the repository)";
  std::string dir = TmpDir(), text;
  for (const char *conf : {"expandable_segments:True", "expandable_segments:False"}) {
    SCOPED_TRACE(conf);
    std::string end = dir + "/end.pickle", peak = dir + "/peak.pickle";
    ASSERT_EQ(Replay({"--quiet", "--conf", conf, "--snapshot", end, "--snapshot-at", "end", raw},
                     &text),
              0)
        << text;
    ASSERT_EQ(Replay({"--quiet", "--conf", conf, "--snapshot", peak, "--snapshot-at", "peak", raw},
                     &text),
              0)
        << text;
    // every allocation carries the frames the recorded one had (its innermost 16, what a
    // history event keeps), read back through expseg's own reader: ids match one to one
    TraceSet orig, back;
    ASSERT_EQ(expseg_trace_read_file(raw.c_str(), &orig.s), EXPSEG_OK) << expseg_trace_last_error();
    ASSERT_EQ(expseg_trace_read_file(end.c_str(), &back.s), EXPSEG_OK) << expseg_trace_last_error();
    ASSERT_EQ(back.s.n, 1u);
    const expseg_trace_t &o = orig.s.traces[0], &b = back.s.traces[0];
    ASSERT_EQ(b.n_ids, o.n_ids);
    size_t framed = 0;
    for (uint64_t id = 0; id < o.n_ids; id++) {
      expseg_frame fo[16], fb[16];
      size_t no = expseg_trace_frames_of(&o, id, fo, 16), nb = expseg_trace_frames_of(&b, id, fb, 16);
      ASSERT_EQ(nb, no) << "id " << id;
      for (size_t k = 0; k < no; k++) {
        ASSERT_STREQ(fb[k].filename, fo[k].filename) << "id " << id << " frame " << k;
        ASSERT_STREQ(fb[k].name, fo[k].name) << "id " << id << " frame " << k;
        ASSERT_EQ(fb[k].line, fo[k].line) << "id " << id << " frame " << k;
      }
      framed += no > 0;
    }
    EXPECT_GT(framed, 600u) << "allocations with frames in " << raw;
    if (HaveNode()) {
      OpenInViewers(end, std::string("--conf ") + conf + " --min-framed 600");
      OpenInViewers(peak, std::string("--conf ") + conf);
    }
    if (snapshot_have_python()) RunMemoryViz(end, peak, "--min-framed 600");
  }
  EXPECT_EQ(system(("rm -rf '" + dir + "'").c_str()), 0);
  SKIP_WITHOUT_NODE_OR_PYTHON();
}

}  // namespace
