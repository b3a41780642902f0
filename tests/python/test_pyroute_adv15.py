# SPDX-License-Identifier: Apache-2.0
"""test_pyroute_adv15.py: the Python route's torch.cuda memory calls held to PyTorch's own
API (torch/cuda/memory.py): each call's signature and device forms (None, int, "cuda",
"cuda:N", torch.device, torch.cuda.device, a device PyTorch does not have, a bad type),
the statistics after a seeded random run of allocations, frees, record_stream, empty_cache
and peak resets (EXPSEG_TEST_SEED, printed), PyTorch's memory_stats keys, out of memory and
the allocator after it, the fraction's errors, install() twice and too late, the history's
and snapshot's argument forms (with the types PyTorch's binding refuses), one device_traces
list per device and memory_summary's text. The stand-in torch and the child
interpreters are test_pyroute.py's (run by CTest as python_route_adv15)."""

import json
import os
import random
import unittest

from test_pyroute import LIB, run

# PyTorch's memory_stats keys (CUDACachingAllocator's DeviceStats, torch/cuda/memory.py)
PYTORCH_KEYS = sorted(
    ["%s.%s.%s" % (stat, pool, field)
     for stat in ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
                  "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
     for pool in ("all", "small_pool", "large_pool")
     for field in ("current", "peak", "allocated", "freed")] +
    ["oversize_%s.%s" % (what, field) for what in ("allocations", "segments")
     for field in ("current", "peak", "allocated", "freed")] +
    ["num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
     "num_device_free", "max_split_size"])


@unittest.skipUnless(LIB and os.path.isfile(LIB),
                     "set EXPSEG_TEST_TORCH_LIB to the built libexpseg_torch.so")
class PyTorchApi(unittest.TestCase):
    def result(self, code, **kw):
        rc, out, err = run(code, **kw)
        self.assertEqual(rc, 0, err)
        return json.loads(out.strip().split("\n")[-1]), err

    def test_empty_cache_takes_no_argument_as_pytorch(self):
        # torch.cuda.empty_cache() and torch.accelerator.empty_cache() take no argument:
        # empty_cache(0) is PyTorch's TypeError, not a call that empties every device
        r, _ = self.result("""
            import inspect
            expseg.install(route="python")
            x = torch.empty(3 << 20, 0); del x
            held = torch.cuda.memory_reserved(0)
            out = {}
            for name, f in (("cuda", torch.cuda.empty_cache),
                            ("memory", torch.cuda.memory.empty_cache),
                            ("accel", torch.accelerator.empty_cache)):
                try:
                    f(0); out[name] = "no error"
                except TypeError as e:
                    out[name] = "TypeError"
                out[name + "_params"] = list(inspect.signature(f).parameters)
            still = torch.cuda.memory_reserved(0)
            torch.cuda.empty_cache()
            print(json.dumps(dict(out=out, held=held, still=still,
                                  after=torch.cuda.memory_reserved(0))))
            """)
        self.assertEqual(r["out"], {"cuda": "TypeError", "cuda_params": [],
                                    "memory": "TypeError", "memory_params": [],
                                    "accel": "TypeError", "accel_params": []})
        self.assertGreater(r["held"], 0)
        self.assertEqual(r["still"], r["held"], "a refused call emptied the cache")
        self.assertEqual(r["after"], 0)

    def test_torch_cuda_device_object_is_a_device_argument(self):
        # PyTorch's _get_device_index takes a torch.cuda.device (the context manager) as its
        # idx: memory_allocated(torch.cuda.device(1)) is device 1's figure
        r, _ = self.result("""
            class cuda_device:  # torch.cuda.device, reduced: the index as .idx
                def __init__(self, device):
                    self.idx = device if isinstance(device, int) else torch.device(device).index
                    self.prev_idx = -1
            torch.cuda.device = cuda_device
            expseg.install(route="python")
            keep = torch.empty(5 << 20, 1)
            d1 = torch.cuda.device(1)
            got = dict(alloc=torch.cuda.memory_allocated(d1),
                       stats=torch.cuda.memory_stats(d1)["allocated_bytes.all.current"],
                       peak=torch.cuda.max_memory_allocated(d1),
                       info=list(torch.cuda.mem_get_info(d1)),
                       summary="device ID 1" in torch.cuda.memory_summary(d1),
                       dev0=torch.cuda.memory_allocated(torch.cuda.device("cuda:0")))
            torch.cuda.reset_peak_memory_stats(d1)
            print(json.dumps(dict(got=got, want=stat(1, "allocated_bytes.all.current"),
                                  info=list(torch.cuda.mem_get_info(1)),
                                  bad=err(torch.cuda.memory_allocated, cuda_device(7)))))
            """)
        want = r["want"]
        self.assertEqual(want, 5 << 20)
        self.assertEqual(r["got"], dict(alloc=want, stats=want, peak=want, info=r["info"],
                                        summary=True, dev0=0))
        self.assertIn("device 7", r["bad"])

    def test_device_forms_and_refusals_as_pytorch(self):
        # PyTorch: a CUDA device it does not have is a RuntimeError ("Invalid device
        # argument"), a device that is not CUDA a ValueError; expseg's errors are both
        r, _ = self.result("""
            expseg.install(route="python")
            torch.cuda.set_device(1)
            keep = torch.empty(2 << 20, 1)
            forms = [None, 1, "cuda", "cuda:1", torch.device("cuda"), torch.device("cuda", 1)]
            same = {}
            for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                         "max_memory_reserved"):
                same[name] = sorted(set(getattr(torch.cuda, name)(d) for d in forms) |
                                    set(getattr(torch.cuda, name)(device=d) for d in forms))
            def kind(f, *a):
                try:
                    f(*a)
                    return "no error"
                except ValueError as e:
                    return "ValueError+RuntimeError" if isinstance(e, RuntimeError) \\
                        else "ValueError"
                except RuntimeError as e:
                    return "RuntimeError"
                except TypeError:
                    return "TypeError"
            refusals = {repr(d): [kind(f, d) for f in (
                            torch.cuda.memory_allocated, torch.cuda.memory_stats,
                            torch.cuda.reset_peak_memory_stats, torch.cuda.mem_get_info,
                            torch.cuda.memory_summary)]
                        for d in (2, 5, "cuda:2", torch.device("cuda", 3), "cpu",
                                  torch.device("cpu"), "cuda:x", -1)}
            print(json.dumps(dict(same=same, refusals=refusals,
                                  dev0=torch.cuda.memory_allocated(0))))
            """)
        for name, values in r["same"].items():
            self.assertEqual(len(values), 1, (name, values))
        self.assertEqual(r["same"]["memory_allocated"], [2 << 20])
        self.assertEqual(r["dev0"], 0)
        for d in ("2", "5", "'cuda:2'", "device(type='cuda', index=3)", "-1", "'cuda:x'"):
            for k in r["refusals"][d]:
                self.assertIn("RuntimeError", k, (d, r["refusals"][d]))
        for d in ("'cpu'", "device(type='cpu', index=None)"):
            for k in r["refusals"][d]:
                self.assertTrue(k.startswith("ValueError"), (d, r["refusals"][d]))

    def test_statistics_after_a_random_run(self):
        seed = int(os.environ.get("EXPSEG_TEST_SEED", random.randrange(1 << 30)))
        print("test_statistics_after_a_random_run: EXPSEG_TEST_SEED=%d" % seed)
        r, _ = self.result("""
            import random
            rng = random.Random(%d)
            expseg.install(route="python")
            live, bad, serial = {}, [], 0
            def rounded(n):
                return max(512, (n + 511) // 512 * 512)
            for step in range(400):
                op = rng.random()
                if op < 0.45 or not live:
                    n = rng.choice([1, 511, 512, 513, 4000, 1 << 20, (1 << 20) + 1,
                                    rng.randrange(1, 4 << 20)])
                    serial += 1
                    live[serial] = (torch.empty(n, 0), n)
                elif op < 0.8:
                    del live[rng.choice(sorted(live))]
                elif op < 0.87:
                    live[rng.choice(sorted(live))][0].record_stream(
                        torch.cuda.Stream(rng.choice([3, 5])))
                elif op < 0.93:
                    torch.cuda.empty_cache()
                else:
                    torch.cuda.reset_peak_memory_stats(0)
                    if torch.cuda.max_memory_allocated(0) != torch.cuda.memory_allocated(0):
                        bad.append([step, "reset", torch.cuda.max_memory_allocated(0),
                                    torch.cuda.memory_allocated(0)])
                    if torch.cuda.max_memory_reserved(0) != torch.cuda.memory_reserved(0):
                        bad.append([step, "reset reserved"])
                s = torch.cuda.memory_stats(0)
                want = sum(rounded(n) for _, n in live.values())
                got = [torch.cuda.memory_allocated(0), s["allocated_bytes.all.current"],
                       s["requested_bytes.all.current"], s["allocation.all.current"]]
                if got != [want, want, sum(n for _, n in live.values()), len(live)]:
                    bad.append([step, "allocated", got, want])
                if not (torch.cuda.max_memory_allocated(0) >= torch.cuda.memory_allocated(0)
                        and torch.cuda.max_memory_reserved(0) >= torch.cuda.memory_reserved(0)
                        and torch.cuda.memory_reserved(0) >= torch.cuda.memory_allocated(0)
                        and s["allocated_bytes.all.allocated"] - s["allocated_bytes.all.freed"]
                            == want):
                    bad.append([step, "order"])
            live.clear()
            torch.cuda.empty_cache()
            print(json.dumps(dict(bad=bad[:5], end=[torch.cuda.memory_allocated(0),
                                                   torch.cuda.memory_reserved(0)])))
            """ % seed)
        self.assertEqual(r["bad"], [], "seed %d" % seed)
        self.assertEqual(r["end"], [0, 0], "seed %d" % seed)

    def test_memory_stats_has_pytorchs_keys_as_pytorch(self):
        r, _ = self.result("""
            expseg.install(route="python")
            fresh = torch.cuda.memory_stats()
            x = torch.empty(1000, 0)
            s = torch.cuda.memory_stats(device=0)
            n = torch.cuda.memory_stats_as_nested_dict(device=0)
            print(json.dumps(dict(keys=list(s), fresh=list(fresh), cls=type(s).__name__,
                ints=all(type(v) is int for v in s.values()), ncls=type(n).__name__,
                nested=n["allocated_bytes"]["all"]["current"], flat=s["allocated_bytes.all.current"],
                retries=n["num_alloc_retries"])))
            """)
        self.assertEqual(r["cls"], "OrderedDict")
        self.assertEqual(r["keys"], sorted(r["keys"]))
        self.assertEqual([k for k in PYTORCH_KEYS if k not in r["keys"]], [])
        self.assertEqual([k for k in PYTORCH_KEYS if k not in r["fresh"]], [])
        self.assertTrue(r["ints"])
        self.assertEqual(r["ncls"], "dict")
        self.assertEqual(r["nested"], 1024)
        self.assertEqual(r["flat"], 1024)
        self.assertEqual(r["retries"], 0)

    def test_out_of_memory_raises_and_the_allocator_stays_usable(self):
        r, _ = self.result("""
            expseg.install(route="python")
            keep = torch.empty(8 << 20, 0)
            before = torch.cuda.memory_allocated(0)
            try:
                torch.empty(1 << 40, 0); oom = ["no error"]
            except RuntimeError as e:
                oom = [str(e), "\\n" in str(e)]
            stats = torch.cuda.memory_stats(0)
            after = [torch.cuda.memory_allocated(0), stats["num_ooms"]]
            more = torch.empty(16 << 20, 0)
            print(json.dumps(dict(oom=oom, before=before, after=after,
                                  more=torch.cuda.memory_allocated(0))))
            """, EXPSEG_TEST_QUIET="1")
        self.assertTrue(r["oom"][0].startswith("CUDA out of memory"), r["oom"][0])
        self.assertIn("1099511627776 bytes", r["oom"][0])
        self.assertFalse(r["oom"][1], "the message is one line")
        self.assertEqual(r["after"], [8 << 20, 1])
        self.assertEqual(r["more"], 24 << 20)

    def test_fraction_errors_as_pytorch(self):
        r, _ = self.result("""
            expseg.install(route="python")
            def kind(*a, **k):
                try:
                    torch.cuda.set_per_process_memory_fraction(*a, **k)
                    return "ok"
                except TypeError:
                    return "TypeError"
                except ValueError:
                    return "ValueError"
            out = [kind(1), kind(0.5, 0), kind(True), kind("0.5"), kind(1.5), kind(-0.1),
                   kind(0.5, "cpu"), kind(fraction=0.25, device=1), kind(1.0),
                   kind(2, "cpu"), kind("x", torch.device("cpu"))]
            print(json.dumps(dict(out=out, f0=torch.cuda.get_per_process_memory_fraction(0),
                                  f1=torch.cuda.get_per_process_memory_fraction(device=1))))
            """)
        self.assertEqual(r["out"], ["TypeError", "ok", "TypeError", "TypeError", "ValueError",
                                    "ValueError", "ValueError", "ok", "ok",
                                    # PyTorch checks the device first: not CUDA, a ValueError
                                    "ValueError", "ValueError"])
        self.assertEqual(r["f0"], 1.0)
        self.assertEqual(r["f1"], 0.25)

    def test_install_twice_and_too_late(self):
        r, _ = self.result("""
            first = expseg.install(route="python")
            again = expseg.install()
            same = expseg.install(route="python")
            wrong = err(expseg.install, route="cxx")
            x = torch.empty(1 << 20, 0)
            print(json.dumps(dict(same=[first == again == same, expseg.route()], wrong=wrong,
                                  alloc=torch.cuda.memory_allocated())))
            """)
        self.assertEqual(r["same"], [True, "python"])
        self.assertIn("already installed", r["wrong"])
        self.assertEqual(r["alloc"], 1 << 20)
        r, _ = self.result("""
            torch._state.allocator = object(); torch._state.initialized = True
            print(json.dumps(dict(late=err(expseg.install, route="python"),
                                  route=expseg.route())))
            """)
        self.assertIn("too late", r["late"])
        self.assertIsNone(r["route"])

    def test_history_and_snapshot_argument_forms(self):
        r, _ = self.result("""
            expseg.install(route="python")
            h = torch.cuda.memory._record_memory_history
            out = {}
            h(enabled="all", context="all", stacks="python", max_entries=50)
            x = torch.empty(1000, 0); del x
            s = torch.cuda.memory._snapshot()
            out["all"] = [sorted(s), [e["action"] for e in s["device_traces"][0]],
                          sorted(s["device_traces"][0][1])]
            h("state", context=None)
            y = torch.empty(2000, 0)
            out["state"] = len(torch.cuda.memory._snapshot()["device_traces"][0])
            h(None)
            out["off"] = len(torch.cuda.memory._snapshot()["device_traces"][0])
            h(True)
            z = torch.empty(3000, 0)
            out["legacy"] = len(torch.cuda.memory._snapshot()["device_traces"][0])
            h(True, trace_alloc_max_entries=10)
            z2 = torch.empty(3000, 0); del z2
            out["legacy10"] = len(torch.cuda.memory._snapshot()["device_traces"][0])
            h(False)
            out["bad"] = [err(h, "yes"), err(h, "all", context="some"),
                          err(h, "all", stacks=None), err(h, "all", bogus=1)]
            segs = torch.cuda.memory_snapshot()
            out["segs"] = [type(segs).__name__, sorted(segs[0])[:3],
                           sum(b["size"] for seg in segs for b in seg["blocks"]
                               if b["state"] == "active_allocated")]
            path = os.path.join(tempfile.mkdtemp(), "d.pickle")
            torch.cuda.memory._dump_snapshot(path)
            with open(path, "rb") as f:
                out["dump"] = sorted(pickle.load(f))
            print(json.dumps(out))
            """)
        self.assertEqual(r["all"][0], ["allocator_settings", "device_traces",
                                       "external_annotations", "segments"])
        for action in ("alloc", "free_requested", "free_completed"):
            self.assertIn(action, r["all"][1])
        for k in ("action", "addr", "size", "stream", "frames"):
            self.assertIn(k, r["all"][2])
        self.assertEqual(r["state"], 1)
        self.assertEqual(r["off"], 0)
        self.assertEqual(r["legacy"], 1)
        self.assertGreater(r["legacy10"], 1)
        self.assertIn("enabled='yes'", r["bad"][0])
        self.assertIn("context='some'", r["bad"][1])
        self.assertIn("stacks=None", r["bad"][2])
        self.assertIn("bogus", r["bad"][3])
        self.assertEqual(r["segs"][0], "list")
        self.assertEqual(r["segs"][2], 2048 + 3072)
        self.assertEqual(r["dump"], r["all"][0])

    def test_snapshot_has_a_trace_list_per_device_as_pytorch(self):
        # PyTorch's snapshot has one device_traces list per device it has (device_count()),
        # whether used or not: snapshot["device_traces"][1] is [] before device 1 is used
        r, _ = self.result("""
            expseg.install(route="python")
            path = os.path.join(tempfile.mkdtemp(), "d.pickle")
            def shapes():
                torch.cuda.memory._dump_snapshot(path)
                with open(path, "rb") as f:
                    dumped = pickle.load(f)
                return [[len(t) for t in torch.cuda.memory._snapshot()["device_traces"]],
                        [len(t) for t in dumped["device_traces"]],
                        [len(t) for t in torch.cuda.memory._snapshot(
                            include_traces=False)["device_traces"]]]
            out = dict(fresh=shapes())
            torch.cuda.memory._record_memory_history(max_entries=100)
            x = torch.empty(1000, 0)
            out["dev0"] = shapes()
            y = torch.empty(1000, 1)
            out["both"] = shapes()
            print(json.dumps(out))
            """)
        self.assertEqual(r["fresh"], [[0, 0], [0, 0], [0, 0]])
        self.assertEqual(len(r["dev0"][0]), 2)
        self.assertGreater(r["dev0"][0][0], 0)
        self.assertEqual(r["dev0"][0][1], 0)
        self.assertEqual([len(r["dev0"][1]), r["dev0"][1][1:]], [2, [0]])
        self.assertEqual(r["dev0"][2], [0, 0])
        self.assertGreater(r["both"][0][1], 0)
        self.assertEqual(r["both"][2], [0, 0])

    def test_history_argument_types_as_pytorchs_binding(self):
        # torch._C._cuda_record_memory_history(optional<str> enabled, optional<str> context,
        # str stacks, size_t max_entries): a value of another type, a negative max_entries or
        # one past size_t is pybind's TypeError even while stopping; a str it does not know
        # is PyTorch's RuntimeError
        r, _ = self.result("""
            expseg.install(route="python")
            h = torch.cuda.memory._record_memory_history
            def kind(*a, **k):
                try:
                    h(*a, **k)
                    return "ok"
                except TypeError:
                    return "TypeError"
                except ValueError:
                    return "ValueError"
                except RuntimeError:
                    return "RuntimeError"
            out = [kind(enabled=1), kind("all", context=1), kind("all", stacks=None),
                   kind("all", stacks=2), kind("all", max_entries=-1),
                   kind("all", max_entries=1 << 64), kind(None, max_entries=-5),
                   kind(None, max_entries=1.0), kind("all", max_entries=(1 << 64) - 1),
                   kind("bogus"), kind("all", context="bogus"), kind("all", stacks="cpp"),
                   kind(None, context=None), kind("state", max_entries=0), kind(None)]
            print(json.dumps(out))
            """)
        self.assertEqual(r, ["TypeError"] * 8 + ["ok"] + ["RuntimeError"] * 3 + ["ok"] * 3)

    def test_memory_summary_text(self):
        r, _ = self.result("""
            expseg.install(route="python")
            x = torch.empty(3 << 20, 0)
            full = torch.cuda.memory_summary()
            short = torch.cuda.memory_summary(device=0, abbreviated=True)
            print(json.dumps(dict(full=full, short=short, kw=torch.cuda.memory_summary(
                device="cuda:1", abbreviated=False))))
            """)
        for text in (r["full"], r["short"]):
            self.assertIn("PyTorch CUDA memory summary, device ID 0", text)
            self.assertIn("CUDA OOMs: 0", text)
            self.assertIn("Allocated memory", text)
            self.assertIn("3072 KiB", text)
        self.assertIn("from large pool", r["full"])
        self.assertNotIn("from large pool", r["short"])
        self.assertLess(len(r["short"]), len(r["full"]))
        self.assertIn("device ID 1", r["kw"])


if __name__ == "__main__":
    unittest.main()
