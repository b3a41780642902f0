/* SPDX-License-Identifier: Apache-2.0 */
/* test_seed.h: the one seeding helper of the randomized tests. A fixed default per test
 * (so CI runs are repeatable), $EXPSEG_TEST_SEED overrides it, the seed is printed, and
 * EXPSEG_SEEDED(var, default) also adds it to every failure message of the enclosing scope
 * (a GoogleTest scoped trace), so any failure can be replayed. Also their one reading of
 * $EXPSEG_TEST_OPS (test_ops), the length of each run. */
#ifndef EXPSEG_TEST_SEED_H
#define EXPSEG_TEST_SEED_H

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

inline uint64_t test_seed(uint64_t dflt) {
  const char *e = std::getenv("EXPSEG_TEST_SEED");
  uint64_t s = e && *e ? std::strtoull(e, nullptr, 0) : dflt;
  std::printf("seed %llu (EXPSEG_TEST_SEED=%llu reproduces)\n", (unsigned long long)s,
              (unsigned long long)s);
  return s;
}

inline std::string test_seed_note(uint64_t s) {
  return "seed " + std::to_string(s) + " (EXPSEG_TEST_SEED=" + std::to_string(s) + " reproduces)";
}

/* splitmix64: the suites' one pseudo-random generator. The seed goes through the output
 * mix before it becomes the state: a state of seed x the increment would make seed n + 1's
 * stream seed n's shifted by one step, so a loop over nearby seeds would test one stream. */
struct TestRng {
  uint64_t s;
  explicit TestRng(uint64_t seed) : s(mix(seed * 0x9E3779B97F4A7C15ull + 1)) {}
  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t next() { return mix(s += 0x9E3779B97F4A7C15ull); }
  uint64_t below(uint64_t n) { return next() % n; }
  double unit() { return (double)(next() >> 11) / (double)(1ull << 53); }
  bool chance(double p) { return unit() < p; }
};

/* EXPSEG_TEST_OPS: how long the randomized suites run, given as the operations of the
 * longest run (200000 by default). A run that takes `full` operations at that default takes
 * full * EXPSEG_TEST_OPS / 200000 (at least 1) when the variable is set, so that one value
 * shortens (or lengthens) every suite in proportion; unset, it takes `unset` operations
 * (`full`, or fewer where a suite runs shorter under a sanitizer). */
constexpr uint64_t kTestOpsDefault = 200000;

inline uint64_t test_ops(uint64_t full, uint64_t unset) {
  const char *e = std::getenv("EXPSEG_TEST_OPS");
  if (!e || !*e) return unset;
  uint64_t n = std::strtoull(e, nullptr, 0) * full / kTestOpsDefault;
  return n ? n : 1;
}

inline uint64_t test_ops(uint64_t full) { return test_ops(full, full); }

#define EXPSEG_SEEDED(var, dflt)         \
  const uint64_t var = test_seed(dflt); \
  SCOPED_TRACE(test_seed_note(var))

#endif
