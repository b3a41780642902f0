// SPDX-License-Identifier: Apache-2.0
// test_alloc_inplace.cpp: the hit path's in-place split and merge (pools/block.h). A cache
// hit on the pool's last insert hands out its front and leaves the rest in place; a free
// next to the last insert grows it in place. That must give exactly what the general path
// gives (remove, split or merge, insert): the same address for every request and a state
// expseg_check accepts. Pinned by hand on small layouts, and against a model of PyTorch's
// placement (best fit: the smallest free block that fits, then the lowest address; the
// front is handed out; free neighbours merge) on random traffic inside one segment, and in
// the small pool on two streams at once; a free completing later (record_stream, an IPC
// export's deferred free) merges too;
// the in-place merge renews the idle time garbage collection orders by.
// Randomized parts seeded (fixed default, printed; EXPSEG_TEST_SEED).
#include "alloc_support.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;

void *must_alloc(expseg_allocator *a, size_t size) {
  void *p = nullptr;
  EXPECT_EQ(expseg_malloc(a, size, 0, &p), EXPSEG_OK) << size << ": " << expseg_last_error();
  return p;
}

uintptr_t u(void *p) { return (uintptr_t)p; }

const char *const kConfs[] = {"", "expandable_segments:False"};

// One segment of `bytes`, all free: its base.
void *one_free_segment(expseg_allocator *a, size_t bytes) {
  void *p = must_alloc(a, bytes);
  EXPECT_EQ(expseg_free(a, p), EXPSEG_OK);
  return p;
}

// Frees in the orders that reach each merge case: the freed block's next is the last
// insert, its previous is, both neighbours free with one of them the last insert, and
// neither is. After every step the checker passes, and at the end the segment is one free
// block again (a request of its whole size gets its base).
TEST(AllocInplace, EveryMergeCaseLeavesOneFreeBlock) {
  const int orders[][4] = {{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 3, 0, 2}, {0, 2, 1, 3},
                           {2, 0, 3, 1}, {1, 0, 3, 2}, {3, 0, 2, 1}, {2, 3, 1, 0}};
  for (const char *conf : kConfs) {
    for (const auto &order : orders) {
      AllocPtr a = make_alloc("sim:capacity=8G", conf);
      expseg_allocator *A = a.get();
      void *base = one_free_segment(A, 64 * MiB);
      void *p[4];
      for (int i = 0; i < 4; i++) {
        p[i] = must_alloc(A, 4 * MiB);
        EXPECT_EQ(u(p[i]), u(base) + i * 4 * MiB) << conf << ": the front of the rest each time";
      }
      ASSERT_EQ(expseg_check(A), EXPSEG_OK) << conf << ": " << expseg_last_error();
      for (int k : order) {
        ASSERT_EQ(expseg_free(A, p[k]), EXPSEG_OK);
        ASSERT_EQ(expseg_check(A), EXPSEG_OK)
            << conf << ", freeing block " << k << ": " << expseg_last_error();
      }
      EXPECT_EQ(stat_of(A, "inactive_split.all.current"), 0) << conf;
      EXPECT_EQ(must_alloc(A, 64 * MiB), base) << conf << ": one free block again";
      ASSERT_EQ(expseg_check(A), EXPSEG_OK) << conf << ": " << expseg_last_error();
    }
  }
}

// A repeated request is served from the front of the last insert and given back there:
// the same address every time, and the segment never grows.
TEST(AllocInplace, RepeatedPairTakesTheSameFront) {
  for (const char *conf : kConfs) {
    AllocPtr a = make_alloc("sim:capacity=8G", conf);
    expseg_allocator *A = a.get();
    void *base = one_free_segment(A, 32 * MiB);
    const int64_t segs = stat_of(A, "segment.all.current");
    void *keep = must_alloc(A, 3 * MiB); // the front stays busy: the hits come after it
    for (int i = 0; i < 1000; i++) {
      void *q = must_alloc(A, 2 * MiB + (size_t)(i % 7) * 512);
      ASSERT_EQ(u(q), u(base) + 3 * MiB) << conf << ", pair " << i;
      ASSERT_EQ(expseg_free(A, q), EXPSEG_OK);
    }
    EXPECT_EQ(stat_of(A, "segment.all.current"), segs) << conf;
    ASSERT_EQ(expseg_check(A), EXPSEG_OK) << conf << ": " << expseg_last_error();
    ASSERT_EQ(expseg_free(A, keep), EXPSEG_OK);
    EXPECT_EQ(must_alloc(A, 32 * MiB), base) << conf;
  }
}

// PyTorch's placement inside one segment of free ranges, keyed by address.
struct PlacementModel {
  std::map<uintptr_t, size_t> free_ranges; // address -> bytes
  std::map<uintptr_t, size_t> busy;        // address -> bytes handed out (whole block)
  bool classic;

  bool splits(size_t remaining) const {
    return classic ? remaining > 1 * MiB : remaining >= 512; // policy.h: _expseg_should_split
  }
  // The address a request of `rounded` bytes gets, or 0 if no free range fits.
  uintptr_t malloc(size_t rounded) {
    auto best = free_ranges.end();
    for (auto it = free_ranges.begin(); it != free_ranges.end(); ++it)
      if (it->second >= rounded && (best == free_ranges.end() || it->second < best->second))
        best = it; // ascending addresses: the first of the smallest size wins ties
    if (best == free_ranges.end()) return 0;
    const uintptr_t at = best->first;
    const size_t have = best->second;
    free_ranges.erase(best);
    if (splits(have - rounded)) {
      free_ranges[at + rounded] = have - rounded;
      busy[at] = rounded;
    } else {
      busy[at] = have;
    }
    return at;
  }
  void free(uintptr_t at) {
    size_t bytes = busy.at(at);
    busy.erase(at);
    auto next = free_ranges.find(at + bytes);
    if (next != free_ranges.end()) {
      bytes += next->second;
      free_ranges.erase(next);
    }
    auto prev = free_ranges.lower_bound(at);
    if (prev != free_ranges.begin() && (--prev)->first + prev->second == at) {
      prev->second += bytes;
    } else {
      free_ranges[at] = bytes;
    }
  }
};

// Random requests (large pool: above 1 MiB, rounded to 512 B) and frees inside one segment
// made free first; a request that fits nowhere is skipped (it would grow). Every address is
// the model's; the checker passes after every step.
TEST(AllocInplace, RandomTrafficMatchesThePlacementModel) {
  EXPSEG_SEEDED(seed, 20261123);
  for (const char *conf : kConfs) {
    SCOPED_TRACE(conf);
    TestRng rng(seed);
    AllocPtr a = make_alloc("sim:capacity=8G", conf);
    expseg_allocator *A = a.get();
    const size_t bytes = 256 * MiB;
    void *base = one_free_segment(A, bytes);
    ASSERT_EQ(stat_of(A, "reserved_bytes.large_pool.current"), (int64_t)bytes)
        << "one segment of exactly the request, all free";
    PlacementModel m{{{u(base), bytes}}, {}, conf[0] != '\0'};
    std::vector<uintptr_t> live;
    int mallocs = 0; // requests served (in place or not: the check and the model decide)
    for (int step = 0; step < 4000; step++) {
      if (live.empty() || rng.chance(0.55)) {
        // mostly a few repeated sizes (hits on the last insert), sometimes any size
        size_t size = rng.chance(0.6) ? (size_t)(1 + rng.below(4)) * 3 * MiB / 2 + 1
                                      : 1 * MiB + 1 + (size_t)rng.below(24 * MiB);
        const size_t rounded = (size + 511) / 512 * 512;
        const uintptr_t want = m.malloc(rounded);
        if (want == 0) continue; // it would grow: not this test's subject
        void *p = must_alloc(A, size);
        ASSERT_EQ(u(p), want) << "step " << step << ", request " << size;
        live.push_back(want);
        mallocs++;
      } else {
        const size_t k = (size_t)rng.below(live.size());
        ASSERT_EQ(expseg_free(A, (void *)live[k]), EXPSEG_OK) << "step " << step;
        m.free(live[k]);
        live[k] = live.back();
        live.pop_back();
      }
      ASSERT_EQ(expseg_check(A), EXPSEG_OK) << "step " << step << ": " << expseg_last_error();
    }
    EXPECT_GT(mallocs, 1000);
    EXPECT_EQ(stat_of(A, "reserved_bytes.large_pool.current"), (int64_t)bytes) << "no growth";
    for (uintptr_t p : live) ASSERT_EQ(expseg_free(A, (void *)p), EXPSEG_OK);
    EXPECT_EQ(must_alloc(A, bytes), base) << "one free block again";
    ASSERT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
  }
}

// A free that completes later (record_stream on a held stream: the block is pending until
// its event completes, at the next malloc) merges like any free: with the last insert next
// to it in place, with both neighbours when the other one is free too, and never with a
// neighbour the hit path handed out meanwhile. Each case: the merged range is one free
// block (a request of its size gets its start), the checker passes throughout.
TEST(AllocInplace, PendingFreeCompletesIntoTheLastInsert) {
  const expseg_stream S = 5;
  for (const char *conf : kConfs) {
    for (int variant = 0; variant < 3; variant++) { // 0: prev busy, 1: prev free, 2: hit between
      SCOPED_TRACE(std::string(conf) + ", variant " + std::to_string(variant));
      AllocPtr a = make_alloc("sim:capacity=8G", conf);
      expseg_allocator *A = a.get();
      void *base = one_free_segment(A, 64 * MiB);
      void *p0 = must_alloc(A, 4 * MiB), *p1 = must_alloc(A, 4 * MiB);
      ASSERT_EQ(u(p1), u(base) + 4 * MiB);
      ASSERT_EQ(expseg_record_stream(A, p1, S), EXPSEG_OK);
      ASSERT_EQ(expseg_testing_hold_stream(A, S, true), EXPSEG_OK);
      ASSERT_EQ(expseg_free(A, p1), EXPSEG_OK);
      EXPECT_EQ(stat_of(A, "expseg.pending_free_blocks.current"), 1);
      // hits on the rest (the last insert) while p1 is pending: its front, given back
      for (int i = 0; i < 3; i++) {
        void *q = must_alloc(A, 2 * MiB);
        ASSERT_EQ(u(q), u(base) + 8 * MiB) << "the pending block is not free yet";
        ASSERT_EQ(expseg_free(A, q), EXPSEG_OK);
        ASSERT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
      }
      void *mid = nullptr;
      if (variant == 1) {
        ASSERT_EQ(expseg_free(A, p0), EXPSEG_OK);
      }
      if (variant == 2) { // the last insert's front busy: p1 has no free neighbour
        mid = must_alloc(A, 3 * MiB);
        ASSERT_EQ(u(mid), u(base) + 8 * MiB);
      }
      ASSERT_EQ(expseg_testing_hold_stream(A, S, false), EXPSEG_OK);
      // the next malloc completes p1 first (slow path), then places this request
      void *r = must_alloc(A, 4 * MiB);
      EXPECT_EQ(stat_of(A, "expseg.pending_free_blocks.current"), 0);
      ASSERT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
      const uintptr_t want = variant == 1 ? u(base) : u(base) + 4 * MiB;
      EXPECT_EQ(u(r), want) << "the completed free's range merged and taken from its front";
      ASSERT_EQ(expseg_free(A, r), EXPSEG_OK);
      if (variant == 0) {
        ASSERT_EQ(expseg_free(A, p0), EXPSEG_OK);
      }
      if (variant == 2) {
        // p1's range alone (4 MiB between two busy blocks) serves an exact request
        void *x = must_alloc(A, 4 * MiB);
        EXPECT_EQ(u(x), u(base) + 4 * MiB) << "exact fit: the completed free's own range";
        ASSERT_EQ(expseg_free(A, x), EXPSEG_OK);
        ASSERT_EQ(expseg_free(A, mid), EXPSEG_OK);
        ASSERT_EQ(expseg_free(A, p0), EXPSEG_OK);
      }
      ASSERT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
      EXPECT_EQ(stat_of(A, "inactive_split.all.current"), 0);
      EXPECT_EQ(must_alloc(A, 64 * MiB), base) << "one free block again";
    }
  }
}

// The same in the small pool (blocks split down to 512 B, in 2 MiB segments) and on two
// streams at once: each stream has its own segment, and the pool's last insert is the
// block freed or split last on EITHER stream, so a hit must never take it for the other
// stream, and a free merges in place only with its own segment's neighbour. Every address
// is the stream's model's; the checker passes after every step.
TEST(AllocInplace, SmallPoolOnTwoStreamsMatchesThePlacementModel) {
  EXPSEG_SEEDED(seed, 20261124);
  for (const char *conf : kConfs) {
    SCOPED_TRACE(conf);
    TestRng rng(seed);
    AllocPtr a = make_alloc("sim:capacity=8G", conf);
    expseg_allocator *A = a.get();
    const expseg_stream streams[2] = {0, 9};
    PlacementModel m[2];
    std::vector<std::pair<int, uintptr_t>> live; // (stream index, address)
    // both segments made while the other stream's work is unfinished (an idle stream would
    // lend its free memory or give its pages to the other's growth: pools/streams.c), then
    // freed: classic ones of 2 MiB; expandable ones of at least 4 MiB (_expseg_grow_for)
    const bool expandable = conf[0] == '\0';
    const size_t seg_bytes[2] = {(expandable ? 4 : 2) * MiB, (expandable ? 4 : 2) * MiB};
    void *first[2] = {nullptr, nullptr};
    for (int k = 0; k < 2; k++) {
      ASSERT_EQ(alloc_test_hold(A, streams[1 - k], true), EXPSEG_OK);
      ASSERT_EQ(expseg_malloc(A, 1 * MiB, streams[k], &first[k]), EXPSEG_OK) << expseg_last_error();
      ASSERT_EQ(alloc_test_hold(A, streams[1 - k], false), EXPSEG_OK);
    }
    for (int k = 0; k < 2; k++) {
      ASSERT_EQ(expseg_free(A, first[k]), EXPSEG_OK);
      m[k] = PlacementModel{{{u(first[k]), seg_bytes[k]}}, {}, false}; // small: down to 512 B
    }
    const int64_t reserved = (int64_t)(seg_bytes[0] + seg_bytes[1]);
    ASSERT_EQ(stat_of(A, "reserved_bytes.small_pool.current"), reserved)
        << "one small segment per stream, all free";
    ASSERT_EQ(stat_of(A, "expseg.largest_free_block"), (int64_t)seg_bytes[0]);
    int mallocs = 0;
    for (int step = 0; step < 6000; step++) {
      const int k = (int)rng.below(2);
      if (live.empty() || rng.chance(0.55)) {
        size_t size = rng.chance(0.6) ? (size_t)(1 + rng.below(4)) * 24 * KiB + 1
                                      : 1 + (size_t)rng.below(300 * KiB);
        const size_t rounded = (size + 511) / 512 * 512;
        const uintptr_t want = m[k].malloc(rounded);
        if (want == 0) continue; // it would grow: not this test's subject
        void *p = nullptr;
        // the other stream busy: it lends nothing (a tighter fit of its own would be lent
        // when the stream's fit leaves 2 MiB or more: docs/design.md, "Reuse before growth")
        ASSERT_EQ(alloc_test_hold(A, streams[1 - k], true), EXPSEG_OK);
        ASSERT_EQ(expseg_malloc(A, size, streams[k], &p), EXPSEG_OK) << expseg_last_error();
        ASSERT_EQ(alloc_test_hold(A, streams[1 - k], false), EXPSEG_OK);
        ASSERT_EQ(u(p), want) << "step " << step << ", stream " << streams[k] << ", request " << size
                              << ", reserved " << stat_of(A, "reserved_bytes.small_pool.current");
        live.push_back({k, want});
        mallocs++;
      } else {
        const size_t j = (size_t)rng.below(live.size());
        ASSERT_EQ(expseg_free(A, (void *)live[j].second), EXPSEG_OK) << "step " << step;
        m[live[j].first].free(live[j].second);
        live[j] = live.back();
        live.pop_back();
      }
      ASSERT_EQ(expseg_check(A), EXPSEG_OK) << "step " << step << ": " << expseg_last_error();
    }
    EXPECT_GT(mallocs, 1500);
    EXPECT_EQ(stat_of(A, "reserved_bytes.small_pool.current"), reserved) << "no growth";
    for (auto &l : live) ASSERT_EQ(expseg_free(A, (void *)l.second), EXPSEG_OK);
    EXPECT_EQ(stat_of(A, "expseg.largest_free_block"), (int64_t)seg_bytes[0]) << "merged whole";
    EXPECT_EQ(stat_of(A, "inactive_split.all.current"), 0);
    for (int k = 0; k < 2; k++) {
      void *p = nullptr;
      ASSERT_EQ(expseg_malloc(A, 1 * MiB, streams[k], &p), EXPSEG_OK) << expseg_last_error();
      EXPECT_EQ(u(p), u(first[k])) << "the segment's front is free again";
      ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);
    }
    ASSERT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
  }
}

// The idle time of the last insert is renewed when it takes a freed block in place, as a
// fresh insert's would be: garbage collection gives back the oldest free memory first, so
// a stale time makes it give back the wrong segment. Classic segments, whole and free:
// A (large pool, stream 1) freed in place at t3, S (small pool: its own last insert)
// freed at t2 < t3; misses between them move the clock. Over the threshold by less than
// S's 2 MiB, garbage collection must give back S, the older, and keep A.
TEST(AllocInplace, InPlaceFreeRenewsTheIdleTimeForGarbageCollection) {
  // 1 GiB x 1/16 = 64 MiB allowed; collection above 0.515 x 64 MiB = 32.96 MiB held
  AllocPtr a = make_alloc("sim:capacity=1G", "expandable_segments:False,"
                                             "per_process_memory_fraction:0.0625,"
                                             "garbage_collection_threshold:0.515");
  expseg_allocator *A = a.get();
  auto tick = []() { std::this_thread::sleep_for(std::chrono::milliseconds(2)); };
  void *pa = nullptr, *ps = nullptr, *pz = nullptr, *pn = nullptr;
  ASSERT_EQ(expseg_malloc(A, 4 * MiB, 1, &pa), EXPSEG_OK); // miss t1: A, 20 MiB, its rest last
  tick();
  ASSERT_EQ(expseg_malloc(A, 1 * KiB, 0, &ps), EXPSEG_OK); // miss t2: S, 2 MiB (small pool)
  ASSERT_EQ(expseg_free(A, ps), EXPSEG_OK);                // S whole free at t2
  tick();
  ASSERT_EQ(expseg_malloc(A, 12 * MiB, 0, &pz), EXPSEG_OK); // miss t3: exact, nothing inserted
  ASSERT_EQ(expseg_free(A, pa), EXPSEG_OK); // A's rest (the last insert) takes it: A free at t3
  ASSERT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
  ASSERT_EQ(stat_of(A, "reserved_bytes.large_pool.current"), (int64_t)(32 * MiB));
  ASSERT_EQ(stat_of(A, "reserved_bytes.small_pool.current"), (int64_t)(2 * MiB));
  tick();
  // a miss (no free block on stream 0 fits): 34 MiB held, collection gives back one segment
  ASSERT_EQ(expseg_malloc(A, 24 * MiB, 0, &pn), EXPSEG_OK) << expseg_last_error();
  EXPECT_EQ(stat_of(A, "reserved_bytes.small_pool.current"), 0)
      << "garbage collection kept S, freed before A: A's idle time was not renewed";
  EXPECT_EQ(stat_of(A, "reserved_bytes.large_pool.current"), (int64_t)(56 * MiB))
      << "A (20 MiB, the newest free memory) given back";
  ASSERT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
  for (void *p : {pz, pn}) ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);
}

// A free deferred by an IPC export (the memory stays put while another allocator imports
// it) completes when the importer has closed it and the exporter polls: it then merges
// like any free, in place with the last insert next to it (variant 0), or with both
// neighbours (variant 1: the block before it freed meanwhile). The host driver (real
// memory, which IPC needs); the merged range's front serves the next request.
TEST(AllocInplace, FreeDeferredByAnExportCompletesIntoTheLastInsert) {
  for (const char *conf : kConfs) {
    for (int variant = 0; variant < 2; variant++) {
      SCOPED_TRACE(std::string(conf) + ", variant " + std::to_string(variant));
      AllocPtr a = make_alloc("host:capacity=256M", conf), b = make_alloc("host:capacity=256M", conf);
      expseg_allocator *A = a.get();
      void *base = one_free_segment(A, 32 * MiB);
      void *p0 = must_alloc(A, 4 * MiB), *p1 = must_alloc(A, 4 * MiB);
      ASSERT_EQ(u(p1), u(base) + 4 * MiB);
      expseg_ipc_handle h = {};
      ASSERT_EQ(expseg_ipc_export(A, p1, &h), EXPSEG_OK) << expseg_last_error();
      void *q = nullptr;
      ASSERT_EQ(expseg_ipc_import(b.get(), &h, &q), EXPSEG_OK) << expseg_last_error();
      ASSERT_EQ(expseg_free(A, p1), EXPSEG_OK); // deferred: imported
      for (int i = 0; i < 3; i++) { // hits on the last insert meanwhile
        void *x = must_alloc(A, 2 * MiB);
        ASSERT_EQ(u(x), u(base) + 8 * MiB) << "the exported block is not free yet";
        ASSERT_EQ(expseg_free(A, x), EXPSEG_OK);
      }
      if (variant == 1) {
        ASSERT_EQ(expseg_free(A, p0), EXPSEG_OK);
      }
      ASSERT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
      ASSERT_EQ(expseg_ipc_close(b.get(), q), EXPSEG_OK);
      expseg_ipc_handle_free(&h);
      size_t held = 1;
      ASSERT_EQ(expseg_ipc_poll(A, &held), EXPSEG_OK) << expseg_last_error();
      EXPECT_EQ(held, 0u);
      ASSERT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
      void *r = must_alloc(A, 4 * MiB);
      EXPECT_EQ(u(r), variant == 1 ? u(base) : u(base) + 4 * MiB)
          << "the completed free's range merged and taken from its front";
      ASSERT_EQ(expseg_free(A, r), EXPSEG_OK);
      if (variant == 0) {
        ASSERT_EQ(expseg_free(A, p0), EXPSEG_OK);
      }
      ASSERT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
      EXPECT_EQ(must_alloc(A, 32 * MiB), base) << "one free block again";
    }
  }
}

} // namespace
