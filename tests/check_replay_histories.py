#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""check_replay_histories.py: expseg-replay on snapshot pickles nobody recorded, written
here with Python's own pickle (protocols 2 to 5) in a temporary folder (CTest
replay_crafted_histories).

  check_replay_histories.py EXPSEG_REPLAY [--seed N] [--random N] [--deep N] [--keep DIR]

(--deep: how many of the random histories also get --sweep, --fit, --timeline, --report;
default 4.)

Two kinds of input, each run with --json (both models), and some with --sweep and --fit:
  - hand-picked files, each with what must happen: figures (exit status 0) or a refusal
    (exit status 2, a message naming the file and what could not be read): several devices
    (some with empty histories), a window that starts mid-run (frees of addresses never
    allocated in it, blocks live in `segments`), only frees, `oom`, `segment_map` /
    `segment_unmap`, `snapshot` / `annotate` / `user_defined` entries, streams given as
    large or negative integers, odd and zero sizes, a duplicate alloc of a live address,
    sizes of terabytes, an empty file, time_us missing or decreasing, unknown keys, frames
    present, absent or malformed, tuples where lists are usual;
  - seeded random histories (the seed is printed): a small model of PyTorch's classic or
    expandable segments run over several devices and streams, cut to the newest entries as
    the ring buffer does, with the end state written as `segments`, annotations and OOM
    entries mixed in.
Checked on every run: no crash, hang or timeout; every line of stdout is a JSON object (UTF-8)
with no NaN or infinity and no negative figure; without an OOM the peak reserved is at least
the peak requested; --fit is at most the unconstrained peak reserved (to 2 MiB) plus one
chunk (8 MiB for expseg, PyTorch's 20 MiB segment), and the capacity it names runs the
history without an OOM, and on half the peak reserved the replay passes --check with its
OOMs counted and placed; sweep rows rank 1..n within each section with one `best` row, each
row's figures are those of a plain replay of its model and configuration, and a warning is
said once; --timeline rows have the header's 8 fields; --report FILE.html of a single
history writes a UTF-8 page with the name escaped. Also the command line: bad values and
conflicting flags refused (exit status 2), stdout on a full disk (exit status 1).
Exit status 1 with one line per failure.
"""
import csv
import json
import math
import os
import pickle
import pickletools
import random
import struct
import subprocess
import sys
import tempfile

MB = 1 << 20
BASE = 0x7F0000000000
FAILS = []


def fail(msg):
    FAILS.append(msg)
    print("FAIL:", msg)


# ---- what PyTorch writes ----

def seg(dev, addr, total, stream, blocks, expandable=False):
    return {"device": dev, "address": addr, "total_size": total, "allocated_size": 0,
            "active_size": 0, "requested_size": 0, "stream": stream,
            "segment_type": "small" if total <= 2 * MB else "large",
            "segment_pool_id": (0, 0), "is_expandable": expandable, "frames": [],
            "blocks": blocks}


def blk(addr, size, state, req=None):
    return {"address": addr, "size": size, "requested_size": size if req is None else req,
            "state": state, "frames": []}


def ev(action, addr, size, stream=0, t=0):
    return {"action": action, "device_free" if action == "oom" else "addr": addr,
            "size": size, "stream": stream, "time_us": t}


def snapshot(segments, traces, expandable=False):
    return {"segments": segments, "device_traces": traces,
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                                   "expandable_segments": expandable,
                                   "roundup_power2_divisions": {}}}


def basic(dev=0, stream=0, extra=()):
    """One 20 MiB segment with a block live throughout, and two allocations in the window."""
    segs = [seg(dev, BASE, 20 * MB, stream, [blk(BASE, 4 * MB, "active_allocated"),
                                             blk(BASE + 4 * MB, 16 * MB, "inactive")])]
    a = BASE + 4 * MB
    tr = [ev("alloc", a, 1536 * 1024, stream, 1), ev("free_requested", a, 1536 * 1024, stream, 2),
          ev("free_completed", a, 1536 * 1024, stream, 3), ev("alloc", a, 3 * MB + 7, stream, 4),
          ev("free_requested", a, 3 * MB + 7, stream, 5),
          ev("free_completed", a, 3 * MB + 7, stream, 6)] + list(extra)
    return segs, tr


def user_defined(t):
    return {"action": "user_defined", "addr": 0, "size": 0, "stream": 0, "time_us": t,
            "user_metadata": "step"}


def recode(data):
    """The same pickle in other opcodes a writer may choose: strings as BINUNICODE8, small
    integers as LONG4, no FRAME (MEMOIZE and BINGET kept)."""
    ops = list(pickletools.genops(data))
    out = bytearray()
    for i, (op, arg, pos) in enumerate(ops):
        raw = data[pos:ops[i + 1][2] if i + 1 < len(ops) else len(data)]
        if op.name == "FRAME":
            continue
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE"):
            b = arg.encode()
            raw = b"\x8d" + struct.pack("<Q", len(b)) + b
        elif op.name in ("BININT", "BININT1", "BININT2", "LONG1"):
            b = arg.to_bytes((arg.bit_length() + 8) // 8, "little", signed=True)
            raw = b"\x8b" + struct.pack("<I", len(b)) + b
        out += raw
    assert pickle.loads(bytes(out)) == pickle.loads(data)
    return bytes(out)


def hand_picked():
    """(name, object or bytes, protocol, expected: None = figures, a dict = figures with
    these values in the first row, else a part of the refusal's message)"""
    c = []
    for p in (2, 3, 4, 5):
        s, t = basic()
        c.append(("proto%d" % p, snapshot(s, [t]), p, None))
    s, t = basic(extra=[user_defined(9), ev("oom", 5, 40 * MB)])
    c.append(("opcodes_recoded", recode(pickle.dumps(snapshot(s, [t]), 4)), 0, None))
    s, t = basic(extra=[user_defined(7), ev("snapshot", 0, 0, 0, 8),
                        {"action": "annotate", "addr": 0, "size": 0, "stream": 0}])
    c.append(("annotations", snapshot(s, [t]), 4, None))
    s, t = basic()
    t.insert(2, user_defined(2))  # between a free_requested and its free_completed
    c.append(("user_defined_in_free", snapshot(s, [t]), 4, None))
    c.append(("only_user_defined", snapshot([], [[user_defined(1)]]), 4, None))
    s, t = basic(dev=1)
    s.append(seg(0, BASE + 100 * MB, 2 * MB, 0, [blk(BASE + 100 * MB, 2 * MB, "inactive")]))
    c.append(("device1_only", snapshot(s, [[], t, []]), 4, None))
    s0, t0 = basic(dev=0)
    s2, t2 = basic(dev=2)
    c.append(("devices_0_2", snapshot(s0 + s2, [t0, [], t2]), 3, None))
    segs = [seg(0, BASE, 20 * MB, 0, [blk(BASE, 2 * MB, "inactive"),
                                      blk(BASE + 2 * MB, 18 * MB, "inactive")])]
    c.append(("only_frees", snapshot(segs, [[ev("free_requested", BASE, 2 * MB),
                                             ev("free_completed", BASE, 2 * MB),
                                             ev("free_completed", BASE + 2 * MB, 5 * MB)]]),
              4, None))
    segs = [seg(0, BASE, 20 * MB, 0, [blk(BASE, 2 * MB, "active_pending_free"),
                                      blk(BASE + 2 * MB, 18 * MB, "inactive")])]
    c.append(("pending_at_end", snapshot(segs, [[ev("free_requested", BASE, 2 * MB)]]), 4, None))
    segs = [seg(0, BASE, 20 * MB, 0, [blk(BASE, 2 * MB, "active_awaiting_free"),
                                      blk(BASE + 2 * MB, 18 * MB, "inactive")])]
    c.append(("awaiting_free_at_end", snapshot(segs, [[ev("free_requested", BASE, 2 * MB)]]), 4,
              None))  # the state's name in torch.cuda.memory._snapshot's documentation
    segs = [seg(0, BASE, 20 * MB, 0, [blk(BASE, 2 * MB, "active_freed")])]
    c.append(("unknown_block_state", snapshot(segs, [[ev("free_requested", BASE, 2 * MB)]]), 4,
              "unknown block state 'active_freed'"))
    s, t = basic(extra=[ev("oom", 12345, 40 * MB)])
    c.append(("oom_entry", snapshot(s, [t]), 4, None))
    segs = [seg(0, BASE, 40 * MB, 0, [blk(BASE, 30 * MB, "active_allocated"),
                                      blk(BASE + 30 * MB, 10 * MB, "inactive")], True)]
    c.append(("expandable", snapshot(segs, [[ev("segment_map", BASE, 20 * MB),
                                             ev("segment_map", BASE + 20 * MB, 20 * MB),
                                             ev("alloc", BASE, 30 * MB)]], True), 4, None))
    for name, st in (("stream_pointer", 0x55D5C0FFEE00), ("stream_negative", -5),
                     ("stream_int64_max", (1 << 63) - 1)):
        s, t = basic(stream=st)
        c.append((name, snapshot(s, [t]), 4, None))
    s, t = basic()
    t[0]["stream"] = 1 << 64  # a LONG1 of 9 bytes: no 64-bit integer
    c.append(("stream_too_big", snapshot(s, [t]), 2, "'stream' is not a 64-bit integer"))
    segs = [seg(0, BASE, 2 * MB, 0, [blk(BASE, 2 * MB, "inactive")])]
    c.append(("zero_size", snapshot(segs, [[ev("alloc", BASE, 0), ev("free_requested", BASE, 0),
                                            ev("free_completed", BASE, 0)]]), 4, None))
    c.append(("odd_sizes", snapshot(segs, [[ev("alloc", BASE, 1), ev("alloc", BASE + 512, 511),
                                            ev("free_completed", BASE, 1),
                                            ev("free_completed", BASE + 512, 511)]]), 4, None))
    c.append(("duplicate_alloc", snapshot(segs, [[ev("alloc", BASE, 512), ev("alloc", BASE, 512),
                                                  ev("free_completed", BASE, 512)]]), 4,
              "device_traces[0][0]: alloc at 0x7f0000000000"))
    segs = [seg(0, BASE, 2 << 40, 0, [blk(BASE, 2 << 40, "inactive")])]
    c.append(("terabytes", snapshot(segs, [[ev("segment_alloc", BASE, 2 << 40),
                                            ev("alloc", BASE, 1 << 40),
                                            ev("free_completed", BASE, 1 << 40)]]), 4, None))
    big = [seg(0, BASE, 2 * MB, 0, [blk(BASE, 2 * MB, "inactive")])]
    c.append(("request_256T", snapshot(big, [[ev("alloc", BASE + (1 << 50), 1 << 48),
                                              ev("free_completed", BASE + (1 << 50), 1 << 48)]]),
              4, {"num_ooms": 1, "peak_requested": 1 << 48}))
    # (the sim's 128 TiB of address space refuses it, at once: a device with the address
    # space for it would keep a page table of 128 M entries, gigabytes, for one request)
    c.append(("above_2e50", snapshot(segs, [[ev("alloc", BASE, (1 << 50) + 1),
                                             ev("free_completed", BASE, (1 << 50) + 1)]]), 4,
              "above the 2^50 bytes accepted"))
    c.append(("empty_file", b"", 0, "unknown trace format (0 bytes)"))
    c.append(("empty_dict", {}, 4, "'segments' is missing"))
    c.append(("none", None, 2, "expected a dict"))
    c.append(("no_history", snapshot([], [[], []]), 4, "no device has recorded events"))
    c.append(("truncated", pickle.dumps(snapshot(*basic()[0:1], [basic()[1]]), 4)[:-40], 0,
              "frame of"))
    s, t = basic()
    for e in t:
        del e["time_us"]
    c.append(("no_time", snapshot(s, [t]), 4, None))
    s, t = basic()
    for i, e in enumerate(t):
        e["time_us"] = 1000 - i
        e["compile_context"] = "N/A"
    r = snapshot(s, [t])
    r["external_annotations"] = [{"stage": "forward", "time_us": 3}]
    r["a_new_key"] = (1, 2.5, None)
    c.append(("unknown_keys_time_decreasing", r, 5, None))
    s, t = basic()
    t[0]["frames"] = [{"filename": "a.py", "name": "f", "line": 3},
                      {"filename": "b.py", "name": "g", "line": -1}, {"bad": 1}, "junk"]
    t[3]["frames"] = ({"filename": "a.py", "name": "f", "line": 3},)
    s[0]["blocks"][0]["frames"] = None
    c.append(("frames_mixed", snapshot(s, [t]), 4, None))
    s, t = basic()  # a newer PyTorch's key in the recorded setting: left out, not refused
    r = snapshot(s, [t])
    r["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = (
        "some_future_option:4,max_split_size_mb:256, roundup_power2_divisions:[256:1,>:4]")
    c.append(("recorded_setting_newer_key", r, 4, None))
    s, t = basic()
    r = snapshot(s, [t])
    del r["allocator_settings"]
    c.append(("no_allocator_settings", r, 4, None))
    segs = [seg(0, BASE, 20 * MB, 0, [blk(BASE, 20 * MB, "inactive")])]
    c.append(("oom_then_release", snapshot(segs, [[ev("oom", 0, 40 * MB),
                                                   ev("segment_free", BASE + 40 * MB, 20 * MB)]]),
              4, None))
    # a start state PyTorch's rules would not leave (a small request in a large segment):
    # replayed from an empty cache, whatever the capacity (--fit near the cold peak)
    segs = [seg(0, BASE, 60 * MB, 0, [blk(BASE, 2 * MB, "inactive"),
                                      blk(BASE + 2 * MB, 3072, "active_allocated"),
                                      blk(BASE + 2 * MB + 3072, 58 * MB - 3072, "inactive")])]
    c.append(("start_state_not_rebuildable", snapshot(segs, [[
        ev("free_requested", BASE + 2 * MB, 3072), ev("free_completed", BASE + 2 * MB, 3072),
        ev("alloc", BASE + 2 * MB, 3072)]]), 4, None))
    # as PyTorch 2.0 wrote it: blocks without address or requested_size, the live
    # allocation first in 'history'; no time_us, no allocator_settings; oom with 'addr'
    old = seg(0, BASE, 20 * MB, 0, [
        {"size": 4 * MB, "state": "active_allocated", "history": [
            {"addr": BASE, "real_size": 3000000,
             "frames": [{"filename": "m.py", "name": "f", "line": 1}]},
            {"addr": BASE, "real_size": 100}]},
        {"size": 16 * MB, "state": "inactive", "history": [{"addr": BASE + 4 * MB,
                                                            "real_size": 5}]}])
    for k in ("requested_size", "is_expandable", "segment_pool_id"):
        old.pop(k)
    tr = [ev("alloc", BASE + 4 * MB, MB), ev("free_requested", BASE + 4 * MB, MB),
          ev("free_completed", BASE + 4 * MB, MB),
          {"action": "oom", "addr": 12345, "size": 64 * MB, "stream": 0}]
    for e in tr:
        e.pop("time_us", None)
    c.append(("pytorch_2_0", {"segments": [old], "device_traces": [tr]}, 2,
              {"peak_requested": 3000000 + MB}))
    s, t = basic()
    c.append(("tuples", {"segments": tuple(s), "device_traces": (t,)}, 4, None))
    return c


# ---- random histories: a small model of the recorded allocator ----

def random_history(rng, n_events, expandable):
    """A device's events and end-state segments from a toy classic allocator: each
    segment holds one block at its start (live, pending or free); a freed segment is reused
    by a request that fits or released (segment_free / segment_unmap)."""
    devs = rng.choice([[0], [0, 1], [1], [0, 2, 3]])
    streams = [0, 0x55D5C0FFEE00 + rng.randrange(1 << 20) * 16, rng.choice([7, 1 << 40])]
    segments, traces = [], [[] for _ in range(max(devs) + 1)]
    grab, drop = ("segment_map", "segment_unmap") if expandable else ("segment_alloc",
                                                                         "segment_free")
    for d in devs:
        nxt = BASE + d * (1 << 40)
        free_segs, live, pending = [], {}, {}  # addr -> (seg size, req, stream)
        evs, t = [], 0
        for _ in range(n_events):
            t += rng.choice([1, 2, 3, -1])  # time_us may step back: never read
            r = rng.random()
            if r < 0.45 or not live:
                req = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 2 * MB),
                                  rng.randrange(1, 64 * MB), 0, 512 * rng.randrange(1, 9)])
                st = rng.choice(streams)
                size = max(512, (req + 511) // 512 * 512)
                fit = [s for s in free_segs if s[1] >= size and s[2] == st]
                if fit:
                    a, ssize, _ = min(fit, key=lambda s: s[1])
                    free_segs.remove((a, ssize, st))
                else:
                    ssize = 2 * MB if size <= MB else (size + 2 * MB - 1) // (2 * MB) * 2 * MB
                    a = nxt
                    nxt += ssize + 2 * MB
                    evs.append(ev(grab, a, ssize, st, t))
                evs.append(ev("alloc", a, req, st, t))
                live[a] = (ssize, req, st)
            elif r < 0.8:
                a = rng.choice(sorted(live))
                ssize, req, st = live.pop(a)
                evs.append(ev("free_requested", a, req, st, t))
                if rng.random() < 0.2:
                    pending[a] = (ssize, req, st)
                else:
                    evs.append(ev("free_completed", a, req, st, t))
                    free_segs.append((a, ssize, st))
            elif r < 0.88 and pending:
                a = rng.choice(sorted(pending))
                ssize, req, st = pending.pop(a)
                evs.append(ev("free_completed", a, req, st, t))
                free_segs.append((a, ssize, st))
            elif r < 0.93 and free_segs:
                for a, ssize, st in list(free_segs):  # empty_cache()
                    evs.append(ev(drop, a, ssize, st, t))
                free_segs = []
            elif r < 0.96:
                evs.append(user_defined(t) if rng.random() < 0.5 else ev("snapshot", 0, 0, 0, t))
            else:
                evs.append(ev("oom", rng.randrange(1 << 30), rng.randrange(1, 1 << 36),
                              rng.choice(streams), t))
        keep = rng.randrange(1, len(evs) + 1)  # the ring buffer keeps the newest entries
        evs = evs[len(evs) - keep:]
        if rng.random() < 0.3:
            for e in evs:
                e.pop("time_us", None)
        if rng.random() < 0.5:
            for e in evs:
                e["frames"] = [] if rng.random() < 0.5 else [
                    {"filename": "model.py", "name": "forward", "line": rng.randrange(1, 999)}]
        traces[d] = evs
        for a, (ssize, req, st) in live.items():
            size = max(512, (req + 511) // 512 * 512)
            bl = [blk(a, size, "active_allocated", req)]
            if ssize > size:
                bl.append(blk(a + size, ssize - size, "inactive"))
            segments.append(seg(d, a, ssize, st, bl, expandable))
        for a, (ssize, req, st) in pending.items():
            size = max(512, (req + 511) // 512 * 512)
            bl = [blk(a, size, "active_pending_free", req)]
            if ssize > size:
                bl.append(blk(a + size, ssize - size, "inactive"))
            segments.append(seg(d, a, ssize, st, bl, expandable))
        for a, ssize, st in free_segs:
            segments.append(seg(d, a, ssize, st, [blk(a, ssize, "inactive")], expandable))
    rng.shuffle(segments)
    return snapshot(segments, traces, expandable)


# ---- running the tool and checking what it prints ----

def run(tool, args, timeout=60):
    try:
        p = subprocess.run([tool, "--quiet"] + args, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        fail("%s: timed out after %d s" % (" ".join(map(os.fsdecode, args)), timeout))
        return None
    p.stderr = p.stderr.decode("utf-8", "replace")
    try:  # JSON is UTF-8 (RFC 8259), whatever bytes the file's name holds
        p.stdout = p.stdout.decode("utf-8" if "--json" in args else "latin-1")
    except UnicodeDecodeError as e:
        fail("%s: the output is not UTF-8: %s" % (" ".join(map(os.fsdecode, args)), e))
        p.stdout = p.stdout.decode("utf-8", "replace")
    if p.returncode < 0 or p.returncode > 2:
        fail("%s: exit status %d (crash?): %s" % (" ".join(map(os.fsdecode, args)), p.returncode,
                                                  p.stderr[-400:].decode("utf-8", "replace")))
        return None
    return p


def numbers(obj, where, label):
    if isinstance(obj, dict):
        for k, v in obj.items():
            numbers(v, where, label + "." + k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            numbers(v, where, "%s[%d]" % (label, i))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        if isinstance(obj, float) and not math.isfinite(obj):
            fail("%s: %s is %r" % (where, label, obj))
        elif obj < 0 and label not in (".first_oom_event",):
            fail("%s: %s is negative (%r)" % (where, label, obj))


def json_lines(p, where):
    rows = []
    for line in p.stdout.splitlines():
        if "nan" in line.lower().replace("nanos", "") or "inf" in line.lower().split('"config"')[0]:
            fail("%s: NaN or infinity in %s" % (where, line[:200]))
        try:
            rows.append(json.loads(line))
        except ValueError as e:
            fail("%s: not JSON (%s): %s" % (where, e, line[:200]))
            continue
        numbers(rows[-1], where, "")
    return rows


def check_rows(rows, where):
    for r in rows:
        if "peak_reserved" in r and r.get("num_ooms", 0) == 0 and r.get("errors", 0) == 0:
            if r["peak_reserved"] < r["peak_requested"]:
                fail("%s: %s: peak reserved %d < peak requested %d" % (
                    where, r.get("trace"), r["peak_reserved"], r["peak_requested"]))


def check_file(tool, path, expect, deep):
    name = os.fsdecode(os.path.basename(path))
    for model in ("expseg", "pytorch"):
        where = "%s --model %s" % (name, model)
        p = run(tool, ["--json", "--allow-oom", "--model", model, path])
        if p is None:
            return
        if expect is not None and not isinstance(expect, dict):
            if p.returncode != 2 or expect not in p.stderr or name not in p.stderr:
                fail("%s: expected exit status 2 and a message with %r naming the file, got "
                     "%d: %s" % (where, expect, p.returncode, p.stderr.strip()[:300]))
            return
        if p.returncode != 0:
            fail("%s: exit status %d: %s" % (where, p.returncode, p.stderr.strip()[:300]))
            return
        rows = json_lines(p, where)
        if not rows:
            fail("%s: no row" % where)
        check_rows(rows, where)
        for k, v in (expect or {}).items():  # figures the file fixes
            if rows and rows[0].get(k) != v:
                fail("%s: %s is %r, expected %r" % (where, k, rows[0].get(k), v))
    if not deep:
        return
    for r in rows:  # on half the memory it needs: OOMs, each counted and placed
        half = max(r["peak_reserved"] // 2, 1 << 20)
        p = run(tool, ["--json", "--allow-oom", "--check", "--model", r["model"],
                       "--capacity", str(half), path])
        got = [x for x in json_lines(p, name + " half") if x["trace"] == r["trace"]] if p else []
        if not p or p.returncode != 0 or not got or got[0]["errors"] or (
                (got[0]["num_ooms"] > 0) != (got[0]["first_oom_event"] != -1)) or (
                got[0]["first_oom_event"] < -2) or got[0]["peak_reserved"] > half:
            fail("%s --capacity %d: %s" % (name, half, (p and p.stderr[-300:], got[:1])))
    tl = os.path.join(os.fsdecode(os.path.dirname(path)), "timeline.csv")
    p = run(tool, ["--allow-oom", "--timeline", tl, "--timeline-every", "1", path])
    try:
        with open(tl, newline="", encoding="utf-8", errors="surrogateescape") as f:
            got = list(csv.reader(f))
    except OSError:
        got = []
    if p is None or p.returncode != 0 or not got or any(
            len(r) != 8 or not all(x.lstrip("-").isdigit() for x in r[1:]) for r in got[1:]):
        fail("%s --timeline: rows that are not the header's 8 fields: %s" % (
            name, [r for r in got[1:] if len(r) != 8][:2]))
    if len(rows) == 1:  # one history: the HTML report too
        page = os.path.join(os.fsdecode(os.path.dirname(path)), "report.html")
        p = run(tool, ["--allow-oom", "--report", page, path], timeout=120)
        text = ""
        if p is not None and os.path.exists(page):
            try:
                text = open(page, encoding="utf-8").read()
            except UnicodeDecodeError as e:
                fail("%s --report: the page is not UTF-8: %s" % (name, e))
        if p is None or p.returncode != 0 or "</html>" not in text or "NaN" in text or (
                "Infinity" in text) or "<img" in text:
            fail("%s --report: exit status %s, %d bytes written: %s" % (
                name, p and p.returncode, len(text), p and p.stderr.strip()[:300]))
    p = run(tool, ["--sweep", "--json", "--allow-oom", path], timeout=120)
    said = [x for x in p.stderr.splitlines() if "cannot rebuild" in x] if p else []
    if len(said) != len(set(said)):
        fail("%s --sweep: a warning said %d times instead of once: %s" % (
            name, len(said), said[0][:200]))
    if p is not None:
        rows = json_lines(p, name + " --sweep")
        check_rows(rows, name + " --sweep")
        by = {}
        for r in rows:
            by.setdefault((r["trace"], r["section"]), []).append(r)
        for key, rs in by.items():
            ranks = sorted(r["rank"] for r in rs)
            if ranks != list(range(1, len(rs) + 1)):
                fail("%s --sweep: %s: ranks %s" % (name, key, ranks))
            best = [r for r in rs if "best" in r["flags"]]
            clean = [r for r in rs if r["num_ooms"] == 0 and r["errors"] == 0]
            if clean and len(clean) < len(rs) and max(r["rank"] for r in clean) > min(
                    r["rank"] for r in rs if r not in clean):
                fail("%s --sweep: %s: a row with an OOM or a failure ranks above a clean one"
                     % (name, key))
            least = min((r["peak_reserved"] for r in clean), default=0)
            for r in clean:  # near-best: within 1 % of the least peak reserved
                if ("near-best" in r["flags"]) != (r["peak_reserved"] <= least * (1.0 + 0.01)):
                    fail("%s --sweep: %s '%s': near-best flag %s at %d (least %d)" % (
                        name, key, r["setting"], "near-best" in r["flags"],
                        r["peak_reserved"], least))
            # best: the first clean row; in expseg's section never one that holds more
            # than expseg's defaults (the row `expseg`, docs/replay.md "The sweep")
            dflt = [r["peak_reserved"] for r in clean if r["setting"] == "expseg"]
            ok = [r for r in clean if not dflt or r["peak_reserved"] <= dflt[0]]
            if len(best) != (1 if ok else 0) or (best and best[0]["rank"] != min(
                    r["rank"] for r in ok)):
                fail("%s --sweep: %s: %d rows flagged best (%s)" % (
                    name, key, len(best), [(r["rank"], r["setting"]) for r in best]))
        for r in rows:  # each row is the plain replay of its model and configuration
            q = run(tool, ["--json", "--allow-oom", "--model", r["model"], "--conf",
                           r["config"], path])
            one = [x for x in json_lines(q, name) if x["trace"] == r["trace"]] if q else []
            keys = ("peak_reserved", "peak_requested", "num_device_alloc", "num_device_free",
                    "num_ooms", "warm_start", "driver_ms")
            if not one or any(one[0][k] != r[k] for k in keys):
                fail("%s --sweep: %s '%s' differs from its plain replay: %s" % (
                    name, r["trace"], r["setting"],
                    [(k, r[k], one[0][k]) for k in keys if one and one[0][k] != r[k]]))
    p = run(tool, ["--fit", "--json", path], timeout=120)
    if p is None or p.returncode != 0:
        if p is not None:
            fail("%s --fit: exit status %d: %s" % (name, p.returncode, p.stderr[-300:]))
        return
    for f in json_lines(p, name + " --fit"):
        where = "%s --fit %s %s" % (name, f["trace"], f["model"])
        q = run(tool, ["--json", "--model", f["model"], path])
        peak = [r for r in json_lines(q, where) if r["trace"] == f["trace"]]
        if not peak:
            fail("%s: no unconstrained row" % where)
            continue
        # one chunk: expseg's largest (chunk_max_mb 8), PyTorch's large segment (20 MiB)
        chunk = 8 * MB if f["model"] == "expseg" else 20 * MB
        limit = (peak[0]["peak_reserved"] + 2 * MB - 1) // (2 * MB) * (2 * MB) + chunk
        if f["fit_capacity"] > limit:
            fail("%s: fit %d above the peak reserved %d plus one chunk" % (
                where, f["fit_capacity"], peak[0]["peak_reserved"]))
        q = run(tool, ["--json", "--allow-oom", "--model", f["model"], "--capacity",
                       str(f["fit_capacity"]), path])  # other devices may not fit
        rows = [r for r in json_lines(q, where) if r["trace"] == f["trace"]]
        if q is None or q.returncode != 0 or not rows or rows[0]["num_ooms"] != 0:
            fail("%s: the fit capacity %d does not run it without an OOM" % (
                where, f["fit_capacity"]))
        elif rows[0]["capacity"] != f["fit_capacity"]:
            fail("%s: the fit names %d bytes, the replay ran on %d" % (
                where, f["fit_capacity"], rows[0]["capacity"]))


def write(d, name, obj, proto):
    path = os.path.join(os.fsencode(d), os.fsencode(name) + b".pickle")
    with open(path, "wb") as f:
        f.write(obj if isinstance(obj, bytes) else pickle.dumps(obj, protocol=proto))
    return path


def cli_cases(tool, d, good):
    """Bad flag values, conflicting flags, outputs that cannot be created: exit status 2
    with a message, before any replay; stdout that cannot be written: exit status 1."""
    missing = os.path.join(d, "no", "such", "dir")
    cases = [["--limit", "-1", good], ["--limit", "x", good], ["--capacity", "0", good],
             ["--capacity", "12Q", good], ["--model", "tensorflow", good],
             ["--device", "-3", good], ["--timeline-every", "0", "--timeline",
                                        os.path.join(d, "t.csv"), good],
             ["--fit", "--sweep", good], ["--fit", "--capacity", "10M", good],
             ["--fit", "--timeline", os.path.join(d, "t.csv"), good],
             ["--snapshot-at", "end", good],
             ["--snapshot", os.path.join(missing, "s.pickle"), good],
             ["--timeline", os.path.join(missing, "t.csv"), good],
             ["--report", os.path.join(missing, "r.html"), good],
             ["--costs", os.path.join(missing, "c.txt"), good], ["--json", d],
             ["--conf", "expandable_segments:Maybe", good], [good, "--no-such-flag"],
             ["--synth", "train:1:-1"], ["--synth", "nope"]]
    for args in cases:
        p = run(tool, args)
        if p is not None and (p.returncode != 2 or not p.stderr.strip()):
            fail("expseg-replay %s: expected exit status 2 with a message, got %d (%s)" % (
                " ".join(args), p.returncode, p.stderr.strip()[:200]))
    costs = os.path.join(d, "costs.txt")  # as an editor may save it: a BOM, CRLF, a tab
    with open(costs, "wb") as f:
        f.write(b"\xef\xbb\xbfcreate 7.5\r\n# comment\r\nrelease\t2\r\n")
    p = run(tool, ["--json", "--costs", costs, good])
    if p is None or p.returncode != 0:
        fail("--costs with a BOM and CRLF: exit status %s: %s" % (
            p and p.returncode, p and p.stderr[:200]))
    if not os.path.exists("/dev/full"):
        return
    for args in (["--json"], ["--sweep"], ["--fit"]):  # stdout on a full disk: status 1
        with open("/dev/full", "w") as full:
            p = subprocess.run([tool, "--quiet"] + args + [good], stdout=full,
                               stderr=subprocess.PIPE, timeout=60)
        if p.returncode != 1 or b"writing the output failed" not in p.stderr:
            fail("expseg-replay %s > /dev/full: expected exit status 1 with a message, got %d "
                 "(%s)" % (" ".join(args), p.returncode, p.stderr.strip()[:200]))


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    tool, seed, n_random, keep, n_deep = args[0], 1, 12, None, 4
    if "--seed" in args:
        seed = int(args[args.index("--seed") + 1])
    if "--random" in args:
        n_random = int(args[args.index("--random") + 1])
    if "--deep" in args:
        n_deep = int(args[args.index("--deep") + 1])
    if "--keep" in args:
        keep = args[args.index("--keep") + 1]
    print("seed %d, %d random histories" % (seed, n_random))
    with tempfile.TemporaryDirectory() as tmp:
        d = keep or tmp
        os.makedirs(d, exist_ok=True)
        deep = {"proto4", "annotations", "devices_0_2", "expandable", "only_frees",
                "oom_then_release", "odd_sizes", "start_state_not_rebuildable",
                "opcodes_recoded", "only_user_defined", "zero_size",
                "recorded_setting_newer_key"}
        for name, obj, proto, expect in hand_picked():
            check_file(tool, write(d, name, obj, proto), expect, name in deep)
        # a file name with a quote, a backslash, a control character, markup and bytes that
        # are not UTF-8: every JSON line stays valid (checked in run), the page escapes it
        check_file(tool, write(d, os.fsdecode(b'name,"\\\x01<img src=x>\xff\xfe\xc3'),
                               pickle.loads(pickle.dumps(snapshot(*basic()[:1], [basic()[1]]))),
                               4), None, True)
        rng = random.Random(seed)
        for i in range(n_random):
            exp = rng.random() < 0.4
            obj = random_history(rng, rng.randrange(5, 120), exp)
            proto = rng.choice([2, 3, 4, 5])
            path = write(d, "random%d_%s" % (i, "exp" if exp else "classic"), obj, proto)
            before = len(FAILS)
            check_file(tool, path, None, i < n_deep)
            if len(FAILS) > before:
                print("  (seed %d, history %d, protocol %d)" % (seed, i, proto))
        cli_cases(tool, d, os.path.join(d, "proto4.pickle"))
    print("%d failure(s)" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
