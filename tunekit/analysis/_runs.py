"""Configs measured more than once: their runs pooled into one row each, and the evidence the decisions read from
them (the run-to-run spreads, one config's rate over another's)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from tunekit import rules
from tunekit.contract import Mode, Stage
from tunekit.records import TrialRow


def _config(r: TrialRow) -> tuple[Any, ...]:
    return (r.stage, r.mode, r.knobs)


def pooled(rows: Iterable[TrialRow]) -> list[TrialRow]:
    """The trials as the decisions read them: each completed end-to-end config as one row, its first run's, whose
    rate is the mean of its runs' rates (a collapsed run, ``rules.collapsed``, set aside in ``collapsed``) and whose
    ``interval`` is that of the mean with the run-to-run spread in it (``rules.mean_interval``: the candidates'
    spread for a candidate, every repeated config's for the script's own settings; the prior where the repeats
    give too few degrees of freedom; never narrower than the windows'). A repeat that failed adds nothing; every
    other trial is kept as it is."""
    rows = list(rows)
    groups: dict[tuple[Any, ...], list[TrialRow]] = {}
    for r in rows:
        if r.ok and r.mode == Mode.train:
            groups.setdefault(_config(r), []).append(r)
    merged = {key: _merged(group) for key, group in groups.items()}
    evidence = Evidence.of(merged.values())
    out = []
    for r in rows:
        key = _config(r)
        if key in merged:
            if r is groups[key][0]:
                row = merged[key]
                runs = len(row.runs) or 1
                interval = rules.mean_interval(runs, evidence.spread_for(row), row.window_interval)
                out.append(dataclasses.replace(row, interval=interval))
        elif not r.run:
            out.append(r)
    return out


def _merged(group: list[TrialRow]) -> TrialRow:
    """The runs of one config as one row: the first run's identity, the mean rate and window noise of the runs that
    did not collapse (each with the block it ran in, for a config measured more than once), and their windows'
    intervals combined (``rules.mean_windows``)."""
    group = sorted(group, key=lambda r: r.run)
    down = set(rules.collapsed([r.rate for r in group]))
    kept = [r for i, r in enumerate(group) if i not in down]
    windows = rules.mean_windows([r.window_interval for r in kept])
    repeated = len(group) > 1
    return dataclasses.replace(
        group[0],
        rate=fmean(r.rate for r in kept),
        noise_cv=fmean(r.noise_cv for r in kept),
        runs=tuple(r.rate for r in kept) if repeated else (),
        blocks=tuple(r.run for r in kept) if repeated else (),
        collapsed=tuple((group[i].run, group[i].rate) for i in sorted(down)),
        interval=windows,
        window_interval=windows,
    )


@dataclass(frozen=True)
class Evidence:
    """What the decisions compare with: the run-to-run spreads of a run's repeated configs and the ratio of one
    config's rate over another's (``rules.ratio``). Each side of a ratio brings its own spread: a candidate the
    candidates' pooled one (one-way for a whole run, blocked for a paired one), the script's own settings their own
    runs' (often starved and erratic: the prior blended in where their repeats give too few degrees of freedom,
    and never less than the candidates'), so their spread enters only the comparisons with them."""

    candidates: rules.Spread
    """One-way spread over the repeated configs other than the script's own settings."""
    candidates_blocked: rules.Spread
    """The paired (config + block) spread over the candidates."""
    own: rules.Spread
    """The script's own settings' runs' spread."""
    own_blocked: rules.Spread
    """What is left of the script's own settings' runs once each block's common shift is out (their own
    residuals in the additive model over every repeated config)."""

    @classmethod
    def of(cls, rows: Iterable[TrialRow]) -> Evidence:
        """The evidence of pooled rows (:func:`pooled`)."""
        repeated = [r for r in rows if r.ok and r.mode == Mode.train and r.runs]
        picks = [r for r in repeated if r.stage != Stage.baseline]
        candidates = rules.spread(r.runs for r in picks)
        own = rules.spread(r.runs for r in repeated if r.stage == Stage.baseline)
        if own.sd < candidates.sd:
            own = dataclasses.replace(own, sd=candidates.sd)
        blocked = rules.blocked_spread({_config(r): r.by_run for r in picks})
        mine = next((_config(r) for r in repeated if r.stage == Stage.baseline), None)
        own_blocked = rules.blocked_spread({_config(r): r.by_run for r in repeated}, of=mine) if mine else own
        if own_blocked.sd < blocked.sd:
            own_blocked = dataclasses.replace(own_blocked, sd=blocked.sd)
        return cls(candidates, blocked, own, own_blocked)

    def spread_for(self, row: TrialRow) -> rules.Spread:
        """What one run of ``row``'s config varies by."""
        return self.own if row.stage == Stage.baseline else self.candidates

    def _paired(self, row: TrialRow) -> rules.Spread:
        return self.own_blocked if row.stage == Stage.baseline else self.candidates_blocked

    def ratio(self, a: TrialRow, b: TrialRow) -> rules.Ratio:
        """``a``'s rate over ``b``'s at 95 %, paired over their shared blocks where they have any."""
        return rules.ratio(
            a.by_run,
            b.by_run,
            paired=(self._paired(a), self._paired(b)),
            unpaired=(self.spread_for(a), self.spread_for(b)),
            a_windows=a.window_interval,
            b_windows=b.window_interval,
        )
