// SPDX-License-Identifier: Apache-2.0
// test_replay_model.cpp: the replay tool's honesty (issue 11). --model pytorch reproduces
// every recorded history of ../shared/traces/raw (peak reserved within 1 %, segment
// allocations within 10 %; skipped when the folder is absent); and each dishonest case of
// the issue is pinned to its fixed behaviour: --limit takes the recorded figures over the
// same prefix, a failed request is reported, counts in peak requested and makes the exit
// status 1 unless --allow-oom, EXPSEG_DRIVER and --capacity are honoured and named, the
// user's --conf is replayed with PyTorch's defaults under the pytorch model (and a key
// PyTorch does not read is never recommended for it), empty_cache() runs become 'E', driver
// work is priced from --costs, and the sweep's text and JSON carry sections, models, flags
// and driver time.
#include "test_replay_common.h"

#include <dirent.h>
#include <unistd.h>
#include <sys/stat.h>

#include <algorithm>

namespace {

using namespace replay_test;

// ------------------------------------------------------------------ fidelity

// The recorded histories of ../shared/traces/raw (every *.pickle, sorted); none when the
// folder is absent (*missing then says what was expected).
std::vector<std::string> RecordedHistories(std::string *missing) {
  const std::string dir = std::string(EXPSEG_TRACES_DIR) + "/raw";
  std::vector<std::string> v;
  if (DIR *d = opendir(dir.c_str())) {
    while (struct dirent *e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 7 && n.compare(n.size() - 7, 7, ".pickle") == 0) v.push_back(dir + "/" + n);
    }
    closedir(d);
  }
  std::sort(v.begin(), v.end());
  if (v.empty())
    *missing = "the recorded traces are missing: expected " + dir +
               "/*.pickle (../shared/traces/raw next to the repository)";
  return v;
}

// Every device history of every recorded file: peak reserved within 1 % of the recorded
// one (5 % where the recorded run hit an out-of-memory error), and the segment allocations
// (classic) or maps (expandable) within 10 %. The recorded setting is replayed: classic
// segments from a warm cache, or expandable segments where the file recorded maps.
TEST(ReplayModel, PytorchModelReproducesEveryRecordedHistory) {
  std::string missing;
  const std::vector<std::string> histories = RecordedHistories(&missing);
  if (histories.empty()) GTEST_SKIP() << missing;
  for (const std::string &f : histories) {
    Outcome r = Replay({"--json", "--quiet", "--model", "pytorch", f});
    ASSERT_EQ(r.rc, 0) << f << ": " << r.err;
    for (const std::string &j : Lines(r.out)) {
      SCOPED_TRACE(Str(j, "trace"));
      EXPECT_EQ(Str(j, "model"), "pytorch");
      size_t b = j.find("\"baseline\":{");
      ASSERT_NE(b, std::string::npos);
      const bool expandable = Num(j, "map", b) > 0;
      EXPECT_NE(Str(j, "config").find(expandable ? "expandable_segments:True"
                                                 : "expandable_segments:False"),
                std::string::npos)
          << "the recorded setting: " << j;
      double peak = Num(j, "peak_reserved"), rec = Num(j, "peak_reserved", b);
      const double tol = Num(j, "oom", b) > 0 ? 0.05 : 0.01;
      EXPECT_LE(std::fabs(peak - rec), tol * rec) << "peak reserved " << peak << " vs " << rec;
      double segs = expandable ? Num(j, "set_access", j.find("\"window_calls\""))
                               : Num(j, "window_device_alloc");
      double rsegs = Num(j, expandable ? "map" : "segment_alloc", b);
      EXPECT_LE(std::fabs(segs - rsegs), 0.10 * rsegs) << "segment allocs/maps " << segs
                                                       << " vs " << rsegs;
      EXPECT_EQ(Num(j, "num_ooms"), 0);
    }
  }
}

// The cost table that prices every call by the 2 MiB pages it covers and nothing per call
// (docs/benchmarks.md, "Driver time"), written to a temporary file.
std::string ProportionalCosts() {
  static std::string path;
  if (path.empty()) {
    char tmpl[] = "/tmp/expseg_prop_costsXXXXXX";
    int fd = mkstemp(tmpl);
    if (fd < 0) return "";
    const char text[] = "reserve 14\ncreate 0\ncreate.page 100\nrelease 0\nrelease.page 11.5\n"
                        "map 0\nmap.page 1.25\nunmap 0\nunmap.page 18.5\nset_access 0\n"
                        "set_access.page 28.5\ncudaMalloc 0\ncudaMalloc.page 33\n"
                        "cudaFree 0\ncudaFree.page 33\n";
    bool ok = write(fd, text, sizeof text - 1) == (ssize_t)(sizeof text - 1);
    close(fd);
    if (ok) path = tmpl;
  }
  return path;
}

// Modelled driver time against PyTorch's expandable segments' (docs/replay.md, "Priced
// driver work": units of 2 MiB for created and released bytes, a handle for map, unmap and
// set_access). The target is at most 1 x under both tables; expseg's defaults miss it
// (docs/benchmarks.md, "Driver time priced per handle": up to 3.47 x under the default
// table and 1.13 x under the proportional one on the recorded histories, 2.66 x and 1.10 x
// on the synthetic seeds; with the large pool's minimum growth, silmont2000 3.92 x, a
// history PyTorch models at 1.0 ms, and streams8:2 2.97 x: "A minimum growth within half a
// percent"). These
// ceilings keep the miss from growing; they are not the target.
constexpr double kRecordedDriverCeiling = 4.0, kRecordedDriverCeilingProportional = 1.2;
constexpr double kSyntheticDriverCeiling = 3.1, kSyntheticDriverCeilingProportional = 1.15;

// What expseg holds to with its defaults on every device history of every recorded file
// (docs/benchmarks.md, "Placement and chunks", gives the figures and the targets still
// missed): modelled driver time within the ceilings above under both cost tables (the
// default one, measured on an H200, and the proportional one), and at most 1.05 x the peak
// live request + 8 MiB (the target is 1.02 x: one recorded history misses it, silmont, at
// 1.043).
TEST(ReplayModel, ExpsegHoldsLittleAndCostsLittleMoreThanPytorchExpandable) {
  std::string missing;
  const std::vector<std::string> histories = RecordedHistories(&missing);
  if (histories.empty()) GTEST_SKIP() << missing;
  const std::string prop = ProportionalCosts();
  ASSERT_FALSE(prop.empty());
  for (const std::string &f : histories) {
    for (const std::string &table : {std::string(), prop}) {
      SCOPED_TRACE(table.empty() ? "default cost table" : "proportional cost table");
      std::vector<std::string> c;
      if (!table.empty()) c = {"--costs", table};
      auto args = [&](std::vector<std::string> a) { // the cost table before the file
        a.insert(a.end() - 1, c.begin(), c.end());
        return a;
      };
      Outcome e = Replay(args({"--json", "--quiet", "--model", "expseg", f}));
      Outcome p = Replay(args({"--json", "--quiet", "--model", "pytorch", "--conf",
                               "expandable_segments:True", f}));
      ASSERT_EQ(e.rc, 0) << f << ": " << e.err;
      ASSERT_EQ(p.rc, 0) << f << ": " << p.err;
      std::vector<std::string> el = Lines(e.out), pl = Lines(p.out);
      ASSERT_EQ(el.size(), pl.size()) << f;
      for (size_t i = 0; i < el.size(); i++) {
        SCOPED_TRACE(Str(el[i], "trace"));
        EXPECT_LE(Num(el[i], "driver_ms"),
                  (table.empty() ? kRecordedDriverCeiling : kRecordedDriverCeilingProportional) *
                      Num(pl[i], "driver_ms"))
            << el[i] << "\n" << pl[i];
        EXPECT_LE(Num(el[i], "peak_reserved"),
                  1.05 * Num(el[i], "peak_requested") + 8.0 * (1 << 20))
            << el[i];
        EXPECT_EQ(Num(el[i], "num_ooms"), 0) << el[i];
      }
    }
  }
}

// Every seed (1-10) of a synthetic workload: at most 1.05 x its peak live request, and
// modelled driver time within the ceilings above under either cost table.
void SyntheticSeedsHoldAtMostFivePercentOverLive(const std::string &workload) {
  const std::string prop = ProportionalCosts();
  ASSERT_FALSE(prop.empty());
  for (int seed = 1; seed <= 10; seed++) {
    const std::string w = workload + ":" + std::to_string(seed);
    SCOPED_TRACE(w);
    for (const std::string &table : {std::string(), prop}) {
      std::vector<std::string> e = {"--json", "--quiet"}, p;
      if (!table.empty()) e.insert(e.end(), {"--costs", table});
      p = e;
      p.insert(p.end(), {"--model", "pytorch", "--conf", "expandable_segments:True"});
      e.insert(e.end(), {"--synth", w});
      p.insert(p.end(), {"--synth", w});
      Outcome oe = Replay(e), op = Replay(p);
      ASSERT_EQ(oe.rc, 0) << oe.err;
      ASSERT_EQ(op.rc, 0) << op.err;
      EXPECT_LE(Num(oe.out, "peak_reserved"), 1.05 * Num(oe.out, "peak_requested")) << oe.out;
      EXPECT_LE(Num(oe.out, "driver_ms"),
                (table.empty() ? kSyntheticDriverCeiling : kSyntheticDriverCeilingProportional) *
                    Num(op.out, "driver_ms"))
          << oe.out << "\n" << op.out;
    }
  }
}

// The eight-stream pipeline. Each stream keeps free pieces between its blocks; lending a
// tighter fit (docs/design.md) serves requests from them instead of cutting a stream's own
// large free block (without it seeds 1 and 7 hold 1.065 and 1.055 x).
TEST(ReplayModel, EightStreamPipelineHoldsAtMostFivePercentOverLive) {
  SyntheticSeedsHoldAtMostFivePercentOverLive("streams8");
}

// Inference with K/V buffers grown by reallocation: the last growths before a peak come
// with the pool's free memory in pieces smaller than the request; growth near the bound
// (docs/design.md) maps only what they lack (without it seed 10 holds 1.0525 x).
TEST(ReplayModel, InferenceHoldsAtMostFivePercentOverLive) {
  SyntheticSeedsHoldAtMostFivePercentOverLive("infer");
}

// Generation with a torch.cat K/V cache (every decode step reallocates each layer's K and V
// one token larger) after large weights: memory held stays within 1.02 x the peak live
// + 8 MiB and the growths move no chunk per step. Moving idle chunks whatever the memory
// held (as before _expseg_move_first) moved a freed buffer's chunks to the next growth,
// leaving its room unmapped for the layer after it: 309 to 4,926 unmaps on seeds 1-10,
// 20 to 247 ms of modelled driver time against 5 to 10 ms for PyTorch's expandable
// segments, and seed 8 at 1.0211 x past its bound of 1.0205.
TEST(ReplayModel, GenerationWithATorchCatCacheMovesNoChunkPerStep) {
  for (int seed = 1; seed <= 10; seed++) {
    const std::string w = "generate:" + std::to_string(seed);
    SCOPED_TRACE(w);
    Outcome e = Replay({"--json", "--quiet", "--synth", w});
    Outcome p = Replay({"--json", "--quiet", "--model", "pytorch", "--conf",
                        "expandable_segments:True", "--synth", w});
    ASSERT_EQ(e.rc, 0) << e.err;
    ASSERT_EQ(p.rc, 0) << p.err;
    EXPECT_LE(Num(e.out, "unmap", e.out.find("\"window_calls\"")), 10.0) << e.out;
    EXPECT_LE(Num(e.out, "peak_reserved"), 1.02 * Num(e.out, "peak_requested") + 8.0 * (1 << 20))
        << e.out;
    EXPECT_LE(Num(e.out, "driver_ms"), 2.0 * Num(p.out, "driver_ms")) << e.out << "\n" << p.out;
  }
}

TEST(ReplayModel, WarmStartRebuildsTheRecordedSegmentsAndBlocks) {
  // tests/fuzz/corpus/pickle/warm_p4.pickle (written by Python's pickle): a 20 MiB large
  // segment holding a live 4 MiB block and 16 MiB free, a 2 MiB small segment holding a live
  // 512-byte block; the window allocates 8 MB and 1000 bytes in the cached free space (no
  // segment_alloc recorded) and frees them
  const std::string f = std::string(EXPSEG_SOURCE_DIR) + "/tests/fuzz/corpus/pickle/warm_p4.pickle";
  Outcome p = Replay({"--json", "--quiet", "--model", "pytorch", f});
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_NE(p.out.find("\"warm_start\":true"), std::string::npos) << p.out;
  EXPECT_EQ(Num(p.out, "peak_reserved"), 22.0 * 1048576) << "both recorded segments: " << p.out;
  EXPECT_EQ(Num(p.out, "window_device_alloc"), 0) << "the window fits the cached space";
  EXPECT_EQ(Num(p.out, "driver_ms"), 0);
  // expseg starts cold: it must grow in the window
  Outcome e = Replay({"--json", "--quiet", "--model", "expseg", f});
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_NE(e.out.find("\"warm_start\":false"), std::string::npos) << e.out;
  EXPECT_GE(Num(e.out, "window_device_alloc"), 1) << e.out;
  // another classic setting starts from the same state, then applies its keys
  Outcome m = Replay({"--json", "--quiet", "--model", "pytorch", "--conf",
                      "max_split_size_mb:64", f});
  ASSERT_EQ(m.rc, 0) << m.err;
  EXPECT_NE(m.out.find("\"warm_start\":true"), std::string::npos) << m.out;
  EXPECT_NE(Str(m.out, "config").find("max_split_size_mb:64"), std::string::npos) << m.out;
}

TEST(ReplayModel, AStartStateThePytorchRulesCannotMakeReplaysColdAndSaysSo) {
  // tests/fuzz/corpus/pickle/odd_layout_p4.pickle: a small-pool segment holding a live block
  // above 1 MiB (PyTorch puts such a request in the large pool)
  const std::string f =
      std::string(EXPSEG_SOURCE_DIR) + "/tests/fuzz/corpus/pickle/odd_layout_p4.pickle";
  Outcome p = Replay({"--json", "--quiet", "--check", "--model", "pytorch", f});
  ASSERT_EQ(p.rc, 0) << p.err;
  EXPECT_NE(p.err.find("replaying from an empty cache"), std::string::npos) << p.err;
  EXPECT_NE(p.out.find("\"warm_start\":false"), std::string::npos) << p.out;
  EXPECT_EQ(Num(p.out, "errors"), 0) << p.out;
}

// ------------------------------------------------------------------ honest figures

// Recorded segment events after event 4 must not count with --limit 4.
const char kGrow[] =
    "# memtrace v1\n"
    "# pytorch: start_reserved=0 peak_reserved=44040192 end_reserved=44040192 "
    "segment_alloc=2 segment_free=0 map=0 unmap=0 oom=0\n"
    "M 0 0x7f0000000000 2097152\n"
    "a 0 0 4096\n"
    "f 0 0 4096\n"
    "a 0 1 4096\n"
    "M 0 0x7f0000200000 41943040\n"
    "a 0 2 40000000\n"
    "f 0 2 40000000\n"
    "f 0 1 4096\n";

TEST(ReplayModel, LimitTakesTheRecordedFiguresOverThePrefix) {
  TempFile f(kGrow);
  Outcome r = Replay({"--json", "--quiet", "--limit", "4", f.path});
  ASSERT_EQ(r.rc, 0) << r.err;
  size_t b = r.out.find("\"baseline\":{");
  ASSERT_NE(b, std::string::npos) << r.out;
  EXPECT_EQ(Num(r.out, "peak_reserved", b), 2097152) << r.out;
  EXPECT_EQ(Num(r.out, "segment_alloc", b), 1) << r.out;
  Outcome all = Replay({"--json", "--quiet", f.path});
  b = all.out.find("\"baseline\":{");
  EXPECT_EQ(Num(all.out, "peak_reserved", b), 44040192);
  EXPECT_EQ(Num(all.out, "segment_alloc", b), 2);
}

TEST(ReplayModel, FailedRequestsAreReportedCountedAndFailTheRun) {
  TempFile f(kGrow);
  Outcome r = Replay({"--json", "--quiet", "--capacity", "16M", f.path});
  EXPECT_EQ(r.rc, 1) << "an OOM makes the exit status 1 without --allow-oom";
  EXPECT_NE(r.err.find("1 request(s) failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("event 5"), std::string::npos) << "the first failing event: " << r.err;
  EXPECT_NE(r.err.find("the first: out of memory: tried to allocate 38.15 MiB (40000000 bytes"),
            std::string::npos)
      << "the allocator's message for the first failure, naming the request: " << r.err;
  EXPECT_NE(r.err.find("Hint: "), std::string::npos) << r.err;
  EXPECT_EQ(Num(r.out, "num_ooms"), 1);
  EXPECT_EQ(Num(r.out, "first_oom_event"), 5);
  EXPECT_EQ(Num(r.out, "peak_requested"), 4096 + 40000000) << "the failed request counts";
  EXPECT_EQ(Str(r.out, "driver"), "sim:capacity=16M") << "--capacity sets the device size";
  EXPECT_EQ(Num(r.out, "capacity"), 16.0 * 1048576);
  Outcome ok = Replay({"--json", "--quiet", "--allow-oom", "--capacity", "16M", f.path});
  EXPECT_EQ(ok.rc, 0) << ok.err;
  EXPECT_EQ(Num(ok.out, "num_ooms"), 1);
}

TEST(ReplayModel, HonoursExpsegDriverAndNamesTheCapacity) {
  TempFile f(kGrow);
  setenv("EXPSEG_DRIVER", "sim:capacity=1G", 1);
  Outcome r = Replay({"--quiet", f.path});
  Outcome j = Replay({"--json", "--quiet", "--capacity", "2G", f.path});
  unsetenv("EXPSEG_DRIVER");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("# driver sim:capacity=1G, device capacity 1.00 GiB"), std::string::npos)
      << r.out;
  ASSERT_EQ(j.rc, 0) << j.err;
  EXPECT_EQ(Str(j.out, "driver"), "sim:capacity=2G") << "--capacity replaces the capacity";
}

TEST(ReplayModel, StreamsAreTheDriversOnlyWhereItHasThem) {
  // host and sim take any value as a stream: the replay uses the trace's indices there, and
  // the library says it has none to create (on cuda: tests/test_gpu_streams.cpp)
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim:capacity=1G", 0, nullptr, &a), EXPSEG_OK) << expseg_last_error();
  expseg_stream s = 0;
  EXPECT_EQ(expseg_stream_create(a, &s), EXPSEG_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(expseg_last_error()).find("any value is a stream"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(expseg_stream_destroy(a, 0), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_stream_create(nullptr, &s), EXPSEG_ERR_INVALID_ARGUMENT);
  expseg_destroy(a);
  Outcome r = Replay({"--json", "--quiet", "--synth", "streams8:1:0.01"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(Num(r.out, "errors"), 0);
}

TEST(ReplayModel, FitFindsACapacityThatRuns) {
  Outcome r = Replay({"--fit", "--json", "--quiet", "--synth", "infer:1:0.01"});
  ASSERT_EQ(r.rc, 0) << r.err;
  auto lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  for (const auto &l : lines) {
    double cap = Num(l, "fit_capacity");
    char c[32];
    snprintf(c, sizeof c, "%.0fK", std::ceil(cap / 1024));
    Outcome at = Replay({"--json", "--quiet", "--model", Str(l, "model"), "--capacity", c,
                         "--synth", "infer:1:0.01"});
    EXPECT_EQ(at.rc, 0) << l << at.err;
    EXPECT_EQ(Num(at.out, "num_ooms"), 0) << l;
    EXPECT_GE(cap, Num(at.out, "peak_requested"));
  }
}

// --fit answers at most the unconstrained peak reserved plus one chunk (8 MiB) on every
// recorded history and on seeded synthetic ones: expseg lays out its segments the same way
// on a device just large enough for the peak as on a larger one, so it does not run out
// where the unconstrained run held no more. (With address space sized from the device, a
// recorded 78 GiB history ran out at its own peak + 8 MiB and --fit answered 0.6 GiB more.)
TEST(ReplayModel, FitIsAtMostTheUnconstrainedPeakPlusOneChunk) {
  std::string missing;
  std::vector<std::vector<std::string>> inputs;
  for (const std::string &f : RecordedHistories(&missing)) inputs.push_back({f});
  for (const char *w : {"train:1", "train:2", "infer:1", "infer:2", "streams8:1", "streams8:2"})
    inputs.push_back({"--synth", w});
  const double chunk = 8.0 * (1 << 20);
  for (const auto &in : inputs) {
    SCOPED_TRACE(in.back());
    std::vector<std::string> a = {"--json", "--quiet"}, f = {"--fit", "--json", "--quiet"};
    a.insert(a.end(), in.begin(), in.end());
    f.insert(f.end(), in.begin(), in.end());
    Outcome plain = Replay(a), fit = Replay(f);
    ASSERT_EQ(plain.rc, 0) << plain.err;
    ASSERT_EQ(fit.rc, 0) << fit.err;
    for (const std::string &p : Lines(plain.out)) {
      bool found = false;
      for (const std::string &l : Lines(fit.out)) {
        if (Str(l, "model") != "expseg" || Num(l, "device") != Num(p, "device")) continue;
        found = true;
        EXPECT_LE(Num(l, "fit_capacity"), Num(p, "peak_reserved") + chunk) << l << "\n" << p;
        EXPECT_GE(Num(l, "fit_capacity"), Num(p, "peak_requested")) << l << "\n" << p;
      }
      EXPECT_TRUE(found) << p << "\n" << fit.out;
    }
  }
  if (!missing.empty()) std::printf("recorded histories not checked: %s\n", missing.c_str());
}

// ------------------------------------------------------------------ models and the sweep

TEST(ReplayModel, PytorchModelReadsTheConfWithPytorchDefaults) {
  TempFile f(kGrow);
  Outcome r = Replay({"--json", "--quiet", "--model", "pytorch", "--conf",
                      "max_split_size_mb:128", f.path});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(Str(r.out, "model"), "pytorch");
  EXPECT_NE(Str(r.out, "config").find("expandable_segments:False"), std::string::npos)
      << "PyTorch's default is classic segments: " << r.out;
  Outcome e = Replay({"--json", "--quiet", "--conf", "max_split_size_mb:128", f.path});
  EXPECT_EQ(Str(e.out, "model"), "expseg");
  Outcome bad = Replay({"--model", "tensorflow", f.path});
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("expseg and pytorch"), std::string::npos) << bad.err;
}

TEST(ReplayModel, SweepSectionsFlagsAndClosingLines) {
  // the user's classic setting is replayed as PyTorch would read it, in section (a)
  Outcome j = Replay({"--sweep", "--json", "--quiet", "--synth", "train:1:0.02", "--conf",
                      "max_split_size_mb:128"});
  ASSERT_EQ(j.rc, 0) << j.err;
  bool yours_pt = false;
  for (const auto &l : Lines(j.out)) {
    EXPECT_FALSE(Str(l, "section").empty()) << l;
    EXPECT_EQ(Str(l, "model"), Str(l, "section")) << l;
    EXPECT_FALSE(std::isnan(Num(l, "driver_ms"))) << l;
    EXPECT_NE(l.find("\"flags\":["), std::string::npos) << l;
    if (Str(l, "setting") == "yours (--conf)") {
      yours_pt = true;
      EXPECT_EQ(Str(l, "model"), "pytorch");
      EXPECT_NE(Str(l, "config").find("expandable_segments:False"), std::string::npos) << l;
      EXPECT_NE(l.find("\"yours\""), std::string::npos) << l;
    }
    if (Str(l, "config").find("page_size_mb:8,") != std::string::npos &&
        Str(l, "model") == "expseg") {
      EXPECT_NE(l.find("\"expseg-only\""), std::string::npos) << l;
    }
  }
  EXPECT_TRUE(yours_pt);

  // an expseg-only key is never offered as a PyTorch setting
  Outcome t = Replay({"--sweep", "--quiet", "--synth", "train:1:0.02", "--conf",
                      "page_size_mb:8"});
  ASSERT_EQ(t.rc, 0) << t.err;
  const std::string &o = t.out;
  size_t a = o.find("(a) PyTorch"), b = o.find("(b) expseg");
  ASSERT_NE(a, std::string::npos) << o;
  ASSERT_NE(b, std::string::npos) << o;
  EXPECT_LT(a, b);
  EXPECT_NE(o.find("columns: peak resv"), std::string::npos) << "a legend: " << o;
  EXPECT_EQ(o.substr(a, b - a).find("page_size_mb"), std::string::npos)
      << "section (a) holds PyTorch keys only: " << o;
  EXPECT_NE(o.find("yours (--conf) on expseg"), std::string::npos) << o;
  EXPECT_NE(o.find("[expseg-only]"), std::string::npos) << o;
  size_t best = o.find("best PyTorch setting: ");
  ASSERT_NE(best, std::string::npos) << o;
  std::string best_line = o.substr(best, o.find('\n', best) - best);
  EXPECT_EQ(best_line.find("page_size_mb"), std::string::npos) << best_line;
  EXPECT_NE(o.find("expseg beyond it: "), std::string::npos) << o;
  EXPECT_NE(o.find("ms in the driver"), std::string::npos) << o;

  // the recommended expseg row never holds more than expseg's defaults (the row "expseg")
  for (const char *w : {"train:1", "infer:2"}) {
    Outcome sj = Replay({"--sweep", "--json", "--quiet", "--synth", w});
    ASSERT_EQ(sj.rc, 0) << sj.err;
    double plain = -1, best = -1;
    for (const auto &l : Lines(sj.out)) {
      if (Str(l, "section") != "expseg") continue;
      if (Str(l, "setting") == "expseg") plain = Num(l, "peak_reserved");
      if (l.find("\"best\"") != std::string::npos) best = Num(l, "peak_reserved");
    }
    ASSERT_GT(plain, 0) << w << ": " << sj.out;
    ASSERT_GT(best, 0) << w << ": " << sj.out;
    EXPECT_LE(best, plain) << w << ": the recommended row holds more than the defaults";
  }

  // every key of expseg's own (the option table's, not a hand-kept list) stays out of (a)
  for (const char *conf : {"single_chunk_min_mb:100", "verbose:True", "page_cache_max_mb:0",
                           "va_reserve_mb:1024", "expandable_segments:True,single_chunk_min_mb:64"}) {
    Outcome u = Replay({"--sweep", "--quiet", "--synth", "train:1:0.02", "--conf", conf});
    ASSERT_EQ(u.rc, 0) << conf << ": " << u.err;
    const std::string key = std::string(conf).substr(std::string(conf).rfind(',') + 1);
    const std::string name = key.substr(0, key.find(':'));
    size_t ua = u.out.find("(a) PyTorch"), ub = u.out.find("(b) expseg");
    ASSERT_NE(ua, std::string::npos) << u.out;
    ASSERT_NE(ub, std::string::npos) << u.out;
    EXPECT_EQ(u.out.substr(ua, ub - ua).find(name), std::string::npos)
        << conf << ": section (a) holds PyTorch keys only: " << u.out;
  }
}

// The closing line sets the best PyTorch row against the recorded run only when both
// started alike: a row replayed from an empty cache is not compared with a warm recorded run.
TEST(ReplayModel, ClosingLineComparesLikeWithLike) {
  std::string missing;
  const std::vector<std::string> histories = RecordedHistories(&missing);
  if (histories.empty()) GTEST_SKIP() << missing;
  const std::string f = std::string(EXPSEG_TRACES_DIR) + "/raw/ftcourse_qlora_finetune.pickle";
  Outcome j = Replay({"--sweep", "--json", "--quiet", f});
  ASSERT_EQ(j.rc, 0) << j.err;
  bool cold = false;
  for (const auto &l : Lines(j.out)) {
    if (Str(l, "section") == "pytorch" && l.find("\"best\"") != std::string::npos)
      cold = l.find("\"cold-start\"") != std::string::npos;
  }
  Outcome t = Replay({"--sweep", "--quiet", f});
  ASSERT_EQ(t.rc, 0) << t.err;
  size_t b = t.out.find("best PyTorch setting: ");
  ASSERT_NE(b, std::string::npos) << t.out;
  const std::string line = t.out.substr(b, t.out.find('\n', b) - b);
  EXPECT_EQ(line.find("(recorded run: ") == std::string::npos, cold) << line;
  if (cold) {
    EXPECT_NE(line.find("not compared"), std::string::npos) << line;
  }
}

TEST(ReplayModel, PytorchExpandableSegmentsMoveNoPage) {
  // streams8: expseg reuses idle memory across streams (lent, or pages moved), so it makes
  // less; PyTorch never does (its expandable segments call for call:
  // tests/test_replay_pytorch_expandable.cpp)
  Outcome e = Replay({"--json", "--quiet", "--model", "expseg", "--conf",
                      "expandable_segments:True", "--synth", "streams8:1:0.02"});
  Outcome p = Replay({"--json", "--quiet", "--model", "pytorch", "--conf",
                      "expandable_segments:True", "--synth", "streams8:1:0.02"});
  ASSERT_EQ(e.rc, 0) << e.err;
  ASSERT_EQ(p.rc, 0) << p.err;
  size_t we = e.out.find("\"window_calls\":{"), wp = p.out.find("\"window_calls\":{");
  EXPECT_LT(Num(e.out, "created_bytes"), Num(p.out, "created_bytes")) << e.out << "\n" << p.out;
  EXPECT_LE(Num(e.out, "create", we), Num(p.out, "create", wp)) << e.out << "\n" << p.out;
  EXPECT_EQ(Num(p.out, "unmap", wp), 0) << "no page moves, no empty_cache: " << p.out;
}

// ------------------------------------------------------------------ empty_cache and costs

TEST(ReplayModel, RecordedReleasesNotAfterAnOomBecomeEmptyCache) {
  const char text[] =
      "# memtrace v1\n"
      "M 0 0x7f0000000000 20971520\n"
      "a 0 0 2000000\n"
      "f 0 0 2000000\n"
      "X 0 0x7f0000000000 20971520\n"   // the program's empty_cache(): an E before it
      "M 0 0x7f0000000000 20971520\n"
      "a 0 1 2000000\n"
      "O 0 - 104857600 device_free=0\n"
      "X 0 0x7f0000000000 20971520\n"   // after an OOM: the allocator's own release
      "f 0 1 2000000\n";
  TempFile f(text);
  expseg_trace_set_t s;
  ASSERT_EQ(expseg_trace_read_file(f.path.c_str(), &s), EXPSEG_OK) << expseg_trace_last_error();
  ASSERT_EQ(s.n, 1u);
  int empties = 0;
  size_t at = 0;
  for (size_t i = 0; i < s.traces[0].n_events; i++)
    if (s.traces[0].events[i].kind == EXPSEG_TR_EMPTY) empties++, at = i;
  expseg_trace_set_free(&s);
  EXPECT_EQ(empties, 1);
  EXPECT_EQ(at, 3u) << "the E goes just before the run of releases";

  Outcome r = Replay({"--json", "--quiet", "--conf", "expandable_segments:False", f.path});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(Num(r.out, "num_device_free"), 1) << "the replay released its segment: " << r.out;
}

// The units of the pricing are the same for every model (docs/replay.md, "Priced driver
// work"): a set_access per handle (one per map), whatever the handles' size, and a
// cudaFree per 2 MiB of the bytes freed.
TEST(ReplayModel, DriverWorkIsPricedInTheSameUnitsForEveryModel) {
  TempFile per_handle("# 1 ms per handle a set_access covers, nothing else\n"
                      "reserve 0\ncreate 0\nrelease 0\nmap 0\nunmap 0\nset_access 0\n"
                      "cudaMalloc 0\ncudaFree 0\nreserve.page 0\ncreate.page 0\n"
                      "release.page 0\nmap.page 0\nunmap.page 0\nset_access.page 1000\n"
                      "cudaMalloc.page 0\ncudaFree.page 0\n",
                      ".costs");
  for (std::vector<std::string> m : {std::vector<std::string>{"--model", "expseg"},
                                     {"--model", "pytorch", "--conf", "expandable_segments:True"}}) {
    std::vector<std::string> a = {"--json", "--quiet", "--costs", per_handle.path};
    a.insert(a.end(), m.begin(), m.end());
    a.insert(a.end(), {"--synth", "train:1"});
    Outcome o = Replay(a);
    ASSERT_EQ(o.rc, 0) << o.err;
    size_t w = o.out.find("\"window_calls\":{");
    ASSERT_NE(w, std::string::npos) << o.out;
    EXPECT_GT(Num(o.out, "map", w), 0) << o.out;
    EXPECT_EQ(Num(o.out, "driver_ms"), Num(o.out, "map", w)) << "one unit per handle: " << o.out;
  }
  TempFile per_free("cudaMalloc 0\ncudaFree 0\ncudaMalloc.page 0\ncudaFree.page 1000\n",
                    ".costs");
  TempFile f("# memtrace v1\n"
             "M 0 0x7f0000000000 20971520\n"
             "a 0 0 2000000\n"
             "f 0 0 2000000\n"
             "X 0 0x7f0000000000 20971520\n"
             "M 0 0x7f0000000000 20971520\n"
             "a 0 1 2000000\n"
             "f 0 1 2000000\n");
  Outcome c = Replay({"--json", "--quiet", "--costs", per_free.path, "--model", "pytorch",
                      "--conf", "expandable_segments:False", f.path});
  ASSERT_EQ(c.rc, 0) << c.err;
  ASSERT_EQ(Num(c.out, "num_device_free"), 1) << c.out;
  EXPECT_EQ(Num(c.out, "driver_ms"), 1.0 * Num(c.out, "num_device_free") * 10)
      << "a 20 MiB segment freed is ten units: " << c.out;
}

TEST(ReplayModel, DriverWorkIsPricedFromTheCostTable) {
  TempFile costs("# every VMM call 1 ms, cudaMalloc 2 ms, nothing per page\n"
                 "reserve 1000\ncreate 1000\nrelease 1000\nmap 1000\nunmap 1000\n"
                 "set_access 1000\ncudaMalloc 2000\ncudaFree 2000\n"
                 "reserve.page 0\ncreate.page 0\nrelease.page 0\nmap.page 0\nunmap.page 0\n"
                 "set_access.page 0\ncudaMalloc.page 0\ncudaFree.page 0\n",
                 ".costs");
  TempFile f(kGrow);
  Outcome r = Replay({"--json", "--quiet", "--costs", costs.path, "--model", "pytorch", f.path});
  ASSERT_EQ(r.rc, 0) << r.err;
  size_t w = r.out.find("\"window_calls\":{");
  ASSERT_NE(w, std::string::npos) << r.out;
  EXPECT_EQ(Num(r.out, "driver_ms"), 2.0 * Num(r.out, "cudaMalloc", w) +
                                         2.0 * Num(r.out, "cudaFree", w))
      << r.out;
  size_t b = r.out.find("\"baseline\":{");
  ASSERT_NE(b, std::string::npos);
  EXPECT_EQ(Num(r.out, "recorded_driver_ms", b), 4.0) << "2 recorded cudaMallocs: " << r.out;

  Outcome e = Replay({"--json", "--quiet", "--costs", costs.path, f.path});
  ASSERT_EQ(e.rc, 0) << e.err;
  w = e.out.find("\"window_calls\":{");
  double calls = 0;
  for (const char *k : {"reserve", "create", "release", "map", "unmap", "set_access"})
    calls += Num(e.out, k, w);
  EXPECT_GT(calls, 0);
  EXPECT_EQ(Num(e.out, "driver_ms"), calls) << e.out;

  TempFile bad("create 10\nteleport 5\n", ".costs");
  Outcome x = Replay({"--costs", bad.path, f.path});
  EXPECT_EQ(x.rc, 2);
  EXPECT_NE(x.err.find("line 2"), std::string::npos) << x.err;
  EXPECT_NE(x.err.find("teleport"), std::string::npos) << x.err;
}

} // namespace
