"""The trial worker: runs inside the trial's own subprocess, measures, and writes measurement.json.

``python -m tunekit.worker SPEC_JSON MEASUREMENT_JSON`` (one process, or every rank on the node running the sweep);
``--follow FOLDER`` (the ranks of another node, ``tunekit node``); ``--release`` (the end of a multi-node sweep);
``--fork-server FD`` (forks single-process trials, see ``_forkserver``).
Every outcome leaves a measurement file: numbers with status ok, or a status (oom, illegal_access, crashed) and a
one-line reason. The launcher handles what the worker cannot report itself (timeouts, signals, a missing or
malformed file).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from tunekit._files import read_json, write_json_atomic
from tunekit.contract import TrialSpec, failed_measurement
from tunekit.contract import process as names
from tunekit.launch import classify_error

__all__ = ["main", "EXIT_FAILED", "watch_parent"]

EXIT_FAILED = 3
"""Exit code of a worker that classified its own failure and wrote measurement.json."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - alive, someone else's
        return True
    return True


def _task(name: str, data: dict[str, Any]) -> int:
    """``--resolve PATHS``: which import paths do not resolve (JSON on the last line); ``--prepare WORKLOAD``: build
    the dataset once before the sweep's first trial (its length on the last line): datasets that build a cache on
    first use (synthetic_jpeg writes its JPEG files) would otherwise spend that time inside the first trial."""
    from tunekit.workloads import check_paths, resolve

    if name == names.RESOLVE:
        print(json.dumps(check_paths(data)))
        return 0
    dataset = resolve(data["dataset"])(**data.get("dataset_args", {}))
    try:
        print(len(dataset))
    except TypeError:  # an IterableDataset has no length, and needs none: built is all that was asked
        print("an iterable of")
    return 0


def watch_parent() -> None:
    """Kill this trial's process group if its parent (the launcher, or torchrun for a rank) or the sweep that
    launched it dies (SIGKILL, a lost terminal): a trial never outlives the sweep that started it."""
    parent = os.getppid()
    launcher = int(os.environ.get(names.LAUNCHER_PID) or 0)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent or (launcher and not _alive(launcher)):
                os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="tunekit-parent-watch", daemon=True).start()


def _rank() -> int | None:
    """This worker's rank in a multi-rank trial (torchrun sets RANK), else None."""
    return int(os.environ["RANK"]) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None


def _spec_and_paths(args: list[str], rank: int | None) -> tuple[TrialSpec | None, str]:
    """The trial to run and where its measurement goes: from SPEC MEASUREMENT on the node running the sweep (whose
    rank 0 hands the spec on to the other nodes), or from rank 0 with ``--follow FOLDER`` on another node. None:
    the sweep is over (``--release``, or a follower told so)."""
    if args[0] == names.RELEASE:
        if rank == 0:
            from tunekit.worker._dist import publish

            publish(None)
        return None, ""
    if args[0] == names.FOLLOW:
        from tunekit.worker._dist import receive

        folder = Path(args[1])
        data = receive()
        if data is None:
            (folder / names.NODE_STOP_FILE).touch()
            return None, ""
        spec = TrialSpec.from_dict(data)
        (folder / names.NODE_TRIAL_FILE).write_text(str(spec.number))  # the node loop reports which trial it served
        return spec, str(folder / names.MEASUREMENT_FILE)
    spec = TrialSpec.from_dict(read_json(args[0]))
    if rank == 0 and int((spec.config.get("launch") or {}).get("nnodes") or 1) > 1:
        from tunekit.worker._dist import publish

        publish(spec.to_dict())
    return spec, args[1]


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args[:1] == [names.FORK_SERVER]:  # no watch thread there: the server forks, and forks only its one thread
        from tunekit.worker.script._forkserver import serve

        return serve(int(args[1]))
    if args[:1] in ([names.PREPARE], [names.RESOLVE]):  # a sweep's short tasks, forked from the server as trials are
        return _task(args[0], json.loads(args[1]))
    watch_parent()
    rank = _rank()
    spec, out_path = _spec_and_paths(args, rank)
    if spec is None:
        return 0
    # rank 0 writes the trial's measurement; a failing rank writes its failure beside it, with the time: the first
    # rank to fail is the cause (the others then fail in their collectives with a lost peer)
    failure_path = out_path if rank is None else str(Path(out_path).with_name(names.rank_failure_file(rank)))
    where = "" if rank is None else f"rank {rank}: "
    try:
        from tunekit.worker.factory._measure import measure  # torch: a broken install is a classified failure too

        result = measure(spec)
    except Exception as exc:  # noqa: BLE001 - every failure becomes data
        when = {} if rank is None else {"failed_at": time.time()}
        if type(exc).__name__ == "Diverged":  # a NaN/Inf loss: its own status, the reason as written
            write_json_atomic(
                failure_path,
                failed_measurement(spec, "diverged", f"{where}{exc}", exception="Diverged", **when).to_dict(),
            )
            return EXIT_FAILED
        text = "".join(traceback.format_exception(exc))
        sys.stderr.write(f"{where}{text}")
        sys.stderr.flush()
        status, reason = classify_error(f"{type(exc).__name__}: {exc}\n{text}")
        write_json_atomic(
            failure_path,
            failed_measurement(spec, status, f"{where}{reason}", exception=type(exc).__name__, **when).to_dict(),
        )
        if rank is not None:  # a rank's interpreter exit can hang in the backend's teardown, its peers gone
            sys.stderr.flush()
            os._exit(EXIT_FAILED)
        return EXIT_FAILED
    if result is None:  # not rank 0: rank 0 wrote the merged measurement
        return 0
    write_json_atomic(out_path, result.to_dict())
    sys.stderr.write(f"trial {spec.number}: {result.rate:.1f} {result.unit}/s -> {Path(out_path)}\n")
    return 0
