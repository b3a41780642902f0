/* SPDX-License-Identifier: Apache-2.0 */
/* trace_support.h: C++ helpers for the trace reader tests (tests/test_trace_*.cpp): an owning
 * trace set, a per-process temporary path, a trace's events against the expected list, and
 * the comparison of two traces event by event (what a write and a read back must keep). Header-only; the including test links
 * expseg_traces (bench/replay/). */
#ifndef EXPSEG_TRACE_SUPPORT_H
#define EXPSEG_TRACE_SUPPORT_H

#include <gtest/gtest.h>

#include <unistd.h>

#include <string>

extern "C" {
#include "trace.h"
}

/* A trace set freed at the end of its scope. */
struct TraceSet {
  expseg_trace_set_t s{nullptr, 0};
  TraceSet() = default;
  TraceSet(const TraceSet &) = delete;
  TraceSet &operator=(const TraceSet &) = delete;
  ~TraceSet() { expseg_trace_set_free(&s); }
};

/* TempDir()/STEM_PID: a path no other test process uses. */
inline std::string trace_tmp_path(const char *stem) {
  return std::string(::testing::TempDir()) + "/" + stem + "_" + std::to_string(getpid());
}

/* One event a reader must give: kind, stream index, id, size, extra. */
struct WantEvent {
  char kind;
  uint32_t stream;
  uint64_t id, size, extra;
};

/* t holds exactly the events of want, in that order. */
template <size_t N>
inline void expect_events(const expseg_trace_t &t, const WantEvent (&want)[N]) {
  ASSERT_EQ(t.n_events, N);
  for (size_t i = 0; i < N; i++) {
    SCOPED_TRACE(i);
    EXPECT_EQ(t.events[i].kind, (uint8_t)want[i].kind);
    EXPECT_EQ(t.events[i].stream, want[i].stream);
    EXPECT_EQ(t.events[i].id, want[i].id);
    EXPECT_EQ(t.events[i].size, want[i].size);
    EXPECT_EQ(t.events[i].extra, want[i].extra);
  }
}

/* Every event (kind, stream, id, size, extra; the first five that differ are named), the
 * counts, the peak, the device and, where either has one, every baseline figure of a equal
 * those of b. The names are left to the caller (a file written and read back is named after
 * its path). */
inline void expect_same_trace(const expseg_trace_t &a, const expseg_trace_t &b) {
  EXPECT_EQ(a.device, b.device);
  ASSERT_EQ(a.n_events, b.n_events);
  size_t bad = 0;
  for (size_t i = 0; i < a.n_events && bad < 5; i++) {
    const expseg_trace_event_t &x = a.events[i], &y = b.events[i];
    if (x.kind != y.kind || x.stream != y.stream || x.id != y.id || x.size != y.size ||
        x.extra != y.extra) {
      ADD_FAILURE() << "event " << i << ": got " << (char)x.kind << " " << x.stream << " " << x.id
                    << " " << x.size << " " << x.extra << ", want " << (char)y.kind << " "
                    << y.stream << " " << y.id << " " << y.size << " " << y.extra;
      bad++;
    }
  }
  EXPECT_EQ(a.n_ids, b.n_ids);
  EXPECT_EQ(a.n_streams, b.n_streams);
  EXPECT_EQ(a.peak_live_requested, b.peak_live_requested);
  const expseg_trace_baseline_t &x = a.baseline, &y = b.baseline;
  EXPECT_EQ(x.present, y.present);
  // Without recorded figures a trace still counts the recorded allocator's OOMs (its 'O'
  // events: an RMM log's "allocate failure" lines).
  EXPECT_EQ(x.oom, y.oom);
  if (!x.present && !y.present) return; // no other recorded figures
  EXPECT_EQ(x.start_reserved, y.start_reserved);
  EXPECT_EQ(x.peak_reserved, y.peak_reserved);
  EXPECT_EQ(x.end_reserved, y.end_reserved);
  EXPECT_EQ(x.segment_alloc, y.segment_alloc);
  EXPECT_EQ(x.segment_free, y.segment_free);
  EXPECT_EQ(x.map, y.map);
  EXPECT_EQ(x.unmap, y.unmap);
}

#endif
