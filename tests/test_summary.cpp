// SPDX-License-Identifier: Apache-2.0
// test_summary.cpp: expseg_memory_summary against torch.cuda.memory_summary()'s layout.
// The expected text below was produced by PyTorch's own formatting rules
// (torch/cuda/memory.py: memory_summary, _format_size, _format_count) applied to the fixed
// statistics that set_fixed_stats() writes: sizes stepped by 1024 while the column's `all`
// value is >= 768 KiB of the unit, counts by 1000 while >= 750,000, values wider than the
// column left as Python prints them. Then expseg's own section: framed 75-character lines.
#include <gtest/gtest.h>

#include "expseg.h"
#include "internal.h"

#include <algorithm>
#include <string>
#include <vector>

namespace {

// metric m (allocated_bytes .. inactive_split, PyTorch's order), pool p (all, small, large),
// field f (current, peak, allocated, freed)
int64_t fixed_value(int m, int p, int f) {
  static const int64_t base[16] = {805306368, 1610612736, int64_t(1) << 50, 786431, 1023, 1024,
                                   1025, int64_t(786432) * 1024, 750000, 749999, 750000000, 12,
                                   0, 999999, 5, int64_t(1) << 40};
  int64_t v = base[(m * 3 + f * 5) % 16];
  int64_t small = v >> 2;
  return p == 0 ? v : p == 1 ? small : v - small;
}

// The kept form of a statistic whose reader sees v (internal.h, stat_t): freed through base.
stat_t kept(stat_view_t v) { return stat_t{v.current, v.peak, v.allocated, v.freed - v.allocated + v.current}; }

// An array whose views are the fixed values: the pools as they are, `all` as its peak and
// the corrections that make the derived sums read the fixed `all` values.
void set_array(stat_t arr[3], int m) {
  stat_view_t v[3];
  for (int p = 0; p < 3; p++)
    v[p] = stat_view_t{fixed_value(m, p, 0), fixed_value(m, p, 1), fixed_value(m, p, 2),
                       fixed_value(m, p, 3)};
  arr[STAT_SMALL] = kept(v[STAT_SMALL]);
  arr[STAT_LARGE] = kept(v[STAT_LARGE]);
  arr[STAT_ALL] = stat_t{0, v[STAT_ALL].peak, 0, 0};
  const stat_view_t sum = stat_array_view(arr, STAT_ALL);
  ASSERT_EQ(sum.current, v[STAT_ALL].current) << "the fixed pools must add up to `all`";
  arr[STAT_ALL].allocated = v[STAT_ALL].allocated - sum.allocated;
  arr[STAT_ALL].base = v[STAT_ALL].freed - (sum.freed + arr[STAT_ALL].allocated);
  const stat_view_t all = stat_array_view(arr, STAT_ALL);
  ASSERT_EQ(all.allocated, v[STAT_ALL].allocated);
  ASSERT_EQ(all.freed, v[STAT_ALL].freed);
}

void set_fixed_stats(expseg_allocator *a) {
  stats_t *s = &a->stats;
  stat_t *arrays[9] = {s->allocated_bytes, s->active_bytes, s->requested_bytes,
                       s->reserved_bytes, s->inactive_split_bytes, s->allocation,
                       s->active, s->segment, s->inactive_split};
  for (int m = 0; m < 9; m++) set_array(arrays[m], m);
  const int64_t over[4] = {1, 2000000, 750000000, 749999};
  stat_t *o[2] = {&s->oversize_allocations, &s->oversize_segments};
  for (int i = 0; i < 2; i++)
    *o[i] = kept(stat_view_t{over[(0 + i) % 4], over[(1 + i) % 4], over[(2 + i) % 4],
                             over[(3 + i) % 4]});
  s->num_ooms = 3;
  s->num_alloc_retries = 123456789;
}

const char *const kFull =
R"(|===========================================================================|
|                  PyTorch CUDA memory summary, device ID 0                 |
|---------------------------------------------------------------------------|
|            CUDA OOMs: 3            |        cudaMalloc retries: 123456789  |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
| Allocated memory      |    768 MiB |   1024 B   | 732421 KiB |   1024 GiB |
|       from large pool |    576 MiB |    768 B   | 549316 KiB |    768 GiB |
|       from small pool |    192 MiB |    256 B   | 183105 KiB |    256 GiB |
|---------------------------------------------------------------------------|
| Active memory         | 786431 B   | 750000 B   |    976 KiB |   1024 TiB |
|       from large pool | 589824 B   | 562500 B   |    732 KiB |    768 TiB |
|       from small pool | 196607 B   | 187500 B   |    244 KiB |    256 TiB |
|---------------------------------------------------------------------------|
| Requested memory      |   1025 B   |     12 B   |    768 MiB |   1024 B   |
|       from large pool |    769 B   |      9 B   |    576 MiB |    768 B   |
|       from small pool |    256 B   |      3 B   |    192 MiB |    256 B   |
|---------------------------------------------------------------------------|
| GPU reserved memory   | 749999 B   |      5 B   | 786431 B   | 750000 B   |
|       from large pool | 562500 B   |      4 B   | 589824 B   | 562500 B   |
|       from small pool | 187499 B   |      1 B   | 196607 B   | 187500 B   |
|---------------------------------------------------------------------------|
| Non-releasable memory |      0 B   |   1536 MiB |   1025 B   |     12 B   |
|       from large pool |      0 B   |   1152 MiB |    769 B   |      9 B   |
|       from small pool |      0 B   |    384 MiB |    256 B   |      3 B   |
|---------------------------------------------------------------------------|
| Allocations           | 1099511 M  |    1023    |  749999    |       5    |
|       from large pool |  824633 M  |     768    |  562500    |       4    |
|       from small pool |  274877 M  |     255    |  187499    |       1    |
|---------------------------------------------------------------------------|
| Active allocs         | 1125899906 M  |     805 M  |       0    |    1610 M  |
|       from large pool | 844424930 M  |     603 M  |       0    |    1207 M  |
|       from small pool | 281474976 M  |     201 M  |       0    |     402 M  |
|---------------------------------------------------------------------------|
| GPU reserved segments |    1024    |     750 M  | 1099511 M  |    1023    |
|       from large pool |     768    |     562 M  |  824633 M  |     768    |
|       from small pool |     256    |     187 M  |  274877 M  |     255    |
|---------------------------------------------------------------------------|
| Non-releasable allocs |     750 K  |     999 K  | 1125899906 M  |     805 M  |
|       from large pool |     562 K  |     750 K  | 844424930 M  |     603 M  |
|       from small pool |     187 K  |     249 K  | 281474976 M  |     201 M  |
|---------------------------------------------------------------------------|
| Oversize allocations  |       1    |    2000 K  |     750 M  |  749999    |
|---------------------------------------------------------------------------|
| Oversize GPU segments |    2000 K  |     750 M  |  749999    |       1    |
|===========================================================================|
)";

// abbreviated: the same text without the pool rows (memory_summary's `abbreviated` only
// drops the large/small pool submetrics)
std::string abbreviated(const std::string &full) {
  std::string out;
  size_t at = 0;
  while (at < full.size()) {
    size_t nl = full.find('\n', at);
    std::string line = full.substr(at, nl + 1 - at);
    if (line.find("|       from ") != 0) out += line;
    at = nl + 1;
  }
  return out;
}

std::string summary(expseg_allocator *a, bool abbreviated) {
  size_t need = expseg_memory_summary(a, nullptr, 0, abbreviated);
  std::vector<char> buf(need);
  EXPECT_EQ(expseg_memory_summary(a, buf.data(), buf.size(), abbreviated), need);
  return std::string(buf.data());
}

std::vector<std::string> lines_of(const std::string &s) {
  std::vector<std::string> v;
  size_t at = 0;
  while (at < s.size()) {
    size_t nl = s.find('\n', at);
    if (nl == std::string::npos) nl = s.size();
    v.push_back(s.substr(at, nl - at));
    at = nl + 1;
  }
  return v;
}

void expect_lines(const std::string &got, const std::string &want) {
  std::vector<std::string> g = lines_of(got), w = lines_of(want);
  ASSERT_GE(g.size(), w.size());
  for (size_t i = 0; i < w.size(); i++) EXPECT_EQ(g[i], w[i]) << "line " << i + 1;
  // expseg's section follows: framed 75-character lines, ending with a '=' rule
  for (size_t i = w.size(); i < g.size(); i++) {
    EXPECT_EQ(g[i].size(), 77u) << "line " << i + 1 << ": " << g[i];
    EXPECT_TRUE(g[i].front() == '|' && g[i].back() == '|') << g[i];
  }
  EXPECT_EQ(g.back(), "|" + std::string(75, '=') + "|");
  EXPECT_NE(got.find("expseg: mapped memory and driver calls"), std::string::npos);
  EXPECT_NE(got.find("| Fragmentation         |"), std::string::npos);
}

class Summary : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(expseg_create("sim:capacity=8G", 0, "", &a_), EXPSEG_OK) << expseg_last_error();
  }
  void TearDown() override { expseg_destroy(a_); }
  expseg_allocator *a_ = nullptr;
};

TEST_F(Summary, MatchesPyTorchLayoutLineForLine) {
  set_fixed_stats(a_);
  expect_lines(summary(a_, false), kFull);
}

TEST_F(Summary, AbbreviatedHasOnlyTheAllRows) {
  set_fixed_stats(a_);
  std::string want = abbreviated(kFull);
  EXPECT_EQ(std::count(want.begin(), want.end(), '\n'), 29);
  expect_lines(summary(a_, true), want);
}

TEST_F(Summary, FreshAllocatorEveryLineFramed) {
  std::string s = summary(a_, false);
  for (const std::string &l : lines_of(s)) EXPECT_EQ(l.size(), 77u) << l;
  EXPECT_NE(s.find("| Allocated memory      |      0 B   |      0 B   |      0 B   |      0 B   |"),
            std::string::npos);
}

TEST_F(Summary, ExpsegSectionFollowsTheState) {
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(expseg_malloc(a_, 3 << 20, 0, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_malloc(a_, 1 << 20, 0, &q), EXPSEG_OK);
  ASSERT_EQ(expseg_free(a_, p), EXPSEG_OK);
  int64_t mapped = 0, active = 0;
  ASSERT_EQ(expseg_stat(a_, "reserved_bytes.all.current", &mapped), EXPSEG_OK);
  ASSERT_EQ(expseg_stat(a_, "active_bytes.all.current", &active), EXPSEG_OK);
  std::string s = summary(a_, true);
  char want[128];
  snprintf(want, sizeof want, "| Fragmentation         | %9.2f%% |", 100.0 * double(mapped - active) / double(mapped));
  EXPECT_NE(s.find(want), std::string::npos) << want << "\n" << s;
  EXPECT_NE(s.find("Driver calls: reserve "), std::string::npos) << s;
  ASSERT_EQ(expseg_free(a_, q), EXPSEG_OK);
}

TEST_F(Summary, ShortBufferTruncatesAndReportsTheLength) {
  size_t need = expseg_memory_summary(a_, nullptr, 0, false);
  ASSERT_GT(need, 75u * 40);
  char small[100];
  EXPECT_EQ(expseg_memory_summary(a_, small, sizeof small, false), need);
  EXPECT_EQ(strlen(small), sizeof small - 1);
  EXPECT_EQ(std::string(small, 4), "|===");
  EXPECT_EQ(expseg_memory_summary(nullptr, small, sizeof small, false), 0u);
  EXPECT_STREQ(small, "");
}

}  // namespace
