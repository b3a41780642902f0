#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""check_snapshot.py: checks a snapshot pickle written by expseg, field by field, with
Python's standard pickle (run by tests/test_snapshot.cpp; usable by hand).

  check_snapshot.py SNAPSHOT [--expect EXPECT.json] [--from-creation] [--quiet]

Checks, exit status 1 with one line per failure:
  - the opcodes (pickletools.genops): PROTO <= 4 and only those MemoryViz.js unpickles;
  - the structure: segments (every field PyTorch writes, sorted by address, blocks tiling
    each segment in address order, the segment's sizes equal to its blocks' sums),
    device_traces (one list per device, every event's fields), allocator_settings;
  - EXPECT (JSON written by the test from expseg's statistics and the operations it made):
    "stats": {allocated, active, requested, mapped, segments_small, segments_large...}
    compared with the sums over segments; "events": [[action, addr, size, stream], ...]
    compared with the history (the newest len(events) when "tail" is true);
  - --from-creation: replays the history backwards from the end state as the viewer's
    simulate_memory does (alloc removes its block, free_completed adds it back,
    segment_map/unmap and segment_alloc/free undo the ranges) and requires an empty state:
    no block and no mapped byte before the first event. Every undo must find what it
    undoes, and every live block must lie in a mapped range wherever the viewer may draw
    (checked at 200 points spread over the history): the viewer would fail otherwise.
"""
import bisect
import json
import pickle
import pickletools
import sys

VIEWER_OPCODES = {
    "PROTO", "FRAME", "MARK", "STOP", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET",
    "LONG_BINGET", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_LIST", "LIST",
    "APPEND", "APPENDS", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "NONE",
    "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT",
    "SHORT_BINUNICODE", "BINUNICODE"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot", "annotate", "sleep", "wake"}
STATES = {"active_allocated", "active_pending_free", "inactive"}
SEG_KEYS = {"device": int, "address": int, "total_size": int, "allocated_size": int,
            "active_size": int, "requested_size": int, "stream": int, "segment_type": str,
            "segment_pool_id": tuple, "is_expandable": bool, "frames": list, "blocks": list}
BLOCK_KEYS = {"address": int, "size": int, "requested_size": int, "state": str, "frames": list}
SETTINGS_KEYS = ["PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold",
                 "expandable_segments", "pinned_num_register_threads",
                 "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
                 "roundup_power2_divisions", "graph_capture_record_stream_reuse"]

errors = []


def fail(msg):
    errors.append(msg)


def check_opcodes(data):
    n = 0
    for op, arg, pos in pickletools.genops(data):
        n += 1
        if op.name not in VIEWER_OPCODES:
            fail("byte %d: opcode %s is not one the viewer unpickles" % (pos, op.name))
        if op.name == "PROTO" and arg > 4:
            fail("protocol %d > 4" % arg)
    return n


def check_frames(where, frames):
    for f in frames:
        if not (isinstance(f, dict) and isinstance(f.get("filename"), str)
                and isinstance(f.get("name"), str) and isinstance(f.get("line"), int)):
            fail("%s: frame %r lacks filename/name/line" % (where, f))
            return


def check_structure(snap):
    for k in ("segments", "device_traces", "allocator_settings"):
        if k not in snap:
            fail("top level: '%s' is missing" % k)
            return
    prev_end = 0
    for i, s in enumerate(snap["segments"]):
        w = "segments[%d]" % i
        for k, t in SEG_KEYS.items():
            if not isinstance(s.get(k), t) or (t is int and isinstance(s.get(k), bool)):
                fail("%s: '%s' is %r, expected %s" % (w, k, s.get(k), t.__name__))
                return
        if s["address"] < prev_end:
            fail("%s: address %#x overlaps or is out of order" % (w, s["address"]))
        prev_end = s["address"] + s["total_size"]
        if s["segment_type"] not in ("small", "large"):
            fail("%s: segment_type %r" % (w, s["segment_type"]))
        check_frames(w, s["frames"])
        addr, alloc, active, req = s["address"], 0, 0, 0
        if not s["blocks"]:
            fail("%s: no blocks" % w)
        for j, b in enumerate(s["blocks"]):
            wb = "%s.blocks[%d]" % (w, j)
            for k, t in BLOCK_KEYS.items():
                if not isinstance(b.get(k), t):
                    fail("%s: '%s' is %r" % (wb, k, b.get(k)))
                    return
            if b["address"] != addr:
                fail("%s: address %#x, expected %#x (blocks must tile)" % (wb, b["address"], addr))
            if b["state"] not in STATES:
                fail("%s: state %r" % (wb, b["state"]))
            if b["size"] <= 0 or b["requested_size"] > b["size"]:
                fail("%s: size %d requested %d" % (wb, b["size"], b["requested_size"]))
            if b["state"] == "inactive" and (b["requested_size"] or b["frames"]):
                fail("%s: an inactive block with a requested size or frames" % wb)
            check_frames(wb, b["frames"])
            addr += b["size"]
            if b["state"] == "active_allocated":
                alloc += b["size"]
            if b["state"] != "inactive":
                active += b["size"]
                req += b["requested_size"]
        if addr != s["address"] + s["total_size"]:
            fail("%s: blocks end at %#x, the segment at %#x" % (w, addr, s["address"] + s["total_size"]))
        for k, v in (("allocated_size", alloc), ("active_size", active), ("requested_size", req)):
            if s[k] != v:
                fail("%s: %s %d, its blocks sum to %d" % (w, k, s[k], v))
    settings = snap["allocator_settings"]
    for k in SETTINGS_KEYS:
        if k not in settings:
            fail("allocator_settings: '%s' is missing" % k)
    for d, trace in enumerate(snap["device_traces"]):
        times = [e.get("time_us", 0) for e in trace]
        if any(b < a for a, b in zip(times, times[1:])):
            fail("device_traces[%d]: time_us goes backwards" % d)
        if times and not 1500000000 * 10**6 < times[0] < 4000000000 * 10**6:
            fail("device_traces[%d]: time_us %d is not microseconds since the epoch" % (d, times[0]))
        for i, e in enumerate(trace):
            w = "device_traces[%d][%d]" % (d, i)
            if e.get("action") not in ACTIONS:
                fail("%s: action %r" % (w, e.get("action")))
                continue
            addr_key = "device_free" if e["action"] == "oom" else "addr"
            for k in (addr_key, "size", "stream", "time_us"):
                if not isinstance(e.get(k), int):
                    fail("%s: '%s' is %r" % (w, k, e.get(k)))
            check_frames(w, e.get("frames", []))
            for k in ("compile_context", "user_metadata"):
                if not isinstance(e.get(k), str):
                    fail("%s: '%s' is %r, expected a string" % (w, k, e.get(k)))


def blocks_inside(blocks, segs, i):
    """The viewer draws the state after event i: every live block must lie in a mapped range
    (its find_segment would return null and the drawing fail)."""
    starts = [s[0] for s in segs]
    for a, n in blocks.items():
        k = bisect.bisect_right(starts, a) - 1
        if k < 0 or a + n > segs[k][0] + segs[k][1]:
            fail("after event %d: live block %#x+%d lies outside every mapped range" % (i, a, n))
            return False
    return True


def replay_backwards(snap, device):
    """The viewer's simulate_memory(-1): the state before the first event."""
    segs = []  # [addr, size, stream], sorted
    blocks = {}
    for s in snap["segments"]:
        if s["device"] != device:
            continue
        segs.append([s["address"], s["total_size"], s["stream"]])
        for b in s["blocks"]:
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[b["address"]] = b["size"]
    segs.sort()
    trace = snap["device_traces"][device] if device < len(snap["device_traces"]) else []
    every = max(1, len(trace) // 200)  # where the viewer's find_segment is checked
    for i in range(len(trace) - 1, -1, -1):
        if i % every == 0 and not blocks_inside(blocks, segs, i):
            return
        e = trace[i]
        a, n, st = e.get("addr"), e["size"], e["stream"]
        act = e["action"]
        w = "event %d (%s %#x, %d bytes)" % (i, act, a or 0, n)
        if act == "alloc":
            if a not in blocks:
                fail("%s: undoing an alloc of a block that is not live" % w)
                return
            del blocks[a]
        elif act == "free_completed":
            if a in blocks:
                fail("%s: undoing a free of a block that is live" % w)
                return
            blocks[a] = n
        elif act in ("segment_free", "segment_unmap"):  # memory comes back
            for s in segs:
                if s[0] < a + n and a < s[0] + s[1]:
                    fail("%s: undoing it overlaps mapped %#x+%d" % (w, s[0], s[1]))
                    return
            segs.append([a, n, st])
            segs.sort()
            if act == "segment_unmap":  # merge with same-stream neighbours, as the viewer
                merged = []
                for s in segs:
                    if merged and merged[-1][0] + merged[-1][1] == s[0] and merged[-1][2] == s[2]:
                        merged[-1][1] += s[1]
                    else:
                        merged.append(s)
                segs = merged
        elif act in ("segment_alloc", "segment_map"):  # memory goes away
            hit = [s for s in segs if s[0] <= a and a + n <= s[0] + s[1]]
            if not hit or (act == "segment_alloc" and (hit[0][0] != a or hit[0][1] != n)):
                fail("%s: no mapped range holds it" % w)
                return
            s = hit[0]
            segs.remove(s)
            if s[0] < a:
                segs.append([s[0], a - s[0], s[2]])
            if a + n < s[0] + s[1]:
                segs.append([a + n, s[0] + s[1] - a - n, s[2]])
            segs.sort()
    if blocks:
        fail("before the first event %d blocks are still live, e.g. %#x" % (len(blocks), min(blocks)))
    if segs:
        fail("before the first event %d bytes are still mapped, e.g. %#x+%d"
             % (sum(s[1] for s in segs), segs[0][0], segs[0][1]))


def check_expect(snap, exp, device):
    segs = [s for s in snap["segments"] if s["device"] == device]
    got = {
        "allocated": sum(s["allocated_size"] for s in segs),
        "active": sum(s["active_size"] for s in segs),
        "requested": sum(s["requested_size"] for s in segs),
        "mapped": sum(s["total_size"] for s in segs),
        "pending_blocks": sum(1 for s in segs for b in s["blocks"] if b["state"] == "active_pending_free"),
        "allocated_blocks": sum(1 for s in segs for b in s["blocks"] if b["state"] == "active_allocated"),
    }
    for k, v in exp.get("stats", {}).items():
        if got.get(k) != v:
            fail("stats: %s is %r in the snapshot, %r in expseg's statistics" % (k, got.get(k), v))
    trace = snap["device_traces"][device] if device < len(snap["device_traces"]) else []
    for k, v in exp.get("counts", {}).items():
        n = sum(1 for e in trace if e["action"] in k.split("+"))
        if n != v:
            fail("history: %d %s events, expected %d" % (n, k, v))
    if "events" in exp:
        only = set(exp.get("only", ACTIONS))
        kept = [e for e in trace if e["action"] in only]
        want = exp["events"]
        have = [[e["action"], e.get("addr", e.get("device_free")), e["size"], e["stream"]] for e in kept]
        for i, frames in enumerate(exp.get("host_frames", [])):
            if i >= len(kept):
                break
            got = [[f["filename"], f["name"], f["line"]] for f in kept[i].get("frames", [])]
            n_c = len(got) - len(frames)
            if got[len(got) - len(frames):] != frames or n_c < 0:
                fail("history: event %d frames %r do not end with the pushed %r" % (i, got, frames))
            elif exp.get("c_stacks") is not None and (n_c > 0) != exp["c_stacks"]:
                fail("history: event %d has %d C frames, C stacks %s" % (i, n_c, exp["c_stacks"]))
        if exp.get("tail"):
            if len(have) != len(want):
                fail("history: %d events kept, expected the newest %d" % (len(have), len(want)))
        if have != want:
            for i, (h, w) in enumerate(zip(have, want)):
                if h != w:
                    fail("history: event %d is %r, expected %r" % (i, h, w))
                    break
            else:
                fail("history: %d events, expected %d" % (len(have), len(want)))
    for k, v in exp.get("settings", {}).items():
        if snap["allocator_settings"].get(k) != v:
            fail("allocator_settings: %s is %r, expected %r" % (k, snap["allocator_settings"].get(k), v))
    if "frames_contain" in exp:
        names = {f["name"] for e in snap["device_traces"][device] for f in e.get("frames", [])}
        names |= {f["filename"] for e in snap["device_traces"][device] for f in e.get("frames", [])}
        for n in exp["frames_contain"]:
            if n not in names:
                fail("no event frame is named %r" % n)


def main(argv):
    args = argv[1:]
    quiet = "--quiet" in args
    from_creation = "--from-creation" in args
    expect = None
    if "--expect" in args:
        expect = json.load(open(args[args.index("--expect") + 1]))
    skip = {args.index("--expect") + 1} if "--expect" in args else set()
    paths = [a for i, a in enumerate(args) if not a.startswith("--") and i not in skip]
    if len(paths) != 1:
        print(__doc__)
        return 2
    path = paths[0]
    data = open(path, "rb").read()
    n_ops = check_opcodes(data)
    snap = pickle.loads(data)
    if not isinstance(snap, dict):
        print("%s: top level is %s, not a dict" % (path, type(snap).__name__))
        return 1
    check_structure(snap)
    device = expect.get("device", 0) if expect else 0
    if not errors and expect:
        check_expect(snap, expect, device)
    if not errors and from_creation:
        replay_backwards(snap, device)
    for e in errors[:20]:
        print("%s: %s" % (path, e))
    if not quiet and not errors:
        print("%s: ok (%d opcodes, %d segments, %d events)" % (
            path, n_ops, len(snap["segments"]), sum(len(t) for t in snap["device_traces"])))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
