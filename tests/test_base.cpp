// SPDX-License-Identifier: Apache-2.0
// test_base.cpp: base/, the helpers every layer shares: the hash map (against std::map,
// clustered and aligned keys, the key 0, growth, removal by backward shift), the treap
// (against std::set: every query after every change, the search-tree and heap orders,
// split and join), the decimal reader (digits only, overflow refused), the unit ladder,
// the generator (splitmix64's published outputs) and the clock (monotonic, in ns).
#include <gtest/gtest.h>

#include "clock.h"
#include "dec.h"
#include "map.h"
#include "rand.h"
#include "test_seed.h"
#include "treap.h"
#include "units.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

// ---- the map ----

TEST(BaseMap, MatchesStdMapUnderRandomPutAndTake) {
  EXPSEG_SEEDED(seed, 20261122);
  TestRng r(seed);
  _expseg_map_t m{};  // a zeroed map is an empty one
  std::map<uint64_t, uint64_t> ref;
  for (int i = 0; i < 200000; i++) {
    // clustered keys (long probe chains), 512-aligned ones (addresses) and the key 0
    const uint64_t k = r.below(4096) * (r.below(2) ? 512 : 1);
    if (r.below(3)) {
      const uint64_t v = r.next();
      ASSERT_TRUE(_expseg_map_put(&m, k, v));
      ref[k] = v;
    } else {
      uint64_t v = 0;
      auto it = ref.find(k);
      ASSERT_EQ(_expseg_map_take(&m, k, &v), it != ref.end()) << k;
      if (it != ref.end()) {
        ASSERT_EQ(v, it->second) << k;
        ref.erase(it);
      }
    }
    if (i % 1000 == 0) {
      ASSERT_EQ(_expseg_map_count(&m), ref.size());
      ASSERT_LE(2 * (m.count - (m.has_zero ? 1 : 0)), m.cap) << "at most half full";
      for (auto &kv : ref) {
        uint64_t *v = _expseg_map_get(&m, kv.first);
        ASSERT_NE(v, nullptr) << kv.first;
        ASSERT_EQ(*v, kv.second);
      }
      std::vector<uint64_t> keys(_expseg_map_count(&m));
      ASSERT_EQ(_expseg_map_keys(&m, keys.data()), keys.size());
      std::sort(keys.begin(), keys.end());
      std::vector<uint64_t> want;
      for (auto &kv : ref) want.push_back(kv.first);
      ASSERT_EQ(keys, want);
    }
  }
  for (uint64_t k = 0; k < 4096 * 512; k += 511) {
    uint64_t *v = _expseg_map_get(&m, k);
    ASSERT_EQ(v != nullptr, ref.count(k) == 1) << k;
  }
  _expseg_map_free(&m);
  EXPECT_EQ(_expseg_map_count(&m), 0u);
  EXPECT_EQ(_expseg_map_get(&m, 0), nullptr);
}

TEST(BaseMap, InitSizesTheTableAndKeyZeroIsAKey) {
  _expseg_map_t m;
  ASSERT_TRUE(_expseg_map_init(&m, 512));
  EXPECT_EQ(m.cap, 1024u);
  EXPECT_EQ(_expseg_map_get(&m, 0), nullptr);
  EXPECT_FALSE(_expseg_map_take(&m, 0, nullptr));
  ASSERT_TRUE(_expseg_map_put(&m, 0, 7));
  ASSERT_TRUE(_expseg_map_put(&m, 0, 8));  // replaces
  EXPECT_EQ(_expseg_map_count(&m), 1u);
  ASSERT_NE(_expseg_map_get(&m, 0), nullptr);
  EXPECT_EQ(*_expseg_map_get(&m, 0), 8u);
  for (uint64_t k = 1; k <= 512; k++) ASSERT_TRUE(_expseg_map_put(&m, k << 21, k));
  EXPECT_EQ(m.cap, 2048u) << "grown past half full";
  uint64_t v = 0;
  EXPECT_TRUE(_expseg_map_take(&m, 0, &v));
  EXPECT_EQ(v, 8u);
  EXPECT_EQ(_expseg_map_count(&m), 512u);
  for (uint64_t k = 1; k <= 512; k++) ASSERT_TRUE(_expseg_map_take(&m, k << 21, &v) && v == k);
  EXPECT_EQ(_expseg_map_count(&m), 0u);
  _expseg_map_free(&m);
}

// ---- the treap ----

struct Node;
struct Node {
  uint64_t key;
  EXPSEG_TREAP_LINK(Node) link;
};
#define NODE_KEY(n) ((n)->key)
#define KEY_LESS(a, b) ((a) < (b))
EXPSEG_TREAP_DEFINE(tt, Node, link, uint64_t, NODE_KEY, KEY_LESS)

// In order, with the heap order on priorities; returns the keys.
void walk(const Node *t, std::vector<uint64_t> *out, const Node *parent) {
  if (t == nullptr) return;
  if (parent != nullptr) {
    ASSERT_LE(t->link.prio, parent->link.prio) << "heap order";
  }
  walk(t->link.l, out, t);
  out->push_back(t->key);
  walk(t->link.r, out, t);
}

void expect_same(Node *root, const std::set<uint64_t> &ref, TestRng &r) {
  std::vector<uint64_t> keys;
  walk(root, &keys, nullptr);
  ASSERT_EQ(keys, std::vector<uint64_t>(ref.begin(), ref.end())) << "search-tree order";
  const Node *first = tt_first(root);
  ASSERT_EQ(first == nullptr, ref.empty());
  if (first != nullptr) {
    ASSERT_EQ(first->key, *ref.begin());
  }
  for (int q = 0; q < 20; q++) {
    const uint64_t k = r.below(2100);
    auto lb = ref.lower_bound(k);
    const Node *n = tt_lower_bound(root, k);
    ASSERT_EQ(n == nullptr, lb == ref.end()) << k;
    if (n != nullptr) {
      ASSERT_EQ(n->key, *lb);
    }
    const Node *p = tt_pred(root, k);
    ASSERT_EQ(p == nullptr, lb == ref.begin()) << k;
    if (p != nullptr) {
      ASSERT_EQ(p->key, *std::prev(lb));
    }
    const Node *f = tt_find(root, k);
    ASSERT_EQ(f != nullptr, ref.count(k) == 1) << k;
    if (n != nullptr) {
      const Node *nx = tt_next(root, n);
      auto it = std::next(lb);
      ASSERT_EQ(nx == nullptr, it == ref.end());
      if (nx != nullptr) {
        ASSERT_EQ(nx->key, *it);
      }
    }
  }
}

TEST(BaseTreap, MatchesStdSetUnderRandomInsertAndRemove) {
  EXPSEG_SEEDED(seed, 7);
  TestRng r(seed);
  std::vector<Node> nodes(2000);
  for (size_t i = 0; i < nodes.size(); i++) nodes[i].key = i;
  std::vector<bool> in(nodes.size(), false);
  Node *root = nullptr;
  std::set<uint64_t> ref;
  for (int step = 0; step < 20000 && !::testing::Test::HasFatalFailure(); step++) {
    const size_t i = r.below(nodes.size());
    if (!in[i]) {
      nodes[i].link.prio = (uint32_t)r.next();
      tt_insert(&root, &nodes[i]);
      ref.insert(i);
    } else {
      tt_remove(&root, &nodes[i]);
      ref.erase(i);
    }
    in[i] = !in[i];
    if (step % 50 == 0) expect_same(root, ref, r);
  }
  expect_same(root, ref, r);
  // split at k and join back: the two sides hold < k and >= k, and nothing is lost
  for (uint64_t k : {0ull, 1ull, 999ull, 1000ull, 5000ull}) {
    Node *lt = nullptr, *ge = nullptr;
    tt_split(root, k, &lt, &ge);
    std::vector<uint64_t> a, b;
    walk(lt, &a, nullptr);
    walk(ge, &b, nullptr);
    for (uint64_t x : a) ASSERT_LT(x, k);
    for (uint64_t x : b) ASSERT_GE(x, k);
    ASSERT_EQ(a.size() + b.size(), ref.size());
    root = tt_join(lt, ge);
    expect_same(root, ref, r);
  }
}

// ---- the decimal reader ----

TEST(BaseDec, DigitsOnlyOverflowRefused) {
  uint64_t v = 0;
  EXPECT_TRUE(_expseg_dec_str("0", &v));
  EXPECT_EQ(v, 0u);
  EXPECT_TRUE(_expseg_dec_str("18446744073709551615", &v));
  EXPECT_EQ(v, UINT64_MAX);
  v = 5;
  EXPECT_FALSE(_expseg_dec_str("18446744073709551616", &v)) << "one past UINT64_MAX";
  EXPECT_EQ(v, 5u) << "unchanged on failure";
  for (const char *bad : {"", "-1", "+1", " 1", "1 ", "0x10", "1e3", "12a"})
    EXPECT_FALSE(_expseg_dec_str(bad, &v)) << "'" << bad << "'";
  EXPECT_FALSE(_expseg_dec_str(nullptr, &v));
  // the prefix form stops after the digits, within the given end
  const char *s = "4096K";
  const char *p = s;
  ASSERT_TRUE(_expseg_dec_u64(&p, s + 5, &v));
  EXPECT_EQ(v, 4096u);
  EXPECT_EQ(p, s + 4);
  p = s;
  ASSERT_TRUE(_expseg_dec_u64(&p, s + 2, &v));
  EXPECT_EQ(v, 40u) << "reads no further than end";
  EXPECT_TRUE(_expseg_dec_all(s, 4, &v));
  EXPECT_FALSE(_expseg_dec_all(s, 5, &v));
  EXPECT_FALSE(_expseg_dec_all(s, 0, &v));
}

// ---- the unit ladder ----

TEST(BaseDec, SizesWithBinaryUnits) {
  auto size = [](const char *t, uint64_t *v) { return _expseg_dec_size(t, strlen(t), v); };
  uint64_t v = 0;
  EXPECT_TRUE(size("123", &v));
  EXPECT_EQ(v, 123u);
  EXPECT_TRUE(size("3K", &v));
  EXPECT_EQ(v, 3072u);
  EXPECT_TRUE(size("2m", &v));
  EXPECT_EQ(v, 2u << 20);
  EXPECT_TRUE(size("5G", &v));
  EXPECT_EQ(v, 5ull << 30);
  EXPECT_TRUE(size("7t", &v));
  EXPECT_EQ(v, 7ull << 40);
  EXPECT_TRUE(size("16777215T", &v)) << "the largest T that fits 64 bits";
  EXPECT_EQ(v, 16777215ull << 40);
  v = 99;
  for (const char *bad : {"16777216T", "", "K", "8GB", "8 G", "-1", "1.5G", "8X", "G8"}) {
    EXPECT_FALSE(size(bad, &v)) << bad;
    EXPECT_EQ(v, 99u) << bad << ": nothing written on a refusal";
  }
}

TEST(BaseUnits, StepsWhileTheReferenceReachesTheThreshold) {
  EXPECT_EQ(_expseg_unit_steps(1023, 1024, 1024, 6), 0);
  EXPECT_EQ(_expseg_unit_steps(1024, 1024, 1024, 6), 1);
  EXPECT_EQ(_expseg_unit_steps((1ull << 20) - 1, 1024, 1024, 6), 1);
  EXPECT_EQ(_expseg_unit_steps(1ull << 20, 1024, 1024, 6), 2);
  EXPECT_EQ(_expseg_unit_steps(UINT64_MAX, 1024, 1024, 6), 6) << "capped at max";
  EXPECT_EQ(_expseg_unit_steps(768 * 1024 - 1, 1024, 768 * 1024, 5), 0);
  EXPECT_EQ(_expseg_unit_steps(768 * 1024, 1024, 768 * 1024, 5), 1);
  EXPECT_EQ(_expseg_unit_steps(768ull << 20, 1024, 768 * 1024, 5), 2);
  EXPECT_STREQ(_expseg_size_unit(0), "B");
  EXPECT_STREQ(_expseg_size_unit(2), "MiB");
  EXPECT_STREQ(_expseg_size_unit(6), "EiB");
  EXPECT_STREQ(_expseg_size_unit(7), "?");
}

// ---- the generator and the clock ----

TEST(BaseRand, Splitmix64FromSeedZero) {
  uint64_t s = 0;
  EXPECT_EQ(_expseg_splitmix64(&s), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(_expseg_splitmix64(&s), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(_expseg_splitmix64(&s), 0x06C45D188009454Full);
}

TEST(BaseClock, MonotonicNanoseconds) {
  const uint64_t a = _expseg_clock_ns();
  struct timespec d = {0, 2000000};
  nanosleep(&d, nullptr);
  const uint64_t b = _expseg_clock_ns();
  EXPECT_GE(b - a, 2000000u) << "a 2 ms sleep";
  EXPECT_LT(b - a, 10000000000ull);
}

}  // namespace
