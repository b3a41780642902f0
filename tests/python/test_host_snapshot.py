# SPDX-License-Identifier: Apache-2.0
"""test_host_snapshot.py: the pinned host pool of the Python helper in snapshots (run by
CTest), without PyTorch or a GPU: the stand-in torch (standin_torch.py), the host driver.

expseg.host_alloc / host_free take pinned host memory from the plug's one host pool; once it
is used, expseg.snapshot / snapshot_dict and the PyTorch route's _snapshot / _dump_snapshot
carry it as host_segments and host_traces, and _record_memory_history(
record_pinned_host_memory=True) records its history (record_cuda=False: the host pool's
only). On the C++ backend's route (an injected _expseg_cxx, PyTorch's own _snapshot and
_record_memory_history stood in for) the pool is added to what PyTorch returns. The dumped
pickle is checked by tests/check_memory_viz.py --host (every _memory_viz.py subcommand, the
pool's bytes against its statistics) and opened in both viewers by tests/check_viewers.js,
where the fixtures (../shared/reference/pytorch-viewer/) and node are present. Each case
runs in a child interpreter (the library keeps its pools for the process)."""

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
LIB = os.environ.get("EXPSEG_TEST_TORCH_LIB") or os.environ.get("EXPSEG_TORCH_LIB")
VIEWERS = os.path.join(REPO, "..", "shared", "reference", "pytorch-viewer")

PRELUDE = """
import ctypes, json, os, pickle, sys, tempfile
import standin_torch, expseg
torch = standin_torch.install()
expseg._modelled_driver_ok = True
def err(f, *a, **k):
    try:
        f(*a, **k)
    except expseg.ExpsegError as e:
        return str(e)
    return "no error"
def host_view(s):
    segs = s.get("host_segments")
    if segs is None:
        return None
    live = [b["address"] for g in segs for b in g["blocks"] if b["state"] == "active_allocated"]
    return dict(segs=len(segs), live=live, bytes=sum(g["total_size"] for g in segs),
                devices=sorted({g["device"] for g in segs}),
                acts=sorted({e["action"] for e in s["host_traces"]}),
                allocs=[e["addr"] for e in s["host_traces"] if e["action"] == "alloc"])
"""


def run(code, cxx=None):
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "python"), HERE])
    e["EXPSEG_TORCH_LIB"] = LIB
    e["EXPSEG_DRIVER"] = "host:capacity=64M"
    e.pop("EXPSEG_SAFE_RECORD_STREAM", None)
    fake = "sys.modules['_expseg_cxx'] = None\n" if cxx is None else textwrap.dedent(cxx)
    p = subprocess.run([sys.executable, "-c", PRELUDE + fake + textwrap.dedent(code)], env=e,
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


@unittest.skipUnless(LIB and os.path.isfile(LIB),
                     "set EXPSEG_TEST_TORCH_LIB to the built libexpseg_torch.so")
class HostPoolInSnapshots(unittest.TestCase):
    def result(self, code, cxx=None):
        rc, out, err = run(code, cxx)
        self.assertEqual(rc, 0, err)
        return json.loads(out.strip().split("\n")[-1])

    def test_python_route_snapshot_carries_the_pool_and_its_history(self):
        r = self.result("""
            expseg.install(route="python")
            x = torch.empty(1 << 20, 0)
            before = torch.cuda.memory._snapshot()
            # set before the pool exists: applies when the first host_alloc creates it
            torch.cuda.memory._record_memory_history(max_entries=1000,
                                                     record_pinned_host_memory=True)
            sizes = [4096, 100000, 3 << 20, 5000]
            ptrs = [expseg.host_alloc(n) for n in sizes]
            expseg.host_free(ptrs.pop(1))
            s = torch.cuda.memory._snapshot()
            path = os.path.join(tempfile.mkdtemp(), "s.pickle")
            torch.cuda.memory._dump_snapshot(path)
            with open(path, "rb") as f:
                dumped = pickle.load(f)
            torch.cuda.memory._record_memory_history(enabled=None, record_pinned_host_memory=True)
            off = torch.cuda.memory._snapshot()
            print(json.dumps(dict(before=sorted(before), ptrs=ptrs, path=path,
                                  s=host_view(s), dumped=host_view(dumped), off=host_view(off),
                                  device_acts=sorted({e["action"] for t in s["device_traces"]
                                                      for e in t}),
                                  reserved=expseg.host_stat("reserved_bytes.current"),
                                  allocated=expseg.host_stat("allocation.current"))))
            """)
        self.assertNotIn("host_segments", r["before"])  # no pool used yet: as PyTorch
        s = r["s"]
        self.assertIsNotNone(s)
        self.assertEqual(sorted(s["live"]), sorted(r["ptrs"]))
        self.assertEqual(s["bytes"], r["reserved"])
        self.assertEqual(r["allocated"], 3)
        self.assertEqual(s["devices"], [-1])
        self.assertTrue({"alloc", "free_requested", "free_completed", "segment_alloc"} <=
                        set(s["acts"]), s["acts"])
        for p in r["ptrs"]:
            self.assertIn(p, s["allocs"])
        self.assertEqual(r["dumped"]["live"], s["live"])
        self.assertEqual(r["off"]["acts"], [])       # the host history stopped (and cleared)
        self.assertEqual(sorted(r["off"]["live"]), sorted(r["ptrs"]))
        self.assertEqual(r["device_acts"], ["snapshot"])  # record_cuda (default): on
        self.check_tools(r["path"], r["reserved"], len(r["ptrs"]))

    def check_tools(self, path, reserved, live):
        viz = os.path.join(VIEWERS, "_memory_viz.py")
        if not os.path.isfile(viz):
            self.skipTest("PyTorch's viewer files are missing: expected %s" % VIEWERS)
        p = subprocess.run([sys.executable, os.path.join(REPO, "tests", "check_memory_viz.py"),
                            viz, path, path, "--host", str(reserved), str(live), "0", "0"],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("every _memory_viz.py subcommand ran", p.stdout)
        if shutil.which("node") is None:
            self.skipTest("node is not on PATH (Debian: apt-get install nodejs): the viewers' "
                          "unpickler did not run")
        for v in ("MemoryViz_v1.js", "MemoryViz_v2.js"):
            p = subprocess.run(["node", os.path.join(REPO, "tests", "check_viewers.js"),
                                os.path.join(VIEWERS, v), path],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, v + ": " + p.stdout + p.stderr)
            self.assertIn("opens in", p.stdout)

    def test_helper_calls_and_record_cuda_false(self):
        r = self.result("""
            expseg.record_history(True, 100, record_pinned_host_memory=True, record_cuda=False)
            a = expseg.host_alloc(8192, device=1)
            b = expseg.host_alloc(0)
            d = expseg.snapshot_dict()
            path = os.path.join(tempfile.mkdtemp(), "h.pickle")
            expseg.snapshot(path, include_traces=False)
            with open(path, "rb") as f:
                state = pickle.load(f)
            print(json.dumps(dict(a=a, b=b, d=host_view(d), state=host_view(state),
                                  dev=sorted({e["action"] for t in d["device_traces"] for e in t}),
                                  free0=err(expseg.host_free, 0) + err(expseg.host_free, None))))
            """)
        self.assertEqual(r["b"], 0)
        self.assertEqual(r["d"]["live"], [r["a"]])
        self.assertIn("alloc", r["d"]["acts"])
        self.assertEqual(r["dev"], [])            # record_cuda=False: the devices' is off
        self.assertEqual(r["state"]["live"], [r["a"]])
        self.assertEqual(r["state"]["acts"], [])  # include_traces=False
        self.assertEqual(r["free0"], "no errorno error")

    def test_bad_input_is_a_one_line_error_naming_the_value(self):
        r = self.result("""
            before_use = err(expseg.host_stat, "allocation.current")
            p = expseg.host_alloc(4096)
            print(json.dumps(dict(
                size=err(expseg.host_alloc, -1), kind=err(expseg.host_alloc, 1.5),
                huge=err(expseg.host_alloc, 1 << 62),
                foreign=err(expseg.host_free, 0x1234000), ptr=err(expseg.host_free, "x"),
                key=err(expseg.host_stat, "no_such_key"), before_use=before_use,
                live=expseg.host_stat("allocation.current"))))
            """)
        self.assertIn("size=-1", r["size"])
        self.assertIn("size=1.5", r["kind"])
        self.assertIn("expseg.host_alloc", r["huge"])
        self.assertIn("0x1234000", r["foreign"])
        self.assertIn("'x'", r["ptr"])
        self.assertIn("no_such_key", r["key"])
        self.assertIn("no pinned host memory", r["before_use"])
        self.assertEqual(r["live"], 1)
        for v in r.values():
            if isinstance(v, str):
                self.assertNotIn("\n", v)

    CXX = """
        import types
        cxx = types.ModuleType("_expseg_cxx"); cxx.install = lambda path: True
        sys.modules["_expseg_cxx"] = cxx
        calls = []
        def pytorch_history(enabled="all", context="all", stacks="all", max_entries=10,
                            device=None, clear_history=False, skip_actions=None):
            calls.append([enabled, max_entries, clear_history, skip_actions])
        def pytorch_snapshot(augment_with_fx_traces=False):
            return {"segments": [], "device_traces": [[]],
                    "host_segments": [{"address": 1, "total_size": 0, "device": -1,
                                       "blocks": []}],
                    "host_traces": [{"action": "alloc", "addr": 7, "time_us": 0}]}
        torch.cuda.memory._record_memory_history = pytorch_history
        torch.cuda.memory._snapshot = pytorch_snapshot
        """

    def test_cxx_route_adds_the_pool_to_pytorchs_snapshot(self):
        r = self.result("""
            expseg.install()
            torch.cuda.memory._record_memory_history(max_entries=50, clear_history=True,
                                                     record_pinned_host_memory=True)
            # every positional argument reaches PyTorch; an argument expseg does not know
            # (a later PyTorch's) does not stop the pool's part
            torch.cuda.memory._record_memory_history("all", "all", "all", 33, None, True)
            torch.cuda.memory._record_memory_history(max_entries=60, future_argument=1,
                                                     record_pinned_host_memory=True)
            torch.cuda.memory._record_memory_history(record_pinned_host_memory=True,
                                                     record_cuda=False)
            p = expseg.host_alloc(65536)
            s = torch.cuda.memory._snapshot()
            print(json.dumps(dict(route=expseg.route(), calls=calls, p=p, s=host_view(s),
                                  first=s["host_segments"][0]["address"])))
            """, cxx=self.CXX)
        self.assertEqual(r["route"], "cxx")
        # PyTorch got what it takes, not record_pinned_host_memory; record_cuda=False: no call
        self.assertEqual(r["calls"], [["all", 50, True, None], ["all", 33, True, None],
                                      ["all", 60, False, None]])
        self.assertEqual(r["first"], 1)            # PyTorch's own host segments kept first
        self.assertIn(r["p"], r["s"]["live"])
        self.assertIn(7, r["s"]["allocs"])         # PyTorch's trace entry kept
        self.assertIn(r["p"], r["s"]["allocs"])    # expseg's pool history recorded

    # PyTorch's own dispatcher: a bool enabled goes to the legacy function, and the function
    # shows only the current signature (its __signature__), not the legacy keywords
    CXX_DISPATCH = """
        import types, inspect
        cxx = types.ModuleType("_expseg_cxx"); cxx.install = lambda path: True
        sys.modules["_expseg_cxx"] = cxx
        calls = []
        def impl(enabled="all", context="all", stacks="all", max_entries=10, device=None,
                 clear_history=False, compile_context=False, global_record_annotations=False,
                 skip_actions=None):
            calls.append(["impl", enabled, max_entries, skip_actions])
        def legacy(enabled, record_context=True, trace_alloc_max_entries=1,
                   trace_alloc_record_context=False, device=None, record_context_cpp=False,
                   clear_history=False, compile_context=False, global_record_annotations=False,
                   skip_actions=None):
            calls.append(["legacy", enabled, trace_alloc_max_entries, record_context_cpp])
        def pytorch_history(enabled="all", *args, **kwargs):
            return (legacy if isinstance(enabled, bool) else impl)(enabled, *args, **kwargs)
        pytorch_history.__signature__ = inspect.signature(impl)
        torch.cuda.memory._record_memory_history = pytorch_history
        torch.cuda.memory._snapshot = lambda augment_with_fx_traces=False: {
            "segments": [], "device_traces": [[]]}
        """

    def test_cxx_route_passes_the_legacy_keywords_and_reads_positional_host_arguments(self):
        r = self.result("""
            expseg.install()
            torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=100,
                                                     record_context_cpp=True)
            # record_pinned_host_memory given by position: the pool records, and a PyTorch
            # without it gets only the arguments it takes
            torch.cuda.memory._record_memory_history("all", "all", "all", 40, None, False,
                                                     False, False, None, True)
            p = expseg.host_alloc(65536)
            s = torch.cuda.memory._snapshot()
            print(json.dumps(dict(calls=calls, p=p, s=host_view(s))))
            """, cxx=self.CXX_DISPATCH)
        self.assertEqual(r["calls"], [["legacy", True, 100, True], ["impl", "all", 40, None]])
        self.assertIn(r["p"], r["s"]["allocs"])    # the positional True recorded the pool


if __name__ == "__main__":
    unittest.main()
