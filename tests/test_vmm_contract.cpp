// SPDX-License-Identifier: Apache-2.0
// The driver contract (vmm/vmm.h), run against every backend: host, sim, and the fault
// wrapper (with no rules) over each. test_gpu_vmm.cpp includes this file with
// EXPSEG_VMM_CONTRACT_GPU defined to run the same suite against cuda; there the tests read
// and write device memory through the data-check hook (copy_in / copy_out), and the ones that
// need a configured capacity or a forked child run only against the CUDA driver double
// (tests/cuda_double/cudadouble.h, which this test may include: it is a test double).
#include <gtest/gtest.h>

#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "vmm_support.h"
#include "error.h"
#ifdef EXPSEG_VMM_CONTRACT_GPU
#include "cudadouble.h"
#endif

namespace {

struct Backend {
  const char *label;
  const char *spec;
  bool fault; // wrap in the fault driver (no rules)
};

void PrintTo(const Backend &b, std::ostream *os) { *os << b.label; }

#define ASSERT_OK(e) ASSERT_EQ(EXPSEG_OK, (e)) << expseg_last_error()
#define EXPECT_OK(e) EXPECT_EQ(EXPSEG_OK, (e)) << expseg_last_error()
#define EXPECT_INVALID(e)                                          \
  do {                                                             \
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, (e)) << expseg_last_error(); \
    EXPECT_STRNE("", expseg_last_error());                         \
  } while (0)

class VmmContract : public ::testing::TestWithParam<Backend> {
protected:
  expseg_vmm_t *v = nullptr;
  size_t g = 0;
  std::string base; // "host", "sim", "cuda"
  // Set when a test reconfigured the CUDA driver double: TearDown puts this spec back.
  bool restore_double = false;
  std::string double_spec;

  void SetUp() override {
#ifdef EXPSEG_VMM_CONTRACT_GPU
    if (!_expseg_cuda_usable(0)) {
      expseg_vmm_t *probe = nullptr;
      expseg_status s = _expseg_cuda_new(0, &probe);
      EXPECT_NE(EXPSEG_OK, s);
      EXPECT_NE(EXPSEG_ERR_INVALID_ARGUMENT, s);
      GTEST_SKIP() << "no usable CUDA device: " << expseg_last_error();
    }
#endif
    Open();
  }
  void Open() {
    ASSERT_OK(_expseg_vmm_open(GetParam().spec, 0, &v));
    if (GetParam().fault) {
      expseg_vmm_t *f = nullptr;
      ASSERT_OK(_expseg_fault_new(v, &f));
      v = f;
    }
    g = v->granularity;
    ASSERT_GT(g, 0u);
    base = GetParam().fault ? _expseg_fault_inner(v)->ops->name : v->ops->name;
  }
  void TearDown() override {
    if (v) {
      char why[128];
      EXPECT_TRUE(vmm_test_is_idle(v, why, sizeof why)) << why;
      if (GetParam().fault) {
        EXPECT_TRUE(vmm_test_is_idle(_expseg_fault_inner(v), why, sizeof why)) << "inner " << why;
      }
      _expseg_vmm_close(v);
      v = nullptr;
    }
#ifdef EXPSEG_VMM_CONTRACT_GPU
    cudadouble_api api;
    if (restore_double && cudadouble_load(&api)) {
      EXPECT_EQ(0, api.configure(double_spec.c_str())) << api.last_message();
    }
#endif
  }
  // Writes / reads device memory through the data-check hook (host and cuda have one).
  void Put(uintptr_t dst, const void *src, size_t n) { ASSERT_OK(_expseg_vmm_copy_in(v, dst, src, n)); }
  void Get(void *dst, uintptr_t src, size_t n) { ASSERT_OK(_expseg_vmm_copy_out(v, dst, src, n)); }
  bool is_host() const { return base == "host"; }
  bool is_cuda() const { return base == "cuda"; }
  bool models_streams() const { return base != "cuda"; }
  // The backend's own bookkeeping enforces map/unmap/release rules (host, sim via the ledger).
  bool has_ledger() const { return base != "cuda"; }
  uint64_t calls(expseg_vmm_call c) { return vmm_test_calls(v, c); }
  uint64_t failures(expseg_vmm_call c) { return vmm_test_failures(v, c); }
};

TEST_P(VmmContract, MapUnmapRoundTrip) {
  uintptr_t va = 0;
  ASSERT_OK(_expseg_vmm_reserve(v, 8 * g, 0, &va));
  EXPECT_NE(0u, va);
  EXPECT_EQ(0u, va % g);
  expseg_vmm_handle a = 0, b = 0;
  ASSERT_OK(_expseg_vmm_create(v, 2 * g, &a));
  ASSERT_OK(_expseg_vmm_create(v, 2 * g, &b));
  EXPECT_NE(a, b);
  EXPECT_NE(0u, a);
  ASSERT_OK(_expseg_vmm_map(v, va, 2 * g, a, 0));
  ASSERT_OK(_expseg_vmm_map(v, va + 2 * g, 2 * g, b, 0));
  ASSERT_OK(_expseg_vmm_set_access(v, va, 4 * g)); // one call for the contiguous range
  if (is_host()) {
    memset(reinterpret_cast<void *>(va), 0xab, 4 * g);
    EXPECT_EQ(0xab, reinterpret_cast<unsigned char *>(va)[4 * g - 1]);
  }
  EXPECT_EQ(int64_t(4 * g), vmm_test_gauges(v).mapped_bytes);
  EXPECT_EQ(2, vmm_test_gauges(v).live_chunks);
  EXPECT_EQ(int64_t(4 * g), vmm_test_gauges(v).live_chunk_bytes);
  EXPECT_EQ(int64_t(8 * g), vmm_test_gauges(v).reserved_va_bytes);
  ASSERT_OK(_expseg_vmm_unmap(v, va, 4 * g)); // a union of two whole mappings
  EXPECT_EQ(0, vmm_test_gauges(v).mapped_bytes);
  // Remap a in the other slot: the reservation survived the unmap.
  ASSERT_OK(_expseg_vmm_map(v, va + 6 * g, 2 * g, a, 0));
  ASSERT_OK(_expseg_vmm_set_access(v, va + 6 * g, 2 * g));
  ASSERT_OK(_expseg_vmm_unmap(v, va + 6 * g, 2 * g));
  ASSERT_OK(_expseg_vmm_release(v, a, 2 * g));
  ASSERT_OK(_expseg_vmm_release(v, b, 2 * g));
  ASSERT_OK(_expseg_vmm_unreserve(v, va, 8 * g));
  EXPECT_EQ(int64_t(4 * g), vmm_test_gauges(v).created_bytes);
}

TEST_P(VmmContract, ReserveHonoursAlignment) {
  uintptr_t a = 0, b = 0;
  size_t align = 16 * g;
  ASSERT_OK(_expseg_vmm_reserve(v, g, align, &a));
  ASSERT_OK(_expseg_vmm_reserve(v, 3 * g, align, &b));
  EXPECT_EQ(0u, a % align);
  EXPECT_EQ(0u, b % align);
  EXPECT_TRUE(a + g <= b || b + 3 * g <= a) << "reservations overlap";
  EXPECT_OK(_expseg_vmm_unreserve(v, a, g));
  EXPECT_OK(_expseg_vmm_unreserve(v, b, 3 * g));
}

TEST_P(VmmContract, DataPersistsAcrossRemap) {
  if (base == "sim") GTEST_SKIP() << "sim keeps no bytes (copy_in / copy_out are unsupported)";
  // Bytes go in and out through the data-check hook: memcpy on host, cuMemcpyHtoD / DtoH on
  // cuda. Each 4 KiB page starts with its number.
  std::vector<unsigned char> in(2 * g, 0), out(2 * g, 0);
  for (size_t i = 0; i < 2 * g; i += 4096) in[i] = (unsigned char)(i / 4096 + 1);
  uintptr_t va = 0;
  ASSERT_OK(_expseg_vmm_reserve(v, 4 * g, 0, &va));
  expseg_vmm_handle h = 0;
  ASSERT_OK(_expseg_vmm_create(v, 2 * g, &h));
  ASSERT_OK(_expseg_vmm_map(v, va, 2 * g, h, 0));
  ASSERT_OK(_expseg_vmm_set_access(v, va, 2 * g));
  Put(va, in.data(), in.size());
  ASSERT_OK(_expseg_vmm_unmap(v, va, 2 * g));
  ASSERT_OK(_expseg_vmm_map(v, va + 2 * g, 2 * g, h, 0));
  ASSERT_OK(_expseg_vmm_set_access(v, va + 2 * g, 2 * g));
  Get(out.data(), va + 2 * g, out.size());
  // against the pattern, not `in`: a copy run backwards would overwrite both alike
  for (size_t i = 0; i < 2 * g; i += 4096) ASSERT_EQ((unsigned char)(i / 4096 + 1), out[i]) << i;
  ASSERT_OK(_expseg_vmm_unmap(v, va + 2 * g, 2 * g));
  if (!is_cuda()) { // cuda maps whole handles only (offset 0)
    // Mapping a part of the chunk (offset g) shows its second half.
    ASSERT_OK(_expseg_vmm_map(v, va, g, h, g));
    ASSERT_OK(_expseg_vmm_set_access(v, va, g));
    unsigned char first = 0;
    Get(&first, va, 1);
    EXPECT_EQ((unsigned char)(g / 4096 + 1), first);
    ASSERT_OK(_expseg_vmm_unmap(v, va, g));
  }
  ASSERT_OK(_expseg_vmm_release(v, h, 2 * g));
  ASSERT_OK(_expseg_vmm_unreserve(v, va, 4 * g));
}

TEST_P(VmmContract, CopyInOutMovesBytesAcrossRemapAndRefusesBadRanges) {
  std::vector<unsigned char> in(2 * g), out(2 * g, 0);
  for (size_t i = 0; i < in.size(); i++) in[i] = (unsigned char)(i * 131 + i / 4096 + 1);
  const std::vector<unsigned char> want = in; // copy_in must leave its source alone
  uintptr_t va = 0;
  ASSERT_OK(_expseg_vmm_reserve(v, 4 * g, 0, &va));
  expseg_vmm_handle h = 0;
  ASSERT_OK(_expseg_vmm_create(v, 2 * g, &h));
  ASSERT_OK(_expseg_vmm_map(v, va, 2 * g, h, 0));
  if (base == "host") { // mapped, but the device was not given access yet
    EXPECT_INVALID(_expseg_vmm_copy_in(v, va, in.data(), 16));
  }
  ASSERT_OK(_expseg_vmm_set_access(v, va, 2 * g));
  EXPECT_INVALID(_expseg_vmm_copy_in(v, va, in.data(), 0));
  EXPECT_INVALID(_expseg_vmm_copy_out(v, nullptr, va, 16));
  if (base == "sim") {
    EXPECT_EQ(EXPSEG_ERR_UNSUPPORTED, _expseg_vmm_copy_in(v, va, in.data(), 16));
    EXPECT_NE(std::string::npos, std::string(expseg_last_error()).find("copy_in"));
  } else {
    ASSERT_OK(_expseg_vmm_copy_in(v, va, in.data(), in.size()));
    ASSERT_OK(_expseg_vmm_copy_out(v, out.data(), va + g, g)); // a part, at an offset
    EXPECT_EQ(0, memcmp(out.data(), want.data() + g, g));
    EXPECT_TRUE(in == want) << "copy_in changed its source";
    if (has_ledger()) { // half of the range is past the mapping
      EXPECT_INVALID(_expseg_vmm_copy_out(v, out.data(), va + g, 2 * g));
    }
    // The bytes live in the chunk: they follow it to another address.
    ASSERT_OK(_expseg_vmm_unmap(v, va, 2 * g));
    ASSERT_OK(_expseg_vmm_map(v, va + 2 * g, 2 * g, h, 0));
    ASSERT_OK(_expseg_vmm_set_access(v, va + 2 * g, 2 * g));
    std::fill(out.begin(), out.end(), 0);
    ASSERT_OK(_expseg_vmm_copy_out(v, out.data(), va + 2 * g, out.size()));
    EXPECT_EQ(0, memcmp(out.data(), want.data(), want.size()));
    ASSERT_OK(_expseg_vmm_unmap(v, va + 2 * g, 2 * g));
  }
  if (base == "sim") {
    ASSERT_OK(_expseg_vmm_unmap(v, va, 2 * g));
  }
  ASSERT_OK(_expseg_vmm_release(v, h, 2 * g));
  ASSERT_OK(_expseg_vmm_unreserve(v, va, 4 * g));
}

TEST_P(VmmContract, CapacityExhaustionIsOutOfMemoryAndLeaksNothing) {
  if (is_cuda()) {
#ifdef EXPSEG_VMM_CONTRACT_GPU
    // Against the CUDA driver double, give the device 64 MiB (TearDown restores the
    // configuration); the double takes a new one only while nothing is live, so reopen.
    cudadouble_api api;
    if (!cudadouble_load(&api)) GTEST_SKIP() << "filling a real GPU is test_gpu_vmm's job";
    const char *env = getenv("EXPSEG_CUDA_DOUBLE");
    double_spec = env ? env : "";
    _expseg_vmm_close(v);
    v = nullptr;
    std::string small = double_spec.empty() ? "capacity=64M" : double_spec + ",capacity=64M";
    ASSERT_EQ(0, api.configure(small.c_str())) << api.last_message();
    restore_double = true;
    Open();
    if (HasFatalFailure()) return;
#endif
  }
  size_t fr = 0, tot = 0;
  _expseg_vmm_mem_info(v, &fr, &tot);
  ASSERT_EQ(64u << 20, tot); // the specs below give capacity=64M
  EXPECT_EQ(tot, fr);
  size_t chunk = 8u << 20;
  std::vector<expseg_vmm_handle> hs;
  expseg_vmm_handle h = 0;
  for (int i = 0; i < 8; i++) {
    ASSERT_OK(_expseg_vmm_create(v, chunk, &h));
    hs.push_back(h);
    _expseg_vmm_mem_info(v, &fr, &tot);
    EXPECT_EQ(tot - (i + 1) * chunk, fr);
  }
  h = 0;
  EXPECT_EQ(EXPSEG_ERR_OUT_OF_MEMORY, _expseg_vmm_create(v, g, &h));
  EXPECT_NE(nullptr, strstr(expseg_last_error(),
                            is_cuda() ? "cuMemCreate" : "capacity 64.00 MiB, 64.00 MiB in use"))
      << expseg_last_error();
  EXPECT_EQ(1u, failures(EXPSEG_VMM_CALL_create));
  EXPECT_EQ(8, vmm_test_gauges(v).live_chunks);
  for (expseg_vmm_handle x : hs) ASSERT_OK(_expseg_vmm_release(v, x, chunk));
  _expseg_vmm_mem_info(v, &fr, &tot);
  EXPECT_EQ(tot, fr);
  ASSERT_OK(_expseg_vmm_create(v, 64u << 20, &h)); // all of it fits again
  ASSERT_OK(_expseg_vmm_release(v, h, 64u << 20));
}

TEST_P(VmmContract, WrapperRefusesBadArgumentsWithoutCallingTheBackend) {
  uintptr_t va = 0;
  ASSERT_OK(_expseg_vmm_reserve(v, 4 * g, 0, &va));
  expseg_vmm_handle h = 0;
  ASSERT_OK(_expseg_vmm_create(v, g, &h));
  uint64_t seen_map = GetParam().fault ? _expseg_fault_seen(v, EXPSEG_VMM_CALL_map) : 0;

  EXPECT_INVALID(_expseg_vmm_reserve(v, 0, 0, &va));
  EXPECT_INVALID(_expseg_vmm_reserve(v, g + 1, 0, &va));
  EXPECT_INVALID(_expseg_vmm_reserve(v, g, 3 * g, &va)); // align not a power of two
  EXPECT_INVALID(_expseg_vmm_reserve(v, g, 0, nullptr));
  EXPECT_INVALID(_expseg_vmm_create(v, 0, &h));
  EXPECT_INVALID(_expseg_vmm_create(v, g / 2, &h));
  EXPECT_INVALID(_expseg_vmm_create(v, g, nullptr));
  EXPECT_INVALID(_expseg_vmm_map(v, va + 1, g, h, 0));
  EXPECT_NE(nullptr, strstr(expseg_last_error(), "granularity")) << expseg_last_error();
  EXPECT_NE(nullptr, strstr(expseg_last_error(), "map(addr=0x")) << expseg_last_error();
  EXPECT_INVALID(_expseg_vmm_map(v, va, g, h, 1));
  EXPECT_INVALID(_expseg_vmm_map(v, va, 0, h, 0));
  EXPECT_INVALID(_expseg_vmm_map(v, va + 3 * g, 2 * g, h, 0)); // runs off the reservation
  EXPECT_NE(nullptr, strstr(expseg_last_error(), "reservation")) << expseg_last_error();
  EXPECT_INVALID(_expseg_vmm_map(v, va + 64 * g, g, h, 0)); // outside any reservation
  EXPECT_INVALID(_expseg_vmm_unmap(v, va - g, g));
  EXPECT_INVALID(_expseg_vmm_set_access(v, va, g + 7));
  EXPECT_INVALID(_expseg_vmm_unreserve(v, va, 2 * g)); // not the whole reservation
  EXPECT_INVALID(_expseg_vmm_unreserve(v, va + g, 3 * g));
  EXPECT_INVALID(_expseg_vmm_release(v, 0, g));
  EXPECT_INVALID(_expseg_vmm_event_create(v, nullptr));
  EXPECT_INVALID(_expseg_vmm_event_record(v, 0, 0));
  bool done;
  EXPECT_INVALID(_expseg_vmm_event_query(v, 0, &done));
  size_t off = 0;
  EXPECT_INVALID(_expseg_vmm_export_fd(v, h, nullptr, &off));
  int no_fd = -1;
  EXPECT_INVALID(_expseg_vmm_export_fd(v, h, &no_fd, nullptr));
  EXPECT_INVALID(_expseg_vmm_import_fd(v, -1, 0, g, &h));
  EXPECT_INVALID(_expseg_vmm_import_fd(v, 0, SIZE_MAX - g + 1, g, &h)); // offset + size wraps

  EXPECT_EQ(5u, failures(EXPSEG_VMM_CALL_map));
  EXPECT_EQ(5u, calls(EXPSEG_VMM_CALL_map));
  EXPECT_EQ(4u, failures(EXPSEG_VMM_CALL_reserve));
  EXPECT_EQ(2u, failures(EXPSEG_VMM_CALL_unreserve));
  if (GetParam().fault) { // refused calls never reached the backend
    EXPECT_EQ(seen_map, _expseg_fault_seen(v, EXPSEG_VMM_CALL_map));
    EXPECT_EQ(0u, vmm_test_calls(_expseg_fault_inner(v), EXPSEG_VMM_CALL_map));
  }
  EXPECT_EQ(0, vmm_test_gauges(v).mapped_bytes);
  ASSERT_OK(_expseg_vmm_release(v, h, g));
  ASSERT_OK(_expseg_vmm_unreserve(v, va, 4 * g));
}

TEST_P(VmmContract, BackendRefusesMappingTableViolations) {
  if (!has_ledger()) GTEST_SKIP() << "cuda leaves these to the driver";
  uintptr_t va = 0, va2 = 0;
  ASSERT_OK(_expseg_vmm_reserve(v, 8 * g, 0, &va));
  ASSERT_OK(_expseg_vmm_reserve(v, 8 * g, 0, &va2));
  expseg_vmm_handle a = 0, b = 0;
  ASSERT_OK(_expseg_vmm_create(v, 2 * g, &a));
  ASSERT_OK(_expseg_vmm_create(v, 2 * g, &b));
  ASSERT_OK(_expseg_vmm_map(v, va + 2 * g, 2 * g, a, 0));

  // double map of the same granules, and partial overlaps on either side
  EXPECT_INVALID(_expseg_vmm_map(v, va + 2 * g, 2 * g, b, 0));
  EXPECT_NE(nullptr, strstr(expseg_last_error(), "overlaps")) << expseg_last_error();
  EXPECT_INVALID(_expseg_vmm_map(v, va + g, 2 * g, b, 0));
  EXPECT_INVALID(_expseg_vmm_map(v, va + 3 * g, 2 * g, b, 0));
  // a mapping past the end of the chunk
  EXPECT_INVALID(_expseg_vmm_map(v, va + 4 * g, 2 * g, b, g));
  // a mapping spanning two reservations is refused by the wrapper
  // partial unmap, unmap of unmapped granules, unmap straddling a mapping's end
  EXPECT_INVALID(_expseg_vmm_unmap(v, va + 2 * g, g));
  EXPECT_NE(nullptr, strstr(expseg_last_error(), "whole")) << expseg_last_error();
  EXPECT_INVALID(_expseg_vmm_unmap(v, va + 3 * g, g));
  EXPECT_INVALID(_expseg_vmm_unmap(v, va, g));
  EXPECT_NE(nullptr, strstr(expseg_last_error(), "not mapped")) << expseg_last_error();
  EXPECT_INVALID(_expseg_vmm_unmap(v, va + 2 * g, 3 * g));
  // set_access on a range with an unmapped granule
  EXPECT_INVALID(_expseg_vmm_set_access(v, va + 2 * g, 3 * g));
  EXPECT_INVALID(_expseg_vmm_set_access(v, va2, g));
  // release of a mapped chunk, unreserve with mappings
  EXPECT_INVALID(_expseg_vmm_release(v, a, 2 * g));
  EXPECT_NE(nullptr, strstr(expseg_last_error(), "mapped")) << expseg_last_error();
  EXPECT_INVALID(_expseg_vmm_unreserve(v, va, 8 * g));
  // unknown and stale handles
  EXPECT_INVALID(_expseg_vmm_map(v, va2, g, a ^ 0x5555000000000000ull, 0));
  EXPECT_EQ(0, vmm_test_gauges(v).live_chunks - 2);
  EXPECT_EQ(int64_t(2 * g), vmm_test_gauges(v).mapped_bytes);

  // state unchanged by the refusals: the legal sequence still works
  ASSERT_OK(_expseg_vmm_set_access(v, va + 2 * g, 2 * g));
  ASSERT_OK(_expseg_vmm_map(v, va + 4 * g, 2 * g, b, 0));
  ASSERT_OK(_expseg_vmm_set_access(v, va + 3 * g, 2 * g)); // across two mappings, partial
  ASSERT_OK(_expseg_vmm_unmap(v, va + 2 * g, 4 * g));
  ASSERT_OK(_expseg_vmm_release(v, a, 2 * g));
  EXPECT_INVALID(_expseg_vmm_map(v, va, 2 * g, a, 0)); // stale handle
  EXPECT_NE(nullptr, strstr(expseg_last_error(), "not a live chunk")) << expseg_last_error();
  EXPECT_INVALID(_expseg_vmm_release(v, a, 2 * g));
  ASSERT_OK(_expseg_vmm_release(v, b, 2 * g));
  ASSERT_OK(_expseg_vmm_unreserve(v, va, 8 * g));
  ASSERT_OK(_expseg_vmm_unreserve(v, va2, 8 * g));
  EXPECT_INVALID(_expseg_vmm_unreserve(v, va2, 8 * g)); // twice
}

TEST_P(VmmContract, HeldStreamKeepsEventsIncompleteUntilReleased) {
  expseg_vmm_event e1 = 0, e2 = 0, e3 = 0;
  ASSERT_OK(_expseg_vmm_event_create(v, &e1));
  ASSERT_OK(_expseg_vmm_event_create(v, &e2));
  ASSERT_OK(_expseg_vmm_event_create(v, &e3));
  EXPECT_EQ(3, vmm_test_gauges(v).live_events);
  EXPECT_NE(0u, e1);
  bool done = false;
  ASSERT_OK(_expseg_vmm_event_record(v, e1, 0));
  ASSERT_OK(_expseg_vmm_event_synchronize(v, e1));
  ASSERT_OK(_expseg_vmm_event_query(v, e1, &done));
  EXPECT_TRUE(done);
  {
    // host and sim: any value is a stream; cuda: streams the driver created (the hold is
    // cuStreamWaitValue32 on a host word)
    const bool created = !models_streams();
    expseg_stream s = 7, s8 = 8;
    if (created) {
      ASSERT_OK(_expseg_vmm_stream_create(v, &s));
      ASSERT_OK(_expseg_vmm_stream_create(v, &s8));
    }
    ASSERT_OK(_expseg_vmm_event_record(v, e1, s)); // recorded before the hold: complete
    ASSERT_OK(_expseg_vmm_hold_stream(v, s, true));
    ASSERT_OK(_expseg_vmm_event_record(v, e2, s));
    ASSERT_OK(_expseg_vmm_event_record(v, e3, s8)); // another stream is not held
    ASSERT_OK(_expseg_vmm_event_query(v, e1, &done));
    EXPECT_TRUE(done);
    ASSERT_OK(_expseg_vmm_event_query(v, e2, &done));
    EXPECT_FALSE(done);
    ASSERT_OK(_expseg_vmm_event_query(v, e3, &done));
    EXPECT_TRUE(done);
    EXPECT_EQ(EXPSEG_ERR_DRIVER, _expseg_vmm_event_synchronize(v, e2));
    EXPECT_NE(nullptr, strstr(expseg_last_error(), created ? "would block forever: a stream is held"
                                                           : "would block forever: stream 0x7 is held"))
        << expseg_last_error();
    EXPECT_EQ(EXPSEG_ERR_DRIVER, _expseg_vmm_stream_synchronize(v, s));
    EXPECT_NE(nullptr, strstr(expseg_last_error(), "would block forever")) << expseg_last_error();
    EXPECT_OK(_expseg_vmm_stream_synchronize(v, s8));
    // a device-wide wait is refused while any stream is held (every stream: s too)
    EXPECT_EQ(EXPSEG_ERR_DRIVER, _expseg_vmm_device_synchronize(v));
    EXPECT_NE(nullptr, strstr(expseg_last_error(),
                              created ? "device_synchronize would block forever: a stream is held"
                                      : "device_synchronize would block forever: stream 0x7 is held"))
        << expseg_last_error();
    ASSERT_OK(_expseg_vmm_hold_stream(v, s, false));
    EXPECT_OK(_expseg_vmm_device_synchronize(v));
    ASSERT_OK(_expseg_vmm_event_query(v, e2, &done));
    EXPECT_TRUE(done);
    ASSERT_OK(_expseg_vmm_event_synchronize(v, e2));
    // A new hold does not un-complete events recorded under the old one.
    ASSERT_OK(_expseg_vmm_hold_stream(v, s, true));
    ASSERT_OK(_expseg_vmm_event_query(v, e2, &done));
    EXPECT_TRUE(done);
    ASSERT_OK(_expseg_vmm_event_record(v, e2, s));
    ASSERT_OK(_expseg_vmm_event_query(v, e2, &done));
    EXPECT_FALSE(done);
    ASSERT_OK(_expseg_vmm_hold_stream(v, s, false));
    ASSERT_OK(_expseg_vmm_stream_synchronize(v, s));
    if (created) {
      ASSERT_OK(_expseg_vmm_stream_destroy(v, s));
      ASSERT_OK(_expseg_vmm_stream_destroy(v, s8));
    } else {
      // never-recorded and destroyed events are refused (on cuda that is the driver's
      // business: a never-recorded event queries as complete)
      expseg_vmm_event e4 = 0;
      ASSERT_OK(_expseg_vmm_event_create(v, &e4));
      EXPECT_INVALID(_expseg_vmm_event_query(v, e4, &done));
      ASSERT_OK(_expseg_vmm_event_destroy(v, e4));
      EXPECT_INVALID(_expseg_vmm_event_record(v, e4, 0));
      EXPECT_INVALID(_expseg_vmm_event_destroy(v, e4));
    }
  }
  ASSERT_OK(_expseg_vmm_event_destroy(v, e1));
  ASSERT_OK(_expseg_vmm_event_destroy(v, e2));
  ASSERT_OK(_expseg_vmm_event_destroy(v, e3));
}

TEST_P(VmmContract, CallsAreCountedByKind) {
  uintptr_t va = 0;
  expseg_vmm_handle h = 0;
  expseg_vmm_event e = 0;
  ASSERT_OK(_expseg_vmm_reserve(v, 4 * g, 0, &va));
  for (int i = 0; i < 3; i++) {
    ASSERT_OK(_expseg_vmm_create(v, g, &h));
    ASSERT_OK(_expseg_vmm_map(v, va + g, g, h, 0));
    ASSERT_OK(_expseg_vmm_set_access(v, va + g, g));
    ASSERT_OK(_expseg_vmm_unmap(v, va + g, g));
    ASSERT_OK(_expseg_vmm_release(v, h, g));
  }
  ASSERT_OK(_expseg_vmm_event_create(v, &e));
  // any value is a stream on host and sim; on cuda only a created one or the default (0)
  const expseg_stream s = models_streams() ? 3 : 0;
  ASSERT_OK(_expseg_vmm_event_record(v, e, s));
  ASSERT_OK(_expseg_vmm_stream_synchronize(v, s));
  ASSERT_OK(_expseg_vmm_device_synchronize(v));
  ASSERT_OK(_expseg_vmm_event_destroy(v, e));
  ASSERT_OK(_expseg_vmm_unreserve(v, va, 4 * g));
  const uint64_t want[EXPSEG_VMM_CALL_COUNT] = {
      /*reserve*/ 1, /*unreserve*/ 1, /*create*/ 3, /*release*/ 3, /*map*/ 3, /*unmap*/ 3,
      /*set_access*/ 3, /*event_create*/ 1, /*event_destroy*/ 1, /*event_record*/ 1,
      /*event_query*/ 0, /*event_synchronize*/ 0, /*stream_synchronize*/ 1, /*export_fd*/ 0,
      /*import_fd*/ 0, /*host_alloc*/ 0, /*host_free*/ 0, /*device_synchronize*/ 1,
      /*copy*/ 0};
  for (int c = 0; c < EXPSEG_VMM_CALL_COUNT; c++) {
    EXPECT_EQ(want[c], calls(expseg_vmm_call(c))) << _expseg_vmm_call_name(expseg_vmm_call(c));
    EXPECT_EQ(0u, failures(expseg_vmm_call(c))) << _expseg_vmm_call_name(expseg_vmm_call(c));
    if (GetParam().fault) {
      EXPECT_EQ(want[c], vmm_test_calls(_expseg_fault_inner(v), expseg_vmm_call(c)));
      EXPECT_EQ(want[c], _expseg_fault_seen(v, expseg_vmm_call(c)));
    }
  }
  EXPECT_EQ(int64_t(3 * g), vmm_test_gauges(v).created_bytes);
}

TEST_P(VmmContract, ExportedFdIsReadableInAnotherProcess) {
  if (base == "sim") {
    expseg_vmm_handle h = 0;
    int fd = -1;
    size_t off = 0;
    ASSERT_OK(_expseg_vmm_create(v, g, &h));
    EXPECT_EQ(EXPSEG_ERR_UNSUPPORTED, _expseg_vmm_export_fd(v, h, &fd, &off));
    ASSERT_OK(_expseg_vmm_release(v, h, g));
    return;
  }
#ifdef EXPSEG_VMM_CONTRACT_GPU
  {
    cudadouble_api api;
    if (!cudadouble_load(&api))
      GTEST_SKIP() << "a forked child cannot use a real CUDA driver; GpuIpc.TwoProcesses "
                      "shares memory with a freshly started process instead";
  }
#endif
  // Bytes go in and out through the data-check hook (memcpy on host, cuMemcpy on cuda).
  uintptr_t va = 0;
  expseg_vmm_handle h = 0, first = 0;
  ASSERT_OK(_expseg_vmm_reserve(v, 2 * g, 0, &va));
  ASSERT_OK(_expseg_vmm_create(v, g, &first)); // so that h does not start the file
  ASSERT_OK(_expseg_vmm_create(v, 2 * g, &h));
  ASSERT_OK(_expseg_vmm_map(v, va, 2 * g, h, 0));
  ASSERT_OK(_expseg_vmm_set_access(v, va, 2 * g));
  const char msg[] = "written by the parent";
  char sent[sizeof msg]; // a copy: a hook copying backwards must not change msg
  memcpy(sent, msg, sizeof msg);
  Put(va + g, sent, sizeof sent);
  int fd = -1;
  size_t off = 0;
  ASSERT_OK(_expseg_vmm_export_fd(v, h, &fd, &off));
  ASSERT_GE(fd, 0);
  if (is_host()) EXPECT_EQ(g, off) << "h is the second range of the host driver's arena file";
  else EXPECT_EQ(0u, off) << "a CUDA handle is the whole allocation";
  const char *child_spec = is_cuda() ? "cuda" : "host:capacity=16M,granularity=64K";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: a fresh driver imports the fd, maps it and checks the parent's bytes; the
    // exit code tells the parent which step failed.
    expseg_vmm_t *c = nullptr;
    if (_expseg_vmm_open(child_spec, 0, &c) != EXPSEG_OK) _exit(2);
    size_t cg = c->granularity;
    uintptr_t cva = 0;
    expseg_vmm_handle ch = 0;
    size_t fr0 = 0, fr = 0, tot = 0;
    _expseg_vmm_mem_info(c, &fr0, &tot);
    if (_expseg_vmm_reserve(c, 2 * g, 0, &cva) != EXPSEG_OK) _exit(3);
    if (_expseg_vmm_import_fd(c, fd, off, 2 * g, &ch) != EXPSEG_OK) _exit(4);
    if (_expseg_vmm_map(c, cva, 2 * g, ch, 0) != EXPSEG_OK) _exit(5);
    if (_expseg_vmm_set_access(c, cva, 2 * g) != EXPSEG_OK) _exit(6);
    char seen[sizeof msg] = {0};
    if (_expseg_vmm_copy_out(c, seen, cva + g, sizeof seen) != EXPSEG_OK ||
        memcmp(seen, msg, sizeof msg) != 0)
      _exit(7);
    char mark = 'C'; // the parent sees this
    if (_expseg_vmm_copy_in(c, cva, &mark, 1) != EXPSEG_OK) _exit(10);
    _expseg_vmm_mem_info(c, &fr, &tot);
    if (fr != fr0) _exit(8); // imports do not count against capacity
    if (_expseg_vmm_unmap(c, cva, 2 * g) || _expseg_vmm_release(c, ch, 2 * g) ||
        _expseg_vmm_unreserve(c, cva, 2 * g) || cg == 0)
      _exit(9);
    _expseg_vmm_close(c);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(pid, waitpid(pid, &status, 0));
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(0, WEXITSTATUS(status)) << "child failed at step " << WEXITSTATUS(status);
  char mark = 0;
  Get(&mark, va, 1);
  EXPECT_EQ('C', mark);
  close(fd);
  // Import into this driver too: a second handle on the same memory.
  size_t off2 = 1;
  ASSERT_OK(_expseg_vmm_export_fd(v, h, &fd, &off2));
  EXPECT_EQ(off, off2);
  expseg_vmm_handle h2 = 0;
  ASSERT_OK(_expseg_vmm_import_fd(v, fd, off, 2 * g, &h2));
  close(fd); // import took a duplicate
  EXPECT_EQ(3, vmm_test_gauges(v).live_chunks);
  if (is_cuda()) { // the driver refuses it
    EXPECT_EQ(EXPSEG_ERR_DRIVER, _expseg_vmm_import_fd(v, 0 /* stdin is no handle */, 0, 2 * g, &h2));
    EXPECT_NE(nullptr, strstr(expseg_last_error(), "cuMemImportFromShareableHandle"))
        << expseg_last_error();
  } else {
    EXPECT_INVALID(_expseg_vmm_import_fd(v, 0 /* stdin is no chunk */, 0, 2 * g, &h2));
  }
  ASSERT_OK(_expseg_vmm_unmap(v, va, 2 * g));
  ASSERT_OK(_expseg_vmm_map(v, va, 2 * g, h2, 0));
  ASSERT_OK(_expseg_vmm_set_access(v, va, 2 * g));
  char back[sizeof msg] = {0};
  Get(back, va + g, sizeof back);
  EXPECT_EQ(0, memcmp(back, msg, sizeof msg));
  ASSERT_OK(_expseg_vmm_unmap(v, va, 2 * g));
  ASSERT_OK(_expseg_vmm_release(v, h2, 2 * g));
  ASSERT_OK(_expseg_vmm_release(v, h, 2 * g));
  ASSERT_OK(_expseg_vmm_release(v, first, g));
  ASSERT_OK(_expseg_vmm_unreserve(v, va, 2 * g));
}

// host: an exported chunk is a range of an arena file another process may still map, so its
// release neither punches nor reuses that range (the importer keeps the data). cuda: the
// exported fd keeps the allocation alive after its release; importing it shows the bytes.
TEST_P(VmmContract, ExportedRangeOutlivesItsRelease) {
  if (base == "sim") GTEST_SKIP() << "sim cannot export";
  if (is_cuda()) {
    uintptr_t va = 0;
    expseg_vmm_handle h = 0, h2 = 0;
    ASSERT_OK(_expseg_vmm_reserve(v, g, 0, &va));
    ASSERT_OK(_expseg_vmm_create(v, g, &h));
    ASSERT_OK(_expseg_vmm_map(v, va, g, h, 0));
    ASSERT_OK(_expseg_vmm_set_access(v, va, g));
    const char msg[] = "still here";
    char sent[sizeof msg]; // a copy: a hook copying backwards must not change msg
    memcpy(sent, msg, sizeof msg);
    Put(va, sent, sizeof sent);
    int fd = -1;
    size_t off = 1;
    ASSERT_OK(_expseg_vmm_export_fd(v, h, &fd, &off));
    EXPECT_EQ(0u, off);
    ASSERT_OK(_expseg_vmm_unmap(v, va, g));
    ASSERT_OK(_expseg_vmm_release(v, h, g));
    ASSERT_OK(_expseg_vmm_import_fd(v, fd, 0, g, &h2));
    close(fd); // the driver does not keep the caller's fd
    ASSERT_OK(_expseg_vmm_map(v, va, g, h2, 0));
    ASSERT_OK(_expseg_vmm_set_access(v, va, g));
    char back[sizeof msg] = {0};
    Get(back, va, sizeof back);
    EXPECT_STREQ("still here", back) << "the exported allocation did not outlive its release";
    ASSERT_OK(_expseg_vmm_unmap(v, va, g));
    ASSERT_OK(_expseg_vmm_release(v, h2, g));
    ASSERT_OK(_expseg_vmm_unreserve(v, va, g));
    return;
  }
  uintptr_t va = 0;
  expseg_vmm_handle h = 0, h2 = 0;
  ASSERT_OK(_expseg_vmm_reserve(v, g, 0, &va));
  ASSERT_OK(_expseg_vmm_create(v, g, &h));
  ASSERT_OK(_expseg_vmm_map(v, va, g, h, 0));
  ASSERT_OK(_expseg_vmm_set_access(v, va, g));
  const char msg[] = "still here";
  memcpy(reinterpret_cast<void *>(va), msg, sizeof msg);
  int fd = -1;
  size_t off = 0;
  ASSERT_OK(_expseg_vmm_export_fd(v, h, &fd, &off));
  ASSERT_OK(_expseg_vmm_unmap(v, va, g));
  ASSERT_OK(_expseg_vmm_release(v, h, g));
  char back[sizeof msg] = {0};
  ASSERT_EQ(ssize_t(sizeof back), pread(fd, back, sizeof back, off_t(off)));
  EXPECT_STREQ(msg, back) << "the exported range was punched on release";
  ASSERT_OK(_expseg_vmm_create(v, g, &h2)); // never the exported range
  ASSERT_OK(_expseg_vmm_map(v, va, g, h2, 0));
  ASSERT_OK(_expseg_vmm_set_access(v, va, g));
  EXPECT_EQ(0, reinterpret_cast<volatile char *>(va)[0]);
  ASSERT_EQ(ssize_t(sizeof back), pread(fd, back, sizeof back, off_t(off)));
  EXPECT_STREQ(msg, back) << "the exported range was reused";
  close(fd);
  ASSERT_OK(_expseg_vmm_unmap(v, va, g));
  ASSERT_OK(_expseg_vmm_release(v, h2, g));
  ASSERT_OK(_expseg_vmm_unreserve(v, va, g));
}

TEST_P(VmmContract, ClockIsMonotonic) {
  uint64_t a = _expseg_vmm_now_ns(v);
  uint64_t b = _expseg_vmm_now_ns(v);
  EXPECT_LE(a, b);
  EXPECT_GT(a, 0u);
}

#ifdef EXPSEG_VMM_CONTRACT_GPU
INSTANTIATE_TEST_SUITE_P(Gpu, VmmContract,
                         ::testing::Values(Backend{"cuda", "cuda", false},
                                           Backend{"fault_cuda", "cuda", true}),
                         [](const auto &i) { return std::string(i.param.label); });
#else
INSTANTIATE_TEST_SUITE_P(
    Cpu, VmmContract,
    ::testing::Values(Backend{"host", "host:capacity=64M,granularity=64K", false},
                      Backend{"sim", "sim:capacity=64M,granularity=64K", false},
                      Backend{"fault_host", "host:capacity=64M,granularity=64K", true},
                      Backend{"fault_sim", "sim:capacity=64M,granularity=64K", true}),
    [](const auto &i) { return std::string(i.param.label); });
#endif

} // namespace

namespace {

// numa=N binds each mapping's pages; a failure to bind is one warning, never an error.
TEST(VmmHost, NumaPlacementWarnsAtMostOnce) {
  std::vector<std::string> lines;
  expseg_set_log_sink(
      [](void *ctx, const char *line) {
        static_cast<std::vector<std::string> *>(ctx)->push_back(line);
      },
      &lines);
  expseg_vmm_t *v = nullptr;
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_open("host:capacity=16M,granularity=64K,numa=0", 0, &v))
      << expseg_last_error();
  size_t g = v->granularity;
  uintptr_t va = 0;
  expseg_vmm_handle h = 0;
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_reserve(v, 4 * g, 0, &va));
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_create(v, g, &h));
  for (int i = 0; i < 3; i++) {
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_map(v, va + i * g, g, h, 0)) << expseg_last_error();
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_set_access(v, va + i * g, g));
    reinterpret_cast<volatile char *>(va + i * g)[0] = 1;
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_unmap(v, va + i * g, g));
  }
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_release(v, h, g));
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_unreserve(v, va, 4 * g));
  _expseg_vmm_close(v);
  expseg_set_log_sink(nullptr, nullptr);
  EXPECT_LE(lines.size(), 1u);
  for (auto &l : lines) EXPECT_NE(std::string::npos, l.find("NUMA node 0")) << l;
}

} // namespace
