"""expseg.py: expseg as PyTorch's CUDA allocator, and its statistics, from Python.

    import expseg
    expseg.install()                 # before the first CUDA allocation
    ...
    expseg.memory_stats(0)           # the dict torch.cuda.memory_stats() returns
    expseg.empty_cache(); expseg.reset_peak_memory_stats(); expseg.snapshot("mem.pickle")

Standard library and ctypes only; PyTorch is imported by install() alone. The library is
libexpseg_torch.so (plugin/expseg_torch.c), found through $EXPSEG_TORCH_LIB, next to this
file, the build folders of the repository, then the installed lib folders
(docs/torch.md). Every failure is an ExpsegError with a one-line message.
"""

import collections
import ctypes
import glob
import os
import sys

__all__ = [
    "ExpsegError", "install", "library_path", "memory_stats", "empty_cache",
    "reset_peak_memory_stats", "reset_accumulated_memory_stats", "snapshot", "mem_get_info",
    "driver", "last_error",
]

LIB_NAME = "libexpseg_torch.so"
_STATUS = {0: "EXPSEG_OK", 1: "EXPSEG_ERR_OUT_OF_MEMORY", 2: "EXPSEG_ERR_INVALID_ARGUMENT",
           3: "EXPSEG_ERR_CONFIG", 4: "EXPSEG_ERR_DRIVER", 5: "EXPSEG_ERR_UNSUPPORTED"}

_lib = None
_lib_path = None
_installed = None  # the CUDAPluggableAllocator object, kept alive


class ExpsegError(RuntimeError):
    """A failure of expseg, with a one-line message (what failed, why, what to do)."""

    def __init__(self, message):
        super().__init__(" ".join(str(message).split()))


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    found = [os.path.join(here, LIB_NAME)]
    # the repository's build folders (build/, build-*/), newest first
    builds = glob.glob(os.path.join(repo, "build*", "plugin", LIB_NAME))
    found += sorted(builds, key=os.path.getmtime, reverse=True)
    # installed: PREFIX/share/expseg/python/expseg.py -> PREFIX/lib*/libexpseg_torch.so
    prefix = os.path.normpath(os.path.join(here, "..", "..", ".."))
    found += sorted(glob.glob(os.path.join(prefix, "lib*", LIB_NAME)))
    found += sorted(glob.glob(os.path.join(prefix, "lib", "*-linux-gnu", LIB_NAME)))
    for d in ("/usr/local/lib", "/usr/lib"):
        found.append(os.path.join(d, LIB_NAME))
    return found


def library_path():
    """The path of libexpseg_torch.so that install() and the statistics calls use."""
    env = os.environ.get("EXPSEG_TORCH_LIB")
    if env:
        if not os.path.isfile(env):
            raise ExpsegError("EXPSEG_TORCH_LIB=%s: no such file (unset it to search the "
                              "usual places, or point it at %s)" % (env, LIB_NAME))
        return os.path.abspath(env)
    tried = _candidates()
    for path in tried:
        if os.path.isfile(path):
            return path
    raise ExpsegError("%s not found: build it (cmake --build build --target expseg_torch), "
                      "install it, or set EXPSEG_TORCH_LIB=/path/to/%s; looked in %s"
                      % (LIB_NAME, LIB_NAME, ", ".join(sorted(set(os.path.dirname(p)
                                                                  for p in tried)))))


def _load():
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    path = library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ExpsegError("cannot load %s: %s" % (path, e)) from None
    c_int, c_size, c_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
    sigs = {
        "expseg_torch_alloc": (c_p, [c_size, c_int, c_p]),
        "expseg_torch_free": (None, [c_p, c_size, c_int, c_p]),
        "expseg_torch_last_error": (ctypes.c_char_p, [c_int]),
        "expseg_torch_driver_name": (ctypes.c_char_p, [c_int]),
        "expseg_torch_mem_get_info": (c_int, [c_int, ctypes.POINTER(c_size),
                                              ctypes.POINTER(c_size)]),
        "expseg_torch_stat": (c_int, [c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64)]),
        "expseg_torch_stats_json": (c_size, [c_int, ctypes.c_char_p, c_size]),
        "expseg_torch_reset_peak_stats": (c_int, [c_int]),
        "expseg_torch_reset_accumulated_stats": (c_int, [c_int]),
        "expseg_torch_empty_cache": (c_int, [c_int]),
        "expseg_torch_snapshot_dump": (c_int, [c_int, ctypes.c_char_p]),
    }
    for name, (res, args) in sigs.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise ExpsegError("%s has no %s: an older or foreign library; rebuild expseg"
                              % (path, name)) from None
        f.restype, f.argtypes = res, args
    _lib, _lib_path = lib, path
    return lib


def _device(device):
    """None -> PyTorch's current device when PyTorch is loaded and initialized, else 0."""
    if device is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
        return 0
    bad = ExpsegError("device %r: expected an int >= 0, 'cuda', 'cuda:N' or a torch.device"
                      % (device,))
    if isinstance(device, bool):
        raise bad
    if isinstance(device, str):  # 'cuda' -> the current device, 'cuda:1' -> 1
        name, _, index = device.partition(":")
        if name != "cuda":
            raise bad
        if not index:
            return _device(None)
    elif isinstance(device, int):
        index = device
    else:  # torch.device("cuda:1") -> 1; torch.device("cuda") -> the current device
        if getattr(device, "type", "cuda") != "cuda":
            raise bad
        index = getattr(device, "index", None)
        if index is None:
            return _device(None)
    try:
        index = int(index)
    except (TypeError, ValueError):
        raise bad from None
    if index < 0:
        raise bad
    return index


def last_error(device=None):
    """The device's last failure message ("" if none)."""
    return _load().expseg_torch_last_error(_device(device)).decode(errors="replace")


def _check(status, call, device):
    if status != 0:
        raise ExpsegError("%s(device %d) failed (%s): %s"
                          % (call, device, _STATUS.get(status, status), last_error(device)))


def driver(device=None):
    """The driver of the device's allocator: "cuda", "host" or "sim"."""
    d = _device(device)
    name = _load().expseg_torch_driver_name(d).decode()
    if not name:
        raise ExpsegError("expseg.driver(device %d): %s" % (d, last_error(d)))
    return name


def memory_stats(device=None):
    """Every statistic of the device's allocator, shaped as torch.cuda.memory_stats(): an
    OrderedDict of flat keys ("allocated_bytes.all.current", ...) in sorted order, int values;
    expseg's own keys ("expseg.mapped_bytes.current", ...) are included."""
    import json
    d = _device(device)
    lib = _load()
    need = lib.expseg_torch_stats_json(d, None, 0)
    if need == 0:
        raise ExpsegError("expseg.memory_stats(device %d): %s" % (d, last_error(d)))
    buf = ctypes.create_string_buffer(need + 1)
    lib.expseg_torch_stats_json(d, buf, need + 1)
    stats = json.loads(buf.value.decode())
    return collections.OrderedDict(sorted((k, int(v)) for k, v in stats.items()))


def mem_get_info(device=None):
    """(free, total) bytes of the device, as torch.cuda.mem_get_info()."""
    d = _device(device)
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _check(_load().expseg_torch_mem_get_info(d, ctypes.byref(free), ctypes.byref(total)),
           "expseg.mem_get_info", d)
    return free.value, total.value


def empty_cache(device=None):
    """Gives cached memory back to the driver: every device when device is None."""
    d = -1 if device is None else _device(device)
    _check(_load().expseg_torch_empty_cache(d), "expseg.empty_cache", d)


def reset_peak_memory_stats(device=None):
    d = _device(device)
    _check(_load().expseg_torch_reset_peak_stats(d), "expseg.reset_peak_memory_stats", d)


def reset_accumulated_memory_stats(device=None):
    d = _device(device)
    _check(_load().expseg_torch_reset_accumulated_stats(d),
           "expseg.reset_accumulated_memory_stats", d)


def snapshot(path, device=None):
    """Writes the device's memory snapshot (the memory_viz pickle) to path."""
    d = _device(device)
    try:
        raw = os.fsencode(path)
    except TypeError:
        raise ExpsegError("expseg.snapshot(%r): expected a file name (str or bytes)" % (path,)) \
            from None
    if not raw or b"\0" in raw:
        raise ExpsegError("expseg.snapshot(%r): the file name is empty or holds a NUL byte"
                          % (path,))
    _check(_load().expseg_torch_snapshot_dump(d, raw), "expseg.snapshot", d)


def install():
    """Makes expseg PyTorch's CUDA allocator. Call it before the first CUDA allocation
    (best: right after `import torch`). Returns the library's path."""
    global _installed
    if _installed is not None:
        return _lib_path
    try:
        import torch
    except ImportError:
        raise ExpsegError("expseg.install() needs PyTorch, which is not installed here "
                          "(pip install torch); the statistics calls work without it") from None
    spec = os.environ.get("EXPSEG_DRIVER", "")
    if spec and not spec.startswith("cuda"):
        raise ExpsegError("expseg.install(): EXPSEG_DRIVER=%s, but PyTorch's kernels need "
                          "device memory: unset EXPSEG_DRIVER (or set it to cuda)" % spec)
    if not torch.cuda.is_available():
        raise ExpsegError("expseg.install(): PyTorch sees no CUDA device "
                          "(torch.cuda.is_available() is False); expseg replaces PyTorch's CUDA "
                          "allocator, so it needs a GPU")
    too_late = ("expseg.install() came too late: PyTorch's CUDA allocator is already "
                "initialized (CUDA was used before); call expseg.install() before the first "
                "CUDA tensor, e.g. right after import torch")
    if torch.cuda.is_initialized():
        raise ExpsegError(too_late)
    path = library_path()
    _load()
    try:
        alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "expseg_torch_alloc",
                                                         "expseg_torch_free")
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        if "already initialized" in str(e):
            raise ExpsegError(too_late) from None
        raise ExpsegError("expseg.install(): PyTorch refused the allocator: %s" % e) from None
    _installed = alloc
    return path
