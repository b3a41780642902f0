// SPDX-License-Identifier: Apache-2.0
// The sharing API under load and faults (docs/ipc.md): malformed and oversized socket
// messages and a receiver at its descriptor limit, forty exports closed in a seeded order,
// an importer's cache work and a failed import's leftovers at destroy, a seeded random
// program checked against a model, every driver call of export, import and close failed in
// turn with nothing leaked and a retry succeeding, sim's refusal, and several threads
// sharing across two allocators at once.
#include "test_adv16_ipc_common.h"

namespace {

using namespace adv16;

class Adv16Ipc : public ::testing::TestWithParam<const char *> {};

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

ADV16_INSTANTIATE_CONFIGS(Adv16Ipc);

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
