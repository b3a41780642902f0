// SPDX-License-Identifier: Apache-2.0
// test_adv_fidx.cpp: adversarial tests of the free index (pools/fidx.c) and what it leans
// on, through the public API: expseg_check short of host memory and on corrupted index
// structures, the EXPSEG_DEBUG=3 periodic check (in free, in destroy), threads on the hit
// path while history, configuration and held streams change, and two older defects found by
// the old/new differential run (tests/fidx_diff/run.sh): garbage collection's victims
// depending on the host heap layout, and a refused release lost without host memory; and
// the in-place hit path (pools/block.h) short of host memory for its split.
// Host allocation failure is injected by replacing malloc, calloc and realloc in this
// executable (they fail only while armed); under a sanitizer (which owns malloc) the tests
// that need it are skipped. Each test's comment names the defect it pins (or, for a
// regression guard, what it keeps).
#include "adv_fidx_support.h"
#include "alloc_support.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include "host_fail.h"

namespace {

constexpr size_t KiB = 1024;

void *must_alloc(expseg_allocator *a, size_t size, expseg_stream s = 0) {
  void *p = nullptr;
  EXPECT_EQ(expseg_malloc(a, size, s, &p), EXPSEG_OK) << size << ": " << expseg_last_error();
  return p;
}

// Free blocks of one size held in a size node's heap (two holes of 256 KiB between live
// blocks: the first freed moves from the last-insert slot into the heap when the second is
// freed).
std::vector<void *> two_holes(expseg_allocator *a, std::vector<void *> *holes) {
  std::vector<void *> keep;
  for (int i = 0; i < 2; i++) {
    keep.push_back(must_alloc(a, 64 * KiB));
    holes->push_back(must_alloc(a, 256 * KiB));
  }
  keep.push_back(must_alloc(a, 64 * KiB));
  for (void *h : *holes) EXPECT_EQ(expseg_free(a, h), EXPSEG_OK);
  return keep;
}

// Defect: _expseg_fidx_check's heap walk (heap_check) mallocs its stack; when that fails it
// "skips" the walk but leaves the count at 0, and the caller then reports "heap of size N
// holds 0 blocks, count M": expseg_check calls a sound allocator corrupt whenever host
// memory is short. (At EXPSEG_DEBUG=3 the periodic check in malloc/free aborts the
// process on it: see DebugCheckSurvivesHostShortage.)
TEST(AdvFidx, CheckIsNotCorruptWhenHostMemoryIsShort) {
#ifdef EXPSEG_TEST_SANITIZED
  GTEST_SKIP() << "malloc cannot be replaced under a sanitizer";
#else
  for (const char *conf : {"", "expandable_segments:False"}) {
    AllocPtr a = make_alloc("sim:capacity=8G", conf);
    std::vector<void *> holes;
    std::vector<void *> keep = two_holes(a.get(), &holes);
    ASSERT_EQ(expseg_check(a.get()), EXPSEG_OK) << expseg_last_error();
    g_fail_host = true;
    expseg_status st = expseg_check(a.get());
    g_fail_host = false;
    std::string msg = expseg_last_error();
    // Out of host memory the check may skip work or say it ran out; it must not report
    // corruption of a sound allocator.
    EXPECT_NE(st, EXPSEG_ERR_INVALID_ARGUMENT) << conf << ": " << msg;
    EXPECT_EQ(msg.find("holds 0 blocks"), std::string::npos) << conf << ": " << msg;
    ASSERT_EQ(expseg_check(a.get()), EXPSEG_OK) << expseg_last_error();
    for (void *p : keep) ASSERT_EQ(expseg_free(a.get(), p), EXPSEG_OK);
  }
#endif
}

// The same defect seen at EXPSEG_DEBUG=3 (the level of CI's test build): the check every
// N operations runs inside expseg_free and aborts the process when host memory is short
// at that moment, although nothing is corrupt. expseg_free needs no host memory (docs/
// design.md, "No allocation on free"), so frees with host memory gone must all succeed.
TEST(AdvFidx, DebugCheckSurvivesHostShortage) {
#ifdef EXPSEG_TEST_SANITIZED
  GTEST_SKIP() << "malloc cannot be replaced under a sanitizer";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        expseg_allocator *a = nullptr;
        if (expseg_create("sim:capacity=8G", 0, "expandable_segments:False", &a) != EXPSEG_OK)
          std::exit(2);
        std::vector<void *> live;
        live.reserve(20000);
        for (int i = 0; i < 6000; i++) { // blocks of many sizes, so that heaps are not empty
          void *p = nullptr;
          if (expseg_malloc(a, (size_t)(1 + i % 3) * 512 * KiB / 4, 0, &p) != EXPSEG_OK)
            std::exit(3);
          live.push_back(p);
        }
        g_fail_host = true; // host memory gone: frees alone (more than one check interval)
        for (size_t i = 0; i < live.size(); i += 2)
          if (expseg_free(a, live[i]) != EXPSEG_OK) std::exit(4);
        g_fail_host = false;
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
#endif
}

// Threads on the hit path while others toggle what sends requests off it: history
// recording on and off, runtime configuration (max_split_size, rounding), held streams
// with record_stream (pending frees), empty_cache and the checker. Every block handed out
// must overlap no live block (a registry of live ranges), and the allocator must check
// clean at the end with everything back. Meant for ThreadSanitizer too.
TEST(AdvFidx, ThreadsOnTheHitPathWithTogglers) {
  EXPSEG_SEEDED(seed, 99);
  size_t ops = 20000;
  if (const char *e = std::getenv("EXPSEG_TEST_OPS")) ops = std::strtoull(e, nullptr, 10);
  for (const char *conf : {"", "expandable_segments:False,max_split_size_mb:64"}) {
    AllocPtr a = make_alloc("sim:capacity=8G", conf);
    expseg_allocator *A = a.get();
    std::mutex mu;
    std::map<uintptr_t, size_t> live; // start -> size
    std::atomic<int> errors{0};
    std::atomic<bool> stop{false};
    auto fail = [&](const std::string &what) {
      if (errors.fetch_add(1) < 5)
        ADD_FAILURE() << conf << ", " << test_seed_note(seed) << ": " << what << ": "
                      << expseg_last_error();
    };
    auto enter = [&](void *p, size_t size) {
      std::lock_guard<std::mutex> g(mu);
      uintptr_t x = (uintptr_t)p;
      auto it = live.upper_bound(x);
      if (it != live.end() && it->first < x + size) fail("block overlaps the next live block");
      if (it != live.begin() && std::prev(it)->first + std::prev(it)->second > x)
        fail("block overlaps the previous live block");
      live[x] = size;
    };
    auto leave = [&](void *p) {
      std::lock_guard<std::mutex> g(mu);
      live.erase((uintptr_t)p);
    };
    auto worker = [&](int id) {
      TestRng rng(seed * 7919 + (uint64_t)id + 1);
      auto next = [&rng]() { return rng.next(); };
      const expseg_stream own = 10 + (expseg_stream)id, shared = 0;
      std::vector<std::pair<void *, size_t>> mine;
      const size_t sizes[4] = {1000 + (size_t)id * 512, 300 * KiB, 3 * 1024 * KiB + 17, 25 * 1024 * KiB};
      for (size_t i = 0; i < ops; i++) {
        uint64_t r = next() % 100;
        if (r < 50 && mine.size() < 48) {
          size_t size = next() % 4 == 0 ? 1 + next() % (8 * 1024 * KiB) : sizes[next() % 4];
          expseg_stream st = next() % 3 == 0 ? shared : own;
          void *p = nullptr;
          expseg_status rc = expseg_malloc(A, size, st, &p);
          if (rc == EXPSEG_OK) {
            enter(p, size);
            mine.push_back({p, size});
          } else if (rc != EXPSEG_ERR_OUT_OF_MEMORY && rc != EXPSEG_ERR_HOST_OUT_OF_MEMORY) {
            fail("malloc");
          }
        } else if (!mine.empty()) {
          size_t k = next() % mine.size();
          void *p = mine[k].first;
          if (next() % 10 == 0 && expseg_record_stream(A, p, 5 + next() % 2) != EXPSEG_OK)
            fail("record_stream");
          leave(p);
          if (expseg_free(A, p) != EXPSEG_OK) fail("free");
          mine[k] = mine.back();
          mine.pop_back();
        }
      }
      for (auto &m : mine) {
        leave(m.first);
        if (expseg_free(A, m.first) != EXPSEG_OK) fail("final free");
      }
    };
    std::thread toggler([&]() {
      const char *confs[] = {"max_split_size_mb:40", "max_split_size_mb:4000",
                             "roundup_power2_divisions:4", "roundup_power2_divisions:0"};
      for (unsigned i = 0; !stop.load(); i++) {
        switch (i % 6) {
        case 0: (void)expseg_record_history_ex(A, i % 12 == 0, 1000, 0); break;
        case 1: (void)expseg_configure(A, confs[(i / 6) % 4]); break;
        case 2: (void)expseg_testing_hold_stream(A, 5, (i / 6) % 2 == 0); break;
        case 3: (void)expseg_empty_cache(A); break;
        case 4:
          if (expseg_check(A) != EXPSEG_OK) fail("check (concurrent)");
          break;
        default: {
          int64_t v;
          (void)expseg_stat(A, "expseg.largest_free_block", &v);
        }
        }
        std::this_thread::yield();
      }
      (void)expseg_testing_hold_stream(A, 5, false);
      (void)expseg_record_history(A, false, 0);
    });
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; t++) ts.emplace_back(worker, t);
    for (auto &t : ts) t.join();
    stop = true;
    toggler.join();
    ASSERT_EQ(errors.load(), 0);
    ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);
    EXPECT_EQ(expseg_check(A), EXPSEG_OK) << conf << ": " << expseg_last_error();
    EXPECT_EQ(stat_of(A, "allocated_bytes.all.current"), 0) << conf;
    EXPECT_EQ(stat_of(A, "reserved_bytes.all.current"), 0) << conf;
  }
}

// The state the corruption tests start from: equal-size holes on two streams (heaps with
// children), an emptied size node, spare nodes. Returns the blocks to free at the end.
std::vector<void *> corruptible_state(expseg_allocator *A) {
  std::vector<void *> keep, holes;
  for (expseg_stream s : {(expseg_stream)0, (expseg_stream)3})
    for (int i = 0; i < 12; i++) {
      keep.push_back(must_alloc(A, 64 * KiB, s));
      holes.push_back(must_alloc(A, (size_t)(1 + i % 4) * 128 * KiB, s));
    }
  keep.push_back(must_alloc(A, 64 * KiB));
  for (void *h : holes) EXPECT_EQ(expseg_free(A, h), EXPSEG_OK);
  keep.push_back(must_alloc(A, 128 * KiB)); // a hole of that size taken back
  void *odd = must_alloc(A, 999 * KiB);     // a size of its own, freed and taken again
  keep.push_back(must_alloc(A, 64 * KiB));
  EXPECT_EQ(expseg_free(A, odd), EXPSEG_OK);
  void *other = must_alloc(A, 64 * KiB, 3); // moves the odd block into its heap
  EXPECT_EQ(expseg_free(A, must_alloc(A, 64 * KiB * 3 + 512)), EXPSEG_OK);
  keep.push_back(must_alloc(A, 999 * KiB)); // takes the odd block: its node is left empty
  keep.push_back(other);
  return keep;
}

const char *const kCorruptNames[ADV_CORRUPT_COUNT_KINDS] = {
    "count", "drop child", "drop last", "treap order", "empty list", "lose spare", "heap order"};

void expect_check_catches(int kind) {
  for (const char *conf : {"", "expandable_segments:False"}) {
    AllocPtr a = make_alloc("sim:capacity=8G", conf);
    expseg_allocator *A = a.get();
    std::vector<void *> keep = corruptible_state(A);
    ASSERT_EQ(expseg_check(A), EXPSEG_OK) << conf << ": " << expseg_last_error();
    ASSERT_TRUE(adv_fidx_corrupt(A, kind)) << conf << ": nothing to corrupt for " << kCorruptNames[kind];
    expseg_status st = expseg_check(A);
    adv_fidx_undo(A);
    EXPECT_NE(st, EXPSEG_OK) << conf << ": expseg_check missed corruption '" << kCorruptNames[kind] << "'";
    ASSERT_EQ(expseg_check(A), EXPSEG_OK) << conf << ": after undoing '" << kCorruptNames[kind]
                                          << "': " << expseg_last_error();
    for (void *p : keep) ASSERT_EQ(expseg_free(A, p), EXPSEG_OK);
    EXPECT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
  }
}

// Each corruption of the free index's structures (adv_fidx_support.h) makes expseg_check
// fail, and undoing it makes it pass again (these hold on main).
TEST(AdvFidx, CheckCatchesEachCorruption) {
  for (int k = 0; k < ADV_CORRUPT_COUNT_KINDS; k++)
    if (k != ADV_CORRUPT_LOSE_SPARE) expect_check_catches(k);
}

// Defect (a gap of the check): what makes a free never need host memory is that size nodes
// are never fewer than the block structs made (and the table at most half full of them);
// _expseg_fidx_check verifies spare + indexed == n_nodes but never n_nodes >= the block
// structs made, so an index that can run out of nodes on a later free (node_make asserts
// then) checks clean. Fix: pass the block structs made (a->n_slabs * SLAB_BLOCKS) to
// _expseg_fidx_check and FAIL when n_nodes is below it or 2 * n_nodes > cap.
TEST(AdvFidx, CheckCatchesFewerNodesThanBlocks) { expect_check_catches(ADV_CORRUPT_LOSE_SPARE); }

// Defect (older than the free index, found by the differential run old vs new library:
// tests/fidx_diff): garbage collection picks its victims oldest first, but blocks and
// segments freed between the same two misses share one idle time (a->now_ns is read on
// misses only), and policy/gc.c breaks such ties by the item's tag, the HOST address of
// the block_t or segment_t struct. So which memory is given back depends on where malloc
// put those structs: the same program hands out different device addresses when the host
// heap is laid out differently (and the new index, whose node slabs sit among the block
// slabs, changes replays with garbage_collection_threshold against the old library).
// Fix: break ties by the device address (segment base, block ptr) before the tag.
TEST(AdvFidx, GcVictimsDoNotDependOnHostHeapLayout) {
  constexpr size_t MiB = 1024 * KiB;
  std::string first;
  for (int holes : {0, 2, 10, 50, 100, 400, 1000}) {
    std::vector<void *> hold; // holes in the host heap that structs made later fill
    for (int j = 0; j < holes; j++) hold.push_back(std::malloc(64 + 16 * (size_t)(j % 24)));
    for (int j = 0; j < holes; j += 2) std::free(hold[(size_t)j]);
    AllocPtr a = make_alloc("sim:capacity=8G", "expandable_segments:False,"
                                               "garbage_collection_threshold:0.6,"
                                               "per_process_memory_fraction:0.5");
    expseg_allocator *A = a.get();
    std::vector<void *> p, rest;
    for (int i = 0; i < 26; i++) p.push_back(must_alloc(A, 100 * MiB));
    for (int i = 0; i < 26; i += 2) ASSERT_EQ(expseg_free(A, p[(size_t)i]), EXPSEG_OK);
    // a miss over threshold x allowed: GC gives back some of the 13 equally idle segments
    std::string seq = std::to_string((uintptr_t)must_alloc(A, 300 * MiB));
    for (int i = 0; i < 13; i++) { // the segments GC kept come back first, lowest address first
      void *q = must_alloc(A, 100 * MiB);
      seq += " " + std::to_string((uintptr_t)q);
    }
    if (std::getenv("ADV_VERBOSE")) std::printf("%d: %s\n", holes, seq.c_str());
    if (first.empty()) first = seq;
    EXPECT_EQ(seq, first) << "host heap perturbed by " << holes
                          << " small blocks: garbage collection chose other victims";
    for (int j = 1; j < holes; j += 2) std::free(hold[(size_t)j]);
  }
}

// Defect (older than the free index; found by the differential run with the checker on):
// expseg_destroy tears the allocator down and then unlocks with api_unlock, whose
// EXPSEG_DEBUG=3 tick runs the full check every EXPSEG_CHECK_EVERY (1000) operations on
// the destroyed allocator: its counts (unmapped index, idle lists) still name freed
// blocks, so the check fails and aborts the process, once in 1000 destroys at random (or
// walks freed memory). Here destroys are spread over every residue of the operation
// counter (3 counted operations per round, 3 and 1000 coprime). Fix: end _expseg_destroy_with
// with pthread_mutex_unlock + _expseg_log_defer(false) instead of api_unlock (no tick).
TEST(AdvFidx, DestroyNeverRunsTheCheckOnATornDownAllocator) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        for (int round = 0; round < 1001; round++) {
          expseg_allocator *a = nullptr;
          if (expseg_create("sim:capacity=8G", 0, "", &a) != EXPSEG_OK) std::exit(2);
          void *p = nullptr;
          if (expseg_malloc(a, 3 * 1024 * KiB, 0, &p) != EXPSEG_OK) std::exit(3);
          if (expseg_free(a, p) != EXPSEG_OK) std::exit(4);
          expseg_destroy(a);
        }
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// Defect (older than the free index; found by random traffic with host memory failing):
// when the driver refuses a release for want of host memory (sim: "unreserve: out of host
// memory for the free list") and the retry list cannot grow either, release.c's
// _expseg_release_keep has already put the item's reserved_bytes / reserved_va_bytes back
// but keeps the item nowhere ("a refused release is lost"): the statistics then count
// address space and memory that no segment, cache entry or retry item holds, and
// expseg_check reports "statistic expseg.reserved_va_bytes.current is X, a recount gives
// Y" from then on. Fix: make room on the retry list before releasing (so keeping a refused
// item needs no memory), or count a lost item nowhere (and say so in the warning).
TEST(AdvFidx, ReleaseRefusedWithoutHostMemoryKeepsTheStatisticsTrue) {
#ifdef EXPSEG_TEST_SANITIZED
  GTEST_SKIP() << "malloc cannot be replaced under a sanitizer";
#else
  constexpr size_t MiB = 1024 * KiB;
  for (long k = 0; k < 40; k++) { // host memory runs out after k allocations in the malloc
    AllocPtr a = make_alloc("sim:capacity=1G", "expandable_segments:False");
    expseg_allocator *A = a.get();
    std::vector<void *> p;
    for (int i = 0; i < 64; i++) p.push_back(must_alloc(A, 12 * MiB, (expseg_stream)(i % 8)));
    for (size_t i = 0; i < p.size(); i += 2) ASSERT_EQ(expseg_free(A, p[i]), EXPSEG_OK);
    ASSERT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
    g_countdown = k;
    void *big = nullptr; // out of device memory: the free segments go back (32 VA holes)
    if (expseg_malloc(A, 600 * MiB, 99, &big) != EXPSEG_OK) big = nullptr;
    g_countdown = -1;
    g_fail_host = false;
    ASSERT_EQ(expseg_check(A), EXPSEG_OK) << "host memory gone after " << k
                                          << " allocations in malloc: " << expseg_last_error();
    for (size_t i = 1; i < p.size(); i += 2) ASSERT_EQ(expseg_free(A, p[i]), EXPSEG_OK);
    if (big != nullptr) {
      ASSERT_EQ(expseg_free(A, big), EXPSEG_OK);
    }
    ASSERT_EQ(expseg_empty_cache(A), EXPSEG_OK);
    ASSERT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
  }
#endif
}

// Regression guard (the in-place hit path, pools/block.h): a hit on the pool's last insert
// takes a new block struct for the front it hands out (a slab refill when the structs run
// out, every EXPSEG_SLAB_BLOCKS), and the pointer map may have to grow right after that
// split. Either failure must leave what the general path leaves: the whole rest handed out
// (no struct for a split), or the request refused with the layout unchanged (the front
// merged back into the last insert). One free segment; every other block of a first size
// freed (holes: block structs without map entries, so that the map's growth and the slab's
// refill fall on different requests), then requests of a larger size taken from the rest,
// host memory gone from the 1010th live block on. Each success is the front of the rest (or
// the whole rest); each refusal changes nothing (with host memory back the same request
// gets the same address); frees need no host memory; at the end the segment is one free
// block again. (Counts follow base/map.h's doubling and EXPSEG_SLAB_BLOCKS; the last two
// expectations say when the scenario is no longer met.)
TEST(AdvFidx, HitSplitShortOfHostMemoryChangesNothingElse) {
#ifdef EXPSEG_TEST_SANITIZED
  GTEST_SKIP() << "malloc cannot be replaced under a sanitizer";
#else
  constexpr size_t MiB = 1024 * KiB, seg = 4096 * MiB;
  for (const char *conf : {"", "expandable_segments:False"}) {
    SCOPED_TRACE(conf);
    int refused = 0, whole = 0;
    AllocPtr a = make_alloc("sim:capacity=8G", conf);
    expseg_allocator *A = a.get();
    void *base = must_alloc(A, seg);
    ASSERT_EQ(expseg_free(A, base), EXPSEG_OK);
    std::vector<void *> live;
    for (int i = 0; i < 1000; i++) live.push_back(must_alloc(A, 1 * MiB + 512));
    for (size_t i = 0; i < live.size(); i += 2) ASSERT_EQ(expseg_free(A, live[i]), EXPSEG_OK);
    for (size_t i = 0; i < live.size() / 2; i++) live[i] = live[2 * i + 1];
    live.resize(live.size() / 2);
    uintptr_t next = (uintptr_t)base + 1000 * (MiB + 512), end = (uintptr_t)base + seg;
    const size_t size = 2 * MiB + 1024; // no hole fits: the front of the rest each time
    for (int i = 0; live.size() < 2000 && next < end; i++) {
      const int64_t before = stat_of(A, "allocated_bytes.all.current");
      void *p = nullptr;
      g_fail_host = live.size() >= 1010;
      expseg_status st = expseg_malloc(A, size, 0, &p);
      g_fail_host = false;
      ASSERT_EQ(expseg_check(A), EXPSEG_OK) << "request " << i << ": " << expseg_last_error();
      const int64_t got = stat_of(A, "allocated_bytes.all.current") - before;
      if (st != EXPSEG_OK) { // refused: nothing changed, and with host memory it is served
        ASSERT_EQ(st, EXPSEG_ERR_HOST_OUT_OF_MEMORY) << i << ": " << expseg_last_error();
        ASSERT_EQ(stat_of(A, "num_ooms"), 0) << i << ": host memory is not the device's";
        ASSERT_EQ(got, 0) << "request " << i << " refused but changed the allocated bytes";
        refused++;
        ASSERT_EQ(expseg_malloc(A, size, 0, &p), EXPSEG_OK) << i << ": " << expseg_last_error();
        ASSERT_EQ((uintptr_t)p, next) << "request " << i << " after a refusal";
        ASSERT_EQ(stat_of(A, "allocated_bytes.all.current") - before, (int64_t)size);
      } else {
        ASSERT_EQ((uintptr_t)p, next) << "request " << i << ": the front of the rest";
        if (got != (int64_t)size) { // no struct for the split: the whole rest, as before
          ASSERT_EQ(got, (int64_t)(end - next)) << "request " << i;
          whole++;
        }
      }
      next += (size_t)(stat_of(A, "allocated_bytes.all.current") - before);
      live.push_back(p);
    }
    for (size_t i = 0; i < live.size(); i++) { // frees merge in place or not: no host memory
      const size_t j = (i * 7919) % live.size(); // a permutation (7919 is prime, > the count)
      g_fail_host = true;
      expseg_status st = expseg_free(A, live[j]);
      g_fail_host = false;
      ASSERT_EQ(st, EXPSEG_OK) << "free " << i << ": " << expseg_last_error();
      ASSERT_EQ(expseg_check(A), EXPSEG_OK) << "free " << i << ": " << expseg_last_error();
    }
    EXPECT_EQ(stat_of(A, "inactive_split.all.current"), 0);
    EXPECT_EQ(must_alloc(A, seg), base) << "one free block again";
    ASSERT_EQ(expseg_check(A), EXPSEG_OK) << expseg_last_error();
    EXPECT_GT(refused, 0) << "the pointer map never had to grow while host memory was gone";
    EXPECT_GT(whole, 0) << "no split ever lacked a block struct";
  }
#endif
}

} // namespace
