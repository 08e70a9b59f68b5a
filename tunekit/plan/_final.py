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
    final = select(s.cfg, s.raw).knee  # the knee as reported (your batch, keep your settings applied)
    knee = final if final is not None and final.stage != Stage.baseline else s.knee(None)
    if s.world < 2 or knee is None or knee.knobs.ranks < 2:
        return []
    return pending([Request(Stage.scaling, Mode.train, Knobs.of(**{**knee.knobs.to_dict(), "ranks": 1}))], s.raw)


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
        asked = []
        for c in configs:
            req = Request(c.stage, c.mode, _asked_knobs(s, c), run=run)
            if c.stage == Stage.baseline:  # one trial whatever its knobs turn out to be, as its first
                done = any(r.stage == Stage.baseline and r.run == run for r in s.raw)
            else:  # asked for and run with other knobs is done too (pending reads each trial's asked knobs)
                done = not pending([req], s.raw)
            if not done:
                asked.append(req)
        if asked:
            return asked
    return []


def _asked_knobs(s: _Finished, row: TrialRow) -> Knobs:
    """The knobs to ask a repeat of ``row`` with: those its first trial was asked with (the script's own settings'
    request; a trial the script ran with other knobs than asked, ``Measurement.asked``, its request's)."""
    if row.stage == Stage.baseline:
        return _script_request_knobs(s)
    return Knobs.of(**{**row.knobs.to_dict(), **(row.measurement.asked or {})})
