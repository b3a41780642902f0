/* SPDX-License-Identifier: Apache-2.0 */
/* backend_glue.h: the parts of the C++ backend (backend.cpp) that need no PyTorch header:
 * the map from PyTorch's memory-pool ids to expseg pool ids, the statistics mapping into a
 * DeviceStats, the one-line error text, the skip_actions flags, and the history's context
 * (recordAnnotation's entries and compile context and user metadata on
 * the C library, their fields in PyTorch's TraceEntry). Header-only C++17 over include/expseg.h, so
 * tests/test_torch_backend_glue.cpp checks it on a machine without PyTorch or a GPU.
 *
 * Why a map: PyTorch names a private pool by a pair of integers (MempoolId_t, {0, 0} = the
 * general cache) and counts its users; expseg names a pool by one integer it hands out
 * (expseg_pool_create) and counts users itself. The map only translates names per device:
 * every use count and every decision stays in the C library; the reverse names (pair_of)
 * outlive a pool's release until a walk shows it gone. The calls into expseg's pool
 * API go through an Ops policy (the real functions in backend.cpp, a fake in the test), so
 * this header does not need a library that has private pools to be tested. */
#ifndef EXPSEG_PLUGIN_BACKEND_GLUE_H
#define EXPSEG_PLUGIN_BACKEND_GLUE_H

#include "expseg.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace expseg_glue {

/* ---- errors ---- */

/* "expseg: CALL (device D): STATUS_NAME: MESSAGE", one line (newlines in MESSAGE become
 * spaces), as every exception of the backend reads. */
inline std::string error_text(const char *call, int device, expseg_status st,
                              const char *message) {
  std::string s = "expseg: ";
  s += call;
  s += " (device ";
  s += std::to_string(device);
  s += "): ";
  s += expseg_status_name(st);
  if (message && *message) {
    s += ": ";
    for (const char *p = message; *p; ++p) s += (*p == '\n' || *p == '\r') ? ' ' : *p;
  }
  return s;
}

/* ---- configuration ---- */

/* The allocator's configuration as one option string (expseg_config_string). */
inline std::string config_string(const expseg_allocator *a) {
  std::string s(256, '\0');
  size_t n = expseg_config_string(a, &s[0], s.size());
  if (n + 1 > s.size()) {
    s.assign(n + 1, '\0');
    n = expseg_config_string(a, &s[0], s.size());
  }
  s.resize(n < s.size() ? n : s.size() - 1);
  return s;
}

/* The value of a scalar key in an option string ("k1:v1,k2:v2"); false when absent. List
 * values ("[a:b,c:d]") are skipped whole, so a key inside a list is never matched. */
inline bool config_value(const std::string &cfg, const std::string &key, std::string *out) {
  std::size_t i = 0;
  while (i < cfg.size()) {
    std::size_t colon = cfg.find(':', i);
    if (colon == std::string::npos) return false;
    std::size_t j = colon + 1, depth = 0;
    while (j < cfg.size() && (depth > 0 || cfg[j] != ',')) {
      if (cfg[j] == '[') ++depth;
      if (cfg[j] == ']' && depth > 0) --depth;
      ++j;
    }
    if (cfg.compare(i, colon - i, key) == 0 && colon - i == key.size()) {
      *out = cfg.substr(colon + 1, j - colon - 1);
      return true;
    }
    i = j + 1;
  }
  return false;
}

/* getMemoryFraction: the per_process_memory_fraction in force (1 when not reported). */
inline double memory_fraction(const expseg_allocator *a) {
  std::string v;
  if (!config_value(config_string(a), "per_process_memory_fraction", &v)) return 1.0;
  try {
    return std::stod(v);
  } catch (...) {
    return 1.0;
  }
}

/* ---- history ---- */

/* PyTorch's skip_actions (recordHistory) as EXPSEG_HISTORY_SKIP_* flags in *flags, from the
 * C library's one table (expseg_history_skip_action); false, with the first name expseg
 * cannot leave out in *bad, for any other name. */
inline bool skip_flags(const std::vector<std::string> &names, unsigned *flags,
                       std::string *bad) {
  *flags = 0;
  for (const std::string &n : names) {
    unsigned f = 0;
    if (expseg_history_skip_action(n.c_str(), &f) != EXPSEG_OK) {
      *bad = n;
      return false;
    }
    *flags |= f;
  }
  return true;
}

/* The names skip_flags accepts, for a message: "alloc, free_requested, ...". */
inline const char *skip_names() { return expseg_history_skip_action_names(); }

/* ---- annotations, compile context and user metadata ---- */

/* recordAnnotation (record_function's annotations, for the snapshot's
 * external_annotations): one entry in the allocator's history (expseg_history_record_annotation,
 * the C library's one log, shared with the Python route: kept while the history is recorded,
 * the newest max_entries, dropped by clear_history or stopping). */
using AnnotationPairs = std::vector<std::pair<std::string, std::string>>;
inline expseg_status record_annotation(expseg_allocator *a, const AnnotationPairs &md) {
  std::vector<const char *> k, v;
  for (const auto &kv : md) {
    k.push_back(kv.first.c_str());
    v.push_back(kv.second.c_str());
  }
  return expseg_history_record_annotation(a, k.data(), v.data(), md.size());
}

/* Whether a SnapshotInfo has external_annotations (PyTorch 2.6+). */
template <class T, class = void>
struct HasExternalAnnotations : std::false_type {};
template <class T>
struct HasExternalAnnotations<T, std::void_t<decltype(std::declval<T &>().external_annotations)>>
    : std::true_type {};

/* Appends the allocator's annotations (expseg_history_annotations) to
 * info.external_annotations as PyTorch's AnnotationEntry (device_, time_,
 * recordUserMetadata(name, value)), where this PyTorch's SnapshotInfo has them. */
template <class Info>
expseg_status fill_annotations(Info &info, expseg_allocator *a) {
  if constexpr (HasExternalAnnotations<Info>::value) {
    using AE = typename decltype(info.external_annotations)::value_type;
    std::vector<AE> got;
    expseg_status st = expseg_history_annotations(
        a,
        [](void *ctx, const expseg_annotation *e) {
          AE ae(static_cast<decltype(ae.device_)>(e->device), 0);
          ae.time_.t_ = static_cast<decltype(ae.time_.t_)>(e->time_us);
          for (size_t i = 0; i < e->n; ++i) ae.recordUserMetadata(e->keys[i], e->values[i]);
          static_cast<std::vector<AE> *>(ctx)->push_back(std::move(ae));
        },
        &got);
    for (AE &ae : got) info.external_annotations.push_back(std::move(ae));
    return st;
  } else {
    (void)info;
    (void)a;
    return EXPSEG_OK;
  }
}

/* pushCompileContext / popCompileContext / setUserMetadata: the allocator's compile-context
 * stack and user metadata, which each later event carries. */
inline expseg_status push_compile_context(expseg_allocator *a, const std::string &md) {
  return expseg_history_push_compile_context(a, md.c_str());
}
inline expseg_status pop_compile_context(expseg_allocator *a) {
  return expseg_history_pop_compile_context(a);
}
inline expseg_status set_user_metadata(expseg_allocator *a, const std::string &md) {
  return expseg_history_set_user_metadata(a, md.c_str());
}

/* getUserMetadata: the allocator's user metadata ("" when none, or for no allocator). */
inline std::string user_metadata(expseg_allocator *a) {
  if (!a) return "";
  std::string s(expseg_history_user_metadata(a, nullptr, 0), '\0');
  expseg_history_user_metadata(a, &s[0], s.size());
  s.resize(s.size() - 1); /* the NUL */
  return s;
}

/* Whether a TraceEntry has compile_context_ / user_metadata_ (PyTorch 2.12+ has them). */
template <class T, class = void>
struct HasCompileContext : std::false_type {};
template <class T>
struct HasCompileContext<T, std::void_t<decltype(std::declval<T &>().compile_context_ =
                                                     std::string())>> : std::true_type {};
template <class T, class = void>
struct HasUserMetadata : std::false_type {};
template <class T>
struct HasUserMetadata<T, std::void_t<decltype(std::declval<T &>().user_metadata_ =
                                                   std::string())>> : std::true_type {};

/* Copies a walked event's compile_context and user_metadata into the TraceEntry the backend
 * builds from it, where this PyTorch's TraceEntry has the fields. */
template <class TE>
void set_trace_context(TE &te, const expseg_walk_event *e) {
  if constexpr (HasCompileContext<TE>::value)
    te.compile_context_ = e->compile_context ? e->compile_context : "N/A";
  if constexpr (HasUserMetadata<TE>::value) te.user_metadata_ = e->user_metadata ? e->user_metadata : "";
  (void)te;
  (void)e;
}

/* ---- statistics ---- */

/* PyTorch's StatArray index of each pool suffix of expseg's keys (StatType: AGGREGATE = 0,
 * SMALL_POOL = 1, LARGE_POOL = 2). */
struct PoolSuffix {
  const char *suffix;
  std::size_t index;
};
constexpr PoolSuffix kPoolSuffixes[] = {{"all", 0}, {"small_pool", 1}, {"large_pool", 2}};

/* Whether a DeviceStats has PyTorch 2.12's num_oom_rejections field. */
template <class S, class = void>
struct HasOomRejections : std::false_type {};
template <class S>
struct HasOomRejections<S, std::void_t<decltype(std::declval<S &>().num_oom_rejections)>>
    : std::true_type {};

/* Fills a DeviceStats-shaped struct (PyTorch's c10::CachingDeviceAllocator::DeviceStats, or
 * a stand-in with the same field names) from get(key, &value) -> bool, a reader of expseg's
 * statistics. Each key read is added to *keys_read when given; returns how many keys get()
 * did not have (0 when expseg reports every field). */
template <class Stats, class Get>
int fill_device_stats(Stats &s, Get &&get, std::set<std::string> *keys_read = nullptr) {
  int missing = 0;
  auto one = [&](const std::string &key, int64_t &field) {
    int64_t v = 0;
    if (get(key.c_str(), &v))
      field = v;
    else
      ++missing;
    if (keys_read) keys_read->insert(key);
  };
  auto stat = [&](const std::string &base, auto &st) {
    one(base + ".current", st.current);
    one(base + ".peak", st.peak);
    one(base + ".allocated", st.allocated);
    one(base + ".freed", st.freed);
  };
  auto array = [&](const char *name, auto &arr) {
    for (const PoolSuffix &p : kPoolSuffixes)
      stat(std::string(name) + "." + p.suffix, arr[p.index]);
  };
#define EXPSEG_GLUE_ARRAY_(n) array(#n, s.n);
#define EXPSEG_GLUE_STAT_(n) stat(#n, s.n);
#define EXPSEG_GLUE_COUNTER_(n) one(#n, s.n);
  EXPSEG_GLUE_ARRAY_(allocation)
  EXPSEG_GLUE_ARRAY_(segment)
  EXPSEG_GLUE_ARRAY_(active)
  EXPSEG_GLUE_ARRAY_(inactive_split)
  EXPSEG_GLUE_ARRAY_(allocated_bytes)
  EXPSEG_GLUE_ARRAY_(reserved_bytes)
  EXPSEG_GLUE_ARRAY_(active_bytes)
  EXPSEG_GLUE_ARRAY_(inactive_split_bytes)
  EXPSEG_GLUE_ARRAY_(requested_bytes)
  EXPSEG_GLUE_COUNTER_(num_alloc_retries)
  EXPSEG_GLUE_COUNTER_(num_ooms)
  EXPSEG_GLUE_STAT_(oversize_allocations)
  EXPSEG_GLUE_STAT_(oversize_segments)
  EXPSEG_GLUE_COUNTER_(num_sync_all_streams)
  EXPSEG_GLUE_COUNTER_(num_device_alloc)
  EXPSEG_GLUE_COUNTER_(num_device_free)
  EXPSEG_GLUE_COUNTER_(max_split_size)
  if constexpr (HasOomRejections<Stats>::value) EXPSEG_GLUE_COUNTER_(num_oom_rejections)
#undef EXPSEG_GLUE_ARRAY_
#undef EXPSEG_GLUE_STAT_
#undef EXPSEG_GLUE_COUNTER_
  return missing;
}

/* fill_device_stats from an allocator's statistics. */
template <class Stats>
int fill_device_stats_from(Stats &s, const expseg_allocator *a,
                           std::set<std::string> *keys_read = nullptr) {
  return fill_device_stats(
      s, [a](const char *key, int64_t *v) { return expseg_stat(a, key, v) == EXPSEG_OK; },
      keys_read);
}

/* ---- private pools ---- */

/* PyTorch's MempoolId_t: {0, 0} is the general cache. */
using PoolPair = std::pair<uint64_t, uint64_t>;
/* A stream filter as expseg takes it: true when an allocation on the stream goes to the pool. */
using StreamFilter = std::function<bool(expseg_stream)>;

/* The C trampoline expseg_pool_begin calls with the StreamFilter as ctx. An exception from
 * the filter cannot cross the C library: it counts as "not this pool". */
inline bool filter_trampoline(void *ctx, expseg_stream stream) {
  try {
    return (*static_cast<StreamFilter *>(ctx))(stream);
  } catch (...) {
    return false;
  }
}

/* Ops: create(a, &id), retain(a, id), use_count(a, id, &n), begin(a, id, fn, ctx),
 * end(a, id), release(a, id), each returning expseg_status, as expseg_pool_* do.
 * Every method is thread-safe (one mutex; expseg is called with it held, and expseg never
 * calls back into the map). */
template <class Ops>
class PoolMap {
 public:
  explicit PoolMap(Ops ops = Ops()) : ops_(std::move(ops)) {}

  /* createOrIncrefPool: a new expseg pool (use count 1) the first time the pair is named
   * on the device, else one more use of it. {0, 0} is refused (not a private pool). */
  expseg_status acquire(expseg_allocator *a, int device, PoolPair id, uint64_t *out) {
    why().clear();
    if (id == PoolPair{0, 0})
      return refuse(device, id, "is the general cache, not a private pool");
    std::lock_guard<std::mutex> g(mu_);
    auto it = map_.find(Key{device, id});
    if (it != map_.end()) {
      expseg_status st = ops_.retain(a, it->second.pool);
      if (st == EXPSEG_OK && out) *out = it->second.pool;
      return st;
    }
    uint64_t pool = 0;
    expseg_status st = ops_.create(a, &pool);
    if (st != EXPSEG_OK) return st;
    map_[Key{device, id}].pool = pool;
    {
      std::lock_guard<std::mutex> n(names_mu_);
      names_[Name{device, pool}] = NameEntry{id, 0};
    }
    if (out) *out = pool;
    return EXPSEG_OK;
  }

  /* beginAllocateToPool: one more use of the pool (as PyTorch's allocator takes one), then
   * allocations whose stream passes the filter go to it until end(). */
  expseg_status begin(expseg_allocator *a, int device, PoolPair id, StreamFilter filter) {
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = map_.find(Key{device, id});
      if (it != map_.end() && it->second.filter)
        return refuse(device, id, "is already being allocated to (begin without end)");
    }
    uint64_t pool = 0;
    expseg_status st = acquire(a, device, id, &pool);
    if (st != EXPSEG_OK) return st;
    std::lock_guard<std::mutex> g(mu_);
    Entry &e = map_[Key{device, id}];
    auto f = std::make_unique<StreamFilter>(std::move(filter));
    st = ops_.begin(a, pool, &filter_trampoline, f.get());
    if (st != EXPSEG_OK) { /* undo the use taken above; forget a pool nobody uses */
      int n = 0;
      if (ops_.release(a, pool) == EXPSEG_OK &&
          (ops_.use_count(a, pool, &n) != EXPSEG_OK || n <= 0)) {
        map_.erase(Key{device, id});
        released(device, pool);
      }
      return st;
    }
    e.filter = std::move(f); /* kept alive until end() */
    return EXPSEG_OK;
  }

  /* endAllocateToPool: allocations stop going to the pool; the filter is dropped. */
  expseg_status end(expseg_allocator *a, int device, PoolPair id) {
    why().clear();
    std::lock_guard<std::mutex> g(mu_);
    auto it = map_.find(Key{device, id});
    if (it == map_.end()) return refuse(device, id, "was never created or is released");
    expseg_status st = ops_.end(a, it->second.pool);
    if (st == EXPSEG_OK) it->second.filter.reset();
    return st;
  }

  /* releasePool: one use fewer. When expseg says nobody uses the pool any more, the pair is
   * forgotten (PyTorch never names a released pool again). */
  expseg_status release(expseg_allocator *a, int device, PoolPair id) {
    why().clear();
    std::lock_guard<std::mutex> g(mu_);
    auto it = map_.find(Key{device, id});
    if (it == map_.end()) return refuse(device, id, "was never created or is released");
    expseg_status st = ops_.release(a, it->second.pool);
    if (st != EXPSEG_OK) return st;
    int n = 0;
    if (ops_.use_count(a, it->second.pool, &n) != EXPSEG_OK || n <= 0) {
      released(device, it->second.pool);
      map_.erase(it);
    }
    return EXPSEG_OK;
  }

  /* getPoolUseCount: expseg's count; 0 for a pair never named (or forgotten). */
  int use_count(const expseg_allocator *a, int device, PoolPair id) const {
    std::lock_guard<std::mutex> g(mu_);
    auto it = map_.find(Key{device, id});
    if (it == map_.end()) return 0;
    int n = 0;
    return ops_.use_count(a, it->second.pool, &n) == EXPSEG_OK ? n : 0;
  }

  /* The expseg pool of a pair: {0, 0} is 0 (the general cache); false when never named. */
  bool find(int device, PoolPair id, uint64_t *out) const {
    if (id == PoolPair{0, 0}) {
      *out = 0;
      return true;
    }
    std::lock_guard<std::mutex> g(mu_);
    auto it = map_.find(Key{device, id});
    if (it == map_.end()) return false;
    *out = it->second.pool;
    return true;
  }

  /* The reverse lookup: the pair an expseg pool on a device was created for, also after its
   * release while expseg still has its memory or history (a draining pool, as PyTorch still
   * reports a released pool's segments under its pair); {0, 0} for 0 and for pools never
   * named here. Safe inside expseg_walk's callbacks: names_mu_ is a leaf lock, never held
   * while calling expseg. */
  PoolPair pair_of(int device, uint64_t pool) const {
    if (pool == 0) return {0, 0};
    std::lock_guard<std::mutex> n(names_mu_);
    auto it = names_.find(Name{device, pool});
    return it == names_.end() ? PoolPair{0, 0} : it->second.pair;
  }

  /* A mark to take before a walk of a device's whole state (segments and history), for
   * forget_unseen after it. */
  uint64_t walk_mark() const {
    std::lock_guard<std::mutex> n(names_mu_);
    return released_gen_;
  }

  /* After a complete walk begun at `mark` that reported the pools in `seen`: forgets the
   * names of the device's pools released before the mark that the walk did not report. Such
   * a pool has no segment and no history event left, and never gets one again (ids are
   * never reused; a released pool takes no allocation), so its name is no longer needed.
   * Returns how many names were forgotten. */
  std::size_t forget_unseen(int device, uint64_t mark, const std::set<uint64_t> &seen) {
    std::lock_guard<std::mutex> n(names_mu_);
    std::size_t k = 0;
    for (auto it = names_.begin(); it != names_.end();) {
      const NameEntry &e = it->second;
      if (std::get<0>(it->first) == device && e.released_at != 0 && e.released_at <= mark &&
          !seen.count(std::get<1>(it->first))) {
        it = names_.erase(it);
        ++k;
      } else {
        ++it;
      }
    }
    return k;
  }

  /* Names kept (live and released pools), every device. */
  std::size_t names() const {
    std::lock_guard<std::mutex> n(names_mu_);
    return names_.size();
  }

  std::size_t size() const {
    std::lock_guard<std::mutex> g(mu_);
    return map_.size();
  }

  /* Why this thread's last call was refused by the map itself ("" when the status, if any,
   * came from expseg: then expseg_last_error() has the message). */
  static std::string &why() {
    static thread_local std::string w;
    return w;
  }

 private:
  static expseg_status refuse(int device, PoolPair id, const char *what) {
    why() = "memory pool (" + std::to_string(id.first) + ", " + std::to_string(id.second) +
            ") on device " + std::to_string(device) + " " + what;
    return EXPSEG_ERR_INVALID_ARGUMENT;
  }

  /* mu_ held: the pool's use count reached 0; its name stays for pair_of until
   * forget_unseen. */
  void released(int device, uint64_t pool) {
    std::lock_guard<std::mutex> n(names_mu_);
    auto it = names_.find(Name{device, pool});
    if (it != names_.end()) it->second.released_at = ++released_gen_;
  }

  using Key = std::tuple<int, PoolPair>;
  struct Entry {
    uint64_t pool = 0;
    std::unique_ptr<StreamFilter> filter;
  };
  using Name = std::tuple<int, uint64_t>; /* device, expseg pool */
  struct NameEntry {
    PoolPair pair;
    uint64_t released_at = 0; /* 0: live; else the release's number (released_gen_) */
  };
  mutable Ops ops_;
  mutable std::mutex mu_;
  std::map<Key, Entry> map_;
  /* the reverse map, under its own lock (taken inside mu_ and inside expseg's walk; nothing
   * is called with it held) */
  mutable std::mutex names_mu_;
  std::map<Name, NameEntry> names_;
  uint64_t released_gen_ = 0;
};

} // namespace expseg_glue

#endif
