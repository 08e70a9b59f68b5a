# script mode's in-loop overhead on the compute-bound steady job, with the noise floor
exec > $OUT/log.txt 2>&1
LIMIT=575; source .gpx/pre.sh
stamp "overhead"
timeout $(( $(left) - 20 )) python3 -u benchmarks/script_overhead.py benchmarks/steady/tunekit.yaml --set num_workers=4 \
  --set batch_size=256 --set pin_memory=true --repeats 4 --control --out /tmp/ovh
echo "rc=$?"; stamp "after"
cp /tmp/ovh/script_overhead.csv $OUT/ 2>/dev/null
python3 - <<'PY'
import json, glob
for f in sorted(glob.glob('/tmp/ovh/trials/trials/*/measurement.json')):
    m = json.load(open(f)); print(f, {k: m.get(k) for k in ('status', 'reason', 'rate', 'noise_cv', 'windows_measured',
          'stop_reason', 'data_wait_frac', 'startup_s', 'build_s', 'warmup_s', 'measured_s', 'host_mem_peak_bytes')})
PY
uptime; stamp "done"
