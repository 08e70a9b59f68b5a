"""Script mode's hook into torch: the bootstrap (``_bootstrap/sitecustomize.py``) calls :func:`install` at
interpreter start when the launcher set ``TUNEKIT_SCRIPT_SPEC`` (the trial's spec.json) and
``TUNEKIT_SCRIPT_MEASUREMENT`` (where measurement.json goes). From then on every ``DataLoader`` the script builds is
counted with the line that built it, and each ``iter()`` goes to the trial's :class:`~._session.Session`, which
picks the training loader and measures it (a loader it passes over is iterated as torch would)."""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from typing import Any

import torch
from torch.utils.data import DataLoader

from tunekit._files import read_json
from tunekit.command import placeholders
from tunekit.contract import TrialSpec
from tunekit.contract import process as names
from tunekit.worker.script._session import Session

__all__ = ["install", "SPEC_ENV", "OUT_ENV"]

SPEC_ENV, OUT_ENV = names.SCRIPT_SPEC, names.SCRIPT_MEASUREMENT

_original_init = DataLoader.__init__
_original_iter = DataLoader.__iter__

_SESSION: Session | None = None


def _torchrun_agent() -> bool:
    """Whether this process is torchrun itself (it starts the ranks; they train)."""
    argv = getattr(sys, "orig_argv", sys.argv)
    return "LOCAL_RANK" not in os.environ and (
        any(os.path.basename(a) == "torchrun" for a in argv[1:2]) or "torch.distributed.run" in argv[1:3]
    )


def _init(self: DataLoader, *args: Any, **kwargs: Any) -> None:
    _original_init(self, *args, **kwargs)
    if _SESSION is not None:
        _SESSION.built.append(weakref.ref(self))
        _SESSION.sites.append(_built_at(sys._getframe(1)))
        _SESSION.marks.put(built=len(_SESSION.built))


_NOT_THE_SCRIPTS = (
    os.path.dirname(torch.__file__) + os.sep,
    os.path.dirname(os.path.dirname(os.path.dirname(__file__))) + os.sep,
)
"""torch's and tunekit's own folders: their frames are never where a script built its loader."""

_PASSING_ON = frozenset({"wrapper", "wrapped", "inner", "_wrapper"})
"""Decorators' inner functions, which pass a call on (Lightning wraps ``DataLoader.__init__`` while a module's
``train_dataloader()`` runs, to record its arguments): a package frame of one of these did not build the loader."""


def _built_at(frame: Any) -> dict[str, str]:
    """Where a DataLoader was built, from the frame that called its ``__init__`` outwards: ``built_at``, the
    innermost line of the script's own code (``file:line``), and ``built_by``, the installed package that built it
    for the script (accelerate for HF Trainer's loader), when the innermost frame outside torch lies in one."""
    site: dict[str, str] = {}
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_NOT_THE_SCRIPTS) and not path.startswith("<"):
            package = _installed_package(path)
            if package is None:
                site["built_at"] = f"{path}:{frame.f_lineno}"
                return site
            if frame.f_code.co_name not in _PASSING_ON:
                site.setdefault("built_by", package)
        frame = frame.f_back
    return site


def _installed_package(path: str) -> str | None:
    """The top-level package an installed file belongs to (its folder under site-packages), else None."""
    parts = path.split(os.sep)
    for i, part in enumerate(parts[:-1]):
        if part in ("site-packages", "dist-packages"):
            return parts[i + 1].removesuffix(".py")
    return None


def _iter(self: DataLoader) -> Any:
    session = _SESSION
    if session is None or session.done:
        return _original_iter(self)
    if session.training is self:  # the script's next iter() of the measured loader: the measurement goes on
        return session.stream
    if session.same_role(self):  # the training loader built anew (each epoch): the measurement goes on with it
        return session.follow(self)
    found_by = session.found_by(self) if session.training is None else None
    return _passed_through(session, self) if found_by is None else session.start(self, found_by)


def _passed_through(session: Session, loader: DataLoader) -> Any:
    index = session.index(loader)
    for batch in _original_iter(loader):
        session.yielded[index] = session.yielded.get(index, 0) + 1
        yield batch


def install() -> None:
    """Hook torch's DataLoader for the trial named by the environment; write a failure if the script ends first."""
    global _SESSION
    from tunekit.worker import watch_parent

    if _torchrun_agent():  # its ranks install the meter, each in its own process
        return
    # the trial is this process's alone: no other Python child of the script (a spawn- or forkserver-context
    # DataLoader worker, a subprocess of sys.executable, a compile worker) finds it in its environment
    spec_path, out_path = os.environ.pop(SPEC_ENV), os.environ.pop(OUT_ENV)
    watch_parent()  # the script dies with the sweep that launched it, as a worker does
    spec = TrialSpec.from_dict(read_json(spec_path))
    _SESSION = Session(spec, out_path)
    if spec.knobs.threads and spec.stage != "baseline" and "threads" not in placeholders(_SESSION.command):
        torch.set_num_threads(spec.knobs.threads)  # as OMP_NUM_THREADS would, before the script's own code
    DataLoader.__init__ = _init  # type: ignore[method-assign]
    DataLoader.__iter__ = _iter  # type: ignore[method-assign]
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        previous(kind, exc, tb)
        if _SESSION is not None:
            _SESSION.failure(exc)

    sys.excepthook = excepthook
    atexit.register(lambda: _SESSION.failure() if _SESSION is not None else None)
