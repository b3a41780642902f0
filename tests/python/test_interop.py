# SPDX-License-Identifier: Apache-2.0
"""test_interop.py: expseg.cupy_allocator and expseg's Numba EMM plugin with the stand-in
cupy and numba modules (standin_cupy.py, standin_numba.py say what they cannot show), on the
host driver: allocations come from the device's expseg allocator (its statistics, shared
with PyTorch and expseg.memory_stats), go back when the library drops them, and failures
are one-line ExpsegErrors. Each test runs in a child interpreter (run by CTest)."""

import json
import os
import subprocess
import sys
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LIB = os.environ.get("EXPSEG_TEST_TORCH_LIB") or os.environ.get("EXPSEG_TORCH_LIB")


def run(code, **env):
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "python"), HERE]),
             EXPSEG_TORCH_LIB=LIB or "", EXPSEG_DRIVER="host:capacity=64M")
    e.update(env)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e,
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


@unittest.skipUnless(LIB and os.path.isfile(LIB),
                     "set EXPSEG_TEST_TORCH_LIB to the built libexpseg_torch.so")
class CuPy(unittest.TestCase):
    def test_allocations_come_from_expseg_and_go_back(self):
        rc, out, err = run("""
            import gc, json, standin_cupy, expseg
            cupy = standin_cupy.install()
            cupy.cuda.set_allocator(expseg.cupy_allocator)
            with cupy.cuda.Device(1), cupy.cuda.Stream(9):
                p = cupy.cuda.alloc(3 << 20)
            s = expseg.memory_stats(1)
            r = dict(dev=p.device_id, mem_dev=p.mem.device_id, ptr=bool(p.ptr),
                     alloc=s["allocated_bytes.all.current"], req=s["requested_bytes.all.current"],
                     n=s["allocation.all.current"], dev0=expseg.memory_stats(0)["allocation.all.current"])
            del p; gc.collect()
            r["after"] = expseg.memory_stats(1)["allocation.all.current"]
            zero = cupy.cuda.alloc(0)
            r["zero"] = [zero.ptr, expseg.memory_stats(0)["allocation.all.current"]]
            msgs = []
            for bad in (-1, 1 << 40, "1"):
                try:
                    cupy.cuda.alloc(bad); msgs.append("no error")
                except expseg.ExpsegError as e:
                    msgs.append(str(e))
            r["msgs"] = msgs
            print(json.dumps(r))
            """)
        self.assertEqual(rc, 0, err)
        r = json.loads(out)
        self.assertEqual([r["dev"], r["mem_dev"], r["ptr"]], [1, 1, True])
        self.assertEqual(r["req"], 3 << 20)
        self.assertGreaterEqual(r["alloc"], 3 << 20)
        self.assertEqual([r["n"], r["dev0"], r["after"]], [1, 0, 0])
        self.assertEqual(r["zero"], [0, 0])
        self.assertIn("-1", r["msgs"][0])
        self.assertIn("out of memory", r["msgs"][1])
        self.assertIn("device 0", r["msgs"][1])
        self.assertIn("'1'", r["msgs"][2])
        for m in r["msgs"]:
            self.assertNotIn("\n", m)


@unittest.skipUnless(LIB and os.path.isfile(LIB),
                     "set EXPSEG_TEST_TORCH_LIB to the built libexpseg_torch.so")
class Numba(unittest.TestCase):
    def test_emm_plugin_from_the_environment(self):
        rc, out, err = run("""
            import gc, json, standin_numba, expseg
            numba = standin_numba.install()
            cls = numba.cuda.load_from_env()          # NUMBA_CUDA_MEMORY_MANAGER=expseg
            m = cls(context=numba.cuda.Context(1))
            m.initialize()
            p = m.memalloc(5 << 20)
            s = expseg.memory_stats(1)
            r = dict(sub=issubclass(cls, numba.cuda.HostOnlyCUDAMemoryManager),
                     version=m.interface_version, size=p.size, ptr=p.device_pointer.value != 0,
                     req=s["requested_bytes.all.current"], n=s["allocation.all.current"],
                     info=list(m.get_memory_info()), want=list(expseg.mem_get_info(1)))
            p.free()
            r["freed"] = expseg.memory_stats(1)["allocation.all.current"]
            q = m.memalloc(1 << 20); del q; gc.collect()
            r["collected"] = expseg.memory_stats(1)["allocation.all.current"]
            m.reset()
            r["reset"] = [expseg.memory_stats(1)["reserved_bytes.all.current"], m.host_resets]
            try:
                m.get_ipc_handle(p); r["ipc"] = "no error"
            except expseg.ExpsegError as e:
                r["ipc"] = str(e)
            try:
                m.memalloc(1 << 40); r["oom"] = "no error"
            except expseg.ExpsegError as e:
                r["oom"] = str(e)
            print(json.dumps(r))
            """, NUMBA_CUDA_MEMORY_MANAGER="expseg")
        self.assertEqual(rc, 0, err)
        r = json.loads(out)
        self.assertTrue(r["sub"])
        self.assertEqual(r["version"], 1)
        self.assertEqual([r["size"], r["ptr"], r["req"], r["n"]], [5 << 20, True, 5 << 20, 1])
        self.assertEqual(r["info"], r["want"])
        self.assertEqual([r["freed"], r["collected"]], [0, 0])
        self.assertEqual(r["reset"], [0, 1])
        self.assertIn("cudaIpcGetMemHandle", r["ipc"])
        self.assertIn("out of memory", r["oom"])

    def test_interop_module_is_expsegs_whichever_is_imported_first(self):
        # expseg_interop.py holds the CuPy and Numba parts; expseg's names are its names,
        # bound to the expseg module that loaded it, and neither import pulls in CuPy or Numba
        rc, out, err = run("""
            import json, sys
            import expseg_interop            # alone first: it binds expseg on first use
            first = expseg_interop._core
            import expseg
            r = dict(first=first is None, same_cupy=expseg.cupy_allocator is expseg_interop.cupy_allocator,
                     same_numba=expseg.numba_memory_manager is expseg_interop.numba_memory_manager,
                     core=expseg_interop._core is expseg, in_all=[n in expseg.__all__ for n in
                     ("cupy_allocator", "numba_memory_manager")],
                     imported=[m for m in ("cupy", "numba") if m in sys.modules])
            import standin_cupy
            standin_cupy.install()
            try:
                expseg_interop.cupy_allocator(-1)
            except expseg.ExpsegError as e:
                r["err"] = str(e)
            print(json.dumps(r))
            """)
        self.assertEqual(rc, 0, err)
        r = json.loads(out)
        self.assertEqual([r["first"], r["same_cupy"], r["same_numba"], r["core"]],
                         [True, True, True, True])
        self.assertEqual(r["in_all"], [True, True])
        self.assertEqual(r["imported"], [])
        self.assertIn("expseg.cupy_allocator(-1)", r["err"])

    def test_without_numba_the_attribute_error_is_plain(self):
        rc, out, err = run("""
            import expseg
            try:
                expseg.no_such_thing
            except AttributeError as e:
                print(e)
            """)
        self.assertEqual(rc, 0, err)
        self.assertIn("no_such_thing", out)


if __name__ == "__main__":
    unittest.main()
