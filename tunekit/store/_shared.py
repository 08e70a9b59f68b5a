"""A run whose studies live in a database that several nodes share (``storage:`` a URL): each node asks for its
next trial through optuna's own queue, beats while it runs it, and fails the trials of nodes that stopped beating.

Claiming a trial is optuna's: a node enqueues the request it wants run (a WAITING trial holding its knobs) and asks;
``ask`` pops the oldest WAITING trial atomically (a row update that succeeds for one node only), so each WAITING
trial is run by one node. Two nodes may enqueue the same request at once: the one popped with the higher trial id
sees the lower one (waiting, running or finished) and steps aside, closed as a ``duplicate`` that records nothing.
Trial creation holds the study's row lock, so the lower one is always visible to it: no request runs twice to
completion, and none is lost. A node that dies stops beating: after ``fleet.grace_s`` the next node that looks
fails its trial and optuna's retry callback (``RetryHeartbeatStaleTrialCallback``) enqueues it again, under its
number, for whichever node asks next.

Run-wide trial numbers (the trials/<n>/ folders, which the nodes keep apart) are the database's trial ids less the
run's ``base`` (the first id free when the run was created): unique however many nodes ask at once, consecutive
while no other run writes the database meanwhile.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tunekit.config import Config
from tunekit.contract import Knobs, Measurement, Mode, Stage
from tunekit.store._run import _SET_ASIDE, INTERRUPTED, RunStore, _guarded, knob_params, suggest_knobs
from tunekit.store._url import StorageUrl, quiet_optuna

__all__ = ["SharedRun", "Claim", "DUPLICATE", "BASE", "REQUEST", "SKIP"]

DUPLICATE = "duplicate"
"""The status of a trial a node popped and closed at once: another trial of the same request came first."""
BASE = "base"
"""The main study's user attribute: the first trial id of the run (trial numbers count from it)."""
REQUEST = "request"
"""A shared run's trial's user attribute: the request it runs (stage, mode, knobs, run), as the plan asked; two
trials of one request are one trial run twice."""
SKIP = "skip"
"""A shared run's trial's user attribute: the plan's skip reason and bound, when it is skipped."""
BEATING = "beating"
"""A shared run's trial's user attribute: its own trial id, set once its node recorded its first heartbeat (a copy
queued again carries its predecessor's id, so the mark is its own only once it beats)."""
_FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)


@dataclass(frozen=True)
class Claim:
    """A trial this node popped from the queue and now runs (RUNNING, its heartbeat recorded)."""

    trial: optuna.Trial
    number: int
    stage: Stage
    mode: Mode
    knobs: Knobs
    run: int
    skip: str | None = None
    """Why the plan skips it (it is recorded at once, without running), or None."""
    bound: tuple[float, int] | None = None
    """A skipped trial's upper bound and the trial that shows it (``plan.Request.bound``)."""
    retried: int | None = None
    """The trial number of a run this one repeats because its node stopped beating, else None."""


def _request(stage: Stage, mode: Mode, knobs: Knobs, run: int) -> dict[str, Any]:
    return {"stage": Stage(stage).value, "mode": Mode(mode).value, "knobs": knobs.to_dict(), "run": run}


class SharedRun(RunStore):
    """The studies of one run in a shared database (``tunekit/<name>``, ``tunekit-ceilings/<name>``)."""

    shared = True

    def __init__(
        self,
        run_dir: Path,
        main: optuna.Study,
        ceilings: optuna.Study | None,
        url: StorageUrl,
        storage: optuna.storages.RDBStorage,
        heartbeat_s: int,
    ):
        super().__init__(run_dir, main, ceilings)
        self.url = url
        self.storage = storage
        self.heartbeat_s = heartbeat_s
        self._unbeaten: dict[int, float] = {}
        """Running trials without their ``BEATING`` mark: when this node first saw each (``time.monotonic``)."""

    @property
    def where(self) -> str:
        return f"{self.url.shown} (study {self.main.study_name})"

    @_guarded
    def start(
        self, cfg: Config, stage: Stage, mode: Mode, knobs: dict[str, Any], run: int = 0
    ) -> tuple[optuna.Trial, int]:
        """Ask for a trial with exactly these knobs (a seed recorded before any other node asks: the queue holds
        nothing else)."""
        claim = self.claim(cfg, stage, mode, Knobs.of(**knobs), run)
        if claim is None or (claim.stage, claim.mode, claim.knobs, claim.run) != (stage, mode, Knobs.of(**knobs), run):
            raise RuntimeError(f"{self.where}: another node's trial was in the queue while this run was seeded")
        return claim.trial, claim.number

    @_guarded
    def claim(
        self,
        cfg: Config,
        stage: Stage,
        mode: Mode,
        knobs: Knobs,
        run: int,
        skip: str | None = None,
        bound: tuple[float, int] | None = None,
    ) -> Claim | None:
        """Enqueue this request and ask for a trial: the claim of the oldest trial waiting (this one, or one enqueued
        before it: a node's that died, another's), or None when the trial popped was a duplicate (ask again)."""
        study = self._study_for(mode)
        tags = {
            REQUEST: _request(stage, mode, knobs, run),
            SKIP: None if skip is None else {"reason": skip, "bound": list(bound) if bound else None},
            "stage": Stage(stage).value,
            "mode": Mode(mode).value,
            "run": run,
        }
        study.enqueue_trial(knob_params(cfg, knobs), user_attrs=tags, skip_if_exists=False)
        return self._pop(cfg, study)

    @_guarded
    def waiting(self) -> int:
        """How many trials wait in the queue for a node to ask."""
        return sum(len(s.get_trials(deepcopy=False, states=(TrialState.WAITING,))) for s in self._studies())

    @_guarded
    def pop_waiting(self, cfg: Config) -> Claim | None:
        """A trial already waiting in either study (a dead node's, queued again; one a node enqueued and did not
        ask for), claimed; None when none waits or the one popped was a duplicate."""
        for study in self._studies():
            if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                return self._pop(cfg, study)
        return None

    def _pop(self, cfg: Config, study: optuna.Study) -> Claim | None:
        with quiet_optuna():
            trial = study.ask()  # the oldest WAITING trial, atomically; a fresh one when another node was quicker
        request = trial.user_attrs.get(REQUEST)
        if request is None or self._earlier(study, trial._trial_id, request):
            trial.set_user_attr("status", DUPLICATE)
            study.tell(trial, state=TrialState.FAIL)
            return None
        self.storage.record_heartbeat(trial._trial_id)  # from now on a dead node's trial is seen as stale
        trial.set_user_attr(BEATING, trial._trial_id)
        knobs = Knobs.of(**request["knobs"])
        number = trial.user_attrs.get("number")
        retried = number
        if number is None:
            number = trial._trial_id - int(self.main.user_attrs.get(BASE, 0))
            trial.set_user_attr("number", number)
        suggest_knobs(cfg, study, trial, knob_params(cfg, knobs))
        skip = trial.user_attrs.get(SKIP) or {}
        bound = skip.get("bound")
        return Claim(
            trial,
            number,
            Stage(request["stage"]),
            Mode(request["mode"]),
            knobs,
            int(request["run"]),
            skip.get("reason"),
            (float(bound[0]), int(bound[1])) if bound else None,
            retried,
        )

    def _earlier(self, study: optuna.Study, trial_id: int, request: dict[str, Any]) -> bool:
        """Whether a trial of the same request came before this one and still counts: waiting, running, or finished
        with a measurement (not interrupted, failed as stale, closed as a duplicate or set aside)."""
        aside = set(study.user_attrs.get(_SET_ASIDE, []))
        for t in study.get_trials(deepcopy=False):
            if t._trial_id >= trial_id or t.user_attrs.get(REQUEST) != request:
                continue
            if t.state in (TrialState.WAITING, TrialState.RUNNING):
                return True
            counted = "measurement" in t.user_attrs and t.user_attrs.get("status") != INTERRUPTED
            if t.state in _FINISHED and counted and t.user_attrs.get("number") not in aside:
                return True
        return False

    @_guarded
    def in_flight(self) -> list[tuple[Stage, Mode, Knobs, int]]:
        """The requests waiting or running on some node, oldest first."""
        found = []
        for study in self._studies():
            for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING)):
                request = t.user_attrs.get(REQUEST)
                if request is not None:
                    found.append((t._trial_id, request))
        return [(Stage(r["stage"]), Mode(r["mode"]), Knobs.of(**r["knobs"]), int(r["run"])) for _, r in sorted(found)]

    @_guarded
    def fail_stale(self) -> None:
        """Fail the trials whose node stopped beating; optuna's retry callback enqueues each again. A trial whose
        node died between asking for it and its first heartbeat has no heartbeat for optuna to find stale: it is
        failed and queued again once this node has seen it unmarked for twice the grace period (on its own clock:
        the trial's start is the popping node's, whose clock may differ)."""
        unbeaten: dict[int, float] = {}
        with quiet_optuna():
            for study in self._studies():
                optuna.storages.fail_stale_trials(study)
                self._fail_unbeaten(study, unbeaten)
        self._unbeaten = unbeaten  # the trials still running unmarked: those finished since are forgotten

    def _fail_unbeaten(self, study: optuna.Study, unbeaten: dict[int, float]) -> None:
        grace = self.storage.grace_period or 2 * (self.storage.heartbeat_interval or self.heartbeat_s)
        now = time.monotonic()
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if t.user_attrs.get(BEATING) == t._trial_id:
                continue
            first = unbeaten[t._trial_id] = self._unbeaten.get(t._trial_id, now)
            if now - first <= 2 * grace:
                continue
            try:
                if not self.storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                    continue
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # another node failed it first
            again = self.storage.get_heartbeat_stale_trial_callback()
            if again is not None and REQUEST in t.user_attrs:  # a trial asked for without a request is no work
                again(study, copy.deepcopy(self.storage.get_trial(t._trial_id)))

    def recover_running(self) -> list[int]:
        """A resumed node leaves the other nodes' trials running: only those whose node stopped beating are failed
        (and queued again)."""
        self.fail_stale()
        return []

    @contextlib.contextmanager
    def beating(self, claim: Claim) -> Iterator[None]:
        """Record the claimed trial's heartbeat every ``fleet.heartbeat_s`` while it runs (a node that dies stops
        beating, and its trial is run again elsewhere). A missed beat is left to the next: a database that does not
        answer for the whole grace period has the trial run again, and this node's result is then not recorded."""
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.heartbeat_s):
                with contextlib.suppress(Exception):
                    self.storage.record_heartbeat(claim.trial._trial_id)

        thread = threading.Thread(target=beat, name="tunekit-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def finish(self, trial: optuna.Trial, mode: Mode, measurement: Measurement) -> bool:
        """Record the measurement; False when the trial was failed meanwhile as stale (its heartbeat lapsed) and
        queued again: its re-run is the one that counts."""
        try:
            return super().finish(trial, mode, measurement)
        except optuna.exceptions.UpdateFinishedTrialError:
            return False

    def interrupt(self, trial: optuna.Trial, mode: Mode) -> None:
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            super().interrupt(trial, mode)

    def __repr__(self) -> str:
        return f"SharedRun({self.where})"
