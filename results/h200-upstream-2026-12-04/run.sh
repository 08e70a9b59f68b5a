#!/usr/bin/env bash
# On one H200: synthetic data, a script-mode sweep of torchvision's reference train.py, then the script's own clock
# (3 epochs, time-stamped) at the sweep's pick and at its own settings, all on the same host. Usage: run.sh OUT
set -u
out=${1:?OUT}
here=$(cd "$(dirname "$0")" && pwd)
ref="$here/../../.upstream/classification"
python3 "$here/make_data.py" /tmp/tvdata 32768 4096
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > "$out/gpu.txt"
nproc >> "$out/gpu.txt"
cd "$here/../.."
( time python3 -m tunekit sweep "$here/tunekit.yaml" --budget-min 4.5 --out /tmp/sweep ) > "$out/sweep.txt" 2>&1
tail -32 "$out/sweep.txt" | cut -c1-220
cp /tmp/sweep/report.md /tmp/sweep/recommended.yaml /tmp/sweep/trials.csv "$out/" 2>/dev/null
tar czf "$out/sweep.tgz" -C /tmp --exclude='*.db' sweep
cd "$ref"
own() {  # NAME ARGS...: 3 epochs of the script, its output time-stamped
  local name=$1; shift
  python3 -u train.py --data-path /tmp/tvdata --model resnet50 --amp --output-dir /tmp/tvown --print-freq 10 \
    --epochs 3 "$@" 2>&1 | python3 "$here/stamp.py" > "$out/own_$name.txt"
  echo "== $name: $*"; python3 "$here/clock.py" "$out/own_$name.txt" 32768
}
pick=$(python3 -c "import yaml; d=yaml.safe_load(open('/tmp/sweep/recommended.yaml'))['dataloader']; print(d['num_workers'], d['batch_size'])" 2>/dev/null || echo "16 128")
set -- $pick
own pick -j "$1" -b "$2"
own script_defaults
