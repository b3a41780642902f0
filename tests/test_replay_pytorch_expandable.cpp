// SPDX-License-Identifier: Apache-2.0
// test_replay_pytorch_expandable.cpp: --model pytorch with expandable_segments:True is
// PyTorch's ExpandableSegment (c10/cuda/CUDACachingAllocator.cpp), call for call. Each
// workload is a memtrace small enough to work out by hand what PyTorch does; the expected
// figures (peak reserved, cuMemCreate / cuMemMap / cuMemSetAccess / cuMemUnmap /
// cuMemRelease / reservations, device allocs and frees) are derived in the comments.
// Sizes: requests round up to 512 B; the small pool's page is 2 MiB (kSmallBuffer), the
// large pool's 20 MiB (large_segment_size_mb); pages count from the segment's base.
#include "test_replay_common.h"

namespace {

using namespace replay_test;

constexpr double MiB = 1048576.0;

Outcome Pytorch(const std::string &path, std::vector<std::string> extra = {},
                const std::string &conf = "expandable_segments:True") {
  std::vector<std::string> args = {"--json", "--quiet", "--check", "--model", "pytorch",
                                   "--conf", conf};
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back(path);
  return Replay(args);
}

double Window(const Outcome &o, const char *kind) {
  return Num(o.out, kind, o.out.find("\"window_calls\":{"));
}

double Driver(const Outcome &o, const char *kind) {
  return Num(o.out, kind, o.out.find("\"driver_calls\":{"));
}

// Replays under PyTorch's model and checks the peak reserved (MiB) and the window's calls.
Outcome Expect(const std::string &path, double peak_mib,
               std::initializer_list<std::pair<const char *, double>> calls,
               const std::string &conf = "expandable_segments:True",
               std::vector<std::string> extra = {}) {
  Outcome o = Pytorch(path, extra, conf);
  EXPECT_EQ(o.rc, 0) << o.err;
  EXPECT_EQ(Num(o.out, "peak_reserved"), peak_mib * MiB) << o.out;
  for (const auto &c : calls) EXPECT_EQ(Window(o, c.first), c.second) << c.first << ": " << o.out;
  return o;
}

TEST(PytorchExpandable, PagesPerPoolOneChunkPerPageReleasedOnUnmap) {
  // a0 30,000,000 B -> 30,000,128: a new large segment (1 reserve), pages [0, 40 MiB):
  //    2 creates, 2 maps, 1 set_access; block [0, 30000128), free tail to 40 MiB
  // a1 1,000 B -> 1,024: a new small segment (1 reserve), one 2 MiB page: 1 create, 1 map,
  //    1 set_access
  // a2 15,000,000 B -> 15,000,064: the free tail (11,942,912) is too small; growth starts
  //    at the tail (the free block before the unmapped range) and must reach 30000128 +
  //    15000064 = 45,000,192 from the base: pages up to 60 MiB, 1 more create, map and
  //    set_access. Peak reserved: 60 MiB + 2 MiB = 65,011,712.
  // f a0; E: unmap_block on every free block: [0, 30000128) holds the whole page [0, 20M):
  //    1 unmap + 1 release (the chunk goes at once, no page cache); the tail [45000192,
  //    60M) holds no whole page; the small segment's free rest none. Reserved 42 MiB.
  // f a2, f a1; E: the large free block [20M, 60M): 2 unmaps + 2 releases; the small one:
  //    1 + 1; both segments are then wholly unmapped and their reservations go (2).
  // Totals: reserve 2, create 4, map 4, set_access 3, unmap 4, release 4, unreserve 2;
  // device allocs (map_block) 3, device frees (unmap_block) 3.
  TempFile f("# memtrace v1\n"
             "a 0 0 30000000\n"
             "a 0 1 1000\n"
             "a 0 2 15000000\n"
             "f 0 0 30000000\n"
             "E\n"
             "f 0 2 15000000\n"
             "f 0 1 1000\n"
             "E\n");
  // a table of per-call costs only (the published A100 figures), so the price is the calls'
  TempFile costs("reserve 14\ncreate 100\nrelease 11.5\nmap 1.25\nunmap 18.5\nset_access 28.5\n"
                 "reserve.page 0\ncreate.page 0\nrelease.page 0\nmap.page 0\nunmap.page 0\n"
                 "set_access.page 0\n",
                 ".costs");
  Outcome o = Expect(f.path, 62, {{"reserve", 2}, {"create", 4}, {"map", 4}, {"set_access", 3},
                                  {"unmap", 4}, {"release", 4}},
                     "expandable_segments:True", {"--costs", costs.path});
  EXPECT_EQ(Driver(o, "unreserve"), 2) << o.out;
  EXPECT_EQ(Num(o.out, "num_device_alloc"), 3) << o.out;
  EXPECT_EQ(Num(o.out, "num_device_free"), 3) << o.out;
  EXPECT_EQ(Num(o.out, "created_bytes"), 62.0 * MiB) << "each page created once: " << o.out;
  // priced as the calls were made: 4 creates x 100 + 4 maps x 1.25 + 3 set_access x 28.5
  // + 4 unmaps x 18.5 + 4 releases x 11.5 + 2 reserves x 14 us
  EXPECT_NEAR(Num(o.out, "driver_ms"), (400 + 5 + 85.5 + 74 + 46 + 28) / 1000.0, 0.001)
      << "printed to the microsecond: " << o.out;
  // large_segment_size_mb sets the large pool's page: 16 MiB pages, a0 needs 2 (32 MiB),
  // a2 reaches 45000192 -> 3 pages (48 MiB); peak 48 + 2 MiB
  Expect(f.path, 50, {{"create", 4}}, "expandable_segments:True,large_segment_size_mb:16");
}

TEST(PytorchExpandable, BestFitKeepsTheEndOfASegmentForGrowth) {
  // a0 10 MiB: page [0, 20M); a1 10 MiB takes the free tail [10M, 20M) exactly;
  // a2 12 MiB: page [20M, 40M); free tail [32M, 40M) (8 MiB, room to expand: the rest of
  // the reservation). f a0: a free 10 MiB block between allocated ones.
  // a3 8 MiB: best fit by size is the 8 MiB tail, but PyTorch's get_free_block moves on
  // to the next larger block while it could expand less: the 10 MiB hole (split, 2 MiB
  // left). a4 9 MiB: no free block of 9 MiB (2 MiB hole, 8 MiB tail): growth from the tail
  // to 32M + 9M: page [40M, 60M). Peak 60 MiB, 3 creates.
  // (Plain best fit would give a3 the tail and a4 the hole: 40 MiB, 2 creates.)
  TempFile f("# memtrace v1\n"
             "a 0 0 10485760\n"
             "a 0 1 10485760\n"
             "a 0 2 12582912\n"
             "f 0 0 10485760\n"
             "a 0 3 8388608\n"
             "a 0 4 9437184\n");
  Expect(f.path, 60, {{"create", 3}, {"set_access", 3}});
  Outcome e = Replay({"--json", "--quiet", "--check", "--model", "expseg", "--conf",
                      "expandable_segments:True,page_size_mb:20", f.path});
  ASSERT_EQ(e.rc, 0) << e.err;
  EXPECT_EQ(Num(e.out, "peak_reserved"), 40.0 * MiB) << "expseg's best fit: " << e.out;
}

TEST(PytorchExpandable, OutOfMemoryUnmapsEveryFreePageThenRetries) {
  // Device of 42 MiB. a0 40 MiB on stream 0: 2 pages (40 MiB). f a0. a1 20 MiB on stream
  // 1: a new segment for stream 1 (PyTorch never takes stream 0's free pages); its page's
  // cuMemCreate fails (2 MiB free on the device): alloc_block fails, release_cached_blocks
  // unmaps and releases stream 0's 2 pages (and its segment's reservation), and the retry
  // creates the page (4 creates in all, one failed). Stream 1's segment, reserved before the
  // failed create, keeps its reservation: PyTorch frees one only when unmapping a free
  // block empties it. No OOM; peak reserved 40 MiB; 2 reserves, 1 unreserve.
  TempFile f("# memtrace v1\n"
             "a 0 0 41943040\n"
             "f 0 0 41943040\n"
             "a 1 1 20971520\n"
             "f 1 1 20971520\n");
  Outcome o = Expect(f.path, 40,
                     {{"unmap", 2}, {"release", 2}, {"map", 3}, {"create", 4}, {"reserve", 2}},
                     "expandable_segments:True", {"--capacity", "42M"});
  EXPECT_EQ(Num(o.out, "num_ooms"), 0) << o.out;
  EXPECT_EQ(Driver(o, "unreserve"), 1) << "stream 0's segment, wholly unmapped: " << o.out;
}

TEST(PytorchExpandable, OversizeRulesApplyToExpandableBlocks) {
  // max_split_size_mb:64: a free 100 MiB expandable block (pages [0, 100M)) may not serve
  // a 30 MiB request (a block >= max_split_size for a request below it). Growth from the
  // unmapped range at 100M (no free block before it): 30 MiB -> 2 pages [100M, 140M).
  // Peak 140 MiB: 5 + 2 creates, 2 set_access.
  TempFile f("# memtrace v1\na 0 0 104857600\nf 0 0 104857600\na 0 1 31457280\n"
             "f 0 1 31457280\n");
  Expect(f.path, 140, {{"create", 7}, {"set_access", 2}},
         "expandable_segments:True,max_split_size_mb:64");
}

} // namespace
