# SPDX-License-Identifier: Apache-2.0
"""standin_cupy.py: a stand-in `cupy` for expseg.cupy_allocator, after CuPy's documented
interface: cupy.cuda.set_allocator(f) makes f(nbytes) -> cupy.cuda.MemoryPointer the
allocator of cupy.cuda.alloc; cupy.cuda.UnownedMemory(ptr, size, owner, device_id=-1) keeps
`owner` alive as long as the memory is referenced; MemoryPointer(mem, offset);
cupy.cuda.runtime.getDevice(); cupy.cuda.get_current_stream().ptr; `with Device(n)` and
`with Stream()` change the current device and stream.

What a stand-in cannot show: CuPy's own memory pool being bypassed, kernels using the
memory, and CuPy's exact reference counting of the owner (here: plain Python references)."""

import sys
import types


def build():
    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    runtime = types.ModuleType("cupy.cuda.runtime")
    cupy.cuda, cuda.runtime = cuda, runtime
    state = types.SimpleNamespace(device=0, stream=0, allocator=None)
    cupy._state = state
    runtime.getDevice = lambda: state.device

    class Device:
        def __init__(self, index=0):
            self.id = index

        def __enter__(self):
            self._old, state.device = state.device, self.id
            return self

        def __exit__(self, *exc):
            state.device = self._old

    class Stream:
        def __init__(self, ptr=0):
            self.ptr = ptr

        def __enter__(self):
            self._old, state.stream = state.stream, self.ptr
            return self

        def __exit__(self, *exc):
            state.stream = self._old

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device_id=-1):
            self.ptr, self.size, self._owner = ptr, size, owner
            self.device_id = device_id if device_id >= 0 else state.device

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.ptr, self.device_id = mem, mem.ptr + offset, mem.device_id

    def set_allocator(f=None):
        state.allocator = f

    def alloc(size):
        if state.allocator is None:
            raise RuntimeError("stand-in cupy: no allocator set")
        return state.allocator(size)

    cuda.Device, cuda.Stream = Device, Stream
    cuda.UnownedMemory, cuda.MemoryPointer = UnownedMemory, MemoryPointer
    cuda.set_allocator, cuda.alloc = set_allocator, alloc
    cuda.get_current_stream = lambda: Stream(state.stream)
    return cupy


def install():
    cupy = build()
    sys.modules["cupy"] = cupy
    sys.modules["cupy.cuda"] = cupy.cuda
    sys.modules["cupy.cuda.runtime"] = cupy.cuda.runtime
    return cupy
