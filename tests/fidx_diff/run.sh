#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# run.sh OLD_BUILD NEW_BUILD FIRST_SEED LAST_SEED STEPS: the differential test of the free
# index. diff_prog.c is built against both libraries (OLD_BUILD, NEW_BUILD: build folders
# holding libexpseg.a, their source trees one level up); for every seed and configuration
# the address sequences must be equal, and the new library with expseg_check after every
# step must exit 0. Configurations whose programs can turn garbage collection on differ
# legitimately while AdvFidx.GcVictimsDoNotDependOnHostHeapLayout fails (GC ties broken by
# host addresses): they are reported as "GC-possible".
# DIFF_NOGC=1 CONFS="0 1 2 3 4 5 7 8 10 11 12 13 14 16 17": no garbage collection, so every DIFF is a
# defect (GC ties are broken by the idle list's order now, so a GC DIFF is one too).
# DRIVERS="sim:capacity=8G sim:capacity=1G fault;sim:capacity=2G": each configuration on each driver (a small
# capacity: out of memory, retries and releases near the limit; a fault driver: random driver
# failures armed now and then). The programs' observations
# are switched by diff_prog.c's variables, passed through: DIFF_FULL=1 (every statistic after
# every step), DIFF_SNAP=K (the snapshot's bytes and the memory summary every K steps),
# DIFF_HIST=N (history on: the slow path), DIFF_RESET=1 (peaks reset at random),
# DIFF_SMALL=1 (mostly small-pool requests). DIFF_CFLAGS: extra flags to build and link the
# programs with (-fsanitize=address,undefined for a NEW_BUILD made with EXPSEG_SANITIZE=address).
# Example (the in-place hit path against its parent, 2026-11-23):
#   DIFF_FULL=1 DIFF_SNAP=25 DRIVERS="sim:capacity=8G sim:capacity=1G" \
#     tests/fidx_diff/run.sh /work/ref/build-rel build 1 40 2000
set -u
here=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
for v in old:$1 new:$2; do
  gcc -O1 -std=c11 ${DIFF_CFLAGS:-} -I"${v#*:}/../include" -I"$here" "$here/diff_prog.c" "${v#*:}/libexpseg.a" \
    -lpthread -ldl -lhwloc -lm -o "$T/${v%%:*}" || exit 2
done
fails=0
for d in ${DRIVERS:-sim:capacity=8G}; do export DIFF_DRIVER=$d
for s in $(seq "$3" "$4"); do for c in ${CONFS:-0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17}; do
  "$T/new" "$s" "$c" "$5" > "$T/n.txt" 2>/dev/null; rn=$?
  "$T/old" "$s" "$c" "$5" > "$T/o.txt" 2>/dev/null; ro=$?
  "$T/new" "$s" "$c" "$5" check > "$T/k.txt" 2> "$T/k.err"; rk=$?
  if ! cmp -s "$T/n.txt" "$T/o.txt" || [ $rn != $ro ]; then
    if grep -q "c garbage_collection" "$T/n.txt" || [ "$c" = 6 ] || [ "$c" = 9 ] || [ "$c" = 15 ]; then g=GC-possible; else g=NO-GC; fi
    echo "DIFF $g driver=$d seed=$s conf=$c rc=$rn/$ro"; diff "$T/o.txt" "$T/n.txt" | head -3; fails=$((fails + 1))
  fi
  if [ $rk != 0 ]; then echo "CHECK rc=$rk driver=$d seed=$s conf=$c: $(tail -c 300 "$T/k.err")"; fails=$((fails + 1)); fi
done; done; done
rm -rf "$T"
echo "fails=$fails"
[ $fails = 0 ]
