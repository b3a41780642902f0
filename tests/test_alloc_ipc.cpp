// SPDX-License-Identifier: Apache-2.0
// Sharing allocations between processes (issue 14, docs/ipc.md) on the host driver: a
// forked child imports what the parent exported over a socketpair (SCM_RIGHTS), reads it,
// writes back and closes; a child killed with SIGKILL before closing releases the parent's
// block; descriptors, chunks and mappings balance after destroy; malformed handles are
// rejected with a message naming the field.
#include "alloc_support.h"
#include "expseg_testing.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

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
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed + i * 7);
}
bool holds(const void *p, size_t n, unsigned char seed) {
  auto *b = static_cast<const unsigned char *>(p);
  for (size_t i = 0; i < n; i++)
    if (b[i] != (unsigned char)(seed + i * 7)) return false;
  return true;
}

// The child: receive, import, check, write back, then close (or wait to be killed).
// Exit codes name the step that failed.
[[noreturn]] void child(int sock, size_t size, bool close_it) {
  expseg_allocator *c = nullptr;
  if (expseg_create("host:capacity=256M", 0, nullptr, &c) != EXPSEG_OK) _exit(10);
  expseg_ipc_handle h = {};
  if (expseg_ipc_recv(sock, &h) != EXPSEG_OK) _exit(11);
  void *p = nullptr;
  if (expseg_ipc_import(c, &h, &p) != EXPSEG_OK) _exit(12);
  expseg_ipc_handle_free(&h);
  if (!holds(p, size, 1)) _exit(13);
  fill(p, size, 2);
  if (!close_it) {
    char b = 'i';
    if (write(sock, &b, 1) != 1) _exit(14);
    for (;;) pause(); // killed here
  }
  if (expseg_ipc_close(c, p) != EXPSEG_OK) _exit(15);
  expseg_testing_driver_counts left;
  expseg_testing_destroy(c, &left);
  if (left.live_chunks || left.mapped_bytes || left.live_reservations) _exit(16);
  char b = 'd';
  if (write(sock, &b, 1) != 1) _exit(17);
  _exit(0);
}

struct TwoProc {
  int fds_before = open_fds();
  int sv[2] = {-1, -1};
  pid_t pid = -1;
  expseg_allocator *a = nullptr;
};

void start(TwoProc &r, size_t size, bool close_it) {
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, r.sv));
  r.pid = fork(); // before the parent's allocator exists: the child inherits none of it
  ASSERT_GE(r.pid, 0);
  if (r.pid == 0) {
    close(r.sv[0]);
    child(r.sv[1], size, close_it);
  }
  close(r.sv[1]);
  ASSERT_EQ(EXPSEG_OK, expseg_create("host:capacity=256M", 0, nullptr, &r.a));
}

void finish(TwoProc &r) {
  expseg_testing_driver_counts left;
  expseg_testing_destroy(r.a, &left);
  EXPECT_EQ(left.live_chunks, 0);
  EXPECT_EQ(left.mapped_bytes, 0);
  EXPECT_EQ(left.live_reservations, 0);
  close(r.sv[0]);
  EXPECT_EQ(open_fds(), r.fds_before) << "a descriptor leaked";
}

class Ipc : public ::testing::TestWithParam<const char *> {};

// Parent side: allocate, fill, export, send, free the handle, wait for the child's byte.
void share(TwoProc &r, const char *config, size_t size, void **p, char expect) {
  ASSERT_EQ(EXPSEG_OK, expseg_configure(r.a, config));
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(r.a, size, 0, p));
  fill(*p, size, 1);
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(r.a, *p, &h)) << expseg_last_error();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_send(r.sv[0], &h)) << expseg_last_error();
  expseg_ipc_handle_free(&h);
  char b = 0;
  ASSERT_EQ(1, read(r.sv[0], &b, 1)) << "the child stopped early";
  EXPECT_EQ(expect, b);
}

TEST_P(Ipc, ChildReadsAndWritesBack) {
  const size_t size = 6u << 20;
  TwoProc r;
  start(r, size, true);
  void *p = nullptr;
  share(r, GetParam(), size, &p, 'd');
  int status = 0;
  ASSERT_EQ(r.pid, waitpid(r.pid, &status, 0));
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(0, WEXITSTATUS(status)) << "the child failed at step " << WEXITSTATUS(status);
  EXPECT_TRUE(holds(p, size, 2)) << "the parent sees the child's write";
  size_t held = 99;
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_poll(r.a, &held));
  EXPECT_EQ(held, 0u) << "the child closed and exited";
  ASSERT_EQ(EXPSEG_OK, expseg_free(r.a, p));
  EXPECT_EQ(EXPSEG_OK, expseg_check(r.a)) << expseg_last_error();
  finish(r);
}

TEST_P(Ipc, KilledChildReleasesTheBlock) {
  const size_t size = 6u << 20;
  TwoProc r;
  start(r, size, false);
  void *p = nullptr;
  share(r, GetParam(), size, &p, 'i'); // the child imported, then waits
  ASSERT_EQ(EXPSEG_OK, expseg_free(r.a, p)) << "deferred while the child holds it";
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_free(r.a, p)) << "a second free is an error";
  EXPECT_NE(std::string(expseg_last_error()).find("already freed"), std::string::npos);
  // the pointer is gone for the caller at once: record_stream is refused as export is
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_record_stream(r.a, p, 5));
  EXPECT_NE(std::string(expseg_last_error()).find("expseg_record_stream"), std::string::npos);
  EXPECT_NE(std::string(expseg_last_error()).find("already freed"), std::string::npos)
      << expseg_last_error();
  expseg_ipc_handle again_h;
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_export(r.a, p, &again_h));
  size_t held = 0;
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_poll(r.a, &held));
  EXPECT_EQ(held, 1u);
  void *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(r.a, size, 0, &q));
  EXPECT_NE(q, p) << "the block is not reused while the child maps it";
  ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(r.a));
  EXPECT_TRUE(holds(p, size, 2)) << "nor released: the child's write is there";
  kill(r.pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(r.pid, waitpid(r.pid, &status, 0));
  ASSERT_TRUE(WIFSIGNALED(status));
  // exports are polled on a miss, at empty_cache and by expseg_ipc_poll (not on every hit)
  int64_t before = 0, after = 0;
  ASSERT_EQ(EXPSEG_OK, expseg_stat(r.a, "allocated_bytes.all.current", &before));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_poll(r.a, &held));
  EXPECT_EQ(held, 0u) << "the child's death ends the export";
  ASSERT_EQ(EXPSEG_OK, expseg_stat(r.a, "allocated_bytes.all.current", &after));
  EXPECT_LT(after, before) << "the block deferred at its free is freed once the child is gone";
  void *again = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(r.a, size, 0, &again));
  ASSERT_EQ(EXPSEG_OK, expseg_free(r.a, again));
  ASSERT_EQ(EXPSEG_OK, expseg_free(r.a, q));
  EXPECT_EQ(EXPSEG_OK, expseg_check(r.a)) << expseg_last_error();
  finish(r);
}

INSTANTIATE_TEST_SUITE_P(Cpu, Ipc,
                         ::testing::Values("expandable_segments:True", "expandable_segments:False",
                                           "expandable_segments:True,chunk_max_mb:2"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                           const std::string c = i.param;
                           return c.find("chunk_max") != std::string::npos ? "one_page_chunks"
                                  : c.find("True") != std::string::npos    ? "expandable"
                                                                           : "classic";
                         });

// In one process: import into a second allocator, then every malformed variant.
TEST(IpcHandle, MalformedHandlesAreRejected) {
  int fds_before = open_fds();
  expseg_allocator *a = nullptr, *b = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_create("host:capacity=256M", 0, nullptr, &a));
  ASSERT_EQ(EXPSEG_OK, expseg_create("host:capacity=256M", 1, nullptr, &b));
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(b, 3));
  const size_t size = 5u << 20;
  void *p = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, size, 0, &p));
  fill(p, size, 9);
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  EXPECT_EQ(h.size, 64u + 32u) << "5 MiB in its growth's one 6 MiB chunk";
  EXPECT_EQ(h.n_fds, 2u) << "one arena file, sent once, and the liveness socket";

  void *q = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &h, &q)) << expseg_last_error();
  EXPECT_TRUE(holds(q, size, 9));
  int state = -1;
  uintptr_t lo = (uintptr_t)q / (2u << 20) * (2u << 20);
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_has_access(alloc_test_driver(b), lo, 6u << 20, 3, &state));
  EXPECT_EQ(state, 2) << "imports get the enabled peers' access";
  uint64_t calls = alloc_test_calls(b, EXPSEG_VMM_CALL_set_access);
  ASSERT_EQ(EXPSEG_OK, expseg_enable_peer_access(b, 4));
  EXPECT_EQ(alloc_test_calls(b, EXPSEG_VMM_CALL_set_access) - calls, 1u) << "the import's range";
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_has_access(alloc_test_driver(b), lo, 6u << 20, 4, &state));
  EXPECT_EQ(state, 2) << "and the peers enabled later";
  EXPECT_EQ(EXPSEG_OK, expseg_check(b)) << "imports are not segments: " << expseg_last_error();
  EXPECT_EQ(EXPSEG_OK, expseg_check(a)) << expseg_last_error();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(b, q));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_close(b, q));

  struct Case {
    const char *what;
    size_t at;
    unsigned char value;
    const char *expect;
  } cases[] = {
      {"magic", 0, 'X', "magic"},        {"version", 4, 2, "version"},
      {"header size", 6, 63, "header size"}, {"padding", 10, 1, "padding"},
      {"chunk count", 12, 9, "handle size"}, {"fd count", 16, 5, "descriptor count"},
      {"liveness index", 20, 7, "liveness"}, {"extent", 24, 1, "extent"},
      {"flags", 48, 1, "padding or flags"},  {"entry fd index", 64, 1, "descriptor index"},
      {"entry padding", 68, 1, "padding"},   {"entry offset", 80, 1, "offset in the extent"},
  };
  for (const Case &c : cases) {
    std::vector<unsigned char> bytes(h.data, h.data + h.size);
    bytes[c.at] = c.value;
    expseg_ipc_handle bad = h;
    bad.data = bytes.data();
    void *x = nullptr;
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &bad, &x)) << c.what;
    EXPECT_NE(std::string(expseg_last_error()).find(c.expect), std::string::npos)
        << c.what << ": " << expseg_last_error();
  }
  for (size_t cut : {0ul, 10ul, 63ul, 64ul + 31, (size_t)h.size - 1}) {
    expseg_ipc_handle bad = h;
    bad.size = cut;
    void *x = nullptr;
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &bad, &x)) << "cut at " << cut;
  }
  { // a descriptor that is not a chunk
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    std::vector<int> fds(h.fds, h.fds + h.n_fds);
    fds[0] = devnull;
    expseg_ipc_handle bad = h;
    bad.fds = fds.data();
    void *x = nullptr;
    EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_import(b, &bad, &x));
    EXPECT_NE(std::string(expseg_last_error()).find("not a file"), std::string::npos)
        << expseg_last_error();
    close(devnull);
  }
  expseg_testing_driver_counts counts;
  ASSERT_EQ(EXPSEG_OK, expseg_testing_driver_counts_get(b, &counts));
  EXPECT_EQ(counts.live_chunks, 0) << "failed imports leave nothing behind";
  EXPECT_EQ(counts.live_reservations, 0);
  void *r = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(b, size, 0, &r)) << "the importer keeps working";
  ASSERT_EQ(EXPSEG_OK, expseg_free(b, r));
  expseg_ipc_handle none = {};
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_export(a, (char *)p + 1, &none));
  EXPECT_EQ(none.data, nullptr);
  expseg_ipc_handle_free(&h);
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  expseg_testing_driver_counts left;
  expseg_testing_destroy(b, &left);
  EXPECT_EQ(left.live_chunks, 0);
  expseg_testing_destroy(a, &left);
  EXPECT_EQ(left.live_chunks, 0);
  EXPECT_EQ(left.mapped_bytes, 0);
  EXPECT_EQ(open_fds(), fds_before);
}

// A second import of a live import in the same importer, an import kept at destroy, and
// the sender seeing a receiver that hangs up.
TEST(IpcHandle, DestroyClosesImportsAndRecvRejectsGarbage) {
  int fds_before = open_fds();
  expseg_allocator *a = nullptr, *b = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_create("host:capacity=256M", 0, "expandable_segments:False", &a));
  ASSERT_EQ(EXPSEG_OK, expseg_create("host:capacity=256M", 0, nullptr, &b));
  void *p = nullptr, *q1 = nullptr, *q2 = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 3u << 20, 0, &p));
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h));
  EXPECT_EQ(h.size, 64u + 32u) << "a classic segment is one chunk";
  int sv[2];
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_send(sv[0], &h));
  expseg_ipc_handle got = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_recv(sv[1], &got)) << expseg_last_error();
  ASSERT_EQ(got.size, h.size);
  EXPECT_EQ(0, memcmp(got.data, h.data, h.size));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &got, &q1));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(b, &got, &q2));
  EXPECT_NE(q1, q2);
  EXPECT_EQ(EXPSEG_OK, expseg_check(b)) << expseg_last_error();
  expseg_ipc_handle_free(&got);
  ASSERT_EQ(4, write(sv[0], "junk", 4));
  close(sv[0]);
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_recv(sv[1], &got));
  EXPECT_EQ(got.data, nullptr);
  close(sv[1]);
  int dgram[2];
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, dgram));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_ipc_send(dgram[0], &h));
  EXPECT_NE(std::string(expseg_last_error()).find("SOCK_STREAM"), std::string::npos);
  close(dgram[0]), close(dgram[1]);
  expseg_ipc_handle_free(&h);
  expseg_testing_driver_counts left;
  expseg_testing_destroy(b, &left); // q1, q2 still imported
  EXPECT_EQ(left.live_chunks, 0);
  EXPECT_EQ(left.live_reservations, 0);
  size_t held = 0;
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_poll(a, &held));
  EXPECT_EQ(held, 0u) << "the importer is gone";
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  expseg_testing_destroy(a, &left);
  EXPECT_EQ(left.live_chunks, 0);
  EXPECT_EQ(open_fds(), fds_before);
}

} // namespace
