#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# replay_diff.sh OLD_REPLAY NEW_REPLAY [TRACE_DIR]: every replay figure of two builds of
# expseg-replay must be equal (ns_per_op aside: it is a time): the recorded PyTorch traces in
# TRACE_DIR (default ../shared/traces/raw, and its ../memtrace; skipped when absent) and the synthetic histories,
# under both models and several settings, --json, plus --sweep on the synthetic ones; then the
# text table, --sweep and --sweep --json of each recorded pickle and of three synthetic
# histories, byte for byte.
set -u
old=$1 new=$2 dir=${3:-$(dirname "$0")/../../../shared/traces/raw}
T=$(mktemp -d)
fails=0
files=()
if [ -d "$dir" ]; then files=("$dir"/*.pickle "$dir"/../memtrace/*.memtrace); else echo "SKIP traces: $dir is absent"; fi
confs=("" "expandable_segments:False" "expandable_segments:True,max_split_size_mb:64"
       "expandable_segments:False,max_split_size_mb:128,roundup_power2_divisions:4"
       "expandable_segments:False,garbage_collection_threshold:0.7,per_process_memory_fraction:0.6")
run() { # NAME ARGS...: both builds, compared
  local name=$1; shift
  "$old" --json --quiet "$@" 2>/dev/null | sed 's/"ns_per_op":[0-9.e+-]*,//g' > "$T/o"; local ro=${PIPESTATUS[0]}
  "$new" --json --quiet "$@" 2>/dev/null | sed 's/"ns_per_op":[0-9.e+-]*,//g' > "$T/n"; local rn=${PIPESTATUS[0]}
  if ! cmp -s "$T/o" "$T/n" || [ "$ro" != "$rn" ] || [ ! -s "$T/n" ]; then
    echo "DIFF $name rc=$ro/$rn"; diff "$T/o" "$T/n" | head -4; fails=$((fails + 1))
  else echo "same $name rc=$rn"; fi
}
for model in expseg pytorch; do
  for c in "${confs[@]}"; do
    for f in "${files[@]}"; do run "$(basename "$f") $model [$c]" --model "$model" --conf "$c" "$f"; done
    for s in train:1 train:2:2 infer:3 streams8:4 streams8:5:3; do
      run "synth $s $model [$c]" --model "$model" --conf "$c" --synth "$s"
    done
  done
  run "fit $model" --model "$model" --fit --synth train:7 --synth streams8:8
  run "capacity $model" --model "$model" --capacity 3G --allow-oom --synth train:9:2 --synth streams8:9:2
done
run "sweep" --sweep --synth train:11 --synth streams8:12
# the text table and the sweep (text and --json) of each recorded pickle and three synthetic
# histories: byte for byte, ns_per_op aside
text() { # NAME ARGS...: both builds' output as printed, compared
  local name=$1; shift
  "$old" "$@" 2>/dev/null | sed 's/"ns_per_op":[0-9.e+-]*,//g' > "$T/o"; local ro=${PIPESTATUS[0]}
  "$new" "$@" 2>/dev/null | sed 's/"ns_per_op":[0-9.e+-]*,//g' > "$T/n"; local rn=${PIPESTATUS[0]}
  if ! cmp -s "$T/o" "$T/n" || [ "$ro" != "$rn" ] || [ ! -s "$T/n" ]; then
    echo "DIFF $name rc=$ro/$rn"; diff "$T/o" "$T/n" | head -4; fails=$((fails + 1))
  else echo "same $name rc=$rn"; fi
}
srcs=(--synth=train:1 --synth=infer:2 --synth=streams8:3)
[ -d "$dir" ] && srcs+=("$dir"/*.pickle)
for src in "${srcs[@]}"; do
  arg=("$src"); [ "${src#--synth=}" != "$src" ] && arg=(--synth "${src#--synth=}")
  text "table ${src##*/}" "${arg[@]}"
  text "sweep table ${src##*/}" --sweep "${arg[@]}"
  text "sweep json ${src##*/}" --sweep --json "${arg[@]}"
done
# the snapshot (at the peak and at the end: snapcmp.py, equal but for wall-clock times) and the
# memory summary's text
snaps=("${files[@]:0:3}") # the second recording holds several devices: both builds refuse it alike
for h in "${snaps[@]}" synth; do
  for at in peak end; do for model in expseg pytorch; do
    src=("$h"); [ "$h" = synth ] && src=(--synth streams8:13)
    "$old" --quiet --model $model --snapshot "$T/o.pickle" --snapshot-at $at --report "${src[@]}" 2> "$T/oe" | grep -v ns_per_op > "$T/or"
    "$new" --quiet --model $model --snapshot "$T/n.pickle" --snapshot-at $at --report "${src[@]}" 2> "$T/ne" | grep -v ns_per_op > "$T/nr"
    : > "$T/sd"
    if [ -s "$T/n.pickle" ] && "$(dirname "$0")/snapcmp.py" "$T/o.pickle" "$T/n.pickle" > "$T/sd" && cmp -s "$T/or" "$T/nr"; then
      echo "same snapshot+report $(basename "$h") $at $model"
    elif [ ! -e "$T/o.pickle" ] && [ ! -e "$T/n.pickle" ] && [ -s "$T/ne" ] && cmp -s "$T/oe" "$T/ne" && cmp -s "$T/or" "$T/nr"; then
      # both refuse alike (--snapshot takes one history: a multi-device recording is several)
      echo "same refusal snapshot+report $(basename "$h") $at $model: $(tail -c 120 "$T/ne")"
    else echo "DIFF snapshot+report $(basename "$h") $at $model"; cat "$T/sd"; diff "$T/or" "$T/nr" | head -4; fails=$((fails + 1)); fi
    rm -f "$T/o.pickle" "$T/n.pickle"
  done; done
done
# the timeline samples (every 50 events) of the first trace and a synthetic one
for src in "${files[0]:-}" "--synth=streams8:14"; do
  [ -z "$src" ] && continue
  arg=("$src"); [ "${src#--synth=}" != "$src" ] && arg=(--synth "${src#--synth=}")
  for model in expseg pytorch; do
    "$old" --quiet --model $model --timeline "$T/ot.csv" --timeline-every 50 "${arg[@]}" > /dev/null 2>&1
    "$new" --quiet --model $model --timeline "$T/nt.csv" --timeline-every 50 "${arg[@]}" > /dev/null 2>&1
    if [ -s "$T/nt.csv" ] && cmp -s "$T/ot.csv" "$T/nt.csv"; then echo "same timeline ${src##*/} $model"
    else echo "DIFF timeline ${src##*/} $model"; diff "$T/ot.csv" "$T/nt.csv" | head -4; fails=$((fails + 1)); fi
  done
done
# the new build's invariants after every event (--check), both models, both segment kinds
for model in expseg pytorch; do for c in "" "expandable_segments:False"; do
  if "$new" --quiet --check --model $model --conf "$c" "${files[@]}" --synth streams8:3 --synth train:4 > /dev/null 2> "$T/ce"; then
    echo "same check $model [$c]"
  else echo "CHECK $model [$c]: $(tail -c 300 "$T/ce")"; fails=$((fails + 1)); fi
done; done
rm -rf "$T"
echo "fails=$fails"
[ $fails = 0 ]
