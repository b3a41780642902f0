// SPDX-License-Identifier: Apache-2.0
// test_policy_docs.cpp: docs/config.md documents every option of policy/options.def: each key
// and alias appears in backquotes, each key has a row in the options table, and the
// expandable_segments default difference and the canonical example are stated.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "test_policy_common.h"

namespace {

std::string read_doc() {
  std::ifstream f(std::string(EXPSEG_SOURCE_DIR) + "/docs/config.md");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(PolicyDocs, EveryOptionDocumented) {
  std::string doc = read_doc();
  ASSERT_FALSE(doc.empty()) << "cannot read " EXPSEG_SOURCE_DIR "/docs/config.md";
  for (int i = 0; i < EXPSEG_OPT_COUNT; i++) {
    const expseg_option_info_t &o = _expseg_options[i];
    EXPECT_NE(doc.find("| `" + std::string(o.key) + "`"), std::string::npos)
        << "no row for " << o.key << " in the options table of docs/config.md";
    if (o.alias) {
      EXPECT_NE(doc.find("`" + std::string(o.alias) + "`"), std::string::npos)
          << "alias " << o.alias << " not documented";
    }
  }
}

TEST(PolicyDocs, DefaultsStated) {
  std::string doc = read_doc();
  EXPECT_NE(doc.find("**`expandable_segments` defaults to `True`**"), std::string::npos);
  // the documented canonical string of the defaults is what the printer writes
  expseg_config_t c = policy_test::defaults();
  char buf[2048];
  _expseg_config_print(&c, buf, sizeof buf);
  EXPECT_NE(doc.find(std::string("\n") + buf + "\n"), std::string::npos)
      << "docs/config.md should show the defaults as printed:\n" << buf;
}

}  // namespace
