"""recommended.yaml as training scripts read it (tunekit/recommended/): its mappings onto the argument names users
type elsewhere (Hugging Face ``TrainingArguments``, Lightning's ``Trainer``, ``torch.utils.data.DataLoader``) from a
file of the shape ``tunekit sweep`` writes, and ``load_recommended``'s refusals, one line each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

import tunekit
from tunekit import config
from tunekit.errors import ConfigError
from tunekit.recommended import recommendation_dict

PINNED = {
    "version": 2,
    "dataloader": {
        "batch_size": 32,
        "num_workers": 8,
        "prefetch_factor": 4,
        "pin_memory": True,
        "persistent_workers": True,
    },
    "training": {"non_blocking": True, "grad_accum": 2, "compile": "reduce-overhead"},
    "evidence": {},
}
"""(a) 8 workers, prefetch 4, pinned, accumulation 2, compiled with mode reduce-overhead."""

IN_PROCESS = {
    "version": 2,
    "dataloader": {
        "batch_size": 16,
        "num_workers": 0,
        "prefetch_factor": None,
        "pin_memory": False,
        "persistent_workers": False,
    },
    "training": {"non_blocking": False, "grad_accum": 1, "compile": "none"},
    "evidence": {},
}
"""(b) loading in the main process, no pinning, no accumulation, not compiled."""

CASES = {"pinned": PINNED, "in_process": IN_PROCESS}

EXPECTED_TRAINING_ARGUMENTS = {
    "pinned": {
        "per_device_train_batch_size": 32,
        "dataloader_num_workers": 8,
        "dataloader_prefetch_factor": 4,
        "dataloader_pin_memory": True,
        "dataloader_persistent_workers": True,
        "gradient_accumulation_steps": 2,
        "torch_compile": True,
        "torch_compile_mode": "reduce-overhead",
    },
    "in_process": {
        "per_device_train_batch_size": 16,
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": False,
        "dataloader_persistent_workers": False,
        "gradient_accumulation_steps": 1,
    },
}

EXPECTED_LIGHTNING = {"pinned": {"accumulate_grad_batches": 2}, "in_process": {"accumulate_grad_batches": 1}}

TRAINING_ARGUMENTS_NAMES = frozenset(
    {
        "per_device_train_batch_size",
        "dataloader_num_workers",
        "dataloader_prefetch_factor",
        "dataloader_pin_memory",
        "dataloader_persistent_workers",
        "gradient_accumulation_steps",
        "torch_compile",
        "torch_compile_mode",
    }
)
"""``transformers.TrainingArguments`` parameters, as checked by hand in its reference (main_classes/trainer) and
src/transformers/training_args.py; used only where transformers is not installed (it is in the test extra)."""

LIGHTNING_TRAINER_NAMES = frozenset({"accumulate_grad_batches"})
"""``lightning.pytorch.Trainer`` parameters (lightning.ai/docs/pytorch/stable, gradient accumulation); used only
where lightning is not installed (it is in the test extra)."""


def _load(tmp_path: Path, content: dict[str, Any]) -> tunekit.Recommended:
    path = tmp_path / "recommended.yaml"
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return tunekit.load_recommended(path)


def test_the_fixtures_have_the_shape_tunekit_writes():
    pinned = {
        "batch_size": 32,
        "num_workers": 8,
        "prefetch_factor": 4,
        "pin_memory": True,
        "grad_accum": 2,
        "compile": "reduce-overhead",
    }
    in_process = {
        "batch_size": 16,
        "num_workers": 0,
        "prefetch_factor": 2,
        "pin_memory": False,
        "grad_accum": 1,
        "compile": "none",
    }
    assert recommendation_dict(pinned, {}) == PINNED
    assert recommendation_dict(in_process, {}) == IN_PROCESS


def test_old_and_new_files_give_the_evidence_under_version_2_s_names(tmp_path: Path):
    """A recommended.yaml without ``version`` (every run before version 2) named the rates samples_per_s."""
    old = {
        **{k: v for k, v in PINNED.items() if k != "version"},
        "evidence": {
            "unit": "tokens",
            "samples_per_s": 10.0,
            "best_samples_per_s": 11.0,
            "defaults_samples_per_s": 2.0,
            "samples_per_dollar": 5.0,
            "verdict": "compute-bound",
            "distributed": {"ranks": 2, "per_gpu_samples_per_s": 5.0, "single_gpu_samples_per_s": 6.0},
        },
    }
    new = {
        "unit": "tokens",
        "rate": 10.0,
        "best_rate": 11.0,
        "defaults_rate": 2.0,
        "items_per_money": 5.0,
        "verdict": "compute-bound",
        "distributed": {"ranks": 2, "per_gpu_rate": 5.0, "single_gpu_rate": 6.0},
    }
    assert _load(tmp_path, old).evidence == new
    assert _load(tmp_path, {**PINNED, "evidence": new}).evidence == new
    committed = sorted((Path(__file__).parents[2] / "results").glob("*/recommended.yaml"))
    assert committed
    for path in committed:
        evidence = tunekit.load_recommended(path).evidence
        assert evidence["rate"] > 0 and "samples_per_s" not in evidence, path


@pytest.mark.parametrize("case", CASES)
def test_training_arguments(tmp_path: Path, case: str):
    assert _load(tmp_path, CASES[case]).training_arguments() == EXPECTED_TRAINING_ARGUMENTS[case]


@pytest.mark.parametrize("case", CASES)
def test_training_arguments_build_real_training_arguments(tmp_path: Path, case: str):
    """``transformers.TrainingArguments(**rec.training_arguments())`` as the README writes it (transformers is in
    the test extra): every name is a parameter, every value passes its checks (a prefetch factor without workers
    is refused there), and each lands on the field it names. Without transformers: the hand-checked names."""
    kwargs = _load(tmp_path, CASES[case]).training_arguments()
    try:
        import transformers
    except ImportError:
        assert set(kwargs) <= TRAINING_ARGUMENTS_NAMES
        return
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), **kwargs)
    assert {name: getattr(args, name) for name in kwargs} == kwargs
    expected = EXPECTED_TRAINING_ARGUMENTS[case]
    assert args.per_device_train_batch_size == expected["per_device_train_batch_size"]
    assert args.dataloader_prefetch_factor == expected.get("dataloader_prefetch_factor")
    with pytest.raises(ValueError, match="dataloader_prefetch_factor"):  # the check the mapping must keep out of
        transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"), **{**kwargs, "dataloader_num_workers": 0, "dataloader_prefetch_factor": 2}
        )


@pytest.mark.parametrize("mode", ["default", "max-autotune"])
def test_training_arguments_name_every_compile_mode(tmp_path: Path, mode: str):
    content = {**PINNED, "training": {**PINNED["training"], "compile": mode}}
    kwargs = _load(tmp_path, content).training_arguments()
    assert (kwargs["torch_compile"], kwargs["torch_compile_mode"]) == (True, mode)


def test_training_arguments_leave_out_a_prefetch_factor_the_file_does_not_give(tmp_path: Path):
    content = {**PINNED, "dataloader": {**PINNED["dataloader"], "prefetch_factor": None}}
    kwargs = _load(tmp_path, content).training_arguments()
    assert "dataloader_prefetch_factor" not in kwargs and kwargs["dataloader_num_workers"] == 8


def test_training_arguments_never_persist_workers_without_workers(tmp_path: Path):
    content = {**IN_PROCESS, "dataloader": {**IN_PROCESS["dataloader"], "persistent_workers": True}}
    kwargs = _load(tmp_path, content).training_arguments()
    assert kwargs["dataloader_persistent_workers"] is False and "dataloader_prefetch_factor" not in kwargs


@pytest.mark.parametrize("case", CASES)
def test_lightning_trainer_kwargs(tmp_path: Path, case: str):
    """``lightning.pytorch.Trainer(**rec.lightning_trainer_kwargs())`` for real (lightning is in the test extra),
    on the CPU, writing nothing; without lightning: the hand-checked names."""
    kwargs = _load(tmp_path, CASES[case]).lightning_trainer_kwargs()
    assert kwargs == EXPECTED_LIGHTNING[case]
    try:
        import lightning.pytorch as pl
    except ImportError:
        assert set(kwargs) <= LIGHTNING_TRAINER_NAMES
        return
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        **kwargs,
    )
    assert trainer.accumulate_grad_batches == EXPECTED_LIGHTNING[case]["accumulate_grad_batches"]


@pytest.mark.parametrize("case", CASES)
def test_dataloader_kwargs_drive_a_dataloader(tmp_path: Path, case: str):
    rec = _load(tmp_path, CASES[case])
    dataset = TensorDataset(torch.randn(3 * rec.batch_size, 5), torch.arange(3 * rec.batch_size))
    loader = DataLoader(dataset, **rec.dataloader_kwargs())
    shapes = [(tuple(x.shape), tuple(y.shape)) for x, y in loader]
    assert shapes == [((rec.batch_size, 5), (rec.batch_size,))] * 3
    del loader  # persistent workers shut down with the loader


def test_the_mappings_import_neither_transformers_nor_lightning():
    sources = sorted((Path(tunekit.__file__).parent / "recommended").glob("*.py"))
    assert sources
    for path in sources:
        source = path.read_text()
        assert "import transformers" not in source and "import lightning" not in source, path


def test_worker_threads_reach_the_workers_of_a_loader_built_from_the_recommendation(tmp_path: Path):
    """recommended.yaml's dataloader.worker_threads: dataloader_kwargs() gives a worker_init_fn that sets them in
    each worker and then calls the user's own; a bad count names its key."""
    from torch.utils.data import DataLoader

    from tunekit.contract import Knobs
    from tunekit.errors import ConfigError

    path = tmp_path / "recommended.yaml"
    knobs = Knobs(num_workers=2, prefetch_factor=2, batch_size=4, worker_threads=3).to_dict()
    path.write_text(yaml.safe_dump(recommendation_dict(knobs, {})))
    rec = tunekit.load_recommended(path)
    assert rec.worker_threads == 3
    loader = DataLoader(_ThreadCounts(), **rec.dataloader_kwargs(worker_init_fn=_mark_worker))
    assert next(iter(loader)).tolist() == [3 * 1000 + 7] * 4  # 3 threads, then the user's init ran
    data = yaml.safe_load(path.read_text())
    data["dataloader"]["worker_threads"] = 0
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"dataloader: worker_threads=0: must be at least 1"):
        tunekit.load_recommended(path)


_MARK = {"value": 0}


def _mark_worker(worker_id: int) -> None:
    """A user's own worker_init_fn: marks the worker it ran in."""
    _MARK["value"] = 7


class _ThreadCounts(torch.utils.data.Dataset):
    """Each sample: the worker's intra-op threads x 1000 + the user's init mark."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        return torch.get_num_threads() * 1000 + _MARK["value"]


def test_threads_and_your_knobs_round_trip_and_a_bad_thread_count_names_its_key(tmp_path: Path):
    from tunekit.contract import Knobs
    from tunekit.errors import ConfigError

    knobs = Knobs(
        num_workers=4, prefetch_factor=2, batch_size=64, threads=4, extra={"workload.dataset_args.decode": "gpu"}
    ).to_dict()
    path = tmp_path / "recommended.yaml"
    path.write_text(yaml.safe_dump(recommendation_dict(knobs, {})))
    rec = tunekit.load_recommended(path)
    assert rec.threads == 4 and rec.config == {"workload.dataset_args.decode": "gpu"}
    assert rec.worker_threads is None and "worker_init_fn" not in rec.dataloader_kwargs()
    data = yaml.safe_load(path.read_text())
    data["training"]["threads"] = 0
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"training: threads=0: must be at least 1"):
        tunekit.load_recommended(path)


def _write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "recommended.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _refusal(path: Path) -> str:
    """The one line load_recommended refuses ``path`` with (a ConfigError naming the file)."""
    from tunekit.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        tunekit.load_recommended(path)
    (line,) = err.value.lines()
    assert line.startswith(f"{path}: "), line
    return line


MACHINE = {
    "device": "CPU: AMD EPYC",
    "gpu": None,
    "gpus": 0,
    "cpu": "AMD EPYC",
    "cpus": 2,
    "memory_bytes": 25276071936,
    "torch": "2.14.1",
    "cuda": None,
    "driver": None,
    "python": "3.11.7",
}


def _edited(edit: Any) -> dict[str, Any]:
    """PINNED with a machine in its evidence, then ``edit`` applied to it (a copy)."""
    data = yaml.safe_load(yaml.safe_dump({**PINNED, "evidence": {"unit": "samples", "rate": 10.0, "machine": MACHINE}}))
    edit(data)
    return data


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (
            lambda d: d.update(dataloaders=d.pop("dataloader")),
            "dataloaders: not a section of a recommendation; allowed: version, dataloader, training, config, script, "
            "evidence (did you mean dataloader?)",
        ),
        (
            lambda d: d["training"].update(grad_acum=2),
            "training.grad_acum: not a setting of training; allowed: grad_accum, compile, ranks, threads, non_blocking",
        ),
        (
            lambda d: d.update(dataloader=[d["dataloader"]]),
            "dataloader: expected a mapping (of batch_size, num_workers",
        ),
        (
            lambda d: d.update(evidence=[["rate", 10.0]]),
            "evidence: expected a mapping (what the sweep measured), got a list",
        ),
        (lambda d: d.update(config=[]), "config: expected a mapping of config keys to values"),
        (
            lambda d: d.update(script=["python", "train.py"]),
            "script: expected a mapping (of command, set_on_dataloader, dataloader_built_at, dataloader_built_by)",
        ),
        (
            lambda d: d.update(script={"command": ["python", "train.py"], "dataloader_built_at": ["train.py", 71]}),
            "script.dataloader_built_at: expected a string (where the script builds its DataLoader), got a list",
        ),
        (
            lambda d: d["dataloader"].update(batch_size={"per_rank": 32}),
            "batch_size={'per_rank': 32}: expected an integer",
        ),
        (lambda d: d["evidence"].update(unit={"name": "samples"}), "evidence.unit: expected a string"),
        (
            lambda d: d.update(config={"workload.dataset_args.decode": {"mode": "gpu"}}),
            "config.workload.dataset_args.decode: expected a string, number, boolean or null, got a mapping",
        ),
        (
            lambda d: d["evidence"]["machine"].update(gpu=["NVIDIA H200"]),
            "evidence.machine.gpu: expected a string, number, boolean or null, got a list",
        ),
        (
            lambda d: d["dataloader"].update(pin_memory=False),
            "training.non_blocking = true with dataloader.pin_memory = false: non_blocking copies need pinned memory",
        ),
        (
            lambda d: d["evidence"].update(machine={}),
            "evidence.machine: records nothing of the machine the sweep ran on",
        ),
        (lambda d: d["evidence"].update(machine=dict.fromkeys(MACHINE)), "evidence.machine: records nothing"),
    ],
    ids=[
        "unknown-section",
        "unknown-setting",
        "list-for-section",
        "list-for-evidence",
        "list-for-config",
        "list-for-script",
        "list-for-site",
        "mapping-for-knob",
        "mapping-for-unit",
        "mapping-for-config-value",
        "list-for-machine-fact",
        "non-blocking-unpinned",
        "empty-machine",
        "null-machine",
    ],
)
def test_a_recommendation_tunekit_would_not_write_is_refused_in_one_line(tmp_path: Path, edit, said):
    """A section or setting tunekit does not write (a typo would be ignored and its default used), a value of the
    wrong kind, non_blocking copies without pinned memory, and a machine fingerprint that records nothing (it would
    read as this machine, whatever this one is): one line naming the file, the key and what is allowed."""
    line = _refusal(_write(tmp_path, yaml.safe_dump(_edited(edit), sort_keys=False)))
    assert said in line, line


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "version: 2\ndataloader: {batch_size: 8, num_workers: 0, pin_memory: false}\ntraining: {}\n"
            "dataloader: {batch_size: 64, num_workers: 0, pin_memory: false}\n",
            "line 4, column 1: invalid YAML: duplicate key 'dataloader' (a key may appear only once in a mapping)",
        ),
        (
            "version: 2\ndataloader:\n  batch_size: 8\n  num_workers: 0\n  pin_memory: false\n  batch_size: 64\n"
            "training: {}\n",
            "line 6, column 3: invalid YAML: duplicate key 'batch_size'",
        ),
        (
            "version: 2\ndataloader: {batch_size: 8, num_workers: 0, pin_memory: false}\ntraining: {}\n"
            "evidence: {rate: 10.0, machine: {cpus: 2, cpus: 64}}\n",
            "duplicate key 'cpus'",
        ),
    ],
    ids=["section", "setting", "evidence"],
)
def test_a_key_given_twice_is_refused_not_the_last_kept(tmp_path: Path, text: str, said: str):
    """PyYAML keeps the last of two equal keys silently; a recommendation names each once."""
    line = _refusal(_write(tmp_path, text))
    assert said in line, line


def test_a_file_that_is_not_utf8_is_one_line(tmp_path: Path):
    text = yaml.safe_dump({**PINNED, "evidence": {"reason": "knee"}}, sort_keys=False).encode()
    line = _refusal(_write(tmp_path, text.replace(b"knee", b"kn\xe9e")))  # latin-1, as an editor might save it
    assert "not valid UTF-8 (byte 0xe9 at offset " in line, line


def test_every_section_tunekit_writes_still_loads(tmp_path: Path):
    """The refusals above leave alone what tunekit writes: a script's ``script:`` section, ``config:``, a
    fingerprint with unknown facts (null), anchors and merges, and non_blocking false with pinning."""
    data = {
        **IN_PROCESS,
        "config": {"workload.dataset_args.decode": "gpu"},
        "script": {"command": ["python", "train.py", "-j", "0"], "set_on_dataloader": {"pin_memory": False}},
        "evidence": {"unit": "samples", "rate": 10.0, "machine": {**MACHINE, "cpu": None}},
    }
    rec = _load(tmp_path, data)
    assert rec.config == {"workload.dataset_args.decode": "gpu"} and rec.evidence["machine"]["cpus"] == 2
    pinned = {**PINNED, "training": {**PINNED["training"], "non_blocking": False}}
    assert _load(tmp_path, pinned).non_blocking is False
    merged = (
        "version: 2\ndataloader: {batch_size: 8, num_workers: 0, pin_memory: false}\n"
        "training: {<<: {grad_accum: 2}, grad_accum: 4}\n"
    )  # a merge's key overridden: not a duplicate
    assert tunekit.load_recommended(_write(tmp_path, merged)).grad_accum == 4


def _write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


_VALID = {
    "dataloader": {
        "batch_size": 8,
        "num_workers": 2,
        "prefetch_factor": 2,
        "pin_memory": False,
        "persistent_workers": True,
    },
    "training": {"non_blocking": False, "grad_accum": 1, "compile": "none"},
    "evidence": {},
}


def _with_batch(value) -> str:
    data = json.loads(json.dumps(_VALID))
    data["dataloader"]["batch_size"] = value
    return yaml.safe_dump(data)


@pytest.mark.parametrize(
    "content",
    [
        None,  # no file at all
        "dataloader: [batch_size: 8\ntraining: {",
        yaml.safe_dump({k: v for k, v in _VALID.items() if k != "dataloader"}),
        _with_batch("eight"),
        _with_batch(8.5),  # must not be truncated to 8
        _with_batch(True),  # YAML true must not become batch 1
    ],
    ids=["missing", "invalid-yaml", "no-dataloader", "batch-size-text", "batch-size-float", "batch-size-bool"],
)
def test_load_recommended_errors_are_one_line_naming_the_file(tmp_path: Path, content: str | None):
    path = tmp_path / "recommended.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        tunekit.load_recommended(path)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and len(info.value.lines()) == 1, message
    assert str(path) in message


def test_load_recommended_without_a_dataloader_names_the_key(tmp_path: Path):
    path = _write_text(tmp_path / "recommended.yaml", yaml.safe_dump({"training": _VALID["training"]}))
    with pytest.raises(ConfigError, match="dataloader"):
        tunekit.load_recommended(path)


GOOD = recommendation_dict(
    {"num_workers": 4, "prefetch_factor": 2, "pin_memory": True, "batch_size": 64, "grad_accum": 1, "compile": "none"},
    {"unit": "samples", "rate": 100.0},
)


@pytest.mark.parametrize(
    ("section", "key", "value", "said"),
    [
        ("dataloader", "pin_memory", "false", 'pin_memory="false": expected true or false'),
        ("training", "grad_accum", 0, "grad_accum=0: must be at least 1"),
        ("training", "grad_accum", 2.7, "grad_accum=2.7: expected an integer"),
        ("training", "compile", "fast", 'compile="fast": choose one of: none, default'),
        ("dataloader", "prefetch_factor", -1, "prefetch_factor=-1: must be at least 1"),
        ("dataloader", "prefetch_factor", "four", 'prefetch_factor="four": expected an integer'),
        ("training", "non_blocking", "yes", "training.non_blocking = 'yes': expected true or false"),
        (None, "version", 3, "version: 3 is not one this tunekit reads"),
    ],
)
def test_load_recommended_checks_what_it_reads_as_strictly_as_a_config(tmp_path: Path, section, key, value, said):
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    (data[section] if section else data)[key] = value
    path = tmp_path / "recommended.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        tunekit.load_recommended(path)
    (line,) = err.value.lines()
    assert str(path) in line and said in line


def test_a_recommendation_with_more_workers_than_this_machine_allows_still_loads(tmp_path: Path):
    """Tuned on a large machine, loaded on a laptop: the worker bound is the sweep's, not the reader's."""
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["dataloader"]["num_workers"] = config.max_workers() + 1
    path = tmp_path / "recommended.yaml"
    path.write_text(yaml.safe_dump(data))
    assert tunekit.load_recommended(path).num_workers == config.max_workers() + 1
