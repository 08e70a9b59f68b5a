#!/usr/bin/env bash
# The README's showcase figures, on one GPU machine, in the order they depend on each other:
#   1. the staged sweep of configs/resnet.yaml;
#   2. the reduced grid right after it, on the same machine (the check of the staged pick);
#   3. trial fidelity at 16, 8 and 0 workers (each short trial against 10x longer windows);
#   4. where the sweep's trial time went.
# Every step resumes when the script is run again with the same OUT, so a run cut by a time limit loses nothing:
#   bash benchmarks/showcase.sh results/h200-showcase        # PYTHON=python3 by default
set -u
out=${1:?usage: bash benchmarks/showcase.sh OUT}
py=${PYTHON:-python3}
"$py" -m tunekit sweep configs/resnet.yaml --out "$out/sweep" || exit $?
"$py" -m tunekit sweep configs/resnet-reduced.yaml --out "$out/grid" || exit $?
"$py" benchmarks/trial_fidelity.py configs/resnet.yaml --workers 16 8 0 --batch 512 --set pin_memory=false \
    --out "$out/fidelity" || exit $?
"$py" benchmarks/time_breakdown.py "$out/sweep"
