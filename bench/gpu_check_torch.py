#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gpu_check_torch.py: expseg against PyTorch's own allocator, on one GPU (bench/gpu-check).

    python3 bench/gpu_check_torch.py --out torch.json [--budget SECONDS] [--steps N]

Four allocators, each piece of work in a fresh Python process (so every allocator starts from
an uninitialized CUDA state):
  pytorch      PyTorch's caching allocator
  expandable   the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  expseg-cxx   expseg.install(route="cxx")     (the C++ backend)
  expseg-py    expseg.install(route="python")  (the plug with torch.cuda's calls routed)
Pieces:
  train   a small transformer trained --steps steps (default 300) with sequence lengths that
          change every step, a side stream that reads each step's logits after
          record_stream; deterministic algorithms and one seed, so the outputs (losses, side
          sums, final weights: a SHA-256) must equal PyTorch's bit for bit. Reports the
          median step time, peak reserved and peak allocated.
  graph   a captured CUDA graph replayed while other work allocates and writes tensors;
          each replay's output must equal the eager result.
  calls   every torch.cuda memory call (memory_allocated/reserved/max_*, memory_stats,
          memory_summary, reset_peak_memory_stats, reset_accumulated_memory_stats,
          _record_memory_history/_snapshot/_dump_snapshot, empty_cache,
          set_per_process_memory_fraction), each checked for what it must say.
A route that fails (cannot install, raises, times out, differs) is reported as failed with
its message; the script itself never stops on one. Exit status 0 when every route passed, 1
when one failed, 2 for bad arguments; without torch or CUDA it prints why and exits 0 with
{"status": "skipped"}.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROUTES = ["pytorch", "expandable", "expseg-cxx", "expseg-py"]
PIECES = ["train", "graph", "calls"]
SEED = 1234


# ---------------------------------------------------------------- the child: one piece


def install(route):
    """Sets the allocator up before the first CUDA allocation; returns a note."""
    if route == "expandable":
        return "PYTORCH_CUDA_ALLOC_CONF=" + os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if route == "pytorch":
        return "PyTorch's allocator"
    import expseg  # python/ on PYTHONPATH (bench/gpu-check sets it)
    r = {"expseg-cxx": "cxx", "expseg-py": "python"}[route]
    path = expseg.install(route=r)
    return "expseg.install(route=%r): %s" % (r, path)


def tensor_bytes(torch, t):
    b = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    try:
        return b.numpy().tobytes()
    except Exception:  # PyTorch without NumPy
        return bytes(b.tolist())


def deterministic(torch):
    torch.manual_seed(SEED)
    torch.cuda.manual_seed_all(SEED)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # attention through the math kernels: the fused ones' backward is not deterministic
    for name, on in (("enable_flash_sdp", False), ("enable_mem_efficient_sdp", False),
                     ("enable_cudnn_sdp", False), ("enable_math_sdp", True)):
        fn = getattr(torch.backends.cuda, name, None)
        if fn is not None:
            fn(on)


def piece_train(torch, steps):
    import hashlib
    nn = torch.nn
    dev = torch.device("cuda")
    vocab, d, heads, layers, batch = 512, 128, 4, 2, 16

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(d, vocab)

        def forward(self, x):
            return self.head(self.enc(self.emb(x)))

    model = Model().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    gen = torch.Generator().manual_seed(SEED)
    side = torch.cuda.Stream()
    lengths = [16 + int(torch.randint(0, 241, (1,), generator=gen)) for _ in range(steps)]
    losses, side_sums, times = [], [], []
    torch.cuda.reset_peak_memory_stats()
    for i, n in enumerate(lengths):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x = torch.randint(0, vocab, (batch, n), generator=gen).to(dev)
        y = torch.roll(x, -1, dims=1)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        # a side stream reads the logits; the main stream drops them right away
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            s = logits.detach().float().abs().sum()
        logits.record_stream(side)
        del logits
        side_sums.append(s)
        losses.append(loss.detach())
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    h = hashlib.sha256()
    for t in losses + side_sums + list(model.parameters()):
        h.update(tensor_bytes(torch, t))
    warm = sorted(times[10:] or times)
    return {
        "steps": steps,
        "sequence_lengths": [min(lengths), max(lengths)],
        "step_ms": 1e3 * warm[len(warm) // 2],
        "step_ms_p99": 1e3 * warm[min(len(warm) - 1, int(len(warm) * 0.99))],
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "final_loss": float(losses[-1].item()),
        "outputs_sha256": h.hexdigest(),
    }


def piece_graph(torch):
    import hashlib
    dev = torch.device("cuda")
    net = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(),
                              torch.nn.Linear(1024, 256)).to(dev)
    static_in = torch.randn(64, 256, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture, as PyTorch's docs do
        for _ in range(3):
            net(static_in)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = net(static_in)
    gen = torch.Generator().manual_seed(SEED)
    bad, held, h = 0, [], hashlib.sha256()
    replays = 50
    for i in range(replays):
        static_in.copy_(torch.randn(64, 256, generator=gen).to(dev))
        g.replay()
        # other work allocates (and frees) between and around the replays
        n = int(torch.randint(1, 1 << 20, (1,), generator=gen))
        t = torch.full((n,), float(i), device=dev)
        held.append(t)
        if len(held) > 8:
            held.pop(0)
        with torch.no_grad():
            want = net(static_in)
        if not torch.equal(want, static_out):
            bad += 1
        h.update(tensor_bytes(torch, static_out))
        for k, t in enumerate(held):
            if float(t[0].item()) != float(i - len(held) + 1 + k):
                bad += 1
    torch.cuda.synchronize()
    del g
    return {"replays": replays, "mismatches": bad, "outputs_sha256": h.hexdigest(),
            "ok": bad == 0}


def piece_calls(torch, tmp, route):
    """Each call: {"ok": bool, "value" or "error"}; what it must say is asserted."""
    res = {}

    def call(name, fn, check=None):
        try:
            v = fn()
            ok = True if check is None else bool(check(v))
            res[name] = {"ok": ok, "value": v if isinstance(v, (int, float, bool, str, type(None)))
                         else type(v).__name__}
            if not ok:
                res[name]["error"] = "unexpected value %r" % (v if not isinstance(v, (dict, list)) else
                                                               type(v).__name__)
        except Exception as e:  # a route that lacks the call: recorded, never fatal
            res[name] = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        return res[name].get("value")

    cuda = torch.cuda
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # 64 MiB live
    x.fill_(1)
    cuda.synchronize()
    call("memory_allocated", cuda.memory_allocated, lambda v: v >= 64 << 20)
    call("memory_reserved", cuda.memory_reserved, lambda v: v >= cuda.memory_allocated())
    call("max_memory_allocated", cuda.max_memory_allocated, lambda v: v >= 64 << 20)
    call("max_memory_reserved", cuda.max_memory_reserved, lambda v: v >= 64 << 20)
    call("memory_stats", cuda.memory_stats,
         lambda v: isinstance(v, dict) and v.get("allocated_bytes.all.current", 0) >= 64 << 20)
    call("memory_summary", cuda.memory_summary, lambda v: isinstance(v, str) and len(v) > 0)
    y = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    del y
    call("reset_peak_memory_stats", cuda.reset_peak_memory_stats)
    call("max_memory_allocated_after_reset", cuda.max_memory_allocated,
         lambda v: v == cuda.memory_allocated())
    call("reset_accumulated_memory_stats", cuda.reset_accumulated_memory_stats)
    call("memory_stats_after_accumulated_reset", cuda.memory_stats,
         lambda v: v.get("allocation.all.allocated", 0) == 0)
    call("_record_memory_history", lambda: cuda.memory._record_memory_history(max_entries=10000))
    z = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    call("_snapshot", cuda.memory._snapshot,
         lambda v: isinstance(v, dict) and "segments" in v and any(
             b.get("size", 0) >= 8 << 20 for s in v["segments"] for b in s.get("blocks", [])))
    path = os.path.join(tmp, "snapshot.pickle")
    call("_dump_snapshot", lambda: cuda.memory._dump_snapshot(path),
         lambda v: os.path.getsize(path) > 0)
    call("_record_memory_history_off", lambda: cuda.memory._record_memory_history(enabled=None))
    del z
    before = cuda.memory_reserved()
    call("empty_cache", cuda.empty_cache, lambda v: cuda.memory_reserved() <= before)
    free, total = cuda.mem_get_info()
    call("set_per_process_memory_fraction", lambda: cuda.set_per_process_memory_fraction(0.25))

    def over_fraction():
        try:
            t = torch.empty(int(total * 0.5), dtype=torch.uint8, device="cuda")
            del t
            return "no error"
        except torch.cuda.OutOfMemoryError:
            return "OutOfMemoryError"
        except RuntimeError as e:  # the Python route: PyTorch's pluggable allocator can only
            if "CUDA out of memory (expseg)" not in str(e):  # pass on a C++ exception
                raise
            return "RuntimeError: " + " ".join(str(e).split())[:300]

    want = ("OutOfMemoryError", "RuntimeError: CUDA out of memory (expseg)")
    call("fraction_refuses_half_the_device", over_fraction,
         lambda v: v.startswith(want[1] if route == "expseg-py" else want[0]))
    call("set_per_process_memory_fraction_back", lambda: cuda.set_per_process_memory_fraction(1.0))
    del x
    failed = sorted(k for k, v in res.items() if not v["ok"])
    return {"calls": res, "failed_calls": failed, "ok": not failed}


def child(route, piece, steps, out):
    result = {"route": route, "piece": piece}
    try:
        note = install(route)  # before torch touches CUDA
        import torch
        result["install"] = note
        deterministic(torch)
        with tempfile.TemporaryDirectory() as tmp:
            if piece == "install":
                torch.empty(1, device="cuda")
                result["ok"] = True
            elif piece == "train":
                result.update(piece_train(torch, steps))
                result["ok"] = True
            elif piece == "graph":
                result.update(piece_graph(torch))
            else:
                result.update(piece_calls(torch, tmp, route))
        result["status"] = "passed" if result.get("ok") else "failed"
    except Exception as e:
        msg = " ".join(("%s: %s" % (type(e).__name__, e)).split())[:600]
        if route == "expseg-py" and piece == "graph" and "cannot capture CUDA graphs" in msg:
            # documented: the Python route refuses a capture before it starts (no private pool)
            result.update(status="passed", ok=True, refused=msg)
        else:
            result["status"] = "failed"
            result["error"] = msg
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


# ---------------------------------------------------------------- the parent


def run_child(route, piece, steps, timeout, tmp):
    out = os.path.join(tmp, "%s-%s.json" % (route, piece))
    env = dict(os.environ)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if route == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", route, piece, "--steps",
           str(steps), "--out", out]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, cwd=tmp, timeout=timeout, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True)
        tail = p.stdout[-800:]
        rc = p.returncode
    except subprocess.TimeoutExpired as e:
        return {"status": "failed", "error": "timed out after %d s" % timeout,
                "seconds": round(time.time() - t0, 1)}
    try:
        with open(out) as f:
            r = json.load(f)
    except (OSError, ValueError):
        r = {"status": "failed",
             "error": "the process ended with status %d and no result: %s" % (rc, " ".join(tail.split())[-400:])}
    r["seconds"] = round(time.time() - t0, 1)
    return r


def main():
    ap = argparse.ArgumentParser(description="expseg against PyTorch's allocator on one GPU")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=int, default=300)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--routes", default=",".join(ROUTES))
    ap.add_argument("--child", nargs=2, metavar=("ROUTE", "PIECE"))
    a = ap.parse_args()
    if a.child:
        return child(a.child[0], a.child[1], a.steps, a.out)
    routes = [r for r in a.routes.split(",") if r]
    bad = [r for r in routes if r not in ROUTES]
    if bad or a.budget < 10 or not 10 <= a.steps <= 100000:
        print("gpu_check_torch: --routes takes %s; --budget from 10 s; --steps from 10 (got %s, %d, %d)"
              % (",".join(ROUTES), a.routes, a.budget, a.steps), file=sys.stderr)
        return 2
    report = {"status": "skipped"}
    try:
        import torch
        report.update(torch_version=torch.__version__, cuda=torch.version.cuda)
        if not torch.cuda.is_available():
            report["why"] = "torch.cuda.is_available() is False"
    except ImportError as e:
        report["why"] = "import torch failed: %s" % e
    if "why" in report:
        print("skipped: " + report["why"])
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
        return 0
    report["device"] = torch.cuda.get_device_name(0)
    report["status"] = "ran"
    report["steps"] = a.steps
    t_end = time.time() + a.budget
    report["routes"] = {r: {"status": "passed"} for r in routes}
    with tempfile.TemporaryDirectory() as tmp:
        # expseg's C++ backend may be compiled on first use: that gets its own, longer, step
        jobs = [(r, "install") for r in routes if r == "expseg-cxx"]
        jobs += [(r, p) for p in PIECES for r in routes]  # every route's train first
        for i, (route, piece) in enumerate(jobs):
            rr = report["routes"].setdefault(route, {"status": "passed"})
            left = t_end - time.time()
            weight = {"install": 4.0, "train": 2.0}.get(piece, 0.75)
            share = max(10, int(left / max(1, len(jobs) - i) * weight))
            if left < 10:
                rr[piece] = {"status": "skipped", "error": "budget spent"}
                continue
            r = run_child(route, piece, a.steps, min(share, int(left)), tmp)
            rr[piece] = r
            print("%-11s %-6s %-7s %5.1f s %s" % (route, piece, r.get("status"), r.get("seconds", 0),
                                                r.get("error", "")), flush=True)
    # bit-for-bit: every route's outputs against PyTorch's own allocator
    base = report["routes"].get("pytorch", {})
    for route, rr in report["routes"].items():
        same = []
        for piece in ("train", "graph"):
            mine, ref = rr.get(piece, {}), base.get(piece, {})
            if mine.get("outputs_sha256") and ref.get("outputs_sha256"):
                same.append(mine["outputs_sha256"] == ref["outputs_sha256"])
        rr["same_outputs_as_pytorch"] = all(same) if same else None
        errs = ["%s: %s" % (p, rr[p].get("error") or ",".join(rr[p].get("failed_calls", [])) or "failed")
                for p in ["install"] + PIECES if isinstance(rr.get(p), dict) and rr[p].get("status") == "failed"]
        if rr["same_outputs_as_pytorch"] is False:
            errs.append("outputs differ from PyTorch's allocator")
        rr["status"] = "failed" if errs else ("passed" if all(
            rr.get(p, {}).get("status") == "passed" for p in PIECES) else "incomplete")
        if errs:
            rr["error"] = "; ".join(errs)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print("routes: " + " ".join("%s=%s" % (r, v["status"]) for r, v in report["routes"].items()))
    return 0 if all(v["status"] == "passed" for v in report["routes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
