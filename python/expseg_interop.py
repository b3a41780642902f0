# SPDX-License-Identifier: Apache-2.0
"""expseg_interop.py: expseg as CuPy's allocator and as Numba's EMM plugin (part of the expseg
Python module, split from expseg.py to keep each file short; use them through expseg:

    cupy.cuda.set_allocator(expseg.cupy_allocator)      # CuPy
    NUMBA_CUDA_MEMORY_MANAGER=expseg                     # Numba (expseg._numba_memory_manager)

Numba imports the module the variable names and reads its `_numba_memory_manager`, so the
variable names expseg, not this module). Standard library and ctypes only: CuPy and Numba
are imported by the calls that need them. Everything else (the library, errors, statistics)
is expseg.py's: expseg binds itself here when it loads this file (`_core`); imported alone,
this module imports expseg on first use."""

import ctypes
import importlib

__all__ = ["cupy_allocator", "numba_memory_manager"]

_core = None  # the expseg module (set by expseg.py when it loads this file)


def _expseg():
    global _core
    if _core is None:
        _core = importlib.import_module("expseg")
    return _core


class _Block:
    """Owns one expseg allocation; frees it when the last reference goes (CuPy's
    UnownedMemory keeps it alive, Numba's finalizer calls free)."""
    __slots__ = ("ptr", "size", "device", "stream", "__weakref__")

    def __init__(self, size, device, stream, who):
        self.ptr = None
        core = _expseg()
        lib = core._load()
        ptr = lib.expseg_torch_alloc(size, device, ctypes.c_void_p(stream))
        if not ptr and size:
            raise core.ExpsegError("%s(%d bytes, device %d): %s"
                                   % (who, size, device, core.last_error(device)))
        self.ptr, self.size, self.device, self.stream = ptr or 0, size, device, stream

    def free(self):
        if self.ptr:
            ptr, self.ptr = self.ptr, None
            _core._lib.expseg_torch_free(ctypes.c_void_p(ptr), self.size, self.device,
                                         ctypes.c_void_p(self.stream))

    def __del__(self):
        # at interpreter exit the module or its library may be gone already
        if _core is not None and getattr(_core, "_lib", None) is not None:
            self.free()


# ---- CuPy: cupy.cuda.set_allocator(expseg.cupy_allocator) ----

def cupy_allocator(nbytes):
    """A CuPy allocator: cupy.cuda.set_allocator(expseg.cupy_allocator). Allocates on CuPy's
    current device and stream; the memory goes back to expseg when CuPy drops it."""
    import cupy
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise _expseg().ExpsegError("expseg.cupy_allocator(%r): expected a size in bytes (an "
                                    "int >= 0)" % (nbytes,))
    device = cupy.cuda.runtime.getDevice()
    stream = int(cupy.cuda.get_current_stream().ptr)
    block = _Block(nbytes, device, stream, "expseg.cupy_allocator")
    mem = cupy.cuda.UnownedMemory(block.ptr, nbytes, block, device)
    return cupy.cuda.MemoryPointer(mem, 0)


# ---- Numba: NUMBA_CUDA_MEMORY_MANAGER=expseg, or numba.cuda.set_memory_manager(...) ----

_numba_class = None


def numba_memory_manager():
    """The Numba EMM plugin class (a HostOnlyCUDAMemoryManager: Numba keeps host memory and
    its defer_cleanup, expseg takes device memory and frees at once). Numba finds it as
    expseg._numba_memory_manager when NUMBA_CUDA_MEMORY_MANAGER=expseg."""
    global _numba_class
    if _numba_class is not None:
        return _numba_class
    from numba import cuda
    core = _expseg()

    def device_pointer(ptr):
        from numba.cuda.cudadrv import driver as drv
        if getattr(drv, "USE_NV_BINDING", False):
            return drv.binding.CUdeviceptr(ptr)
        return ctypes.c_uint64(ptr)

    class ExpsegNumbaManager(cuda.HostOnlyCUDAMemoryManager):
        """expseg as Numba's device memory manager (same allocators and statistics as
        expseg.memory_stats and PyTorch)."""

        def initialize(self):
            self._device = int(self.context.device.id)
            core._load()
            core.driver(self._device)  # creates the device's allocator now: errors show here

        def memalloc(self, size):
            block = _Block(int(size), self._device, 0, "expseg Numba memalloc")
            ptr = device_pointer(block.ptr)
            return cuda.MemoryPointer(self.context, ptr, size, finalizer=block.free)

        def get_memory_info(self):
            free, total = core.mem_get_info(self._device)
            return cuda.MemoryInfo(free=free, total=total)

        def get_ipc_handle(self, memory):
            raise core.ExpsegError("expseg's Numba plugin: get_ipc_handle: memory mapped with "
                                   "cuMemMap cannot be shared through cudaIpcGetMemHandle; "
                                   "share it with expseg_ipc_export (docs/ipc.md)")

        def reset(self):
            super().reset()
            core.empty_cache(self._device)

        @property
        def interface_version(self):
            return 1

    _numba_class = ExpsegNumbaManager
    return _numba_class
