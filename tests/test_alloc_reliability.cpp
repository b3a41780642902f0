// SPDX-License-Identifier: Apache-2.0
// Reliability defects found by adversarial testing (issue 8), each pinned through the public
// API and the testing hooks of expseg_testing.h: memory freed on a busy stream is never
// given back or handed out before that stream's work is done; refused undo steps are kept
// and retried, never leaked; oversize_segments survives a run-time max_split_size change; a
// log sink may call back into expseg; garbage collection does not turn a request that could
// be served into an out-of-memory error.
#include "chunk_support.h"
#include "policy.h"
#include "alloc_support.h"
#ifdef EXPSEG_RELIABILITY_GPU
#include "cudadouble.h"
#include "vmm.h"
#endif

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

constexpr size_t MiB = 1024 * 1024;


expseg_allocator *make(const char *driver, const char *config) {
  expseg_allocator *a = nullptr;
  EXPECT_EQ(expseg_create(driver, 0, config, &a), EXPSEG_OK) << driver << ": "
                                                             << expseg_last_error();
  return a;
}

bool overlaps(uintptr_t a, size_t as, uintptr_t b, size_t bs) { return a < b + bs && b < a + as; }

} // namespace

// ---- 1. busy classic segments are not given back ----
// On host (any value is a stream) and, from test_gpu_reliability.cpp, on cuda against the
// CUDA driver double only (streams the driver created, capacity set through the double; on
// a real GPU each test skips, naming what of the double it needs).

class BusyStreams : public ::testing::TestWithParam<const char *> {
protected:
  expseg_allocator *a_ = nullptr;
  std::map<int, expseg_stream> streams_;
  bool cuda() const { return std::string(GetParam()) == "cuda"; }
  expseg_allocator *make(size_t capacity_mib, const char *config) {
    std::string cap = "capacity=" + std::to_string(capacity_mib) + "M";
    if (!cuda()) return a_ = ::make(("host:" + cap).c_str(), config);
#ifdef EXPSEG_RELIABILITY_GPU
    cudadouble_api api;
    if (!cudadouble_load(&api) || !_expseg_cuda_usable(0)) return nullptr;
    EXPECT_EQ(0, api.configure((cap + ",granularity=2M,recommended=2M").c_str()))
        << api.last_message();
#endif
    return a_ = ::make("cuda", config);
  }
  // stream i: i itself on host; on cuda a stream the driver created (0: the default)
  expseg_stream S(int i) {
    if (!cuda() || i == 0) return (expseg_stream)i;
    if (!streams_.count(i)) {
      EXPECT_EQ(EXPSEG_OK, expseg_stream_create(a_, &streams_[i])) << expseg_last_error();
    }
    return streams_[i];
  }
  void done(expseg_allocator *a, const char *where) {
    for (auto &kv : streams_) EXPECT_EQ(EXPSEG_OK, expseg_stream_destroy(a, kv.second));
    expect_nothing_left(a, where);
  }
};

// why: what of the double the test needs (a real GPU is not that device)
#define MAKE_OR_SKIP(var, cap, config, why)                                     \
  expseg_allocator *var = make(cap, config);                                    \
  if (!var && cuda()) GTEST_SKIP() << "needs the CUDA driver double (tests/cuda_double): " << why; \
  ASSERT_NE(nullptr, var)

TEST_P(BusyStreams, EmptyCacheKeepsAClassicSegmentWhoseStreamIsBusy) {
  QuietLog q;
  MAKE_OR_SKIP(a, 64, "expandable_segments:False",
               "a released stream is idle at once there; on a real GPU it finishes a moment "
               "later, and the non-blocking empty_cache that follows could still see it busy");
  ASSERT_EQ(expseg_testing_hold_stream(a, S(3), true), EXPSEG_OK) << expseg_last_error();
  void *p = nullptr, *r = nullptr;
  ASSERT_EQ(expseg_malloc(a, 5 * MiB, S(3), &p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "num_device_free"), 0) << "unmapped while stream 3 still had work queued";
  EXPECT_GT(stat_of(a, "reserved_bytes.all.current"), 0);
  ASSERT_EQ(expseg_malloc(a, 5 * MiB, S(1), &r), EXPSEG_OK);
  EXPECT_FALSE(overlaps((uintptr_t)p, 5 * MiB, (uintptr_t)r, 5 * MiB))
      << "stream 1 was handed memory stream 3 may still use";
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_testing_hold_stream(a, S(3), false), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, r), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0) << "released once the stream is idle";
  EXPECT_EQ(stat_of(a, "num_device_free"), 2);
  done(a, "empty_cache");
}

TEST_P(BusyStreams, OutOfMemoryRetryDoesNotReleaseABusyClassicSegment) {
  QuietLog q;
  MAKE_OR_SKIP(a, 48, "expandable_segments:False", "its device of 48 MiB, to run out of");
  ASSERT_EQ(expseg_testing_hold_stream(a, S(3), true), EXPSEG_OK);
  void *p = nullptr, *r = nullptr;
  ASSERT_EQ(expseg_malloc(a, 25 * MiB, S(3), &p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  EXPECT_EQ(expseg_malloc(a, 30 * MiB, S(1), &r), EXPSEG_ERR_OUT_OF_MEMORY)
      << "only the busy segment's memory could have served it";
  EXPECT_EQ(stat_of(a, "num_device_free"), 0);
  EXPECT_EQ(stat_of(a, "num_ooms"), 1);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_testing_hold_stream(a, S(3), false), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 30 * MiB, S(1), &r), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(stat_of(a, "num_device_free"), 1) << "the idle segment is released on the retry";
  ASSERT_EQ(expseg_free(a, r), EXPSEG_OK);
  done(a, "oom retry");
}

TEST_P(BusyStreams, GarbageCollectionSkipsABusyClassicSegment) {
  QuietLog q;
  MAKE_OR_SKIP(a, 128, "expandable_segments:False,garbage_collection_threshold:0.5",
               "its device of 128 MiB, of which the fraction and threshold are taken");
  ASSERT_EQ(expseg_set_memory_fraction(a, 0.5), EXPSEG_OK); // 64 MiB allowed, GC above 32
  ASSERT_EQ(expseg_testing_hold_stream(a, S(3), true), EXPSEG_OK);
  void *p = nullptr, *r = nullptr;
  ASSERT_EQ(expseg_malloc(a, 40 * MiB, S(3), &p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  EXPECT_EQ(expseg_malloc(a, 4 * MiB, S(1), &r), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(stat_of(a, "num_device_free"), 0) << "collection released a segment of a busy stream";
  EXPECT_FALSE(overlaps((uintptr_t)p, 40 * MiB, (uintptr_t)r, 4 * MiB));
  ASSERT_EQ(expseg_free(a, r), EXPSEG_OK);
  ASSERT_EQ(expseg_testing_hold_stream(a, S(3), false), EXPSEG_OK);
  void *s = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4 * MiB, S(5), &s), EXPSEG_OK); // a miss: collects now
  EXPECT_GE(stat_of(a, "num_device_free"), 1) << "idle now: collection may take it";
  ASSERT_EQ(expseg_free(a, s), EXPSEG_OK);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  done(a, "gc");
}

TEST_P(BusyStreams, ExpandablePagesOfABusyStreamAreNotMovedOrReleased) {
  QuietLog q;
  MAKE_OR_SKIP(a, 64, "", "its device of 64 MiB, to run out of");
  ASSERT_EQ(expseg_testing_hold_stream(a, S(3), true), EXPSEG_OK);
  void *p = nullptr, *r = nullptr;
  ASSERT_EQ(expseg_malloc(a, 40 * MiB, S(3), &p), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), (int64_t)(40 * MiB));
  EXPECT_EQ(expseg_malloc(a, 30 * MiB, S(1), &r), EXPSEG_ERR_OUT_OF_MEMORY)
      << "stream 1 got pages stream 3 may still use";
  ASSERT_EQ(expseg_testing_hold_stream(a, S(3), false), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 30 * MiB, S(1), &r), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(stat_of(a, "expseg.num_lent"), 1) << "stream 3 is idle now: its free block is lent";
  EXPECT_EQ((uintptr_t)r, (uintptr_t)p);
  ASSERT_EQ(expseg_free(a, r), EXPSEG_OK);
  done(a, "expandable");
}

#ifdef EXPSEG_RELIABILITY_GPU
INSTANTIATE_TEST_SUITE_P(Gpu, BusyStreams, ::testing::Values("cuda"),
                         [](const auto &i) { return std::string(i.param); });
#else
INSTANTIATE_TEST_SUITE_P(Cpu, BusyStreams, ::testing::Values("host"),
                         [](const auto &i) { return std::string(i.param); });

// ---- 2. refused undo steps are kept and retried, never leaked ----

// Every growth step fails once, and then one step of its undo is refused too.
TEST(Reliability, RefusedUndoStepsAreRetriedNotLeaked) {
  const char *grow_fail[] = {"create@1:oom", "map@1", "set_access@1", "reserve@1:oom"};
  const char *undo_fail[] = {"unmap@1", "release@1", "unreserve@1", "unmap@1..2",
                             "release@1,unreserve@1"};
  const char *modes[] = {"expandable_segments:False", "expandable_segments:True"};
  for (const char *mode : modes)
    for (const char *g : grow_fail)
      for (const char *u : undo_fail) {
        std::string spec = std::string("fault:fail=") + g + "," + u + ";host:capacity=64M";
        std::string where = std::string(mode) + " / " + spec;
        QuietLog q;
        expseg_allocator *a = make(spec.c_str(), mode);
        ASSERT_NE(a, nullptr) << where;
        void *p = nullptr;
        expseg_status st = expseg_malloc(a, 5 * MiB, 0, &p);
        EXPECT_TRUE(st == EXPSEG_OK || st == EXPSEG_ERR_DRIVER ||
                    st == EXPSEG_ERR_OUT_OF_MEMORY)
            << where << ": " << expseg_status_name(st);
        EXPECT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << expseg_last_error();
        if (p) {
          EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
        }
        // the allocator keeps working after the faults
        void *r = nullptr;
        EXPECT_EQ(expseg_malloc(a, 5 * MiB, 0, &r), EXPSEG_OK) << where << ": "
                                                              << expseg_last_error();
        EXPECT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << expseg_last_error();
        EXPECT_EQ(expseg_free(a, r), EXPSEG_OK);
        // a release refused now is kept and retried: at most one empty_cache per refusal
        for (int i = 0; i < 4 && stat_of(a, "reserved_bytes.all.current") +
                                         stat_of(a, "expseg.reserved_va_bytes.current") > 0;
             i++) {
          EXPECT_EQ(expseg_empty_cache(a), EXPSEG_OK);
          EXPECT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << expseg_last_error();
        }
        EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0) << where;
        EXPECT_EQ(stat_of(a, "expseg.reserved_va_bytes.current"), 0) << where;
        expect_nothing_left(a, where);
      }
}

TEST(Reliability, AnUnreserveRefusedAfterANaturalOutOfMemoryIsRetried) {
  QuietLog q;
  expseg_allocator *a = make("fault:fail=unreserve@1;host:capacity=32M",
                             "expandable_segments:False");
  void *p = nullptr, *r = nullptr;
  ASSERT_EQ(expseg_malloc(a, 10 * MiB, 0, &r), EXPSEG_OK); // a 20 MiB segment
  EXPECT_EQ(expseg_malloc(a, 24 * MiB, 0, &p), EXPSEG_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(expseg_testing_faults_injected(a), 1u);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_free(a, r), EXPSEG_OK);
  EXPECT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "expseg.reserved_va_bytes.current"), 0);
  expect_nothing_left(a, "natural oom");
}

// ---- 3. oversize_segments follows each segment, not today's setting ----

TEST(Reliability, OversizeSegmentsSurviveARunTimeMaxSplitSizeChange) {
  for (int raise = 0; raise < 2; raise++) {
    expseg_allocator *a = make("sim", raise ? "expandable_segments:False,max_split_size_mb:20"
                                            : "expandable_segments:False");
    void *p = nullptr;
    ASSERT_EQ(expseg_malloc(a, 25 * MiB, 0, &p), EXPSEG_OK);
    EXPECT_EQ(stat_of(a, "oversize_segments.current"), raise ? 1 : 0);
    ASSERT_EQ(expseg_configure(a, raise ? "max_split_size_mb:100" : "max_split_size_mb:20"),
              EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
    ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
    EXPECT_EQ(stat_of(a, "segment.all.current"), 0);
    EXPECT_EQ(stat_of(a, "oversize_segments.current"), 0) << (raise ? "raised" : "lowered");
    EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
    expseg_destroy(a);
  }
}

// ---- 4. a log sink may call back into expseg ----

namespace {
expseg_allocator *g_sink_alloc;
int g_sink_calls;
void sink_reentering(void *, const char *) {
  g_sink_calls++;
  int64_t v;
  (void)expseg_stat(g_sink_alloc, "num_ooms", &v);          // takes the allocator's lock
  expseg_set_log_sink(&sink_reentering, nullptr);           // takes the sink's mutex
  void *p = nullptr;                                        // and allocates
  if (expseg_malloc(g_sink_alloc, 1024, 0, &p) == EXPSEG_OK) (void)expseg_free(g_sink_alloc, p);
}
} // namespace

TEST(Reliability, ALogSinkMayCallIntoExpseg) {
  // run in a child with an alarm: a deadlock fails the test instead of hanging the suite
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(20);
    g_sink_alloc = make("fault:fail=release@1..;host:capacity=64M", "expandable_segments:False");
    expseg_set_log_sink(&sink_reentering, nullptr);
    void *p = nullptr;
    if (expseg_malloc(g_sink_alloc, 5 * MiB, 0, &p) != EXPSEG_OK) _exit(3);
    (void)expseg_free(g_sink_alloc, p);
    (void)expseg_empty_cache(g_sink_alloc); // release refused: a warning inside the allocator
    if (g_sink_calls == 0) _exit(4);
    if (expseg_testing_set_faults(g_sink_alloc, "") != EXPSEG_OK) _exit(5);
    expseg_set_log_sink(nullptr, nullptr);
    expseg_destroy(g_sink_alloc);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_FALSE(WIFSIGNALED(status)) << "the child died of signal " << WTERMSIG(status)
                                    << (WTERMSIG(status) == SIGALRM ? " (deadlock)" : "");
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// ---- 5. garbage collection leaves what the request can use ----

TEST(Reliability, GarbageCollectionDoesNotTurnAServableRequestIntoAnOutOfMemory) {
  for (const char *conf : {"", "garbage_collection_threshold:0.5"}) {
    QuietLog q;
    expseg_allocator *a = make("host:capacity=64M", conf);
    void *p0 = nullptr, *p1 = nullptr, *r = nullptr;
    ASSERT_EQ(expseg_malloc(a, 24 * MiB, 0, &p0), EXPSEG_OK);
    ASSERT_EQ(expseg_malloc(a, 24 * MiB, 1, &p1), EXPSEG_OK);
    ASSERT_EQ(expseg_set_memory_fraction(a, 0.25), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, p0), EXPSEG_OK);
    EXPECT_EQ(expseg_malloc(a, 4 * MiB, 7, &r), EXPSEG_OK)
        << "'" << conf << "': " << expseg_last_error();
    EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
    if (r) {
      EXPECT_EQ(expseg_free(a, r), EXPSEG_OK);
    }
    EXPECT_EQ(expseg_free(a, p1), EXPSEG_OK);
    expect_nothing_left(a, conf);
  }
}

// ---- 8. messages ----

TEST(Reliability, MessagesSayWhatHappened) {
  expseg_allocator *a = make("host:capacity=64M", "");
  EXPECT_EQ(expseg_set_memory_fraction(a, 1.0000001), EXPSEG_ERR_INVALID_ARGUMENT);
  std::string m = expseg_last_error();
  EXPECT_NE(m.find("1.0000001"), std::string::npos) << m;
  EXPECT_EQ(m.find("fraction 1 is"), std::string::npos) << m;

  // larger than the whole device: refused at once, no driver call, the right hint
  int64_t calls_before = stat_of(a, "expseg.driver.create");
  void *p = nullptr;
  EXPECT_EQ(expseg_malloc(a, 100 * MiB, 0, &p), EXPSEG_ERR_OUT_OF_MEMORY);
  m = expseg_last_error();
  EXPECT_NE(m.find("larger than the whole device"), std::string::npos) << m;
  EXPECT_EQ(m.find("smaller batches"), std::string::npos) << m;
  EXPECT_EQ(stat_of(a, "expseg.driver.create"), calls_before);
  EXPECT_EQ(stat_of(a, "num_ooms"), 1);

  // the OOM message's figures agree with each other (taken before the page cache goes back)
  void *q = nullptr;
  ASSERT_EQ(expseg_malloc(a, 40 * MiB, 0, &q), EXPSEG_OK);
  EXPECT_EQ(expseg_malloc(a, 30 * MiB, 1, &p), EXPSEG_ERR_OUT_OF_MEMORY);
  m = expseg_last_error();
  // (the growth's chunks are created while they fit in the 24 MiB left; the first that does
  // not is refused, and the message gives the figures of then)
  size_t made = 0, asked = 0;
  for (size_t c : growth_chunk_sizes(30 * MiB, 30 * MiB)) {
    asked = c;
    if (made + asked > 24 * MiB) break;
    made += asked;
  }
  char want[96];
  snprintf(want, sizeof want, "64.00 MiB in total, %s free",
           made == 24 * MiB ? "0 bytes" : (std::to_string((24 * MiB - made) >> 20) + ".00 MiB").c_str());
  EXPECT_NE(m.find(want), std::string::npos) << want << "\n" << m;
  snprintf(want, sizeof want, "asked %zu.00 MiB", asked >> 20);
  EXPECT_NE(m.find(want), std::string::npos) << want << "\n" << m; // not "6144.00 KiB"
  EXPECT_EQ(expseg_free(a, q), EXPSEG_OK);
  expseg_destroy(a);
}

TEST(Reliability, ExhaustedAddressSpaceIsNamedAsSuch) {
  QuietLog q;
  // a tiny address space: a few streams use it up long before memory runs out
  expseg_allocator *a = make("sim:capacity=64G,va=4G", "");
  std::vector<void *> ps;
  expseg_status st = EXPSEG_OK;
  for (expseg_stream s = 1; s < 4096 && st == EXPSEG_OK; s++) {
    void *p = nullptr;
    st = expseg_malloc(a, 1 * MiB, s, &p);
    if (p) ps.push_back(p);
  }
  ASSERT_EQ(st, EXPSEG_ERR_OUT_OF_MEMORY);
  std::string m = expseg_last_error();
  EXPECT_NE(m.find("address space ran out"), std::string::npos) << m;
  EXPECT_EQ(m.find("free tensors"), std::string::npos) << m;
  for (void *p : ps) EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
  expseg_destroy(a);
}

// ---- testing hooks: their own errors ----

TEST(Reliability, FaultRulesAreCheckedAndNamed) {
  expseg_allocator *a = make("host:capacity=64M", "");
  EXPECT_EQ(expseg_testing_set_faults(a, "map@1"), EXPSEG_ERR_INVALID_ARGUMENT)
      << "not a fault driver";
  expseg_destroy(a);
  expseg_allocator *f = nullptr;
  EXPECT_EQ(expseg_create("fault:fail=mapp@1;host", 0, "", &f), EXPSEG_ERR_CONFIG);
  EXPECT_NE(std::string(expseg_last_error()).find("unknown call kind"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(expseg_create("fault:fail=map@0;host", 0, "", &f), EXPSEG_ERR_CONFIG);
  EXPECT_EQ(expseg_create("fault:fail=map@3..2;host", 0, "", &f), EXPSEG_ERR_CONFIG);
  EXPECT_EQ(expseg_create("fault:fail=map@3:maybe;host", 0, "", &f), EXPSEG_ERR_CONFIG);
  EXPECT_EQ(expseg_create("fault:fail=map@1", 0, "", &f), EXPSEG_ERR_CONFIG) << "no inner driver";
  EXPECT_EQ(expseg_create("fault:rate=1;host", 0, "", &f), EXPSEG_ERR_CONFIG);
  EXPECT_EQ(expseg_create("fault;sim", 0, "", &f), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_testing_set_faults(f, "create@2..3:oom,unmap@1.."), EXPSEG_OK)
      << expseg_last_error();
  EXPECT_EQ(expseg_testing_set_faults(f, "create@"), EXPSEG_ERR_CONFIG);
  EXPECT_NE(std::string(expseg_last_error()).find("position"), std::string::npos);
  EXPECT_EQ(expseg_testing_set_faults(f, ""), EXPSEG_OK);
  EXPECT_EQ(expseg_testing_set_faults(f, "map@1"), EXPSEG_OK);
  void *p = nullptr;
  EXPECT_EQ(expseg_malloc(f, 1 * MiB, 0, &p), EXPSEG_ERR_DRIVER);
  EXPECT_EQ(expseg_testing_faults_injected(f), 1u);
  EXPECT_EQ(expseg_malloc(f, 1 * MiB, 0, &p), EXPSEG_OK) << "map@1 fails only the next map";
  EXPECT_EQ(expseg_free(f, p), EXPSEG_OK);
  EXPECT_EQ(expseg_testing_hold_stream(nullptr, 1, true), EXPSEG_ERR_INVALID_ARGUMENT);
  expect_nothing_left(f, "fault rules");
}

// A refused undo-unmap inside a live expandable segment: destroy retries it before the
// segment's reservation goes (it leaked 128 MiB of address space before), and a growth
// whose retry is refused again reports a driver error instead of mapping over the range.
TEST(Reliability, ARefusedUndoUnmapIsNeitherMappedOverNorLeakedAtDestroy) {
  for (const char *drv : {"fault;sim:capacity=1G", "fault;host:capacity=256M"}) {
    QuietLog q;
    for (int refuse_again = 0; refuse_again < 2; refuse_again++) {
      std::string where = std::string(drv) + (refuse_again ? " / refused twice" : "");
      expseg_allocator *a = make(drv, "");
      void *p1 = nullptr, *p2 = nullptr;
      ASSERT_EQ(expseg_malloc(a, 4 * MiB, 0, &p1), EXPSEG_OK);
      ASSERT_EQ(expseg_testing_set_faults(a, "set_access@1,unmap@1"), EXPSEG_OK);
      EXPECT_EQ(expseg_malloc(a, 8 * MiB, 0, &p2), EXPSEG_ERR_DRIVER) << where;
      EXPECT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << expseg_last_error();
      if (refuse_again) {
        // the retry before the growth is refused too: the growth skips the range the
        // refused unmap still maps (the driver would refuse a map over it: the growth would
        // fail) and grows past it or in a reservation of its own
        ASSERT_EQ(expseg_testing_set_faults(a, "unmap@1"), EXPSEG_OK);
        EXPECT_EQ(expseg_malloc(a, 8 * MiB, 0, &p2), EXPSEG_OK) << where << ": "
                                                               << expseg_last_error();
        EXPECT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << expseg_last_error();
        EXPECT_EQ(expseg_free(a, p2), EXPSEG_OK);
        ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK);
        ASSERT_EQ(expseg_malloc(a, 8 * MiB, 0, &p2), EXPSEG_OK) << where << ": "
                                                               << expseg_last_error();
        EXPECT_EQ(expseg_free(a, p2), EXPSEG_OK);
      }
      ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK);
      EXPECT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << expseg_last_error();
      EXPECT_EQ(expseg_free(a, p1), EXPSEG_OK);
      expect_nothing_left(a, where);
    }
  }
}

// expseg_configure cannot reach a state whose printed form does not parse back, and the
// printed form of any configuration recreates it without warnings.
TEST(Reliability, ConfigureKeepsTheConfigurationConsistent) {
  QuietLog q;
  expseg_allocator *a = make("sim", "max_split_size_mb:100");
  EXPECT_EQ(expseg_configure(a, "large_segment_size_mb:200"), EXPSEG_ERR_CONFIG);
  std::string m = expseg_last_error();
  EXPECT_NE(m.find("not with the settings in force"), std::string::npos) << m;
  EXPECT_NE(m.find("max_split_size_mb"), std::string::npos) << m;
  EXPECT_EQ(expseg_configure(a, "large_segment_size_mb:50"), EXPSEG_OK) << expseg_last_error();
  size_t need = expseg_config_string(a, nullptr, 100); // NULL buffer: only the length
  ASSERT_GT(need, 0u);
  std::string text(need, '\0');
  ASSERT_EQ(expseg_config_string(a, &text[0], need + 1), need);
  int before = q.lines;
  expseg_allocator *b = make("sim", text.c_str());
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(q.lines, before) << "the canonical form warned: " << q.last;
  std::string again(need, '\0');
  ASSERT_EQ(expseg_config_string(b, &again[0], need + 1), need);
  EXPECT_EQ(again, text);
  expseg_destroy(b);
  expseg_destroy(a);
}

// expseg_snapshot_dump renames a temporary file over its path: it refuses what a rename
// would destroy (a FIFO, a directory) and writes a symbolic link's target, keeping the link.
TEST(Reliability, SnapshotDumpReplacesOnlyRegularFiles) {
  char dir[] = "/tmp/expseg_dump_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  std::string d = dir, fifo = d + "/fifo", sub = d + "/sub", target = d + "/target",
              link = d + "/link";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  ASSERT_EQ(mkdir(sub.c_str(), 0700), 0);
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  expseg_allocator *a = make("sim", "");
  EXPECT_EQ(expseg_snapshot_dump(a, fifo.c_str()), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("a FIFO"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(expseg_snapshot_dump(a, sub.c_str()), EXPSEG_ERR_INVALID_ARGUMENT);
  struct stat sb;
  ASSERT_EQ(lstat(fifo.c_str(), &sb), 0);
  EXPECT_TRUE(S_ISFIFO(sb.st_mode)) << "the FIFO was replaced";
  EXPECT_EQ(expseg_snapshot_dump(a, link.c_str()), EXPSEG_ERR_INVALID_ARGUMENT)
      << "a dangling link is refused";
  if (FILE *f = std::fopen(target.c_str(), "w")) std::fclose(f);
  EXPECT_EQ(expseg_snapshot_dump(a, link.c_str()), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(lstat(link.c_str(), &sb), 0);
  EXPECT_TRUE(S_ISLNK(sb.st_mode)) << "the link was replaced";
  ASSERT_EQ(stat(target.c_str(), &sb), 0);
  EXPECT_TRUE(S_ISREG(sb.st_mode));
  EXPECT_GT(sb.st_size, 0);
  expseg_destroy(a);
  unlink(link.c_str());
  unlink(target.c_str());
  unlink(fifo.c_str());
  rmdir(sub.c_str());
  rmdir(dir);
}
#endif // EXPSEG_RELIABILITY_GPU
