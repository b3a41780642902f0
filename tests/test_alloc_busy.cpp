// SPDX-License-Identifier: Apache-2.0
// test_alloc_busy.cpp: a seeded random run that tracks busy memory, through the public API
// and the testing hooks only (expseg.h, expseg_testing.h), on the host driver (real memory)
// behind a fault wrapper that fails driver calls of every kind at random points.
//
// Streams 1..5 are held and released at random (work on a held stream does not complete).
// A block freed while its stream is held stays busy for every *other* stream until that
// stream is released (reuse on its own stream is ordered after its work, as in PyTorch); a
// block used through record_stream on a held stream is busy for everyone. Any allocation
// overlapping busy memory fails the test: the allocator handed out memory the GPU may
// still be using. After each operation: expseg_check (every structure and statistic
// recounted, driver counts included), the statistics against this test's own model, the
// data of the block just touched, and every 500 operations the data of every live block.
// An out-of-memory error is accepted only where a fault was injected during the call, a
// stream is held, the memory fraction caps the allocator, or what it reserves plus the
// request exceeds the device; anything else is a spurious OOM and fails. At the end:
// destroy, the driver holds nothing, the process's descriptor count is back where it was.
//
// EXPSEG_TEST_SEED: the seed (printed); EXPSEG_TEST_OPS: operations (default 100000).
// test_gpu_busy.cpp runs the same on cuda against the CUDA driver double.
#include "alloc_support.h"
#ifdef EXPSEG_ALLOC_BUSY_GPU
#include "cudadouble.h"
#include "vmm.h"
#endif

#include <gtest/gtest.h>

#include <dirent.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr size_t KiB = 1024, MiB = 1024 * KiB;
constexpr size_t kCapacity = 256 * MiB;
constexpr int kStreams = 6; // 0 .. 5; 0 is never held

const char *const kKinds[] = {"reserve",     "unreserve",         "create",
                              "release",     "map",               "unmap",
                              "set_access",  "event_create",      "event_destroy",
                              "event_record", "event_query",      "event_synchronize",
                              "stream_synchronize"};

int open_fds() {
  int n = 0;
  if (DIR *d = opendir("/proc/self/fd")) {
    while (readdir(d)) n++;
    closedir(d);
  }
  return n;
}

uint64_t env_u64(const char *name, uint64_t dflt) {
  const char *e = std::getenv(name);
  return e && *e ? std::strtoull(e, nullptr, 0) : dflt;
}

struct Block {
  size_t size;
  expseg_stream stream;
  std::vector<expseg_stream> uses; // record_stream
  uint64_t tag;
};

struct Busy {
  uintptr_t lo, hi;
  expseg_stream owner; // busy for streams other than owner, until owner is released
  bool everyone;       // busy for every stream (a record_stream use), until `owner` released
};

// A pattern at both ends and the middle of a block (whole small blocks).
void spots(size_t size, size_t out[3], size_t *n) {
  *n = 0;
  out[(*n)++] = 0;
  if (size >= 16) out[(*n)++] = (size / 2) & ~(size_t)7;
  if (size >= 24) out[(*n)++] = (size - 8) & ~(size_t)7;
}

void write_tag(void *p, size_t size, uint64_t tag) {
  size_t at[3], n;
  spots(size, at, &n);
  for (size_t i = 0; i < n; i++) {
    if (size - at[i] >= 8) std::memcpy((char *)p + at[i], &tag, 8);
    else std::memcpy((char *)p + at[i], &tag, size - at[i]);
  }
}

bool tag_ok(const void *p, size_t size, uint64_t tag) {
  size_t at[3], n;
  spots(size, at, &n);
  for (size_t i = 0; i < n; i++) {
    size_t k = size - at[i] >= 8 ? 8 : size - at[i];
    if (std::memcmp((const char *)p + at[i], &tag, k) != 0) return false;
  }
  return true;
}


} // namespace

// spec: the driver under the fault wrapper; driver_streams: streams 1..5 are created by the
// driver (cuda), else any value is a stream (host).
static void run_busy(const char *spec, bool driver_streams, uint64_t default_ops) {
  EXPSEG_SEEDED(seed, 20261122);
  const uint64_t ops = env_u64("EXPSEG_TEST_OPS", default_ops);
  std::printf("%s: %llu operations (EXPSEG_TEST_OPS)\n", spec, (unsigned long long)ops);
  const std::string S = "seed " + std::to_string(seed) + ": ";
  std::mt19937_64 rng(seed);
  auto below = [&](uint64_t n) { return rng() % n; };
  auto chance = [&](double p) { return (double)(rng() >> 11) / 9007199254740992.0 < p; };

  int warnings = 0;
  expseg_set_log_sink([](void *ctx, const char *) { ++*static_cast<int *>(ctx); }, &warnings);
  const int fds_before = open_fds();
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create(spec, 0, "expandable_segments:True", &a), EXPSEG_OK)
      << expseg_last_error();
  expseg_stream st[kStreams] = {0}; // stream i's handle
  for (int i = 1; i < kStreams; i++) {
    if (driver_streams) {
      ASSERT_EQ(expseg_stream_create(a, &st[i]), EXPSEG_OK) << expseg_last_error();
    } else {
      st[i] = (expseg_stream)i;
    }
  }

  std::map<uintptr_t, Block> live;
  std::vector<Busy> busy;
  bool held[kStreams] = {false};
  int n_held = 0;
  int64_t model_requested = 0;
  double fraction = 1.0;
  uint64_t next_tag = 1, overlaps_checked = 0, ooms = 0, driver_errors = 0;

  auto release_stream = [&](expseg_stream s) {
    ASSERT_EQ(expseg_testing_hold_stream(a, st[s], false), EXPSEG_OK);
    held[s] = false;
    n_held--;
    std::vector<Busy> keep;
    for (const Busy &b : busy)
      if (b.owner != s) keep.push_back(b);
    busy.swap(keep);
  };

  for (uint64_t op = 0; op < ops; op++) {
    const std::string where = S + "op " + std::to_string(op);
    // a fault in one driver call kind, now and then (map@1: the next map fails)
    if (chance(0.06)) {
      std::string rule = std::string(kKinds[below(sizeof kKinds / sizeof *kKinds)]) + "@" +
                         std::to_string(1 + below(3));
      if (chance(0.3)) rule += ":oom";
      ASSERT_EQ(expseg_testing_set_faults(a, rule.c_str()), EXPSEG_OK) << where;
    }
    const uint64_t injected_before = expseg_testing_faults_injected(a);
    const uint64_t pick = below(1000);
    size_t live_bytes = (size_t)model_requested;
    if (pick < 470 && live_bytes < 96 * MiB) { // ---- malloc
      size_t size;
      uint64_t u = below(100);
      if (u < 55) size = 1 + below(1 * MiB);
      else if (u < 90) size = 1 * MiB + below(9 * MiB);
      else size = 10 * MiB + below(22 * MiB);
      expseg_stream s = below(kStreams);
      void *p = nullptr;
      expseg_status st_ = expseg_malloc(a, size, st[s], &p);
      bool faulted = expseg_testing_faults_injected(a) != injected_before;
      if (st_ == EXPSEG_OK) {
        ASSERT_NE(p, nullptr) << where;
        uintptr_t lo = (uintptr_t)p, hi = lo + size;
        for (const Busy &b : busy) {
          overlaps_checked++;
          if ((b.everyone || b.owner != s) && lo < b.hi && b.lo < hi)
            FAIL() << where << ": stream " << s << " was handed [" << std::hex << lo << ", "
                   << hi << ") overlapping [" << b.lo << ", " << b.hi << ") freed on held stream "
                   << std::dec << b.owner << (b.everyone ? " (record_stream use)" : "");
        }
        auto it = live.lower_bound(lo);
        if (it != live.end()) {
          ASSERT_GE(it->first, hi) << where << ": overlaps a live block";
        }
        if (it != live.begin()) {
          --it;
          ASSERT_LE(it->first + it->second.size, lo) << where << ": overlaps a live block";
        }
        uint64_t tag = next_tag++ * 0x9E3779B97F4A7C15ull;
        write_tag(p, size, tag);
        live[lo] = Block{size, s, {}, tag};
        model_requested += (int64_t)size;
      } else if (st_ == EXPSEG_ERR_OUT_OF_MEMORY) {
        ooms++;
        int64_t reserved = stat_of(a, "reserved_bytes.all.current");
        size_t need = (size + 20 * MiB - 1) / (20 * MiB) * (20 * MiB) + 2 * MiB;
        bool explained = faulted || n_held > 0 || fraction < 1.0 ||
                         (size_t)reserved + need > kCapacity;
        ASSERT_TRUE(explained) << where << ": spurious out-of-memory for " << size
                               << " bytes with " << reserved << " reserved: "
                               << expseg_last_error();
      } else {
        driver_errors++;
        ASSERT_EQ(st_, EXPSEG_ERR_DRIVER) << where << ": " << expseg_last_error();
        ASSERT_TRUE(faulted) << where << ": a driver error without an injected fault: "
                             << expseg_last_error();
      }
    } else if (pick < 880 && !live.empty()) { // ---- free (sometimes after record_stream)
      auto it = live.begin();
      std::advance(it, (long)below(live.size()));
      Block &b = it->second;
      ASSERT_TRUE(tag_ok((void *)it->first, b.size, b.tag)) << where << ": data of a live block "
                                                            << "changed before its free";
      if (chance(0.25)) {
        expseg_stream u = below(kStreams);
        ASSERT_EQ(expseg_record_stream(a, (void *)it->first, st[u]), EXPSEG_OK) << where;
        if (u != b.stream) b.uses.push_back(u);
      }
      ASSERT_EQ(expseg_free(a, (void *)it->first), EXPSEG_OK) << where << ": " << expseg_last_error();
      if (held[b.stream]) busy.push_back({it->first, it->first + b.size, b.stream, false});
      for (expseg_stream u : b.uses)
        if (held[u]) busy.push_back({it->first, it->first + b.size, u, true});
      model_requested -= (int64_t)b.size;
      live.erase(it);
    } else if (pick < 940) { // ---- hold or release a stream
      expseg_stream s = 1 + below(kStreams - 1);
      if (held[s]) {
        release_stream(s);
      } else if (n_held < 3) {
        ASSERT_EQ(expseg_testing_hold_stream(a, st[s], true), EXPSEG_OK) << where;
        held[s] = true;
        n_held++;
      }
    } else if (pick < 960) { // ---- give cached memory back
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << where;
    } else if (pick < 975) { // ---- memory fraction and garbage collection
      fraction = chance(0.5) ? 1.0 : 0.5 + 0.5 * (double)below(100) / 100.0;
      ASSERT_EQ(expseg_set_memory_fraction(a, fraction), EXPSEG_OK) << where;
      ASSERT_EQ(expseg_configure(a, chance(0.5) ? "garbage_collection_threshold:0.6"
                                                : "garbage_collection_threshold:0.99"),
                EXPSEG_OK)
          << where << ": " << expseg_last_error();
    } else if (pick < 985) { // ---- switch segment kinds at run time
      ASSERT_EQ(expseg_configure(a, chance(0.5) ? "expandable_segments:True"
                                                : "expandable_segments:False"),
                EXPSEG_OK)
          << where;
    } else if (pick < 990) { // ---- a run-time max_split_size change
      ASSERT_EQ(expseg_configure(a, chance(0.5) ? "max_split_size_mb:24"
                                                : "max_split_size_mb:1000000"),
                EXPSEG_OK)
          << where;
    }
    // ---- after every operation
    ASSERT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << expseg_last_error();
    ASSERT_EQ(stat_of(a, "allocation.all.current"), (int64_t)live.size()) << where;
    // requested_bytes leaves at the real free (PyTorch's rule): pending blocks still count
    if (stat_of(a, "expseg.pending_free_blocks.current") == 0)
      ASSERT_EQ(stat_of(a, "requested_bytes.all.current"), model_requested) << where;
    else
      ASSERT_GT(stat_of(a, "requested_bytes.all.current"), model_requested) << where;
    ASSERT_LE(stat_of(a, "allocated_bytes.all.current"), stat_of(a, "reserved_bytes.all.current"))
        << where;
    if (op % 500 == 499) {
      for (const auto &kv : live)
        ASSERT_TRUE(tag_ok((void *)kv.first, kv.second.size, kv.second.tag))
            << where << ": data of the live block at " << std::hex << kv.first << " changed";
    }
  }
  for (expseg_stream s = 1; s < kStreams; s++)
    if (held[s]) release_stream(s);
  ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK);
  for (const auto &kv : live) {
    ASSERT_TRUE(tag_ok((void *)kv.first, kv.second.size, kv.second.tag)) << S << "at the end";
    ASSERT_EQ(expseg_free(a, (void *)kv.first), EXPSEG_OK) << S << expseg_last_error();
  }
  const uint64_t injected = expseg_testing_faults_injected(a);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  ASSERT_EQ(expseg_check(a), EXPSEG_OK) << S << expseg_last_error();
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0) << S;
  expseg_set_log_sink(nullptr, nullptr);
  std::printf("%llu faults injected, %llu out-of-memory and %llu driver errors seen, %llu "
              "busy-range checks, %d warnings\n",
              (unsigned long long)injected, (unsigned long long)ooms,
              (unsigned long long)driver_errors, (unsigned long long)overlaps_checked, warnings);
  EXPECT_GE(injected, ops / 100) << S << "too few faults reached the driver";
  for (int i = 1; driver_streams && i < kStreams; i++)
    EXPECT_EQ(expseg_stream_destroy(a, st[i]), EXPSEG_OK) << S << expseg_last_error();
  expect_nothing_left(a, S);
  EXPECT_EQ(open_fds(), fds_before) << S << "descriptors leaked";
}

#ifndef EXPSEG_ALLOC_BUSY_GPU
TEST(AllocBusy, NoBusyMemoryHandedOutNothingLeakedUnderFaults) {
  run_busy("fault;host:capacity=256M", false, 100000);
}
#else
// The same run on cuda against the CUDA driver double, configured as the host run's device
// (256 MiB, 2 MiB pages); fewer operations by default (every call goes through the double).
TEST(GpuBusy, NoBusyMemoryHandedOutNothingLeakedUnderFaults) {
  cudadouble_api api;
  if (!cudadouble_load(&api) || !_expseg_cuda_usable(0))
    GTEST_SKIP() << "needs the CUDA driver double (tests/cuda_double): data is checked from the CPU";
  ASSERT_EQ(0, api.configure("capacity=256M,granularity=2M,recommended=2M")) << api.last_message();
  run_busy("fault;cuda", true, 20000);
}
#endif

#ifndef EXPSEG_ALLOC_BUSY_GPU
// ---- private pools under the same conditions ----
//
// Up to four pools are created, retained, released, begun with a stream filter (or none)
// and ended at random, and allocations go through expseg_malloc (routed: the newest begun
// pool whose filter accepts the stream, as this test's model of the begun pools says) or
// expseg_malloc_pool (a pool named, or the general cache). After each allocation:
// expseg_pool_of names the pool the model expects, and no granule of the block is one a
// live private pool holds for itself (an owner map of granules, cleared for a pool only when
// its memory may go: expseg_pool_empty_cache of it, or its drain): no block crosses pools,
// reuse happens only inside a pool. A released pool's statistics must remain while the model
// has a live block of it or a block freed on a held stream (its memory not given back before
// it is empty and idle); the pool's reserved bytes never fall below its live requests. At
// the end, with every stream released, every block freed and every pool released,
// empty_cache leaves nothing reserved and no pool statistic.
TEST(AllocBusy, PrivatePoolsNeverShareMemory) {
  EXPSEG_SEEDED(seed, 20261126);
  const uint64_t ops = env_u64("EXPSEG_TEST_OPS", 100000) / 2;
  const std::string S = "seed " + std::to_string(seed) + ": ";
  std::mt19937_64 rng(seed);
  auto below = [&](uint64_t n) { return rng() % n; };
  auto chance = [&](double p) { return (double)(rng() >> 11) / 9007199254740992.0 < p; };
  int warnings = 0;
  expseg_set_log_sink([](void *ctx, const char *) { ++*static_cast<int *>(ctx); }, &warnings);
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("fault;host:capacity=256M", 0, "expandable_segments:True", &a),
            EXPSEG_OK)
      << expseg_last_error();
  expseg_info info;
  ASSERT_EQ(expseg_get_info(a, &info), EXPSEG_OK);
  const uintptr_t gran = info.granularity;

  struct PBlock {
    size_t size;
    expseg_stream stream;
    expseg_pool_id pool;
    uint64_t tag;
  };
  struct PoolM {
    int use;           // 0: released, draining
    uint32_t mask = 0; // the filter's streams while begun (ctx points here)
  };
  struct Route {
    expseg_pool_id id;
    uint32_t *mask; // nullptr: no filter
  };
  std::map<uintptr_t, PBlock> live;
  std::map<expseg_pool_id, std::unique_ptr<PoolM>> pools; // not drained yet
  std::vector<Route> routes;
  std::map<uintptr_t, expseg_pool_id> owner;               // granule -> private pool
  std::map<expseg_pool_id, int> busy_on_held[kStreams];    // blocks freed on a held stream
  bool held[kStreams] = {false};
  uint64_t next_tag = 1, crossings_checked = 0, drained = 0, routed = 0;
  auto filter = [](void *ctx, expseg_stream s) {
    return s < 32 && ((*static_cast<uint32_t *>(ctx) >> s) & 1) != 0;
  };
  auto key = [](expseg_pool_id id, const char *f) {
    return "reserved_bytes_by_private_pools.0_" + std::to_string(id) + ".all." + f;
  };
  auto stat_or = [&](const std::string &k, int64_t *v) {
    return expseg_stat(a, k.c_str(), v) == EXPSEG_OK;
  };
  auto forget = [&](expseg_pool_id id) { // pool id's memory may have gone back
    for (auto it = owner.begin(); it != owner.end();) it = it->second == id ? owner.erase(it) : ++it;
    for (const auto &kv : live)
      if (kv.second.pool == id)
        for (uintptr_t g = kv.first / gran; g <= (kv.first + kv.second.size - 1) / gran; g++)
          owner[g] = id;
  };
  auto live_pool_ids = [&]() {
    std::vector<expseg_pool_id> v;
    for (const auto &kv : pools)
      if (kv.second->use > 0) v.push_back(kv.first);
    return v;
  };

  for (uint64_t op = 0; op < ops; op++) {
    const std::string where = S + "op " + std::to_string(op);
    if (chance(0.03)) {
      std::string rule = std::string(kKinds[below(sizeof kKinds / sizeof *kKinds)]) + "@" +
                         std::to_string(1 + below(3));
      ASSERT_EQ(expseg_testing_set_faults(a, rule.c_str()), EXPSEG_OK) << where;
    }
    const uint64_t pick = below(1000);
    std::vector<expseg_pool_id> ids = live_pool_ids();
    if (pick < 450 && live.size() < 400) { // ---- malloc, routed or to a pool named
      size_t size = chance(0.6) ? 1 + below(1 * MiB) : 1 * MiB + below(15 * MiB);
      expseg_stream s = below(kStreams);
      void *p = nullptr;
      expseg_pool_id want = 0;
      expseg_status st;
      if (chance(0.6)) {
        for (size_t i = routes.size(); i > 0; i--)
          if (routes[i - 1].mask == nullptr || ((*routes[i - 1].mask >> s) & 1)) {
            want = routes[i - 1].id;
            break;
          }
        routed += want != 0;
        st = expseg_malloc(a, size, s, &p);
      } else {
        want = ids.empty() || chance(0.25) ? 0 : ids[below(ids.size())];
        st = expseg_malloc_pool(a, size, s, want, &p);
      }
      if (st != EXPSEG_OK) {
        ASSERT_TRUE(st == EXPSEG_ERR_OUT_OF_MEMORY || st == EXPSEG_ERR_DRIVER)
            << where << ": " << expseg_last_error();
      } else {
        expseg_pool_id got = 999;
        ASSERT_EQ(expseg_pool_of(a, p, &got), EXPSEG_OK) << where;
        ASSERT_EQ(got, want) << where << ": allocated in the wrong pool";
        const uintptr_t lo = (uintptr_t)p;
        for (uintptr_t g = lo / gran; g <= (lo + size - 1) / gran; g++) {
          crossings_checked++;
          auto o = owner.find(g);
          // a released pool with no live block gives its memory back (a malloc reaps first)
          bool holder_live = false;
          for (const auto &kv : live) holder_live |= o != owner.end() && kv.second.pool == o->second;
          if (o != owner.end() && o->second != want && pools.count(o->second) &&
              pools[o->second]->use == 0 && !holder_live) {
            forget(o->second);
            o = owner.find(g);
          }
          if (o != owner.end() && o->second != want)
            FAIL() << where << ": pool " << want << " (use " << (want ? pools[want]->use : -1)
                   << ") holder use " << (pools.count(o->second) ? pools[o->second]->use : -9)
                   << " was handed [" << std::hex << lo << ", +"
                   << size << ") in a granule pool " << std::dec << o->second << " holds";
          if (want != 0) owner[g] = want;
        }
        uint64_t tag = next_tag++ * 0x9E3779B97F4A7C15ull;
        write_tag(p, size, tag);
        live[lo] = PBlock{size, s, want, tag};
      }
    } else if (pick < 850 && !live.empty()) { // ---- free
      auto it = live.begin();
      std::advance(it, (long)below(live.size()));
      ASSERT_TRUE(tag_ok((void *)it->first, it->second.size, it->second.tag)) << where;
      ASSERT_EQ(expseg_free(a, (void *)it->first), EXPSEG_OK) << where << expseg_last_error();
      if (held[it->second.stream] && it->second.pool != 0)
        busy_on_held[it->second.stream][it->second.pool]++;
      live.erase(it);
    } else if (pick < 880) { // ---- create, retain, release
      if (pools.size() < 4 && (ids.empty() || chance(0.4))) {
        expseg_pool_id id = 0;
        ASSERT_EQ(expseg_pool_create(a, &id), EXPSEG_OK) << where;
        ASSERT_EQ(pools.count(id), 0u) << where << ": id reused";
        pools[id] = std::make_unique<PoolM>();
        pools[id]->use = 1;
      } else if (!ids.empty()) {
        expseg_pool_id id = ids[below(ids.size())];
        PoolM &m = *pools[id];
        bool begun = false;
        for (const Route &r : routes) begun |= r.id == id;
        if (chance(0.3)) {
          ASSERT_EQ(expseg_pool_retain(a, id), EXPSEG_OK) << where;
          m.use++;
        } else if (m.use == 1 && begun) {
          ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_ERR_INVALID_ARGUMENT) << where;
        } else {
          ASSERT_EQ(expseg_pool_release(a, id), EXPSEG_OK) << where << expseg_last_error();
          m.use--;
        }
        int n = -1;
        if (m.use > 0) {
          ASSERT_EQ(expseg_pool_use_count(a, id, &n), EXPSEG_OK) << where;
          ASSERT_EQ(n, m.use) << where;
        } else {
          ASSERT_EQ(expseg_pool_use_count(a, id, &n), EXPSEG_ERR_INVALID_ARGUMENT) << where;
        }
      }
    } else if (pick < 910) { // ---- begin or end
      if (!routes.empty() && chance(0.5)) {
        size_t i = below(routes.size());
        const expseg_pool_id id = routes[i].id;
        ASSERT_EQ(expseg_pool_end(a, id), EXPSEG_OK) << where;
        for (size_t j = routes.size(); j > 0; j--) // the newest begin of id ends
          if (routes[j - 1].id == id) {
            routes.erase(routes.begin() + (long)(j - 1));
            break;
          }
      } else if (!ids.empty() && routes.size() < 6) {
        expseg_pool_id id = ids[below(ids.size())];
        PoolM &m = *pools[id];
        if (chance(0.3)) {
          ASSERT_EQ(expseg_pool_begin(a, id, nullptr, nullptr), EXPSEG_OK) << where;
          routes.push_back({id, nullptr});
        } else {
          // one mask per pool: a pool begun twice filters both begins by its newest mask
          m.mask = (uint32_t)below(1u << kStreams);
          ASSERT_EQ(expseg_pool_begin(a, id, filter, &m.mask), EXPSEG_OK) << where;
          routes.push_back({id, &m.mask});
        }
      } else if (!ids.empty()) {
        bool begun = false;
        for (const Route &r : routes) begun |= r.id == ids[0];
        if (!begun) {
          ASSERT_EQ(expseg_pool_end(a, ids[0]), EXPSEG_ERR_INVALID_ARGUMENT) << where;
        }
      }
    } else if (pick < 940) { // ---- hold or release a stream
      expseg_stream s = 1 + below(kStreams - 1);
      ASSERT_EQ(expseg_testing_hold_stream(a, s, !held[s]), EXPSEG_OK) << where;
      held[s] = !held[s];
      if (!held[s]) busy_on_held[s].clear();
    } else if (pick < 960) { // ---- empty the general cache (and drain released pools)
      ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK) << where;
    } else if (pick < 980 && !ids.empty()) { // ---- empty one pool
      expseg_pool_id id = ids[below(ids.size())];
      ASSERT_EQ(expseg_pool_empty_cache(a, id), EXPSEG_OK) << where;
      forget(id);
    } else if (pick < 990) { // ---- switch segment kinds at run time (classic pools too)
      ASSERT_EQ(expseg_configure(a, chance(0.5) ? "expandable_segments:True"
                                                : "expandable_segments:False"),
                EXPSEG_OK)
          << where;
    }
    // ---- after every operation
    ASSERT_EQ(expseg_check(a), EXPSEG_OK) << where << ": " << expseg_last_error();
    ASSERT_EQ(stat_of(a, "allocation.all.current"), (int64_t)live.size()) << where;
    std::map<expseg_pool_id, int64_t> requested;
    for (const auto &kv : live) requested[kv.second.pool] += (int64_t)kv.second.size;
    int64_t sum = 0;
    for (auto it = pools.begin(); it != pools.end();) {
      const expseg_pool_id id = it->first;
      int64_t cur = 0;
      bool busy = requested[id] > 0;
      for (int s = 1; s < kStreams; s++) busy |= busy_on_held[s].count(id) > 0;
      if (!stat_or(key(id, "current"), &cur)) {
        ASSERT_EQ(it->second->use, 0) << where << ": pool " << id << " lost its statistics";
        ASSERT_FALSE(busy) << where << ": pool " << id << " was given back with live blocks or "
                           << "blocks freed on a held stream";
        drained++;
        forget(id);
        for (int s = 1; s < kStreams; s++) busy_on_held[s].erase(id);
        it = pools.erase(it);
        continue;
      }
      ASSERT_GE(cur, requested[id]) << where << ": pool " << id << " reserves less than it holds";
      sum += cur;
      ++it;
    }
    ASSERT_LE(sum, stat_of(a, "reserved_bytes.all.current")) << where;
    if (op % 500 == 499) {
      for (const auto &kv : live)
        ASSERT_TRUE(tag_ok((void *)kv.first, kv.second.size, kv.second.tag)) << where;
    }
  }
  ASSERT_EQ(expseg_testing_set_faults(a, ""), EXPSEG_OK);
  for (expseg_stream s = 1; s < kStreams; s++) {
    if (held[s]) {
      ASSERT_EQ(expseg_testing_hold_stream(a, s, false), EXPSEG_OK);
    }
  }
  for (const auto &kv : live) {
    ASSERT_TRUE(tag_ok((void *)kv.first, kv.second.size, kv.second.tag)) << S << "at the end";
    ASSERT_EQ(expseg_free(a, (void *)kv.first), EXPSEG_OK) << S << expseg_last_error();
  }
  while (!routes.empty()) {
    ASSERT_EQ(expseg_pool_end(a, routes.back().id), EXPSEG_OK) << S;
    routes.pop_back();
  }
  for (auto &kv : pools)
    for (; kv.second->use > 0; kv.second->use--) ASSERT_EQ(expseg_pool_release(a, kv.first), EXPSEG_OK);
  ASSERT_EQ(expseg_empty_cache(a), EXPSEG_OK);
  ASSERT_EQ(expseg_check(a), EXPSEG_OK) << S << expseg_last_error();
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0) << S;
  for (auto &kv : pools) {
    int64_t v;
    EXPECT_FALSE(stat_or(key(kv.first, "current"), &v)) << S << "pool " << kv.first << " not drained";
  }
  expseg_set_log_sink(nullptr, nullptr);
  std::printf("%llu operations, %llu routed allocations, %llu pools drained, %llu granule "
              "checks, %d warnings\n",
              (unsigned long long)ops, (unsigned long long)routed, (unsigned long long)drained,
              (unsigned long long)crossings_checked, warnings);
  EXPECT_GT(drained, 5u) << S;
  EXPECT_GT(routed, ops / 20) << S;
  expect_nothing_left(a, S);
}
#endif
