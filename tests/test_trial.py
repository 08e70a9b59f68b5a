"""Real trials: subprocesses, DataLoader workers and torch on the CPU, against workloads with known answers."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from tests.conftest import sleepy_config
from tunekit import config
from tunekit.contract import Knobs, TrialSpec
from tunekit.launch import run_trial
from tunekit.workloads.synthetic import expected_samples_per_s, sleepy_dataset, sleepy_model


def _spec(cfg: dict, number: int = 0, mode: str = "train", **knobs) -> TrialSpec:
    resolved = config.from_dict(cfg).to_dict()
    return TrialSpec(number=number, stage="single", mode=mode, knobs=Knobs(**knobs), config=resolved)


def _plain_loop_rate(
    num_workers: int,
    prefetch: int,
    batch: int,
    sample_wait: float,
    step_wait: float,
    first_step_wait: float = 0.0,
    seconds: float = 1.0,
) -> float:
    """Reference: a plain training loop, timed after the pipeline has drained and refilled at steady state."""
    ds = sleepy_dataset(sample_wait_s=sample_wait)
    model = sleepy_model(step_wait_s=step_wait, first_step_wait_s=first_step_wait)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    loader = DataLoader(
        ds,
        batch_size=batch,
        sampler=RandomSampler(ds, num_samples=1 << 30),
        num_workers=num_workers,
        prefetch_factor=prefetch if num_workers else None,
    )
    it = iter(loader)

    def step() -> None:
        x, y = next(it)
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    for _ in range(1 + num_workers * prefetch + 5):
        step()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        step()
        n += batch
    return n / (time.perf_counter() - t0)


def test_tiny_trial_reports_the_contract(tmp_path: Path):
    cfg = sleepy_config(**{"trial.window_s": 0.5})
    m = run_trial(_spec(cfg, num_workers=2, prefetch_factor=2, batch_size=8), tmp_path / "t", 60)
    assert m.status == "ok", m
    on_disk = json.loads((tmp_path / "t" / "measurement.json").read_text())
    assert on_disk["version"] == 2 and on_disk["rate"] == m.rate and on_disk["unit"] == "samples"
    assert on_disk["started_by"] and on_disk["launcher_wall_s"] > 0  # the launcher's fields, added
    for key in (
        "rate",
        "rate_windows",
        "noise_cv",
        "step_time_s",
        "data_wait_frac",
        "gpu_busy_frac",
        "nvml",
        "device_mem_peak_reserved_bytes",
        "headroom",
        "host_mem_peak_bytes",
        "cpu_util_cores",
        "warmup_s",
        "compile_s",
        "device_name",
        "versions",
        "params",
    ):
        assert key in on_disk, key
    assert len(m.rate_windows) == 2
    assert m.gpu_busy_frac is None and m.nvml is None  # CPU: no GPU figures, not zeros
    assert m.params["num_workers"] == 2 and m.params["prefetch_factor"] == 2
    assert m.host_processes >= 3  # the main process and two loader workers were measured
    # the first batch, what the 2 workers x prefetch 2 had ready (set aside, at most the fill), a warm-up step
    assert 0 <= m.warmup_set_aside <= 2 * 2 and m.warmup_batches >= 1 + m.warmup_set_aside + 1
    assert 0 < m.headroom < 1 and m.headroom_basis == "host"
    assert m.epoch_boundary_in_trial is False
    # the parts the worker times lie within its trial time, the loader's start and the teardown among them
    parts = ("cuda_init_s", "build_s", "loop_setup_s", "warmup_s", "measured_s", "teardown_s")
    assert all(getattr(m, p) >= 0 for p in parts) and m.teardown_s > 0
    assert sum(getattr(m, p) for p in parts) <= m.trial_s
    assert (tmp_path / "t" / "spec.json").exists() and (tmp_path / "t" / "worker.log").exists()


@pytest.mark.parametrize("workers,sample_wait,step_wait", [(0, 0.005, 0.02), (2, 0.01, 0.01)])
def test_fidelity_against_plain_loop_and_analytic(tmp_path: Path, workers: int, sample_wait: float, step_wait: float):
    batch = 8
    # half-second windows (8 steps at 0 workers, 12 at 2) and a 1-s reference loop: sleeps bound both from above
    cfg = sleepy_config(
        **{
            "workload.model_args": {"step_wait_s": step_wait},
            "workload.dataset_args": {"sample_wait_s": sample_wait},
            "trial.window_s": 0.5,
        }
    )
    knobs = {"num_workers": workers, "prefetch_factor": 2 if workers else None, "batch_size": batch}
    m = run_trial(_spec(cfg, **knobs), tmp_path / "t", 60)
    assert m.status == "ok", m
    reference = _plain_loop_rate(workers, 2, batch, sample_wait, step_wait)
    analytic = expected_samples_per_s(workers, batch, sample_wait, step_wait)
    # Sleeps can only make a trial slower, never faster: the upper bounds are tight (counting batches prepared during
    # warm-up reads 1.5-5x too fast); a loaded box only lowers both figures, so the lower bounds leave it room.
    assert m.rate <= analytic * 1.03
    assert m.rate >= 0.6 * analytic
    assert m.rate == pytest.approx(reference, rel=0.25)
    if workers == 0:
        assert m.data_wait_frac > 0.5  # 40 ms of loading per 60 ms step, in the main process


def test_slow_first_step_and_deep_prefetch_are_not_counted(tmp_path: Path):
    """While a 1 s first step runs, 2 workers x prefetch 8 prepare 16 batches (8 each, 80 ms a batch: 0.64 s).
    Counting them would inflate the first window by ~60 %: warm-up must drain the pipeline fill before timing."""
    batch, sample_wait, step_wait = 8, 0.01, 0.005
    cfg = sleepy_config(
        **{
            "workload.model_args": {"step_wait_s": step_wait, "first_step_wait_s": 1.0},
            "workload.dataset_args": {"sample_wait_s": sample_wait},
            "trial.warmup_steps": 0,
            "trial.measure_windows": 2,
            "trial.window_s": 1.0,  # 25 batches a window: one batch more or less is 4 %, within the bound below
        }
    )
    m = run_trial(_spec(cfg, num_workers=2, prefetch_factor=8, batch_size=batch), tmp_path / "t", 60)
    assert m.status == "ok", m
    analytic = expected_samples_per_s(2, batch, sample_wait, step_wait)  # 200/s, loader-bound
    reference = _plain_loop_rate(2, 8, batch, sample_wait, step_wait, first_step_wait=1.0)
    assert m.rate == pytest.approx(reference, rel=0.25)
    assert max(m.rate_windows) <= analytic * 1.05  # no window counts the 16 prefetched batches
    assert m.first_step_s >= 1.0 and m.warmup_batches >= 1 + 16


def test_the_loader_queues_show_the_ready_batches():
    """Warm-up sets aside what the loader's queues hold, not what fetch times suggest (a loaded box makes a ready
    fetch slow): after the first batch, 2 workers x prefetch 3 make 6 batches, all shown ready once made; a fetch
    takes one; a loader of another kind shows nothing (None: nothing is set aside)."""
    from tunekit.worker.meter import LoaderBatches

    dataset = sleepy_dataset(sample_wait_s=0.2)  # 0.8 s a batch: none is made while the test takes them
    loader = DataLoader(
        dataset, batch_size=4, num_workers=2, prefetch_factor=3, sampler=RandomSampler(dataset, num_samples=1 << 20)
    )
    batches = LoaderBatches(loader)
    try:
        next(batches)
        deadline = time.monotonic() + 30
        while batches.ready() != 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert batches.ready() == 6
        next(batches)
        assert batches.ready() == 5
        assert _meter(batches, fill=6)._set_aside() == 5
        assert batches.ready() == 0
    finally:
        batches.close()
    plain = LoaderBatches(iter([torch.zeros(1)] * 3))
    assert plain.ready() is None and _meter(plain, fill=3)._set_aside() == 0
    inline = LoaderBatches(DataLoader(dataset, batch_size=4))  # no workers: nothing is made before it is asked for
    assert inline.ready() == 0


def _meter(batches, fill: int):
    """A meter on ``batches`` with a set-aside of at most ``fill``."""
    from tunekit.worker.meter import Meter, MeterSettings
    from tunekit.worker.meter._monitor import TreeCpu

    settings = MeterSettings(window_s=0.1, measure_windows=1, max_windows=1, precision=None, warmup_steps=0, fill=fill)
    return Meter(
        batches,
        settings,
        device=torch.device("cpu"),
        count=len,
        cpu=TreeCpu(),
        ready=batches.ready,
        epochs=lambda: batches.epochs_ended,
    )


def test_the_set_aside_stops_at_an_epochs_end_and_a_persistent_loader_crosses_epochs():
    """A stream of 4 batches over 2 workers: after the first, 3 batches and the end marker of the worker asked for
    a fifth wait in the queues, all shown as ready; the set-aside takes the 3 and, when the other worker's marker
    is in too, meets the end of the stream (a 4th fetch starts the next epoch), and stops there, never running
    through epoch after epoch. A persistent loader (what a user's loader
    factory gets) goes on into its next epoch with the same workers."""
    from tests._workloads import finite_stream
    from tunekit.worker.meter import LoaderBatches

    batches = LoaderBatches(DataLoader(finite_stream(8), batch_size=2, num_workers=2))
    try:
        next(batches)
        deadline = time.monotonic() + 30
        while (batches.ready() or 0) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        # the 3 batches, and the first of the next epoch when worker 1's end marker was already in the queue
        assert _meter(batches, fill=8)._set_aside() in (3, 4) and batches.epochs_ended <= 1
    finally:
        batches.close()
    loader = DataLoader(
        torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=4, num_workers=2, persistent_workers=True
    )
    batches = LoaderBatches(loader)
    try:
        seen = [next(batches)[0].tolist() for _ in range(5)]
        assert batches.epochs_ended == 2 and all(len(b) == 4 for b in seen)
    finally:
        batches.close()


def _epochs_of(batches_per_epoch: int, stall_s: float):
    """An endless stream of epochs of ``batches_per_epoch`` batches, each epoch opening after ``stall_s`` (a drained
    pipeline refilling); ``state["epochs"]`` counts the epochs ended."""
    state = {"epochs": 0}

    def stream():
        while True:
            time.sleep(stall_s)
            for _ in range(batches_per_epoch):
                yield [torch.zeros(2)]
            state["epochs"] += 1

    return stream(), state


def test_windows_hold_whole_epochs_when_epochs_are_shorter_than_a_window():
    """Epochs of 5 batches (10 ms steps, 30 ms opening each) end three times in a 0.25 s window: every window then
    holds whole epochs, so each holds the same share of their openings; epochs of 400 batches take longer than a
    window, whose length then follows the rounds alone."""
    from tunekit.worker.meter import Meter, MeterSettings
    from tunekit.worker.meter._monitor import TreeCpu

    def measure(per_epoch: int) -> Meter:
        batches, state = _epochs_of(per_epoch, 0.03)
        settings = MeterSettings(
            window_s=0.25, measure_windows=3, max_windows=3, precision=None, warmup_steps=1, epoch_batches=per_epoch
        )
        meter = Meter(
            batches, settings, device=torch.device("cpu"), count=len, cpu=TreeCpu(), epochs=lambda: state["epochs"]
        )
        for _ in meter:
            time.sleep(0.01)
        return meter

    short = measure(5).reading
    assert short.epoch_batches == 5 and len(short.windows) == 3
    assert all(w.micro_batches % 5 == 0 for w in short.windows), [w.micro_batches for w in short.windows]
    long = measure(400).reading
    assert long.epoch_batches is None and len(long.windows) == 3


@pytest.mark.parametrize("length", [1, None])
def test_epochs_of_one_batch_are_measured_in_whole_epochs(length: int | None):
    """Epochs of one batch whose opening (0.15 s: an evaluation, a loader's restart) outlasts two 50 ms windows: every
    batch is an epoch boundary's, nothing is left inside an epoch to measure, so the windows hold whole epochs
    (known from the length, or seen when two boundaries close inside one window) and the measurement ends."""
    from tunekit.worker.meter import Meter, MeterSettings
    from tunekit.worker.meter._monitor import TreeCpu

    batches, state = _epochs_of(1, 0.15)
    settings = MeterSettings(
        window_s=0.05,
        measure_windows=2,
        max_windows=2,
        precision=None,
        warmup_steps=1,
        epoch_batches=length,
        boundary_wait_s=10.0,
        fill=2,
    )
    meter = Meter(
        batches,
        settings,
        device=torch.device("cpu"),
        count=len,
        cpu=TreeCpu(),
        epochs=lambda: state["epochs"],
        epoch_aware=True,
    )
    for taken, _ in enumerate(meter):
        assert taken < 60, "the windows never ended"
        time.sleep(0.005)
    reading = meter.reading
    assert not reading.epoch_aware and reading.epoch_batches == 1 and len(reading.windows) == 2
    assert all(w.rate < 1 / 0.15 for w in reading.windows)  # each window holds its epochs' openings


def test_the_scripts_own_settings_wait_for_an_epoch_boundary_other_trials_skip():
    """Epochs of 150 batches of 5 ms steps; two 50 ms windows measure about 20 of them, so the epoch's end lies over
    three times the windows' time away: a trial skips it (its figure is the steady rate), while the script's own
    settings, which every gain is measured against, wait for it (within ``boundary_wait_s``) and record it."""
    import math

    from tunekit.worker.meter import Meter, MeterSettings
    from tunekit.worker.meter._monitor import TreeCpu

    def boundaries(patience: float) -> int:
        batches, state = _epochs_of(150, 0.03)
        settings = MeterSettings(
            window_s=0.05,
            measure_windows=2,
            max_windows=2,
            precision=None,
            warmup_steps=1,
            epoch_batches=150,
            boundary_wait_s=10.0,
            boundary_patience=patience,
        )
        meter = Meter(
            batches,
            settings,
            device=torch.device("cpu"),
            count=len,
            cpu=TreeCpu(),
            epochs=lambda: state["epochs"],
            epoch_aware=True,
        )
        for _ in meter:
            time.sleep(0.005)
        return len(meter.reading.boundaries)

    assert boundaries(3.0) == 0
    assert boundaries(math.inf) >= 1


def test_a_workloads_finite_epochs_are_measured_apart_from_the_steady_rate(tmp_path: Path):
    """Factories with their own sampler (a sequential one: epochs of 40 batches of 8, 1.6 s at one worker's 200/s,
    longer than two 0.4 s windows): the epoch ends inside the trial are measured apart, as a script's are, and the
    figure is the rate over whole epochs; with tunekit's endless sampler no epoch ends and nothing changes."""
    cfg = sleepy_config(
        **{
            "workload.dataset_args": {"num_samples": 320, "sample_wait_s": 0.005},
            "workload.sampler": "torch.utils.data:SequentialSampler",
            "trial.window_s": 0.4,
            "trial.measure_windows": 3,
        }
    )
    m = run_trial(_spec(cfg, num_workers=1, batch_size=8, prefetch_factor=2), tmp_path / "finite", 60)
    assert m.status == "ok", m
    assert m.epoch_boundaries >= 1 and m.epoch_items == 320, (m.epoch_boundaries, m.epoch_items)
    assert m.rate == m.rate_whole_epoch and m.rate <= m.rate_in_epoch
    endless = run_trial(_spec(sleepy_config(), num_workers=0, batch_size=8), tmp_path / "endless", 60)
    assert endless.status == "ok" and endless.epoch_boundaries is None and endless.rate_in_epoch is None


def test_warm_up_steps_stop_after_a_window_of_time(tmp_path: Path):
    """0.2 s steps, 10 warm-up steps asked, window_s 0.5: the warm-up trains steps for about a window (its first
    step, then 1-3 more), not 2 s of them; nothing was prepared ahead (0 workers), so nothing is set aside."""
    cfg = sleepy_config(
        **{
            "workload.model_args": {"step_wait_s": 0.2},
            "trial.warmup_steps": 10,
            "trial.measure_windows": 2,
            "trial.window_s": 0.5,
        }
    )
    m = run_trial(_spec(cfg, num_workers=0, batch_size=4), tmp_path / "t", 60)
    assert m.status == "ok", m
    assert m.warmup_set_aside == 0
    assert 2 <= m.warmup_batches <= 4


def test_a_trial_clearly_below_the_band_stops_measuring(tmp_path: Path):
    """With a precision no window spread can meet, a trial measures to max_windows, unless the rate it needs to
    matter (the spec's needed, all ranks) lies above its whole interval: then it stops after measure_windows."""
    cfg = sleepy_config(**{"trial.precision": 1e-6, "trial.max_windows": 5, "trial.window_s": 0.3})
    spec = _spec(cfg, num_workers=0, batch_size=8)
    raced = run_trial(dataclasses.replace(spec, needed=1e9), tmp_path / "raced", 60)
    assert raced.status == "ok", raced
    assert raced.stop_reason == "below_band" and raced.windows_measured == 2
    full = run_trial(dataclasses.replace(spec, number=1, needed=1.0), tmp_path / "full", 60)
    assert full.stop_reason == "max_windows" and full.windows_measured == 5


def test_the_fork_server_starts_trials_that_stay_isolated(tmp_path: Path):
    """Single-process trials are forked by the fork server (which imported the workload's module once); what a
    trial does to its modules dies with it: the model that refuses a second build in one process builds in each.
    With trial.fork_server: false a fresh interpreter starts the trial instead."""
    cfg = sleepy_config(
        **{
            "workload.model": "tests._workloads:once_per_process_model",
            "workload.model_args": {},
            "trial.measure_windows": 2,
            "trial.window_s": 0.3,
        }
    )
    first = run_trial(_spec(cfg, number=0, num_workers=2, prefetch_factor=2, batch_size=8), tmp_path / "a", 60)
    second = run_trial(_spec(cfg, number=1, num_workers=0, batch_size=8), tmp_path / "b", 60)
    assert first.status == second.status == "ok", (first, second)
    assert first.started_by == second.started_by == "fork server"
    assert first.input_on_device is False  # the trial moved the batches: no input work on the device
    assert first.pid != second.pid
    fresh = run_trial(
        _spec(sleepy_config(**{"trial.fork_server": False, "trial.window_s": 0.3}), number=2, batch_size=8, threads=2),
        tmp_path / "c",
        60,
    )
    assert fresh.status == "ok" and fresh.started_by == "interpreter"
    assert fresh.params["threads"] == 2 and fresh.torch_threads == 2  # the thread knob, set


def test_a_fork_server_started_ahead_serves_the_first_trial(tmp_path: Path):
    """The sweep starts the fork server while it prepares the dataset: the first trial is forked by that same
    server (its imports already paid), not by one started on demand; with trial.fork_server: false none starts."""
    from tunekit.launch import _forks, start_fork_server

    _forks.close_servers()
    off = sleepy_config(**{"trial.fork_server": False})
    start_fork_server(config.from_dict(off))
    assert "server" not in _forks.SERVERS
    cfg = sleepy_config(**{"trial.measure_windows": 2, "trial.window_s": 0.3})
    start_fork_server(config.from_dict(cfg))
    ahead = _forks.SERVERS["server"].proc
    assert ahead.poll() is None  # importing torch while nothing asks it for a trial yet
    m = run_trial(_spec(cfg, number=0, batch_size=8), tmp_path / "t", 60)
    assert m.status == "ok" and m.started_by == "fork server"
    assert _forks.SERVERS["server"].proc is ahead and ahead.poll() is None  # the same server served it


def test_compute_and_loader_modes(tmp_path: Path):
    cfg = sleepy_config(
        **{
            "workload.model_args": {"step_wait_s": 0.02},
            "workload.dataset_args": {"sample_wait_s": 0.01},
            "trial.window_s": 0.5,
        }
    )
    compute = run_trial(_spec(cfg, mode="compute", num_workers=2, batch_size=8), tmp_path / "c", 60)
    loader = run_trial(_spec(cfg, mode="loader", num_workers=2, prefetch_factor=2, batch_size=8), tmp_path / "l", 60)
    assert compute.status == loader.status == "ok"
    # compute: the model alone on a staged batch, 8 samples / 20 ms; loader: 2 workers / 10 ms per sample
    assert 0.6 * 400 <= compute.rate <= 400 * 1.03
    assert compute.data_wait_frac < 0.01 and compute.host_processes == 1
    assert 0.6 * 200 <= loader.rate <= 200 * 1.03
    assert all(steps % 2 == 0 for steps in loader.steps_windows)  # windows end on whole rounds of 2 workers


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_hung_loader_times_out_and_leaves_no_process(tmp_path: Path):
    pids = tmp_path / "pids"
    pids.mkdir()
    cfg = sleepy_config(
        **{"workload.dataset_args": {"num_samples": 16, "sample_wait_s": 0.0, "hang_at": 3, "pid_dir": str(pids)}}
    )
    # 4 s: the forked trial builds its loader and both workers serve samples within half a second here (a second or
    # two on a loaded box); then one hangs, and the timeout must end the whole tree
    t0 = time.monotonic()
    m = run_trial(_spec(cfg, num_workers=2, prefetch_factor=2, batch_size=4), tmp_path / "t", 4)
    assert m.status == "timeout" and "timeout_s = 4" in m.reason
    assert time.monotonic() - t0 < 4 + 20
    loader_pids = [int(p.name) for p in pids.iterdir()]
    assert len(loader_pids) == 2 and m.pid not in loader_pids  # the workers served samples
    assert not [pid for pid in [m.pid, *loader_pids] if _alive(pid)]
    saved = json.loads((tmp_path / "t" / "measurement.json").read_text())
    assert saved["status"] == "timeout" and saved["reason"]


def test_dying_loader_worker_is_crashed_with_reason(tmp_path: Path):
    cfg = sleepy_config(**{"workload.dataset_args": {"num_samples": 16, "sample_wait_s": 0.0, "kill_at": 5}})
    m = run_trial(_spec(cfg, num_workers=2, prefetch_factor=2, batch_size=4), tmp_path / "t", 60)
    assert m.status == "crashed"
    # torch names the signal or only the pids, by which of its checks saw the death first: the kill is named both ways
    assert m.reason.startswith("a DataLoader worker died: "), m.reason
    assert "OOM killer" in m.reason and ("killed by signal: Killed" in m.reason or "exited unexpectedly" in m.reason)


def test_exception_in_dataset_is_crashed_with_its_message(tmp_path: Path):
    cfg = sleepy_config(**{"workload.dataset_args": {"num_samples": 16, "sample_wait_s": 0.0, "raise_at": 7}})
    m = run_trial(_spec(cfg, num_workers=1, prefetch_factor=2, batch_size=4), tmp_path / "t", 60)
    assert m.status == "crashed"
    assert "sample 7 is corrupt" in m.reason and "DataLoader worker 0" in m.reason
    assert "Traceback" in (tmp_path / "t" / "worker.log").read_text()


def test_host_oom_is_classified_oom(tmp_path: Path):
    cfg = sleepy_config(**{"workload.step": "tests._workloads:huge_alloc_step"})
    m = run_trial(_spec(cfg, num_workers=0, batch_size=4), tmp_path / "t", 60)
    assert m.status == "oom", m
    assert "allocate" in m.reason


def test_killed_worker_process_is_crashed_with_signal(tmp_path: Path):
    cfg = sleepy_config(**{"workload.step": "tests._workloads:self_kill_step"})
    m = run_trial(_spec(cfg, num_workers=0, batch_size=4), tmp_path / "t", 60)
    assert m.status == "crashed" and "SIGKILL" in m.reason and m.returncode == -9


def test_bad_output_is_detected(tmp_path: Path):
    from tunekit.launch import classify as _outcome

    spec = _spec(sleepy_config(), num_workers=0)
    out = tmp_path / "measurement.json"
    out.write_text("{not json")
    assert _outcome(spec, 0, False, 60, out, tmp_path / "log").status == "bad_output"
    out.write_text(json.dumps({"status": "ok", "samples_per_s": float("nan")}))  # version 1, as the worker writes
    assert "rate = nan is not a finite" in _outcome(spec, 0, False, 60, out, tmp_path / "log").reason
    out.write_text(
        json.dumps(
            {
                "version": 2,
                "status": "ok",
                "rate": 0.0,
                "rate_windows": [0.0],
                "noise_cv": 0.0,
                "step_time_s": 1.0,
                "data_wait_frac": 0.0,
                "headroom": 0.5,
                "warmup_s": 1.0,
            }
        )
    )
    assert "rate = 0.0 is not positive" in _outcome(spec, 0, False, 60, out, tmp_path / "log").reason
    out.write_text(json.dumps({"version": 99, "status": "ok"}))
    assert _outcome(spec, 0, False, 60, out, tmp_path / "log").status == "bad_output"
    out.unlink()
    assert _outcome(spec, 0, False, 60, out, tmp_path / "log").status == "bad_output"


def test_trial_cli_writes_measurement(write_config, tmp_path: Path):
    path = write_config(sleepy_config())
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunekit",
            "trial",
            str(path),
            "--set",
            "num_workers=2",
            "--set",
            "batch_size=8",
            "--set",
            "trial.window_s=0.5",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    m = json.loads((out / "trials" / "0" / "measurement.json").read_text())
    assert m["status"] == "ok" and m["params"]["num_workers"] == 2 and m["params"]["batch_size"] == 8
    assert "samples/s:" in proc.stdout
    assert (out / "config.resolved.yaml").exists()


def test_trial_dies_with_its_launcher(tmp_path: Path):
    """A sweep killed with SIGKILL cannot clean up: the trial's own watchdog kills its process group."""
    pids = tmp_path / "pids"
    pids.mkdir()
    cfg = sleepy_config(
        **{"workload.dataset_args": {"num_samples": 16, "sample_wait_s": 0.0, "hang_at": 3, "pid_dir": str(pids)}}
    )
    spec = _spec(cfg, num_workers=2, prefetch_factor=2, batch_size=4)
    code = (
        "import json, sys; from tunekit.contract import TrialSpec; from tunekit.launch import run_trial; "
        f"run_trial(TrialSpec.from_dict(json.loads(sys.argv[1])), {str(tmp_path / 't')!r}, 300)"
    )
    launcher = subprocess.Popen([sys.executable, "-c", code, json.dumps(spec.to_dict())])
    deadline = time.monotonic() + 60
    while len(list(pids.iterdir())) < 2:  # both loader workers are serving (one of them hangs)
        assert time.monotonic() < deadline
        time.sleep(0.1)
    worker = int((tmp_path / "t" / "worker.pid").read_text())
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    victims = [worker, *(int(p.name) for p in pids.iterdir())]
    while any(_alive(pid) for pid in victims):
        assert time.monotonic() < deadline, [pid for pid in victims if _alive(pid)]
        time.sleep(0.2)


def test_precision_measures_until_the_interval_is_tight_leaving_out_settling_windows(tmp_path: Path):
    """The first window runs at half speed (the pipeline still settling): with trial.precision the trial measures
    on, leaves that window out, and reports the steady rate; without, the slow window drags the median down."""
    # 18 slow calls: the warm-up takes the first 6 (5 steps and the first), so the first window is all slow; with the
    # default 12 it held half slow steps, and a slow host's fixed overhead per step pushed the ratio to 0.92
    base = {
        "workload.model": "tests._workloads:settling_model",
        "workload.model_args": {"fast_after": 18},
        "workload.dataset_args": {"sample_wait_s": 0.0},
        "trial.window_s": 0.5,
        "trial.measure_windows": 2,
    }
    # the cut often takes two windows (the second holds the last slow steps), and two kept windows are precise only
    # when they agree within 0.4 % (t = 12.7 for one degree of freedom): room for more windows on a loaded host
    precise = run_trial(
        _spec(sleepy_config(**base, **{"trial.precision": 0.05, "trial.max_windows": 12}), num_workers=0, batch_size=8),
        tmp_path / "precise",
        60,
    )
    assert precise.status == "ok", precise
    windows = (precise.settling_windows, precise.rate_windows, precise.rate_interval)
    assert precise.stop_reason == "precise" and len(precise.settling_windows) >= 1, windows
    assert precise.windows_measured == len(precise.settling_windows) + len(precise.rate_windows)
    assert precise.settling_windows[0] < 0.8 * min(precise.rate_windows)  # the slow first window
    assert precise.rate_interval <= 0.05
    fixed = run_trial(_spec(sleepy_config(**base), num_workers=0, batch_size=8), tmp_path / "fixed", 60)
    assert fixed.stop_reason == "fixed" and fixed.windows_measured == 2 and fixed.settling_windows == []
    assert fixed.rate < 0.9 * precise.rate
    # the settling windows' batches are warm-up batches (both trials warm up alike: 3 slow steps, no set-aside)
    settled = precise.warmup_batches - fixed.warmup_batches
    items = [rate * precise.settling_s for rate in (min(precise.settling_windows), max(precise.settling_windows))]
    assert items[0] / 8 - 1 <= settled <= items[1] / 8 + 1, (settled, precise.settling_windows, precise.settling_s)


def test_a_wait_on_a_forked_trial_whose_exit_message_was_lost_still_ends():
    """An interrupt that lands after a wait read the server's exit message but before it kept the code loses that
    message: a later wait (kill_tree's, without a timeout) must still end once the trial's process group is gone."""
    import signal

    from tunekit.launch import _forks, _start

    env = _start.child_env()
    server = _forks.server_for(env)
    proc = server.request(["--resolve", json.dumps({})], env, [])
    assert proc is not None
    try:
        while True:  # the message the cut-short wait read
            reply = server.receive(timeout=60)
            assert reply is not None, "the fork server died"
            if reply.get("exit") == proc.pid:
                break
        started = time.monotonic()
        assert proc.wait(timeout=30) == -signal.SIGKILL  # not TimeoutExpired: the group's end was seen
        assert time.monotonic() - started < 10
    finally:
        proc.stdout.close()


def test_loader_workers_forked_after_the_last_pss_read_are_not_counted_whole(tmp_path: Path):
    """Workers fork from the trial's process, sharing its pages: the tree's PSS grows by what they touch, not by
    their RSS. The monitor reads PSS only every 10 s inside the windows and estimates between from the RSS change,
    so a sample whose processes changed since the last read is left out; estimated across the workers' fork (they
    start in the short warm-up, after the last read), two workers tripled the figure."""
    cfg = sleepy_config(**{"trial.window_s": 0.5})
    alone = run_trial(_spec(cfg, number=0, batch_size=8), tmp_path / "alone", 60)
    workers = run_trial(_spec(cfg, number=1, num_workers=2, prefetch_factor=2, batch_size=8), tmp_path / "two", 60)
    assert alone.status == "ok" and workers.status == "ok", (alone.reason, workers.reason)
    assert workers.host_processes == 3
    assert workers.host_mem_peak_bytes < 1.5 * alone.host_mem_peak_bytes, (
        workers.host_mem_peak_bytes,
        alone.host_mem_peak_bytes,
    )


def test_the_fork_server_refuses_once_an_import_initialised_cuda(tmp_path: Path):
    """A workload module that leaves torch's CUDA state initialised (here marked so, on the CPU) makes the fork
    server refuse: the trial starts in a fresh interpreter, and so do the trials after it."""
    plain = sleepy_config(**{"trial.window_s": 0.3})
    first = run_trial(_spec(plain, number=0, batch_size=8), tmp_path / "a", 60)
    assert first.status == "ok" and first.started_by == "fork server", first
    cuda = sleepy_config(**{"trial.window_s": 0.3, "workload.loss": "tests._cuda_state_at_import:loss"})
    refused = run_trial(_spec(cuda, number=1, batch_size=8), tmp_path / "b", 60)
    assert refused.status == "ok" and refused.started_by == "interpreter", refused
    assert "initialised CUDA" in refused.fork_server_refused
    after = run_trial(_spec(plain, number=2, batch_size=8), tmp_path / "c", 60)
    assert after.status == "ok" and after.started_by == "interpreter", after


def test_a_dataset_moving_its_batches_ahead_is_moved_beside_the_step(tmp_path: Path):
    """A dataset with batch_to_device_ahead (decode: gpu-overlap on a GPU) has each batch moved in the trial's ahead
    thread, before the step takes it; the trial counts the loader's items and records input on the device."""
    cfg = sleepy_config(
        **{
            "workload.dataset": "tests._workloads:moved_ahead_dataset",
            "workload.dataset_args": {},
            "workload.step": "tests._workloads:moved_ahead_step",
            "trial.window_s": 0.3,
        }
    )
    m = run_trial(_spec(cfg, number=0, num_workers=2, prefetch_factor=2, batch_size=8), tmp_path / "t", 60)
    assert m.status == "ok", m
    assert m.input_on_device is True and m.measured_items == 8 * m.measured_steps


def test_the_ahead_thread_keeps_order_and_hands_on_its_failure():
    """AheadStream moves batches in order in a thread of its own, passes an exception on to the step that fetches next,
    and close() ends the thread."""
    import threading

    from tunekit.worker.factory._ahead import AheadStream

    class Ctx:
        device = torch.device("cpu")

    source = iter([torch.tensor([1]), torch.tensor([2]), torch.tensor([3])])

    def batches():
        item = next(source, None)
        if item is None:
            raise ValueError("the loader failed")
        return item

    threads = set()

    def move(batch, ctx, non_blocking):
        threads.add(threading.current_thread().name)
        return batch * 10

    ahead = AheadStream(batches, move, Ctx(), non_blocking=False)
    assert [next(ahead).item() for _ in range(3)] == [10, 20, 30]
    with pytest.raises(ValueError, match="the loader failed"):
        next(ahead)
    ahead.close()
    assert not ahead.thread.is_alive() and threads == {"tunekit-ahead"}


def test_the_step_waiting_on_the_ahead_move_is_not_data_wait():
    """While the ahead thread moves (decodes) a batch, a step that waits for it waits on the device-side work, not
    on the loader: AheadStream counts that apart (device_wait_s), and a wait while the thread waits on the loader stays
    data wait."""
    from tunekit.worker.factory._ahead import AheadStream

    class Ctx:
        device = torch.device("cpu")

    def slow_move(batch, ctx, non_blocking):
        time.sleep(0.1)
        return batch

    ahead = AheadStream(lambda: torch.zeros(1), slow_move, Ctx(), non_blocking=False)
    for _ in range(3):
        next(ahead)
    ahead.close()
    assert ahead.device_wait_s > 0.1  # the first fetch alone waited a whole move

    def slow_loader():
        time.sleep(0.1)
        return torch.zeros(1)

    ahead = AheadStream(slow_loader, lambda b, c, non_blocking: b, Ctx(), non_blocking=False)
    for _ in range(3):
        next(ahead)
    ahead.close()
    assert ahead.device_wait_s < 0.15  # of about 0.3 s waited, on the loader


def test_worker_threads_are_set_in_every_loader_worker(tmp_path: Path):
    """The worker_threads knob reaches each loader worker before the workload's own worker_init_fn; without it the
    workers keep PyTorch's one thread (the dataset fails a trial whose workers run another count)."""
    cfg = sleepy_config(**{"workload.dataset": "tests._workloads:threads_seen_dataset", "trial.window_s": 0.3})
    for number, (threads, expect) in enumerate([(2, 2), (None, 1)]):
        cfg["workload"]["dataset_args"] = {"expect": expect}
        m = run_trial(
            _spec(cfg, number=number, num_workers=2, prefetch_factor=2, batch_size=8, worker_threads=threads),
            tmp_path / str(number),
            60,
        )
        assert m.status == "ok", m
        assert m.params["worker_threads"] == threads
