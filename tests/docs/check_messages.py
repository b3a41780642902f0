#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""check_messages.py LIBEXPSEG_SO: the messages quoted in docs/api.md and docs/config.md are
what the library says. Each plain fenced block (``` with no language) of those files is a
quoted message: one per line, or one wrapped over several lines (compared joined with
spaces); "..." in a quoted message stands for text left out. Each case below runs in a child
process (libexpseg.so through ctypes, the configuration variables cleared but the one it
sets) and gives one message: expseg_last_error() after a refused expseg_create, or the
warning written to stderr (its "expseg: " prefix removed). Every quoted block must equal one
of them; a block no case can produce here (the cuda message where a CUDA driver is
installed) is reported as not compared. Exit 1 on a stale quote."""
import ctypes, os, re, subprocess, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DOCS = ["docs/api.md", "docs/config.md"]
ENV_KEYS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "EXPSEG_ALLOC_CONF",
            "PYTORCH_HIP_ALLOC_CONF", "EXPSEG_DRIVER")
# (what it shows, driver or None, config or None, environment)
CASES = [
    ("no driver and no GPU", None, "", {}),
    ("max_split_size_mb below its bound", "sim", None, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:10"}),
    ("a boolean in the wrong case", "sim", None, {"EXPSEG_ALLOC_CONF": "expandable_segments:true"}),
    ("an unknown key", "sim", "max_split_size", {}),
    ("a ']' where a key belongs", "sim", None, {"PYTORCH_CUDA_ALLOC_CONF": "max_non_split_rounding_mb:20,]"}),
    ("the accidents' warning", "sim", None,
     {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:-1,expandable_segments:True,"}),
    ("the defaults, printed (expseg_config_string)", "sim", "", {"PRINT": "1"}),
]
CHILD = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.expseg_last_error.restype = ctypes.c_char_p
a = ctypes.c_void_p()
drv = None if sys.argv[2] == "-" else sys.argv[2].encode()
conf = None if sys.argv[3] == "-" else sys.argv[3].encode()
if lib.expseg_create(drv, 0, conf, ctypes.byref(a)) != 0:
    print(lib.expseg_last_error().decode())
else:
    if len(sys.argv) > 4:
        buf = ctypes.create_string_buffer(4096)
        lib.expseg_config_string(a, buf, ctypes.c_size_t(4096))
        print(buf.value.decode())
    lib.expseg_destroy(a)
"""


def messages(lib):
    out = []
    for what, drv, conf, env in CASES:
        e = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
        env = dict(env)
        extra = ["print"] if env.pop("PRINT", None) else []
        e.update(env)
        p = subprocess.run([sys.executable, "-c", CHILD, lib, drv or "-",
                            "-" if conf is None else conf] + extra,
                           env=e, capture_output=True, text=True, timeout=60)
        text = (p.stdout + p.stderr).strip()
        text = re.sub(r"^expseg: ", "", text)
        out.append((what, text))
    return out


def accepted(lib, text):
    """Whether text is a configuration expseg_create takes without a word."""
    e = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    p = subprocess.run([sys.executable, "-c", CHILD, lib, "sim", text], env=e,
                       capture_output=True, text=True, timeout=60)
    return p.returncode == 0 and (p.stdout + p.stderr).strip() == ""


def quoted(path):
    lines, blocks, i = open(path, encoding="utf-8").read().split("\n"), [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            if lines[i] == "```":
                blocks.append((i + 1, lines[i + 1:j]))
            i = j + 1
        else:
            i += 1
    return blocks


def same(quote, message):
    parts = [re.escape(p) for p in quote.split("...")]
    return re.fullmatch(".*".join(parts), message, re.S) is not None


def main():
    lib = sys.argv[1]
    got = messages(lib)
    for what, text in got:
        print("-- %s:\n   %s" % (what, text))
    try:
        ctypes.CDLL("libcuda.so.1")
        cuda_here = True
    except OSError:
        cuda_here = False
    stale = 0
    for doc in DOCS:
        for line, block in quoted(os.path.join(ROOT, doc)):
            whole = " ".join(l.strip() for l in block)
            if any(same(whole, m) for _, m in got):
                print("ok: %s:%d (one message)" % (doc, line))
                continue
            if all(any(same(l, m) for _, m in got) for l in block):
                print("ok: %s:%d (%d messages)" % (doc, line, len(block)))
                continue
            if len(block) == 1 and accepted(lib, block[0]):
                print("ok: %s:%d (a configuration the library accepts as written)" % (doc, line))
                continue
            if cuda_here and "cuda driver" in whole:
                print("not compared: %s:%d (a CUDA driver is installed here)" % (doc, line))
                continue
            stale += 1
            print("STALE: %s:%d:" % (doc, line))
            for l in block:
                if not any(same(l, m) for _, m in got):
                    print("   quoted:  %s" % l)
    if stale:
        print("%d quoted block(s) differ from the library's messages" % stale)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
