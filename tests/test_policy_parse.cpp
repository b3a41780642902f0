// SPDX-License-Identifier: Apache-2.0
// test_policy_parse.cpp: the config parser (policy/parse.c), table-driven: every key at and
// past each bound, every error class with its message (source, position, key, value), the
// list form of roundup_power2_divisions, whitespace, the HIP aliases, duplicate keys, the
// merge over a base config, and the no-effect report.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "test_policy_common.h"

using policy_test::defaults;
using policy_test::differs;

namespace {

constexpr size_t MiB = size_t(1) << 20;
constexpr size_t kClamp = (SIZE_MAX / MiB) * MiB;  // PyTorch's clamp: 0xFFFFFFFFFFF00000
const char *kSrc = "PYTORCH_CUDA_ALLOC_CONF";

struct Parsed {
  expseg_status st;
  expseg_config_t c;
  std::string err;
};

Parsed parse(const std::string &text, const expseg_config_t *base = nullptr) {
  Parsed p;
  expseg_config_t b = base ? *base : defaults();
  char err[1024];
  memset(&p.c, 0xA5, sizeof p.c);
  p.st = _expseg_config_parse(text.c_str(), kSrc, &b, &p.c, err, sizeof err);
  p.err = err;
  return p;
}

bool all_div(const expseg_config_t &c, uint64_t v) {
  for (uint64_t d : c.roundup_power2_divisions)
    if (d != v) return false;
  return true;
}

std::vector<uint64_t> divs(const expseg_config_t &c) {
  return std::vector<uint64_t>(c.roundup_power2_divisions,
                               c.roundup_power2_divisions + EXPSEG_ROUNDUP_INTERVALS);
}

// ---- valid values: text -> predicate on the result ----

struct Ok {
  const char *text;
  std::function<bool(const expseg_config_t &)> check;
};

const Ok kOk[] = {
    {"", [](auto &c) { return differs(c, defaults()).empty() && c.given == 0; }},
    {"  \t\n ", [](auto &c) { return differs(c, defaults()).empty() && c.given == 0; }},
    {"backend:native", [](auto &c) { return c.backend == 0; }},
    // max_split_size_mb: >= 20, clamped at SIZE_MAX / 1 MiB (= unlimited)
    {"max_split_size_mb:20", [](auto &c) { return c.max_split_size == 20 * MiB; }},
    {"max_split_size_mb:021", [](auto &c) { return c.max_split_size == 21 * MiB; }},
    {"max_split_size_mb:17592186044414",
     [](auto &c) { return c.max_split_size == 17592186044414ull * MiB; }},
    {"max_split_size_mb:17592186044415", [](auto &c) { return c.max_split_size == kClamp; }},
    {"max_split_size_mb:18446744073709551615",
     [](auto &c) { return c.max_split_size == kClamp; }},
    {"max_non_split_rounding_mb:20", [](auto &c) { return c.max_non_split_rounding == 20 * MiB; }},
    {"max_non_split_rounding_mb:99999999999999999",
     [](auto &c) { return c.max_non_split_rounding == kClamp; }},
    // garbage_collection_threshold: (0, 1)
    {"garbage_collection_threshold:0.5", [](auto &c) { return c.garbage_collection_threshold == 0.5; }},
    {"garbage_collection_threshold:.25", [](auto &c) { return c.garbage_collection_threshold == 0.25; }},
    {"garbage_collection_threshold:5e-1", [](auto &c) { return c.garbage_collection_threshold == 0.5; }},
    {"garbage_collection_threshold:0.000001",
     [](auto &c) { return c.garbage_collection_threshold == 0.000001; }},
    {"garbage_collection_threshold:0.9999999",
     [](auto &c) { return c.garbage_collection_threshold == 0.9999999; }},
    {"garbage_collection_threshold:1e-300",
     [](auto &c) { return c.garbage_collection_threshold == 1e-300; }},
    // roundup_power2_divisions, single-number form: a power of two, 1 = no rounding
    {"roundup_power2_divisions:1", [](auto &c) { return all_div(c, 1); }},
    {"roundup_power2_divisions:4", [](auto &c) { return all_div(c, 4); }},
    {"roundup_power2_divisions:1073741824", [](auto &c) { return all_div(c, 1u << 30); }},
    // list form
    {"roundup_power2_divisions:[64:8,256:4,1024:4,>:1]",
     [](auto &c) {
       return divs(c) == std::vector<uint64_t>{8, 8, 8, 8, 8, 8, 8, 0, 4, 0, 4, 1, 1, 1, 1, 1};
     }},
    {"roundup_power2_divisions:[1:4]",
     [](auto &c) {
       return divs(c) == std::vector<uint64_t>{4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
     }},
    {"roundup_power2_divisions:[256:2]",  // the first entry fills every interval below it
     [](auto &c) {
       return divs(c) == std::vector<uint64_t>{2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0};
     }},
    {"roundup_power2_divisions:[32768:2]", [](auto &c) { return all_div(c, 2); }},
    {"roundup_power2_divisions:[1048576:2]", [](auto &c) { return all_div(c, 2); }},  // clamped
    {"roundup_power2_divisions:[>:4]",  // PyTorch: '>' first starts after interval 0
     [](auto &c) { return c.roundup_power2_divisions[0] == 0 && c.roundup_power2_divisions[1] == 4; }},
    {"roundup_power2_divisions:[2:4,>:8]",  // '>' starts after the last explicit entry (2.9+)
     [](auto &c) {
       return divs(c) == std::vector<uint64_t>{4, 4, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
     }},
    {"roundup_power2_divisions:[2:0,>:8]",
     [](auto &c) {
       return divs(c) == std::vector<uint64_t>{0, 0, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
     }},
    {"roundup_power2_divisions:[256:4,64:8]",  // entries apply in order
     [](auto &c) {
       return divs(c) == std::vector<uint64_t>{4, 4, 4, 4, 4, 4, 8, 4, 4, 0, 0, 0, 0, 0, 0, 0};
     }},
    {"roundup_power2_divisions:[4:2,4:16]",  // a repeated K: the last one wins
     [](auto &c) {
       return divs(c) == std::vector<uint64_t>{2, 2, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
     }},
    {"roundup_power2_divisions:[ 1 : 2 ,\t2:4 , > : 8 ]",
     [](auto &c) {
       return divs(c) == std::vector<uint64_t>{2, 4, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
     }},
    {"roundup_power2_divisions:[1:1073741824]",
     [](auto &c) { return c.roundup_power2_divisions[0] == (uint64_t(1) << 30); }},
    // booleans
    {"expandable_segments:False", [](auto &c) { return !c.expandable_segments; }},
    {"expandable_segments:True", [](auto &c) { return c.expandable_segments; }},
    // large_segment_size_mb: > 10
    {"large_segment_size_mb:11", [](auto &c) { return c.large_segment_size == 11 * MiB && c.max_non_split_rounding == 11 * MiB; }},
    {"large_segment_size_mb:1048576",
     [](auto &c) { return c.large_segment_size == 1048576 * MiB; }},
    // HIP aliases
    {"release_lock_on_cudamalloc:True", [](auto &c) { return c.release_lock_on_cudamalloc; }},
    {"release_lock_on_hipmalloc:True",
     [](auto &c) {
       return c.release_lock_on_cudamalloc &&
              c.given == (uint64_t(1) << EXPSEG_OPT_release_lock_on_cudamalloc);
     }},
    {"pinned_use_cuda_host_register:True", [](auto &c) { return c.pinned_use_cuda_host_register; }},
    {"pinned_use_hip_host_register:True", [](auto &c) { return c.pinned_use_cuda_host_register; }},
    // pinned_num_register_threads: power of two <= 128
    {"pinned_num_register_threads:1", [](auto &c) { return c.pinned_num_register_threads == 1; }},
    {"pinned_num_register_threads:8", [](auto &c) { return c.pinned_num_register_threads == 8; }},
    {"pinned_num_register_threads:128", [](auto &c) { return c.pinned_num_register_threads == 128; }},
    {"pinned_use_background_threads:True", [](auto &c) { return c.pinned_use_background_threads; }},
    {"pinned_reserve_segment_size_mb:1",
     [](auto &c) { return c.pinned_reserve_segment_size == MiB; }},
    {"graph_capture_record_stream_reuse:True",
     [](auto &c) { return c.graph_capture_record_stream_reuse; }},
    // per_process_memory_fraction: [0, 1]
    {"per_process_memory_fraction:0", [](auto &c) { return c.per_process_memory_fraction == 0.0; }},
    {"per_process_memory_fraction:1", [](auto &c) { return c.per_process_memory_fraction == 1.0; }},
    {"per_process_memory_fraction:1.0", [](auto &c) { return c.per_process_memory_fraction == 1.0; }},
    {"per_process_memory_fraction:0.75",
     [](auto &c) { return c.per_process_memory_fraction == 0.75; }},
    // expseg's own
    {"page_size_mb:0", [](auto &c) { return c.page_size == 0; }},
    {"page_size_mb:1024", [](auto &c) { return c.page_size == 1024 * MiB; }},
    {"page_cache_max_mb:0", [](auto &c) { return c.page_cache_max == 0; }},
    {"page_cache_max_mb:17592186044415", [](auto &c) { return c.page_cache_max == kClamp; }},
    {"va_reserve_mb:0", [](auto &c) { return c.va_reserve == 0; }},
    {"va_reserve_mb:65536", [](auto &c) { return c.va_reserve == 65536 * MiB; }},
    {"verbose:True", [](auto &c) { return c.verbose; }},
    {"chunk_max_mb:1", [](auto &c) { return c.chunk_max == MiB; }},
    {"chunk_max_mb:8", [](auto &c) { return c.chunk_max == 8 * MiB; }},
    {"chunk_max_mb:1024", [](auto &c) { return c.chunk_max == 1024 * MiB; }},
    // whitespace anywhere is dropped (PyTorch's tokenizer does the same)
    {" max_split_size_mb : 1 0 0 ,\texpandable_segments:\nFalse ",
     [](auto &c) { return c.max_split_size == 100 * MiB && !c.expandable_segments; }},
    // a key given twice: the last one wins (PyTorch's behaviour)
    {"max_split_size_mb:100,max_split_size_mb:200",
     [](auto &c) { return c.max_split_size == 200 * MiB; }},
    {"release_lock_on_cudamalloc:True,release_lock_on_hipmalloc:False",
     [](auto &c) { return !c.release_lock_on_cudamalloc; }},
    // PyTorch's documented example
    {"max_split_size_mb:100,max_non_split_rounding_mb:20,garbage_collection_threshold:0.5,"
     "roundup_power2_divisions:[64:8,256:4,1024:4,>:1],expandable_segments:True,"
     "pinned_use_background_threads:True",
     [](auto &c) {
       return c.max_split_size == 100 * MiB && c.garbage_collection_threshold == 0.5 &&
              c.roundup_power2_divisions[15] == 1 && c.expandable_segments &&
              c.pinned_use_background_threads && __builtin_popcountll(c.given) == 6;
     }},
};

TEST(PolicyParse, ValidValues) {
  for (const Ok &k : kOk) {
    Parsed p = parse(k.text);
    ASSERT_EQ(p.st, EXPSEG_OK) << k.text << ": " << p.err;
    EXPECT_TRUE(k.check(p.c)) << k.text;
    EXPECT_EQ(p.err, "") << k.text;
  }
}

// ---- errors: text -> substrings the message must contain ----

struct Bad {
  const char *text;
  std::vector<std::string> want;  // besides the source name, always checked
};

const Bad kBad[] = {
    // max_split_size_mb / max_non_split_rounding_mb
    {"max_split_size_mb:19", {"max_split_size_mb", "'19'", "too small", "at least 20", "position 19"}},
    {"max_split_size_mb:0", {"max_split_size_mb", "'0'"}},
    {"max_split_size_mb:12abc", {"max_split_size_mb", "'12abc'", "too small"}},  // read as 12
    {"max_split_size_mb:0x20", {"max_split_size_mb", "'0x20'", "too small"}},  // read as 0
    {"max_split_size_mb:2.5e1", {"max_split_size_mb", "'2.5e1'"}},
    {"max_split_size_mb:18446744073709551616", {"max_split_size_mb", "out of range"}},
    {"max_non_split_rounding_mb:19", {"max_non_split_rounding_mb", "'19'", "at least 20"}},
    {"max_non_split_rounding_mb:abc", {"max_non_split_rounding_mb", "'abc'"}},
    // garbage_collection_threshold
    {"garbage_collection_threshold:0", {"garbage_collection_threshold", "'0'", "(0, 1)"}},
    {"garbage_collection_threshold:0.0", {"garbage_collection_threshold", "'0.0'", "out of range"}},
    {"garbage_collection_threshold:1", {"garbage_collection_threshold", "'1'", "out of range"}},
    {"garbage_collection_threshold:1.5", {"garbage_collection_threshold", "'1.5'"}},
    {"garbage_collection_threshold:-0.5", {"garbage_collection_threshold", "'-0.5'", "out of range"}},
    {"garbage_collection_threshold:nan", {"garbage_collection_threshold", "'nan'"}},
    {"garbage_collection_threshold:inf", {"garbage_collection_threshold", "'inf'"}},
    {"garbage_collection_threshold:.", {"garbage_collection_threshold", "'.'"}},
    {"garbage_collection_threshold:1e", {"garbage_collection_threshold", "'1e'"}},
    {"garbage_collection_threshold:1e-400", {"garbage_collection_threshold", "'1e-400'"}},
    // roundup_power2_divisions
    {"roundup_power2_divisions:0", {"roundup_power2_divisions", "'0'", "1 = no rounding"}},
    {"roundup_power2_divisions:3", {"roundup_power2_divisions", "'3'", "power of two"}},
    {"roundup_power2_divisions:-4", {"roundup_power2_divisions", "'-4'", "power of two"}},
    {"roundup_power2_divisions:[3:4]", {"roundup_power2_divisions", "'3'", "power of two"}},
    {"roundup_power2_divisions:[0:4]", {"roundup_power2_divisions", "'0'", "power of two"}},
    {"roundup_power2_divisions:[2:3]", {"roundup_power2_divisions", "'3'", "power of two or 0"}},
    {"roundup_power2_divisions:[2:x]", {"roundup_power2_divisions", "'x'", "not a number"}},
    {"roundup_power2_divisions:[2:4", {"roundup_power2_divisions", "no closing ']'"}},
    {"roundup_power2_divisions:[2:4,", {"roundup_power2_divisions", "no closing ']'"}},
    {"roundup_power2_divisions:[2]", {"roundup_power2_divisions", "'2'", "no value N"}},
    {"roundup_power2_divisions:[2:]", {"roundup_power2_divisions", "']'", "not a number"}},
    {"roundup_power2_divisions:[:4]", {"roundup_power2_divisions", "']'", "not a number"}},
    {"roundup_power2_divisions:[2:4:8]", {"roundup_power2_divisions", "'8'", "no value N"}},
    {"roundup_power2_divisions:[[2:4]]", {"roundup_power2_divisions", "':'", "not a number"}},
    // booleans: exactly True / False
    {"expandable_segments:true", {"expandable_segments", "'true'", "True or False"}},
    {"expandable_segments:TRUE", {"expandable_segments", "'TRUE'"}},
    {"expandable_segments:1", {"expandable_segments", "'1'", "not a boolean"}},
    {"expandable_segments:Truee", {"expandable_segments", "'Truee'"}},
    {"release_lock_on_hipmalloc:yes", {"release_lock_on_hipmalloc", "'yes'"}},
    {"pinned_use_hip_host_register:no", {"pinned_use_hip_host_register", "'no'"}},
    {"pinned_use_background_threads:0", {"pinned_use_background_threads", "'0'"}},
    {"graph_capture_record_stream_reuse:on", {"graph_capture_record_stream_reuse", "'on'"}},
    {"verbose:false", {"verbose", "'false'"}},
    // backend
    {"backend:cudaMallocAsync", {"backend", "'cudaMallocAsync'", "native allocator only"}},
    {"backend:hipMallocAsync", {"backend", "'hipMallocAsync'", "native"}},
    {"backend:Native", {"backend", "'Native'", "native"}},
    // large_segment_size_mb
    {"large_segment_size_mb:10", {"large_segment_size_mb", "'10'", "at least 11"}},
    // pinned_*
    {"pinned_num_register_threads:0", {"pinned_num_register_threads", "'0'", "power of two"}},
    {"pinned_num_register_threads:3", {"pinned_num_register_threads", "'3'", "power of two"}},
    {"pinned_num_register_threads:256", {"pinned_num_register_threads", "'256'", "[1, 128]"}},
    {"pinned_reserve_segment_size_mb:0", {"pinned_reserve_segment_size_mb", "'0'", ">= 1"}},
    // per_process_memory_fraction
    {"per_process_memory_fraction:1.0000001", {"per_process_memory_fraction", "'1.0000001'", "[0, 1]"}},
    {"per_process_memory_fraction:2", {"per_process_memory_fraction", "'2'"}},
    // expseg's own
    {"page_size_mb:1025", {"page_size_mb", "'1025'", "[0, 1024]"}},
    {"chunk_max_mb:0", {"chunk_max_mb", "'0'", "[1, 1024]"}},
    {"chunk_max_mb:1025", {"chunk_max_mb", "'1025'", "[1, 1024]"}},
    {"chunk_max_mb:-1", {"chunk_max_mb", "'-1'", "[1, 1024]"}},
    {"chunk_max_mb:0.5", {"chunk_max_mb", "'0.5'", "[1, 1024]"}},  // read as 0
    {"chunk_max_mb:eight", {"chunk_max_mb", "'eight'", "[1, 1024]"}},
    // unknown keys
    {"max_split_size:100", {"unknown key", "'max_split_size'", "did you mean 'max_split_size_mb'"}},
    {"expandable_segment:True", {"unknown key", "'expandable_segment'", "expandable_segments"}},
    {"roundup_bypass_threshold_mb:1", {"unknown key", "'roundup_bypass_threshold_mb'", "accepted keys: backend"}},
    {"Expandable_Segments:True", {"unknown key", "'Expandable_Segments'"}},
    {"expandable_segments:True,bogus:1", {"unknown key", "'bogus'", "position 26"}},
    // missing values, trailing and doubled commas, stray separators
    {"expandable_segments", {"expandable_segments", "no value", "end of the text"}},
    {"expandable_segments:", {"expandable_segments", "no value"}},
    {"expandable_segments:,verbose:True", {"expandable_segments", "no value", "','"}},
    {"expandable_segments,verbose:True", {"expandable_segments", "'verbose'", "not a boolean"}},
    {",expandable_segments:True", {"empty option", "position 1"}},
    {"expandable_segments:True,,verbose:True", {"empty option", "position 26"}},
    {"expandable_segments:True:False", {"unknown key", "'False'", "position 26"}},
    {"expandable_segments:True verbose:True", {"expandable_segments", "'Trueverbose'"}},
    {"expandable_segments::True", {"expandable_segments", "no value", "':'"}},
    {"expandable_segments:[True]", {"expandable_segments", "no value", "'['"}},
    {":True", {"expected a key", "':'"}},
    {"]", {"expected a key", "']'"}},
    // non-printable bytes are escaped in the message
    {"expandable_segments:\x01True", {"expandable_segments", "'\\x01True'"}},
    // the position of the offending value, 1-based
    {"expandable_segments:True,max_split_size_mb:10", {"max_split_size_mb", "'10'", "position 44"}},
};

TEST(PolicyParse, ErrorsNameSourcePositionKeyValue) {
  for (const Bad &b : kBad) {
    Parsed p = parse(b.text);
    EXPECT_EQ(p.st, EXPSEG_ERR_CONFIG) << b.text;
    EXPECT_EQ(p.err.rfind(std::string(kSrc) + ": position ", 0), 0u) << b.text << " -> " << p.err;
    for (const std::string &w : b.want)
      EXPECT_NE(p.err.find(w), std::string::npos)
          << "text: " << b.text << "\nmessage: " << p.err << "\nmissing: " << w;
    EXPECT_EQ(p.err.find('\n'), std::string::npos) << "one line: " << p.err;
  }
}

TEST(PolicyParse, ErrorLeavesOutUntouched) {
  for (const Bad &b : kBad) {
    expseg_config_t base = defaults(), out;
    memset(&out, 0x5A, sizeof out);
    expseg_config_t before = out;
    char err[256];
    ASSERT_EQ(_expseg_config_parse(b.text, "API", &base, &out, err, sizeof err), EXPSEG_ERR_CONFIG);
    EXPECT_EQ(memcmp(&out, &before, sizeof out), 0) << b.text;
  }
  // also when out and base are the same object (reconfiguring in place)
  expseg_config_t c = defaults();
  c.max_split_size = 100 * MiB;
  expseg_config_t keep = c;
  char err[256];
  ASSERT_EQ(_expseg_config_parse("expandable_segments:False,max_split_size_mb:1", "API", &c, &c,
                                 err, sizeof err),
            EXPSEG_ERR_CONFIG);
  EXPECT_EQ(memcmp(&c, &keep, sizeof c), 0);
}

TEST(PolicyParse, BaseKeepsKeysNotGiven) {
  expseg_config_t base = defaults();
  char err[256];
  ASSERT_EQ(_expseg_config_parse("max_split_size_mb:100,garbage_collection_threshold:0.6,"
                                 "roundup_power2_divisions:4",
                                 "API", &base, &base, err, sizeof err),
            EXPSEG_OK);
  // Reconfigure with another key: PyTorch would reset max_split_size, the GC threshold and
  // the divisions here; expseg changes only the keys given.
  expseg_config_t out;
  ASSERT_EQ(_expseg_config_parse("expandable_segments:False", "expseg_configure", &base, &out,
                                 err, sizeof err),
            EXPSEG_OK);
  EXPECT_EQ(out.max_split_size, 100 * MiB);
  EXPECT_EQ(out.garbage_collection_threshold, 0.6);
  EXPECT_TRUE(all_div(out, 4));
  EXPECT_FALSE(out.expandable_segments);
  EXPECT_EQ(out.given, uint64_t(1) << EXPSEG_OPT_expandable_segments);
  // NULL base = defaults; NULL text = nothing given
  ASSERT_EQ(_expseg_config_parse(nullptr, "API", nullptr, &out, err, sizeof err), EXPSEG_OK);
  EXPECT_EQ(differs(out, defaults()), "");
  EXPECT_EQ(out.given, 0u);
}

TEST(PolicyParse, GivenBitsMatchKeys) {
  for (int i = 0; i < EXPSEG_OPT_COUNT; i++) {
    // every key in the table, through its key and its alias, sets exactly its own bit
    const char *names[2] = {_expseg_options[i].key, _expseg_options[i].alias};
    for (const char *n : names) {
      if (!n) continue;
      // Print the defaults, take this key's "key:value" out of the printed text.
      char buf[2048];
      expseg_config_t c = defaults();
      _expseg_config_print(&c, buf, sizeof buf);
      std::string all = buf, key = std::string(_expseg_options[i].key) + ":";
      size_t at = all.find(key);
      if (at == std::string::npos) continue;  // an "off" default that is not printed
      size_t end = all.find(',', at);
      if (all.compare(at + key.size(), 1, "[") == 0) end = all.find(']', at) + 1;
      std::string pair = std::string(n) + ":" + all.substr(at + key.size(), end - at - key.size());
      Parsed p = parse(pair);
      ASSERT_EQ(p.st, EXPSEG_OK) << pair << ": " << p.err;
      EXPECT_EQ(p.c.given, uint64_t(1) << i) << pair;
    }
  }
}

TEST(PolicyParse, SmallOrMissingErrorBuffer) {
  expseg_config_t out;
  char tiny[8];
  memset(tiny, 'x', sizeof tiny);
  EXPECT_EQ(_expseg_config_parse("bogus:1", "PYTORCH_CUDA_ALLOC_CONF", nullptr, &out, tiny, sizeof tiny),
            EXPSEG_ERR_CONFIG);
  EXPECT_EQ(strlen(tiny), sizeof tiny - 1);
  EXPECT_EQ(_expseg_config_parse("bogus:1", "API", nullptr, &out, nullptr, 0), EXPSEG_ERR_CONFIG);
  EXPECT_EQ(_expseg_config_parse("verbose:True", nullptr, nullptr, &out, nullptr, 0), EXPSEG_OK);
}

TEST(PolicyParse, LongTokens) {
  std::string longkey(500, 'k');
  Parsed p = parse(longkey + ":1");
  EXPECT_EQ(p.st, EXPSEG_ERR_CONFIG);
  EXPECT_NE(p.err.find("unknown key"), std::string::npos) << p.err;
  p = parse("max_split_size_mb:" + std::string(300, '9'));
  EXPECT_EQ(p.st, EXPSEG_ERR_CONFIG);
  EXPECT_NE(p.err.find("max_split_size_mb"), std::string::npos) << p.err;
}

TEST(PolicyParse, NoEffectReport) {
  char buf[512];
  expseg_config_t c = defaults();
  EXPECT_EQ(_expseg_config_no_effect(&c, buf, sizeof buf), 0u);
  EXPECT_STREQ(buf, "");
  Parsed p = parse("graph_capture_record_stream_reuse:True,expandable_segments:True,"
                   "release_lock_on_hipmalloc:True,max_split_size_mb:30");
  ASSERT_EQ(p.st, EXPSEG_OK) << p.err;
  size_t n = _expseg_config_no_effect(&p.c, buf, sizeof buf);
  std::string s = buf;
  EXPECT_EQ(n, s.size());
  EXPECT_NE(s.find("graph_capture_record_stream_reuse"), std::string::npos) << s;
  EXPECT_NE(s.find("release_lock_on_cudamalloc"), std::string::npos) << s;
  EXPECT_EQ(s.find("expandable_segments"), std::string::npos) << s;
  EXPECT_EQ(s.find("max_split_size_mb"), std::string::npos) << s;
  // a key without effect given at its default changes nothing: not named (so the canonical
  // form, which writes every key, parses back without the warning)
  Parsed q = parse("release_lock_on_cudamalloc:False,graph_capture_record_stream_reuse:False");
  ASSERT_EQ(q.st, EXPSEG_OK) << q.err;
  EXPECT_EQ(_expseg_config_no_effect(&q.c, buf, sizeof buf), 0u) << buf;
  char canon[4096];
  _expseg_config_print(&p.c, canon, sizeof canon);
  Parsed r = parse(canon);
  ASSERT_EQ(r.st, EXPSEG_OK) << r.err;
  // every option marked "no effect" in the table is named when given, and only those
  // (given with its default value it is not named)
  for (int i = 0; i < EXPSEG_OPT_COUNT; i++) {
    expseg_config_t d = defaults();
    d.given = uint64_t(1) << i;
    _expseg_config_no_effect(&d, buf, sizeof buf);
    EXPECT_STREQ(buf, "") << _expseg_options[i].key;
  }
}

TEST(PolicyParse, OptionInfoMatchesTable) {
  for (int i = 0; i < EXPSEG_OPT_COUNT; i++) {
    EXPECT_STREQ(_expseg_options[i].key, policy_test::kRows[i].key);
    EXPECT_TRUE(_expseg_options[i].help && *_expseg_options[i].help);
    EXPECT_EQ(_expseg_options[i].pytorch, policy_test::kRows[i].pytorch != 0);
  }
  static_assert(EXPSEG_OPT_COUNT <= 64, "given is a 64-bit mask");
  expseg_config_t c = defaults();
  EXPECT_TRUE(c.expandable_segments);  // expseg's default (PyTorch: False)
  EXPECT_EQ(c.max_split_size, SIZE_MAX);
  EXPECT_EQ(c.max_non_split_rounding, 20 * MiB);
  EXPECT_EQ(c.large_segment_size, 20 * MiB);
  EXPECT_EQ(c.per_process_memory_fraction, 1.0);
  EXPECT_EQ(c.pinned_num_register_threads, 1u);
  EXPECT_TRUE(all_div(c, 0));
}

}  // namespace
