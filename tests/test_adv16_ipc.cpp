// SPDX-License-Identifier: Apache-2.0
// Adversarial programs against the sharing API (docs/ipc.md, docs/api.md "Devices, peers
// and sharing"): an export freed in the exporter while imported, closes of pointers never
// imported, stale, garbage and truncated handles, imports into the exporting allocator,
// exports of interior, freed and foreign pointers, exports from private pools and tagged
// regions, peer access across growth and sleeping regions, driver faults on every call of
// these paths with nothing leaked and a retry succeeding, several threads sharing at once,
// and a seeded random program checked against a model. Two allocators in one process stand
// for the two processes (the descriptors travel the same); one test forks a real exporter.
#include "alloc_support.h"
#include "expseg_testing.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

const char *const HOST = "host:capacity=256M";
const char *const FAULT_HOST = "fault;host:capacity=256M";

int open_fds() {
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

void fill(void *p, size_t n, unsigned char seed) {
  auto *b = static_cast<unsigned char *>(p);
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed + i * 13);
}
bool holds(const void *p, size_t n, unsigned char seed) {
  auto *b = static_cast<const unsigned char *>(p);
  for (size_t i = 0; i < n; i++)
    if (b[i] != (unsigned char)(seed + i * 13)) return false;
  return true;
}

std::string err() { return expseg_last_error(); }
bool says(const std::string &what) { return err().find(what) != std::string::npos; }
std::string hex(const void *p) {
  char b[32];
  snprintf(b, sizeof b, "%" PRIxPTR, (uintptr_t)p);
  return b;
}

expseg_allocator *make(const char *driver, int device, const char *config = nullptr) {
  expseg_allocator *a = nullptr;
  EXPECT_EQ(EXPSEG_OK, expseg_create(driver, device, config, &a)) << err();
  return a;
}

expseg_testing_driver_counts counts(expseg_allocator *a) {
  expseg_testing_driver_counts c = {};
  EXPECT_EQ(EXPSEG_OK, expseg_testing_driver_counts_get(a, &c));
  return c;
}

void destroy_clean(expseg_allocator *a, const char *who) {
  expseg_testing_driver_counts left = {};
  expseg_testing_destroy(a, &left);
  EXPECT_EQ(left.live_chunks, 0) << who;
  EXPECT_EQ(left.mapped_bytes, 0) << who;
  EXPECT_EQ(left.live_reservations, 0) << who;
  EXPECT_EQ(left.live_events, 0) << who;
}

size_t held_of(expseg_allocator *a) {
  size_t held = 12345;
  EXPECT_EQ(EXPSEG_OK, expseg_ipc_poll(a, &held)) << err();
  return held;
}

// 2: every byte accessible from device; 1: some; 0: none.
int access_of(expseg_allocator *a, const void *p, size_t size, int device) {
  int state = -1;
  size_t g = alloc_test_page(a);
  uintptr_t lo = (uintptr_t)p / g * g, hi = ((uintptr_t)p + size + g - 1) / g * g;
  EXPECT_EQ(EXPSEG_OK, _expseg_vmm_has_access(alloc_test_driver(a), lo, hi - lo, device, &state))
      << err();
  return state;
}

class Adv16Ipc : public ::testing::TestWithParam<const char *> {};

// The exporter frees while the importer maps it: the free is deferred, the memory kept
// (also through empty_cache), still counted as allocated; the importer's close ends it.
TEST_P(Adv16Ipc, FreeInExporterWhileImported) {
  const int fds = open_fds();
  expseg_allocator *a = make(HOST, 0, GetParam()), *b = make(HOST, 1);
  const size_t size = 5u << 20;
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, 0, &p));
  fill(p, size, 3);
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h)) << err();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q)) << err();
  ASSERT_TRUE(holds(q, size, 3));
  EXPECT_EQ(stat_of(b, "allocated_bytes.all.current"), 0) << "an import is not an allocation";
  EXPECT_EQ(stat_of(b, "reserved_bytes.all.current"), 0) << "nor a segment of the importer";
  const int64_t alloc0 = stat_of(a, "allocated_bytes.all.current");
  const int64_t reserved0 = stat_of(a, "reserved_bytes.all.current");
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p)) << err();
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), alloc0) << "deferred: still allocated";
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_free(a, p));
  EXPECT_TRUE(says("already freed")) << err();
  EXPECT_EQ(held_of(a), 1u);
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), reserved0) << "not released";
  fill(q, size, 4); // the importer writes: the exporter's pages are still those
  EXPECT_TRUE(holds(p, size, 4));
  void *r = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, 0, &r));
  EXPECT_NE(r, p) << "not reused";
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, r));
  expseg_ipc_handle_free(&h);
  EXPECT_EQ(h.data, nullptr);
  EXPECT_EQ(h.n_fds, 0u);
  EXPECT_EQ(held_of(a), 1u) << "the importer still holds it";
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q)) << err();
  EXPECT_EQ(held_of(a), 0u);
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0) << "the poll did the free";
  EXPECT_EQ(stat_of(a, "allocation.all.current"), 0);
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(counts(b).live_chunks, 0);
  destroy_clean(b, "importer");
  destroy_clean(a, "exporter");
  EXPECT_EQ(open_fds(), fds) << "a descriptor leaked";
}

// The poll inside empty_cache does the deferred free before giving memory back: one call
// after the last close returns everything; a block pending on a held stream is not live
// (no export); the importer's own device gets access, the exporter's device does not.
TEST_P(Adv16Ipc, EmptyCacheAfterCloseAndPendingBlocks) {
  expseg_allocator *a = make(HOST, 0, GetParam()), *b = make(HOST, 1);
  const size_t size = 4u << 20;
  void *p = nullptr, *q = nullptr, *pend = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, 0, &p));
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q));
  expseg_ipc_handle_free(&h);
  EXPECT_EQ(access_of(b, q, size, 1), 2) << "the importer's device";
  EXPECT_EQ(access_of(b, q, size, 0), 0) << "not a peer of the importer";
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q));
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a)); // no poll before it
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0) << "freed and released in one call";
  EXPECT_EQ(counts(a).live_chunks, 0);

  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, 1, &pend));
  ASSERT_EQ(EXPSEG_OK, expseg_record_stream(a, pend, 2));
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(a, 2, true));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, pend)); // pending on stream 2
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_export(a, pend, &h)) << "freed, pending";
  EXPECT_TRUE(says(hex(pend))) << err();
  EXPECT_EQ(held_of(a), 0u);
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(a, 2, false));
  ASSERT_EQ(EXPSEG_OK, expseg_synchronize(a));
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  destroy_clean(b, "importer");
  destroy_clean(a, "exporter");
}

// Exporting twice gives two handles; the block stays until both are freed and every
// importer has closed.
TEST_P(Adv16Ipc, TwoExportsOfOneBlock) {
  const int fds = open_fds();
  expseg_allocator *a = make(HOST, 0, GetParam()), *b = make(HOST, 1);
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 3u << 20, 0, &p));
  expseg_ipc_handle h1 = {}, h2 = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h1)) << err();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h2)) << err();
  EXPECT_EQ(held_of(a), 2u);
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h2, &q)) << err();
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  expseg_ipc_handle_free(&h1);
  expseg_ipc_handle_free(&h1); // freeing a freed (zeroed) handle does nothing
  EXPECT_EQ(held_of(a), 1u);
  expseg_ipc_handle_free(&h2);
  EXPECT_EQ(held_of(a), 1u);
  EXPECT_GT(stat_of(a, "allocated_bytes.all.current"), 0);
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q));
  EXPECT_EQ(held_of(a), 0u);
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0);
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  destroy_clean(b, "importer");
  destroy_clean(a, "exporter");
  EXPECT_EQ(open_fds(), fds);
}

// Closes of what was not imported are refused naming the pointer and change nothing.
TEST_P(Adv16Ipc, CloseOfWhatWasNotImported) {
  const int fds = open_fds();
  expseg_allocator *a = make(HOST, 0, GetParam()), *b = make(HOST, 1, GetParam());
  void *p = nullptr, *q = nullptr, *own = nullptr;
  const size_t size = 4u << 20;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, 0, &p));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(b, size, 0, &own));
  fill(own, size, 8);
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q));
  expseg_ipc_handle_free(&h);
  const int64_t b_alloc = stat_of(b, "allocated_bytes.all.current");
  for (void *x : {own, (void *)((char *)q + 4096), (void *)((char *)q + 1), (void *)0x1000,
                  p}) {
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_close(b, x)) << x;
    EXPECT_TRUE(says(hex(x))) << "names the pointer " << x << ": " << err();
  }
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_close(b, nullptr));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_close(a, q)) << "not a's import";
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_close(nullptr, q));
  EXPECT_TRUE(holds(own, size, 8)) << "b's own block untouched";
  EXPECT_EQ(stat_of(b, "allocated_bytes.all.current"), b_alloc);
  // an imported pointer is not one of the importer's blocks
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_free(b, q));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_record_stream(b, q, 3));
  expseg_pool_id pool = 77;
  EXPECT_NE(EXPSEG_OK, expseg_pool_of(b, q, &pool));
  EXPECT_EQ(EXPSEG_OK, expseg_check(b)) << err();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q)) << err();
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_close(b, q)) << "double close";
  EXPECT_TRUE(says(hex(q))) << err();
  EXPECT_EQ(held_of(a), 0u);
  ASSERT_EQ(EXPSEG_OK, expseg_free(b, own));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  EXPECT_EQ(EXPSEG_OK, expseg_check(b)) << err();
  destroy_clean(b, "importer");
  destroy_clean(a, "exporter");
  EXPECT_EQ(open_fds(), fds);
}

// Exports of what is not the start of a live block are refused naming the pointer, leave
// the handle empty and hold nothing.
TEST_P(Adv16Ipc, ExportOfBadPointers) {
  const int fds = open_fds();
  expseg_allocator *a = make(HOST, 0, GetParam()), *o = make(HOST, 2, GetParam());
  void *p = nullptr, *gone = nullptr, *other = nullptr, *small = nullptr;
  const size_t size = 6u << 20;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, 0, &p));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, 0, &gone));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 4096, 0, &small));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, gone));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(o, size, 0, &other));
  for (void *x : {(void *)((char *)p + 1), (void *)((char *)p + size / 2),
                  (void *)((char *)p + size - 1), gone, other, (void *)0x2000,
                  (void *)((char *)small + 512)}) {
    expseg_ipc_handle h = {};
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_export(a, x, &h)) << x;
    EXPECT_TRUE(says(hex(x))) << "names " << x << ": " << err();
    EXPECT_EQ(h.data, nullptr);
    EXPECT_EQ(h.fds, nullptr);
    EXPECT_EQ(h.n_fds, 0u);
  }
  expseg_ipc_handle h = {};
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_export(a, nullptr, &h));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_export(a, p, nullptr));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_export(nullptr, p, &h));
  EXPECT_EQ(held_of(a), 0u) << "no refused export holds anything";
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, small));
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0) << "frees were not deferred";
  ASSERT_EQ(EXPSEG_OK, expseg_free(o, other));
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  destroy_clean(o, "other");
  destroy_clean(a, "exporter");
  EXPECT_EQ(open_fds(), fds);
}

// Importing into the allocator that exported: a second mapping of the same pages, not a
// block of the allocator; the exporter's free waits for the close.
TEST_P(Adv16Ipc, ImportIntoTheExporter) {
  const int fds = open_fds();
  expseg_allocator *a = make(HOST, 0, GetParam());
  const size_t size = 3u << 20;
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, 0, &p));
  fill(p, size, 5);
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(a, &h, &q)) << err();
  EXPECT_NE(p, q);
  EXPECT_TRUE(holds(q, size, 5));
  expseg_ipc_handle_free(&h);
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_free(a, q)) << "an import is not a block";
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  EXPECT_EQ(held_of(a), 1u);
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  fill(q, size, 6);
  EXPECT_TRUE(holds(p, size, 6));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(a, q)) << err();
  EXPECT_EQ(held_of(a), 0u);
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0);
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  EXPECT_EQ(counts(a).live_chunks, 0);
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  destroy_clean(a, "exporter");
  EXPECT_EQ(open_fds(), fds);
}

// Garbage, truncated and half-empty handles: INVALID_ARGUMENT naming the value, the
// caller's descriptors left open, nothing held, and the importer keeps working.
TEST_P(Adv16Ipc, GarbageHandles) {
  EXPSEG_SEEDED(seed, 16);
  std::mt19937_64 rng(seed);
  expseg_allocator *a = make(HOST, 0, GetParam()), *b = make(HOST, 1);
  void *p = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 5u << 20, 0, &p));
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  const int fds = open_fds();
  void *x = (void *)0x5;
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, nullptr, &x));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &h, nullptr));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(nullptr, &h, &x));
  {
    expseg_ipc_handle z = {};
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &z, &x)) << "empty handle";
    z = h;
    z.data = nullptr;
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &z, &x)) << "no data";
    z = h;
    z.fds = nullptr;
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &z, &x)) << "no fds";
    z = h;
    z.n_fds = 0;
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &z, &x)) << "n_fds 0";
    EXPECT_TRUE(says("descriptor count is " + std::to_string(h.n_fds))) << err();
    EXPECT_TRUE(says("received, 0")) << "names both counts: " << err();
    { // the allocation's size past the extent: size, offset and extent named
      std::vector<unsigned char> bytes(h.data, h.data + h.size);
      uint64_t extent = 0, huge = UINT64_C(1) << 40;
      memcpy(&extent, &bytes[24], 8);
      memcpy(&bytes[40], &huge, 8);
      expseg_ipc_handle y = h;
      y.data = bytes.data();
      EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &y, &x));
      EXPECT_TRUE(says(std::to_string(huge)) && says("extent, " + std::to_string(extent)))
          << err();
    }
    std::vector<int> neg(h.n_fds, -1);
    z = h;
    z.fds = neg.data();
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &z, &x)) << "fds -1";
    EXPECT_TRUE(says("-1")) << err();
    std::vector<int> swapped(h.fds, h.fds + h.n_fds);
    std::swap(swapped.front(), swapped.back());
    z = h;
    z.fds = swapped.data();
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &z, &x)) << "fds swapped";
    z = h;
    z.size = (size_t)1 << 62;
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &z, &x)) << "huge size";
    EXPECT_TRUE(says("4611686018427387904")) << "names the size: " << err();
  }
  // the chunk count field: truncated and inflated handles name the count and the size
  {
    std::vector<unsigned char> bytes(h.data, h.data + h.size);
    bytes[12] = (unsigned char)(bytes[12] + 1);
    expseg_ipc_handle z = h;
    z.data = bytes.data();
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &z, &x));
    EXPECT_TRUE(says("handle size is " + std::to_string(h.size))) << err();
  }
  // random flips of every byte, seeded
  int rejected = 0;
  for (int i = 0; i < 400; i++) {
    std::vector<unsigned char> bytes(h.data, h.data + h.size);
    int flips = 1 + (int)(rng() % 3);
    for (int f = 0; f < flips; f++) bytes[rng() % bytes.size()] ^= (unsigned char)(1 + rng() % 255);
    expseg_ipc_handle z = h;
    z.data = bytes.data();
    if (rng() % 4 == 0) z.size = rng() % (h.size + 8);
    void *y = nullptr;
    expseg_status st = expseg_ipc_import(b, &z, &y);
    if (st == EXPSEG_OK) { // a flip the importer cannot see (the chunk's file offset)
      ASSERT_NE(y, nullptr);
      ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, y)) << err();
      continue;
    }
    rejected++;
    EXPECT_EQ(st, EXPSEG_ERR_INVALID_ARGUMENT) << "flip " << i << ": " << err();
    EXPECT_FALSE(err().empty());
    expseg_testing_driver_counts c = counts(b);
    ASSERT_EQ(c.live_chunks, 0) << "flip " << i;
    ASSERT_EQ(c.live_reservations, 0) << "flip " << i;
    ASSERT_EQ(c.mapped_bytes, 0) << "flip " << i;
  }
  EXPECT_GT(rejected, 300);
  EXPECT_EQ(open_fds(), fds) << "imports keep the caller's descriptors and leak none";
  for (size_t i = 0; i < h.n_fds; i++) EXPECT_NE(fcntl(h.fds[i], F_GETFD), -1);
  void *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q)) << "the real handle still works: " << err();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q));
  void *r = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(b, 7u << 20, 0, &r));
  ASSERT_EQ(EXPSEG_OK, expseg_free(b, r));
  expseg_ipc_handle_free(&h);
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0);
  destroy_clean(b, "importer");
  destroy_clean(a, "exporter");
}

// A handle whose exporter is gone (the allocator destroyed, its end of the liveness socket
// closed) is stale: refused naming it, nothing mapped.
TEST_P(Adv16Ipc, StaleHandleAfterExporterDestroyed) {
  expseg_allocator *a = make(HOST, 0, GetParam()), *b = make(HOST, 1);
  void *p = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 2u << 20, 0, &p));
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  destroy_clean(a, "exporter");
  void *q = nullptr;
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &h, &q));
  EXPECT_TRUE(says("exporter")) << err();
  EXPECT_EQ(q, nullptr);
  EXPECT_EQ(counts(b).live_chunks, 0);
  expseg_ipc_handle_free(&h);
  destroy_clean(b, "importer");
}

// A shallow copy of a handle used after the original was freed: its descriptors are closed,
// and the import says which one.
TEST_P(Adv16Ipc, HandleUsedAfterFree) {
  expseg_allocator *a = make(HOST, 0, GetParam()), *b = make(HOST, 1);
  void *p = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 2u << 20, 0, &p));
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  std::vector<unsigned char> bytes(h.data, h.data + h.size);
  std::vector<int> fds(h.fds, h.fds + h.n_fds);
  expseg_ipc_handle copy = {bytes.data(), bytes.size(), fds.data(), fds.size()};
  expseg_ipc_handle_free(&h);
  void *q = nullptr;
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &copy, &q));
  EXPECT_TRUE(says("descriptor " + std::to_string(fds.back()))) << err();
  EXPECT_TRUE(says("not a socket")) << err();
  EXPECT_EQ(q, nullptr);
  EXPECT_EQ(counts(b).live_reservations, 0);
  EXPECT_EQ(held_of(a), 0u) << "the export ended with its handle";
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0);
  destroy_clean(b, "importer");
  destroy_clean(a, "exporter");
}

// Across processes: a forked child exports and is killed while this process maps its
// memory. The mapping stays readable, a second import of the same handle is stale, and
// the close gives everything back.
TEST(Adv16IpcProcess, ExporterKilledWhileImported) {
  const int fds = open_fds();
  int sv[2];
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
  const size_t size = 3u << 20;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) { // exit codes name the step that failed
    close(sv[0]);
    expseg_allocator *c = nullptr;
    if (expseg_create(HOST, 0, nullptr, &c) != EXPSEG_OK) _exit(10);
    void *p = nullptr;
    if (expseg_malloc(c, size, 0, &p) != EXPSEG_OK) _exit(11);
    fill(p, size, 61);
    expseg_ipc_handle h = {};
    if (expseg_ipc_export(c, p, &h) != EXPSEG_OK) _exit(12);
    if (expseg_ipc_send(sv[1], &h) != EXPSEG_OK) _exit(13);
    expseg_ipc_handle_free(&h);
    for (;;) pause(); // killed here
  }
  close(sv[1]);
  expseg_allocator *b = make(HOST, 1);
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_recv(sv[0], &h)) << err();
  void *q = nullptr, *q2 = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q)) << err();
  EXPECT_TRUE(holds(q, size, 61));
  kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(pid, waitpid(pid, &status, 0));
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child failed at step " << WEXITSTATUS(status);
  EXPECT_TRUE(holds(q, size, 61)) << "the mapping outlives the exporter";
  fill(q, size, 62);
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &h, &q2));
  EXPECT_TRUE(says("stale handle")) << err();
  EXPECT_EQ(counts(b).live_chunks, 1) << "only the first import";
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q));
  expseg_ipc_handle_free(&h);
  close(sv[0]);
  destroy_clean(b, "importer");
  EXPECT_EQ(open_fds(), fds);
}

// A private pool's allocation exported, then the pool emptied and released: the block and
// its memory stay until the importer closes; then the pool goes.
TEST_P(Adv16Ipc, PrivatePoolReleasedWhileExported) {
  const int fds = open_fds();
  expseg_allocator *a = make(HOST, 0, GetParam()), *b = make(HOST, 1);
  expseg_pool_id pool = 0;
  ASSERT_EQ(EXPSEG_OK, expseg_pool_create(a, &pool));
  const size_t size = 4u << 20;
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc_pool(a, size, 0, pool, &p));
  fill(p, size, 11);
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h)) << err();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q));
  expseg_ipc_handle_free(&h);
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  ASSERT_EQ(EXPSEG_OK, expseg_pool_empty_cache(a, pool));
  ASSERT_EQ(EXPSEG_OK, expseg_pool_release(a, pool));
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  EXPECT_GT(stat_of(a, "reserved_bytes.all.current"), 0);
  EXPECT_TRUE(holds(q, size, 11));
  fill(q, size, 12);
  EXPECT_TRUE(holds(p, size, 12)) << "the exporter's pages are the importer's";
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q));
  EXPECT_EQ(held_of(a), 0u);
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0);
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0) << "the released pool went";
  int uses = 0;
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_pool_use_count(a, pool, &uses));
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  destroy_clean(b, "importer");
  destroy_clean(a, "exporter");
  EXPECT_EQ(open_fds(), fds);
}

// A tagged region's allocation exported: sleep is refused while held, allowed after.
TEST_P(Adv16Ipc, SleepRefusedWhileExported) {
  expseg_allocator *a = make(HOST, 0, GetParam()), *b = make(HOST, 1);
  ASSERT_EQ(EXPSEG_OK, expseg_region_begin(a, "w"));
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 2u << 20, 0, &p));
  ASSERT_EQ(EXPSEG_OK, expseg_region_end(a, "w"));
  fill(p, 2u << 20, 21);
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q));
  expseg_ipc_handle_free(&h);
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_sleep(a, "w", EXPSEG_SLEEP_OFFLOAD));
  EXPECT_TRUE(says(hex(p))) << err();
  expseg_region_info info = {};
  ASSERT_EQ(EXPSEG_OK, expseg_region_get_info(a, "w", &info));
  EXPECT_FALSE(info.asleep);
  EXPECT_TRUE(holds(q, 2u << 20, 21));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q));
  ASSERT_EQ(EXPSEG_OK, expseg_sleep(a, "w", EXPSEG_SLEEP_OFFLOAD)) << err();
  expseg_ipc_handle h2 = {};
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_export(a, p, &h2)) << "asleep";
  EXPECT_EQ(h2.data, nullptr);
  ASSERT_EQ(EXPSEG_OK, expseg_wake(a, "w"));
  EXPECT_TRUE(holds(p, 2u << 20, 21));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  destroy_clean(b, "importer");
  destroy_clean(a, "exporter");
}

// A block freed on other streams (recorded, held) while exported: the export's hold and
// the streams' hold both end before the memory is reused.
TEST_P(Adv16Ipc, FreeWithStreamsWhileExported) {
  expseg_allocator *a = make(HOST, 0, GetParam()), *b = make(HOST, 1);
  const size_t size = 4u << 20;
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, 1, &p));
  ASSERT_EQ(EXPSEG_OK, expseg_record_stream(a, p, 2));
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(a, 2, true));
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q));
  expseg_ipc_handle_free(&h);
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q));
  EXPECT_EQ(held_of(a), 0u);
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  void *r = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, 1, &r));
  EXPECT_NE(r, p) << "stream 2 still uses it";
  ASSERT_EQ(EXPSEG_OK, expseg_testing_hold_stream(a, 2, false));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, r));
  ASSERT_EQ(EXPSEG_OK, expseg_synchronize(a));
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  destroy_clean(b, "importer");
  destroy_clean(a, "exporter");
}

// The exporter destroyed while another allocator maps its memory: the importer's mapping
// stays valid (it holds the chunks), and its close gives everything back.
TEST_P(Adv16Ipc, ExporterDestroyedWhileImported) {
  const int fds = open_fds();
  expseg_allocator *a = make(HOST, 0, GetParam()), *b = make(HOST, 1);
  const size_t size = 5u << 20;
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, 0, &p));
  fill(p, size, 41);
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q));
  expseg_ipc_handle_free(&h);
  destroy_clean(a, "exporter with a live import elsewhere");
  EXPECT_TRUE(holds(q, size, 41));
  fill(q, size, 42);
  EXPECT_TRUE(holds(q, size, 42));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q)) << err();
  EXPECT_EQ(counts(b).live_chunks, 0);
  destroy_clean(b, "importer");
  EXPECT_EQ(open_fds(), fds);
}

// What an export describes: the chunks under the block (counted by expseg.driver.export_fd
// and import_fd), one chunk of exactly the rounded size for a single-chunk allocation, and
// a small-pool block inside a shared segment kept while its neighbours come and go.
TEST_P(Adv16Ipc, ChunksCountedAndSmallBlocks) {
  expseg_allocator *a = make(HOST, 0, GetParam()), *b = make(HOST, 1);
  void *p = nullptr, *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc_ex(a, 3u << 20, 0, EXPSEG_MALLOC_SINGLE_CHUNK, &p));
  expseg_ipc_handle h = {};
  const int64_t ex0 = stat_of(a, "expseg.driver.export_fd");
  const int64_t im0 = stat_of(b, "expseg.driver.import_fd");
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h)) << err();
  EXPECT_EQ(h.size, 64u + 32u) << "one chunk";
  EXPECT_EQ(stat_of(a, "expseg.driver.export_fd") - ex0, 1);
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(b, 5));
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(b, 6));
  const int64_t sa0 = stat_of(b, "expseg.driver.set_access");
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q));
  EXPECT_EQ(stat_of(b, "expseg.driver.import_fd") - im0, 1);
  EXPECT_EQ(stat_of(b, "expseg.driver.set_access") - sa0, 3) << "the device's, then each peer's";
  ASSERT_EQ(EXPSEG_OK, expseg_disable_peer_access(b, 6));
  EXPECT_EQ(stat_of(b, "expseg.driver.set_access") - sa0, 4) << "one revocation: the import";
  EXPECT_EQ(counts(b).mapped_bytes, (int64_t)(4u << 20)) << "3 MiB rounded to the granularity";
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q));
  expseg_ipc_handle_free(&h);
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  EXPECT_EQ(held_of(a), 0u);

  void *s1 = nullptr, *s2 = nullptr, *s3 = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 1000, 0, &s1));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 1000, 0, &s2));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 1000, 0, &s3));
  fill(s2, 1000, 43);
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, s2, &h)) << err();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q)) << err();
  EXPECT_TRUE(holds(q, 1000, 43));
  expseg_ipc_handle_free(&h);
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, s1));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, s2));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, s3));
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 1024) << "s2 stays, rounded to 512s";
  EXPECT_GT(stat_of(a, "reserved_bytes.all.current"), 0);
  fill(q, 1000, 44);
  EXPECT_TRUE(holds(s2, 1000, 44));
  void *reuse = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 1000, 0, &reuse));
  EXPECT_NE(reuse, s2);
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, reuse));
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q));
  EXPECT_EQ(held_of(a), 0u);
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0);
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  destroy_clean(b, "importer");
  destroy_clean(a, "exporter");
}

// A receiver given fewer descriptors than the preamble announces, or a preamble claiming
// more than the limits, fails closing everything it received.
TEST(Adv16IpcSocket, RecvOfShortOrOversizedMessages) {
  expseg_allocator *a = make(HOST, 0);
  void *p = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 2u << 20, 0, &p));
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  const int fds = open_fds();
  for (int variant = 0; variant < 3; variant++) {
    SCOPED_TRACE(variant);
    int sv[2];
    ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
    if (variant == 0) { // the real handle with a preamble announcing one more descriptor
      expseg_ipc_handle more = h;
      std::vector<int> f(h.fds, h.fds + h.n_fds);
      more.fds = f.data();
      more.n_fds = h.n_fds - 1; // sends one fewer than ...
      unsigned char pre[16] = {'E', 'X', 'S', 'K', 1, 0, 0, 0};
      uint32_t sz = (uint32_t)h.size, nf = (uint32_t)h.n_fds; // ... the preamble says
      memcpy(pre + 8, &sz, 4), memcpy(pre + 12, &nf, 4);
      ASSERT_EQ(16, write(sv[0], pre, 16));
      ASSERT_EQ((ssize_t)h.size, write(sv[0], h.data, h.size));
      // one batch of n_fds - 1 descriptors through a handle-less send is not possible with
      // the public API: send the batch by hand
      char byte = 'F';
      struct iovec iov = {&byte, 1};
      union {
        char buf[CMSG_SPACE(8 * sizeof(int))];
        struct cmsghdr align;
      } u;
      memset(&u, 0, sizeof u);
      struct msghdr m = {};
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      m.msg_control = u.buf;
      m.msg_controllen = CMSG_SPACE(more.n_fds * sizeof(int));
      struct cmsghdr *c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(more.n_fds * sizeof(int));
      memcpy(CMSG_DATA(c), more.fds, more.n_fds * sizeof(int));
      ASSERT_EQ(1, sendmsg(sv[0], &m, MSG_NOSIGNAL));
    } else {
      unsigned char pre[16] = {'E', 'X', 'S', 'K', 1, 0, 0, 0};
      uint32_t sz = variant == 1 ? 0xffffffffu : 96u, nf = variant == 1 ? 2u : 0x7fffffffu;
      memcpy(pre + 8, &sz, 4), memcpy(pre + 12, &nf, 4);
      ASSERT_EQ(16, write(sv[0], pre, 16));
    }
    close(sv[0]);
    expseg_ipc_handle got = {};
    EXPECT_NE(EXPSEG_OK, expseg_ipc_recv(sv[1], &got));
    EXPECT_FALSE(err().empty());
    EXPECT_EQ(got.data, nullptr);
    EXPECT_EQ(got.fds, nullptr);
    close(sv[1]);
    EXPECT_EQ(open_fds(), fds) << "received descriptors closed: " << err();
  }
  expseg_ipc_handle_free(&h);
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  destroy_clean(a, "exporter");
}

struct WalkCount {
  int allocated = 0, pending = 0;
};
void walk_seg(void *ctx, const expseg_walk_segment *s) {
  auto *w = static_cast<WalkCount *>(ctx);
  for (size_t i = 0; i < s->n_blocks; i++) {
    if (s->blocks[i].state == EXPSEG_BLOCK_ALLOCATED) w->allocated++;
    if (s->blocks[i].state == EXPSEG_BLOCK_PENDING_FREE) w->pending++;
  }
}

// Forty exports at once (more than the poll's on-stack set), each imported once, half into
// the exporter itself, all freed at once (deferred): walks and snapshots show them
// allocated; closes in a seeded order end them one at a time.
TEST_P(Adv16Ipc, FortyExportsClosedInRandomOrder) {
  EXPSEG_SEEDED(seed, 40);
  std::mt19937_64 rng(seed);
  const int fds = open_fds();
  expseg_allocator *a = make("host:capacity=1G", 0, GetParam()), *b = make(HOST, 1);
  enum { N = 40 };
  struct Item {
    void *p, *q;
    expseg_allocator *at;
    size_t size;
  } it[N];
  for (int i = 0; i < N; i++) {
    it[i].size = (1 + rng() % 3) << 20;
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, it[i].size, (expseg_stream)(i % 3), &it[i].p));
    fill(it[i].p, 4096, (unsigned char)i);
    expseg_ipc_handle h = {};
    ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, it[i].p, &h)) << i << ": " << err();
    it[i].at = (i % 2) ? a : b;
    ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(it[i].at, &h, &it[i].q)) << i << ": " << err();
    expseg_ipc_handle_free(&h);
  }
  EXPECT_EQ(held_of(a), (size_t)N);
  for (int i = 0; i < N; i++) ASSERT_EQ(EXPSEG_OK, expseg_free(a, it[i].p));
  EXPECT_EQ(stat_of(a, "allocation.all.current"), N) << "every free deferred";
  WalkCount w;
  ASSERT_EQ(EXPSEG_OK, expseg_walk(a, walk_seg, nullptr, &w));
  EXPECT_EQ(w.allocated, N);
  EXPECT_EQ(w.pending, 0);
  for (expseg_allocator *x : {a, b}) {
    unsigned char *buf = nullptr;
    size_t len = 0;
    ASSERT_EQ(EXPSEG_OK, expseg_snapshot(x, &buf, &len)) << err();
    expseg_snapshot_free(buf);
    char text[256];
    EXPECT_GT(expseg_memory_summary(x, text, sizeof text, true), 0u);
    EXPECT_EQ(EXPSEG_OK, expseg_check(x)) << err();
  }
  std::vector<int> order(N);
  for (int i = 0; i < N; i++) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  int left = N;
  for (int i : order) {
    ASSERT_TRUE(holds(it[i].q, 4096, (unsigned char)i)) << i;
    ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(it[i].at, it[i].q)) << i << ": " << err();
    left--;
    ASSERT_EQ(held_of(a), (size_t)left) << "after closing " << i;
    ASSERT_EQ(stat_of(a, "allocation.all.current"), left) << "after closing " << i;
  }
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  destroy_clean(b, "importer");
  destroy_clean(a, "exporter");
  EXPECT_EQ(open_fds(), fds);
}

// The importer's own cache work (an out-of-memory retry that releases everything, an
// empty_cache) leaves imports alone; a failed import whose undo the driver refused is
// given back at destroy.
TEST_P(Adv16Ipc, ImporterCacheWorkAndOrphanAtDestroy) {
  const int fds = open_fds();
  expseg_allocator *a = make(HOST, 0, GetParam());
  expseg_allocator *b = make("fault;host:capacity=64M", 1, GetParam());
  const size_t size = 5u << 20;
  void *p = nullptr, *q = nullptr, *big = nullptr, *mid = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, 0, &p));
  fill(p, size, 51);
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(b, 20u << 20, 0, &mid));
  ASSERT_EQ(EXPSEG_OK, expseg_free(b, mid));
  EXPECT_EQ(EXPSEG_ERR_OUT_OF_MEMORY, expseg_malloc(b, 100u << 20, 0, &big));
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(b));
  EXPECT_TRUE(holds(q, size, 51)) << "the import survives the importer's cache release";
  EXPECT_EQ(EXPSEG_OK, expseg_check(b)) << err();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q));
  ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(b, "map@1,release@1"));
  EXPECT_NE(EXPSEG_OK, expseg_ipc_import(b, &h, &q));
  ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(b, ""));
  EXPECT_EQ(EXPSEG_OK, expseg_check(b)) << "the orphan is counted: " << err();
  EXPECT_GT(counts(b).live_chunks, 0) << "the release was refused";
  destroy_clean(b, "importer with an orphan");
  EXPECT_EQ(held_of(a), 1u) << "only the exporter's handle";
  expseg_ipc_handle_free(&h);
  EXPECT_EQ(held_of(a), 0u);
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  destroy_clean(a, "exporter");
  EXPECT_EQ(open_fds(), fds);
}

// A seeded random program over the whole protocol, checked against a model after every
// step: which exports are held (a handle or an import alive), how many allocations the
// exporter counts (deferred frees included), the bytes every import sees, the peer's
// access to imports, and expseg_check on both sides.
TEST_P(Adv16Ipc, RandomProgramAgainstAModel) {
  EXPSEG_SEEDED(seed, 1606);
  std::mt19937_64 rng(seed);
  const int fds = open_fds();
  expseg_allocator *a = make("host:capacity=1G", 0, GetParam()), *b = make(HOST, 1);
  struct Block {
    void *p;
    unsigned char tag;
    bool freed;
  };
  struct Export {
    size_t block;
    expseg_ipc_handle h;
    std::vector<std::pair<expseg_allocator *, void *>> imports;
  };
  std::vector<Block> blocks;    // erased when truly gone
  std::vector<Export> exports;  // erased when no longer held
  bool peer = false;
  auto held = [&](const Export &e) { return e.h.data != nullptr || !e.imports.empty(); };
  for (int step = 0; step < 1500; step++) {
    SCOPED_TRACE("step " + std::to_string(step));
    unsigned r = (unsigned)(rng() % 100);
    if (r < 22 || blocks.empty()) {
      size_t size = rng() % 3 ? (1 + rng() % 4) << 20 : 512 + rng() % 60000;
      void *p = nullptr;
      ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, (expseg_stream)(rng() % 2), &p)) << err();
      unsigned char tag = (unsigned char)rng();
      fill(p, 64, tag);
      blocks.push_back({p, tag, false});
    } else if (r < 35) {
      size_t k = rng() % blocks.size();
      expseg_status st = expseg_free(a, blocks[k].p);
      if (blocks[k].freed) {
        ASSERT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, st) << "a second free";
      } else {
        ASSERT_EQ(EXPSEG_OK, st) << err();
        blocks[k].freed = true;
      }
    } else if (r < 50) {
      size_t k = rng() % blocks.size();
      expseg_ipc_handle h = {};
      expseg_status st = expseg_ipc_export(a, blocks[k].p, &h);
      if (blocks[k].freed) {
        ASSERT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, st) << "export of a freed block";
      } else {
        ASSERT_EQ(EXPSEG_OK, st) << err();
        exports.push_back({k, h, {}});
      }
    } else if (r < 68 && !exports.empty()) {
      Export &e = exports[rng() % exports.size()];
      if (e.h.data == nullptr) continue;
      expseg_allocator *to = rng() % 3 ? b : a;
      void *q = nullptr;
      ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(to, &e.h, &q)) << err();
      ASSERT_TRUE(holds(q, 64, blocks[e.block].tag));
      if (to == b) {
        ASSERT_EQ(access_of(b, q, 64, 2), peer ? 2 : 0);
      }
      e.imports.push_back({to, q});
    } else if (r < 82 && !exports.empty()) {
      Export &e = exports[rng() % exports.size()];
      if (e.imports.empty()) continue;
      size_t i = rng() % e.imports.size();
      ASSERT_TRUE(holds(e.imports[i].second, 64, blocks[e.block].tag));
      ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(e.imports[i].first, e.imports[i].second)) << err();
      e.imports.erase(e.imports.begin() + (long)i);
    } else if (r < 92 && !exports.empty()) {
      Export &e = exports[rng() % exports.size()];
      expseg_ipc_handle_free(&e.h);
    } else if (r < 95) {
      peer = !peer;
      ASSERT_EQ(EXPSEG_OK, peer ? expseg_enable_peer_access(b, 2) : expseg_disable_peer_access(b, 2));
    } else {
      ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(rng() % 2 ? a : b));
    }
    // the model: exports no longer held go; freed blocks no export holds go
    std::vector<bool> held_block(blocks.size(), false);
    std::vector<Export> still;
    for (Export &e : exports)
      if (held(e)) held_block[e.block] = true, still.push_back(e);
    exports.swap(still);
    std::vector<size_t> remap(blocks.size());
    std::vector<Block> kept;
    for (size_t i = 0; i < blocks.size(); i++) {
      remap[i] = kept.size();
      if (!blocks[i].freed || held_block[i]) kept.push_back(blocks[i]);
    }
    blocks.swap(kept);
    for (Export &e : exports) e.block = remap[e.block];
    ASSERT_EQ(held_of(a), exports.size());
    ASSERT_EQ(stat_of(a, "allocation.all.current"), (int64_t)blocks.size());
    if (step % 50 == 0) {
      ASSERT_EQ(EXPSEG_OK, expseg_check(a)) << err();
      ASSERT_EQ(EXPSEG_OK, expseg_check(b)) << err();
    }
  }
  for (Export &e : exports) {
    for (auto &im : e.imports) ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(im.first, im.second));
    expseg_ipc_handle_free(&e.h);
  }
  EXPECT_EQ(held_of(a), 0u);
  for (Block &x : blocks) {
    if (!x.freed) {
      ASSERT_EQ(EXPSEG_OK, expseg_free(a, x.p));
    }
  }
  EXPECT_EQ(stat_of(a, "allocation.all.current"), 0);
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  EXPECT_EQ(EXPSEG_OK, expseg_check(b)) << err();
  destroy_clean(b, "importer");
  destroy_clean(a, "exporter");
  EXPECT_EQ(open_fds(), fds);
}

// A receiver at its descriptor limit (RLIMIT_NOFILE): the control message is truncated,
// recv fails saying so with everything it received closed, and works once there is room.
TEST(Adv16IpcSocket, RecvAtTheDescriptorLimit) {
  expseg_allocator *a = make(HOST, 0, "expandable_segments:True,chunk_max_mb:2");
  void *p = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 2u << 20, 0, &p));
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  ASSERT_EQ(h.n_fds, 2u);
  int sv[2];
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
  const int fds = open_fds();
  int second_free = -1; // the limit leaves exactly one free descriptor number below it
  for (int fd = 0, free_seen = 0; fd < 4096 && second_free < 0; fd++)
    if (fcntl(fd, F_GETFD) == -1 && ++free_seen == 2) second_free = fd;
  ASSERT_GT(second_free, 0);
  struct rlimit old = {}, low = {};
  ASSERT_EQ(0, getrlimit(RLIMIT_NOFILE, &old));
  low = old;
  low.rlim_cur = (rlim_t)second_free; // room for one received descriptor, not two
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_send(sv[0], &h));
  ASSERT_EQ(0, setrlimit(RLIMIT_NOFILE, &low));
  expseg_ipc_handle got = {};
  expseg_status st = expseg_ipc_recv(sv[1], &got);
  ASSERT_EQ(0, setrlimit(RLIMIT_NOFILE, &old));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, st);
  EXPECT_TRUE(says("truncated")) << err();
  EXPECT_EQ(got.data, nullptr);
  EXPECT_EQ(open_fds(), fds) << "what was received is closed";
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_send(sv[0], &h));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_recv(sv[1], &got)) << err();
  EXPECT_EQ(got.n_fds, 2u);
  expseg_ipc_handle_free(&got);
  close(sv[0]), close(sv[1]);
  expseg_ipc_handle_free(&h);
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  destroy_clean(a, "exporter");
}

INSTANTIATE_TEST_SUITE_P(Cpu, Adv16Ipc,
                         ::testing::Values("expandable_segments:True", "expandable_segments:False",
                                           "expandable_segments:True,chunk_max_mb:2"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                           const std::string c = i.param;
                           return c.find("chunk_max") != std::string::npos ? "one_page_chunks"
                                  : c.find("True") != std::string::npos    ? "expandable"
                                                                           : "classic";
                         });

// Every driver call of export, import and close failed in turn, first to fourth of its
// kind: the call fails cleanly (nothing held, no descriptor leaked), and a retry works.
TEST(Adv16IpcFaults, EveryDriverCallOfTheSharingPaths) {
  // single kinds, then a failure whose undo is refused too (taken up by the next call)
  const char *kinds[] = {"export_fd",  "import_fd", "reserve", "unreserve", "map",
                         "unmap",      "set_access", "create", "release",
                         "map@2,unmap", "set_access@1,release", "map@2,unreserve",
                         "import_fd@2,release", "set_access@1,unmap"};
  for (const char *config : {"expandable_segments:True,chunk_max_mb:2",
                             "expandable_segments:False"}) {
    SCOPED_TRACE(config);
    const int fds = open_fds();
    expseg_allocator *a = make(FAULT_HOST, 0, config), *b = make(FAULT_HOST, 1);
    ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(b, 2));
    const size_t size = 7u << 20;
    void *p = nullptr;
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, 0, &p));
    fill(p, size, 31);
    for (const char *kind : kinds) {
      for (int n = 1; n <= 4; n++) {
        std::string rule = std::string(kind) + "@" + std::to_string(n);
        if (strchr(kind, ',')) { // "a@i,b": b fails at its n-th call
          if (n > 2) continue;
          rule = std::string(kind) + "@" + std::to_string(n);
        }
        SCOPED_TRACE(rule);
        const int fds0 = open_fds();
        // export
        ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(a, rule.c_str()));
        expseg_ipc_handle h = {};
        expseg_status st = expseg_ipc_export(a, p, &h);
        ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(a, ""));
        if (st != EXPSEG_OK) {
          EXPECT_EQ(h.data, nullptr);
          EXPECT_EQ(h.n_fds, 0u);
          EXPECT_EQ(open_fds(), fds0) << "failed export leaked a descriptor";
          EXPECT_EQ(held_of(a), 0u) << "failed export holds nothing";
          ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h)) << "retry: " << err();
        }
        // import
        ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(b, rule.c_str()));
        void *q = nullptr;
        const int fds1 = open_fds();
        st = expseg_ipc_import(b, &h, &q);
        ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(b, ""));
        if (st != EXPSEG_OK) {
          EXPECT_FALSE(err().empty());
          EXPECT_EQ(EXPSEG_OK, expseg_check(b)) << "counts true after a failed import: " << err();
          if (!strchr(kind, ',')) { // else the refused undo waits for the next import
            expseg_testing_driver_counts c = counts(b);
            EXPECT_EQ(c.live_chunks, 0);
            EXPECT_EQ(c.live_reservations, 0);
            EXPECT_EQ(c.mapped_bytes, 0);
            EXPECT_EQ(open_fds(), fds1) << "failed import leaked a descriptor";
          }
          ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q)) << "retry: " << err();
        }
        EXPECT_TRUE(holds(q, size, 31));
        EXPECT_EQ(access_of(b, q, size, 2), 2) << "the peer's access";
        expseg_ipc_handle_free(&h);
        // close
        ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(b, rule.c_str()));
        st = expseg_ipc_close(b, q);
        ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(b, ""));
        if (st != EXPSEG_OK) {
          EXPECT_FALSE(err().empty());
          EXPECT_EQ(held_of(a), 1u) << "a failed close keeps the import";
          ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q)) << "retry: " << err();
        }
        EXPECT_EQ(held_of(a), 0u);
        expseg_testing_driver_counts c = counts(b);
        EXPECT_EQ(c.live_chunks, 0);
        EXPECT_EQ(c.live_reservations, 0);
        EXPECT_EQ(open_fds(), fds0);
        EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
        EXPECT_EQ(EXPSEG_OK, expseg_check(b)) << err();
      }
    }
    EXPECT_GT(expseg_testing_faults_injected(b), 0u);
    ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
    EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0);
    destroy_clean(b, "importer");
    destroy_clean(a, "exporter");
    EXPECT_EQ(open_fds(), fds);
  }
}

// Peer access: range checks name the value, twice is harmless, disable while mapped takes
// the access away, and expandable growth after enable gives every new chunk the access.
class Adv16Peers : public ::testing::TestWithParam<const char *> {};

TEST_P(Adv16Peers, GrowthAfterEnableAndDisableWhileMapped) {
  expseg_allocator *a = make(GetParam(), 3, "expandable_segments:True");
  for (int bad : {3, 64, -1, 1000, INT32_MIN}) {
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_enable_peer_access(a, bad));
    EXPECT_TRUE(says(std::to_string(bad))) << err();
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_disable_peer_access(a, bad));
    EXPECT_TRUE(says(std::to_string(bad))) << err();
  }
  EXPECT_EQ(EXPSEG_OK, expseg_disable_peer_access(a, 5)) << "never enabled: nothing to do";
  void *first = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 2u << 20, 0, &first));
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(a, 0));
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(a, 0));
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(a, 63));
  EXPECT_EQ(access_of(a, first, 2u << 20, 0), 2);
  std::vector<std::pair<void *, size_t>> live;
  for (int i = 1; i <= 6; i++) { // grows the one segment, chunk by chunk
    void *p = nullptr;
    size_t s = (size_t)i << 20;
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, s, 0, &p));
    live.push_back({p, s});
    EXPECT_EQ(access_of(a, p, s, 0), 2) << "grown chunk " << i;
    EXPECT_EQ(access_of(a, p, s, 63), 2) << "grown chunk " << i;
    EXPECT_EQ(access_of(a, p, s, 1), 0) << "not enabled";
  }
  ASSERT_EQ(EXPSEG_OK, expseg_disable_peer_access(a, 0)) << "while memory is mapped";
  for (auto &x : live) {
    EXPECT_EQ(access_of(a, x.first, x.second, 0), 0);
    EXPECT_EQ(access_of(a, x.first, x.second, 63), 2);
    EXPECT_EQ(access_of(a, x.first, x.second, 3), 2) << "the owner keeps its access";
  }
  void *late = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 9u << 20, 0, &late));
  EXPECT_EQ(access_of(a, late, 9u << 20, 0), 0) << "disabled: growth does not grant it";
  EXPECT_EQ(access_of(a, late, 9u << 20, 63), 2);
  for (auto &x : live) ASSERT_EQ(EXPSEG_OK, expseg_free(a, x.first));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, late));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, first));
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  EXPECT_EQ(stat_of(a, "reserved_bytes.all.current"), 0);
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  destroy_clean(a, "peers");
}

// A set_access fault during growth with a peer enabled: the malloc fails with nothing
// held (no half-granted chunk), and the retry succeeds with both accesses.
TEST_P(Adv16Peers, FaultedGrantDuringGrowth) {
  std::string spec = std::string("fault;") + GetParam();
  for (const char *config : {"expandable_segments:True", "expandable_segments:False"}) {
    SCOPED_TRACE(config);
    expseg_allocator *a = make(spec.c_str(), 0, config);
    ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(a, 1));
    for (const char *rule : {"set_access@1", "set_access@2", "map@1", "create@1", "reserve@1"}) {
      SCOPED_TRACE(rule);
      ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
      const expseg_testing_driver_counts before = counts(a);
      ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(a, rule));
      void *p = nullptr;
      expseg_status st = expseg_malloc(a, 6u << 20, 0, &p);
      ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(a, ""));
      if (st != EXPSEG_OK) {
        EXPECT_EQ(p, nullptr);
        ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
        expseg_testing_driver_counts c = counts(a);
        EXPECT_EQ(c.live_chunks, before.live_chunks) << "nothing leaked";
        EXPECT_EQ(c.mapped_bytes, before.mapped_bytes);
        EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0);
        ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 6u << 20, 0, &p)) << "retry: " << err();
      }
      EXPECT_EQ(access_of(a, p, 6u << 20, 0), 2);
      EXPECT_EQ(access_of(a, p, 6u << 20, 1), 2);
      EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
      ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
    }
    ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
    destroy_clean(a, "peers");
  }
}

// Enabling and disabling a peer with imports and segments mapped, a set_access failing at
// each range in turn: the failed call changes nothing (every range as before), a retry works.
TEST(Adv16PeersHost, FaultedEnableAndDisableWithImports) {
  expseg_allocator *a = make(HOST, 0), *b = make(FAULT_HOST, 1, "expandable_segments:False");
  void *p = nullptr, *q = nullptr, *own[2] = {};
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 4u << 20, 0, &p));
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(b, 30u << 20, 0, &own[0]));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(b, 50u << 20, 0, &own[1]));
  auto all = [&](int want) {
    EXPECT_EQ(access_of(b, own[0], 30u << 20, 5), want);
    EXPECT_EQ(access_of(b, own[1], 50u << 20, 5), want);
    EXPECT_EQ(access_of(b, q, 4u << 20, 5), want) << "the import";
  };
  for (int n = 1; n <= 3; n++) {
    std::string rule = "set_access@" + std::to_string(n);
    SCOPED_TRACE(rule);
    ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(b, rule.c_str()));
    EXPECT_EQ(EXPSEG_ERR_DRIVER, expseg_enable_peer_access(b, 5));
    ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(b, ""));
    all(0);
    ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(b, 5)) << err();
    all(2);
    ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(b, rule.c_str()));
    EXPECT_EQ(EXPSEG_ERR_DRIVER, expseg_disable_peer_access(b, 5));
    ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(b, ""));
    all(2);
    ASSERT_EQ(EXPSEG_OK, expseg_disable_peer_access(b, 5)) << err();
    all(0);
  }
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(b, 5));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q));
  void *q2 = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q2)) << "imports after enable get the peer";
  EXPECT_EQ(access_of(b, q2, 4u << 20, 5), 2);
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q2));
  expseg_ipc_handle_free(&h);
  for (void *x : own) ASSERT_EQ(EXPSEG_OK, expseg_free(b, x));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  EXPECT_EQ(EXPSEG_OK, expseg_check(b)) << err();
  destroy_clean(b, "importer");
  destroy_clean(a, "exporter");
}

// A peer enabled or disabled while a region sleeps (classic and expandable segments): the
// sleeping memory is not mapped, so there is nothing to grant, and the wake grants the
// peer; a chunk a refused unmap left mapped while asleep is granted and revoked too.
TEST_P(Adv16Peers, EnableWhileARegionSleeps) {
  const std::string spec = std::string("fault;") + GetParam();
  for (const char *cfg : {"expandable_segments:False", "expandable_segments:True"}) {
    SCOPED_TRACE(cfg);
    for (bool refused_unmap : {false, true}) {
      SCOPED_TRACE(refused_unmap ? "a sleep's unmap refused" : "a clean sleep");
      expseg_allocator *a = make(spec.c_str(), 0, cfg);
      ASSERT_EQ(EXPSEG_OK, expseg_region_begin(a, "r"));
      void *p = nullptr, *other = nullptr;
      ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 6u << 20, 0, &p));
      ASSERT_EQ(EXPSEG_OK, expseg_region_end(a, "r"));
      ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 6u << 20, 0, &other));
      if (refused_unmap) {
        ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(a, "unmap@1"));
      }
      expseg_status st = expseg_sleep(a, "r", EXPSEG_SLEEP_DISCARD);
      ASSERT_EQ(EXPSEG_OK, expseg_testing_set_faults(a, ""));
      ASSERT_EQ(refused_unmap ? EXPSEG_ERR_DRIVER : EXPSEG_OK, st) << err();
      EXPECT_EQ(EXPSEG_OK, expseg_enable_peer_access(a, 1)) << err();
      EXPECT_EQ(access_of(a, other, 6u << 20, 1), 2);
      if (refused_unmap) {
        EXPECT_EQ(access_of(a, p, 6u << 20, 1), 2) << "still mapped";
      }
      EXPECT_EQ(EXPSEG_OK, expseg_disable_peer_access(a, 1)) << err();
      if (refused_unmap) {
        EXPECT_EQ(access_of(a, p, 6u << 20, 1), 0) << "revoked";
      }
      EXPECT_EQ(EXPSEG_OK, expseg_enable_peer_access(a, 1)) << err();
      ASSERT_EQ(EXPSEG_OK, expseg_wake(a, "r")) << err();
      EXPECT_EQ(access_of(a, p, 6u << 20, 1), 2) << "the wake grants the enabled peer";
      EXPECT_EQ(access_of(a, p, 6u << 20, 0), 2);
      EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
      ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
      ASSERT_EQ(EXPSEG_OK, expseg_free(a, other));
      ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
      destroy_clean(a, "sleeping peers");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, Adv16Peers, ::testing::Values("host:capacity=256M", "sim"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                           return std::string(i.param).substr(0, 4) == "host" ? "host" : "sim";
                         });

// sim has no memory to share: every sharing call says so and holds nothing.
TEST(Adv16IpcSim, UnsupportedOnSim) {
  expseg_allocator *a = make("sim", 0);
  void *p = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 1u << 20, 0, &p));
  expseg_ipc_handle h = {};
  EXPECT_EQ(EXPSEG_ERR_UNSUPPORTED, expseg_ipc_export(a, p, &h));
  EXPECT_EQ(h.data, nullptr);
  EXPECT_EQ(held_of(a), 0u);
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  EXPECT_EQ(stat_of(a, "allocated_bytes.all.current"), 0) << "not deferred";
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
  // a host handle imported into a sim allocator: refused, nothing held, sim keeps working
  const int fds = open_fds();
  expseg_allocator *x = make(HOST, 1);
  void *xp = nullptr, *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(x, 2u << 20, 0, &xp));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(x, xp, &h));
  EXPECT_EQ(EXPSEG_ERR_UNSUPPORTED, expseg_ipc_import(a, &h, &q)) << err();
  EXPECT_FALSE(err().empty());
  EXPECT_EQ(q, nullptr);
  expseg_testing_driver_counts c = counts(a);
  EXPECT_EQ(c.live_reservations, 0);
  EXPECT_EQ(c.live_chunks, 0);
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_close(a, xp));
  expseg_ipc_handle_free(&h);
  EXPECT_EQ(held_of(x), 0u);
  ASSERT_EQ(EXPSEG_OK, expseg_free(x, xp));
  destroy_clean(x, "host exporter");
  EXPECT_EQ(open_fds(), fds);
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 1u << 20, 0, &p));
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << err();
  destroy_clean(a, "sim");
}

// Several threads export, import (across two allocators, both ways), close, free handles
// and blocks at once, with peers toggled; everything balances at the end.
TEST(Adv16IpcThreads, ShareAcrossThreads) {
  enum { THREADS = 4, OPS = 300 };
  EXPSEG_SEEDED(seed, 1616);
  const int fds = open_fds();
  expseg_allocator *dev[2] = {make("host:capacity=2G", 0, "expandable_segments:True"),
                              make("host:capacity=2G", 1, "expandable_segments:False")};
  std::atomic<int> failures{0};
  std::mutex msg_lock;
  std::string first_msg;
  auto fail = [&](const char *what) {
    std::lock_guard<std::mutex> g(msg_lock);
    if (first_msg.empty()) first_msg = std::string(what) + ": " + err();
    failures++;
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < THREADS; t++) {
    ts.emplace_back([&, t] {
      std::mt19937_64 rng(seed * 31 + (uint64_t)t);
      struct Imp {
        int at;
        void *q;
        size_t size;
        unsigned char tag;
      };
      std::vector<std::pair<int, void *>> blocks;
      std::vector<Imp> imps;
      for (int i = 0; i < OPS; i++) {
        unsigned r = (unsigned)(rng() % 100);
        int d = (int)(rng() % 2);
        if (r < 2) {
          expseg_status st = (r == 0) ? expseg_enable_peer_access(dev[d], 4 + t)
                                      : expseg_disable_peer_access(dev[d], 4 + t);
          if (st != EXPSEG_OK) fail("peer");
        } else if (r < 40 || blocks.empty()) {
          size_t size = (1 + rng() % 3) << 20;
          unsigned char tag = (unsigned char)rng();
          void *p = nullptr;
          if (expseg_malloc(dev[d], size, (expseg_stream)(t % 2), &p) != EXPSEG_OK) {
            fail("malloc");
            continue;
          }
          fill(p, 4096, tag);
          expseg_ipc_handle h = {};
          if (expseg_ipc_export(dev[d], p, &h) != EXPSEG_OK) {
            fail("export");
            continue;
          }
          void *q = nullptr;
          int to = (int)(rng() % 2);
          if (expseg_ipc_import(dev[to], &h, &q) != EXPSEG_OK) {
            fail("import");
          } else {
            imps.push_back({to, q, size, tag});
            if (!holds(q, 4096, tag)) fail("bytes");
          }
          expseg_ipc_handle_free(&h);
          if (rng() % 2) {
            if (expseg_free(dev[d], p) != EXPSEG_OK) fail("free exported");
          } else {
            blocks.push_back({d, p});
          }
        } else if ((r < 70 || imps.size() > 8) && !imps.empty()) {
          size_t k = rng() % imps.size();
          if (!holds(imps[k].q, 4096, imps[k].tag)) fail("bytes before close");
          if (expseg_ipc_close(dev[imps[k].at], imps[k].q) != EXPSEG_OK) fail("close");
          imps[k] = imps.back();
          imps.pop_back();
        } else if (!blocks.empty()) {
          size_t k = rng() % blocks.size();
          if (expseg_free(dev[blocks[k].first], blocks[k].second) != EXPSEG_OK) fail("free");
          blocks[k] = blocks.back();
          blocks.pop_back();
        } else {
          size_t held = 0;
          if (expseg_ipc_poll(dev[d], &held) != EXPSEG_OK) fail("poll");
        }
      }
      for (auto &x : imps)
        if (expseg_ipc_close(dev[x.at], x.q) != EXPSEG_OK) fail("close at end");
      for (auto &x : blocks)
        if (expseg_free(dev[x.first], x.second) != EXPSEG_OK) fail("free at end");
    });
  }
  for (auto &t : ts) t.join();
  EXPECT_EQ(failures.load(), 0) << first_msg;
  for (int d = 0; d < 2; d++) {
    EXPECT_EQ(held_of(dev[d]), 0u) << "device " << d;
    EXPECT_EQ(stat_of(dev[d], "allocated_bytes.all.current"), 0) << "device " << d;
    EXPECT_EQ(stat_of(dev[d], "allocation.all.current"), 0) << "device " << d;
    EXPECT_EQ(EXPSEG_OK, expseg_check(dev[d])) << err();
    ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(dev[d]));
    EXPECT_EQ(stat_of(dev[d], "reserved_bytes.all.current"), 0) << "device " << d;
  }
  destroy_clean(dev[1], "device 1");
  destroy_clean(dev[0], "device 0");
  EXPECT_EQ(open_fds(), fds);
}

} // namespace
