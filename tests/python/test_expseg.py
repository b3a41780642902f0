# SPDX-License-Identifier: Apache-2.0
"""test_expseg.py: python/expseg.py without PyTorch (run by CTest: python3 -m unittest).

The statistics calls are checked against the C library itself (libexpseg_torch.so on the
host driver, through ctypes); install() is checked for its messages with stand-in torch
modules (none, no GPU, too late, a refused swap) and for what it hands PyTorch. Each test
runs in a child interpreter where the process-wide state matters (the library creates one
allocator per device on first use, from $EXPSEG_DRIVER at that moment)."""

import json
import os
import subprocess
import sys
import textwrap
import types
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))
import expseg  # noqa: E402

LIB = os.environ.get("EXPSEG_TEST_TORCH_LIB") or os.environ.get("EXPSEG_TORCH_LIB")

# Keys torch.cuda.memory_stats() has (PyTorch 2.5-2.11), every one must be there.
TORCH_KEYS = [
    "%s.%s.%s" % (m, p, k)
    for m in ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
              "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
    for p in ("all", "small_pool", "large_pool")
    for k in ("current", "peak", "allocated", "freed")
] + ["%s.%s" % (m, k) for m in ("oversize_allocations", "oversize_segments")
     for k in ("current", "peak", "allocated", "freed")] + [
    "num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
    "num_device_free", "max_split_size"]


def run_child(code, **env):
    """Runs code in a fresh interpreter with expseg importable; returns (rc, stdout, stderr)."""
    e = dict(os.environ)
    e.pop("EXPSEG_DRIVER", None)
    e["PYTHONPATH"] = os.path.join(REPO, "python")
    if LIB:
        e["EXPSEG_TORCH_LIB"] = LIB
    for k, v in env.items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e,
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def one_line(test, text):
    test.assertTrue(text.strip(), "empty message")
    test.assertNotIn("\n", text.strip(), text)
    test.assertNotIn("Traceback", text, text)
    test.assertNotIn("ctypes.", text, text)


def torch_with_gpu():
    """True where PyTorch is importable (in a child: importing it here would hide the
    no-PyTorch tests) and sees a GPU."""
    rc, out, _ = run_child("import torch; print(torch.cuda.is_available())")
    return rc == 0 and out.strip() == "True"


def fake_torch(available=True, initialized=False, refuse=None):
    """A stand-in torch module recording what install() asks of it."""
    t = types.ModuleType("torch")
    calls = []

    class Pluggable:
        def __init__(self, path, alloc, free):
            calls.append(("CUDAPluggableAllocator", path, alloc, free))

    def change(a):
        calls.append(("change_current_allocator", a))
        if refuse:
            raise RuntimeError(refuse)

    memory = types.SimpleNamespace(CUDAPluggableAllocator=Pluggable,
                                   change_current_allocator=change)
    t.cuda = types.SimpleNamespace(is_available=lambda: available,
                                   is_initialized=lambda: initialized,
                                   current_device=lambda: 0, memory=memory)
    return t, calls


@unittest.skipUnless(LIB and os.path.isfile(LIB),
                     "set EXPSEG_TEST_TORCH_LIB to the built libexpseg_torch.so")
class WithLibrary(unittest.TestCase):
    def test_memory_stats_shape_and_values_on_host(self):
        rc, out, err = run_child("""
            import ctypes, json, expseg
            lib = expseg._load()
            s0 = expseg.memory_stats(1)
            p = lib.expseg_torch_alloc(3 << 20, 1, None)
            assert p, expseg.last_error(1)
            s = expseg.memory_stats(1)
            lib.expseg_torch_free(p, 3 << 20, 1, None)
            after_free = expseg.memory_stats(1)
            expseg.empty_cache()
            emptied = expseg.memory_stats(1)
            expseg.reset_peak_memory_stats(1)
            reset = expseg.memory_stats(1)
            expseg.reset_accumulated_memory_stats(1)
            acc = expseg.memory_stats(1)
            print(json.dumps(dict(keys=list(s), types=sorted({type(v).__name__ for v in s.values()}),
                cls=type(s).__name__, s0=s0, s=s, after_free=after_free, emptied=emptied,
                reset=reset, acc=acc, driver=expseg.driver(1), info=expseg.mem_get_info(1))))
            """, EXPSEG_DRIVER="host:capacity=64M")
        self.assertEqual(rc, 0, err)
        import json
        r = json.loads(out)
        self.assertEqual(r["keys"], sorted(r["keys"]))
        self.assertEqual(r["types"], ["int"])
        self.assertEqual(r["cls"], "OrderedDict")
        for k in TORCH_KEYS:
            self.assertIn(k, r["keys"])
        self.assertTrue(any(k.startswith("expseg.") for k in r["keys"]))
        self.assertEqual(r["driver"], "host")
        self.assertEqual(r["info"][1], 64 << 20)
        self.assertEqual(r["s0"]["allocated_bytes.all.current"], 0)
        self.assertEqual(r["s"]["requested_bytes.all.current"], 3 << 20)
        self.assertGreaterEqual(r["s"]["allocated_bytes.all.current"], 3 << 20)
        self.assertEqual(r["s"]["allocation.all.current"], 1)
        self.assertEqual(r["after_free"]["allocated_bytes.all.current"], 0)
        self.assertGreater(r["after_free"]["reserved_bytes.all.current"], 0)
        self.assertEqual(r["emptied"]["reserved_bytes.all.current"], 0)
        self.assertGreater(r["emptied"]["allocated_bytes.all.peak"], 0)
        self.assertEqual(r["reset"]["allocated_bytes.all.peak"], 0)
        self.assertEqual(r["reset"]["allocation.all.allocated"], 1)
        self.assertEqual(r["acc"]["allocation.all.allocated"], 0)

    def test_region_sleep_wake_keeps_addresses_and_bytes(self):
        # host driver: device addresses are this process's memory, read with ctypes
        rc, out, err = run_child("""
            import ctypes, expseg
            lib = expseg._load()
            with expseg.region("weights"):
                p = lib.expseg_torch_alloc(3 << 20, 0, None)
            assert p, expseg.last_error()
            ctypes.memmove(p, bytes(range(256)) * 4, 1024)
            before = expseg.memory_stats()["reserved_bytes.all.current"]
            expseg.sleep("weights")
            asleep = expseg.memory_stats()["reserved_bytes.all.current"]
            for call in (lambda: expseg.sleep("nope"), lambda: expseg.sleep("weights", "zap"),
                         lambda: expseg.sleep(3)):
                try:
                    call()
                    print("no error")
                except expseg.ExpsegError as e:
                    print(e)
            with expseg.region("weights"):
                q = lib.expseg_torch_alloc(1 << 20, 0, None)
            print("refused" if not q else "served", expseg.last_error().split(":")[0])
            expseg.wake("weights")
            print(before, asleep, ctypes.string_at(p, 1024) == bytes(range(256)) * 4)
            """, EXPSEG_DRIVER="host:capacity=64M")
        self.assertEqual(rc, 0, err)
        lines = out.strip().split("\n")
        self.assertIn('no region is tagged "nope"', lines[0])
        self.assertIn("mode 'zap'", lines[1])
        self.assertIn("region tag 3", lines[2])
        self.assertTrue(lines[3].startswith("refused"), lines[3])
        before, asleep, same = lines[4].split()
        self.assertGreater(int(before), int(asleep))
        self.assertEqual(same, "True")

    def test_region_info_follows_sleep_and_wake(self):
        # host driver: the dict's figures against what the test allocated, at each step
        rc, out, err = run_child("""
            import json, expseg
            lib = expseg._load()
            with expseg.region("weights"):
                p = lib.expseg_torch_alloc(3 << 20, 0, None)
            assert p, expseg.last_error()
            steps = {"awake": expseg.region_info("weights")}
            expseg.sleep("weights")
            lib.expseg_torch_free(p, 3 << 20, 0, None)
            steps["asleep"] = expseg.region_info("weights", device=0)
            expseg.wake("weights")
            steps["woken"] = expseg.region_info("weights")
            for call in (lambda: expseg.region_info("nope"), lambda: expseg.region_info(7)):
                try:
                    call()
                    steps.setdefault("errors", []).append("no error")
                except expseg.ExpsegError as e:
                    steps.setdefault("errors", []).append(str(e))
            print(json.dumps(steps))
            """, EXPSEG_DRIVER="host:capacity=64M")
        self.assertEqual(rc, 0, err)
        r = json.loads(out)
        awake, asleep, woken = r["awake"], r["asleep"], r["woken"]
        self.assertEqual(sorted(awake), sorted([
            "pool", "asleep", "live_bytes", "device_bytes", "asleep_bytes", "host_bytes",
            "host_kept_bytes", "deferred_frees", "sleeps", "wakes", "last_sleep_us",
            "last_wake_us", "last_sleep_at_us", "last_wake_at_us", "last_sleep_copy_us",
            "last_wake_copy_us"]))
        self.assertIs(awake["asleep"], False)
        self.assertEqual(awake["live_bytes"], 3 << 20)
        self.assertGreaterEqual(awake["device_bytes"], 3 << 20)
        self.assertGreater(awake["pool"], 0)
        self.assertEqual((awake["sleeps"], awake["wakes"], awake["last_sleep_at_us"]), (0, 0, 0))
        self.assertIs(asleep["asleep"], True)
        self.assertEqual(asleep["device_bytes"], 0)
        self.assertEqual(asleep["asleep_bytes"], awake["device_bytes"])
        self.assertGreaterEqual(asleep["host_bytes"], 3 << 20)  # whole pages
        self.assertEqual((asleep["sleeps"], asleep["wakes"], asleep["deferred_frees"]), (1, 0, 1))
        self.assertGreater(asleep["last_sleep_at_us"], 1.5e15)  # after 2017, in microseconds
        self.assertIs(woken["asleep"], False)
        self.assertEqual((woken["sleeps"], woken["wakes"], woken["deferred_frees"]), (1, 1, 0))
        self.assertEqual((woken["asleep_bytes"], woken["host_bytes"]), (0, 0))
        self.assertEqual(woken["live_bytes"], 0)  # the free made asleep took effect
        self.assertGreaterEqual(woken["last_wake_at_us"], asleep["last_sleep_at_us"])
        self.assertEqual(woken["pool"], awake["pool"])
        nope, seven = r["errors"]
        self.assertIn('expseg.region_info(\'nope\')', nope)
        self.assertIn('no region is tagged "nope"', nope)
        self.assertIn("region tag 7", seven)
        for e in r["errors"]:
            one_line(self, e)

    def test_region_info_rejects_tags_that_are_not_printable_ascii(self):
        # a tag with a non-ASCII character or a NUL is refused by name: it must not alias
        # another region ("w\u00e9" read as "w?", "w\0x" cut to "w")
        rc, out, err = run_child("""
            import json, expseg
            lib = expseg._load()
            res = {}
            for tag in ("w?", "w"):
                with expseg.region(tag):
                    assert lib.expseg_torch_alloc(1 << 20, 0, None), expseg.last_error()
            for tag in ("w\\u00e9", "w\\0x", "", "x" * 64, "x" * 100000):
                try:
                    res[repr(tag)[:20]] = expseg.region_info(tag)["live_bytes"]
                except expseg.ExpsegError as e:
                    res[repr(tag)[:20]] = "error: " + str(e)
                try:
                    with expseg.region(tag):
                        pass
                    res["region " + repr(tag)[:20]] = "entered"
                except expseg.ExpsegError as e:
                    res["region " + repr(tag)[:20]] = "error: " + str(e)
            res["w"] = expseg.region_info("w")["live_bytes"]
            print(json.dumps(res))
            """, EXPSEG_DRIVER="host:capacity=64M")
        self.assertEqual(rc, 0, err)
        r = json.loads(out)
        self.assertEqual(r["w"], 1 << 20)
        for k, v in r.items():
            if k == "w":
                continue
            self.assertIsInstance(v, str, "%s was accepted: %r" % (k, v))
            self.assertIn("printable ASCII", v)
            one_line(self, v)

    def test_region_ends_when_its_block_raises(self):
        # the with block ends the region even when it raises: a later allocation is not
        # routed to it (while it sleeps such an allocation would be refused)
        rc, out, err = run_child("""
            import expseg
            lib = expseg._load()
            try:
                with expseg.region("kv"):
                    p = lib.expseg_torch_alloc(1 << 20, 0, None)
                    raise KeyError("inside")
            except KeyError:
                pass
            expseg.sleep("kv", "discard")
            q = lib.expseg_torch_alloc(1 << 20, 0, None)
            print("served" if q else "refused: " + expseg.last_error())
            with expseg.region("kv"):
                r = lib.expseg_torch_alloc(1 << 20, 0, None)
            print("served" if r else "refused")
            """, EXPSEG_DRIVER="host:capacity=64M")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.split(), ["served", "refused"])

    def test_sleep_wake_example_runs(self):
        # examples/python/sleep_wake.py, as its docstring says to run it
        e = dict(os.environ)
        e.pop("EXPSEG_DRIVER", None)
        e["PYTHONPATH"] = os.path.join(REPO, "python")
        if LIB:
            e["EXPSEG_TORCH_LIB"] = LIB
        p = subprocess.run([sys.executable, os.path.join(REPO, "examples", "python", "sleep_wake.py")],
                           env=e, capture_output=True, text=True, timeout=120, cwd=REPO)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        lines = p.stdout.strip().split("\n")
        self.assertEqual(len(lines), 3, p.stdout)
        self.assertIn("bytes intact", lines[2])
        awake, asleep = (int(x.split(" MiB")[0].split()[-1]) for x in lines[:2])
        self.assertGreaterEqual(awake, 32)
        self.assertLess(asleep, awake)

    def test_device_strings_and_bad_paths(self):
        rc, out, err = run_child("""
            import expseg
            print(expseg.memory_stats("cuda:1")["allocation.all.current"],
                  expseg.driver("cuda"), expseg.driver("cuda:0"))
            for call in (lambda: expseg.snapshot(None), lambda: expseg.snapshot("/tmp/a\\0b"),
                         lambda: expseg.memory_stats("cpu:0"), lambda: expseg.memory_stats(True)):
                try:
                    call()
                    print("no error")
                except expseg.ExpsegError as e:
                    print(e)
            """, EXPSEG_DRIVER="sim:capacity=1G")
        self.assertEqual(rc, 0, err)
        lines = out.strip().split("\n")
        self.assertEqual(lines[0], "0 sim sim", out)
        self.assertEqual(len(lines), 5, out)
        self.assertIn("expected a file name", lines[1])
        self.assertIn("NUL", lines[2])
        self.assertIn("'cpu:0'", lines[3])
        self.assertIn("True", lines[4])

    def test_no_gpu_and_no_driver_named_is_one_line(self):
        rc, out, err = run_child("""
            import expseg
            try:
                expseg.memory_stats(0)
                print("no error: driver", expseg.driver(0))
            except expseg.ExpsegError as e:
                print(e)
            """, EXPSEG_DRIVER=None)
        self.assertEqual(rc, 0, err)
        if out.startswith("no error: driver cuda"):
            self.skipTest("a usable GPU: the default driver is cuda")
        one_line(self, out)
        self.assertIn("expseg.memory_stats(device 0)", out)
        self.assertIn("EXPSEG_DRIVER=host", out)
        self.assertIn("cuda driver", out)

    def test_snapshot_and_bad_device_are_one_line(self):
        rc, out, err = run_child("""
            import os, tempfile, expseg
            path = os.path.join(tempfile.mkdtemp(), "s.pickle")
            try:
                expseg.snapshot(path, 0)
                print("written" if os.path.getsize(path) > 0 else "empty")
            except expseg.ExpsegError as e:
                print(e)
            for bad in (-2, "cuda:x", 99):
                try:
                    expseg.memory_stats(bad)
                    print("no error for", bad)
                except expseg.ExpsegError as e:
                    print(e)
            """, EXPSEG_DRIVER="sim:capacity=1G")
        self.assertEqual(rc, 0, err)
        lines = out.strip().split("\n")
        self.assertEqual(len(lines), 4, out)
        self.assertTrue(lines[0] == "written" or "EXPSEG_ERR_UNSUPPORTED" in lines[0], lines[0])
        self.assertIn("device -2", lines[1])
        self.assertIn("'cuda:x'", lines[2])
        self.assertIn("device 99", lines[3])

    def test_history_arguments_annotate_and_traceback(self):
        rc, out, err = run_child('''
            import os, pickle, tempfile, expseg
            lib = expseg._load()
            expseg.record_history(True, 1000, c_stacks=False, device=0)
            p = lib.expseg_torch_alloc(4096, 0, None)
            expseg.annotate_memory(p, "weights", 0)
            expseg.annotate_memory(None, "step 1", 0)
            print(expseg.allocation_traceback(p, 0))
            path = os.path.join(tempfile.mkdtemp(), "s.pickle")
            expseg.snapshot(path, 0)
            s = pickle.load(open(path, "rb"))
            print([(e["action"], e["addr"] == p, e["user_metadata"])
                   for e in s["device_traces"][0] if e["action"] == "annotate"])
            expseg.snapshot(path, 0, include_traces=False)
            print(pickle.load(open(path, "rb"))["device_traces"])
            expseg.record_history(True, 1000, c_stacks=False, device=0, clear_history=True,
                                  skip_actions=["alloc"])
            q = lib.expseg_torch_alloc(8192, 0, None)
            expseg.snapshot(path, 0)
            print(sorted({e["action"] for e in pickle.load(open(path, "rb"))["device_traces"][0]}))
            for bad in (lambda: expseg.record_history(skip_actions=["segment_map"]),
                        lambda: expseg.annotate_memory(p, 3, 0),
                        lambda: expseg.allocation_traceback(q, 0)):
                try:
                    bad()
                    print("no error")
                except expseg.ExpsegError as e:
                    print(e)
            ''', EXPSEG_DRIVER="sim:capacity=1G")
        self.assertEqual(rc, 0, err)
        lines = out.strip().split("\n")
        self.assertEqual(len(lines), 7, out)
        self.assertEqual(lines[0], "[]")  # no frames: no C stacks, nothing pushed
        self.assertEqual(lines[1], "[('annotate', True, 'weights'), ('annotate', False, 'step 1')]")
        self.assertEqual(lines[2], "[[]]")
        self.assertEqual(lines[3], "['snapshot']")  # cleared; the alloc skipped
        self.assertIn("'segment_map'", lines[4])
        self.assertIn("alloc, free_requested", lines[4])
        self.assertIn("text=3", lines[5])
        self.assertIn("no longer holds its alloc event", lines[6])

    def test_skip_actions_come_from_the_c_librarys_table(self):
        rc, out, err = run_child('''
            import ctypes, json, expseg
            lib = expseg._load()
            names = lib.expseg_history_skip_action_names().decode()
            flags = {n: expseg._skip_action(n) for n in names.split(", ")}
            msgs = []
            for bad in (["segment_map"], ["alloc", 3], ["al\\0loc"]):
                try:
                    expseg.record_history(True, 10, skip_actions=bad)
                    msgs.append("no error")
                except expseg.ExpsegError as e:
                    msgs.append(str(e))
            print(json.dumps(dict(names=names, flags=flags, msgs=msgs)))
            ''', EXPSEG_DRIVER="sim:capacity=1G")
        self.assertEqual(rc, 0, err)
        r = json.loads(out.strip().split("\n")[-1])
        # PyTorch's names, each with its EXPSEG_HISTORY_SKIP_* bit (include/expseg.h)
        self.assertEqual(r["flags"], {"alloc": 1 << 8, "free_requested": 1 << 9,
                                      "free_completed": 1 << 10, "segment_alloc": 1 << 11,
                                      "segment_free": 1 << 12, "oom": 1 << 15,
                                      "snapshot": 1 << 16})
        for m, bad in zip(r["msgs"], ("'segment_map'", "3", "'al\\x00loc'")):
            self.assertIn(bad, m)
            self.assertIn("accepted: " + r["names"], m)

    def test_install_hands_pytorch_the_two_functions(self):
        t, calls = fake_torch()
        sys.modules["torch"] = t
        sys.modules["_expseg_cxx"] = None  # the Python route (test_pyroute.py: the C++ seam)
        try:
            os.environ["EXPSEG_TORCH_LIB"] = LIB
            expseg._unpatch()  # forget an earlier installation
            with warnings.catch_warnings(record=True):
                path = expseg.install()
        finally:
            del sys.modules["torch"], sys.modules["_expseg_cxx"]
            expseg._unpatch()
        self.assertEqual(os.path.realpath(path), os.path.realpath(LIB))
        self.assertEqual(calls[0], ("CUDAPluggableAllocator", path, "expseg_torch_alloc_raising",
                                    "expseg_torch_free"))
        self.assertEqual(calls[1][0], "change_current_allocator")
        lib = expseg._load()
        for name in ("expseg_torch_alloc", "expseg_torch_free"):
            self.assertTrue(getattr(lib, name))


@unittest.skipUnless(LIB and os.path.isfile(LIB) and torch_with_gpu(),
                     "needs PyTorch with a CUDA device (and EXPSEG_TEST_TORCH_LIB)")
class WithTorch(unittest.TestCase):
    def test_install_then_tensors_come_from_expseg(self):
        rc, out, err = run_child("""
            import torch, expseg
            expseg.install()
            x = torch.ones(1 << 20, device="cuda")
            s = expseg.memory_stats(0)
            assert s["allocation.all.current"] >= 1, s
            assert s["allocated_bytes.all.current"] >= 4 << 20, s
            y = (x * 2).sum().item()
            del x
            torch.cuda.synchronize()
            expseg.empty_cache()
            print(torch.cuda.memory.get_allocator_backend(), expseg.driver(0), int(y))
            """)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.split(), ["pluggable", "cuda", str(2 << 20)])

    def test_install_after_cuda_use_is_too_late(self):
        rc, out, err = run_child("""
            import torch, expseg
            torch.ones(1, device="cuda")
            try:
                expseg.install()
                print("installed")
            except expseg.ExpsegError as e:
                print(e)
            """)
        self.assertEqual(rc, 0, err)
        one_line(self, out)
        self.assertIn("too late", out)


class Messages(unittest.TestCase):
    def install_message(self, torch_module, env=None):
        saved = sys.modules.get("torch")
        if torch_module is None:
            sys.modules["torch"] = None  # import torch raises ImportError
        else:
            sys.modules["torch"] = torch_module
        old_env = dict(os.environ)
        os.environ.update(env or {})
        sys.modules["_expseg_cxx"] = None
        try:
            expseg._unpatch()  # forget an earlier installation
            with self.assertRaises(expseg.ExpsegError) as cm:
                expseg.install()
            return str(cm.exception)
        finally:
            os.environ.clear()
            os.environ.update(old_env)
            del sys.modules["_expseg_cxx"]
            if saved is None:
                del sys.modules["torch"]
            else:
                sys.modules["torch"] = saved

    def test_without_pytorch(self):
        m = self.install_message(None)
        one_line(self, m)
        self.assertIn("needs PyTorch", m)

    def test_without_gpu(self):
        m = self.install_message(fake_torch(available=False)[0])
        one_line(self, m)
        self.assertIn("no CUDA device", m)

    def test_too_late(self):
        m = self.install_message(fake_torch(initialized=True)[0])
        one_line(self, m)
        self.assertIn("too late", m)
        m = self.install_message(fake_torch(refuse="Can't swap an already initialized allocator")[0],
                                 {"EXPSEG_TORCH_LIB": LIB or "/nonexistent"})
        one_line(self, m)
        if LIB:
            self.assertIn("too late", m)

    def test_host_driver_is_refused_for_pytorch(self):
        m = self.install_message(fake_torch()[0], {"EXPSEG_DRIVER": "host"})
        one_line(self, m)
        self.assertIn("EXPSEG_DRIVER=host", m)
        self.assertIn("EXPSEG_ALLOW_MODELLED_DRIVER=1", m)  # the way for a stand-in torch
        # with it (and a torch that sees no GPU) install() goes past the driver check
        m = self.install_message(fake_torch(available=False)[0],
                                 {"EXPSEG_DRIVER": "host", "EXPSEG_ALLOW_MODELLED_DRIVER": "1"})
        self.assertIn("no CUDA device", m)

    def test_install_from_the_repository_root_without_pytorch(self):
        # python -c puts the current folder first on sys.path: a folder named torch/ in the
        # repository root would be imported as PyTorch (a namespace package without .cuda)
        code = ("import expseg\n"
                "try:\n"
                "    expseg.install()\n"
                "except expseg.ExpsegError as e:\n"
                "    print(e)\n")
        e = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
        p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=e, capture_output=True,
                           text=True, timeout=120)
        if p.returncode == 0 and "needs PyTorch" not in p.stdout and torch_with_gpu():
            self.skipTest("PyTorch is installed here")
        self.assertEqual(p.returncode, 0, p.stderr)
        one_line(self, p.stdout)
        self.assertIn("needs PyTorch", p.stdout)

    def test_library_not_found(self):
        rc, out, err = run_child("""
            import expseg
            try:
                expseg.memory_stats(0)
            except expseg.ExpsegError as e:
                print(e)
            """, EXPSEG_TORCH_LIB="/nonexistent/libexpseg_torch.so")
        self.assertEqual(rc, 0, err)
        one_line(self, out)
        self.assertIn("EXPSEG_TORCH_LIB=/nonexistent/libexpseg_torch.so", out)


if __name__ == "__main__":
    unittest.main()
