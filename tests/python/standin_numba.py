# SPDX-License-Identifier: Apache-2.0
"""standin_numba.py: a stand-in `numba` (numba.cuda) for expseg's EMM plugin, after Numba's
documented External Memory Management interface: the plugin subclasses
numba.cuda.HostOnlyCUDAMemoryManager (constructed with the context; it keeps host memory),
Numba calls initialize(), memalloc(size) -> numba.cuda.MemoryPointer(context, pointer,
size, owner=None, finalizer=None) (the finalizer runs when the pointer is freed or
collected), get_memory_info() -> numba.cuda.MemoryInfo(free, total), get_ipc_handle(memory),
reset(), defer_cleanup(), interface_version (1); NUMBA_CUDA_MEMORY_MANAGER=module makes Numba
use module._numba_memory_manager (load_from_env() below does what Numba does).

What a stand-in cannot show: Numba's NVIDIA-binding pointer type (CUdeviceptr; here the
ctypes path), its deallocation queue for host memory, and kernels using the memory."""

import collections
import contextlib
import importlib
import os
import sys
import types
import weakref


def build():
    numba = types.ModuleType("numba")
    cuda = types.ModuleType("numba.cuda")
    cudadrv = types.ModuleType("numba.cuda.cudadrv")
    driver = types.ModuleType("numba.cuda.cudadrv.driver")
    numba.cuda, cuda.cudadrv, cudadrv.driver = cuda, cudadrv, driver
    driver.USE_NV_BINDING = False

    class HostOnlyCUDAMemoryManager:
        def __init__(self, context):
            self.context = context
            self.host_resets = 0

        def reset(self):
            self.host_resets += 1

        def defer_cleanup(self):
            return contextlib.nullcontext()

    class MemoryPointer:
        def __init__(self, context, pointer, size, owner=None, finalizer=None):
            self.context, self.device_pointer, self.size = context, pointer, size
            self._finalizer = weakref.finalize(self, finalizer) if finalizer else None

        def free(self):
            if self._finalizer:
                self._finalizer()

    MemoryInfo = collections.namedtuple("MemoryInfo", "free total")

    class Context:
        def __init__(self, device_id):
            self.device = types.SimpleNamespace(id=device_id)

    def load_from_env():
        """What Numba does with NUMBA_CUDA_MEMORY_MANAGER: the class the module names."""
        name = os.environ["NUMBA_CUDA_MEMORY_MANAGER"]
        return importlib.import_module(name)._numba_memory_manager

    cuda.HostOnlyCUDAMemoryManager = HostOnlyCUDAMemoryManager
    cuda.MemoryPointer, cuda.MemoryInfo = MemoryPointer, MemoryInfo
    cuda.Context, cuda.load_from_env = Context, load_from_env
    return numba


def install():
    numba = build()
    for name, m in (("numba", numba), ("numba.cuda", numba.cuda),
                    ("numba.cuda.cudadrv", numba.cuda.cudadrv),
                    ("numba.cuda.cudadrv.driver", numba.cuda.cudadrv.driver)):
        sys.modules[name] = m
    return numba
