# the pair in the other order: the workload-mode sweep of the image example first, then the script-mode sweep
exec > $OUT/log.txt 2>&1
LIMIT=590; source .gpx/pre.sh
stamp "workload sweep"
timeout 220 python3 -u benchmarks/script_vs_workload.py --budget-min 3.4 --rounds 0 --modes workload --out /tmp/svw
echo "rc=$?"; stamp "after workload sweep"
budget=$(python3 -c "print(min(5.6, round(($(left) - 25) / 60, 1)))")
stamp "script sweep, budget $budget min"
timeout $(( $(left) - 10 )) python3 -u benchmarks/script_vs_workload.py --budget-min $budget --rounds 0 --modes script --out /tmp/svw
echo "rc=$?"; stamp "after script sweep"
cp /tmp/svw/sweeps.csv $OUT/ 2>/dev/null
for m in script workload; do mkdir -p $OUT/$m; for f in report.md trials.csv recommended.yaml sweep.json; do cp /tmp/svw/$m/$f $OUT/$m/ 2>/dev/null; done; done
uptime; stamp "done"
