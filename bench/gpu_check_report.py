#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gpu_check_report.py: the report of bench/gpu-check, from what its parts left in a work folder.

Reads WORK/parts.tsv (name, status, seconds, note per part) and the parts' outputs
(driver.json, device.json (the "allocator" section), grow.jsonl, hit.jsonl, sleep.json, replay.jsonl, ctest.out, torch.json, each
optional) and writes OUT/gpu-check.json (every figure and every part's status, the device and
driver version, "double": true with timings labelled meaningless when the CUDA driver double
ran) and OUT/summary.txt (a short text summary). Standard library only. Exit status 0, or 2
when WORK has no parts.tsv.
"""

import argparse
import json
import os
import re
import sys

MEANINGLESS = "meaningless: the CUDA driver double ran (no GPU); figures test the plumbing only"


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"unreadable": "%s: %s" % (os.path.basename(path), e)} if os.path.exists(path) else None


def read_jsonl(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        return None
    return rows


def read_parts(path):
    parts = {}
    with open(path) as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) < 3:
                continue
            name, status, seconds = cols[0], cols[1], cols[2]
            note = cols[3] if len(cols) > 3 else ""
            # a part recorded twice (a sub-step skipped, then the part): keep the worst
            rank = {"failed": 2, "passed": 1, "skipped": 0}
            old = parts.get(name)
            if old is None or rank.get(status, 0) >= rank.get(old["status"], 0):
                parts[name] = {"status": status, "seconds": int(seconds or 0), "note": note}
    return parts


def ctest_summary(path):
    try:
        text = open(path).read()
    except OSError:
        return None
    m = re.search(r"(\d+)% tests passed, (\d+) tests failed out of (\d+)", text)
    failed = re.findall(r"^\s*\d+ - (\S+).*? \((Failed|Timeout|SEGFAULT|Exception|Subprocess aborted)\)$",
                        text, re.M)
    skipped = re.findall(r"^\s*\d+ - (\S+).*? \(Skipped\)$", text, re.M)
    out = {"failed_tests": [f[0] for f in failed], "skipped_tests": skipped}
    if m:
        out.update(total=int(m.group(3)), failed=int(m.group(2)))
    return out


def fmt_us(v):
    return "%.1f" % v if isinstance(v, (int, float)) else "-"


def summary_lines(rep):
    L = []
    L.append("expseg gpu-check: %s (driver %s)" % (rep["device"], rep["driver_version"]))
    if rep["double"]:
        L.append("timings: " + MEANINGLESS)
    L.append("budget %d s, took %d s; driver spec %s" % (rep["budget_s"], rep["seconds"],
                                                         rep["driver_spec"]))
    L.append("")
    for name, p in rep["parts"].items():
        L.append("%-8s %-7s %4d s  %s" % (name, p["status"], p["seconds"], p["note"])[:200])
    d = rep.get("driver")
    if isinstance(d, dict) and d.get("sizes"):
        L.append("")
        L.append("driver calls, median / p99 us (granularity %s KiB):" % (d.get("granularity", 0) // 1024))
        calls = ["reserve", "create", "map", "set_access", "unmap", "release", "cudaMalloc", "cudaFree"]
        L.append("  %8s " % "MiB" + " ".join("%17s" % c for c in calls))
        for s in d["sizes"]:
            if not s.get("measured"):
                L.append("  %8d  not measured (larger than free memory)" % s["mib"])
                continue
            L.append("  %8d " % s["mib"] + " ".join(
                "%17s" % ("%s/%s" % (fmt_us(s[c]["median_us"]), fmt_us(s[c]["p99_us"])) if c in s else "-")
                for c in calls))
        for p in d.get("set_access_pages", []):
            if p.get("measured"):
                L.append("  set_access over %d pages: %s / %s us" % (p["pages"], fmt_us(p["median_us"]),
                                                                   fmt_us(p["p99_us"])))
        uw = d.get("unmap_wait", {})
        if uw.get("status") == "ok":
            L.append("  unmap while another stream is held %d ms: %.3f ms: %s" % (
                uw["hold_ms"], uw["unmap_ms"], "waits" if uw["unmap_waits"] else "does not wait"))
        elif uw:
            L.append("  unmap wait: %s %s" % (uw.get("status"), uw.get("why", "")))
        if d.get("cudart", {}).get("status") not in (None, "ok", "not asked"):
            L.append("  cudaMalloc: %s" % d["cudart"].get("why"))
    dev = rep.get("allocator")
    if isinstance(dev, dict):
        r = dev.get("random") or {}
        if r:
            L.append("")
            L.append("allocator on device memory: %s ops, %s bytes checked, %s mismatches, %s" % (
                r.get("ops"), r.get("checked_bytes"), r.get("mismatches"), "ok" if r.get("ok") else
                "FAILED " + str(r.get("why"))))
        o = dev.get("oom") or {}
        if "blocks" in o:
            L.append("out of memory after %s blocks of %d MiB: failing malloc %.3f ms, %s" % (
                o["blocks"], o["block_bytes"] >> 20, o["failing_malloc_ms"], o["status"]))
        for g in dev.get("grow") or []:
            L.append("grow %.0f us/GiB, shrink %.0f us/GiB  [%s]" % (
                g["grow_ns_per_gib"] / 1e3, g["shrink_ns_per_gib"] / 1e3, g["config"]))
        for h in dev.get("hit") or []:
            L.append("hit pair (malloc+free) with %d live: median %.1f ns, p99 %.1f ns" % (
                h["live"], h["median_ns"], h["p99_ns"]))
    sl = rep.get("sleep")
    if isinstance(sl, dict) and "sleep_ms" in sl:
        gib = sl["size_bytes"] / 2**30
        L.append("")
        L.append("sleep (offload) and wake of a %.2f GiB region, median of %d rounds:" % (gib, sl["rounds"]))
        L.append("  sleep %.1f ms (copy %.1f), wake %.1f ms (copy %.1f); first round: sleep %.1f ms, wake %.1f ms" % (
            sl["sleep_ms"], sl["sleep_copy_ms"], sl["wake_ms"], sl["wake_copy_ms"],
            sl["first_sleep_ms"], sl["first_wake_ms"]))
        if sl.get("floor_d2h_ms"):
            L.append("  floor: device -> host %.1f ms (%.1f GB/s), host -> device %.1f ms (%.1f GB/s); "
                     "sleep + wake / floor %.2f" % (
                         sl["floor_d2h_ms"], sl["size_bytes"] / sl["floor_d2h_ms"] / 1e6,
                         sl["floor_h2d_ms"], sl["size_bytes"] / sl["floor_h2d_ms"] / 1e6,
                         (sl["sleep_ms"] + sl["wake_ms"]) / (sl["floor_d2h_ms"] + sl["floor_h2d_ms"])))
        if sl.get("same_work_d2h_ms"):
            L.append("  same-work floor (sleep): device -> host into a region-sized pinned buffer "
                     "%.1f ms (%.1f GB/s); sleep copy / that %.2f" % (
                         sl["same_work_d2h_ms"], sl["size_bytes"] / sl["same_work_d2h_ms"] / 1e6,
                         sl["sleep_copy_ms"] / sl["same_work_d2h_ms"]))
        elif sl.get("same_work"):
            L.append("  same-work floor (sleep): %s" % sl["same_work"])
        L.append("  bytes checked %d, mismatches %d" % (sl.get("checked_bytes", 0), sl.get("mismatches", 0)))
    rp = rep.get("replay")
    if isinstance(rp, list) and rp:
        L.append("")
        L.append("replays (driver %s): %d histories" % (rep["driver_spec"], len(rp)))
        for r in rp:
            L.append("  %-50s peak reserved %8.1f MiB (ratio %.3f), %d ooms, modelled driver %.1f ms" % (
                r.get("trace", "?")[:50], r.get("peak_reserved", 0) / 2**20, r.get("ratio", 0),
                r.get("num_ooms", 0), r.get("driver_ms", 0)))
    t = rep.get("torch")
    if isinstance(t, dict) and t.get("routes"):
        L.append("")
        L.append("PyTorch %s:" % t.get("torch_version", "?"))
        for name, r in t["routes"].items():
            tr = r.get("train") or {}
            L.append("  %-12s %-7s step %s ms, peak reserved %s MiB, peak allocated %s MiB, same outputs: %s%s" % (
                name, r.get("status"), fmt_us(tr.get("step_ms")),
                fmt_us(tr["peak_reserved"] / 2**20) if "peak_reserved" in tr else "-",
                fmt_us(tr["peak_allocated"] / 2**20) if "peak_allocated" in tr else "-",
                r.get("same_outputs_as_pytorch", "-"),
                ("  (" + r["error"] + ")")[:160] if r.get("error") else ""))
    return L


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--double", type=int, default=0)
    ap.add_argument("--device", default="")
    ap.add_argument("--driver-version", default="")
    ap.add_argument("--budget", type=int, default=0)
    ap.add_argument("--seconds", type=int, default=0)
    ap.add_argument("--spec", default="cuda")
    a = ap.parse_args()
    tsv = os.path.join(a.work, "parts.tsv")
    if not os.path.exists(tsv):
        print("gpu_check_report: %s is missing" % tsv, file=sys.stderr)
        return 2
    w = lambda n: os.path.join(a.work, n)
    rep = {
        "schema": 1,
        "double": bool(a.double),
        "timings": MEANINGLESS if a.double else "measured on the device named",
        "device": a.device,
        "driver_version": a.driver_version,
        "driver_spec": a.spec,
        "budget_s": a.budget,
        "seconds": a.seconds,
        "parts": read_parts(tsv),
        "ctest": ctest_summary(w("ctest.out")),
        "driver": read_json(w("driver.json")),
        "allocator": None,
        "replay": read_jsonl(w("replay.jsonl")),
        "torch": read_json(w("torch.json")),
        "sleep": read_json(w("sleep.json")),
        "cost_table": None,
    }
    dev = read_json(w("device.json"))
    grow, hit = read_jsonl(w("grow.jsonl")), read_jsonl(w("hit.jsonl"))
    if dev is not None or grow or hit:
        rep["allocator"] = dict(dev or {}, grow=grow or [], hit=hit or [])
    costs = os.path.join(a.out, "driver-costs.txt")
    if os.path.exists(costs):
        rep["cost_table"] = {"file": "driver-costs.txt",
                             "lines": [l.rstrip("\n") for l in open(costs) if l.strip()]}
    if a.double:
        for k in ("driver", "allocator", "sleep", "torch"):
            if isinstance(rep[k], dict):
                rep[k]["timings"] = MEANINGLESS
    with open(os.path.join(a.out, "gpu-check.json"), "w") as f:
        json.dump(rep, f, indent=1, sort_keys=False)
        f.write("\n")
    with open(os.path.join(a.out, "summary.txt"), "w") as f:
        f.write("\n".join(summary_lines(rep)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
