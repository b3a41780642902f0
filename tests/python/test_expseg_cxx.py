# SPDX-License-Identifier: Apache-2.0
"""test_expseg_cxx.py: python/_expseg_cxx.py without PyTorch (run by CTest: python3 -m unittest).

The cache key, the version checks, the prebuilt lookup and the one-line messages are checked
directly; install() runs in child interpreters against a stand-in `torch` package whose
`torch.utils.cpp_extension.load` either fails with a compiler log or "builds" a small C
library with the backend's two entry points (compiled here with cc), so the whole path
(load the C plug, find libexpseg, key the cache, load the backend, check its PyTorch
version, install) runs for real except the C++ backend itself."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
import _expseg_cxx as cxx  # noqa: E402

LIB = os.environ.get("EXPSEG_TEST_TORCH_LIB") or os.environ.get("EXPSEG_TORCH_LIB")
CC = shutil.which("cc") or shutil.which("gcc")

COMPILER_LOG = (
    "Error building extension 'expseg_torch_backend': [1/2] c++ -MMD -MF backend.o.d "
    "-DTORCH_EXTENSION_NAME=expseg_torch_backend -c /src/plugin/backend.cpp -o backend.o\n"
    "FAILED: backend.o\n"
    "In file included from /src/plugin/backend.cpp:14:\n"
    "/src/plugin/backend.cpp:120:3: error: 'getFoo' was not declared in this scope\n"
    "  120 |   getFoo();\n"
    "      |   ^~~~~~\n"
    "/src/plugin/backend.cpp:130:3: error: second error\n"
    "ninja: build stopped: subcommand failed.\n")

# The stand-in PyTorch: version, is_initialized and what load() does come from the
# environment of the child.
FAKE_TORCH = {
    "torch/__init__.py": textwrap.dedent("""\
        import os
        __version__ = os.environ.get("FAKE_TORCH_VERSION", "2.11.0+cu128")
        from . import cuda, utils
        """),
    "torch/cuda.py": textwrap.dedent("""\
        import os
        def is_initialized():
            return os.environ.get("FAKE_CUDA_INITIALIZED") == "1"
        """),
    "torch/utils/__init__.py": "",
    "torch/utils/cpp_extension.py": textwrap.dedent("""\
        import json, os, subprocess
        def load(name, sources, **kw):
            rec = os.environ.get("FAKE_LOAD_RECORD")
            if rec:
                with open(rec, "a") as f:
                    f.write(json.dumps({"name": name, "sources": sources, **kw}) + "\\n")
            mode = os.environ.get("FAKE_LOAD_MODE", "stub")
            if mode == "fail":
                raise RuntimeError(os.environ["FAKE_LOAD_LOG"])
            out = os.path.join(kw["build_directory"], name + ".so")
            subprocess.check_call([os.environ["FAKE_CC"], "-shared", "-fPIC", "-o", out,
                                   os.environ["FAKE_STUB_SRC"]])
        """),
}

STUB_BACKEND = textwrap.dedent("""\
    #include <stdio.h>
    #include <stdlib.h>
    const char *expseg_torch_backend_torch_version(void) {
      const char *v = getenv("STUB_BUILT_FOR");
      return v ? v : "2.11.0";
    }
    int expseg_torch_backend_install(char *err, size_t len) {
      const char *m = getenv("STUB_FAIL");
      if (m) { snprintf(err, len, "%s", m); return 1; }
      FILE *f = fopen(getenv("STUB_MARK"), "a");
      if (f) { fputs("installed\\n", f); fclose(f); }
      return 0;
    }
    """)


def one_line(test, text):
    test.assertTrue(text.strip(), "empty message")
    test.assertNotIn("\n", text.strip(), text)
    test.assertNotIn("Traceback", text, text)


class Pure(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="expseg_cxx_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write(self, name, text):
        p = os.path.join(self.tmp, name)
        with open(p, "w") as f:
            f.write(text)
        return p

    def test_versions_are_read_and_old_ones_refused(self):
        self.assertEqual(cxx.torch_version_tuple("2.11.0+cu128"), (2, 11, 0))
        self.assertEqual(cxx.torch_version_tuple("2.12.0a0+git1234"), (2, 12, 0))
        self.assertEqual(cxx.torch_version_tuple("3.0"), (3, 0, 0))
        cxx.check_torch_version("2.10.1")
        cxx.check_torch_version("2.11.0+cu128")
        with self.assertRaises(cxx.ExpsegError) as e:
            cxx.check_torch_version("2.9.1+cu126")
        one_line(self, str(e.exception))
        self.assertIn("2.10", str(e.exception))
        self.assertIn("2.9.1+cu126", str(e.exception))
        self.assertIn("pluggable", str(e.exception))
        with self.assertRaises(cxx.ExpsegError) as e:
            cxx.torch_version_tuple("nightly")
        self.assertIn("'nightly'", str(e.exception))

    def test_the_error_is_expseg_py_s(self):
        import expseg
        self.assertIs(cxx.ExpsegError, expseg.ExpsegError)

    def test_cache_key_changes_with_each_part_and_only_then(self):
        files = {"backend.cpp": self.write("backend.cpp", "int x;"),
                 "expseg.h": self.write("expseg.h", "/* h */")}
        k = cxx.cache_key("2.11.0+cu128", "0.1.0", files)
        self.assertEqual(k, cxx.cache_key("2.11.0+cu128", "0.1.0", dict(files)))
        self.assertRegex(k, r"^torch[A-Za-z0-9._-]+-[0-9a-f]{16}$")
        self.assertNotIn("+", k)
        self.assertNotIn("/", k)
        self.assertIn("2.11.0", k)
        self.assertNotEqual(k, cxx.cache_key("2.11.1+cu128", "0.1.0", files))
        self.assertNotEqual(k, cxx.cache_key("2.11.0+cu128", "0.2.0", files))
        self.write("backend.cpp", "int y;")
        self.assertNotEqual(k, cxx.cache_key("2.11.0+cu128", "0.1.0", files))

    def test_the_real_sources_are_found(self):
        files = cxx.source_files()
        self.assertEqual(sorted(files), sorted(cxx.SOURCE_NAMES))
        for p in files.values():
            self.assertTrue(os.path.isfile(p), p)

    def test_a_missing_source_is_named(self):
        with self.assertRaises(cxx.ExpsegError) as e:
            cxx.source_files([self.tmp])
        one_line(self, str(e.exception))
        self.assertIn("backend.cpp", str(e.exception))
        self.assertIn("EXPSEG_SOURCE_DIR", str(e.exception))

    def test_prebuilt_only_for_the_same_torch_and_expseg(self):
        plug = self.write("libexpseg_torch.so", "")
        so = self.write("libexpseg_torch_backend.so", "")
        self.assertIsNone(cxx.prebuilt_for(plug, "2.11.0", "0.1.0"))  # no version file
        self.write("libexpseg_torch_backend.so.torch_version", "torch 2.11.0\nexpseg 0.1.0\n")
        self.assertEqual(cxx.prebuilt_for(plug, "2.11.0+cu128", "0.1.0"), so)
        self.assertIsNone(cxx.prebuilt_for(plug, "2.11.1", "0.1.0"))
        self.assertIsNone(cxx.prebuilt_for(plug, "2.10.0", "0.1.0"))
        self.assertIsNone(cxx.prebuilt_for(plug, "2.11.0", "0.2.0"))

    def test_compiler_failure_is_one_line_naming_the_first_error_and_the_log(self):
        log = os.path.join(self.tmp, "build.log")
        err = cxx.build_failure(RuntimeError(COMPILER_LOG), log, "2.11.0")
        msg = str(err)
        one_line(self, msg)
        self.assertIn("'getFoo' was not declared", msg)
        self.assertNotIn("second error", msg)
        self.assertIn(log, msg)
        self.assertIn("2.11.0", msg)
        with open(log) as f:
            self.assertIn("second error", f.read())  # the whole output is kept

    def test_first_error_line_without_an_error_is_the_last_line(self):
        self.assertEqual(cxx.first_error_line("a\nb\n\n"), "b")
        self.assertEqual(cxx.first_error_line(""), "no output")
        long = "x.cpp:1:1: error: " + "y" * 400
        self.assertEqual(len(cxx.first_error_line(long)), 300)


@unittest.skipUnless(LIB and os.path.isfile(LIB), "needs libexpseg_torch.so (EXPSEG_TEST_TORCH_LIB)")
class Install(unittest.TestCase):
    """install() in a child interpreter with the stand-in PyTorch."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="expseg_cxx_")
        for name, text in FAKE_TORCH.items():
            p = os.path.join(self.tmp, "fake", name)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text)
        self.stub = os.path.join(self.tmp, "stub.c")
        with open(self.stub, "w") as f:
            f.write(STUB_BACKEND)
        self.record = os.path.join(self.tmp, "load.jsonl")
        self.mark = os.path.join(self.tmp, "installed")
        self.cache = os.path.join(self.tmp, "cache")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_install(self, lib=LIB, **env):
        e = dict(os.environ)
        e.update(PYTHONPATH=os.pathsep.join([os.path.join(self.tmp, "fake"),
                                             os.path.join(REPO, "python")]),
                 EXPSEG_CACHE_DIR=self.cache, FAKE_LOAD_RECORD=self.record,
                 FAKE_STUB_SRC=self.stub, FAKE_CC=CC or "cc", STUB_MARK=self.mark,
                 FAKE_LOAD_LOG=COMPILER_LOG)
        for k, v in env.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
        code = textwrap.dedent("""\
            import sys, _expseg_cxx
            try:
                print("RESULT", _expseg_cxx.install(sys.argv[1]), _expseg_cxx.installed_path())
                print("AGAIN", _expseg_cxx.install(sys.argv[1]))
            except _expseg_cxx.ExpsegError as e:
                print("ERROR", e)
            """)
        p = subprocess.run([sys.executable, "-c", code, lib], env=e, capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout.strip()

    def loads(self):
        if not os.path.exists(self.record):
            return []
        with open(self.record) as f:
            return [json.loads(l) for l in f]

    def test_compile_failure_is_one_line_naming_the_log(self):
        out = self.run_install(FAKE_LOAD_MODE="fail")
        self.assertTrue(out.startswith("ERROR "), out)
        msg = out[len("ERROR "):]
        one_line(self, msg)
        self.assertIn("'getFoo' was not declared", msg)
        calls = self.loads()
        self.assertEqual(len(calls), 1)
        log = os.path.join(calls[0]["build_directory"], "build.log")
        self.assertIn(log, msg)
        with open(log) as f:
            self.assertIn("ninja: build stopped", f.read())

    @unittest.skipUnless(CC, "needs a C compiler for the stand-in backend")
    def test_build_once_then_cached_and_installed(self):
        out = self.run_install()
        self.assertTrue(out.startswith("RESULT True "), out)
        self.assertIn("AGAIN True", out)
        with open(self.mark) as f:
            self.assertEqual(f.read(), "installed\n")  # once, though install() ran twice
        calls = self.loads()
        self.assertEqual(len(calls), 1)
        c = calls[0]
        self.assertEqual(c["name"], "expseg_torch_backend")
        self.assertTrue(c["sources"][0].endswith("backend.cpp"))
        self.assertTrue(c["with_cuda"])
        self.assertFalse(c["is_python_module"])
        key = os.path.basename(c["build_directory"])
        self.assertTrue(c["build_directory"].startswith(os.path.join(self.cache, "torch_backend")))
        self.assertTrue(key.startswith("torch2.11.0_cu128-expseg"), key)
        incs = c["extra_include_paths"]
        self.assertTrue(any(os.path.isfile(os.path.join(d, "expseg.h")) for d in incs), incs)
        self.assertTrue(any(f.startswith("-l:libexpseg.so") for f in c["extra_ldflags"]),
                        c["extra_ldflags"])
        # a second process finds it in the cache and compiles nothing
        os.unlink(self.mark)
        out = self.run_install()
        self.assertTrue(out.startswith("RESULT True"), out)
        self.assertEqual(len(self.loads()), 1)
        # another PyTorch: another key, another build
        out = self.run_install(FAKE_TORCH_VERSION="2.10.0", STUB_BUILT_FOR="2.10.0")
        self.assertTrue(out.startswith("RESULT True"), out)
        self.assertEqual(len(self.loads()), 2)
        self.assertNotEqual(self.loads()[1]["build_directory"], c["build_directory"])

    @unittest.skipUnless(CC, "needs a C compiler for the stand-in backend")
    def test_a_backend_built_for_another_torch_is_refused(self):
        out = self.run_install(STUB_BUILT_FOR="2.10.0")
        self.assertTrue(out.startswith("ERROR "), out)
        one_line(self, out)
        self.assertIn("built against PyTorch 2.10.0", out)
        self.assertIn("2.11.0+cu128 is running", out)
        self.assertFalse(os.path.exists(self.mark))

    @unittest.skipUnless(CC, "needs a C compiler for the stand-in backend")
    def test_the_backend_s_refusal_is_passed_on(self):
        out = self.run_install(STUB_FAIL="expseg: the C++ backend came too late: native")
        self.assertEqual(out, "ERROR expseg: the C++ backend came too late: native")

    def test_too_late_is_refused_before_compiling(self):
        out = self.run_install(FAKE_CUDA_INITIALIZED="1")
        self.assertTrue(out.startswith("ERROR "), out)
        one_line(self, out)
        self.assertIn("too late", out)
        self.assertEqual(self.loads(), [])

    def test_old_torch_is_refused_before_compiling(self):
        out = self.run_install(FAKE_TORCH_VERSION="2.8.0")
        self.assertIn("needs PyTorch 2.10 or later", out)
        self.assertEqual(self.loads(), [])

    @unittest.skipUnless(CC, "needs a C compiler for the stand-in backend")
    def test_a_matching_prebuilt_backend_is_loaded_without_compiling(self):
        d = os.path.join(self.tmp, "prefix")
        os.makedirs(d)
        plug = os.path.join(d, os.path.basename(LIB))
        shutil.copy(LIB, plug)
        core = [l for l in subprocess.run(["ldd", LIB], capture_output=True, text=True)
                .stdout.split("\n") if "libexpseg.so" in l]
        if core and "=>" in core[0]:
            shutil.copy(core[0].split("=>")[1].split()[0], d)
        so = os.path.join(d, "libexpseg_torch_backend.so")
        subprocess.check_call([CC, "-shared", "-fPIC", "-o", so, self.stub])
        expseg_version = subprocess.run(
            [sys.executable, "-c", "import ctypes,sys;l=ctypes.CDLL(sys.argv[1]);"
             "l.expseg_version.restype=ctypes.c_char_p;print(l.expseg_version().decode())",
             plug], capture_output=True, text=True).stdout.strip()
        with open(so + ".torch_version", "w") as f:
            f.write("torch 2.11.0\nexpseg %s\n" % expseg_version)
        out = self.run_install(lib=plug)
        self.assertTrue(out.startswith("RESULT True " + so), out)
        self.assertEqual(self.loads(), [])  # nothing compiled


if __name__ == "__main__":
    unittest.main()
