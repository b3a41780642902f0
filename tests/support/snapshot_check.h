/* SPDX-License-Identifier: Apache-2.0 */
/* snapshot_check.h: runs tests/check_snapshot.py (Python's pickle) and other commands for
 * the snapshot tests (test_snapshot.cpp, test_trace_snapshot.cpp). C++ only, header-only. */
#ifndef EXPSEG_SNAPSHOT_CHECK_H
#define EXPSEG_SNAPSHOT_CHECK_H

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

/* Runs cmd (stderr joined to stdout); its output in *out; its exit status, -1 if it did not
 * run or exit. */
inline int snapshot_run(const std::string &cmd, std::string *out) {
  FILE *p = popen((cmd + " 2>&1").c_str(), "r");
  out->clear();
  if (!p) return -1;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) *out += buf;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

inline bool snapshot_have_python() {
  static int ok = -1;
  if (ok < 0) ok = system("python3 -c 'import pickle, pickletools, csv, json' >/dev/null 2>&1") == 0;
  return ok == 1;
}

/* tests/check_snapshot.py on path, with expect_json (written next to it) when not empty. */
inline int snapshot_check(const std::string &path, const std::string &expect_json,
                          bool from_creation, std::string *out) {
  std::string cmd = "python3 " EXPSEG_SOURCE_DIR "/tests/check_snapshot.py --quiet '" + path + "'";
  if (!expect_json.empty()) {
    std::string ej = path + ".expect.json";
    FILE *f = fopen(ej.c_str(), "w");
    if (!f) return -1;
    fputs(expect_json.c_str(), f);
    fclose(f);
    cmd += " --expect '" + ej + "'";
  }
  if (from_creation) cmd += " --from-creation";
  return snapshot_run(cmd, out);
}

#endif
