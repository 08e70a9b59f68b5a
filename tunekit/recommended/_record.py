"""The recommendation as a training script uses it (:class:`Recommended`: a DataLoader's kwargs, the training
knobs, Hugging Face's and Lightning's arguments, the evidence) and as a sweep writes it (``recommendation_dict``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Recommended", "recommendation_dict", "worker_threads_init", "RECOMMENDED_VERSION"]


RECOMMENDED_VERSION = 2
"""The version of recommended.yaml written now. Version 1 (files without ``version``) named the evidence's
throughput ``samples_per_s`` whatever its unit; :func:`load_recommended` reads both."""


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
        return {
            "num_workers": self.num_workers,
            "prefetch_factor": self.prefetch_factor if self.num_workers else None,
            "pin_memory": self.pin_memory,
            "batch_size": self.batch_size,
            "grad_accum": self.grad_accum,
            "compile": self.compile,
            "ranks": self.ranks,
            "threads": self.threads,
            "worker_threads": self.worker_threads,
        }

    def dataloader_kwargs(self, worker_init_fn: Callable[[int], Any] | None = None) -> dict[str, Any]:
        """Keyword arguments for ``torch.utils.data.DataLoader`` (prefetch/persistence only with workers). With
        ``worker_threads`` recommended, a ``worker_init_fn`` that sets them, then calls yours (pass it here rather
        than beside these kwargs)."""
        kwargs: dict[str, Any] = {
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
        }
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
