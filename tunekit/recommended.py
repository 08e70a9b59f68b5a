"""recommended.yaml: what a sweep recommends, in a form a training script loads without a GPU or torch.

    rec = tunekit.load_recommended("recommended.yaml")
    loader = DataLoader(dataset, **rec.dataloader_kwargs())
    x = x.to(device, non_blocking=rec.non_blocking)
    args = transformers.TrainingArguments(output_dir="out", **rec.training_arguments())
    trainer = lightning.pytorch.Trainer(**rec.lightning_trainer_kwargs())
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tunekit.config import check_knobs
from tunekit.errors import ConfigError, UsageError

__all__ = ["Recommended", "load_recommended", "recommendation_dict", "worker_threads_init", "RECOMMENDED_VERSION"]

RECOMMENDED_VERSION = 2
"""The version of recommended.yaml written now. Version 1 (files without ``version``) named the evidence's
throughput ``samples_per_s`` whatever its unit; :func:`load_recommended` reads both."""

_V1_EVIDENCE = {"samples_per_s": "rate", "best_samples_per_s": "best_rate", "defaults_samples_per_s": "defaults_rate",
                "samples_per_dollar": "items_per_money"}
_V1_DISTRIBUTED = {"per_gpu_samples_per_s": "per_gpu_rate", "single_gpu_samples_per_s": "single_gpu_rate"}


def _set_worker_threads(threads: int, then: Callable[[int], Any] | None, worker_id: int) -> None:
    import torch

    torch.set_num_threads(threads)
    if then is not None:
        then(worker_id)


def worker_threads_init(threads: int | None, then: Callable[[int], Any] | None = None) -> Callable[[int], Any] | None:
    """A DataLoader ``worker_init_fn`` that sets each worker's intra-op threads (``torch.set_num_threads``) and then
    calls ``then`` (your own ``worker_init_fn``, if any); ``then`` itself when ``threads`` is None. Picklable, so it
    works with every multiprocessing context."""
    return then if threads is None else functools.partial(_set_worker_threads, threads, then)


@dataclass(frozen=True)
class Recommended:
    """The settings from recommended.yaml."""

    batch_size: int
    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    persistent_workers: bool
    non_blocking: bool
    grad_accum: int
    compile: str
    evidence: dict[str, Any] = field(default_factory=dict)
    """What the sweep measured at the recommendation: ``rate``, ``best_rate`` and ``defaults_rate`` in ``unit``/s,
    ``noise_cv``, ``rate_interval`` and ``band`` (what ``tunekit check`` compares a fresh trial with),
    ``items_per_money``, the verdict and its diagnosis, ``distributed`` for several ranks, ``machine`` (the machine's
    fingerprint, env.machine_fingerprint; older files hold only ``device`` and ``versions``) (version 2's names,
    also for a version-1 file)."""
    ranks: int = 1
    """DDP ranks (one per GPU) the settings were measured with; the DataLoader settings are per rank."""
    threads: int | None = None
    """Intra-op threads for the training process (``torch.set_num_threads(rec.threads)``); None: PyTorch's
    default."""
    worker_threads: int | None = None
    """Intra-op threads of each loader worker (set by :meth:`dataloader_kwargs`'s ``worker_init_fn``); None:
    PyTorch's one."""
    config: dict[str, Any] = field(default_factory=dict)
    """User-defined knobs (search.extra) the recommendation sets away from their baseline: config key to value
    (e.g. ``workload.dataset_args.decode: gpu``), to set in your own job the same way."""

    @property
    def knobs(self) -> dict[str, Any]:
        """The recommendation as the knobs of a trial (``tunekit.trial(config, knobs=rec.knobs)``, what ``tunekit
        check`` re-measures); its user-defined knobs are in :attr:`config`."""
        return {"num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor if self.num_workers else None,
                "pin_memory": self.pin_memory, "batch_size": self.batch_size, "grad_accum": self.grad_accum,
                "compile": self.compile, "ranks": self.ranks, "threads": self.threads,
                "worker_threads": self.worker_threads}

    def dataloader_kwargs(self, worker_init_fn: Callable[[int], Any] | None = None) -> dict[str, Any]:
        """Keyword arguments for ``torch.utils.data.DataLoader`` (prefetch/persistence only with workers). With
        ``worker_threads`` recommended, a ``worker_init_fn`` that sets them, then calls yours (pass it here rather
        than beside these kwargs)."""
        kwargs: dict[str, Any] = {"batch_size": self.batch_size, "num_workers": self.num_workers,
                                  "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kwargs["prefetch_factor"] = self.prefetch_factor
            kwargs["persistent_workers"] = self.persistent_workers
        init = worker_threads_init(self.worker_threads if self.num_workers > 0 else None, worker_init_fn)
        if init is not None:
            kwargs["worker_init_fn"] = init
        return kwargs

    @property
    def compile_mode(self) -> str | None:
        """The torch.compile mode (None: do not compile; "default": ``torch.compile(model)``)."""
        return None if self.compile == "none" else self.compile

    def compile_model(self, model: Any) -> Any:
        """``model`` compiled as recommended, or unchanged when the recommendation is not to compile."""
        if self.compile_mode is None:
            return model
        import torch

        return torch.compile(model, mode=None if self.compile_mode == "default" else self.compile_mode)

    def training_arguments(self) -> dict[str, Any]:
        """Keyword arguments for Hugging Face ``transformers.TrainingArguments``.

        Maps the recommendation onto the names ``TrainingArguments`` takes (transformers is not imported here)::

            args = TrainingArguments(output_dir="out", **rec.training_arguments())

        ``dataloader_prefetch_factor`` is left out without workers (or without a recommended factor):
        ``TrainingArguments`` raises ``ValueError`` for a prefetch factor with ``dataloader_num_workers == 0``.
        ``dataloader_persistent_workers`` is True only with workers, as in :meth:`dataloader_kwargs`. Compile sets
        ``torch_compile=True`` and ``torch_compile_mode`` (``"default"`` included); neither key is present when the
        recommendation is not to compile. ``non_blocking`` has no counterpart: the Trainer moves batches itself.

        Names checked against the ``TrainingArguments`` reference (huggingface.co/docs/transformers, main_classes/
        trainer) and ``src/transformers/training_args.py``. The newest, ``dataloader_prefetch_factor``, came with
        transformers 4.38.0 (huggingface/transformers#28498, merged January 2024); the others are older.

        Returns:
            ``per_device_train_batch_size``, ``dataloader_num_workers``, ``dataloader_pin_memory``,
            ``dataloader_persistent_workers``, ``gradient_accumulation_steps``, and where they apply
            ``dataloader_prefetch_factor``, ``torch_compile`` and ``torch_compile_mode``.
        """
        workers = self.num_workers > 0
        kwargs: dict[str, Any] = {
            "per_device_train_batch_size": self.batch_size,
            "dataloader_num_workers": self.num_workers,
            "dataloader_pin_memory": self.pin_memory,
            "dataloader_persistent_workers": self.persistent_workers and workers,
            "gradient_accumulation_steps": self.grad_accum,
        }
        if workers and self.prefetch_factor is not None:
            kwargs["dataloader_prefetch_factor"] = self.prefetch_factor
        if self.compile_mode is not None:
            kwargs["torch_compile"] = True
            kwargs["torch_compile_mode"] = self.compile_mode
        return kwargs

    def lightning_trainer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``lightning.pytorch.Trainer`` (lightning is not imported here).

        The Trainer takes only gradient accumulation; the rest of the recommendation goes where Lightning users
        already write it:

        - the DataLoader built in a ``LightningDataModule``'s ``train_dataloader()`` takes
          ``DataLoader(dataset, **rec.dataloader_kwargs())`` (batch size, workers, prefetch, pinning, persistence);
        - compile goes through ``model = rec.compile_model(model)`` before ``trainer.fit(model, datamodule=dm)``
          (a no-op when the recommendation is not to compile).

        ::

            trainer = lightning.pytorch.Trainer(max_epochs=3, **rec.lightning_trainer_kwargs())

        Returns:
            ``{"accumulate_grad_batches": grad_accum}``.
        """
        return {"accumulate_grad_batches": self.grad_accum}


def recommendation_dict(knobs: dict[str, Any], evidence: dict[str, Any]) -> dict[str, Any]:
    workers = int(knobs["num_workers"])
    ranks = int(knobs.get("ranks", 1))
    return {
        "version": RECOMMENDED_VERSION,
        "dataloader": {
            "batch_size": int(knobs["batch_size"]),
            "num_workers": workers,
            "prefetch_factor": knobs.get("prefetch_factor") if workers > 0 else None,
            "pin_memory": bool(knobs["pin_memory"]),
            "persistent_workers": workers > 0,
            **({"worker_threads": int(knobs["worker_threads"])} if knobs.get("worker_threads") and workers else {}),
        },
        "training": {
            "non_blocking": bool(knobs["pin_memory"]),
            "grad_accum": int(knobs.get("grad_accum", 1)),
            "compile": str(knobs.get("compile", "none")),
            **({"ranks": ranks} if ranks > 1 else {}),  # the dataloader block is then per rank
            **({"threads": int(knobs["threads"])} if knobs.get("threads") else {}),  # torch.set_num_threads
        },
        **({"config": dict(knobs["extra"])} if knobs.get("extra") else {}),  # user-defined knobs to set
        "evidence": evidence,
    }


def load_recommended(path: str | os.PathLike[str]) -> Recommended:
    """Load a recommended.yaml written by ``tunekit sweep``.

    Raises:
        ConfigError: the file is missing, not YAML, or lacks a required key (one line naming it).
    """
    label = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError([f"{label}: cannot read recommendation: {exc.strerror or exc}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{label}: invalid YAML: {str(exc).splitlines()[0]}"]) from None
    _check(data, label)
    try:
        dl, tr = data["dataloader"], data["training"]
        return Recommended(
            batch_size=_count(dl, "batch_size", 1), num_workers=_count(dl, "num_workers", 0),
            prefetch_factor=dl.get("prefetch_factor"), pin_memory=bool(dl["pin_memory"]),
            persistent_workers=bool(dl.get("persistent_workers", False)),
            non_blocking=bool(tr.get("non_blocking", dl["pin_memory"])), grad_accum=int(tr.get("grad_accum", 1)),
            compile=str(tr.get("compile", "none")), evidence=_evidence(data),
            ranks=_count(tr, "ranks", 1, "training") if "ranks" in tr else 1, config=dict(data.get("config") or {}),
            threads=_count(tr, "threads", 1, "training") if tr.get("threads") is not None else None,
            worker_threads=(_count(dl, "worker_threads", 1, "dataloader") if dl.get("worker_threads") is not None
                            else None),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError([f"{label}: not a tunekit recommendation: missing or bad key {exc}"]) from None


_SECTIONS = {"dataloader": ("batch_size", "num_workers", "prefetch_factor", "pin_memory", "worker_threads"),
             "training": ("grad_accum", "compile", "ranks", "threads")}
"""The knobs each section holds, checked as a config's are (config.check_knobs), the machine's bound aside."""


def _check(data: Any, label: str) -> None:
    """As strict as a config: the version this tunekit reads, every knob's type and range, the booleans."""
    if not isinstance(data, dict):
        raise ConfigError([f"{label}: not a tunekit recommendation: expected a mapping, got {type(data).__name__}"])
    version = data.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= RECOMMENDED_VERSION:
        raise ConfigError([f"{label}: version: {version!r} is not one this tunekit reads (1 to "
                           f"{RECOMMENDED_VERSION}); a newer tunekit wrote it, or it is not a recommendation"])
    problems = []
    for section, keys in _SECTIONS.items():
        block = data.get(section)
        if not isinstance(block, dict):
            problems.append(f"{label}: {section}: missing, or not a mapping")
            continue
        for key in ("persistent_workers",) if section == "dataloader" else ("non_blocking",):
            if key in block and not isinstance(block[key], bool):
                problems.append(f"{label}: {section}.{key} = {block[key]!r}: expected true or false")
        knobs = {k: block[k] for k in keys if k in block}
        try:
            check_knobs(knobs, where=f"{label}: {section}", bound=False)
        except UsageError as exc:
            problems.extend(str(exc).split("; "))
    if problems:
        raise ConfigError(problems)


def _evidence(data: dict[str, Any]) -> dict[str, Any]:
    """The evidence under version 2's names: the one adapter for recommended.yaml files of version 1."""
    evidence = dict(data.get("evidence") or {})
    if int(data.get("version") or 1) > 1:
        return evidence
    evidence = {_V1_EVIDENCE.get(k, k): v for k, v in evidence.items()}
    if isinstance(evidence.get("distributed"), dict):
        evidence["distributed"] = {_V1_DISTRIBUTED.get(k, k): v for k, v in evidence["distributed"].items()}
    return evidence


def _count(section: dict[str, Any], key: str, minimum: int, where: str = "dataloader") -> int:
    """An integer setting (not a bool, not a float that int() would truncate)."""
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}.{key} = {value!r} (an integer >= {minimum})")
    return value
