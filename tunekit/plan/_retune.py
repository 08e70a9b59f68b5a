"""A retune's search: the staged plan run again on a search narrowed around a committed knee (``tunekit check
--retune``), so that it confirms the knee or moves it in a fraction of a full sweep's trials. The plan itself is
the same: only the lists it walks are shorter (docs/plan.md, "Retune")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tunekit.config import Config, extra_knobs
from tunekit.contract import Knobs


def _around(values: list[int], value: int) -> list[int]:
    """``value`` and its neighbours in the sorted ``values`` (``value`` joins them when they lack it)."""
    ordered = sorted(set(values) | {value})
    i = ordered.index(value)
    return ordered[max(0, i - 1) : i + 2]


def knee_values(cfg: Config, values: Mapping[str, Any]) -> dict[str, Any]:
    """Config overrides that hold each user-defined knob (``search.extra``) at a recommendation's value
    (recommended.yaml's ``config``), the others at their baseline, as the one value listed: a factory config also
    holds the value at its key (its baseline is the config's own value there); a script's command takes the first
    listed."""
    knobs = extra_knobs(cfg)
    if not knobs:
        return {}
    held = {k.key: values.get(k.key, k.baseline) for k in knobs}
    out: dict[str, Any] = {
        "search.extra": {k.key: {"values": [held[k.key]], "changes_result": k.changes_result} for k in knobs}
    }
    if cfg.script is None:
        out.update(held)
    return out


def retune_search(
    cfg: Config, knee: Knobs, values: Mapping[str, Any] | None = None, measured: Iterable[int] = ()
) -> dict[str, Any]:
    """The overrides of a retune's search around ``knee`` (in ``cfg``'s search lists, as resolved on this machine):

    * workers: the counts from half the knee's to twice it, and the next one beyond each end: a per-item cost that
      doubled needs twice the workers (and the count above confirms that the climb stopped gaining), one that
      halved half of them; the end-to-end walk climbs only while a step up gains more than the band and descends
      only while a step down stays within it, so the counts it does not need are skipped, not run. Above, the
      next count beyond is the first the committed sweep measured the loader alone at (``measured``), when
      there is one: its ceiling is reused, and the loader stage starts from the most workers;
    * prefetch: the knee's factor and its neighbours; batch: the knee's and its neighbours, whose compute ceilings
      choose among them as in a sweep (a script's own batch stays its own);
    * pin_memory, accumulation, compile, threads and the user-defined knobs: the knee's values only.
    """
    s = cfg.search
    w = min(knee.num_workers, max(s.num_workers))  # a knee of a larger machine: this one's most workers
    counts = sorted(set(s.num_workers) | {w})
    below, above = [c for c in counts if c < w], [c for c in counts if c > w]
    up, down = [c for c in above if c <= 2 * w], [c for c in below if c >= w / 2]
    beyond = [c for c in above[len(up) :] if c in set(measured)][:1] or above[len(up) : len(up) + 1]
    workers = below[: len(below) - len(down)][-1:] + down + [w] + up + beyond
    out: dict[str, Any] = {
        "search.num_workers": workers,
        "search.prefetch_factor": _around(s.prefetch_factor, knee.prefetch_factor or s.prefetch_factor[0]),
        "search.pin_memory": [knee.pin_memory],
        "search.compile": [knee.compile],
        "search.threads": [knee.threads] if knee.threads else None,
        "search.worker_threads": [knee.worker_threads] if knee.worker_threads else None,
    }
    if not cfg.own_batch:
        out["search.batch_size"] = _around(s.batch_size, knee.batch_size)
    if not s.target_effective_batch:
        out["search.grad_accum"] = [knee.grad_accum]
    return {**out, **knee_values(cfg, values or {})}
