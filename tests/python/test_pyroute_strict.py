# SPDX-License-Identifier: Apache-2.0
"""test_pyroute_strict.py: expseg.install()'s Python route against standin_torch_strict.py, a
stand-in laid out as PyTorch 2.11 is (a _C layer under torch.cuda.memory, functions calling
their siblings through the module, lazy CUDA initialization, positional-only
torch.accelerator calls, deprecated aliases that warn, MemPool refused by the pluggable
allocator). Cases: every figure through torch.cuda, torch.cuda.memory and torch.accelerator
(and torch.accelerator.memory) on the current device set by set_device and torch.cuda.device;
PyTorch's functions bound before install();
caching_allocator_alloc/delete; record_stream with streams whose id is not their pointer;
history, _snapshot, memory_snapshot and _dump_snapshot; install() after CUDA was initialized
(current_device, set_device, a Stream) and a second swap; the memory fraction of a device no
tensor has used (no allocator made); a fraction refused naming PyTorch's call; the
deprecated aliases' FutureWarning; MemPool and CUDA graphs refused with an ExpsegError; the
C++ backend's history wrapper over 2.11's signatures. The child interpreters are
test_pyroute.py's, with the strict stand-in installed over the other (CTest:
python_route_strict)."""

import json
import os
import textwrap
import unittest

from test_pyroute import LIB, run

STRICT = """
import standin_torch_strict
torch = standin_torch_strict.install()
lib = expseg._load()
"""


@unittest.skipUnless(LIB and os.path.isfile(LIB),
                     "set EXPSEG_TEST_TORCH_LIB to the built libexpseg_torch.so")
class StrictTorch(unittest.TestCase):
    def result(self, code, **kw):
        rc, out, err = run(STRICT + textwrap.dedent(code), **kw)
        self.assertEqual(rc, 0, err)
        return json.loads(out.strip().split("\n")[-1]), err

    def test_figures_on_the_current_device_through_every_module(self):
        r, _ = self.result("""
            before = torch.cuda.memory_stats()          # PyTorch's own: {} before CUDA is up
            expseg.install(route="python")
            torch.cuda.set_device(1)
            keep = [torch.empty(3 << 20, dtype=torch.uint8, device="cuda"),
                    torch.empty(5 << 20, dtype=torch.uint8, device=torch.device("cuda", 1))]
            with torch.cuda.device(0):
                zero = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
            raw = torch.cuda.caching_allocator_alloc(2 << 20, 1)
            want = stat(1, "allocated_bytes.all.current")
            got = [torch.cuda.memory_allocated(), torch.cuda.memory.memory_allocated(1),
                   torch.cuda.memory_stats()["allocated_bytes.all.current"],
                   torch.accelerator.memory_allocated(), torch.accelerator.memory_allocated(1),
                   torch.accelerator.memory.memory_allocated(1),
                   torch.accelerator.memory_stats(1)["allocated_bytes.all.current"]]
            torch.cuda.caching_allocator_delete(raw)
            after = torch.cuda.memory_allocated(1)
            info = [list(torch.cuda.mem_get_info(1)), list(torch.accelerator.get_memory_info(1))]
            print(json.dumps(dict(before=len(before), want=want, got=got, after=after,
                                  zero=torch.cuda.memory_allocated(0), info=info,
                                  summary="device ID 1" in torch.cuda.memory_summary())))
            """)
        self.assertEqual(r["before"], 0)
        self.assertEqual(r["want"], 10 << 20)
        self.assertEqual(r["got"], [r["want"]] * 7)
        self.assertEqual(r["after"], 8 << 20)
        self.assertEqual(r["zero"], 1 << 20)
        self.assertEqual(r["info"][0], r["info"][1])
        self.assertTrue(r["summary"])

    def test_pytorchs_functions_bound_before_install_reach_expseg(self):
        # `from torch.cuda.memory import X` before install() keeps PyTorch's function, which
        # calls its siblings through the module: those the route replaced answer for it
        r, _ = self.result("""
            from torch.cuda.memory import (memory_allocated, memory_stats, memory_summary,
                                           _record_memory_history, _dump_snapshot)
            expseg.install(route="python")
            _record_memory_history(max_entries=50)
            a = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
            path = os.path.join(tempfile.mkdtemp(), "s.pickle")
            _dump_snapshot(path)
            with open(path, "rb") as f:
                traces = len(pickle.load(f)["device_traces"][0])
            _record_memory_history(False)
            print(json.dumps(dict(alloc=memory_allocated(), stats=memory_stats()[
                "allocated_bytes.all.current"], summary="device ID 0" in memory_summary(),
                traces=traces, want=stat(0, "allocated_bytes.all.current"))))
            """)
        self.assertEqual([r["alloc"], r["stats"]], [r["want"]] * 2)
        self.assertTrue(r["summary"])
        self.assertGreater(r["traces"], 0)

    def test_record_stream_uses_the_stream_pointer_not_its_id(self):
        # a tensor made on stream s and used on s only needs no event at its free; used on t
        # too, one: expseg must be told s's cudaStream_t (cuda_stream), not its stream_id; a
        # plain torch.Stream (torch.accelerator.current_stream()) of s is s
        r, _ = self.result("""
            expseg.install(route="python")
            s, t = torch.cuda.Stream(), torch.cuda.Stream()
            events = []
            with torch.cuda.stream(s):
                plain = torch.accelerator.current_stream()    # s as a torch.Stream
            for also in (None, t, plain):
                with torch.cuda.stream(s):
                    a = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
                e0 = stat(0, "expseg.driver.event_record")
                a.record_stream(s)
                if also is not None:
                    a.record_stream(also)
                del a
                events.append(stat(0, "expseg.driver.event_record") - e0)
            try:
                torch.empty(4, device="cuda").record_stream(7)
                typ = "no error"
            except TypeError as e:
                typ = str(e)
            print(json.dumps(dict(ids=[s.stream_id, s.cuda_stream], events=events, typ=typ,
                                  plain=hasattr(plain, "cuda_stream"))))
            """)
        self.assertNotEqual(r["ids"][0], r["ids"][1])
        self.assertFalse(r["plain"])
        self.assertEqual(r["events"], [0, 1, 0])
        self.assertIn("must be Stream", r["typ"])

    def test_history_and_snapshots_replace_pytorchs(self):
        r, _ = self.result("""
            import inspect
            expseg.install(route="python")
            torch.cuda.memory._record_memory_history(max_entries=100)
            a = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
            s = torch.cuda.memory._snapshot()
            path = os.path.join(tempfile.mkdtemp(), "s.pickle")
            torch.cuda.memory._dump_snapshot(path)
            with open(path, "rb") as f:
                d = pickle.load(f)
            torch.cuda.memory._record_memory_history(False)   # the legacy form
            torch.cuda.memory._record_memory_history(None)
            print(json.dumps(dict(traces=len(s["device_traces"][0]),
                                  segs=[len(s["segments"]), len(d["segments"]),
                                        len(torch.cuda.memory_snapshot())],
                                  sig="max_entries" in str(inspect.signature(
                                      torch.cuda.memory._record_memory_history)))))
            """)
        self.assertGreater(r["traces"], 0)
        self.assertEqual(r["segs"], [1, 1, 1])
        self.assertTrue(r["sig"])

    def test_install_after_cuda_was_initialized_is_too_late(self):
        r, _ = self.result("""
            out = []
            for touch in ("torch.cuda.current_device()", "torch.cuda.set_device(0)",
                          "torch.cuda.Stream()", "torch.cuda.current_stream()"):
                torch = standin_torch_strict.install()
                eval(touch)
                out.append(err(expseg.install, route="python"))
            torch = standin_torch_strict.install()
            expseg.install(route="python")
            expseg._unpatch()                      # a second swap: PyTorch refuses it too
            out.append(err(expseg.install, route="python"))
            print(json.dumps(out))
            """)
        for e in r:
            self.assertIn("came too late", e)

    def test_memory_fraction_of_an_unused_device_creates_no_allocator(self):
        # PyTorch reads a device's fraction without touching the device; an expseg allocator
        # on the cuda driver holds the device's context, so asking must not create one: the
        # answer is a fresh allocator's (the configuration's fraction)
        r, _ = self.result("""
            expseg.install(route="python")
            f = [torch.cuda.get_per_process_memory_fraction(1),
                 torch.cuda.get_per_process_memory_fraction()]
            used = [lib.expseg_torch_device_used(d) for d in (0, 1)]
            torch.cuda.set_per_process_memory_fraction(0.25, 1)
            print(json.dumps(dict(f=f, used=used,
                                  later=torch.cuda.get_per_process_memory_fraction(1))))
            """, EXPSEG_ALLOC_CONF="per_process_memory_fraction:0.5")
        self.assertEqual(r, dict(f=[0.5, 0.5], used=[0, 0], later=0.25))

    def test_refusals_name_the_pytorch_call_made(self):
        # PyTorch's TypeError and ValueError for a fraction; the route's say which call
        r, _ = self.result("""
            expseg.install(route="python")
            out = []
            for f in (1, 1.5, -0.5):
                try:
                    torch.cuda.set_per_process_memory_fraction(f)
                except (TypeError, ValueError) as e:
                    out.append(["TypeError" if isinstance(e, TypeError) else "ValueError",
                                str(e)])
            print(json.dumps(out))
            """)
        self.assertEqual([k for k, _ in r], ["TypeError", "ValueError", "ValueError"])
        for _, text in r:
            self.assertIn("torch.cuda.set_per_process_memory_fraction", text)

    def test_deprecated_aliases_still_warn(self):
        # PyTorch's memory_cached, max_memory_cached (renamed) and reset_max_memory_* (now
        # reset every peak) give a FutureWarning; the route's must too
        r, _ = self.result("""
            expseg.install(route="python")
            a = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
            out = {}
            for name in ("memory_cached", "max_memory_cached", "reset_max_memory_allocated",
                         "reset_max_memory_cached", "memory_reserved"):
                for mod in (torch.cuda, torch.cuda.memory):
                    with warnings.catch_warnings(record=True) as w:
                        warnings.simplefilter("always")
                        v = getattr(mod, name)(0)
                    out[name] = [[x.category.__name__ for x in w], v]
            out["reserved"] = stat(0, "reserved_bytes.all.current")
            print(json.dumps(out))
            """)
        for name in ("memory_cached", "max_memory_cached", "reset_max_memory_allocated",
                     "reset_max_memory_cached"):
            self.assertEqual(r[name][0], ["FutureWarning"], name)
        self.assertEqual(r["memory_reserved"][0], [])
        self.assertEqual(r["memory_cached"][1], r["reserved"])

    def test_cxx_route_history_on_pytorch_without_the_host_arguments(self):
        # PyTorch 2.11's _record_memory_history takes no record_pinned_host_memory or
        # record_cuda (either form): the C++ backend's wrapper keeps the host pool's history
        # itself and passes PyTorch only what it takes, by keyword or position
        r, _ = self.result("""
            import types
            calls = []
            torch._C._cuda_record_memory_history = lambda *a: calls.append(["current"] + list(a))
            torch._C._cuda_record_memory_history_legacy = lambda *a: calls.append(
                ["legacy"] + list(a))
            cxx = types.ModuleType("_expseg_cxx")
            cxx.install = lambda path: True
            sys.modules["_expseg_cxx"] = cxx
            expseg.install()
            H = torch.cuda.memory._record_memory_history
            H("all", max_entries=7, record_pinned_host_memory=True)
            H(True, trace_alloc_max_entries=5, record_context_cpp=True)
            H("all", "all", "all", 9, None, False, False, False, None, True)
            H(None)
            print(json.dumps(dict(route=expseg.route(), calls=calls)))
            """)
        self.assertEqual(r["route"], "cxx")
        self.assertEqual(r["calls"], [["current", "all", "all", "all", 7],
                                      ["legacy", True, True, 5],
                                      ["current", "all", "all", "all", 9],
                                      ["current", None, "all", "all", 9223372036854775807]])

    def test_mempool_and_graphs_are_refused_with_an_expseg_error(self):
        # PyTorch's pluggable allocator cannot make a MemPool ("pluggable does not yet
        # support createOrIncrefPool"): the route says so, and what to use instead
        r, _ = self.result("""
            expseg.install(route="python")
            print(json.dumps([err(torch.cuda.MemPool),
                              err(lambda: torch.cuda.graph(torch.cuda.CUDAGraph()).__enter__())]))
            """)
        self.assertIn("MemPool", r[0])
        self.assertIn('route="cxx"', r[0])
        self.assertIn("cannot capture CUDA graphs", r[1])


if __name__ == "__main__":
    unittest.main()
