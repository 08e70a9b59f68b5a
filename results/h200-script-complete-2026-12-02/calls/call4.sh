# both sweeps again in one call, the workload sweep first this time; then the script re-run under the recommendation
exec > $OUT/log.txt 2>&1
LIMIT=560; source .gpx/pre.sh
O=/tmp/svw4
stamp "workload sweep"
timeout 230 python3 -u benchmarks/script_vs_workload.py --budget-min 3.6 --rounds 0 --modes workload --out $O
echo "rc=$?"; stamp "script sweep"
timeout 260 python3 -u benchmarks/script_vs_workload.py --budget-min 4.1 --rounds 0 --modes script --out $O
echo "rc=$?"; stamp "re-runs"
timeout $(( $(left) - 12 )) python3 -u benchmarks/script_vs_workload.py --rerun $O/script/recommended.yaml --rounds 2 --out $O
echo "rc=$?"
(cd $O && tar czf $OUT/svw.tgz sweeps.csv reruns.csv script/report.md script/trials.csv script/recommended.yaml script/env.json script/config.resolved.yaml script/plots workload/report.md workload/trials.csv workload/recommended.yaml workload/env.json workload/config.resolved.yaml workload/plots)
uptime; stamp "done"
