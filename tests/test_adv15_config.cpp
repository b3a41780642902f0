// SPDX-License-Identifier: Apache-2.0
// test_adv15_config.cpp: option strings against an independent model of PyTorch's two
// parsers. The model below is written from reading c10/core/AllocatorConfig.h
// (ConfigTokenizer, b42fb116), c10/core/AllocatorConfig.cpp (the generic parser, 0ac71663)
// and c10/cuda/CUDAAllocatorConfig.cpp (the CUDA parser, b944315b), and reads numbers with
// the very functions PyTorch calls (std::stoull, std::stod, in the C locale the test runs
// in). Seeded random texts, built from well-formed pairs and then damaged (separators
// swapped, dropped or doubled, whitespace inserted), must get PyTorch's verdict (accepted or
// refused) and, when accepted, PyTorch's values. A table of hand-picked strings follows, each
// with the PyTorch line that decides it.
#include <gtest/gtest.h>

#include "test_seed.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <locale>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_policy_common.h"

namespace {

constexpr uint64_t MiB = 1ull << 20;

// ---- the model of PyTorch's parse (only the keys whose parsers the stored sources hold) ----

struct Refused {};

struct Model {
  uint64_t msplit = SIZE_MAX, nsplit = 20 * MiB, pres = 0, thr = 1, large = 20 * MiB;
  double gc = 0, frac = 1;
  uint64_t div[EXPSEG_ROUNDUP_INTERVALS] = {};
  bool exp = true;  // expseg's documented default; every other default is PyTorch's
  bool bg = false, lock = false, host = false, graph = false, thr_oom = false, catch_all = false;
  double reserve = 0;  // expandable_segments_reserve: 0 = not set
  bool reserve_gib = false;
};

// CUDAAllocatorConfig::parseReserveSpec (PyTorch main): a trailing G/g means GiB; the rest
// read by an istringstream in the classic locale, wholly, finite and above 0, else ignored.
bool reserve_spec(const std::string &token, double *value, bool *gib) {
  *gib = !token.empty() && (token.back() == 'G' || token.back() == 'g');
  std::string num = *gib ? token.substr(0, token.size() - 1) : token;
  std::istringstream iss(num);
  iss.imbue(std::locale::classic());
  *value = 0;
  iss >> *value;
  return !num.empty() && !iss.fail() && iss.eof() && std::isfinite(*value) && *value > 0;
}

struct Tokens {
  std::vector<std::string> t;
  explicit Tokens(const std::string &s) {  // ConfigTokenizer's constructor
    std::string buf;
    for (char ch : s) {
      if (ch == ',' || ch == ':' || ch == '[' || ch == ']') {
        if (!buf.empty()) t.push_back(buf), buf.clear();
        t.push_back(std::string(1, ch));
      } else if (!std::isspace((unsigned char)ch)) {
        buf += ch;
      }
    }
    if (!buf.empty()) t.push_back(buf);
  }
  // operator[] and checkIndex: TORCH_INTERNAL_ASSERT(i < size)
  const std::string &at(size_t i) const {
    if (i >= t.size()) throw Refused();
    return t[i];
  }
  size_t size() const { return t.size(); }
  uint64_t size_t_at(size_t i) const {  // toSizeT: std::stoull, exceptions refuse
    try {
      return std::stoull(at(i));
    } catch (const std::logic_error &) {
      throw Refused();
    }
  }
  double double_at(size_t i) const {  // toDouble: std::stod
    try {
      return std::stod(at(i));
    } catch (const std::logic_error &) {
      throw Refused();
    }
  }
  bool bool_at(size_t i) const {  // toBool: exactly True or False
    if (at(i) == "True") return true;
    if (at(i) == "False") return false;
    throw Refused();
  }
  size_t skip_key(size_t i) const {  // skipKey: ':' unchecked, a list runs to its first ']'
    at(++i);
    ++i;
    if (at(i) != "[") return i;
    while (++i < size() && t[i] != "]") {
    }
    if (i >= size()) throw Refused();
    return i;
  }
};

bool pow2(uint64_t v) { return v && !(v & (v - 1)); }

void check(bool ok) {
  if (!ok) throw Refused();
}

bool generic_key(const std::string &k) {  // AcceleratorAllocatorConfig::getKeys
  for (const char *g : {"large_segment_size_mb", "max_split_size_mb", "max_non_split_rounding_mb",
                        "garbage_collection_threshold", "roundup_power2_divisions",
                        "expandable_segments", "pinned_use_background_threads"})
    if (k == g) return true;
  return false;
}

bool cuda_key(const std::string &k) {  // CUDAAllocatorConfig::getKeys (PyTorch main)
  for (const char *g : {"backend", "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
                        "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
                        "pinned_num_register_threads", "pinned_reserve_segment_size_mb",
                        "graph_capture_record_stream_reuse", "per_process_memory_fraction",
                        "throw_on_cudamalloc_oom", "pinned_free_catch_all",
                        "expandable_segments_reserve", "expandable_segments_reserve_by_class"})
    if (k == g) return true;
  return false;
}

// AcceleratorAllocatorConfig::parseRoundUpPower2Divisions
size_t model_divisions(const Tokens &tk, size_t i, Model &m) {
  tk.at(++i);  // checkToken(':'), result unread
  bool first = true;
  if (tk.at(++i) == "[") {
    size_t last = 0;
    while (++i < tk.size() && tk.t[i] != "]") {
      size_t key_at = i;
      tk.at(++i);
      uint64_t v = tk.size_t_at(++i);
      check(v == 0 || pow2(v));
      if (tk.t[key_at] == ">") {
        for (size_t k = last + 1; k < EXPSEG_ROUNDUP_INTERVALS; k++) m.div[k] = v;
      } else {
        uint64_t b = tk.size_t_at(key_at);
        check(pow2(b));
        size_t idx = 63 - __builtin_clzll(b);
        if (idx > EXPSEG_ROUNDUP_INTERVALS - 1) idx = EXPSEG_ROUNDUP_INTERVALS - 1;
        if (first) {
          for (size_t k = 0; k < idx; k++) m.div[k] = v;
          first = false;
        }
        m.div[idx] = v;
        last = idx;
      }
      if (tk.at(i + 1) != "]") tk.at(++i);
    }
    check(i < tk.size());
  } else {
    uint64_t v = tk.size_t_at(i);
    check(pow2(v));
    for (auto &d : m.div) d = v;
  }
  return i;
}

uint64_t mb_clamped(uint64_t v) { return (v < SIZE_MAX / MiB ? v : SIZE_MAX / MiB) * MiB; }

void model_generic(const Tokens &tk, Model &m) {  // AcceleratorAllocatorConfig::parseArgs
  // main's copy: every large_segment_size_mb first, wherever it stands (> 10 MB, clamped);
  // max_non_split_rounding then starts at it, and both split bounds are at least it
  for (size_t i = 0; i < tk.size(); ++i) {
    if (tk.at(i) != "large_segment_size_mb") continue;
    tk.at(++i);
    uint64_t v = tk.size_t_at(++i);
    check(v > 10);
    m.large = mb_clamped(v);
  }
  m.nsplit = m.large;
  for (size_t i = 0; i < tk.size(); i++) {
    const std::string &k = tk.at(i);
    if (k == "large_segment_size_mb") {
      i = tk.skip_key(i);
    } else if (k == "max_split_size_mb" || k == "max_non_split_rounding_mb") {
      tk.at(++i);
      uint64_t v = tk.size_t_at(++i);
      check(v >= m.large / MiB);
      (k == "max_split_size_mb" ? m.msplit : m.nsplit) = mb_clamped(v);
    } else if (k == "garbage_collection_threshold") {
      tk.at(++i);
      double v = tk.double_at(++i);
      check(v > 0 && v < 1.0);
      m.gc = v;
    } else if (k == "roundup_power2_divisions") {
      i = model_divisions(tk, i, m);
    } else if (k == "expandable_segments") {
      tk.at(++i);
      m.exp = tk.bool_at(++i);
    } else if (k == "pinned_use_background_threads") {
      tk.at(++i);
      m.bg = tk.bool_at(++i);
    } else {
      // PyTorch 2.9 and later (main's copy): with a device parser registered, the generic
      // parser too refuses a key that is in no parser's list ("Unrecognized key ... in
      // Accelerator allocator config"); 0ac71663 skipped it
      check(generic_key(k) || cuda_key(k));
      i = tk.skip_key(i);
    }
    if (i + 1 < tk.size()) ++i;  // checkToken(','), result unread
  }
}

void model_cuda(const Tokens &tk, Model &m) {  // CUDAAllocatorConfig::parseArgs
  for (size_t i = 0; i < tk.size(); i++) {
    const std::string &k = tk.at(i);
    if (k == "backend") {
      tk.at(++i);
      check(tk.at(++i) == "native");  // cudaMallocAsync: expseg's documented refusal
    } else if (k == "release_lock_on_cudamalloc" || k == "release_lock_on_hipmalloc") {
      tk.at(++i);
      m.lock = tk.bool_at(++i);
    } else if (k == "pinned_use_cuda_host_register" || k == "pinned_use_hip_host_register") {
      tk.at(++i);
      m.host = tk.bool_at(++i);
    } else if (k == "pinned_num_register_threads") {
      tk.at(++i);
      uint64_t v = tk.size_t_at(++i);
      check(pow2(v) && v <= 128);  // pinned_max_register_threads() is 128
      m.thr = v;
    } else if (k == "pinned_reserve_segment_size_mb") {
      tk.at(++i);
      uint64_t v = tk.size_t_at(++i);
      check(v > 0);
      m.pres = mb_clamped(v);  // expseg stores bytes, clamped as the other MB keys
    } else if (k == "graph_capture_record_stream_reuse") {
      tk.at(++i);
      m.graph = tk.bool_at(++i);
    } else if (k == "per_process_memory_fraction") {
      tk.at(++i);
      double v = tk.double_at(++i);
      check(v >= 0.0 && v <= 1.0);
      m.frac = v;
    } else if (k == "throw_on_cudamalloc_oom" || k == "pinned_free_catch_all") {
      tk.at(++i);  // main's copy: checkToken(':') then toBool, as the other flags
      (k == "throw_on_cudamalloc_oom" ? m.thr_oom : m.catch_all) = tk.bool_at(++i);
    } else if (k == "expandable_segments_reserve") {  // parseExpandableSegmentsReserve
      tk.at(++i);
      double v;
      bool gib;
      if (reserve_spec(tk.at(++i), &v, &gib)) m.reserve = v, m.reserve_gib = gib;
    } else if (k == "expandable_segments_reserve_by_class") {
      tk.at(++i);  // checkToken(':') and checkToken('['), results unread
      tk.at(++i);
      while (tk.at(i + 1) != "]") {  // entries name:R; a bad R is ignored
        tk.at(++i);
        tk.at(++i);
        tk.at(++i);
        if (tk.at(i + 1) == ",") ++i;
      }
      ++i;
    } else {
      check(generic_key(k));  // "Unrecognized key ... in CUDA allocator config"
      i = tk.skip_key(i);
    }
    if (i + 1 < tk.size()) ++i;
  }
}

bool model_parse(const std::string &text, Model *m) {
  Tokens tk(text);
  try {
    model_generic(tk, *m);
    model_cuda(tk, *m);
  } catch (const Refused &) {
    return false;
  }
  return true;
}

// ---- expseg's verdict against the model's ----

struct Got {
  expseg_status st;
  expseg_config_t c;
  std::string err;
};

Got parse(const std::string &text) {
  Got g;
  char err[EXPSEG_CONFIG_MSG_MAX], warn[EXPSEG_CONFIG_MSG_MAX];
  g.st = _expseg_config_parse_warn(text.c_str(), "PYTORCH_CUDA_ALLOC_CONF", nullptr, &g.c, err,
                                   sizeof err, warn, sizeof warn);
  g.err = g.st == EXPSEG_OK ? "" : err;
  return g;
}

bool same_double(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

// "" when expseg agrees with the model, else what differs.
std::string compare(const std::string &text) {
  Model m;
  bool ok = model_parse(text, &m);
  Got g = parse(text);
  if (ok != (g.st == EXPSEG_OK))
    return std::string("PyTorch ") + (ok ? "accepts" : "refuses") + ", expseg " +
           (ok ? "refuses: " + g.err : "accepts");
  if (!ok) return "";
  const expseg_config_t &c = g.c;
  std::string bad;
  auto num = [&](const char *f, uint64_t want, uint64_t got) {
    if (want != got) bad += std::string(f) + " " + std::to_string(got) + " != " + std::to_string(want) + "; ";
  };
  num("max_split_size", m.msplit, c.max_split_size);
  num("max_non_split_rounding", m.nsplit, c.max_non_split_rounding);
  num("large_segment_size", m.large, c.large_segment_size);
  num("pinned_reserve_segment_size", m.pres, c.pinned_reserve_segment_size);
  num("pinned_num_register_threads", m.thr, c.pinned_num_register_threads);
  for (int k = 0; k < EXPSEG_ROUNDUP_INTERVALS; k++) num("div", m.div[k], c.roundup_power2_divisions[k]);
  num("expandable_segments", m.exp, c.expandable_segments);
  num("pinned_use_background_threads", m.bg, c.pinned_use_background_threads);
  num("release_lock_on_cudamalloc", m.lock, c.release_lock_on_cudamalloc);
  num("pinned_use_cuda_host_register", m.host, c.pinned_use_cuda_host_register);
  num("graph_capture_record_stream_reuse", m.graph, c.graph_capture_record_stream_reuse);
  num("throw_on_cudamalloc_oom", m.thr_oom, c.throw_on_cudamalloc_oom);
  num("pinned_free_catch_all", m.catch_all, c.pinned_free_catch_all);
  if (m.reserve != c.expandable_segments_reserve || (m.reserve && m.reserve_gib != c.expandable_segments_reserve_gib))
    bad += "expandable_segments_reserve " + std::to_string(c.expandable_segments_reserve) + "; ";
  if (!same_double(m.gc, c.garbage_collection_threshold))
    bad += "gc " + std::to_string(c.garbage_collection_threshold) + "; ";
  if (!same_double(m.frac, c.per_process_memory_fraction) && !(m.frac == 0 && c.per_process_memory_fraction == 0))
    bad += "frac " + std::to_string(c.per_process_memory_fraction) + "; ";
  return bad;
}

// ---- random texts ----

const char *kKeys[] = {"max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
                       "roundup_power2_divisions", "expandable_segments", "pinned_use_background_threads",
                       "backend", "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
                       "pinned_use_cuda_host_register", "pinned_num_register_threads",
                       "pinned_reserve_segment_size_mb", "graph_capture_record_stream_reuse",
                       "per_process_memory_fraction", "throw_on_cudamalloc_oom",
                       "pinned_free_catch_all", "expandable_segments_reserve",
                       "expandable_segments_reserve_by_class", "large_segment_size_mb", "bogus"};
const char *kInts[] = {"0", "1", "2", "3", "4", "8", "16", "19", "20", "21", "100", "128", "256",
                       "-1", "+4", "-4", "020", "0x20", "1e3", "100abc", "4.5", "+-4", "-0",
                       "18446744073709551615", "18446744073709551616", "-18446744073709551615",
                       "9223372036854775808", "-9223372036854775808", "17592186044416", "abc", ">", "10", "11", "12", "40",
                       "17592186044415"};
const char *kDoubles[] = {"0.5", ".5", "5e-1", "0x1p-1", "0x1p-1074", "0x1p-1022", "0x1.8p-1070",
                          "1e-310", "1e-400", "0e-400", "nan", "inf", "-0", "1", "0", "1.0000001",
                          "0x", "1e", "0.5e", "-0.0", "4.9e-324", "2.2250738585072014e-308",
                          "0X.8P0", "infinity", "1e400", "-1e-400", ".", "0.5.5", "0x1p+0",
                          "2.2250738585072012e-308", "2.2250738585072013e-308", "0x1.fffffffffffff8p-1023",
                          "0x1.ffffffffffffe8p-1023", "0x1.fffffffffffff7p-1023", "0x1p-1075",
                          "0x1.0000000000000000000000001p-1074", "-0x1p-1074", "0x0.0p-5000"};
const char *kBools[] = {"True", "False", "true", "TRUE", "1", "native", "Native"};
const char *kBounds[] = {"1", "2", "3", "4", "64", "256", "1024", "1048576", ">", "0", "-1", "+2",
                         "9223372036854775808", "-9223372036854775808"};
const char *kDivs[] = {"0", "1", "2", "4", "8", "3", "-1", "+4", "9223372036854775808",
                       "-9223372036854775808", "x"};

const char *kReserves[] = {"0.5", "40G", "2.5g", "1e-310", "+0.5", "5.", "1e", "1e309", "G", ".5g",
                           "inf", "0x1", "-0.5", "1.5", "00.5", "1e1G", "nan", "0", "abc", "0.5GG"};

template <size_t N> const char *pick(TestRng &r, const char *(&a)[N]) { return a[r.below(N)]; }

std::string value_for(TestRng &r, const std::string &key) {
  int kind = (int)r.below(10);
  if (kind < 7) {
    if (key == "roundup_power2_divisions") {
      if (r.chance(0.4)) return pick(r, kDivs);
      std::string s = "[";
      for (uint64_t n = r.below(4), j = 0; j < n; j++)
        s += std::string(j ? "," : "") + pick(r, kBounds) + ":" + pick(r, kDivs);
      return s + "]";
    }
    if (key == "expandable_segments_reserve") return pick(r, kReserves);
    if (key == "expandable_segments_reserve_by_class") {
      std::string s = "[";
      for (uint64_t n = r.below(4), j = 0; j < n; j++)
        s += std::string(j ? "," : "") + (r.chance(0.5) ? "a" : "b") + ":" + pick(r, kReserves);
      return s + "]";
    }
    if (key == "garbage_collection_threshold" || key == "per_process_memory_fraction")
      return pick(r, kDoubles);
    if (key.find("_mb") != std::string::npos || key == "pinned_num_register_threads")
      return pick(r, kInts);
    return pick(r, kBools);
  }
  if (kind == 7) return pick(r, kInts);
  if (kind == 8) return pick(r, kDoubles);
  return pick(r, kBools);
}

std::string damage(TestRng &r, std::string s) {
  static const char seps[] = ",:[] \t";
  for (uint64_t n = r.below(3), j = 0; j < n && !s.empty(); j++) {
    size_t at = r.below(s.size() + 1);
    switch (r.below(4)) {
      case 0: s.insert(at, 1, seps[r.below(sizeof seps - 1)]); break;
      case 1: if (at < s.size()) s.erase(at, 1); break;
      case 2: {  // a separator becomes another
        std::vector<size_t> where;
        for (size_t k = 0; k < s.size(); k++)
          if (std::strchr(",:[]", s[k])) where.push_back(k);
        if (!where.empty()) s[where[r.below(where.size())]] = seps[r.below(4)];
        break;
      }
      default: s += r.chance(0.5) ? "," : "]"; break;
    }
  }
  return s;
}

// A run of tokens with no structure: keys, values and separators in any order.
std::string token_soup(TestRng &r) {
  static const char *seps[] = {",", ":", "[", "]", " "};
  std::string s;
  for (uint64_t n = 1 + r.below(12), j = 0; j < n; j++) {
    switch (r.below(6)) {
      case 0: s += pick(r, kKeys); break;
      case 1: s += pick(r, kBounds); break;
      case 2: s += pick(r, kBools); break;
      default: s += pick(r, seps); break;
    }
  }
  return s;
}

std::string random_text(TestRng &r) {
  if (r.chance(0.25)) return token_soup(r);
  std::string s;
  for (uint64_t n = 1 + r.below(3), j = 0; j < n; j++) {
    std::string key = pick(r, kKeys);
    s += (j ? "," : "") + key + ":" + value_for(r, key);
  }
  return r.chance(0.6) ? damage(r, s) : s;
}

TEST(Adv15Config, RandomTextsGetPyTorchsVerdictAndValues) {
  EXPSEG_SEEDED(seed, 15);
  TestRng r(seed);
  const uint64_t n = test_ops(200000, 200000);
  uint64_t accepted = 0, failures = 0;
  for (uint64_t i = 0; i < n && failures < 20; i++) {
    std::string text = random_text(r);
    std::string d = compare(text);
    Model m;
    accepted += model_parse(text, &m);
    if (!d.empty()) {
      ADD_FAILURE() << "'" << text << "': " << d;
      failures++;
    }
  }
  std::printf("%llu texts, %llu accepted by PyTorch's parse\n", (unsigned long long)n,
              (unsigned long long)accepted);
  EXPECT_GT(accepted, n / 20) << "the generator must reach the accepting paths";
}

}  // namespace

// ---- hand-picked strings, each with the PyTorch behaviour that decides it ----

namespace {

struct Pick {
  const char *text;
  bool accepted;
  // accepted: "field=value" checked below; refused: substrings of the message besides
  // "accepted" (every refusal names what is accepted)
  const char *want;
};

const Pick kPicks[] = {
    // ConfigTokenizer: no tokens at all; whitespace is dropped (std::isspace)
    {"", true, ""},
    {" \t\n\v\f\r", true, ""},
    // generic parseArgs: ',' as a key goes to skipKey, whose index check throws (one token)
    {",", false, "empty option"},
    // ',,,': the generic walk skips ',' (slot ',', value ','); the CUDA walk: "Unrecognized key"
    {",,,", false, "empty option"},
    {"expandable_segments:True,,", false, "empty option"},
    // toDouble is std::stod: glibc's strtod sets ERANGE for a value below DBL_MIN only when
    // a bit is lost (strtod_l.c, round_and_return); an exact subnormal is returned as is
    {"garbage_collection_threshold:0x1p-1074", true, "gc=0x1p-1074"},
    {"per_process_memory_fraction:0x1.8p-1070", true, "frac=0x1.8p-1070"},
    {"garbage_collection_threshold:0x1.8p-1074", false, "garbage_collection_threshold '0x1.8p-1074' out of range"},
    {"garbage_collection_threshold:0x1p-1075", false, "'0x1p-1075' out of range"},
    // tiny and inexact (it rounds up to DBL_MIN, still ERANGE); a hair above: not tiny
    {"per_process_memory_fraction:2.2250738585072012e-308", false, "per_process_memory_fraction '2.2250738585072012e-308'"},
    {"per_process_memory_fraction:2.2250738585072013e-308", true, "frac=2.2250738585072014e-308"},
    // glibc does not look at the 54th bit of a tiny value: no ERANGE, the value rounds down
    {"garbage_collection_threshold:0x1.ffffffffffffe8p-1023", true, "gc=0x0.fffffffffffffp-1022"},
    {"per_process_memory_fraction:0e-400", true, "frac=0"},  // an exact 0: no ERANGE
    {"per_process_memory_fraction:1e-310", false, "'1e-310' out of range"},
    // parseExpandableSegmentsReserveByClass reads ']' as a (bad, ignored) value and goes on
    // to class b, but the generic walk's skipKey stopped at that ']' and meets 'b' as a key:
    // "Unrecognized key 'b' in Accelerator allocator config" (PyTorch 2.9 and later)
    {"expandable_segments_reserve_by_class:[a:],b:1G]", false, "unknown key 'b'"},
    {"expandable_segments_reserve_by_class:x,y:]", false, "unknown key 'y'"},
    {"expandable_segments_reserve_by_class:x]", true, "cls="},  // 'x' taken as '['
    // expandable_segments_reserve takes '[' as its (bad) value; the generic skipKey runs to
    // ']' and so never reads max_split_size_mb: accepted, max_split_size unchanged
    {"expandable_segments_reserve:[,max_split_size_mb:100]", true, "msplit=max"},
    // ... and here the generic walk, after the ']', meets ',' as a key: refused
    {"expandable_segments_reserve:[,release_lock_on_cudamalloc]True,,expandable_segments:False", false,
     "empty option"},
    // toSizeT is std::stoull: '-9223372036854775808' wraps to 2^63, a power of two
    {"roundup_power2_divisions:[-9223372036854775808:4]", true, "div=4"},
    {"pinned_num_register_threads:-9223372036854775808", false, "pinned_num_register_threads '-9223372036854775808' [1, 128]"},
    {"max_split_size_mb:+-1", false, "max_split_size_mb '+-1' not a number"},
    // the list ends at its first ']'; the second stands where ',' belongs
    {"roundup_power2_divisions:[2:4]]", true, "div=4,4,0"},
    // a repeated key: the last one wins
    {"garbage_collection_threshold:0.5,garbage_collection_threshold:0.7", true, "gc=0.7"},
    // the generic parser runs first and refuses the unknown key before reading the next
    {"bogus:1,max_split_size_mb:5", false, "unknown key 'bogus'"},
    // documented difference: expseg implements the native allocator only
    {"backend:cudaMallocAsync,max_split_size_mb:100", false, "backend 'cudaMallocAsync' native"},
};

double hex_double(const std::string &v) { return std::strtod(v.c_str(), nullptr); }

TEST(Adv15Config, HandPickedStrings) {
  for (const Pick &k : kPicks) {
    Got g = parse(k.text);
    Model m;
    EXPECT_EQ(model_parse(k.text, &m), k.accepted) << "the model disagrees: " << k.text;
    std::string want = k.want;
    if (!k.accepted) {
      EXPECT_EQ(g.st, EXPSEG_ERR_CONFIG) << "PyTorch refuses: '" << k.text << "'";
      EXPECT_NE(g.err.find("accepted"), std::string::npos) << g.err;
      std::istringstream in(want);
      for (std::string w; in >> w;) {
        if (w == "out" || w == "of" || w == "range" || w == "not" || w == "a" || w == "number" ||
            w == "too" || w == "small" || w == "unknown" || w == "key")
          continue;  // checked as phrases below
        EXPECT_NE(g.err.find(w), std::string::npos) << k.text << ": " << w << "\n" << g.err;
      }
      for (const char *phrase :
           {"out of range", "not a number", "too small", "empty option", "unknown key"}) {
        if (want.find(phrase) != std::string::npos) {
          EXPECT_NE(g.err.find(phrase), std::string::npos) << k.text << "\n" << g.err;
        }
      }
      continue;
    }
    ASSERT_EQ(g.st, EXPSEG_OK) << "PyTorch accepts: '" << k.text << "': " << g.err;
    EXPECT_EQ(compare(k.text), "") << k.text;
    if (want.empty()) continue;
    std::string f = want.substr(0, want.find('=')), v = want.substr(want.find('=') + 1);
    const expseg_config_t &c = g.c;
    if (f == "gc") EXPECT_EQ(c.garbage_collection_threshold, hex_double(v)) << k.text;
    else if (f == "frac") EXPECT_EQ(c.per_process_memory_fraction, hex_double(v)) << k.text;
    else if (f == "cls") EXPECT_STREQ(c.expandable_segments_reserve_by_class, v.c_str()) << k.text;
    else if (f == "msplit") EXPECT_EQ(c.max_split_size, (size_t)SIZE_MAX) << k.text;
    else if (f == "div") {
      std::istringstream d(v);
      std::vector<uint64_t> w;
      for (std::string x; std::getline(d, x, ',');) w.push_back(std::stoull(x));
      for (int i = 0; i < EXPSEG_ROUNDUP_INTERVALS; i++)  // the last one given fills the rest
        EXPECT_EQ(c.roundup_power2_divisions[i], w[i < (int)w.size() ? i : w.size() - 1])
            << k.text << " interval " << i;
    } else ADD_FAILURE() << "unknown field " << f;
  }
}

// Every refusal the random texts meet names a position and what is accepted, on one line
// that fits the message buffer.
TEST(Adv15Config, EveryRefusalSaysWhatIsAccepted) {
  EXPSEG_SEEDED(seed, 1515);
  TestRng r(seed * 0x9E3779B97F4A7C15ull);
  for (uint64_t i = 0, n = test_ops(50000); i < n; i++) {
    std::string text = random_text(r);
    Got g = parse(text);
    if (g.st == EXPSEG_OK) continue;
    ASSERT_EQ(g.err.rfind("PYTORCH_CUDA_ALLOC_CONF: position ", 0), 0u) << text << "\n" << g.err;
    ASSERT_NE(g.err.find("; accepted"), std::string::npos) << text << "\n" << g.err;
    ASSERT_EQ(g.err.find('\n'), std::string::npos) << text << "\n" << g.err;
    ASSERT_LT(g.err.size(), (size_t)EXPSEG_CONFIG_MSG_MAX - 1) << text;
  }
}

}  // namespace

namespace {

// A subnormal value PyTorch reads (an exact hexadecimal one) prints as that hexadecimal: no
// decimal form reads back (every one is ERANGE to strtod). The printed string parses back to
// the same configuration, without a warning; so does the clean form of a warning.
TEST(Adv15Config, SubnormalsPrintBackExactly) {
  for (const char *text : {"garbage_collection_threshold:0x1p-1074",
                           "per_process_memory_fraction:0x1.8p-1070",
                           "garbage_collection_threshold:0x1.ffffffffffffep-1023",
                           "garbage_collection_threshold:0x1p-1074abc,per_process_memory_fraction:+0x1p-1073",
                           // a reserve is read by an istringstream, which takes the decimal
                           "expandable_segments_reserve:1e-310,expandable_segments_reserve_by_class:[a:1e-310]"}) {
    char err[EXPSEG_CONFIG_MSG_MAX], warn[EXPSEG_CONFIG_MSG_MAX], out[4096];
    expseg_config_t a, b;
    ASSERT_EQ(_expseg_config_parse_warn(text, "test", nullptr, &a, err, sizeof err, warn, sizeof warn),
              EXPSEG_OK) << text << ": " << err;
    ASSERT_LT(_expseg_config_print(&a, out, sizeof out), sizeof out);
    EXPECT_EQ(_expseg_config_parse_warn(out, "test", nullptr, &b, err, sizeof err, warn, sizeof warn),
              EXPSEG_OK) << text << " printed as " << out << ": " << err;
    EXPECT_STREQ(warn, "") << text << " printed as " << out;
    EXPECT_EQ(policy_test::differs(a, b), "") << text << " printed as " << out;
    EXPECT_EQ(a.garbage_collection_threshold, b.garbage_collection_threshold) << out;
    EXPECT_EQ(a.expandable_segments_reserve, b.expandable_segments_reserve) << out;
  }
}

}  // namespace
