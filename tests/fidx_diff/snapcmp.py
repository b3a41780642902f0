#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""snapcmp.py A.pickle B.pickle: two memory_viz snapshots equal but for the events' wall-clock
times (time_us), which differ from run to run. Exit 0 when equal; else the first differences."""
import pickle
import sys


def diff(x, y, path, out):
    if len(out) > 5:
        return
    if type(x) is not type(y):
        out.append(f"{path}: {type(x).__name__} vs {type(y).__name__}")
    elif isinstance(x, dict):
        for k in sorted(set(x) | set(y), key=str):
            if k == "time_us":
                continue
            if k not in x or k not in y:
                out.append(f"{path}/{k}: only in one")
            else:
                diff(x[k], y[k], f"{path}/{k}", out)
    elif isinstance(x, list):
        if len(x) != len(y):
            out.append(f"{path}: {len(x)} vs {len(y)} items")
        for i, (p, q) in enumerate(zip(x, y)):
            diff(p, q, f"{path}[{i}]", out)
    elif x != y:
        out.append(f"{path}: {x!r:.80} vs {y!r:.80}")


with open(sys.argv[1], "rb") as fa, open(sys.argv[2], "rb") as fb:
    a, b = pickle.load(fa), pickle.load(fb)
out = []
diff(a, b, "", out)
print("\n".join(out))
sys.exit(1 if out else 0)
