"""The model's share of the device's measured matmul peak at each batch size and compile mode: one compute trial
(`tunekit trial --mode compute`: the step on a batch staged on the device, no loader) per pair, its FLOPs per item
counted by the trial, and the peak probed once in this process in the workload's precision.

    python benchmarks/flop_share.py configs/resnet.yaml --batch 256 512 --compile none default reduce-overhead \
        --out results/flop-share

Prints and writes flop_share.csv: batch, compile, rate, FLOPs per item, share (rate x FLOPs / peak). The share is
of executed FLOPs: a padded batch's padding is counted as work (the report says the same).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _common import merged_sets, run_trial, write_csv

from tunekit import config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config")
    parser.add_argument("--batch", type=int, nargs="+", required=True)
    parser.add_argument("--compile", nargs="+", default=["none"])
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--out", type=Path, default=Path("results/flop-share"))
    args = parser.parse_args()

    import torch

    from tunekit.worker.factory._flops import matmul_peak

    cfg = config.load(args.config)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    peak = matmul_peak(device, cfg.workload.precision)
    if not peak["matmul_peak_flops"]:
        raise SystemExit(f"no matmul peak: {peak['matmul_peak_reason']}")
    print(f"matmul peak ({peak['matmul_peak_precision']}, {device}): {peak['matmul_peak_flops'] / 1e12:.1f} TFLOP/s")

    rows = []
    for batch in args.batch:
        for mode in args.compile:
            m, _ = run_trial(
                args.config,
                args.out,
                merged_sets(args.sets, [f"batch_size={batch}", f"compile={mode}"]),
                mode="compute",
            )
            share = (
                m.rate * m.flops_per_item / peak["matmul_peak_flops"]
                if m.status == "ok" and m.rate and m.flops_per_item
                else None
            )
            rows.append(
                {
                    "batch_size": batch,
                    "compile": mode,
                    "status": m.status,
                    "rate": round(m.rate, 1) if m.rate else None,
                    "unit": cfg.workload.unit,
                    "flops_per_item": m.flops_per_item,
                    "share_of_peak": round(share, 4) if share else None,
                    "peak_flops": peak["matmul_peak_flops"],
                    "reason": m.reason or m.flops_reason or "",
                }
            )
            r = rows[-1]
            print(
                f"batch {batch}, compile {mode}: {r['status']} {r['rate']} {r['unit']}/s, "
                f"{(r['flops_per_item'] or 0) / 1e9:.2f} GFLOP/item, "
                f"share {'' if share is None else f'{share:.1%}'} {r['reason']}",
                flush=True,
            )
            write_csv(args.out / "flop_share.csv", rows)


if __name__ == "__main__":
    main()
