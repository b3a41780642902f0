# SPDX-License-Identifier: Apache-2.0
"""standin_torch_strict.py: a stricter stand-in `torch` for expseg's Python route, laid out as
PyTorch 2.11 lays out what the route touches, so that the route cannot lean on shortcuts of
standin_torch.py.

What it keeps from PyTorch (torch/cuda/__init__.py, torch/cuda/memory.py,
torch/accelerator/memory.py, torch/csrc/cuda/CUDAPluggableAllocator.cpp), by behaviour, not
by code:
- a `_C` layer under Python functions: each torch.cuda.memory function calls the current
  allocator through `_C`, and memory_stats, memory_allocated, memory_summary, _dump_snapshot,
  MemPool.snapshot and the deprecated aliases call their sibling functions through the
  module's globals (a function replaced in the module is what they call);
- torch.cuda re-exports only torch.cuda.memory's __all__ (no _snapshot, no
  _record_memory_history there);
- CUDA is initialized lazily by current_device(), set_device(), current_stream(), Stream(),
  torch.cuda.device(), set/get_per_process_memory_fraction and the first CUDA tensor;
  is_initialized() says so; the native allocator is initialized with it, so
  change_current_allocator() then refuses ("Can't swap an already initialized allocator"),
  and a pluggable allocator is initialized when it is made, so a second swap refuses too;
- the pluggable allocator: alloc(size, device, stream) with the current device and its current
  stream, free(ptr, size, device, stream) with what the allocation was given, recordStream a
  no-op, emptyCache and setMemoryFraction no-ops, and getDeviceStats, resetPeakStats,
  resetAccumulatedStats, snapshot, recordHistory, getMemoryFraction and createOrIncrefPool
  (MemPool) raising RuntimeError "... does not yet support X. If you need it, ...";
- memory_stats_as_nested_dict() is {} before CUDA is initialized; torch.accelerator's memory
  calls take a positional-only device_index and give {} before the allocator is initialized;
- torch.empty(*size, dtype=None, device=None) (CPU unless told), Tensor.record_stream a
  method of the C base class refusing anything but a torch.Stream, torch.cuda.Stream a
  torch.Stream whose stream_id is not its cuda_stream, torch.accelerator.current_stream() a
  plain torch.Stream (an id, no cuda_stream);
- caching_allocator_alloc/caching_allocator_delete through the allocator's raw_alloc and
  raw_delete ("Trying to free a pointer not allocated here");
- FutureWarning from memory_cached, max_memory_cached, reset_max_memory_allocated and
  reset_max_memory_cached.

What it cannot show is what standin_torch.py cannot (kernels, real streams, a C++ exception
through ctypes: a *_raising alloc function is called as its non-raising twin and its error is
raised as RuntimeError, as standin_torch.py does).

install() puts the module and its submodules in sys.modules."""

import collections
import contextlib
import ctypes
import inspect
import sys
import types
import warnings

NOT_YET = ("%s does not yet support %s. If you need it, please file an issue describing your "
           "use case.")
DEVICES = 2


def _unsupported(owner, what):
    raise RuntimeError(NOT_YET % (owner, what))


class _Native:
    """PyTorch's own caching allocator, reduced to what happens before it is replaced."""

    def __init__(self):
        self.inited, self.next = False, 0x100000

    def name(self):
        return "native"

    def init(self, n):
        self.inited = True

    def initialized(self):
        return self.inited

    def malloc(self, size, device, stream):
        self.next += max(size, 512)
        return self.next

    def raw_delete(self, ptr):
        pass

    def recordStream(self, ptr, stream):
        pass

    def getDeviceStats(self, device):
        return {}

    def resetPeakStats(self, device):
        pass

    resetAccumulatedStats = resetPeakStats

    def emptyCache(self):
        pass

    def setMemoryFraction(self, fraction, device):
        pass

    def getMemoryFraction(self, device):
        return 1.0

    def snapshot(self):
        return {"segments": [], "device_traces": []}

    def recordHistory(self, *args):
        pass

    def createOrIncrefPool(self, device, pool):
        pass


class _Pluggable:
    """CUDAPluggableAllocator.cpp: alloc and free function pointers, initialized when made."""

    def __init__(self, alloc, free, raising):
        self.alloc, self.free, self.raising = alloc, free, raising
        self.metadata, self.inited = {}, False

    def name(self):
        return "pluggable"

    def init(self, n):
        self.inited = True

    def initialized(self):
        return self.inited

    def malloc(self, size, device, stream):
        r = self.alloc(size, device, ctypes.c_void_p(stream))
        if self.raising is not None and not r and size > 0:
            self.raising(device)
        self.metadata[r or 0] = (size, device, stream)
        return r or 0

    def raw_delete(self, ptr):
        if ptr not in self.metadata:
            raise RuntimeError("Trying to free a pointer not allocated here")
        size, device, stream = self.metadata.pop(ptr)
        self.free(ctypes.c_void_p(ptr), size, device, ctypes.c_void_p(stream))

    def recordStream(self, ptr, stream):
        pass  # no record_stream_fn from Python

    def emptyCache(self):
        pass  # no reset_fn from Python

    def setMemoryFraction(self, fraction, device):
        pass  # no memory_fraction_fn from Python

    def __getattr__(self, what):  # every other allocator call
        if what in ("getDeviceStats", "resetPeakStats", "resetAccumulatedStats", "snapshot",
                    "recordHistory", "getMemoryFraction"):
            return lambda *a: _unsupported("CUDAPluggableAllocator", what)
        if what == "createOrIncrefPool":
            return lambda *a: _unsupported("pluggable", what)
        raise AttributeError(what)


_RAISING = {}  # alloc function address -> (the non-raising twin, its error reporter)


def build():
    torch = types.ModuleType("torch")
    C = types.ModuleType("torch._C")
    cuda = types.ModuleType("torch.cuda")
    memory = types.ModuleType("torch.cuda.memory")
    graphs = types.ModuleType("torch.cuda.graphs")
    accel = types.ModuleType("torch.accelerator")
    accel_memory = types.ModuleType("torch.accelerator.memory")
    torch._C, torch.cuda, cuda.memory, cuda.graphs = C, cuda, memory, graphs
    torch.accelerator, accel.memory = accel, accel_memory
    st = types.SimpleNamespace(initialized=False, device=0, allocator=_Native(),
                               streams={d: 0 for d in range(DEVICES)}, next_stream=1)
    torch._state = st

    # ---- devices and streams (torch/cuda/__init__.py) ----
    class device:
        def __init__(self, type, index=None):
            if isinstance(type, int):
                type, index = "cuda", type
            kind, _, idx = str(type).partition(":")
            if kind not in ("cuda", "cpu"):
                raise RuntimeError("Expected one of cpu, cuda device type at start of device "
                                   "string: %s" % type)
            self.type = kind
            self.index = int(idx) if idx else index

        def __eq__(self, other):
            return isinstance(other, device) and (self.type, self.index) == (other.type,
                                                                             other.index)

        def __repr__(self):
            return "device(type=%r%s)" % (self.type, "" if self.index is None
                                          else ", index=%d" % self.index)

    torch.device = device

    def _get_device_index(d, optional=False):
        if isinstance(d, str):
            d = device(d)
        if isinstance(d, device):
            if d.type != "cuda":
                raise ValueError("Expected a cuda device, but got: %s" % (d,))
            d = d.index
        if d is None:
            if not optional:
                raise ValueError("Expected a torch.device with a specified index or an integer, "
                                 "but got:%s" % d)
            return current_device()
        return int(d)

    def _lazy_init():
        if not st.initialized:
            st.initialized = True
            st.allocator.init(DEVICES)

    def current_device():
        _lazy_init()
        return st.device

    def set_device(d):
        d = _get_device_index(d)
        if d >= 0:
            _lazy_init()
            st.device = d

    class _device_ctx:
        def __init__(self, d):
            self.idx = _get_device_index(d, optional=True)

        def __enter__(self):
            _lazy_init()
            self.prev, st.device = st.device, self.idx

        def __exit__(self, *exc):
            st.device = self.prev
            return False

    class Stream:  # torch.Stream: any device type; an id, no cuda_stream
        def __init__(self, device=None, priority=0, **kwargs):
            _lazy_init()
            if "stream_id" in kwargs:
                self.stream_id = kwargs["stream_id"]
                self.device_index = kwargs.get("device_index", st.device)
            else:
                self.stream_id = 0x20 + 2 * st.next_stream  # not the pointer: an encoded id
                st.next_stream += 1
                self.device_index = st.device if device is None else _get_device_index(device)
            self.device_type = 1

    class CudaStream(Stream):
        @property
        def cuda_stream(self):
            return 0 if self.stream_id == 0 else 0x7f0000 + self.stream_id * 0x10

        def __repr__(self):
            return "<torch.cuda.Stream device=cuda:%d cuda_stream=%#x>" % (
                self.device_index, self.cuda_stream)

    torch.Stream, cuda.Stream = Stream, CudaStream
    cuda.streams = types.SimpleNamespace(Stream=CudaStream)

    def current_stream(device=None):
        _lazy_init()
        d = st.device if device is None else _get_device_index(device, optional=True)
        return CudaStream(stream_id=st.streams[d], device_index=d)

    @contextlib.contextmanager
    def stream(s):
        prev, st.streams[s.device_index] = st.streams[s.device_index], s.stream_id
        try:
            yield
        finally:
            st.streams[s.device_index] = prev

    def accelerator_current_stream(device=None):  # a torch.Stream, not a torch.cuda.Stream
        s = current_stream(device)
        return Stream(stream_id=s.stream_id, device_index=s.device_index)

    cuda.is_available = lambda: True
    cuda.is_initialized = lambda: st.initialized
    cuda._lazy_init, cuda.current_device, cuda.set_device = _lazy_init, current_device, set_device
    cuda.device_count = lambda: DEVICES
    cuda.device, cuda.current_stream, cuda.stream = _device_ctx, current_stream, stream
    cuda._get_device_index = _get_device_index
    cuda.synchronize = lambda device=None: _lazy_init()

    # ---- tensors ----
    class UntypedStorage:
        def __init__(self, ptr, nbytes, allocator):
            self._ptr, self._n, self._a = ptr, nbytes, allocator

        def data_ptr(self):
            return self._ptr

        def nbytes(self):
            return self._n

        def __del__(self):
            if self._ptr and self._a is not None:  # a null DataPtr calls no deleter
                self._a.raw_delete(self._ptr)

    class TensorBase:  # torch._C.TensorBase: record_stream is its (C++) method
        def record_stream(self, stream):
            if not isinstance(stream, Stream):
                raise TypeError("record_stream(): argument 'stream' (position 1) must be "
                                "Stream, not %s" % type(stream).__name__)
            if self.is_cuda:
                st.allocator.recordStream(self._storage.data_ptr(), stream)

    class Tensor(TensorBase):
        def __init__(self, storage, dev):
            self._storage, self.device = storage, dev
            self.is_cuda = dev.type == "cuda"

        def untyped_storage(self):
            return self._storage

        def data_ptr(self):
            return self._storage.data_ptr()

    C.TensorBase, torch.Tensor = TensorBase, Tensor
    torch.uint8, torch.float32 = ("uint8", 1), ("float32", 4)

    def empty(*size, dtype=None, device=None):
        if len(size) == 1 and isinstance(size[0], (tuple, list)):
            size = tuple(size[0])
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in size):
            raise TypeError("empty() received an invalid combination of arguments")
        n = (dtype or torch.float32)[1]
        for s in size:
            n *= s
        dev = device if isinstance(device, torch.device) else torch.device(device or "cpu") \
            if not isinstance(device, int) else torch.device("cuda", device)
        if dev.type != "cuda":
            return Tensor(UntypedStorage(0, n, None), dev)
        _lazy_init()
        index = st.device if dev.index is None else dev.index
        with _device_ctx(index):
            ptr = st.allocator.malloc(n, index, current_stream().cuda_stream)
        return Tensor(UntypedStorage(ptr, n, st.allocator), torch.device("cuda", index))

    torch.empty = empty

    # ---- torch._C: the allocator calls ----
    def custom_allocator(alloc_addr, free_addr):
        alloc_t = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                   ctypes.c_void_p)
        free_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                  ctypes.c_void_p)
        twin, raising = _RAISING.get(alloc_addr, (None, None))
        a = _Pluggable(twin or alloc_t(alloc_addr), free_t(free_addr), raising)
        a.init(0)  # createCustomAllocator: allocator->init(device_count)
        return a

    def change_allocator(a):
        if st.allocator.initialized():
            raise RuntimeError("Can't swap an already initialized allocator")
        st.allocator = a

    def memory_snapshot_c(arg):
        return st.allocator.snapshot()

    C._cuda_customAllocator, C._cuda_changeCurrentAllocator = custom_allocator, change_allocator
    C._cuda_getAllocator = lambda: st.allocator
    C._cuda_getAllocatorBackend = lambda: st.allocator.name()
    C._cuda_memoryStats = lambda d: st.allocator.getDeviceStats(d)
    C._cuda_resetPeakMemoryStats = lambda d: st.allocator.resetPeakStats(d)
    C._cuda_resetAccumulatedMemoryStats = lambda d: st.allocator.resetAccumulatedStats(d)
    C._cuda_emptyCache = lambda: st.allocator.emptyCache()
    C._cuda_setMemoryFraction = lambda f, d: st.allocator.setMemoryFraction(f, d)
    C._cuda_getMemoryFraction = lambda d: st.allocator.getMemoryFraction(d)
    C._cuda_memorySnapshot = memory_snapshot_c
    C._cuda_record_memory_history = lambda *a: st.allocator.recordHistory(*a)
    C._cuda_record_memory_history_legacy = lambda *a: st.allocator.recordHistory(*a)
    C._cuda_cudaCachingAllocator_raw_alloc = lambda size, stream: st.allocator.malloc(
        size, current_device(), stream)
    C._cuda_cudaCachingAllocator_raw_delete = lambda ptr: st.allocator.raw_delete(ptr)
    C._cuda_cudaMemGetInfo = lambda d: (16 << 30, 16 << 30)
    C._accelerator_isAllocatorInitialized = lambda: st.allocator.initialized()
    C._accelerator_getDeviceStats = C._cuda_memoryStats
    C._accelerator_resetPeakStats = C._cuda_resetPeakMemoryStats
    C._accelerator_resetAccumulatedStats = C._cuda_resetAccumulatedMemoryStats
    C._accelerator_emptyCache = C._cuda_emptyCache
    C._accelerator_getMemoryInfo = C._cuda_cudaMemGetInfo

    _build_memory(torch, memory, cuda, C, st)
    _build_accelerator(torch, accel, accel_memory, C)
    accel.current_stream = accelerator_current_stream
    _build_graphs_and_profiler(torch, cuda, graphs)
    return torch


def _build_memory(torch, memory, cuda, C, st):
    """torch.cuda.memory: each function through _C or through its siblings (module globals)."""
    g = memory.__dict__
    dev = cuda._get_device_index
    g["__all__"] = [
        "caching_allocator_alloc", "caching_allocator_delete", "get_per_process_memory_fraction",
        "set_per_process_memory_fraction", "empty_cache", "memory_stats",
        "memory_stats_as_nested_dict", "reset_accumulated_memory_stats",
        "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
        "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
        "memory_cached", "max_memory_cached", "memory_snapshot", "memory_summary",
        "mem_get_info", "get_allocator_backend", "CUDAPluggableAllocator",
        "change_current_allocator", "MemPool", "use_mem_pool"]

    def caching_allocator_alloc(size, device=None, stream=None):
        device = dev(cuda.current_device() if device is None else device)
        if stream is None:
            stream = cuda.current_stream(device)
        if isinstance(stream, cuda.Stream):
            stream = stream.cuda_stream
        if not isinstance(stream, int):
            raise TypeError("Invalid type for stream argument, must be `torch.cuda.Stream` or "
                            "`int` representing a pointer to an existing stream")
        with cuda.device(device):
            return C._cuda_cudaCachingAllocator_raw_alloc(size, stream)

    def caching_allocator_delete(mem_ptr):
        C._cuda_cudaCachingAllocator_raw_delete(mem_ptr)

    def set_per_process_memory_fraction(fraction, device=None):
        cuda._lazy_init()
        device = dev(cuda.current_device() if device is None else device)
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if fraction < 0 or fraction > 1:
            raise ValueError("Invalid fraction value: %s. Allowed range: 0~1" % fraction)
        C._cuda_setMemoryFraction(fraction, device)

    def get_per_process_memory_fraction(device=None):
        cuda._lazy_init()
        return C._cuda_getMemoryFraction(dev(cuda.current_device() if device is None
                                             else device))

    def empty_cache():
        if cuda.is_initialized():
            C._cuda_emptyCache()

    def memory_stats(device=None):
        result = []

        def add(prefix, obj):
            if isinstance(obj, dict):
                for k, v in obj.items():
                    add((prefix + "." if prefix else "") + str(k), v)
            else:
                result.append((prefix, obj))
        add("", g["memory_stats_as_nested_dict"](device=device))
        result.sort()
        return collections.OrderedDict(result)

    def memory_stats_as_nested_dict(device=None):
        if not cuda.is_initialized():
            return {}
        return C._cuda_memoryStats(dev(device, optional=True))

    def reset_accumulated_memory_stats(device=None):
        return C._cuda_resetAccumulatedMemoryStats(dev(device, optional=True))

    def reset_peak_memory_stats(device=None):
        return C._cuda_resetPeakMemoryStats(dev(device, optional=True))

    def _renamed(name, target, doc):
        def f(device=None):
            warnings.warn(doc, FutureWarning, stacklevel=2)
            return g[target](device=device)
        f.__name__ = name
        return f

    def _stat(name, key):
        def f(device=None):
            return g["memory_stats"](device=device).get(key, 0)
        f.__name__ = name
        return f

    def memory_snapshot(mempool_id=None, include_traces=True):
        return C._cuda_memorySnapshot((0, 0, include_traces))["segments"]

    def memory_summary(device=None, abbreviated=False):
        device = dev(device, optional=True)
        stats = g["memory_stats"](device=device)
        return "|PyTorch CUDA memory summary, device ID %d| allocated %d|\n" % (
            device, stats["allocated_bytes.all.current"])

    def mem_get_info(device=None):
        return C._cuda_cudaMemGetInfo(dev(cuda.current_device() if device is None else device,
                                          optional=True))

    def _record_memory_history_legacy(enabled, record_context=True, trace_alloc_max_entries=1,
                                      trace_alloc_record_context=False, device=None,
                                      record_context_cpp=False, clear_history=False,
                                      compile_context=False, global_record_annotations=False,
                                      skip_actions=None):
        C._cuda_record_memory_history_legacy(enabled, record_context, trace_alloc_max_entries)

    def _record_memory_history(enabled="all", *args, **kwargs):
        if isinstance(enabled, bool):
            return g["_record_memory_history_legacy"](enabled, *args, **kwargs)
        return g["_record_memory_history_impl"](enabled, *args, **kwargs)

    def _record_memory_history_impl(enabled="all", context="all", stacks="all",
                                    max_entries=sys.maxsize, device=None, clear_history=False,
                                    compile_context=False, global_record_annotations=False,
                                    skip_actions=None):
        C._cuda_record_memory_history(enabled, context, stacks, max_entries)

    _record_memory_history.__signature__ = inspect.signature(_record_memory_history_impl)

    def _snapshot(device=None, augment_with_fx_traces=False):
        return C._cuda_memorySnapshot(None)

    def _dump_snapshot(filename="dump_snapshot.pickle", augment_with_fx_traces=False):
        import pickle
        s = g["_snapshot"](augment_with_fx_traces=augment_with_fx_traces)
        with open(filename, "wb") as f:
            pickle.dump(s, f)

    class _CUDAAllocator:
        def __init__(self, allocator):
            self._allocator = allocator

        def allocator(self):
            return self._allocator

    class CUDAPluggableAllocator(_CUDAAllocator):
        def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
            allocator = ctypes.CDLL(path_to_so_file)
            alloc_fn = ctypes.cast(getattr(allocator, alloc_fn_name), ctypes.c_void_p).value
            free_fn = ctypes.cast(getattr(allocator, free_fn_name), ctypes.c_void_p).value
            if alloc_fn_name.endswith("_raising"):  # see the module's note
                _RAISING[alloc_fn] = _raising_twin(allocator, alloc_fn_name)
            self._allocator = C._cuda_customAllocator(alloc_fn, free_fn)

    def change_current_allocator(allocator):
        C._cuda_changeCurrentAllocator(allocator.allocator())

    class MemPool:
        def __init__(self, allocator=None, use_on_oom=False, no_split=False):
            st.allocator.createOrIncrefPool(cuda.current_device(), (0, 1))
            self.id = (0, 1)

        def snapshot(self, include_traces=True):
            return cuda.memory_snapshot(self.id, include_traces=include_traces)

    @contextlib.contextmanager
    def use_mem_pool(pool, device=None):
        yield  # a MemPool cannot be made on the pluggable allocator: never reached

    defined = dict(locals())
    g.update({k: v for k, v in defined.items() if callable(v) and not k.startswith("__")
              and k not in ("dev", "_renamed", "_stat")})
    for name, key in (("memory_allocated", "allocated_bytes.all.current"),
                      ("max_memory_allocated", "allocated_bytes.all.peak"),
                      ("memory_reserved", "reserved_bytes.all.current"),
                      ("max_memory_reserved", "reserved_bytes.all.peak")):
        g[name] = _stat(name, key)
    for name, target in (("memory_cached", "memory_reserved"),
                         ("max_memory_cached", "max_memory_reserved")):
        g[name] = _renamed(name, target, "`torch.cuda.%s` has been renamed to `torch.cuda.%s`"
                           % (name, target))
    for name in ("reset_max_memory_allocated", "reset_max_memory_cached"):
        g[name] = _renamed(name, "reset_peak_memory_stats", "torch.cuda.%s now calls "
                           "torch.cuda.reset_peak_memory_stats, which resets /all/ peak memory "
                           "stats." % name)
    g["get_allocator_backend"] = C._cuda_getAllocatorBackend
    for name in g["__all__"]:  # from .memory import *
        setattr(cuda, name, g[name])


def _raising_twin(lib, name):
    twin = getattr(lib, name[:-len("_raising")])
    twin.restype, twin.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int,
                                                    ctypes.c_void_p]
    err, status, sname = lib.expseg_torch_last_error, lib.expseg_torch_alloc_status, \
        lib.expseg_status_name
    err.restype, err.argtypes = ctypes.c_char_p, [ctypes.c_int]
    sname.restype, sname.argtypes = ctypes.c_char_p, [ctypes.c_int]

    def raising(device):
        s = status()
        head = ("CUDA out of memory (expseg): " if s == 1 else
                "expseg could not allocate (%s): " % sname(s).decode())
        raise RuntimeError(head + (err(device) or b"").decode())
    return twin, raising


def _build_accelerator(torch, accel, mem, C):
    """torch.accelerator's memory calls: positional-only device_index."""
    def index(d):
        return torch.cuda._get_device_index(d, optional=True)

    def memory_stats(device_index=None, /):
        if not C._accelerator_isAllocatorInitialized():
            return collections.OrderedDict()
        flat = []

        def add(prefix, v):
            if isinstance(v, dict):
                for k, x in v.items():
                    add("%s.%s" % (prefix, k) if prefix else k, x)
            else:
                flat.append((prefix, v))
        add("", C._accelerator_getDeviceStats(index(device_index)))
        return collections.OrderedDict(sorted(flat))

    def _stat(key):
        return lambda device_index=None, /: mem.memory_stats(device_index).get(key, 0)

    mem.memory_stats = memory_stats
    mem.memory_allocated = _stat("allocated_bytes.all.current")
    mem.max_memory_allocated = _stat("allocated_bytes.all.peak")
    mem.memory_reserved = _stat("reserved_bytes.all.current")
    mem.max_memory_reserved = _stat("reserved_bytes.all.peak")
    mem.empty_cache = lambda: C._accelerator_emptyCache() \
        if C._accelerator_isAllocatorInitialized() else None
    mem.reset_peak_memory_stats = lambda device_index=None, /: C._accelerator_resetPeakStats(
        index(device_index))
    mem.reset_accumulated_memory_stats = lambda device_index=None, /: \
        C._accelerator_resetAccumulatedStats(index(device_index))
    mem.get_memory_info = lambda device_index=None, /: C._accelerator_getMemoryInfo(
        index(device_index))
    for name in ("empty_cache", "get_memory_info", "max_memory_allocated",
                 "max_memory_reserved", "memory_allocated", "memory_reserved", "memory_stats",
                 "reset_accumulated_memory_stats", "reset_peak_memory_stats"):
        setattr(accel, name, getattr(mem, name))


def _build_graphs_and_profiler(torch, cuda, graphs):
    class _CUDAGraph:  # torch._C._CUDAGraph
        captured = 0

        def capture_begin(self, pool=None, capture_error_mode="global"):
            _CUDAGraph.captured += 1

        def capture_end(self):
            pass

    class CUDAGraph(_CUDAGraph):
        def capture_begin(self, pool=None, capture_error_mode="global"):
            super().capture_begin(pool=pool, capture_error_mode=capture_error_mode)

    class graph:
        def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
            self.cuda_graph, self.pool = cuda_graph, () if pool is None else (pool,)

        def __enter__(self):
            cuda.synchronize()
            cuda.empty_cache()
            self.cuda_graph.capture_begin(*self.pool)

        def __exit__(self, *exc):
            self.cuda_graph.capture_end()
            return False

    graphs.CUDAGraph, graphs.graph = CUDAGraph, graph
    cuda.CUDAGraph, cuda.graph = CUDAGraph, graph

    autograd = types.ModuleType("torch.autograd")
    profiler = types.ModuleType("torch.autograd.profiler")
    tprofiler = types.ModuleType("torch.profiler")

    class record_function(contextlib.ContextDecorator):
        def __init__(self, name, args=None):
            self.name, self.args = name, args

        def __enter__(self):
            return self

        def __exit__(self, exc_type, exc_value, traceback):
            return None

    profiler.record_function = tprofiler.record_function = record_function
    torch.autograd, autograd.profiler, torch.profiler = autograd, profiler, tprofiler


def install():
    torch = build()
    for name, mod in (("torch", torch), ("torch._C", torch._C), ("torch.cuda", torch.cuda),
                      ("torch.cuda.memory", torch.cuda.memory),
                      ("torch.cuda.graphs", torch.cuda.graphs),
                      ("torch.accelerator", torch.accelerator),
                      ("torch.accelerator.memory", torch.accelerator.memory),
                      ("torch.autograd", torch.autograd),
                      ("torch.autograd.profiler", torch.autograd.profiler),
                      ("torch.profiler", torch.profiler)):
        sys.modules[name] = mod
    return torch
