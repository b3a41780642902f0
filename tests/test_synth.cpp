// SPDX-License-Identifier: Apache-2.0
// test_synth.cpp: the synthetic workload generator (bench/replay/synth.c): deterministic per seed,
// well-formed traces (dense ids, each freed at most once, 'r' before 'f', pre-live first),
// figures that match a recount, the documented shapes, and clear errors for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "trace.h"
}

namespace {

const char *const kWorkloads[] = {"train", "infer", "streams8", "generate"};

struct Trace {
  expseg_trace_t t;
  Trace() { std::memset(&t, 0, sizeof t); }
  ~Trace() { expseg_trace_free(&t); }
};

// Replays the events and checks every rule of a well-formed trace; returns the peak of
// live requested bytes.
uint64_t Validate(const expseg_trace_t &t) {
  std::vector<int> state(t.n_ids, 0);  // 0 never, 1 live, 2 free requested, 3 freed
  std::vector<uint64_t> size(t.n_ids, 0);
  uint64_t next = 0, live = 0, peak = 0;
  uint32_t max_stream = 0;
  bool seen_non_prelive = false;
  for (size_t i = 0; i < t.n_events; i++) {
    const expseg_trace_event_t &e = t.events[i];
    if (e.stream > max_stream) max_stream = e.stream;
    switch (e.kind) {
      case EXPSEG_TR_PRELIVE:
      case EXPSEG_TR_ALLOC:
        if (e.kind == EXPSEG_TR_PRELIVE) EXPECT_FALSE(seen_non_prelive) << "event " << i;
        else seen_non_prelive = true;
        EXPECT_EQ(e.id, next) << "ids must be dense, event " << i;
        next = e.id + 1;
        if (e.id >= t.n_ids) {
          ADD_FAILURE() << "id " << e.id << " >= n_ids " << t.n_ids;
          return 0;
        }
        EXPECT_GT(e.size, 0u);
        state[e.id] = 1;
        size[e.id] = e.size;
        live += e.size;
        if (live > peak) peak = live;
        break;
      case EXPSEG_TR_FREE_REQ:
        seen_non_prelive = true;
        EXPECT_LT(e.id, t.n_ids);
        if (e.id >= t.n_ids) return 0;
        EXPECT_EQ(state[e.id], 1) << "'r' of an id that is not live, event " << i;
        EXPECT_EQ(e.size, size[e.id]);
        state[e.id] = 2;
        break;
      case EXPSEG_TR_FREE:
        seen_non_prelive = true;
        EXPECT_LT(e.id, t.n_ids);
        if (e.id >= t.n_ids) return 0;
        EXPECT_TRUE(state[e.id] == 1 || state[e.id] == 2) << "double or early free, event " << i;
        EXPECT_EQ(e.size, size[e.id]);
        state[e.id] = 3;
        live -= e.size;
        break;
      default:
        ADD_FAILURE() << "unexpected kind '" << (char)e.kind << "' at event " << i;
    }
  }
  EXPECT_EQ(next, t.n_ids);
  EXPECT_EQ(max_stream + 1, t.n_streams);
  return peak;
}

TEST(Synth, DeterministicPerSeed) {
  for (const char *w : kWorkloads) {
    Trace a, b, c;
    ASSERT_EQ(expseg_trace_synth(w, 42, 1.0, &a.t), EXPSEG_OK) << expseg_trace_last_error();
    ASSERT_EQ(expseg_trace_synth(w, 42, 1.0, &b.t), EXPSEG_OK) << expseg_trace_last_error();
    ASSERT_EQ(expseg_trace_synth(w, 43, 1.0, &c.t), EXPSEG_OK) << expseg_trace_last_error();
    ASSERT_EQ(a.t.n_events, b.t.n_events) << w;
    bool same = true;
    for (size_t i = 0; i < a.t.n_events && same; i++) {
      const expseg_trace_event_t &x = a.t.events[i], &y = b.t.events[i];
      same = x.kind == y.kind && x.stream == y.stream && x.id == y.id && x.size == y.size;
    }
    EXPECT_TRUE(same) << w << ": the same seed gave different traces";
    EXPECT_EQ(a.t.peak_live_requested, b.t.peak_live_requested);
    // another seed changes the sizes (sequence lengths, prompt lengths, micro-batches)
    bool differs = a.t.n_events != c.t.n_events || a.t.peak_live_requested != c.t.peak_live_requested;
    for (size_t i = 0; i < a.t.n_events && !differs; i++)
      differs = a.t.events[i].size != c.t.events[i].size;
    EXPECT_TRUE(differs) << w << ": seeds 42 and 43 gave the same trace";
  }
}

TEST(Synth, WellFormedAndFiguresMatchRecount) {
  for (const char *w : kWorkloads) {
    Trace t;
    ASSERT_EQ(expseg_trace_synth(w, 7, 1.0, &t.t), EXPSEG_OK) << expseg_trace_last_error();
    SCOPED_TRACE(w);
    EXPECT_EQ(std::string("synth-") + w, t.t.name);
    EXPECT_EQ(t.t.baseline.present, 0);
    EXPECT_EQ(t.t.device, 0);
    uint64_t peak = Validate(t.t);
    EXPECT_EQ(peak, t.t.peak_live_requested);
    // the documented shape at scale 1: 20k .. 80k events, peak 1 .. 3 GiB; generate (a
    // 7B-sized model's weights, a decode step per token): 100k .. 1M events, 8 .. 24 GiB
    const bool gen = std::strcmp(w, "generate") == 0;
    EXPECT_GE(t.t.n_events, gen ? 100000u : 20000u);
    EXPECT_LE(t.t.n_events, gen ? 1000000u : 80000u);
    EXPECT_GE(t.t.peak_live_requested, (gen ? 8ull : 1ull) << 30);
    EXPECT_LE(t.t.peak_live_requested, (gen ? 24ull : 3ull) << 30);
    size_t prelive = 0, freereq = 0;
    for (size_t i = 0; i < t.t.n_events; i++) {
      prelive += t.t.events[i].kind == EXPSEG_TR_PRELIVE;
      freereq += t.t.events[i].kind == EXPSEG_TR_FREE_REQ;
    }
    EXPECT_GT(prelive, 0u) << "weights are live before recording";
    if (std::strcmp(w, "streams8") == 0) {
      EXPECT_EQ(t.t.n_streams, 8u);
      EXPECT_GT(freereq, 0u) << "buffers crossing streams are freed with 'r' then 'f'";
    } else {
      EXPECT_EQ(t.t.n_streams, 1u);
      EXPECT_EQ(freereq, 0u);
    }
  }
}

TEST(Synth, TrainSequenceLengthChangesPerStep) {
  // The logits tensor (batch x seq x vocab x 4 bytes) is the largest per-step allocation;
  // its size must take several values over the steps.
  Trace t;
  ASSERT_EQ(expseg_trace_synth("train", 1, 1.0, &t.t), EXPSEG_OK);
  uint64_t max_prelive = 0;
  for (size_t i = 0; i < t.t.n_events; i++)
    if (t.t.events[i].kind == EXPSEG_TR_PRELIVE && t.t.events[i].size > max_prelive)
      max_prelive = t.t.events[i].size;
  std::vector<uint64_t> big;
  for (size_t i = 0; i < t.t.n_events; i++)
    if (t.t.events[i].kind == EXPSEG_TR_ALLOC && t.t.events[i].size > max_prelive)
      big.push_back(t.t.events[i].size);
  std::sort(big.begin(), big.end());
  big.erase(std::unique(big.begin(), big.end()), big.end());
  EXPECT_GE(big.size(), 5u) << "sequence length should change from step to step";
}

TEST(Synth, ScaleMultipliesSizesNotEvents) {
  Trace one, half;
  ASSERT_EQ(expseg_trace_synth("infer", 3, 1.0, &one.t), EXPSEG_OK);
  ASSERT_EQ(expseg_trace_synth("infer", 3, 0.5, &half.t), EXPSEG_OK);
  EXPECT_EQ(one.t.n_events, half.t.n_events);
  double r = (double)half.t.peak_live_requested / (double)one.t.peak_live_requested;
  EXPECT_NEAR(r, 0.5, 0.01);
  EXPECT_EQ(Validate(half.t), half.t.peak_live_requested);
}

TEST(Synth, AcceptedByTheMemtraceReader) {
  // Written as memtrace v1 and read back, the reader's own checker accepts every event and
  // computes the same peak.
  Trace t;
  ASSERT_EQ(expseg_trace_synth("streams8", 5, 0.25, &t.t), EXPSEG_OK);
  std::string text = "# memtrace v1\n";
  for (size_t i = 0; i < t.t.n_events; i++) {
    const expseg_trace_event_t &e = t.t.events[i];
    text += (char)e.kind;
    text += " " + std::to_string(e.stream) + " " + std::to_string(e.id) + " " +
            std::to_string(e.size) + "\n";
  }
  expseg_trace_set_t set;
  ASSERT_EQ(expseg_trace_read_memtrace("synth.memtrace", text.data(), text.size(), &set),
            EXPSEG_OK)
      << expseg_trace_last_error();
  ASSERT_EQ(set.n, 1u);
  EXPECT_EQ(set.traces[0].n_events, t.t.n_events);
  EXPECT_EQ(set.traces[0].n_ids, t.t.n_ids);
  EXPECT_EQ(set.traces[0].n_streams, t.t.n_streams);
  EXPECT_EQ(set.traces[0].peak_live_requested, t.t.peak_live_requested);
  expseg_trace_set_free(&set);
}

TEST(Synth, UnknownWorkloadAndBadScale) {
  expseg_trace_t t;
  EXPECT_EQ(expseg_trace_synth("training", 1, 1.0, &t), EXPSEG_ERR_INVALID_ARGUMENT);
  std::string msg = expseg_trace_last_error();
  EXPECT_NE(msg.find("'training'"), std::string::npos) << msg;
  for (const char *w : kWorkloads) EXPECT_NE(msg.find(w), std::string::npos) << msg;
  EXPECT_EQ(t.events, nullptr);
  EXPECT_EQ(t.n_events, 0u);

  EXPECT_EQ(expseg_trace_synth(nullptr, 1, 1.0, &t), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_trace_synth("train", 1, 1.0, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  for (double bad : {0.0, -1.0, (double)NAN, (double)INFINITY}) {
    EXPECT_EQ(expseg_trace_synth("train", 1, bad, &t), EXPSEG_ERR_INVALID_ARGUMENT) << bad;
    EXPECT_NE(std::string(expseg_trace_last_error()).find("scale"), std::string::npos);
    EXPECT_EQ(t.events, nullptr);
  }
}

}  // namespace
