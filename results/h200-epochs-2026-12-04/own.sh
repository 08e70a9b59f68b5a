#!/usr/bin/env bash
# The script's own clock over whole epochs at 16 workers, batch 128: its loader as written, and with persistent
# workers (what a trial that sets a loader knob runs). Usage: own.sh OUT
set -u
out=${1:?OUT}
cd "$(dirname "$0")/../../examples/image_classifier"
for extra in "" "--persistent"; do
  name=own_j16_b128${extra:+_persistent}
  python3 train.py --data /tmp/epochs-data --make-data 32768 --arch resnet50 --crop 176 --eval 4096 -j 16 -b 128 \
    --epochs 5 --out /tmp/epochs-own $extra > "$out/$name.txt" 2>&1
  echo "$name"; grep "ended at\|images/s" "$out/$name.txt"
done
