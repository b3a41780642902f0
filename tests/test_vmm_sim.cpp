// SPDX-License-Identifier: Apache-2.0
// sim and fault specifics: fake address space, scale and speed of the mapping table,
// fault injection rules and counter balance.
#include <gtest/gtest.h>

#include <string.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "vmm_support.h"
#include "error.h"

namespace {

#define ASSERT_OK(e) ASSERT_EQ(EXPSEG_OK, (e)) << expseg_last_error()
#define EXPECT_OK(e) EXPECT_EQ(EXPSEG_OK, (e)) << expseg_last_error()

struct Closer {
  expseg_vmm_t *v;
  ~Closer() { _expseg_vmm_close(v); }
};

TEST(VmmSim, AddressSpaceIsFakeBoundedAndReused) {
  expseg_vmm_t *v = nullptr;
  ASSERT_OK(_expseg_vmm_open("sim:granularity=2M,va=64M", 0, &v));
  Closer c{v};
  uintptr_t a = 0, b = 0, d = 0;
  ASSERT_OK(_expseg_vmm_reserve(v, 32u << 20, 0, &a));
  ASSERT_OK(_expseg_vmm_reserve(v, 32u << 20, 0, &b));
  EXPECT_GE(a, uintptr_t(1) << 48); // never a real user-space address
  EXPECT_EQ(EXPSEG_ERR_OUT_OF_MEMORY, _expseg_vmm_reserve(v, 2u << 20, 0, &d));
  EXPECT_NE(nullptr, strstr(expseg_last_error(), "address space exhausted")) << expseg_last_error();
  ASSERT_OK(_expseg_vmm_unreserve(v, a, 32u << 20));
  ASSERT_OK(_expseg_vmm_unreserve(v, b, 32u << 20));
  // Freed extents coalesce: the whole space fits again, aligned to 64M.
  ASSERT_OK(_expseg_vmm_reserve(v, 64u << 20, 64u << 20, &d));
  EXPECT_EQ(0u, d % (64u << 20));
  ASSERT_OK(_expseg_vmm_unreserve(v, d, 64u << 20));
  // Holes in the middle are reused.
  uintptr_t r[4];
  for (auto &x : r) ASSERT_OK(_expseg_vmm_reserve(v, 16u << 20, 0, &x));
  ASSERT_OK(_expseg_vmm_unreserve(v, r[1], 16u << 20));
  ASSERT_OK(_expseg_vmm_unreserve(v, r[2], 16u << 20));
  ASSERT_OK(_expseg_vmm_reserve(v, 32u << 20, 0, &d));
  EXPECT_EQ(r[1], d);
  ASSERT_OK(_expseg_vmm_unreserve(v, d, 32u << 20));
  ASSERT_OK(_expseg_vmm_unreserve(v, r[0], 16u << 20));
  ASSERT_OK(_expseg_vmm_unreserve(v, r[3], 16u << 20));
  EXPECT_TRUE(vmm_test_is_idle(v, nullptr, 0));
}

// Tens of thousands of chunks mapped into one reservation, unmapped in a random order and
// remapped: every call must stay cheap (O(log n)), and the bookkeeping exact.
TEST(VmmSim, ManyMappingsStayCheap) {
  expseg_vmm_t *v = nullptr;
  ASSERT_OK(_expseg_vmm_open("sim:capacity=1T,granularity=2M", 0, &v));
  Closer c{v};
  const size_t g = v->granularity, n = 40000;
  uintptr_t va = 0;
  ASSERT_OK(_expseg_vmm_reserve(v, n * g, 0, &va));
  std::vector<expseg_vmm_handle> hs(n);
  for (auto &h : hs) ASSERT_OK(_expseg_vmm_create(v, g, &h));
  const unsigned seed = 12345;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; i++) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  auto t0 = std::chrono::steady_clock::now();
  for (size_t i : order) ASSERT_OK(_expseg_vmm_map(v, va + i * g, g, hs[i], 0));
  ASSERT_OK(_expseg_vmm_set_access(v, va, n * g));
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t i : order) {
    ASSERT_OK(_expseg_vmm_unmap(v, va + i * g, g));
    ASSERT_OK(_expseg_vmm_map(v, va + i * g, g, hs[i], 0));
  }
  auto t1 = std::chrono::steady_clock::now();
  double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / (3.0 * n);
  std::printf("sim map/unmap with %zu live mappings: %.0f ns per call\n", n, ns);
  EXPECT_LT(ns, 20000.0); // generous: sanitizer builds are slow; release is ~0.2 us
  EXPECT_EQ(int64_t(n * g), vmm_test_gauges(v).mapped_bytes);
  // One unmap of the whole range: a union of 40000 mappings.
  ASSERT_OK(_expseg_vmm_unmap(v, va, n * g));
  EXPECT_EQ(0, vmm_test_gauges(v).mapped_bytes);
  for (auto h : hs) ASSERT_OK(_expseg_vmm_release(v, h, g));
  ASSERT_OK(_expseg_vmm_unreserve(v, va, n * g));
  EXPECT_TRUE(vmm_test_is_idle(v, nullptr, 0));
}

// Randomised against a simple model: each granule mapped or not; calls that the model says
// are legal must succeed, the others must be refused with INVALID_ARGUMENT.
TEST(VmmSim, RandomOperationsMatchAModel) {
  expseg_vmm_t *v = nullptr;
  ASSERT_OK(_expseg_vmm_open("sim:capacity=1G,granularity=64K", 0, &v));
  Closer c{v};
  const size_t g = v->granularity, slots = 64;
  uintptr_t va = 0;
  ASSERT_OK(_expseg_vmm_reserve(v, slots * g, 0, &va));
  struct M {
    bool start = false; // a mapping starts here
    size_t len = 0;     // its length in granules
    expseg_vmm_handle h = 0;
  };
  std::vector<M> m(slots);
  std::vector<int> owner(slots, -1); // slot of the mapping covering each granule
  const unsigned seed = 777;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (int step = 0; step < 20000; step++) {
    size_t at = rng() % slots, len = 1 + rng() % 4;
    if (at + len > slots) len = slots - at;
    if (rng() % 2) {
      bool legal = true;
      for (size_t i = at; i < at + len; i++) legal &= owner[i] < 0;
      expseg_vmm_handle h = 0;
      ASSERT_OK(_expseg_vmm_create(v, len * g, &h));
      expseg_status s = _expseg_vmm_map(v, va + at * g, len * g, h, 0);
      ASSERT_EQ(legal ? EXPSEG_OK : EXPSEG_ERR_INVALID_ARGUMENT, s) << step;
      if (legal) {
        m[at] = {true, len, h};
        for (size_t i = at; i < at + len; i++) owner[i] = int(at);
      } else {
        ASSERT_OK(_expseg_vmm_release(v, h, len * g));
      }
    } else {
      // legal iff [at, at+len) is exactly whole, contiguous mappings
      bool legal = owner[at] == int(at);
      size_t i = at;
      while (legal && i < at + len) {
        if (owner[i] != int(i)) legal = false;
        else i += m[i].len;
      }
      legal = legal && i == at + len;
      expseg_status s = _expseg_vmm_unmap(v, va + at * g, len * g);
      ASSERT_EQ(legal ? EXPSEG_OK : EXPSEG_ERR_INVALID_ARGUMENT, s) << step;
      if (legal) {
        for (size_t j = at; j < at + len; j += m[j].len) {
          ASSERT_OK(_expseg_vmm_release(v, m[j].h, m[j].len * g));
          for (size_t k = j; k < j + m[j].len; k++) owner[k] = -1;
          m[j].start = false;
        }
      }
    }
  }
  for (size_t j = 0; j < slots; j++)
    if (owner[j] == int(j)) {
      ASSERT_OK(_expseg_vmm_unmap(v, va + j * g, m[j].len * g));
      ASSERT_OK(_expseg_vmm_release(v, m[j].h, m[j].len * g));
    }
  ASSERT_OK(_expseg_vmm_unreserve(v, va, slots * g));
  char why[64];
  EXPECT_TRUE(vmm_test_is_idle(v, why, sizeof why)) << why;
}

// ---- the fault wrapper ----

TEST(VmmFault, NthCallFailsWithoutReachingTheInnerBackend) {
  expseg_vmm_t *inner = nullptr, *f = nullptr;
  ASSERT_OK(_expseg_vmm_open("sim:capacity=1G,granularity=2M", 0, &inner));
  ASSERT_OK(_expseg_fault_new(inner, &f));
  Closer c{f};
  EXPECT_EQ(inner, _expseg_fault_inner(f));
  EXPECT_EQ(nullptr, _expseg_fault_inner(inner));
  EXPECT_STREQ("fault", f->ops->name);
  const size_t g = f->granularity;
  const expseg_fault_rule_t rules[] = {
      {EXPSEG_VMM_CALL_create, 2, 2, EXPSEG_ERR_OUT_OF_MEMORY},
      {EXPSEG_VMM_CALL_map, 1, 0, EXPSEG_ERR_DRIVER},
  };
  _expseg_fault_set_rules(f, rules, 2);
  expseg_vmm_handle h[4] = {};
  EXPECT_OK(_expseg_vmm_create(f, g, &h[0]));
  EXPECT_EQ(EXPSEG_ERR_OUT_OF_MEMORY, _expseg_vmm_create(f, g, &h[1]));
  EXPECT_NE(nullptr, strstr(expseg_last_error(), "injected EXPSEG_ERR_OUT_OF_MEMORY on create call #2"))
      << expseg_last_error();
  EXPECT_EQ(EXPSEG_ERR_OUT_OF_MEMORY, _expseg_vmm_create(f, g, &h[2]));
  EXPECT_OK(_expseg_vmm_create(f, g, &h[3]));
  EXPECT_EQ(4u, _expseg_fault_seen(f, EXPSEG_VMM_CALL_create));
  EXPECT_EQ(4u, vmm_test_calls(f, EXPSEG_VMM_CALL_create));
  EXPECT_EQ(2u, vmm_test_failures(f, EXPSEG_VMM_CALL_create));
  EXPECT_EQ(2u, vmm_test_calls(inner, EXPSEG_VMM_CALL_create)); // never saw the failures
  EXPECT_EQ(0u, vmm_test_failures(inner, EXPSEG_VMM_CALL_create));
  size_t fr = 0, tot = 0;
  _expseg_vmm_mem_info(f, &fr, &tot);
  EXPECT_EQ(tot - 2 * g, fr); // only two chunks exist in the inner backend

  uintptr_t va = 0;
  ASSERT_OK(_expseg_vmm_reserve(f, 4 * g, 0, &va));
  EXPECT_EQ(EXPSEG_ERR_DRIVER, _expseg_vmm_map(f, va, g, h[0], 0));
  EXPECT_EQ(0, vmm_test_gauges(f).mapped_bytes);
  ASSERT_OK(_expseg_vmm_map(f, va, g, h[0], 0)); // the 2nd map is not in a rule
  // Gauges agree between outer and inner.
  vmm_gauges_t o = vmm_test_gauges(f), i = vmm_test_gauges(inner);
  EXPECT_EQ(0, memcmp(&o, &i, sizeof o));
  EXPECT_EQ(int64_t(g), o.mapped_bytes);
  EXPECT_EQ(2, o.live_chunks);

  // Rules are replaced at run time; an empty set passes everything.
  const expseg_fault_rule_t r2[] = {{EXPSEG_VMM_CALL_unmap, 1, 1, EXPSEG_ERR_DRIVER}};
  _expseg_fault_set_rules(f, r2, 1);
  EXPECT_EQ(EXPSEG_ERR_DRIVER, _expseg_vmm_unmap(f, va, g));
  _expseg_fault_set_rules(f, nullptr, 0);
  ASSERT_OK(_expseg_vmm_unmap(f, va, g));
  ASSERT_OK(_expseg_vmm_release(f, h[0], g));
  ASSERT_OK(_expseg_vmm_release(f, h[3], g));
  ASSERT_OK(_expseg_vmm_unreserve(f, va, 4 * g));
  for (int k = 0; k < EXPSEG_VMM_CALL_COUNT; k++) {
    auto kind = expseg_vmm_call(k);
    uint64_t injected = vmm_test_calls(f, kind) - vmm_test_calls(inner, kind);
    EXPECT_EQ(_expseg_fault_seen(f, kind), vmm_test_calls(f, kind)) << _expseg_vmm_call_name(kind);
    EXPECT_EQ(vmm_test_failures(f, kind) - vmm_test_failures(inner, kind), injected)
        << _expseg_vmm_call_name(kind);
  }
  o = vmm_test_gauges(f);
  i = vmm_test_gauges(inner);
  EXPECT_EQ(0, memcmp(&o, &i, sizeof o));
  EXPECT_TRUE(vmm_test_is_idle(f, nullptr, 0));
}

TEST(VmmFault, HoldStreamForwardsAndEventsCanFail) {
  expseg_vmm_t *inner = nullptr, *f = nullptr;
  ASSERT_OK(_expseg_vmm_open("host:capacity=16M,granularity=64K", 0, &inner));
  ASSERT_OK(_expseg_fault_new(inner, &f));
  Closer c{f};
  expseg_vmm_event e = 0;
  ASSERT_OK(_expseg_vmm_event_create(f, &e));
  ASSERT_OK(_expseg_vmm_hold_stream(f, 5, true));
  ASSERT_OK(_expseg_vmm_event_record(f, e, 5));
  bool done = true;
  ASSERT_OK(_expseg_vmm_event_query(f, e, &done));
  EXPECT_FALSE(done);
  const expseg_fault_rule_t r[] = {{EXPSEG_VMM_CALL_event_query, 2, 1, EXPSEG_ERR_DRIVER}};
  _expseg_fault_set_rules(f, r, 1);
  EXPECT_EQ(EXPSEG_ERR_DRIVER, _expseg_vmm_event_query(f, e, &done));
  ASSERT_OK(_expseg_vmm_hold_stream(f, 5, false));
  ASSERT_OK(_expseg_vmm_event_query(f, e, &done));
  EXPECT_TRUE(done);
  ASSERT_OK(_expseg_vmm_event_destroy(f, e));
  EXPECT_EQ(0, vmm_test_gauges(inner).live_events);
}

} // namespace
