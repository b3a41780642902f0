// SPDX-License-Identifier: Apache-2.0
// test_vmm_host_fds.cpp: the host driver holds no open file per chunk. Under a low limit on
// open files (RLIMIT_NOFILE lowered in the test, restored after) it creates thousands of
// chunks of 4 KiB and of 2 MiB, maps and touches some, releases them, and the process's
// descriptor count (/proc/self/fd) stays flat and is back where it started after close; the
// pages of a released chunk go back to the OS; and the allocator serves 100 MiB in 4 KiB
// pages under the usual soft limit of 1024 open files.
#include <gtest/gtest.h>

#include <dirent.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "alloc_support.h"
#include "error.h"

namespace {

#define ASSERT_OK(e) ASSERT_EQ(EXPSEG_OK, (e)) << expseg_last_error()

// Entries of /proc/self/fd (the directory's own descriptor included, every time alike).
int count_fds() {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (readdir(d)) n++;
  closedir(d);
  return n;
}

// Bytes on disk (st_blocks) of every memfd the host driver has open in this process.
long long host_memfd_bytes() {
  long long total = 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (struct dirent *e = readdir(d)) {
    std::string p = std::string("/proc/self/fd/") + e->d_name;
    char target[256] = {0};
    ssize_t n = readlink(p.c_str(), target, sizeof target - 1);
    if (n <= 0 || !strstr(target, "memfd:expseg-")) continue;
    struct stat sb;
    if (stat(p.c_str(), &sb) == 0) total += (long long)sb.st_blocks * 512;
  }
  closedir(d);
  return total;
}

// Lowers the soft limit on open files for the scope of a test.
struct FdLimit {
  rlimit old{};
  bool ok = false;
  explicit FdLimit(rlim_t soft) {
    if (getrlimit(RLIMIT_NOFILE, &old) != 0) return;
    rlimit r = old;
    r.rlim_cur = soft < old.rlim_max ? soft : old.rlim_max;
    ok = setrlimit(RLIMIT_NOFILE, &r) == 0;
  }
  ~FdLimit() {
    if (ok) setrlimit(RLIMIT_NOFILE, &old);
  }
};

// Creates n chunks of the driver's granularity (or `size`), maps them side by side, touches
// every 7th, and gives everything back; the descriptor count never grows by more than
// `max_extra` while they live.
void many_chunks(const char *spec, size_t n, int max_extra) {
  const int before = count_fds();
  ASSERT_GT(before, 0);
  expseg_vmm_t *v = nullptr;
  ASSERT_OK(_expseg_vmm_open(spec, 0, &v));
  const size_t g = v->granularity;
  uintptr_t va = 0;
  ASSERT_OK(_expseg_vmm_reserve(v, n * g, 0, &va));
  std::vector<expseg_vmm_handle> hs(n);
  for (size_t i = 0; i < n; i++) {
    ASSERT_OK(_expseg_vmm_create(v, g, &hs[i])) << " chunk " << i << " of " << n;
    ASSERT_OK(_expseg_vmm_map(v, va + i * g, g, hs[i], 0));
  }
  EXPECT_LE(count_fds() - before, max_extra) << n << " chunks of " << g << " bytes";
  ASSERT_OK(_expseg_vmm_set_access(v, va, n * g));
  for (size_t i = 0; i < n; i += 7) {
    volatile char *p = reinterpret_cast<char *>(va + i * g);
    p[0] = char(i), p[g - 1] = char(i + 1);
  }
  for (size_t i = 0; i < n; i += 7) {
    volatile char *p = reinterpret_cast<char *>(va + i * g);
    ASSERT_EQ(char(i), p[0]) << "chunk " << i;
    ASSERT_EQ(char(i + 1), p[g - 1]) << "chunk " << i;
  }
  for (size_t i = 0; i < n; i++) ASSERT_OK(_expseg_vmm_unmap(v, va + i * g, g));
  for (size_t i = 0; i < n; i++) ASSERT_OK(_expseg_vmm_release(v, hs[i], g));
  EXPECT_LE(count_fds() - before, max_extra);
  ASSERT_OK(_expseg_vmm_unreserve(v, va, n * g));
  char why[128];
  EXPECT_TRUE(vmm_test_is_idle(v, why, sizeof why)) << why;
  _expseg_vmm_close(v);
  EXPECT_EQ(before, count_fds()) << "descriptors left open after close";
}

TEST(VmmHostFds, FiveThousandSmallChunksUnderALimitOf256) {
  FdLimit lim(256);
  ASSERT_TRUE(lim.ok);
  many_chunks("host:capacity=8G,granularity=4K", 5000, 2);
}

TEST(VmmHostFds, TwoThousandPagesOf2MiBUnderALimitOf256) {
  FdLimit lim(256);
  ASSERT_TRUE(lim.ok);
  many_chunks("host:capacity=8G,granularity=2M", 2000, 2);
}

// A released chunk's pages go back to the OS, even though its file stays open for the
// other chunks; the others keep their data.
TEST(VmmHostFds, ReleaseGivesThePagesBack) {
  expseg_vmm_t *v = nullptr;
  ASSERT_OK(_expseg_vmm_open("host:capacity=64M,granularity=2M", 0, &v));
  const size_t g = v->granularity;
  const long long base = host_memfd_bytes();
  uintptr_t va = 0;
  expseg_vmm_handle a = 0, b = 0;
  ASSERT_OK(_expseg_vmm_reserve(v, 2 * g, 0, &va));
  ASSERT_OK(_expseg_vmm_create(v, g, &a));
  ASSERT_OK(_expseg_vmm_create(v, g, &b));
  ASSERT_OK(_expseg_vmm_map(v, va, g, a, 0));
  ASSERT_OK(_expseg_vmm_map(v, va + g, g, b, 0));
  ASSERT_OK(_expseg_vmm_set_access(v, va, 2 * g));
  memset(reinterpret_cast<void *>(va), 0xab, 2 * g);
  const long long touched = host_memfd_bytes();
  EXPECT_GE(touched - base, (long long)(2 * g)) << "both chunks' pages are resident";
  ASSERT_OK(_expseg_vmm_unmap(v, va, g));
  ASSERT_OK(_expseg_vmm_release(v, a, g));
  const long long after = host_memfd_bytes();
  EXPECT_LE(after, touched - (long long)g) << "the released chunk's pages are still held";
  EXPECT_EQ(char(0xab), reinterpret_cast<volatile char *>(va + g)[g / 2]);
  // A new chunk reusing the range starts zeroed.
  ASSERT_OK(_expseg_vmm_create(v, g, &a));
  ASSERT_OK(_expseg_vmm_map(v, va, g, a, 0));
  ASSERT_OK(_expseg_vmm_set_access(v, va, g));
  EXPECT_EQ(0, reinterpret_cast<volatile char *>(va)[g / 3]);
  ASSERT_OK(_expseg_vmm_unmap(v, va, 2 * g));
  ASSERT_OK(_expseg_vmm_release(v, a, g));
  ASSERT_OK(_expseg_vmm_release(v, b, g));
  EXPECT_LE(host_memfd_bytes(), base);
  ASSERT_OK(_expseg_vmm_unreserve(v, va, 2 * g));
  _expseg_vmm_close(v);
}

// Through the allocator: 100 MiB in 4 KiB pages (page_size_mb:0 = the granularity), grown
// by 100 live requests of 1 MiB and a few 4 KiB pages each: a chunk per growth, dozens of
// chunks of odd sizes, under the usual soft limit of 1024 open files (the vmm-level tests
// above make thousands).
TEST(VmmHostFds, AllocatorServes100MiBIn4KiBPagesUnderALimitOf1024) {
  FdLimit lim(1024);
  ASSERT_TRUE(lim.ok);
  const int before = count_fds();
  expseg_allocator *a = nullptr;
  ASSERT_OK(expseg_create("host:capacity=8G,granularity=4K", 0, "page_size_mb:0", &a));
  std::vector<void *> ps;
  for (int i = 0; i < 100; i++) { // large pool: more than 1 MiB each
    void *p = nullptr;
    const size_t size = (1u << 20) + 4096u * (1 + i % 7);
    ASSERT_OK(expseg_malloc(a, size, 0, &p));
    memset(p, 0x5a, size);
    EXPECT_EQ(0x5a, static_cast<unsigned char *>(p)[size - 1]);
    ps.push_back(p);
  }
  EXPECT_LE(count_fds() - before, 2);
  EXPECT_GE(alloc_test_calls(a, EXPSEG_VMM_CALL_create), 50u) << "a chunk per growth";
  for (void *p : ps) ASSERT_OK(expseg_free(a, p));
  ASSERT_OK(expseg_empty_cache(a));
  expseg_destroy(a);
  EXPECT_EQ(before, count_fds());
}

} // namespace
