// SPDX-License-Identifier: Apache-2.0
// test_adv2_config.cpp: expandable_segments_reserve_by_class and
// expseg_stream_set_reserve_class under hostile input. Bad values warn and leave the class
// out (its streams keep the usual reserve); a class listed twice takes its last value; every
// accepted text prints back to a string that parses to itself; refused tags change nothing
// (statistics, the checker) and name the value; tagging a stream that already holds segments
// changes only the segments made after.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "alloc_support.h"
#include "expseg.h"

namespace {

constexpr int64_t MiB = 1 << 20, GiB = (int64_t)1 << 30;

struct Log {
  std::vector<std::string> lines;
  Log() {
    expseg_set_log_sink(
        [](void *c, const char *l) { static_cast<Log *>(c)->lines.push_back(l); }, this);
  }
  ~Log() { expseg_set_log_sink(nullptr, nullptr); }
  std::string all() const {
    std::string s;
    for (auto &l : lines) s += l + "\n";
    return s;
  }
};

std::string config_of(const expseg_allocator *a) {
  size_t n = expseg_config_string(a, nullptr, 0);
  std::string s(n + 1, '\0');
  expseg_config_string(a, &s[0], s.size());
  s.resize(std::strlen(s.c_str()));
  return s;
}

// Address space a new segment of stream 5, tagged "a", reserves for a 4 MiB request.
int64_t class_va(const std::string &list, std::string *printed, Log *log) {
  std::string cfg = "expandable_segments:True,expandable_segments_reserve_by_class:" + list;
  expseg_allocator *a = nullptr;
  size_t before = log->lines.size();
  EXPECT_EQ(expseg_create("sim:capacity=80G", 0, cfg.c_str(), &a), EXPSEG_OK)
      << list << ": " << expseg_last_error();
  if (!a) return -1;
  *printed = config_of(a);
  // what it prints parses back to itself, without a warning
  expseg_allocator *b = nullptr;
  size_t mid = log->lines.size();
  EXPECT_EQ(expseg_create("sim:capacity=80G", 0, printed->c_str(), &b), EXPSEG_OK)
      << list << ": printed " << *printed << ": " << expseg_last_error();
  if (b) {
    EXPECT_EQ(config_of(b), *printed) << list;
    expseg_destroy(b);
  }
  EXPECT_EQ(log->lines.size(), mid) << list << ": the printed form warns: " << log->all();
  (void)before;
  EXPECT_EQ(expseg_stream_set_reserve_class(a, 5, "a"), EXPSEG_OK);
  int64_t v0 = stat_of(a, "expseg.reserved_va_bytes.current");
  void *p = nullptr;
  EXPECT_EQ(expseg_malloc(a, 4 * MiB, 5, &p), EXPSEG_OK) << expseg_last_error();
  int64_t va = stat_of(a, "expseg.reserved_va_bytes.current") - v0;
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  expseg_destroy(a);
  return va;
}

TEST(Adv2Config, BadClassValuesWarnAndKeepTheUsualReserve) {
  Log log;
  std::string printed;
  const int64_t usual = class_va("[]", &printed, &log);
  ASSERT_GT(usual, 0);
  EXPECT_EQ(class_va("[a:8G]", &printed, &log), 8 * GiB);
  EXPECT_EQ(class_va("[a:0.1]", &printed, &log), 8 * GiB) << "0.1 of 80G";
  for (const char *bad : {"[a:0]", "[a:-1]", "[a:nan]", "[a:inf]", "[a:1e400]", "[a:0x10]",
                          "[a:G]", "[a:abc]", "[a:-2G]", "[a:1e-400]"}) {
    size_t before = log.lines.size();
    EXPECT_EQ(class_va(bad, &printed, &log), usual) << bad << " must keep the usual reserve";
    ASSERT_GT(log.lines.size(), before) << bad << ": no warning";
    std::string w = log.lines[before];
    std::string value = std::string(bad).substr(3, std::string(bad).size() - 4);
    EXPECT_NE(w.find("'" + value + "'"), std::string::npos) << bad << ": warning lacks the value: " << w;
    EXPECT_NE(w.find("accepted"), std::string::npos) << bad << ": " << w;
    EXPECT_EQ(printed.find("reserve_by_class:[]"), printed.find("reserve_by_class:"))
        << bad << ": printed " << printed;
  }
  // a bad value next to good ones drops only itself
  EXPECT_EQ(class_va("[b:1G,a:zz,c:2G]", &printed, &log), usual);
  EXPECT_NE(printed.find("reserve_by_class:[b:1G,c:2G]"), std::string::npos) << printed;
  EXPECT_EQ(class_va("[b:1G,a:3G,c:2G]", &printed, &log), 3 * GiB);
}

TEST(Adv2Config, AClassListedTwiceTakesItsLastValue) {
  Log log;
  std::string printed;
  EXPECT_EQ(class_va("[a:1G,a:2G]", &printed, &log), 2 * GiB);
  EXPECT_NE(printed.find("reserve_by_class:[a:2G]"), std::string::npos) << printed;
  EXPECT_NE(log.all().find("class a given twice"), std::string::npos) << log.all();
  EXPECT_EQ(class_va("[a:1G,b:3G,a:2G]", &printed, &log), 2 * GiB);
  EXPECT_NE(printed.find("reserve_by_class:[b:3G,a:2G]"), std::string::npos) << printed;
  EXPECT_EQ(class_va("[aa:1G,a:2G,b:4G,a:5G]", &printed, &log), 5 * GiB);
  EXPECT_NE(printed.find("reserve_by_class:[aa:1G,b:4G,a:5G]"), std::string::npos) << printed;
  // a bad second value is ignored: the first stays
  EXPECT_EQ(class_va("[a:2G,a:0]", &printed, &log), 2 * GiB);
}

TEST(Adv2Config, RefusedTagsChangeNothingAndTagsApplyToLaterSegments) {
  Log log;
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim:capacity=80G", 0,
                          "expandable_segments:True,expandable_segments_reserve_by_class:[big:16G]",
                          &a),
            EXPSEG_OK)
      << expseg_last_error();
  void *p0 = nullptr, *p1 = nullptr;
  ASSERT_EQ(expseg_malloc(a, 4 * MiB, 7, &p0), EXPSEG_OK); // stream 7 holds a segment
  const int64_t usual = stat_of(a, "expseg.reserved_va_bytes.current");
  auto before = stat_map(a);
  const std::string long63(63, 'x'), long64(64, 'y');
  struct Bad {
    std::string cls, names;
  } bads[] = {{long64, "64 bytes"}, {"a,b", "','"}, {"a b", "' '"}, {"[x", "'['"},
              {"x]", "']'"},        {"k:v", "':'"}, {"tab\t", "byte 3"}};
  for (const Bad &b : bads) {
    EXPECT_EQ(expseg_stream_set_reserve_class(a, 7, b.cls.c_str()), EXPSEG_ERR_INVALID_ARGUMENT)
        << b.cls;
    std::string msg = expseg_last_error();
    EXPECT_NE(msg.find(b.names), std::string::npos) << b.cls << ": " << msg;
    EXPECT_NE(msg.find("0x7"), std::string::npos) << "names the stream: " << msg;
  }
  EXPECT_EQ(expseg_stream_set_reserve_class(a, (expseg_stream)1 << 48, "big"),
            EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(stat_map(a), before) << "a refused tag changed the statistics";
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  // accepted: 63 bytes, non-ASCII bytes, an unknown class, untagging what is not tagged
  EXPECT_EQ(expseg_stream_set_reserve_class(a, 9, long63.c_str()), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_stream_set_reserve_class(a, 10, "\xff\xfe"), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(expseg_stream_set_reserve_class(a, 11, nullptr), EXPSEG_OK);
  EXPECT_EQ(expseg_stream_set_reserve_class(a, 11, ""), EXPSEG_OK);
  // the live segment of stream 7 is untouched by tagging it; the next segment follows
  ASSERT_EQ(expseg_stream_set_reserve_class(a, 7, "big"), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a, 4 * MiB, 7, &p1), EXPSEG_OK);
  EXPECT_EQ(stat_of(a, "expseg.reserved_va_bytes.current"), usual) << "room in the old segment";
  void *p2 = nullptr;
  int64_t v0 = stat_of(a, "expseg.reserved_va_bytes.current");
  ASSERT_EQ(expseg_malloc(a, (size_t)usual + MiB, 7, &p2), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(stat_of(a, "expseg.reserved_va_bytes.current") - v0, 16 * GiB)
      << "a new segment of the tagged stream reserves its class's 16G";
  for (void *p : {p0, p1, p2}) EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
  EXPECT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  expseg_destroy(a);
}

} // namespace
