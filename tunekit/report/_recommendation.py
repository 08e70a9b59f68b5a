from __future__ import annotations

from typing import Any

import yaml

from tunekit import rules
from tunekit.recommended import recommendation_dict
from tunekit.records import compute_ceiling
from tunekit.report._summary import RunSummary


def _evidence(s: RunSummary) -> dict[str, Any]:
    knee, best = s.choice.knee, s.choice.best
    assert knee is not None and best is not None
    m = knee.measurement
    return {
        "unit": s.unit,
        # with a price, output per unit of money leads, beside the rate
        "items_per_money": round(s.per_money(knee.rate) or 0.0, 1) if s.per_hour else None,
        "rate": round(knee.rate, 2),
        "flop_share": _rounded(s.flop_share(knee), 4),
        "best_rate": round(best.rate, 2),
        "ratio": round(float(s.choice.ratio or 0), 4),
        "best_config": best.knobs.to_dict(),
        **_gains(s),
        "headroom": round(float(knee.headroom), 4) if knee.headroom is not None else None,
        "headroom_basis": m.headroom_basis,
        "items_per_batch_mean": m.items_per_batch_mean,
        **_noise(s),
        "data_wait_frac": m.data_wait_frac,
        "gpu_busy_frac": m.gpu_busy_frac,
        "best_items_per_money": round(s.per_money(best.rate) or 0.0, 1) if s.per_hour else None,
        "defaults_items_per_money": round(s.per_money(s.defaults.rate) or 0.0, 1)
        if s.per_hour and s.defaults
        else None,
        "model_flops": _model_flops(s),
        "disturbed": list(s.disturbances) or None,
        "verdict": s.verdicts[0].name if s.verdicts else None,
        "diagnosis": [v.sentence() for v in s.verdicts],
        "reason": s.choice.reason,
        "device": s.device,
        "versions": s.versions,
        "machine": s.machine or None,
        "date": s.date,
        "distributed": _distributed(s),
        "run": {
            "name": s.name,
            "strategy": s.strategy,
            "trials": len(s.rows),
            "trials_run": sum(1 for r in s.rows if r.status != "skipped"),
            "knee_trial": knee.number,
        },
    }


def _gains(s: RunSummary) -> dict[str, Any]:
    """The PyTorch defaults' and the script's own rates, the knee's gains over them with their intervals, and
    whether the script's own settings are kept."""
    own = s.script_baseline
    return {
        "defaults_rate": round(s.defaults.rate, 2) if s.defaults else None,
        "speedup_vs_defaults": round(s.speedup_vs_defaults, 3) if s.speedup_vs_defaults else None,
        "script_rate": round(own.rate, 2) if own and own.ok else None,
        "speedup_vs_script": round(s.speedup_vs_script, 3) if s.speedup_vs_script else None,
        "speedup_vs_script_interval": _interval(s, own),
        "speedup_vs_defaults_interval": _interval(s, s.defaults),
        "keep_own_settings": s.choice.kept if own is not None else None,
    }


def _noise(s: RunSummary) -> dict[str, Any]:
    """The knee's figures ``tunekit check`` compares with: its window noise, its rate's 95 % interval (that of its
    runs' mean with the run-to-run spread in it, ``analysis.pooled``), its windows' own interval, its runs, the
    run-to-run spread its interval rests on with its degrees of freedom (``rules.Spread``: measured, or the prior),
    the band the plan steered by, and the configs still undecided against the knee."""
    knee = s.choice.knee
    assert knee is not None
    spread = s.evidence.spread_for(knee)
    return {
        "noise_cv": round(knee.noise_cv, 4),
        "rate_interval": round(knee.interval, 4) if knee.interval is not None else None,
        "window_interval": round(knee.window_interval, 4) if knee.window_interval is not None else None,
        "runs": [round(r, 2) for r in knee.runs] or None,
        "run_spread": round(spread.sd, 4),
        "spread_df": spread.df,
        "spread_measured": spread.measured,
        "band": round(float(s.choice.band or 0), 4),
        "undecided": [r.knobs.describe() for r in s.choice.undecided] or None,
    }


def _interval(s: RunSummary, against: Any) -> list[float] | None:
    """The knee's gain over ``against`` at 95 % (rules.gain_interval), as [low, high]."""
    if s.choice.knee is None or against is None or not against.ok:
        return None
    gain = s.gain(against)
    return [round(gain.low, 3), round(gain.high, 3)] if gain else None


def _rounded(value: float | None, digits: int) -> float | None:
    """``value`` to ``digits`` significant digits (a share of a sleeping model's FLOPs is tiny, not 0)."""
    return None if value is None else float(f"{value:.{digits}g}")


def _model_flops(s: RunSummary) -> dict[str, Any] | None:
    """What the knee's model asks of the device against what the device measured: FLOPs per item, the knee's and
    its compute ceiling's share of the matmul peak, the peak and the datasheet's figure beside it."""
    knee = s.choice.knee
    assert knee is not None
    flops, peak = rules.flops_per_item(knee, s.rows), s.peak(knee)
    if flops is None and peak is None:
        return None
    ceiling = compute_ceiling(s.rows, knee.knobs.batch_size)
    return {
        "flops_per_item": flops,
        "flops_reason": knee.measurement.flops_reason if flops is None else None,
        # the count's backward over its forward, outside rules.FLOP_BACKWARD_BAND: the share is uncertain
        "uncertain_backward_ratio": _rounded(rules.flops_uncertain(knee, s.rows), 2),
        "share_of_peak": _rounded(s.flop_share(knee), 4),
        "ceiling_share_of_peak": _rounded(s.flop_share(ceiling), 4),
        "ceiling_trial": ceiling.number if ceiling is not None else None,
        "matmul_peak_flops": peak.flops if peak else None,
        "matmul_peak_precision": peak.precision if peak else None,
        "matmul_peak_trial": peak.trial if peak else None,
        "datasheet_flops": peak.datasheet_flops if peak else None,
    }


def _distributed(s: RunSummary) -> dict[str, Any] | None:
    knee = s.choice.knee
    if knee is None or knee.knobs.ranks < 2:
        return None
    m, n = knee.measurement, knee.knobs.ranks
    return {
        "ranks": n,
        "nodes": m.nodes,
        "workers_per_rank": knee.knobs.num_workers,
        "workers_total": knee.knobs.num_workers * n,
        "cpus": m.cpu_count,
        "per_gpu_rate": round(knee.rate / n, 2),
        "scaling_efficiency": round(s.scaling.efficiency, 4) if s.scaling else None,
        "single_gpu_rate": round(s.scaling.single.rate, 2) if s.scaling else None,
        "sync_share": m.sync_share,
        "slowest_rank": m.slowest_rank,
        "rank_spread": m.rank_spread,
        "host_mem_peak_bytes": m.host_mem_peak_bytes,
        "pinned_peak_bytes_per_rank": m.pinned_peak_bytes,
    }


def recommendation_yaml(s: RunSummary) -> str | None:
    """recommended.yaml's text, or None when the run has no recommendation."""
    if s.choice.knee is None:
        return None
    data = recommendation_dict(s.choice.knee.knobs.to_dict(), _evidence(s))
    if s.script_command:  # how to run the script with the knee: the filled command, and what to set on its loader
        evidence = data.pop("evidence")
        site = {f"dataloader_{key}": value for key, value in s.loader_site.items()}
        data = {
            **data,
            "script": {"command": list(s.script_command), "set_on_dataloader": dict(s.set_on_loader), **site},
            "evidence": evidence,
        }
    header = (
        f"# tunekit recommendation for {s.name} on {s.device} ({s.date}).\n"
        + "".join(f"# DISTURBED: {line}.\n" for line in s.disturbances)
        + "# Load it with: tunekit.load_recommended(path).dataloader_kwargs()\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False)
