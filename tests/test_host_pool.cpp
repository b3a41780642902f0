// SPDX-License-Identifier: Apache-2.0
// test_host_pool.cpp: the pinned host memory pool (expseg_host_*) on the host and sim
// backends: placement on the chosen NUMA node as the kernel sees the pages (move_pages(2)
// with NULL nodes), reuse only after the events of recorded streams complete, the effect of
// each pinned_* option, and the error cases. Driver failures, random operations and
// threads: test_host_pool_faults.cpp.
#include <gtest/gtest.h>

#include <dirent.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "alloc_support.h"
#include "host_pool_support.h"
#include "sanitized.h"

namespace {

// NUMA nodes with memory, from the kernel.
std::vector<int> memory_nodes() {
  std::vector<int> out;
  FILE *f = std::fopen("/sys/devices/system/node/has_memory", "r");
  if (!f) return {0};
  char buf[256] = "";
  if (!std::fgets(buf, sizeof buf, f)) buf[0] = '\0';
  std::fclose(f);
  for (char *p = buf; *p && *p != '\n';) {  // "0-1,3"
    int lo = (int)std::strtol(p, &p, 10), hi = lo;
    if (*p == '-') hi = (int)std::strtol(p + 1, &p, 10);
    for (int n = lo; n <= hi; n++) out.push_back(n);
    if (*p == ',') p++;
  }
  if (out.empty()) out.push_back(0);
  return out;
}

// The node of every page of [p, p+size) as the kernel sees it (move_pages with NULL nodes
// only reports); -ENOENT for a page that is not present.
std::vector<int> page_nodes(void *p, size_t size) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE), n = size / page;
  std::vector<void *> pages(n);
  std::vector<int> status(n, -1000);
  for (size_t i = 0; i < n; i++) pages[i] = (char *)p + i * page;
  long r = syscall(SYS_move_pages, 0, (unsigned long)n, pages.data(), nullptr, status.data(), 0);
  EXPECT_EQ(r, 0) << "move_pages: " << std::strerror(errno);
  return status;
}

void expect_on_node(void *p, size_t size, int node, const std::string &what) {
  std::vector<int> st = page_nodes(p, size);
  size_t wrong = 0;
  int first = 0;
  for (int s : st)
    if (s != node && wrong++ == 0) first = s;
  EXPECT_EQ(wrong, 0u) << what << ": " << wrong << " of " << st.size()
                       << " pages are not on node " << node << " (first: " << first << ")";
}

// ---- placement ----

// Whether this build can bind memory to `node` (built with hwloc, node known).
bool can_bind(int node) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  void *p = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  bool ok = p != MAP_FAILED && _expseg_topo_bind(p, page, node) == EXPSEG_OK;
  if (p != MAP_FAILED) munmap(p, page);
  if (!ok) std::printf("note: binding to node %d is unsupported here: %s\n", node, expseg_last_error());
  return ok;
}

TEST(HostPool, PagesSitOnTheChosenNode) {
  QuietLog quiet;  // mlock past RLIMIT_MEMLOCK is warned about
  for (int node : memory_nodes()) {
    for (const char *cfg : {"pinned_use_cuda_host_register:False",
                            "pinned_use_cuda_host_register:True,pinned_num_register_threads:4"}) {
      std::string spec = "host:numa=" + std::to_string(node);
      SCOPED_TRACE(spec + " " + cfg);
      PoolPtr h = make_pool(spec.c_str(), cfg);
      ASSERT_TRUE(h);
      EXPECT_EQ(expseg_host_numa_node(h.get()), node);
      EXPECT_EQ(hstat(h.get(), "expseg.numa_node"), node);
      void *p = nullptr;
      ASSERT_EQ(expseg_host_malloc(h.get(), 6 * MiB, &p), EXPSEG_OK) << expseg_last_error();
      // every page is already present (pre-faulted) and on the node, before we touch it
      expect_on_node(p, 8 * MiB, node, "fresh block");
      std::memset(p, 0xab, 6 * MiB);
      expect_on_node(p, 8 * MiB, node, "after writing");
      // bound, where this build can bind (hwloc); else left to the OS and counted as such
      EXPECT_EQ(hstat(h.get(), "expseg.placed_bytes"), can_bind(node) ? int64_t(8 * MiB) : 0);
      EXPECT_EQ(expseg_host_free(h.get(), p), EXPSEG_OK);
    }
  }
}

// The cuda backend's node comes from the GPU's PCI bus id: hwloc's answer for every PCI
// device here must agree with the kernel's numa_node where both know one.
TEST(HostPool, PciLocalityAgreesWithTheKernel) {
  DIR *d = opendir("/sys/bus/pci/devices");
  if (!d) GTEST_SKIP() << "no /sys/bus/pci/devices";
  int known = 0, nodes = _expseg_topo_numa_count();
  for (dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    int mine = _expseg_topo_numa_of_pci(e->d_name);
    EXPECT_GE(mine, -1) << e->d_name;
    EXPECT_LT(mine, nodes) << e->d_name;
    FILE *f = std::fopen(("/sys/bus/pci/devices/" + std::string(e->d_name) + "/numa_node").c_str(), "r");
    int kernel = -1;
    if (f) {
      if (std::fscanf(f, "%d", &kernel) != 1) kernel = -1;
      std::fclose(f);
    }
    if (mine >= 0) known++;
    if (mine >= 0 && kernel >= 0) {
      EXPECT_EQ(mine, kernel) << e->d_name;
    }
  }
  closedir(d);
  std::printf("%d PCI device(s) with a known nearest node\n", known);
  EXPECT_EQ(_expseg_topo_numa_of_pci("0000:ff:1f.7"), -1) << "no such device";
  EXPECT_EQ(_expseg_topo_numa_of_pci("not a bus id"), -1);
  EXPECT_EQ(_expseg_topo_numa_of_pci(nullptr), -1);
}

TEST(HostPool, NodesExistByTheirOsNumber) {
  for (int node : memory_nodes()) EXPECT_TRUE(_expseg_topo_node_exists(node)) << node;
  EXPECT_FALSE(_expseg_topo_node_exists(-1));
  EXPECT_FALSE(_expseg_topo_node_exists(1 << 20));
}

TEST(HostPool, DefaultNodeIsReported) {
  PoolPtr h = make_pool("host", "");
  ASSERT_TRUE(h);
  int node = expseg_host_numa_node(h.get());
  if (memory_nodes().size() == 1) {
    // one node: it is the nearest to any device, and the pages must be on it
    EXPECT_EQ(node, memory_nodes()[0]);
    void *p = nullptr;
    ASSERT_EQ(expseg_host_malloc(h.get(), 64 * KiB, &p), EXPSEG_OK);
    expect_on_node(p, 64 * KiB, node, "default placement");
    EXPECT_EQ(expseg_host_free(h.get(), p), EXPSEG_OK);
  } else {
    EXPECT_EQ(node, -1) << "the host backend has no PCI location: unknown without numa=N";
  }
}

TEST(HostPool, BadNodeInSpecIsRejected) {
  expseg_host_pool *h = nullptr;
  EXPECT_EQ(expseg_host_create("host:numa=999", 0, "", &h), EXPSEG_ERR_CONFIG);
  EXPECT_EQ(h, nullptr);
  EXPECT_NE(std::string(expseg_last_error()).find("numa=999"), std::string::npos)
      << expseg_last_error();
}

// ---- reuse after events ----

TEST(HostPool, FreedBlockWithoutStreamsIsReusedAtOnce) {
  for (const char *drv : {"host", "sim"}) {
    SCOPED_TRACE(drv);
    PoolPtr h = make_pool(drv, "");
    ASSERT_TRUE(h);
    void *p = nullptr, *q = nullptr;
    ASSERT_EQ(expseg_host_malloc(h.get(), 100 * KiB, &p), EXPSEG_OK);
    ASSERT_EQ(expseg_host_free(h.get(), p), EXPSEG_OK);
    ASSERT_EQ(expseg_host_malloc(h.get(), 128 * KiB, &q), EXPSEG_OK);  // same class
    EXPECT_EQ(p, q);
    EXPECT_EQ(hstat(h.get(), "expseg.hits"), 1);
    EXPECT_EQ(hstat(h.get(), "num_host_alloc"), 1);
    EXPECT_EQ(expseg_host_free(h.get(), q), EXPSEG_OK);
  }
}

TEST(HostPool, BlockWaitsForEveryRecordedStream) {
  for (const char *drv : {"host", "sim"}) {
    SCOPED_TRACE(drv);
    PoolPtr h = make_pool(drv, "");
    ASSERT_TRUE(h);
    hold(h.get(), 7, true);
    hold(h.get(), 8, true);
    void *p = nullptr, *q = nullptr, *r = nullptr, *s = nullptr;
    ASSERT_EQ(expseg_host_malloc(h.get(), 1 * MiB, &p), EXPSEG_OK);
    ASSERT_EQ(expseg_host_record_stream(h.get(), p, 7), EXPSEG_OK);
    ASSERT_EQ(expseg_host_record_stream(h.get(), p, 8), EXPSEG_OK);
    ASSERT_EQ(expseg_host_record_stream(h.get(), p, 8), EXPSEG_OK);  // once per stream
    ASSERT_EQ(expseg_host_free(h.get(), p), EXPSEG_OK);
    EXPECT_EQ(hstat(h.get(), "expseg.pending_blocks.current"), 1);
    EXPECT_EQ(hstat(h.get(), "expseg.pending_events"), 2);
    // both streams busy: a new block
    ASSERT_EQ(expseg_host_malloc(h.get(), 1 * MiB, &q), EXPSEG_OK);
    EXPECT_NE(q, p);
    hold(h.get(), 7, false);
    // stream 8 still busy: still not reused
    ASSERT_EQ(expseg_host_malloc(h.get(), 1 * MiB, &r), EXPSEG_OK);
    EXPECT_NE(r, p);
    EXPECT_EQ(hstat(h.get(), "expseg.pending_events"), 1);
    hold(h.get(), 8, false);
    ASSERT_EQ(expseg_host_malloc(h.get(), 1 * MiB, &s), EXPSEG_OK);
    EXPECT_EQ(s, p) << "the block must be reused once its streams are done";
    EXPECT_EQ(hstat(h.get(), "expseg.pending_blocks.current"), 0);
    EXPECT_EQ(hstat(h.get(), "num_host_alloc"), 3);
    for (void *x : {q, r, s}) EXPECT_EQ(expseg_host_free(h.get(), x), EXPSEG_OK);
  }
}

TEST(HostPool, EmptyCacheKeepsPendingBlocks) {
  PoolPtr h = make_pool("host", "");
  ASSERT_TRUE(h);
  hold(h.get(), 3, true);
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(expseg_host_malloc(h.get(), 256 * KiB, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_host_malloc(h.get(), 256 * KiB, &q), EXPSEG_OK);
  ASSERT_EQ(expseg_host_record_stream(h.get(), p, 3), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(h.get(), p), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(h.get(), q), EXPSEG_OK);
  ASSERT_EQ(expseg_host_empty_cache(h.get()), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "segment.current"), 1) << "only the idle block goes back";
  EXPECT_EQ(hstat(h.get(), "num_host_free"), 1);
  hold(h.get(), 3, false);
  ASSERT_EQ(expseg_host_empty_cache(h.get()), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "segment.current"), 0);
  EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), 0);
  EXPECT_EQ(hstat(h.get(), "expseg.cached_bytes.current"), 0);
}

// ---- pinned_use_background_threads ----

int64_t wait_pending_zero(const expseg_host_pool *h, int ms) {
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  int64_t v;
  while ((v = hstat(h, "expseg.pending_blocks.current")) != 0 &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return v;
}

TEST(HostPool, BackgroundThreadProcessesEvents) {
  for (bool bg : {false, true}) {
    SCOPED_TRACE(bg ? "background" : "caller");
    PoolPtr h = make_pool("host", bg ? "pinned_use_background_threads:True"
                                     : "pinned_use_background_threads:False");
    ASSERT_TRUE(h);
    hold(h.get(), 5, true);
    void *p = nullptr;
    ASSERT_EQ(expseg_host_malloc(h.get(), 64 * KiB, &p), EXPSEG_OK);
    ASSERT_EQ(expseg_host_record_stream(h.get(), p, 5), EXPSEG_OK);
    ASSERT_EQ(expseg_host_free(h.get(), p), EXPSEG_OK);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(hstat(h.get(), "expseg.pending_blocks.current"), 1) << "the stream is held";
    hold(h.get(), 5, false);
    // no pool call in between: only a background thread can move the block
    if (bg) {
      EXPECT_EQ(wait_pending_zero(h.get(), 2000), 0);
      EXPECT_GT(hstat(h.get(), "expseg.background_passes"), 0);
      EXPECT_EQ(hstat(h.get(), "expseg.cached_bytes.current"), int64_t(64 * KiB));
    } else {
      EXPECT_EQ(wait_pending_zero(h.get(), 50), 1);
      EXPECT_EQ(hstat(h.get(), "expseg.background_passes"), 0);
      void *q = nullptr;
      ASSERT_EQ(expseg_host_malloc(h.get(), 64 * KiB, &q), EXPSEG_OK);  // the caller processes
      EXPECT_EQ(q, p);
      EXPECT_EQ(expseg_host_free(h.get(), q), EXPSEG_OK);
    }
  }
}

// ---- pinned_use_cuda_host_register and pinned_num_register_threads ----

TEST(HostPool, RegisterPathPrefaultsWithTheAskedThreads) {
  QuietLog quiet;
  for (uint32_t threads : {1u, 2u, 4u, 8u}) {
    SCOPED_TRACE(threads);
    std::string cfg = "pinned_use_cuda_host_register:True,pinned_num_register_threads:" +
                      std::to_string(threads);
    PoolPtr h = make_pool("host:numa=0", cfg.c_str());
    ASSERT_TRUE(h);
    EXPECT_EQ(hstat(h.get(), "expseg.register_threads"), threads);
    void *p = nullptr;
    ASSERT_EQ(expseg_host_malloc(h.get(), 4 * MiB, &p), EXPSEG_OK);
    EXPECT_EQ(hstat(h.get(), "expseg.registered_segments"), 1);
    EXPECT_EQ(hstat(h.get(), "expseg.created_segments"), 0);
    EXPECT_EQ(hstat(h.get(), "expseg.fault_threads_started"), threads);
    // every page present before the caller touches it
    std::vector<unsigned char> vec(4 * MiB / (size_t)sysconf(_SC_PAGESIZE));
    ASSERT_EQ(mincore(p, 4 * MiB, vec.data()), 0);
    size_t absent = 0;
    for (unsigned char c : vec) absent += !(c & 1);
    EXPECT_EQ(absent, 0u);
    EXPECT_EQ(expseg_host_free(h.get(), p), EXPSEG_OK);
  }
  {  // one thread for a small chunk: the caller faults it (no thread start to pay)
    PoolPtr s = make_pool("host:numa=0", "pinned_use_cuda_host_register:True");
    ASSERT_TRUE(s);
    void *p = nullptr;
    ASSERT_EQ(expseg_host_malloc(s.get(), 64 * KiB, &p), EXPSEG_OK);
    EXPECT_EQ(hstat(s.get(), "expseg.fault_threads_started"), 0);
    expect_on_node(p, 64 * KiB, 0, "small register chunk");
    EXPECT_EQ(expseg_host_free(s.get(), p), EXPSEG_OK);
  }
  PoolPtr h = make_pool("host:numa=0", "pinned_use_cuda_host_register:False,"
                                       "pinned_num_register_threads:8");
  ASSERT_TRUE(h);
  void *p = nullptr;
  ASSERT_EQ(expseg_host_malloc(h.get(), 4 * MiB, &p), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "expseg.registered_segments"), 0);
  EXPECT_EQ(hstat(h.get(), "expseg.created_segments"), 1);
  EXPECT_EQ(hstat(h.get(), "expseg.fault_threads_started"), 0)
      << "threads pre-fault only on the register path";
  EXPECT_EQ(expseg_host_free(h.get(), p), EXPSEG_OK);
}

// In a child (death-test fork): CAP_IPC_LOCK dropped (root ignores the limit otherwise),
// RLIMIT_MEMLOCK 0, then one block: it must be usable and reported unlocked. Exit code:
// 0 = as expected, 1.. = which check failed.
int locking_refused_child() {
  __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return 10;
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  if (syscall(SYS_capset, &hdr, data) != 0) return 11;
  struct rlimit none = {0, 0};
  if (setrlimit(RLIMIT_MEMLOCK, &none) != 0) return 12;
  expseg_set_log_sink([](void *, const char *) {}, nullptr);
  expseg_host_pool *h = nullptr;
  void *p = nullptr;
  if (expseg_host_create("host", 0, "", &h) != EXPSEG_OK) return 2;
  if (expseg_host_malloc(h, 2 * MiB, &p) != EXPSEG_OK) return 3;
  std::memset(p, 1, 2 * MiB);  // usable all the same
  int64_t locked = -1, unlocked = -1;
  (void)expseg_host_stat(h, "expseg.locked_bytes", &locked);
  (void)expseg_host_stat(h, "expseg.unlocked_bytes", &unlocked);
  if (locked != 0) return 4;
  if (unlocked != int64_t(2 * MiB)) return 5;
  if (expseg_host_free(h, p) != EXPSEG_OK) return 6;
  expseg_host_destroy(h);
  return 0;
}


TEST(HostPool, PageLockingIsModelledUnderRlimitMemlock) {
#ifdef EXPSEG_TEST_SANITIZED
  GTEST_SKIP() << "sanitizers replace mlock with a no-op: refused locking cannot be observed";
#endif
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(locking_refused_child()), ::testing::ExitedWithCode(0), "");
  // and where locking works, every byte is accounted as locked or not
  QuietLog quiet;
  PoolPtr h = make_pool("host", "");
  void *p = nullptr;
  ASSERT_EQ(expseg_host_malloc(h.get(), 2 * MiB, &p), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "expseg.locked_bytes") + hstat(h.get(), "expseg.unlocked_bytes"),
            hstat(h.get(), "reserved_bytes.current"));
  EXPECT_EQ(expseg_host_free(h.get(), p), EXPSEG_OK);
}

// ---- pinned_max_round_threshold_mb, pinned_max_cached_size_mb (PyTorch 2.13) ----

TEST(HostPool, RoundThresholdGivesExactPageRoundedBlocks) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  PoolPtr h = make_pool("host", "pinned_max_round_threshold_mb:1");
  ASSERT_TRUE(h);
  void *small = nullptr, *big = nullptr, *exact = nullptr;
  ASSERT_EQ(expseg_host_malloc(h.get(), 600 * KiB, &small), EXPSEG_OK);  // <= 1 MiB: rounded
  EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), int64_t(1 * MiB));
  ASSERT_EQ(expseg_host_malloc(h.get(), 3 * MiB + 1, &big), EXPSEG_OK);  // above: exact
  EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), int64_t(1 * MiB + 3 * MiB + page));
  EXPECT_EQ(hstat(h.get(), "allocated_bytes.current"), int64_t(1 * MiB + 3 * MiB + page));
  ASSERT_EQ(expseg_host_malloc(h.get(), 1 * MiB, &exact), EXPSEG_OK);  // at the threshold: 2^20
  ASSERT_EQ(expseg_host_free(h.get(), big), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "expseg.cached_bytes.current"), int64_t(3 * MiB + page)) << "cached";
  // (a miss gives back carve segments that are all free, so the hit comes first)
  void *other = nullptr, *same = nullptr;
  ASSERT_EQ(expseg_host_malloc(h.get(), 3 * MiB + 5, &same), EXPSEG_OK);
  EXPECT_EQ(same, big) << "the same page-rounded size is a hit";
  EXPECT_EQ(hstat(h.get(), "expseg.cached_bytes.current"), 0) << "taken from the cache";
  const int64_t held = hstat(h.get(), "reserved_bytes.current");
  ASSERT_EQ(expseg_host_malloc(h.get(), 3 * MiB + 2 * page, &other), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), held + int64_t(3 * MiB + 2 * page))
      << "a miss: exact new memory for it";
  for (void *x : {small, exact, other, same}) ASSERT_EQ(expseg_host_free(h.get(), x), EXPSEG_OK);
  ASSERT_EQ(expseg_host_empty_cache(h.get()), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), 0);
}

// pinned_carve_strict: a small carved request does not take a large whole free segment (it
// would pin it); it misses, the miss gives the large one back and makes a segment of the
// usual size. Without it the large segment is cut (and held). A whole free segment no larger
// than a fresh one is taken either way (a free range inside a segment in use too: the
// policy's own test).
TEST(HostPool, StrictCarvingGivesLargeFreeSegmentsBack) {
  for (bool strict : {false, true}) {
    SCOPED_TRACE(strict ? "strict" : "default");
    PoolPtr h = make_pool("host", strict ? "pinned_max_round_threshold_mb:1,pinned_carve_strict:True"
                                         : "pinned_max_round_threshold_mb:1");
    ASSERT_TRUE(h);
    void *big = nullptr, *small = nullptr, *small2 = nullptr;
    ASSERT_EQ(expseg_host_malloc(h.get(), 40 * MiB, &big), EXPSEG_OK);  // its own 40 MiB segment
    EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), int64_t(40 * MiB));
    ASSERT_EQ(expseg_host_free(h.get(), big), EXPSEG_OK);
    ASSERT_EQ(expseg_host_malloc(h.get(), 3 * MiB, &small), EXPSEG_OK);
    if (strict) {
      EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), int64_t(3 * MiB))
          << "the 40 MiB segment went back; a fresh one (3 MiB: larger than 40/32) made";
      EXPECT_EQ(hstat(h.get(), "num_host_free"), 1);
    } else {
      EXPECT_EQ(small, big) << "cut from the free 40 MiB segment";
      EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), int64_t(40 * MiB));
      EXPECT_EQ(hstat(h.get(), "num_host_free"), 0);
    }
    // a whole free segment no larger than a fresh one is taken either way
    const int64_t made = hstat(h.get(), "num_host_alloc");
    ASSERT_EQ(expseg_host_free(h.get(), small), EXPSEG_OK);
    ASSERT_EQ(expseg_host_malloc(h.get(), 3 * MiB, &small2), EXPSEG_OK);
    EXPECT_EQ(small2, small);
    EXPECT_EQ(hstat(h.get(), "num_host_alloc"), made) << "no new chunk";
    ASSERT_EQ(expseg_host_free(h.get(), small2), EXPSEG_OK);
  }
}

// Exact blocks are carved from shared segments: neighbours merge when free, a free range
// serves any request that fits (best fit), and a segment all free goes back at empty_cache;
// a carved block a stream still uses merges only after its event.
TEST(HostPool, ExactBlocksAreCarvedFromSegmentsAndMerge) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  PoolPtr h = make_pool("host", "pinned_max_round_threshold_mb:0");
  ASSERT_TRUE(h);
  void *a = nullptr, *b = nullptr, *c = nullptr;
  ASSERT_EQ(expseg_host_malloc(h.get(), 100 * KiB, &a), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), int64_t(2 * MiB)) << "one 2 MiB segment";
  EXPECT_EQ(hstat(h.get(), "allocated_bytes.current"), int64_t(100 * KiB)) << "exact";
  ASSERT_EQ(expseg_host_malloc(h.get(), 300 * KiB + 1, &b), EXPSEG_OK);
  EXPECT_EQ((char *)b - (char *)a, (ptrdiff_t)(100 * KiB)) << "cut right after a";
  EXPECT_EQ(hstat(h.get(), "segment.current"), 1);
  EXPECT_EQ(hstat(h.get(), "allocated_bytes.current"), int64_t(400 * KiB + page));
  ASSERT_EQ(expseg_host_malloc(h.get(), 200 * KiB, &c), EXPSEG_OK);
  expseg_stream s = 7;
  hold(h.get(), s, true);
  ASSERT_EQ(expseg_host_record_stream(h.get(), b, s), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(h.get(), a), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(h.get(), b), EXPSEG_OK);  // pending: a and b stay apart
  void *d = nullptr;
  ASSERT_EQ(expseg_host_malloc(h.get(), 200 * KiB, &d), EXPSEG_OK);
  EXPECT_NE(d, a) << "a alone (100 KiB) is too small, b is pending";
  ASSERT_EQ(expseg_host_free(h.get(), d), EXPSEG_OK);
  hold(h.get(), s, false);
  void *e = nullptr;
  ASSERT_EQ(expseg_host_malloc(h.get(), 400 * KiB + page, &e), EXPSEG_OK);
  EXPECT_EQ(e, a) << "a and b merged once b's event completed";
  EXPECT_EQ(hstat(h.get(), "segment.current"), 1) << "all from the first segment";
  ASSERT_EQ(expseg_host_free(h.get(), e), EXPSEG_OK);
  ASSERT_EQ(expseg_host_empty_cache(h.get()), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "segment.current"), 1) << "c still lives in it";
  ASSERT_EQ(expseg_host_free(h.get(), c), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "expseg.cached_bytes.current"), int64_t(2 * MiB)) << "merged whole";
  ASSERT_EQ(expseg_host_empty_cache(h.get()), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "segment.current"), 0);
  EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), 0);
  EXPECT_EQ(hstat(h.get(), "expseg.cached_bytes.current"), 0);
}

TEST(HostPool, MaxCachedSizeGivesLargeBlocksBack) {
  PoolPtr h = make_pool("host", "pinned_max_cached_size_mb:2");
  ASSERT_TRUE(h);
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  void *big = nullptr, *small = nullptr;
  ASSERT_EQ(expseg_host_malloc(h.get(), 3 * MiB, &big), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), int64_t(3 * MiB))
      << "above pinned_max_cached_size_mb: not rounded to 4 MiB either";
  ASSERT_EQ(expseg_host_malloc(h.get(), 2 * MiB - page, &small), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(h.get(), big), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), int64_t(2 * MiB)) << "given back at free";
  EXPECT_EQ(hstat(h.get(), "expseg.cached_bytes.current"), 0);
  EXPECT_EQ(hstat(h.get(), "num_host_free"), 1);
  ASSERT_EQ(expseg_host_free(h.get(), small), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "expseg.cached_bytes.current"), int64_t(2 * MiB)) << "at most 2 MiB: cached";

  // A block a stream still uses is given back once its event completes, not before.
  void *p = nullptr;
  expseg_stream s = 7;
  ASSERT_EQ(expseg_host_malloc(h.get(), 5 * MiB, &p), EXPSEG_OK);
  hold(h.get(), s, true);
  ASSERT_EQ(expseg_host_record_stream(h.get(), p, s), EXPSEG_OK);
  ASSERT_EQ(expseg_host_free(h.get(), p), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), int64_t(2 * MiB + 5 * MiB)) << "pending";
  hold(h.get(), s, false);
  void *q = nullptr;
  ASSERT_EQ(expseg_host_malloc(h.get(), 4 * KiB, &q), EXPSEG_OK);  // processes the events
  EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), int64_t(2 * MiB + 4 * KiB))
      << "released once its stream passed; a 4 KiB request is new (no 2 MiB block serves it)";
  ASSERT_EQ(expseg_host_free(h.get(), q), EXPSEG_OK);
}

// ---- pinned_reserve_segment_size_mb ----

TEST(HostPool, ReserveSegmentIsServedFirstAndKept) {
  PoolPtr h = make_pool("host", "pinned_reserve_segment_size_mb:4");
  ASSERT_TRUE(h);
  EXPECT_EQ(hstat(h.get(), "num_host_alloc"), 1);
  EXPECT_EQ(hstat(h.get(), "segment.current"), 1);
  EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), int64_t(4 * MiB));
  EXPECT_EQ(hstat(h.get(), "expseg.reserve_segment_bytes"), int64_t(4 * MiB));
  void *a = nullptr, *b = nullptr, *c = nullptr;
  ASSERT_EQ(expseg_host_malloc(h.get(), 1 * MiB, &a), EXPSEG_OK);
  ASSERT_EQ(expseg_host_malloc(h.get(), 3000, &b), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "num_host_alloc"), 1) << "served from the reserve";
  EXPECT_EQ(hstat(h.get(), "expseg.reserve_segment_used_bytes"), int64_t(1 * MiB + 4 * KiB));
  EXPECT_EQ((char *)b - (char *)a, (ptrdiff_t)MiB) << "slices follow each other";
  ASSERT_EQ(expseg_host_malloc(h.get(), 4 * MiB, &c), EXPSEG_OK);  // does not fit
  EXPECT_EQ(hstat(h.get(), "num_host_alloc"), 2);
  for (void *x : {a, b, c}) ASSERT_EQ(expseg_host_free(h.get(), x), EXPSEG_OK);
  ASSERT_EQ(expseg_host_empty_cache(h.get()), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "segment.current"), 1) << "the reserve is never given back";
  EXPECT_EQ(hstat(h.get(), "num_host_free"), 1);
  void *again = nullptr;
  ASSERT_EQ(expseg_host_malloc(h.get(), 1 * MiB, &again), EXPSEG_OK);
  EXPECT_EQ(again, a) << "reserve slices are cached like other blocks";
  EXPECT_EQ(expseg_host_free(h.get(), again), EXPSEG_OK);
}

// ---- pinned_huge_pages ----

// The VmFlags line of the mapping that holds p in /proc/self/smaps ("" when not found).
std::string vm_flags_of(const void *p) {
  FILE *f = fopen("/proc/self/smaps", "r");
  if (f == nullptr) return "";
  char line[512];
  bool in = false;
  std::string flags;
  const uintptr_t a = (uintptr_t)p;
  while (fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
      in = a >= lo && a < hi;
    } else if (in && strncmp(line, "VmFlags:", 8) == 0) {
      flags = line + 8;
      break;
    }
  }
  fclose(f);
  return flags;
}

// A chunk of 4 MiB or more is advised to use transparent huge pages (VM_HUGEPAGE: "hg" in
// VmFlags) unless pinned_huge_pages:False; a smaller one never is.
TEST(HostPool, HugePagesAdvisedForLargeChunksUnlessTurnedOff) {
  if (access("/sys/kernel/mm/transparent_hugepage/enabled", R_OK) != 0)
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  for (const char *cfg : {"", "pinned_huge_pages:True", "pinned_huge_pages:False"}) {
    SCOPED_TRACE(cfg);
    const bool want = strstr(cfg, "False") == nullptr;
    PoolPtr h = make_pool("host", cfg);
    ASSERT_TRUE(h);
    void *big = nullptr, *small = nullptr;
    ASSERT_EQ(expseg_host_malloc(h.get(), 8 * MiB, &big), EXPSEG_OK) << expseg_last_error();
    ASSERT_EQ(expseg_host_malloc(h.get(), 64 * KiB, &small), EXPSEG_OK) << expseg_last_error();
    const std::string fb = vm_flags_of(big), fs = vm_flags_of(small);
    ASSERT_FALSE(fb.empty()) << "no mapping found for " << big;
    ASSERT_FALSE(fs.empty()) << "no mapping found for " << small;
    EXPECT_EQ(fb.find(" hg") != std::string::npos, want) << "8 MiB chunk, VmFlags:" << fb;
    EXPECT_EQ(fs.find(" hg"), std::string::npos) << "64 KiB chunk, VmFlags:" << fs;
    std::vector<char> pattern(8 * MiB);
    for (size_t i = 0; i < pattern.size(); i++) pattern[i] = (char)(i * 7 + 3);
    memcpy(big, pattern.data(), pattern.size());
    EXPECT_EQ(memcmp(big, pattern.data(), pattern.size()), 0) << "the memory is usable";
    ASSERT_EQ(expseg_host_free(h.get(), big), EXPSEG_OK);
    ASSERT_EQ(expseg_host_free(h.get(), small), EXPSEG_OK);
  }
}

// ---- sizes and statistics ----

TEST(HostPool, SizesArePowersOfTwoOfAtLeastAPage) {
  PoolPtr h = make_pool("host", "");
  ASSERT_TRUE(h);
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  void *p = nullptr, *q = nullptr, *z = (void *)1;
  ASSERT_EQ(expseg_host_malloc(h.get(), 0, &z), EXPSEG_OK);
  EXPECT_EQ(z, nullptr);
  ASSERT_EQ(expseg_host_malloc(h.get(), 1, &p), EXPSEG_OK);
  ASSERT_EQ(expseg_host_malloc(h.get(), 3 * MiB + 1, &q), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "allocated_bytes.current"), int64_t(page + 4 * MiB));
  EXPECT_EQ(hstat(h.get(), "reserved_bytes.current"), int64_t(page + 4 * MiB));
  EXPECT_EQ(hstat(h.get(), "allocation.current"), 2);
  EXPECT_EQ(hstat(h.get(), "host_alloc_time.count"), 2);
  EXPECT_EQ((uintptr_t)p % page, 0u);
  EXPECT_EQ(expseg_host_free(h.get(), p), EXPSEG_OK);
  EXPECT_EQ(expseg_host_free(h.get(), q), EXPSEG_OK);
  EXPECT_EQ(hstat(h.get(), "allocation.current"), 0);
  EXPECT_EQ(hstat(h.get(), "allocation.peak"), 2);
  EXPECT_EQ(hstat(h.get(), "expseg.cached_bytes.current"), int64_t(page + 4 * MiB));
  expseg_host_reset_peak_stats(h.get());
  EXPECT_EQ(hstat(h.get(), "allocation.peak"), 0);
  // foreach: sorted, and the keys it names are the ones expseg_host_stat answers
  std::vector<std::string> keys;
  expseg_host_stats_foreach(
      h.get(), [](void *ctx, const char *k, int64_t) {
        static_cast<std::vector<std::string> *>(ctx)->push_back(k);
      },
      &keys);
  ASSERT_GT(keys.size(), 30u);
  for (size_t i = 1; i < keys.size(); i++) EXPECT_LT(keys[i - 1], keys[i]);
  for (const char *k : {"allocation.current", "segment.peak", "allocated_bytes.freed",
                        "reserved_bytes.allocated", "num_host_alloc", "num_host_free",
                        "host_alloc_time.avg", "host_free_time.max", "expseg.numa_node"})
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
}

// ---- bad input ----

TEST(HostPool, BadInputIsRefusedWithAMessage) {
  PoolPtr h = make_pool("host", "");
  ASSERT_TRUE(h);
  void *p = nullptr;
  auto msg = [] { return std::string(expseg_last_error()); };
  for (size_t size : {SIZE_MAX, SIZE_MAX / 2 + 2, (size_t(1) << 60) + 1}) {
    EXPECT_EQ(expseg_host_malloc(h.get(), size, &p), EXPSEG_ERR_INVALID_ARGUMENT) << size;
    EXPECT_NE(msg().find("2^60"), std::string::npos) << msg();
    EXPECT_EQ(p, nullptr);
  }
  EXPECT_EQ(expseg_host_malloc(h.get(), 16, nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_host_malloc(nullptr, 16, &p), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("NULL"), std::string::npos) << msg();
  int local = 0;
  EXPECT_EQ(expseg_host_free(h.get(), &local), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("not a pointer this host pool handed out; nothing was freed"),
            std::string::npos) << msg();
  EXPECT_NE(msg().find("free or cudaFreeHost"), std::string::npos) << msg();
  EXPECT_EQ(expseg_host_record_stream(h.get(), &local, 1), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("nothing was recorded. For device memory from expseg_malloc, use "
                       "expseg_record_stream"), std::string::npos) << msg();
  EXPECT_EQ(msg().find("expseg_free"), std::string::npos) << "a free hint for a record: " << msg();
  {  // another live pool's pointer: recognised, and sent back to that pool
    PoolPtr other = make_pool("host", "");
    void *o = nullptr;
    ASSERT_EQ(expseg_host_malloc(other.get(), 4 * KiB, &o), EXPSEG_OK);
    EXPECT_EQ(expseg_host_free(h.get(), o), EXPSEG_ERR_INVALID_ARGUMENT);
    EXPECT_NE(msg().find("pinned memory of another host pool: give it back with "
                         "expseg_host_free on that pool"), std::string::npos) << msg();
    EXPECT_EQ(expseg_host_record_stream(h.get(), o, 1), EXPSEG_ERR_INVALID_ARGUMENT);
    EXPECT_NE(msg().find("expseg_host_record_stream on that pool"), std::string::npos) << msg();
    EXPECT_EQ(expseg_host_free(other.get(), o), EXPSEG_OK);
  }
  ASSERT_EQ(expseg_host_malloc(h.get(), 64 * KiB, &p), EXPSEG_OK);
  EXPECT_EQ(expseg_host_free(h.get(), (char *)p + 8), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("points inside"), std::string::npos) << msg();
  ASSERT_EQ(expseg_host_free(h.get(), p), EXPSEG_OK);
  EXPECT_EQ(expseg_host_free(h.get(), p), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("already freed"), std::string::npos) << msg();
  EXPECT_EQ(expseg_host_record_stream(h.get(), p, 1), EXPSEG_ERR_INVALID_ARGUMENT);
  int64_t v = 0;
  EXPECT_EQ(expseg_host_stat(h.get(), "allocation.all.current", &v), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(msg().find("allocation.all.current"), std::string::npos) << msg();
  EXPECT_EQ(expseg_host_free(h.get(), nullptr), EXPSEG_OK);
  EXPECT_EQ(expseg_host_empty_cache(nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_host_numa_node(nullptr), -1);
  expseg_host_destroy(nullptr);
  // the pool still works
  void *q = nullptr;
  ASSERT_EQ(expseg_host_malloc(h.get(), 64 * KiB, &q), EXPSEG_OK);
  EXPECT_EQ(q, p);
  EXPECT_EQ(hstat(h.get(), "allocation.current"), 1);
  EXPECT_EQ(expseg_host_free(h.get(), q), EXPSEG_OK);
}

TEST(HostPool, DeviceAndHostPointersDoNotMix) {
  PoolPtr h = make_pool("host", "");
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("host", 0, "", &a), EXPSEG_OK) << expseg_last_error();
  void *dev = nullptr, *pin = nullptr;
  ASSERT_EQ(expseg_malloc(a, 1 * MiB, 0, &dev), EXPSEG_OK);
  ASSERT_EQ(expseg_host_malloc(h.get(), 1 * MiB, &pin), EXPSEG_OK);
  EXPECT_EQ(expseg_host_free(h.get(), dev), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("expseg_free"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(expseg_host_record_stream(h.get(), dev, 2), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_free(a, pin), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("expseg_host_free"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(expseg_record_stream(a, pin, 2), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(expseg_last_error()).find("pinned host memory"), std::string::npos)
      << expseg_last_error();
  int local = 0;  // neither's: no hint
  EXPECT_EQ(expseg_free(a, &local), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(expseg_last_error()).find("pinned"), std::string::npos)
      << expseg_last_error();
  // both still work and own what they own
  EXPECT_EQ(expseg_free(a, dev), EXPSEG_OK);
  EXPECT_EQ(expseg_host_free(h.get(), pin), EXPSEG_OK);
  EXPECT_EQ(expseg_check(a), EXPSEG_OK) << expseg_last_error();
  expseg_destroy(a);
}

TEST(HostPool, BadConfigurationIsRejected) {
  expseg_host_pool *h = nullptr;
  EXPECT_EQ(expseg_host_create("host", 0, "pinned_num_register_threads:3", &h),
            EXPSEG_ERR_CONFIG);
  EXPECT_NE(std::string(expseg_last_error()).find("power of two"), std::string::npos)
      << expseg_last_error();
  EXPECT_EQ(expseg_host_create("host", 0, "pinned_reserve_segment_size_mb:0", &h),
            EXPSEG_ERR_CONFIG);
  EXPECT_EQ(expseg_host_create("nosuch", 0, "", &h), EXPSEG_ERR_CONFIG);
  EXPECT_EQ(expseg_host_create("host", -1, "", &h), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(expseg_host_create("host", 0, "", nullptr), EXPSEG_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h, nullptr);
}

}  // namespace
