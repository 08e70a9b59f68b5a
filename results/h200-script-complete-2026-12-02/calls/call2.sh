# the workload-mode sweep (unless call 1 ran it), the script re-run under the recommendation, the GPU tests
exec > $OUT/log.txt 2>&1
LIMIT=575; source .gpx/pre.sh
if ! grep -q '^workload,' .gpu/svw/sweeps.csv 2>/dev/null; then
  stamp "workload sweep"
  timeout 300 python3 -u benchmarks/script_vs_workload.py --budget-min 4.5 --rounds 0 --modes workload --out $PWD/.gpu/svw
  echo "rc=$?"; stamp "after workload sweep"
fi
stamp "re-runs"
timeout $(( $(left) - 200 )) python3 -u benchmarks/script_vs_workload.py --rerun .gpu/svw/script/recommended.yaml --rounds 2 --out $PWD/.gpu/svw
echo "rc=$?"; stamp "gpu tests"
timeout $(( $(left) - 15 )) python3 -m pytest -q -n 0 -m gpu tests/test_gpu.py -p no:cacheprovider
echo "rc=$?"
(cd .gpu/svw && tar czf $OUT/svw.tgz sweeps.csv reruns.csv script/report.md script/trials.csv script/recommended.yaml script/env.json script/config.resolved.yaml script/plots workload/report.md workload/trials.csv workload/recommended.yaml workload/env.json workload/config.resolved.yaml workload/plots)
uptime; stamp "done"
