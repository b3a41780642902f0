// SPDX-License-Identifier: Apache-2.0
// test_policy_pytorch.cpp: parity with PyTorch main (2026). A table of option strings, each
// with PyTorch's verdict and the values its parse gives, written beside it from reading
// c10/core/AllocatorConfig.cpp and c10/cuda/CUDAAllocatorConfig.cpp (see docs/config.md):
// expseg must give the same verdict and values, warn exactly where PyTorch's reading is an
// accident of its parser, and name the position and what is accepted in every refusal. Then
// round_size: an independent model of PyTorch's rule, written from its code, against expseg
// on edge and seeded random sizes under settings whose division arrays are written out.
#include <gtest/gtest.h>

#include "test_seed.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "test_policy_common.h"

using policy_test::defaults;

namespace {

constexpr size_t MiB = size_t(1) << 20;
constexpr uint64_t kClamp = 0xFFFFFFFFFFF00000ull;  // PyTorch: (SIZE_MAX / 1 MiB) MiB

enum Verdict { ACC, WARN, REF };  // accepted clean; accepted, expseg warns; refused

struct Case {
  const char *text;
  Verdict v;
  // ACC / WARN: the values PyTorch's parse gives, "field=value" separated by spaces:
  //   msplit nsplit large pres pround pcached page cache va: bytes ("20M", "clamp", "max" = SIZE_MAX)
  //   gc frac res: decimals (res "40G" = GiB); exp lock host bg graph throw catch verbose: T/F
  //   thr: integer; div: "*N" (all intervals) or 16 integers "a,b,..."; cls: the classes
  // REF: substrings the message must hold (besides the position and "accepted").
  const char *values;
};

const Case kCases[] = {
    // ---- accepted, clean ----
    {"", ACC, ""},
    {"expandable_segments:True", ACC, "exp=T"},
    {"expandable_segments:False", ACC, "exp=F"},
    {"max_split_size_mb:20", ACC, "msplit=20M"},
    {"max_split_size_mb:020", ACC, "msplit=20M"},
    {"max_split_size_mb:100", ACC, "msplit=100M"},
    {"max_split_size_mb:17592186044415", ACC, "msplit=clamp"},
    {"max_split_size_mb:17592186044416", ACC, "msplit=clamp"},  // >= 2^44: clamped
    {"max_split_size_mb:18446744073709551615", ACC, "msplit=clamp"},
    {"max_non_split_rounding_mb:20", ACC, "nsplit=20M"},
    {"max_non_split_rounding_mb:99999999999999999", ACC, "nsplit=clamp"},
    {"garbage_collection_threshold:0.6", ACC, "gc=0.6"},
    {"garbage_collection_threshold:.25", ACC, "gc=0.25"},
    {"garbage_collection_threshold:5e-1", ACC, "gc=0.5"},
    {"garbage_collection_threshold:1e-300", ACC, "gc=1e-300"},
    {"roundup_power2_divisions:4", ACC, "div=*4"},
    {"roundup_power2_divisions:1", ACC, "div=*1"},
    {"roundup_power2_divisions:1073741824", ACC, "div=*1073741824"},
    {"roundup_power2_divisions:2147483648", ACC, "div=*2147483648"},  // above 2^30: stoull
    {"roundup_power2_divisions:9223372036854775808", ACC, "div=*9223372036854775808"},
    {"roundup_power2_divisions:[64:8,256:4,1024:4,>:1]", ACC, "div=8,8,8,8,8,8,8,0,4,0,4,1,1,1,1,1"},
    {"roundup_power2_divisions:[256:2]", ACC, "div=2,2,2,2,2,2,2,2,2,0,0,0,0,0,0,0"},
    {"roundup_power2_divisions:[1:4]", ACC, "div=4,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0"},
    {"roundup_power2_divisions:[2:4,>:8]", ACC, "div=4,4,8,8,8,8,8,8,8,8,8,8,8,8,8,8"},
    {"roundup_power2_divisions:[1048576:2]", ACC, "div=*2"},  // K clamped to interval 15
    {"roundup_power2_divisions:[4:2,4:16]", ACC, "div=2,2,16,0,0,0,0,0,0,0,0,0,0,0,0,0"},
    {"roundup_power2_divisions:[256:4,64:8]", ACC, "div=4,4,4,4,4,4,8,4,4,0,0,0,0,0,0,0"},
    {"roundup_power2_divisions:[64:8,>:4,128:2]", ACC, "div=8,8,8,8,8,8,8,2,4,4,4,4,4,4,4,4"},
    {"roundup_power2_divisions:[2:0,>:0]", ACC, "div=*0"},
    // a repeated roundup_power2_divisions key merges with the earlier one
    {"roundup_power2_divisions:4,roundup_power2_divisions:[64:8]", ACC,
     "div=8,8,8,8,8,8,8,4,4,4,4,4,4,4,4,4"},
    {"roundup_power2_divisions:[64:8],roundup_power2_divisions:[1024:2]", ACC,
     "div=2,2,2,2,2,2,2,2,2,2,2,0,0,0,0,0"},
    {"roundup_power2_divisions:[2:4,>:8],roundup_power2_divisions:[1:2]", ACC,
     "div=2,4,8,8,8,8,8,8,8,8,8,8,8,8,8,8"},
    // large_segment_size_mb: > 10, no upper bound, read first, bounds max_split/max_non_split
    {"large_segment_size_mb:11", ACC, "large=11M nsplit=11M"},
    {"large_segment_size_mb:40", ACC, "large=40M nsplit=40M"},
    {"large_segment_size_mb:12,max_split_size_mb:15", ACC, "large=12M msplit=15M nsplit=12M"},
    {"max_split_size_mb:15,large_segment_size_mb:12", ACC, "large=12M msplit=15M nsplit=12M"},
    {"max_non_split_rounding_mb:50,large_segment_size_mb:30", ACC, "large=30M nsplit=50M"},
    {"large_segment_size_mb:12,max_non_split_rounding_mb:12", ACC, "large=12M nsplit=12M"},
    {"large_segment_size_mb:1048577", ACC, "large=1048577M nsplit=1048577M"},
    {"large_segment_size_mb:17592186044416", ACC, "large=clamp nsplit=clamp"},
    {"large_segment_size_mb:20,large_segment_size_mb:11,max_split_size_mb:11", ACC,
     "large=11M msplit=11M"},
    {"expandable_segments:True,large_segment_size_mb:12", ACC, "exp=T large=12M nsplit=12M"},
    {"expandable_segments:True,large_segment_size_mb:12,graph_capture_record_stream_reuse:True",
     ACC, "exp=T large=12M graph=T"},
    // CUDA keys
    {"backend:native", ACC, ""},
    {"release_lock_on_cudamalloc:True", ACC, "lock=T"},
    {"release_lock_on_hipmalloc:True", ACC, "lock=T"},
    {"pinned_use_cuda_host_register:True", ACC, "host=T"},
    {"pinned_use_hip_host_register:True", ACC, "host=T"},
    {"pinned_num_register_threads:8", ACC, "thr=8"},
    {"pinned_num_register_threads:128", ACC, "thr=128"},
    {"pinned_use_background_threads:True", ACC, "bg=T"},
    {"pinned_reserve_segment_size_mb:1", ACC, "pres=1M"},
    // PyTorch 2.13 (generic parser, c10/core/AllocatorConfig.cpp): integer MB, 0 accepted
    {"pinned_max_round_threshold_mb:64", ACC, "pround=64M pcached=max"},
    {"pinned_max_round_threshold_mb:0", ACC, "pround=0M"},
    {"pinned_max_cached_size_mb:0", ACC, "pcached=0M pround=max"},
    {"pinned_max_cached_size_mb:1024", ACC, "pcached=1024M"},
    {"pinned_max_round_threshold_mb:1,pinned_max_cached_size_mb:1", ACC, "pround=1M pcached=1M"},
    {"expandable_segments:True,pinned_max_round_threshold_mb:128", ACC, "exp=T pround=128M"},
    {"pinned_max_cached_size_mb:64,pinned_max_cached_size_mb:32", ACC, "pcached=32M"},
    {"pinned_max_cached_size_mb:-1", WARN, "pcached=clamp"},
    {"graph_capture_record_stream_reuse:True", ACC, "graph=T"},
    {"per_process_memory_fraction:0", ACC, "frac=0"},
    {"per_process_memory_fraction:1", ACC, "frac=1"},
    {"per_process_memory_fraction:0.75", ACC, "frac=0.75"},
    {"per_process_memory_fraction:0.4,throw_on_cudamalloc_oom:True", ACC, "frac=0.4 throw=T"},
    {"throw_on_cudamalloc_oom:False", ACC, "throw=F"},
    {"pinned_free_catch_all:True", ACC, "catch=T"},
    {"expandable_segments_reserve:0.5", ACC, "res=0.5"},
    {"expandable_segments_reserve:40G", ACC, "res=40G"},
    {"expandable_segments_reserve:2.5g", ACC, "res=2.5G"},
    {"expandable_segments_reserve:1.5", ACC, "res=1.5"},
    {"expandable_segments_reserve_by_class:[tiny:0.05]", ACC, "cls=tiny:0.05"},
    {"expandable_segments_reserve_by_class:[a:0.25,b:8G]", ACC, "cls=a:0.25,b:8G"},
    {"expandable_segments_reserve_by_class:[]", ACC, "cls="},
    {"expandable_segments:True,expandable_segments_reserve_by_class:[tiny:0.05]", ACC,
     "exp=T cls=tiny:0.05"},
    // whitespace dropped; the last of a repeated key wins; PyTorch's documented example
    {" max_split_size_mb : 1 0 0 ,\texpandable_segments:\nFalse ", ACC, "msplit=100M exp=F"},
    {"max_split_size_mb:100,max_split_size_mb:200", ACC, "msplit=200M"},
    {"release_lock_on_cudamalloc:True,release_lock_on_hipmalloc:False", ACC, "lock=F"},
    {"max_split_size_mb:100,max_non_split_rounding_mb:20,garbage_collection_threshold:0.5,"
     "roundup_power2_divisions:[64:8,256:4,1024:4,>:1],expandable_segments:True,"
     "pinned_use_background_threads:True",
     ACC, "msplit=100M nsplit=20M gc=0.5 div=8,8,8,8,8,8,8,0,4,0,4,1,1,1,1,1 exp=T bg=T"},
    // expseg's own keys (PyTorch refuses them: unknown keys)
    {"page_size_mb:0,page_cache_max_mb:0,va_reserve_mb:65536,verbose:True", ACC,
     "page=0M cache=0M va=65536M verbose=T"},
    {"chunk_max_mb:8", ACC, "chunk=8M"},

    // ---- accepted by PyTorch through an accident of its parser: expseg warns ----
    {"expandable_segments:True,", WARN, "exp=T"},  // PyTorch's own tests expect this to work
    {"expandable_segments:True , ", WARN, "exp=T"},
    {"expandable_segments:True:max_split_size_mb:100", WARN, "exp=T msplit=100M"},
    {"expandable_segments:True]verbose:True", WARN, "exp=T verbose=T"},
    {"max_split_size_mb,100", WARN, "msplit=100M"},
    {"max_split_size_mb[100", WARN, "msplit=100M"},
    {"max_split_size_mb:100]", WARN, "msplit=100M"},
    {"max_split_size_mb:+100", WARN, "msplit=100M"},
    {"max_split_size_mb:100abc", WARN, "msplit=100M"},
    {"max_split_size_mb:100.9", WARN, "msplit=100M"},
    {"max_split_size_mb:-1", WARN, "msplit=clamp"},  // wraps to 2^64 - 1, clamped
    {"max_non_split_rounding_mb:25MB", WARN, "nsplit=25M"},
    {"large_segment_size_mb:+12", WARN, "large=12M nsplit=12M"},
    {"garbage_collection_threshold:0x1p-1", WARN, "gc=0.5"},
    {"garbage_collection_threshold:0.5abc", WARN, "gc=0.5"},
    {"garbage_collection_threshold:+0.5", WARN, "gc=0.5"},
    {"garbage_collection_threshold:1e-1x", WARN, "gc=0.1"},
    {"per_process_memory_fraction:-0", WARN, "frac=0"},
    {"per_process_memory_fraction:0x1p-2", WARN, "frac=0.25"},
    {"per_process_memory_fraction:1.0e0junk", WARN, "frac=1"},
    {"roundup_power2_divisions:[>:8]", WARN, "div=0,8,8,8,8,8,8,8,8,8,8,8,8,8,8,8"},
    {"roundup_power2_divisions:[>:8,>:4]", WARN, "div=0,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4"},
    {"roundup_power2_divisions:[>:4,2:8]", WARN, "div=8,8,4,4,4,4,4,4,4,4,4,4,4,4,4,4"},
    {"roundup_power2_divisions:[]", WARN, "div=*0"},
    {"roundup_power2_divisions:[2:4,]", WARN, "div=4,4,0,0,0,0,0,0,0,0,0,0,0,0,0,0"},
    {"roundup_power2_divisions:[256,4]", WARN, "div=4,4,4,4,4,4,4,4,4,0,0,0,0,0,0,0"},
    {"roundup_power2_divisions:[2:4:8:2]", WARN, "div=4,4,0,2,0,0,0,0,0,0,0,0,0,0,0,0"},
    {"roundup_power2_divisions:[2:4]x", WARN, "div=4,4,0,0,0,0,0,0,0,0,0,0,0,0,0,0"},
    {"roundup_power2_divisions:[+2:4]", WARN, "div=4,4,0,0,0,0,0,0,0,0,0,0,0,0,0,0"},
    {"roundup_power2_divisions:+4", WARN, "div=*4"},
    {"roundup_power2_divisions:4x", WARN, "div=*4"},
    {"pinned_num_register_threads:+8", WARN, "thr=8"},
    {"pinned_reserve_segment_size_mb:-1", WARN, "pres=clamp"},
    {"page_cache_max_mb:-1", WARN, "cache=clamp"},
    {"va_reserve_mb:1G", WARN, "va=1M"},
    // a bad reserve value is ignored by PyTorch (a warning, the previous value stays)
    {"expandable_segments_reserve:abc", WARN, "res=0"},
    {"expandable_segments_reserve:-0.5", WARN, "res=0"},
    {"expandable_segments_reserve:0x1", WARN, "res=0"},
    {"expandable_segments_reserve:0.5,expandable_segments_reserve:junk", WARN, "res=0.5"},
    {"expandable_segments_reserve_by_class:[a:0.5,]", WARN, "cls=a:0.5"},
    {"expandable_segments_reserve_by_class:[a:bad,b:1G]", WARN, "cls=b:1G"},

    // ---- refused by PyTorch (and by expseg) ----
    {"expandable_segments:true", REF, "expandable_segments 'true' True or False"},
    {"expandable_segments:1", REF, "'1' not a boolean"},
    {"expandable_segments", REF, "no value end of the text"},
    {"expandable_segments:", REF, "no value"},
    {"expandable_segments:[True]", REF, "no value '['"},
    {"expandable_segments:True verbose:True", REF, "'Trueverbose'"},
    {"expandable_segments:True:False", REF, "unknown key 'False'"},
    {",expandable_segments:True", REF, "empty option"},
    {"expandable_segments:True,,verbose:True", REF, "empty option"},
    {":True", REF, "expected a key"},
    {"]", REF, "expected a key"},
    {"bogus:1", REF, "unknown key 'bogus' verbose"},
    {"expandable_segments:True,bogus:1", REF, "unknown key 'bogus' position 26"},
    {"max_split_size:100", REF, "did you mean 'max_split_size_mb'"},
    {"Expandable_Segments:True", REF, "unknown key"},
    {"roundup_bypass_threshold_mb:1", REF, "unknown key"},
    {"max_split_size_mb:19", REF, "'19' too small at least 20"},
    {"max_split_size_mb:abc", REF, "'abc' not a number"},
    {"max_split_size_mb:[100]", REF, "max_split_size_mb no value"},
    {"max_split_size_mb:18446744073709551616", REF, "out of range"},
    {"max_split_size_mb:-18446744073709551615", REF, "too small"},  // wraps to 1
    {"max_split_size_mb:1e3", REF, "too small"},                    // read as 1
    {"max_non_split_rounding_mb:19", REF, "max_non_split_rounding_mb too small"},
    {"large_segment_size_mb:10", REF, "large_segment_size_mb '10' too small"},
    {"large_segment_size_mb:40,max_split_size_mb:20", REF, "max_split_size_mb '20' at least 40"},
    {"max_split_size_mb:20,large_segment_size_mb:40", REF, "max_split_size_mb '20' at least 40"},
    {"large_segment_size_mb:40,max_non_split_rounding_mb:30", REF, "max_non_split_rounding_mb '30'"},
    {"large_segment_size_mb", REF, "large_segment_size_mb no value"},
    {"garbage_collection_threshold:0", REF, "out of range (0, 1)"},
    {"garbage_collection_threshold:1", REF, "out of range"},
    {"garbage_collection_threshold:nan", REF, "'nan'"},
    {"garbage_collection_threshold:inf", REF, "'inf'"},
    {"garbage_collection_threshold:-0.5", REF, "out of range"},
    {"garbage_collection_threshold:1e-400", REF, "out of range"},
    {"garbage_collection_threshold:1e-310", REF, "out of range"},  // subnormal: ERANGE
    {"garbage_collection_threshold:.", REF, "not a number"},
    {"roundup_power2_divisions:0", REF, "'0'"},
    {"roundup_power2_divisions:3", REF, "power of two"},
    {"roundup_power2_divisions:-4", REF, "power of two"},
    {"roundup_power2_divisions:[3:4]", REF, "'3' power of two"},
    {"roundup_power2_divisions:[0:4]", REF, "'0' power of two"},
    {"roundup_power2_divisions:[2:3]", REF, "'3' power of two or 0"},
    {"roundup_power2_divisions:[2:x]", REF, "'x' not a number"},
    {"roundup_power2_divisions:[2:4", REF, "no closing ']'"},
    {"roundup_power2_divisions:[2]", REF, "'2'"},
    {"roundup_power2_divisions:[2:]", REF, "not a number"},
    {"roundup_power2_divisions:[[2:4]]", REF, "not a number"},
    {"roundup_power2_divisions:[2]4]", REF, "expected a key"},  // the CUDA parser's walk
    {"backend:Native", REF, "'Native' native"},
    {"backend:hipMallocAsync", REF, "'hipMallocAsync'"},  // a CUDA build refuses it too
    {"pinned_num_register_threads:0", REF, "power of two"},
    {"pinned_num_register_threads:3", REF, "power of two"},
    {"pinned_num_register_threads:256", REF, "[1, 128]"},
    {"pinned_num_register_threads:-8", REF, "power of two"},
    {"pinned_reserve_segment_size_mb:0", REF, "too small"},
    {"pinned_max_round_threshold_mb:abc", REF, "pinned_max_round_threshold_mb 'abc'"},
    {"pinned_max_cached_size_mb:True", REF, "pinned_max_cached_size_mb 'True'"},
    {"pinned_max_cached_size_mb", REF, "pinned_max_cached_size_mb no value"},
    {"per_process_memory_fraction:1.0000001", REF, "[0, 1]"},
    {"per_process_memory_fraction:2", REF, "out of range"},
    {"per_process_memory_fraction:-0.1", REF, "out of range"},
    {"throw_on_cudamalloc_oom:true", REF, "throw_on_cudamalloc_oom 'true'"},
    {"pinned_free_catch_all:1", REF, "pinned_free_catch_all '1'"},
    {"expandable_segments_reserve", REF, "expandable_segments_reserve no value"},
    {"expandable_segments_reserve_by_class:[a:0.5", REF, "no closing ']'"},
    {"expandable_segments_reserve_by_class", REF, "no value"},
    // named by one revision of PyTorch's reserve tests only; not in main's key list
    // (CUDAAllocatorConfig::getKeys): an unknown key there, and here
    {"expandable_segments_min_reserve:32G", REF, "unknown key 'expandable_segments_min_reserve'"},
    {"expandable_segments:True,expandable_segments_min_reserve:0.1", REF, "unknown key"},
    // other allocators' keys PyTorch's CUDA parser does not know
    {"pin_memory_expandable_segments:True", REF, "unknown key 'pin_memory_expandable_segments'"},
};

struct Parsed {
  expseg_status st;
  expseg_config_t c;
  std::string err, warn;
};

Parsed parse(const char *text, const expseg_config_t *base = nullptr) {
  Parsed p;
  char err[EXPSEG_CONFIG_MSG_MAX], warn[EXPSEG_CONFIG_MSG_MAX];
  memset(&p.c, 0xA5, sizeof p.c);
  p.st = _expseg_config_parse_warn(text, "PYTORCH_CUDA_ALLOC_CONF", base, &p.c, err, sizeof err,
                                   warn, sizeof warn);
  p.err = err;
  p.warn = warn;
  return p;
}

uint64_t bytes_of(const std::string &v) {
  if (v == "clamp") return kClamp;
  if (v == "max") return SIZE_MAX;
  EXPECT_EQ(v.back(), 'M') << v;
  return strtoull(v.c_str(), nullptr, 10) * MiB;
}

// Checks the "field=value ..." description against c; returns "" or what differs.
std::string check_values(const expseg_config_t &c, const std::string &spec) {
  std::istringstream in(spec);
  std::string item;
  std::ostringstream bad;
  while (in >> item) {
    size_t eq = item.find('=');
    std::string f = item.substr(0, eq), v = item.substr(eq + 1);
    auto flag = [&](bool got) {
      if (got != (v == "T")) bad << f << " is " << got << "; ";
    };
    auto size = [&](size_t got) {
      if (got != bytes_of(v)) bad << f << " is " << got << "; ";
    };
    auto dbl = [&](double got) {
      if (got != strtod(v.c_str(), nullptr)) bad << f << " is " << got << "; ";
    };
    if (f == "msplit") size(c.max_split_size);
    else if (f == "nsplit") size(c.max_non_split_rounding);
    else if (f == "large") size(c.large_segment_size);
    else if (f == "pres") size(c.pinned_reserve_segment_size);
    else if (f == "pround") size(c.pinned_max_round_threshold);
    else if (f == "pcached") size(c.pinned_max_cached_size);
    else if (f == "page") size(c.page_size);
    else if (f == "cache") size(c.page_cache_max);
    else if (f == "va") size(c.va_reserve);
    else if (f == "chunk") size(c.chunk_max);
    else if (f == "gc") dbl(c.garbage_collection_threshold);
    else if (f == "frac") {
      dbl(c.per_process_memory_fraction);
      if (std::signbit(c.per_process_memory_fraction)) bad << "frac is -0; ";
    } else if (f == "res") {
      bool gib = v.back() == 'G';
      dbl(c.expandable_segments_reserve);
      if (c.expandable_segments_reserve_gib != gib) bad << "res unit; ";
    } else if (f == "exp") flag(c.expandable_segments);
    else if (f == "lock") flag(c.release_lock_on_cudamalloc);
    else if (f == "host") flag(c.pinned_use_cuda_host_register);
    else if (f == "bg") flag(c.pinned_use_background_threads);
    else if (f == "graph") flag(c.graph_capture_record_stream_reuse);
    else if (f == "throw") flag(c.throw_on_cudamalloc_oom);
    else if (f == "catch") flag(c.pinned_free_catch_all);
    else if (f == "verbose") flag(c.verbose);
    else if (f == "thr") {
      if (c.pinned_num_register_threads != strtoull(v.c_str(), nullptr, 10)) bad << "thr; ";
    } else if (f == "cls") {
      if (v != c.expandable_segments_reserve_by_class)
        bad << "cls is '" << c.expandable_segments_reserve_by_class << "'; ";
    } else if (f == "div") {
      std::vector<uint64_t> want;
      if (v[0] == '*') {
        want.assign(EXPSEG_ROUNDUP_INTERVALS, strtoull(v.c_str() + 1, nullptr, 10));
      } else {
        std::istringstream d(v);
        std::string x;
        while (std::getline(d, x, ',')) want.push_back(strtoull(x.c_str(), nullptr, 10));
      }
      EXPECT_EQ(want.size(), (size_t)EXPSEG_ROUNDUP_INTERVALS) << spec;
      for (int i = 0; i < EXPSEG_ROUNDUP_INTERVALS && i < (int)want.size(); i++)
        if (c.roundup_power2_divisions[i] != want[i])
          bad << "div[" << i << "] is " << c.roundup_power2_divisions[i] << "; ";
    } else {
      bad << "unknown field " << f << "; ";
    }
  }
  return bad.str();
}

TEST(PolicyPyTorch, TableOfVerdictsAndValues) {
  EXPECT_GE(sizeof kCases / sizeof kCases[0], 100u);
  for (const Case &k : kCases) {
    Parsed p = parse(k.text);
    if (k.v == REF) {
      EXPECT_EQ(p.st, EXPSEG_ERR_CONFIG) << "PyTorch refuses: " << k.text;
      if (p.st != EXPSEG_ERR_CONFIG) continue;
      EXPECT_EQ(p.err.rfind("PYTORCH_CUDA_ALLOC_CONF: position ", 0), 0u) << p.err;
      EXPECT_NE(p.err.find("accepted"), std::string::npos) << "what is accepted: " << p.err;
      EXPECT_EQ(p.err.find('\n'), std::string::npos) << p.err;
      EXPECT_LT(p.err.size(), (size_t)EXPSEG_CONFIG_MSG_MAX - 1) << "cut: " << p.err;
      std::string w;
      // words of the description, each in the message ("at least 40" etc. kept as one)
      std::string spec = k.values;
      for (const char *phrase : {"no value", "not a number", "too small", "at least 20",
                                 "at least 40", "out of range", "power of two or 0",
                                 "power of two", "unknown key", "no closing ']'",
                                 "expected a key", "empty option", "did you mean",
                                 "end of the text", "not a boolean", "True or False"}) {
        size_t at = spec.find(phrase);
        if (at == std::string::npos) continue;
        EXPECT_NE(p.err.find(phrase), std::string::npos) << k.text << "\n" << p.err;
        spec.erase(at, strlen(phrase));
      }
      std::istringstream rest(spec);
      while (rest >> w) EXPECT_NE(p.err.find(w), std::string::npos) << k.text << ": " << w << "\n" << p.err;
      continue;
    }
    ASSERT_EQ(p.st, EXPSEG_OK) << "PyTorch accepts: " << k.text << "\n" << p.err;
    EXPECT_EQ(check_values(p.c, k.values), "") << k.text;
    if (k.v == ACC) {
      EXPECT_EQ(p.warn, "") << k.text;
      continue;
    }
    // one warning line: the source, a position, and the clean form, which parses to the
    // same configuration without a warning
    EXPECT_EQ(p.warn.rfind("PYTORCH_CUDA_ALLOC_CONF: accepted as PyTorch's parser reads it", 0), 0u)
        << k.text << "\n" << p.warn;
    EXPECT_NE(p.warn.find("position "), std::string::npos) << p.warn;
    EXPECT_EQ(p.warn.find('\n'), std::string::npos) << p.warn;
    size_t at = p.warn.find("write it as ");
    ASSERT_NE(at, std::string::npos) << p.warn;
    size_t end = p.warn.find(" (", at);
    std::string clean = p.warn.substr(at + 12, end - at - 12);
    if (clean == "\"\"") clean = ""; // nothing to write: the key is left out
    Parsed q = parse(clean.c_str());
    ASSERT_EQ(q.st, EXPSEG_OK) << clean << ": " << q.err;
    EXPECT_EQ(q.warn, "") << clean;
    EXPECT_EQ(policy_test::differs(p.c, q.c), "") << k.text << " -> " << clean;
  }
}

TEST(PolicyPyTorch, CudaMallocAsyncIsADocumentedDifference) {
  // PyTorch accepts backend:cudaMallocAsync when it was loaded with that backend; expseg is the
  // native allocator and says so (docs/config.md, differences)
  Parsed p = parse("backend:cudaMallocAsync");
  ASSERT_EQ(p.st, EXPSEG_ERR_CONFIG);
  EXPECT_NE(p.err.find("native caching allocator only"), std::string::npos) << p.err;
}

TEST(PolicyPyTorch, UnknownKeyMessageIsComplete) {
  // the message names every key, the last one included, whatever the key and the source
  std::string junk(300, 'z');
  junk[5] = '\x01';
  for (const std::string &key : {std::string("bogus"), std::string("expandable_segment"), junk}) {
    expseg_config_t out;
    char err[EXPSEG_CONFIG_MSG_MAX];
    std::string text = key + ":1";
    ASSERT_EQ(_expseg_config_parse(text.c_str(), "PYTORCH_CUDA_ALLOC_CONF", nullptr, &out, err,
                                   sizeof err),
              EXPSEG_ERR_CONFIG);
    std::string m = err;
    EXPECT_LT(m.size(), sizeof err - 1) << "cut: " << m;
    for (int i = 0; i < EXPSEG_OPT_COUNT; i++) {
      EXPECT_NE(m.find(_expseg_options[i].key), std::string::npos) << _expseg_options[i].key;
      if (_expseg_options[i].alias) {
        EXPECT_NE(m.find(_expseg_options[i].alias), std::string::npos);
      }
    }
    EXPECT_NE(m.find("verbose"), std::string::npos);
    EXPECT_EQ(m.substr(m.size() - strlen(_expseg_options[EXPSEG_OPT_COUNT - 1].key)),
              _expseg_options[EXPSEG_OPT_COUNT - 1].key)
        << "ends with the last key: " << m;
  }
  // through expseg_create: the whole message reaches expseg_last_error()
  expseg_allocator *a = nullptr;
  std::string text = junk + ":1";
  ASSERT_EQ(expseg_create("sim", 0, text.c_str(), &a), EXPSEG_ERR_CONFIG);
  std::string m = expseg_last_error();
  EXPECT_NE(m.find("page_size_mb, page_cache_max_mb, va_reserve_mb, verbose"), std::string::npos)
      << m;
  const char *last = _expseg_options[EXPSEG_OPT_COUNT - 1].key;
  EXPECT_EQ(m.substr(m.size() - strlen(last)), last) << "not cut: " << m;
}

// an integer key's value is read as PyTorch reads integers (its leading digits, with a
// warning), expseg's own keys too: chunk_max_mb:1.5 is 1 MB, and the warning says so
TEST(PolicyPyTorch, ChunkMaxReadsItsLeadingDigits) {
  Parsed p = parse("chunk_max_mb:1.5");
  ASSERT_EQ(p.st, EXPSEG_OK) << p.err;
  EXPECT_EQ(p.c.chunk_max, size_t(1) << 20);
  EXPECT_NE(p.warn.find("chunk_max_mb value '1.5' read as 1"), std::string::npos) << p.warn;
}

TEST(PolicyPyTorch, WarningNamesValueTaken) {
  Parsed p = parse("max_split_size_mb:-1,garbage_collection_threshold:0x1p-1,expandable_segments:True,");
  ASSERT_EQ(p.st, EXPSEG_OK) << p.err;
  EXPECT_NE(p.warn.find("'-1' read as 17592186044415"), std::string::npos) << p.warn;
  EXPECT_NE(p.warn.find("wraps"), std::string::npos) << p.warn;
  EXPECT_NE(p.warn.find("'0x1p-1' read as 0.5"), std::string::npos) << p.warn;
  EXPECT_NE(p.warn.find("trailing ','"), std::string::npos) << p.warn;
  EXPECT_NE(p.warn.find("write it as max_split_size_mb:17592186044415,"
                        "garbage_collection_threshold:0.5,expandable_segments:True"),
            std::string::npos)
      << p.warn;
  // the plain parse entry point takes the same values and says nothing
  expseg_config_t c;
  char err[256];
  ASSERT_EQ(_expseg_config_parse("max_split_size_mb:-1", "t", nullptr, &c, err, sizeof err), EXPSEG_OK);
  EXPECT_EQ(c.max_split_size, kClamp);
}

TEST(PolicyPyTorch, LargeSegmentOverBase) {
  // large_segment_size_mb stays from an earlier parse (PyTorch does not reset it), so it bounds
  // max_split_size_mb in a later one
  expseg_config_t base = defaults();
  Parsed p = parse("large_segment_size_mb:64", &base);
  ASSERT_EQ(p.st, EXPSEG_OK);
  EXPECT_EQ(p.c.max_non_split_rounding, 64 * MiB);
  Parsed q = parse("max_split_size_mb:32", &p.c);
  EXPECT_EQ(q.st, EXPSEG_ERR_CONFIG) << q.err;
  EXPECT_NE(q.err.find("at least 64"), std::string::npos) << q.err;
  Parsed r = parse("max_split_size_mb:64", &p.c);
  EXPECT_EQ(r.st, EXPSEG_OK) << r.err;
}

// ---- through the allocator: the warning reaches the log sink once; the statistic ----

std::vector<std::string> g_lines;
void sink(void *, const char *line) { g_lines.push_back(line); }

TEST(PolicyPyTorch, WarningGoesToTheLogSinkOnce) {
  expseg_set_log_sink(sink, nullptr);
  g_lines.clear();
  expseg_allocator *a = nullptr;
  ASSERT_EQ(expseg_create("sim", 0, "expandable_segments:True:max_split_size_mb:100abc,", &a),
            EXPSEG_OK)
      << expseg_last_error();
  size_t n = 0;
  for (const std::string &l : g_lines)
    if (l.find("accepted as PyTorch's parser reads it") != std::string::npos) {
      n++;
      EXPECT_NE(l.find("write it as max_split_size_mb:100,expandable_segments:True"),
                std::string::npos)
          << l;
      EXPECT_NE(l.find("'100abc' read as 100"), std::string::npos) << l;
    }
  EXPECT_EQ(n, 1u);
  char buf[2048];
  expseg_config_string(a, buf, sizeof buf);
  EXPECT_NE(std::string(buf).find("max_split_size_mb:100,"), std::string::npos) << buf;
  // expseg_configure warns the same way; a clean text says nothing
  g_lines.clear();
  ASSERT_EQ(expseg_configure(a, "garbage_collection_threshold:+0.5"), EXPSEG_OK);
  ASSERT_EQ(g_lines.size(), 1u);
  EXPECT_NE(g_lines[0].find("expseg_configure: accepted as PyTorch"), std::string::npos);
  g_lines.clear();
  ASSERT_EQ(expseg_configure(a, "garbage_collection_threshold:0.5"), EXPSEG_OK);
  EXPECT_TRUE(g_lines.empty());
  expseg_destroy(a);
  expseg_set_log_sink(nullptr, nullptr);
}

TEST(PolicyPyTorch, MaxSplitSizeStatisticAsPyTorchReportsIt) {
  struct {
    const char *text;
    int64_t stat;
  } cases[] = {{"", -1},  // SIZE_MAX
               {"max_split_size_mb:100", 100 * 1048576},
               {"max_split_size_mb:17592186044416", -1048576},  // 0xFFFFFFFFFFF00000
               {"max_split_size_mb:-1", -1048576}};
  expseg_set_log_sink(sink, nullptr);
  for (auto &k : cases) {
    expseg_allocator *a = nullptr;
    ASSERT_EQ(expseg_create("sim", 0, k.text, &a), EXPSEG_OK) << expseg_last_error();
    int64_t v = 0;
    ASSERT_EQ(expseg_stat(a, "max_split_size", &v), EXPSEG_OK);
    EXPECT_EQ(v, k.stat) << k.text;
    expseg_destroy(a);
  }
  expseg_set_log_sink(nullptr, nullptr);
}

// ---- round_size ----

// PyTorch's round_size, written from CUDACachingAllocator.cpp (round_size,
// roundup_power2_next_division) and AllocatorConfig.cpp (roundup_power2_divisions(size)),
// over a division array given explicitly.
uint64_t pytorch_round(const uint64_t div_by_interval[16], uint64_t size) {
  const uint64_t kMinBlockSize = 512;
  if (size < kMinBlockSize) return kMinBlockSize;
  uint64_t log_size = 63 - (uint64_t)__builtin_clzll(size);
  uint64_t index = log_size > 20 ? log_size - 20 : 0;  // intervals start at 1 MB
  if (index > 15) index = 15;
  uint64_t divisions = div_by_interval[index];
  if (divisions > 1 && size > kMinBlockSize * divisions) {  // size_t product, wraps
    if ((size & (size - 1)) == 0) return size;
    uint64_t power2_floor = uint64_t(1) << log_size;
    uint64_t step = power2_floor >> (63 - __builtin_clzll(divisions));
    if (step == 0) return power2_floor << 1;
    uint64_t floor = size & ~(step - 1);
    return floor == size ? size : floor + step;
  }
  return kMinBlockSize * ((size + kMinBlockSize - 1) / kMinBlockSize);
}

struct Setting {
  const char *text;
  uint64_t div[16];  // what PyTorch's parse of text gives
};

const Setting kSettings[] = {
    {"", {0}},
    {"roundup_power2_divisions:1", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
    {"roundup_power2_divisions:4", {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}},
    {"roundup_power2_divisions:16", {16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16, 16}},
    {"roundup_power2_divisions:[>:8]", {0, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8}},
    {"roundup_power2_divisions:[64:8,256:4,1024:4,>:1]",
     {8, 8, 8, 8, 8, 8, 8, 0, 4, 0, 4, 1, 1, 1, 1, 1}},
    {"roundup_power2_divisions:[1:2,2:4,4:8,8:16,>:32]",
     {2, 4, 8, 16, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32, 32}},
    {"roundup_power2_divisions:[256,4]", {4, 4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0}},
    {"roundup_power2_divisions:[>:4,2:8]", {8, 8, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}},
    {"roundup_power2_divisions:2147483648",
     {1ull << 31, 1ull << 31, 1ull << 31, 1ull << 31, 1ull << 31, 1ull << 31, 1ull << 31,
      1ull << 31, 1ull << 31, 1ull << 31, 1ull << 31, 1ull << 31, 1ull << 31, 1ull << 31,
      1ull << 31, 1ull << 31}},
    {"roundup_power2_divisions:[1:1024,>:9223372036854775808]",
     {1024, 1ull << 63, 1ull << 63, 1ull << 63, 1ull << 63, 1ull << 63, 1ull << 63, 1ull << 63,
      1ull << 63, 1ull << 63, 1ull << 63, 1ull << 63, 1ull << 63, 1ull << 63, 1ull << 63,
      1ull << 63}},
    {"roundup_power2_divisions:[2:0,64:2,32768:64]", {0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 64}},
};

TEST(PolicyPyTorch, RoundSizeMatchesPyTorch) {
  EXPSEG_SEEDED(seed, 0x5eed12);
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> sizes;
  for (uint64_t p = 0; p < 60; p++)
    for (int64_t d : {-513, -512, -511, -1, 0, 1, 511, 512, 513})
      if ((int64_t)(uint64_t(1) << p) + d > 0) sizes.push_back((uint64_t(1) << p) + d);
  for (uint64_t s : {1200ull, 8193ull, 9000ull, 1288490188ull, (1ull << 60) - 1, (1ull << 60) - 512})
    sizes.push_back(s);
  for (int i = 0; i < 1000; i++) sizes.push_back((rng() >> (4 + rng() % 60)) + 1);
  ASSERT_GE(sizes.size(), 500u);
  size_t compared = 0;
  for (const Setting &s : kSettings) {
    expseg_config_t c;
    char err[256];
    ASSERT_EQ(_expseg_config_parse(s.text, "t", nullptr, &c, err, sizeof err), EXPSEG_OK) << err;
    for (int i = 0; i < 16; i++) ASSERT_EQ(c.roundup_power2_divisions[i], s.div[i]) << s.text << " " << i;
    for (uint64_t size : sizes) {
      if (size >= (uint64_t(1) << 60)) continue;
      ASSERT_EQ(_expseg_round_size(&c, size), pytorch_round(s.div, size))
          << s.text << " size " << size;
      compared++;
    }
  }
  EXPECT_GE(compared, 500u * 10);
  // the example: [>:8] leaves sizes below 2 MiB unrounded in PyTorch
  expseg_config_t c;
  char err[256];
  ASSERT_EQ(_expseg_config_parse("roundup_power2_divisions:[>:8]", "t", nullptr, &c, err, sizeof err),
            EXPSEG_OK);
  EXPECT_EQ(_expseg_round_size(&c, 8193), 8704u);
  // and 2^60 and more are refused (0), as PyTorch refuses them before rounding
  EXPECT_EQ(_expseg_round_size(&c, size_t(1) << 60), 0u);
  EXPECT_EQ(_expseg_round_size(&c, SIZE_MAX), 0u);
}

}  // namespace
