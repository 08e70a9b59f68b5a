#!/usr/bin/env bash
# On one H200 (16 CPU cores): the script's own clock over whole epochs (evaluation and checkpoint included) at
# 16 workers, batch 128, then a script-mode sweep of the same command. Usage: run.sh OUT
set -u
out=${1:?OUT}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../examples/image_classifier"
python3 train.py --data /tmp/epochs-data --make-data 32768 --arch resnet50 --crop 176 --eval 4096 -j 16 -b 128 \
  --epochs 4 --out /tmp/epochs-own > "$out/own_j16_b128.txt" 2>&1
grep "ended at\|images/s\|accuracy" "$out/own_j16_b128.txt"
cd "$here/../.."
( time python3 -m tunekit sweep "$here/tunekit.yaml" --budget-min 4 --out "$out/sweep" ) > "$out/sweep.txt" 2>&1
tail -30 "$out/sweep.txt" | cut -c1-200
