// SPDX-License-Identifier: Apache-2.0
// test_policy_print.cpp: the canonical printer (_expseg_config_print). Round trip over the
// whole option space sampled at random (seeded; the seed is printed; set EXPSEG_TEST_SEED to
// replay): random option strings parse, print, and parse back to the same configuration, and
// printing is a fixed point; random valid configurations print and parse back exactly
// (doubles included); snprintf semantics of the output buffer.
#include <gtest/gtest.h>

#include "test_seed.h"

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test_policy_common.h"

using namespace policy_test;

namespace {

constexpr size_t MiB = size_t(1) << 20;
constexpr uint64_t kMbCeil = SIZE_MAX / MiB;


std::string print(const expseg_config_t &c) {
  char buf[4096];
  size_t n = _expseg_config_print(&c, buf, sizeof buf);
  EXPECT_LT(n, sizeof buf);
  return std::string(buf, n);
}

struct Gen {
  std::mt19937_64 rng;
  explicit Gen(uint64_t seed) : rng(seed) {}
  uint64_t u(uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); }
  bool coin(double p = 0.5) { return std::bernoulli_distribution(p)(rng); }
  std::string ws() {
    static const char *w[] = {"", "", "", " ", "\t", "  ", "\n"};
    return w[u(0, 6)];
  }
  // a random double in (0, 1), sometimes with few digits
  double unit() {
    for (;;) {
      double d = (double)(rng() >> 11) * 0x1.0p-53;
      if (coin(0.3)) d = (double)u(1, 999) / 1000.0;
      if (coin(0.1)) d = std::ldexp(1.0, -(int)u(1, 1000));
      if (d > 0 && d < 1) return d;
    }
  }
  std::string decimal_text(double lo, double hi, bool open) {
    for (;;) {
      char b[64];
      double d = unit();
      switch (u(0, 4)) {
      case 0: snprintf(b, sizeof b, "%.17g", d); break;
      case 1: snprintf(b, sizeof b, "%.*g", (int)u(1, 17), d); break;
      case 2: snprintf(b, sizeof b, "%.*e", (int)u(0, 16), d); break;
      case 3: snprintf(b, sizeof b, "0.%0*" PRIu64, (int)u(1, 25), u(0, 999999)); break;
      default:
        if (open) continue;
        snprintf(b, sizeof b, "%s", coin() ? "0" : "1");
      }
      double v = strtod(b, nullptr);
      if (open ? (v > lo && v < hi) : (v >= lo && v <= hi)) return b;
    }
  }
  std::string pow2(uint64_t lo, uint64_t hi) {
    std::vector<uint64_t> c;
    for (uint64_t v = 1; v && v <= hi; v <<= 1)
      if (v >= lo) c.push_back(v);
    return std::to_string(c[u(0, c.size() - 1)]);
  }
  std::string value(const Row &r) {
    switch (r.kind) {
    case BOOL: return coin() ? "True" : "False";
    case MB: {
      uint64_t lo = (uint64_t)r.lo, hi = (uint64_t)r.hi;
      // large_segment_size_mb is the lower bound of max_split_size_mb (20 here): keep it below
      if (!strcmp(r.key, "large_segment_size_mb")) return std::to_string(u(11, 20));
      switch (u(0, 4)) {
      case 0: return std::to_string(lo);
      case 1: return std::to_string(hi);
      case 2: return std::to_string(u(lo, std::min<uint64_t>(hi, lo + 4096)));
      case 3: return hi == kMbCeil ? std::to_string(u(hi, UINT64_MAX)) : std::to_string(u(lo, hi));
      default: return std::to_string(u(lo, hi));
      }
    }
    case DOUBLE: return decimal_text(r.lo, r.hi, false);
    case DOUBLE_OPEN: return decimal_text(r.lo, r.hi, true);
    case UINT: return std::to_string(u((uint64_t)r.lo, (uint64_t)r.hi));
    case POW2: return pow2((uint64_t)r.lo, (uint64_t)r.hi);
    case BACKEND: return "native";
    case RESERVE: return coin() ? std::to_string(u(1, 80)) + "G" : decimal_text(0, 1, true);
    case RESERVE_CLASSES:
      return coin() ? "[]" : "[a:" + decimal_text(0, 1, true) + ",b" + ws() + ":" + ws() +
                                 std::to_string(u(1, 9)) + "G]";
    case DIVISIONS: {
      if (coin(0.3)) return pow2(1, uint64_t(1) << 30);
      std::string s = "[";
      int n = (int)u(1, 6);
      bool gt = coin();
      for (int i = 0; i < n; i++) {
        if (i) s += "," + ws();
        s += std::to_string(uint64_t(1) << u(0, 20)) + ws() + ":" + ws() +
             (coin(0.2) ? "0" : pow2(1, uint64_t(1) << 30));
      }
      if (gt) s += ",>:" + (coin(0.2) ? std::string("0") : pow2(1, uint64_t(1) << 30));
      return s + "]";
    }
    }
    return "";
  }
  std::string text() {
    std::string s;
    int n = (int)u(0, 2 * EXPSEG_OPT_COUNT);
    for (int i = 0; i < n; i++) {
      const Row &r = kRows[u(0, EXPSEG_OPT_COUNT - 1)];
      if (!s.empty()) s += ws() + "," + ws();
      s += (r.alias && coin()) ? r.alias : r.key;
      s += ws() + ":" + ws() + value(r);
    }
    return s;
  }
};

TEST(PolicyPrint, RoundTripRandomStrings) {
  EXPSEG_SEEDED(seed, 20261122);
  Gen g(seed);
  char err[1024];
  for (int iter = 0; iter < 20000; iter++) {
    std::string text = g.text();
    expseg_config_t c1, c2, c3;
    ASSERT_EQ(_expseg_config_parse(text.c_str(), "random", nullptr, &c1, err, sizeof err), EXPSEG_OK)
        << text << "\n" << err;
    std::string p1 = print(c1);
    ASSERT_EQ(_expseg_config_parse(p1.c_str(), "printed", nullptr, &c2, err, sizeof err), EXPSEG_OK)
        << p1 << "\n" << err;
    ASSERT_EQ(differs(c1, c2), "") << "input: " << text << "\nprinted: " << p1;
    EXPECT_EQ(print(c2), p1);  // canonical: printing is a fixed point
    // the printed text also round-trips over an arbitrary base (every printable key is given)
    expseg_config_t base = c1;
    base.expandable_segments = !base.expandable_segments;
    if (c1.max_split_size != SIZE_MAX) base.max_split_size = 77 * MiB;  // unlimited: not printed
    ASSERT_EQ(_expseg_config_parse(p1.c_str(), "printed", &base, &c3, err, sizeof err), EXPSEG_OK);
    EXPECT_EQ(differs(c1, c3), "") << p1;
  }
}

TEST(PolicyPrint, RoundTripRandomConfigs) {
  EXPSEG_SEEDED(seed, 20261123);
  Gen g(seed ^ 0x9e3779b97f4a7c15ull);
  char err[1024];
  for (int iter = 0; iter < 20000; iter++) {
    expseg_config_t c = defaults();
    c.max_split_size = g.coin(0.2) ? SIZE_MAX : g.u(20, kMbCeil) * MiB;
    c.max_non_split_rounding = g.coin(0.2) ? kMbCeil * MiB : g.u(20, 1 << 20) * MiB;
    c.garbage_collection_threshold = g.coin(0.2) ? 0.0 : g.unit();  // 0 = off (not printed)
    for (uint64_t &d : c.roundup_power2_divisions)
      d = g.coin(0.3) ? 0 : uint64_t(1) << g.u(0, 63);
    if (g.coin(0.3))
      for (uint64_t &d : c.roundup_power2_divisions) d = c.roundup_power2_divisions[0];
    c.expandable_segments = g.coin();
    c.large_segment_size = g.u(11, 20) * MiB;  // <= the max_split / max_non_split bounds
    c.release_lock_on_cudamalloc = g.coin();
    c.pinned_use_cuda_host_register = g.coin();
    c.pinned_num_register_threads = uint32_t(1) << g.u(0, 7);
    c.pinned_use_background_threads = g.coin();
    c.pinned_reserve_segment_size = g.coin(0.3) ? 0 : g.u(1, 1 << 30) * MiB;
    c.pinned_max_round_threshold = g.coin(0.3) ? SIZE_MAX : g.u(0, 1 << 30) * MiB;
    c.pinned_max_cached_size = g.coin(0.3) ? SIZE_MAX : g.u(0, 1 << 30) * MiB;
    c.graph_capture_record_stream_reuse = g.coin();
    c.per_process_memory_fraction = g.coin(0.1) ? 0.0 : g.coin(0.1) ? 1.0 : g.unit();
    c.throw_on_cudamalloc_oom = g.coin();
    c.pinned_free_catch_all = g.coin();
    c.expandable_segments_reserve = g.coin(0.3) ? 0.0 : g.coin() ? g.unit() : (double)g.u(1, 80);
    c.expandable_segments_reserve_gib = c.expandable_segments_reserve >= 1;
    if (g.coin()) snprintf(c.expandable_segments_reserve_by_class, 64, "x:0.25,y:%dG", (int)g.u(1, 9));
    c.page_size = g.u(0, 1024) * MiB;
    c.page_cache_max = g.coin(0.2) ? SIZE_MAX : g.u(0, 1 << 30) * MiB;
    c.va_reserve = g.u(0, 1 << 30) * MiB;
    c.chunk_max = g.coin(0.3) ? SIZE_MAX : g.u(1, 1024) * MiB;
    c.verbose = g.coin();
    std::string p = print(c);
    expseg_config_t back;
    ASSERT_EQ(_expseg_config_parse(p.c_str(), "printed", nullptr, &back, err, sizeof err), EXPSEG_OK)
        << p << "\n" << err;
    ASSERT_EQ(differs(c, back), "") << p;
  }
}

TEST(PolicyPrint, DefaultsAndShape) {
  expseg_config_t c = defaults();
  std::string p = print(c);
  // every printable key once, in table order, canonical spelling
  size_t at = 0;
  for (int i = 0; i < EXPSEG_OPT_COUNT; i++) {
    std::string k = std::string(kRows[i].key) + ":";
    size_t f = p.find(k);
    if (i == EXPSEG_OPT_garbage_collection_threshold || i == EXPSEG_OPT_pinned_reserve_segment_size_mb ||
        i == EXPSEG_OPT_max_split_size_mb || i == EXPSEG_OPT_page_cache_max_mb ||
        i == EXPSEG_OPT_expandable_segments_reserve || i == EXPSEG_OPT_single_chunk_min_mb ||
        i == EXPSEG_OPT_pinned_max_round_threshold_mb || i == EXPSEG_OPT_pinned_max_cached_size_mb ||
        i == EXPSEG_OPT_chunk_max_mb) {
      EXPECT_EQ(f, std::string::npos) << "off by default, cannot be written: " << p;
      continue;
    }
    ASSERT_NE(f, std::string::npos) << k << " in " << p;
    EXPECT_GE(f, at);
    at = f;
  }
  EXPECT_NE(p.find("expandable_segments:True"), std::string::npos);
  EXPECT_EQ(p.find("max_split_size_mb:"), std::string::npos) << "unlimited cannot be written";
  EXPECT_NE(p.find("per_process_memory_fraction:1,"), std::string::npos);
  EXPECT_EQ(p.find("hip"), std::string::npos);
  EXPECT_EQ(p.find(' '), std::string::npos);
}

TEST(PolicyPrint, Divisions) {
  struct {
    const char *in, *out;
  } cases[] = {
      {"roundup_power2_divisions:4", "roundup_power2_divisions:4,"},
      {"roundup_power2_divisions:[>:4]", "roundup_power2_divisions:[1:0,>:4],"},
      {"roundup_power2_divisions:[1:4,>:4]", "roundup_power2_divisions:4,"},
      {"roundup_power2_divisions:[256,4]", "roundup_power2_divisions:[256:4,>:0],"},
      {"roundup_power2_divisions:[64:8,256:4,1024:4,>:1]",
       "roundup_power2_divisions:[64:8,128:0,256:4,512:0,1024:4,>:1],"},
      {"roundup_power2_divisions:[1:4]", "roundup_power2_divisions:[1:4,>:0],"},
      {"roundup_power2_divisions:[2:0,>:0]", "roundup_power2_divisions:[>:0],"},
  };
  for (auto &k : cases) {
    expseg_config_t c;
    char err[256];
    ASSERT_EQ(_expseg_config_parse(k.in, "t", nullptr, &c, err, sizeof err), EXPSEG_OK) << err;
    EXPECT_NE(print(c).find(k.out), std::string::npos) << k.in << " -> " << print(c);
  }
}

TEST(PolicyPrint, Doubles) {
  struct {
    double v;
    const char *out;
  } cases[] = {{0.5, "garbage_collection_threshold:0.5,"},
               {0.1, "garbage_collection_threshold:0.1,"},
               {0.3, "garbage_collection_threshold:0.3,"},
               {1e-7, "garbage_collection_threshold:1e-7,"},
               {0.000123, "garbage_collection_threshold:0.000123,"},
               {0.99999999999999989, "garbage_collection_threshold:0.9999999999999999,"}};
  for (auto &k : cases) {
    expseg_config_t c = defaults();
    c.garbage_collection_threshold = k.v;
    EXPECT_NE(print(c).find(k.out), std::string::npos) << print(c);
  }
}

TEST(PolicyPrint, SnprintfSemantics) {
  expseg_config_t c = defaults();
  std::string full = print(c);
  EXPECT_EQ(_expseg_config_print(&c, nullptr, 0), full.size());
  char small[11];
  memset(small, 'x', sizeof small);
  EXPECT_EQ(_expseg_config_print(&c, small, sizeof small), full.size());
  EXPECT_EQ(std::string(small), full.substr(0, 10));
  char one[1] = {'x'};
  EXPECT_EQ(_expseg_config_print(&c, one, 1), full.size());
  EXPECT_EQ(one[0], '\0');
}

}  // namespace
