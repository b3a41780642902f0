// SPDX-License-Identifier: Apache-2.0
// Peer access (docs/api.md "Devices, peers and sharing"): ordinals out of range named,
// enabling and disabling twice, disabling while mapped, expandable growth after enabling
// (every new chunk granted), set_access faults during growth and during enable / disable
// with imports mapped (undone, retried), and peers changed while a tagged region sleeps.
#include "test_adv16_ipc_common.h"

namespace {

using namespace adv16;

// Peer access: range checks name the value, twice is harmless, disable while mapped takes
// the access away, and expandable growth after enable gives every new chunk the access.
class Adv16Peers : public ::testing::TestWithParam<const char *> {};

TEST_P(Adv16Peers, GrowthAfterEnableAndDisableWhileMapped) {
  expseg_allocator *a = make(GetParam(), 3, "expandable_segments:True");
  for (int bad : {3, 64, -1, 1000, INT32_MIN}) {
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_enable_peer_access(a, bad));
    EXPECT_TRUE(says(std::to_string(bad))) << err();
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_disable_peer_access(a, bad));
    EXPECT_TRUE(says(std::to_string(bad))) << err();
  }
  EXPECT_EQ(EXPSEG_OK, expseg_disable_peer_access(a, 5)) << "never enabled: nothing to do";
  void *first = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 2u << 20, 0, &first));
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(a, 0));
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(a, 0));
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(a, 63));
  EXPECT_EQ(access_of(a, first, 2u << 20, 0), 2);
  std::vector<std::pair<void *, size_t>> live;
  for (int i = 1; i <= 6; i++) { // grows the one segment, chunk by chunk
    void *p = nullptr;
    size_t s = (size_t)i << 20;
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, s, 0, &p));
    live.push_back({p, s});
    EXPECT_EQ(access_of(a, p, s, 0), 2) << "grown chunk " << i;
    EXPECT_EQ(access_of(a, p, s, 63), 2) << "grown chunk " << i;
    EXPECT_EQ(access_of(a, p, s, 1), 0) << "not enabled";
  }
  ASSERT_EQ(EXPSEG_OK, expseg_disable_peer_access(a, 0)) << "while memory is mapped";
  for (auto &x : live) {
    EXPECT_EQ(access_of(a, x.first, x.second, 0), 0);
    EXPECT_EQ(access_of(a, x.first, x.second, 63), 2);
    EXPECT_EQ(access_of(a, x.first, x.second, 3), 2) << "the owner keeps its access";
  }
  void *late = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 9u << 20, 0, &late));
  EXPECT_EQ(access_of(a, late, 9u << 20, 0), 0) << "disabled: growth does not grant it";
  EXPECT_EQ(access_of(a, late, 9u << 20, 63), 2);
  for (auto &x : live) ASSERT_EQ(EXPSEG_OK, expseg_free(a, x.first));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, late));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, first));
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  destroy_clean(a, "peers");
}

// A set_access fault during growth with a peer enabled: the malloc fails with nothing
// held (no half-granted chunk), and the retry succeeds with both accesses.
TEST_P(Adv16Peers, FaultedGrantDuringGrowth) {
  std::string spec = std::string("fault;") + GetParam();
  for (const char *config : {"expandable_segments:True", "expandable_segments:False"}) {
    SCOPED_TRACE(config);
    expseg_allocator *a = make(spec.c_str(), 0, config);
    ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(a, 1));
    for (const char *rule : {"set_access@1", "set_access@2", "map@1", "create@1", "reserve@1"}) {
      SCOPED_TRACE(rule);
      ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
      const expseg_testing_driver_counts before = counts(a);
      ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(a, rule));
      void *p = nullptr;
      expseg_status st = expseg_malloc(a, 6u << 20, 0, &p);
      ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(a, ""));
      if (st != EXPSEG_OK) {
        EXPECT_EQ(p, nullptr);
        ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
        expseg_testing_driver_counts c = counts(a);
        EXPECT_EQ(c.live_chunks, before.live_chunks) << "nothing leaked";
        EXPECT_EQ(c.mapped_bytes, before.mapped_bytes);
        EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0);
        ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 6u << 20, 0, &p)) << "retry: " << err();
      }
      EXPECT_EQ(access_of(a, p, 6u << 20, 0), 2);
      EXPECT_EQ(access_of(a, p, 6u << 20, 1), 2);
      EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
      ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
    }
    ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
    destroy_clean(a, "peers");
  }
}

// Enabling and disabling a peer with imports and segments mapped, a set_access failing at
// each range in turn: the failed call changes nothing (every range as before), a retry works.
TEST(Adv16PeersHost, FaultedEnableAndDisableWithImports) {
  expseg_allocator *a = make(HOST, 0), *b = make(FAULT_HOST, 1, "expandable_segments:False");
  void *p = nullptr, *q = nullptr, *own[2] = {};
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 4u << 20, 0, &p));
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(b, 30u << 20, 0, &own[0]));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(b, 50u << 20, 0, &own[1]));
  auto all = [&](int want) {
    EXPECT_EQ(access_of(b, own[0], 30u << 20, 5), want);
    EXPECT_EQ(access_of(b, own[1], 50u << 20, 5), want);
    EXPECT_EQ(access_of(b, q, 4u << 20, 5), want) << "the import";
  };
  for (int n = 1; n <= 3; n++) {
    std::string rule = "set_access@" + std::to_string(n);
    SCOPED_TRACE(rule);
    ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(b, rule.c_str()));
    EXPECT_EQ(EXPSEG_ERR_DRIVER, expseg_enable_peer_access(b, 5));
    ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(b, ""));
    all(0);
    ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(b, 5)) << err();
    all(2);
    ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(b, rule.c_str()));
    EXPECT_EQ(EXPSEG_ERR_DRIVER, expseg_disable_peer_access(b, 5));
    ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(b, ""));
    all(2);
    ASSERT_EQ(EXPSEG_OK, expseg_disable_peer_access(b, 5)) << err();
    all(0);
  }
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(b, 5));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q));
  void *q2 = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q2)) << "imports after enable get the peer";
  EXPECT_EQ(access_of(b, q2, 4u << 20, 5), 2);
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q2));
  expseg_ipc_handle_free(&h);
  for (void *x : own) ASSERT_EQ(EXPSEG_OK, expseg_free(b, x));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  EXPECT_EQ(EXPSEG_OK, expseg_check(b)) << err();
  destroy_clean(b, "importer");
  destroy_clean(a, "exporter");
}

// A peer enabled or disabled while a region sleeps (classic and expandable segments): the
// sleeping memory is not mapped, so there is nothing to grant, and the wake grants the
// peer; a chunk a refused unmap left mapped while asleep is granted and revoked too.
TEST_P(Adv16Peers, EnableWhileARegionSleeps) {
  const std::string spec = std::string("fault;") + GetParam();
  for (const char *cfg : {"expandable_segments:False", "expandable_segments:True"}) {
    SCOPED_TRACE(cfg);
    for (bool refused_unmap : {false, true}) {
      SCOPED_TRACE(refused_unmap ? "a sleep's unmap refused" : "a clean sleep");
      expseg_allocator *a = make(spec.c_str(), 0, cfg);
      ASSERT_EQ(EXPSEG_OK, expseg_region_begin(a, "r"));
      void *p = nullptr, *other = nullptr;
      ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 6u << 20, 0, &p));
      ASSERT_EQ(EXPSEG_OK, expseg_region_end(a, "r"));
      ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 6u << 20, 0, &other));
      if (refused_unmap) {
        ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(a, "unmap@1"));
      }
      expseg_status st = expseg_sleep(a, "r", EXPSEG_SLEEP_DISCARD);
      ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(a, ""));
      ASSERT_EQ(refused_unmap ? EXPSEG_ERR_DRIVER : EXPSEG_OK, st) << err();
      EXPECT_EQ(EXPSEG_OK, expseg_enable_peer_access(a, 1)) << err();
      EXPECT_EQ(access_of(a, other, 6u << 20, 1), 2);
      if (refused_unmap) {
        EXPECT_EQ(access_of(a, p, 6u << 20, 1), 2) << "still mapped";
      }
      EXPECT_EQ(EXPSEG_OK, expseg_disable_peer_access(a, 1)) << err();
      if (refused_unmap) {
        EXPECT_EQ(access_of(a, p, 6u << 20, 1), 0) << "revoked";
      }
      EXPECT_EQ(EXPSEG_OK, expseg_enable_peer_access(a, 1)) << err();
      ASSERT_EQ(EXPSEG_OK, expseg_wake(a, "r")) << err();
      EXPECT_EQ(access_of(a, p, 6u << 20, 1), 2) << "the wake grants the enabled peer";
      EXPECT_EQ(access_of(a, p, 6u << 20, 0), 2);
      EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
      ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
      ASSERT_EQ(EXPSEG_OK, expseg_free(a, other));
      ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
      destroy_clean(a, "sleeping peers");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, Adv16Peers, ::testing::Values("host:capacity=256M", "sim"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                           return std::string(i.param).substr(0, 4) == "host" ? "host" : "sim";
                         });

} // namespace
