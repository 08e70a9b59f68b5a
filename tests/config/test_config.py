from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, sleepy_config
from tests.test_driver import _cli
from tunekit import config
from tunekit.errors import ConfigError
from tunekit.launch import classify_error, resolve_paths


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


def test_launch_config_is_checked():
    with pytest.raises(ConfigError, match="launch.rdzv_endpoint: launch.nnodes = 2 needs the host:port"):
        config.from_dict(sleepy_config(**{"launch.nnodes": 2}))
    with pytest.raises(ConfigError, match="device: cuda:1 names one GPU"):
        config.from_dict(sleepy_config(**{"launch.nproc_per_node": 2, "device": "cuda:1"}))
    with pytest.raises(ConfigError, match="nccl needs CUDA"):
        config.from_dict(sleepy_config(**{"launch.backend": "nccl"}))
    per_rank = config.from_dict(sleepy_config(**{"launch.nproc_per_node": 2, "search.num_workers": "auto"}))
    alone = config.from_dict(sleepy_config(**{"search.num_workers": "auto"}))
    assert max(per_rank.search.num_workers) < max(alone.search.num_workers) or config.cpu_count() < 2


@pytest.mark.parametrize(
    "command, words",
    [
        (["pyhton", "train.py"], '"pyhton" is not found on PATH; did you mean python'),
        (["./notexec.py"], '"./notexec.py" is not executable (no exec bit)'),
        (["{num_workers}", "train.py"], 'the program "{num_workers}" is a placeholder'),
    ],
)
def test_a_command_that_cannot_start_is_refused_before_any_trial(tmp_path: Path, command: list[str], words: str):
    (tmp_path / "notexec.py").write_text("print('hi')\n")
    raw = {"name": "x", "script": {"command": command, "cwd": str(tmp_path)}}
    with pytest.raises(ConfigError) as err:
        config.load(raw, check_imports=True)
    assert words in str(err.value)
    missing = {"name": "x", "script": {"command": ["python", "train.py"], "cwd": str(tmp_path / "nowhere")}}
    with pytest.raises(ConfigError, match="script.cwd: .* is not a folder"):
        config.load(missing, check_imports=True)


@pytest.mark.parametrize("name", ["../../etc/x", "/tmp/abs", "a/b", ".."])
def test_a_run_name_is_a_plain_folder_name(name: str):
    with pytest.raises(ConfigError) as err:
        config.from_dict(sleepy_config(name=name))
    (line,) = err.value.lines()
    assert "name" in line and "--out" in line


def test_a_bad_set_value_is_one_line_and_exit_2(write_config):
    bad = _cli("trial", str(write_config(sleepy_config())), "--set", "trial.window_s=[")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()] and "trial.window_s" in bad.stderr


def test_worker_counts_are_bounded_by_the_machine(write_config):
    bound = max(4 * config.cpu_count(), 32)  # 4 per usable CPU, and 32 on any machine
    assert config.max_workers() == bound
    assert config.from_dict(sleepy_config(**{"search.num_workers": [0, bound]})).search.num_workers == [0, bound]
    with pytest.raises(
        ConfigError,
        match=rf"search.num_workers: {bound + 1} is more than this machine allows "
        rf"\({bound}:",
    ):
        config.from_dict(sleepy_config(**{"search.num_workers": [0, bound + 1]}))
    path = str(write_config(sleepy_config()))
    refused = _cli("trial", path, "--set", f"num_workers={bound + 1}")
    assert refused.returncode == 2 and f"num_workers={bound + 1}: more than this machine allows ({bound}:" in (
        refused.stderr
    )
    assert config.parse_knob("num_workers", str(bound)) == bound  # --set takes the bound itself
    assert classify_error("BlockingIOError: [Errno 11] Resource temporarily unavailable")[1].startswith(
        "the system refused another process"
    )


def test_validate_names_placeholders_that_are_not_knobs(write_config):
    path = write_config(
        {"name": "s", "script": {"command": "python train.py -j {workers}"}, "search": {"compile": ["none", "default"]}}
    )
    bad = subprocess.run(
        [sys.executable, "-m", "tunekit", "validate", str(path)], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert any("script.command: {workers} is not a knob" in line for line in lines)
    assert any("search.compile: the script sets it itself" in line for line in lines)
    both = write_config(
        {"name": "s", "script": {"command": "python t.py"}, "workload": {"model": "a:b", "dataset": "a:c"}}, "both.yaml"
    )
    refused = subprocess.run(
        [sys.executable, "-m", "tunekit", "validate", str(both)], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and "give exactly one" in refused.stderr


def test_script_mode_refuses_several_nodes_and_a_non_python_command_under_launch(write_config):
    bad = write_config(
        {"name": "s", "script": {"command": "./train.sh -j {num_workers}"}, "launch": {"nproc_per_node": 2}}
    )
    with pytest.raises(config.ConfigError, match="not a Python interpreter"):
        config.load(bad)
    nodes = write_config(
        {
            "name": "s",
            "script": {"command": "python t.py"},
            "launch": {"nproc_per_node": 2, "nnodes": 2, "rdzv_endpoint": "h:1"},
        },
        "n.yaml",
    )
    with pytest.raises(config.ConfigError, match="launch.nnodes: script mode runs a trial's ranks on one node"):
        config.load(nodes)
    clash = write_config(
        {"name": "s", "script": {"command": "torchrun --nproc-per-node 4 t.py"}, "launch": {"nproc_per_node": 2}},
        "c.yaml",
    )
    with pytest.raises(config.ConfigError, match="differs from the command's --nproc-per-node 4"):
        config.load(clash)


def test_validate_reports_import_problems_beside_the_other_errors(write_config):
    import subprocess
    import sys

    path = write_config(
        sleepy_config(
            **{
                "workload.model": "tunekit.workloads.synthetic:no_such_model",
                "trial.measure_windows": 3,
                "trial.max_windows": 2,
            }
        )
    )
    bad = subprocess.run(
        [sys.executable, "-m", "tunekit", "validate", str(path)], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert any("trial.max_windows" in line for line in lines) and any("no_such_model" in line for line in lines)
