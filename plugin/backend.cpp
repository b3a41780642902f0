// SPDX-License-Identifier: Apache-2.0
// backend.cpp: expseg as PyTorch's CUDA allocator: a subclass of
// c10::cuda::CUDACachingAllocator::CUDAAllocator over expseg's C API, so every torch.cuda
// memory call (tensors, raw_alloc, record_stream, empty_cache, memory_stats, snapshots,
// history, out-of-memory observers, MemPool and CUDA-graph pools) reaches expseg.
//
// Glue only: every decision and every figure stays in the C library. The allocators are the
// C plug's (libexpseg_torch.so, expseg_torch_allocator), one per device, so python/expseg.py
// and this backend see the same state. What needs no PyTorch header is in backend_glue.h
// (tested without PyTorch). Built by CMake (plugin/backend.cmake) or from Python
// (python/_expseg_cxx.py, torch.utils.cpp_extension); installed by
// expseg_torch_backend_install(). Written against the headers of PyTorch 2.10 and 2.11; what
// differs between them is guarded by TORCH_VERSION_MAJOR/MINOR (docs/torch.md).
#include "backend_glue.h"
#include "expseg.h"
#include "expseg_torch.h"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/version.h>

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#if !(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10))
#error "expseg's C++ backend needs PyTorch 2.10 or later (use expseg.install(route=\"pluggable\") with older releases)"
#endif
// PyTorch 2.12 and later (post-2.11 main): attachOomRejectionObserver is pure virtual.
#define EXPSEG_TORCH_AT_LEAST_2_12 \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 12))

#if defined(__clang__)
// Members whose presence or exact signature changed between 2.10 and 2.11 are declared
// without `override` (one of each pair overrides, the other is an unused extra virtual).
#pragma clang diagnostic ignored "-Winconsistent-missing-override"
#endif

namespace expseg_backend {

namespace CCA = c10::cuda::CUDACachingAllocator;
using c10::DeviceIndex;
using MempoolId = c10::MempoolId_t;

constexpr int kMaxDevices = EXPSEG_TORCH_MAX_DEVICES;

// The real pool API of include/expseg.h for PoolMap.
struct RealPoolOps {
  expseg_status create(expseg_allocator *a, uint64_t *out) { return expseg_pool_create(a, out); }
  expseg_status retain(expseg_allocator *a, uint64_t id) { return expseg_pool_retain(a, id); }
  expseg_status use_count(const expseg_allocator *a, uint64_t id, int *n) {
    return expseg_pool_use_count(a, id, n);
  }
  expseg_status begin(expseg_allocator *a, uint64_t id, bool (*fn)(void *, expseg_stream),
                      void *ctx) {
    return expseg_pool_begin(a, id, fn, ctx);
  }
  expseg_status end(expseg_allocator *a, uint64_t id) { return expseg_pool_end(a, id); }
  expseg_status release(expseg_allocator *a, uint64_t id) { return expseg_pool_release(a, id); }
};

expseg_stream stream_of(cudaStream_t s) { return (expseg_stream)(uintptr_t)s; }
expseg_glue::PoolPair pair_of(const MempoolId &id) { return {id.first, id.second}; }

// Throws c10::OutOfMemoryError (torch.cuda.OutOfMemoryError) or c10::Error with one line.
[[noreturn]] void fail(const char *call, int device, expseg_status st, const char *message) {
  std::string text = expseg_glue::error_text(call, device, st, message);
  if (st == EXPSEG_ERR_OUT_OF_MEMORY) C10_THROW_ERROR(OutOfMemoryError, text);
  C10_THROW_ERROR(Error, text);
}

void check(const char *call, int device, expseg_status st) {
  if (st != EXPSEG_OK) fail(call, device, st, expseg_last_error());
}

using PoolMap = expseg_glue::PoolMap<RealPoolOps>;

// A pool-map call: the map's own refusal, else expseg's message.
void check_pool(const char *call, int device, expseg_status st) {
  if (st == EXPSEG_OK) return;
  const std::string &why = PoolMap::why();
  fail(call, device, st, why.empty() ? expseg_last_error() : why.c_str());
}

class ExpsegAllocator;
ExpsegAllocator *g_self = nullptr; // the installed instance (deleters are plain functions)

class ExpsegAllocator final : public CCA::CUDAAllocator {
 public:
  ExpsegAllocator() = default;

  // ---- the allocators of the C plug, with this backend's settings applied ----

  // The device's allocator, made on first use; throws with expseg's message when it cannot.
  expseg_allocator *alloc_for(int device) {
    if (device < 0 || device >= kMaxDevices)
      fail("device", device, EXPSEG_ERR_INVALID_ARGUMENT,
           ("expected 0 <= device < " + std::to_string(kMaxDevices)).c_str());
    Device &d = devs_[device];
    expseg_allocator *a = d.a.load(std::memory_order_acquire);
    if (a && d.gen.load(std::memory_order_acquire) == gen_.load(std::memory_order_acquire))
      return a;
    return apply_settings(device);
  }

  // The device's allocator if some call has made it (never makes one).
  expseg_allocator *existing(int device) {
    if (device < 0 || device >= kMaxDevices) return nullptr;
    expseg_allocator *a = expseg_torch_allocator(device, 0);
    return a ? alloc_for(device) : nullptr;
  }

  // ---- c10::Allocator ----

  c10::DataPtr allocate(size_t n) override {
    DeviceIndex device = c10::cuda::current_device();
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    void *p = malloc_on(device, n, stream, "allocate");
    return {p, p, deleters()[device], c10::Device(c10::DeviceType::CUDA, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete_any; }
  void copy_data(void *dest, const void *src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // ---- c10::DeviceAllocator ----

  bool initialized() override { return initialized_.load(); }
  void emptyCache(MempoolId mempool_id) override {
    uint64_t pool = 0;
    for (int d = 0; d < kMaxDevices; ++d) {
      expseg_allocator *a = existing(d);
      if (!a) continue;
      if (mempool_id == MempoolId{0, 0})
        check("emptyCache", d, expseg_empty_cache(a));
      else if (pools_.find(d, pair_of(mempool_id), &pool))
        check("emptyCache(pool)", d, expseg_pool_empty_cache(a, pool));
    }
  }
  // Statistics never make an allocator (that would initialize a device nobody used): a
  // device without one reports zeros, as PyTorch does for a device it has not allocated on,
  // and the max_split_size of the configuration (the same on every device).
  CCA::DeviceStats getDeviceStats(DeviceIndex device) override {
    CCA::DeviceStats s;
    expseg_allocator *a = existing(device);
    if (!a) {
      s.max_split_size = -1;
      for (int d = 0; d < kMaxDevices; ++d)
        if (expseg_allocator *other = existing(d)) {
          (void)expseg_stat(other, "max_split_size", &s.max_split_size);
          break;
        }
      return s;
    }
    if (expseg_glue::fill_device_stats_from(s, a) != 0)
      fail("getDeviceStats", device, EXPSEG_ERR_UNSUPPORTED,
           "this libexpseg lacks keys of torch.cuda.memory_stats(); rebuild the backend");
    return s;
  }
  void resetAccumulatedStats(DeviceIndex device) override {
    if (expseg_allocator *a = existing(device)) expseg_reset_accumulated_stats(a);
  }
  void resetPeakStats(DeviceIndex device) override {
    if (expseg_allocator *a = existing(device)) expseg_reset_peak_stats(a);
  }
  std::pair<size_t, size_t> getMemoryInfo(DeviceIndex device) {
    size_t free_b = 0, total_b = 0;
    check("getMemoryInfo", device, expseg_mem_get_info(alloc_for(device), &free_b, &total_b));
    return {free_b, total_b};
  }

  // ---- CUDAAllocator ----

  void *raw_alloc(size_t nbytes) override {
    DeviceIndex device = c10::cuda::current_device();
    return malloc_on(device, nbytes, c10::cuda::getCurrentCUDAStream(device).stream(),
                     "raw_alloc");
  }
  void *raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    return malloc_on(c10::cuda::current_device(), nbytes, stream, "raw_alloc_with_stream");
  }
  void raw_delete(void *ptr) override {
    if (!ptr) return;
    DeviceIndex cur = c10::cuda::current_device();
    if (free_on(cur, ptr)) return;
    for (int d = 0; d < kMaxDevices; ++d)
      if (d != cur && free_on(d, ptr)) return;
    fail("raw_delete", cur, EXPSEG_ERR_INVALID_ARGUMENT,
         ("invalid device pointer " + ptr_text(ptr) + ": no device's allocator handed it out")
             .c_str());
  }
  // Not CUDAAllocator::init (2.10 asks overrides to call it): it would set the memory
  // fraction on every device, making an allocator (and a CUDA context) on each; expseg reads
  // per_process_memory_fraction from the same configuration when a device is first used.
  void init(int device_count) override {
    expseg_torch_init(device_count);
    device_count_ = device_count;
    initialized_ = true;
  }
  double getMemoryFraction(DeviceIndex device) override {
    return expseg_glue::memory_fraction(alloc_for(device));
  }
  void setMemoryFraction(double fraction, DeviceIndex device) override {
    check("setMemoryFraction", device, expseg_set_memory_fraction(alloc_for(device), fraction));
  }
  std::vector<CCA::StreamSegmentSize> getExpandableSegmentSizes(DeviceIndex device) override {
    // Used by PyTorch to re-create its own expandable segments elsewhere; expseg's
    // segments are its own business.
    fail("getExpandableSegmentSizes", device, EXPSEG_ERR_UNSUPPORTED,
         "expseg does not hand its segment layout to PyTorch");
  }
  void enable(bool value) override {
    TORCH_CHECK(value, "expseg: caching_allocator_enable(False) is not supported: expseg always "
                       "caches; use expseg.empty_cache() or PYTORCH_NO_CUDA_MEMORY_CACHING "
                       "with PyTorch's own allocator");
  }
  bool isEnabled() const override { return true; }
  void cacheInfo(DeviceIndex device, size_t *largestBlock) override {
    expseg_allocator *a = alloc_for(device);
    if (*largestBlock == 0) // as PyTorch: a first guess from the device's free memory
      check("cacheInfo", device, expseg_mem_get_info(a, largestBlock, nullptr));
    int64_t v = 0;
    if (expseg_stat(a, "expseg.largest_free_block", &v) == EXPSEG_OK && (size_t)v > *largestBlock)
      *largestBlock = (size_t)v;
  }
  void *getBaseAllocation(void *ptr, size_t *size) override {
    // Its only user is the legacy IPC path (cudaIpcGetMemHandle), which cannot share memory
    // mapped with cuMemMap anyway; the pointer is its own base.
    (void)size;
    return ptr;
  }
  using CCA::CUDAAllocator::recordStream;
  void recordStream(const c10::DataPtr &ptr, c10::cuda::CUDAStream stream) override {
    if (!ptr.get() || !is_ours(ptr.get_deleter())) return; // as PyTorch: not this allocator's
    int device = ptr.device().index();
    check("recordStream", device,
          expseg_record_stream(alloc_for(device), ptr.get(), stream_of(stream.stream())));
  }

  // snapshot: 2.10 has snapshot(MempoolId_t); 2.11 adds include_traces.
  CCA::SnapshotInfo snapshot(MempoolId mempool_id) { return snapshot_of(mempool_id, true); }
  CCA::SnapshotInfo snapshot(MempoolId mempool_id, bool include_traces) {
    return snapshot_of(mempool_id, include_traces);
  }

  void beginAllocateToPool(DeviceIndex device, MempoolId mempool_id,
                           std::function<bool(cudaStream_t)> filter) override {
    expseg_glue::StreamFilter f = [filter = std::move(filter)](expseg_stream s) {
      return filter(reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(s)));
    };
    check_pool("beginAllocateToPool", device,
               pools_.begin(alloc_for(device), device, pair_of(mempool_id), std::move(f)));
  }
  void endAllocateToPool(DeviceIndex device, MempoolId mempool_id) override {
    check_pool("endAllocateToPool", device,
               pools_.end(alloc_for(device), device, pair_of(mempool_id)));
  }
  void releasePool(DeviceIndex device, MempoolId mempool_id) override {
    check_pool("releasePool", device,
               pools_.release(alloc_for(device), device, pair_of(mempool_id)));
  }
  int getPoolUseCount(DeviceIndex device, MempoolId mempool_id) {
    return pools_.use_count(alloc_for(device), device, pair_of(mempool_id));
  }
  // The allocator argument is a raw pointer in some releases and a shared_ptr in others:
  // both forms, one of them overrides. A pool with its own allocator (MemPool(allocator=...))
  // is refused: expseg pools take their memory from expseg.
  void createOrIncrefPool(DeviceIndex device, MempoolId mempool_id, CCA::CUDAAllocator *other) {
    create_or_incref(device, mempool_id, other);
  }
  void createOrIncrefPool(DeviceIndex device, MempoolId mempool_id,
                          std::shared_ptr<CCA::CUDAAllocator> other) {
    create_or_incref(device, mempool_id, other.get());
  }

  // MemPool(use_on_oom=...): every MemPool's destructor calls it with false, which is what
  // expseg does anyway (a pool's memory serves only that pool); true is refused. 2.10 has
  // only the two-argument form (called for use_on_oom=True); later releases take the flag.
  void setUseOnOOM(DeviceIndex device, MempoolId mempool_id, bool use_on_oom) {
    (void)mempool_id;
    if (use_on_oom)
      fail("setUseOnOOM", device, EXPSEG_ERR_UNSUPPORTED,
           "MemPool(use_on_oom=True) is not supported by expseg: a pool's memory serves only "
           "that pool");
  }
  void setUseOnOOM(DeviceIndex device, MempoolId mempool_id) {
    setUseOnOOM(device, mempool_id, true);
  }

  CCA::ShareableHandle shareIpcHandle(void *ptr) override {
    fail("shareIpcHandle", c10::cuda::current_device(), EXPSEG_ERR_UNSUPPORTED,
         ("sharing " + ptr_text(ptr) +
          " with another process through PyTorch (torch.multiprocessing, CUDA IPC) is not "
          "supported by the expseg backend; expseg_ipc_export/expseg_ipc_import share "
          "allocations from C (docs/ipc.md)")
             .c_str());
  }
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    (void)handle;
    fail("getIpcDevPtr", c10::cuda::current_device(), EXPSEG_ERR_UNSUPPORTED,
         "opening a CUDA IPC handle from another process is not supported by the expseg "
         "backend (docs/ipc.md)");
  }

  bool isHistoryEnabled() { return history_on_.load(); }
  // recordHistory: 2.10 takes (enabled, recorder, max_entries, when, clearHistory); 2.11
  // adds skip_actions. Both forms; one of them overrides.
  void recordHistory(bool enabled, CCA::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, CCA::RecordContext when,
                     bool clearHistory) {
    record_history(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory, {});
  }
  void recordHistory(bool enabled, CCA::CreateContextFn context_recorder,
                     size_t alloc_trace_max_entries, CCA::RecordContext when, bool clearHistory,
                     const std::vector<std::string> &skip_actions) {
    record_history(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory,
                   skip_actions);
  }
  // recordAnnotation, pushCompileContext, popCompileContext, setUserMetadata and
  // getUserMetadata (2.11's signatures; without `override`: 2.10 may lack them): on the
  // current device, as PyTorch; the logic is in backend_glue.h.
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>> &md) {
    if (!history_on_) return; // nothing is kept while off: no allocator made for it
    const int d = c10::cuda::current_device();
    check("recordAnnotation", d, expseg_glue::record_annotation(alloc_for(d), md));
  }
  void pushCompileContext(std::string &md) {
    check("pushCompileContext", c10::cuda::current_device(),
          expseg_glue::push_compile_context(alloc_for(c10::cuda::current_device()), md));
  }
  void popCompileContext() {
    check("popCompileContext", c10::cuda::current_device(),
          expseg_glue::pop_compile_context(alloc_for(c10::cuda::current_device())));
  }
  void setUserMetadata(const std::string &metadata) {
    check("setUserMetadata", c10::cuda::current_device(),
          expseg_glue::set_user_metadata(alloc_for(c10::cuda::current_device()), metadata));
  }
  std::string getUserMetadata() {
    return expseg_glue::user_metadata(existing(c10::cuda::current_device()));
  }

  void attachOutOfMemoryObserver(CCA::OutOfMemoryObserver observer) override {
    {
      std::lock_guard<std::mutex> g(settings_mu_);
      observers_.push_back(std::move(observer));
    }
    gen_.fetch_add(1); // every allocator gets it at its next use
    for (int d = 0; d < kMaxDevices; ++d) (void)existing(d);
  }
#if EXPSEG_TORCH_AT_LEAST_2_12
  void attachOomRejectionObserver(CCA::OomRejectionObserver observer) {
    (void)observer; // expseg refuses over-fraction requests as out of memory: see OOM observers
  }
#endif
  void attachAllocatorTraceTracker(CCA::AllocatorTraceTracker tracker) override {
    (void)tracker;
    fail("attachAllocatorTraceTracker", c10::cuda::current_device(), EXPSEG_ERR_UNSUPPORTED,
         "per-event trace callbacks are not supported by the expseg backend; record history "
         "(torch.cuda.memory._record_memory_history) and take a snapshot instead");
  }
  void enablePeerAccess(DeviceIndex dev, DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled)
      (void)cudaGetLastError();
    else
      C10_CUDA_CHECK(err);
    // dev may now read and write what dev_to_access's allocator maps (every range, now and
    // later: expseg_enable_peer_access).
    check("enablePeerAccess", dev_to_access,
          expseg_enable_peer_access(alloc_for(dev_to_access), dev));
  }
  cudaError_t memcpyAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    if (p2p_enabled || dstDevice == srcDevice)
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }
  std::shared_ptr<CCA::AllocatorState> getCheckpointState(DeviceIndex device,
                                                          MempoolId id) override {
    (void)id;
    fail("getCheckpointState", device, EXPSEG_ERR_UNSUPPORTED,
         "CUDA-graph tree checkpointing is not supported by the expseg backend");
  }
  CCA::CheckpointDelta setCheckpointPoolState(DeviceIndex device,
                                              std::shared_ptr<CCA::AllocatorState> pps) override {
    (void)pps;
    fail("setCheckpointPoolState", device, EXPSEG_ERR_UNSUPPORTED,
         "CUDA-graph tree checkpointing is not supported by the expseg backend");
  }
  std::string name() override { return "expseg"; }

  // ---- deleters: one per device, so a DataPtr knows its allocator without a lookup ----

  static const std::array<c10::DeleterFnPtr, kMaxDevices> &deleters() {
    static const std::array<c10::DeleterFnPtr, kMaxDevices> table =
        make_deleters(std::make_index_sequence<kMaxDevices>());
    return table;
  }

 private:
  struct Device {
    std::atomic<expseg_allocator *> a{nullptr};
    std::atomic<uint64_t> gen{~uint64_t(0)}; // settings generation applied
    size_t observers_attached = 0;           // under settings_mu_
    uint64_t history_gen = 0, clear_gen = 0; // under settings_mu_
  };

  // Runs in destructors: a failure is a warning, never an exception.
  template <int D> static void delete_on(void *p) {
    if (p && g_self && !g_self->free_on(D, p))
      TORCH_WARN(expseg_glue::error_text("free", D, EXPSEG_ERR_INVALID_ARGUMENT,
                                         expseg_last_error()));
  }
  template <std::size_t... I>
  static std::array<c10::DeleterFnPtr, kMaxDevices> make_deleters(std::index_sequence<I...>) {
    return {{&delete_on<(int)I>...}};
  }
  static void raw_delete_any(void *p) {
    if (g_self) g_self->raw_delete(p);
  }
  static bool is_ours(c10::DeleterFnPtr f) {
    for (c10::DeleterFnPtr d : deleters())
      if (d == f) return true;
    return f == &raw_delete_any;
  }
  static std::string ptr_text(const void *p) {
    char b[32];
    std::snprintf(b, sizeof b, "%p", p);
    return b;
  }

  // Slow path of alloc_for: makes the allocator, then applies what changed since.
  expseg_allocator *apply_settings(int device) {
    expseg_allocator *a = expseg_torch_allocator(device, 1);
    if (!a) fail("allocator", device, EXPSEG_ERR_UNSUPPORTED, expseg_torch_last_error(device));
    std::lock_guard<std::mutex> g(settings_mu_);
    Device &d = devs_[device];
    uint64_t gen = gen_.load();
    for (; d.observers_attached < observers_.size(); ++d.observers_attached)
      check("attachOutOfMemoryObserver", device,
            expseg_add_oom_observer(a, &oom_trampoline, &observers_[d.observers_attached]));
    if (history_.clear_gen != d.clear_gen) { // clearHistory: expseg clears when disabled
      check("recordHistory", device, expseg_record_history_ex(a, false, 0, 0));
      d.clear_gen = history_.clear_gen;
      d.history_gen = ~history_.gen;
    }
    if (history_.gen != d.history_gen) {
      check("recordHistory", device,
            expseg_record_history_ex(a, history_.enabled, history_.max_entries, history_.flags));
      d.history_gen = history_.gen;
    }
    d.a.store(a, std::memory_order_release);
    d.gen.store(gen, std::memory_order_release);
    return a;
  }

  static void oom_trampoline(void *ctx, int device, size_t alloc_size, size_t allowed_or_total,
                             size_t device_free) {
    try {
      (*static_cast<CCA::OutOfMemoryObserver *>(ctx))(device, alloc_size, allowed_or_total,
                                                      device_free);
    } catch (...) { // an observer's exception cannot cross the C library
    }
  }

  void *malloc_on(int device, size_t n, cudaStream_t stream, const char *call) {
    expseg_allocator *a = alloc_for(device);
    void *p = nullptr;
    // While history is recorded with stacks: PyTorch's context (Python frames, from its
    // CapturedTraceback recorder), kept per live block for snapshot() as PyTorch does.
    std::shared_ptr<c10::GatheredContext> context;
    if (CCA::CreateContextFn rec = recorder_.load(std::memory_order_relaxed)) context = rec();
    expseg_status st = expseg_malloc(a, n, stream_of(stream), &p);
    if (st != EXPSEG_OK) {
      std::string what = std::string(call) + "(" + std::to_string(n) + " bytes)";
      fail(what.c_str(), device, st, expseg_last_error());
    }
    if (context && p) {
      std::lock_guard<std::mutex> g(contexts_mu_);
      contexts_[p] = std::move(context);
      n_contexts_.store(contexts_.size(), std::memory_order_relaxed);
    }
    return p;
  }
  bool free_on(int device, void *p) {
    expseg_allocator *a = existing(device);
    if (!a || expseg_free(a, p) != EXPSEG_OK) return false;
    if (n_contexts_.load(std::memory_order_relaxed) != 0) {
      std::lock_guard<std::mutex> g(contexts_mu_);
      contexts_.erase(p);
      n_contexts_.store(contexts_.size(), std::memory_order_relaxed);
    }
    return true;
  }
  std::shared_ptr<c10::GatheredContext> context_of(uint64_t address) {
    if (n_contexts_.load(std::memory_order_relaxed) == 0) return nullptr;
    std::lock_guard<std::mutex> g(contexts_mu_);
    auto it = contexts_.find(reinterpret_cast<void *>(static_cast<uintptr_t>(address)));
    return it == contexts_.end() ? nullptr : it->second;
  }

  void create_or_incref(DeviceIndex device, MempoolId id, CCA::CUDAAllocator *other) {
    if (other && other != this)
      fail("createOrIncrefPool", device, EXPSEG_ERR_UNSUPPORTED,
           ("a memory pool with its own allocator (" + other->name() +
            ") cannot be served by expseg; create torch.cuda.MemPool() without one")
               .c_str());
    uint64_t pool = 0;
    check_pool("createOrIncrefPool", device,
               pools_.acquire(alloc_for(device), device, pair_of(id), &pool));
  }

  void record_history(bool enabled, CCA::CreateContextFn recorder, size_t max_entries,
                      CCA::RecordContext when, bool clear,
                      const std::vector<std::string> &skip_actions) {
    unsigned skip = 0;
    std::string bad;
    if (enabled && !expseg_glue::skip_flags(skip_actions, &skip, &bad))
      fail("recordHistory", c10::cuda::current_device(), EXPSEG_ERR_INVALID_ARGUMENT,
           ("skip_actions holds '" + bad + "'; accepted: " + expseg_glue::skip_names())
               .c_str());
    CCA::CreateContextFn keep = enabled && when != CCA::RecordContext::NEVER ? recorder : nullptr;
    {
      std::lock_guard<std::mutex> g(settings_mu_);
      if (enabled && clear) ++history_.clear_gen;
      history_.enabled = enabled;
      history_.max_entries = enabled ? (max_entries ? max_entries : 1) : 0;
      history_.flags = (keep ? EXPSEG_HISTORY_C_STACKS : 0u) | (enabled ? skip : 0u);
      ++history_.gen;
    }
    history_on_ = enabled;
    recorder_.store(keep);
    if (!keep || clear) {
      std::lock_guard<std::mutex> g(contexts_mu_);
      contexts_.clear();
      n_contexts_.store(0);
    }
    gen_.fetch_add(1);
    for (int d = 0; d < kMaxDevices; ++d) (void)existing(d); // applied now where made
  }

  CCA::SnapshotInfo snapshot_of(MempoolId mempool_id, bool include_traces);

  std::array<Device, kMaxDevices> devs_;
  std::atomic<uint64_t> gen_{0};
  std::atomic<bool> initialized_{false};
  std::atomic<bool> history_on_{false};
  std::atomic<CCA::CreateContextFn> recorder_{nullptr};
  int device_count_ = 0;
  std::mutex settings_mu_;
  std::deque<CCA::OutOfMemoryObserver> observers_; // stable addresses: expseg keeps them
  struct History {
    bool enabled = false;
    size_t max_entries = 0;
    unsigned flags = 0;
    uint64_t gen = 0, clear_gen = 0;
  } history_;
  std::mutex contexts_mu_;
  std::unordered_map<void *, std::shared_ptr<c10::GatheredContext>> contexts_;
  std::atomic<size_t> n_contexts_{0};
  PoolMap pools_;
};

} // namespace expseg_backend

namespace expseg_backend {

namespace {

using TraceEntry = CCA::TraceEntry;
using TraceStream = decltype(TraceEntry::stream_);

bool action_of(const char *name, TraceEntry::Action *out) {
  static const std::pair<const char *, TraceEntry::Action> table[] = {
      {"alloc", TraceEntry::ALLOC},
      {"free_requested", TraceEntry::FREE_REQUESTED},
      {"free_completed", TraceEntry::FREE_COMPLETED},
      {"segment_alloc", TraceEntry::SEGMENT_ALLOC},
      {"segment_free", TraceEntry::SEGMENT_FREE},
      {"segment_map", TraceEntry::SEGMENT_MAP},
      {"segment_unmap", TraceEntry::SEGMENT_UNMAP},
      {"snapshot", TraceEntry::SNAPSHOT},
      {"oom", TraceEntry::OOM}};
  for (const auto &kv : table)
    if (std::strcmp(kv.first, name) == 0) {
      *out = kv.second;
      return true;
    }
  return false;
}

// TraceEntry's constructor gained the pool argument between releases: whichever it has.
template <class TE>
TE make_trace_entry(typename TE::Action action, DeviceIndex device, size_t addr, size_t size,
                    TraceStream stream, MempoolId pool) {
  if constexpr (std::is_constructible_v<TE, typename TE::Action, DeviceIndex, size_t, size_t,
                                        TraceStream, MempoolId, c10::approx_time_t>)
    return TE(action, device, addr, size, stream, pool, c10::approx_time_t(0));
  else {
    (void)pool; // this release's TraceEntry has no pool
    return TE(action, device, addr, size, stream, c10::approx_time_t(0));
  }
}

struct SnapshotCtx {
  ExpsegAllocator *self;
  int device;
  CCA::SnapshotInfo *info;
  std::vector<TraceEntry> *trace; // null: the history is walked only for seen
  MempoolId only;                 // {0, 0}: every segment; else that pool's only
  std::set<uint64_t> seen;        // the expseg pools the walk reported
};

MempoolId mempool_of(expseg_glue::PoolPair p) { return MempoolId{p.first, p.second}; }

} // namespace

// snapshot(mempool_id): as PyTorch, a pool other than {0, 0} reports only that pool's
// segments (none where the pool is unknown) and every trace entry.
CCA::SnapshotInfo ExpsegAllocator::snapshot_of(MempoolId mempool_id, bool include_traces) {
  CCA::SnapshotInfo info;
  int n = device_count_ > 0 ? device_count_ : 1;
  info.device_traces.resize((size_t)n);
  for (int d = 0; d < kMaxDevices; ++d) {
    expseg_allocator *a = existing(d);
    if (!a) continue;
    if (d >= (int)info.device_traces.size()) info.device_traces.resize((size_t)d + 1);
    SnapshotCtx c{this, d, &info, include_traces ? &info.device_traces[(size_t)d] : nullptr,
                  mempool_id, {}};
    auto on_segment = [](void *ctx, const expseg_walk_segment *s) {
      auto *c = static_cast<SnapshotCtx *>(ctx);
      if (s->pool != 0) c->seen.insert(s->pool);
      const MempoolId owner = mempool_of(c->self->pools_.pair_of(c->device, s->pool));
      if (c->only != MempoolId{0, 0} && owner != c->only) return;
      CCA::SegmentInfo seg;
      seg.owner_private_pool_id = owner;
      seg.device = static_cast<DeviceIndex>(c->device);
      seg.address = s->address;
      seg.total_size = s->total_size;
      seg.requested_size = s->requested_size;
      seg.allocated_size = s->allocated_size;
      seg.active_size = s->active_size;
      seg.stream = reinterpret_cast<decltype(seg.stream)>(static_cast<uintptr_t>(s->stream));
      seg.is_large = s->is_large;
      seg.is_expandable = s->is_expandable;
      for (size_t i = 0; i < s->n_blocks; ++i) {
        const expseg_walk_block &b = s->blocks[i];
        CCA::BlockInfo bi;
        bi.size = b.size;
        bi.requested_size = b.requested_size;
        bi.allocated = b.state == EXPSEG_BLOCK_ALLOCATED;
        bi.active = b.state != EXPSEG_BLOCK_INACTIVE;
        if (bi.active) bi.context_when_allocated = c->self->context_of(b.address);
        seg.blocks.push_back(std::move(bi));
      }
      c->info->segments.push_back(std::move(seg));
    };
    auto on_event = [](void *ctx, const expseg_walk_event *e) {
      auto *c = static_cast<SnapshotCtx *>(ctx);
      if (e->pool != 0) c->seen.insert(e->pool);
      TraceEntry::Action action;
      if (!c->trace || !action_of(e->action, &action)) return; // not asked, or no name
      TraceEntry te = make_trace_entry<TraceEntry>(
          action, static_cast<DeviceIndex>(c->device), e->addr, e->size,
          reinterpret_cast<TraceStream>(static_cast<uintptr_t>(e->stream)),
          mempool_of(c->self->pools_.pair_of(c->device, e->pool)));
      te.time_.t_ = static_cast<time_t>(e->time_us);
      expseg_glue::set_trace_context(te, e); // compile_context, user_metadata (2.12+)
      c->trace->push_back(std::move(te));
    };
    // context_of takes contexts_mu_ and pair_of the pool names' lock inside the walk (under
    // the allocator's lock): nothing takes them the other way round. The history is walked
    // even without traces, so that names of drained pools can be forgotten.
    const uint64_t mark = pools_.walk_mark();
    check("snapshot", d, expseg_walk(a, on_segment, on_event, &c));
    pools_.forget_unseen(d, mark, c.seen);
  }
  for (int d = 0; d < kMaxDevices; ++d) // recordAnnotation's entries, device by device
    if (expseg_allocator *a = existing(d))
      check("snapshot", d, expseg_glue::fill_annotations(info, a));
  if (expseg_allocator *a = existing(c10::cuda::current_device())) {
    CCA::AllocatorConfigInfo &m = info.config_metadata;
    std::string cfg = expseg_glue::config_string(a), v;
    m.last_allocator_settings = cfg;
    m.expandable_segments =
        expseg_glue::config_value(cfg, "expandable_segments", &v) && v == "True";
    int64_t split = -1;
    (void)expseg_stat(a, "max_split_size", &split);
    m.max_split_size = static_cast<size_t>(split);
    m.garbage_collection_threshold =
        expseg_glue::config_value(cfg, "garbage_collection_threshold", &v) ? std::stod(v) : 0.0;
  }
  return info;
}

} // namespace expseg_backend

// ---- installing it (python/_expseg_cxx.py calls these through ctypes) ----

#define EXPSEG_BACKEND_STR2_(x) #x
#define EXPSEG_BACKEND_STR_(x) EXPSEG_BACKEND_STR2_(x)

extern "C" {

// The PyTorch release the backend was compiled against, "MAJOR.MINOR.PATCH".
__attribute__((visibility("default"))) const char *expseg_torch_backend_torch_version(void) {
  return EXPSEG_BACKEND_STR_(TORCH_VERSION_MAJOR) "." EXPSEG_BACKEND_STR_(
      TORCH_VERSION_MINOR) "." EXPSEG_BACKEND_STR_(TORCH_VERSION_PATCH);
}

// Makes expseg PyTorch's CUDA allocator. 0 on success (also when it already is); else 1
// with one line in err (len bytes): PyTorch's allocator was already used, or the swap failed.
__attribute__((visibility("default"))) int expseg_torch_backend_install(char *err, size_t len) {
  using namespace expseg_backend;
  auto say = [&](const std::string &m) {
    if (err && len) std::snprintf(err, len, "%s", m.c_str());
    return 1;
  };
  try {
    CCA::CUDAAllocator *cur = CCA::allocator.load();
    if (g_self != nullptr && cur == g_self) return 0;
    if (cur != nullptr && cur->initialized())
      return say("expseg: the C++ backend came too late: PyTorch's CUDA allocator (" +
                 cur->name() +
                 ") is already initialized (a CUDA tensor or CUDA call came first); install "
                 "expseg before any CUDA allocation");
    auto a = std::make_shared<ExpsegAllocator>();
    a->init(static_cast<int>(c10::cuda::device_count()));
    g_self = a.get(); // before the swap: deleters of its first blocks need it
    try {
      torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(a); // keeps a alive
    } catch (...) {
      g_self = nullptr;
      throw;
    }
    return 0;
  } catch (const c10::Error &e) {
    return say(e.what_without_backtrace());
  } catch (const std::exception &e) {
    return say(e.what());
  }
}

} // extern "C"
