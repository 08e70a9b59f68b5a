"""The staged plan's last stages: the repeats of the configs a decision rests on, then the scaling trial
(docs/plan.md)."""

from __future__ import annotations

from tunekit.analysis import select
from tunekit.contract import Knobs, Mode, Stage
from tunekit.plan._finished import _Finished
from tunekit.plan._request import Request, pending
from tunekit.plan._walk import _script_request_knobs
from tunekit.records import TrialRow


def _scaling(s: _Finished) -> list[Request] | None:
    """A multi-rank knee's config on one GPU, for the scaling efficiency (never a knee candidate: another job)."""
    knee = s.knee(None)
    if s.world < 2 or knee is None or knee.knobs.ranks < 2:
        return []
    return pending([Request(Stage.scaling, Mode.train, Knobs(**{**knee.knobs.to_dict(), "ranks": 1}))], s.raw)


def _repeats(s: _Finished) -> list[Request]:
    """The configs a decision rests on, each measured ``selection.repeats`` more times, in alternation (the
    script's own settings, the knee, the best; then again): their spread between runs is the run-to-run noise,
    measured on this machine, which widens the band and every gain's interval (``analysis.pooled``). The choice is
    made anew after each run, so a knee that moves is repeated too. The script's own settings are asked for as
    their first trial was (``_script_baseline``: its knobs are what the script chose)."""
    if not s.selection.repeats:
        return []
    choice = select(s.cfg, s.raw)
    own = next((r for r in s.rows if r.stage == Stage.baseline and r.ok and r.mode == Mode.train), None)
    configs: list[TrialRow] = []
    for row in (own, choice.knee, choice.best):
        if row is not None and row.ok and row.mode == Mode.train and all(row.key != c.key for c in configs):
            configs.append(row)
    for run in range(1, s.selection.repeats + 1):
        ran = [r for r in s.raw if r.run == run]
        asked = [Request(c.stage, c.mode, _asked_knobs(s, c), run=run) for c in configs
                 if not any(r.stage == c.stage and (r.knobs == c.knobs or c.stage == Stage.baseline) for r in ran)]
        if asked:
            return asked
    return []


def _asked_knobs(s: _Finished, row: TrialRow) -> Knobs:
    """The knobs to ask a repeat of ``row`` with: its own, or for the script's own settings those its first trial
    was asked with."""
    return _script_request_knobs(s) if row.stage == Stage.baseline else row.knobs
