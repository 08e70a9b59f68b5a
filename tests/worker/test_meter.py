"""The meter (tunekit/worker/meter/): real trials (subprocesses, DataLoader workers and torch on the CPU) against
workloads with known answers, the warm-up, windows and epochs on streams made here, and the monitor thread's
samples."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

import tunekit
from tests.conftest import sleepy_config
from tunekit import config
from tunekit.contract import Knobs, Mode, Stage, TrialSpec
from tunekit.launch import run_trial
from tunekit.worker.meter import _monitor
from tunekit.worker.meter._monitor import Monitor
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


def test_a_baseline_below_the_band_measures_on_until_its_figure_can_carry_a_gain(tmp_path: Path):
    """Windows 2x apart (a slow step in every other), needed far above: a trial of the walk stops after
    two windows, whose interval says nothing; PyTorch's defaults, what every gain is over, measure on until their
    interval is within rules.CLAIM_PRECISION, here never, so to max_windows."""
    from tunekit import rules

    cfg = sleepy_config(
        **{
            "workload.model": "tests._workloads:cycling_model",
            "workload.model_args": {},
            "workload.dataset_args": {"sample_wait_s": 0.0},
            "trial.window_s": 0.1,
            "trial.precision": 1e-6,
            "trial.max_windows": 5,
        }
    )
    walk = dataclasses.replace(_spec(cfg, num_workers=0, batch_size=8), stage="end_to_end", needed=1e9)
    assert walk.baseline and not _spec(cfg, num_workers=0, batch_size=8).baseline  # ``tunekit trial`` is no baseline
    defaults = run_trial(walk, tmp_path / "defaults", 60)
    assert defaults.status == "ok", defaults
    assert defaults.rate_interval > rules.CLAIM_PRECISION and defaults.stop_reason == "max_windows", defaults
    one_worker = dataclasses.replace(walk, number=1, knobs=Knobs(num_workers=1, prefetch_factor=2, batch_size=8))
    raced = run_trial(one_worker, tmp_path / "raced", 60)
    assert raced.stop_reason == "below_band" and raced.windows_measured == 2, raced


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


def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the monitor took no sample in time"
        time.sleep(0.02)


def test_inside_the_windows_pss_is_read_rarely_and_growth_still_counts(monkeypatch):
    """Outside the windows every sample reads PSS; inside them only every pss_period_s, the samples between adding
    the change in the tree's RSS to the last PSS read: 256 MiB touched inside the windows raise the measured peak by
    about that much with no PSS read meanwhile, and the read after the windows confirms it."""
    reads = []
    real = _monitor._tree_memory
    monkeypatch.setattr(_monitor, "_tree_memory", lambda root: reads.append(1) or real(root))
    monitor = Monitor(None, host_period_s=0.05, pss_period_s=3600).start()
    try:
        _until(lambda: len(reads) >= 2)  # warm-up: every sample reads PSS
        before = monitor.host_pss_peak
        monitor.measuring = True
        reads_at_start = len(reads)
        grown = bytearray(256 << 20)  # zero pages become resident only once written
        grown[::4096] = b"x" * len(grown[::4096])
        _until(lambda: monitor.host_pss_peak_measured > before + (200 << 20))
        assert len(reads) - reads_at_start <= 1  # at most the one due as the windows began
        monitor.sample_now()  # after the windows: PSS read once more
        assert len(reads) > reads_at_start and monitor.host_pss_peak_measured > before + (200 << 20)
        del grown
    finally:
        monitor.stop()


def test_processes_that_come_and_go_inside_the_windows_leave_samples_out_rather_than_read_pss(monkeypatch):
    """Loader workers without persistent_workers restart at every epoch's end: the tree's processes change between
    samples. An estimate across that change would count a new process's shared pages whole, and a PSS read at each
    change would cost the step what the rare reads save; so inside the windows such samples are left out (their RSS
    and process count still kept) until the next due PSS read."""
    import subprocess
    import sys

    reads = []
    real = _monitor._tree_memory
    monkeypatch.setattr(_monitor, "_tree_memory", lambda root: reads.append(1) or real(root))
    monitor = Monitor(None, host_period_s=0.05, pss_period_s=3600).start()
    children = []
    try:
        _until(lambda: len(reads) >= 2)
        monitor.measuring = True
        reads_at_start = len(reads)
        for _ in range(6):  # a child started and ended every few samples: a worker restart each time
            children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"]))
            time.sleep(0.15)
            children[-1].wait()
        assert len(reads) - reads_at_start <= 1, len(reads) - reads_at_start  # at most the one due at the start
        assert monitor.max_processes >= 2  # the samples still counted the processes
    finally:
        for child in children:
            child.kill()
        monitor.stop()


def test_the_fork_server_counts_only_for_the_process_it_forked(monkeypatch):
    """TUNEKIT_FORKED_FROM names the server in the child it forked; a process the trial starts (a wrapper script's
    own python) inherits the variable but was not forked by it, and counts no server pages."""
    import os

    monkeypatch.setenv("TUNEKIT_FORKED_FROM", str(os.getppid()))
    assert _monitor.fork_server_pid() == os.getppid()
    monkeypatch.setenv("TUNEKIT_FORKED_FROM", str(os.getpid()))  # any pid but the parent's
    assert _monitor.fork_server_pid() is None
    monkeypatch.delenv("TUNEKIT_FORKED_FROM")
    assert _monitor.fork_server_pid() is None


def _trial(tmp_path: Path, name: str, knobs: dict | None = None, **overrides) -> dict:
    cfg = sleepy_config(**overrides)
    return tunekit.trial(cfg, knobs=knobs, out=tmp_path / name).measurement


def test_an_iterable_dataset_runs_and_unsharded_workers_are_flagged(tmp_path: Path):
    iterable = {"workload.dataset_args": {}, "workload.model_args": {"step_wait_s": 0.002}, "trial.window_s": 0.5}
    sharded = _trial(
        tmp_path,
        "sharded",
        {"num_workers": 2, "batch_size": 8},
        **{"workload.dataset": "tests._workloads:sharded_stream", **iterable},
    )
    assert sharded.status == "ok", sharded
    # (a loaded box adds its own warnings: other processes' CPU use)
    assert not [w for w in sharded.warnings if "identical" in w], sharded.warnings
    assert sharded.dataset_len is None and not sharded.epoch_boundary_in_trial
    unsharded = _trial(
        tmp_path,
        "unsharded",
        {"num_workers": 2, "batch_size": 8},
        **{"workload.dataset": "tests._workloads:unsharded_stream", **iterable},
    )
    assert unsharded.status == "ok", unsharded
    (warning,) = [w for w in unsharded.warnings if "get_worker_info" in w]
    assert "workers 0, 1" in warning and "identical" in warning and "get_worker_info" in warning


def _batch8_spec(cfg: dict, **knobs) -> TrialSpec:
    return TrialSpec(
        number=0,
        stage=Stage.single,
        mode=Mode.train,
        knobs=Knobs(batch_size=8, **knobs),
        config=config.from_dict(cfg).to_dict(),
    )


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        ("0", "returned 0 for a batch"),
        ("-3", "returned -3"),
        ("float('nan')", "returned nan"),
        ("'many'", "returned str 'many'"),
    ],
)
def test_a_count_hook_that_returns_no_positive_number_is_named(tmp_path: Path, write_config, returned, said):
    module = tmp_path / "badcount.py"
    module.write_text(f"def count(batch):\n    return {returned}\n")
    cfg = sleepy_config(**{"workload.count": f"{module}:count", "trial.window_s": 0.3})
    m = run_trial(_batch8_spec(cfg), tmp_path / "t", 60)
    assert m.status == "crashed" and "workload.count" in m.reason and said in m.reason, m.reason
    assert "ZeroDivisionError" not in m.reason


@pytest.mark.alone
def test_a_trial_on_a_machine_other_processes_keep_busy_names_them(tmp_path: Path):
    """Busy loops outside the trial's tree, one per usable CPU: the trial measures the cores they took, warns, and
    its verdict is shared-host with CPU advice (no GPU here)."""
    import subprocess
    import sys

    from tunekit.diagnosis import trial_verdicts
    from tunekit.records import rows_from_measurements

    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(config.cpu_count())]
    try:
        m = run_trial(_batch8_spec(sleepy_config(**{"trial.window_s": 0.5})), tmp_path / "t", 60)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert m.status == "ok", m.reason
    assert m.other_cpu_cores > 0.5 * config.cpu_count(), m.other_cpu_cores
    assert any("other processes kept" in w and "usable CPUs busy" in w for w in m.warnings)
    verdict = trial_verdicts(rows_from_measurements([m]), config.Selection())[0]
    assert verdict.name == "shared-host" and "nvidia-smi" not in verdict.fix
