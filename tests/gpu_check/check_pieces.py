#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""check_pieces.py: the pieces of bench/gpu-check, each run quickly on a driver that needs no GPU.

    check_pieces.py PIECE BENCH_DIR SOURCE_DIR [SPEC]

PIECE: driver (expseg-bench-driver: skipped sizes, the page sweep, unmap while a stream is
held, the JSON, a cost table expseg-replay accepts), device (expseg-bench-device: bytes
checked, out of memory, nothing leaked; sim refused; expseg-bench-hit: a row per live count,
none for a live set that does not fit), sleep (expseg-bench-sleep: a region
slept and woken, every byte checked, the copy time within each, the floor measured, the
JSON; sim gives calls only), report (gpu_check_report.py over a
made-up work folder: statuses, the double's label, the summary), args (bench/gpu-check
refuses bad arguments with a message). SPEC: the driver (default host:capacity=256M). Exit 0
when every assertion holds; otherwise the first failed one is printed and the status is 1.
"""
import json
import os
import subprocess
import sys
import tempfile


def run(cmd, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, **kw)
    print("$ %s -> %d\n%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:]))
    return p


def check(cond, what):
    if not cond:
        print("FAILED: " + what)
        sys.exit(1)


def piece_driver(bench, src, spec, tmp):
    j, c = os.path.join(tmp, "d.json"), os.path.join(tmp, "costs.txt")
    p = run([os.path.join(bench, "expseg-bench-driver"), "--driver", spec, "--rounds", "5",
             "--sizes", "2,20,512", "--pages", "1,4", "--unmap-wait", "100", "--json", j,
             "--costs-out", c])
    check(p.returncode == 0, "expseg-bench-driver exits 0")
    d = json.load(open(j))
    sizes = d["sizes"]  # in the order asked (rounded up to the granularity)
    check(sizes[0]["measured"] and sizes[1]["measured"], "2 and 20 MiB measured")
    check(not sizes[2]["measured"], "512 MiB (more than the 256 MiB free) skipped")
    for k in ("reserve", "create", "map", "set_access", "unmap", "release"):
        s = sizes[0][k]
        check(0 < s["median_us"] <= s["p99_us"], "%s: 0 < median <= p99" % k)
    check([p["pages"] for p in d["set_access_pages"] if p["measured"]] == [1, 4], "pages 1 and 4")
    w = d["unmap_wait"]
    if spec.startswith(("host", "sim")):
        check(w["status"] == "ok" and w["stream_was_busy"] and not w["unmap_waits"],
              "a held stream is busy and unmap does not wait for it (host)")
        check(w["unmap_ms"] < 50, "unmap took less than half the hold")
    else:  # cuda: the hold is cuStreamWaitValue32; whether unmap waits is the driver's to say
        check(w["status"] == "ok" and w["stream_was_busy"], "the cuda hold keeps the stream busy")
    check(d["cudart"] == {"status": "not asked"}, "cudart not asked")
    lines = [l.split() for l in open(c) if l.strip() and not l.startswith("#")]
    kinds = {l[0] for l in lines}
    for k in ("reserve", "create", "release", "map", "unmap", "set_access"):
        check(k in kinds and k + ".page" in kinds, "cost table has %s and %s.page" % (k, k))
    check(all(float(l[1]) >= 0 for l in lines), "costs are not negative")
    p = run([os.path.join(bench, "expseg-replay"), "--synth", "infer:1:0.05", "--costs", c, "--json",
             "--quiet"])
    check(p.returncode == 0, "expseg-replay reads the cost table")
    p = run([os.path.join(bench, "expseg-bench-driver"), "--driver", spec, "--pages", "0,4"])
    check(p.returncode == 2 and "--pages" in p.stdout, "--pages 0,4 refused with a message")


def piece_device(bench, src, spec, tmp):
    j = os.path.join(tmp, "dev.json")
    p = run([os.path.join(bench, "expseg-bench-device"), "--driver", spec, "--ops", "1500",
             "--seed", "7", "--json", j])
    check(p.returncode == 0, "expseg-bench-device exits 0")
    check("seed 7" in p.stdout, "the seed is printed")
    d = json.load(open(j))
    r, o = d["random"], d["oom"]
    check(r["ok"] and r["mismatches"] == 0 and r["checked_bytes"] > 0 and r["frees"] == r["mallocs"],
          "random: bytes checked, no mismatch, every block freed")
    check(o["ok"] and o["status"] == "EXPSEG_ERR_OUT_OF_MEMORY" and o["blocks"] >= 1 and
          "out of memory" in o["message"], "fill to out of memory: OOM with a message")
    check(d["leaked"] is False, "nothing left with the driver")
    p = run([os.path.join(bench, "expseg-bench-device"), "--driver", "sim"])
    check(p.returncode == 2 and "sim driver has no bytes" in p.stdout, "sim refused with a message")
    if not spec.startswith("host"):
        return
    # the hit pair: a row per live count; a run that cannot build its live set has no row
    # (its own capacity: the synthetic sizes it times reach 264 MiB)
    hit, spec = os.path.join(bench, "expseg-bench-hit"), "host:capacity=2G"
    p = run([hit, "--driver", spec, "--batches", "200", "--live", "0,100", "--max-live-size",
             "65536", "--json"])
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    check(p.returncode == 0 and [r["live"] for r in rows] == [0, 100] and
          all(r["median_ns"] > 0 and r["device_allocs_timed"] == 0 for r in rows),
          "expseg-bench-hit: one row per live count, every timed pair a hit")
    p = run([hit, "--driver", spec, "--batches", "200", "--live", "0,100000", "--json"])
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    check(p.returncode == 1 and [r["live"] for r in rows] == [0] and
          "building the live set" in p.stdout and "a timed malloc failed" not in p.stdout,
          "expseg-bench-hit: a live set that does not fit is an error with no row for it")


def piece_sleep(bench, src, spec, tmp):
    j = os.path.join(tmp, "sleep.json")
    p = run([os.path.join(bench, "expseg-bench-sleep"), "--driver", spec, "--size", "96",
             "--block", "16", "--rounds", "2", "--json", j])
    check(p.returncode == 0, "expseg-bench-sleep exits 0")
    d = json.load(open(j))
    check(d["bytes"] is True and d["size_bytes"] == 96 << 20 and d["rounds"] == 2, "size and rounds")
    # every byte checked after the last wake, both ends of every block after the first
    check(d["mismatches"] == 0 and d["checked_bytes"] == (96 << 20) + 6 * 2 * 4096,
          "bytes checked: %s, mismatches %s" % (d["checked_bytes"], d["mismatches"]))
    check(0 < d["sleep_copy_ms"] <= d["sleep_ms"] and 0 < d["wake_copy_ms"] <= d["wake_ms"],
          "the copy time is measured and part of each sleep and wake")
    check(d["floor_d2h_ms"] > 0 and d["floor_h2d_ms"] > 0, "the floor is measured")
    # a 96 MiB region is far below a quarter of free host memory: the same-work floor is on
    check(d["same_work"] == "measured" and d["same_work_d2h_ms"] > 0 and
          d["same_work_bytes"] == 96 << 20, "the same-work floor is measured: %s" % d["same_work"])
    check("same-work floor (sleep): device -> host into a region-sized" in p.stdout,
          "the same-work floor is printed")
    check(d["same_work_second_d2h_ms"] > 0 and "sleep copy / first pass" in p.stdout,
          "the same-work floor's second pass is measured and printed")
    # the last round's sleep copies into the host copies kept from the first: already faulted
    # in (the driver's memory is mapped and populated too), so the sleep takes next to no page
    # fault (a few of the allocator's own bookkeeping at most; thousands if its 96 MiB of host
    # copies were new, or faulted by the copy)
    if spec.startswith("host"):
        check(0 <= d["sleep_minflt"] < 64 and d["wake_minflt"] >= 0,
              "minor faults: sleep %s (kept host copies), wake %s"
              % (d["sleep_minflt"], d["wake_minflt"]))
    c = d["calls_per_gib"]
    # 6 blocks of 16 MiB per 96 MiB: 64 copies per GiB each way; one create and map per chunk
    check(c["copy"] == [64.0, 64.0], "one copy per live block each way: %s" % c["copy"])
    check(c["create"][0] == 0 and c["create"][1] > 0 and c["unmap"][0] > 0 and c["unmap"][1] == 0,
          "the sleep unmaps, the wake creates")
    check("sleep (offload)" in p.stdout and "floor: device -> host" in p.stdout, "the table is printed")
    p = run([os.path.join(bench, "expseg-bench-sleep"), "--driver", spec, "--size", "32",
             "--block", "16", "--rounds", "1", "--same-work", "off", "--json", j])
    d = json.load(open(j))
    check(p.returncode == 0 and d["same_work"] == "off" and d["same_work_d2h_ms"] == 0 and
          d["same_work_bytes"] == 0 and "same-work floor (sleep): off" in p.stdout,
          "--same-work off: not measured, said so")
    p = run([os.path.join(bench, "expseg-bench-sleep"), "--same-work", "maybe"])
    check(p.returncode == 2 and "--same-work" in p.stdout, "--same-work maybe refused")
    p = run([os.path.join(bench, "expseg-bench-sleep"), "--driver", "sim", "--size", "64",
             "--rounds", "1"])
    check(p.returncode == 0 and "driver calls per GiB" in p.stdout and "floor" not in p.stdout,
          "sim: calls only")
    p = run([os.path.join(bench, "expseg-bench-sleep"), "--size", "0"])
    check(p.returncode == 2 and "--size" in p.stdout, "--size 0 refused with a message")


def piece_report(bench, src, spec, tmp):
    work, out = os.path.join(tmp, "work"), os.path.join(tmp, "out")
    os.makedirs(work)
    os.makedirs(out)
    with open(os.path.join(work, "parts.tsv"), "w") as f:
        f.write("build\tpassed\t12\ttargets: a b\nctest\tfailed\t3\t1 failed\n"
                "device-hit\tskipped\t0\tbudget spent\ntorch\tskipped\t0\tno torch\n")
    with open(os.path.join(work, "driver.json"), "w") as f:
        json.dump({"granularity": 2 << 20, "sizes": [
            {"mib": 2, "measured": True, **{k: {"median_us": 1.5, "p99_us": 2.5} for k in
                                             ("reserve", "create", "map", "set_access", "unmap",
                                              "release", "unreserve")}},
            {"mib": 2048, "measured": False}], "set_access_pages": [],
            "cudart": {"status": "not asked"}, "unmap_wait": {"status": "not asked"}}, f)
    with open(os.path.join(work, "sleep.json"), "w") as f:
        json.dump({"driver": "cuda", "bytes": True, "size_bytes": 1 << 30, "rounds": 3,
                   "sleep_ms": 100.0, "sleep_copy_ms": 80.0, "wake_ms": 120.0, "wake_copy_ms": 90.0,
                   "first_sleep_ms": 300.0, "first_wake_ms": 130.0, "floor_d2h_ms": 50.0,
                   "floor_h2d_ms": 60.0, "fresh_pages_ms": 0, "same_work": "measured",
                   "same_work_d2h_ms": 40.0, "same_work_bytes": 1 << 30, "checked_bytes": 1 << 30,
                   "mismatches": 0, "calls_per_gib": {}}, f)
    with open(os.path.join(work, "ctest.out"), "w") as f:
        f.write("97% tests passed, 1 tests failed out of 32\n\nThe following tests FAILED:\n"
                "\t 12 - GpuVmm.Thing (Failed)\n")
    with open(os.path.join(out, "driver-costs.txt"), "w") as f:
        f.write("# t\ncreate 1.0\ncreate.page 0.5\n")
    p = run([sys.executable, os.path.join(src, "bench", "gpu_check_report.py"), "--work", work,
             "--out", out, "--double", "1", "--device", "double", "--driver-version", "double",
             "--budget", "60", "--seconds", "15"])
    check(p.returncode == 0, "the report is written")
    r = json.load(open(os.path.join(out, "gpu-check.json")))
    check(r["double"] is True and "meaningless" in r["timings"] and "meaningless" in r["driver"]["timings"],
          "double: timings labelled meaningless")
    check(r["parts"]["ctest"]["status"] == "failed" and r["parts"]["build"]["status"] == "passed",
          "part statuses kept")
    check(r["ctest"]["failed_tests"] == ["GpuVmm.Thing"] and r["ctest"]["failed"] == 1,
          "ctest's failed tests listed")
    check(r["cost_table"]["lines"][1] == "create 1.0", "the cost table is carried")
    s = open(os.path.join(out, "summary.txt")).read()
    check("meaningless" in s and "ctest    failed" in s and "not measured" in s, "summary lines")
    check(r["sleep"]["wake_copy_ms"] == 90.0 and "meaningless" in r["sleep"]["timings"],
          "the sleep figures are carried, labelled meaningless on the double")
    check("sleep + wake / floor 2.00" in s and "sleep 100.0 ms (copy 80.0)" in s, "the sleep summary")
    check("sleep copy / that 2.00" in s, "the same-work floor in the summary")
    p = run([sys.executable, os.path.join(src, "bench", "gpu_check_report.py"), "--work", out,
             "--out", out])
    check(p.returncode == 2 and "parts.tsv" in p.stdout, "no parts.tsv: status 2 and a message")


def piece_args(bench, src, spec, tmp):
    gc = os.path.join(src, "bench", "gpu-check")
    for args, want in ((["--budget", "abc", tmp], "--budget 'abc'"), ([tmp, "--budget", "5"], "from 30"),
                       ([], "OUTDIR is missing"), ([tmp, "--frob"], "unknown option '--frob'"),
                       ([tmp, tmp + "x"], "one OUTDIR only"),
                       ([tmp, "--parts", "torch,frob"], "unknown part 'frob'"),
                       ([tmp, "--parts", ","], "the list is empty")):
        p = run(["bash", gc] + args)
        check(p.returncode == 2 and want in p.stdout, "gpu-check %s: status 2 and '%s'" % (args, want))


def main():
    piece, bench, src = sys.argv[1:4]
    spec = sys.argv[4] if len(sys.argv) > 4 else "host:capacity=256M"
    with tempfile.TemporaryDirectory() as tmp:
        {"driver": piece_driver, "device": piece_device, "sleep": piece_sleep, "report": piece_report,
         "args": piece_args}[piece](bench, src, spec, tmp)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
