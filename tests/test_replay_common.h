/* SPDX-License-Identifier: Apache-2.0 */
// test_replay_common.h: helpers shared by tests/test_replay*.cpp: run expseg-replay
// in-process (expseg_replay_main) with captured output, split lines, read a number or a
// string field of a one-line JSON object, and a temporary trace file.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "trace.h"
int expseg_replay_main(int argc, char **argv, FILE *out, FILE *err);
}

namespace replay_test {

struct Outcome {
  int rc = -1;
  std::string out, err;
};

inline std::string Slurp(FILE *f) {
  std::string s;
  rewind(f);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  fclose(f);
  return s;
}

inline Outcome Replay(std::vector<std::string> args) {
  args.insert(args.begin(), "expseg-replay");
  std::vector<char *> argv;
  for (auto &a : args) argv.push_back(&a[0]);
  argv.push_back(nullptr);
  FILE *out = tmpfile(), *err = tmpfile();
  Outcome r;
  if (!out || !err) {
    ADD_FAILURE() << "tmpfile failed";
    return r;
  }
  r.rc = expseg_replay_main((int)args.size(), argv.data(), out, err);
  r.out = Slurp(out);
  r.err = Slurp(err);
  return r;
}

inline std::vector<std::string> Lines(const std::string &s) {
  std::vector<std::string> v;
  size_t p = 0;
  while (p < s.size()) {
    size_t e = s.find('\n', p);
    if (e == std::string::npos) e = s.size();
    if (e > p) v.push_back(s.substr(p, e - p));
    p = e + 1;
  }
  return v;
}

// The number after "key": in a one-line JSON object (the first occurrence; nested
// objects are searched with the prefix "baseline" etc. by the caller). NAN if absent.
inline double Num(const std::string &json, const std::string &key, size_t from = 0) {
  size_t p = json.find("\"" + key + "\":", from);
  if (p == std::string::npos) return NAN;
  return std::strtod(json.c_str() + p + key.size() + 3, nullptr);
}

inline std::string Str(const std::string &json, const std::string &key) {
  size_t p = json.find("\"" + key + "\":\"");
  if (p == std::string::npos) return "";
  p += key.size() + 4;
  return json.substr(p, json.find('"', p) - p);
}

struct TempFile {
  std::string path;
  explicit TempFile(const std::string &text, const char *suffix = ".memtrace") {
    char tmpl[] = "/tmp/expseg_test_replay_XXXXXX";
    int fd = mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    path = std::string(tmpl) + suffix;
    close(fd);
    unlink(tmpl);
    FILE *f = fopen(path.c_str(), "w");
    EXPECT_NE(f, nullptr);
    if (f) {
      fwrite(text.data(), 1, text.size(), f);
      fclose(f);
    }
  }
  ~TempFile() { unlink(path.c_str()); }
};

} // namespace replay_test
