"""Verdicts on fixtures for every verdict, the compute-bound verdict's fix by the share of the matmul peak, and
real CPU scenarios."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from tests.conftest import measurement, repeated, sleepy_config
from tunekit import config
from tunekit.config import Selection
from tunekit.contract import Knobs, Measurement, TrialSpec
from tunekit.diagnosis import VERDICTS, run_verdicts, trial_verdicts
from tunekit.diagnosis._verdicts import COMPUTE_FIXES
from tunekit.launch import run_trial
from tunekit.records import rows_from_measurements
from tunekit.report import flop_summary, summarize
from tunekit.report._recommendation import recommendation_yaml

SELECTION = Selection(tolerance=0.03, min_headroom=0.10)
CEILINGS = [
    measurement(0, "compute", "compute", 500, batch_size=16),
    measurement(1, "compute", "compute", 2000, batch_size=64),
    measurement(2, "compute", "compute", 2100, batch_size=128),
]

CASES = {
    "data-starved": measurement(10, "end_to_end", "train", 600, num_workers=4, data_wait_frac=0.6),
    "cpu-preprocessing": measurement(
        10, "end_to_end", "train", 900, num_workers=16, data_wait_frac=0.4, cpu_util_frac=0.97
    ),
    "compute-bound": measurement(10, "end_to_end", "train", 1950, num_workers=8, data_wait_frac=0.02),
    "overhead-bound": measurement(10, "end_to_end", "train", 480, batch_size=16, num_workers=8, data_wait_frac=0.01),
    "memory-wall": measurement(10, "end_to_end", "train", 1900, num_workers=8, headroom=0.12),
    "h2d-copy": measurement(10, "end_to_end", "train", 1500, num_workers=8, data_wait_frac=0.1),
    # 87 % of the compute ceiling with 3 % data wait and no small-batch penalty: no bound stands out
    "unattributed": measurement(10, "end_to_end", "train", 1740, num_workers=8, data_wait_frac=0.03),
    # decode: gpu (the dataset moves its batches itself): 73 % of the ceiling, the stream busy, no data wait
    "gpu-preprocessing": measurement(
        10,
        "end_to_end",
        "train",
        1460,
        num_workers=8,
        pin_memory=True,
        data_wait_frac=0.04,
        gpu_busy_frac=0.995,
        input_on_device=True,
    ),
    # two ranks at 70 % of twice one GPU's throughput (trial 11), 40 % of a step in gradient sync, no data wait
    "communication-bound": measurement(
        10, "end_to_end", "train", 2800, num_workers=8, ranks=2, data_wait_frac=0.02, sync_share=0.4
    ),
    "shared-gpu": measurement(
        10,
        "end_to_end",
        "train",
        1500,
        num_workers=8,
        noise_cv=0.2,
        nvml={"throttle_reasons": ["hw_slowdown"]},
        device="cuda:0",
    ),
    # other processes kept 10 of the 16 usable CPUs busy during the windows
    "shared-host": measurement(10, "end_to_end", "train", 1500, num_workers=8, other_cpu_cores=10.0, device="cuda:0"),
    # half the compute ceiling, hardly any data wait, the CPUs 97 % busy: the step itself is starved of CPU
    "cpu-contention": measurement(
        10, "end_to_end", "train", 1000, num_workers=8, data_wait_frac=0.05, cpu_util_frac=0.97
    ),
}


FIX_WORDS = {
    "shared-gpu": "idle GPU",
    "shared-host": "machine is idle",
    "memory-wall": "accumulation",
    "h2d-copy": "pin_memory=True",
    "cpu-preprocessing": "on the GPU",
    "data-starved": "faster storage",
    "overhead-bound": "larger batch",
    "compute-bound": "the model itself",
    "unattributed": "profile",
    "communication-bound": "accumulate gradients",
    "gpu-preprocessing": "side CUDA stream",
    "cpu-contention": "intra-op threads",
}


@pytest.mark.parametrize("name", VERDICTS)
def test_every_verdict_on_fixtures(name: str):
    ms = [*CEILINGS, CASES[name]]
    if name == "h2d-copy":
        ms.append(measurement(11, "end_to_end", "train", 1800, num_workers=8, pin_memory=True, data_wait_frac=0.05))
    if name == "communication-bound":
        ms.append(measurement(11, "scaling", "train", 2000, num_workers=8, data_wait_frac=0.02))
    verdict = trial_verdicts(rows_from_measurements(ms), SELECTION)[10]
    assert verdict.name == name
    assert verdict.evidence and verdict.fix
    assert verdict.sentence().startswith(f"{name}: ") and "First fix" in verdict.sentence()
    assert FIX_WORDS[name] in verdict.fix  # the fix that fits the cause, not another verdict's


@pytest.mark.parametrize("workers_rate,expected", [(580, "cpu-contention"), (900, "data-starved")])
def test_a_zero_worker_trial_is_data_starved_unless_the_workers_measured_were_no_faster(
    workers_rate: float, expected: str
):
    """Loading in the main process, the loop waits 65 % of the time: adding workers is the data verdict's fix. When
    the run measured workers that kept the CPUs busy and were no faster (a 2-core box whose model also runs on the
    CPU), that fix is refuted by the run itself: the CPUs are shared, and the verdict says so with that trial."""
    zero = measurement(10, "end_to_end", "train", 600, data_wait_frac=0.65, cpu_util_frac=0.77)
    workers = measurement(
        11, "end_to_end", "train", workers_rate, num_workers=4, data_wait_frac=0.08, cpu_util_frac=0.97
    )
    verdicts = trial_verdicts(rows_from_measurements([*CEILINGS, zero, workers]), SELECTION)
    assert verdicts[10].name == expected
    if expected == "cpu-contention":
        assert verdicts[11].name == "cpu-contention"  # the workers' own trial: slowed, not waiting on data
        assert "4 workers, 580.0 samples/s at batch 64, CPU busy 97%: no faster" in verdicts[10].sentence()
    # workers that left the CPUs free refute nothing: more of them may still help
    idle = measurement(11, "end_to_end", "train", 580, num_workers=4, data_wait_frac=0.5, cpu_util_frac=0.4)
    assert trial_verdicts(rows_from_measurements([*CEILINGS, zero, idle]), SELECTION)[10].name == "data-starved"


def test_device_side_input_work_is_named_only_where_the_step_does_it():
    """The gpu-preprocessing evidence gives the step's time beyond the ceiling's; the same figures from a step that
    does no input work on the device stay unattributed, and one that waits on data gets the data verdict."""
    gpu = CASES["gpu-preprocessing"]
    ev = trial_verdicts(rows_from_measurements([*CEILINGS, gpu]), SELECTION)[10].evidence
    assert ev["step time beyond the model's on a ready batch"] == pytest.approx(1 - 1460 / 2000)
    plain = {**gpu, "input_on_device": False}
    assert trial_verdicts(rows_from_measurements([*CEILINGS, plain]), SELECTION)[10].name == "unattributed"
    waiting = {**gpu, "data_wait_frac": 0.4}
    assert trial_verdicts(rows_from_measurements([*CEILINGS, waiting]), SELECTION)[10].name == "data-starved"


def test_evidence_carries_the_numbers():
    rows = rows_from_measurements([*CEILINGS, CASES["cpu-preprocessing"]])
    ev = trial_verdicts(rows, SELECTION)[10].evidence
    assert ev["data wait"] == 0.4 and ev["workers"] == 16 and ev["usable CPUs"] == 16
    assert ev["of compute ceiling"] == pytest.approx(900 / 2000)


def test_zero_workers_is_data_starved_however_busy_the_main_process():
    rows = rows_from_measurements(
        [*CEILINGS, measurement(10, "end_to_end", "train", 200, data_wait_frac=0.95, cpu_util_frac=0.95)]
    )
    assert trial_verdicts(rows, SELECTION)[10].name == "data-starved"


def test_noisy_windows_blame_the_gpu_only_when_the_loop_does_not_wait_on_data():
    # H200, 12 loader workers on 16 CPUs: 55 % window noise from CPU contention, GPU alone and at full clocks
    starved = measurement(
        10, "end_to_end", "train", 900, num_workers=12, data_wait_frac=0.54, noise_cv=0.55, cpu_util_frac=0.82
    )
    verdict = trial_verdicts(rows_from_measurements([*CEILINGS, starved]), SELECTION)[10]
    assert verdict.name == "data-starved" and verdict.evidence["window noise (CV)"] == 0.55
    gpu_bound = measurement(
        10, "end_to_end", "train", 1500, num_workers=8, data_wait_frac=0.02, noise_cv=0.2, device="cuda:0"
    )
    verdict = trial_verdicts(rows_from_measurements([*CEILINGS, gpu_bound]), SELECTION)[10]
    assert verdict.name == "shared-gpu" and verdict.evidence["window noise (CV)"] == 0.2


def test_pinning_that_beats_more_workers_is_h2d_copy_not_data_starved():
    # H200, ResNet-50 on cheap tensors: unpinned runs wait on data at every worker count; 0 workers pinned is faster
    ms = [
        *CEILINGS,
        measurement(10, "end_to_end", "train", 1300, num_workers=2, data_wait_frac=0.27),
        measurement(11, "end_to_end", "train", 1350, num_workers=8, data_wait_frac=0.27),
        measurement(12, "end_to_end", "train", 1850, pin_memory=True, data_wait_frac=0.6),
    ]
    verdicts = trial_verdicts(rows_from_measurements(ms), SELECTION)
    assert verdicts[10].name == verdicts[11].name == "h2d-copy"
    assert verdicts[10].evidence["pinned trial"] == 12
    assert verdicts[11].evidence["fastest unpinned trial with as many workers or fewer"] == 11
    assert verdicts[10].evidence["gain with pinning"] == pytest.approx(1850 / 1300 - 1)
    # a pinned config with more workers is no evidence: more workers may be what helped
    ms = [
        *CEILINGS,
        measurement(10, "end_to_end", "train", 600, num_workers=2, data_wait_frac=0.6),
        measurement(11, "end_to_end", "train", 1850, num_workers=8, pin_memory=True, data_wait_frac=0.05),
    ]
    assert trial_verdicts(rows_from_measurements(ms), SELECTION)[10].name == "data-starved"


def test_run_verdicts_lead_with_the_knee_and_add_oom_and_other_processes():
    ms = [
        *CEILINGS,
        {**measurement(3, "compute", "compute", None, batch_size=256), "status": "oom"},
        CASES["cpu-preprocessing"],
    ]
    rows = rows_from_measurements(ms)
    env = {"gpus": [{"index": 0, "processes": [{"pid": 7, "name": "python"}]}]}
    found = run_verdicts(rows, rows[-1], trial_verdicts(rows, SELECTION), SELECTION, env)
    assert [v.name for v in found] == ["cpu-preprocessing", "shared-gpu", "memory-wall"]
    assert found[2].evidence == {"OOM at batch": 256, "largest batch that fits": 128}


def _trial(tmp: Path, cfg: dict, n: int, mode: str, **knobs) -> Measurement:
    spec = TrialSpec(number=n, stage="single", mode=mode, knobs=Knobs(**knobs), config=config.from_dict(cfg).to_dict())
    m = run_trial(spec, tmp / str(n), 60)
    assert m.status == "ok", m
    return dataclasses.replace(m, number=n)


@pytest.mark.alone
def test_real_cpu_scenarios(tmp_path: Path):
    """Per-sample waits with one worker -> data-starved; a heavy step on cheap data -> compute-bound."""
    # half-second windows: 6 steps of the loader-bound pipeline (80 ms a batch), 8 of the 60-ms step
    slow_data = sleepy_config(
        **{
            "workload.dataset_args": {"sample_wait_s": 0.01},
            "workload.model_args": {"step_wait_s": 0.005},
            "trial.window_s": 0.5,
        }
    )
    cheap_data = sleepy_config(
        **{
            "workload.dataset": "tunekit.workloads.synthetic:tensor_dataset",
            "workload.dataset_args": {"shape": [3, 8, 8]},
            "workload.model_args": {"step_wait_s": 0.06},
            "trial.window_s": 0.5,
        }
    )
    starved = [
        _trial(tmp_path, slow_data, 0, "compute", batch_size=8),
        _trial(tmp_path, slow_data, 1, "train", num_workers=1, prefetch_factor=2, batch_size=8),
    ]
    bound = [
        _trial(tmp_path, cheap_data, 2, "compute", batch_size=8),
        _trial(tmp_path, cheap_data, 3, "train", num_workers=1, prefetch_factor=2, batch_size=8),
    ]
    v1 = trial_verdicts(rows_from_measurements(starved), SELECTION)[1]
    v2 = trial_verdicts(rows_from_measurements(bound), SELECTION)[3]
    assert v1.name == "data-starved", v1.sentence()
    assert v1.evidence["data wait"] > 0.5 and v1.evidence["of compute ceiling"] < 0.5
    assert v2.name == "compute-bound", v2.sentence()
    assert v2.evidence["of compute ceiling"] >= 0.9


def test_other_processes_count_only_on_the_gpu_the_trials_used():
    ms = [*CEILINGS, {**CASES["compute-bound"], "device_uuid": "aaaa"}]
    rows = rows_from_measurements(ms)
    env = {
        "gpus": [
            {"index": 0, "uuid": "GPU-aaaa", "processes": []},
            {"index": 1, "uuid": "GPU-bbbb", "processes": [{"pid": 7, "name": "python"}]},
        ]
    }
    names = [v.name for v in run_verdicts(rows, rows[-1], trial_verdicts(rows, SELECTION), SELECTION, env)]
    assert "shared-gpu" not in names


def test_fewer_workers_doing_as_well_unpinned_is_not_h2d_copy():
    # 16 workers oversubscribe 16 CPUs; 8 workers do as well unpinned as pinned: pinning is not what helps
    ms = [
        *CEILINGS,
        measurement(10, "end_to_end", "train", 900, num_workers=16, data_wait_frac=0.4, cpu_util_frac=0.97),
        measurement(11, "end_to_end", "train", 1480, num_workers=8, data_wait_frac=0.1),
        measurement(12, "end_to_end", "train", 1500, num_workers=8, pin_memory=True),
    ]
    assert trial_verdicts(rows_from_measurements(ms), SELECTION)[10].name == "cpu-preprocessing"


def test_a_full_stream_below_the_ceiling_unpinned_is_h2d_copy_until_pinning_is_measured():
    # Unpinned, the stream is busy 97 % at 60 % of the compute ceiling (the pageable copy of each batch sits on it)
    # while the host waits 34 % on data, with CPUs to spare: pinning, never measured, is the first thing to try.
    copy = measurement(
        10, "end_to_end", "train", 1200, num_workers=8, data_wait_frac=0.34, cpu_util_frac=0.4, gpu_busy_frac=0.97
    )
    alone = trial_verdicts(rows_from_measurements([*CEILINGS, copy]), SELECTION)[10]
    assert alone.name == "h2d-copy" and alone.evidence["pinned"] == "not measured at this batch"
    assert alone.evidence["GPU busy (events)"] == 0.97
    # measured pinned at another batch only: still not measured for this one
    other = measurement(
        11, "end_to_end", "train", 1900, batch_size=128, num_workers=8, pin_memory=True, gpu_busy_frac=0.99
    )
    assert trial_verdicts(rows_from_measurements([*CEILINGS, copy, other]), SELECTION)[10].name == "h2d-copy"


def test_a_full_stream_on_saturated_cpus_stays_cpu_preprocessing_with_what_pinning_measured():
    # The H200 knee of configs/resnet.yaml: 16 workers on 16 CPUs at 97 %; events also hold late launches there
    knee = measurement(
        10, "end_to_end", "train", 1200, num_workers=16, data_wait_frac=0.34, cpu_util_frac=0.97, gpu_busy_frac=0.97
    )
    alone = trial_verdicts(rows_from_measurements([*CEILINGS, knee]), SELECTION)[10]
    assert alone.name == "cpu-preprocessing" and alone.evidence["pinned"] == "not measured at this batch"
    # measured pinned, it lost (the pin-memory thread competes with 16 decoding workers)
    pinned = measurement(
        11,
        "end_to_end",
        "train",
        1030,
        num_workers=16,
        pin_memory=True,
        data_wait_frac=0.53,
        cpu_util_frac=0.98,
        gpu_busy_frac=0.56,
    )
    faster = measurement(
        12,
        "end_to_end",
        "train",
        1260,
        num_workers=16,
        data_wait_frac=0.3,
        cpu_util_frac=0.97,
        gpu_busy_frac=0.97,
        params={
            "num_workers": 16,
            "prefetch_factor": 4,
            "pin_memory": False,
            "batch_size": 64,
            "grad_accum": 1,
            "compile": "none",
        },
    )
    both = trial_verdicts(rows_from_measurements([*CEILINGS, knee, pinned, faster]), SELECTION)
    assert both[10].name == "cpu-preprocessing" and both[10].evidence["GPU busy (events)"] == 0.97
    assert both[10].evidence["pinned (trial 11) vs this"] == "-14.2%"  # against this trial, not the fastest
    assert both[12].evidence["pinned (trial 11) vs this"] == "-18.3%"
    assert "GPU busy (events)" not in both[11].evidence  # pinned: its copies are not from pageable memory
    assert "pinned (trial 11) vs this -14.2%" in both[10].sentence()


def test_an_idle_stream_keeps_the_data_verdict():
    starved = measurement(10, "end_to_end", "train", 600, num_workers=4, data_wait_frac=0.6, gpu_busy_frac=0.3)
    verdict = trial_verdicts(rows_from_measurements([*CEILINGS, starved]), SELECTION)[10]
    assert verdict.name == "data-starved" and "GPU busy (events)" not in verdict.evidence


def _loader_bound(tmp_path: Path, dataset_args: dict, workers: int, first: int) -> dict:
    """A compute ceiling and one end-to-end trial of a sleepy model fed by ``dataset_args`` at ``workers``. The model
    (1 ms per step of 8) stays far above what the loaders deliver on any box up to a few dozen cores."""
    cfg = sleepy_config(
        **{"workload.dataset_args": dataset_args, "workload.model_args": {"step_wait_s": 0.001}, "trial.window_s": 0.5}
    )  # a window: at least a whole round of the workers' batches
    rows = rows_from_measurements(
        [
            _trial(tmp_path, cfg, first, "compute", batch_size=8),
            _trial(
                tmp_path,
                cfg,
                first + 1,
                "train",
                num_workers=workers,
                prefetch_factor=2 if workers else None,
                batch_size=8,
            ),
        ]
    )
    return trial_verdicts(rows, SELECTION)[first + 1]


@pytest.mark.alone
def test_waiting_workers_are_data_starved_and_computing_workers_cpu_preprocessing(tmp_path: Path):
    """Both loaders at the same worker count, twice the cores of this box: workers that sleep (slow storage) leave
    the CPUs idle -> data-starved with the storage fix; workers that burn CPU saturate them -> cpu-preprocessing.
    The worker count alone decides neither (the sweep test below also runs both at the core count)."""
    workers = 2 * config.cpu_count()
    sleeping = _loader_bound(tmp_path, {"sample_wait_s": 0.02}, workers, 0)
    burning = _loader_bound(tmp_path, {"sample_wait_s": 0.0, "sample_cpu_s": 0.02}, workers, 2)
    assert sleeping.name == "data-starved", sleeping.sentence()
    assert sleeping.evidence["CPU busy"] < 0.5 and "waiting, not computing" in str(sleeping.evidence["workers"])
    assert "faster storage" in sleeping.fix and "beyond the usable core count" in sleeping.fix
    assert burning.name == "cpu-preprocessing", burning.sentence()
    # saturated by the trial itself, or by the trial plus whatever else runs on this box
    assert max(burning.evidence["CPU busy"], burning.evidence.get("machine CPU busy", 0.0)) > 0.85


def test_a_loader_ceiling_that_stopped_rising_on_busy_cpus_is_cpu_preprocessing():
    ceilings = [
        measurement(20 + i, "loader", "loader", rate, num_workers=w, data_wait_frac=0.99)
        for i, (w, rate) in enumerate([(2, 400), (4, 700), (8, 710)])
    ]
    trial = measurement(10, "end_to_end", "train", 690, num_workers=8, data_wait_frac=0.5, cpu_util_frac=0.6)
    verdict = trial_verdicts(rows_from_measurements([*CEILINGS, *ceilings, trial]), SELECTION)[10]
    assert (
        verdict.name == "cpu-preprocessing" and "710.0 at 8 workers vs 700.0 at 4" in verdict.evidence["loader ceiling"]
    )
    rising = [*ceilings[:2], measurement(22, "loader", "loader", 1300, num_workers=8, data_wait_frac=0.99)]
    verdict = trial_verdicts(rows_from_measurements([*CEILINGS, *rising, trial]), SELECTION)[10]
    assert verdict.name == "data-starved"  # more workers still help: add them


def test_the_run_names_the_memory_boundary_of_a_batch_over_the_headroom_limit():
    ms = [*CEILINGS, measurement(3, "compute", "compute", 2150, batch_size=256, headroom=0.084), CASES["compute-bound"]]
    rows = rows_from_measurements(ms)
    found = run_verdicts(rows, rows[-1], trial_verdicts(rows, SELECTION), SELECTION)
    wall = next(v for v in found if v.name == "memory-wall")
    assert wall.evidence == {"headroom at batch 256": 0.084, "limit": 0.10, "largest batch that fits": 128}
    # walking down from the largest batch, the stage meets an OOM above the batch over the limit: the OOM is named,
    # and the batch that fits is still the one under the headroom limit
    ms.insert(-1, measurement(4, "compute", "compute", None, status="oom", batch_size=512))
    rows = rows_from_measurements(ms)
    found = run_verdicts(rows, rows[-1], trial_verdicts(rows, SELECTION), SELECTION)
    wall = next(v for v in found if v.name == "memory-wall")
    assert wall.evidence == {"OOM at batch": 512, "largest batch that fits": 128}


@pytest.mark.alone
@pytest.mark.slow
def test_storage_and_cpu_bound_loaders_get_their_verdict_and_fix_in_every_output(write_config, tmp_path: Path):
    """The same worker counts on the same box, through whole sweeps: trials.csv, report.md and recommended.yaml
    say data-starved (with the storage fix) for sleeping workers and cpu-preprocessing for burning ones."""
    import pandas as pd
    import yaml

    import tunekit

    workers = [config.cpu_count(), 2 * config.cpu_count()]
    cases = {
        "data-starved": ({"sample_wait_s": 0.02}, "faster storage"),
        "cpu-preprocessing": ({"sample_wait_s": 0.0, "sample_cpu_s": 0.02}, "on the GPU"),
    }
    for expected, (dataset_args, fix) in cases.items():
        cfg = write_config(
            sleepy_config(
                **{
                    "workload.dataset_args": dataset_args,
                    "workload.model_args": {"step_wait_s": 0.001},
                    "search.num_workers": workers,
                    "strategy": "grid",
                    "trial.window_s": 0.5,
                }
            ),
            name=f"{expected}.yaml",
        )
        out = tmp_path / expected
        run = tunekit.sweep(cfg, out=out)
        assert run.recommendation is not None, run.reason
        trials = pd.read_csv(out / "trials.csv")
        assert set(trials["verdict"]) == {expected}, trials[["num_workers", "verdict", "verdict_evidence"]]
        rec = yaml.safe_load((out / "recommended.yaml").read_text())
        assert rec["evidence"]["verdict"] == expected and fix in rec["evidence"]["diagnosis"][0]
        assert f"**{expected}**" in (out / "report.md").read_text()


def test_window_noise_from_variable_batches_is_not_blamed_on_the_gpu():
    """Tokens/s of padded text varies with each window's documents: 11 % window noise with a 9 % spread of tokens
    per batch is the data's; the same noise with fixed-size batches is the machine's."""
    text = measurement(10, "end_to_end", "train", 1950, num_workers=8, noise_cv=0.11, items_per_batch_cv=0.09)
    assert trial_verdicts(rows_from_measurements([*CEILINGS, text]), SELECTION)[10].name == "compute-bound"
    fixed = measurement(10, "end_to_end", "train", 1950, num_workers=8, noise_cv=0.11, device="cuda:0")
    assert trial_verdicts(rows_from_measurements([*CEILINGS, fixed]), SELECTION)[10].name == "shared-gpu"


def test_pinning_is_judged_among_trials_of_the_same_user_knobs():
    """A pinned trial that decodes on the GPU is no pinned twin of an unpinned one that decodes on the CPU: the
    copy is not what differs between them. And a step that decodes on the device keeps its stream busy with that
    work: no h2d-copy from the stream alone."""
    gpu = {"workload.dataset_args.decode": "gpu"}
    unpinned = measurement(10, "end_to_end", "train", 1000, num_workers=8, data_wait_frac=0.1)
    pinned_gpu = measurement(
        11,
        "end_to_end",
        "train",
        1800,
        num_workers=8,
        pin_memory=True,
        data_wait_frac=0.02,
        extra=gpu,
        input_on_device=True,
    )
    verdicts = trial_verdicts(rows_from_measurements([*CEILINGS, unpinned, pinned_gpu]), SELECTION)
    assert verdicts[10].name != "h2d-copy"
    busy_gpu = measurement(
        12,
        "end_to_end",
        "train",
        1460,
        num_workers=8,
        data_wait_frac=0.04,
        gpu_busy_frac=0.995,
        extra=gpu,
        input_on_device=True,
    )
    assert trial_verdicts(rows_from_measurements([*CEILINGS, busy_gpu]), SELECTION)[12].name == "gpu-preprocessing"


def test_a_noisy_run_without_a_gpu_is_shared_host_with_cpu_advice():
    """On a 2-core box other processes kept busy, the windows scattered 20-50 %: the verdict names the host, and
    its advice says nothing of nvidia-smi or a GPU."""
    noisy = measurement(
        10, "end_to_end", "train", 1500, num_workers=8, noise_cv=0.35, device="cpu", data_wait_frac=0.05
    )
    verdict = trial_verdicts(rows_from_measurements([*CEILINGS, noisy]), SELECTION)[10]
    assert verdict.name == "shared-host" and "nvidia-smi" not in verdict.fix and "GPU" not in verdict.fix


def test_an_uncertain_count_decides_no_fix():
    """A count whose backward is 100 times its forward (a miscounted op): the compute-bound verdict's fix does not
    turn on its share (58 % of the peak named a faster card), and report.md and recommended.yaml say it is
    uncertain."""
    from tunekit.diagnosis._verdicts import FIXES

    s = _run(200e12, ratio=100.0)
    verdict = s.trial_verdicts[3]
    assert verdict.name == "compute-bound" and verdict.fix == FIXES["compute-bound"], verdict
    assert "its backward counted 100.0x its forward (expected 1.5-2.5x)" in verdict.sentence()
    assert "**Uncertain**: the count's backward is 100.0x its forward" in flop_summary(s)
    assert yaml.safe_load(recommendation_yaml(s))["evidence"]["model_flops"]["uncertain_backward_ratio"] == 100.0
    assert _run(200e12, ratio=None).trial_verdicts[3].fix == COMPUTE_FIXES["card"]  # no ratio: nothing to doubt


GPU = {"device": "cuda:0", "device_uuid": "GPU-1", "device_name": "NVIDIA H200"}


FLOPS = 24e9


def _run(peak: float, ratio: float | None = 2.0, **cfg_overrides):
    """A ResNet-like run on an H200 whose compute trial at batch 512 measured the matmul peak: the knee (8 workers)
    within 2 % of the best (16), shown so by three alternated runs each, the PyTorch defaults a fifth of it;
    ``ratio``: each count's backward over its forward."""
    cfg = config.from_dict(
        sleepy_config(**{"search.batch_size": [256, 512], "search.num_workers": [0, 8, 16], **cfg_overrides})
    )
    probe = {"matmul_peak_flops": peak, "matmul_peak_precision": "bf16"}
    GPU = {**globals()["GPU"], "flops_backward_ratio": ratio}
    rows = rows_from_measurements(
        [
            measurement(0, "compute", "compute", 5000, batch_size=512, flops_per_item=FLOPS, **GPU, **probe),
            measurement(1, "compute", "compute", 4000, batch_size=256, flops_per_item=FLOPS, **GPU),
            measurement(
                2, "end_to_end", "train", 1000, batch_size=512, data_wait_frac=0.8, flops_per_item=FLOPS, **GPU
            ),
            measurement(3, "end_to_end", "train", 4800, batch_size=512, num_workers=8, flops_per_item=FLOPS, **GPU),
            measurement(4, "end_to_end", "train", 4900, batch_size=512, num_workers=16, flops_per_item=FLOPS, **GPU),
        ]
    )
    three = rows_from_measurements(repeated([r.measurement.to_dict() for r in rows]))
    return summarize(cfg, three, strategy="staged")


def test_the_compute_bound_fix_turns_on_the_share_of_the_peak():
    low, high = _run(500e12), _run(200e12)  # 8 workers at 23 % and at 58 % of the peak
    for s, fix in ((low, COMPUTE_FIXES["kernels"]), (high, COMPUTE_FIXES["card"])):
        verdict = s.trial_verdicts[3]
        assert verdict.name == "compute-bound" and verdict.fix == fix
        eight = next(r for r in s.rows if r.number == 3)
        assert verdict.evidence["of the device's measured matmul peak"] == pytest.approx(s.flop_share(eight))
    assert "reduce-overhead" in low.trial_verdicts[3].fix and "channels_last" in low.trial_verdicts[3].fix
    assert "cheaper model" in high.trial_verdicts[3].fix
    no_peak = _run(0.0)  # no figure: the share is unknown, the fix the general one, and the report says why
    assert no_peak.flop_share(no_peak.choice.knee) is None
    assert "of the device's measured matmul peak" not in no_peak.trial_verdicts[3].evidence
    assert (
        flop_summary(no_peak) == "Model FLOP utilisation: not known: no matmul peak of this device (no trial "
        "measured it)."
    )
