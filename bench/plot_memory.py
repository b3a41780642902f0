#!/usr/bin/env python3
"""plot_memory.py: memory held over time for one workload under several allocator settings.

Runs expseg-replay once per setting with --timeline, then draws live requested bytes and
each setting's reserved bytes against the event index, as a self-contained SVG written by
hand (no matplotlib needed). Usage (from the repository root):

  python3 bench/plot_memory.py --replay build-bench/bench/expseg-replay \
      --trace ../shared/traces/memtrace/ftcourse_qlora_finetune.dev0.memtrace \
      --out docs/memory_over_time.svg

Settings default to classic (expandable_segments:False) and expandable
(expandable_segments:True); add or replace them with --setting LABEL=CONF (repeatable).
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
    summary = json.loads(res.stdout.splitlines()[0])
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            rows.append((int(r["event"]), int(r["live_requested"]), int(r["reserved"])))
    os.unlink(path)
    return summary, rows, " ".join(cmd)


def nice_step(span, ticks=6):
    raw = span / ticks
    mag = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def svg(title, series, live, out):
    W, H, L, R, T, B = 960, 480, 80, 20, 50, 60
    xmax = max(x for s in series for x, _ in s[2]) or 1
    ymax = max(max(y for s in series for _, y in s[2]), max(y for _, y in live)) / GIB
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

    def poly(points, color, width, dash=""):
        pts = " ".join("%.1f,%.1f" % (px(a), py(b)) for a, b in points)
        d = ' stroke-dasharray="%s"' % dash if dash else ""
        o.append('<polyline fill="none" stroke="%s" stroke-width="%g"%s points="%s"/>'
                 % (color, width, d, pts))

    legend = []
    for i, (label, peak, pts) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        poly(pts, c, 1.8)
        legend.append((c, "%s: reserved (peak %.2f GiB)" % (label, peak / GIB), ""))
    poly(live, "#000", 1.2, "4,3")
    legend.append(("#000", "live requested (peak %.2f GiB)" % (max(y for _, y in live) / GIB), "4,3"))
    for i, (c, text, dash) in enumerate(legend):
        yy = T + 16 + 18 * i
        d = ' stroke-dasharray="%s"' % dash if dash else ""
        o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>'
                 % (L + 12, yy, L + 40, yy, c, d))
        o.append('<text x="%d" y="%d">%s</text>' % (L + 46, yy + 4, escape(text)))
    o.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replay", default="build-bench/bench/expseg-replay")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--out", default="docs/memory_over_time.svg")
    ap.add_argument("--setting", action="append", default=[], metavar="LABEL=CONF")
    ap.add_argument("--every", type=int, default=10, help="sample every N events")
    ap.add_argument("--driver", default=None)
    a = ap.parse_args()
    settings = [s.split("=", 1) for s in a.setting] or [
        ["classic", "expandable_segments:False"], ["expandable", "expandable_segments:True"]]
    series, live, name = [], None, None
    for label, conf in settings:
        summary, rows, cmd = replay(a.replay, a.trace, conf, a.every, a.driver)
        print(cmd, file=sys.stderr)
        name = summary["trace"]
        series.append((label, summary["peak_reserved"], [(e, r) for e, _, r in rows]))
        if live is None:
            live = [(e, l) for e, l, _ in rows]
        print("%s: peak_reserved %d, peak_requested %d, ratio %.3f"
              % (label, summary["peak_reserved"], summary["peak_requested"], summary["ratio"]))
    svg("%s: memory held over time" % name, series, live, a.out)
    print("wrote %s" % a.out)


if __name__ == "__main__":
    main()
