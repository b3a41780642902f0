// SPDX-License-Identifier: Apache-2.0
// test_alloc_random.cpp: seeded random operations against the allocator with expseg_check
// after every step. Mixed sizes (1 B .. 64 MiB) on several streams, frees, record_stream on
// held streams (pending frees), empty_cache, run-time configure (expandable segments on/off,
// max_split_size_mb, garbage collection), memory fraction changes (OOMs allowed then, and
// they must be clean). The sim run checks bookkeeping (no overlap, alignment, counts, no
// leak at destroy); the host run writes a pattern into every block and checks it before the
// free and after every cache release, so pages moved or unmapped under a live block show.
//
// EXPSEG_TEST_SEED: the seed (printed). EXPSEG_TEST_OPS: operations of the sim run (default
// 200000; the host run does a tenth).
#include "alloc_support.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cinttypes>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

using Rng = TestRng;

// Sizes as a training job asks for them: many small tensors, a body of 1-10 MiB ones, a
// tail of big ones, with some exact powers of two and odd byte counts.
size_t random_size(Rng &r) {
  double u = r.unit();
  auto log_uniform = [&](double lo, double hi) {
    return (size_t)std::exp(std::log(lo) + r.unit() * (std::log(hi) - std::log(lo)));
  };
  if (u < 0.05) return 1 + r.below(512);
  if (u < 0.50) return log_uniform(512, (double)MiB);
  if (u < 0.82) return log_uniform((double)MiB, 10.0 * MiB);
  if (u < 0.95) return log_uniform(10.0 * MiB, 64.0 * MiB);
  return (size_t)1 << (10 + r.below(17));  // 1 KiB .. 64 MiB exactly
}

struct Live {
  size_t size;
  expseg_stream stream;
  uint64_t tag;
};

struct Harness {
  expseg_allocator *a;
  bool pattern;  // write and check bytes (host driver)
  std::map<uintptr_t, Live> live;
  std::vector<std::string> recent;  // ring of recent operations, for failure messages
  size_t recent_at = 0;
  uint64_t step = 0, ooms = 0, mallocs = 0, frees = 0, pending_frees = 0, configures = 0;
  bool held[4] = {false, false, false, false};
  size_t total_mem = 0;  // the device's memory; the allocator's limit is fraction of it
  double fraction = 1.0;

  void note(const std::string &s) {
    if (recent.size() < 24) recent.push_back(s);
    else recent[recent_at++ % 24] = s;
  }
  std::string history() const {
    std::string out;
    size_t n = recent.size();
    for (size_t i = 0; i < n; i++) out += "  " + recent[(recent_at + i) % n] + "\n";
    return out;
  }

  static uint8_t byte_at(uint64_t tag, size_t off) {
    uint64_t x = (tag ^ (off * 0x9E3779B97F4A7C15ull)) * 0xD6E8FEB86659FD93ull;
    return (uint8_t)(x >> 56);
  }
  static void spots(size_t size, size_t *offs, size_t *n) {  // offsets written / checked
    size_t k = 0;
    for (size_t i = 0; i < 64 && i < size; i++) offs[k++] = i;
    for (size_t i = size > 64 ? size - 64 : 64; i < size; i++) offs[k++] = i;
    for (size_t j = 1; j < 8; j++) offs[k++] = size * j / 8;
    *n = k;
  }
  void write(uintptr_t p, const Live &l) {
    size_t offs[140], n;
    spots(l.size, offs, &n);
    for (size_t i = 0; i < n; i++) reinterpret_cast<uint8_t *>(p)[offs[i]] = byte_at(l.tag, offs[i]);
  }
  bool verify(uintptr_t p, const Live &l) {
    size_t offs[140], n;
    spots(l.size, offs, &n);
    for (size_t i = 0; i < n; i++) {
      uint8_t got = reinterpret_cast<const uint8_t *>(p)[offs[i]];
      if (got != byte_at(l.tag, offs[i])) {
        ADD_FAILURE() << "step " << step << ": block " << (void *)p << " (+" << l.size
                      << ", stream " << l.stream << ") byte " << offs[i] << " is "
                      << (int)got << ", wrote " << (int)byte_at(l.tag, offs[i]) << "\nrecent:\n"
                      << history();
        return false;
      }
    }
    return true;
  }
  bool verify_all() {
    if (!pattern) return true;
    for (auto &kv : live)
      if (!verify(kv.first, kv.second)) return false;
    return true;
  }

  bool check() {
    expseg_status st = expseg_check(a);
    if (st != EXPSEG_OK) {
      ADD_FAILURE() << "step " << step << ": expseg_check: " << expseg_last_error()
                    << "\nrecent:\n" << history();
      return false;
    }
    return true;
  }

  bool do_malloc(size_t size, expseg_stream s) {
    void *p = nullptr;
    expseg_status st = expseg_malloc(a, size, s, &p);
    mallocs++;
    note("malloc(" + std::to_string(size) + ", stream " + std::to_string(s) + ") -> " +
         std::string(expseg_status_name(st)));
    if (st == EXPSEG_ERR_OUT_OF_MEMORY) {
      ooms++;
      if (p != nullptr || std::strstr(expseg_last_error(), "out of memory") == nullptr) {
        ADD_FAILURE() << "step " << step << ": OOM with p=" << p << " message: "
                      << expseg_last_error();
        return false;
      }
      // What the budget allows: an OOM has given back every free cached segment and page,
      // so what is still reserved is held by live or pending blocks. When that plus the
      // largest segment this request could need (its size rounded up to a power of two, the
      // coarsest roundup_power2_divisions used here, or a 20 MiB large segment, plus a 2 MiB
      // page of rounding) fits under the limit, the OOM was spurious.
      int64_t reserved = stat_of(a, "reserved_bytes.all.current");
      size_t pow2 = 1;
      while (pow2 < size) pow2 <<= 1;
      const size_t need = std::max(pow2, (size_t)20 << 20) + (2u << 20);
      const double limit = fraction * (double)total_mem;
      if ((double)reserved + (double)need <= limit) {
        ADD_FAILURE() << "step " << step << ": spurious OOM for malloc(" << size
                      << "): reserved " << reserved << " + " << need << " <= limit " << limit
                      << " (fraction " << fraction << ")\nmessage: " << expseg_last_error()
                      << "\nrecent:\n" << history();
        return false;
      }
      return true;
    }
    if (st != EXPSEG_OK || p == nullptr) {
      ADD_FAILURE() << "step " << step << ": malloc(" << size << ") -> "
                    << expseg_status_name(st) << ": " << expseg_last_error() << "\nrecent:\n"
                    << history();
      return false;
    }
    uintptr_t u = reinterpret_cast<uintptr_t>(p);
    if (u % 512 != 0) {
      ADD_FAILURE() << "step " << step << ": " << p << " is not 512-byte aligned";
      return false;
    }
    auto it = live.lower_bound(u);
    if ((it != live.end() && it->first < u + size) ||
        (it != live.begin() && std::prev(it)->first + std::prev(it)->second.size > u)) {
      ADD_FAILURE() << "step " << step << ": " << p << " (+" << size
                    << ") overlaps a live block\nrecent:\n" << history();
      return false;
    }
    Live l{size, s, (uint64_t)step * 2654435761u + u};
    if (pattern) write(u, l);
    live.emplace(u, l);
    return true;
  }

  bool do_free(Rng &r) {
    if (live.empty()) return true;
    auto it = live.lower_bound((uintptr_t)r.next());
    if (it == live.end()) it = live.begin();
    uintptr_t u = it->first;
    if (pattern && !verify(u, it->second)) return false;
    // sometimes the block was used on other (possibly held) streams too
    bool recorded = false;
    if (r.chance(0.15)) {
      int k = 1 + (int)r.below(2);
      for (int i = 0; i < k; i++) {
        expseg_stream other = 100 + r.below(4);
        expseg_status st = expseg_record_stream(a, (void *)u, other);
        if (st != EXPSEG_OK) {
          ADD_FAILURE() << "step " << step << ": record_stream: " << expseg_last_error();
          return false;
        }
        recorded = true;
      }
    }
    expseg_status st = expseg_free(a, (void *)u);
    note(std::string("free(") + std::to_string(it->second.size) + ", stream " +
         std::to_string(it->second.stream) + (recorded ? ", recorded)" : ")"));
    if (st != EXPSEG_OK) {
      ADD_FAILURE() << "step " << step << ": free: " << expseg_last_error();
      return false;
    }
    frees++;
    pending_frees += recorded;
    live.erase(it);
    return true;
  }
};

void run_random(const char *driver, size_t ops, uint64_t seed, bool pattern) {
  expseg_vmm_t *inner = nullptr, *borrow = nullptr;
  ASSERT_EQ(_expseg_vmm_open(driver, 0, &inner), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(alloc_test_borrow(inner, &borrow), EXPSEG_OK);
  expseg_allocator *a = nullptr;
  ASSERT_EQ(alloc_test_create(borrow, "", &a), EXPSEG_OK) << expseg_last_error();
  QuietLog quiet;  // held streams make empty_cache warn; count instead of printing
  Harness h{a, pattern, {}, {}};
  Rng r(seed);
  size_t total_mem = 0, dummy = 0;
  _expseg_vmm_mem_info(inner, &dummy, &total_mem);
  h.total_mem = total_mem;
  const size_t budget = total_mem * 3 / 4;  // live bytes kept below this (when fraction = 1)
  size_t live_bytes = 0;
  double fraction = 1.0;
  auto t0 = std::chrono::steady_clock::now();
  bool ok = true;
  for (h.step = 0; h.step < ops && ok; h.step++) {
    uint64_t op = r.below(1000);
    live_bytes = 0;
    if (h.live.size() < 4096)
      for (auto &kv : h.live) live_bytes += kv.second.size;
    bool must_free = h.live.size() > 600 || live_bytes > budget;
    if (must_free || op < 400) {
      if (!h.live.empty() && (must_free || op < 400) && (must_free || r.chance(0.9)))
        ok = h.do_free(r);
      else
        ok = h.do_malloc(random_size(r), r.below(6));
    } else if (op < 850) {
      ok = h.do_malloc(random_size(r), r.below(6));
    } else if (op < 880) {  // record_stream on a live block; later freed -> pending
      if (!h.live.empty()) {
        auto it = h.live.lower_bound((uintptr_t)r.next());
        if (it == h.live.end()) it = h.live.begin();
        expseg_stream other = r.chance(0.5) ? 100 + r.below(4) : r.below(6);
        expseg_status st = expseg_record_stream(a, (void *)it->first, other);
        h.note("record_stream(" + std::to_string(other) + ")");
        if (st != EXPSEG_OK) {
          ADD_FAILURE() << "record_stream: " << expseg_last_error();
          ok = false;
        }
      }
    } else if (op < 900) {  // hold or release one of the record streams 100..103
      int k = (int)r.below(4);
      h.held[k] = !h.held[k];
      h.note(std::string(h.held[k] ? "hold" : "release") + " stream " + std::to_string(100 + k));
      if (alloc_test_hold(a, 100 + k, h.held[k]) != EXPSEG_OK) {
        ADD_FAILURE() << "hold: " << expseg_last_error();
        ok = false;
      }
    } else if (op < 905) {
      h.note("empty_cache");
      if (expseg_empty_cache(a) != EXPSEG_OK) {
        ADD_FAILURE() << "empty_cache: " << expseg_last_error();
        ok = false;
      }
      ok = ok && h.verify_all();
    } else if (op < 912) {
      static const char *const confs[] = {
          "expandable_segments:False", "expandable_segments:True",
          "expandable_segments:True",  "max_split_size_mb:20",
          "max_split_size_mb:64",      "max_split_size_mb:17592186044415",
          "garbage_collection_threshold:0.6", "garbage_collection_threshold:0.9",
          "expandable_segments:False,max_split_size_mb:40",
          "roundup_power2_divisions:4", "roundup_power2_divisions:[256:1,>:8]",
          "roundup_power2_divisions:1"};
      const char *c = confs[r.below(sizeof confs / sizeof confs[0])];
      h.note(std::string("configure ") + c);
      h.configures++;
      if (expseg_configure(a, c) != EXPSEG_OK) {
        ADD_FAILURE() << "configure " << c << ": " << expseg_last_error();
        ok = false;
      }
    } else if (op < 917) {
      fraction = r.chance(0.4) ? 1.0 : 0.05 + 0.95 * r.unit();
      if (fraction <= 0.05) fraction = 0.06;
      h.fraction = fraction;
      h.note("fraction " + std::to_string(fraction));
      if (expseg_set_memory_fraction(a, fraction) != EXPSEG_OK) {
        ADD_FAILURE() << "fraction: " << expseg_last_error();
        ok = false;
      }
    } else if (op < 930) {  // statistics are readable and coherent
      int64_t v = 0;
      if (expseg_stat(a, "allocation.all.current", &v) != EXPSEG_OK ||
          v != (int64_t)h.live.size()) {
        ADD_FAILURE() << "step " << h.step << ": allocation.all.current " << v << ", live "
                      << h.live.size() << "\nrecent:\n" << h.history();
        ok = false;
      }
      if (r.chance(0.05)) expseg_reset_peak_stats(a);
      if (r.chance(0.02)) expseg_reset_accumulated_stats(a);
    } else {  // a burst of same-size mallocs and frees on one stream (the cache-hit path)
      size_t size = random_size(r);
      expseg_stream s = r.below(6);
      for (int i = 0; i < 4 && ok; i++) ok = h.do_malloc(size, s);
    }
    ok = ok && h.check();
    if (ok && h.step % 4096 == 0) {
      expect_consistent(a, "step " + std::to_string(h.step));
      ok = !::testing::Test::HasFailure() && h.verify_all();
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s: %" PRIu64 " steps in %.2f s (%.1f us/step): %" PRIu64 " mallocs, %" PRIu64
              " OOMs, %" PRIu64 " frees (%" PRIu64 " recorded), %" PRIu64
              " configures, %d warnings\n",
              driver, h.step, secs, secs * 1e6 / (double)(h.step ? h.step : 1), h.mallocs, h.ooms,
              h.frees, h.pending_frees, h.configures, quiet.lines);
  // drain: release holds, free everything, give everything back
  for (int k = 0; k < 4; k++) {
    if (h.held[k]) {
      EXPECT_EQ(alloc_test_hold(a, 100 + k, false), EXPSEG_OK);
    }
  }
  ASSERT_EQ(expseg_set_memory_fraction(a, 1.0), EXPSEG_OK);
  while (!h.live.empty() && !::testing::Test::HasFatalFailure()) {
    if (!h.do_free(r)) break;
  }
  // blocks freed with record_stream just now are pending until the streams are synced
  EXPECT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_TRUE(h.check());
  EXPECT_EQ(stat_of(a, "active.all.current"), 0);
  EXPECT_EQ(stat_of(a, "requested_bytes.all.current"), 0);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(stat_of(a, "segment.all.current"), 0);
  EXPECT_EQ(stat_of(a, "expseg.reserved_va_bytes.current"), 0);
  EXPECT_EQ(stat_of(a, "expseg.pending_free_blocks.current"), 0);
  expseg_destroy(a);
  char why[128];
  EXPECT_TRUE(vmm_test_is_idle(inner, why, sizeof why)) << "after destroy: " << why;
  _expseg_vmm_close(inner);
}

TEST(AllocRandom, SimManyOperations) {
  EXPSEG_SEEDED(seed, 20240611);
  size_t ops = test_ops(200000);
  run_random("sim:capacity=4G", ops, seed, false);
}

TEST(AllocRandom, HostPatternsSurviveGrowthShrinkAndPageMoves) {
  EXPSEG_SEEDED(seed, 777);
  size_t ops = test_ops(20000);
  run_random("host:capacity=1G,granularity=2M", ops, seed, true);
  (void)GiB;
}

}  // namespace
