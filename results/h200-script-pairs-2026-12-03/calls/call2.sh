# the script re-run under the script sweep's recommendation against its own settings; the overhead
exec > $OUT/log.txt 2>&1
LIMIT=590; source .gpx/pre.sh
if [ -f .gpu/svw/script/recommended.yaml ]; then
  stamp "re-runs"
  timeout 200 python3 -u benchmarks/script_vs_workload.py --rerun .gpu/svw/script/recommended.yaml --rounds 2 --out $PWD/.gpu/svw
  echo "rc=$?"; cp .gpu/svw/reruns.csv $OUT/ 2>/dev/null
fi
stamp "overhead"
timeout $(( $(left) - 15 )) python3 -u benchmarks/script_overhead.py benchmarks/steady/tunekit.yaml --set num_workers=4 \
  --set batch_size=256 --set pin_memory=true --repeats 2 --control --out /tmp/ovh
echo "rc=$?"; cp /tmp/ovh/script_overhead.csv $OUT/ 2>/dev/null
uptime; stamp "done"
