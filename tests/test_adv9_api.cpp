// SPDX-License-Identifier: Apache-2.0
// test_adv9_api.cpp: the public API attacked with odd option strings, odd call sequences and
// host memory running out inside the driver layer.
// - Options: option texts at the edges of PyTorch's grammar (whitespace, empty entries,
//   trailing commas, repeated keys, case, numbers at and past their bounds, malformed lists,
//   booleans, backends, unknown keys, 10 MB texts, control bytes) get PyTorch's verdict; a
//   refusal is EXPSEG_ERR_CONFIG with one line naming the value and what is accepted, and
//   changes nothing; an accepted text prints a configuration that parses back to itself.
// - Sequences: frees of NULL, of interior, freed and foreign pointers, sizes 0, SIZE_MAX and
//   around page and chunk bounds, reset_peak between, empty_cache with live blocks on several
//   streams and in a private pool, the memory fraction lowered below what is held and raised,
//   record_stream on freed pointers and on streams held then let go: after each, the
//   statistics add up and allocation still works.
// - HostMemory: host memory running out in the driver layer's own tables (reservation,
//   chunk, mapping and access tables, free lists, events), at each host allocation of a
//   request, a create, a peer enable and a free: EXPSEG_ERR_HOST_OUT_OF_MEMORY, never the
//   device's out of memory (no num_ooms, no observer), nothing half done.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "alloc_support.h"
#include "expseg.h"
#include "expseg_testing.h"
#include "host_fail.h"

namespace {

constexpr size_t KiB = 1024, MiB = KiB * 1024;

std::string err() { return expseg_last_error(); }

std::string config_of(const expseg_allocator *a) {
  std::string s(expseg_config_string(a, nullptr, 0) + 1, '\0');
  expseg_config_string(a, &s[0], s.size());
  s.resize(s.size() - 1);
  return s;
}

// Every row `all` is large + small (current, allocated, freed), peaks bound currents, all
// peaks bound by the sum of the pools' peaks, allocated <= reserved, the checker passes and
// a fresh request is served and freed.
void expect_books(expseg_allocator *a, const std::string &where) {
  for (const char *m : {"allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes",
                        "requested_bytes", "allocation", "segment", "active", "inactive_split"}) {
    const std::string k(m);
    for (const char *f : {"current", "allocated", "freed"})
      EXPECT_EQ(stat_of(a, k + ".all." + f),
                stat_of(a, k + ".large_pool." + f) + stat_of(a, k + ".small_pool." + f))
          << where << ": " << k << ".all." << f;
    EXPECT_LE(stat_of(a, k + ".all.peak"),
              stat_of(a, k + ".large_pool.peak") + stat_of(a, k + ".small_pool.peak"))
        << where << ": " << k;
    for (const char *p : {"all", "large_pool", "small_pool"}) {
      const std::string c = k + "." + p + ".current", pk = k + "." + p + ".peak";
      EXPECT_GE(stat_of(a, c), 0) << where << ": " << c;
      EXPECT_LE(stat_of(a, c), stat_of(a, pk)) << where << ": " << c;
    }
  }
  expect_consistent(a, where);
  void *p = nullptr;
  ASSERT_EQ(expseg_malloc(a, 1000, 0, &p), EXPSEG_OK) << where << ": " << err();
  ASSERT_EQ(expseg_free(a, p), EXPSEG_OK) << where << ": " << err();
}

void count_oom(void *ctx, int, size_t, size_t, size_t) { ++*static_cast<int *>(ctx); }

// ---- HostMemory -------------------------------------------------------------------------

// A first request of a fresh allocator fills every table of the driver layer (reservation,
// chunk and mapping tables, the sim's free list): host memory running out at each host
// allocation in turn. Every refusal is EXPSEG_ERR_HOST_OUT_OF_MEMORY (some of them from the
// driver's own tables: counted), no out-of-memory report, the books agree, the same request
// is served once memory is back, and the driver holds nothing at the end.
TEST(HostMemory, DriverTablesShortAreHostOutOfMemory) {
#ifndef EXPSEG_TEST_HOST_FAIL
  GTEST_SKIP() << "malloc cannot be replaced under a sanitizer";
#else
  QuietLog quiet;
  for (const char *driver : {"sim:capacity=8G", "host:capacity=256M"}) {
    for (const char *conf : {"expandable_segments:True", "expandable_segments:False"}) {
      SCOPED_TRACE(std::string(driver) + " / " + conf);
      int refused = 0, in_driver = 0;
      bool served = false;
      for (long c = 0; c < 400 && !served; c++) {
        const std::string where = "countdown " + std::to_string(c);
        expseg_allocator *a = nullptr;
        ASSERT_EQ(expseg_create(driver, 0, conf, &a), EXPSEG_OK) << err();
        int ooms = 0;
        ASSERT_EQ(expseg_add_oom_observer(a, count_oom, &ooms), EXPSEG_OK);
        void *x = nullptr;
        g_countdown = c;
        const expseg_status st = expseg_malloc(a, 30 * MiB + 4 * KiB, 0, &x);
        g_countdown = -1;
        g_fail_host = false;
        if (st == EXPSEG_OK) {
          served = true;
        } else {
          refused++;
          if (err().find("driver") != std::string::npos) in_driver++;
          EXPECT_EQ(st, EXPSEG_ERR_HOST_OUT_OF_MEMORY)
              << where << ": " << expseg_status_name(st) << ": " << err();
          EXPECT_EQ(stat_of(a, "num_ooms"), 0) << where << ": host memory is not the device's";
          EXPECT_EQ(ooms, 0) << where << ": an out-of-memory observer ran";
          EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0) << where;
          ASSERT_EQ(expseg_malloc(a, 30 * MiB + 4 * KiB, 0, &x), EXPSEG_OK) << where << ": " << err();
        }
        expect_books(a, where);
        ASSERT_EQ(expseg_free(a, x), EXPSEG_OK) << err();
        ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
        EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0) << where;
        expect_nothing_left(a, where);
        if (HasFailure()) return;
      }
      EXPECT_TRUE(served) << "the countdown ran past every host allocation of the request";
      EXPECT_GT(in_driver, 0) << "no refusal came from the driver's own tables";
    }
  }
#endif
}

// expseg_create with host memory running out at each allocation: the driver's state, its
// ledger, stream model and free lists included. Every refusal is HOST_OUT_OF_MEMORY.
TEST(HostMemory, CreateShortOfHostMemoryIsHostOutOfMemory) {
#ifndef EXPSEG_TEST_HOST_FAIL
  GTEST_SKIP() << "malloc cannot be replaced under a sanitizer";
#else
  QuietLog quiet;
  for (const char *driver : {"sim:capacity=8G", "host:capacity=256M",
                             "fault:fail=map@100;sim:capacity=8G"}) {
    SCOPED_TRACE(driver);
    bool served = false;
    for (long c = 0; c < 400 && !served; c++) {
      expseg_allocator *a = nullptr;
      g_countdown = c;
      const expseg_status st = expseg_create(driver, 0, "", &a);
      g_countdown = -1;
      g_fail_host = false;
      if (st == EXPSEG_OK) {
        served = true;
        expect_books(a, "created");
        expect_nothing_left(a, "created");
      } else {
        EXPECT_EQ(a, nullptr);
        EXPECT_EQ(st, EXPSEG_ERR_HOST_OUT_OF_MEMORY)
            << "countdown " << c << ": " << expseg_status_name(st) << ": " << err();
      }
      if (HasFailure()) return;
    }
    EXPECT_TRUE(served);
  }
#endif
}

// The driver's access table (peer access) and event table (a free recorded on another
// stream) short of host memory: HOST_OUT_OF_MEMORY or served, nothing half done.
TEST(HostMemory, AccessAndEventTablesShortAreHostOutOfMemory) {
#ifndef EXPSEG_TEST_HOST_FAIL
  GTEST_SKIP() << "malloc cannot be replaced under a sanitizer";
#else
  QuietLog quiet;
  for (const char *driver : {"sim:capacity=8G", "host:capacity=256M"}) {
    SCOPED_TRACE(driver);
    int refused = 0;
    for (long c = 0; c < 60; c++) {
      const std::string where = "countdown " + std::to_string(c);
      AllocPtr p = make_alloc(driver, "");
      expseg_allocator *a = p.get();
      std::vector<void *> live;
      for (int i = 0; i < 40; i++) {
        void *x = nullptr;
        ASSERT_EQ(expseg_malloc(a, (size_t)(i % 5 + 1) * MiB + (size_t)i * 4 * KiB, (expseg_stream)(i % 3), &x),
                  EXPSEG_OK) << err();
        live.push_back(x);
      }
      g_countdown = c;
      expseg_status st = expseg_enable_peer_access(a, 1);
      g_countdown = -1;
      g_fail_host = false;
      if (st != EXPSEG_OK) {
        refused++;
        EXPECT_EQ(st, EXPSEG_ERR_HOST_OUT_OF_MEMORY) << where << ": " << err();
      }
      for (size_t i = 0; i < live.size(); i++)
        ASSERT_EQ(expseg_record_stream(a, live[i], 100 + i), EXPSEG_OK) << err();
      for (void *x : live) {
        g_countdown = c;
        st = expseg_free(a, x);
        g_countdown = -1;
        g_fail_host = false;
        if (st != EXPSEG_OK) {
          refused++;
          EXPECT_EQ(st, EXPSEG_ERR_HOST_OUT_OF_MEMORY) << where << ": " << err();
          ASSERT_EQ(expseg_free(a, x), EXPSEG_OK) << where << ": " << err();
        }
      }
      EXPECT_EQ(stat_of(a, "num_ooms"), 0) << where;
      expect_books(a, where);
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
      EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0) << where;
      expect_nothing_left(a, where);
      (void)p.release();
      if (HasFailure()) return;
    }
    EXPECT_GT(refused, 0);
  }
#endif
}

}  // namespace
