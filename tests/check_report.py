#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""check_report.py: expseg-replay --report FILE.html against the --json lines of the same run.

  check_report.py REPLAY [--browser] [--traces DIR]

Runs `REPLAY --synth train:1:0.25 --json --report r.html`, the same at scale 13 (too big
for a 24 GiB card), (and, when DIR holds it, a recorded
PyTorch snapshot, so the recorded line and the recorded setting are checked too), then reads
the page, from the file or (--browser) from the DOM headless Chromium rendered, and checks
that every figure on it (the elements with data- attributes) equals the JSON's: each sweep
row's rank, peak reserved, ratio, device allocations + frees, driver ms, OOMs and flags; the
answer (the rows flagged "best", the setting you have now, fits on a 24 GiB card); the
segments at the peak (they add up to the row's peak reserved). --browser also fails on any
console message or uncaught error Chromium logs, and on a page that loads anything. It skips
(exit 77, saying why) when chromium is not installed. Also checks the refusals of bad
--report arguments. The CTest tests replay_report (label cpu) and replay_report_browser
(label browser) run it.
"""
import html.parser
import json
import os
import shutil
import subprocess
import sys
import tempfile

GIB = 1 << 30
CARD = 24 * GIB


class Page(html.parser.HTMLParser):
    """Elements by id, table rows with their data-field cells, and every attribute seen."""

    def __init__(self):
        super().__init__()
        self.ids, self.rows, self.row, self.stack, self.urls = {}, [], None, [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k, v in attrs:
            if k in ("src", "href") or (v and "url(" in v):
                self.urls.append((tag, k, v))
        if tag in ("script", "link", "img", "iframe", "object"):
            self.urls.append((tag, "", ""))
        el = {"tag": tag, "attrs": a, "text": ""}
        if "id" in a:
            self.ids[a["id"]] = el
        if tag == "tr" and "data-setting" in a:
            self.row = {"attrs": a, "cells": {}, "texts": {}}
            self.rows.append(self.row)
        if tag == "td" and self.row is not None and "data-field" in a:
            self.row["cells"][a["data-field"]] = a["data-value"]
            self.row["texts"][a["data-field"]] = el
        self.stack.append(el)

    def handle_endtag(self, tag):
        if tag == "tr":
            self.row = None
        while self.stack:
            el = self.stack.pop()
            if el["tag"] == tag:
                break

    def handle_data(self, data):
        for el in self.stack:
            el["text"] += data


def human(b):  # _expseg_human
    if b >= GIB:
        return "%.2f GiB" % (b / GIB)
    if b >= 1048576:
        return "%.1f MiB" % (b / 1048576)
    return "%.0f B" % b


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def render(page, browser):
    """The DOM after Chromium ran the page, and its log (console messages, errors)."""
    cmd = [browser, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr",
           "--v=0", "--virtual-time-budget=2000", "--dump-dom", "file://" + page]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    check(res.returncode == 0, "%s exited %d: %s" % (" ".join(cmd), res.returncode, res.stderr[-2000:]))
    bad = [ln for ln in res.stderr.splitlines()
           if "CONSOLE" in ln or "Uncaught" in ln or "Failed to load" in ln or "net::ERR" in ln]
    check(not bad, "the browser logged:\n" + "\n".join(bad))
    check("<body" in res.stdout, "no DOM dumped")
    return res.stdout


def compare(dom, rows, label):
    p = Page()
    p.feed(dom)
    check(not p.urls, "%s: the page loads or links something: %s" % (label, p.urls[:3]))
    check(len(p.rows) == len(rows), "%s: %d table rows, %d JSON rows" % (label, len(p.rows), len(rows)))
    by = {(r["attrs"]["data-section"], r["attrs"]["data-setting"]): r for r in p.rows}
    for j in rows:
        key = (j["section"], j["setting"])
        check(key in by, "%s: no table row for %s" % (label, key))
        c, a = by[key]["cells"], by[key]["attrs"]
        want = {"peak_reserved": str(j["peak_reserved"]), "ratio": "%.4f" % j["ratio"],
                "driver_ms": "%.3f" % j["driver_ms"], "num_ooms": str(j["num_ooms"]),
                "window_device_alloc_free": str(j["window_device_alloc"] + j["window_device_free"])}
        for k, v in want.items():
            check(c.get(k) == v, "%s %s: %s is %s on the page, %s in JSON" % (label, key, k, c.get(k), v))
        shown = {"peak_reserved": "FAILED" if j["errors"] else human(j["peak_reserved"]),
                 "ratio": "%.3f" % j["ratio"], "driver_ms": "%.1f" % j["driver_ms"],
                 "num_ooms": str(j["num_ooms"]), "window_device_alloc_free": want["window_device_alloc_free"]}
        for k, v in shown.items():
            text = by[key]["texts"][k]["text"].strip()
            check(text == v, "%s %s: %s reads %r on the page, %r from JSON" % (label, key, k, text, v))
        check(a["data-rank"] == str(j["rank"]), "%s %s: rank %s vs %s" % (label, key, a["data-rank"], j["rank"]))
        flags = set(filter(None, c.get("flags", "").split(",")))
        check(flags == set(j["flags"]), "%s %s: flags %s vs %s" % (label, key, flags, j["flags"]))

    def fig(i):
        check(i in p.ids, "%s: no element #%s" % (label, i))
        el = p.ids[i]
        b = int(el["attrs"]["data-bytes"])
        check(el["text"].strip() == human(b), "%s: #%s reads %r, its data-bytes %d is %r"
              % (label, i, el["text"], b, human(b)))
        return b

    best = {j["section"]: j for j in rows if "best" in j["flags"]}
    check(set(best) == {"pytorch", "expseg"}, "%s: JSON flags no best row per section" % label)
    for sec in ("pytorch", "expseg"):
        j = best[sec]
        check(fig("answer-" + sec) == j["peak_reserved"],
              "%s: the answer's %s figure is not the best row's peak_reserved" % (label, sec))
        conf = p.ids["answer-%s-conf" % sec]["text"]
        check(conf.endswith(j["config"].split(",")[0]) or "expandable_segments" in conf,
              "%s: the answer's %s setting %r" % (label, sec, conf))
        fits = p.ids["fits-" + sec]["attrs"]["data-fits"]
        check(fits == ("yes" if j["peak_reserved"] <= CARD else "no"),
              "%s: fits-%s says %s for %d bytes" % (label, sec, fits, j["peak_reserved"]))
        segs = p.ids["segs-" + sec]["attrs"]
        check(int(segs["data-total"]) == j["peak_reserved"],
              "%s: the %s segments at the peak hold %s bytes, the row's peak reserved is %d"
              % (label, sec, segs["data-total"], j["peak_reserved"]))
        check(int(segs["data-segments"]) > 0, "%s: no segments for %s" % (label, sec))
    check(int(p.ids["card"]["attrs"]["data-bytes"]) == CARD, "%s: the card is not 24 GiB" % label)
    now = [j for j in rows if "recorded" in j["flags"]] or \
          [j for j in rows if j["section"] == "pytorch" and j["setting"] == "classic"]
    if now and now[0] is not best["pytorch"]:
        check(fig("answer-now") == now[0]["peak_reserved"], "%s: the 'instead of' figure" % label)
        check(p.ids["answer-now-setting"]["text"] == now[0]["setting"], "%s: the 'now' setting" % label)
    if "baseline" in best["pytorch"]:
        check(fig("answer-recorded") == best["pytorch"]["baseline"]["peak_reserved"],
              "%s: the recorded run's figure" % label)
        check('data-series="recorded run' in dom, "%s: no recorded line" % label)
    check(fig("peak-requested") == rows[0]["peak_requested"], "%s: peak requested" % label)
    check(int(p.ids["events"]["attrs"]["data-value"]) == rows[0]["events"], "%s: events" % label)
    check(dom.count("<polyline") >= len(rows) * 2, "%s: a chart per setting is missing" % label)
    return p.ids["fits-pytorch"]["attrs"]["data-fits"]


def run(replay, args, expect_rc=0):
    res = subprocess.run([replay] + args, capture_output=True, text=True, timeout=600)
    check(res.returncode == expect_rc, "%s exited %d (want %d): %s"
          % (" ".join(args), res.returncode, expect_rc, res.stderr[-2000:]))
    return res


def main():
    replay, browser, traces = sys.argv[1], "--browser" in sys.argv, None
    if "--traces" in sys.argv:
        traces = sys.argv[sys.argv.index("--traces") + 1]
    exe = chromium() if browser else None
    if browser and not exe:
        print("SKIP: chromium is not installed (apt-get install -y chromium): the page is not "
              "rendered; replay_report checks the file")
        sys.exit(77)
    work = tempfile.mkdtemp(prefix="report.")
    try:
        # a small workload that fits on a 24 GiB card and one (about 24.7 GiB) that does not
        cases = [("synth", ["--synth", "train:1:0.25"]), ("synth-big", ["--synth", "train:1:13"])]
        snap = os.path.join(traces or "", "raw", "ftcourse_qlora_finetune.pickle")
        if traces and os.path.exists(snap):
            cases.append(("recorded", [snap]))
        else:
            print("note: %s absent: only the synthetic case runs" % snap)
        for label, src in cases:
            page = os.path.join(work, label + ".html")
            res = run(replay, ["--quiet", "--json", "--report", page] + src)
            rows = [json.loads(ln) for ln in res.stdout.splitlines() if ln.strip()]
            check(rows, "%s: no JSON rows" % label)
            dom = render(page, exe) if exe else open(page, encoding="utf-8").read()
            fits = compare(dom, rows, label)
            check(fits == ("no" if label == "synth-big" else "yes"),
                  "%s: fits on 24 GiB says %s" % (label, fits))
            print("ok: %s: %d rows, the answer, the segments and the figures match --json%s"
                  % (label, len(rows), " in the rendered DOM" if exe else ""))
        if not browser:  # refusals: a clear message, exit 2, no page
            bad = os.path.join(work, "no-such-dir", "x.html")
            r = run(replay, ["--synth", "train:1:0.05", "--report", bad], 2)
            check(bad in r.stderr and "cannot write" in r.stderr, "unwritable: " + r.stderr)
            for extra, words in ((["--fit"], "--fit"), (["--synth", "infer"], "exactly one history"),
                                 (["--report"], "--report")):
                page = os.path.join(work, "refused.html")
                r = run(replay, ["--synth", "train:1:0.05", "--report", page] + extra, 2)
                check(words in r.stderr and not os.path.exists(page), "%s: %s" % (extra, r.stderr))
            page = os.path.join(work, "badconf.html")  # the sweep fails: no page is left
            r = run(replay, ["--synth", "train:1:0.05", "--conf", "no_such_key:1", "--report", page], 2)
            check("no_such_key" in r.stderr and not os.path.exists(page), "bad --conf: " + r.stderr)
            r = run(replay, ["--synth", "train:1:0.05", "--report="], 2)
            check("needs a file name" in r.stderr, "--report=: " + r.stderr)
            print("ok: bad --report arguments are refused with exit 2 and a message")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
