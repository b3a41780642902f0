// SPDX-License-Identifier: Apache-2.0
// Several devices and peer access (issue 14): allocators of different devices are
// independent (8 threads over 4 device ordinals, each with its own statistics), and
// expseg_enable_peer_access grants every mapped range, and every later one, to the peer with
// one set_access call per range, checked through the driver's call counts and the access
// record the host and sim drivers keep (_expseg_vmm_has_access). Runs under ThreadSanitizer
// in .ci/run.
#include "alloc_support.h"

#include "expseg_testing.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

namespace {

struct Del {
  void operator()(expseg_allocator *a) const { expseg_destroy(a); }
};
using Alloc = std::unique_ptr<expseg_allocator, Del>;

Alloc make(const char *driver, int device, const char *config) {
  expseg_allocator *a = nullptr;
  expseg_status st = expseg_create(driver, device, config, &a);
  EXPECT_EQ(st, EXPSEG_OK) << expseg_last_error();
  return Alloc(a);
}

// 2: every byte accessible from device; 1: some; 0: none.
int access_of(expseg_allocator *a, void *p, size_t size, int device) {
  int state = -1;
  size_t g = alloc_test_page(a);
  uintptr_t lo = (uintptr_t)p / g * g, hi = ((uintptr_t)p + size + g - 1) / g * g;
  EXPECT_EQ(EXPSEG_OK, _expseg_vmm_has_access(alloc_test_driver(a), lo, hi - lo, device, &state))
      << expseg_last_error();
  return state;
}

uint64_t set_access_calls(expseg_allocator *a) {
  return alloc_test_calls(a, EXPSEG_VMM_CALL_set_access);
}

class Peers : public ::testing::TestWithParam<const char *> {};

// Classic segments: one range per segment, so the counts are exact.
TEST_P(Peers, OneSetAccessPerRangePerPeer) {
  Alloc a = make(GetParam(), 0, "expandable_segments:False");
  expseg_allocator *A = a.get();
  void *p[3];
  const size_t sizes[3] = {30u << 20, 50u << 20, 70u << 20}; // three segments
  for (int i = 0; i < 3; i++) ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, sizes[i], 0, &p[i]));
  ASSERT_EQ(stat_of(A, "segment.all.current"), 3);
  for (int i = 0; i < 3; i++) EXPECT_EQ(access_of(A, p[i], sizes[i], 1), 0);
  uint64_t before = set_access_calls(A);
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(A, 1)) << expseg_last_error();
  EXPECT_EQ(set_access_calls(A) - before, 3u) << "one call per mapped range";
  for (int i = 0; i < 3; i++) EXPECT_EQ(access_of(A, p[i], sizes[i], 1), 2);
  EXPECT_EQ(access_of(A, p[0], sizes[0], 2), 0) << "only the peer asked for";
  before = set_access_calls(A);
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(A, 1)) << "enabling twice is fine";
  EXPECT_EQ(set_access_calls(A), before) << "and costs nothing";

  void *q = nullptr;
  before = set_access_calls(A);
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 90u << 20, 0, &q));
  EXPECT_EQ(set_access_calls(A) - before, 2u) << "the owner's call, then the peer's";
  EXPECT_EQ(access_of(A, q, 90u << 20, 1), 2);

  before = set_access_calls(A);
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(A, 2));
  EXPECT_EQ(set_access_calls(A) - before, 4u);
  before = set_access_calls(A);
  ASSERT_EQ(EXPSEG_OK, expseg_disable_peer_access(A, 1));
  EXPECT_EQ(set_access_calls(A) - before, 4u) << "one revocation per range";
  for (int i = 0; i < 3; i++) {
    EXPECT_EQ(access_of(A, p[i], sizes[i], 1), 0);
    EXPECT_EQ(access_of(A, p[i], sizes[i], 2), 2);
    EXPECT_EQ(access_of(A, p[i], sizes[i], 0), 2) << "the owner keeps its access";
  }
  ASSERT_EQ(EXPSEG_OK, expseg_disable_peer_access(A, 1)) << "disabling twice is fine";

  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_enable_peer_access(A, 0));
  EXPECT_NE(std::string(expseg_last_error()).find("peer device 0"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_enable_peer_access(A, 64));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_enable_peer_access(A, -1));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_enable_peer_access(nullptr, 1));
  for (void *x : p) ASSERT_EQ(EXPSEG_OK, expseg_free(A, x));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, q));
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(A));
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
}

// Expandable segments: pages that move to another place and pages re-mapped from the page
// cache keep the peer's access.
TEST_P(Peers, PageMovesAndRemapsKeepAccess) {
  Alloc a = make(GetParam(), 0, "expandable_segments:True");
  expseg_allocator *A = a.get();
  const size_t big = 64u << 20, two = 2u << 20;
  void *p = nullptr, *keep = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, big, 1, &p));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 8u << 20, 1, &keep));
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(A, 3));
  EXPECT_EQ(access_of(A, p, big, 3), 2);
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, p));
  // No free block holds 66 MiB: the growth takes stream 1's idle 64 MiB chunk (unmap, map),
  // and the surplus chunk keep's growth made, if any, and creates only what they lack.
  uint64_t maps = alloc_test_calls(A, EXPSEG_VMM_CALL_map);
  const int64_t created = stat_of(A, "expseg.created_bytes");
  const int64_t idle =
      stat_of(A, "reserved_bytes.all.current") - stat_of(A, "allocated_bytes.all.current");
  ASSERT_GE(idle, (int64_t)big);
  void *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, big + two, 2, &q));
  EXPECT_GT(alloc_test_calls(A, EXPSEG_VMM_CALL_map), maps) << "pages were re-mapped";
  EXPECT_EQ(stat_of(A, "expseg.created_bytes") - created,
            std::max<int64_t>(0, (int64_t)(big + two) - idle))
      << "only what was missing";
  EXPECT_EQ(access_of(A, q, big + two, 3), 2) << "moved pages keep the peer's access";
  EXPECT_EQ(access_of(A, p, big, 3), 0) << "the old place is unmapped, access gone with it";
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, q));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, keep));
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(A));
  EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
}

// A failing grant is undone: the peer set is unchanged and nothing is left half-granted.
TEST(PeersFault, FailedEnableChangesNothing) {
  Alloc a = make("fault;sim", 0, "expandable_segments:False");
  expseg_allocator *A = a.get();
  void *p[2];
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 30u << 20, 0, &p[0]));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 50u << 20, 0, &p[1]));
  ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(A, "set_access@2"));
  EXPECT_EQ(EXPSEG_ERR_DRIVER, expseg_enable_peer_access(A, 1));
  EXPECT_NE(std::string(expseg_last_error()).find("peer 1"), std::string::npos)
      << expseg_last_error();
  ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(A, ""));
  uint64_t before = set_access_calls(A);
  void *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(A, 70u << 20, 0, &q));
  EXPECT_EQ(set_access_calls(A) - before, 1u) << "peer 1 is not enabled";
  for (void *x : p) ASSERT_EQ(EXPSEG_OK, expseg_free(A, x));
  ASSERT_EQ(EXPSEG_OK, expseg_free(A, q));
}

INSTANTIATE_TEST_SUITE_P(Cpu, Peers, ::testing::Values("host:capacity=512M", "sim"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                           return std::string(i.param).substr(0, 4) == "host" ? "host" : "sim";
                         });

// 8 threads over 4 devices: each allocator counts only its own work; peers are enabled
// and disabled while other threads allocate.
class Devices : public ::testing::TestWithParam<const char *> {};

TEST_P(Devices, EightThreadsFourDevices) {
  enum { DEVICES = 4, THREADS = 8, OPS = 400 };
  EXPSEG_SEEDED(seed, 14);
  const bool real = std::string(GetParam()).substr(0, 4) == "host";
  std::vector<Alloc> dev;
  for (int d = 0; d < DEVICES; d++) dev.push_back(make(GetParam(), d, nullptr));
  std::atomic<int64_t> allocs[DEVICES] = {};
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < THREADS; t++) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(seed + (unsigned)t);
      std::vector<std::pair<int, void *>> live;
      for (int i = 0; i < OPS; i++) {
        int d = (int)(rng() % DEVICES);
        expseg_allocator *A = dev[d].get();
        unsigned r = rng() % 100;
        if (r < 3) {
          int peer = (d + 1 + (int)(rng() % (DEVICES - 1))) % DEVICES;
          expseg_status st = r < 2 ? expseg_enable_peer_access(A, peer)
                                   : expseg_disable_peer_access(A, peer);
          if (st != EXPSEG_OK) failures++;
        } else if (r < 60 || live.empty()) {
          size_t size = (rng() % 2) ? 512 + rng() % 100000 : (1u + rng() % 8) << 20;
          void *p = nullptr;
          if (expseg_malloc(A, size, (expseg_stream)(t % 2), &p) != EXPSEG_OK || !p) {
            failures++;
            continue;
          }
          allocs[d]++;
          if (real) std::memset(p, t, 64 < size ? 64 : size); // sim memory is not real
          live.push_back({d, p});
        } else {
          size_t k = rng() % live.size();
          if (expseg_free(dev[live[k].first].get(), live[k].second) != EXPSEG_OK) failures++;
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (auto &x : live)
        if (expseg_free(dev[x.first].get(), x.second) != EXPSEG_OK) failures++;
    });
  }
  for (auto &t : ts) t.join();
  EXPECT_EQ(failures.load(), 0) << expseg_last_error();
  for (int d = 0; d < DEVICES; d++) {
    expseg_allocator *A = dev[d].get();
    EXPECT_EQ(stat_of(A, "allocation.all.allocated"), allocs[d].load()) << "device " << d;
    EXPECT_EQ(stat_of(A, "allocation.all.current"), 0) << "device " << d;
    EXPECT_EQ(EXPSEG_OK, expseg_check(A)) << expseg_last_error();
    ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(A));
    expseg_testing_driver_counts left;
    expseg_testing_destroy(dev[d].release(), &left);
    EXPECT_EQ(left.live_chunks, 0);
    EXPECT_EQ(left.mapped_bytes, 0);
    EXPECT_EQ(left.live_reservations, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, Devices,
                         ::testing::Values("host:capacity=1G", "sim:capacity=16G"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                           return std::string(i.param).substr(0, 4) == "host" ? "host" : "sim";
                         });

} // namespace
