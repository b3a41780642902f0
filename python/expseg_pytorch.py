# SPDX-License-Identifier: Apache-2.0
"""expseg_pytorch.py: expseg as PyTorch's CUDA allocator (part of the expseg Python module,
split from expseg.py by concern; use it through expseg):

    import expseg
    expseg.install()        # this module's install(): the C++ backend, else the Python route

install() tries the C++ backend (_expseg_cxx.py beside this file), then the Python route: the
plug as PyTorch's allocator plus torch.cuda's memory calls and Tensor.record_stream routed to
expseg (docs/torch.md has the table of every call). On the C++ backend's route it adds
expseg's pinned host pool to PyTorch's _snapshot and _record_memory_history. The library,
the statistics and the snapshots are expseg.py's: expseg binds itself here when it loads
this file (`_core`); imported alone, this module imports expseg on first use. Standard
library and ctypes only; PyTorch is imported by install()."""

import ctypes
import importlib
import importlib.util
import inspect
import os
import pickle
import sys
import tempfile
import threading
import warnings


class _Core:
    """The expseg module, looked up on first use when this file was imported alone."""

    def __getattr__(self, name):
        return getattr(importlib.import_module("expseg"), name)


_core = _Core()  # replaced by the expseg module when expseg.py loads this file
_installed = None  # the CUDAPluggableAllocator object (or the C++ backend), kept alive
_route = None      # "cxx" or "python" once installed
_patched = []      # (object, attribute, original) replaced by the Python route


ROUTES = ("auto", "cxx", "python")
SAFE_ENV = "EXPSEG_SAFE_RECORD_STREAM"
MODELLED_ENV = "EXPSEG_ALLOW_MODELLED_DRIVER"  # 1: install() over host/sim (stand-in torch)
SAFE_BATCH = 256  # frees completed together in safe mode (docs/torch.md)
CXX_MODULE = "_expseg_cxx"

PYTHON_ROUTE_LIMITS = (
    "expseg runs PyTorch's CUDA memory through its Python route: torch.cuda's memory calls "
    "and Tensor.record_stream from Python report and act on expseg, but it cannot see "
    "record_stream calls made from C++ (NCCL process groups, FSDP, other extensions: memory "
    "they still use may be reused early; install(safe_record_stream=True) or %s=1 makes "
    "every free wait for a device-wide synchronization instead), and CUDA graph capture "
    "(torch.cuda.graph) and torch.cuda.MemPool are refused: they get no private pool. For "
    "both, use the C++ backend (install(route=\"cxx\"); it needs a C++ compiler and "
    "PyTorch's headers; docs/torch.md)." % SAFE_ENV)


def _safe_setting(safe_record_stream):
    """The safe-mode batch size: 0 (off) or SAFE_BATCH, from the argument, else $SAFE_ENV."""
    if safe_record_stream is None:
        raw = os.environ.get(SAFE_ENV, "")
        words = {"": 0, "0": 0, "false": 0, "no": 0, "off": 0,
                 "1": SAFE_BATCH, "true": SAFE_BATCH, "yes": SAFE_BATCH, "on": SAFE_BATCH}
        if raw.strip().lower() not in words:
            raise _core.ExpsegError("%s=%s: expected 1 (on) or 0 (off) (also true/false, yes/no, "
                              "on/off)" % (SAFE_ENV, raw))
        return words[raw.strip().lower()]
    if not isinstance(safe_record_stream, bool):
        raise _core.ExpsegError("expseg.install(safe_record_stream=%r): expected True, False or None "
                          "(None: $%s)" % (safe_record_stream, SAFE_ENV))
    return SAFE_BATCH if safe_record_stream else 0


def _cxx_module():
    """The C++ backend's loader: sys.modules[CXX_MODULE] if set (None there: absent), else
    _expseg_cxx.py beside this file; (module, None) or (None, why it is absent)."""
    if CXX_MODULE in sys.modules:
        mod = sys.modules[CXX_MODULE]
        return (mod, None) if mod is not None else (None, "%s is disabled" % CXX_MODULE)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), CXX_MODULE + ".py")
    if not os.path.isfile(path):
        return None, "%s is not installed next to %s" % (os.path.basename(path), __file__)
    try:
        spec = importlib.util.spec_from_file_location(CXX_MODULE, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[CXX_MODULE] = mod
        spec.loader.exec_module(mod)
    except Exception as e:  # a broken loader must not stop the Python route
        sys.modules.pop(CXX_MODULE, None)
        return None, "cannot import %s: %s: %s" % (path, type(e).__name__, e)
    return mod, None


def _try_cxx(path):
    """(installed, why not, whether the loader is there)."""
    mod, why = _cxx_module()
    if mod is None:
        return False, why, False
    try:
        ok = mod.install(path)
    except Exception as e:  # ExpsegError from the loader, or anything it let through
        text = str(e) if isinstance(e, _core.ExpsegError) else "%s: %s" % (type(e).__name__, e)
        return False, text, True
    if ok is not True:
        return False, "%s.install() returned %r, not True" % (CXX_MODULE, ok), True
    return True, None, True


def install(route="auto", safe_record_stream=None):
    """Makes expseg PyTorch's CUDA allocator. Call it before the first CUDA allocation
    (best: right after `import torch`). Returns the library's path; a second call does
    nothing but what it says explicitly: a route other than the one installed raises, and
    safe_record_stream True or False turns the Python route's safe mode on or off.

    route: "cxx" the C++ backend (every torch.cuda memory call, record_stream from C++,
    CUDA graph pools); "python" the plug plus torch.cuda's memory calls routed from Python;
    "auto" (default) the C++ backend when it can be loaded, else the Python route, saying
    once why. safe_record_stream (Python route): True defers every free until a
    device-wide synchronization (None: $EXPSEG_SAFE_RECORD_STREAM)."""
    with _install_lock:  # threads calling it together: one installs, the others see it
        return _install(route, safe_record_stream)


_install_lock = threading.RLock()


def _install(route, safe_record_stream):
    global _installed, _route
    if route not in ROUTES:
        raise _core.ExpsegError("expseg.install(route=%r): expected one of %s"
                          % (route, ", ".join(repr(r) for r in ROUTES)))
    safe = _safe_setting(safe_record_stream)
    if _installed is not None:
        if route != "auto" and route != _route:
            raise _core.ExpsegError("expseg.install(route=%r): expseg is already installed on "
                                    "the %r route; the first install() decides the route "
                                    "for the process" % (route, _route))
        if safe_record_stream is not None and _route == "python":
            _core._check(_core._lib.expseg_torch_set_safe_free(safe),
                         "expseg.install(safe_record_stream)", -1)
        return _core._lib_path
    try:
        import torch
    except ImportError:
        raise _core.ExpsegError("expseg.install() needs PyTorch, which is not installed here "
                          "(pip install torch); the statistics calls work without it") from None
    spec = os.environ.get("EXPSEG_DRIVER", "")
    modelled_ok = _core._modelled_driver_ok or os.environ.get(MODELLED_ENV, "") == "1"
    if spec and not spec.startswith("cuda") and not modelled_ok:
        raise _core.ExpsegError("expseg.install(): EXPSEG_DRIVER=%s, but PyTorch's kernels need "
                                "device memory: unset EXPSEG_DRIVER (or set it to cuda); to "
                                "test install() with a stand-in torch on that driver, set "
                                "%s=1" % (spec, MODELLED_ENV))
    if not torch.cuda.is_available():
        raise _core.ExpsegError("expseg.install(): PyTorch sees no CUDA device "
                          "(torch.cuda.is_available() is False); expseg replaces PyTorch's CUDA "
                          "allocator, so it needs a GPU")
    too_late = ("expseg.install() came too late: PyTorch's CUDA allocator is already "
                "initialized (CUDA was used before); call expseg.install() before the first "
                "CUDA tensor, e.g. right after import torch")
    if torch.cuda.is_initialized():
        raise _core.ExpsegError(too_late)
    path = _core.library_path()
    _core._load()
    try:  # the option text, read as each device's allocator will read it: refused here, not
        _core._fresh_stats()  # by every allocation once PyTorch's allocator is replaced
    except _core.ExpsegError as e:
        raise _core.ExpsegError("expseg.install(): the allocator configuration is refused, so "
                                "nothing was installed: %s" % e) from None
    if route in ("auto", "cxx"):
        ok, why, present = _try_cxx(path)
        if ok:
            _installed, _route = sys.modules.get(CXX_MODULE, True), "cxx"
            _patch_cxx(torch)
            return path
        if route == "cxx":
            raise _core.ExpsegError("expseg.install(route=\"cxx\"): the C++ backend is not available: "
                              "%s (route=\"python\" needs no compiler)" % why)
        if present:  # a loader that failed says why; a missing one is in the warning below
            _core._say_once("the C++ backend is not used (%s); using the Python route" % why)
    _core._check(_core._lib.expseg_torch_set_safe_free(safe), "expseg.install(safe_record_stream)", -1)
    try:
        # the raising entry point: PyTorch does not check a NULL from the alloc function
        alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "expseg_torch_alloc_raising",
                                                         "expseg_torch_free")
        torch.cuda.memory.change_current_allocator(alloc)
    except (RuntimeError, OSError, AttributeError) as e:  # ctypes: a file or function
        _core._lib.expseg_torch_set_safe_free(0)           # it cannot load
        if "already initialized" in str(e):
            raise _core.ExpsegError(too_late) from None
        raise _core.ExpsegError("expseg.install(): PyTorch refused the allocator: %s: %s"
                                % (type(e).__name__, e)) from None
    _installed, _route = alloc, "python"
    _bound_devices(torch)
    _patch_torch(torch)
    if PYTHON_ROUTE_LIMITS not in _core._said:
        _core._said.add(PYTHON_ROUTE_LIMITS)
        warnings.warn(PYTHON_ROUTE_LIMITS, _core.ExpsegWarning, stacklevel=4)
    return path




def _bound_devices(torch):
    """PyTorch's device count bounds every device argument, as it bounds its own allocator's:
    a device PyTorch does not have is an error naming it, not a fresh allocator of its own.
    A torch without a usable device_count() leaves the library's bound (64)."""
    try:
        count = int(torch.cuda.device_count())
    except Exception:  # a stand-in or a broken build: nothing to bound by
        return
    if count > 0:
        _core._lib.expseg_torch_init(count)
        _device_bound[0] = count


_device_bound = [64]  # the device count given to expseg_torch_init (64: the library's table)


def _device_count():
    """PyTorch's device count, 0 where install() could not read it."""
    return _device_bound[0] if _device_bound[0] < _core._MAX_DEVICES else 0


def route():
    """"cxx", "python", or None before install()."""
    return _route


# ---- the Python route: torch.cuda's memory calls answered by expseg ----

# torch.cuda.memory._record_memory_history's two signatures, as PyTorch dispatches them: a
# bool `enabled` takes the legacy one (trace_alloc_max_entries, default 1), anything else the
# current one; record_pinned_host_memory and record_cuda (PyTorch 2.14) last in both.
def _history_current(enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                     device=None, clear_history=False, compile_context=False,
                     global_record_annotations=False, skip_actions=None,
                     record_pinned_host_memory=False, record_cuda=True):
    return dict(locals())


def _history_legacy(enabled, record_context=True, trace_alloc_max_entries=1,
                    trace_alloc_record_context=False, device=None, record_context_cpp=False,
                    clear_history=False, compile_context=False, global_record_annotations=False,
                    skip_actions=None, record_pinned_host_memory=False, record_cuda=True):
    return dict(locals())


# the legacy signature's keywords but the two PyTorch 2.14 added to both (passed on only
# where the installed PyTorch takes them)
_HISTORY_LEGACY_NAMES = frozenset(_history_legacy.__code__.co_varnames[
    1:_history_legacy.__code__.co_argcount]) - {"record_pinned_host_memory", "record_cuda"}


def _history_positional(enabled):
    """How many positional arguments after `enabled` come before the two PyTorch 2.14 added
    (a PyTorch without them refuses more)."""
    return (_history_legacy if isinstance(enabled, bool) else _history_current) \
        .__code__.co_argcount - 3


_HISTORY_CALL = "torch.cuda.memory._record_memory_history"


def _history_args(enabled, args, kwargs, strict=True):
    """record_history's arguments for _record_memory_history(enabled, *args, **kwargs), read
    as PyTorch reads them: the same verdicts on enabled, context and stacks, and the same
    history length ("state" keeps 1 entry, as does the legacy form unless it says
    trace_alloc_max_entries)."""
    legacy = isinstance(enabled, bool)
    if not strict:  # PyTorch checks the call itself: keep what these signatures know
        known = (_history_legacy if legacy else _history_current).__code__
        names = known.co_varnames[:known.co_argcount + known.co_kwonlyargcount]
        kwargs = {k: v for k, v in kwargs.items() if k in names}
    try:
        a = (_history_legacy if legacy else _history_current)(enabled, *args, **kwargs)
    except TypeError as e:
        raise _core.ExpsegTypeError("%s(%s): %s" % (
            _HISTORY_CALL, ", ".join([repr(enabled)] + [repr(x) for x in args] +
                                     ["%s=%r" % kv for kv in kwargs.items()]),
            str(e).replace("_history_current()", "").replace("_history_legacy()", "").strip()
        )) from None
    if legacy:
        # C++ frames only with a context recorded, as PyTorch's legacy form
        on, entries, c_stacks = enabled, a["trace_alloc_max_entries"], \
            bool(a["record_context_cpp"]) and bool(a["record_context"] or
                                                   a["trace_alloc_record_context"])
    else:
        for name, value, accepted in (("enabled", enabled, ("state", "all")),
                                      ("context", a["context"], ("state", "alloc", "all")),
                                      ("stacks", a["stacks"], ("python", "all"))):
            if not (isinstance(value, str) and value in accepted) and \
                    (value is not None or name == "stacks"):
                # as PyTorch: a str it does not know is its RuntimeError, a value of another
                # type (None for stacks) its binding's TypeError
                raise (_core.ExpsegError if isinstance(value, str) else _core.ExpsegTypeError)(
                    "%s(%s=%r): expected %s%s" % (
                        _HISTORY_CALL, name, value, ", ".join('"%s"' % v for v in accepted),
                        "" if name == "stacks" else " or None"))
        m = a["max_entries"]  # the binding's size_t: another type or a value outside it is
        if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m < 1 << 64:  # TypeError
            raise _core.ExpsegTypeError("%s(max_entries=%r): expected an int from 0 to 2**64-1"
                                        % (_HISTORY_CALL, m))
        on = enabled is not None
        entries = a["max_entries"] if enabled == "all" else 1
        c_stacks = on and a["context"] is not None and a["stacks"] == "all"
    if isinstance(entries, int) and not isinstance(entries, bool) and entries == 0:
        entries = 1  # PyTorch keeps at least one entry
    return dict(enabled=on, max_entries=entries if on else 1, c_stacks=c_stacks,
                clear_history=bool(a["clear_history"]),
                skip_actions=a["skip_actions"] if on else None,
                record_pinned_host_memory=bool(a["record_pinned_host_memory"]),
                record_cuda=bool(a["record_cuda"])), bool(a["global_record_annotations"])


def _patch_cxx(torch):
    """The C++ backend's route: PyTorch answers _record_memory_history and _snapshot itself
    (from the backend); expseg adds its pinned host pool. record_pinned_host_memory=True
    also records the pool's history; the snapshot gets its host_segments and host_traces
    (appended to PyTorch's own where PyTorch writes them). An argument this PyTorch does not
    take (record_pinned_host_memory, record_cuda before 2.14) is not passed on."""
    memory = torch.cuda.memory
    hist = getattr(memory, "_record_memory_history", None)
    snap = getattr(memory, "_snapshot", None)
    if hist is not None:
        try:
            params = inspect.signature(hist).parameters
        except (TypeError, ValueError):
            params = {}
        any_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())

        def history(enabled="all", *args, **kwargs):
            host, _ = _history_args(enabled, args, kwargs, strict=False)
            cuda = host["record_cuda"]
            if host["record_pinned_host_memory"]:
                host.update(record_cuda=False, device=None)
                _core.record_history(**host)
            if not cuda and not ("record_cuda" in params or any_kw):
                return None
            # PyTorch's function shows the current signature but takes the legacy one's
            # keywords too when enabled is a bool: those are passed on as well
            legacy = _HISTORY_LEGACY_NAMES if isinstance(enabled, bool) else ()
            passed = {k: v for k, v in kwargs.items()
                      if k in params or any_kw or k in legacy}
            if "record_pinned_host_memory" not in params:  # a PyTorch before 2.14
                args = args[:_history_positional(enabled)]
            return hist(enabled, *args, **passed)
        history.__doc__ = getattr(hist, "__doc__", None)
        _replace(memory, "_record_memory_history", history)
    if snap is not None:
        def snapshot_with_host(*args, **kwargs):
            return _core._add_host(snap(*args, **kwargs), kwargs.get("include_traces", True))
        snapshot_with_host.__doc__ = getattr(snap, "__doc__", None)
        _replace(memory, "_snapshot", snapshot_with_host)


def _torch_calls(torch):
    """The torch.cuda.memory functions of the Python route, by name, with PyTorch's
    signatures."""

    # a device no tensor has used has no allocator yet, and asking about it makes none: on
    # the cuda driver an allocator holds the device's context, which PyTorch's own answer
    # does not take (a loop over every device would take one on each). A device past
    # PyTorch's count goes to the library, which refuses it by name.
    def used(device):
        d = _core._device(device)
        return d if d >= _device_bound[0] or _core._load().expseg_torch_device_used(d) else None

    def memory_stats(device=None):
        d = used(device)
        return _core._fresh_stats() if d is None else _core.memory_stats(d)

    def memory_stats_as_nested_dict(device=None):
        nested = {}
        for key, value in memory_stats(device).items():
            node, parts = nested, key.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):  # a key that is also a prefix: keep it flat
                    node = None
                    break
            if node is None:
                nested[key] = value
            else:
                node[parts[-1]] = value
        return nested

    def stat(key, name):
        def f(device=None):
            d = used(device)
            if d is None:
                return _core._fresh_stats()[key]
            return _core._stat(d, key, "torch.cuda." + name)
        f.__name__ = name
        f.__doc__ = "expseg's %s of the device (the Python route of expseg)." % key
        return f

    def reset_peak(device=None):
        d = used(device)
        if d is not None:  # a fresh allocator has nothing to reset
            _core.reset_peak_memory_stats(d)

    def reset_accumulated(device=None):
        d = used(device)
        if d is not None:
            _core.reset_accumulated_memory_stats(d)

    def empty_cache():  # as PyTorch's: no argument (every device)
        _core.empty_cache(None)

    def fraction(fraction, device=None):
        d = _core._device(device)  # as PyTorch: the device is checked before the fraction
        bad = "torch.cuda.set_per_process_memory_fraction: fraction=%r: expected a float " \
              "from 0 to 1" % (fraction,)
        if not isinstance(fraction, float):  # as PyTorch: 1 is refused, 1.0 taken
            raise _core.ExpsegTypeError(bad)
        if not 0 <= fraction <= 1:
            raise _core.ExpsegValueError(bad)
        _core.set_memory_fraction(fraction, d)

    def get_fraction(device=None):
        d = used(device)
        return _core._fraction(_core._fresh_config(_core._device(device)) if d is None
                               else _core.config(d))

    def summary(device=None, abbreviated=False):
        d = used(device)
        if d is None:
            return _core._fresh_summary(_core._device(device), abbreviated)
        return _core.memory_summary(d, abbreviated)

    def history(enabled="all", *args, **kwargs):
        hist, every_thread = _history_args(enabled, args, kwargs)
        _core.record_history(**hist)
        if hist["record_cuda"]:
            _annotate_scopes(hist["enabled"], every_thread)
    # the signature PyTorch's shows (inspect.signature: callers look for an argument there)
    history.__signature__ = inspect.signature(_history_current)

    def whole(traces):  # before any device has an allocator: a fresh one's, making none
        if _core._load().expseg_torch_device_count() == 0:
            snap = _fresh_snapshot(_core._device(None), traces)
        else:
            snap = _core.snapshot_dict(None, traces)
        # as PyTorch's: one list of device_traces per device it has, used or not
        traces_of = snap.setdefault("device_traces", [])
        while len(traces_of) < _device_count():
            traces_of.append([])
        return snap

    def snap(device=None, *args, **kwargs):
        return whole(bool(kwargs.get("include_traces", True)))

    def dump(filename="dump_snapshot.pickle", *args, **kwargs):
        raw = _core._path_bytes(filename, "torch.cuda.memory._dump_snapshot")
        devices = _core._used_devices()
        traces = bool(kwargs.get("include_traces", True))
        if len(devices) == 1 and _core._lib.expseg_torch_device_used(devices[0]) and \
                devices[0] + 1 >= _device_count():  # the library's file has every list
            _core._check(_core._lib.expseg_torch_snapshot_dump_ex(devices[0], raw,
                                                                  0 if traces else 1),
                   "torch.cuda.memory._dump_snapshot", devices[0])
            return
        # as expseg_snapshot_dump: a temporary file opened before the snapshot is taken (a
        # path that cannot be written records nothing), then renamed over the name
        tmp = raw + b".tmp.%d" % os.getpid()
        try:
            f = open(tmp, "wb")
        except OSError as e:
            raise _core.ExpsegError("torch.cuda.memory._dump_snapshot(%r): cannot write the "
                                    "temporary file: %s (nothing was written, nothing recorded)"
                                    % (filename, e)) from None
        try:
            with f:
                pickle.dump(whole(traces), f, protocol=4)
            os.replace(tmp, raw)
        except OSError as e:
            os.unlink(tmp)
            raise _core.ExpsegError("torch.cuda.memory._dump_snapshot(%r): %s" % (filename, e)) \
                from None
        except BaseException:
            os.unlink(tmp)
            raise

    def renamed(f, name, why):  # PyTorch's deprecated aliases: its FutureWarning, then f
        def alias(device=None):
            warnings.warn("torch.cuda.%s %s" % (name, why), FutureWarning, stacklevel=2)
            return f(device)
        alias.__name__ = name
        return alias

    reserved, max_reserved = (stat("reserved_bytes.all.current", "memory_reserved"),
                              stat("reserved_bytes.all.peak", "max_memory_reserved"))
    every_peak = ("now calls torch.cuda.reset_peak_memory_stats, which resets /all/ peak "
                  "memory stats.")
    calls = {
        "memory_stats": memory_stats,
        "memory_stats_as_nested_dict": memory_stats_as_nested_dict,
        "memory_allocated": stat("allocated_bytes.all.current", "memory_allocated"),
        "max_memory_allocated": stat("allocated_bytes.all.peak", "max_memory_allocated"),
        "memory_reserved": reserved,
        "max_memory_reserved": max_reserved,
        "memory_cached": renamed(reserved, "memory_cached", "has been renamed to "
                                 "torch.cuda.memory_reserved"),
        "max_memory_cached": renamed(max_reserved, "max_memory_cached", "has been renamed to "
                                     "torch.cuda.max_memory_reserved"),
        "reset_peak_memory_stats": reset_peak,
        "reset_max_memory_allocated": renamed(reset_peak, "reset_max_memory_allocated",
                                              every_peak),
        "reset_max_memory_cached": renamed(reset_peak, "reset_max_memory_cached", every_peak),
        "reset_accumulated_memory_stats": reset_accumulated,
        "memory_summary": summary,
        "empty_cache": empty_cache,
        "set_per_process_memory_fraction": fraction,
        "get_per_process_memory_fraction": get_fraction,
        "memory_snapshot": lambda *args, **kwargs: whole(False)["segments"],
        "mem_get_info": _core.mem_get_info,
        "_record_memory_history": history,
        # what PyTorch's own _record_memory_history (held from before install()) calls
        "_record_memory_history_impl": history,
        "_record_memory_history_legacy": history,
        "_snapshot": snap,
        "_dump_snapshot": dump,
    }
    for f in calls.values():
        if getattr(f, "__module__", None) == __name__ and f.__doc__ is None:
            f.__doc__ = "The Python route of expseg (docs/torch.md)."
    return calls


def _fresh_snapshot(device, include_traces):
    """The snapshot dict of an allocator that has served nothing (as `device`)."""
    def dump(a):
        with tempfile.TemporaryDirectory(prefix="expseg-snapshot-") as tmp:
            path = os.path.join(tmp, "fresh.pickle")
            if _core._lib.expseg_snapshot_dump_ex(a, os.fsencode(path),
                                                  0 if include_traces else 1) != 0:
                raise _core.ExpsegError("torch.cuda.memory._snapshot: %s" % (
                    _core._lib.expseg_last_error() or b"").decode(errors="replace"))
            with open(path, "rb") as f:
                return pickle.load(f)
    return _core._with_fresh(device, dump)


# record_function scopes as the history's external annotations: PyTorch's
# _record_memory_history registers a RecordFunction callback (user scopes) that reports each
# scope's start and end to its allocator's recordAnnotation, on the calling thread only
# unless global_record_annotations=True. An allocator made from Python never hears of them,
# so the Python route wraps record_function's __enter__ and __exit__ to the same effect.
_scopes = {"on": False, "thread": None}  # thread: the one that enabled it; None: every thread


def _annotate_scopes(on, every_thread):
    import threading
    _scopes["on"] = on
    _scopes["thread"] = None if every_thread else threading.get_ident()


def _scope_annotation(torch, scope, stage):
    import threading
    if not _scopes["on"] or _scopes["thread"] not in (None, threading.get_ident()):
        return
    _core.record_annotation([("name", str(getattr(scope, "name", ""))), ("stage", stage)],
                            int(torch.cuda.current_device()))


def _patch_record_function(torch):
    """torch.autograd.profiler.record_function (the class torch.profiler re-exports): each
    scope's start and end recorded while the history is on (_annotate_scopes)."""
    profiler = getattr(getattr(torch, "autograd", None), "profiler", None)
    cls = getattr(profiler, "record_function", None)
    if cls is None or not hasattr(cls, "__enter__") or not hasattr(cls, "__exit__"):
        return
    enter, leave = cls.__enter__, cls.__exit__

    def __enter__(self):
        result = enter(self)
        _scope_annotation(torch, self, "START")
        return result

    def __exit__(self, *exc):
        result = leave(self, *exc)
        _scope_annotation(torch, self, "END")
        return result
    __enter__.__doc__, __exit__.__doc__ = enter.__doc__, leave.__doc__
    _replace(cls, "__enter__", __enter__)
    _replace(cls, "__exit__", __exit__)


# torch.accelerator's memory calls (PyTorch 2.8+; torch.accelerator.memory.X re-exported as
# torch.accelerator.X): the same figures when the current accelerator is CUDA, by their name
# there and the Python route's call that answers them.
_ACCELERATOR_CALLS = {name: name for name in (
    "memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
    "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats",
    "empty_cache")}
_ACCELERATOR_CALLS["get_memory_info"] = "mem_get_info"


def _replace(obj, name, value):
    _patched.append((obj, name, getattr(obj, name)))
    setattr(obj, name, value)


def _stream_value(torch, stream):
    """The cudaStream_t (an int) of a torch.cuda.Stream or torch.Stream."""
    value = getattr(stream, "cuda_stream", None)
    if value is None and hasattr(stream, "stream_id"):
        value = torch.cuda.Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                                  device_type=stream.device_type).cuda_stream
    if value is None:
        raise _core.ExpsegError("Tensor.record_stream(%r): expected a torch.cuda.Stream" % (stream,))
    return int(value)


def _patch_torch(torch):
    """Replaces each memory call where callers look it up: torch.cuda.memory.X and its
    re-export torch.cuda.X (and torch.accelerator.X); wraps Tensor.record_stream."""
    calls = _torch_calls(torch)
    memory = torch.cuda.memory
    for name, f in calls.items():
        for module in (memory, torch.cuda):
            if hasattr(module, name):
                _replace(module, name, f)
    accel = getattr(torch, "accelerator", None)
    for module in (accel, getattr(accel, "memory", None)):
        for name, ours in _ACCELERATOR_CALLS.items():
            if module is not None and hasattr(module, name):
                _replace(module, name, calls[ours])
    tensor = getattr(torch, "Tensor", None)
    if tensor is not None and hasattr(tensor, "record_stream"):
        original = tensor.record_stream

        def record_stream(self, stream):
            original(self, stream)  # PyTorch's own checks (and its no-op for the plug)
            ptr = self.untyped_storage().data_ptr()
            if ptr:
                _core._lib.expseg_torch_record_stream_status(ctypes.c_void_p(ptr),
                                                       ctypes.c_void_p(_stream_value(torch,
                                                                                     stream)))
        record_stream.__doc__ = getattr(original, "__doc__", None)
        _replace(tensor, "record_stream", record_stream)
    _patch_record_function(torch)
    _refuse_graphs(torch)


GRAPH_REFUSED = (
    "expseg's Python route cannot capture CUDA graphs: PyTorch gives an allocator made from "
    "Python no private pool for a graph, so memory the graph uses on replay could be handed to "
    "other tensors. Use the C++ backend (expseg.install(route=\"cxx\")), which gives each graph "
    "its own pool")


MEMPOOL_REFUSED = (
    "expseg's Python route cannot make a torch.cuda.MemPool: PyTorch's allocator made from "
    "Python has no pools (it refuses createOrIncrefPool). Use the C++ backend "
    "(expseg.install(route=\"cxx\"))")


def _refuse_graphs(torch):
    """CUDAGraph.capture_begin (torch.cuda.graph, make_graphed_callables) and MemPool() raise
    ExpsegError on the Python route, before PyTorch's allocator is asked."""
    graphs = getattr(torch.cuda, "graphs", None)
    for cls, name, why in ((getattr(graphs, "CUDAGraph", None), "capture_begin", GRAPH_REFUSED),
                           (getattr(torch.cuda.memory, "MemPool", None), "__init__",
                            MEMPOOL_REFUSED)):
        if cls is None or not hasattr(cls, name):
            continue

        def refused(self, *args, _why=why, **kwargs):
            raise _core.ExpsegError(_why)
        refused.__doc__ = why
        _replace(cls, name, refused)


def _unpatch():
    """Puts back what the Python route replaced (for tests)."""
    global _installed, _route
    while _patched:
        obj, name, original = _patched.pop()
        setattr(obj, name, original)
    _annotate_scopes(False, False)
    _installed = _route = None
