// SPDX-License-Identifier: Apache-2.0
// test_trace_memtrace.cpp: the memtrace v1 reader (bench/replay/trace_memtrace.c), the writer, the
// format detection of expseg_trace_read_file, and the shared map and checker (bench/replay/trace.c).
#include <gtest/gtest.h>

#include "trace_support.h"

#include "test_seed.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <chrono>
#include <fcntl.h>
#include <future>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

extern "C" {
#include "trace.h"
#include "trace_internal.h"
}

namespace {

expseg_status read(const std::string &text, TraceSet &out, const char *name = "t.memtrace") {
  return expseg_trace_read_memtrace(name, text.data(), text.size(), &out.s);
}

const char *kGood =
    "# memtrace v1\n"
    "# source: good device=3\n"
    "# pytorch: start_reserved=100 peak_reserved=300 end_reserved=200 segment_alloc=1 "
    "segment_free=0 map=1 unmap=1 oom=1\n"
    "p 0 0 1000\n"
    "p 0 1 24\n"
    "a 1 2 4096\n"
    "# a comment in the middle\n"
    "r 1 2 4096\n"
    "a 0 3 10\n"
    "f 0 0 1000\n"
    "f 1 2 4096\n"
    "E\n"
    "M 0 0x7f0000000000 2097152\n"
    "m 2 140000 4096\n"
    "u 2 0x22 4096\n"
    "O 0 - 8192 device_free=77\n"
    "\n"
    "# stats: prelive=2 peak_live_requested=5130\n";

TEST(TraceMemtrace, ReadsEveryLineKind) {
  TraceSet s;
  ASSERT_EQ(read(kGood, s, "dir/good.memtrace"), EXPSEG_OK) << expseg_trace_last_error();
  ASSERT_EQ(s.s.n, 1u);
  const expseg_trace_t &t = s.s.traces[0];
  EXPECT_STREQ(t.name, "good");
  EXPECT_EQ(t.device, 3);
  const WantEvent want[] = {
      {'p', 0, 0, 1000, 0}, {'p', 0, 1, 24, 0}, {'a', 1, 2, 4096, 0}, {'r', 1, 2, 4096, 0},
      {'a', 0, 3, 10, 0}, {'f', 0, 0, 1000, 0}, {'f', 1, 2, 4096, 0}, {'E', 0, 0, 0, 0},
      {'M', 0, 0x7f0000000000ull, 2097152, 0}, {'m', 2, 140000, 4096, 0},
      // an unmap not after an OOM is the program's empty_cache(): the reader adds an E
      {'E', 0, 0, 0, 0}, {'u', 2, 0x22, 4096, 0}, {'O', 0, 0, 8192, 77}};
  ASSERT_NO_FATAL_FAILURE(expect_events(t, want));
  EXPECT_EQ(t.n_ids, 4u);
  EXPECT_EQ(t.n_streams, 3u);
  // 1000 + 24 + 4096 + 10: the 'r' does not end the allocation, its 'f' does
  EXPECT_EQ(t.peak_live_requested, 5130u);
  EXPECT_EQ(t.baseline.present, 1);
  EXPECT_EQ(t.baseline.start_reserved, 100u);
  EXPECT_EQ(t.baseline.peak_reserved, 300u);
  EXPECT_EQ(t.baseline.end_reserved, 200u);
  EXPECT_EQ(t.baseline.segment_alloc, 1u);
  EXPECT_EQ(t.baseline.map, 1u);
  EXPECT_EQ(t.baseline.unmap, 1u);
  EXPECT_EQ(t.baseline.oom, 1u);
}

TEST(TraceMemtrace, PeakCountsFreeNotFreeRequest) {
  TraceSet s;
  ASSERT_EQ(read("# memtrace v1\na 0 0 100\nr 0 0 100\na 0 1 50\nf 0 0 100\na 0 2 70\n", s),
            EXPSEG_OK)
      << expseg_trace_last_error();
  EXPECT_EQ(s.s.traces[0].peak_live_requested, 150u);
  EXPECT_EQ(s.s.traces[0].baseline.present, 0);
}

// Without a "# pytorch:" line the OOM count comes from the 'O' lines (as for an RMM log);
// with one, the line's figure stands.
TEST(TraceMemtrace, OomCountWithoutRecordedFigures) {
  TraceSet s;
  ASSERT_EQ(read("# memtrace v1\na 0 0 100\nO 0 - 4096 device_free=0\nO 0 - 8192 "
                 "device_free=0\nf 0 0 100\n", s),
            EXPSEG_OK)
      << expseg_trace_last_error();
  EXPECT_EQ(s.s.traces[0].baseline.present, 0);
  EXPECT_EQ(s.s.traces[0].baseline.oom, 2u);
  TraceSet p;
  ASSERT_EQ(read("# memtrace v1\n# pytorch: start_reserved=0 peak_reserved=0 end_reserved=0 "
                 "segment_alloc=0 segment_free=0 map=0 unmap=0 oom=5\na 0 0 100\n"
                 "O 0 - 4096 device_free=0\n", p),
            EXPSEG_OK)
      << expseg_trace_last_error();
  EXPECT_EQ(p.s.traces[0].baseline.present, 1);
  EXPECT_EQ(p.s.traces[0].baseline.oom, 5u);
}

// The OOM count without a "# pytorch:" line, attacked: malformed 'O' lines are rejected at
// their line (nothing counted, nothing returned), the largest accepted size (2^50) and
// device_free values
// count once each, a thousand 'O' lines on several streams count a thousand, and a
// "# pytorch:" line after the 'O' lines still stands (its figure, not the lines').
TEST(TraceMemtrace, OomCountAttacked) {
  const std::string head = "# memtrace v1\na 0 0 100\n";
  for (const char *bad : {"O 0 - 4096\n", "O 0 x 4096 device_free=0\n",
                          "O 0 - 4096 device_free=\n", "O 0 - 4096 device_free=-1\n",
                          "O 0 - 4096 device_free=18446744073709551616\n",
                          "O 0 - 18446744073709551616 device_free=0\n",
                          "O 0 - 4096 free=0\n", "O 0 - 4096 device_free=0 x\n",
                          "O 99999999 - 4096 device_free=0\n", "O 0 - 0x10 device_free=0\n",
                          "O - - 4096 device_free=0\n", "OO 0 - 4096 device_free=0\n",
                          "o 0 - 4096 device_free=0\n", "O 0 - 4096 device_free=1e3\n"}) {
    TraceSet s;
    EXPECT_NE(read(head + bad + "f 0 0 100\n", s), EXPSEG_OK) << bad;
    EXPECT_EQ(s.s.n, 0u) << bad;
    std::string e = expseg_trace_last_error();
    EXPECT_NE(e.find("t.memtrace:3:"), std::string::npos) << bad << ": " << e;
  }
  TraceSet huge;
  ASSERT_EQ(read(head + "O 0 - 1125899906842624 device_free=18446744073709551615\n"
                        "O 0 - 0 device_free=0\nf 0 0 100\n",
                 huge),
            EXPSEG_OK)
      << expseg_trace_last_error();
  EXPECT_EQ(huge.s.traces[0].baseline.oom, 2u);
  std::string many = head + "a 1 1 10\n";
  for (int i = 0; i < 1000; i++)
    many += "O " + std::to_string(i % 2) + " - " + std::to_string(4096 + i) + " device_free=" +
            std::to_string(i) + (i % 3 ? "\n" : "\r\n");
  many += "f 0 0 100\nf 1 1 10\n";
  TraceSet m;
  ASSERT_EQ(read(many, m), EXPSEG_OK) << expseg_trace_last_error();
  EXPECT_EQ(m.s.traces[0].baseline.present, 0);
  EXPECT_EQ(m.s.traces[0].baseline.oom, 1000u);
  TraceSet late;
  ASSERT_EQ(read(head + "O 0 - 4096 device_free=0\nO 0 - 4096 device_free=0\n"
                        "# pytorch: start_reserved=0 peak_reserved=0 end_reserved=0 "
                        "segment_alloc=0 segment_free=0 map=0 unmap=0 oom=0\nf 0 0 100\n",
                 late),
            EXPSEG_OK)
      << expseg_trace_last_error();
  EXPECT_EQ(late.s.traces[0].baseline.present, 1);
  EXPECT_EQ(late.s.traces[0].baseline.oom, 0u) << "the recorded figure stands, even 0";
}

TEST(TraceMemtrace, AcceptsCrlfAndStreamZeroLate) {
  TraceSet s;
  // stream 0 may first appear after stream 1 (the default stream is always index 0)
  ASSERT_EQ(read("# memtrace v1\r\na 1 0 5\r\na 0 1 6\r\na 2 2 7\r\n", s), EXPSEG_OK)
      << expseg_trace_last_error();
  EXPECT_EQ(s.s.traces[0].n_streams, 3u);
  EXPECT_EQ(s.s.traces[0].n_events, 3u);
}

struct Bad {
  const char *text;
  const char *want;  // substrings of the message, '|'-separated
};

const Bad kBad[] = {
    {"", "t.memtrace:0: empty file"},
    {"a 0 0 1\n", "t.memtrace:1: the first line must be '# memtrace v1'"},
    {"# memtrace v2\n", ":1: the first line"},
    {"# memtrace v1\na 0 1 10\n", ":2: id 1 is not the next new id (0)"},
    {"# memtrace v1\np 0 0 10\np 0 0 10\n", ":3: id 0 is not the next new id (1)"},
    {"# memtrace v1\nf 0 0 10\n", ":2: free of id 0, which was never allocated"},
    {"# memtrace v1\na 0 0 10\nf 0 0 10\nf 0 0 10\n", ":4: free of id 0, which is already free"},
    {"# memtrace v1\na 0 0 10\nf 0 0 11\n", ":3: free of id 0 with size 11, but it was "
                                            "allocated with size 10"},
    {"# memtrace v1\na 0 0 10\nr 0 0 10\nr 0 0 10\n", ":4: free request of id 0, which is "
                                                      "already awaiting its free"},
    {"# memtrace v1\na 0 0 10\nf 0 0 10\nr 0 0 10\n", ":4: free request of id 0, which is "
                                                      "already free"},
    {"# memtrace v1\na 0 x1 10\n", ":2: id 'x1' is not an unsigned decimal number"},
    {"# memtrace v1\na 0 0 -5\n", ":2: size '-5' is not"},
    {"# memtrace v1\na 0 0 99999999999999999999999\n", ":2: size '9999"},
    {"# memtrace v1\na 0 0 1125899906842625\n", ":2: size 1125899906842625 is above the 2^50"},
    {"# memtrace v1\nM 0 0x10 1125899906842625\n", ":2: size 1125899906842625 is above"},
    {"# memtrace v1\nz 0 0 1\n", ":2: unknown line kind 'z'"},
    {"# memtrace v1\nalloc 0 0 1\n", ":2: unknown line kind 'alloc'"},
    {"# memtrace v1\na 0 0 1 2\n", ":2: 'a' line has more than 4 fields"},
    {"# memtrace v1\na 0 0\n", ":2: 'a' line has 3 fields, expected 4"},
    {"# memtrace v1\nE 0\n", ":2: 'E' line has more than 1 fields"},
    {"# memtrace v1\na 2 0 1\n", ":2: stream 2 skips stream 1"},
    {"# memtrace v1\na 0 0 1\na 1 1 1\na 3 2 1\n", ":4: stream 3 skips stream 2"},
    {"# memtrace v1\na 9999999 0 1\n", ":2: stream 9999999 is above"},
    {"# memtrace v1\na 0 0 1\np 0 1 1\n", ":3: 'p' (live at start) after the first event"},
    {"# memtrace v1\nO 0 5 10 device_free=1\n", ":2: 'O' line: third field must be '-'"},
    {"# memtrace v1\nO 0 - 10 free=1\n", ":2: 'O' line: last field must be device_free=N"},
    {"# memtrace v1\nO 0 - 10 device_free=x\n", ":2: device_free 'x' is not"},
    {"# memtrace v1\nM 0 0xzz 10\n", ":2: address '0xzz' is not an unsigned decimal number or "
                                     "0x-prefixed hexadecimal"},
    {"# memtrace v1\n# pytorch: start_reserved=1 peak_reserved=1 end_reserved=1\n",
     ":2: '# pytorch:' line: segment_alloc is missing"},
    {"# memtrace v1\n# pytorch: start_reserved=1 peak_reserved=1 end_reserved=1 "
     "segment_alloc=0 segment_free=0 map=0 unmap=0 oom=0 bogus=1\n",
     ":2: '# pytorch:' line: unknown item 'bogus=1'"},
    {"# memtrace v1\n# pytorch: start_reserved=1 start_reserved=1\n", ":2: '# pytorch:' line: "
                                                                      "start_reserved given twice"},
    {"# memtrace v1\n# stats: prelive=q peak_live_requested=0\n", ":2: '# stats:' line: prelive "
                                                                  "'q' is not"},
    {"# memtrace v1\n# stats: prelive=1 peak_live_requested=10\np 0 0 10\na 0 1 5\n",
     ":2: '# stats:' line says prelive=1 peak_live_requested=10, but the events give 1 and 15"},
    {"# memtrace v1\n# source: x device=zz\n", ":2: device 'zz' is not"},
};

TEST(TraceMemtrace, RejectsMalformedInputNamingLineAndReason) {
  for (const Bad &b : kBad) {
    SCOPED_TRACE(b.text);
    TraceSet s;
    EXPECT_EQ(read(b.text, s), EXPSEG_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(s.s.n, 0u);
    EXPECT_EQ(s.s.traces, nullptr);
    std::string msg = expseg_trace_last_error();
    EXPECT_NE(msg.find(b.want), std::string::npos) << "message: " << msg;
    EXPECT_EQ(msg.rfind("t.memtrace:", 0), 0u) << "message: " << msg;
  }
}

TEST(TraceMemtrace, RejectsNulBytes) {
  TraceSet s;
  static const char text[] = "# memtrace v1\na 0 0 1\n\0\n";
  EXPECT_EQ(read(std::string(text, sizeof text - 1), s), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_trace_last_error()).find("t.memtrace:3: NUL byte"), std::string::npos)
      << expseg_trace_last_error();
}

TEST(TraceMemtrace, WriteThenReadGivesTheSameTrace) {
  TraceSet a;
  ASSERT_EQ(read(kGood, a), EXPSEG_OK) << expseg_trace_last_error();
  std::string path = trace_tmp_path("roundtrip.memtrace");
  ASSERT_EQ(expseg_trace_write_memtrace(&a.s.traces[0], path.c_str()), EXPSEG_OK)
      << expseg_trace_last_error();
  TraceSet b;
  ASSERT_EQ(expseg_trace_read_file(path.c_str(), &b.s), EXPSEG_OK) << expseg_trace_last_error();
  ASSERT_EQ(b.s.n, 1u);
  expect_same_trace(a.s.traces[0], b.s.traces[0]);
  std::remove(path.c_str());
}

TEST(TraceMemtrace, WriteFailsOnUnwritablePath) {
  TraceSet a;
  ASSERT_EQ(read(kGood, a), EXPSEG_OK);
  EXPECT_EQ(expseg_trace_write_memtrace(&a.s.traces[0], "/nonexistent-dir/x.memtrace"),
            EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_trace_last_error()).find("/nonexistent-dir/x.memtrace"),
            std::string::npos);
}

TEST(TraceReadFile, NamesThePathWhenUnreadable) {
  TraceSet s;
  EXPECT_EQ(expseg_trace_read_file("/nonexistent-dir/none.memtrace", &s.s),
            EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_trace_last_error()).find("/nonexistent-dir/none.memtrace: cannot open"),
            std::string::npos)
      << expseg_trace_last_error();
  EXPECT_EQ(s.s.n, 0u);
  EXPECT_EQ(expseg_trace_read_file("/", &s.s), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_trace_read_file(nullptr, &s.s), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_trace_read_file("x", nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
}

TEST(TraceReadFile, PicksTheFormatByContent) {
  std::string path = trace_tmp_path("fmt.bin");
  struct { std::string text; expseg_status want; const char *msg; } cases[] = {
      {"# memtrace v1\na 0 0 10\n", EXPSEG_OK, ""},
      {"Thread,Time,Action,Pointer,Size,Stream\n1,2,allocate,0x10,5,0x0\n", EXPSEG_OK, ""},
      {"hello\n", EXPSEG_ERR_INVALID_ARGUMENT, "unknown trace format"},
      {"", EXPSEG_ERR_INVALID_ARGUMENT, "unknown trace format (0 bytes)"},
      {"\x80\x04.", EXPSEG_ERR_INVALID_ARGUMENT, "STOP with 0 values"},
      {"# memtrace v1\nq\n", EXPSEG_ERR_INVALID_ARGUMENT, ":2: unknown line kind"},
  };
  for (auto &c : cases) {
    SCOPED_TRACE(c.text);
    FILE *f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(c.text.data(), 1, c.text.size(), f);
    std::fclose(f);
    TraceSet s;
    EXPECT_EQ(expseg_trace_read_file(path.c_str(), &s.s), c.want);
    if (c.want == EXPSEG_OK) {
      ASSERT_EQ(s.s.n, 1u);
      EXPECT_EQ(s.s.traces[0].n_events, 1u);
    } else {
      std::string msg = expseg_trace_last_error();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.msg), std::string::npos) << msg;
    }
  }
  std::remove(path.c_str());
}

// A FIFO is refused at once (opening one for reading used to block until a writer came),
// with a message naming the path and what is accepted.
TEST(TraceReadFile, RefusesAFifoWithoutBlocking) {
  std::string path = trace_tmp_path("trace.fifo");
  std::remove(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0) << std::strerror(errno);
  std::string msg;
  auto done = std::async(std::launch::async, [&] {
    TraceSet s;
    expseg_status st = expseg_trace_read_file(path.c_str(), &s.s);
    msg = expseg_trace_last_error(); // the message is per thread
    return st;
  });
  bool prompt = done.wait_for(std::chrono::seconds(3)) == std::future_status::ready;
  if (!prompt) { // unblock the reader so the test ends: a writer opens and closes the FIFO
    int w = open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) close(w);
  }
  expseg_status st = done.get();
  EXPECT_TRUE(prompt) << "expseg_trace_read_file blocked on a FIFO";
  EXPECT_EQ(st, EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find(path + ": is a FIFO"), std::string::npos) << msg;
  EXPECT_NE(msg.find("regular file"), std::string::npos) << msg;
  std::remove(path.c_str());
}

// A 2 GiB file that is no trace is refused from its first bytes, without reading it whole
// (it used to be read into memory first: seconds and 2 GiB of memory).
TEST(TraceReadFile, RefusesAHugeNonTraceFromItsFirstBytes) {
  std::string path = trace_tmp_path("huge.bin");
  int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  const char garbage[] = "\x01\x02 not a trace at all";
  ASSERT_EQ(write(fd, garbage, sizeof garbage), (ssize_t)sizeof garbage);
  ASSERT_EQ(ftruncate(fd, off_t(2) << 30), 0) << std::strerror(errno); // sparse
  close(fd);
  struct rusage before {}, after {};
  getrusage(RUSAGE_SELF, &before);
  auto t0 = std::chrono::steady_clock::now();
  TraceSet s;
  EXPECT_EQ(expseg_trace_read_file(path.c_str(), &s.s), EXPSEG_ERR_INVALID_ARGUMENT);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string msg = expseg_trace_last_error();
  getrusage(RUSAGE_SELF, &after);
  std::remove(path.c_str());
  EXPECT_NE(msg.find("unknown trace format"), std::string::npos) << msg;
  EXPECT_NE(msg.find("memtrace v1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("RMM"), std::string::npos) << msg;
  EXPECT_NE(msg.find("pickle"), std::string::npos) << msg;
  EXPECT_LT(secs, 1.0) << "refusing took " << secs << " s";
  long grew_kb = after.ru_maxrss - before.ru_maxrss;
  EXPECT_LT(grew_kb, 100 * 1024) << "peak RSS grew by " << grew_kb << " KiB";
}

}  // namespace
