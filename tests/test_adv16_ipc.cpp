// SPDX-License-Identifier: Apache-2.0
// Adversarial programs against the sharing API (docs/ipc.md): an export freed in the
// exporter while imported, two exports of one block, closes of pointers never imported,
// exports of interior, freed, pending and foreign pointers, imports into the exporting
// allocator, garbage, truncated, stale and freed handles, a forked exporter killed while
// imported, private pools and tagged regions holding exported blocks, frees on other
// streams, and what an export describes. Two allocators in one process stand for the two
// processes (the descriptors travel the same). test_adv16_ipc_stress.cpp and
// test_adv16_peers.cpp hold the rest of the round.
#include "test_adv16_ipc_common.h"

namespace {

using namespace adv16;

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

ADV16_INSTANTIATE_CONFIGS(Adv16Ipc);

} // namespace
