from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, sleepy_config
from tunekit import config
from tunekit.errors import ConfigError
from tunekit.launch import resolve_paths


def _load(path) -> config.Config:
    """``config.load`` with its import paths checked as a sweep checks them, through the fork server (the tests of
    this process share one): the default, a fresh interpreter per check, is what ``tunekit validate`` and
    test_config_loading_never_imports_torch run."""
    return config.load(path, resolve=resolve_paths)


def _problems(write_config, data) -> list[str]:
    path = write_config(data)
    with pytest.raises(ConfigError) as info:
        _load(path)
    return info.value.problems


def test_shipped_configs_load():
    shipped = sorted((REPO / "configs").glob("*.yaml"))
    assert {p.stem for p in shipped} >= {"quickstart", "resnet", "resnet-cheapdata", "gpt-tokens"}
    paths = {}
    for path in shipped:
        cfg = config.load(path, check_imports=False)
        assert cfg.workload.model and cfg.search.batch_size
        paths.update(
            {
                f"{path.name}: workload.{key}": getattr(cfg.workload, key)
                for key in config.IMPORT_PATH_KEYS
                if getattr(cfg.workload, key) is not None
            }
        )
    # every import path of every shipped config resolves: checked by the resolver config.load runs, in one
    # subprocess for all of them (test_unresolvable_import_paths checks that load runs it); a path that does not
    # resolve rides along, so a resolver that found nothing wrong with anything would fail here
    paths["control: workload.model"] = "tunekit.workloads.synthetic:no_such_model"
    resolved = subprocess.run(
        [sys.executable, "-m", "tunekit.worker", "--resolve", json.dumps(paths)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resolved.returncode == 0, resolved.stderr
    problems = json.loads(resolved.stdout.strip().splitlines()[-1])
    assert set(problems) == set(paths) and "no_such_model" in problems.pop("control: workload.model")
    assert not {key: msg for key, msg in problems.items() if msg}
    assert len(problems) >= 2 * len(shipped)  # a model and a dataset at least, each
    text = config.load(REPO / "configs" / "gpt-tokens.yaml", check_imports=False)
    assert text.workload.unit == "tokens" and text.workload.count and text.workload.collate_fn
    resnet = config.load(REPO / "configs" / "resnet.yaml", check_imports=False)
    assert resnet.workload.precision == "bf16" and resnet.workload.channels_last
    assert resnet.search.compile == ["none", "default"]


def test_defaults_and_normalisation(write_config):
    data = sleepy_config(**{"search.num_workers": [4, 0, 4, 2], "search.batch_size": 16})
    cfg = _load(write_config(data))
    assert cfg.search.num_workers == [0, 2, 4]  # deduplicated and sorted
    assert cfg.search.batch_size == [16]  # a scalar is a one-element list
    assert cfg.selection.tolerance == 0.03 and cfg.budget.max_trials == 60 and cfg.strategy == "staged"
    assert cfg.to_dict()["workload"]["model"] == "tunekit.workloads.synthetic:sleepy_model"
    assert "source" not in cfg.to_dict()


def test_auto_workers_spans_zero_to_twice_the_cpus(write_config):
    cfg = _load(write_config(sleepy_config(**{"search.num_workers": "auto"})))
    cpus = config.cpu_count()
    assert cfg.search.num_workers[0] == 0 and cfg.search.num_workers[-1] == 2 * cpus
    assert config.auto_workers(16) == [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    assert config.auto_workers(2) == [0, 1, 2, 3, 4]


def test_every_problem_is_reported_at_once(write_config):
    data = sleepy_config(
        **{
            "device": "gpu",
            "strategy": "random",
            "colour": "blue",
            "search.num_wokers": [1],
            "search.batch_size": [8, "big"],
            "search.prefetch_factor": [0],
            "search.compile": ["fast"],
            "search.pin_memory": ["yes"],
            "trial.window_s": -1,
            "selection.tolerance": 1.5,
            "workload.precision": "fp8",
            "workload.model": "not an import path",
            "cost.per_hour": 0,
        }
    )
    problems = _problems(write_config, data)
    text = "\n".join(problems)
    assert len(problems) == 13, text
    assert all(p.startswith(str(write_config(data))) for p in problems)
    expected = [
        'device: "gpu" is not allowed; choose one of: auto, cpu, cuda, cuda:N',
        'strategy: "random" is not allowed; choose one of: staged, grid',
        "colour: unknown key",
        "search.num_wokers: unknown key (did you mean 'num_workers'?)",
        'search.batch_size[1]: expected an integer, got a string "big"',
        "search.prefetch_factor[0]: 0 is out of range; must be at least 1",
        'search.compile[0]: "fast" is not allowed; choose one of: none, default, reduce-overhead',
        "search.pin_memory[0]: expected true or false",
        "trial.window_s: -1.0 is out of range; must be greater than 0",
        "selection.tolerance: 1.5 is out of range; must be less than 1",
        'workload.precision: "fp8" is not allowed; choose one of: fp32, bf16, fp16',
        'workload.model: "not an import path" is not an import path',
        "cost.per_hour: 0.0 is out of range; must be greater than 0",
    ]
    for fragment in expected:
        assert fragment in text


def test_missing_required_keys(write_config):
    problems = _problems(write_config, {"workload": {"optimizer": "torch.optim:SGD"}})
    assert any("workload.model: required key is missing" in p for p in problems)
    assert any("workload.dataset: required key is missing" in p for p in problems)


def test_malformed_yaml_names_line(write_config):
    problems = _problems(write_config, "name: x\nsearch:\n  num_workers: [0, 2\n  batch_size: 8\n")
    assert len(problems) == 1 and "invalid YAML" in problems[0] and "line " in problems[0]


def test_top_level_must_be_mapping(write_config):
    assert "top level must be a mapping" in _problems(write_config, "- a\n- b\n")[0]


def test_unresolvable_import_paths(write_config):
    data = sleepy_config(
        **{
            "workload.dataset": "tunekit.workloads.synthetic:no_such_dataset",
            "workload.loss": "torch.nn:Nonexistent",
            "workload.optimizer": "no_such_module_xyz:SGD",
            "workload.step": "tunekit.workloads.synthetic:__doc__",
        }
    )
    problems = _problems(write_config, data)
    text = "\n".join(problems)
    assert len(problems) == 4, text
    assert "workload.dataset" in text and "has no attribute 'no_such_dataset'" in text
    assert "workload.optimizer" in text and "no module named 'no_such_module_xyz'" in text
    assert "workload.step" in text and "not a callable" in text


def test_target_effective_batch_checks(write_config):
    problems = _problems(
        write_config, sleepy_config(**{"search.target_effective_batch": 12, "search.batch_size": [8, 16]})
    )
    assert "not a multiple of any search.batch_size" in problems[0]
    problems = _problems(
        write_config, sleepy_config(**{"search.target_effective_batch": 16, "search.grad_accum": [1, 2]})
    )
    assert "not both" in problems[0]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tunekit", *args], capture_output=True, text=True, timeout=120)


def test_validate_cli_exit_codes(write_config):
    good = _cli("validate", str(write_config(sleepy_config())))
    assert good.returncode == 0 and ": ok" in good.stdout
    bad_path = write_config(sleepy_config(**{"device": "tpu", "trial.timeout_s": "long"}), "bad.yaml")
    bad = _cli("validate", str(bad_path))
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith(f"tunekit: error: {bad_path}: ") for line in lines)
    assert "Traceback" not in bad.stderr
    debug = _cli("--debug", "validate", str(bad_path))
    assert debug.returncode == 2 and "Traceback" in debug.stderr
    missing = _cli("validate", "does/not/exist.yaml")
    assert missing.returncode == 2 and "does/not/exist.yaml: cannot read config" in missing.stderr


def test_trial_cli_usage_errors(write_config):
    path = str(write_config(sleepy_config()))
    unknown = _cli("trial", path, "--set", "workers=4")
    assert unknown.returncode == 2 and "--set workers: unknown knob; allowed: num_workers" in unknown.stderr
    bad_value = _cli("trial", path, "--set", "pin_memory=maybe")
    assert bad_value.returncode == 2 and "pin_memory=maybe: expected true or false" in bad_value.stderr
    bad_compile = _cli("trial", path, "--set", "compile=turbo")
    assert bad_compile.returncode == 2 and "choose one of: none, default" in bad_compile.stderr
    ranks = _cli("trial", path, "--set", "ranks=2")  # the config launches no ranks
    assert ranks.returncode == 2 and "ranks=2:" in ranks.stderr and "launches 1 rank(s)" in ranks.stderr
    assert "Traceback" not in ranks.stderr


def test_config_loading_never_imports_torch(write_config):
    path = write_config(sleepy_config())
    code = f"import sys, tunekit.config as c; c.load({str(path)!r}); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_user_knobs_are_validated_one_line_each(write_config):
    def extra(spec: dict) -> list[str]:
        return _problems(write_config, sleepy_config(**{"search.extra": spec}))

    (line,) = extra({"search.num_workers": {"values": [1], "changes_result": False}})
    assert "search.extra.search.num_workers: not a knob key" in line
    (line,) = extra({"workload.dataset_args.crop": [160, 224]})
    assert "expected a mapping with values (a list) and changes_result" in line
    (line,) = extra({"workload.dataset_args.sample_wait_s": {"values": [0.001, 0.002], "changes_result": False}})
    assert "the config's own value workload.dataset_args.sample_wait_s = 0.005 must be one of them" in line
    (line,) = extra({"workload.dataset_args.crop": {"values": [160, 160], "changes_result": True}})
    assert "lists a value twice" in line
    (line,) = extra({"workload.dataset_args.crop": {"values": [160], "changes_result": "yes"}})
    assert "changes_result: expected true or false" in line
    cfg = config.from_dict(
        sleepy_config(
            **{
                "search.extra": {
                    "workload.dataset_args.crop": {"values": [224, 160], "changes_result": True},
                    "workload.precision": {"values": ["bf16", "fp32"], "changes_result": False},
                }
            }
        )
    )
    knobs = config.extra_knobs(cfg)
    assert [(k.key, k.baseline) for k in knobs] == [("workload.dataset_args.crop", 224), ("workload.precision", "fp32")]


def test_gpu_decode_on_a_cpu_device_is_a_config_error(write_config):
    images = {"workload.dataset": "tunekit.workloads.images:synthetic_jpeg", "workload.dataset_args": {}}
    (line,) = _problems(write_config, sleepy_config(**images, **{"workload.dataset_args.decode": "gpu"}))
    assert "workload.dataset_args.decode: gpu decodes on the CUDA device, but device is cpu" in line
    (line,) = _problems(
        write_config,
        sleepy_config(
            **images,
            **{"search.extra": {"workload.dataset_args.decode": {"values": ["cpu", "gpu"], "changes_result": False}}},
        ),
    )
    assert "search.extra.workload.dataset_args.decode: gpu decodes on the CUDA device" in line
    (line,) = _problems(
        write_config,
        sleepy_config(
            **{**images, "workload.dataset_args": {}},
            **{
                "search.extra": {
                    "workload.dataset_args.decode": {"values": ["cpu", "gpu-overlap"], "changes_result": False}
                }
            },
        ),
    )
    assert "search.extra.workload.dataset_args.decode: gpu-overlap decodes on the CUDA device" in line


def test_worker_threads_need_tunekit_to_build_the_loader(write_config):
    (line,) = _problems(
        write_config, sleepy_config(**{"workload.loader": "tests._workloads:own_loader", "search.worker_threads": [2]})
    )
    assert line.endswith(
        "search.worker_threads: workload.loader builds the whole DataLoader, so tunekit cannot set "
        "its workers' threads; set them in its worker_init_fn, or search them without "
        "workload.loader"
    )
    assert any(
        "search.worker_threads" in p for p in _problems(write_config, sleepy_config(**{"search.worker_threads": [0]}))
    )
