/* SPDX-License-Identifier: Apache-2.0 */
// test_policy_common.h: helpers shared by the tests/test_policy_*.cpp suites: field-wise
// config comparison and the option ranges, both generated from policy/options.def.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "policy.h"

namespace policy_test {

template <class T> inline bool same(const T &a, const T &b) { return a == b; }
template <class T, size_t N> inline bool same(const T (&a)[N], const T (&b)[N]) {
  for (size_t i = 0; i < N; i++)
    if (a[i] != b[i]) return false;
  return true;
}

// Every field except `given`; returns the first key that differs, or "" when equal.
inline std::string differs(const expseg_config_t &a, const expseg_config_t &b) {
#define EXPSEG_OPTION(key, alias, kind, field, def, lo, hi, pt, help)                        \
  if (!same(a.field, b.field)) return #key;
#include "options.def"
#undef EXPSEG_OPTION
  return "";
}

enum Kind { BOOL, MB, DOUBLE, DOUBLE_OPEN, UINT, POW2, DIVISIONS, BACKEND, RESERVE, RESERVE_CLASSES };

struct Row {
  const char *key, *alias;
  Kind kind;
  double lo, hi;
  int pytorch;
};

static const Row kRows[] = {
#define EXPSEG_OPTION(key, alias, kind, field, def, lo, hi, pt, help)                        \
  {#key, alias, kind, (double)(lo), (double)(hi), pt},
#include "options.def"
#undef EXPSEG_OPTION
};

inline expseg_config_t defaults() {
  expseg_config_t c;
  _expseg_config_defaults(&c);
  return c;
}

// A configuration from text; a parse failure is a test failure (with the parser's message).
inline expseg_config_t conf(const char *text) {
  expseg_config_t c;
  char err[512];
  EXPECT_EQ(_expseg_config_parse(text, "test", nullptr, &c, err, sizeof err), EXPSEG_OK) << err;
  return c;
}

}  // namespace policy_test
