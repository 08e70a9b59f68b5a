"""The staged plan: its stages in order (``STAGES``), the requests of the first stage that has any, the baseline
it owes its report, and its usual size. Each stage lives in its own module."""

from __future__ import annotations

from tunekit.config import Config, extra_knobs
from tunekit.contract import Stage
from tunekit.plan._ceilings import _compute, _loader
from tunekit.plan._final import _repeats, _scaling
from tunekit.plan._finished import StagePlan, _Finished
from tunekit.plan._refine import _accumulation, _compile, _extra, _prefetch, _smaller_batches
from tunekit.plan._request import Request, pins
from tunekit.plan._walk import _defaults_owed, _end_to_end, _script_baseline
from tunekit.records import TrialRow


def baseline_request(cfg: Config, rows: list[TrialRow], cuda: bool) -> Request | None:
    """The baseline trial a staged sweep that has chosen its batch still owes its report (None when none is): in
    script mode the script's own settings first (the gain the report leads with), then the PyTorch defaults. The
    driver runs it before a budget ends the sweep, so no report lacks its baseline."""
    s = _Finished(cfg, rows, cuda)
    batch = s.batch if _compute(s) == [] else None  # the compute stage over: the batch is final
    if batch is None:
        return None
    found = _script_baseline(s) or _defaults_owed(s, batch)
    return found[0] if found else None


def repeat_requests(cfg: Config, rows: list[TrialRow], cuda: bool) -> list[Request]:
    """The repeats a grid's decision rests on, once every combination ran."""
    return _repeats(_Finished(cfg, rows, cuda))


def script_baseline(cfg: Config, rows: list[TrialRow], cuda: bool) -> list[Request]:
    """Script mode's baseline trial while it is owed (a grid's too)."""
    return _script_baseline(_Finished(cfg, rows, cuda))


def scaling_requests(cfg: Config, rows: list[TrialRow], cuda: bool) -> list[Request]:
    """The scaling trial of a sweep under ``launch`` once its knee stages are done (a grid's too)."""
    return _scaling(_Finished(cfg, rows, cuda)) or []


STAGES: tuple[tuple[Stage | None, StagePlan], ...] = (
    (Stage.compute, _compute),
    (Stage.loader, _loader),
    (Stage.end_to_end, _end_to_end),
    (Stage.prefetch, _prefetch),
    (Stage.batch, _smaller_batches),
    (Stage.compile, _compile),
    (Stage.extra, _extra),
    (Stage.accumulation, _accumulation),
    (None, _repeats),
    (Stage.scaling, _scaling),
)
"""Each stage of the staged plan with its planner, in the order they run (the enum's; a script's own baseline is
planned by ``_end_to_end``, after the walk's start, or first of all by ``plan.next_requests`` with own_batch). The
repeats (None: they keep the stage of the config they repeat, ``Request.run``) come before the scaling trial, which
takes the final knee."""


def staged_requests(cfg: Config, rows: list[TrialRow], cuda: bool) -> list[Request]:
    """The first stage's pending requests; [] when every stage is complete or one cannot go on."""
    finished = _Finished(cfg, rows, cuda)
    for _, stage in STAGES:
        requests = stage(finished)
        if requests is None:
            return []
        if requests:
            return requests
    return []


def estimate_staged(cfg: Config, rows: list[TrialRow], cuda: bool) -> int:
    """Trials a staged sweep will likely run in all: every stage at its usual size."""
    s = cfg.search
    computed = [r for r in rows if r.stage == Stage.compute]
    over = computed and _compute(_Finished(cfg, rows, cuda)) == []
    n_compute = len(computed) if over else len(s.batch_size)  # at most every batch, down from the largest
    counts = len([w for w in s.num_workers if w])
    n_loader = 1 + max(0, counts - 1).bit_length()  # the most workers, then a bisection at worst
    n_e2e = 1 + min(3, len(s.num_workers)) * len(pins(cfg, cuda))  # the defaults; the start, one up, one down
    n_e2e += 1 if cfg.own_settings else 0  # the script's own settings
    total = n_compute + n_loader + n_e2e + (len(s.prefetch_factor) - 1) + (len(s.compile) - 1)
    knobs = extra_knobs(cfg)
    total += (
        sum(len(k.values) - 1 for k in knobs) + len(s.threads or []) + len(s.worker_threads or [])
    )  # one each, at the knee
    if s.threads or s.worker_threads or any(not k.changes_result for k in knobs):
        total += counts.bit_length()  # the bisection of the smaller worker counts after a faster value
    total += 1 if cfg.launch.world > 1 else 0  # the knee on one GPU: the scaling efficiency
    if s.target_effective_batch:
        total += sum(1 for b in s.batch_size if s.target_effective_batch % b == 0)
    else:
        total += min(1, len(s.batch_size) - 1)  # stage 4b usually tries one smaller batch, when data-bound
    return total
