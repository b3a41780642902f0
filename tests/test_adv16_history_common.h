// SPDX-License-Identifier: Apache-2.0
// test_adv16_history_common.h: what test_adv16_history.cpp and test_adv16_snapshot.cpp share: the
// events of a snapshot read by Python's pickle and of a walk, and temporary file names.
#ifndef EXPSEG_TEST_ADV16_HISTORY_COMMON_H
#define EXPSEG_TEST_ADV16_HISTORY_COMMON_H

#include <gtest/gtest.h>

#include "expseg.h"
#include "snapshot_check.h"

#include <unistd.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

inline const std::string kViewerDir = EXPSEG_SOURCE_DIR "/../shared/reference/pytorch-viewer";

struct Ev {
  std::string action;
  uint64_t addr = 0, size = 0, stream = 0;
  std::string frames; // "file:line:name;" each, innermost first
};

// The events of the newest device list of the snapshot at path, read by Python's pickle.
inline std::vector<Ev> pickle_events(const std::string &path, std::string *err) {
  std::string out;
  int rc = snapshot_run(
      "python3 -c \"import pickle,sys\n"
      "d=pickle.load(open(sys.argv[1],'rb'))\n"
      "for e in d['device_traces'][-1]:\n"
      "  fr=';'.join('%s:%d:%s'%(f['filename'],f['line'],f['name']) for f in e['frames'])\n"
      "  print(e['action'], e.get('addr', e.get('device_free')), e['size'], e['stream'], fr+';')\n"
      "\" '" + path + "'",
      &out);
  std::vector<Ev> v;
  if (rc != 0) {
    *err = out;
    return v;
  }
  std::istringstream in(out);
  Ev e;
  while (in >> e.action >> e.addr >> e.size >> e.stream >> e.frames) v.push_back(e);
  return v;
}

// The walk's events (action, addr, size, stream; no frames).
inline std::vector<Ev> walk_events(expseg_allocator *a) {
  std::vector<Ev> v;
  EXPECT_EQ(expseg_walk(
                a, nullptr,
                [](void *ctx, const expseg_walk_event *e) {
                  Ev x;
                  x.action = e->action;
                  x.addr = e->addr;
                  x.size = e->size;
                  x.stream = e->stream;
                  static_cast<std::vector<Ev> *>(ctx)->push_back(x);
                },
                &v),
            EXPSEG_OK)
      << expseg_last_error();
  return v;
}

inline std::string ev_text(const Ev &e) {
  return e.action + " " + std::to_string(e.size) + " " + std::to_string(e.stream);
}

inline std::string tmp_path(const std::string &name) {
  return ::testing::TempDir() + "adv16_" + std::to_string(getpid()) + "_" + name;
}

#endif
