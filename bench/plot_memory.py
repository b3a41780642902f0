#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""plot_memory.py: allocated, reserved and cached memory of one replay with the true peaks
marked (--timeline, --csv), or the memory a snapshot's own history records (--snapshot), as
a self-contained SVG written by hand (no matplotlib needed). Memory over time under every
allocator setting, side by side, is expseg-replay --report FILE.html (docs/replay.md).

With --timeline (one setting, --setting LABEL=CONF, default expandable_segments:True) it
replays with expseg-replay --timeline and draws allocated, reserved and cached bytes and
marks the peaks of the statistics (reserved_bytes.all.peak, allocated_bytes.all.peak) at the
event where they were reached: the replay writes that event as a row, so the mark is the
statistic, not the largest sample. --csv FILE plots a timeline already written by
expseg-replay --timeline; --json prints the plotted peaks. Usage (from the repository root):

  python3 bench/plot_memory.py --timeline --replay build/bench/expseg-replay \
      --trace ../shared/traces/raw/ftcourse_qlora_finetune.pickle --out docs/memory_timeline.svg
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from xml.sax.saxutils import escape

COLORS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
GIB = float(1 << 30)


def replay(tool, trace, conf, every, driver):
    fd, path = tempfile.mkstemp(suffix=".csv")
    os.close(fd)
    cmd = [tool, "--json", "--quiet", "--conf", conf, "--timeline", path,
           "--timeline-every", str(every)]
    if driver:
        cmd += ["--driver", driver]
    cmd.append(trace)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit("plot_memory: %s failed (%d): %s" % (" ".join(cmd), res.returncode, res.stderr))
    return " ".join(cmd), path


def nice_step(span, ticks=6):
    raw = span / ticks
    mag = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def chart(title, lines, markers, out):
    """lines: (legend, color, width, dash, [(x, bytes)]); markers: (x, bytes, color, text)."""
    W, H, L, R, T, B = 960, 480, 80, 20, 50, 60
    xmax = max(x for ln in lines for x, _ in ln[4]) or 1
    ymax = max([y for ln in lines for _, y in ln[4]] + [m[1] for m in markers]) / GIB
    ystep = nice_step(ymax) if ymax > 0 else 1
    ytop = ystep * (int(ymax / ystep) + 1)
    xstep = nice_step(xmax)

    def px(x):
        return L + (W - L - R) * x / xmax

    def py(y):
        return H - B - (H - T - B) * (y / GIB) / ytop

    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
         'viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">' % (W, H, W, H),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="24" font-size="15" font-weight="bold">%s</text>' % (L, escape(title))]
    y = 0.0
    while y <= ytop + 1e-9:
        yy = H - B - (H - T - B) * y / ytop
        o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, yy, W - R, yy))
        o.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (L - 6, yy + 4, round(y, 3)))
        y += ystep
    x = 0.0
    while x <= xmax:
        xx = px(x)
        o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>' % (xx, T, xx, H - B))
        o.append('<text x="%.1f" y="%d" text-anchor="middle">%d</text>' % (xx, H - B + 16, x))
        x += xstep
    o.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>'
             % (L, T, W - L - R, H - T - B))
    o.append('<text x="%d" y="%d" text-anchor="middle">event index</text>' % ((L + W - R) / 2, H - 20))
    o.append('<text transform="translate(20,%d) rotate(-90)" text-anchor="middle">GiB</text>'
             % ((T + H - B) / 2))
    for _, color, width, dash, points in lines:
        pts = " ".join("%.1f,%.1f" % (px(a), py(b)) for a, b in points)
        d = ' stroke-dasharray="%s"' % dash if dash else ""
        o.append('<polyline fill="none" stroke="%s" stroke-width="%g"%s points="%s"/>'
                 % (color, width, d, pts))
    for i, (x, y, color, text) in enumerate(markers):
        o.append('<circle class="peak" cx="%.1f" cy="%.1f" r="5" fill="none" stroke="%s" '
                 'stroke-width="2"/>' % (px(x), py(y), color))
        left = px(x) > (L + W - R) / 2  # the label goes to the side with more room
        o.append('<text x="%.1f" y="%.1f" text-anchor="%s" fill="%s">%s</text>'
                 % (px(x) + (-8 if left else 8), py(y) - 8 - 14 * i, "end" if left else "start",
                    color, escape(text)))
    for i, (legend, color, _, dash, _) in enumerate(lines):
        yy = T + 16 + 18 * i
        d = ' stroke-dasharray="%s"' % dash if dash else ""
        o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>'
                 % (L + 12, yy, L + 40, yy, color, d))
        o.append('<text x="%d" y="%d">%s</text>' % (L + 46, yy + 4, escape(legend)))
    o.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")


def read_timeline(path):
    """Rows of expseg-replay --timeline: the first trace in the file."""
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            if rows and r["trace"] != rows[0]["trace"]:
                break
            rows.append(r)
    if not rows or "reserved_peak" not in rows[0]:
        sys.exit("plot_memory: %s has no rows with the peak columns (expseg-replay --timeline)" % path)
    return rows


def timeline_plot(rows, title, out):
    """Allocated, reserved and cached bytes of one replay; the peaks of the statistics marked
    where they were reached (the replay writes that event as a row), at their exact value."""
    ev = [int(r["event"]) for r in rows]
    col = {k: [int(r[k]) for r in rows] for k in
           ("live_requested", "allocated", "reserved", "cached", "reserved_peak", "allocated_peak")}
    peaks = {}
    for k in ("reserved", "allocated"):
        final = col[k + "_peak"][-1]
        at = next(i for i, v in enumerate(col[k + "_peak"]) if v == final)
        peaks[k] = (final, ev[at])
    lines = [("reserved (peak %.3f GiB)" % (peaks["reserved"][0] / GIB), COLORS[0], 1.8, "",
              list(zip(ev, col["reserved"]))),
             ("allocated (peak %.3f GiB)" % (peaks["allocated"][0] / GIB), COLORS[1], 1.8, "",
              list(zip(ev, col["allocated"]))),
             ("cached physical pages", COLORS[2], 1.5, "", list(zip(ev, col["cached"]))),
             ("live requested", "#000", 1.0, "4,3", list(zip(ev, col["live_requested"])))]
    markers = [(peaks["reserved"][1], peaks["reserved"][0], COLORS[0],
                "peak reserved %.3f GiB (event %d)" % (peaks["reserved"][0] / GIB, peaks["reserved"][1])),
               (peaks["allocated"][1], peaks["allocated"][0], COLORS[1],
                "peak allocated %.3f GiB (event %d)" % (peaks["allocated"][0] / GIB, peaks["allocated"][1]))]
    chart(title, lines, markers, out)
    return {"peak_reserved": peaks["reserved"][0], "peak_reserved_event": peaks["reserved"][1],
            "peak_allocated": peaks["allocated"][0], "peak_allocated_event": peaks["allocated"][1],
            "line_max_reserved": max(col["reserved"]), "line_max_allocated": max(col["allocated"]),
            "rows": len(rows)}


def snapshot_series(path, device=0):
    """From a snapshot pickle (expseg's or PyTorch's, with a history): live requested bytes
    (alloc .. free_completed, as the viewer counts them) and mapped bytes (the viewer's
    reserved: segment_alloc/map .. segment_free/unmap) after every event, walked backwards
    from the end state to the start as the viewer does, then forwards. Exact: every event is
    a point, so the maxima are the true peaks of what the history records."""
    import pickle
    with open(path, "rb") as f:
        snap = pickle.load(f)
    trace = snap["device_traces"][device] if device < len(snap["device_traces"]) else []
    if not trace:
        sys.exit("plot_memory: %s has no history for device %d" % (path, device))
    segs = [s for s in snap["segments"] if s["device"] == device]
    live = sum(b["requested_size"] for s in segs for b in s["blocks"]
               if b["state"] in ("active_allocated", "active_pending_free"))
    mapped = sum(s["total_size"] for s in segs)
    step = {"alloc": (1, 0), "free_completed": (-1, 0), "segment_alloc": (0, 1),
            "segment_map": (0, 1), "segment_free": (0, -1), "segment_unmap": (0, -1)}
    for e in reversed(trace):
        dl, dm = step.get(e["action"], (0, 0))
        live -= dl * e["size"]
        mapped -= dm * e["size"]
    pts = []
    for i, e in enumerate(trace):
        dl, dm = step.get(e["action"], (0, 0))
        live += dl * e["size"]
        mapped += dm * e["size"]
        pts.append((i, live, mapped))
    return snap, pts


def snapshot_plot(path, out):
    _, pts = snapshot_series(path)
    ev = [p[0] for p in pts]
    live = [p[1] for p in pts]
    mapped = [p[2] for p in pts]
    cached = [m - l for _, l, m in pts]
    pl = max(range(len(pts)), key=lambda i: live[i])
    pm = max(range(len(pts)), key=lambda i: mapped[i])
    lines = [("reserved: mapped segments (peak %.3f GiB)" % (mapped[pm] / GIB), COLORS[0], 1.8, "",
              list(zip(ev, mapped))),
             ("allocated: live requested (peak %.3f GiB)" % (live[pl] / GIB), COLORS[1], 1.8, "",
              list(zip(ev, live))),
             ("cached: reserved - allocated", COLORS[2], 1.5, "", list(zip(ev, cached)))]
    markers = [(ev[pm], mapped[pm], COLORS[0], "peak reserved %.3f GiB (event %d)" % (mapped[pm] / GIB, ev[pm])),
               (ev[pl], live[pl], COLORS[1], "peak allocated %.3f GiB (event %d)" % (live[pl] / GIB, ev[pl]))]
    name = os.path.basename(path)
    chart("%s: memory over the recorded history" % name, lines, markers, out)
    return {"peak_mapped": mapped[pm], "peak_mapped_event": ev[pm], "peak_requested": live[pl],
            "peak_requested_event": ev[pl], "events": len(pts)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replay", default="build-bench/bench/expseg-replay")
    ap.add_argument("--trace")
    ap.add_argument("--timeline", action="store_true",
                    help="one setting: allocated, reserved and cached over time, peaks marked")
    ap.add_argument("--csv", help="plot this expseg-replay --timeline file instead of replaying")
    ap.add_argument("--snapshot", help="plot the history of this snapshot pickle (expseg's or PyTorch's)")
    ap.add_argument("--json", action="store_true", help="print the plotted peaks as JSON")
    ap.add_argument("--out", default="memory_timeline.svg")
    ap.add_argument("--setting", action="append", default=[], metavar="LABEL=CONF",
                    help="the setting --timeline replays (default expandable_segments:True)")
    ap.add_argument("--every", type=int, default=10, help="sample every N events")
    ap.add_argument("--driver", default=None)
    a = ap.parse_args()
    if a.snapshot:
        res = snapshot_plot(a.snapshot, a.out)
        print(json.dumps(res) if a.json else "wrote %s: peak mapped %d at event %d, peak live "
              "requested %d at event %d" % (a.out, res["peak_mapped"], res["peak_mapped_event"],
                                            res["peak_requested"], res["peak_requested_event"]))
        return
    if a.csv or a.timeline:
        path = a.csv
        if not path:
            if not a.trace:
                sys.exit("plot_memory: --timeline needs --trace (or --csv)")
            conf = a.setting[0].split("=", 1)[1] if a.setting else "expandable_segments:True"
            cmd, path = replay(a.replay, a.trace, conf, a.every, a.driver)
            print(cmd, file=sys.stderr)
        rows = read_timeline(path)
        res = timeline_plot(rows, "%s: memory over time" % rows[0]["trace"], a.out)
        if not a.csv:
            os.unlink(path)
        print(json.dumps(res) if a.json else "wrote %s: peak reserved %d at event %d, peak "
              "allocated %d at event %d" % (a.out, res["peak_reserved"], res["peak_reserved_event"],
                                            res["peak_allocated"], res["peak_allocated_event"]))
        return
    sys.exit("plot_memory: give --timeline (with --trace), --csv or --snapshot; memory over "
             "time under every setting is expseg-replay --report FILE.html")

if __name__ == "__main__":
    main()
