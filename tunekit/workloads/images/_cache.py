"""The synthetic JPEG folder, written once per recipe (in parallel processes) and reused: its marker, an
atomic install, and the discard of a stale or broken one."""

from __future__ import annotations

import json
import logging
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import uuid
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from PIL import Image

from tunekit.config import cpu_count
from tunekit.workloads.images._render import _render

logger = logging.getLogger(__name__)


_MARKER = "DONE.json"


_RECIPE_VERSION = 1  # bump when the pixel recipe changes, so stale caches are not reused


_POOL_THRESHOLD = 64  # below this many images, generate inline


_MAX_WORKERS = 16


_CHUNKS_PER_WORKER = 4


@dataclass(frozen=True)
class _Params:
    """Everything that determines the bytes of the generated files."""

    width: int
    height: int
    quality: int
    seed: int
    num_images: int
    version: int = _RECIPE_VERSION

    @property
    def folder_name(self) -> str:
        return f"{self.width}x{self.height}-q{self.quality}-s{self.seed}-n{self.num_images}-v{self.version}"


def _cache_root(cache_dir: str | None) -> Path:
    root = cache_dir or os.environ.get("TUNEKIT_CACHE") or os.path.join("~", ".cache", "tunekit")
    return Path(root).expanduser()


def _ensure_generated(parent: Path, params: _Params) -> Path:
    """Return the complete cache folder for ``params``, generating it first if needed."""
    target = parent / params.folder_name
    if _is_complete(target, params):
        return target
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{params.folder_name}.tmp-", dir=parent))
    try:
        logger.info("generating %d synthetic JPEGs into %s", params.num_images, target)
        _generate(tmp, params)
        _write_marker(tmp, params)
        _install(tmp, target, params)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _is_complete(folder: Path, params: _Params) -> bool:
    """Trust a folder only if its marker matches ``params`` and every image file is present."""
    try:
        marker = json.loads((folder / _MARKER).read_text())
        names = os.listdir(folder)
    except (OSError, ValueError):
        return False
    expected = {**asdict(params), "count": params.num_images}
    jpegs = sum(name.endswith(".jpg") for name in names)
    return marker == expected and jpegs == params.num_images


def _write_marker(folder: Path, params: _Params) -> None:
    marker = {**asdict(params), "count": params.num_images}
    (folder / _MARKER).write_text(json.dumps(marker, sort_keys=True))


def _install(tmp: Path, target: Path, params: _Params) -> None:
    """Atomically rename ``tmp`` to ``target``; if another process got there first, keep its folder."""
    for _ in range(5):
        try:
            os.rename(tmp, target)
            return
        except OSError:
            if _is_complete(target, params):
                return  # another process won the race; the caller deletes tmp
            _discard(target)  # stale or tampered folder without a valid marker
    raise RuntimeError(f"could not install generated images at {target}")


def _discard(folder: Path) -> None:
    """Move ``folder`` out of the way atomically, then delete it."""
    trash = folder.with_name(f".{folder.name}.trash-{uuid.uuid4().hex}")
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _generate(folder: Path, params: _Params) -> None:
    """Write all images of ``params`` into ``folder``, in worker processes when there are many."""
    # Daemonic processes (e.g. DataLoader workers) may not have children: generate inline there too.
    if params.num_images < _POOL_THRESHOLD or multiprocessing.current_process().daemon:
        _write_range(str(folder), params, 0, params.num_images)
        return
    workers = min(cpu_count(), _MAX_WORKERS)
    chunk = math.ceil(params.num_images / (workers * _CHUNKS_PER_WORKER))
    bounds = [(start, min(start + chunk, params.num_images)) for start in range(0, params.num_images, chunk)]
    with _process_pool(workers) as pool:
        futures = [pool.submit(_write_range, str(folder), params, start, stop) for start, stop in bounds]
        for future in futures:
            future.result()


def _process_pool(workers: int) -> ProcessPoolExecutor:
    """A process pool; on Linux it forks, so workers skip re-importing torch (seconds per process)."""
    if not sys.platform.startswith("linux"):
        return ProcessPoolExecutor(max_workers=workers)
    with warnings.catch_warnings():
        # Python >= 3.12 warns when forking a multi-threaded process; the children only run numpy and PIL.
        warnings.filterwarnings("ignore", r".*fork\(\) may lead to deadlocks", DeprecationWarning)
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))
        # With fork, all workers start on the first submit: start them here, inside the warnings filter.
        pool.submit(int).result()
    return pool


def _write_range(folder: str, params: _Params, start: int, stop: int) -> None:
    for index in range(start, stop):
        pixels = _render(params.seed, index, params.width, params.height)
        Image.fromarray(pixels).save(_image_path(folder, index), format="JPEG", quality=params.quality, optimize=False)


def _image_path(root: str | Path, index: int) -> str:
    return os.path.join(root, f"{index:06d}.jpg")
