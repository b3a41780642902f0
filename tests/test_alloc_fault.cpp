// SPDX-License-Identifier: Apache-2.0
// test_alloc_fault.cpp: every driver call of a scripted scenario fails in turn. The scenario
// (mallocs of several sizes on two streams, frees, record_stream + free on a held stream,
// empty_cache, classic and expandable segments) first runs with no fault to count the calls
// of each kind; then, for every call kind and every position n, it runs again with the nth
// call of that kind failing (OUT_OF_MEMORY and DRIVER, once and from n on). Each API call
// must return OK or the injected status, expseg_check must pass after every step, requests
// must be served again once the faults stop, and after expseg_destroy the drivers below the
// allocator must hold nothing (no chunk, reservation, mapping or event).
//
// Driver stack: sim (owned by) fault <- borrow (non-owning, tests/support) <- allocator, so
// the test can read the fault and sim drivers' gauges after the allocator closed its driver.
#include "alloc_support.h"

#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;

const expseg_vmm_call kKinds[] = {
    EXPSEG_VMM_CALL_reserve,      EXPSEG_VMM_CALL_create,          EXPSEG_VMM_CALL_map,
    EXPSEG_VMM_CALL_set_access,   EXPSEG_VMM_CALL_unmap,           EXPSEG_VMM_CALL_release,
    EXPSEG_VMM_CALL_unreserve,    EXPSEG_VMM_CALL_event_create,    EXPSEG_VMM_CALL_event_record,
    EXPSEG_VMM_CALL_event_query,  EXPSEG_VMM_CALL_event_synchronize,
    EXPSEG_VMM_CALL_stream_synchronize};

struct Stack {
  expseg_vmm_t *fault = nullptr, *sim = nullptr;
  expseg_allocator *a = nullptr;

  // config "pytorch-model;KEYS": KEYS with the replay tool's PyTorch model switched on
  // (pools/model.c: PyTorch's expandable segments)
  void open(const char *config) {
    expseg_vmm_t *inner = nullptr, *borrow = nullptr;
    const char *model = "pytorch-model;";
    const bool pytorch = std::strncmp(config, model, std::strlen(model)) == 0;
    if (pytorch) config += std::strlen(model);
    ASSERT_EQ(_expseg_vmm_open("sim:capacity=2G", 0, &inner), EXPSEG_OK);
    ASSERT_EQ(_expseg_fault_new(inner, &fault), EXPSEG_OK);
    sim = _expseg_fault_inner(fault);
    ASSERT_EQ(alloc_test_borrow(fault, &borrow), EXPSEG_OK);
    ASSERT_EQ(alloc_test_create(borrow, config, &a), EXPSEG_OK) << expseg_last_error();
    if (pytorch) {
      ASSERT_EQ(expseg_testing_set_model_pytorch(a, true), EXPSEG_OK);
    }
  }
  // Destroys the allocator, then checks nothing is left in the drivers below it.
  void close(const std::string &what) {
    _expseg_fault_set_rules(fault, nullptr, 0);
    expseg_destroy(a);
    a = nullptr;
    char why[128];
    EXPECT_TRUE(vmm_test_is_idle(fault, why, sizeof why)) << what << ": fault driver: " << why;
    EXPECT_TRUE(vmm_test_is_idle(sim, why, sizeof why)) << what << ": sim driver: " << why;
    _expseg_vmm_close(fault);
    fault = sim = nullptr;
  }
};

struct Scenario {
  expseg_allocator *a;
  expseg_status injected;  // EXPSEG_OK: no fault
  std::string what;
  std::vector<void *> live{};
  int step = 0;
  bool ok = true;
  bool oom_allowed = false;
  std::string error{};  // the first failure

  std::ostream &fail() {
    ok = false;
    static std::ostringstream sink;
    sink.str("");
    return error.empty() ? err_ : sink;
  }
  std::ostringstream err_{};
  void flush() {
    if (error.empty() && !err_.str().empty()) error = err_.str();
  }

  bool check(const char *after) {
    step++;
    expseg_status st = expseg_check(a);
    if (st != EXPSEG_OK) fail() << "step " << step << " (" << after << "): " << expseg_last_error();
    flush();
    return ok;
  }
  void *malloc_(size_t size, expseg_stream s) {
    if (!ok) return nullptr;
    void *p = nullptr;
    expseg_status st = expseg_malloc(a, size, s, &p);
    if (st == EXPSEG_OK) {
      if (p == nullptr) fail() << "malloc returned OK and NULL";
      live.push_back(p);
    } else {
      if (st != injected && !(oom_allowed && st == EXPSEG_ERR_OUT_OF_MEMORY))
        fail() << "step " << step + 1 << ": malloc(" << size << ", stream " << s << ") -> "
               << expseg_status_name(st) << ": " << expseg_last_error();
      if (p != nullptr || expseg_last_error()[0] == '\0')
        fail() << "failed malloc left p=" << p << " or no message";
    }
    check("malloc");
    return p;
  }
  void free_(void *p) {
    if (!ok || p == nullptr) return;
    expseg_status st = expseg_free(a, p);
    if (st != EXPSEG_OK) fail() << "free -> " << expseg_status_name(st) << ": " << expseg_last_error();
    for (auto &q : live)
      if (q == p) q = nullptr;
    check("free");
  }
  void record(void *p, expseg_stream s) {
    if (!ok || p == nullptr) return;
    if (expseg_record_stream(a, p, s) != EXPSEG_OK) fail() << "record_stream: " << expseg_last_error();
    check("record_stream");
  }
  void empty() {
    if (!ok) return;
    if (expseg_empty_cache(a) != EXPSEG_OK) fail() << "empty_cache: " << expseg_last_error();
    check("empty_cache");
  }
  void configure(const char *c) {
    if (!ok) return;
    if (expseg_configure(a, c) != EXPSEG_OK) fail() << "configure " << c << ": " << expseg_last_error();
    check(c);
  }

  void run() {
    ASSERT_EQ(alloc_test_hold(a, 9, true), EXPSEG_OK);
    // the out-of-memory path with idle pages on a busy stream: under a 24 MiB cap, 16 MiB
    // freed on held stream 9 cannot move (stream_synchronize fails: held) -> OOM
    ASSERT_EQ(expseg_set_memory_fraction(a, 24.0 / 2048.0), EXPSEG_OK);
    free_(malloc_(16 * MiB, 9));
    oom_allowed = true;
    free_(malloc_(16 * MiB, 2));
    oom_allowed = false;
    ASSERT_EQ(expseg_set_memory_fraction(a, 1.0), EXPSEG_OK);
    void *p1 = malloc_(1000, 1);
    void *p2 = malloc_(3 * MiB, 1);
    void *p3 = malloc_(12 * MiB, 2);
    void *p4 = malloc_(700 * KiB, 2);
    record(p2, 9);  // held: p2 stays pending after its free
    record(p3, 1);  // completes at once
    free_(p1);
    free_(p2);
    free_(p3);
    void *p5 = malloc_(5 * MiB, 2);  // pages may move from stream 1's free memory
    void *p6 = malloc_(3 * MiB, 1);  // must not be p2 (pending)
    if (ok && p6 != nullptr && p6 == p2) fail() << "a block pending on a held stream was handed out again";
    ASSERT_EQ(alloc_test_hold(a, 9, false), EXPSEG_OK);
    void *p7 = malloc_(1000, 1);  // processes the completed event
    empty();
    configure("expandable_segments:False");
    void *c1 = malloc_(25 * MiB, 1);
    void *c2 = malloc_(1536 * KiB, 2);
    void *c3 = malloc_(200 * KiB, 1);
    free_(c1);
    record(c2, 3);
    ASSERT_EQ(alloc_test_hold(a, 3, true), EXPSEG_OK); // c2 stays pending after its free
    free_(c2);
    ASSERT_EQ(alloc_test_hold(a, 3, false), EXPSEG_OK);
    empty();  // synchronizes stream 3's event
    void *c4 = malloc_(2 * MiB, 1);
    empty();
    configure("expandable_segments:True");
    void *e1 = malloc_(40 * MiB, 3);
    free_(p4);
    free_(p5);
    free_(e1);
    void *e2 = malloc_(30 * MiB, 2);  // reuses stream 2 memory, and pages from stream 3
    free_(p6);
    free_(p7);
    free_(c3);
    free_(c4);
    free_(e2);
    empty();
  }
};

struct Counts {
  uint64_t seen[EXPSEG_VMM_CALL_COUNT] = {};
};

Counts baseline(const char *config) {
  Counts c;
  Stack st;
  st.open(config);
  if (::testing::Test::HasFatalFailure()) return c;
  Scenario s{st.a, EXPSEG_OK, std::string("no fault (") + config + ")"};
  s.run();
  EXPECT_TRUE(s.ok) << s.error;
  for (expseg_vmm_call k : kKinds) c.seen[k] = _expseg_fault_seen(st.fault, k);
  EXPECT_EQ(stat_of(st.a, "reserved_bytes.all.current"), 0);
  st.close("no fault");
  return c;
}

// One scenario with a fault rule; then faults stop and the allocator must serve again.
std::string run_with_fault(const char *config, expseg_vmm_call kind, uint64_t nth,
                           uint64_t count, expseg_status status) {
  std::string what = std::string(config) + ": " + _expseg_vmm_call_name(kind) + " #" +
                     std::to_string(nth) + (count > 1 ? "+" : "") + " fails with " +
                     expseg_status_name(status);
  Stack st;
  st.open(config);
  if (::testing::Test::HasFatalFailure()) return what + ": could not open";
  expseg_fault_rule_t rule = {kind, nth, count, status};
  _expseg_fault_set_rules(st.fault, &rule, 1);
  Scenario s{st.a, status, what};
  s.run();
  _expseg_fault_set_rules(st.fault, nullptr, 0);
  EXPECT_EQ(alloc_test_hold(st.a, 9, false), EXPSEG_OK);
  // faults over: free what is left, and every request is served again
  s.injected = EXPSEG_OK;
  std::vector<void *> left = s.live;
  for (void *p : left) s.free_(p);
  s.live.clear();
  void *x = s.malloc_(8 * MiB, 1), *y = s.malloc_(1000, 2), *z = s.malloc_(30 * MiB, 5);
  if (s.ok && (x == nullptr || y == nullptr || z == nullptr))
    s.fail() << "not served after the faults stopped: " << expseg_last_error();
  s.flush();
  s.free_(x);
  s.free_(y);
  s.free_(z);
  s.empty();
  int64_t v = 0;
  if (s.ok && expseg_stat(st.a, "reserved_bytes.all.current", &v) == EXPSEG_OK && v != 0)
    s.fail() << "after the faults stopped, free everything, empty_cache: reserved_bytes "
             << v << " (memory stranded)";
  if (s.ok && expseg_stat(st.a, "active.all.current", &v) == EXPSEG_OK && v != 0)
    s.fail() << "active.all.current " << v << " after everything was freed";
  s.flush();
  expseg_vmm_t *fault = st.fault, *sim = st.sim;
  _expseg_fault_set_rules(fault, nullptr, 0);
  expseg_destroy(st.a);
  char why[128];
  if (!vmm_test_is_idle(sim, why, sizeof why)) {
    s.fail() << "after destroy the sim driver still holds: " << why;
    s.flush();
  }
  _expseg_vmm_close(fault);
  return s.error.empty() ? std::string() : what + ": " + s.error;
}

class AllocFault : public ::testing::TestWithParam<const char *> {};

TEST_P(AllocFault, EveryCallFailsInTurn) {
  QuietLog quiet;  // failures are warned about; keep the output readable
  const char *config = GetParam();
  Counts c = baseline(config);
  ASSERT_FALSE(HasFailure());
  uint64_t total = 0;
  for (expseg_vmm_call k : kKinds) {
    std::printf("%s: %s x %llu\n", config, _expseg_vmm_call_name(k), (unsigned long long)c.seen[k]);
    total += c.seen[k];
  }
  // the scenario must reach every path we mean to break
  for (expseg_vmm_call k : {EXPSEG_VMM_CALL_reserve, EXPSEG_VMM_CALL_create, EXPSEG_VMM_CALL_map,
                            EXPSEG_VMM_CALL_set_access, EXPSEG_VMM_CALL_unmap,
                            EXPSEG_VMM_CALL_release, EXPSEG_VMM_CALL_unreserve,
                            EXPSEG_VMM_CALL_event_create, EXPSEG_VMM_CALL_event_record,
                            EXPSEG_VMM_CALL_event_query, EXPSEG_VMM_CALL_event_synchronize})
    EXPECT_GT(c.seen[k], 0u) << _expseg_vmm_call_name(k) << " never called by the scenario";
  // one failure report per call kind: how many runs failed, and the first one's message
  for (expseg_vmm_call k : kKinds) {
    int runs = 0, failed = 0;
    std::string first;
    for (uint64_t n = 1; n <= c.seen[k]; n++) {
      for (expseg_status status : {EXPSEG_ERR_OUT_OF_MEMORY, EXPSEG_ERR_DRIVER}) {
        for (uint64_t count : {(uint64_t)1, (uint64_t)1000000}) {
          std::string err = run_with_fault(config, k, n, count, status);
          runs++;
          if (!err.empty()) {
            failed++;
            if (first.empty()) first = err;
          }
        }
      }
    }
    EXPECT_EQ(failed, 0) << failed << " of " << runs << " runs failed; first: " << first;
  }
  std::printf("%s: %llu call positions tried\n", config, (unsigned long long)total);
}

INSTANTIATE_TEST_SUITE_P(Modes, AllocFault,
                         ::testing::Values("expandable_segments:True",
                                           "expandable_segments:True,page_cache_max_mb:0",
                                           "expandable_segments:False",
                                           "pytorch-model;expandable_segments:True"));

// A block used on a busy stream must not be handed out again even when no event can be
// recorded for it (the allocator then has to wait for the stream, and if it cannot, keep
// the block out of use).
TEST(AllocFaultSafety, BlockOfBusyStreamNotReusedWhenEventRecordFails) {
  QuietLog quiet;
  for (expseg_vmm_call kind : {EXPSEG_VMM_CALL_event_record, EXPSEG_VMM_CALL_event_create}) {
    SCOPED_TRACE(_expseg_vmm_call_name(kind));
    Stack st;
    st.open("");
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_EQ(alloc_test_hold(st.a, 9, true), EXPSEG_OK);
    void *p = nullptr, *q = nullptr;
    ASSERT_EQ(expseg_malloc(st.a, 4 * MiB, 1, &p), EXPSEG_OK);
    ASSERT_EQ(expseg_record_stream(st.a, p, 9), EXPSEG_OK);
    expseg_fault_rule_t rule = {kind, 1, 1000000, EXPSEG_ERR_DRIVER};
    _expseg_fault_set_rules(st.fault, &rule, 1);
    EXPECT_EQ(expseg_free(st.a, p), EXPSEG_OK);
    _expseg_fault_set_rules(st.fault, nullptr, 0);
    ASSERT_EQ(expseg_malloc(st.a, 4 * MiB, 1, &q), EXPSEG_OK);
    EXPECT_NE(q, p) << "the block is still in use on held stream 9 but was handed out again";
    EXPECT_EQ(expseg_check(st.a), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(alloc_test_hold(st.a, 9, false), EXPSEG_OK);
    EXPECT_EQ(expseg_free(st.a, q), EXPSEG_OK);
    EXPECT_EQ(expseg_empty_cache(st.a), EXPSEG_OK);
    EXPECT_EQ(stat_of(st.a, "reserved_bytes.all.current"), 0);
    st.close("busy stream");
  }
}

}  // namespace
