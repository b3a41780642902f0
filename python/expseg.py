# SPDX-License-Identifier: Apache-2.0
"""expseg.py: expseg as the CUDA allocator of PyTorch, CuPy and Numba, and its statistics.

    import expseg
    expseg.install()                 # before the first CUDA allocation
    ...
    torch.cuda.memory_stats(0)       # expseg's figures (C++ backend or the Python route)
    expseg.memory_stats(0)           # the same, without PyTorch
    cupy.cuda.set_allocator(expseg.cupy_allocator)      # CuPy
    NUMBA_CUDA_MEMORY_MANAGER=expseg                     # Numba (expseg._numba_memory_manager)

Standard library and ctypes only; PyTorch, CuPy and Numba are imported by the calls that
need them. The library is libexpseg_torch.so (plugin/expseg_torch.c), found through
$EXPSEG_TORCH_LIB, next to this file, the build folders of the repository, then the installed
lib folders (docs/torch.md). This file holds the library, the statistics, the history and
snapshots, the pinned host pool and regions; by concern, the modules beside it hold the rest
(loaded from here by path; their public names are this module's): expseg_pytorch.py
install() and the PyTorch routes (the C++ backend through _expseg_cxx.py, else the Python
route; docs/torch.md has the table of every call), expseg_interop.py CuPy's allocator and the
Numba plugin. Every failure is an ExpsegError with a one-line message.
"""

import collections
import contextlib
import ctypes
import glob
import importlib.util
import operator
import os
import pickle
import sys
import tempfile
import threading

__all__ = [
    "ExpsegError", "ExpsegValueError", "ExpsegTypeError", "ExpsegWarning", "install", "route", "library_path", "memory_stats",
    "memory_summary", "empty_cache", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
    "record_history", "record_annotation", "snapshot", "snapshot_dict", "host_alloc",
    "host_free", "host_stat", "mem_get_info", "set_memory_fraction",
    "get_memory_fraction", "config",
    "synchronize", "deferred_frees", "driver", "last_error", "cupy_allocator",
    "numba_memory_manager",
]

LIB_NAME = "libexpseg_torch.so"
_STATUS = {0: "EXPSEG_OK", 1: "EXPSEG_ERR_OUT_OF_MEMORY", 2: "EXPSEG_ERR_INVALID_ARGUMENT",
           3: "EXPSEG_ERR_CONFIG", 4: "EXPSEG_ERR_DRIVER", 5: "EXPSEG_ERR_UNSUPPORTED",
           6: "EXPSEG_ERR_HOST_OUT_OF_MEMORY"}

_lib = None
_lib_path = None
_said = set()      # messages printed once
_modelled_driver_ok = False  # tests: allow EXPSEG_DRIVER=host/sim under a stand-in torch


class ExpsegError(RuntimeError):
    """A failure of expseg, with a one-line message (what failed, why, what to do)."""

    def __init__(self, message):
        super().__init__(" ".join(str(message).split()))


class ExpsegValueError(ExpsegError, ValueError):
    """An argument of a bad value: an ExpsegError that is also the ValueError PyTorch raises
    for it (a fraction outside [0, 1], a device that is not a CUDA device)."""


class ExpsegTypeError(ExpsegError, TypeError):
    """An argument of a bad type or a call PyTorch's signature refuses: an ExpsegError that is
    also the TypeError PyTorch raises for it."""


class ExpsegWarning(UserWarning):
    """What the Python route cannot see (given once per process)."""


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


_STAT_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64)
_LOG_SINK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)
_DROP_LOG = _LOG_SINK(lambda ctx, line: None)
_fresh_lock = threading.Lock()


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
        "expseg_torch_snapshot_dump_ex": (c_int, [c_int, ctypes.c_char_p, ctypes.c_uint]),
        "expseg_torch_annotate": (c_int, [c_int, c_p, ctypes.c_char_p]),
        "expseg_torch_record_annotation": (c_int, [c_int, ctypes.POINTER(ctypes.c_char_p),
                                                   ctypes.POINTER(ctypes.c_char_p), c_size]),
        "expseg_torch_allocation_traceback": (c_int, [c_int, c_p, ctypes.c_char_p, c_size,
                                                      ctypes.POINTER(c_size)]),
        "expseg_torch_device_count": (c_int, []),
        "expseg_torch_init": (None, [c_int]),
        "expseg_torch_device_used": (c_int, [c_int]),
        "expseg_torch_config_string": (c_size, [c_int, ctypes.c_char_p, c_size]),
        "expseg_torch_memory_summary": (c_size, [c_int, ctypes.c_char_p, c_size, c_int]),
        "expseg_torch_record_history": (c_int, [c_int, c_int, c_size, ctypes.c_uint]),
        "expseg_torch_set_memory_fraction": (c_int, [c_int, ctypes.c_double]),
        "expseg_torch_record_stream_status": (c_int, [c_p, c_p]),
        "expseg_torch_synchronize": (c_int, [c_int]),
        "expseg_torch_set_safe_free": (c_int, [c_int]),
        "expseg_torch_deferred": (c_int, [c_int, ctypes.POINTER(c_size),
                                          ctypes.POINTER(c_size)]),
        "expseg_torch_region": (c_int, [c_int, ctypes.c_char_p, c_int]),
        "expseg_torch_sleep": (c_int, [c_int, ctypes.c_char_p, c_int]),
        "expseg_torch_wake": (c_int, [c_int, ctypes.c_char_p]),
        "expseg_torch_region_info_json": (c_int, [c_int, ctypes.c_char_p, ctypes.c_char_p,
                                                  c_size, ctypes.POINTER(c_size)]),
        "expseg_torch_host_alloc": (c_int, [c_int, c_size, ctypes.POINTER(c_p)]),
        "expseg_torch_host_free": (c_int, [c_p]),
        "expseg_torch_host_record_history": (c_int, [c_int, c_size, ctypes.c_uint]),
        "expseg_torch_host_used": (c_int, []),
        "expseg_torch_host_stat": (c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64)]),
        "expseg_torch_host_empty_cache": (c_int, []),
        # the C library's (libexpseg.so, loaded with the plug)
        "expseg_create": (c_int, [ctypes.c_char_p, c_int, ctypes.c_char_p, ctypes.POINTER(c_p)]),
        "expseg_destroy": (None, [c_p]),
        "expseg_stats_foreach": (None, [c_p, _STAT_FN, c_p]),
        "expseg_last_error": (ctypes.c_char_p, []),
        "expseg_memory_summary": (c_size, [c_p, ctypes.c_char_p, c_size, ctypes.c_bool]),
        "expseg_config_string": (c_size, [c_p, ctypes.c_char_p, c_size]),
        "expseg_set_log_sink": (None, [_LOG_SINK, c_p]),
        "expseg_snapshot_dump_ex": (c_int, [c_p, ctypes.c_char_p, ctypes.c_uint]),
        "expseg_history_skip_action": (c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint)]),
        "expseg_history_skip_action_names": (ctypes.c_char_p, []),
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


_MAX_DEVICES = 64  # EXPSEG_TORCH_MAX_DEVICES (plugin/expseg_torch.h)
_fresh = None     # _fresh_stats(): the statistics of an allocator that served nothing


def _with_fresh(device, use):
    """use(allocator) on an allocator that has served nothing, under the configuration of
    the environment ($EXPSEG_ALLOC_CONF, ...), made on the sim driver (bookkeeping only: no
    device is touched) as device `device` and destroyed after. Its log lines are dropped
    (verbose:True would name the sim driver; the real allocators say the rest); nothing
    else of expseg in this process sets a log sink. An ExpsegError with the library's
    message when the configuration is refused."""
    lib, a = _load(), ctypes.c_void_p()
    with _fresh_lock:
        lib.expseg_set_log_sink(_DROP_LOG, None)
        try:
            if lib.expseg_create(b"sim", device, None, ctypes.byref(a)) != 0:
                raise ExpsegError((lib.expseg_last_error() or b"").decode(errors="replace"))
            try:
                return use(a)
            finally:
                lib.expseg_destroy(a)
        finally:
            lib.expseg_set_log_sink(_LOG_SINK(), None)  # NULL: stderr again


def _fresh_stats():
    """The statistics an allocator has before its first allocation (every key; the values
    the configuration sets, such as max_split_size, else 0)."""
    global _fresh
    if _fresh is None:
        pairs = []
        _with_fresh(0, lambda a: _lib.expseg_stats_foreach(a, _STAT_FN(
            lambda ctx, key, v: pairs.append((key.decode(), int(v)))), None))
        _fresh = collections.OrderedDict(sorted(pairs))
    return collections.OrderedDict(_fresh)


def _fresh_summary(device, abbreviated):
    """memory_summary's report for a device whose allocator has served nothing."""
    return _with_fresh(device, lambda a: _c_text("memory_summary", device, lambda buf, n: (
        _lib.expseg_memory_summary(a, buf, n, bool(abbreviated)))))


def _is_cuda_device_object(device):
    """Whether device is a torch.cuda.device (the context manager; its index is .idx)."""
    cls = getattr(getattr(sys.modules.get("torch"), "cuda", None), "device", None)
    return isinstance(cls, type) and isinstance(device, cls)


def _device(device):
    """None -> PyTorch's current device when PyTorch is loaded and initialized, else 0."""
    if device is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
        return 0
    bad = ExpsegValueError("device %r: expected an int in [0, %d), 'cuda', 'cuda:N' or a "
                      "torch.device" % (device, _MAX_DEVICES))
    if isinstance(device, bool):
        raise bad
    if isinstance(device, str):  # 'cuda' -> the current device, 'cuda:1' -> 1
        name, _, index = device.partition(":")
        if name != "cuda":
            raise bad
        if not index:
            return _device(None)
        if not (index.isascii() and index.isdigit()):
            raise bad  # as torch.device: digits only, no sign or space
    elif isinstance(device, int):
        index = device
    elif _is_cuda_device_object(device):  # torch.cuda.device(1), taken as PyTorch takes it
        index = device.idx
    elif hasattr(device, "type"):  # torch.device("cuda:1") -> 1; "cuda" -> the current one
        if device.type != "cuda":
            raise bad
        index = getattr(device, "index", None)
        if index is None:
            return _device(None)
    else:  # an integer through __index__ (numpy.int64, ...); not a float, not a list
        try:
            index = operator.index(device)
        except TypeError:
            raise bad from None
    try:
        index = int(index)
    except (TypeError, ValueError):
        raise bad from None
    if index < 0 or index >= _MAX_DEVICES:  # the library's table; ctypes would wrap past int
        raise bad
    return index


def last_error(device=None):
    """The device's last failure message ("" if none)."""
    return _load().expseg_torch_last_error(_device(device)).decode(errors="replace")


def _check(status, call, device):
    """device -1: a call on no one device (its message is kept under -1)."""
    if status != 0:
        why = _load().expseg_torch_last_error(device).decode(errors="replace")
        where = "" if device < 0 else "(device %d)" % device
        raise ExpsegError("%s%s failed (%s): %s"
                          % (call, where, _STATUS.get(status, status), why))


def driver(device=None):
    """The driver of the device's allocator: "cuda", "host" or "sim"."""
    d = _device(device)
    name = _load().expseg_torch_driver_name(d).decode()
    if not name:
        raise ExpsegError("expseg.driver(device %d): %s" % (d, last_error(d)))
    return name


def _c_text(name, d, fill):
    """Text from a C call that writes at most n bytes and returns the length it needs (as
    snprintf): asked for the length, then filled, and filled again in a larger buffer while
    the text outgrew it (other threads allocate between the calls: a figure gains a digit);
    0 is a failure of expseg.NAME."""
    need = fill(None, 0)
    while True:
        if need == 0:
            raise ExpsegError("expseg.%s(device %d): %s" % (name, d, last_error(d)))
        room = need + 1 + 256
        buf = ctypes.create_string_buffer(room)
        need = fill(buf, room)
        if 0 < need < room:
            return buf.value.decode(errors="replace")


def memory_stats(device=None):
    """Every statistic of the device's allocator, shaped as torch.cuda.memory_stats(): an
    OrderedDict of flat keys ("allocated_bytes.all.current", ...) in sorted order, int values;
    expseg's own keys ("expseg.mapped_bytes.current", ...) are included."""
    import json
    d = _device(device)
    stats = json.loads(_c_text("memory_stats", d, lambda buf, n: _load().expseg_torch_stats_json(d, buf, n)))
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


def _path_bytes(path, call):
    try:
        raw = os.fsencode(path)
    except TypeError:
        raise ExpsegError("%s(%r): expected a file name (str or bytes)" % (call, path)) from None
    if not raw or b"\0" in raw:
        raise ExpsegError("%s(%r): the file name is empty or holds a NUL byte" % (call, path))
    return raw


def snapshot(path, device=None, include_traces=True):
    """Writes the device's memory snapshot (the memory_viz pickle) to path. include_traces
    False: the state only, device_traces empty (PyTorch's include_traces=False)."""
    d = _device(device)
    _check(_load().expseg_torch_snapshot_dump_ex(d, _path_bytes(path, "expseg.snapshot"),
                                                 0 if include_traces else 1),
           "expseg.snapshot", d)


def _pointer(ptr, call):
    if isinstance(ptr, bool) or not isinstance(ptr, int) or not 0 <= ptr < 1 << 64:
        raise ExpsegError("%s: ptr=%r: expected an address (an int, e.g. tensor.data_ptr())"
                          % (call, ptr))
    return ptr


def annotate_memory(ptr, text, device=None):
    """Records an `annotate` event whose user_metadata is text (as PyTorch's
    _annotate_memory): on the live allocation at ptr, or with ptr None a mark in time.
    Nothing is recorded while the history is off."""
    if not isinstance(text, str) or "\0" in text:  # a NUL would cut the text short in C
        raise ExpsegError("expseg.annotate_memory: text=%r: expected a str without NUL"
                          % (text,))
    p = None if ptr is None else _pointer(ptr, "expseg.annotate_memory")
    d = _device(device)
    _check(_load().expseg_torch_annotate(d, p, text.encode("utf-8", "replace")),
           "expseg.annotate_memory", d)


def record_annotation(metadata, device=None):
    """One entry of the snapshot's external_annotations (PyTorch's recordAnnotation, which
    its record_function scopes call with {"name": ..., "stage": "START"/"END"}): metadata
    is a dict (or pairs) of str to str, kept with the device and the time while the history
    is recorded (the newest max_entries; clear_history or stopping drops them)."""
    items = list(metadata.items()) if isinstance(metadata, dict) else metadata
    try:
        pairs = [(k, v) for k, v in items]
    except (TypeError, ValueError):
        raise ExpsegError("expseg.record_annotation: metadata=%r: expected a dict of str to "
                          "str (or (key, value) pairs)" % (metadata,)) from None
    for k, v in pairs:
        if not isinstance(k, str) or not isinstance(v, str) or "\0" in k or "\0" in v:
            raise ExpsegError("expseg.record_annotation: %r: %r: keys and values must be str "
                              "without NUL" % (k, v))
    n = len(pairs)
    keys = (ctypes.c_char_p * max(n, 1))(*[k.encode("utf-8", "replace") for k, _ in pairs])
    values = (ctypes.c_char_p * max(n, 1))(*[v.encode("utf-8", "replace") for _, v in pairs])
    d = _device(device)
    _check(_load().expseg_torch_record_annotation(d, keys, values, n),
           "expseg.record_annotation", d)


def allocation_traceback(ptr, device=None):
    """Where the live allocation at ptr was made (PyTorch's _allocation_traceback): its
    alloc event's frames, innermost first, as [{"filename", "line", "name"}, ...]."""
    p = _pointer(ptr, "expseg.allocation_traceback")
    d = _device(device)
    lib, need = _load(), ctypes.c_size_t(0)
    _check(lib.expseg_torch_allocation_traceback(d, p, None, 0, ctypes.byref(need)),
           "expseg.allocation_traceback", d)
    buf = ctypes.create_string_buffer(need.value)
    _check(lib.expseg_torch_allocation_traceback(d, p, buf, need.value, ctypes.byref(need)),
           "expseg.allocation_traceback", d)
    frames = []
    for line in buf.value.decode("utf-8", "replace").splitlines():
        filename, lineno, name = line.split(":", 2) if line.count(":") >= 2 else (line, "0", "")
        frames.append({"filename": filename, "line": int(lineno) if lineno.isdigit() else 0,
                       "name": name})
    return frames


def _used_devices():
    """The devices that have an allocator (the current one when none has yet)."""
    lib = _load()
    used = [d for d in range(lib.expseg_torch_device_count()) if lib.expseg_torch_device_used(d)]
    return used or [_device(None)]


def snapshot_dict(device=None, include_traces=True):
    """The snapshot as the dict torch.cuda.memory._snapshot() returns: {"segments",
    "device_traces", "allocator_settings", "external_annotations"}. device None: every
    device that has an allocator, merged as PyTorch merges its devices. include_traces
    False: device_traces holds empty lists (PyTorch's include_traces=False)."""
    devices = _used_devices() if device is None else [_device(device)]
    merged = None
    with tempfile.TemporaryDirectory(prefix="expseg-snapshot-") as tmp:
        for d in devices:
            path = os.path.join(tmp, "%d.pickle" % d)
            _check(_load().expseg_torch_snapshot_dump_ex(d, os.fsencode(path),
                                                         0 if include_traces else 1),
                   "expseg.snapshot_dict", d)
            with open(path, "rb") as f:
                one = pickle.load(f)
            if merged is None:
                merged = one
                continue
            merged["segments"] = merged.get("segments", []) + one.get("segments", [])
            traces = merged.setdefault("device_traces", [])
            theirs = one.get("device_traces", [])
            while len(traces) < len(theirs):
                traces.append([])
            if d < len(theirs):
                traces[d] = theirs[d]
            merged["external_annotations"] = (merged.get("external_annotations", []) +
                                              one.get("external_annotations", []))
    return merged


def memory_summary(device=None, abbreviated=False):
    """torch.cuda.memory_summary()'s report for the device, then expseg's own section."""
    d = _device(device)
    ab = int(bool(abbreviated))
    return _c_text("memory_summary", d,
                   lambda buf, n: _load().expseg_torch_memory_summary(d, buf, n, ab))


def _skip_action(name):
    """The EXPSEG_HISTORY_SKIP_* flag of one of PyTorch's skip_actions names, from the C
    library's table (expseg_history_skip_action); an ExpsegError for any other name."""
    lib, flag = _load(), ctypes.c_uint(0)
    raw = name.encode("utf-8", "replace") if isinstance(name, str) else None
    if raw is None or b"\0" in raw or \
            lib.expseg_history_skip_action(raw, ctypes.byref(flag)) != 0:
        raise ExpsegError("expseg.record_history: skip_actions holds %r; accepted: %s"
                          % (name, lib.expseg_history_skip_action_names().decode()))
    return flag.value


def record_history(enabled=True, max_entries=100000, c_stacks=True, device=None,
                   clear_history=False, skip_actions=None, record_pinned_host_memory=False,
                   record_cuda=True):
    """Starts (enabled) or stops and clears the history of allocator events that snapshots
    carry. device None: every device, those that get an allocator later included.
    clear_history: drop what was recorded before (else re-enabling keeps it); skip_actions:
    actions not to record, as PyTorch's _record_memory_history takes them.
    record_pinned_host_memory: the same setting for the pinned host pool (host_alloc), whose
    history is the snapshot's host_traces; record_cuda False: leave the devices' history as
    it is (PyTorch 2.14's arguments)."""
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or \
            (enabled and not 1 <= max_entries < 1 << 64):
        bad = ExpsegValueError if isinstance(max_entries, int) and \
            not isinstance(max_entries, bool) else ExpsegTypeError
        raise bad("expseg.record_history: max_entries=%r: expected an int from 1 to 2**64-1"
                  % (max_entries,))
    if skip_actions is not None and (isinstance(skip_actions, (str, bytes)) or
                                     not hasattr(skip_actions, "__iter__")):
        raise ExpsegTypeError("expseg.record_history: skip_actions=%r: expected a list of "
                              "action names (such as [\"alloc\"]) or None" % (skip_actions,))
    flags = (1 if c_stacks else 0) | (2 if clear_history else 0)
    for name in skip_actions or ():
        flags |= _skip_action(name)
    entries = max(0, max_entries) if enabled else 0
    if record_cuda:
        d = -1 if device is None else _device(device)
        _check(_load().expseg_torch_record_history(d, int(bool(enabled)), entries, flags),
               "expseg.record_history", d)
    if record_pinned_host_memory:
        _check(_load().expseg_torch_host_record_history(int(bool(enabled)), entries, flags),
               "expseg.record_history(record_pinned_host_memory=True)", -1)


# ---- the pinned host pool (docs/torch.md "Pinned host memory") ----

def host_alloc(size, device=None):
    """size bytes of pinned host memory from expseg's pinned host pool (one per process,
    placed near the device of the first call): its address as an int (0 for size 0). Once
    used, every snapshot carries the pool as host_segments and host_traces."""
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < 1 << 64:
        raise ExpsegError("expseg.host_alloc: size=%r: expected an int from 0 to 2**64-1"
                          % (size,))
    d = _device(device)
    out = ctypes.c_void_p()
    _check(_load().expseg_torch_host_alloc(d, size, ctypes.byref(out)), "expseg.host_alloc", -1)
    return out.value or 0


def host_free(ptr):
    """Gives back pinned host memory that host_alloc returned (0 or None: nothing)."""
    if ptr is None or ptr == 0:
        return
    p = _pointer(ptr, "expseg.host_free")
    _check(_load().expseg_torch_host_free(p), "expseg.host_free", -1)


def host_stat(key):
    """One statistic of the pinned host pool (torch.cuda.host_memory_stats()'s keys, e.g.
    "allocated_bytes.current"); an ExpsegError before the first host_alloc."""
    if not isinstance(key, str) or "\0" in key:
        raise ExpsegTypeError("expseg.host_stat: key=%r: expected a str, a key of "
                              "torch.cuda.host_memory_stats()" % (key,))
    v = ctypes.c_int64()
    _check(_load().expseg_torch_host_stat(key.encode(), ctypes.byref(v)), "expseg.host_stat", -1)
    return v.value


def _host_part(include_traces=True):
    """(host_segments, host_traces) of the pinned host pool, or None before its first use."""
    lib = _load()
    if not lib.expseg_torch_host_used():
        return None
    d = _used_devices()[0]
    with tempfile.TemporaryDirectory(prefix="expseg-snapshot-") as tmp:
        path = os.path.join(tmp, "host.pickle")
        _check(lib.expseg_torch_snapshot_dump_ex(d, os.fsencode(path), 0 if include_traces else 1),
               "expseg.snapshot (pinned host pool)", d)
        with open(path, "rb") as f:
            one = pickle.load(f)
    return one.get("host_segments", []), one.get("host_traces", [])


def _add_host(snap, include_traces=True):
    """Adds expseg's pinned host pool to a snapshot dict made by PyTorch (the C++ backend's
    route): host_segments appended, host_traces merged in time order."""
    part = _host_part(include_traces)
    if part is None or not isinstance(snap, dict):
        return snap
    segments, traces = part
    snap["host_segments"] = list(snap.get("host_segments", [])) + segments
    merged = list(snap.get("host_traces", [])) + traces
    merged.sort(key=lambda e: e.get("time_us", 0) if isinstance(e, dict) else 0)
    snap["host_traces"] = merged
    return snap


def set_memory_fraction(fraction, device=None):
    """Caps what the device's allocator holds at fraction x its memory (0 <= fraction <= 1),
    as torch.cuda.set_per_process_memory_fraction."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise ExpsegTypeError("expseg.set_memory_fraction: fraction=%r: expected a number from "
                              "0 to 1" % (fraction,))
    if not 0 <= fraction <= 1:
        raise ExpsegValueError("expseg.set_memory_fraction: fraction=%r: expected a number from "
                               "0 to 1" % (fraction,))
    d = _device(device)
    _check(_load().expseg_torch_set_memory_fraction(d, float(fraction)),
           "expseg.set_memory_fraction", d)


def config(device=None):
    """The configuration in force on the device, as one option string (docs/config.md)."""
    d = _device(device)
    return _c_text("config", d, lambda buf, n: _load().expseg_torch_config_string(d, buf, n))


def get_memory_fraction(device=None):
    """The device's memory fraction (1.0: no cap), as get_per_process_memory_fraction."""
    return _fraction(config(device))


def _fresh_config(device):
    """config() of an allocator that has served nothing (as `device`)."""
    return _with_fresh(device, lambda a: _c_text("config", device, lambda buf, n: (
        _lib.expseg_config_string(a, buf, n))))


def _fraction(config_text):
    """per_process_memory_fraction of a configuration text (1.0 when it has none)."""
    for item in config_text.split(","):
        key, _, value = item.partition(":")
        if key.strip() == "per_process_memory_fraction":
            return float(value)
    return 1.0


def synchronize(device=None):
    """Waits until all work on the device, on every stream, is done."""
    d = _device(device)
    _check(_load().expseg_torch_synchronize(d), "expseg.synchronize", d)


def deferred_frees(device=None):
    """(count, bytes) of the frees the safe mode holds back on the device."""
    d = _device(device)
    n, b = ctypes.c_size_t(), ctypes.c_size_t()
    _check(_load().expseg_torch_deferred(d, ctypes.byref(n), ctypes.byref(b)),
           "expseg.deferred_frees", d)
    return n.value, b.value


def _tag(tag):
    # refused here, not replaced: "w\u00e9" read as "w?" or "w\0x" cut to "w" would name
    # another region; the library checks the rest (length, control characters)
    if not isinstance(tag, str) or "\0" in tag or not tag.isascii():
        raise ExpsegError("region tag %r: expected a str of 1 to 63 printable ASCII "
                          "characters" % (tag[:80] if isinstance(tag, str) else tag,))
    return tag.encode("ascii")


@contextlib.contextmanager
def region(tag, device=None):
    """Allocations on the device, on every stream, inside the block belong to region `tag`:
    segments of its own that expseg.sleep(tag) gives back and expseg.wake(tag) restores at
    the same addresses."""
    d = _device(device)
    t = _tag(tag)
    _check(_load().expseg_torch_region(d, t, 1), "expseg.region(%r)" % (tag,), d)
    try:
        yield
    finally:
        _check(_lib.expseg_torch_region(d, t, 0), "expseg.region(%r) end" % (tag,), d)


_SLEEP_MODES = {"offload": 0, "discard": 1}


def sleep(tag, mode="offload", device=None):
    """Gives region `tag`'s device memory back, keeping its addresses: mode "offload"
    copies its live bytes to pinned host memory first, "discard" drops them."""
    d = _device(device)
    if not isinstance(mode, str) or mode not in _SLEEP_MODES:  # a list is not hashable
        raise ExpsegError("expseg.sleep(%r): mode %r: expected 'offload' or 'discard'"
                          % (tag, mode))
    _check(_load().expseg_torch_sleep(d, _tag(tag), _SLEEP_MODES[mode]),
           "expseg.sleep(%r)" % (tag,), d)


def wake(tag, device=None):
    """Maps region `tag`'s memory again at the same addresses and restores its bytes."""
    d = _device(device)
    _check(_load().expseg_torch_wake(d, _tag(tag)), "expseg.wake(%r)" % (tag,), d)


def region_info(tag, device=None):
    """Region `tag`'s statistics as a dict (the fields of the C API's expseg_region_info):
    "asleep" (bool); "live_bytes", "device_bytes" (held now), "asleep_bytes" (given back by
    the current sleep), "host_bytes" (pinned host copies of the current sleep),
    "host_kept_bytes" (copies kept for the next sleep), "deferred_frees", "sleeps", "wakes",
    "last_sleep_us" / "last_wake_us" (durations), "last_sleep_copy_us" / "last_wake_copy_us"
    (their copies), "last_sleep_at_us" / "last_wake_at_us" (when they ended, microseconds
    since the Unix epoch, 0 none yet) and "pool" (ints). An ExpsegError for a tag no region
    has."""
    import json
    d = _device(device)
    t = _tag(tag)
    call = "expseg.region_info(%r)" % (tag,)
    lib, need, size = _load(), ctypes.c_size_t(0), 1024
    while True:  # the text grows while another thread sleeps or wakes the region
        buf = ctypes.create_string_buffer(size)
        _check(lib.expseg_torch_region_info_json(d, t, buf, size, ctypes.byref(need)), call, d)
        if need.value <= size:
            return json.loads(buf.value.decode())
        size = need.value + 64


def _stat(device, key, call):
    d = _device(device)
    v = ctypes.c_int64()
    _check(_load().expseg_torch_stat(d, key.encode(), ctypes.byref(v)), call, d)
    return v.value


def _say_once(message):
    """Prints message on stderr once per process."""
    if message not in _said:
        _said.add(message)
        print("expseg: " + message, file=sys.stderr)


# ---- PyTorch, CuPy and Numba: modules beside this file, loaded by path and bound here ----

PYTORCH_MODULE = "expseg_pytorch"
INTEROP_MODULE = "expseg_interop"


def _sibling(name, holds):
    """The module NAME.py beside this file, bound to this module (loaded by path, as the C++
    backend's loader is, so that the copy beside this expseg.py is the one used)."""
    mod = sys.modules.get(name)
    here = os.path.dirname(os.path.abspath(__file__))
    if mod is None or os.path.dirname(os.path.abspath(getattr(mod, "__file__", ""))) != here:
        path = os.path.join(here, name + ".py")
        if not os.path.isfile(path):
            raise ImportError("expseg: %s is not installed next to %s (it holds %s)"
                              % (os.path.basename(path), __file__, holds))
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[name] = mod
    mod._core = sys.modules.get(__name__)  # None: it imports expseg itself on first use
    return mod


_pytorch = _sibling(PYTORCH_MODULE, "install() and the PyTorch routes")


def install(route="auto", safe_record_stream=None):
    return _pytorch.install(route, safe_record_stream)


install.__doc__ = _pytorch.install.__doc__  # written once, in expseg_pytorch.py


def route():
    """"cxx", "python", or None before install()."""
    return _pytorch._route


def _unpatch():
    """Puts back what the Python route replaced and forgets the installation (for tests)."""
    _pytorch._unpatch()


# the constants of install(), under their names here too
ROUTES, SAFE_ENV, SAFE_BATCH = _pytorch.ROUTES, _pytorch.SAFE_ENV, _pytorch.SAFE_BATCH
CXX_MODULE, PYTHON_ROUTE_LIMITS = _pytorch.CXX_MODULE, _pytorch.PYTHON_ROUTE_LIMITS
GRAPH_REFUSED, MEMPOOL_REFUSED = _pytorch.GRAPH_REFUSED, _pytorch.MEMPOOL_REFUSED

_interop_module = _sibling(INTEROP_MODULE, "cupy_allocator and the Numba plugin")
cupy_allocator = _interop_module.cupy_allocator
numba_memory_manager = _interop_module.numba_memory_manager


def __getattr__(name):
    # Numba reads `_numba_memory_manager` of the module NUMBA_CUDA_MEMORY_MANAGER names;
    # resolved on first use so that importing expseg never imports Numba. `_installed`: the
    # installed allocator object (expseg_pytorch's).
    if name == "_numba_memory_manager":
        return numba_memory_manager()
    if name == "_installed":
        return _pytorch._installed
    raise AttributeError("module 'expseg' has no attribute %r" % (name,))
