// SPDX-License-Identifier: Apache-2.0
// test_pool_threads.cpp: a private pool released to use count 0 by one thread while another
// thread's allocation into it is under way (the allocator drops its lock to create memory),
// and the cost of retrying the drain of a released pool whose memory cannot go back yet.
//
// The race: the release must not free the pool's slot while the allocation is in flight,
// else the allocation lands in a slot that no pool (or a later pool) owns. Either order is
// a valid outcome (allocation first: the pool drains when it is freed; release first: the
// allocation is refused); what must hold is that a pointer handed out says which pool it
// came from and that expseg_check passes. Seeded; each round randomizes when the release
// comes. The drain test counts event queries (each drain attempt records and queries an
// event per stream) through the fault driver, whose failing query stands for a stream
// still busy.
#include "expseg.h"
#include "expseg_testing.h"
#include "driver_param.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "alloc_support.h"
#include "test_seed.h"

namespace {

constexpr size_t MiB = 1 << 20;

using RaceParam = DriverParam;

class PoolRace : public ::testing::TestWithParam<RaceParam> {};

TEST_P(PoolRace, ReleaseDuringAnAllocationIntoThePool) {
  EXPSEG_SEEDED(seed, 23);
  AllocPtr owner = make_alloc(GetParam().driver, GetParam().config);
  ASSERT_NE(owner, nullptr);
  expseg_allocator *a = owner.get();
  std::atomic<int> go{0}; // round number the releasing thread may start
  std::atomic<expseg_pool_id> pool{0};
  std::atomic<int> done{0};
  std::atomic<uint64_t> spin_seed{seed};
  constexpr int kRounds = 6000;
  std::thread releaser([&] {
    TestRng rng(seed ^ 0x5eed);
    for (int r = 1; r <= kRounds; r++) {
      for (int k = 0; go.load() < r; k++) // spins a while (the allocation starts now), then
        if (k > 20000) std::this_thread::yield(); // leaves the core to others
      for (uint64_t i = rng.below(400); i > 0; i--) spin_seed.fetch_add(1); // when: random
      EXPECT_EQ(expseg_pool_release(a, pool.load()), EXPSEG_OK) << expseg_last_error();
      done.store(r);
    }
  });
  int landed = 0, refused = 0;
  TestRng rng(seed);
  for (int r = 1; r <= kRounds; r++) {
    expseg_pool_id id = 0;
    ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << expseg_last_error();
    pool.store(id);
    go.store(r);
    void *p = nullptr;
    // a new pool has no memory: this allocation creates some, with the lock dropped
    expseg_status st = expseg_malloc_pool(a, (2 + rng.below(6)) * MiB, 1, id, &p);
    while (done.load() < r) std::this_thread::yield();
    if (st == EXPSEG_OK) {
      ++landed;
      expseg_pool_id of = 0;
      ASSERT_EQ(expseg_pool_of(a, p, &of), EXPSEG_OK) << expseg_last_error();
      EXPECT_EQ(of, id) << "round " << r << ": the block's pool slot was freed under it";
      ASSERT_EQ(expseg_check(a), EXPSEG_OK) << "round " << r << ": " << expseg_last_error();
      // a new pool may reuse a freed slot: it must not see the old pool's block
      expseg_pool_id other = 0;
      ASSERT_EQ(expseg_pool_create(a, &other), EXPSEG_OK);
      ASSERT_EQ(expseg_pool_of(a, p, &of), EXPSEG_OK);
      EXPECT_EQ(of, id) << "round " << r;
      ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
      ASSERT_EQ(expseg_pool_release(a, other), EXPSEG_OK);
    } else {
      ++refused;
      EXPECT_EQ(st, EXPSEG_ERR_INVALID_ARGUMENT) << expseg_last_error();
    }
    ASSERT_EQ(expseg_check(a), EXPSEG_OK) << "round " << r << ": " << expseg_last_error();
    if (::testing::Test::HasFailure()) break;
  }
  go.store(kRounds);
  done.store(kRounds);
  releaser.join();
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  int64_t reserved = -1;
  ASSERT_EQ(expseg_stat(a, "reserved_bytes.all.current", &reserved), EXPSEG_OK);
  EXPECT_EQ(reserved, 0) << "released pools' memory went back";
  printf("rounds %d: allocation first %d, release first %d\n", kRounds, landed, refused);
}

INSTANTIATE_TEST_SUITE_P(
    Drivers, PoolRace,
    ::testing::Values(RaceParam{"host:capacity=512M", "expandable_segments:True"},
                      RaceParam{"host:capacity=512M", "expandable_segments:False"},
                      RaceParam{"sim:capacity=8G", "expandable_segments:True"}),
    [](const ::testing::TestParamInfo<RaceParam> &p) {
      return std::string(p.param.driver).substr(0, 4) == "host"
                 ? (std::string("host_") +
                    (std::string(p.param.config).find("True") != std::string::npos ? "expandable"
                                                                                    : "classic"))
                 : std::string("sim_expandable");
    });

} // namespace

namespace {

// A released pool whose memory cannot go back yet (its stream still busy: here every event
// query fails) is tried again after a growing number of calls, not at every allocation (each
// try walks every segment and records and queries an event per stream); once the stream is
// idle, empty_cache gives the memory back at once.
TEST(PoolDrain, RetriesBackOffWhileAStreamIsBusy) {
  AllocPtr owner = make_alloc("fault;host:capacity=256M", "expandable_segments:False");
  ASSERT_NE(owner, nullptr);
  expseg_allocator *a = owner.get();
  expseg_pool_id id = 0;
  ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK);
  void *p = nullptr;
  ASSERT_EQ(expseg_malloc_pool(a, 2 * MiB, 3, id, &p), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_testing_set_faults(a, "event_query@1..:driver"), EXPSEG_OK)
      << expseg_last_error();
  ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_OK); // tries once: the stream looks busy
  const uint64_t after_release = expseg_testing_faults_injected(a);
  EXPECT_EQ(after_release, 1u) << "the release tries to drain once";
  const std::string key = "reserved_bytes_by_private_pools.0_" + std::to_string(id) + ".all.current";
  int64_t v = 0;
  ASSERT_EQ(expseg_stat(a, key.c_str(), &v), EXPSEG_OK) << "the pool still drains";
  EXPECT_GE(v, (int64_t)(2 * MiB));
  constexpr int kCalls = 2000;
  for (int i = 0; i < kCalls; i++) { // slow-path allocations (a pool named: the general cache)
    void *q = nullptr;
    ASSERT_EQ(expseg_malloc_pool(a, 4096, 0, 0, &q), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_free(a, q), EXPSEG_OK);
  }
  const uint64_t tries = expseg_testing_faults_injected(a) - after_release;
  printf("%d slow-path allocations: %llu drain tries\n", kCalls, (unsigned long long)tries);
  EXPECT_GE(tries, 5u) << "still retried";
  EXPECT_LE(tries, 16u) << "retried at every allocation";
  ASSERT_EQ(expseg_stat(a, key.c_str(), &v), EXPSEG_OK) << "the pool still drains";
  ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK); // blocking: at once, whatever the back-off
  EXPECT_EQ(expseg_stat(a, key.c_str(), &v), EXPSEG_ERR_INVALID_ARGUMENT) << "drained";
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
}

// The back-off never delays a pool that just became drainable: its last free tries at once.
TEST(PoolDrain, LastFreeOfAReleasedPoolDrainsAtOnceDespiteTheBackOff) {
  AllocPtr owner = make_alloc("fault;host:capacity=256M", "expandable_segments:False");
  ASSERT_NE(owner, nullptr);
  expseg_allocator *a = owner.get();
  expseg_pool_id busy_stream = 0, other = 0;
  ASSERT_EQ(expseg_pool_create(a, &busy_stream), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_create(a, &other), EXPSEG_OK);
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(expseg_malloc_pool(a, 2 * MiB, 3, busy_stream, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc_pool(a, 2 * MiB, 4, other, &q), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK);
  ASSERT_EQ(expseg_testing_set_faults(a, "event_query@1..:driver"), EXPSEG_OK);
  ASSERT_EQ(expseg_pool_release(a, busy_stream), EXPSEG_OK);
  for (int i = 0; i < 200; i++) { // backs off
    void *r = nullptr;
    ASSERT_EQ(expseg_malloc_pool(a, 4096, 0, 0, &r), EXPSEG_OK);
    ASSERT_EQ(expseg_free(a, r), EXPSEG_OK);
  }
  ASSERT_EQ(expseg_pool_release(a, other), EXPSEG_OK); // q is live: not tried
  ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK); // streams idle from now on
  ASSERT_EQ(expseg_free(a, q), EXPSEG_OK);                // the last block: both drain now
  int64_t v = 0;
  for (expseg_pool_id id : {busy_stream, other}) {
    const std::string key = "reserved_bytes_by_private_pools.0_" + std::to_string(id) + ".all.current";
    EXPECT_EQ(expseg_stat(a, key.c_str(), &v), EXPSEG_ERR_INVALID_ARGUMENT) << id;
  }
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
}

} // namespace
