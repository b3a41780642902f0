// SPDX-License-Identifier: Apache-2.0
// test_trace_costs.cpp: the snapshot reader (bench/replay/pickle.c, bench/replay/trace_pickle.c) costs time
// linear in its input whatever the memo shares. The crafted shapes of bench/replay/pickle_craft.c
// (a wide event dict read through the memo, a history and a segment shared by many devices,
// many devices beside many segments, sparse memo indices) must read, or be refused, well
// within a bound that a quadratic reader misses by far (seconds to hours); the refusals of
// structures that would be walked twice name what is shared; large dicts are hashed and
// still give the last value of a repeated key.
#include <gtest/gtest.h>

#include "trace_support.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

extern "C" {
#include "trace.h"
#include "trace_internal.h"
}

namespace {

struct Crafted {
  unsigned char *p = nullptr;
  size_t n = 0;
  Crafted(const char *shape, size_t k) { p = _expseg_pickle_craft(shape, k, &n); }
  ~Crafted() { free(p); }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The quadratic readers took 12 s (wide, 352 KB) and 16 s (shared, 80 KB) for these shapes;
// a linear one takes milliseconds (tens under ASan). 3 s leaves room for a loaded machine.
constexpr double kBoundS = 3.0;

TEST(TraceCosts, WideEventDictSharedThroughTheMemo) {
  Crafted c("wide", 25000);
  ASSERT_NE(c.p, nullptr);
  EXPECT_GT(c.n, 300000u);
  TraceSet s;
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(expseg_trace_read_pickle("wide.pickle", c.p, c.n, &s.s), EXPSEG_OK)
      << expseg_trace_last_error();
  double t = seconds_since(t0);
  EXPECT_LT(t, kBoundS) << c.n << " bytes";
  ASSERT_EQ(s.s.n, 1u);
  ASSERT_EQ(s.s.traces[0].n_events, 25000u);
  EXPECT_EQ(s.s.traces[0].events[24999].kind, 'O');
  EXPECT_EQ(s.s.traces[0].baseline.oom, 25000u);
}

TEST(TraceCosts, HistoryAndSegmentSharedByManyDevicesIsRefused) {
  Crafted c("shared", 16000);
  ASSERT_NE(c.p, nullptr);
  TraceSet s;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(expseg_trace_read_pickle("shared.pickle", c.p, c.n, &s.s),
            EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_LT(seconds_since(t0), kBoundS) << c.n << " bytes";
  EXPECT_EQ(s.s.n, 0u);
  std::string msg = expseg_trace_last_error();
  EXPECT_NE(msg.find("device_traces[1] is the same list as device_traces[0]: each device has "
                     "its own history"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.rfind("shared.pickle: byte ", 0), 0u) << msg;
}

TEST(TraceCosts, ManyDevicesBesideManySegmentsWalkEachSegmentOnce) {
  Crafted c("devices", 500000);
  ASSERT_NE(c.p, nullptr);
  TraceSet s;
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(expseg_trace_read_pickle("devices.pickle", c.p, c.n, &s.s), EXPSEG_OK)
      << expseg_trace_last_error();
  EXPECT_LT(seconds_since(t0), kBoundS) << c.n << " bytes";
  ASSERT_EQ(s.s.n, (size_t)EXPSEG_PICKLE_MAX_DEVICES);
  for (size_t i = 0; i < s.s.n; i++) {
    EXPECT_EQ(s.s.traces[i].device, (int)i);
    ASSERT_EQ(s.s.traces[i].n_events, 1u);
    EXPECT_EQ(s.s.traces[i].baseline.end_reserved, 0u);  // the segment is on another device
  }
}

TEST(TraceCosts, SparseMemoIndicesReadBack) {
  Crafted c("memo", 20000);
  ASSERT_NE(c.p, nullptr);
  TraceSet s;
  ASSERT_EQ(expseg_trace_read_pickle("memo.pickle", c.p, c.n, &s.s), EXPSEG_OK)
      << expseg_trace_last_error();
  ASSERT_EQ(s.s.n, 1u);
  EXPECT_EQ(s.s.traces[0].n_events, 40000u);
  // a reference to an index never stored is still an error, dense or sparse
  std::string q = std::string("\x80\x02N", 3) + "r" + std::string("\x30\x00\x00\x00", 4) +
                  "j" + std::string("\x31\x00\x00\x00", 4) + ".";
  q += std::string(64, 'N');  // long enough that the indices are below its length
  _expseg_pickle_t pk;
  ASSERT_EQ(_expseg_pickle_load("m", reinterpret_cast<const unsigned char *>(q.data()), q.size(),
                                &pk),
            EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_trace_last_error()).find("memo index 49 was never stored"),
            std::string::npos)
      << expseg_trace_last_error();
}

// A protocol-2 fragment writer: enough to share lists through the memo.
std::string u32(uint32_t v) {
  std::string o;
  for (int j = 0; j < 4; j++) o += (char)(v >> (8 * j));
  return o;
}
std::string S(const std::string &s) { return "X" + u32((uint32_t)s.size()) + s; }
std::string I(int32_t v) { return "J" + u32((uint32_t)v); }
std::string put(uint32_t i) { return "r" + u32(i); }
std::string get(uint32_t i) { return "j" + u32(i); }
std::string seg(int dev, int addr, const std::string &blocks) {
  return "}(" + S("device") + I(dev) + S("address") + I(addr) + S("total_size") + I(4096) +
         S("stream") + I(0) + S("blocks") + blocks + "u";
}
std::string blk(int addr, const char *state) {
  return "}(" + S("address") + I(addr) + S("size") + I(512) + S("state") + S(state) + "u";
}
std::string oom_ev() {
  return "}(" + S("action") + S("oom") + S("device_free") + I(0) + S("size") + I(1) +
         S("stream") + I(0) + "u";
}
std::string snap(const std::string &segs, const std::string &traces) {
  return "\x80\x02}(" + S("segments") + "](" + segs + "e" + S("device_traces") + "](" + traces +
         "eu.";
}

void expect_refused(const std::string &p, const char *want) {
  SCOPED_TRACE(want);
  TraceSet s;
  EXPECT_EQ(expseg_trace_read_pickle("r.pickle", reinterpret_cast<const unsigned char *>(p.data()),
                                     p.size(), &s.s),
            EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(s.s.n, 0u);
  std::string msg = expseg_trace_last_error();
  EXPECT_NE(msg.find(want), std::string::npos) << msg;
  EXPECT_EQ(msg.rfind("r.pickle: byte ", 0), 0u) << msg;
}

TEST(TraceCosts, StructuresWalkedTwiceAreRefused) {
  std::string hist = "](" + oom_ev() + "e";
  // two segments share one non-empty block list
  expect_refused(snap(seg(0, 4096, "](" + blk(4096, "inactive") + "e" + put(30)) +
                          seg(0, 8192, get(30)),
                      hist),
                 "segments[1]: 'blocks' is the same list as segments[0]'s");
  // one segment twice on a device with a history
  expect_refused(snap(seg(0, 4096, "]") + put(30) + get(30), hist),
                 "segments[1]: two segments at address 0x1000");
  // a device index beyond the limit
  std::string many;
  for (int i = 0; i < EXPSEG_PICKLE_MAX_DEVICES; i++) many += "]";
  expect_refused(snap("", many + hist), "device index 1024 is too large (accepted are 0 to 1023)");
  // an empty history and an empty block list may be shared: they cost nothing
  TraceSet s;
  std::string ok = snap(seg(0, 4096, "]" + put(30)) + seg(0, 8192, get(30)),
                        "]" + put(31) + get(31) + hist);
  ASSERT_EQ(expseg_trace_read_pickle("ok.pickle",
                                     reinterpret_cast<const unsigned char *>(ok.data()),
                                     ok.size(), &s.s),
            EXPSEG_OK)
      << expseg_trace_last_error();
  ASSERT_EQ(s.s.n, 1u);
  EXPECT_EQ(s.s.traces[0].device, 2);
}

TEST(TraceCosts, LargeDictsAreHashedAndTheLastKeyWins) {
  // {'k0': 0, ..., 'k39': 39, 7: None, 'k5': 555}: above EXPSEG_PICKLE_SCAN_KEYS keys
  std::string p = "\x80\x02}(";
  for (int i = 0; i < 40; i++) p += S("k" + std::to_string(i)) + I(i);
  p += I(7) + "N" + S("k5") + I(555) + "u.";
  _expseg_pickle_t pk;
  ASSERT_EQ(_expseg_pickle_load("d", reinterpret_cast<const unsigned char *>(p.data()), p.size(),
                                &pk),
            EXPSEG_OK)
      << expseg_trace_last_error();
  EXPECT_GT(_expseg_map_count(&pk.dindex), 0u);  // the table exists
  for (int i = 0; i < 40; i++) {
    uint32_t v = _expseg_pickle_dict_get(&pk, pk.root, ("k" + std::to_string(i)).c_str());
    ASSERT_NE(v, 0u) << i;
    EXPECT_EQ(pk.v[v].u.iv, i == 5 ? 555 : i);
  }
  EXPECT_EQ(_expseg_pickle_dict_get(&pk, pk.root, "k40"), 0u);
  EXPECT_EQ(_expseg_pickle_dict_get(&pk, pk.root, "7"), 0u);
  _expseg_pickle_free(&pk);
}

}  // namespace
