// SPDX-License-Identifier: Apache-2.0
// test_history_annotations.cpp: the history's external annotations
// (expseg_history_record_annotation, PyTorch's recordAnnotation): kept only while the history
// is recorded, the newest max_entries, kept when the history is enabled again, dropped by
// EXPSEG_HISTORY_CLEAR and by stopping; read back with expseg_history_annotations and from
// the snapshot's external_annotations (Python's pickle, skipped without python3); bad
// arguments refused with a message naming them.
#include <gtest/gtest.h>

#include "expseg.h"
#include "snapshot_check.h"

#include <unistd.h>

#include <string>
#include <vector>

namespace {

struct Alloc {
  expseg_allocator *a = nullptr;
  explicit Alloc(int device = 0) {
    EXPECT_EQ(expseg_create("sim", device, "", &a), EXPSEG_OK) << expseg_last_error();
  }
  ~Alloc() { expseg_destroy(a); }
};

// "name=stage" of each kept entry (its first two pairs), oldest first; device and time in
// the others.
struct Seen {
  std::vector<std::string> text;
  std::vector<int> device;
  std::vector<uint64_t> time_us;
};

Seen Read(expseg_allocator *a) {
  Seen s;
  EXPECT_EQ(expseg_history_annotations(
                a,
                [](void *ctx, const expseg_annotation *e) {
                  Seen *s = static_cast<Seen *>(ctx);
                  std::string t;
                  for (size_t i = 0; i < e->n; i++)
                    t += std::string(i ? "," : "") + e->keys[i] + "=" + e->values[i];
                  s->text.push_back(t);
                  s->device.push_back(e->device);
                  s->time_us.push_back(e->time_us);
                },
                &s),
            EXPSEG_OK);
  return s;
}

expseg_status Record(expseg_allocator *a, const std::string &name, const char *stage) {
  const char *k[] = {"name", "stage"};
  const char *v[] = {name.c_str(), stage};
  return expseg_history_record_annotation(a, k, v, 2);
}

TEST(HistoryAnnotations, KeptOnlyWhileRecordingAndBoundedByTheHistory) {
  Alloc x;
  ASSERT_EQ(Record(x.a, "off", "START"), EXPSEG_OK);  // not recording: nothing kept
  EXPECT_TRUE(Read(x.a).text.empty());
  ASSERT_EQ(expseg_record_history_ex(x.a, true, 3, 0), EXPSEG_OK);
  for (int i = 0; i < 5; i++) ASSERT_EQ(Record(x.a, "f" + std::to_string(i), "START"), EXPSEG_OK);
  Seen s = Read(x.a);
  ASSERT_EQ(s.text, (std::vector<std::string>{"name=f2,stage=START", "name=f3,stage=START",
                                                "name=f4,stage=START"}));  // the newest 3
  EXPECT_EQ(s.device, (std::vector<int>{0, 0, 0}));
  EXPECT_GT(s.time_us[0], 1700000000ull * 1000000);  // since the epoch (after 2023)
  EXPECT_LE(s.time_us[0], s.time_us[2]);
  // enabled again with a larger bound: kept
  ASSERT_EQ(expseg_record_history_ex(x.a, true, 10, 0), EXPSEG_OK);
  ASSERT_EQ(Record(x.a, "g", "END"), EXPSEG_OK);
  EXPECT_EQ(Read(x.a).text.size(), 4u);
  // enabled again with a smaller bound: the newest that fit
  ASSERT_EQ(expseg_record_history_ex(x.a, true, 2, 0), EXPSEG_OK);
  EXPECT_EQ(Read(x.a).text, (std::vector<std::string>{"name=f4,stage=START", "name=g,stage=END"}));
  // clear_history drops them
  ASSERT_EQ(expseg_record_history_ex(x.a, true, 10, EXPSEG_HISTORY_CLEAR), EXPSEG_OK);
  EXPECT_TRUE(Read(x.a).text.empty());
  ASSERT_EQ(Record(x.a, "h", "START"), EXPSEG_OK);
  // stopping drops them; starting again does not bring them back
  ASSERT_EQ(expseg_record_history_ex(x.a, false, 0, 0), EXPSEG_OK);
  EXPECT_TRUE(Read(x.a).text.empty());
  ASSERT_EQ(expseg_record_history_ex(x.a, true, 10, 0), EXPSEG_OK);
  EXPECT_TRUE(Read(x.a).text.empty());
}

TEST(HistoryAnnotations, ManyEntriesThroughTheRingKeepTheirText) {
  Alloc x;
  ASSERT_EQ(expseg_record_history_ex(x.a, true, 100, 0), EXPSEG_OK);
  for (int i = 0; i < 1000; i++)
    ASSERT_EQ(Record(x.a, std::string(i % 50, 'x') + std::to_string(i), i % 2 ? "END" : "START"),
              EXPSEG_OK);
  Seen s = Read(x.a);
  ASSERT_EQ(s.text.size(), 100u);
  for (int i = 900; i < 1000; i++)
    EXPECT_EQ(s.text[i - 900], "name=" + std::string(i % 50, 'x') + std::to_string(i) +
                                   ",stage=" + (i % 2 ? "END" : "START"));
}

TEST(HistoryAnnotations, BadArgumentsAreRefusedNamingThem) {
  Alloc x;
  ASSERT_EQ(expseg_record_history_ex(x.a, true, 10, 0), EXPSEG_OK);
  const char *k[] = {"name", nullptr};
  const char *v[] = {"f", "START"};
  EXPECT_EQ(expseg_history_record_annotation(x.a, k, v, 2), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("keys[1] is NULL"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(expseg_history_record_annotation(x.a, k, nullptr, 1), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("values is NULL"), std::string::npos);
  EXPECT_EQ(expseg_history_record_annotation(nullptr, k, v, 1), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_history_annotations(x.a, nullptr, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(Read(x.a).text.empty());  // nothing kept from a refused call
  EXPECT_EQ(expseg_history_record_annotation(x.a, nullptr, nullptr, 0), EXPSEG_OK);  // no pairs
  EXPECT_EQ(Read(x.a).text, (std::vector<std::string>{""}));
}

TEST(HistoryAnnotations, SnapshotWritesThemAsExternalAnnotations) {
  if (!snapshot_have_python()) GTEST_SKIP() << "python3 is not installed";
  Alloc x(3);
  ASSERT_EQ(expseg_record_history_ex(x.a, true, 100, 0), EXPSEG_OK);
  ASSERT_EQ(Record(x.a, "## forward ##", "START"), EXPSEG_OK);
  ASSERT_EQ(Record(x.a, "## forward ##", "END"), EXPSEG_OK);
  std::string path = "/tmp/expseg_history_annotations_" + std::to_string(getpid()) + ".pickle";
  ASSERT_EQ(expseg_snapshot_dump(x.a, path.c_str()), EXPSEG_OK) << expseg_last_error();
  std::string out;
  int rc = snapshot_run("python3 -c \"import pickle,sys\n"
                        "s = pickle.load(open(sys.argv[1], 'rb'))\n"
                        "for e in s['external_annotations']:\n"
                        "  print(sorted(e), e['name'], e['stage'], e['device'], "
                        "e['time_us'] > 1700000000000000)\" '" + path + "'",
                        &out);
  unlink(path.c_str());
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out,
            "['device', 'name', 'stage', 'time_us'] ## forward ## START 3 True\n"
            "['device', 'name', 'stage', 'time_us'] ## forward ## END 3 True\n");
}

}  // namespace
