#!/usr/bin/env bash
# On one H200, one host: tunekit's trials and the script's own clock interleaved (A B A B), after the data's
# write-back has finished (sync), so that neither side always runs first. torchvision's reference train.py (see
# ../h200-upstream-2026-12-04/README.md), ResNet-50, AMP, 32,768 training and 4,096 validation JPEGs.
# A: `tunekit trial` of the pick (12 workers, batch 128, pinned; its workers persist, as recommended);
# B: the script itself, 3 epochs, time-stamped, with that pick applied whole (apply.py: persistent workers);
# then the script's own settings, trial then plain. Usage: abab.sh OUT
set -u
out=${1:?OUT}
here=$(cd "$(dirname "$0")" && pwd)
up="$here/../h200-upstream-2026-12-04"
ref="$here/../../.upstream/classification"
python3 "$up/make_data.py" /tmp/tvdata 32768 4096
sync; sleep 3
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > "$out/gpu.txt"; nproc >> "$out/gpu.txt"
cd "$here/../.."
own() {  # NAME PROGRAM ARGS...: 3 epochs of the script, its output time-stamped
  local name=$1; shift
  ( cd "$ref" && python3 -u "$@" --data-path /tmp/tvdata --model resnet50 --amp --output-dir /tmp/tvown \
      --print-freq 10 --epochs 3 2>&1 | python3 "$up/stamp.py" > "$out/own_$name.txt" )
  echo "== plain $name: $*"; python3 "$up/clock.py" "$out/own_$name.txt" 32768
}
trial() {  # NAME ARGS...: one tunekit trial of the config, its measurement summarised
  local name=$1; shift
  python3 -m tunekit trial "$up/tunekit.yaml" "$@" --out "/tmp/t_$name" > "$out/trial_$name.txt" 2>&1
  cp "/tmp/t_$name/trials/0/measurement.json" "$out/trial_$name.json"
  python3 - "$out/trial_$name.json" "$name" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
print(f"== trial {sys.argv[2]}: {m['status']} rate {m['rate'] or 0:.0f}/s over whole epochs; inside an epoch "
      f"{m.get('rate_in_epoch') or 0:.0f}/s, noise {100 * (m['noise_cv'] or 0):.1f} %, {len(m['rate_windows'] or [])} "
      f"windows; between epochs {m.get('boundary_s')} s (boundaries {m.get('boundaries_s')}); trial {m['trial_s']:.0f} s")
PY
}
pick=(--set num_workers=12 --set batch_size=128 --set pin_memory=true --set trial.measure_windows=6)
trial pick_1 "${pick[@]}"
own pick_1 "$up/apply.py" train.py -j 12 -b 128
trial pick_2 "${pick[@]}"
own pick_2 "$up/apply.py" train.py -j 12 -b 128
trial own_1 --set trial.measure_windows=6
own own_1 train.py
