// SPDX-License-Identifier: Apache-2.0
// test_gpu_host_pool.cpp: the pinned host pool on the cuda driver (label gpu; skipped without
// a usable CUDA device): both chunk paths give locked memory on the reported node, usable
// from the host, and a block recorded on a stream is reused once the stream is done.
#include <gtest/gtest.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "host_pool_support.h"

namespace {

TEST(GpuHostPool, BothPathsGiveLockedPlacedMemory) {
  if (!_expseg_cuda_usable(0)) GTEST_SKIP() << "no usable CUDA device";
  for (const char *cfg : {"pinned_use_cuda_host_register:False",
                          "pinned_use_cuda_host_register:True,pinned_num_register_threads:4"}) {
    SCOPED_TRACE(cfg);
    expseg_host_pool *h = nullptr;
    ASSERT_EQ(expseg_host_create("cuda", 0, cfg, &h), EXPSEG_OK) << expseg_last_error();
    int node = expseg_host_numa_node(h);
    std::printf("%s: node %d\n", cfg, node);
    void *p = nullptr;
    ASSERT_EQ(expseg_host_malloc(h, 64 * MiB, &p), EXPSEG_OK) << expseg_last_error();
    std::memset(p, 0x5a, 64 * MiB);
    EXPECT_EQ(hstat(h, "expseg.locked_bytes"), hstat(h, "reserved_bytes.current"));
    EXPECT_EQ(hstat(h, "expseg.created_segments") + hstat(h, "expseg.registered_segments"),
              hstat(h, "num_host_alloc"));
    if (node >= 0 && hstat(h, "expseg.registered_segments") > 0) {
      // registered memory is ordinary memory: the kernel can say where each page is
      size_t page = (size_t)sysconf(_SC_PAGESIZE), n = 64 * MiB / page;
      std::vector<void *> pages(n);
      std::vector<int> status(n, -1);
      for (size_t i = 0; i < n; i++) pages[i] = (char *)p + i * page;
      ASSERT_EQ(syscall(SYS_move_pages, 0, n, pages.data(), nullptr, status.data(), 0), 0);
      size_t wrong = 0;
      for (int s : status) wrong += s != node;
      EXPECT_EQ(wrong, 0u);
    }
    // a block recorded on the default stream comes back once the stream is done
    ASSERT_EQ(expseg_host_record_stream(h, p, 0), EXPSEG_OK);
    ASSERT_EQ(expseg_host_free(h, p), EXPSEG_OK);
    ASSERT_EQ(_expseg_vmm_stream_synchronize(_expseg_host_pool_driver(h), 0), EXPSEG_OK);
    void *q = nullptr;
    ASSERT_EQ(expseg_host_malloc(h, 64 * MiB, &q), EXPSEG_OK);
    EXPECT_EQ(q, p);
    EXPECT_EQ(expseg_host_free(h, q), EXPSEG_OK);
    EXPECT_EQ(expseg_host_empty_cache(h), EXPSEG_OK);
    EXPECT_EQ(hstat(h, "segment.current"), 0);
    expseg_host_destroy(h);
  }
}

}  // namespace
