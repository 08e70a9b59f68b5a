# the script-mode sweep of the image example, then the workload-mode sweep of the same job, then the GPU tests
exec > $OUT/log.txt 2>&1
LIMIT=590; source .gpx/pre.sh
stamp "script sweep"
timeout 330 python3 -u benchmarks/script_vs_workload.py --budget-min 5.2 --rounds 0 --modes script --out $PWD/.gpu/svw
echo "rc=$?"; stamp "after script sweep"
budget=$(python3 -c "print(min(4.5, round(($(left) - 30) / 60, 1)))")
stamp "workload sweep, budget $budget min"
timeout $(( $(left) - 10 )) python3 -u benchmarks/script_vs_workload.py --budget-min $budget --rounds 0 --modes workload --out $PWD/.gpu/svw
echo "rc=$?"; stamp "after workload sweep"
mkdir -p $OUT/script $OUT/workload
cp .gpu/svw/sweeps.csv $OUT/ 2>/dev/null
for m in script workload; do for f in report.md trials.csv recommended.yaml env.json config.resolved.yaml sweep.json; do cp .gpu/svw/$m/$f $OUT/$m/ 2>/dev/null; done; done
stamp "gpu tests"
timeout $(( $(left) - 8 )) python3 -m pytest -q -n 0 -m gpu tests/test_gpu.py -p no:cacheprovider
echo "rc=$?"
uptime; stamp "done"
