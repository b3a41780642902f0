// SPDX-License-Identifier: Apache-2.0
// test_torch_backend_glue.cpp: the PyTorch-free part of the C++ backend
// (plugin/backend_glue.h): the statistics mapping into a DeviceStats-shaped struct (against
// the host driver's real statistics), the MempoolId_t -> expseg pool map (against a fake of
// expseg's pool API that counts uses), the error text, skip_actions, and the history's
// context (recordAnnotation's log into external_annotations, compile context and user
// metadata into TraceEntry-shaped structs). No PyTorch, no GPU.
#include "backend_glue.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <map>
#include <string>
#include <chrono>
#include <thread>
#include <unordered_map>
#include <vector>

#include "test_seed.h"

namespace {

// The shape of PyTorch's c10::CachingDeviceAllocator::DeviceStats (field names and types).
struct Stat {
  int64_t current = 0, peak = 0, allocated = 0, freed = 0;
};
using StatArray = std::array<Stat, 3>;
struct DeviceStats {
  StatArray allocation, segment, active, inactive_split, allocated_bytes, reserved_bytes,
      active_bytes, inactive_split_bytes, requested_bytes;
  int64_t num_alloc_retries = 0, num_ooms = 0;
  Stat oversize_allocations, oversize_segments;
  int64_t num_sync_all_streams = 0, num_device_alloc = 0, num_device_free = 0;
  int64_t num_oom_rejections = 0;  // PyTorch 2.12
  int64_t max_split_size = 0;
};
constexpr size_t kAll = 0, kSmall = 1, kLarge = 2;

struct Alloc {
  expseg_allocator *a = nullptr;
  explicit Alloc(const char *config = "") {
    EXPECT_EQ(expseg_create("host:capacity=64M", 0, config, &a), EXPSEG_OK) << expseg_last_error();
  }
  ~Alloc() { expseg_destroy(a); }
};

TEST(BackendGlueStats, FieldsComeFromTheirKeys) {
  Alloc al;
  void *small = nullptr, *large = nullptr, *freed = nullptr;
  ASSERT_EQ(expseg_malloc(al.a, 1000, 0, &small), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(al.a, 5 << 20, 0, &large), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(al.a, 3000, 0, &freed), EXPSEG_OK);
  ASSERT_EQ(expseg_free(al.a, freed), EXPSEG_OK);

  DeviceStats s;
  std::set<std::string> read;
  EXPECT_EQ(expseg_glue::fill_device_stats_from(s, al.a, &read), 0);
  EXPECT_EQ(s.allocation[kAll].current, 2);
  EXPECT_EQ(s.allocation[kSmall].current, 1);
  EXPECT_EQ(s.allocation[kLarge].current, 1);
  EXPECT_EQ(s.allocation[kAll].allocated, 3);
  EXPECT_EQ(s.allocation[kAll].freed, 1);
  EXPECT_EQ(s.allocation[kSmall].peak, 2);
  EXPECT_EQ(s.allocated_bytes[kSmall].current, 1024);     // 1000 rounded to 512
  EXPECT_EQ(s.allocated_bytes[kLarge].current, 5 << 20);
  EXPECT_EQ(s.requested_bytes[kAll].current, 1000 + (5 << 20));
  EXPECT_EQ(s.max_split_size, -1);                         // unlimited, as PyTorch reports it
  // Every other field equals its key, read independently.
  int64_t v = 0;
  ASSERT_EQ(expseg_stat(al.a, "reserved_bytes.large_pool.current", &v), EXPSEG_OK);
  EXPECT_EQ(s.reserved_bytes[kLarge].current, v);
  ASSERT_EQ(expseg_stat(al.a, "segment.small_pool.current", &v), EXPSEG_OK);
  EXPECT_EQ(s.segment[kSmall].current, v);
  ASSERT_EQ(expseg_stat(al.a, "num_device_alloc", &v), EXPSEG_OK);
  EXPECT_EQ(s.num_device_alloc, v);
  EXPECT_GT(v, 0);

  // Complete: every PyTorch key expseg reports fills a field, and nothing else is read.
  std::set<std::string> torch_keys;
  expseg_stats_foreach(
      al.a,
      [](void *ctx, const char *key, int64_t) {
        if (std::string(key).rfind("expseg.", 0) != 0)
          static_cast<std::set<std::string> *>(ctx)->insert(key);
      },
      &torch_keys);
  EXPECT_EQ(read, torch_keys);
  EXPECT_EQ(read.size(), 9u * 3 * 4 + 2 * 4 + 7);
  expseg_free(al.a, small);
  expseg_free(al.a, large);
}

TEST(BackendGlueStats, MaxSplitSizeAndOversize) {
  Alloc al("max_split_size_mb:20");
  void *p = nullptr;
  ASSERT_EQ(expseg_malloc(al.a, 25 << 20, 0, &p), EXPSEG_OK);
  DeviceStats s;
  EXPECT_EQ(expseg_glue::fill_device_stats_from(s, al.a), 0);
  EXPECT_EQ(s.max_split_size, 20 << 20);
  EXPECT_EQ(s.oversize_allocations.current, 1);
  expseg_free(al.a, p);
}

TEST(BackendGlueStats, MissingKeysAreCounted) {
  DeviceStats s;
  s.num_ooms = 77;
  int missing = expseg_glue::fill_device_stats(s, [](const char *key, int64_t *v) {
    if (std::string(key) == "num_ooms" || std::string(key) == "active.all.peak") return false;
    *v = 5;
    return true;
  });
  EXPECT_EQ(missing, 2);
  EXPECT_EQ(s.num_ooms, 77); // left as it was
  EXPECT_EQ(s.active[kAll].peak, 0);
  EXPECT_EQ(s.active[kLarge].freed, 5);
}

// recordHistory's skip_actions: PyTorch's names as expseg's skip flags; any other name is
// refused and named (the backend raises with it and the accepted list).
TEST(BackendGlueHistory, SkipActionsBecomeSkipFlags) {
  unsigned f = 1;
  std::string bad;
  EXPECT_TRUE(expseg_glue::skip_flags({}, &f, &bad));
  EXPECT_EQ(f, 0u);
  EXPECT_TRUE(expseg_glue::skip_flags({"alloc", "free_requested", "free_completed",
                                       "segment_alloc", "segment_free", "oom", "snapshot"},
                                      &f, &bad));
  EXPECT_EQ(f, (unsigned)(EXPSEG_HISTORY_SKIP_ALLOC | EXPSEG_HISTORY_SKIP_FREE_REQUESTED |
                          EXPSEG_HISTORY_SKIP_FREE_COMPLETED | EXPSEG_HISTORY_SKIP_SEGMENT_ALLOC |
                          EXPSEG_HISTORY_SKIP_SEGMENT_FREE | EXPSEG_HISTORY_SKIP_OOM |
                          EXPSEG_HISTORY_SKIP_SNAPSHOT));
  EXPECT_TRUE(expseg_glue::skip_flags({"oom"}, &f, &bad));
  EXPECT_EQ(f, (unsigned)EXPSEG_HISTORY_SKIP_OOM);
  EXPECT_FALSE(expseg_glue::skip_flags({"alloc", "Alloc", "segment_map"}, &f, &bad));
  EXPECT_EQ(bad, "Alloc");
  EXPECT_NE(std::string(expseg_glue::skip_names()).find("free_completed"), std::string::npos);
  // every accepted name is in the message
  for (const char *n : {"alloc", "free_requested", "free_completed", "segment_alloc",
                        "segment_free", "oom", "snapshot"}) {
    EXPECT_NE(std::string(expseg_glue::skip_names()).find(n), std::string::npos) << n;
    EXPECT_TRUE(expseg_glue::skip_flags({n}, &f, &bad)) << n;
    EXPECT_NE(f, 0u) << n;
  }
}

TEST(BackendGlueError, OneLineNamingCallDeviceStatusAndMessage) {
  std::string t = expseg_glue::error_text("raw_alloc(4096 bytes)", 3, EXPSEG_ERR_OUT_OF_MEMORY,
                                          "asked 4096\nheld 0");
  EXPECT_EQ(t, "expseg: raw_alloc(4096 bytes) (device 3): EXPSEG_ERR_OUT_OF_MEMORY: asked 4096 held 0");
  EXPECT_EQ(expseg_glue::error_text("x", 0, EXPSEG_ERR_UNSUPPORTED, ""),
            "expseg: x (device 0): EXPSEG_ERR_UNSUPPORTED");
}

TEST(BackendGlueConfig, ValuesOfScalarKeysOnly) {
  std::string v;
  const std::string cfg = "a:1,roundup_power2_divisions:[256:1,>:8],b:x,per_process_memory_fraction:0.5";
  ASSERT_TRUE(expseg_glue::config_value(cfg, "a", &v));
  EXPECT_EQ(v, "1");
  ASSERT_TRUE(expseg_glue::config_value(cfg, "roundup_power2_divisions", &v));
  EXPECT_EQ(v, "[256:1,>:8]");
  ASSERT_TRUE(expseg_glue::config_value(cfg, "per_process_memory_fraction", &v));
  EXPECT_EQ(v, "0.5");
  EXPECT_FALSE(expseg_glue::config_value(cfg, ">", &v));   // inside a list
  EXPECT_FALSE(expseg_glue::config_value(cfg, "256", &v)); // inside a list
  EXPECT_FALSE(expseg_glue::config_value(cfg, "", &v));
  EXPECT_FALSE(expseg_glue::config_value(cfg, "per_process", &v));
}

TEST(BackendGlueConfig, MemoryFractionFollowsTheAllocator) {
  Alloc al;
  EXPECT_EQ(expseg_glue::memory_fraction(al.a), 1.0);
  ASSERT_EQ(expseg_set_memory_fraction(al.a, 0.25), EXPSEG_OK);
  EXPECT_EQ(expseg_glue::memory_fraction(al.a), 0.25);
  Alloc configured("per_process_memory_fraction:0.125");
  EXPECT_EQ(expseg_glue::memory_fraction(configured.a), 0.125);
  EXPECT_NE(expseg_glue::config_string(al.a).find("expandable_segments:"), std::string::npos);
}

// ---- the pool map, against a fake of expseg's pool API ----

struct FakePools {
  struct State {
    std::mutex mu;
    uint64_t next = 100;
    std::map<uint64_t, int> uses;
    std::map<uint64_t, std::pair<bool (*)(void *, expseg_stream), void *>> active;
    int creates = 0;
    expseg_status begin_result = EXPSEG_OK;
  };
  std::shared_ptr<State> st = std::make_shared<State>();
  expseg_status create(expseg_allocator *, uint64_t *out) {
    std::lock_guard<std::mutex> g(st->mu);
    *out = st->next++;
    st->uses[*out] = 1;
    ++st->creates;
    return EXPSEG_OK;
  }
  expseg_status retain(expseg_allocator *, uint64_t id) {
    std::lock_guard<std::mutex> g(st->mu);
    if (!st->uses.count(id)) return EXPSEG_ERR_INVALID_ARGUMENT;
    ++st->uses[id];
    return EXPSEG_OK;
  }
  expseg_status use_count(const expseg_allocator *, uint64_t id, int *n) {
    std::lock_guard<std::mutex> g(st->mu);
    if (!st->uses.count(id)) return EXPSEG_ERR_INVALID_ARGUMENT;
    *n = st->uses[id];
    return EXPSEG_OK;
  }
  expseg_status begin(expseg_allocator *, uint64_t id, bool (*fn)(void *, expseg_stream), void *ctx) {
    std::lock_guard<std::mutex> g(st->mu);
    if (st->begin_result != EXPSEG_OK) return st->begin_result;
    st->active[id] = {fn, ctx};
    return EXPSEG_OK;
  }
  expseg_status end(expseg_allocator *, uint64_t id) {
    std::lock_guard<std::mutex> g(st->mu);
    return st->active.erase(id) ? EXPSEG_OK : EXPSEG_ERR_INVALID_ARGUMENT;
  }
  expseg_status release(expseg_allocator *, uint64_t id) {
    std::lock_guard<std::mutex> g(st->mu);
    if (!st->uses.count(id) || st->uses[id] <= 0) return EXPSEG_ERR_INVALID_ARGUMENT;
    if (--st->uses[id] == 0) st->uses.erase(id);
    return EXPSEG_OK;
  }
  // What expseg_malloc would ask: does the pool's filter take this stream?
  bool routes(uint64_t id, expseg_stream s) {
    std::lock_guard<std::mutex> g(st->mu);
    auto it = st->active.find(id);
    return it != st->active.end() && it->second.first(it->second.second, s);
  }
};

using Map = expseg_glue::PoolMap<FakePools>;

TEST(BackendGluePools, CreateOrIncrefCountsUsesPerPairAndDevice) {
  FakePools f;
  Map m(f);
  uint64_t a = 0, b = 0, c = 0, d = 0;
  ASSERT_EQ(m.acquire(nullptr, 0, {1, 0}, &a), EXPSEG_OK);
  ASSERT_EQ(m.acquire(nullptr, 0, {1, 0}, &b), EXPSEG_OK);
  ASSERT_EQ(m.acquire(nullptr, 0, {0, 1}, &c), EXPSEG_OK);
  ASSERT_EQ(m.acquire(nullptr, 1, {1, 0}, &d), EXPSEG_OK);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d); // another device's pool
  EXPECT_EQ(f.st->creates, 3);
  EXPECT_EQ(m.use_count(nullptr, 0, {1, 0}), 2);
  EXPECT_EQ(m.use_count(nullptr, 1, {1, 0}), 1);
  EXPECT_EQ(m.use_count(nullptr, 0, {9, 9}), 0);
  uint64_t found = 0;
  ASSERT_TRUE(m.find(0, {0, 1}, &found));
  EXPECT_EQ(found, c);
  EXPECT_TRUE(m.find(0, {0, 0}, &found));
  EXPECT_EQ(found, 0u);
  EXPECT_EQ(m.pair_of(0, c), (expseg_glue::PoolPair{0, 1}));
  EXPECT_EQ(m.pair_of(1, d), (expseg_glue::PoolPair{1, 0}));
  EXPECT_EQ(m.acquire(nullptr, 0, {0, 0}, &found), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(Map::why(), "memory pool (0, 0) on device 0 is the general cache, not a private pool");
  ASSERT_EQ(m.acquire(nullptr, 0, {1, 0}, &a), EXPSEG_OK);
  EXPECT_EQ(Map::why(), ""); // cleared by the next call
}

TEST(BackendGluePools, RefusalsNameThePairAndDevice) {
  FakePools f;
  Map m(f);
  EXPECT_EQ(m.release(nullptr, 2, {4, 5}), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(Map::why(), "memory pool (4, 5) on device 2 was never created or is released");
  EXPECT_EQ(m.end(nullptr, 1, {4, 5}), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(Map::why().find("device 1"), std::string::npos);
  ASSERT_EQ(m.begin(nullptr, 0, {4, 5}, [](expseg_stream) { return true; }), EXPSEG_OK);
  EXPECT_EQ(m.begin(nullptr, 0, {4, 5}, [](expseg_stream) { return true; }),
            EXPSEG_ERR_INVALID_ARGUMENT); // as PyTorch: one begin at a time per pool
  EXPECT_NE(Map::why().find("already being allocated to"), std::string::npos);
  EXPECT_EQ(m.use_count(nullptr, 0, {4, 5}), 1);
  ASSERT_EQ(m.end(nullptr, 0, {4, 5}), EXPSEG_OK);
  EXPECT_EQ(m.begin(nullptr, 0, {4, 5}, [](expseg_stream) { return true; }), EXPSEG_OK);
  EXPECT_EQ(m.use_count(nullptr, 0, {4, 5}), 2);
}

TEST(BackendGluePools, ReleaseForgetsThePairWhenUnused) {
  FakePools f;
  Map m(f);
  uint64_t a = 0;
  ASSERT_EQ(m.acquire(nullptr, 0, {3, 0}, &a), EXPSEG_OK);
  ASSERT_EQ(m.acquire(nullptr, 0, {3, 0}, &a), EXPSEG_OK);
  ASSERT_EQ(m.release(nullptr, 0, {3, 0}), EXPSEG_OK);
  EXPECT_EQ(m.use_count(nullptr, 0, {3, 0}), 1);
  EXPECT_EQ(m.size(), 1u);
  ASSERT_EQ(m.release(nullptr, 0, {3, 0}), EXPSEG_OK);
  EXPECT_EQ(m.size(), 0u);
  uint64_t found = 0;
  EXPECT_FALSE(m.find(0, {3, 0}, &found));
  EXPECT_EQ(m.release(nullptr, 0, {3, 0}), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(f.st->uses.empty());
}

// The reverse map: the pair of an expseg pool, per device, kept after the release (the
// pool's segments drain later and history names it) until a walk begun after the release
// no longer reports it.
TEST(BackendGluePools, PairOfOutlivesTheReleaseUntilAWalkShowsThePoolGone) {
  FakePools f;
  Map m(f);
  uint64_t a = 0, b = 0, c = 0;
  ASSERT_EQ(m.acquire(nullptr, 0, {0, 7}, &a), EXPSEG_OK);
  ASSERT_EQ(m.acquire(nullptr, 0, {8, 0}, &b), EXPSEG_OK);
  ASSERT_EQ(m.acquire(nullptr, 1, {0, 7}, &c), EXPSEG_OK);
  EXPECT_EQ(m.pair_of(0, 0), (expseg_glue::PoolPair{0, 0}));
  EXPECT_EQ(m.pair_of(0, 12345), (expseg_glue::PoolPair{0, 0})); // never named
  EXPECT_EQ(m.pair_of(1, a), (expseg_glue::PoolPair{0, 0}));     // another device's id
  EXPECT_EQ(m.pair_of(1, c), (expseg_glue::PoolPair{0, 7}));
  const uint64_t before = m.walk_mark();
  ASSERT_EQ(m.release(nullptr, 0, {0, 7}), EXPSEG_OK);
  ASSERT_EQ(m.size(), 2u); // the pair is forgotten as a name to allocate to ...
  EXPECT_EQ(m.pair_of(0, a), (expseg_glue::PoolPair{0, 7})); // ... not as a name to report
  EXPECT_EQ(m.names(), 3u);
  // a walk begun before the release proves nothing about it
  EXPECT_EQ(m.forget_unseen(0, before, {}), 0u);
  EXPECT_EQ(m.pair_of(0, a), (expseg_glue::PoolPair{0, 7}));
  // a walk that still saw it (a segment or an event of it): kept
  const uint64_t after = m.walk_mark();
  EXPECT_EQ(m.forget_unseen(0, after, {a}), 0u);
  EXPECT_EQ(m.pair_of(0, a), (expseg_glue::PoolPair{0, 7}));
  // another device's walk: kept
  EXPECT_EQ(m.forget_unseen(1, after, {}), 0u);
  // a later walk that did not: forgotten; live pools are never forgotten
  EXPECT_EQ(m.forget_unseen(0, after, {}), 1u);
  EXPECT_EQ(m.pair_of(0, a), (expseg_glue::PoolPair{0, 0}));
  EXPECT_EQ(m.pair_of(0, b), (expseg_glue::PoolPair{8, 0}));
  EXPECT_EQ(m.pair_of(1, c), (expseg_glue::PoolPair{0, 7}));
  EXPECT_EQ(m.names(), 2u);
  // the pair named again is a new pool with its own name; a failed begin's pool is released
  uint64_t a2 = 0;
  ASSERT_EQ(m.acquire(nullptr, 0, {0, 7}, &a2), EXPSEG_OK);
  EXPECT_NE(a2, a);
  EXPECT_EQ(m.pair_of(0, a2), (expseg_glue::PoolPair{0, 7}));
  f.st->begin_result = EXPSEG_ERR_UNSUPPORTED;
  ASSERT_EQ(m.begin(nullptr, 0, {9, 9}, [](expseg_stream) { return true; }),
            EXPSEG_ERR_UNSUPPORTED);
  EXPECT_EQ(m.names(), 4u); // its name kept until a walk shows it gone
  EXPECT_EQ(m.forget_unseen(0, m.walk_mark(), {a2, b}), 1u);
  EXPECT_EQ(m.names(), 3u);
}

TEST(BackendGluePools, BeginRoutesByTheFilterUntilEnd) {
  FakePools f;
  Map m(f);
  ASSERT_EQ(m.begin(nullptr, 0, {5, 0}, [](expseg_stream s) { return s == 7; }), EXPSEG_OK);
  uint64_t id = 0;
  ASSERT_TRUE(m.find(0, {5, 0}, &id));
  EXPECT_EQ(m.use_count(nullptr, 0, {5, 0}), 1); // begin takes a use, as PyTorch's allocator
  EXPECT_TRUE(f.routes(id, 7));
  EXPECT_FALSE(f.routes(id, 8));
  ASSERT_EQ(m.end(nullptr, 0, {5, 0}), EXPSEG_OK);
  EXPECT_FALSE(f.routes(id, 7));
  EXPECT_EQ(m.end(nullptr, 0, {6, 0}), EXPSEG_ERR_INVALID_ARGUMENT);
}

TEST(BackendGluePools, FailedBeginUndoesItsUse) {
  FakePools f;
  Map m(f);
  f.st->begin_result = EXPSEG_ERR_UNSUPPORTED;
  EXPECT_EQ(m.begin(nullptr, 0, {5, 0}, [](expseg_stream) { return true; }), EXPSEG_ERR_UNSUPPORTED);
  EXPECT_EQ(m.size(), 0u);
  EXPECT_TRUE(f.st->uses.empty());
  uint64_t id = 0;
  ASSERT_EQ(m.acquire(nullptr, 0, {5, 0}, &id), EXPSEG_OK);
  EXPECT_EQ(m.begin(nullptr, 0, {5, 0}, [](expseg_stream) { return true; }), EXPSEG_ERR_UNSUPPORTED);
  EXPECT_EQ(m.use_count(nullptr, 0, {5, 0}), 1); // the pool stays with its earlier use
}

TEST(BackendGluePools, ThrowingFilterMeansNotThisPool) {
  expseg_glue::StreamFilter f = [](expseg_stream) -> bool { throw std::runtime_error("x"); };
  EXPECT_FALSE(expseg_glue::filter_trampoline(&f, 1));
  expseg_glue::StreamFilter g = [](expseg_stream s) { return s == 1; };
  EXPECT_TRUE(expseg_glue::filter_trampoline(&g, 1));
}

TEST(BackendGluePools, ConcurrentIncrefsCreateOnce) {
  EXPSEG_SEEDED(seed, 11);
  FakePools f;
  Map m(f);
  constexpr int kThreads = 8, kEach = 200;
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      TestRng rng(seed + t);
      for (int i = 0; i < kEach; ++i) {
        uint64_t id = 0;
        expseg_glue::PoolPair p{1 + rng.below(3), 0};
        if (m.acquire(nullptr, 0, p, &id) != EXPSEG_OK) ++failures;
      }
    });
  for (auto &t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(f.st->creates, 3);
  int total = 0;
  for (uint64_t k = 1; k <= 3; ++k) total += m.use_count(nullptr, 0, {k, 0});
  EXPECT_EQ(total, kThreads * kEach);
}

// ---- the history's context ----

// The shapes of PyTorch's AnnotationEntry and SnapshotInfo (2.11: device_, time_ with t_,
// recordUserMetadata, external_annotations) and TraceEntry's fields of 2.12+ and older.
struct AnnotationEntry {
  AnnotationEntry(int8_t device, int64_t time) : device_(device) { time_.t_ = time; }
  void recordUserMetadata(const std::string &name, std::string value) { metadata_[name] = value; }
  int8_t device_;
  struct {
    int64_t t_;
  } time_;
  std::unordered_map<std::string, std::string> metadata_;
};
struct SnapshotInfo {
  std::vector<AnnotationEntry> external_annotations;
};
struct OldSnapshotInfo {
  int segments = 0;
};
struct TraceEntryNew {
  std::string compile_context_, user_metadata_;
};
struct TraceEntryMid {
  std::string compile_context_;
};
struct TraceEntryOld {
  int action_ = 0;
};

uint64_t NowUs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// recordAnnotation: into the allocator's history (the C library's log: its rules are tested
// in test_history_annotations.cpp); each kept entry becomes one AnnotationEntry with the
// allocator's device, the time and the pairs.
TEST(BackendGlueHistory, AnnotationsBecomeExternalAnnotations) {
  Alloc al;
  expseg_allocator *a = al.a;
  ASSERT_EQ(expseg_glue::record_annotation(a, {{"name", "ignored"}}), EXPSEG_OK); // off
  ASSERT_EQ(expseg_record_history_ex(a, true, 2, 0), EXPSEG_OK);
  uint64_t before = NowUs();
  ASSERT_EQ(expseg_glue::record_annotation(a, {{"name", "forward"}, {"stage", "START"}}),
            EXPSEG_OK);
  ASSERT_EQ(expseg_glue::record_annotation(a, {{"name", "backward"}, {"stage", "START"}}),
            EXPSEG_OK);
  ASSERT_EQ(expseg_glue::record_annotation(a, {{"name", "step"}}), EXPSEG_OK);
  uint64_t after = NowUs();
  SnapshotInfo info;
  ASSERT_EQ(expseg_glue::fill_annotations(info, a), EXPSEG_OK);
  ASSERT_EQ(info.external_annotations.size(), 2u); // the newest 2
  EXPECT_EQ(info.external_annotations[0].metadata_.at("name"), "backward");
  EXPECT_EQ(info.external_annotations[0].metadata_.at("stage"), "START");
  EXPECT_EQ(info.external_annotations[1].metadata_.at("name"), "step");
  EXPECT_EQ(info.external_annotations[1].metadata_.size(), 1u);
  for (const AnnotationEntry &e : info.external_annotations) {
    EXPECT_EQ(e.device_, 0);
    EXPECT_GE((uint64_t)e.time_.t_ + 1000, before); // the history's clock: within 1 ms
    EXPECT_LE((uint64_t)e.time_.t_, after + 1000);
  }
  ASSERT_EQ(expseg_record_history_ex(a, true, 5, EXPSEG_HISTORY_CLEAR), EXPSEG_OK);
  SnapshotInfo cleared;
  ASSERT_EQ(expseg_glue::fill_annotations(cleared, a), EXPSEG_OK);
  EXPECT_TRUE(cleared.external_annotations.empty());
  OldSnapshotInfo old; // a release without external_annotations: nothing to fill
  EXPECT_EQ(expseg_glue::fill_annotations(old, a), EXPSEG_OK);
  EXPECT_EQ(old.segments, 0);
}

// pushCompileContext / popCompileContext / setUserMetadata / getUserMetadata reach the C
// library, and a walked event's two strings land in whichever TraceEntry fields exist.
TEST(BackendGlueHistory, CompileContextAndUserMetadataReachTraceEntries) {
  Alloc al;
  expseg_allocator *a = al.a;
  EXPECT_EQ(expseg_glue::user_metadata(a), "");
  EXPECT_EQ(expseg_glue::user_metadata(nullptr), "");
  ASSERT_EQ(expseg_record_history_ex(a, true, 100, 0), EXPSEG_OK);
  ASSERT_EQ(expseg_glue::push_compile_context(a, "outer"), EXPSEG_OK);
  ASSERT_EQ(expseg_glue::push_compile_context(a, "inner"), EXPSEG_OK);
  ASSERT_EQ(expseg_glue::set_user_metadata(a, "batch 3"), EXPSEG_OK);
  EXPECT_EQ(expseg_glue::user_metadata(a), "batch 3");
  void *p, *q;
  ASSERT_EQ(expseg_malloc(a, 4096, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_glue::pop_compile_context(a), EXPSEG_OK);
  ASSERT_EQ(expseg_glue::set_user_metadata(a, ""), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 8192, 0, &q), EXPSEG_OK);
  struct Got {
    std::vector<TraceEntryNew> fresh;
    std::vector<TraceEntryMid> mid;
  } got;
  ASSERT_EQ(expseg_walk(
                a, nullptr,
                [](void *ctx, const expseg_walk_event *e) {
                  if (std::string(e->action) != "alloc") return;
                  auto *g = static_cast<Got *>(ctx);
                  TraceEntryNew n;
                  TraceEntryMid m;
                  TraceEntryOld o;
                  expseg_glue::set_trace_context(n, e);
                  expseg_glue::set_trace_context(m, e);
                  expseg_glue::set_trace_context(o, e); // no fields: compiles, does nothing
                  EXPECT_EQ(o.action_, 0);
                  g->fresh.push_back(n);
                  g->mid.push_back(m);
                },
                &got),
            EXPSEG_OK);
  ASSERT_EQ(got.fresh.size(), 2u);
  EXPECT_EQ(got.fresh[0].compile_context_, "inner");
  EXPECT_EQ(got.fresh[0].user_metadata_, "batch 3");
  EXPECT_EQ(got.fresh[1].compile_context_, "outer");
  EXPECT_EQ(got.fresh[1].user_metadata_, "");
  EXPECT_EQ(got.mid[0].compile_context_, "inner");
  ASSERT_EQ(expseg_glue::pop_compile_context(a), EXPSEG_OK);
  ASSERT_EQ(expseg_glue::pop_compile_context(a), EXPSEG_OK); // empty: nothing, as PyTorch
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, q), EXPSEG_OK);
}

} // namespace
