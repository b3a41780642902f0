#!/bin/bash
# run.sh OLD_BUILD NEW_BUILD FIRST_SEED LAST_SEED STEPS: the differential test of the free
# index. diff_prog.c is built against both libraries (OLD_BUILD, NEW_BUILD: build folders
# holding libexpseg.a, their source trees one level up); for every seed and configuration
# the address sequences must be equal, and the new library with expseg_check after every
# step must exit 0. Configurations whose programs can turn garbage collection on differ
# legitimately while AdvFidx.GcVictimsDoNotDependOnHostHeapLayout fails (GC ties broken by
# host addresses): they are reported as "GC-possible".
set -u  # DIFF_NOGC=1 CONFS="0 1 2 3 4 5 7 8 10 11 12 13": no garbage collection, so every DIFF is a defect
here=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
for v in old:$1 new:$2; do
  gcc -O1 -std=c11 -I"${v#*:}/../include" -I"$here" "$here/diff_prog.c" "${v#*:}/libexpseg.a" \
    -lpthread -ldl -lhwloc -lm -o "$T/${v%%:*}" || exit 2
done
fails=0
for s in $(seq "$3" "$4"); do for c in ${CONFS:-0 1 2 3 4 5 6 7 8 9 10 11 12 13}; do
  "$T/new" "$s" "$c" "$5" > "$T/n.txt" 2>/dev/null; rn=$?
  "$T/old" "$s" "$c" "$5" > "$T/o.txt" 2>/dev/null; ro=$?
  "$T/new" "$s" "$c" "$5" check > "$T/k.txt" 2> "$T/k.err"; rk=$?
  if ! cmp -s "$T/n.txt" "$T/o.txt" || [ $rn != $ro ]; then
    if grep -q "c garbage_collection" "$T/n.txt" || [ "$c" = 6 ] || [ "$c" = 9 ]; then g=GC-possible; else g=NO-GC; fi
    echo "DIFF $g seed=$s conf=$c rc=$rn/$ro"; diff "$T/o.txt" "$T/n.txt" | head -3; fails=$((fails + 1))
  fi
  if [ $rk != 0 ]; then echo "CHECK rc=$rk seed=$s conf=$c: $(tail -c 300 "$T/k.err")"; fails=$((fails + 1)); fi
done; done
rm -rf "$T"
echo "fails=$fails"
[ $fails = 0 ]
