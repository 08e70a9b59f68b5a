# script mode's in-loop overhead (heavy example), everything logged under $OUT as it happens
exec > $OUT/log.txt 2>&1
source .gpu/pre.sh
stamp "make data"
(cd examples/image_classifier && timeout 60 python train.py --data ./data-heavy --make-data 8192 --epochs 0)
stamp "overhead"
timeout 250 python3 -u benchmarks/script_overhead.py examples/image_classifier/heavy.yaml --set num_workers=12 \
  --set batch_size=128 --set pin_memory=true --repeats 2 --control --out /tmp/ovh
echo "rc=$?"; stamp "after"
cp /tmp/ovh/script_overhead.csv $OUT/ 2>/dev/null
for f in /tmp/ovh/trials/trials/*/worker.log; do echo "-- $f"; tail -5 $f; done
python3 - <<'PY'
import json, glob
for f in sorted(glob.glob('/tmp/ovh/trials/trials/*/measurement.json')):
    m = json.load(open(f)); print(f, {k: m.get(k) for k in ('status', 'reason', 'rate', 'noise_cv', 'windows_measured',
          'stop_reason', 'data_wait_frac', 'startup_s', 'build_s', 'warmup_s', 'measured_s', 'epochs_ended', 'rate_windows')})
PY
ps aux --sort=-%cpu | head -8
stamp "done"
