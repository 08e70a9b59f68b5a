#!/usr/bin/env bash
# On one H200, one host: a script-mode sweep of torchvision's reference train.py whose decisions rest on repeated
# trials (selection.repeats 1: the knee, the best and the script's own settings each run twice, in alternation),
# then the script itself re-run under the recommendation (applied whole) and under its own settings, 3 epochs
# each, time-stamped: the sweep's gain and its interval against the gain the script's own clock shows.
# 16,384 training and 2,048 validation JPEGs (an epoch of ~8 s at the pick, several windows). Usage: decide.sh OUT
set -u
out=${1:?OUT}
here=$(cd "$(dirname "$0")" && pwd)
up="$here/../h200-upstream-2026-12-04"
ref="$here/../../.upstream/classification"
python3 "$up/make_data.py" /tmp/tvdata 16384 2048
sync; sleep 3
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > "$out/gpu.txt"; nproc >> "$out/gpu.txt"
cd "$here/../.."
( time python3 -m tunekit sweep "$here/decide.yaml" --budget-min 6 --out /tmp/sweep ) > "$out/sweep.txt" 2>&1
tail -40 "$out/sweep.txt" | cut -c1-240
cp /tmp/sweep/report.md /tmp/sweep/recommended.yaml /tmp/sweep/trials.csv "$out/" 2>/dev/null
tar czf "$out/sweep.tgz" -C /tmp --exclude='*.db' sweep
own() {  # NAME PROGRAM ARGS...: 3 epochs of the script, its output time-stamped
  local name=$1; shift
  ( cd "$ref" && python3 -u "$@" --data-path /tmp/tvdata --model resnet50 --amp --output-dir /tmp/tvown \
      --print-freq 10 --epochs 3 2>&1 | python3 "$up/stamp.py" > "$out/own_$name.txt" )
  echo "== plain $name: $*"; python3 "$up/clock.py" "$out/own_$name.txt" 16384
}
pick=$(python3 -c "import yaml; d=yaml.safe_load(open('/tmp/sweep/recommended.yaml'))['dataloader']; print(d['num_workers'], d['batch_size'])" 2>/dev/null || echo "12 128")
set -- $pick
own recommended "$up/apply.py" train.py -j "$1" -b "$2"
own script_defaults train.py
