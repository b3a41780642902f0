# SPDX-License-Identifier: Apache-2.0
"""_expseg_cxx.py: expseg's C++ backend for PyTorch (plugin/backend.cpp), built against the
PyTorch that is running and installed as its CUDA allocator, so every torch.cuda memory call
(not only alloc and free) reaches expseg. expseg.install(route="cxx"|"auto") calls install().

    install(lib_path) -> True

lib_path is libexpseg_torch.so (the C plug: the backend serves PyTorch from its allocators).
The backend is taken, in this order, from:
  1. libexpseg_torch_backend*.so next to lib_path, built by CMake (-DEXPSEG_WITH_TORCH=ON),
     when its .torch_version file names the running PyTorch and this expseg;
  2. the cache: $EXPSEG_CACHE_DIR, else $XDG_CACHE_HOME/expseg, else ~/.cache/expseg, in
     torch_backend/torch<version>-expseg<version>-<hash of the sources>/;
  3. a build there with torch.utils.cpp_extension.load (a minute or so, once per key).
Every failure is an ExpsegError (expseg.py's; a compatible one when expseg.py is not
importable) with a one-line message; a failed compile names the log holding the whole
compiler output. Standard library only, plus PyTorch (imported by install())."""

import ctypes
import glob
import hashlib
import os
import re

BACKEND_NAME = "expseg_torch_backend"
PREBUILT_GLOB = "libexpseg_torch_backend*.so"
VERSION_SUFFIX = ".torch_version"
MIN_TORCH = (2, 10)
SOURCE_NAMES = ("backend.cpp", "backend_glue.h", "expseg.h", "expseg_torch.h")

_installed = None  # the path of the backend installed in this process


try:
    from expseg import ExpsegError
except ImportError:  # expseg.py not on the path: the same one-line error
    class ExpsegError(RuntimeError):
        """A failure of expseg, with a one-line message."""

        def __init__(self, message):
            super().__init__(" ".join(str(message).split()))


# ---- versions and the cache key ----

def torch_version_tuple(version):
    """(major, minor, patch) of a torch.__version__ such as "2.11.0+cu128" or "2.12.0a0+git1"."""
    m = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    if not m:
        raise ExpsegError("expseg: cannot read the PyTorch version %r (expected MAJOR.MINOR.PATCH)"
                          % (version,))
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def check_torch_version(version):
    """Raises unless the C++ backend supports this PyTorch (2.10 or later)."""
    if torch_version_tuple(version)[:2] < MIN_TORCH:
        raise ExpsegError("expseg: the C++ backend needs PyTorch %d.%d or later; this is %s: use "
                          "expseg.install(route=\"pluggable\") (alloc and free only)"
                          % (MIN_TORCH + (version,)))


def source_dirs():
    """Where the backend's sources and headers are: the repository (python/../plugin, ../torch,
    ../include) or an install (PREFIX/share/expseg/plugin, PREFIX/include)."""
    here = os.path.dirname(os.path.abspath(__file__))
    up = os.path.dirname(here)
    cands = [os.path.join(up, "plugin"), os.path.join(up, "torch"), os.path.join(up, "include"),
             os.path.normpath(os.path.join(up, "..", "..", "include"))]
    env = os.environ.get("EXPSEG_SOURCE_DIR")
    if env:
        cands = [os.path.join(env, d) for d in ("plugin", "torch", "include")] + cands
    return [d for d in cands if os.path.isdir(d)]


def source_files(dirs=None):
    """The files the backend is compiled from, by name; raises when one is missing."""
    dirs = source_dirs() if dirs is None else dirs
    found = {}
    for name in SOURCE_NAMES:
        for d in dirs:
            p = os.path.join(d, name)
            if os.path.isfile(p):
                found[name] = p
                break
        else:
            raise ExpsegError("expseg: the C++ backend's source %s was not found (looked in %s); "
                              "set EXPSEG_SOURCE_DIR to the expseg source tree"
                              % (name, ", ".join(dirs) or "nowhere"))
    return found


def cache_key(torch_version, expseg_version, files):
    """torch<version>-expseg<version>-<16 hex digits of the sources' SHA-256>: a new PyTorch,
    a new expseg or any changed source gives a new build."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0")
        with open(files[name], "rb") as f:
            h.update(f.read())
        h.update(b"\0")
    safe = [re.sub(r"[^A-Za-z0-9.]+", "_", str(v)) for v in (torch_version, expseg_version)]
    return "torch%s-expseg%s-%s" % (safe[0], safe[1], h.hexdigest()[:16])


def cache_root():
    env = os.environ.get("EXPSEG_CACHE_DIR")
    if env:
        return env
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "expseg")


# ---- the prebuilt library ----

def read_version_file(path):
    """{"torch": "2.11.0", "expseg": "0.1.0"} from a .torch_version file ({} if unreadable)."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    out[parts[0]] = parts[1]
    except OSError:
        pass
    return out


def prebuilt_for(lib_path, torch_version, expseg_version):
    """The CMake-built backend next to lib_path when it was built against this PyTorch
    (same MAJOR.MINOR.PATCH) and this expseg; else None."""
    want = torch_version_tuple(torch_version)
    for so in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(lib_path)),
                                            PREBUILT_GLOB))):
        if not os.path.isfile(so):
            continue
        v = read_version_file(so + VERSION_SUFFIX)
        try:
            same_torch = "torch" in v and torch_version_tuple(v["torch"]) == want
        except ExpsegError:
            same_torch = False
        if same_torch and v.get("expseg") == expseg_version:
            return so
    return None


# ---- compiling ----

_ERROR_LINE = re.compile(r"(^|\s|:)(fatal )?error\b", re.IGNORECASE)


def first_error_line(text):
    """The first line of compiler output that reports an error (else the last non-empty line),
    stripped and at most 300 characters."""
    lines = [l.strip() for l in str(text).splitlines() if l.strip()]
    pick = next((l for l in lines if _ERROR_LINE.search(l) and not l.startswith("Error building")),
                lines[-1] if lines else "no output")
    return pick if len(pick) <= 300 else pick[:297] + "..."


def build_failure(exc, log_path, torch_version):
    """Writes the whole failure to log_path and returns the one-line ExpsegError."""
    text = str(exc)
    out = getattr(exc, "output", None)
    if out:
        text += "\n" + (out.decode(errors="replace") if isinstance(out, bytes) else str(out))
    try:
        with open(log_path, "w") as f:
            f.write(text + "\n")
        where = "the compiler's output is in %s" % log_path
    except OSError as e:
        where = "and the log %s could not be written (%s)" % (log_path, e.strerror)
    return ExpsegError("expseg: building the C++ backend against PyTorch %s failed: %s; %s"
                       % (torch_version, first_error_line(text), where))


def loaded_library(fragment):
    """The path of a loaded shared object whose file name starts with fragment (from
    /proc/self/maps), or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith(fragment):
                    return parts[5].strip()
    except OSError:
        pass
    return None


def build(torch, lib_path, core_path, torch_version, expseg_version):
    """Compiles the backend into the cache (or finds it there); returns the .so path."""
    files = source_files()
    key = cache_key(torch_version, expseg_version, files)
    build_dir = os.path.join(cache_root(), "torch_backend", key)
    so = os.path.join(build_dir, BACKEND_NAME + ".so")
    if os.path.isfile(so):
        return so
    try:
        os.makedirs(build_dir, exist_ok=True)
    except OSError as e:
        raise ExpsegError("expseg: cannot create the C++ backend's build folder %s (%s); set "
                          "EXPSEG_CACHE_DIR to a writable folder" % (build_dir, e.strerror)) from None
    from torch.utils import cpp_extension
    includes = sorted({os.path.dirname(p) for p in files.values()})
    libdirs = sorted({os.path.dirname(os.path.abspath(p)) for p in (lib_path, core_path)})
    ldflags = ["-L%s" % d for d in libdirs] + ["-Wl,-rpath,%s" % d for d in libdirs]
    ldflags += ["-l:%s" % os.path.basename(lib_path), "-l:%s" % os.path.basename(core_path)]
    try:
        cpp_extension.load(name=BACKEND_NAME, sources=[files["backend.cpp"]],
                           extra_include_paths=includes, extra_cflags=["-O2"],
                           extra_ldflags=ldflags, build_directory=build_dir, with_cuda=True,
                           is_python_module=False, verbose=False)
    except Exception as e:  # compiler errors arrive as RuntimeError with the whole output
        raise build_failure(e, os.path.join(build_dir, "build.log"), torch_version) from None
    if not os.path.isfile(so):
        raise ExpsegError("expseg: torch.utils.cpp_extension.load reported success but %s is "
                          "not there" % so)
    return so


# ---- installing ----

def install(lib_path):
    """Makes expseg's C++ backend PyTorch's CUDA allocator (before the first CUDA
    allocation). Returns True; a second call in the same process does nothing."""
    global _installed
    if _installed is not None:
        return True
    try:
        import torch
    except ImportError:
        raise ExpsegError("expseg: the C++ backend needs PyTorch, which is not installed here "
                          "(pip install torch)") from None
    torch_version = str(torch.__version__)
    check_torch_version(torch_version)
    if torch.cuda.is_initialized():
        raise ExpsegError("expseg: the C++ backend came too late: PyTorch's CUDA allocator is "
                          "already initialized (CUDA was used before); install expseg before "
                          "the first CUDA tensor, e.g. right after import torch")
    try:  # the C plug and, through its RUNPATH, libexpseg: global, so the backend links to them
        ctypes.CDLL(lib_path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise ExpsegError("expseg: cannot load %s: %s" % (lib_path, e)) from None
    core_path = loaded_library("libexpseg.so")
    if core_path is None:
        raise ExpsegError("expseg: %s is loaded but libexpseg.so is not (is it the C plug?)"
                          % lib_path)
    core = ctypes.CDLL(core_path, mode=ctypes.RTLD_GLOBAL)
    core.expseg_version.restype = ctypes.c_char_p
    expseg_version = core.expseg_version().decode()
    so = prebuilt_for(lib_path, torch_version, expseg_version)
    if so is None:
        so = build(torch, lib_path, core_path, torch_version, expseg_version)
    try:
        backend = ctypes.CDLL(so, mode=ctypes.RTLD_GLOBAL)
        backend.expseg_torch_backend_torch_version.restype = ctypes.c_char_p
        backend.expseg_torch_backend_install.restype = ctypes.c_int
        backend.expseg_torch_backend_install.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    except (OSError, AttributeError) as e:
        raise ExpsegError("expseg: cannot load the C++ backend %s: %s (remove it to rebuild)"
                          % (so, e)) from None
    built = backend.expseg_torch_backend_torch_version().decode()
    if torch_version_tuple(built) != torch_version_tuple(torch_version):
        raise ExpsegError("expseg: the C++ backend %s was built against PyTorch %s but %s is "
                          "running; remove it to rebuild" % (so, built, torch_version))
    err = ctypes.create_string_buffer(1024)
    if backend.expseg_torch_backend_install(err, len(err)) != 0:
        raise ExpsegError(err.value.decode(errors="replace") or
                          "expseg: the C++ backend refused to install (no message)")
    _installed = so
    return True


def installed_path():
    """The backend library installed in this process, or None."""
    return _installed
