// SPDX-License-Identifier: Apache-2.0
// test_replay.cpp: the replay tool (bench/replay/synth_cli.c, expseg_replay_main) run
// in-process: JSON fields are sane and agree with the trace, OOMs and skipped frees,
// baseline figures, --check, --timeline, --sweep ordering, and exit status 2 with a clear
// message for every kind of bad argument or input.
#include "test_replay_common.h"

namespace {

using namespace replay_test;

// A tiny hand-made history: a pre-live block, a block freed with 'r' then 'f' on another
// stream, an explicit empty_cache, a block too large for a 64 MiB device (OOM: its free
// is skipped), and the recorded allocator's own segment events (baseline only).
const char kTiny[] =
    "# memtrace v1\n"
    "# source: tiny device=0\n"
    "# pytorch: start_reserved=2097152 peak_reserved=25165824 end_reserved=2097152 "
    "segment_alloc=1 segment_free=1 map=0 unmap=0 oom=1\n"
    "p 0 0 1000\n"
    "M 0 0x7f0000200000 23068672\n"
    "a 0 1 3000000\n"
    "a 1 2 512\n"
    "r 1 2 512\n"
    "f 0 1 3000000\n"
    "E\n"
    "X 0 0x7f0000200000 23068672\n"
    "f 1 2 512\n"
    "a 0 3 20971520\n"
    "O 0 - 104857600 device_free=0\n"
    "a 0 4 104857600\n"
    "f 0 4 104857600\n"
    "f 0 3 20971520\n";

TEST(Replay, SyntheticJsonFieldsAreSane) {
  expseg_trace_t t;
  ASSERT_EQ(expseg_trace_synth("train", 1, 0.05, &t), EXPSEG_OK);
  const uint64_t n_events = t.n_events, peak = t.peak_live_requested;
  expseg_trace_free(&t);

  Outcome r = Replay({"--json", "--quiet", "--synth", "train:1:0.05"});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  const std::string &j = lines[0];
  EXPECT_EQ(Str(j, "trace"), "synth-train");
  EXPECT_EQ(Num(j, "device"), 0);
  EXPECT_EQ(Num(j, "events"), (double)n_events);
  EXPECT_EQ(Num(j, "peak_requested"), (double)peak);
  EXPECT_GE(Num(j, "peak_allocated"), Num(j, "peak_requested"));
  EXPECT_GE(Num(j, "peak_reserved"), Num(j, "peak_allocated"));
  EXPECT_GE(Num(j, "num_device_alloc"), 1);
  EXPECT_GE(Num(j, "num_device_free"), 0);
  EXPECT_EQ(Num(j, "num_ooms"), 0);
  EXPECT_EQ(Num(j, "errors"), 0);
  EXPECT_GT(Num(j, "ns_per_op"), 0);
  EXPECT_GE(Num(j, "ratio"), 1.0);
  EXPECT_NEAR(Num(j, "ratio"), Num(j, "peak_reserved") / Num(j, "peak_requested"), 1e-3);
  EXPECT_EQ(j.find("\"baseline\""), std::string::npos) << "synthetic traces have no baseline";
  EXPECT_EQ(Str(j, "driver"), "sim:capacity=80G");
}

TEST(Replay, TinyMemtraceWithBaselineOomAndCheck) {
  TempFile f(kTiny);
  Outcome r =
      Replay({"--json", "--check", "--allow-oom", "--driver", "sim:capacity=64M", f.path});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  const std::string &j = lines[0];
  // 11 replayed events (p a a r f E f a a f f); the baseline lines M X O are not replayed
  EXPECT_EQ(Num(j, "events"), 11);
  EXPECT_EQ(Num(j, "num_ooms"), 1) << "the 100 MiB block cannot fit in 64 MiB";
  EXPECT_EQ(Num(j, "errors"), 0) << "the OOM'd id's free must be skipped, not reported";
  // live peak: 1000 + 20 MiB + the failed 100 MiB request, which the program asked for
  EXPECT_EQ(Num(j, "peak_requested"), 1000 + 20971520 + 104857600);
  // what was held covers what was granted (the failed request was not)
  EXPECT_GE(Num(j, "peak_reserved"), 1000 + 20971520);
  size_t b = j.find("\"baseline\":{");
  ASSERT_NE(b, std::string::npos) << j;
  EXPECT_EQ(Num(j, "peak_reserved", b), 25165824);
  EXPECT_EQ(Num(j, "segment_alloc", b), 1);
  EXPECT_EQ(Num(j, "segment_free", b), 1);
  EXPECT_EQ(Num(j, "oom", b), 1);
  EXPECT_NEAR(Num(j, "ratio", b), 25165824.0 / (1000 + 20971520 + 104857600), 1e-3);
}

TEST(Replay, CheckModePassesOnEveryWorkload) {
  // every workload once, expandable and classic segments both covered; --check is
  // O(blocks) per event, so only the first 6000 events of each (well past the first
  // training step, request completions and pipeline iterations)
  const char *const runs[][2] = {{"train:2:0.01", "expandable_segments:True"},
                                 {"infer:2:0.01", "expandable_segments:False"},
                                 {"streams8:2:0.01", "expandable_segments:True"}};
  for (const auto &w : runs) {
    Outcome r = Replay(
        {"--json", "--check", "--quiet", "--limit", "6000", "--conf", w[1], "--synth", w[0]});
    EXPECT_EQ(r.rc, 0) << w[0] << " " << w[1] << ": " << r.err;
    EXPECT_EQ(Num(r.out, "num_ooms"), 0) << w[0];
    EXPECT_EQ(Num(r.out, "errors"), 0) << w[0];
    EXPECT_EQ(Num(r.out, "events"), 6000) << w[0];
  }
}

TEST(Replay, TableOutputAndTimeline) {
  TempFile f(kTiny);
  TempFile csv("", ".csv");
  Outcome r = Replay({"--timeline", csv.path, "--timeline-every", "1", f.path, "--synth",
                  "infer:1:0.01", "--quiet"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("peak resv"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("synth-infer"), std::string::npos) << r.out;
  FILE *c = fopen(csv.path.c_str(), "r");
  ASSERT_NE(c, nullptr);
  auto rows = Lines(Slurp(c));
  ASSERT_GT(rows.size(), 12u);
  EXPECT_EQ(rows[0], "trace,event,live_requested,reserved,allocated,cached,reserved_peak,allocated_peak");
  // every sample: reserved >= live requested
  for (size_t i = 1; i < rows.size(); i++) {
    unsigned long long ev, live;
    long long resv;
    char name[128];
    ASSERT_EQ(sscanf(rows[i].c_str(), "%127[^,],%llu,%llu,%lld", name, &ev, &live, &resv), 4)
        << rows[i];
    EXPECT_GE((unsigned long long)resv, live) << rows[i];
  }
}

TEST(Replay, SweepRanksByPeakReserved) {
  Outcome r = Replay({"--sweep", "--json", "--quiet", "--synth", "infer:1:0.02", "--conf",
                  "expandable_segments:True,roundup_power2_divisions:2"});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto lines = Lines(r.out);
  ASSERT_GE(lines.size(), 10u);
  double prev = 0;
  bool saw_classic = false, saw_yours = false;
  std::string section;
  for (size_t i = 0, rank = 1; i < lines.size(); i++, rank++) {
    if (Str(lines[i], "section") != section) { // ranks and order restart per section
      section = Str(lines[i], "section");
      rank = 1;
      prev = 0;
    }
    EXPECT_EQ(Num(lines[i], "rank"), (double)rank);
    double pr = Num(lines[i], "peak_reserved");
    // rows within 1 % of the section's least memory come first, by driver time
    const bool near = lines[i].find("\"near-best\"") != std::string::npos;
    if (near && rank > 1) {
      EXPECT_GE(Num(lines[i], "driver_ms"), Num(lines[i - 1], "driver_ms")) << lines[i];
    }
    if (!near) {
      EXPECT_GE(pr, prev) << "the other rows are sorted by peak_reserved: " << lines[i];
    }
    EXPECT_GE(pr, Num(lines[i], "peak_requested"));
    prev = pr;
    saw_classic |= Str(lines[i], "setting") == "classic";
    saw_yours |= Str(lines[i], "setting") == "yours (--conf)";
  }
  EXPECT_TRUE(saw_classic);
  EXPECT_TRUE(saw_yours);

  Outcome t = Replay({"--sweep", "--quiet", "--synth", "infer:1:0.02"});
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_NE(t.out.find("best PyTorch setting:"), std::string::npos) << t.out;
}

TEST(Replay, BadArgumentsExit2) {
  struct Case {
    std::vector<std::string> args;
    const char *needle;
  } cases[] = {
      {{}, "nothing to replay"},
      {{"--bogus", "x"}, "--bogus"},
      {{"--driver"}, "needs a value"},
      {{"--json=1", "--synth", "train"}, "takes no value"},
      {{"--device", "-1", "--synth", "train"}, "--device"},
      {{"--synth", "nosuch"}, "nosuch"},
      {{"--synth", "train:x"}, "train:x"},
      {{"/nonexistent/dir/trace.memtrace"}, "/nonexistent/dir/trace.memtrace"},
      {{"--conf", "no_such_key:1", "--synth", "train:1:0.01"}, "no_such_key"},
      {{"--driver", "warp:capacity=1G", "--synth", "train:1:0.01"}, "warp"},
      {{"--sweep", "--timeline", "x.csv", "--synth", "train"}, "cannot be combined"},
      {{"--sweep", "--fit", "--synth", "train:1:0.01"}, "--fit and --sweep cannot be combined"},
      {{"--limit", "0", "--synth", "train"}, "--limit"},
  };
  for (auto &c : cases) {
    Outcome r = Replay(c.args);
    std::string joined;
    for (auto &a : c.args) joined += a + " ";
    EXPECT_EQ(r.rc, 2) << joined << "\n" << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << joined << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << joined << "\n" << r.out;
  }
  TempFile garbage("this is not a trace\n", ".txt");
  Outcome r = Replay({garbage.path});
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.err.find(garbage.path), std::string::npos) << r.err;

  Outcome h = Replay({"--help"});
  EXPECT_EQ(h.rc, 0);
  EXPECT_NE(h.out.find("usage: expseg-replay"), std::string::npos);
}

}  // namespace
