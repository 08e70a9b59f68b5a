"""The run's record: the optuna studies holding every trial of a run, in the run folder's ``study.db`` (one machine,
the default) or in a database named by a URL (``storage:``, ``--storage``), which several runs and the nodes of one
sweep share.

Two studies hold a run, so that optuna's own tools (``study.best_trial``, optuna-dashboard) see the truth:

* ``tunekit`` holds the end-to-end trials, whose objective is the job's throughput: COMPLETE with its rate (``unit``/s),
  FAIL with a status and reason, PRUNED when the plan skipped it (the reason says why). The sweep stores its knee
  on this study (user attribute ``knee``); ``best_trial`` is the fastest end-to-end trial.
* ``tunekit-ceilings`` holds the compute-alone and loader-alone trials: bounds, not configs to choose.

In a shared database the run's name tells its studies from other runs': ``tunekit/<name>`` and
``tunekit-ceilings/<name>`` (``<name>``: the config's ``name``). The main study records the run's config, strategy,
name (``run``) and the machine it sweeps on (``machine``: ``env.machine_fingerprint``); :func:`runs_in` lists the
runs a database holds, :func:`load_stored` opens one.

Each trial is asked for with its knobs as categorical params (enqueued, so the values are exactly the plan's);
its run-wide number (the trials/<n>/ folder), stage, mode and whole measurement are user attributes. A trial still
RUNNING when a sweep resumes belongs to a sweep that died: its leftover process group is killed, it is closed as
interrupted, and the plan asks for it again (in a shared database, only once its node has stopped beating:
``_shared``). Runs recorded in one study (older runs) are read the same way.

Modules: ``_run`` (``RunStore``: recording and reading a run's trials), ``_shared`` (``SharedRun``: the nodes'
claims, heartbeats and stale trials), ``_open`` (opening a run, listing a database's), ``_url`` (storage URLs, their
masked passwords, the database's errors as one line).
"""

from tunekit.store._open import StoredRun, load_run, load_stored, open_run, runs_in, study_names
from tunekit.store._run import CEILINGS_STUDY, MAIN_STUDY, STUDY_FILE, RunStore, fingerprint
from tunekit.store._shared import DUPLICATE, Claim, SharedRun
from tunekit.store._url import StorageUrl, masked, parse_url, storage_errors

__all__ = [
    "RunStore",
    "SharedRun",
    "Claim",
    "StoredRun",
    "StorageUrl",
    "open_run",
    "load_run",
    "load_stored",
    "runs_in",
    "study_names",
    "parse_url",
    "masked",
    "storage_errors",
    "fingerprint",
    "STUDY_FILE",
    "MAIN_STUDY",
    "CEILINGS_STUDY",
    "DUPLICATE",
]
