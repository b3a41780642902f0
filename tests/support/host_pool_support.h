/* SPDX-License-Identifier: Apache-2.0 */
/* host_pool_support.h: C++ helpers for the pinned host pool tests (tests/test_host_pool.cpp,
 * tests/test_host_pool_faults.cpp, tests/test_gpu_host_pool.cpp): an owning pool handle,
 * creation that fails the test with the message, statistics by key, holding a stream of
 * the pool's driver busy, and a pool over the fault wrapper. */
#ifndef EXPSEG_HOST_POOL_SUPPORT_H
#define EXPSEG_HOST_POOL_SUPPORT_H

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "expseg.h"
#include "host/host_pool.h"
#include "vmm.h"

constexpr size_t KiB = 1024, MiB = 1024 * 1024;

struct PoolDeleter {
  void operator()(expseg_host_pool *h) const { expseg_host_destroy(h); }
};
using PoolPtr = std::unique_ptr<expseg_host_pool, PoolDeleter>;

inline PoolPtr make_pool(const char *driver, const char *config) {
  expseg_host_pool *h = nullptr;
  expseg_status st = expseg_host_create(driver, 0, config, &h);
  EXPECT_EQ(st, EXPSEG_OK) << driver << " / " << config << ": " << expseg_last_error();
  return PoolPtr(h);
}

inline int64_t hstat(const expseg_host_pool *h, const std::string &key) {
  int64_t v = INT64_MIN;
  EXPECT_EQ(expseg_host_stat(h, key.c_str(), &v), EXPSEG_OK) << key << ": " << expseg_last_error();
  return v;
}

/* Holds (on) or releases a stream of the pool's driver: events recorded on a held stream
 * stay incomplete until it is released. */
inline void hold(expseg_host_pool *h, expseg_stream s, bool on) {
  ASSERT_EQ(_expseg_vmm_hold_stream(_expseg_host_pool_driver(h), s, on), EXPSEG_OK);
}

/* A pool over the fault wrapper (vmm/fault.c) around an inner driver: fail() makes calls
 * nth .. nth+count-1 of one kind fail with st. */
struct FaultPool {
  expseg_vmm_t *fault = nullptr;  // owned by the pool
  PoolPtr h;
  explicit FaultPool(const char *config, const char *inner_driver = "host") {
    expseg_vmm_t *inner = nullptr;
    EXPECT_EQ(_expseg_vmm_open(inner_driver, 0, &inner), EXPSEG_OK) << expseg_last_error();
    EXPECT_EQ(_expseg_fault_new(inner, &fault), EXPSEG_OK) << expseg_last_error();
    expseg_host_pool *p = nullptr;
    EXPECT_EQ(_expseg_host_create_with_driver(fault, config, &p), EXPSEG_OK)
        << expseg_last_error();
    h.reset(p);
  }
  void fail(expseg_vmm_call call, uint64_t nth, uint64_t count, expseg_status st) {
    expseg_fault_rule_t r = {call, nth, count, st};
    _expseg_fault_set_rules(fault, &r, 1);
  }
};

#endif
