// SPDX-License-Identifier: Apache-2.0
// test_adv16_ipc_common.h: what the adversarial sharing suites (test_adv16_ipc.cpp,
// test_adv16_ipc_stress.cpp, test_adv16_peers.cpp) share: allocators on the host driver,
// descriptor counts, byte patterns, driver counts after destroy, the exports still held,
// the access record of a range, and the three configurations the IPC tests run under.
#ifndef EXPSEG_TEST_ADV16_IPC_COMMON_H
#define EXPSEG_TEST_ADV16_IPC_COMMON_H

#include "alloc_support.h"
#include "expseg_testing.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace adv16 {

static const char *const HOST = "host:capacity=256M";
static const char *const FAULT_HOST = "fault;host:capacity=256M";

inline int open_fds() {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

inline void fill(void *p, size_t n, unsigned char seed) {
  auto *b = static_cast<unsigned char *>(p);
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed + i * 13);
}
inline bool holds(const void *p, size_t n, unsigned char seed) {
  auto *b = static_cast<const unsigned char *>(p);
  for (size_t i = 0; i < n; i++)
    if (b[i] != (unsigned char)(seed + i * 13)) return false;
  return true;
}

inline std::string err() { return expseg_last_error(); }
inline bool says(const std::string &what) { return err().find(what) != std::string::npos; }
inline std::string hex(const void *p) {
  char b[32];
  snprintf(b, sizeof b, "%" PRIxPTR, (uintptr_t)p);
  return b;
}

expseg_allocator *make(const char *driver, int device, const char *config = nullptr) {
  expseg_allocator *a = nullptr;
  EXPECT_EQ(EXPSEG_OK, expseg_create(driver, device, config, &a)) << err();
  return a;
}

inline expseg_testing_driver_counts counts(expseg_allocator *a) {
  expseg_testing_driver_counts c = {};
  EXPECT_EQ(EXPSEG_OK, expseg_testing_driver_counts_get(a, &c));
  return c;
}

inline void destroy_clean(expseg_allocator *a, const char *who) {
  expseg_testing_driver_counts left = {};
  expseg_testing_destroy(a, &left);
  EXPECT_EQ(left.live_chunks, 0) << who;
  EXPECT_EQ(left.mapped_bytes, 0) << who;
  EXPECT_EQ(left.live_reservations, 0) << who;
  EXPECT_EQ(left.live_events, 0) << who;
}

inline size_t held_of(expseg_allocator *a) {
  size_t held = 12345;
  EXPECT_EQ(EXPSEG_OK, expseg_ipc_poll(a, &held)) << err();
  return held;
}

// 2: every byte accessible from device; 1: some; 0: none.
inline int access_of(expseg_allocator *a, const void *p, size_t size, int device) {
  int state = -1;
  size_t g = alloc_test_page(a);
  uintptr_t lo = (uintptr_t)p / g * g, hi = ((uintptr_t)p + size + g - 1) / g * g;
  EXPECT_EQ(EXPSEG_OK, _expseg_vmm_has_access(alloc_test_driver(a), lo, hi - lo, device, &state))
      << err();
  return state;
}

} // namespace adv16

// The IPC suites' configurations: expandable segments, classic ones, one 2 MiB page per
// chunk (every allocation several chunks).
#define ADV16_INSTANTIATE_CONFIGS(suite)                                                   \
  INSTANTIATE_TEST_SUITE_P(                                                                \
      Cpu, suite,                                                                          \
      ::testing::Values("expandable_segments:True", "expandable_segments:False",          \
                        "expandable_segments:True,chunk_max_mb:2"),                        \
      [](const ::testing::TestParamInfo<const char *> &i) {                                \
        const std::string c = i.param;                                                     \
        return c.find("chunk_max") != std::string::npos ? "one_page_chunks"               \
               : c.find("True") != std::string::npos    ? "expandable"                    \
                                                        : "classic";                      \
      })

#endif
