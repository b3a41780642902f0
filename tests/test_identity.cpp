// SPDX-License-Identifier: Apache-2.0
// Identity calls (pools/info.c) and the default driver choice (vmm/vmm.c): expseg_version,
// expseg_get_info, expseg_driver_name, expseg_mem_get_info on host and sim, and
// expseg_create(NULL, ...) failing with a message instead of falling back to host memory.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <string.h>

#include <string>

#include "expseg.h"
#include "vmm.h"

namespace {

// Sets or unsets $EXPSEG_DRIVER for one test, restoring it after.
struct DriverEnv {
  std::string saved;
  bool had;
  explicit DriverEnv(const char *value) {
    const char *old = getenv("EXPSEG_DRIVER");
    had = old != nullptr;
    if (had) saved = old;
    if (value) setenv("EXPSEG_DRIVER", value, 1);
    else unsetenv("EXPSEG_DRIVER");
  }
  ~DriverEnv() {
    if (had) setenv("EXPSEG_DRIVER", saved.c_str(), 1);
    else unsetenv("EXPSEG_DRIVER");
  }
};

TEST(Identity, VersionMatchesTheHeader) {
  std::string want = std::to_string(EXPSEG_VERSION_MAJOR) + "." +
                     std::to_string(EXPSEG_VERSION_MINOR) + "." +
                     std::to_string(EXPSEG_VERSION_PATCH);
  EXPECT_EQ(want, expseg_version());
  EXPECT_EQ(EXPSEG_VERSION_MAJOR * 10000 + EXPSEG_VERSION_MINOR * 100 + EXPSEG_VERSION_PATCH,
            EXPSEG_VERSION_NUMBER);
}

struct Case {
  const char *spec;
  const char *driver;
  int device;
  size_t total, granularity;
  const char *config;
  size_t page;
};

TEST(Identity, InfoAndMemGetInfoOnHostAndSim) {
  const Case cases[] = {
      {"host:capacity=64M,granularity=64K", "host", 0, 64u << 20, 64u << 10, "", 2u << 20},
      {"sim:capacity=3G", "sim", 3, 3ull << 30, 2u << 20, "page_size_mb:0", 2u << 20},
      {"sim:capacity=1G,granularity=512K", "sim", 1, 1u << 30, 512u << 10, "page_size_mb:0",
       512u << 10},
      {"sim:capacity=1G,granularity=512K", "sim", 0, 1u << 30, 512u << 10, "page_size_mb:4",
       4u << 20},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.spec);
    expseg_allocator *a = nullptr;
    ASSERT_EQ(EXPSEG_OK, expseg_create(c.spec, c.device, c.config, &a)) << expseg_last_error();
    expseg_info info;
    memset(&info, 0xff, sizeof info);
    ASSERT_EQ(EXPSEG_OK, expseg_get_info(a, &info));
    EXPECT_STREQ(c.driver, info.driver);
    EXPECT_STREQ(c.driver, expseg_driver_name(a));
    EXPECT_EQ(c.device, info.device);
    EXPECT_EQ(c.total, info.total_memory);
    EXPECT_EQ(c.granularity, info.granularity);
    EXPECT_EQ(c.page, info.page_size);

    size_t fr = 0, tot = 0;
    ASSERT_EQ(EXPSEG_OK, expseg_mem_get_info(a, &fr, &tot));
    EXPECT_EQ(c.total, tot);
    EXPECT_EQ(c.total, fr) << "nothing is held yet";
    // What the allocator maps is gone from free; the cache counts as used, as in CUDA.
    void *p = nullptr;
    ASSERT_EQ(EXPSEG_OK, expseg_malloc(a, 5u << 20, 0, &p)) << expseg_last_error();
    int64_t reserved = 0;
    ASSERT_EQ(EXPSEG_OK, expseg_stat(a, "reserved_bytes.all.current", &reserved));
    ASSERT_GT(reserved, 0);
    ASSERT_EQ(EXPSEG_OK, expseg_mem_get_info(a, &fr, nullptr));
    EXPECT_EQ(c.total - (size_t)reserved, fr);
    ASSERT_EQ(EXPSEG_OK, expseg_free(a, p));
    ASSERT_EQ(EXPSEG_OK, expseg_mem_get_info(a, &fr, &tot));
    EXPECT_EQ(c.total - (size_t)reserved, fr) << "a freed block stays cached";
    ASSERT_EQ(EXPSEG_OK, expseg_empty_cache(a));
    ASSERT_EQ(EXPSEG_OK, expseg_mem_get_info(a, nullptr, &tot));
    ASSERT_EQ(EXPSEG_OK, expseg_mem_get_info(a, &fr, nullptr));
    EXPECT_EQ(c.total, fr) << "empty_cache gave everything back";
    expseg_destroy(a);
  }
}

TEST(Identity, NullArgumentsAreRefused) {
  expseg_info info;
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_get_info(nullptr, &info));
  EXPECT_NE(nullptr, strstr(expseg_last_error(), "expseg_get_info")) << expseg_last_error();
  size_t fr;
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_mem_get_info(nullptr, &fr, nullptr));
  EXPECT_STREQ("", expseg_driver_name(nullptr));
  expseg_allocator *a = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_create("sim", 0, "", &a)) << expseg_last_error();
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, expseg_get_info(a, nullptr));
  EXPECT_EQ(EXPSEG_OK, expseg_mem_get_info(a, nullptr, nullptr));
  expseg_destroy(a);
}

TEST(Identity, EnvironmentNamesTheDriver) {
  DriverEnv env("sim:capacity=2G");
  expseg_allocator *a = nullptr;
  ASSERT_EQ(EXPSEG_OK, expseg_create(nullptr, 2, "", &a)) << expseg_last_error();
  expseg_info info;
  ASSERT_EQ(EXPSEG_OK, expseg_get_info(a, &info));
  EXPECT_STREQ("sim", info.driver);
  EXPECT_EQ(2, info.device);
  EXPECT_EQ(2ull << 30, info.total_memory);
  expseg_destroy(a);
}

// The acceptance test: on a machine with no usable GPU and $EXPSEG_DRIVER unset,
// expseg_create(NULL, ...) fails (never host memory in disguise) and says why and what to do.
TEST(Identity, NoDriverNamedAndNoGpuFailsWithTheReason) {
  DriverEnv env(nullptr);
  expseg_allocator *a = reinterpret_cast<expseg_allocator *>(0x1);
  expseg_status st = expseg_create(nullptr, 0, "", &a);
  if (_expseg_cuda_usable(0)) {
    ASSERT_EQ(EXPSEG_OK, st) << expseg_last_error();
    EXPECT_STREQ("cuda", expseg_driver_name(a));
    expseg_destroy(a);
    GTEST_SKIP() << "a CUDA device is usable here: the default is cuda, as checked";
  }
  EXPECT_EQ(EXPSEG_ERR_UNSUPPORTED, st);
  EXPECT_EQ(nullptr, a);
  std::string m = expseg_last_error();
  std::printf("message: %s\n", m.c_str());
  // why: the cuda driver's own reason (no libcuda, no device, no VMM, or built without CUDA)
  EXPECT_NE(std::string::npos, m.find("cuda driver")) << m;
  EXPECT_TRUE(m.find("libcuda.so.1") != std::string::npos ||
              m.find("cuInit") != std::string::npos ||
              m.find("does not exist") != std::string::npos ||
              m.find("virtual memory management") != std::string::npos ||
              m.find("without CUDA support") != std::string::npos)
      << m;
  // how to choose on purpose
  EXPECT_NE(std::string::npos, m.find("EXPSEG_DRIVER=host")) << m;
  EXPECT_NE(std::string::npos, m.find("\"sim\"")) << m;
  // the allocator keeps working: naming a driver succeeds
  ASSERT_EQ(EXPSEG_OK, expseg_create("host:capacity=16M", 0, "", &a)) << expseg_last_error();
  EXPECT_STREQ("host", expseg_driver_name(a));
  expseg_destroy(a);
}

} // namespace
