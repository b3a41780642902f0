// SPDX-License-Identifier: Apache-2.0
// test_alloc_sleep_cycles.cpp: sleep and wake (pools/sleep.c) over several cycles and against
// the driver: the exact size of the host copies and what sim makes of them (none), the wait
// for the region's streams, a captured-graph-style run (the addresses and layout recorded
// before a sleep are those after each wake, with the bytes last written), and on `cuda`
// (test_gpu_sleep_cycles.cpp, read from the CUDA driver double's call log) the queued copies
// and their overlap with the wake's maps. The fixture: test_alloc_sleep_common.h.
#include "test_alloc_sleep_common.h"

namespace {

// An offload's host copies are one per segment, of exactly the segment's live bytes rounded
// up to the OS page. On sim (no bytes) none is allocated and nothing is copied, but they are
// counted the same: host_bytes asleep, host_kept_bytes and expseg.sleep_host_kept_bytes
// awake show what a driver with bytes would hold.
TEST_P(Sleep, OffloadHostCopiesAreExactAndSimMakesNone) {
  if (a_ == nullptr) return;
  fill_region();
  const uint64_t h0 = seen(a_, EXPSEG_VMM_CALL_host_alloc), f0 = seen(a_, EXPSEG_VMM_CALL_host_free),
                 c0 = seen(a_, EXPSEG_VMM_CALL_copy);
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  struct Want {
    expseg_pool_id pool;
    uint64_t page, host, segs;
  } want{info("w").pool, (uint64_t)sysconf(_SC_PAGESIZE), 0, 0};
  ASSERT_EQ(expseg_walk(a_,
                        [](void *ctx, const expseg_walk_segment *sg) {
                          Want *w = (Want *)ctx;
                          if (sg->pool != w->pool || sg->active_size == 0) return;
                          w->host += (sg->active_size + w->page - 1) / w->page * w->page;
                          w->segs++;
                        },
                        nullptr, &want),
            EXPSEG_OK);
  ASSERT_GT(want.segs, 1u);
  EXPECT_EQ(info("w").host_bytes, want.host);
  if (bytes()) {
    EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_host_alloc) - h0, want.segs);
    EXPECT_GT(seen(a_, EXPSEG_VMM_CALL_copy), c0);
  } else {
    EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_host_alloc), h0) << "sim allocated host copies";
    EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_copy), c0) << "sim tried to copy";
  }
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(info("w").host_kept_bytes, want.host);
  EXPECT_EQ(stat_of(a_, "expseg.sleep_host_kept_bytes.current"), (int64_t)want.host);
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(info("w").host_bytes, want.host); // the kept ones, reused
  EXPECT_EQ(info("w").host_kept_bytes, 0u);
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_empty_cache(a_), EXPSEG_OK);
  EXPECT_EQ(info("w").host_kept_bytes, 0u);
  EXPECT_EQ(stat_of(a_, "expseg.sleep_host_kept_bytes.current"), 0);
  EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_host_free) - f0, bytes() ? want.segs : 0u);
  EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_host_alloc) - h0, bytes() ? want.segs : 0u);
  expect_data("after two offloads");
  check("end");
}

// Work on the region's streams completes before its memory goes: while the work of a stream
// one of its blocks was recorded on, or of the stream of one of its segments, cannot
// complete, the sleep fails and the region stays awake with its bytes.
TEST_P(Sleep, SleepWaitsForTheWorkOfTheRegionsStreams) {
  if (a_ == nullptr) return;
  if (driver() == "cuda") GTEST_SKIP() << "a held stream on cuda is waited for, not refused";
  fill_region();
  ASSERT_EQ(expseg_record_stream(a_, live_[0].p, 9), EXPSEG_OK) << expseg_last_error();
  for (expseg_stream held : {expseg_stream{9}, other_}) {
    SCOPED_TRACE("stream " + std::to_string(held) + " held");
    ASSERT_EQ(expseg_testing_hold_stream(a_, held, true), EXPSEG_OK) << expseg_last_error();
    EXPECT_NE(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK);
    EXPECT_NE(std::string(expseg_last_error()).find("the region is awake, nothing changed"),
              std::string::npos)
        << expseg_last_error();
    ASSERT_EQ(expseg_testing_hold_stream(a_, held, false), EXPSEG_OK) << expseg_last_error();
    EXPECT_FALSE(info("w").asleep);
    EXPECT_EQ(info("w").sleeps, 0u);
    check("after a sleep refused by unfinished work");
  }
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  expect_data("after wake");
  check("end");
}

// A captured CUDA graph holds raw addresses. Record every block's address and the layout of
// the region's segments and blocks, then sleep and wake three times (fresh host copies, the
// kept ones, fresh again after empty_cache); after each wake "replay the graph": read the
// bytes at the recorded addresses, then write new ones there, as a graph's kernels would. The
// layout is the same asleep and awake, each wake brings back the bytes last written (not
// those of an earlier cycle), and the copies go in pieces of at most 64 MiB.
TEST_P(Sleep, CapturedGraphStyleAddressesAndBytesSurviveCycles) {
  if (a_ == nullptr) return;
  fill_region();
  using Row = std::tuple<uint64_t, uint64_t, uint64_t, uint64_t, int>;
  struct Layout {
    expseg_pool_id pool;
    std::vector<Row> rows; // segment address and size, block address, size and state
    size_t asleep = 0, awake = 0;
  };
  const expseg_pool_id pool = info("w").pool;
  auto layout = [&] {
    Layout l{pool, {}, 0, 0};
    EXPECT_EQ(expseg_walk(a_,
                          [](void *ctx, const expseg_walk_segment *sg) {
                            Layout *v = (Layout *)ctx;
                            if (sg->pool != v->pool) return;
                            (sg->asleep ? v->asleep : v->awake)++;
                            for (size_t i = 0; i < sg->n_blocks; i++)
                              v->rows.emplace_back(sg->address, sg->total_size,
                                                   sg->blocks[i].address, sg->blocks[i].size,
                                                   (int)sg->blocks[i].state);
                          },
                          nullptr, &l),
              EXPSEG_OK);
    return l;
  };
  // the free memory a sleep gives back first: gone before the layout is recorded
  ASSERT_EQ(expseg_empty_cache(a_), EXPSEG_OK);
  const Layout recorded = layout();
  ASSERT_GT(recorded.awake, 1u);
  std::vector<std::pair<uintptr_t, size_t>> graph; // what the "graph" captured
  uint64_t pieces = 0;
  for (const Live &l : live_) {
    graph.emplace_back((uintptr_t)l.p, l.size);
    pieces += (l.size + 64 * MiB - 1) / (64 * MiB);
  }
  ASSERT_GT(pieces, live_.size()) << "expected a block of more than 64 MiB";
  for (int cycle = 0; cycle < 3; cycle++) {
    SCOPED_TRACE("cycle " + std::to_string(cycle));
    if (cycle == 2) { // fresh host copies
      ASSERT_EQ(expseg_empty_cache(a_), EXPSEG_OK);
    }
    const uint64_t c0 = seen(a_, EXPSEG_VMM_CALL_copy);
    ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
    const uint64_t c1 = seen(a_, EXPSEG_VMM_CALL_copy);
    const Layout asleep = layout();
    EXPECT_EQ(asleep.rows, recorded.rows);
    EXPECT_EQ(asleep.asleep, recorded.awake);
    EXPECT_EQ(asleep.awake, 0u);
    ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
    const Layout awake = layout();
    EXPECT_EQ(awake.rows, recorded.rows);
    EXPECT_EQ(awake.awake, recorded.awake);
    EXPECT_EQ(awake.asleep, 0u);
    if (bytes()) {
      EXPECT_EQ(c1 - c0, pieces) << "copies out";
      EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_copy) - c1, pieces) << "copies back";
    }
    for (size_t i = 0; i < graph.size() && bytes(); i++) { // the replay, at the recorded addresses
      Live &l = live_[i];
      EXPECT_TRUE(get((void *)graph[i].first, graph[i].second) == l.data)
          << "bytes at recorded address " << (void *)graph[i].first;
      for (size_t k = 0; k < l.data.size(); k += 4096) l.data[k] ^= (unsigned char)(cycle + 1);
      put((void *)graph[i].first, l.data);
    }
    check("after the replay");
  }
}

#ifdef EXPSEG_SLEEP_GPU
// The double's log of driver calls, as it stands.
std::vector<cudadouble_call> double_log(cudadouble_api &api) {
  std::vector<cudadouble_call> v(api.log_count());
  for (size_t i = 0; i < v.size(); i++) EXPECT_EQ(0, api.log_get(i, &v[i]));
  return v;
}

// When the synchronize of the copy stream fails, the device is synchronized before the sleep
// or wake undoes anything: no queued copy is left to land in memory given back (a real
// cuMemUnmap does not wait for it). The error is the first failure's; the region is left
// awake (a failed sleep) or asleep (a failed wake), its bytes whole. Read from the double's
// call log.
TEST_P(Sleep, FailedCopySynchronizeIsFollowedByADeviceSynchronize) {
  if (a_ == nullptr) return;
  EXPSEG_SLEEP_NEEDS_DOUBLE("reads the double's call log");
  cudadouble_api api;
  ASSERT_TRUE(cudadouble_load(&api));
  fill_region();
  // the position of the copy stream's synchronize: the last one of a clean sleep or wake
  const uint64_t s0 = seen(a_, EXPSEG_VMM_CALL_stream_synchronize);
  ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
  const uint64_t s1 = seen(a_, EXPSEG_VMM_CALL_stream_synchronize);
  ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
  const uint64_t per[2] = {s1 - s0, seen(a_, EXPSEG_VMM_CALL_stream_synchronize) - s1};
  ASSERT_GE(per[0], 1u);
  ASSERT_GE(per[1], 1u);
  for (int dir = 0; dir < 2; dir++) {
    for (const char *how : {"", ".."}) { // that synchronize alone, or every one from it on
      SCOPED_TRACE(std::string(dir == 0 ? "sleep" : "wake") + how);
      if (dir == 1) {
        ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
      }
      const std::string rule = "stream_synchronize@" + std::to_string(per[dir]) + how;
      const uint64_t d0 = seen(a_, EXPSEG_VMM_CALL_device_synchronize);
      api.log_clear();
      ASSERT_EQ(expseg_testing_set_faults(a_, rule.c_str()), EXPSEG_OK) << expseg_last_error();
      const expseg_status s =
          dir == 0 ? expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD) : expseg_wake(a_, "w");
      const std::string msg = expseg_last_error();
      ASSERT_EQ(expseg_testing_set_faults(a_, ""), EXPSEG_OK);
      EXPECT_NE(s, EXPSEG_OK) << "the copies' synchronize failed";
      EXPECT_NE(msg.find("stream_synchronize"), std::string::npos) << "the first failure: " << msg;
      EXPECT_EQ(seen(a_, EXPSEG_VMM_CALL_device_synchronize), d0 + 1);
      EXPECT_EQ(info("w").asleep, dir == 1) << "a failed sleep leaves it awake, a failed wake asleep";
      const std::vector<cudadouble_call> log = double_log(api);
      size_t ctx_sync = SIZE_MAX, last_async = 0;
      for (size_t i = 0; i < log.size(); i++) {
        const std::string n = log[i].name;
        if (n == "cuMemcpyDtoHAsync" || n == "cuMemcpyHtoDAsync") last_async = i;
        if (n.rfind("cuCtxSynchronize", 0) == 0 && log[i].result == 0 && ctx_sync == SIZE_MAX)
          ctx_sync = i;
        if (i > last_async && (n == "cuMemUnmap" || n == "cuMemRelease" || n == "cuMemHostUnregister")) {
          EXPECT_LT(ctx_sync, i) << n << " after the copies, before the device was synchronized";
        }
        if (n == "cuMemUnmap" || n == "cuMemHostUnregister") {
          EXPECT_EQ(log[i].result, 0) << n << " refused: copies in flight";
        }
      }
      EXPECT_NE(ctx_sync, SIZE_MAX) << "the device was synchronized";
      check("after the failure");
      for (int i = 0; i < 2 && info("w").asleep; i++) ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK);
      EXPECT_FALSE(info("w").asleep);
      expect_data("after the failure");
    }
  }
  check("end");
}

// On cuda the copies are queued on the allocator's stream (cuMemcpyDtoHAsync / HtoDAsync, one
// per piece of at most 64 MiB) and the stream synchronized once per sleep and once per wake:
// a sleep before its first unmap (nothing in flight is unmapped), a wake after its last map,
// each segment's copies queued as soon as it is mapped, so they are in flight while the next
// segments are created and mapped. Read from the CUDA driver double's call log.
TEST_P(Sleep, CudaCopiesAreQueuedAndOverlapTheWakesMaps) {
  if (a_ == nullptr) return;
  EXPSEG_SLEEP_NEEDS_DOUBLE("reads the double's call log");
  cudadouble_api api;
  ASSERT_TRUE(cudadouble_load(&api));
  fill_region();
  uint64_t pieces = 0;
  for (const Live &l : live_) pieces += (l.size + 64 * MiB - 1) / (64 * MiB);
  auto named = [](const cudadouble_call &c, const char *n) { return c.result == 0 && std::string(c.name) == n; };
  for (int dir = 0; dir < 2; dir++) {
    SCOPED_TRACE(dir == 0 ? "sleep" : "wake");
    api.log_clear();
    if (dir == 0) {
      ASSERT_EQ(expseg_sleep(a_, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << expseg_last_error();
    } else {
      ASSERT_EQ(expseg_wake(a_, "w"), EXPSEG_OK) << expseg_last_error();
    }
    const std::vector<cudadouble_call> log = double_log(api);
    const char *async = dir == 0 ? "cuMemcpyDtoHAsync" : "cuMemcpyHtoDAsync";
    size_t n_async = 0, n_sync_copies = 0, first_async = SIZE_MAX, last_async = 0, last_sync = 0,
           first_unmap = SIZE_MAX, last_map = 0, maps_in_flight = 0;
    for (size_t i = 0; i < log.size(); i++) {
      const cudadouble_call &c = log[i];
      if (named(c, async)) n_async++, first_async = std::min(first_async, i), last_async = i;
      if (named(c, "cuMemcpyDtoH") || named(c, "cuMemcpyHtoD")) n_sync_copies++;
      if (named(c, "cuStreamSynchronize")) last_sync = i;
      if (named(c, "cuMemUnmap")) first_unmap = std::min(first_unmap, i);
      if (named(c, "cuMemMap")) last_map = i, maps_in_flight += c.busy_streams > 0;
    }
    EXPECT_EQ(n_async, pieces);
    EXPECT_EQ(n_sync_copies, 0u);
    ASSERT_NE(first_async, SIZE_MAX);
    EXPECT_GT(last_sync, last_async) << "the copy stream is synchronized after the last copy";
    if (dir == 0) {
      EXPECT_LT(last_sync, first_unmap) << "synchronized before anything is unmapped";
      EXPECT_EQ(log[first_unmap].busy_streams, 0) << "unmapped with copies in flight";
    } else {
      EXPECT_LT(first_async, last_map) << "the first segment's copies wait for the last map";
      EXPECT_GT(maps_in_flight, 0u) << "no map ran while copies were in flight";
      EXPECT_GT(last_sync, last_map);
    }
  }
  expect_data("after wake");
  check("end");
}
#endif

EXPSEG_SLEEP_INSTANTIATE();

} // namespace
