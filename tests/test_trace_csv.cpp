// SPDX-License-Identifier: Apache-2.0
// test_trace_csv.cpp: the RMM logging_resource_adaptor CSV reader (bench/replay/trace_csv.c).
#include <gtest/gtest.h>

#include "trace_support.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>

extern "C" {
#include "trace.h"
}

namespace {

expseg_status read(const std::string &text, TraceSet &out) {
  return expseg_trace_read_rmm_csv("logs/run.csv", text.data(), text.size(), &out.s);
}

#define HDR "Thread,Time,Action,Pointer,Size,Stream\n"

TEST(TraceCsv, PairsFreesWithLiveAllocationsByPointer) {
  TraceSet s;
  std::string text = HDR
      "140573312345856,13:45:12:123456,allocate,0x7f8a40000000,1024,0x7f8a38001020\n"
      "140573312345856,13:45:12:123457,allocate,7f8a40000400,2048,0x0\n"
      "140573312345856,13:45:12:123458,free,0x7f8a40000000,1024,0x7f8a38001020\n"
      "140573312345856,13:45:12:123459,allocate,0x7f8a40000000,512,0x7f8a38001020\n"
      "140573312345856,13:45:12:123460,allocate failure,0x0,1099511627776,0x0\n"
      "140573312345856,13:45:12:123461,deallocate,0x7F8A40000400,2048,0\n"
      "140573312345856,13:45:12:123462,allocate,0x10,8,0xabc\n";
  ASSERT_EQ(read(text, s), EXPSEG_OK) << expseg_trace_last_error();
  ASSERT_EQ(s.s.n, 1u);
  const expseg_trace_t &t = s.s.traces[0];
  EXPECT_STREQ(t.name, "run");
  // stream 0 is index 0 although 0x7f8a38001020 came first; the others in order of first use
  const WantEvent want[] = {
      {'a', 1, 0, 1024, 0}, {'a', 0, 1, 2048, 0}, {'f', 1, 0, 1024, 0}, {'a', 1, 2, 512, 0},
      {'O', 0, 0, 1099511627776ull, 0}, {'f', 0, 1, 2048, 0}, {'a', 2, 3, 8, 0}};
  ASSERT_NO_FATAL_FAILURE(expect_events(t, want));
  EXPECT_EQ(t.n_ids, 4u);
  EXPECT_EQ(t.n_streams, 3u);
  EXPECT_EQ(t.peak_live_requested, 3072u);  // 1024 + 2048; then 2048 + 512 + 8 at most
  EXPECT_EQ(t.baseline.present, 0);
  EXPECT_EQ(t.baseline.oom, 1u);
}

TEST(TraceCsv, StreamOrderIsFirstUseWhenZeroIsAbsentAndCrlfIsAccepted) {
  TraceSet s;
  std::string text = "Thread,Time,Action,Pointer,Size,Stream\r\n"
                     "1,t,allocate,0x100,10,0x55\r\n"
                     "1,t,allocate,0x200,20,0x66\r\n"
                     "1,t,allocate,0x300,30,0x55\r\n"
                     "\r\n";
  ASSERT_EQ(read(text, s), EXPSEG_OK) << expseg_trace_last_error();
  const expseg_trace_t &t = s.s.traces[0];
  ASSERT_EQ(t.n_events, 3u);
  EXPECT_EQ(t.events[0].stream, 0u);
  EXPECT_EQ(t.events[1].stream, 1u);
  EXPECT_EQ(t.events[2].stream, 0u);
  EXPECT_EQ(t.n_streams, 2u);
  EXPECT_EQ(t.peak_live_requested, 60u);  // still live at the end: left live
}

TEST(TraceCsv, ManyPointersReusedStayPaired) {
  std::string text = HDR;
  // 3000 blocks, freed in a scrambled order, then the addresses reused
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < 3000; i++)
      text += "1,t,allocate,0x" + std::to_string(1000 + i) + "00," + std::to_string(i + 1) +
              ",0x0\n";
    for (int i = 0; i < 3000; i++) {
      int j = (i * 7919) % 3000;
      text += "1,t,free,0x" + std::to_string(1000 + j) + "00," + std::to_string(j + 1) + ",0x0\n";
    }
  }
  TraceSet s;
  ASSERT_EQ(read(text, s), EXPSEG_OK) << expseg_trace_last_error();
  const expseg_trace_t &t = s.s.traces[0];
  EXPECT_EQ(t.n_ids, 6000u);
  EXPECT_EQ(t.peak_live_requested, 3000u * 3001u / 2);
  // the second round's frees name the second round's ids
  const expseg_trace_event_t &e = t.events[t.n_events - 1];
  EXPECT_EQ(e.kind, 'f');
  int j = (2999 * 7919) % 3000;
  EXPECT_EQ(e.id, 3000u + (uint64_t)j);
  EXPECT_EQ(e.size, (uint64_t)j + 1);
}

struct Bad {
  const char *text;
  const char *want;
};

const Bad kBad[] = {
    {"", "logs/run.csv:0: empty file"},
    {"Thread,Time,Action,Pointer,Size\n", "logs/run.csv:1: the first line must be the header"},
    {HDR "1,t,free,0x10,8,0x0\n", "logs/run.csv:2: free of pointer 0x10, which is not live"},
    {HDR "1,t,allocate,0x10,8,0x0\n1,t,free,0x10,8,0x0\n1,t,free,0x10,8,0x0\n",
     "logs/run.csv:4: free of pointer 0x10, which is not live"},
    {HDR "1,t,allocate,0x10,8,0x0\n1,t,allocate,0x10,8,0x0\n",
     "logs/run.csv:3: allocate returned pointer 0x10, which is already live"},
    {HDR "1,t,allocate,0x10,8,0x0\n1,t,free,0x10,9,0x0\n",
     "logs/run.csv:3: free of id 0 with size 9, but it was allocated with size 8"},
    {HDR "1,t,allocate,0xzz,8,0x0\n", "logs/run.csv:2: pointer '0xzz' is not hexadecimal"},
    {HDR "1,t,allocate,0x11112222333344445,8,0x0\n", ":2: pointer '0x11112222333344445' is not"},
    {HDR "1,t,allocate,0x10,8k,0x0\n", ":2: size '8k' is not an unsigned decimal number"},
    {HDR "1,t,allocate,0x10,-8,0x0\n", ":2: size '-8' is not"},
    {HDR "1,t,allocate,0x10,1125899906842625,0x0\n", ":2: size 1125899906842625 is above the "
                                                      "2^50"},
    {HDR "1,t,allocate,0x10,8,stream\n", ":2: stream 'stream' is not hexadecimal"},
    {HDR "1,t,allocate,0x10,8,\n", ":2: stream '' is not hexadecimal"},
    {HDR "1,t,reallocate,0x10,8,0x0\n", ":2: unknown action 'reallocate'"},
    {HDR "1,t,allocate,0x10,8\n", ":2: 5 fields, expected 6"},
    {HDR "1,t,allocate,0x10,8,0x0,extra\n", ":2: more than 6 fields"},
};

TEST(TraceCsv, RejectsMalformedInputNamingLineAndReason) {
  for (const Bad &b : kBad) {
    SCOPED_TRACE(b.text);
    TraceSet s;
    EXPECT_EQ(read(b.text, s), EXPSEG_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(s.s.n, 0u);
    std::string msg = expseg_trace_last_error();
    EXPECT_NE(msg.find(b.want), std::string::npos) << "message: " << msg;
  }
  TraceSet s;
  static const char nul[] = HDR "1,t,allocate,0x10,8,0x0\0\n";
  EXPECT_EQ(expseg_trace_read_rmm_csv("x.csv", nul, sizeof nul - 1, &s.s),
            EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_trace_last_error()).find("x.csv:2: NUL byte"), std::string::npos)
      << expseg_trace_last_error();
  EXPECT_EQ(expseg_trace_read_rmm_csv("x.csv", nullptr, 5, &s.s), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_trace_read_rmm_csv("x.csv", HDR, 5, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
}

TEST(TraceCsv, RoundTripThroughMemtrace) {
  TraceSet a;
  std::string text = HDR
      "1,t,allocate,0x100,10,0x77\n"
      "1,t,allocate,0x200,20,0x0\n"
      "1,t,allocate failure,0x0,30,0x77\n"
      "1,t,free,0x100,10,0x77\n";
  ASSERT_EQ(read(text, a), EXPSEG_OK) << expseg_trace_last_error();
  std::string path = trace_tmp_path("csv_rt.memtrace");
  ASSERT_EQ(expseg_trace_write_memtrace(&a.s.traces[0], path.c_str()), EXPSEG_OK)
      << expseg_trace_last_error();
  TraceSet b;
  ASSERT_EQ(expseg_trace_read_file(path.c_str(), &b.s), EXPSEG_OK) << expseg_trace_last_error();
  std::remove(path.c_str());
  ASSERT_EQ(b.s.n, 1u);
  expect_same_trace(a.s.traces[0], b.s.traces[0]);
  const expseg_trace_t &y = b.s.traces[0];
  EXPECT_EQ(y.peak_live_requested, 30u);
  EXPECT_EQ(a.s.traces[0].baseline.oom, 1u); // the "allocate failure" line
  EXPECT_EQ(y.baseline.present, 0);
  EXPECT_EQ(y.baseline.oom, 1u) << "the OOM count was lost in the csv -> memtrace round trip";
}

}  // namespace
