// SPDX-License-Identifier: Apache-2.0
// test_trace_pickle.cpp: the snapshot unpickler (bench/replay/pickle.c) and the device-history
// extraction (bench/replay/trace_pickle.c). The recorded traces in EXPSEG_TRACES_DIR/raw must give
// exactly the reference files in EXPSEG_TRACES_DIR/memtrace; small hand-built snapshots pin
// the rules; malformed pickles (every truncation, mutated bytes, wrong opcodes, deep nesting,
// bad memo references) must fail cleanly with the byte offset (the suite also runs under ASan).
#include <gtest/gtest.h>

#include "trace_support.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <vector>

extern "C" {
#include "trace.h"
#include "trace_internal.h"
}

namespace {

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

expseg_status read_pickle(const std::string &bytes, TraceSet &out, const char *name = "snap.pickle") {
  return expseg_trace_read_pickle(name, reinterpret_cast<const unsigned char *>(bytes.data()),
                                  bytes.size(), &out.s);
}

// ------------------------------------------------------------------ recorded traces

const char *const kRecorded[] = {
    "ftcourse_qlora_finetune",        "wedsonlin_medium_1024_training",
    "wedsonlin_medium_128_inference", "wedsonlin_medium_128_training",
    "wedsonlin_medium_256_training",  "wedsonlin_medium_512_training"};

TEST(TracePickle, RecordedSnapshotsGiveTheReferenceMemtraces) {
  std::string dir = EXPSEG_TRACES_DIR;
  struct stat st;
  if (stat((dir + "/raw").c_str(), &st) != 0)
    GTEST_SKIP() << "the recorded traces are missing: no folder " << dir
                 << "/raw (../shared/traces next to the repository; configure with "
                    "-DEXPSEG_TRACES_DIR=...)";
  for (const char *stem : kRecorded) {
    SCOPED_TRACE(stem);
    std::string raw = dir + "/raw/" + stem + ".pickle";
    std::string ref = dir + "/memtrace/" + stem + ".dev0.memtrace";
    TraceSet got, want;
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(expseg_trace_read_file(raw.c_str(), &got.s), EXPSEG_OK) << expseg_trace_last_error();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
    std::printf("%s: %zu events in %.1f ms\n", stem, got.s.n ? got.s.traces[0].n_events : 0, ms);
    ASSERT_EQ(expseg_trace_read_file(ref.c_str(), &want.s), EXPSEG_OK) << expseg_trace_last_error();
    ASSERT_EQ(got.s.n, 1u);
    ASSERT_EQ(want.s.n, 1u);
    EXPECT_STREQ(got.s.traces[0].name, want.s.traces[0].name);
    expect_same_trace(got.s.traces[0], want.s.traces[0]);
    EXPECT_EQ(got.s.traces[0].baseline.present, 1);
  }
}

// ------------------------------------------------------------------ the seed snapshot

// tests/fuzz/corpus/pickle/small_p{2,4}.pickle, written by Python's pickle (protocols 2 and
// 4: memo, FRAME, SHORT_BINUNICODE, LONG1, BINFLOAT, TUPLE2...) from a snapshot that has a
// block live before recording (freed with a pending free_requested), a plain free, a free
// left pending at the end, a side stream used before stream 0, segment_map, segment_alloc,
// segment_free, oom, snapshot, a second device with no events and an empty device list.
const char *kSmallWant =
    "# memtrace v1\n"
    "# pytorch: start_reserved=2097152 peak_reserved=6291456 end_reserved=4194304 "
    "segment_alloc=1 segment_free=1 map=1 unmap=0 oom=1\n"
    "# stats: prelive=1 peak_live_requested=4500\n"
    "p 1 0 300\n"
    "r 1 0 300\n"
    "m 1 0x400000 2097152\n"
    "f 1 0 300\n"
    "a 1 1 4000\n"
    "a 0 2 500\n"
    "f 1 1 4000\n"
    "M 0 0x800000 2097152\n"
    "X 0 0x800000 2097152\n"
    "O 0 - 1099511627776 device_free=12345\n"
    "a 0 3 500\n"
    "r 0 3 500\n";

std::string seed(const char *file) {
  return slurp(std::string(EXPSEG_SOURCE_DIR) + "/tests/fuzz/corpus/pickle/" + file);
}

TEST(TracePickle, SmallSnapshotFollowsTheRules) {
  for (const char *file : {"small_p4.pickle", "small_p2.pickle"}) {
    SCOPED_TRACE(file);
    std::string bytes = seed(file);
    ASSERT_GT(bytes.size(), 100u) << "seed file missing";
    TraceSet got, want;
    ASSERT_EQ(read_pickle(bytes, got, "some/dir/small.pickle"), EXPSEG_OK)
        << expseg_trace_last_error();
    ASSERT_EQ(expseg_trace_read_memtrace("small.dev0.memtrace", kSmallWant, strlen(kSmallWant),
                                         &want.s),
              EXPSEG_OK)
        << expseg_trace_last_error();
    ASSERT_EQ(got.s.n, 1u);  // device 1 and 2 have no events
    EXPECT_STREQ(got.s.traces[0].name, want.s.traces[0].name);
    expect_same_trace(got.s.traces[0], want.s.traces[0]);
  }
}

TEST(TracePickle, TruncatedAtEveryOffsetFailsWithTheOffset) {
  std::string bytes = seed("small_p4.pickle");
  ASSERT_GT(bytes.size(), 100u);
  for (size_t n = 0; n < bytes.size(); n++) {
    TraceSet s;
    ASSERT_EQ(read_pickle(bytes.substr(0, n), s), EXPSEG_ERR_INVALID_ARGUMENT) << n;
    EXPECT_EQ(s.s.n, 0u);
    std::string msg = expseg_trace_last_error();
    ASSERT_EQ(msg.rfind("snap.pickle: byte ", 0), 0u) << n << ": " << msg;
  }
}

TEST(TracePickle, MutatedBytesNeverCrash) {
  std::string bytes = seed("small_p4.pickle");
  ASSERT_GT(bytes.size(), 100u);
  const unsigned char values[] = {0x00, 0xff, 0x7f, 0x80, '(', 'c', 'h', 'a', 'u', '.'};
  size_t ok = 0, bad = 0;
  for (size_t i = 0; i < bytes.size(); i++) {
    for (unsigned char v : values) {
      std::string m = bytes;
      m[i] = (char)v;
      TraceSet s;
      expseg_status st = read_pickle(m, s);
      if (st == EXPSEG_OK) {
        ok++;
        ASSERT_EQ(s.s.n, 1u);
      } else {
        bad++;
        ASSERT_EQ(st, EXPSEG_ERR_INVALID_ARGUMENT);
        ASSERT_NE(std::string(expseg_trace_last_error()).find("snap.pickle: byte "), std::string::npos);
      }
    }
  }
  EXPECT_GT(bad, 0u);
  EXPECT_GT(ok, 0u);  // e.g. changed digits of sizes and addresses still give a valid trace
}

// ------------------------------------------------------------------ malformed pickles

struct Bad {
  std::string bytes;
  const char *want;
};

std::string B(const char *s, size_t n) { return std::string(s, n); }
#define RAW(lit) B(lit, sizeof(lit) - 1)

TEST(TracePickle, RejectsMalformedPicklesNamingOffsetAndReason) {
  std::vector<Bad> bad = {
      {RAW(""), "byte 0: truncated: the pickle ends before its STOP"},
      {RAW("\x80\x01N."), "byte 0 (opcode 0x80): pickle protocol 1: accepted are 2 to 5"},
      {RAW("\x80\x06N."), "pickle protocol 6"},
      {RAW("\x80\x02" "c__builtin__\neval\n."), "byte 2 (opcode 0x63): opcode not accepted"},
      {RAW("\x80\x02R."), "byte 2 (opcode 0x52): opcode not accepted"},
      {RAW("\x80\x02h\x05."), "byte 2 (opcode 0x68): memo index 5 was never stored"},
      {RAW("\x80\x02j\x00\x01\x00\x00."), "memo index 256 was never stored"},
      {RAW("\x80\x02Nr\xff\xff\xff\xff."), "byte 3 (opcode 0x72): memo index 4294967295 is "
                                           "beyond the limit"},
      {RAW("\x80\x02q\x00."), "memo store with an empty stack"},
      {RAW("\x80\x02X\xff\xff\xff\xff" "ab."), "string of 4294967295 bytes, but only 3 bytes "
                                               "are left"},
      {RAW("\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xff."), "string of 18446744073709551615 "
                                                             "bytes"},
      {RAW("\x80\x04\x95\x00\x00\x00\x00\x00\x00\x01\x00N."), "frame of 281474976710656 bytes"},
      {RAW("\x80\x02\x8a\xff" "abc."), "integer of 255 bytes, but only 4 bytes are left"},
      {RAW("\x80\x02J\x01\x02"), "truncated: needs 4 argument bytes, 2 left"},
      {RAW("\x80\x02N.N"), "byte 4: 1 bytes after the STOP opcode"},
      {RAW("\x80\x02NN."), "STOP with 2 values on the stack, expected 1"},
      {RAW("\x80\x02(N."), "STOP with 1 MARK(s) still open"},
      {RAW("\x80\x02}Na."), "APPEND onto a dict, expected a list"},
      {RAW("\x80\x02Na."), "APPEND needs a container and 1 value(s)"},
      {RAW("\x80\x02](Na."), "APPEND needs a container and 1 value(s) above the last MARK"},
      {RAW("\x80\x02}(Nu."), "SETITEMS with an odd number of items (1)"},
      {RAW("\x80\x02](NNs."), "SETITEM needs a container and 2 value(s) above the last MARK"},
      {RAW("\x80\x02]Ne."), "needs a MARK, but there is none"},
      {RAW("\x80\x02]((Ne."), "APPENDS with its container below an enclosing MARK"},
      {RAW("\x80\x02(NNNd."), "DICT over an odd number of items (3)"},
      {RAW("\x80\x02\x85."), "TUPLE1 with 0 values on the stack"},
      {RAW("\x80\x02N(\x85."), "TUPLE1 takes values from below the open MARK"},
      {RAW("\x80\x02" "N\x94h\x00h\x00\x87."), "the snapshot is a value of another type"},
      // a list that contains itself: loads, and is then rejected as a snapshot
      {RAW("\x80\x02]\x94h\x00" "a."), "the snapshot is a list, expected a dict"},
      {RAW("\x80\x02}."), "'segments' is missing"},
      {RAW("\x80\x02}(X\x08\x00\x00\x00segments]u."), "'device_traces' is missing"},
      {RAW("\x80\x02}(X\x08\x00\x00\x00segmentsNu."), "'segments' is not a list"},
      {RAW("\x80\x02}(X\x08\x00\x00\x00segments]X\x0d\x00\x00\x00" "device_traces]u."),
       "no device has recorded events"},
      {RAW("\x80\x02}(X\x08\x00\x00\x00segments]X\x0d\x00\x00\x00" "device_traces](Neu."),
       "device_traces[0] is not a list"},
  };
  std::string deep = RAW("\x80\x02");
  for (int i = 0; i < 65; i++) deep += "(";
  bad.push_back({deep, "byte 66 (opcode 0x28): MARKs nested deeper than 64"});
  for (const Bad &b : bad) {
    SCOPED_TRACE(b.want);
    TraceSet s;
    EXPECT_EQ(read_pickle(b.bytes, s), EXPSEG_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(s.s.n, 0u);
    std::string msg = expseg_trace_last_error();
    EXPECT_NE(msg.find(b.want), std::string::npos) << "message: " << msg;
    EXPECT_EQ(msg.rfind("snap.pickle: byte ", 0), 0u) << "message: " << msg;
  }
}

TEST(TracePickle, DeepNestingWithoutMarksDoesNotRecurse) {
  // 200000 nested lists ([[[...]]]) built with APPEND: no recursion anywhere
  std::string p = RAW("\x80\x02");
  const int n = 200000;
  for (int i = 0; i < n; i++) p += "]";
  for (int i = 0; i < n - 1; i++) p += "a";
  p += ".";
  _expseg_pickle_t pk;
  ASSERT_EQ(_expseg_pickle_load("deep", reinterpret_cast<const unsigned char *>(p.data()),
                                p.size(), &pk),
            EXPSEG_OK)
      << expseg_trace_last_error();
  EXPECT_EQ(pk.v[pk.root].kind, EXPSEG_PV_LIST);
  EXPECT_EQ(pk.v[pk.root].u.c.n, 1u);
  EXPECT_EQ(pk.n, (uint32_t)n + 1);
  _expseg_pickle_free(&pk);
}

TEST(TracePickle, UnpicklerValues) {
  // {'a': -2, 'b': 2**63 - 1, 'c': -2**63, 'd': 2**64, 'e': 1.5, 'f': (True, None), 'g': b'xy'}
  std::string p = RAW(
      "\x80\x04}(\x8c\x01" "aJ\xfe\xff\xff\xff"
      "\x8c\x01" "b\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f"
      "\x8c\x01" "c\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80"
      "\x8c\x01" "d\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01"
      "\x8c\x01" "eG\x3f\xf8\x00\x00\x00\x00\x00\x00"
      "\x8c\x01" "f\x88N\x86"
      "\x8c\x01" "gC\x02xy"
      "\x8c\x01" "a\x8a\x02\xff\x7fu.");  // 'a' again: the last one wins (32767)
  _expseg_pickle_t pk;
  ASSERT_EQ(_expseg_pickle_load("v", reinterpret_cast<const unsigned char *>(p.data()), p.size(),
                                &pk),
            EXPSEG_OK)
      << expseg_trace_last_error();
  auto get = [&](const char *k) { return pk.v[_expseg_pickle_dict_get(&pk, pk.root, k)]; };
  EXPECT_EQ(get("a").u.iv, 32767);
  EXPECT_EQ(get("b").u.iv, INT64_MAX);
  EXPECT_EQ(get("c").u.iv, INT64_MIN);
  EXPECT_EQ(get("d").big, 1);
  EXPECT_EQ(get("e").kind, EXPSEG_PV_FLOAT);
  EXPECT_EQ(get("e").u.fv, 1.5);
  EXPECT_EQ(get("f").kind, EXPSEG_PV_TUPLE);
  EXPECT_EQ(get("f").u.c.n, 2u);
  EXPECT_EQ(get("g").kind, EXPSEG_PV_BYTES);
  EXPECT_EQ(std::string(get("g").u.s.p, get("g").u.s.len), "xy");
  EXPECT_EQ(_expseg_pickle_dict_get(&pk, pk.root, "zz"), 0u);
  _expseg_pickle_free(&pk);
}

// ------------------------------------------------------------------ built snapshots

// A tiny protocol-2 writer for snapshot trees.
struct Py {
  enum Kind { None, Int, Str, List, Dict } k = None;
  int64_t i = 0;
  std::string s;
  std::vector<Py> items;                        // List
  std::vector<std::pair<std::string, Py>> kv;   // Dict
  Py() {}
  Py(int64_t v) : k(Int), i(v) {}
  Py(int v) : k(Int), i(v) {}
  Py(const char *v) : k(Str), s(v) {}
  static Py list(std::vector<Py> v) { Py p; p.k = List; p.items = std::move(v); return p; }
  static Py dict(std::vector<std::pair<std::string, Py>> v) {
    Py p; p.k = Dict; p.kv = std::move(v); return p;
  }
  void put(std::string &o) const {
    auto le = [&](uint64_t v, int n) { for (int j = 0; j < n; j++) o += (char)(v >> (8 * j)); };
    auto str = [&](const std::string &x) { o += 'X'; le(x.size(), 4); o += x; };
    switch (k) {
    case None: o += 'N'; break;
    case Int:
      if (i >= 0 && i < 256) { o += 'K'; le((uint64_t)i, 1); }
      else if (i >= INT32_MIN && i <= INT32_MAX) { o += 'J'; le((uint64_t)i, 4); }
      else { o += '\x8a'; o += '\x08'; le((uint64_t)i, 8); }
      break;
    case Str: str(s); break;
    case List:
      o += ']';
      if (!items.empty()) { o += '('; for (auto &x : items) x.put(o); o += 'e'; }
      break;
    case Dict:
      o += '}';
      if (!kv.empty()) { o += '('; for (auto &x : kv) { str(x.first); x.second.put(o); } o += 'u'; }
      break;
    }
  }
  std::string pickle() const { std::string o = "\x80\x02"; put(o); o += '.'; return o; }
};

Py blk(int64_t addr, int64_t size, int64_t req, const char *state) {
  return Py::dict({{"address", addr}, {"size", size}, {"requested_size", req}, {"state", state}});
}
Py seg(int dev, int64_t addr, int64_t total, int64_t stream, std::vector<Py> blocks) {
  return Py::dict({{"device", dev}, {"address", addr}, {"total_size", total},
                   {"stream", stream}, {"blocks", Py::list(std::move(blocks))}});
}
Py ev(const char *action, int64_t addr, int64_t size, int64_t stream = 0) {
  return Py::dict({{"action", action}, {"addr", addr}, {"size", size}, {"stream", stream}});
}
Py snap(std::vector<Py> segs, std::vector<Py> traces) {
  return Py::dict({{"segments", Py::list(std::move(segs))},
                   {"device_traces", Py::list(std::move(traces))}});
}

TEST(TracePickle, SeveralDevicesAndImpliedBlockAddresses) {
  // device 0: blocks without 'address' (oldest format): addresses from the running offset;
  // device 2: its own history. Pre-live blocks come out in address order.
  Py b_noaddr1 = Py::dict({{"size", 512}, {"requested_size", 100}, {"state", "active_allocated"}});
  Py b_noaddr2 = Py::dict({{"size", 512}, {"requested_size", 200}, {"state", "active_allocated"}});
  Py s = snap({seg(0, 0x2000, 1024, 0, {b_noaddr1, b_noaddr2}),
               seg(0, 0x1000, 512, 0, {blk(0x1000, 512, 50, "active_pending_free")}),
               seg(2, 0x9000, 4096, 7, {blk(0x9000, 4096, 4000, "active_allocated")})},
              {Py::list({ev("free_requested", 0x2200, 200), ev("snapshot", 0, 0)}), Py::list({}),
               Py::list({ev("alloc", 0x9000, 4000, 7), ev("alloc", 0xa000, 1, 7),
                         ev("free_requested", 0xa000, 1, 7), ev("free_completed", 0xa000, 1, 7)})});
  TraceSet got;
  ASSERT_EQ(read_pickle(s.pickle(), got, "/x/multi.pickle"), EXPSEG_OK) << expseg_trace_last_error();
  ASSERT_EQ(got.s.n, 2u);
  const expseg_trace_t &d0 = got.s.traces[0], &d2 = got.s.traces[1];
  EXPECT_STREQ(d0.name, "multi.dev0");
  EXPECT_EQ(d0.device, 0);
  EXPECT_STREQ(d2.name, "multi.dev2");
  EXPECT_EQ(d2.device, 2);
  // device 0: p 0x1000 (50), p 0x2000 (100), p 0x2200 (200), r of 0x2200 (id 2)
  ASSERT_EQ(d0.n_events, 4u);
  EXPECT_EQ(d0.events[0].size, 50u);
  EXPECT_EQ(d0.events[1].size, 100u);
  EXPECT_EQ(d0.events[2].size, 200u);
  EXPECT_EQ(d0.events[3].kind, 'r');
  EXPECT_EQ(d0.events[3].id, 2u);
  EXPECT_EQ(d0.peak_live_requested, 350u);
  EXPECT_EQ(d0.baseline.end_reserved, 1536u);
  EXPECT_EQ(d0.baseline.start_reserved, 1536u);
  // device 2: nothing pre-live; stream 7 is the only stream, so it is index 0
  ASSERT_EQ(d2.n_events, 3u);
  EXPECT_EQ(d2.events[0].kind, 'a');
  EXPECT_EQ(d2.events[0].stream, 0u);
  EXPECT_EQ(d2.events[2].kind, 'f');
  EXPECT_EQ(d2.events[2].id, 1u);
  EXPECT_EQ(d2.n_streams, 1u);
  EXPECT_EQ(d2.peak_live_requested, 4001u);
  EXPECT_EQ(d2.baseline.end_reserved, 4096u);
}

TEST(TracePickle, RejectsInconsistentOrMalformedSnapshots) {
  Py good_seg = seg(0, 0x1000, 1024, 0, {blk(0x1000, 512, 500, "active_allocated")});
  struct Case { Py s; const char *want; } cases[] = {
      // the history allocates 0x1000 but the end state does not hold it and nothing frees it
      {snap({}, {Py::list({ev("alloc", 0x1000, 10)})}),
       "device_traces[0][0]: alloc at 0x1000, but that address is not live after it"},
      {snap({good_seg}, {Py::list({ev("free_completed", 0x1000, 500)})}),
       "device_traces[0][0]: free_completed at 0x1000, but that address is live again"},
      {snap({}, {Py::list({ev("free_requested", 0x1000, 10)})}),
       "device_traces[0][0]: free_requested at 0x1000, which is not live"},
      {snap({}, {Py::list({ev("bogus", 0x1000, 10)})}), "unknown action 'bogus'"},
      {snap({}, {Py::list({ev("alloc", 0x1000, -1)})}), "'size' is -1, expected a non-negative"},
      {snap({}, {Py::list({ev("alloc", 0x1000, (int64_t)1 << 51)})}),
       "size 2251799813685248 is above the 2^50 bytes"},
      {snap({}, {Py::list({Py::dict({{"action", "alloc"}, {"addr", 1}, {"size", 1}})})}),
       "device_traces[0][0]: 'stream' is missing"},
      {snap({}, {Py::list({Py::dict({{"action", 5}})})}), "'action' is missing or not a string"},
      {snap({}, {Py::list({Py(3)})}), "device_traces[0][0]: expected a dict"},
      {snap({seg(0, 0x1000, 1024, 0, {blk(0x1000, 512, 500, "weird")})},
            {Py::list({ev("snapshot", 0, 0)})}),
       "segments[0].blocks[0]: unknown block state 'weird'"},
      {snap({seg(0, 0x1000, 1024, 0, {blk(0x1000, 512, 500, "active_allocated"),
                                      blk(0x1000, 512, 500, "active_allocated")})},
            {Py::list({ev("snapshot", 0, 0)})}),
       "segments[0].blocks[1]: two active blocks at address 0x1000"},
      {snap({Py::dict({{"device", 0}, {"address", 1}, {"total_size", 1}, {"stream", 0}})},
            {Py::list({ev("snapshot", 0, 0)})}),
       "segments[0]: 'blocks' is missing"},
      {snap({Py::dict({{"device", 0}, {"address", "x"}})}, {Py::list({ev("snapshot", 0, 0)})}),
       "segments[0]: 'address' is not a 64-bit integer"},
      {snap({good_seg}, {Py::list({ev("alloc", 0x2000, 10), ev("free_requested", 0x2000, 10),
                                   ev("free_completed", 0x2000, 11)})}),
       "device_traces[0][2]: free of id 1 with size 11, but it was allocated with size 10"},
  };
  for (auto &c : cases) {
    SCOPED_TRACE(c.want);
    TraceSet s;
    EXPECT_EQ(read_pickle(c.s.pickle(), s), EXPSEG_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(s.s.n, 0u);
    std::string msg = expseg_trace_last_error();
    EXPECT_NE(msg.find(c.want), std::string::npos) << "message: " << msg;
    EXPECT_EQ(msg.rfind("snap.pickle: byte ", 0), 0u) << "message: " << msg;
  }
}

}  // namespace
