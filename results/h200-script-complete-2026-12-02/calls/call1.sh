# the script-mode sweep of the image example; the workload-mode sweep after it when the call has time left
exec > $OUT/log.txt 2>&1
LIMIT=575; source .gpx/pre.sh
stamp "script sweep"
timeout 545 python3 -u benchmarks/script_vs_workload.py --budget-min 8.5 --rounds 0 --modes script --out $PWD/.gpu/svw
echo "rc=$?"; stamp "after script sweep"
if [ "$(left)" -ge 240 ]; then
  budget=$(python3 -c "print(round(($(left) - 35) / 60, 1))")
  stamp "workload sweep, budget $budget min"
  timeout $(( $(left) - 10 )) python3 -u benchmarks/script_vs_workload.py --budget-min $budget --rounds 0 --modes workload --out $PWD/.gpu/svw
  echo "rc=$?"; stamp "after workload sweep"
fi
mkdir -p $OUT/script $OUT/workload
cp .gpu/svw/sweeps.csv $OUT/ 2>/dev/null
for m in script workload; do for f in report.md trials.csv recommended.yaml env.json config.resolved.yaml; do cp .gpu/svw/$m/$f $OUT/$m/ 2>/dev/null; done; done
uptime; stamp "done"
