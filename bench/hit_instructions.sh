#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# hit_instructions.sh BENCH_HIT [LIVE...]: instructions per expseg_malloc + expseg_free pair
# on the cache-hit path, deterministic (valgrind's callgrind): the instructions executed
# inside expseg_malloc and expseg_free (everything they call included, the two lock pairs
# too) in a run of 40,000 timed pairs minus a run of 20,000, divided by 20,000, so that
# set-up and warm-up cancel. BENCH_HIT is a build's expseg-bench-hit (Release, the default
# check level); run from the repository root so its default trace is found. The floor's own
# pair (bench_hit.c: a mutex and a LIFO stack per size) is printed beside it the same way.
# HIT_ARGS: more options for the bench (e.g. HIT_ARGS="--cut 1073741824": every request cut
# from one large free block).
# Results: docs/benchmarks.md, "Cache-hit path".
set -eu
bin=$1; shift
lives=${*:-0 100000}
command -v valgrind >/dev/null || { echo "hit_instructions.sh: valgrind is not installed" >&2; exit 2; }
count() { # N LIVE FUNCTIONS...: instructions collected inside those functions
  local n=$1 live=$2 out; shift 2
  out=$(mktemp)
  local toggles=()
  for f in "$@"; do toggles+=("--toggle-collect=$f"); done
  valgrind --tool=callgrind "${toggles[@]}" --callgrind-out-file="$out" "$bin" --live "$live" \
    --holes 1 --batches "$n" --batch 1 ${HIT_ARGS:-} >/dev/null 2>&1
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
  rm -f "$out"
}
printf '%10s %14s %14s\n' live "expseg pair" "floor pair"
for live in $lives; do
  a=$(count 20000 "$live" expseg_malloc expseg_free); b=$(count 40000 "$live" expseg_malloc expseg_free)
  fa=$(count 20000 "$live" floor_malloc floor_free); fb=$(count 40000 "$live" floor_malloc floor_free)
  awk -v l="$live" -v a="$a" -v b="$b" -v fa="$fa" -v fb="$fb" \
    'BEGIN { printf "%10s %14.1f %14.1f\n", l, (b - a) / 20000, (fb - fa) / 20000 }' 
done
