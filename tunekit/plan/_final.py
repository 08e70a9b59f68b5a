"""The staged plan's last stages: the repeats of the configs a decision rests on, then the scaling trial
(docs/plan.md)."""

from __future__ import annotations

from tunekit import rules
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
    script's own settings, the cheapest config still undecided against the best, the knee, the best; then again):
    each block's runs ran back to back, so their ratios are paired (``analysis.Evidence``) and their spread is the
    run-to-run noise measured on this machine. The choice is made anew after each run, so a knee that moves is
    repeated too. Then a run that collapsed (``rules.collapsed``) is measured again, once per config; and while a
    cheaper config is undecided against the best, further blocks of the two, up to ``rules.DECIDING_RUNS`` runs
    each (the budget may end them first: the choice is then provisional, and says so). The script's own settings
    are asked for as their first trial was (``_script_baseline``: its knobs are what the script chose)."""
    if not s.selection.repeats:
        return []
    choice = select(s.cfg, s.raw)
    own = next((r for r in s.rows if r.stage == Stage.baseline and r.ok and r.mode == Mode.train), None)
    contender = choice.undecided[0] if choice.undecided else None
    configs = _distinct(own, contender, choice.knee, choice.best)
    for run in range(1, s.selection.repeats + 1):
        asked = [req for c in configs if not _done(s, req := _request(s, c, run))]
        if asked:
            return asked
    again = [_request(s, c, _next_run(s, c)) for c in configs if c.collapsed and len(c.collapsed) < 2]
    if again:
        return again
    if contender is not None and choice.best is not None:
        pair = _distinct(contender, choice.best)
        runs = max(_next_run(s, c) for c in pair)
        if runs < rules.DECIDING_RUNS:
            return [req for c in pair if not _done(s, req := _request(s, c, runs))]
    return []


def _distinct(*rows: TrialRow | None) -> list[TrialRow]:
    """The completed end-to-end configs among ``rows``, each once, in order."""
    out: list[TrialRow] = []
    for row in rows:
        if row is not None and row.ok and row.mode == Mode.train and all(row.key != c.key for c in out):
            out.append(row)
    return out


def _request(s: _Finished, row: TrialRow, run: int) -> Request:
    return Request(row.stage, row.mode, _asked_knobs(s, row), run=run)


def _done(s: _Finished, req: Request) -> bool:
    """Whether the repeat ``req`` ran: the script's own settings' one trial of that run, whatever its knobs turned
    out to be; another config's asked for and run with other knobs too (pending reads each trial's asked knobs)."""
    if req.stage == Stage.baseline:
        return any(r.stage == Stage.baseline and r.run == req.run for r in s.raw)
    return not pending([req], s.raw)


def _next_run(s: _Finished, row: TrialRow) -> int:
    """The run index after the last one ``row``'s config ran (or failed) with."""
    same = [r.run for r in s.raw if (r.stage, r.mode) == (row.stage, row.mode) and _same_config(s, r, row)]
    return max(same, default=0) + 1


def _same_config(s: _Finished, r: TrialRow, row: TrialRow) -> bool:
    if row.stage == Stage.baseline:
        return r.stage == Stage.baseline
    return r.knobs == row.knobs or r.asked_key == (row.stage, row.mode, _asked_knobs(s, row), r.run)


def _asked_knobs(s: _Finished, row: TrialRow) -> Knobs:
    """The knobs to ask a repeat of ``row`` with: those its first trial was asked with (the script's own settings'
    request; a trial the script ran with other knobs than asked, ``Measurement.asked``, its request's)."""
    if row.stage == Stage.baseline:
        return _script_request_knobs(s)
    return Knobs.of(**{**row.knobs.to_dict(), **(row.measurement.asked or {})})
