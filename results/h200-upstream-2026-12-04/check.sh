#!/usr/bin/env bash
# On one H200, after run.sh's sweep picked 12 workers, batch 128 (pinned): on one host, the script's own clock at
# the pick applied whole (persistent workers, through apply.py) and as the command alone, and at its own settings
# (5 epochs: its epochs spread), beside a tunekit trial of each. Usage: check.sh OUT
set -u
out=${1:?OUT}
here=$(cd "$(dirname "$0")" && pwd)
ref="$here/../../.upstream/classification"
python3 "$here/make_data.py" /tmp/tvdata 32768 4096
cd "$ref"
own() {  # NAME EPOCHS PROGRAM ARGS...: the script's epochs, its output time-stamped
  local name=$1 epochs=$2; shift 2
  python3 -u "$@" --data-path /tmp/tvdata --model resnet50 --amp --output-dir /tmp/tvown --print-freq 10 \
    --epochs "$epochs" 2>&1 | python3 "$here/stamp.py" > "$out/own_$name.txt"
  echo "== $name: $*"; python3 "$here/clock.py" "$out/own_$name.txt" 32768
}
own pick_applied 4 "$here/apply.py" train.py -j 12 -b 128
own pick_command 4 train.py -j 12 -b 128
own script_defaults_5 5 train.py
cd "$here/../.."
summary() { python3 -c "
import json,sys; m=json.load(open(sys.argv[1]))
print(sys.argv[2], 'rate %.0f in %.0f boundary %s noise %.1f%% windows %d boundaries %s trial %.0f s' % (m['rate'], m['rate_in_epoch'] or 0, m['boundary_s'], 100*m['noise_cv'], len(m['rate_windows']), m['boundaries_s'], m['trial_s']))" "$1" "$2"; }
python3 -m tunekit trial "$here/tunekit.yaml" --set num_workers=12 --set batch_size=128 --set pin_memory=true \
  --set trial.measure_windows=6 --out /tmp/tpick > "$out/trial_pick.txt" 2>&1
summary /tmp/tpick/trials/0/measurement.json pick
python3 -m tunekit trial "$here/tunekit.yaml" --out /tmp/town > "$out/trial_own.txt" 2>&1
summary /tmp/town/trials/0/measurement.json own
cp /tmp/tpick/trials/0/measurement.json "$out/trial_pick.json"; cp /tmp/town/trials/0/measurement.json "$out/trial_own.json"
