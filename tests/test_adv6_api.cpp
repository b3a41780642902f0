// SPDX-License-Identifier: Apache-2.0
// test_adv6_api.cpp: the public C API driven the way a hostile caller would, where the
// other suites are thin: a region's private pool reached through the pool calls (release
// to use count 0, then a new pool taking its slot), a sleep mode that is neither offload
// nor discard, an exported allocation in a region that is put to sleep, the out-of-memory
// message and the memory summary while a region sleeps, messages fed control bytes, and
// threads around a region that sleeps and wakes.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "alloc_support.h"
#include "expseg.h"

namespace {

constexpr size_t MiB = size_t(1) << 20;

std::string err() { return expseg_last_error(); }

struct Adv6Api : ::testing::TestWithParam<const char *> {};

// One block of `size` bytes allocated in region `tag` (nullptr, the failure recorded, if not).
void *region_block(expseg_allocator *a, const char *tag, size_t size) {
  void *x = nullptr;
  EXPECT_EQ(expseg_region_begin(a, tag), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_malloc(a, size, 0, &x), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_region_end(a, tag), EXPSEG_OK) << err();
  return x;
}

// A region's pool lives as long as the allocator: releasing it to use count 0 through the
// pool calls is refused naming the region, and the region keeps working; retain + release
// in pairs stays accepted.
TEST_P(Adv6Api, RegionPoolCannotBeReleasedToZero) {
  AllocPtr p = make_alloc(GetParam(), "");
  expseg_allocator *a = p.get();
  void *x = region_block(a, "w", 3 * MiB);
  ASSERT_NE(x, nullptr);
  expseg_region_info info{};
  ASSERT_EQ(expseg_region_get_info(a, "w", &info), EXPSEG_OK) << err();
  const expseg_pool_id pool = info.pool;

  ASSERT_EQ(expseg_pool_retain(a, pool), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_pool_release(a, pool), EXPSEG_OK) << err();
  StatMap before = without_times(stat_map(a));
  EXPECT_EQ(expseg_pool_release(a, pool), EXPSEG_ERR_INVALID_ARGUMENT);
  std::string msg = err();
  EXPECT_NE(msg.find("\"w\""), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(pool)), std::string::npos) << msg;
  EXPECT_EQ(without_times(stat_map(a)), before);
  int uc = 0;
  ASSERT_EQ(expseg_pool_use_count(a, pool, &uc), EXPSEG_OK) << err();
  EXPECT_EQ(uc, 1);

  // Its last block freed: a new pool must not take the region's slot.
  ASSERT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
  expseg_pool_id other = 0;
  ASSERT_EQ(expseg_pool_create(a, &other), EXPSEG_OK) << err();
  void *y = nullptr;
  ASSERT_EQ(expseg_malloc_pool(a, 2 * MiB, 0, other, &y), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_sleep(a, "w", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << err();
  // The other pool is untouched by the region's sleep.
  void *z = nullptr;
  EXPECT_EQ(expseg_malloc_pool(a, 1000, 0, other, &z), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_free(a, z), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_wake(a, "w"), EXPSEG_OK) << err();
  // The region still allocates from its own pool.
  ASSERT_EQ(expseg_region_begin(a, "w"), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_malloc(a, 1000, 0, &z), EXPSEG_OK) << err();
  expseg_pool_id of = 0;
  ASSERT_EQ(expseg_pool_of(a, z, &of), EXPSEG_OK) << err();
  EXPECT_EQ(of, pool);
  ASSERT_EQ(expseg_region_end(a, "w"), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_free(a, z), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_free(a, y), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_pool_release(a, other), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << err();
}

// Only EXPSEG_SLEEP_OFFLOAD (0) and EXPSEG_SLEEP_DISCARD (1) are modes: any other value,
// -1 included, is refused naming it, and an asleep region stays asleep.
TEST_P(Adv6Api, SleepModeOtherThanTheTwoIsRefused) {
  AllocPtr p = make_alloc(GetParam(), "");
  expseg_allocator *a = p.get();
  void *x = region_block(a, "r", 5 * MiB);
  ASSERT_NE(x, nullptr);
  for (int mode : {-1, 2, 7, INT32_MIN, INT32_MAX}) {
    EXPECT_EQ(expseg_sleep(a, "r", (expseg_sleep_mode)mode), EXPSEG_ERR_INVALID_ARGUMENT)
        << mode;
    EXPECT_NE(err().find("mode " + std::to_string(mode)), std::string::npos) << err();
  }
  expseg_region_info info{};
  ASSERT_EQ(expseg_region_get_info(a, "r", &info), EXPSEG_OK) << err();
  EXPECT_FALSE(info.asleep);
  ASSERT_EQ(expseg_sleep(a, "r", EXPSEG_SLEEP_DISCARD), EXPSEG_OK) << err();
  for (int mode : {-1, 2}) {
    EXPECT_EQ(expseg_sleep(a, "r", (expseg_sleep_mode)mode), EXPSEG_ERR_INVALID_ARGUMENT)
        << mode;
    ASSERT_EQ(expseg_region_get_info(a, "r", &info), EXPSEG_OK) << err();
    EXPECT_TRUE(info.asleep) << "expseg_sleep with mode " << mode << " woke the region";
    EXPECT_EQ(info.wakes, 0u);
  }
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_wake(a, "r"), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << err();
}

// An exported allocation's memory is never released under an importer (docs/ipc.md): a
// region holding one refuses to sleep, naming the pointer, and stays awake with importer and
// exporter still sharing the bytes; a sleeping region's blocks cannot be exported (no memory
// behind them). Once the importer closes and the handle is freed, the sleep goes through.
TEST(Adv6Ipc, ExportedBlockKeepsItsRegionAwake) {
  AllocPtr pa = make_alloc("host", ""), pb = make_alloc("host", "");
  expseg_allocator *a = pa.get(), *b = pb.get();
  ASSERT_EQ(expseg_region_begin(a, "kv"), EXPSEG_OK) << err();
  void *x = nullptr, *y = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4 * MiB, 0, &x), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_malloc(a, 1 * MiB, 0, &y), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_region_end(a, "kv"), EXPSEG_OK) << err();
  expseg_ipc_handle h{};
  ASSERT_EQ(expseg_ipc_export(a, x, &h), EXPSEG_OK) << err();
  void *q = nullptr;
  ASSERT_EQ(expseg_ipc_import(b, &h, &q), EXPSEG_OK) << err();
  std::memset(x, 0x5a, 4 * MiB);

  StatMap before = without_times(stat_map(a));
  EXPECT_EQ(expseg_sleep(a, "kv", EXPSEG_SLEEP_OFFLOAD), EXPSEG_ERR_INVALID_ARGUMENT);
  char want[64];
  std::snprintf(want, sizeof want, "%p", x);
  EXPECT_NE(err().find(want), std::string::npos) << err();
  EXPECT_NE(err().find("kv"), std::string::npos) << err();
  expseg_region_info info{};
  ASSERT_EQ(expseg_region_get_info(a, "kv", &info), EXPSEG_OK) << err();
  EXPECT_FALSE(info.asleep);
  EXPECT_EQ(without_times(stat_map(a)), before);
  // Still one memory: a write through the importer is seen by the exporter.
  static_cast<unsigned char *>(q)[12345] = 0x11;
  EXPECT_EQ(static_cast<unsigned char *>(x)[12345], 0x11);
  EXPECT_EQ(static_cast<unsigned char *>(x)[12346], 0x5a);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << err();

  ASSERT_EQ(expseg_ipc_close(b, q), EXPSEG_OK) << err();
  expseg_ipc_handle_free(&h);
  ASSERT_EQ(expseg_sleep(a, "kv", EXPSEG_SLEEP_OFFLOAD), EXPSEG_OK) << err();
  expseg_ipc_handle h2{};
  EXPECT_EQ(expseg_ipc_export(a, y, &h2), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err().find("\"kv\""), std::string::npos) << err();
  EXPECT_NE(err().find("asleep"), std::string::npos) << err();
  EXPECT_EQ(h2.data, nullptr);
  EXPECT_EQ(h2.n_fds, 0u);
  size_t held = 9;
  ASSERT_EQ(expseg_ipc_poll(a, &held), EXPSEG_OK) << err();
  EXPECT_EQ(held, 0u);
  ASSERT_EQ(expseg_wake(a, "kv"), EXPSEG_OK) << err();
  EXPECT_EQ(static_cast<unsigned char *>(x)[12345], 0x11);
  EXPECT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_free(a, y), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_check(b), EXPSEG_OK) << err();
}

// An out-of-memory message while a region sleeps: the sleeping region's allocated bytes hold
// no memory, so "holds H: A allocated, C cached" must not count them in A (C was H - A, which
// wrapped around to 16 EiB); the message names them apart.
TEST_P(Adv6Api, OomWhileARegionSleepsCountsWhatIsHeld) {
  AllocPtr p = make_alloc(GetParam(), "");
  expseg_allocator *a = p.get();
  void *x = region_block(a, "w", 40 * MiB), *g = nullptr, *h = nullptr;
  ASSERT_NE(x, nullptr);
  ASSERT_EQ(expseg_malloc(a, 4 * MiB, 0, &g), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_sleep(a, "w", EXPSEG_SLEEP_DISCARD), EXPSEG_OK) << err();
  expseg_info info{};
  ASSERT_EQ(expseg_get_info(a, &info), EXPSEG_OK) << err();
  // a cap just above what is held: the next large request fails on the cap
  const double f = double(8 * MiB) / double(info.total_memory);
  ASSERT_EQ(expseg_set_memory_fraction(a, f), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_malloc(a, 30 * MiB, 0, &h), EXPSEG_ERR_OUT_OF_MEMORY);
  std::string msg = err();
  EXPECT_EQ(msg.find("EiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("in sleeping regions"), std::string::npos) << msg;
  EXPECT_NE(msg.find("40.00 MiB in sleeping regions"), std::string::npos) << msg;
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_set_memory_fraction(a, 1.0), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_wake(a, "w"), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_free(a, g), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << err();
}

// The summary's "Mapped memory" row while a region sleeps: only what is mapped now (the
// sleeping segments' layouts are not), so for expandable segments it equals
// expseg.mapped_bytes; fragmentation is the free share of that, the sleeping blocks left out.
std::string summary_row(expseg_allocator *a, const char *row) {
  std::vector<char> buf(1 << 16);
  expseg_memory_summary(a, buf.data(), buf.size(), false);
  std::string s(buf.data());
  size_t at = s.find(row);
  if (at == std::string::npos) return "";
  size_t bar = s.find('|', at);
  size_t end = s.find('|', bar + 1);
  std::string cell = s.substr(bar + 1, end - bar - 1);
  cell.erase(0, cell.find_first_not_of(' '));
  cell.erase(cell.find_last_not_of(' ') + 1);
  return cell;
}

TEST_P(Adv6Api, SummaryWhileARegionSleepsShowsWhatIsMapped) {
  AllocPtr p = make_alloc(GetParam(), "expandable_segments:True");
  expseg_allocator *a = p.get();
  void *x = region_block(a, "w", 40 * MiB), *g = nullptr;
  ASSERT_NE(x, nullptr);
  ASSERT_EQ(expseg_malloc(a, 3 * MiB, 0, &g), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_sleep(a, "w", EXPSEG_SLEEP_DISCARD), EXPSEG_OK) << err();
  const int64_t mapped = stat_of(a, "expseg.mapped_bytes.current");
  EXPECT_EQ(mapped, int64_t(4 * MiB));
  EXPECT_EQ(summary_row(a, "Mapped memory"), std::to_string(mapped >> 10) + " KiB");
  EXPECT_EQ(summary_row(a, "Fragmentation"), "25.00%"); // 1 of 4 MiB mapped is free
  ASSERT_EQ(expseg_wake(a, "w"), EXPSEG_OK) << err();
  EXPECT_EQ(summary_row(a, "Mapped memory"), std::to_string(44 * 1024) + " KiB");
  EXPECT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_free(a, g), EXPSEG_OK) << err();
}

// expseg_last_error() is one line (expseg.h) whatever the caller passed: a tag, class name
// or option text holding a newline or other control byte is shown with '?' in its place.
TEST_P(Adv6Api, MessagesStayOneLineWhateverTheInput) {
  AllocPtr p = make_alloc(GetParam(), "");
  expseg_allocator *a = p.get();
  auto one_line = [](const std::string &m) {
    for (unsigned char c : m)
      if (c < 0x20 || c == 0x7f) return false;
    return true;
  };
  EXPECT_EQ(expseg_region_begin(a, "kv\ncache"), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(one_line(err())) << err();
  EXPECT_NE(err().find("kv?cache"), std::string::npos) << err();
  EXPECT_EQ(expseg_region_begin(a, "\x7f\x1b[2J"), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(one_line(err())) << err();
  EXPECT_EQ(expseg_sleep(a, "a\rb", EXPSEG_SLEEP_OFFLOAD), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(one_line(err())) << err();
  EXPECT_EQ(expseg_stream_set_reserve_class(a, 0, "x\ny"), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(one_line(err())) << err();
  EXPECT_NE(expseg_configure(a, "bad\nkey:1"), EXPSEG_OK);
  EXPECT_TRUE(one_line(err())) << err();
  EXPECT_NE(expseg_configure(a, "bogus\t_key:1"), EXPSEG_OK);
  EXPECT_TRUE(one_line(err())) << err();
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << err();
}

// Threads on one allocator: one cycles a region through allocate, sleep (either mode), a
// free while asleep and wake; two allocate and free in the general cache; one reads the
// state (snapshot, walk, summary, check, region info) and resets peaks and empties the
// cache; one retains and releases the region's pool in pairs and tries to release it to 0
// (always refused). Every call's result is as documented, and nothing is left at the end.
TEST_P(Adv6Api, ThreadsAroundASleepingRegion) {
  const uint64_t seed = test_seed(6);
  SCOPED_TRACE(test_seed_note(seed));
  AllocPtr p = make_alloc(GetParam(), "");
  expseg_allocator *a = p.get();
  ASSERT_EQ(expseg_region_begin(a, "r"), EXPSEG_OK) << err();
  ASSERT_EQ(expseg_region_end(a, "r"), EXPSEG_OK) << err();
  expseg_region_info ri{};
  ASSERT_EQ(expseg_region_get_info(a, "r", &ri), EXPSEG_OK) << err();
  const expseg_pool_id pool = ri.pool;
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::mutex mu;
  std::string first;
  auto fail = [&](const char *what) {
    std::lock_guard<std::mutex> g(mu);
    if (bad++ == 0) first = std::string(what) + ": " + err();
  };
  std::vector<std::thread> ts;
  ts.emplace_back([&] {
    TestRng rng(seed);
    for (int i = 0; i < 40; i++) {
      void *r[3] = {};
      if (expseg_region_begin(a, "r") != EXPSEG_OK) fail("region_begin");
      for (void *&v : r)
        if (expseg_malloc(a, rng.below(6 * MiB) + 1, rng.below(3), &v) != EXPSEG_OK)
          fail("region malloc");
      if (expseg_region_end(a, "r") != EXPSEG_OK) fail("region_end");
      if (expseg_free(a, r[0]) != EXPSEG_OK) fail("free awake");
      if (expseg_sleep(a, "r", (expseg_sleep_mode)rng.below(2)) != EXPSEG_OK) fail("sleep");
      if (expseg_free(a, r[1]) != EXPSEG_OK) fail("free asleep");
      if (expseg_wake(a, "r") != EXPSEG_OK) fail("wake");
      if (expseg_free(a, r[2]) != EXPSEG_OK) fail("free woken");
    }
  });
  for (int k = 0; k < 2; k++)
    ts.emplace_back([&, k] {
      TestRng rng(seed + 1 + k);
      void *q[8] = {};
      for (int i = 0; i < 800; i++) {
        void *&v = q[rng.below(8)];
        if (v != nullptr) {
          if (expseg_free(a, v) != EXPSEG_OK) fail("free");
          v = nullptr;
        } else if (expseg_malloc(a, rng.below(4 * MiB) + 1, 10 + k, &v) != EXPSEG_OK) {
          fail("malloc");
        }
      }
      for (void *v : q)
        if (v != nullptr && expseg_free(a, v) != EXPSEG_OK) fail("free at end");
    });
  ts.emplace_back([&] {
    std::vector<char> sum(1 << 15);
    while (!stop) {
      unsigned char *b = nullptr;
      size_t l = 0;
      if (expseg_snapshot_ex(a, EXPSEG_SNAPSHOT_NO_TRACES, &b, &l) != EXPSEG_OK) fail("snapshot");
      expseg_snapshot_free(b);
      if (expseg_walk(a, [](void *, const expseg_walk_segment *) {}, nullptr, nullptr) !=
          EXPSEG_OK)
        fail("walk");
      expseg_memory_summary(a, sum.data(), sum.size(), true);
      if (std::strstr(sum.data(), "EiB") != nullptr) fail("summary shows EiB");
      if (expseg_empty_cache(a) != EXPSEG_OK) fail("empty_cache");
      expseg_reset_peak_stats(a);
      if (expseg_check(a) != EXPSEG_OK) fail("check");
      expseg_region_info info{};
      if (expseg_region_get_info(a, "r", &info) != EXPSEG_OK) fail("region_get_info");
    }
  });
  ts.emplace_back([&] {
    while (!stop) {
      if (expseg_pool_retain(a, pool) != EXPSEG_OK) fail("retain");
      if (expseg_pool_release(a, pool) != EXPSEG_OK) fail("release after retain");
      if (expseg_pool_release(a, pool) != EXPSEG_ERR_INVALID_ARGUMENT) fail("release to 0");
    }
  });
  for (size_t i = 0; i < 3; i++) ts[i].join();
  stop = true;
  for (size_t i = 3; i < ts.size(); i++) ts[i].join();
  EXPECT_EQ(bad.load(), 0) << "first: " << first;
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << err();
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0);
  int uc = 0;
  EXPECT_EQ(expseg_pool_use_count(a, pool, &uc), EXPSEG_OK) << err();
  EXPECT_EQ(uc, 1);
  expect_nothing_left(p.release(), "threads");
}

INSTANTIATE_TEST_SUITE_P(Drivers, Adv6Api, ::testing::Values("host", "sim"));

}  // namespace
