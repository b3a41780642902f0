// SPDX-License-Identifier: Apache-2.0
// test_replay_cli_args.cpp: expseg-replay's output-file options refused before any replay
// (bench/replay/synth_cli.c): a --snapshot name that cannot be written (empty, a directory,
// in a directory that does not exist) is a bad argument (exit status 2, one line naming
// the option, the value and the reason) and nothing is replayed, as --timeline and
// --report FILE.html already were; a writable name leaves no probe file behind. A --costs
// name that is a directory is refused (it read as an empty table), and a refused cost
// line names the text it could not read. --capacity is one SIZE, given to the driver the
// spec names, also inside a fault wrapper ("fault:RULES;INNER"). An option that only
// qualifies another (--timeline-every, --snapshot-at) without it is refused, not ignored.
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "test_replay_common.h"

namespace {

using replay_test::Lines;
using replay_test::Replay;

TEST(ReplayCliArgs, SnapshotThatCannotBeWrittenIsRefusedBeforeTheReplay) {
  const std::string dir = "/tmp/expseg_replay_cli_args." + std::to_string(getpid());
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  struct Case {
    std::string path, why;
  } cases[] = {
      {"", "needs a file name"},
      {dir, "is a directory"},
      {dir + "/missing/x.pickle", "No such file or directory"},
  };
  for (const Case &c : cases) {
    auto r = Replay({"--quiet", "--snapshot", c.path, "--synth", "infer:1:0.01"});
    EXPECT_EQ(r.rc, 2) << c.path << ": " << r.err;
    EXPECT_EQ(r.out, "") << c.path << ": nothing is replayed";
    auto lines = Lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << c.path << ": " << r.err;
    EXPECT_NE(lines[0].find("--snapshot '" + c.path + "'"), std::string::npos) << lines[0];
    EXPECT_NE(lines[0].find(c.why), std::string::npos) << lines[0];
  }
  // The same with --snapshot=NAME.
  auto r = Replay({"--quiet", "--snapshot=" + dir, "--synth", "infer:1:0.01"});
  EXPECT_EQ(r.rc, 2) << r.err;

  // A writable name: written, and the up-front probe leaves nothing else in the directory.
  const std::string ok = dir + "/s.pickle";
  r = Replay({"--quiet", "--snapshot", ok, "--snapshot-at", "end", "--synth", "infer:1:0.01"});
  EXPECT_EQ(r.rc, 0) << r.err;
  struct stat st;
  EXPECT_EQ(stat(ok.c_str(), &st), 0);
  EXPECT_GT(st.st_size, 0);
  std::string ls;
  if (DIR *d = opendir(dir.c_str())) {
    while (struct dirent *e = readdir(d))
      if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) ls += e->d_name + std::string(" ");
    closedir(d);
  }
  EXPECT_EQ(ls, "s.pickle ");
  unlink(ok.c_str());
  rmdir(dir.c_str());
}

TEST(ReplayCliArgs, CostsDirectoryAndBadValuesAreNamed) {
  auto r = Replay({"--quiet", "--costs", "/tmp", "--synth", "infer:1:0.01"});
  EXPECT_EQ(r.rc, 2) << r.out << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("--costs '/tmp'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("directory"), std::string::npos) << r.err;

  const std::string path = "/tmp/expseg_replay_cli_costs." + std::to_string(getpid());
  for (const char *line : {"map -5", "map abc", "map 1e400", "map", "create 5 extra", "map nan"}) {
    FILE *f = fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fprintf(f, "# measured\nreserve 1\n%s\n", line);
    fclose(f);
    r = Replay({"--quiet", "--costs", path, "--synth", "infer:1:0.01"});
    EXPECT_EQ(r.rc, 2) << line << ": " << r.err;
    auto lines = Lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_NE(lines[0].find("line 3"), std::string::npos) << lines[0];
    EXPECT_NE(lines[0].find(std::string("'") + line + "'"), std::string::npos) << lines[0];
  }
  unlink(path.c_str());
}

TEST(ReplayCliArgs, CapacityIsOneSizeForTheInnerDriver) {
  for (const char *bad : {"4G,granularity=3", "4G;sim", "", "x:4G", "4 G"}) {
    auto r = Replay({"--quiet", "--capacity", bad, "--synth", "infer:1:0.01"});
    EXPECT_EQ(r.rc, 2) << bad << ": " << r.err;
    EXPECT_EQ(r.out, "");
    auto lines = Lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_NE(lines[0].find(std::string("--capacity '") + bad + "'"), std::string::npos)
        << lines[0];
  }
  // a fault wrapper: the capacity goes to the driver it wraps, added or replacing its own
  struct Case {
    const char *driver, *want;
  } cases[] = {
      {"fault:fail=map@100000;sim", "fault:fail=map@100000;sim:capacity=4G"},
      {"fault:fail=map@100000;sim:granularity=4M",
       "fault:fail=map@100000;sim:granularity=4M,capacity=4G"},
      {"fault:fail=map@100000;sim:capacity=8G", "fault:fail=map@100000;sim:capacity=4G"},
      {"sim:granularity=4M", "sim:granularity=4M,capacity=4G"},
      {"host", "host:capacity=4G"},
  };
  for (const Case &c : cases) {
    auto r = Replay({"--json", "--quiet", "--driver", c.driver, "--capacity", "4G", "--synth",
                     "infer:1:0.01"});
    EXPECT_EQ(r.rc, 0) << c.driver << ": " << r.err;
    EXPECT_NE(r.out.find(std::string("\"driver\":\"") + c.want + "\""), std::string::npos)
        << c.driver << ": " << r.out.substr(0, 300);
    EXPECT_NE(r.out.find("\"capacity\":4294967296"), std::string::npos) << r.out.substr(0, 300);
  }
}

TEST(ReplayCliArgs, QualifiersWithoutTheirOptionAreRefused) {
  struct Case {
    std::vector<std::string> args;
    const char *needle;
  } cases[] = {
      {{"--timeline-every", "5"}, "--timeline-every 5 needs --timeline"},
      {{"--snapshot-at", "end"}, "--snapshot-at end needs --snapshot"},
      {{"--snapshot-at=peak"}, "--snapshot-at peak needs --snapshot"},
  };
  for (const Case &c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"--quiet", "--synth", "infer:1:0.01"});
    auto r = Replay(args);
    EXPECT_EQ(r.rc, 2) << c.needle << ": " << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
  }
}

}  // namespace
