"""The meter: what one measurement is, around any stream of batches and the step that consumes them.

The meter wraps an iterator of batches and hands them on (``for batch in meter: step(batch)``). Asking it for the
next batch is the signal that the step on the one before is done: the time spent inside that request is data wait,
and the time from a batch handed out to the next request is the step, spanned on CUDA by a pair of events (GPU
busy). It knows nothing about how the loader or the step were built; it reads the device only to synchronise at
window edges. What it does, in order (docs/measurement.md, "Fidelity rules"):

1. The first batch and its step are timed apart (start-up, compilation).
2. The pipeline fill is set aside: the batches the source shows ready in its queues after the first step (at most
   ``fill``) are taken without a step. A source that shows no queues has none set aside.
3. Warm-up steps, ending once they have taken a window's time (but at least one, three when compiling).
4. Timed windows of whole optimizer steps and whole loader rounds (whole epochs, when the source's epochs take at
   most two windows' time), until ``rules.window_stop`` says stop (a fixed count, the precision reached, or
   the interval wholly below the rate the trial needs); then ``rules.settling`` cuts the leading windows that were
   still settling.
5. Epoch-aware (script mode): each epoch boundary is measured apart and left out of the windows, which then hold
   the steady rate inside an epoch. A boundary spans from the request that crossed the source's epoch end (the
   loader's restart, then the script's evaluation, checkpoint and logging before its loop takes the batch) to the
   consumer's return from the step on the new epoch's batch ``fill + 1``: the batches the pipeline made ready
   meanwhile come in a burst that belongs to the boundary, not to the steady rate. Its cost is the span less those
   batches' items at the steady rate. The windows go on until one boundary is seen when the epoch's end is near
   enough (``boundary_wait_s``); the trial's figure is then the rate over whole epochs (:func:`whole_epoch`).
   An epoch with too few batches outside its boundary for a window (one batch: all boundary), or, without a length,
   two boundaries closing inside one window, is measured in whole-epoch windows instead (step 4).

The ranks of a multi-rank trial take every decision together (``ranks.any``, ``ranks.max``): they reach the same
checkpoints, since they step in lockstep.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from tunekit import rules
from tunekit.worker.meter._loader import tensors
from tunekit.worker.meter._monitor import TreeCpu
from tunekit.worker.meter._reading import (
    FEW_BOUNDARIES,
    MeterSettings,
    OneProcess,
    Ranks,
    Reading,
    SourceEnded,
    Window,
)

__all__ = ["Meter", "checked_count", "MIN_WINDOW_STEPS", "EPOCH_WINDOWS"]

MIN_WINDOW_STEPS = 3
"""A window lasts at least the window time and at least this many optimizer steps: with second-long steps a
window of two or three steps quantises throughput too coarsely to be stable."""


EPOCH_WINDOWS = 2
"""Windows hold whole epochs when an epoch takes at most this many windows' time (``window_s``): a window is then
at most this much longer than ``window_s``, and each holds the same share of the epochs' ends."""


class Meter:
    """Measure the step that consumes ``batches``: iterate the meter instead of the batches.

    Args:
        batches: the source of batches.
        settings: warm-up, windows and stops.
        device: synchronised at window edges; CUDA events span the steps on a CUDA device.
        count: items a batch holds, in the workload's unit.
        cpu: the process tree's CPU time, read at window edges.
        ranks: how the trial's processes decide together.
        ready: batches the source holds ready without a wait; None when it cannot tell.
        epochs: epochs the source has ended (the set-aside stops at an epoch's end).
        device_wait: seconds the source's fetches so far waited on a stream ahead's device work.
        window_done: called after each window's closing synchronisation (a loss check may raise there).
        measuring: called once, after the warm-up and right before the first window.
        epoch_aware: measure the source's epoch boundaries apart (step 5).
    """

    def __init__(
        self,
        batches: Iterator[Any],
        settings: MeterSettings,
        *,
        device: torch.device,
        count: Callable[[Any], float],
        cpu: TreeCpu,
        ranks: Ranks | None = None,
        ready: Callable[[], int | None] = lambda: None,
        epochs: Callable[[], int] = lambda: 0,
        device_wait: Callable[[], float] = lambda: 0.0,
        window_done: Callable[[], None] = lambda: None,
        measuring: Callable[[], None] = lambda: None,
        epoch_aware: bool = False,
    ):
        self._batches, self.settings, self.device = batches, settings, device
        self._count, self._cpu, self._ranks = count, cpu, ranks or OneProcess()
        self._ready, self._epochs, self._device_wait = ready, epochs, device_wait
        self._span: int | None = None
        """Micro-batches a window's length is a multiple of, decided at the first window's end (`_window_span`)."""
        self._window_done, self._measuring = window_done, measuring
        self.reading = Reading(epoch_aware=epoch_aware)
        self._requested = 0
        self._open: list[float] | None = None
        """Epoch-aware: the boundary under way, as [start, items, batches left in it]."""
        self._in_epoch = 0
        """Batches taken in the source's current epoch."""
        self._last_epoch = 0
        """Batches the source's last whole epoch held (what a source without a length showed)."""
        self._restart = False
        """Epoch-aware: the windows so far are dropped (epochs turned out too short to measure inside them)."""
        self._pace: float | None = None
        """Seconds a batch took in the warm-up steps (whether an epoch is short, before the windows), when there were
        at least ``MIN_WINDOW_STEPS`` of them; else the first window decides (`_window_span`)."""

    def __iter__(self) -> Iterator[Any]:
        return self._run()

    def _next(self) -> Any:
        self._requested += 1
        self._ranks.mark(self._requested, False)
        aware = self.reading.epoch_aware
        epochs, asked = (self._epochs(), time.perf_counter()) if aware else (0, 0.0)
        try:
            batch = next(self._batches)
        except StopIteration:
            raise SourceEnded("the batches ended before the measurement was complete") from None
        self._ranks.mark(self._requested, True)
        if aware and self._epochs() != epochs:  # this batch opens the next epoch
            if self._open is not None:  # the last one still under way (an epoch shorter than the pipeline)
                self._open[2] = 1
                self._stepped(0.0)
            span = self._boundary_batches(self.settings.epoch_batches)
            self._open, self._last_epoch, self._in_epoch = [asked, 0.0, float(span)], self._in_epoch, 1
        else:
            self._in_epoch += 1
        return batch

    def _boundary_batches(self, epoch: int | None) -> int:
        """The batches an epoch boundary spans (step 5): the pipeline's fill and one, at most half an epoch."""
        return min(self.settings.fill + 1, max(1, epoch // 2)) if epoch else self.settings.fill + 1

    def _too_short_inside(self, epoch: int | None) -> bool:
        """Whether an epoch of ``epoch`` batches leaves too few outside its boundary for a window's fewest steps:
        then only windows of whole epochs measure it (a one-batch epoch is all boundary)."""
        return bool(epoch) and epoch - self._boundary_batches(epoch) < MIN_WINDOW_STEPS * self.settings.grad_accum

    def _stepped(self, items: float) -> tuple[float, float] | None:
        """The consumer is back from a step on a batch of the boundary under way: its items join it, and after its
        last batch the boundary closes; returns its span (s) and items then."""
        if self._open is None:
            return None
        self._open[1] += items
        self._open[2] -= 1
        if self._open[2] > 0:
            return None
        start, items, _ = self._open
        self._open = None
        closed = (time.perf_counter() - start, items)
        self.reading.boundaries.append(closed)
        return closed

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _run(self) -> Generator[Any, None, None]:
        reading, t0 = self.reading, time.perf_counter()
        batch = self._next()
        reading.first_batch_wait_s = time.perf_counter() - t0
        reading.batch_bytes = sum(t.numel() * t.element_size() for t in tensors(batch)) or None
        yield batch
        self._sync()
        reading.first_step_s = time.perf_counter() - t0
        reading.set_aside = self._set_aside()
        trained = yield from self._warm_up_steps()
        self._sync()
        reading.warmup_batches = reading.set_aside + trained
        reading.warmup_s = time.perf_counter() - t0
        self._measuring()
        yield from self._windows()

    def _set_aside(self) -> int:
        """Take the batches made during start-up and the first step, which wait ready in the source's queues (at
        most the fill), without a step; return how many. From there batches arrive at the pipeline's own rate: a
        step on a ready batch would count throughput the pipeline cannot sustain. The set-aside stops at an epoch's
        end (a finite stream's end markers sit in the queues like batches)."""
        taken, epoch = 0, self._epochs()
        while taken < self.settings.fill and self._epochs() == epoch and (self._ready() or 0) > 0:
            self._next()
            taken += 1
        self._open = None  # a batch set aside is never handed out: it opens no boundary of the consumer's
        return taken

    def _warm_up_steps(self) -> Generator[Any, None, int]:
        """The warm-up steps, for at most a window's time once the fewest are done (a step of seconds has nothing
        left to warm; what still settles shows in the first windows). The trained batches, the first included,
        make whole optimizer steps; returns their count."""
        s = self.settings
        steps = max(s.warmup_steps, 3) if s.compiling else s.warmup_steps
        fewest = min(steps, 3 if s.compiling else 1)
        for _ in range(s.grad_accum - 1):  # the rest of the first batch's optimizer step
            yield from self._warm_up_batch()
        trained, started = s.grad_accum, time.perf_counter()
        for done in range(steps):
            if done >= fewest and self._ranks.any(time.perf_counter() - started >= s.window_s):
                break
            for _ in range(s.grad_accum):
                yield from self._warm_up_batch()
            trained += s.grad_accum
        if trained - s.grad_accum >= MIN_WINDOW_STEPS:  # fewer may have come ready from the queues: no pace
            self._pace = (time.perf_counter() - started) / (trained - s.grad_accum)
        return trained

    def _warm_up_batch(self) -> Generator[Any, None, None]:
        """A trained batch of the warm-up; one that belongs to an epoch boundary under way is counted in it."""
        batch = self._next()
        inside = self._open is not None
        yield batch
        if inside:
            self._stepped(self._count(batch))

    def _windows(self) -> Generator[Any, None, None]:
        """The windows until ``rules.window_stop`` stops them, then the settling cut."""
        s, windows, pace = self.settings, [], self._pace
        if (
            self.reading.epoch_aware
            and s.epoch_batches
            and self._ranks.any(
                self._too_short_inside(s.epoch_batches)
                or (pace is not None and s.epoch_batches * pace <= EPOCH_WINDOWS * s.window_s)
            )
        ):
            # epochs of at most two windows, or too few batches outside their boundary: windows of whole epochs
            # hold the boundaries in their share, and the figure is the rate over whole epochs directly (step 4)
            self.reading.epoch_aware, self._open = False, None
            self.reading.boundaries.clear()
        dropped_s = 0.0
        while True:
            windows.append((yield from self._window()))
            if self._restart:  # epochs too short to measure inside, seen only now (`_window_ends`, the ranks
                # together): whole-epoch windows from here
                self._restart, dropped_s = False, dropped_s + sum(w.wall_s + w.boundary_s for w in windows)
                windows.clear()
                continue
            items, seconds = [w.items for w in windows], [w.wall_s for w in windows]
            reason = rules.window_stop(
                items, seconds, s.measure_windows, s.max_windows, s.precision, s.needed, s.baseline
            )
            if not self._ranks.any(reason is None or self._boundary_near(windows)):
                break
        self.reading.windows_end = time.perf_counter()
        rates = [w.rate for w in windows]
        drop = self._ranks.max(rules.settling(rates, s.measure_windows, s.precision) if s.precision is not None else 0)
        kept = windows[drop:]
        settling_s = sum(w.wall_s for w in windows[:drop])
        self.reading.windows = kept
        if s.epoch_batches and kept:  # one epoch's items, at the items a measured batch held
            self.reading.epoch_items = s.epoch_batches * sum(w.items for w in kept) / sum(w.micro_batches for w in kept)
        self.reading.warmup_s += settling_s + dropped_s  # windows cut as still settling were warm-up after all
        self.reading.warmup_batches += sum(w.micro_batches for w in windows[:drop])
        self.reading.stop = {
            "stop_reason": reason,
            "windows_measured": len(windows),
            "settling_windows": rates[:drop],
            "settling_s": settling_s,
            "rate_interval": rules.rate_interval([w.items for w in kept], [w.wall_s for w in kept]),
        }

    def _boundary_near(self, windows: list[Window]) -> bool:
        """Epoch-aware, before the trial has seen ``FEW_BOUNDARIES`` epoch boundaries: whether the current epoch
        ends soon enough at the windows' pace (``BOUNDARY_WAIT``, ``boundary_wait_s``): then the windows go on to see
        it."""
        s = self.settings
        if self._open is not None:  # one under way: the windows go on to its end
            return True
        if (
            len(self.reading.boundaries) >= FEW_BOUNDARIES
            or not self.reading.epoch_aware
            or not s.epoch_batches
            or not s.boundary_wait_s
        ):
            return False
        measured = sum(w.wall_s for w in windows)
        per_batch = measured / max(1, sum(w.micro_batches for w in windows))
        return (s.epoch_batches - self._in_epoch) * per_batch <= min(s.boundary_wait_s, s.boundary_patience * measured)

    def _window_span(self, elapsed: float, batches: int) -> int:
        """What a window's micro-batches are a multiple of, decided once, when the first window has lasted its time:
        whole epochs of the source when an epoch takes at most twice a window's time (at the first window's pace; a
        window then lasts at most ``window_s`` and one epoch, three times ``window_s``), else whole loader rounds.
        Any run of k epochs' batches holds k epoch ends, so windows of whole epochs each hold the same share of what
        an epoch end costs (a drained and refilled pipeline, a worker restart, the script's own work between
        epochs); windows that cut epochs would hold 0, 1 or 2 such ends and spread by their cost. The ranks decide
        together."""
        epoch = self._ranks.max(self.settings.epoch_batches or 0)  # one span for all ranks, or windows part
        short = epoch > 0 and (
            epoch * elapsed / batches <= EPOCH_WINDOWS * self.settings.window_s or self._too_short_inside(epoch)
        )
        if self._ranks.any(short):  # epoch-aware too, once the first window shows epochs that short (the warm-up's
            # pace did not): their boundaries stay inside whole-epoch windows
            self.reading.epoch_aware, self._open = False, None
            self.reading.boundaries.clear()
            self.reading.epoch_batches = epoch
            return epoch
        return self.settings.round_batches

    def _window(self) -> Generator[Any, None, Window]:
        """One window. It ends on a whole round of the loader's workers: batch j and batch j + workers come from the
        same worker, so a window of whole rounds spans whole production periods of each, and lockstep workers
        delivering in bursts cannot alias with the window's edges. With epochs of at most two windows it ends on
        whole epochs instead (`_window_span`; each epoch starts its workers' round afresh)."""
        s, cuda = self.settings, self.device.type == "cuda"
        self._cpu.begin()
        self._sync()
        t0, device0, steps, tally = time.perf_counter(), self._device_wait(), 0, _Tally()
        while True:
            for _ in range(s.grad_accum):
                yield from self._take(tally, cuda)
            steps += 1
            if self._window_ends(steps, time.perf_counter() - t0, tally):
                break
        self._sync()
        wall = time.perf_counter() - t0
        if self.reading.epoch_aware:  # the boundaries' time, batches and items are theirs
            wall, steps = wall - tally.boundary_s, steps - tally.left_out // s.grad_accum
        else:  # whole-epoch windows after all (short epochs): everything the window held is its
            tally.items, tally.boundary_s = tally.items + tally.left_items, 0.0
        used = self._cpu.end()
        self._window_done()
        busy = sum(a.elapsed_time(b) for a, b in tally.events) / 1000.0 if cuda else None
        device_wait = self._device_wait() - device0
        return Window(
            wall,
            steps,
            tally.items,
            steps * s.grad_accum,
            tally.wait_s - device_wait,
            busy,
            used,
            device_wait,
            tally.boundary_s,
        )

    def _take(self, tally: _Tally, cuda: bool) -> Generator[Any, None, None]:
        """One micro-batch of a window: fetched, handed out (its step spanned by CUDA events), counted; a batch of
        an epoch boundary under way is the boundary's (its wait, step and items)."""
        asked, seen = time.perf_counter(), len(self.reading.boundaries)
        batch = self._next()
        inside = self._open is not None
        counted = self._count(batch)
        if inside:
            yield batch
            tally.left_out, tally.left_items = tally.left_out + 1, tally.left_items + counted
            self._stepped(counted)
            closed = self.reading.boundaries[seen:]  # this one's, and one a new epoch cut short (`_next`)
            tally.boundary_s += sum(span for span, _ in closed)
            tally.closed += len(closed)
            return
        tally.wait_s += time.perf_counter() - asked
        tally.items += counted
        if not cuda:
            yield batch
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield batch
        end.record()
        tally.events.append((start, end))

    def _window_ends(self, steps: int, elapsed: float, tally: _Tally) -> bool:
        """Whether the window ends after this optimizer step: at least ``MIN_WINDOW_STEPS``, a whole span, no
        boundary under way, and ``window_s`` passed on every rank. The first window counts wall time (epochs shorter
        than two windows show there, boundaries and all) and decides the span; the later ones count steady time when
        the boundaries are measured apart."""
        s = self.settings
        span = s.round_batches if self._span is None else self._span
        if self._span is not None and self.reading.epoch_aware:
            elapsed -= tally.boundary_s
        if self.reading.epoch_aware and tally.closed >= FEW_BOUNDARIES:
            self._whole_epochs_after_all()  # the ranks see the same epochs (they step in lockstep)
            return False
        if (
            steps < MIN_WINDOW_STEPS
            or (steps * s.grad_accum) % span
            or self._open is not None
            or not self._ranks.any(elapsed >= s.window_s)
        ):
            return False
        if self._span is None:
            self._span = self._window_span(elapsed, steps * s.grad_accum)
            return (steps * s.grad_accum) % self._span == 0
        return True

    def _whole_epochs_after_all(self) -> None:
        """Epoch-aware windows that saw ``FEW_BOUNDARIES`` boundaries close inside one window (a source without a
        length whose epochs are too short to measure inside, e.g. all boundary): the windows so far are dropped and
        the next ones hold whole epochs, of the batches the last whole epoch held."""
        epoch = self._ranks.max(self.settings.epoch_batches or self._last_epoch)
        self.reading.epoch_aware, self._open, self._restart = False, None, True
        self.reading.boundaries.clear()
        self._span = self.reading.epoch_batches = max(1, epoch)


@dataclass
class _Tally:
    """What one window has counted so far."""

    wait_s: float = 0.0
    items: float = 0.0
    boundary_s: float = 0.0
    """Epoch-aware: the boundaries closed inside the window."""
    left_out: int = 0
    """Epoch-aware: the boundaries' batches."""
    left_items: float = 0.0
    closed: int = 0
    """Epoch-aware: the boundaries that closed inside the window."""
    events: list[tuple[Any, Any]] = field(default_factory=list)


def checked_count(count: Callable[[Any], Any], key: str) -> Callable[[Any], float]:
    """``count`` as the meter calls it, with what it returns checked: the items a batch holds, a finite number
    above 0 (a 0 would divide the window by nothing; a NaN or a negative one would make the throughput a lie)."""

    def counted(batch: Any) -> float:
        got = count(batch)
        try:
            items = float(got)
        except (TypeError, ValueError):
            raise TypeError(
                f"{key} returned {type(got).__name__} {got!r} for a batch: it must return the items "
                "the batch holds, a number above 0"
            ) from None
        if not math.isfinite(items) or items <= 0:
            raise ValueError(
                f"{key} returned {got!r} for a batch: it must return the items the batch holds, a finite number above 0"
            )
        return items

    return counted
