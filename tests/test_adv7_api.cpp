// SPDX-License-Identifier: Apache-2.0
// test_adv7_api.cpp: the statistics seen from the outside while a seeded random mix of public
// calls runs (allocations and frees on several streams, recorded streams, private pools, a
// region put to sleep and woken, empty_cache, both resets, memory fraction and option
// changes): after every call each `all` row is the sum of its pool rows, current never
// exceeds peak, nothing goes negative, current - (allocated - freed) moves only at an
// accumulated reset, allocated <= active <= reserved (while no region sleeps), the live
// allocations match `allocation` and `requested_bytes` after an empty_cache, and the
// memory summary keeps its frame. Then single calls a hostile caller
// makes: text calls on a NULL allocator leave "", the stream calls name themselves, and
// expseg_configure names the options it accepts without effect.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "alloc_support.h"
#include "expseg.h"

namespace {

constexpr size_t MiB = size_t(1) << 20;

std::string err() { return expseg_last_error(); }

// The base names of PyTorch's StatArray keys (NAME.{all,small_pool,large_pool}.METRIC).
const char *const kArrays[] = {"allocation",     "allocated_bytes", "requested_bytes",
                               "active",         "active_bytes",    "inactive_split",
                               "inactive_split_bytes", "segment",   "reserved_bytes"};

struct Live {
  void *p;
  size_t size;
  uint64_t pool;  // 0: the general cache; else the private pool (or region) it came from
  bool region;
};

// Every check of the statistics that must hold after any call. `offset` carries, per
// key of shape current/allocated/freed, current - (allocated - freed) from the last
// accumulated reset.
void check_stats(expseg_allocator *a, std::map<std::string, int64_t> &offset, bool asleep,
                 const std::string &where) {
  StatMap m = stat_map(a);
  for (const auto &kv : m) {
    const std::string &k = kv.first;
    if (k == "max_split_size") continue;
    EXPECT_GE(kv.second, 0) << where << ": " << k;
  }
  for (const char *base : kArrays) {
    for (const char *metric : {"current", "allocated", "freed"}) {
      std::string b = base;
      int64_t all = m[b + ".all." + metric], small = m[b + ".small_pool." + metric],
              large = m[b + ".large_pool." + metric];
      EXPECT_EQ(all, small + large) << where << ": " << b << ".*." << metric;
    }
    for (const char *pool : {"all", "small_pool", "large_pool"}) {
      std::string p = std::string(base) + "." + pool + ".";
      EXPECT_LE(m[p + "current"], m[p + "peak"]) << where << ": " << p;
      int64_t off = m[p + "current"] - (m[p + "allocated"] - m[p + "freed"]);
      auto it = offset.find(p);
      if (it == offset.end()) {
        offset[p] = off;
      } else {
        EXPECT_EQ(off, it->second) << where << ": " << p << "current - (allocated - freed)";
      }
    }
  }
  for (const auto &kv : m) {
    const std::string &k = kv.first;
    size_t dot = k.rfind('.');
    if (dot == std::string::npos || k.compare(dot, std::string::npos, ".current") != 0) continue;
    std::string peak = k.substr(0, dot) + ".peak";
    if (m.count(peak)) {
      EXPECT_LE(kv.second, m[peak]) << where << ": " << k;
    }
  }
  EXPECT_LE(m["allocated_bytes.all.current"], m["active_bytes.all.current"]) << where;
  // a sleeping region's blocks stay active while its memory is given back (docs/api.md)
  if (!asleep) {
    EXPECT_LE(m["active_bytes.all.current"], m["reserved_bytes.all.current"]) << where;
  }
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << err();
}

// The summary's frame: it starts and ends with a rule |===|, and every line is as wide as
// the rule and starts and ends with '|'.
void check_summary(expseg_allocator *a, bool abbreviated, const std::string &where) {
  size_t need = expseg_memory_summary(a, nullptr, 0, abbreviated);
  ASSERT_GT(need, 0u) << where;
  std::vector<char> buf(need + 1);
  size_t got = expseg_memory_summary(a, buf.data(), buf.size(), abbreviated);
  EXPECT_EQ(got, need) << where;
  std::string text(buf.data());
  std::vector<std::string> lines;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    lines.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  ASSERT_GE(lines.size(), 3u) << where << "\n" << text;
  const size_t width = lines[0].size();
  const std::string rule = "|" + std::string(width - 2, '=') + "|";
  EXPECT_EQ(lines[0], rule) << where << "\n" << text;
  EXPECT_EQ(lines.back(), rule) << where << "\n" << text;
  for (size_t i = 1; i < lines.size(); i++) {
    EXPECT_EQ(lines[i].size(), width) << where << ": line " << i << ": '" << lines[i] << "'";
    EXPECT_EQ(lines[i].front(), '|') << where << ": line " << i;
    EXPECT_EQ(lines[i].back(), '|') << where << ": line " << i;
  }
}

struct Adv7Random : ::testing::TestWithParam<const char *> {};

TEST_P(Adv7Random, StatisticsHoldThroughEveryPublicCall) {
  EXPSEG_SEEDED(seed, 7007);
  TestRng rng(seed);
  QuietLog quiet;
  AllocPtr p = make_alloc(GetParam(), "");
  expseg_allocator *a = p.get();
  std::vector<Live> live;
  std::vector<uint64_t> pools;
  std::map<std::string, int64_t> offset;
  bool asleep = false;
  const long ops = test_ops(1500);
  for (long i = 0; i < ops; i++) {
    const unsigned op = (unsigned)rng.below(100);
    std::string where = "op " + std::to_string(i) + " (" + std::to_string(op) + ")";
    if (op < 40) {  // malloc
      size_t size = rng.below(4) == 0 ? 1 + rng.below(40 * MiB) : 1 + rng.below(MiB + 4096);
      expseg_stream s = rng.below(4);
      uint64_t pool = 0;
      bool region = false;
      void *x = nullptr;
      expseg_status st;
      unsigned where_to = (unsigned)rng.below(10);
      if (where_to == 0 && !pools.empty()) {
        pool = pools[rng.below(pools.size())];
        st = expseg_malloc_pool(a, size, s, pool, &x);
      } else if (where_to == 1 && !asleep) {
        ASSERT_EQ(expseg_region_begin(a, "r"), EXPSEG_OK) << err();
        st = expseg_malloc(a, size, s, &x);
        ASSERT_EQ(expseg_region_end(a, "r"), EXPSEG_OK) << err();
        expseg_region_info info{};
        ASSERT_EQ(expseg_region_get_info(a, "r", &info), EXPSEG_OK) << err();
        pool = info.pool;
        region = true;
      } else {
        st = expseg_malloc(a, size, s, &x);
      }
      if (st == EXPSEG_OK)
        live.push_back({x, size, pool, region});
      else
        EXPECT_EQ(st, EXPSEG_ERR_OUT_OF_MEMORY) << where << ": " << err();
    } else if (op < 70) {  // free (a region's block while it sleeps: deferred to the wake)
      if (live.empty()) continue;
      size_t k = rng.below(live.size());
      if (live[k].region && asleep) continue;
      if (rng.below(3) == 0) {
        EXPECT_EQ(expseg_record_stream(a, live[k].p, 1 + rng.below(5)), EXPSEG_OK) << err();
      }
      EXPECT_EQ(expseg_free(a, live[k].p), EXPSEG_OK) << where << ": " << err();
      live[k] = live.back();
      live.pop_back();
    } else if (op < 74) {
      EXPECT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
      if (!asleep) {  // every free completed: the counts are those of the live blocks
        int64_t req = 0;
        for (const Live &l : live) req += (int64_t)l.size;
        EXPECT_EQ(stat_of(a, "requested_bytes.all.current"), req) << where;
        EXPECT_EQ(stat_of(a, "allocation.all.current"), (int64_t)live.size()) << where;
        EXPECT_EQ(stat_of(a, "active.all.current"), (int64_t)live.size()) << where;
      }
    } else if (op < 77) {
      expseg_reset_peak_stats(a);
    } else if (op < 80) {
      expseg_reset_accumulated_stats(a);
      offset.clear();
    } else if (op < 84) {
      double f = rng.below(3) == 0 ? 1.0 : 0.05 + 0.9 * rng.unit();
      EXPECT_EQ(expseg_set_memory_fraction(a, f), EXPSEG_OK) << err();
    } else if (op < 90) {
      static const char *const texts[] = {
          "expandable_segments:False", "expandable_segments:True",
          "max_split_size_mb:40",      "garbage_collection_threshold:0.5",
          "roundup_power2_divisions:[256:4,>:2]", "roundup_power2_divisions:1",
          "page_size_mb:2",
          "va_reserve_mb:64", "va_reserve_mb:0", "page_cache_max_mb:0", "page_cache_max_mb:10",
          "single_chunk_min_mb:8", "large_segment_size_mb:40", "max_non_split_rounding_mb:60",
          "per_process_memory_fraction:0.5", "per_process_memory_fraction:1",
          "expandable_segments_reserve:0.01", "expandable_segments_reserve:4G",
          "garbage_collection_threshold:0.9", "max_split_size_mb:17592186044415",
          "expandable_segments_reserve_by_class:[a:0.01]", "page_cache_max_mb:17592186044415"};
      const char *t = texts[rng.below(sizeof texts / sizeof *texts)];
      EXPECT_EQ(expseg_configure(a, t), EXPSEG_OK) << t << ": " << err();
    } else if (op < 91) {
      if (pools.size() < 3 || rng.below(2)) {
        uint64_t id = 0;
        ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << err();
        pools.push_back(id);
      } else {
        size_t k = rng.below(pools.size());
        if (rng.below(2)) {
          EXPECT_EQ(expseg_pool_empty_cache(a, pools[k]), EXPSEG_OK) << err();
        } else {
          EXPECT_EQ(expseg_pool_release(a, pools[k]), EXPSEG_OK) << err();
          pools[k] = pools.back();
          pools.pop_back();
        }
      }
    } else if (op < 93) {
      bool have_region = false;
      for (const Live &l : live) have_region |= l.region;
      if (!have_region && !asleep) continue;
      if (asleep) {
        // a memory fraction drawn low (down to 0.05) may leave the wake no room: refused
        // with the cap named, the region still asleep (tried again at a later draw)
        expseg_status st = expseg_wake(a, "r");
        const std::string why = err();
        expseg_region_info info{};
        ASSERT_EQ(expseg_region_get_info(a, "r", &info), EXPSEG_OK) << err();
        if (st == EXPSEG_ERR_OUT_OF_MEMORY && why.find("memory fraction cap") != std::string::npos) {
          EXPECT_TRUE(info.asleep) << where;
        } else {
          EXPECT_EQ(st, EXPSEG_OK) << where << ": " << why;
          asleep = false;
        }
      } else {
        expseg_status st = expseg_sleep(a, "r", rng.below(2) ? EXPSEG_SLEEP_OFFLOAD
                                                             : EXPSEG_SLEEP_DISCARD);
        EXPECT_EQ(st, EXPSEG_OK) << where << ": " << err();
        asleep = st == EXPSEG_OK;
      }
    } else {
      check_summary(a, rng.below(2) == 0, where);
    }
    check_stats(a, offset, asleep, where);
    if (HasFailure()) {
      std::printf("first failure at %s\n", where.c_str());
      return;
    }
  }
  if (asleep) {  // with room to wake: the fraction drawn last may leave none
    EXPECT_EQ(expseg_set_memory_fraction(a, 1.0), EXPSEG_OK) << err();
    EXPECT_EQ(expseg_wake(a, "r"), EXPSEG_OK) << err();
  }
  for (const Live &l : live) EXPECT_EQ(expseg_free(a, l.p), EXPSEG_OK) << err();
  EXPECT_EQ(expseg_empty_cache(a), EXPSEG_OK) << err();
  EXPECT_EQ(stat_of(a, "allocation.all.current"), 0);
  EXPECT_EQ(stat_of(a, "requested_bytes.all.current"), 0);
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0);
}

INSTANTIATE_TEST_SUITE_P(Drivers, Adv7Random, ::testing::Values("host", "sim"));

}  // namespace

namespace {

// The calls that fill a text buffer (snprintf semantics) leave an empty string in it when
// the allocator is NULL, as expseg_memory_summary and expseg_history_user_metadata do:
// a caller printing the buffer after a failed call must not print stale bytes.
TEST(Adv7Api, TextCallsOnANullAllocatorLeaveAnEmptyString) {
  char buf[16];
  std::memset(buf, 'X', sizeof buf);
  EXPECT_EQ(expseg_config_string(nullptr, buf, sizeof buf), 0u);
  EXPECT_EQ(buf[0], '\0');
  std::memset(buf, 'X', sizeof buf);
  EXPECT_EQ(expseg_memory_summary(nullptr, buf, sizeof buf, false), 0u);
  EXPECT_EQ(buf[0], '\0');
  std::memset(buf, 'X', sizeof buf);
  EXPECT_EQ(expseg_history_user_metadata(nullptr, buf, sizeof buf), 1u);
  EXPECT_EQ(buf[0], '\0');
  // a NULL buffer, or a length of 0, is never written
  EXPECT_EQ(expseg_config_string(nullptr, nullptr, 8), 0u);
  std::memset(buf, 'X', sizeof buf);
  EXPECT_EQ(expseg_config_string(nullptr, buf, 0), 0u);
  EXPECT_EQ(buf[0], 'X');
}

}  // namespace

namespace {

// Every refusal of a public call names that call, the stream calls included.
TEST(Adv7Api, StreamCallsNameThemselves) {
  for (const char *drv : {"host", "sim"}) {
    AllocPtr p = make_alloc(drv, "");
    EXPECT_EQ(expseg_stream_create(p.get(), nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(err().rfind("expseg_stream_create: out is NULL", 0), 0u) << err();
    expseg_stream s = 0;
    EXPECT_EQ(expseg_stream_create(p.get(), &s), EXPSEG_ERR_UNSUPPORTED);
    EXPECT_NE(err().find(drv), std::string::npos) << err();
  }
}

}  // namespace

namespace {

// Options accepted without effect are named in one warning when given (docs/config.md),
// by expseg_configure as by expseg_create; a text without them warns about nothing.
TEST(Adv7Api, ConfigureNamesOptionsWithoutEffect) {
  QuietLog log;
  AllocPtr p = make_alloc("sim", "");
  ASSERT_EQ(log.lines, 0) << log.last;
  ASSERT_EQ(expseg_configure(p.get(), "release_lock_on_cudamalloc:True,"
                                      "graph_capture_record_stream_reuse:True"),
            EXPSEG_OK)
      << err();
  ASSERT_EQ(log.lines, 1);
  EXPECT_NE(log.last.find("without effect"), std::string::npos) << log.last;
  EXPECT_NE(log.last.find("release_lock_on_cudamalloc"), std::string::npos) << log.last;
  EXPECT_NE(log.last.find("graph_capture_record_stream_reuse"), std::string::npos) << log.last;
  // keys given before are not named again by a text that does not give them
  ASSERT_EQ(expseg_configure(p.get(), "max_split_size_mb:40"), EXPSEG_OK) << err();
  EXPECT_EQ(log.lines, 1) << log.last;
  // a refused text warns about nothing
  EXPECT_EQ(expseg_configure(p.get(), "pinned_free_catch_all:True,max_split_size_mb:1"),
            EXPSEG_ERR_CONFIG);
  EXPECT_EQ(log.lines, 1) << log.last;
}

}  // namespace
