# SPDX-License-Identifier: Apache-2.0
"""standin_torch.py: a stand-in `torch` module for testing expseg's Python route without
PyTorch or a GPU.

It mimics what PyTorch (2.5-2.11) offers to a CUDAPluggableAllocator made from Python
(torch/cuda/memory.py, torch/csrc/cuda/CUDAPluggableAllocator.cpp):
- torch.cuda.memory.CUDAPluggableAllocator(path, alloc_name, free_name) loads the library
  with ctypes and change_current_allocator() makes it the allocator (refused once a tensor
  was made: "Can't swap an already initialized allocator");
- torch.empty(n, device=...) allocates through alloc_fn(size, device, stream) on the
  current stream, and a tensor's last reference frees through free_fn(ptr, size, device,
  stream);
- the memory calls raise as PyTorch's do for a pluggable allocator ("CUDAPluggableAllocator
  does not yet support ..."), empty_cache() and set_per_process_memory_fraction() do nothing,
  and Tensor.record_stream() is dropped: so a test sees whether expseg replaced them;
- torch.cuda.X is torch.cuda.memory.X re-exported (as `from .memory import *`);
- torch.autograd.profiler.record_function (= torch.profiler.record_function) is a context
  manager and decorator that reports nothing to the allocator (as PyTorch's, whose
  annotations reach only its native allocator).

What a stand-in cannot show: that PyTorch's real functions look themselves up where expseg
patches them in every version, that kernels run on the memory, and real stream ordering
(host and sim complete work at once unless a test holds a stream).

install() puts the module (and torch.cuda, torch.cuda.memory) in sys.modules."""

import contextlib
import ctypes
import sys
import types


class Unsupported(RuntimeError):
    pass


def _unsupported(what):
    def f(*args, **kwargs):
        raise Unsupported("CUDAPluggableAllocator does not yet support %s. If you need it, "
                          "please file an issue describing your use case." % what)
    return f


def build():
    torch = types.ModuleType("torch")
    cuda = types.ModuleType("torch.cuda")
    memory = types.ModuleType("torch.cuda.memory")
    accelerator = types.ModuleType("torch.accelerator")
    torch.cuda, cuda.memory, torch.accelerator = cuda, memory, accelerator
    state = types.SimpleNamespace(allocator=None, initialized=False, device=0,
                                  stream=0, swapped=False)
    torch._state = state

    class device:
        def __init__(self, spec, index=None):
            if isinstance(spec, int):
                spec, index = "cuda", spec
            kind, _, idx = str(spec).partition(":")
            self.type = kind
            self.index = int(idx) if idx else index

        def __repr__(self):
            return "device(type=%r, index=%r)" % (self.type, self.index)

    torch.device = device

    class Stream:
        def __init__(self, stream_ptr=None, device=None, **kwargs):
            self.cuda_stream = stream_ptr if stream_ptr is not None else 0
            self.device_index = state.device

    cuda.Stream = Stream
    cuda.current_stream = lambda device=None: Stream(state.stream)
    cuda.is_available = lambda: True
    cuda.is_initialized = lambda: state.initialized
    cuda.current_device = lambda: state.device
    cuda.device_count = lambda: 2

    def set_device(d):
        state.device = d

    cuda.set_device = set_device

    class Storage:
        def __init__(self, ptr, size, dev, stream):
            self.ptr, self.size, self.dev, self.stream = ptr, size, dev, stream

        def data_ptr(self):
            return self.ptr

        def __del__(self):
            if self.ptr and state.allocator is not None:
                state.allocator._free(self.ptr, self.size, self.dev, self.stream)

    class Tensor:
        def __init__(self, storage):
            self._storage = storage

        def untyped_storage(self):
            return self._storage

        def data_ptr(self):
            return self._storage.ptr

        def record_stream(self, stream):
            if not isinstance(stream, Stream):
                raise TypeError("record_stream(): argument 'stream' must be Stream")
            # PyTorch calls the allocator's recordStream; a pluggable allocator made from
            # Python has no record_stream_fn: nothing happens.

    torch.Tensor = Tensor

    def empty(nbytes, device="cuda"):
        dev = torch.device(device) if not isinstance(device, torch.device) else device
        index = dev.index if dev.index is not None else state.device
        if state.allocator is None:
            raise RuntimeError("stand-in torch: no allocator (install expseg first)")
        state.initialized = True
        # as PyTorch's CUDAPluggableAllocator: the pointer is not checked (a NULL is a tensor
        # with no memory); only an exception from the alloc function raises
        ptr = state.allocator._alloc(nbytes, index, state.stream)
        return Tensor(Storage(ptr or 0, nbytes, index, state.stream))

    torch.empty = empty

    class CUDAPluggableAllocator:
        # What this stand-in cannot show: a C++ exception from the alloc function. ctypes
        # cannot catch one, so for a *_raising function it calls the C function of the same
        # name without the suffix and raises RuntimeError where PyTorch's C++ would have
        # translated the exception (the raising function itself is tested from C++).
        def __init__(self, path, alloc_name, free_name):
            lib = ctypes.CDLL(path)
            getattr(lib, alloc_name)  # PyTorch resolves the name it was given
            self._raises = alloc_name.endswith("_raising")
            self._a = getattr(lib, alloc_name[:-len("_raising")] if self._raises else alloc_name)
            self._a.restype = ctypes.c_void_p
            self._a.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            self._err = lib.expseg_torch_last_error
            self._err.restype, self._err.argtypes = ctypes.c_char_p, [ctypes.c_int]
            self._status = lib.expseg_torch_alloc_status  # the raising function's heading
            self._name = lib.expseg_status_name
            self._name.restype, self._name.argtypes = ctypes.c_char_p, [ctypes.c_int]
            self._f = getattr(lib, free_name)
            self._f.restype = None
            self._f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]

        def _alloc(self, size, dev, stream):
            p = self._a(size, dev, ctypes.c_void_p(stream))
            if self._raises and not p and size > 0:
                st = self._status()
                head = ("CUDA out of memory (expseg): " if st == 1 else
                        "expseg could not allocate (%s): " % self._name(st).decode())
                raise RuntimeError(head + (self._err(dev) or b"").decode())
            return p

        def _free(self, ptr, size, dev, stream):
            self._f(ctypes.c_void_p(ptr), size, dev, ctypes.c_void_p(stream))

    def change_current_allocator(a):
        if state.initialized:
            raise RuntimeError("Can't swap an already initialized allocator")
        state.allocator = a
        state.swapped = True

    memory.CUDAPluggableAllocator = CUDAPluggableAllocator

    graphs = types.ModuleType("torch.cuda.graphs")

    class CUDAGraph:  # PyTorch's Python subclass of torch._C._CUDAGraph, reduced
        captured = 0

        def capture_begin(self, pool=None, capture_error_mode="global"):
            CUDAGraph.captured += 1

    graphs.CUDAGraph = CUDAGraph
    cuda.graphs, cuda.CUDAGraph = graphs, CUDAGraph
    memory.change_current_allocator = change_current_allocator
    memory.get_allocator_backend = lambda: "pluggable" if state.swapped else "native"

    # What PyTorch does for these under a CUDAPluggableAllocator made from Python.
    stats = _unsupported("getDeviceStats")
    for name in ("memory_stats", "memory_stats_as_nested_dict", "memory_allocated",
                 "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                 "memory_cached", "max_memory_cached", "memory_summary"):
        setattr(memory, name, stats)
    for name in ("reset_peak_memory_stats", "reset_max_memory_allocated",
                 "reset_max_memory_cached"):
        setattr(memory, name, _unsupported("resetPeakStats"))
    memory.reset_accumulated_memory_stats = _unsupported("resetAccumulatedStats")
    memory._record_memory_history = _unsupported("recordHistory")
    memory._snapshot = _unsupported("snapshot")
    memory.memory_snapshot = _unsupported("snapshot")
    memory.get_per_process_memory_fraction = _unsupported("getMemoryFraction")
    memory._dump_snapshot = _unsupported("snapshot")
    memory.empty_cache = lambda: None                                  # does nothing
    memory.set_per_process_memory_fraction = lambda fraction, device=None: None
    memory.mem_get_info = lambda device=None: (0, 0)                   # cudaMemGetInfo
    for name in dir(memory):  # from .memory import *
        if not name.startswith("__"):
            setattr(cuda, name, getattr(memory, name))
    for name in ("memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "reset_peak_memory_stats",
                 "reset_accumulated_memory_stats"):
        setattr(accelerator, name, _unsupported("getDeviceStats"))
    accelerator.empty_cache = lambda: None

    # torch.autograd.profiler.record_function (also torch.profiler.record_function): a user
    # scope. PyTorch's own _record_memory_history registers a RecordFunction callback that
    # reports each scope's start and end to the allocator's recordAnnotation; an allocator
    # made from Python gets nothing from it (the callback calls the native allocator).
    autograd = types.ModuleType("torch.autograd")
    profiler = types.ModuleType("torch.autograd.profiler")
    tprofiler = types.ModuleType("torch.profiler")

    class record_function(contextlib.ContextDecorator):
        def __init__(self, name, args=None):
            self.name, self.args = name, args

        def __enter__(self):
            state.scopes.append(self.name)
            return self

        def __exit__(self, *exc):
            state.scopes.pop()
            return None

    state.scopes = []
    profiler.record_function = tprofiler.record_function = record_function
    torch.autograd, autograd.profiler, torch.profiler = autograd, profiler, tprofiler
    return torch


def install():
    torch = build()
    sys.modules["torch"] = torch
    sys.modules["torch.cuda"] = torch.cuda
    sys.modules["torch.cuda.memory"] = torch.cuda.memory
    sys.modules["torch.cuda.graphs"] = torch.cuda.graphs
    sys.modules["torch.accelerator"] = torch.accelerator
    sys.modules["torch.autograd"] = torch.autograd
    sys.modules["torch.autograd.profiler"] = torch.autograd.profiler
    sys.modules["torch.profiler"] = torch.profiler
    return torch
