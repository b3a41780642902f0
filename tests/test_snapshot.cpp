// SPDX-License-Identifier: Apache-2.0
// test_snapshot.cpp: history recording and snapshots. Every snapshot written here is loaded
// by Python's standard pickle in tests/check_snapshot.py (opcodes the viewer accepts,
// structure field by field, sums against expseg's statistics, the history against the
// operations made, and, for histories recorded from creation, the viewer's backward replay
// to an empty state). The randomized workload is seeded (EXPSEG_TEST_SEED, default 1) and
// prints its seed.
#include <gtest/gtest.h>

#include "alloc_support.h"
#include "expseg.h"
#include "snapshot_check.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <random>
#include <string>
#include <vector>

namespace {

#define REQUIRE_PYTHON() \
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 is not on PATH: the snapshot checker needs it"

std::string tmp_dir() {
  static std::string dir;
  if (dir.empty()) {
    char t[] = "/tmp/expseg_snapshot_XXXXXX";
    EXPECT_NE(mkdtemp(t), nullptr);
    dir = t;
  }
  return dir;
}

int check(const std::string &path, const std::string &expect_json, bool from_creation,
          std::string *out) {
  return snapshot_check(path, expect_json, from_creation, out);
}

int64_t stat(expseg_allocator *a, const char *key) {
  int64_t v = -1;
  EXPECT_EQ(expseg_stat(a, key, &v), EXPSEG_OK) << key;
  return v;
}

struct Ev {
  std::string action;
  uint64_t addr, size, stream;
};

std::string events_json(const std::vector<Ev> &ev) {
  std::string s = "[";
  for (size_t i = 0; i < ev.size(); i++) {
    char b[256];
    snprintf(b, sizeof b, "%s[\"%s\", %" PRIu64 ", %" PRIu64 ", %" PRIu64 "]", i ? ", " : "",
             ev[i].action.c_str(), ev[i].addr, ev[i].size, ev[i].stream);
    s += b;
  }
  return s + "]";
}

// The statistics a snapshot's segments must add up to.
std::string stats_json(expseg_allocator *a) {
  char b[512];
  snprintf(b, sizeof b,
           "{\"allocated\": %" PRId64 ", \"active\": %" PRId64 ", \"requested\": %" PRId64
           ", \"mapped\": %" PRId64 ", \"pending_blocks\": %" PRId64
           ", \"allocated_blocks\": %" PRId64 "}",
           stat(a, "allocated_bytes.all.current"), stat(a, "active_bytes.all.current"),
           stat(a, "requested_bytes.all.current"),
           stat(a, "reserved_bytes.all.current") - stat(a, "expseg.cached_physical_bytes.current"),
           stat(a, "expseg.pending_free_blocks.current"), stat(a, "allocation.all.current"));
  return b;
}

// Driver-side events must count as PyTorch's: one segment_alloc/map per device
// allocation, one segment_free/unmap per device free, one oom per OOM.
std::string counts_json(expseg_allocator *a) {
  char b[256];
  snprintf(b, sizeof b,
           "{\"segment_alloc+segment_map\": %" PRId64 ", \"segment_free+segment_unmap\": %" PRId64
           ", \"oom\": %" PRId64 "}",
           stat(a, "num_device_alloc"), stat(a, "num_device_free"), stat(a, "num_ooms"));
  return b;
}

std::string dump(expseg_allocator *a, const char *name) {
  std::string path = tmp_dir() + "/" + name;
  EXPECT_EQ(expseg_snapshot_dump(a, path.c_str()), EXPSEG_OK) << expseg_last_error();
  return path;
}

const std::vector<std::string> kAllocFree = {"alloc", "free_requested", "free_completed",
                                             "oom", "snapshot"};

std::string only_json() {
  std::string s = "[";
  for (size_t i = 0; i < kAllocFree.size(); i++) s += (i ? ", \"" : "\"") + kAllocFree[i] + "\"";
  return s + "]";
}

TEST(Snapshot, ClassicStateAndHistoryMatchTheOperations) {
  REQUIRE_PYTHON();
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim:capacity=8G", 0, "expandable_segments:False", &a), EXPSEG_OK);
  ASSERT_EQ(expseg_record_history_ex(a, true, SIZE_MAX, 0), EXPSEG_OK);
  void *p1, *p2, *p3;
  ASSERT_EQ(expseg_malloc(a, 1000, 0, &p1), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 5 << 20, 0, &p2), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 30 << 20, 7, &p3), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p1), EXPSEG_OK);
  ASSERT_EQ(alloc_test_hold(a, 9, true), EXPSEG_OK); // p2's use on stream 9 stays incomplete
  ASSERT_EQ(expseg_record_stream(a, p2, 9), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p2), EXPSEG_OK);
  ASSERT_EQ(stat(a, "expseg.pending_free_blocks.current"), 1);
  int64_t active = stat(a, "active_bytes.all.current");
  std::vector<Ev> ev = {{"alloc", (uintptr_t)p1, 1000, 0},
                        {"alloc", (uintptr_t)p2, 5 << 20, 0},
                        {"alloc", (uintptr_t)p3, 30 << 20, 7},
                        {"free_requested", (uintptr_t)p1, 1000, 0},
                        {"free_completed", (uintptr_t)p1, 1000, 0},
                        {"free_requested", (uintptr_t)p2, 5 << 20, 0},
                        {"snapshot", 0, (uint64_t)active, 0}};
  std::string stats = stats_json(a), counts = counts_json(a);
  std::string path = dump(a, "classic.pickle");
  std::string expect = "{\"stats\": " + stats + ", \"counts\": " + counts + ", \"only\": " +
                       only_json() + ", \"events\": " + events_json(ev) +
                       ", \"settings\": {\"expandable_segments\": false, \"expseg.chunk_max\": -1}}";
  std::string out;
  EXPECT_EQ(check(path, expect, true, &out), 0) << out;
  ASSERT_EQ(alloc_test_hold(a, 9, false), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p3), EXPSEG_OK);
  expseg_destroy(a);
}

// Page moves (idle pages of another stream unmapped and mapped here), page-cache re-maps,
// empty_cache, an OOM, then a seeded random workload over three streams: the history,
// replayed backwards from the end state as the viewer does, must reach an empty state.
TEST(Snapshot, ExpandableHistoryReplaysBackwardsToEmpty) {
  REQUIRE_PYTHON();
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim:capacity=256M", 0, "expandable_segments:True", &a), EXPSEG_OK);
  ASSERT_EQ(expseg_record_history(a, true, SIZE_MAX), EXPSEG_OK);
  void *x, *y, *keep, *l;
  ASSERT_EQ(expseg_malloc(a, 64 << 20, 1, &x), EXPSEG_OK);
  // 16 MiB: the large pool's minimum growth, so no surplus block after keep
  ASSERT_EQ(expseg_malloc(a, 16 << 20, 1, &keep), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 66 << 20, 2, &y), EXPSEG_OK); // takes stream 1's idle pages
  EXPECT_GT(stat(a, "expseg.pages_moved"), 0);
  EXPECT_GT(stat(a, "expseg.page_cache_hits"), 0);
  ASSERT_EQ(expseg_free(a, y), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 4 << 20, 3, &l), EXPSEG_OK); // lent by stream 2
  EXPECT_EQ(stat(a, "expseg.num_lent"), 1);
  ASSERT_EQ(expseg_free(a, l), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, keep), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  void *big = nullptr;
  ASSERT_EQ(expseg_malloc(a, (size_t)1 << 30, 0, &big), EXPSEG_ERR_OUT_OF_MEMORY);
  EXPSEG_SEEDED(seed, 1);
  std::mt19937_64 rng(seed);
  std::vector<void *> live;
  for (int i = 0; i < 400; i++) {
    uint64_t r = rng();
    if (live.empty() || r % 5 < 3) {
      size_t size = r % 3 == 0 ? 1 + (r >> 8) % (1 << 20) : 1 + (r >> 8) % (24 << 20);
      void *p = nullptr;
      expseg_status st = expseg_malloc(a, size, (r >> 40) % 3, &p);
      ASSERT_TRUE(st == EXPSEG_OK || st == EXPSEG_ERR_OUT_OF_MEMORY) << expseg_last_error();
      if (p) live.push_back(p);
    } else if (r % 41 == 0) {
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    } else {
      size_t k = (r >> 16) % live.size();
      ASSERT_EQ(expseg_free(a, live[k]), EXPSEG_OK);
      live[k] = live.back();
      live.pop_back();
    }
  }
  ASSERT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  EXPECT_GE(stat(a, "num_ooms"), 1);
  std::string expect = "{\"stats\": " + stats_json(a) + ", \"counts\": " + counts_json(a) + "}";
  std::string path = dump(a, "expandable.pickle");
  std::string out;
  EXPECT_EQ(check(path, expect, true, &out), 0) << out;
  // chunk_max_mb in force: its bytes; off: -1 (the classic case above)
  ASSERT_EQ(expseg_configure(a, "expandable_segments:True,chunk_max_mb:8"), EXPSEG_OK);
  path = dump(a, "chunk_max.pickle");
  EXPECT_EQ(check(path, "{\"settings\": {\"expseg.chunk_max\": 8388608}}", true, &out), 0) << out;
  for (void *p : live) ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  expseg_destroy(a);
}

TEST(Snapshot, RingKeepsTheNewestEvents) {
  REQUIRE_PYTHON();
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim:capacity=8G", 0, "expandable_segments:False", &a), EXPSEG_OK);
  void *p;
  ASSERT_EQ(expseg_malloc(a, 4 << 20, 0, &p), EXPSEG_OK); // a cached segment: hits from now
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_record_history_ex(a, true, 10, 0), EXPSEG_OK);
  std::vector<Ev> all;
  for (uint64_t i = 0; i < 20; i++) {
    uint64_t size = (4 << 20) - 4096 * i;
    ASSERT_EQ(expseg_malloc(a, size, 0, &p), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
    all.push_back({"alloc", (uintptr_t)p, size, 0});
    all.push_back({"free_requested", (uintptr_t)p, size, 0});
    all.push_back({"free_completed", (uintptr_t)p, size, 0});
  }
  all.push_back({"snapshot", 0, 0, 0});
  std::vector<Ev> tail(all.end() - 10, all.end());
  std::string path = dump(a, "ring.pickle");
  std::string expect = "{\"tail\": true, \"events\": " + events_json(tail) +
                       ", \"settings\": {\"expseg.history_recorded\": 61, "
                       "\"expseg.history_max_entries\": 10}}";
  std::string out;
  EXPECT_EQ(check(path, expect, false, &out), 0) << out;
  // re-enabled with a larger bound: the events kept so far stay
  ASSERT_EQ(expseg_record_history_ex(a, true, 100, 0), EXPSEG_OK);
  path = dump(a, "ring2.pickle");
  tail.push_back({"snapshot", 0, 0, 0});
  expect = "{\"tail\": true, \"events\": " + events_json(tail) + "}";
  EXPECT_EQ(check(path, expect, false, &out), 0) << out;
  // disabling clears the history
  ASSERT_EQ(expseg_record_history(a, false, 0), EXPSEG_OK);
  path = dump(a, "ring3.pickle");
  EXPECT_EQ(check(path, "{\"tail\": true, \"events\": []}", false, &out), 0) << out;
  expseg_destroy(a);
}

TEST(Snapshot, PushedFramesAndCStacks) {
  REQUIRE_PYTHON();
  for (unsigned flags : {0u, EXPSEG_HISTORY_C_STACKS}) {
    expseg_allocator *a = nullptr;
    ASSERT_EQ(expseg_create("sim:capacity=8G", 0, "", &a), EXPSEG_OK);
    ASSERT_EQ(expseg_record_history_ex(a, true, 1000, flags), EXPSEG_OK);
    expseg_frame fr[2] = {{"train.py", "main", 10}, {"model.py", "forward", 42}};
    ASSERT_EQ(expseg_history_push_frames(fr, 2), EXPSEG_OK);
    void *p, *q;
    ASSERT_EQ(expseg_malloc(a, 1 << 20, 0, &p), EXPSEG_OK);
    expseg_history_pop_frames(1);
    ASSERT_EQ(expseg_malloc(a, 2 << 20, 0, &q), EXPSEG_OK);
    expseg_history_pop_frames(5); // more than pushed: empty
    ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
    std::string path = dump(a, flags ? "frames_c.pickle" : "frames.pickle");
    std::string expect =
        std::string("{\"only\": [\"alloc\", \"free_requested\"], \"c_stacks\": ") +
        (flags ? "true" : "false") +
        ", \"events\": " +
        events_json({{"alloc", (uintptr_t)p, 1 << 20, 0},
                     {"alloc", (uintptr_t)q, 2 << 20, 0},
                     {"free_requested", (uintptr_t)p, 1 << 20, 0}}) +
        ", \"host_frames\": [[[\"model.py\", \"forward\", 42], [\"train.py\", \"main\", 10]],"
        " [[\"train.py\", \"main\", 10]], []]}";
    std::string out;
    EXPECT_EQ(check(path, expect, true, &out), 0) << "flags " << flags << ": " << out;
    ASSERT_EQ(expseg_free(a, q), EXPSEG_OK);
    expseg_destroy(a);
  }
}

TEST(Snapshot, InMemoryFormIsAProtocol4Pickle) {
  REQUIRE_PYTHON();
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim:capacity=8G", 3, "", &a), EXPSEG_OK);
  void *p;
  ASSERT_EQ(expseg_malloc(a, 12345, 5, &p), EXPSEG_OK); // live before recording: no frames
  ASSERT_EQ(expseg_record_history(a, true, 100), EXPSEG_OK);
  unsigned char *buf = nullptr;
  size_t len = 0;
  ASSERT_EQ(expseg_snapshot(a, &buf, &len), EXPSEG_OK);
  ASSERT_GT(len, 3u);
  EXPECT_EQ(buf[0], 0x80);
  EXPECT_EQ(buf[1], 4);
  EXPECT_EQ(buf[len - 1], '.');
  std::string path = tmp_dir() + "/mem.pickle";
  FILE *f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(fwrite(buf, 1, len, f), len);
  fclose(f);
  expseg_snapshot_free(buf);
  std::string out; // device 3: device_traces holds four lists, the history in the last
  EXPECT_EQ(check(path, "{\"device\": 3, \"stats\": " + stats_json(a) + "}", false, &out), 0) << out;
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  expseg_destroy(a);
}

TEST(Snapshot, BadArgumentsAreRefusedAndNothingIsLeftHalfWritten) {
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim:capacity=8G", 0, "", &a), EXPSEG_OK);
  EXPECT_EQ(expseg_record_history(a, true, 0), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(strstr(expseg_last_error(), "max_entries is 0"), nullptr) << expseg_last_error();
  EXPECT_EQ(expseg_record_history_ex(a, true, 10, 6), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(strstr(expseg_last_error(), "0x6"), nullptr) << expseg_last_error();
  EXPECT_EQ(expseg_record_history(nullptr, true, 10), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_history_push_frames(nullptr, 1), EXPSEG_ERR_INVALID_ARGUMENT);
  expseg_frame bad = {nullptr, "f", 1};
  EXPECT_EQ(expseg_history_push_frames(&bad, 1), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(strstr(expseg_last_error(), "filename"), nullptr) << expseg_last_error();
  EXPECT_EQ(expseg_history_push_frames(nullptr, 0), EXPSEG_OK);
  EXPECT_EQ(expseg_snapshot_dump(a, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_snapshot_dump(a, ""), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_snapshot_dump(nullptr, "x.pickle"), EXPSEG_ERR_INVALID_ARGUMENT);
  unsigned char *buf = (unsigned char *)1;
  size_t len = 1;
  EXPECT_EQ(expseg_snapshot(a, nullptr, &len), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_snapshot(nullptr, &buf, &len), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(buf, nullptr);
  std::string missing = tmp_dir() + "/no/such/dir/s.pickle";
  EXPECT_EQ(expseg_snapshot_dump(a, missing.c_str()), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(strstr(expseg_last_error(), missing.c_str()), nullptr) << expseg_last_error();
  // a good dump over an existing file replaces it, and leaves no temporary file
  std::string path = tmp_dir() + "/atomic.pickle";
  FILE *f = fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("old", f);
  fclose(f);
  ASSERT_EQ(expseg_snapshot_dump(a, path.c_str()), EXPSEG_OK) << expseg_last_error();
  f = fopen(path.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(fgetc(f), 0x80);
  fclose(f);
  DIR *d = opendir(tmp_dir().c_str());
  ASSERT_NE(d, nullptr);
  for (struct dirent *e; (e = readdir(d)) != nullptr;)
    EXPECT_EQ(strstr(e->d_name, ".tmp."), nullptr) << e->d_name;
  closedir(d);
  // the allocator keeps working
  void *p;
  ASSERT_EQ(expseg_malloc(a, 100, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  expseg_destroy(a);
}

}  // namespace
