#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""check_memory_viz.py: runs every subcommand of PyTorch's own torch/cuda/_memory_viz.py on
snapshot pickles (run by tests/test_trace_viewers.cpp; usable by hand). Plain python3: the
script imports no torch for these subcommands.

  check_memory_viz.py MEMORY_VIZ.py SNAPSHOT [SNAPSHOT2] [--min-framed N]
                      [--host RESERVED LIVE PENDING FRAMED [--no-traces]]

MEMORY_VIZ.py is a copy of PyTorch's file (a test fixture kept outside the repository,
../shared/reference/pytorch-viewer/). Checks, exit status 1 with one line per failure:
  - the command line, as a user runs it: `stats`, `trace`, `trace_plot`, `trace_plot -s` and
    `segment_plot` exit 0; `stats` prints the segments' total, `trace` one line or more per
    event, each plot is an HTML page that embeds the snapshot;
  - `segments`, `memory` and `compare` build flamegraph input and hand it to flamegraph.pl
    (which the command line would download from the network): they are called as functions
    of the module with a stand-in for flamegraph.pl that checks every line is
    "frame;frame;... BYTES" and that the bytes add up to the segments' total size (for
    `compare`: SNAPSHOT2's segments not in SNAPSHOT, as the function takes two segment
    lists; PyTorch's own command line passes the whole dicts and fails on any input);
  - --min-framed N: at least N lines of the `memory` flamegraph name a frame of the program
    (not "<non-python>").
  - --host RESERVED LIVE PENDING FRAMED: SNAPSHOT holds the pinned host pool: host_segments
    add up to RESERVED bytes (the pool's reserved_bytes.current), each tiled by its blocks in
    address order with its allocated/active/requested sizes their sums; LIVE blocks are
    active_allocated, PENDING active_pending_free, at least FRAMED active blocks carry frames;
    host_traces is one list of trace entries (empty with --no-traces, else holding an alloc
    event at the address of every active block); then every subcommand runs on the
    snapshot with host_segments and host_traces in the place of segments and device_traces
    (the same shape: PyTorch's tools read them as they read the device's).
"""
import importlib.util
import os
import pickle
import subprocess
import sys
import tempfile

errors = []


def fail(msg):
    errors.append(msg)


def run_cli(viz, args, what):
    p = subprocess.run([sys.executable, viz] + args, capture_output=True, text=True)
    if p.returncode != 0:
        fail("%s: exit %d: %s" % (what, p.returncode, (p.stderr or p.stdout)[-400:]))
    return p.stdout


def flamegraph_checker(expected_total, what, framed):
    def check(lines):
        total = 0
        for i, line in enumerate(lines.splitlines()):
            stack, _, count = line.rpartition(" ")
            if not stack or not count.lstrip("-").isdigit():
                fail("%s: flamegraph line %d is not 'frames BYTES': %r" % (what, i, line))
                return ""
            total += int(count)
            if "<non-python>" not in stack and "<gaps>" not in stack:
                framed[0] += 1
        if total != expected_total:
            fail("%s: flamegraph bytes add up to %d, the segments to %d" % (what, total, expected_total))
        return "<svg/>"
    return check


def check_host(data, reserved, live, pending, framed_min, no_traces):
    if "host_segments" not in data or "host_traces" not in data:
        fail("host: no host_segments or host_traces key")
        return
    segs, trace = data["host_segments"], data["host_traces"]
    if not isinstance(trace, list) or any(not isinstance(e, dict) for e in trace):
        fail("host: host_traces is not one list of trace entries")
        return
    total = sum(s["total_size"] for s in segs)
    if total != reserved:
        fail("host: host_segments add up to %d bytes, the pool reserves %d" % (total, reserved))
    states = {"active_allocated": 0, "active_pending_free": 0, "inactive": 0}
    framed = 0
    allocs = {e["addr"] for e in trace if e["action"] == "alloc"}
    last = -1
    for s in segs:
        if s["address"] <= last:
            fail("host: segments not sorted by address at %#x" % s["address"])
        last = s["address"]
        addr = s["address"]
        sums = {"allocated_size": 0, "active_size": 0, "requested_size": 0}
        for b in s["blocks"]:
            if b["address"] != addr:
                fail("host: segment %#x: block at %#x, expected %#x" % (s["address"], b["address"], addr))
            addr += b["size"]
            states[b["state"]] += 1
            if b["state"] != "inactive":
                sums["active_size"] += b["size"]
                sums["requested_size"] += b["requested_size"]
                framed += len(b["frames"]) > 0
                if not no_traces and b["address"] not in allocs:
                    fail("host: active block %#x has no alloc event" % b["address"])
            if b["state"] == "active_allocated":
                sums["allocated_size"] += b["size"]
        if addr != s["address"] + s["total_size"]:
            fail("host: segment %#x: blocks end at %#x, the segment at %#x"
                 % (s["address"], addr, s["address"] + s["total_size"]))
        for k, v in sums.items():
            if s[k] != v:
                fail("host: segment %#x: %s %d, its blocks %d" % (s["address"], k, s[k], v))
    if states["active_allocated"] != live or states["active_pending_free"] != pending:
        fail("host: %d allocated and %d pending blocks, expected %d and %d"
             % (states["active_allocated"], states["active_pending_free"], live, pending))
    if framed < framed_min:
        fail("host: %d active blocks carry frames, expected at least %d" % (framed, framed_min))
    if no_traces and trace:
        fail("host: %d host_traces entries with include_traces off" % len(trace))
    if not no_traces and not trace:
        fail("host: host_traces is empty")


def main():
    argv = sys.argv[1:]
    host = None
    no_traces = "--no-traces" in argv
    if no_traces:
        argv.remove("--no-traces")
    if "--host" in argv:
        i = argv.index("--host")
        host = [int(x) for x in argv[i + 1:i + 5]]
        del argv[i:i + 5]
    min_framed = 0
    if "--min-framed" in argv:
        i = argv.index("--min-framed")
        min_framed = int(argv[i + 1])
        del argv[i:i + 2]
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    viz, snap = argv[0], argv[1]
    snap2 = argv[2] if len(argv) == 3 else snap
    with open(snap, "rb") as f:
        data = pickle.load(f)
    with open(snap2, "rb") as f:
        data2 = pickle.load(f)
    tmpdir = None
    if host is not None:
        check_host(data, *host, no_traces)
        if errors:
            for e in errors:
                print("%s: %s" % (snap, e))
            return 1
        # the host pool in the device's place: the same shape, the same tools
        tmpdir = tempfile.TemporaryDirectory()
        for d in (data, data2):
            d["segments"] = d.get("host_segments", [])
            d["device_traces"] = [d.get("host_traces", [])]
        snap = os.path.join(tmpdir.name, "host.pickle")
        with open(snap, "wb") as f:
            pickle.dump(data, f)
    total = sum(s["total_size"] for s in data["segments"])
    events = sum(len(t) for t in data["device_traces"])

    out = run_cli(viz, ["stats", snap], "stats")
    if "total_reserved" not in out and str(len(data["segments"])) not in out:
        fail("stats: no summary in %r" % out[-200:])
    out = run_cli(viz, ["trace", snap], "trace")
    if events and len(out.splitlines()) < events // 2:
        fail("trace: %d lines for %d events" % (len(out.splitlines()), events))
    with tempfile.TemporaryDirectory() as tmp:
        for args in (["trace_plot"], ["trace_plot", "-s"], ["segment_plot"]):
            html = os.path.join(tmp, "out.html")
            run_cli(viz, args + [snap, "-o", html], " ".join(args))
            if os.path.exists(html):
                with open(html) as f:
                    page = f.read()
                if "<html" not in page.lower() or len(page) < 100:
                    fail("%s: not an HTML page" % " ".join(args))
            elif not errors:
                fail("%s: wrote no file" % " ".join(args))

    spec = importlib.util.spec_from_file_location("_memory_viz", viz)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    framed = [0]
    mod.segments(data, format_flamegraph=flamegraph_checker(total, "segments", [0]))
    mod.memory(data, format_flamegraph=flamegraph_checker(total, "memory", framed))
    before = {(s["address"], s["total_size"]) for s in data["segments"]}
    after = {(s["address"], s["total_size"]) for s in data2["segments"]}
    changed = sum(s["total_size"] for s in data["segments"] if (s["address"], s["total_size"]) not in after)
    changed += sum(s["total_size"] for s in data2["segments"] if (s["address"], s["total_size"]) not in before)
    mod.compare(data["segments"], data2["segments"],
                format_flamegraph=flamegraph_checker(changed, "compare", [0]))
    if framed[0] < min_framed:
        fail("memory: %d flamegraph lines name a program frame, expected at least %d" % (framed[0], min_framed))

    for e in errors:
        print("%s: %s" % (snap, e))
    if errors:
        return 1
    if host is not None:
        print("%s: host pool: %d segments, %d events" % (argv[1], len(data["segments"]), events))
    print("%s: every _memory_viz.py subcommand ran: %d segments, %d events, %d framed lines"
          % (snap, len(data["segments"]), events, framed[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
