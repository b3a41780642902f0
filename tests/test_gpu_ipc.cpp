// SPDX-License-Identifier: Apache-2.0
// Sharing an allocation between two processes on the cuda backend (label gpu; skips where
// no CUDA device with virtual memory management is usable). CUDA is not fork-safe, so the
// child is this same binary started afresh (posix_spawn of /proc/self/exe) running only
// GpuIpc.ChildSide, with the socket's number in $EXPSEG_IPC_CHILD_FD. Data goes in and out
// of device memory with cuMemcpyHtoD/DtoH, looked up with dlsym here so that only
// vmm/cuda.c includes cuda.h. Prints the export and import times.
#include "alloc_support.h"
#include "expseg_testing.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

extern char **environ;

namespace {

// The few driver entry points the test needs, by hand (CUresult is an int, CUdeviceptr a
// 64-bit integer, CUcontext and CUdevice as the driver API defines them).
struct Cu {
  int (*init)(unsigned) = nullptr;
  int (*dev_get)(int *, int) = nullptr;
  int (*retain)(void **, int) = nullptr;
  int (*set_current)(void *) = nullptr;
  int (*htod)(unsigned long long, const void *, size_t) = nullptr;
  int (*dtoh)(void *, unsigned long long, size_t) = nullptr;
  int (*stream_sync)(void *) = nullptr;
  bool load() {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return false;
    init = (int (*)(unsigned))dlsym(lib, "cuInit");
    dev_get = (int (*)(int *, int))dlsym(lib, "cuDeviceGet");
    retain = (int (*)(void **, int))dlsym(lib, "cuDevicePrimaryCtxRetain");
    set_current = (int (*)(void *))dlsym(lib, "cuCtxSetCurrent");
    htod = (int (*)(unsigned long long, const void *, size_t))dlsym(lib, "cuMemcpyHtoD_v2");
    dtoh = (int (*)(void *, unsigned long long, size_t))dlsym(lib, "cuMemcpyDtoH_v2");
    stream_sync = (int (*)(void *))dlsym(lib, "cuStreamSynchronize");
    if (!init || !dev_get || !retain || !set_current || !htod || !dtoh || !stream_sync)
      return false;
    int dev = 0;
    void *ctx = nullptr;
    return init(0) == 0 && dev_get(&dev, 0) == 0 && retain(&ctx, dev) == 0 &&
           set_current(ctx) == 0;
  }
};

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

const size_t kSize = 64u << 20;

TEST(GpuIpc, ChildSide) {
  const char *fd_text = getenv("EXPSEG_IPC_CHILD_FD");
  if (!fd_text)
    GTEST_SKIP() << "not a test of its own: the child half of GpuIpc.TwoProcesses, run only in "
                    "the process it starts (with $EXPSEG_IPC_CHILD_FD)";
  int sock = atoi(fd_text);
  Cu cu;
  ASSERT_TRUE(cu.load());
  expseg_allocator *a = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_create("cuda", 0, nullptr, &a)) << expseg_last_error();
  expseg_ipc_handle h = {};
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_recv(sock, &h)) << expseg_last_error();
  void *p = nullptr;
  auto t = std::chrono::steady_clock::now();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_import(a, &h, &p)) << expseg_last_error();
  std::printf("import of %zu MiB: %.3f ms\n", kSize >> 20, ms_since(t));
  expseg_ipc_handle_free(&h);
  std::vector<unsigned char> buf(kSize);
  ASSERT_EQ(0, cu.dtoh(buf.data(), (unsigned long long)(uintptr_t)p, kSize));
  for (size_t i = 0; i < kSize; i += 4096) ASSERT_EQ(buf[i], (unsigned char)(i / 4096 + 1));
  for (size_t i = 0; i < kSize; i += 4096) buf[i] = (unsigned char)(i / 4096 + 2);
  ASSERT_EQ(0, cu.htod((unsigned long long)(uintptr_t)p, buf.data(), kSize));
  // from pageable memory the copy returns before its DMA lands: wait before the unmap
  ASSERT_EQ(0, cu.stream_sync(nullptr));
  t = std::chrono::steady_clock::now();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_close(a, p));
  std::printf("close: %.3f ms\n", ms_since(t));
  expseg_testing_driver_counts left;
  expseg_testing_destroy(a, &left);
  EXPECT_EQ(left.live_chunks, 0);
  char b = 'd';
  ASSERT_EQ(1, write(sock, &b, 1));
}

TEST(GpuIpc, TwoProcesses) {
  if (getenv("EXPSEG_IPC_CHILD_FD")) GTEST_SKIP() << "in the child";
  int sv[2];
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
  // Start the child before this process touches CUDA.
  std::string fdenv = "EXPSEG_IPC_CHILD_FD=" + std::to_string(sv[1]);
  std::vector<char *> env;
  for (char **e = environ; *e; e++) env.push_back(*e);
  env.push_back(const_cast<char *>(fdenv.c_str()));
  env.push_back(nullptr);
  char arg0[] = "test_gpu_ipc", arg1[] = "--gtest_filter=GpuIpc.ChildSide";
  char *argv[] = {arg0, arg1, nullptr};
  if (!_expseg_cuda_usable(0)) {
    close(sv[0]), close(sv[1]);
    GTEST_SKIP() << "no usable CUDA device";
  }
  // the child must not hold this end: were this process to fail before sending, the child
  // would then wait forever for a message on a socket no one else can close
  ASSERT_EQ(0, fcntl(sv[0], F_SETFD, FD_CLOEXEC));
  pid_t pid = -1;
  ASSERT_EQ(0, posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, env.data()));
  close(sv[1]);
  Cu cu;
  ASSERT_TRUE(cu.load());
  expseg_allocator *a = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_create("cuda", 0, nullptr, &a)) << expseg_last_error();
  void *p = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, kSize, 0, &p));
  std::vector<unsigned char> buf(kSize);
  for (size_t i = 0; i < kSize; i += 4096) buf[i] = (unsigned char)(i / 4096 + 1);
  ASSERT_EQ(0, cu.htod((unsigned long long)(uintptr_t)p, buf.data(), kSize));
  expseg_ipc_handle h = {};
  auto t = std::chrono::steady_clock::now();
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_export(a, p, &h)) << expseg_last_error();
  std::printf("export of %zu MiB (%zu descriptors): %.3f ms\n", kSize >> 20, h.n_fds, ms_since(t));
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_send(sv[0], &h));
  expseg_ipc_handle_free(&h);
  char b = 0;
  ASSERT_EQ(1, read(sv[0], &b, 1)) << "the child failed: see its output above";
  int status = 0;
  ASSERT_EQ(pid, waitpid(pid, &status, 0));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_EQ(0, cu.dtoh(buf.data(), (unsigned long long)(uintptr_t)p, kSize));
  for (size_t i = 0; i < kSize; i += 4096) ASSERT_EQ(buf[i], (unsigned char)(i / 4096 + 2));
  size_t held = 1;
  ASSERT_EQ(EXPSEG_OK, expseg_ipc_poll(a, &held));
  EXPECT_EQ(held, 0u);
  ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
  expseg_testing_driver_counts left;
  expseg_testing_destroy(a, &left);
  EXPECT_EQ(left.live_chunks, 0);
  EXPECT_EQ(left.mapped_bytes, 0);
  close(sv[0]);
}

} // namespace
