// SPDX-License-Identifier: Apache-2.0
// test_tool_args.cpp: the tools' one command-line parser (bench/tool_args.c): every kind of
// option reads its value, and every refusal returns -1 with a message naming the option,
// the value and what is accepted, leaving the destination as it was.
#include <gtest/gtest.h>

extern "C" {
#include "tool_args.h"
}

#include <cstdio>
#include <list>
#include <string>
#include <vector>

namespace {

void no_usage(FILE *) {}

struct Opts {
  int json = 0, choice = 0;
  const char *str = "default";
  uint64_t u = 5, size = 0, list[4] = {9, 9, 9, 9};
  size_t n_list = 0, n_strs = 0;
  const char *strs[2] = {nullptr, nullptr};
};

const char *const kChoices[] = {"off", "on", "stacks", nullptr};

// Parses args with a table over o; returns the parser's result and its message.
int parse(Opts &o, std::vector<std::string> args, std::string *msg) {
  // every field given (C++ has no C designated initializers for the table macros)
  const _expseg_arg_t t[] = {
      {"--json", ARG_FLAG, &o.json, 0, 0, nullptr, 0, nullptr},
      {"--str", ARG_STR, &o.str, 0, 0, nullptr, 0, nullptr},
      {"--u", ARG_U64, &o.u, 1, 100, nullptr, 0, nullptr},
      {"--size", ARG_SIZE, &o.size, 1, UINT64_MAX, nullptr, 0, nullptr},
      {"--list", ARG_LIST, o.list, 0, 1000, &o.n_list, 4, nullptr},
      {"--conf", ARG_STRS, o.strs, 0, 0, &o.n_strs, 2, nullptr},
      {"--choice", ARG_CHOICE, &o.choice, 0, 0, nullptr, 0, kChoices},
  };
  // the parser keeps pointers into argv (--str, --conf): the strings outlive the call, as
  // a program's argv does
  static std::list<std::vector<std::string>> kept;
  kept.push_back(std::move(args));
  std::vector<std::string> &held = kept.back();
  held.insert(held.begin(), "tool");
  std::vector<char *> argv;
  for (auto &a : held) argv.push_back(&a[0]);
  testing::internal::CaptureStderr();
  int rc = _expseg_args_parse("tool", (int)argv.size(), argv.data(), t, sizeof t / sizeof t[0],
                              no_usage);
  *msg = testing::internal::GetCapturedStderr();
  return rc;
}

TEST(ToolArgs, EveryKindReadsItsValue) {
  Opts o;
  std::string msg;
  ASSERT_EQ(parse(o, {"--json", "--str", "x", "--u", "100", "--size", "3M", "--list", "0,7,1000",
                      "--conf", "a", "--conf", "b", "--choice", "stacks"},
                  &msg),
            0)
      << msg;
  EXPECT_EQ(o.json, 1);
  EXPECT_STREQ(o.str, "x");
  EXPECT_EQ(o.u, 100u);
  EXPECT_EQ(o.size, 3u << 20);
  ASSERT_EQ(o.n_list, 3u);
  EXPECT_EQ(o.list[0], 0u);
  EXPECT_EQ(o.list[1], 7u);
  EXPECT_EQ(o.list[2], 1000u);
  ASSERT_EQ(o.n_strs, 2u);
  EXPECT_STREQ(o.strs[1], "b");
  EXPECT_EQ(o.choice, 2);
  ASSERT_EQ(parse(o, {"--size", "4096", "--size", "2G"}, &msg), 0) << msg;
  EXPECT_EQ(o.size, 2ull << 30);
}

TEST(ToolArgs, RefusalsNameTheOptionTheValueAndWhatIsAccepted) {
  struct Case {
    std::vector<std::string> args;
    const char *says;
  } cases[] = {
      {{"--u", "0"}, "--u '0': accepted: an integer from 1 to 100"},
      {{"--u", "101"}, "--u '101'"},
      {{"--u", "-1"}, "--u '-1'"},
      {{"--u", "1x"}, "--u '1x'"},
      {{"--u"}, "--u needs a value"},
      {{"--size", "2X"}, "with K, M, G or T"},
      {{"--size", "18446744073709551615K"}, "--size '18446744073709551615K'"},
      {{"--list", "1,,2"}, "comma-separated"},
      {{"--list", "1,2,3,4,5"}, "1 to 4 comma-separated"},
      {{"--list", "1001"}, "from 0 to 1000"},
      {{"--conf", "a", "--conf", "b", "--conf", "c"}, "at most 2"},
      {{"--choice", "maybe"}, "one of off, on, stacks"},
      {{"--nope"}, "unknown option '--nope'"},
  };
  for (auto &c : cases) {
    Opts o;
    std::string msg;
    EXPECT_EQ(parse(o, c.args, &msg), -1) << c.args[0];
    EXPECT_NE(msg.find(c.says), std::string::npos) << "message: " << msg;
    EXPECT_EQ(o.u, 5u) << "left as it was";
  }
}

}  // namespace
