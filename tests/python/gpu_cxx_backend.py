# SPDX-License-Identifier: Apache-2.0
"""gpu_cxx_backend.py: the C++ backend under real PyTorch on a GPU (CTest gpu_cxx_backend,
label gpu). Builds or finds the backend (python/_expseg_cxx.py), installs it, then drives
every PyTorch memory call it serves and prints one line per check; exits 0 when all pass, 1
when one fails, 77 (skipped) without PyTorch or a GPU.

    python3 tests/python/gpu_cxx_backend.py [path/to/libexpseg_torch.so]
"""

import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

try:
    import torch
except ImportError:
    print("SKIP: PyTorch is not installed")
    sys.exit(77)
if not torch.cuda.is_available():
    print("SKIP: PyTorch sees no GPU")
    sys.exit(77)

import _expseg_cxx  # noqa: E402
import expseg  # noqa: E402

MiB = 1 << 20
failed = []


def check(name):
    def run(fn):
        try:
            fn()
            print("ok   %s" % name)
        except Exception as e:  # report every check, then fail at the end
            failed.append(name)
            print("FAIL %s: %s: %s" % (name, type(e).__name__, " ".join(str(e).split())[:500]))
            traceback.print_exc(limit=3)
        return fn
    return run


lib = sys.argv[1] if len(sys.argv) > 1 else expseg.library_path()
print("torch %s, libexpseg_torch %s" % (torch.__version__, lib))
assert _expseg_cxx.install(lib) is True, "install() did not return True"
print("backend %s" % _expseg_cxx.installed_path())


@check("the allocator is expseg")
def _():
    assert torch.cuda.get_allocator_backend() == "expseg", torch.cuda.get_allocator_backend()


@check("tensors, memory_stats match expseg's statistics")
def _():
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    s = torch.cuda.memory_stats()
    assert s["allocated_bytes.all.current"] >= 256 * MiB, s["allocated_bytes.all.current"]
    e = expseg.memory_stats(0)
    for k, v in s.items():
        if k in e and not k.startswith("expseg."):
            assert e[k] == v, (k, e[k], v)
    del x


@check("raw alloc and delete with a stream")
def _():
    s = torch.cuda.Stream()
    before = torch.cuda.memory_allocated()
    p = torch.cuda.caching_allocator_alloc(3 * MiB, stream=s)
    assert torch.cuda.memory_allocated() >= before + 3 * MiB
    torch.cuda.caching_allocator_delete(p)
    assert torch.cuda.memory_allocated() == before


@check("record_stream keeps a block pending until the stream's work is done")
def _():
    side = torch.cuda.Stream()
    y = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
    with torch.cuda.stream(side):
        torch.cuda._sleep(10_000_000)
        y.add_(1)
    y.record_stream(side)
    del y
    torch.cuda.synchronize()


@check("empty_cache gives memory back")
def _():
    x = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
    del x
    held = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() < held, (held, torch.cuda.memory_reserved())


@check("reset_peak_memory_stats")
def _():
    x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    del x
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()


@check("memory fraction, out of memory, OOM observer")
def _():
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *a: seen.append(a))
    torch.cuda.set_per_process_memory_fraction(0.25)
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        torch.empty(total // 2, dtype=torch.uint8, device="cuda")
        raise AssertionError("no OutOfMemoryError over the fraction")
    except torch.cuda.OutOfMemoryError as e:
        assert "expseg" in str(e), str(e)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert seen, "the observer was not called"


@check("history and snapshot, Python frames on live blocks")
def _():
    torch.cuda.memory._record_memory_history(max_entries=100000)
    z = torch.randn(1024, 1024, device="cuda")
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    blocks = [b for s in snap["segments"] for b in s["blocks"] if b["address"] == z.data_ptr()]
    assert blocks and blocks[0]["state"] == "active_allocated", blocks
    assert any(f["filename"].endswith("gpu_cxx_backend.py") for f in blocks[0]["frames"]), blocks
    trace = snap["device_traces"][0]
    assert any(t["action"] == "alloc" and t["addr"] == z.data_ptr() for t in trace)


@check("history with skip_actions (PyTorch releases that take it)")
def _():
    import inspect
    if "skip_actions" not in inspect.signature(torch.cuda.memory._record_memory_history).parameters:
        print("     (this PyTorch has no skip_actions)")
        return
    torch.cuda.memory._record_memory_history(max_entries=100000, skip_actions=["alloc"])
    z = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
    addr = z.data_ptr()
    del z
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][0]
    assert not any(t["action"] == "alloc" for t in trace), "alloc was to be left out"
    assert any(t["action"] == "free_requested" and t["addr"] == addr for t in trace), trace[-4:]
    raised = None
    try:  # PyTorch may refuse it itself, before the backend
        torch.cuda.memory._record_memory_history(max_entries=10, skip_actions=["no_such_action"])
    except Exception as e:
        raised = e
    torch.cuda.memory._record_memory_history(enabled=None)
    assert raised is not None, "an unknown skip_actions name was accepted"


@check("MemPool and use_mem_pool")
def _():
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        w = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
    assert pool.use_count() >= 1, pool.use_count()
    del w


@check("CUDA graph capture and replay")
def _():
    a = torch.randn(1 << 20, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        (a * 2).sum()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = a * 2
    a.fill_(3)
    g.replay()
    torch.cuda.synchronize()
    assert out[0].item() == 6.0


@check("a small training loop")
def _():
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(20):
        loss = model(torch.randn(256, 1024, device="cuda")).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    assert torch.isfinite(loss).item()


print("%d failed: %s" % (len(failed), ", ".join(failed)) if failed else "PASS")
sys.exit(1 if failed else 0)
