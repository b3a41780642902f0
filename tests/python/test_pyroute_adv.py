# SPDX-License-Identifier: Apache-2.0
"""test_pyroute_adv.py: expseg.install()'s Python route under calls a user makes that the
route's own tests (test_pyroute.py) do not: figures asked of a device no tensor has used, a
configuration the library refuses, record_stream against a stream whose work is still
queued, a memory fraction lowered below what is live, teardown at interpreter exit and
several threads at once. The stand-in torch and the child interpreters are test_pyroute.py's
(run by CTest as python_route_adv)."""

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
            before = dict(alloc=torch.cuda.memory_allocated(), stats=len(torch.cuda.memory_stats()),
                          used=used())
            x = torch.empty(3 << 20, 0)
            calls = ("memory_allocated", "max_memory_allocated", "memory_reserved",
                     "max_memory_reserved", "reset_peak_memory_stats",
                     "reset_accumulated_memory_stats", "reset_max_memory_allocated")
            got = {name: getattr(torch.cuda, name)(dev) for name in calls
                   for dev in (1, "cuda:1", torch.device("cuda", 1))}
            idle = torch.cuda.memory_stats(1)
            nested = torch.cuda.memory_stats_as_nested_dict(torch.device("cuda:1"))
            acc = torch.accelerator.memory_allocated(1)
            after = used()
            live = torch.cuda.memory_stats(0)
            y = torch.empty(1 << 20, 1)              # now device 1 has an allocator
            print(json.dumps(dict(before=before, got=sorted(set(map(str, got.values()))),
                after=after, acc=acc, keys=list(idle) == list(live), cls=type(idle).__name__,
                nonzero={k: v for k, v in idle.items() if v and k != "max_split_size"},
                split=[idle["max_split_size"], live["max_split_size"]],
                nested=nested["allocated_bytes"]["all"]["current"],
                later=[used(), torch.cuda.memory_allocated(1),
                       stat(1, "allocated_bytes.all.current")])))
            """)
        self.assertEqual(r["before"], dict(alloc=0, stats=r["before"]["stats"], used=[0, 0]))
        self.assertGreater(r["before"]["stats"], 100)
        self.assertEqual(r["got"], ["0", "None"])
        self.assertEqual(r["after"], [1, 0], "a question about device 1 created its allocator")
        self.assertEqual(r["acc"], 0)
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


if __name__ == "__main__":
    unittest.main()
