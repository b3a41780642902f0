// SPDX-License-Identifier: Apache-2.0
// test_trace_snapshot.cpp: snapshots of replayed recorded workloads (../shared/traces/raw).
// expseg-replay --snapshot writes the allocator's state and its history recorded from the
// start of the replay; the file must hold only the opcodes of PyTorch's viewer at protocol
// <= 4, pass the field-by-field check and the viewer's backward replay to an empty state
// (tests/check_snapshot.py, Python's pickle), and read back through expseg's own pickle
// reader (bench/replay/trace_pickle.c) into the history that was replayed: the same allocations
// and frees, in order, with the same sizes, streams and ids.
#include <gtest/gtest.h>

#include "trace_support.h"

#include "expseg.h"
#include "snapshot_check.h"
#include "test_replay_common.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

extern "C" {
#include "trace.h"
int expseg_replay_main(int argc, char **argv, FILE *out, FILE *err);
}

namespace {

// expseg-replay in-process: its output and its messages, together (test_replay_common.h)
int Replay(std::vector<std::string> args, std::string *out_text) {
  replay_test::Outcome o = replay_test::Replay(std::move(args));
  *out_text = o.out + o.err;
  return o.rc;
}

// Walks the opcodes of a pickle and fails on any that MemoryViz.js's unpickler does not
// accept (the list in ../shared/reference/pytorch-allocator.md §6.5), on PROTO > 4, and on
// anything after STOP. Returns the number of opcodes.
size_t WalkViewerOpcodes(const std::string &path) {
  FILE *f = fopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  if (!f) return 0;
  std::string d;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) d.append(buf, n);
  fclose(f);
  auto le = [&](size_t at, size_t k) {
    uint64_t v = 0;
    for (size_t i = 0; i < k && at + i < d.size(); i++) v |= uint64_t((unsigned char)d[at + i]) << (8 * i);
    return v;
  };
  size_t at = 0, ops = 0;
  bool stopped = false;
  while (at < d.size() && !stopped) {
    unsigned char op = (unsigned char)d[at++];
    ops++;
    size_t arg = 0;
    switch (op) {
    case 0x80: arg = 1; EXPECT_LE((unsigned char)d[at], 4) << "protocol"; break; // PROTO
    case 0x95: case 'G': arg = 8; break;                        // FRAME, BINFLOAT
    case '(': case 0x94: case '}': case 'd': case 's': case 'u': case ']': case 'l':
    case 'a': case 'e': case ')': case 't': case 0x85: case 0x86: case 0x87: case 'N':
    case 0x88: case 0x89: break;                                 // no argument
    case '.': stopped = true; break;                             // STOP
    case 'q': case 'h': case 'K': arg = 1; break;                // BINPUT, BINGET, BININT1
    case 'r': case 'j': case 'J': arg = 4; break;                // LONG_BINPUT/GET, BININT
    case 'M': arg = 2; break;                                    // BININT2
    case 0x8a: case 0x8c: arg = 1 + le(at, 1); break;            // LONG1, SHORT_BINUNICODE
    case 'X': arg = 4 + le(at, 4); break;                        // BINUNICODE
    default:
      ADD_FAILURE() << path << ": byte " << at - 1 << ": opcode 0x" << std::hex << int(op)
                    << " is not one the viewer unpickles";
      return ops;
    }
    at += arg;
  }
  EXPECT_TRUE(stopped) << path << ": no STOP";
  EXPECT_EQ(at, d.size()) << path << ": bytes after STOP";
  return ops;
}

// The allocations and frees a history makes: pre-live allocations count as allocations.
std::vector<expseg_trace_event_t> AllocFree(const expseg_trace_t &t) {
  std::vector<expseg_trace_event_t> v;
  for (size_t i = 0; i < t.n_events; i++) {
    expseg_trace_event_t e = t.events[i];
    if (e.kind == EXPSEG_TR_PRELIVE) e.kind = EXPSEG_TR_ALLOC;
    if (e.kind == EXPSEG_TR_ALLOC || e.kind == EXPSEG_TR_FREE) v.push_back(e);
  }
  return v;
}

class TraceSnapshot : public ::testing::TestWithParam<const char *> {};

TEST_P(TraceSnapshot, ReplayedWorkloadSnapshotReadsBackIntoTheSameHistory) {
  std::string dir = EXPSEG_TRACES_DIR;
  struct stat st;
  if (stat((dir + "/raw").c_str(), &st) != 0)
    GTEST_SKIP() << "the recorded traces are missing: expected " << dir
                 << "/raw (../shared/traces next to the repository)";
  bool python = snapshot_have_python();
  const char *stem = "wedsonlin_medium_128_inference";
  std::string raw = dir + "/raw/" + stem + ".pickle";
  char tmpl[] = "/tmp/expseg_trace_snapshot_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string conf = GetParam();
  for (const char *when : {"end", "peak"}) {
    SCOPED_TRACE(conf + ", snapshot at " + when);
    std::string snap = std::string(tmpl) + "/" + when + ".pickle", text;
    ASSERT_EQ(Replay({"--quiet", "--conf", conf, "--report", "--snapshot", snap, "--snapshot-at",
                      when, raw},
                     &text),
              0)
        << text;
    EXPECT_NE(text.find("PyTorch CUDA memory summary, device ID 0"), std::string::npos) << text;
    EXPECT_NE(text.find("snapshot at " + std::string(when == std::string("end") ? "the end" : "the peak")),
              std::string::npos)
        << text;
    EXPECT_GT(WalkViewerOpcodes(snap), 1000u);
    if (python) {
      std::string out;
      EXPECT_EQ(snapshot_check(snap, "", true, &out), 0) << out;
    }
    if (std::string(when) != "end") continue;
    TraceSet orig, back;
    ASSERT_EQ(expseg_trace_read_file(raw.c_str(), &orig.s), EXPSEG_OK) << expseg_trace_last_error();
    ASSERT_EQ(expseg_trace_read_file(snap.c_str(), &back.s), EXPSEG_OK) << expseg_trace_last_error();
    ASSERT_EQ(back.s.n, 1u);
    const expseg_trace_t &b = back.s.traces[0];
    for (size_t i = 0; i < b.n_events; i++) {
      ASSERT_NE(b.events[i].kind, EXPSEG_TR_PRELIVE) << "recorded from creation: nothing pre-live";
      ASSERT_NE(b.events[i].kind, EXPSEG_TR_FREE_REQ) << "expseg completes frees at once here";
    }
    std::vector<expseg_trace_event_t> want = AllocFree(orig.s.traces[0]), got = AllocFree(b);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); i++) {
      ASSERT_EQ(got[i].kind, want[i].kind) << "event " << i;
      ASSERT_EQ(got[i].id, want[i].id) << "event " << i;
      ASSERT_EQ(got[i].size, want[i].size) << "event " << i;
      ASSERT_EQ(got[i].stream, want[i].stream) << "event " << i;
    }
    EXPECT_TRUE(b.baseline.present);
    EXPECT_GT(b.baseline.segment_alloc + b.baseline.map, 0u);
    EXPECT_EQ(b.baseline.oom, 0u);
  }
  std::string cmd = std::string("rm -rf '") + tmpl + "'";
  EXPECT_EQ(system(cmd.c_str()), 0);
}

// bench/plot_memory.py --timeline marks the peaks of the statistics, not the largest sample:
// the peaks it reports equal the replay's reserved_bytes/allocated_bytes peaks, with samples
// only every 50 events.
TEST(PlotMemory, MarkedPeaksEqualTheStatistics) {
  if (!snapshot_have_python())
    GTEST_SKIP() << "python3 is not on PATH: the plot script needs it";
  char tmpl[] = "/tmp/expseg_plot_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl, csv = dir + "/t.csv", svg = dir + "/t.svg";
  for (const char *conf : {"expandable_segments:True", "expandable_segments:False"}) {
    SCOPED_TRACE(conf);
    std::string text;
    ASSERT_EQ(Replay({"--json", "--quiet", "--conf", conf, "--timeline", csv, "--timeline-every",
                      "50", "--synth", "train:3:0.05", "--synth", "infer:1:0.05"},
                     &text),
              0)
        << text;
    auto num = [](const std::string &s, const std::string &key) {
      size_t p = s.find("\"" + key + "\":");
      return p == std::string::npos ? -1.0 : atof(s.c_str() + p + key.size() + 3);
    };
    std::string plot;
    ASSERT_EQ(snapshot_run("python3 " EXPSEG_SOURCE_DIR "/bench/plot_memory.py --json --csv '" + csv +
                               "' --out '" + svg + "'",
                           &plot),
              0)
        << plot;
    EXPECT_EQ(num(plot, "peak_reserved"), num(text, "peak_reserved")) << plot << text;
    EXPECT_EQ(num(plot, "peak_allocated"), num(text, "peak_allocated")) << plot << text;
    // the lines pass through the peaks: the rows where they were reached are in the file
    EXPECT_EQ(num(plot, "line_max_reserved"), num(text, "peak_reserved")) << plot << text;
    EXPECT_EQ(num(plot, "line_max_allocated"), num(text, "peak_allocated")) << plot << text;
    EXPECT_GT(num(plot, "rows"), 10);
    FILE *f = fopen(svg.c_str(), "r");
    ASSERT_NE(f, nullptr);
    std::string s;
    char buf[4096];
    while (fgets(buf, sizeof buf, f)) s += buf;
    fclose(f);
    EXPECT_EQ(s.find("<svg"), 0u);
    EXPECT_NE(s.find("class=\"peak\""), std::string::npos);
    EXPECT_NE(s.find("peak reserved"), std::string::npos);
  }
  EXPECT_EQ(system(("rm -rf '" + dir + "'").c_str()), 0);
}

// plot_memory.py --snapshot: the history of a snapshot walked as the viewer walks it; its
// peaks are exact (every event is a point) and equal expseg's statistics for a history
// recorded from creation: live requested bytes = requested_bytes.all.peak, mapped bytes =
// expseg.mapped_bytes.peak (expandable segments only). On PyTorch's own recorded snapshot
// they equal the figures of ../shared/traces/README.md.
TEST(PlotMemory, SnapshotPeaksEqualTheStatistics) {
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 is not on PATH: the plot script needs it";
  char tmpl[] = "/tmp/expseg_plot_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string dir = tmpl, snap = dir + "/s.pickle", svg = dir + "/s.svg";
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim:capacity=64G", 0, "expandable_segments:True", &a), EXPSEG_OK);
  ASSERT_EQ(expseg_record_history_ex(a, true, SIZE_MAX, 0), EXPSEG_OK);
  std::vector<void *> live;
  uint64_t x = 12345;
  for (int i = 0; i < 3000; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    if (live.empty() || (x >> 60) < 9) {
      void *p = nullptr;
      ASSERT_EQ(expseg_malloc(a, (x >> 33) % (48 << 20) + 1, (x >> 20) % 2, &p), EXPSEG_OK)
          << expseg_trace_last_error();
      live.push_back(p);
    } else {
      size_t k = (x >> 8) % live.size();
      ASSERT_EQ(expseg_free(a, live[k]), EXPSEG_OK);
      live[k] = live.back();
      live.pop_back();
    }
    if (i == 2000) {
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    }
  }
  ASSERT_EQ(expseg_snapshot_dump(a, snap.c_str()), EXPSEG_OK) << expseg_trace_last_error();
  int64_t req = -1, mapped = -1;
  ASSERT_EQ(expseg_stat(a, "requested_bytes.all.peak", &req), EXPSEG_OK);
  ASSERT_EQ(expseg_stat(a, "expseg.mapped_bytes.peak", &mapped), EXPSEG_OK);
  std::string plot;
  ASSERT_EQ(snapshot_run("python3 " EXPSEG_SOURCE_DIR "/bench/plot_memory.py --json --snapshot '" +
                             snap + "' --out '" + svg + "'",
                         &plot),
            0)
      << plot;
  auto num = [](const std::string &t, const std::string &key) {
    size_t p = t.find("\"" + key + "\":");
    return p == std::string::npos ? -1.0 : atof(t.c_str() + p + key.size() + 3);
  };
  EXPECT_EQ(num(plot, "peak_requested"), (double)req) << plot;
  EXPECT_EQ(num(plot, "peak_mapped"), (double)mapped) << plot;
  for (void *p : live) ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  expseg_destroy(a);
  std::string raw = std::string(EXPSEG_TRACES_DIR) + "/raw/ftcourse_qlora_finetune.pickle";
  struct stat st;
  if (stat(raw.c_str(), &st) == 0) { // README: peak live requested, recorded peak reserved
    ASSERT_EQ(snapshot_run("python3 " EXPSEG_SOURCE_DIR "/bench/plot_memory.py --json --snapshot '" +
                               raw + "' --out '" + svg + "'",
                           &plot),
              0)
        << plot;
    EXPECT_EQ(num(plot, "peak_requested"), 5876132840.0) << plot;
    EXPECT_EQ(num(plot, "peak_mapped"), 6471811072.0) << plot;
  }
  EXPECT_EQ(system(("rm -rf '" + dir + "'").c_str()), 0);
}

INSTANTIATE_TEST_SUITE_P(Configs, TraceSnapshot,
                         ::testing::Values("expandable_segments:True",
                                           "expandable_segments:False"));

}  // namespace
