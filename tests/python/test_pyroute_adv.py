# SPDX-License-Identifier: Apache-2.0
"""test_pyroute_adv.py: expseg.install()'s Python route under calls a user makes that the
route's own tests (test_pyroute.py) do not: figures asked of a device no tensor has used,
every statistic against the C library's, a configuration the library refuses, install()
too late, from several threads at once or with a library PyTorch cannot load,
record_stream against a stream whose work is still queued, a memory fraction lowered below
what is live, teardown at interpreter exit and several threads allocating and asking at
once (seeded: EXPSEG_TEST_SEED, printed). The stand-in torch and the child interpreters are
test_pyroute.py's (run by CTest as python_route_adv)."""

import json
import os
import textwrap
import unittest

from test_pyroute import LIB, run

USED = """
lib.expseg_torch_allocator.restype = ctypes.c_void_p
lib.expseg_torch_allocator.argtypes = [ctypes.c_int, ctypes.c_int]
used = lambda: [lib.expseg_torch_device_used(d) for d in (0, 1)]
"""


@unittest.skipUnless(LIB and os.path.isfile(LIB),
                     "set EXPSEG_TEST_TORCH_LIB to the built libexpseg_torch.so")
class Adversarial(unittest.TestCase):
    def result(self, code, **kw):
        rc, out, err = run("lib = expseg._load()\n" + USED + textwrap.dedent(code), **kw)
        self.assertEqual(rc, 0, err)
        return json.loads(out.strip().split("\n")[-1]), err

    def test_figures_of_an_unused_device_create_no_allocator(self):
        # PyTorch answers memory_allocated(i) & co. for a device it has not used without
        # touching it; an expseg allocator on the cuda driver holds the device's context, so
        # asking must not create one (a loop over every device would take a context on each)
        r, _ = self.result("""
            expseg.install(route="python")
            path = os.path.join(tempfile.mkdtemp(), "s.pickle")
            torch.cuda.memory._record_memory_history(max_entries=10)
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._dump_snapshot(path)
            with open(path, "rb") as f:
                dumped = pickle.load(f)
            before = dict(alloc=torch.cuda.memory_allocated(), stats=len(torch.cuda.memory_stats()),
                          segs=torch.cuda.memory_snapshot(), used=used(),
                          snap=[sorted(snap), snap["segments"], sorted(dumped) == sorted(snap)])
            x = torch.empty(3 << 20, 0)
            calls = ("memory_allocated", "max_memory_allocated", "memory_reserved",
                     "max_memory_reserved", "reset_peak_memory_stats",
                     "reset_accumulated_memory_stats", "reset_max_memory_allocated")
            got = {name: getattr(torch.cuda, name)(dev) for name in calls
                   for dev in (1, "cuda:1", torch.device("cuda", 1))}
            summary = torch.cuda.memory_summary(1, abbreviated=True)
            idle = torch.cuda.memory_stats(1)
            nested = torch.cuda.memory_stats_as_nested_dict(torch.device("cuda:1"))
            acc = torch.accelerator.memory_allocated(1)
            after = used()
            live = torch.cuda.memory_stats(0)
            y = torch.empty(1 << 20, 1)              # now device 1 has an allocator
            print(json.dumps(dict(before=before, got=sorted(set(map(str, got.values()))),
                after=after, acc=acc, summary=summary == expseg._fresh_summary(1, True) and
                summary.split("device ID")[1].split()[0], keys=list(idle) == list(live),
                cls=type(idle).__name__,
                nonzero={k: v for k, v in idle.items() if v and k != "max_split_size"},
                split=[idle["max_split_size"], live["max_split_size"]],
                nested=nested["allocated_bytes"]["all"]["current"],
                later=[used(), torch.cuda.memory_allocated(1),
                       stat(1, "allocated_bytes.all.current")])))
            """)
        self.assertEqual(r["before"], dict(alloc=0, stats=r["before"]["stats"], used=[0, 0],
                                           segs=[], snap=[["allocator_settings", "device_traces",
                                                           "external_annotations", "segments"],
                                                          [], True]))
        self.assertGreater(r["before"]["stats"], 100)
        self.assertEqual(r["got"], ["0", "None"])
        self.assertEqual(r["after"], [1, 0], "a question about device 1 created its allocator")
        self.assertEqual(r["acc"], 0)
        self.assertEqual(r["summary"], "1")
        self.assertTrue(r["keys"])
        self.assertEqual(r["cls"], "OrderedDict")
        self.assertEqual(r["nonzero"], {})
        self.assertEqual(r["split"][0], r["split"][1])
        self.assertEqual(r["nested"], 0)
        self.assertEqual(r["later"], [[1, 1], 1 << 20, 1 << 20])

    def test_a_refused_configuration_stops_install_before_anything_changes(self):
        # a bad option text must be install()'s error, not every later allocation's: PyTorch
        # keeps its allocator, nothing is patched, and install() works once the text is right
        fake = ("import types\ncxx = types.ModuleType('_expseg_cxx'); cxx.calls = []\n"
                "cxx.install = lambda path: cxx.calls.append(path) or True\n")
        for route, pre in (("python", ""), ("auto", fake + "sys.modules['_expseg_cxx'] = cxx\n")):
            r, err = self.result(pre + textwrap.dedent("""
                warnings.simplefilter("always")
                e = err(expseg.install, route=ROUTE, safe_record_stream=True)
                try:
                    torch.cuda.memory_allocated(0); patched = True
                except standin_torch.Unsupported:
                    patched = False
                state = dict(e=e, route=expseg.route(), swapped=torch._state.swapped,
                             patched=patched, used=used(), safe=lib.expseg_torch_set_safe_free(0),
                             cxx=len(getattr(sys.modules.get("_expseg_cxx"), "calls", [])))
                x = torch.empty(1 << 20, 0) if torch._state.swapped else None
                del os.environ["PYTORCH_CUDA_ALLOC_CONF"]
                expseg.install(route=ROUTE)
                state["again"] = expseg.route()
                print(json.dumps(state))
                """).replace("ROUTE", repr(route)), PYTORCH_CUDA_ALLOC_CONF="bogus_option:1")
            self.assertIn("expseg.install()", r["e"], route)
            self.assertIn("PYTORCH_CUDA_ALLOC_CONF", r["e"])
            self.assertIn("'bogus_option'", r["e"])
            self.assertIn("nothing was installed", r["e"])
            self.assertNotIn("\n", r["e"])
            self.assertEqual([r["route"], r["swapped"], r["patched"], r["used"], r["cxx"]],
                             [None, False, False, [0, 0], 0], route)
            self.assertEqual(r["again"], "python" if route == "python" else "cxx")
            # the route's warning: once, by the install() that worked
            self.assertEqual(err.count("ExpsegWarning"), 1 if route == "python" else 0, err)

    def test_the_fresh_allocator_behind_those_answers_says_nothing(self):
        # install()'s check of the configuration and the answers about an unused device come
        # from a sim allocator made for the purpose: its log lines (verbose:True names the
        # driver, a warning about the text) are not the user's; the real allocators' are
        rc, out, err = run(textwrap.dedent("""
            expseg.install(route="python")
            torch.cuda.memory_allocated(1), torch.cuda.memory_summary(1)
            print("asked", file=sys.stderr, flush=True)
            x = torch.empty(1 << 20, 0)
            """), EXPSEG_ALLOC_CONF="verbose:True,max_split_size_mb:-1")
        self.assertEqual(rc, 0, err)
        before, _, after = err.partition("asked")
        self.assertNotIn("expseg:", before)
        self.assertNotIn("sim driver", err)
        self.assertIn("expseg: device 0, host driver", after)
        self.assertIn("read as", after)  # the warning about -1, by the real allocator

    def test_record_stream_keeps_a_block_until_the_other_streams_work_is_done(self):
        # a tensor used on stream 7 and then freed is not handed out again while stream 7's
        # work is queued (a held stream: its events stay incomplete), and is once it is done
        r, _ = self.result("""
            hold = lib.expseg_testing_hold_stream
            hold.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_bool]
            expseg.install(route="python")
            x = torch.empty(1 << 20, 0)
            a = lib.expseg_torch_allocator(0, 0)
            held = hold(a, ctypes.c_void_p(7), True)
            x.record_stream(torch.cuda.Stream(7))
            px = x.data_ptr(); del x
            early = [torch.empty(1 << 20, 0) for _ in range(3)]
            ptrs = [t.data_ptr() for t in early]
            alloc = torch.cuda.memory_allocated(0)
            hold(a, ctypes.c_void_p(7), False)
            del early
            late = torch.empty(1 << 20, 0)
            print(json.dumps(dict(held=held, early=px in ptrs, alloc=alloc,
                                  late=late.data_ptr() == px)))
            """)
        self.assertEqual(r["held"], 0)
        self.assertFalse(r["early"], "the block was reused while stream 7's work was queued")
        self.assertEqual(r["alloc"], 3 << 20)
        self.assertTrue(r["late"], "the block was not reused once stream 7's work was done")

    def test_a_fraction_lowered_below_what_is_live(self):
        # PyTorch takes a fraction under what is allocated: live tensors stay, the next
        # allocation that needs new memory fails naming the fraction, and once tensors are
        # freed and the cache emptied, allocations fit under the new cap
        r, _ = self.result("""
            expseg.install(route="python")
            torch.cuda.set_per_process_memory_fraction(0.5, "cuda:0")
            live = [torch.empty(8 << 20, 0) for _ in range(3)]
            torch.cuda.set_per_process_memory_fraction(0.1, torch.device("cuda:0"))
            out = dict(fraction=torch.cuda.get_per_process_memory_fraction(0),
                       alloc=torch.cuda.memory_allocated(0))
            try:
                # larger than any free memory held (a growth's surplus may be): new memory
                torch.empty(40 << 20, 0); out["over"] = "no error"
            except RuntimeError as e:
                out["over"] = str(e)
            del live
            torch.cuda.empty_cache()
            out["emptied"] = torch.cuda.memory_reserved(0)
            small = torch.empty(4 << 20, 0)
            try:
                torch.empty(4 << 20, 0); out["past"] = "no error"
            except RuntimeError as e:
                out["past"] = str(e)
            out["reserved"] = torch.cuda.memory_reserved(0)
            print(json.dumps(out))
            """)
        self.assertEqual(r["fraction"], 0.1)
        self.assertEqual(r["alloc"], 24 << 20)
        self.assertIn("CUDA out of memory (expseg)", r["over"])
        self.assertIn("fraction 0.1", r["over"])
        self.assertEqual(r["emptied"], 0)
        self.assertIn("fraction 0.1", r["past"])
        self.assertLessEqual(r["reserved"], int(0.1 * (64 << 20)))

    def test_interpreter_exit_with_tensors_alive_is_quiet(self):
        # tensors alive on two devices, the history on, frees deferred by the safe mode and a
        # thread still allocating when the interpreter ends: PyTorch frees them during
        # shutdown, in any order; nothing may fail or print
        rc, out, err = run(textwrap.dedent("""
            import threading, time
            expseg.install(route="python", safe_record_stream=True)
            torch.cuda.memory._record_memory_history(max_entries=50)
            keep = [torch.empty(1 << 20, d) for d in (0, 1, 0)]
            gone = torch.empty(2 << 20, 1); del gone
            def spin():
                while True:
                    t = torch.empty(4096, 0); del t
                    time.sleep(0.001)
            threading.Thread(target=spin, daemon=True).start()
            time.sleep(0.05)
            print("deferred", expseg.deferred_frees(1)[0])
            """))
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.split(), ["deferred", "1"])
        # stderr holds the route's one warning, nothing else
        self.assertEqual([l for l in err.splitlines() if l.strip() and "ExpsegWarning" not in l],
                         [], err)

    def test_threads_allocating_and_asking_at_once(self):
        seed = int(os.environ.get("EXPSEG_TEST_SEED", "20261127"))
        print("test_threads_allocating_and_asking_at_once: seed %d" % seed)
        rc, out, err = run("lib = expseg._load()\n" + USED + textwrap.dedent("""
            import random, threading
            expseg.install(route="python")
            check = lib.expseg_check
            check.argtypes, check.restype = [ctypes.c_void_p], ctypes.c_int
            start, errors = threading.Barrier(6), []
            def work(seed):
                r = random.Random(seed)
                try:
                    start.wait()
                    keep = [torch.empty(4096, 1)]   # all at once: device 1's allocator
                    for i in range(200):
                        keep.append(torch.empty(r.choice([512, 4096, 256 << 10, 1 << 20]),
                                                r.choice([0, 1])))
                        if len(keep) > 8 or r.random() < 0.4:
                            t = keep.pop(r.randrange(len(keep)))
                            if r.random() < 0.3:
                                t.record_stream(torch.cuda.Stream(5 + seed % 3))
                            del t
                        k = i % 25
                        if k == 0:
                            torch.cuda.memory_stats(r.choice([0, 1]))
                        elif k == 5:
                            torch.cuda.memory._snapshot()
                        elif k == 10:
                            torch.cuda.reset_peak_memory_stats(r.choice([0, 1]))
                        elif k == 12:   # the safe mode on or off while others free
                            expseg.install(safe_record_stream=r.random() < 0.5)
                        elif k == 15:
                            torch.cuda.empty_cache()
                        elif k == 20:
                            torch.cuda.memory._record_memory_history(
                                None if r.random() < 0.5 else "all", max_entries=64)
                    keep.clear()
                except Exception as e:
                    errors.append(repr(e))
            ts = [threading.Thread(target=work, args=(SEED + i,)) for i in range(6)]
            for t in ts: t.start()
            for t in ts: t.join()
            expseg.install(safe_record_stream=False)   # completes what is deferred
            print(json.dumps(dict(errors=errors, used=used(),
                alloc=[stat(d, "allocated_bytes.all.current") for d in (0, 1)],
                count=[stat(d, "allocation.all.current") for d in (0, 1)],
                check=[check(lib.expseg_torch_allocator(d, 0)) for d in (0, 1)])))
            """).replace("SEED", str(seed)))
        self.assertEqual(rc, 0, err)
        r = json.loads(out.strip().split("\n")[-1])
        self.maxDiff = None
        self.assertEqual(r, dict(errors=[], used=[1, 1], alloc=[0, 0], count=[0, 0],
                                 check=[0, 0]), "seed %d" % seed)
        self.assertNotIn("expseg_torch:", err, "seed %d" % seed)

    def test_install_from_several_threads_at_once_installs_once(self):
        # PyTorch's CUDAPluggableAllocator loads the library with ctypes (dlopen releases
        # the GIL): threads calling install() together must not each swap the allocator and
        # patch torch (record_stream and record_function wrapped twice, the warning twice)
        rc, out, err = run(textwrap.dedent("""
            import threading, time, expseg_pytorch
            slow = torch.cuda.memory.CUDAPluggableAllocator
            class Slow(slow):
                def __init__(self, *a):
                    time.sleep(0.05)
                    slow.__init__(self, *a)
            torch.cuda.memory.CUDAPluggableAllocator = Slow
            swaps, swap = [], torch.cuda.memory.change_current_allocator
            torch.cuda.memory.change_current_allocator = lambda a: swaps.append(a) or swap(a)
            warnings.simplefilter("always")
            start, paths = threading.Barrier(4), []
            def go():
                start.wait()
                paths.append(expseg.install(route="python"))
            ts = [threading.Thread(target=go) for _ in range(4)]
            for t in ts: t.start()
            for t in ts: t.join()
            names = [(id(obj), name) for obj, name, _ in expseg_pytorch._patched]
            print(json.dumps(dict(paths=len(set(paths)), n=len(paths), swaps=len(swaps),
                                  twice=sorted({n for _, n in names if names.count((_, n)) > 1}))))
            """))
        self.assertEqual(rc, 0, err)
        r = json.loads(out.strip().split("\n")[-1])
        self.assertEqual(r, dict(paths=1, n=4, swaps=1, twice=[]))
        self.assertEqual(err.count("ExpsegWarning"), 1, err)

    def test_every_key_is_the_c_figure_and_the_forms_agree(self):
        # every key of memory_stats (private pools' included) is the C library's figure of the
        # same name; the nested form flattens back to it; memory_summary(None) is the current
        # device's; reset_accumulated_memory_stats zeroes the totals and keeps the currents
        r, _ = self.result("""
            expseg.install(route="python")
            torch.cuda.set_device(1)
            b = [torch.empty(n << 10, d) for n in (1, 700, 2048) for d in (0, 1)]
            del b[0]
            with expseg.region("w"):                  # a private pool of device 1
                a = torch.empty(3 << 20, 1)
            def flat(d, p=""):
                out = {}
                for k, v in d.items():
                    out.update(flat(v, p + k + ".") if isinstance(v, dict) else {p + k: v})
                return out
            out = dict(bad=[], summary=[])
            for dev in (0, 1, None, "cuda", torch.device("cuda", 0)):
                s = torch.cuda.memory_stats(dev)
                d = 1 if dev in (None, "cuda") else 0 if not isinstance(dev, int) else dev
                out["bad"] += [[repr(dev), k, v, stat(d, k)] for k, v in s.items()
                               if stat(d, k) != v]
                out["bad"] += [] if flat(torch.cuda.memory_stats_as_nested_dict(dev)) == dict(s) \
                    else [[repr(dev), "nested"]]
                head = torch.cuda.memory_summary(dev).split("device ID")[1]
                out["summary"].append(head.split()[0])
            import inspect  # PyTorch's _record_memory_history shows its current signature
            sig = inspect.signature(torch.cuda.memory._record_memory_history)
            out["sig"] = list(sig.parameters)
            out["pools"] = sorted({k.split(".")[1] for k in torch.cuda.memory_stats(1)
                                   if k.startswith("reserved_bytes_by_private_pools.")})
            torch.cuda.reset_accumulated_memory_stats()
            s = torch.cuda.memory_stats(1)
            out["after"] = [s["allocation.all.allocated"], s["allocation.all.freed"],
                            s["allocation.all.current"], s["allocated_bytes.all.current"],
                            torch.cuda.memory_stats(0)["allocation.all.allocated"]]
            print(json.dumps(out))
            """)
        self.assertEqual(r["bad"], [])
        self.assertEqual(r["summary"], ["0", "1", "1", "1", "0"])
        self.assertEqual(len(r["pools"]), 1)
        self.assertEqual(r["sig"][:5], ["enabled", "context", "stacks", "max_entries", "device"])
        self.assertEqual(r["after"], [0, 0, 4, (3 << 20) + (2749 << 10), 3])

    def test_too_late_says_so_and_leaves_nothing_behind(self):
        # CUDA used before install() (is_initialized), or PyTorch's own refusal to swap an
        # initialized allocator: an ExpsegError saying it came too late; PyTorch's allocator,
        # functions and record_stream are left as they were, the safe mode off, no warning
        for how in ("torch._state.initialized = True",
                    "torch.cuda.memory.change_current_allocator = refuse"):
            r, err = self.result("""
                warnings.simplefilter("always")
                def refuse(a):
                    raise RuntimeError("Can't swap an already initialized allocator")
                record_stream = torch.Tensor.record_stream
                def deferred():  # a free through the plug waits only in the safe mode
                    p = lib.expseg_torch_alloc(4096, 0, None)
                    lib.expseg_torch_free(p, 4096, 0, None)
                    return expseg.deferred_frees(0)[0]
                HOW
                out = [err(expseg.install, route="python", safe_record_stream=True)]
                u, d = used(), deferred()
                out.append(err(expseg.install))
                try:
                    torch.cuda.memory_allocated(0); patched = True
                except standin_torch.Unsupported:
                    patched = False
                print(json.dumps(dict(out=out, patched=patched, route=expseg.route(),
                    same=torch.Tensor.record_stream is record_stream,
                    used=u, swapped=torch._state.allocator is not None, deferred=d)))
                """.replace("HOW", how))
            for m in r["out"]:
                self.assertIn("came too late", m, how)
                self.assertIn("already initialized", m)
                self.assertNotIn("\n", m)
            self.assertEqual([r["patched"], r["route"], r["same"], r["used"], r["swapped"],
                              r["deferred"]], [False, None, True, [0, 0], False, 0], how)
            self.assertNotIn("ExpsegWarning", err)

    def test_a_plug_pytorch_cannot_load_is_a_one_line_error_and_nothing_stays(self):
        # PyTorch's CUDAPluggableAllocator loads the library with ctypes: OSError when the
        # file cannot be loaded, AttributeError for a function it lacks. install() says so
        # in one line and leaves the safe mode off and PyTorch as it was
        for exc in ("OSError('libexpseg_torch.so: wrong ELF class: ELFCLASS32')",
                    "AttributeError('undefined symbol: expseg_torch_alloc_raising')"):
            r, err = self.result("""
                def refuse(*a):
                    raise EXC
                torch.cuda.memory.CUDAPluggableAllocator = refuse
                e = err(expseg.install, route="python", safe_record_stream=True)
                p = lib.expseg_torch_alloc(4096, 0, None)
                lib.expseg_torch_free(p, 4096, 0, None)
                print(json.dumps(dict(e=e, route=expseg.route(), swapped=torch._state.swapped,
                                      deferred=expseg.deferred_frees(0)[0])))
                """.replace("EXC", exc))
            self.assertIn("PyTorch refused the allocator", r["e"], exc)
            self.assertIn(exc.split("'")[1], r["e"])
            self.assertNotIn("\n", r["e"])
            self.assertEqual([r["route"], r["swapped"], r["deferred"]], [None, False, 0], exc)


if __name__ == "__main__":
    unittest.main()
