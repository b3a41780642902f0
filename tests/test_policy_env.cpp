// SPDX-License-Identifier: Apache-2.0
// test_policy_env.cpp: where the configuration comes from (policy/env.c), with a fake
// environment: every combination of API text and the three variables, the ignored list, empty
// variables (set, as in PyTorch main), and the source name reaching the parser's error message.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "test_policy_common.h"

namespace {

std::map<std::string, std::string> g_env;  // the fake environment
int g_calls;

const char *fake_getenv(const char *name) {
  g_calls++;
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}

const char *const kVars[] = {"EXPSEG_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"};

TEST(PolicyEnv, PrecedenceEveryCombination) {
  for (int mask = 0; mask < 16; mask++) {
    g_env.clear();
    const char *api = (mask & 8) ? "verbose:True" : nullptr;
    for (int v = 0; v < 3; v++)
      if (mask & (1 << v)) g_env[kVars[v]] = std::string("text-of-") + kVars[v];
    expseg_config_source_t s;
    _expseg_config_source(api, fake_getenv, &s);
    // expected: API, else the first variable set, in order
    std::string want_name = "defaults", want_ignored;
    const char *want_text = nullptr;
    if (api) {
      want_name = "expseg_create";
      want_text = api;
    }
    for (int v = 0; v < 3; v++) {
      if (!(mask & (1 << v))) continue;
      if (!want_text) {
        want_name = kVars[v];
        want_text = g_env[kVars[v]].c_str();
      } else {
        want_ignored += (want_ignored.empty() ? "" : ", ") + std::string(kVars[v]);
      }
    }
    EXPECT_EQ(std::string(s.name), want_name) << mask;
    if (want_text)
      EXPECT_STREQ(s.text, want_text) << mask;
    else
      EXPECT_EQ(s.text, nullptr) << mask;
    EXPECT_EQ(std::string(s.ignored), want_ignored) << mask;
  }
}

TEST(PolicyEnv, AllSetNamesTheOthers) {
  g_env = {{"EXPSEG_ALLOC_CONF", "max_split_size_mb:100"},
           {"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False"},
           {"PYTORCH_ALLOC_CONF", "garbage_collection_threshold:0.5"}};
  expseg_config_source_t s;
  _expseg_config_source(nullptr, fake_getenv, &s);
  EXPECT_STREQ(s.name, "EXPSEG_ALLOC_CONF");
  EXPECT_STREQ(s.text, "max_split_size_mb:100");
  EXPECT_STREQ(s.ignored, "PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF");
}

TEST(PolicyEnv, EmptyVariableCountsAsSet) {
  // PyTorch main: an empty PYTORCH_CUDA_ALLOC_CONF is set (all defaults), so
  // PYTORCH_ALLOC_CONF is not read
  g_env = {{"PYTORCH_CUDA_ALLOC_CONF", ""}, {"PYTORCH_ALLOC_CONF", "expandable_segments:False"}};
  expseg_config_source_t s;
  _expseg_config_source(nullptr, fake_getenv, &s);
  EXPECT_STREQ(s.name, "PYTORCH_CUDA_ALLOC_CONF");
  EXPECT_STREQ(s.text, "");
  EXPECT_STREQ(s.ignored, "PYTORCH_ALLOC_CONF");
  expseg_config_t c;
  char err[256];
  ASSERT_EQ(_expseg_config_parse(s.text, s.name, nullptr, &c, err, sizeof err), EXPSEG_OK);
  EXPECT_TRUE(c.expandable_segments) << "the defaults, not PYTORCH_ALLOC_CONF's text";
  g_env = {{"EXPSEG_ALLOC_CONF", ""}, {"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False"}};
  _expseg_config_source(nullptr, fake_getenv, &s);
  EXPECT_STREQ(s.name, "EXPSEG_ALLOC_CONF");
  EXPECT_STREQ(s.ignored, "PYTORCH_CUDA_ALLOC_CONF");
  // explicit empty API text wins (= defaults), and the variables are reported as ignored
  _expseg_config_source("", fake_getenv, &s);
  EXPECT_STREQ(s.name, "expseg_create");
  EXPECT_STREQ(s.text, "");
  EXPECT_STREQ(s.ignored, "EXPSEG_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF");
}

TEST(PolicyEnv, SourceNameInParseError) {
  g_env = {{"PYTORCH_ALLOC_CONF", "expandable_segments:true"}};
  expseg_config_source_t s;
  _expseg_config_source(nullptr, fake_getenv, &s);
  expseg_config_t c;
  char err[512];
  ASSERT_EQ(_expseg_config_parse(s.text, s.name, nullptr, &c, err, sizeof err), EXPSEG_ERR_CONFIG);
  EXPECT_NE(std::string(err).find("PYTORCH_ALLOC_CONF: position 21: expandable_segments value 'true'"),
            std::string::npos)
      << err;
}

TEST(PolicyEnv, NullGetenvReadsTheProcessEnvironment) {
  const char *old = getenv("EXPSEG_ALLOC_CONF");
  std::string saved = old ? old : "";
  setenv("EXPSEG_ALLOC_CONF", "verbose:True", 1);
  expseg_config_source_t s;
  _expseg_config_source(nullptr, nullptr, &s);
  EXPECT_STREQ(s.name, "EXPSEG_ALLOC_CONF");
  EXPECT_STREQ(s.text, "verbose:True");
  if (old)
    setenv("EXPSEG_ALLOC_CONF", saved.c_str(), 1);
  else
    unsetenv("EXPSEG_ALLOC_CONF");
}

}  // namespace
