# SPDX-License-Identifier: Apache-2.0
"""test_pyroute.py: expseg.install()'s routes without PyTorch or a GPU (run by CTest).

A stand-in torch (standin_torch.py) gives what PyTorch gives a CUDAPluggableAllocator made
from Python: its memory calls raise or do nothing and Tensor.record_stream is dropped. After
install(route="python") on the host or sim driver, each call must return expseg's figure
(read back from the library through ctypes) or do expseg's action, for every device form
PyTorch accepts; record_stream must reach expseg_record_stream; the safe mode must defer
frees until a device-wide synchronization; the C++ route is tried through an injected
_expseg_cxx module; every failure is a one-line ExpsegError. Each test runs in a child
interpreter (the library keeps one allocator per device for the process)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LIB = os.environ.get("EXPSEG_TEST_TORCH_LIB") or os.environ.get("EXPSEG_TORCH_LIB")

# The stand-in torch, expseg allowed on a modelled driver, no C++ backend unless a test
# injects one.
PRELUDE = """
import ctypes, json, os, pickle, sys, tempfile, warnings
import standin_torch, expseg
torch = standin_torch.install()
expseg._modelled_driver_ok = True
sys.modules["_expseg_cxx"] = None
def stat(d, key):
    v = ctypes.c_int64()
    assert expseg._load().expseg_torch_stat(d, key.encode(), ctypes.byref(v)) == 0
    return v.value
def err(f, *a, **k):
    try:
        f(*a, **k)
    except expseg.ExpsegError as e:
        return str(e)
    return "no error"
"""


def run(code, driver="host:capacity=64M", **env):
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "python"), HERE])
    e["EXPSEG_TORCH_LIB"] = LIB
    e["EXPSEG_DRIVER"] = driver
    e.pop("EXPSEG_SAFE_RECORD_STREAM", None)
    for k, v in env.items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=e,
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


@unittest.skipUnless(LIB and os.path.isfile(LIB),
                     "set EXPSEG_TEST_TORCH_LIB to the built libexpseg_torch.so")
class PythonRoute(unittest.TestCase):
    def result(self, code, **kw):
        rc, out, err = run(code, **kw)
        self.assertEqual(rc, 0, err)
        return json.loads(out.strip().split("\n")[-1]), err

    def test_every_statistic_call_is_expseg_figure_for_every_device_form(self):
        r, _ = self.result("""
            try:
                torch.cuda.memory_allocated(1)
                unpatched = "no error"
            except standin_torch.Unsupported as e:
                unpatched = str(e)
            expseg.install(route="python")
            torch.cuda.set_device(1)
            keep = [torch.empty(3 << 20, "cuda:1"), torch.empty(5 << 20, 1)]
            gone = torch.empty(7 << 20, 1); del gone
            calls = {"memory_allocated": "allocated_bytes.all.current",
                     "max_memory_allocated": "allocated_bytes.all.peak",
                     "memory_reserved": "reserved_bytes.all.current",
                     "max_memory_reserved": "reserved_bytes.all.peak",
                     "memory_cached": "reserved_bytes.all.current",
                     "max_memory_cached": "reserved_bytes.all.peak"}
            bad, same = [], []
            for name, key in calls.items():
                want = stat(1, key)
                for mod in (torch.cuda, torch.cuda.memory):
                    for dev in (None, 1, "cuda:1", torch.device("cuda:1"), torch.device("cuda")):
                        got = getattr(mod, name)(dev)
                        if got != want:
                            bad.append([name, repr(dev), got, want])
                same.append(getattr(torch.cuda, name) is getattr(torch.cuda.memory, name))
            s = torch.cuda.memory_stats("cuda:1")
            nested = torch.cuda.memory.memory_stats_as_nested_dict(1)
            print(json.dumps(dict(unpatched=unpatched, bad=bad, same=all(same),
                keys_sorted=list(s) == sorted(s), cls=type(s).__name__,
                alloc=s["allocated_bytes.all.current"], acc=torch.accelerator.memory_allocated(1),
                nested=nested["allocated_bytes"]["all"]["current"],
                nested_expseg=nested["expseg"]["driver"]["create"],
                flat_expseg=s["expseg.driver.create"],
                dev0=torch.cuda.memory_allocated(0))))
            """)
        self.assertIn("does not yet support", r["unpatched"])
        self.assertEqual(r["bad"], [])
        self.assertTrue(r["same"])
        self.assertTrue(r["keys_sorted"])
        self.assertEqual(r["cls"], "OrderedDict")
        self.assertEqual(r["alloc"], 8 << 20)
        self.assertEqual(r["acc"], 8 << 20)
        self.assertEqual(r["nested"], 8 << 20)
        self.assertEqual(r["nested_expseg"], r["flat_expseg"])
        self.assertEqual(r["dev0"], 0)

    def test_actions_reset_empty_fraction_info_summary(self):
        r, _ = self.result("""
            expseg.install(route="python")
            x = torch.empty(6 << 20, 0); y = torch.empty(2 << 20, 0); del x
            peak0 = torch.cuda.max_memory_allocated(0)
            torch.cuda.reset_peak_memory_stats(0)
            peak1 = torch.cuda.max_memory_allocated(0)
            allocs0 = stat(0, "allocation.all.allocated")
            torch.cuda.memory.reset_accumulated_memory_stats("cuda:0")
            allocs1 = stat(0, "allocation.all.allocated")
            res0 = torch.cuda.memory_reserved(0)
            torch.cuda.empty_cache()
            res1 = torch.cuda.memory_reserved(0)
            torch.cuda.set_per_process_memory_fraction(0.25, 0)
            got_fraction = torch.cuda.get_per_process_memory_fraction(0)
            try:
                torch.empty(20 << 20, 0); oom = "no error"
            except RuntimeError as e:
                oom = str(e)
            torch.cuda.set_per_process_memory_fraction(1.0)
            z = torch.empty(20 << 20, 0)
            info = torch.cuda.mem_get_info(0)
            summary = torch.cuda.memory_summary(0, abbreviated=True)
            print(json.dumps(dict(peak0=peak0, peak1=peak1, allocs0=allocs0, allocs1=allocs1,
                res0=res0, res1=res1, oom=oom, fraction=got_fraction,
                fraction1=torch.cuda.memory.get_per_process_memory_fraction("cuda:0"), info=list(info), want=list(expseg.mem_get_info(0)),
                summary=summary)))
            """)
        self.assertEqual(r["peak0"], 8 << 20)
        self.assertEqual(r["peak1"], 2 << 20)
        self.assertEqual(r["allocs0"], 2)
        self.assertEqual(r["allocs1"], 0)
        self.assertGreater(r["res0"], r["res1"])
        self.assertIn("CUDA out of memory (expseg): expseg_torch_alloc", r["oom"])
        self.assertIn("fraction", r["oom"])  # expseg's reason, not only that it failed
        self.assertEqual([r["fraction"], r["fraction1"]], [0.25, 1.0])
        self.assertEqual(r["info"], r["want"])
        self.assertEqual(r["info"][1], 64 << 20)
        self.assertIn("PyTorch CUDA memory summary, device ID 0", r["summary"])
        self.assertIn("expseg", r["summary"])

    def test_history_snapshot_and_dump(self):
        r, _ = self.result("""
            expseg.install(route="python")
            torch.cuda.memory._record_memory_history(max_entries=100)
            x = torch.empty(1 << 20, 1); del x
            y = torch.empty(2 << 20, 0)
            s = torch.cuda.memory._snapshot()
            segs = torch.cuda.memory_snapshot()
            path = os.path.join(tempfile.mkdtemp(), "s.pickle")
            torch.cuda.memory._dump_snapshot(path, augment_with_fx_traces=False)
            with open(path, "rb") as f:
                d = pickle.load(f)
            notr = torch.cuda.memory._snapshot(include_traces=False)  # PyTorch 2.14's argument
            torch.cuda.memory._dump_snapshot(path, include_traces=False)
            with open(path, "rb") as f:
                dnotr = pickle.load(f)
            notr = [[len(t) for t in x["device_traces"]] + [len(x["segments"])]
                    for x in (notr, dnotr)]
            torch.cuda.memory._record_memory_history(max_entries=100, clear_history=True,
                                                     skip_actions=["alloc"])
            z = torch.empty(3 << 20, 0)
            cleared = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            off = torch.cuda.memory._snapshot()
            print(json.dumps(dict(keys=sorted(s),
                cleared=sorted({e["action"] for t in cleared["device_traces"] for e in t}), segs=segs == s["segments"], devs=sorted({seg["device"] for seg in s["segments"]}),
                acts1=[e["action"] for e in s["device_traces"][1]],
                acts0=[e["action"] for e in s["device_traces"][0]],
                dumped=[len(d["segments"]), len(d["device_traces"])], notr=notr,
                off=[len(t) for t in off["device_traces"]])))
            """)
        self.assertEqual(r["keys"], ["allocator_settings", "device_traces", "external_annotations",
                                     "segments"])
        self.assertEqual(r["devs"], [0, 1])
        self.assertTrue(r["segs"])
        self.assertIn("alloc", r["acts1"])
        self.assertIn("free_requested", r["acts1"])
        self.assertIn("alloc", r["acts0"])
        self.assertEqual(r["dumped"], [2, 2])
        self.assertEqual(r["notr"], [[0, 0, 2], [0, 0, 2]])  # include_traces=False
        self.assertEqual(r["off"], [0, 0])
        self.assertIn("snapshot", r["cleared"])
        self.assertNotIn("free_requested", r["cleared"])  # cleared: x's free is gone
        self.assertNotIn("alloc", r["cleared"])  # z's alloc skipped

    def test_record_function_scopes_become_external_annotations(self):
        r, _ = self.result("""
            import threading
            expseg.install(route="python")
            rf = torch.autograd.profiler.record_function
            with rf("before"):                          # history off: nothing
                pass
            torch.cuda.memory._record_memory_history(max_entries=5)
            with torch.profiler.record_function("## forward ##"):
                x = torch.empty(1 << 20, 0)
                with rf("inner"):
                    pass
            @rf("decorated")
            def step():
                return 7
            torch.cuda.set_device(1)
            step()
            t = threading.Thread(target=lambda: rf("other thread").__enter__().__exit__())
            t.start(); t.join()
            s = torch.cuda.memory._snapshot()
            path = os.path.join(tempfile.mkdtemp(), "s.pickle")
            torch.cuda.memory._dump_snapshot(path)
            with open(path, "rb") as f:
                dumped = pickle.load(f)
            ann = lambda snap: [(e["name"], e["stage"], e["device"]) for e in
                                sorted(snap["external_annotations"], key=lambda e: e["time_us"])]
            keys = sorted(s["external_annotations"][0])
            times = [e["time_us"] for e in s["external_annotations"]]
            torch.cuda.memory._record_memory_history(max_entries=5, global_record_annotations=True)
            kept = ann(torch.cuda.memory._snapshot())
            t = threading.Thread(target=lambda: rf("other thread").__enter__().__exit__())
            t.start(); t.join()
            every = ann(torch.cuda.memory._snapshot())
            torch.cuda.memory._record_memory_history(max_entries=5, clear_history=True)
            cleared = ann(torch.cuda.memory._snapshot())
            with rf("late"):
                pass
            torch.cuda.memory._record_memory_history(enabled=None)
            with rf("after stop"):
                pass
            off = torch.cuda.memory._snapshot()["external_annotations"]
            print(json.dumps(dict(s=ann(s), dumped=ann(dumped), keys=keys, kept=kept,
                                  every=every, cleared=cleared, off=off, path=path,
                                  times=min(times) > 1700000000 * 10**6)))
            """)
        want = [["## forward ##", "START", 0], ["inner", "START", 0], ["inner", "END", 0],
                ["## forward ##", "END", 0], ["decorated", "START", 1], ["decorated", "END", 1]]
        # the newest 5 of each device's history: device 0 keeps its 4, device 1 its 2
        self.assertEqual(r["s"], want)
        self.assertEqual(r["dumped"], want)
        self.assertEqual(r["keys"], ["device", "name", "stage", "time_us"])
        self.assertTrue(r["times"])
        self.assertEqual(r["kept"], want)  # enabled again: kept
        self.assertEqual(r["every"][-2:], [["other thread", "START", 1],
                                           ["other thread", "END", 1]])
        self.assertEqual(r["cleared"], [])
        self.assertEqual(r["off"], [])
        # the dumped pickle (two devices: Python's pickle) opens in PyTorch's viewers
        viewers = os.path.join(REPO, "..", "shared", "reference", "pytorch-viewer")
        if shutil.which("node") is None or not os.path.isdir(viewers):
            self.skipTest("node or %s is missing: the viewers did not open the pickle" % viewers)
        for v in ("MemoryViz_v1.js", "MemoryViz_v2.js"):
            p = subprocess.run(["node", os.path.join(REPO, "tests", "check_viewers.js"),
                                os.path.join(viewers, v), r["path"]],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, v + ": " + p.stdout + p.stderr)
            self.assertIn("opens in", p.stdout)

    def test_dump_to_a_path_that_cannot_be_opened_records_nothing(self):
        r, _ = self.result("""
            expseg.install(route="python")
            torch.cuda.memory._record_memory_history(max_entries=100)
            keep = [torch.empty(1 << 20, 0)]
            n = lambda s: [sum(e["action"] == "snapshot" for e in t) for t in s["device_traces"]]
            bad = os.path.join(tempfile.mkdtemp(), "no_such_dir", "s.pickle")
            one = n(torch.cuda.memory._snapshot())
            e1 = err(torch.cuda.memory._dump_snapshot, bad)       # one device used
            keep.append(torch.empty(1 << 20, 1))
            two = n(torch.cuda.memory._snapshot())
            e2 = err(torch.cuda.memory._dump_snapshot, bad)       # two devices used
            after = n(torch.cuda.memory._snapshot())
            print(json.dumps(dict(one=one, two=two, after=after, e1=e1, e2=e2, bad=bad,
                                  left=os.listdir(os.path.dirname(os.path.dirname(bad))))))
            """)
        # each _snapshot() records one snapshot event per device; the failed dumps none
        self.assertEqual(r["two"][0], r["one"][0] + 1)
        self.assertEqual(r["after"], [r["two"][0] + 1, r["two"][1] + 1])
        for e in (r["e1"], r["e2"]):
            self.assertIn(r["bad"], e)
            self.assertIn("No such file or directory", e)
        self.assertEqual(r["left"], [])

    def test_snapshot_creates_no_allocator_for_unused_devices(self):
        r, _ = self.result("""
            expseg.install(route="python")
            x = torch.empty(1 << 20, 1)
            s = torch.cuda.memory._snapshot()
            lib = expseg._load()
            print(json.dumps([lib.expseg_torch_device_used(0), lib.expseg_torch_device_used(1),
                              len(s["device_traces"]), len(s["segments"])]))
            """)
        self.assertEqual(r, [0, 1, 2, 1])

    def test_record_stream_reaches_expseg(self):
        r, _ = self.result("""
            expseg.install(route="python")
            a = torch.empty(1 << 20, 0); b = torch.empty(1 << 20, 0)
            e0 = stat(0, "expseg.driver.event_record")
            del b                                   # used on its own stream only
            e1 = stat(0, "expseg.driver.event_record")
            a.record_stream(torch.cuda.Stream(7))   # used on stream 7 too
            del a                                   # an event on stream 7 guards the block
            e2 = stat(0, "expseg.driver.event_record")
            try:
                torch.empty(1, 0).record_stream("stream 7"); typ = "no error"
            except TypeError as e:
                typ = str(e)
            print(json.dumps(dict(e=[e0, e1, e2], typ=typ)))
            """)
        self.assertEqual(r["e"][0], r["e"][1])
        self.assertEqual(r["e"][2], r["e"][1] + 1)
        self.assertIn("Stream", r["typ"])

    def test_arguments_get_pytorchs_verdicts_and_exception_types(self):
        # PyTorch's _record_memory_history: a bool `enabled` takes the legacy signature
        # (record_context, trace_alloc_max_entries=1, ...); "state" keeps 1 entry; enabled,
        # context and stacks are checked. set_per_process_memory_fraction: TypeError for a
        # non-float, ValueError outside [0, 1]; a device PyTorch does not have (the stand-in
        # has 2) is an error, not an allocator of its own.
        r, _ = self.result("""
            expseg.install(route="python")
            H = torch.cuda.memory._record_memory_history
            def kind(f, *a, **k):
                try:
                    f(*a, **k)
                except expseg.ExpsegError as e:  # the first of the three it also is
                    t = [t for t in (ValueError, TypeError, RuntimeError) if isinstance(e, t)]
                    return t[0].__name__ + ": " + str(e)
                return "no error"
            def entries(*a, **k):
                H(*a, **k)
                for _ in range(3):
                    t = torch.empty(1 << 20, 0); del t
                n = sum(len(t) for t in torch.cuda.memory._snapshot()["device_traces"])
                H(None)
                return n
            n = dict(state=entries("state"), legacy=entries(True),
                     legacy_pos=entries(True, True, 4), legacy_kw=entries(True,
                     trace_alloc_max_entries=5), all=entries("all", max_entries=6),
                     zero=entries("all", "all", "all", 0))
            bad = [kind(H, "alloc"), kind(H, context="bogus"), kind(H, stacks=None),
                   kind(H, "all", trace_alloc_max_entries=3), kind(H, True, no_such=1),
                   kind(torch.cuda.set_per_process_memory_fraction, 1),
                   kind(torch.cuda.set_per_process_memory_fraction, 1.5),
                   kind(torch.cuda.set_per_process_memory_fraction, -0.5, 0),
                   kind(torch.cuda.memory_allocated, 2), kind(torch.cuda.memory_stats, "cuda:5"),
                   kind(torch.cuda.set_per_process_memory_fraction, 0.5, 3),
                   kind(torch.cuda.memory_allocated, "cpu"),
                   kind(expseg.annotate_memory, None, "cut\\0here"), kind(expseg.host_stat, 7),
                   kind(expseg.record_history, True, 10, skip_actions="alloc"),
                   kind(expseg.record_history, True, 10.0), kind(expseg.memory_stats, "cuda: 1")]
            ok = [kind(H, None, context=None), kind(H, "state", None, "python"),
                  kind(H, False), kind(torch.cuda.set_per_process_memory_fraction, 1.0, 1),
                  kind(torch.cuda.memory_allocated, 1)]
            print(json.dumps(dict(n=n, bad=bad, ok=ok)))
            """)
        self.assertEqual(r["n"], dict(state=1, legacy=1, legacy_pos=4, legacy_kw=5, all=6,
                                      zero=1))
        want = [("RuntimeError", "enabled='alloc'"), ("RuntimeError", "context='bogus'"),
                ("TypeError", "stacks=None"), ("TypeError", "trace_alloc_max_entries"),
                ("TypeError", "no_such"), ("TypeError", "fraction=1:"),
                ("ValueError", "fraction=1.5"), ("ValueError", "fraction=-0.5"),
                ("RuntimeError", "device 2"), ("RuntimeError", "device 5"),
                ("RuntimeError", "device 3"), ("ValueError", "'cpu'"),
                ("RuntimeError", "without NUL"), ("TypeError", "key=7"),
                ("TypeError", "skip_actions='alloc'"), ("TypeError", "max_entries=10.0"),
                ("ValueError", "'cuda: 1'")]
        self.assertEqual(len(r["bad"]), len(want))
        for text, (typ, needle) in zip(r["bad"], want):
            self.assertTrue(text.startswith(typ + ": "), (text, typ))
            self.assertIn(needle, text)
        self.assertEqual(r["ok"], ["no error"] * 5)

    def test_a_bad_configuration_is_not_called_out_of_memory(self):
        # the first allocation creates the allocator and meets the bad text (set after
        # install(), which refuses it when set before): the error names the text and the
        # status; "out of memory" is kept for memory that ran out
        r, _ = self.result("""
            expseg.install(route="python")
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:true"
            try:
                torch.empty(10, 0); msg = "no error"
            except RuntimeError as e:
                msg = str(e)
            print(json.dumps(msg))
            """)
        self.assertIn("expseg could not allocate (EXPSEG_ERR_CONFIG): ", r)
        self.assertIn("expandable_segments value 'true'", r)
        self.assertNotIn("out of memory", r)

    def test_odd_sleep_modes_are_expseg_errors(self):
        # every mode that is not "offload" or "discard" is refused with expseg's one-line
        # error naming it, unhashable ones included (a list raised Python's own TypeError)
        r, _ = self.result("""
            expseg.install(route="python")
            with expseg.region("w"):
                keep = torch.empty(1 << 20, 0)
            out = [err(expseg.sleep, "w", mode) for mode in (["offload"], {}, None, "OFFLOAD", 0)]
            print(json.dumps(out))
            """)
        for text, needle in zip(r, ["['offload']", "{}", "None", "'OFFLOAD'", "0"]):
            self.assertIn("mode " + needle + ":", text)
            self.assertIn("expected 'offload' or 'discard'", text)

    def test_failures_are_one_line_messages(self):
        r, _ = self.result("""
            out = [err(expseg.install, route="fast"),
                   err(expseg.install, safe_record_stream="yes")]
            os.environ["EXPSEG_SAFE_RECORD_STREAM"] = "maybe"
            out.append(err(expseg.install))
            del os.environ["EXPSEG_SAFE_RECORD_STREAM"]
            out.append(err(expseg.install, route="cxx"))
            expseg.install(route="python")
            out += [err(torch.cuda.memory_allocated, "cpu"),
                    err(torch.cuda.memory_stats, -1),
                    err(torch.cuda.set_per_process_memory_fraction, 1.5, 0),
                    err(torch.cuda.memory._record_memory_history, "everything"),
                    err(torch.cuda.memory._record_memory_history, stacks="cpp"),
                    err(torch.cuda.memory._dump_snapshot, ""),
                    err(torch.cuda.memory._dump_snapshot, "/nonexistent/dir/s.pickle"),
                    err(torch.cuda.memory_summary, 99)]
            print(json.dumps(out))
            """)
        want = ["route='fast'", "safe_record_stream='yes'", "EXPSEG_SAFE_RECORD_STREAM=maybe",
                "_expseg_cxx", "'cpu'", "device -1", "fraction=1.5", "'everything'", "'cpp'",
                "empty", "/nonexistent/dir", "device 99"]
        self.assertEqual(len(r), len(want), r)
        for text, needle in zip(r, want):
            self.assertNotEqual(text, "no error", needle)
            self.assertIn(needle, text)
            self.assertNotIn("\n", text)

    def test_a_second_install_does_what_it_asks_explicitly(self):
        r, _ = self.result("""
            expseg.install(route="python")
            again = [expseg.install() == expseg.library_path(),
                     expseg.install(route="python") == expseg.library_path()]
            other = err(expseg.install, route="cxx")
            expseg.install(safe_record_stream=True)
            x = torch.empty(1 << 20, 0); del x
            deferred = expseg.deferred_frees(0)[0]
            expseg.install(safe_record_stream=False)   # off: the deferred frees complete
            print(json.dumps(dict(again=again, other=other, deferred=deferred,
                                  after=expseg.deferred_frees(0)[0], route=expseg.route())))
            """)
        self.assertEqual(r["again"], [True, True])
        self.assertIn("route='cxx'", r["other"])
        self.assertIn("already installed on the 'python' route", r["other"])
        self.assertEqual([r["deferred"], r["after"], r["route"]], [1, 0, "python"])

    def test_says_what_it_cannot_see_once(self):
        rc, out, err = run("""
            warnings.simplefilter("always")
            expseg.install(route="python")
            expseg.install(route="python")
            torch.cuda.memory_allocated(0)
            print(expseg.route())
            """)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.strip(), "python")
        self.assertEqual(err.count("ExpsegWarning"), 1, err)
        self.assertIn("record_stream calls made from C++", err)
        self.assertIn("CUDA graph", err)
        self.assertIn("route=\"cxx\"", err)
        self.assertNotIn("C++ backend is not used", err)  # no loader: nothing else to say

    def test_graph_capture_is_refused_before_it_starts(self):
        r, _ = self.result("""
            g = torch.cuda.CUDAGraph()
            g.capture_begin()  # before install: PyTorch's own
            expseg.install(route="python")
            try:
                torch.cuda.CUDAGraph().capture_begin(pool=None)
                err = "no error"
            except expseg.ExpsegError as e:
                err = str(e)
            started = torch.cuda.CUDAGraph.captured
            expseg._unpatch()
            torch.cuda.CUDAGraph().capture_begin()
            print(json.dumps(dict(err=err, started=started, after=torch.cuda.CUDAGraph.captured)))
            """)
        self.assertIn("cannot capture CUDA graphs", r["err"])
        self.assertIn('route="cxx"', r["err"])
        self.assertEqual(r["started"], 1, "the refused capture must not have begun")
        self.assertEqual(r["after"], 2, "unpatched: PyTorch's capture_begin again")

    def test_device_values_never_wrap_to_another_device(self):
        # a device ordinal past C's int must not become another device (ctypes keeps the low
        # 32 bits), nor may a value that is no device name the current device
        r, _ = self.result("""
            expseg.install(route="python")
            torch.cuda.set_device(1)
            keep = torch.empty(3 << 20, 0)
            class Index:  # as numpy.int64: an integer through __index__ only
                def __index__(self): return 0
            out = {}
            for name, dev in (("wrap", 1 << 32), ("wrap1", (1 << 32) + 1), ("neg", -(1 << 32)),
                              ("float", 0.0), ("list", [0]), ("cpu", torch.device("cpu"))):
                out[name] = err(torch.cuda.memory_allocated, dev)
            out["index"] = torch.cuda.memory_allocated(Index())
            out["want"] = stat(0, "allocated_bytes.all.current")
            print(json.dumps(out))
            """)
        for name, value in (("wrap", "4294967296"), ("wrap1", "4294967297"),
                            ("neg", "-4294967296"), ("float", "0.0"), ("list", "[0]"),
                            ("cpu", "cpu")):
            self.assertIn(value, r[name], name)
            self.assertIn("expected", r[name], name)
        self.assertEqual(r["index"], r["want"])
        self.assertEqual(r["want"], 3 << 20)

    def test_record_stream_of_foreign_tensors_and_bad_streams(self):
        r, _ = self.result("""
            expseg.install(route="python")
            lib = expseg._load()
            lib.expseg_torch_last_error.restype = ctypes.c_char_p
            x = torch.empty(1 << 20, 0)
            before = stat(0, "expseg.driver.event_record")
            buf = ctypes.create_string_buffer(64)   # memory expseg did not hand out
            foreign = torch.Tensor(type(x.untyped_storage())(ctypes.addressof(buf), 64, 0, 0))
            foreign.record_stream(torch.cuda.Stream(5))    # ignored, with a message
            foreign._storage.ptr = 0                       # not freed through expseg
            msg_foreign = lib.expseg_torch_last_error(-1).decode()
            st = lib.expseg_torch_record_stream_status(ctypes.c_void_p(x.data_ptr()),
                                                       ctypes.c_void_p(1 << 48))
            msg_stream = lib.expseg_torch_last_error(-1).decode()
            del x
            print(json.dumps(dict(st=st, msg_foreign=msg_foreign, msg_stream=msg_stream,
                                  ptr=hex(ctypes.addressof(buf)),
                                  events=stat(0, "expseg.driver.event_record") - before,
                                  alloc=stat(0, "allocated_bytes.all.current"))))
            """)
        self.assertIn("not a live pointer", r["msg_foreign"])
        self.assertIn(r["ptr"][2:], r["msg_foreign"])
        self.assertEqual(r["st"], 2)
        self.assertIn("2^48", r["msg_stream"])
        self.assertNotIn("not a live pointer", r["msg_stream"])
        self.assertEqual(r["events"], 0)
        self.assertEqual(r["alloc"], 0)


@unittest.skipUnless(LIB and os.path.isfile(LIB),
                     "set EXPSEG_TEST_TORCH_LIB to the built libexpseg_torch.so")
class ModuleSplit(unittest.TestCase):
    def test_expseg_pytorch_is_expsegs_install(self):
        # expseg_pytorch.py holds install() and the routes; imported alone first, it binds
        # expseg on first use, and expseg's install()/route() are its
        rc, out, err = run("""
            import importlib
            del sys.modules["expseg"], sys.modules["expseg_pytorch"]
            import expseg_pytorch
            alone = expseg_pytorch.ROUTES
            import expseg
            expseg._modelled_driver_ok = True
            path = expseg.install(route="python")
            print(json.dumps(dict(alone=list(alone), core=expseg_pytorch._core is expseg,
                route=[expseg.route(), expseg_pytorch._route],
                installed=expseg._installed is expseg_pytorch._installed is not None,
                same=path == expseg.library_path(),
                consts=expseg.SAFE_BATCH == expseg_pytorch.SAFE_BATCH,
                patched=torch.cuda.memory_allocated(0))))
            """)
        self.assertEqual(rc, 0, err)
        r = json.loads(out.strip().split("\n")[-1])
        self.assertEqual(r, dict(alone=["auto", "cxx", "python"], core=True,
                                 route=["python", "python"], installed=True, same=True,
                                 consts=True, patched=0))


class CxxSeam(unittest.TestCase):
    FAKE = """
        import types
        cxx = types.ModuleType("_expseg_cxx"); calls = []
        def install(path):
            calls.append(path)
            {body}
        cxx.install = install
        sys.modules["_expseg_cxx"] = cxx
        """

    def go(self, body, code):
        return run(textwrap.dedent(self.FAKE.format(body=body)) + textwrap.dedent(code))

    def test_cxx_backend_installed_first(self):
        rc, out, err = self.go("return True", """
            path = expseg.install()
            try:
                torch.cuda.memory_allocated(0); patched = True
            except standin_torch.Unsupported:
                patched = False   # the backend answers these in C++; nothing is patched
            print(expseg.route(), calls == [path], torch._state.swapped, patched)
            """)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.split(), ["cxx", "True", "False", "False"])
        self.assertNotIn("ExpsegWarning", err)

    def test_auto_falls_back_and_says_why_once(self):
        rc, out, err = self.go("raise expseg.ExpsegError('no compiler: g++ not found')", """
            expseg.install()
            expseg.install()
            print(expseg.route(), torch._state.swapped, torch.cuda.memory_allocated(0))
            """)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.split(), ["python", "True", "0"])
        self.assertEqual(err.count("no compiler: g++ not found"), 1, err)
        self.assertEqual(err.count("ExpsegWarning"), 1, err)

    def test_cxx_route_raises_the_backend_message(self):
        for body in ("raise expseg.ExpsegError('headers missing')", "raise OSError('headers missing')",
                     "return False"):
            rc, out, err = self.go(body, """
                print(err(expseg.install, route="cxx"), "|", expseg.route(), torch._state.swapped)
                """)
            self.assertEqual(rc, 0, err)
            msg, rest = out.split("|")
            self.assertIn("C++ backend is not available", msg)
            self.assertIn("headers missing" if "headers" in body else "returned False", msg)
            self.assertEqual(rest.split(), ["None", "False"])


@unittest.skipUnless(LIB and os.path.isfile(LIB),
                     "set EXPSEG_TEST_TORCH_LIB to the built libexpseg_torch.so")
class SafeRecordStream(unittest.TestCase):
    def test_frees_wait_for_a_device_synchronization(self):
        rc, out, err = run("""
            expseg.install(route="python", safe_record_stream=True)
            keep = torch.empty(4 << 20, 0); x = torch.empty(1 << 20, 0)
            px = x.data_ptr(); del keep
            syncs = lambda: stat(0, "expseg.driver.device_synchronize")
            r = dict(deferred=list(expseg.deferred_frees(0)), alloc=torch.cuda.memory_allocated(0))
            # the cache has 4 MiB of room, but the deferred block is not handed out again
            del x
            y = torch.empty(1 << 20, 0)
            r["reused_early"] = y.data_ptr() == px
            r["syncs0"] = syncs()
            # a malloc that would grow the cache completes the batch first
            z = torch.empty(6 << 20, 0)
            r["syncs1"], r["after"] = syncs(), list(expseg.deferred_frees(0))
            # a full batch (256 frees) completes on its own
            for i in range(expseg.SAFE_BATCH - 1):
                torch.empty(4096, 0)
            r["syncs_short"], r["short"] = syncs(), list(expseg.deferred_frees(0))
            torch.empty(4096, 0)
            r["syncs2"], r["batch"] = syncs(), list(expseg.deferred_frees(0))
            t = torch.empty(4096, 0); del t
            torch.cuda.empty_cache()
            r["syncs3"], r["emptied"] = syncs(), list(expseg.deferred_frees(0))
            print(json.dumps(r))
            """)
        self.assertEqual(rc, 0, err)
        r = json.loads(out)
        self.assertEqual(r["deferred"], [1, 4 << 20])
        self.assertEqual(r["alloc"], 5 << 20)   # a deferred block still counts as allocated
        self.assertFalse(r["reused_early"])
        self.assertEqual(r["syncs0"], 0)
        self.assertEqual(r["syncs1"], 1)
        self.assertEqual(r["after"], [0, 0])
        self.assertEqual(r["syncs_short"], 1)
        self.assertEqual(r["short"], [255, 255 * 4096])
        self.assertEqual(r["syncs2"], 2)            # the 256th free completes the batch
        self.assertEqual(r["batch"], [0, 0])
        self.assertEqual(r["syncs3"], 3)
        self.assertEqual(r["emptied"], [0, 0])

    def test_out_of_memory_completes_the_batch_and_env_selects_the_mode(self):
        rc, out, err = run("""
            expseg.install()
            a = torch.empty(40 << 20, 0); del a
            b = torch.empty(40 << 20, 0)         # fails without the deferred 40 MiB
            print(expseg.deferred_frees(0), stat(0, "expseg.driver.device_synchronize"))
            """, driver="sim:capacity=64M", EXPSEG_SAFE_RECORD_STREAM="1")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.strip(), "(0, 0) 1")

    def test_off_frees_at_once(self):
        rc, out, err = run("""
            expseg.install(safe_record_stream=False)
            a = torch.empty(1 << 20, 0); del a
            print(expseg.deferred_frees(0), torch.cuda.memory_allocated(0))
            """, EXPSEG_SAFE_RECORD_STREAM="1")
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.strip(), "(0, 0) 0")


if __name__ == "__main__":
    unittest.main()
