// SPDX-License-Identifier: Apache-2.0
// Driver spec parsing (_expseg_vmm_open) and error.c: messages, sizes, status names, sink.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <string.h>

#include <string>
#include <thread>
#include <vector>

#include "vmm_support.h"
#include "error.h"

namespace {

struct Good {
  const char *spec;
  const char *backend;
  size_t granularity;
  size_t capacity; // 0 = do not check
};

TEST(VmmSpec, GoodSpecs) {
  const Good good[] = {
      {"host", "host", 2u << 20, 0},
      {"sim", "sim", 2u << 20, 80ull << 30},
      {"sim:capacity=8G", "sim", 2u << 20, 8ull << 30},
      {"sim:capacity=1T,granularity=512K,va=1T", "sim", 512u << 10, 1ull << 40},
      {"sim:granularity=4k,capacity=3m", "sim", 4096, 3u << 20},
      {"sim:capacity=12345", "sim", 2u << 20, 12345},
      {"host:capacity=1G,granularity=64K", "host", 64u << 10, 1u << 30},
      {"host:numa=0", "host", 2u << 20, 0},
  };
  for (const Good &c : good) {
    expseg_vmm_t *v = nullptr;
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_open(c.spec, 0, &v)) << c.spec << ": " << expseg_last_error();
    EXPECT_STREQ(c.backend, v->ops->name) << c.spec;
    EXPECT_EQ(c.granularity, v->granularity) << c.spec;
    size_t fr = 0, tot = 0;
    _expseg_vmm_mem_info(v, &fr, &tot);
    if (c.capacity) {
      EXPECT_EQ(c.capacity, tot) << c.spec;
    } else {
      EXPECT_GT(tot, 0u);
      EXPECT_LE(tot, 8ull << 30); // host default: 8G or half of physical memory
    }
    EXPECT_EQ(tot, fr);
    _expseg_vmm_close(v);
  }
}

struct Bad {
  const char *spec;
  const char *needle1; // the bad part
  const char *needle2; // what is accepted
};

TEST(VmmSpec, BadSpecsNameTheBadPart) {
  const Bad bad[] = {
      {"gpu", "unknown driver 'gpu'", "cuda, host, sim"},
      {"", "unknown driver ''", "cuda, host, sim"},
      {"Host", "unknown driver 'Host'", "accepted"},
      {"sim:cap=1G", "unknown option 'cap'", "capacity=SIZE, granularity=SIZE, va=SIZE"},
      {"host:va=1T", "unknown option 'va'", "numa=N"},
      {"sim:capacity=8X", "bad value '8X' for 'capacity'", "K, M, G or T"},
      {"sim:capacity=8GB", "bad value '8GB'", "suffix"},
      {"sim:capacity=G", "bad value 'G'", "integer"},
      {"sim:capacity=-1", "bad value '-1'", "integer"},
      {"sim:capacity=99999999999999999999", "bad value '99999999999999999999'", "integer"},
      {"sim:capacity=17179869184T", "bad value", "integer"}, // overflows 64 bits
      {"sim:capacity", "option 'capacity' has no value", "capacity=SIZE"},
      {"sim:capacity=", "option 'capacity' has no value", "capacity=SIZE"},
      {"sim:capacity=1G,capacity=2G", "option 'capacity' is given twice", "'sim:capacity"},
      {"sim:capacity=1G,", "empty option at offset 16", "trailing"},
      {"sim:,capacity=1G", "empty option at offset 4", "comma"},
      {"sim:capacity=1G,,va=1T", "empty option", "comma"},
      {"sim:", "empty option list", "capacity=SIZE"},
      {"cuda:device=1", "unknown option 'device' for the cuda driver", "numa=N"},
      {"cuda:numa=4096", "numa=4096", "NUMA node"},
      {"host:numa=x", "bad value 'x' for 'numa'", "non-negative integer"},
      {"host:numa=4096", "numa=4096", "NUMA node"},
      {"host:granularity=3M", "granularity=3145728", "power of two"},
      {"host:granularity=1K", "granularity=1024", "OS page"},
      {"sim:granularity=2G", "granularity=2147483648", "4K to 1G"},
      {"sim:capacity=0", "capacity=0", "SIZE > 0"},
      {"host:capacity=0", "capacity=0", "SIZE > 0"},
      {"sim:va=1K", "va=1024", "from the granularity"},
      {"sim:va=8192T", "va=", "4096T"},
      {"sim:top_down=2", "top_down=2", "0 or 1"},
  };
  for (const Bad &c : bad) {
    expseg_vmm_t *v = reinterpret_cast<expseg_vmm_t *>(0x1);
    EXPECT_EQ(EXPSEG_ERR_CONFIG, _expseg_vmm_open(c.spec, 0, &v)) << c.spec;
    EXPECT_EQ(nullptr, v) << c.spec;
    const char *m = expseg_last_error();
    EXPECT_NE(nullptr, strstr(m, c.needle1)) << c.spec << " -> " << m;
    EXPECT_NE(nullptr, strstr(m, c.needle2)) << c.spec << " -> " << m;
    EXPECT_NE(nullptr, strstr(m, "driver spec '")) << c.spec << " -> " << m;
  }
}

// sim's reserve hands out ascending addresses by default, descending with top_down=1 (how
// cudaMalloc's addresses come on Linux; the replay's PyTorch model uses it).
TEST(VmmSpec, SimTopDownReservesDescend) {
  for (int top = 0; top <= 1; top++) {
    expseg_vmm_t *v = nullptr;
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_open(top ? "sim:top_down=1" : "sim:top_down=0", 0, &v))
        << expseg_last_error();
    uintptr_t a = 0, b = 0, c = 0;
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_reserve(v, 4u << 20, 0, &a));
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_reserve(v, 4u << 20, 0, &b));
    EXPECT_EQ(top ? a - (4u << 20) : a + (4u << 20), b) << "top_down=" << top;
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_unreserve(v, a, 4u << 20));
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_reserve(v, 2u << 20, 0, &c)); // reuses a's range
    EXPECT_EQ(top ? a + (2u << 20) : a, c) << "top_down=" << top;
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_unreserve(v, b, 4u << 20));
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_unreserve(v, c, 2u << 20));
    _expseg_vmm_close(v);
  }
}

TEST(VmmSpec, NullSpecUsesEnvironmentThenDefault) {
  const char *old = getenv("EXPSEG_DRIVER");
  std::string saved = old ? old : "";
  expseg_vmm_t *v = nullptr;
  setenv("EXPSEG_DRIVER", "sim:capacity=3G", 1);
  ASSERT_EQ(EXPSEG_OK, _expseg_vmm_open(nullptr, 0, &v)) << expseg_last_error();
  EXPECT_STREQ("sim", v->ops->name);
  size_t fr, tot;
  _expseg_vmm_mem_info(v, &fr, &tot);
  EXPECT_EQ(3ull << 30, tot);
  _expseg_vmm_close(v);
  setenv("EXPSEG_DRIVER", "sim:capacty=3G", 1);
  EXPECT_EQ(EXPSEG_ERR_CONFIG, _expseg_vmm_open(nullptr, 0, &v));
  EXPECT_EQ(0, strncmp(expseg_last_error(), "$EXPSEG_DRIVER: ", 16)) << expseg_last_error();
  EXPECT_NE(nullptr, strstr(expseg_last_error(), "'capacty'")) << expseg_last_error();
  unsetenv("EXPSEG_DRIVER");
  if (_expseg_cuda_usable(0)) {
    ASSERT_EQ(EXPSEG_OK, _expseg_vmm_open(nullptr, 0, &v)) << expseg_last_error();
    EXPECT_STREQ("cuda", v->ops->name);
    _expseg_vmm_close(v);
  } else { // no silent fallback to host memory
    EXPECT_EQ(EXPSEG_ERR_UNSUPPORTED, _expseg_vmm_open(nullptr, 0, &v));
    EXPECT_EQ(nullptr, v);
    EXPECT_NE(nullptr, strstr(expseg_last_error(), "EXPSEG_DRIVER=host")) << expseg_last_error();
  }
  if (old) setenv("EXPSEG_DRIVER", saved.c_str(), 1);
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, _expseg_vmm_open("sim", -1, &v));
  EXPECT_EQ(EXPSEG_ERR_INVALID_ARGUMENT, _expseg_vmm_open("sim", 0, nullptr));
}

TEST(VmmSpec, CudaWithoutDeviceIsUnsupported) {
  if (_expseg_cuda_usable(0)) GTEST_SKIP() << "a CUDA device is usable here";
  expseg_vmm_t *v = nullptr;
  EXPECT_EQ(EXPSEG_ERR_UNSUPPORTED, _expseg_vmm_open("cuda", 0, &v));
  EXPECT_EQ(nullptr, v);
  EXPECT_STRNE("", expseg_last_error());
}

TEST(VmmSpec, CallNames) {
  EXPECT_STREQ("reserve", _expseg_vmm_call_name(EXPSEG_VMM_CALL_reserve));
  EXPECT_STREQ("set_access", _expseg_vmm_call_name(EXPSEG_VMM_CALL_set_access));
  EXPECT_STREQ("import_fd", _expseg_vmm_call_name(EXPSEG_VMM_CALL_import_fd));
  EXPECT_STREQ("unknown", _expseg_vmm_call_name(EXPSEG_VMM_CALL_COUNT));
}

// ---- error.c ----

TEST(VmmError, FormatSizeUsesTheLargestUnitWithAValueOfAtLeastOne) {
  const struct {
    uint64_t bytes;
    const char *text;
  } t[] = {
      {0, "0 bytes"},
      {512, "512 bytes"},
      {1023, "1023 bytes"},
      {1024, "1.00 KiB"},
      {1536, "1.50 KiB"},
      {1048575, "1024.00 KiB"}, /* 1023.999 KiB rounds up in the last digit */
      {1048576, "1.00 MiB"},
      {20ull << 20, "20.00 MiB"},
      {1ull << 30, "1.00 GiB"},
      {80ull << 30, "80.00 GiB"},
      {1ull << 40, "1.00 TiB"},
      {5ull << 50, "5.00 PiB"},
      {1ull << 60, "1.00 EiB"},
      {UINT64_MAX, "16.00 EiB"},
  };
  for (auto &c : t) {
    char buf[32];
    EXPECT_STREQ(c.text, _expseg_format_size(buf, c.bytes)) << c.bytes;
  }
}

TEST(VmmError, StatusNames) {
  EXPECT_STREQ("EXPSEG_OK", expseg_status_name(EXPSEG_OK));
  EXPECT_STREQ("EXPSEG_ERR_OUT_OF_MEMORY", expseg_status_name(EXPSEG_ERR_OUT_OF_MEMORY));
  EXPECT_STREQ("EXPSEG_ERR_INVALID_ARGUMENT", expseg_status_name(EXPSEG_ERR_INVALID_ARGUMENT));
  EXPECT_STREQ("EXPSEG_ERR_CONFIG", expseg_status_name(EXPSEG_ERR_CONFIG));
  EXPECT_STREQ("EXPSEG_ERR_DRIVER", expseg_status_name(EXPSEG_ERR_DRIVER));
  EXPECT_STREQ("EXPSEG_ERR_UNSUPPORTED", expseg_status_name(EXPSEG_ERR_UNSUPPORTED));
  EXPECT_STREQ("EXPSEG_UNKNOWN_STATUS", expseg_status_name(static_cast<expseg_status>(42)));
}

TEST(VmmError, MessagesArePerThreadPrefixedAndCut) {
  EXPECT_EQ(EXPSEG_ERR_DRIVER, _expseg_error_set(EXPSEG_ERR_DRIVER, "x=%d", 5));
  EXPECT_STREQ("x=5", expseg_last_error());
  _expseg_error_prefix("call(%s)", "a");
  EXPECT_STREQ("call(a): x=5", expseg_last_error());
  std::thread([] {
    EXPECT_STREQ("", expseg_last_error());
    _expseg_error_set(EXPSEG_ERR_CONFIG, "other thread");
  }).join();
  EXPECT_STREQ("call(a): x=5", expseg_last_error());
  std::string big(5000, 'y');
  _expseg_error_set(EXPSEG_ERR_CONFIG, "%s", big.c_str());
  size_t n = strlen(expseg_last_error());
  EXPECT_EQ(1023u, n);
  EXPECT_STREQ("...", expseg_last_error() + n - 3);
  _expseg_error_prefix("p");
  EXPECT_EQ(1023u, strlen(expseg_last_error()));
  _expseg_error_clear();
  EXPECT_STREQ("", expseg_last_error());
}

TEST(VmmError, WarningsGoToTheSink) {
  std::vector<std::string> lines;
  expseg_set_log_sink(
      [](void *ctx, const char *line) {
        static_cast<std::vector<std::string> *>(ctx)->push_back(line);
      },
      &lines);
  _expseg_warn("hello %d", 7);
  expseg_set_log_sink(nullptr, nullptr);
  ASSERT_EQ(1u, lines.size());
  EXPECT_EQ("expseg: hello 7", lines[0]);
  testing::internal::CaptureStderr();
  _expseg_warn("to stderr");
  EXPECT_EQ("expseg: to stderr\n", testing::internal::GetCapturedStderr());
}

} // namespace
