#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""check_public_text.py: the text users read (README.md, CHANGELOG.md, docs/*.md, the
installed headers include/*.h and plugin/expseg_torch.h, examples/) speaks to them: no
tracker numbers ("issue 9"), no words about how the work was organised ("session", "lead"
as a person), and no paths into folders beside the checkout that a user does not have
("../shared"). PyTorch's issues are cited as "PyTorch issue #N" (with #), which is allowed.
Exit 1 and each offending line when something is found."""
import glob, os, re, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PATTERNS = [
    (re.compile(r"\bissues?[ -][0-9]", re.I), "an issue number of the project's tracker"),
    (re.compile(r"\bsessions?\b", re.I), "how the work was organised"),
    (re.compile(r"\b(the lead|other helpers|another helper|engineers?)\b", re.I),
     "how the work was organised"),
    (re.compile(r"\.\./shared\b"), "a folder beside the checkout that users do not have"),
]
# Files whose wording is left to a later change, each with the reason; keep this short.
EXEMPT = {}


def files():
    pats = ["README.md", "CHANGELOG.md", "docs/*.md", "include/*.h", "plugin/expseg_torch.h",
            "examples/**/*.*"]
    out = []
    for p in pats:
        out += glob.glob(os.path.join(ROOT, p), recursive=True)
    return sorted(set(os.path.relpath(f, ROOT) for f in out if os.path.isfile(f)))


def main():
    bad = 0
    for rel in files():
        if rel in EXEMPT:
            print("exempt: %s (%s)" % (rel, EXEMPT[rel]))
            continue
        for n, line in enumerate(open(os.path.join(ROOT, rel), encoding="utf-8"), 1):
            for pat, why in PATTERNS:
                if pat.search(line):
                    print("%s:%d: %s: %s" % (rel, n, why, line.strip()))
                    bad += 1
    print("%d line(s) to reword" % bad if bad else "public text: clean")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
