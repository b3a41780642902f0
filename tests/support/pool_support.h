/* SPDX-License-Identifier: Apache-2.0 */
/* pool_support.h: what the private-pool suites share (tests/test_alloc_pools.cpp and the
 * adversarial ones, tests/test_adv_pools_common.h): the driver and configuration a test is
 * instantiated with (named host_expandable, sim_classic, ...), a pool's statistic key, and
 * a fixture base with the pool calls that fail the test with the message. Each suite
 * creates `a` in its own SetUp and decides what its TearDown checks. */
#ifndef EXPSEG_POOL_SUPPORT_H
#define EXPSEG_POOL_SUPPORT_H

#include <gtest/gtest.h>

#include <cstring>
#include <ostream>
#include <string>

#include "driver_param.h"
#include "expseg.h"

using PoolsParam = DriverParam; /* printed as its text */

/* "host_expandable", "sim_classic", ...: the driver's name and whether segments expand. */
inline std::string pools_param_name(const testing::TestParamInfo<PoolsParam> &p) {
  std::string d(p.param.driver);
  return d.substr(0, d.find(':')) +
         (std::strstr(p.param.config, "True") ? "_expandable" : "_classic");
}

/* Whether the statistic exists (a pool's keys go once its memory is given back). */
inline bool has_stat(const expseg_allocator *a, const std::string &key) {
  int64_t v;
  return expseg_stat(a, key.c_str(), &v) == EXPSEG_OK;
}

/* The key of pool id's reserved bytes on device 0 (rest: which of its figures). */
inline std::string pool_key(expseg_pool_id id, const char *rest = "all.current") {
  return "reserved_bytes_by_private_pools.0_" + std::to_string(id) + "." + rest;
}

class PoolCalls : public testing::TestWithParam<PoolsParam> {
protected:
  expseg_pool_id create() {
    expseg_pool_id id = 0;
    EXPECT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << expseg_last_error();
    return id;
  }
  void *alloc(size_t size, expseg_stream s, expseg_pool_id pool) {
    void *p = nullptr;
    EXPECT_EQ(expseg_malloc_pool(a, size, s, pool, &p), EXPSEG_OK) << expseg_last_error();
    return p;
  }
  expseg_pool_id pool_of(const void *p) {
    expseg_pool_id id = 999999;
    EXPECT_EQ(expseg_pool_of(a, p, &id), EXPSEG_OK) << expseg_last_error();
    return id;
  }
  expseg_allocator *a = nullptr;
};

#endif
