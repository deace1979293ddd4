"""Step timing and per-step memory: Bridge's train-step callbacks and the optimizer step.

Bridge's ``train()`` calls ``on_train_step_start`` / ``on_train_step_end`` callbacks (a
``CallbackManager``); the meters here register there and time each step CUDA-synchronised.
:func:`train_measured` also wraps the optimizer's ``step`` for the length of ``train()``, so that
memory after forward/backward and after the optimizer step are recorded apart
(``StepMeter.before_optimizer`` / ``after_optimizer``). ``StepMeter`` writes the rehearsal report's
per-step records; ``SmokeStepMeter`` the smoke rank record's ``steps``.

``rehearse --perf`` hands the meter a :class:`PerfClock`: after the warm-up steps, each step is
timed with CUDA events (start, end of forward/backward, end of the optimizer step, end) and the
collective recorder is switched on for exactly those steps. On timed steps the meter takes no
memory snapshots between forward/backward and the optimizer step: a snapshot synchronises the
GPU, which would stall the host's kernel launches inside the time being measured.
"""

from __future__ import annotations

import math
import time

from .measure import Mem
from .report import GIB, Report, progress


def step_loss(ctx) -> float | None:
    """The step's reduced loss from a train-step callback context: the first entry of its loss
    dict whose name holds "loss" (else the first entry); None when the dict is empty. Raises when
    the value is not a number."""
    if not ctx.loss_dict:
        return None
    key = next((k for k in ctx.loss_dict if "loss" in k), next(iter(ctx.loss_dict)))
    return float(ctx.loss_dict[key])


class PerfClock:
    """CUDA-event timing of the steps after ``warmup`` (``rehearse --perf``), and the recorder's switch.

    Per timed step: the whole step, forward/backward (start to the optimizer step) and the optimizer
    step, in seconds. The recorder (``collectives.CollectiveRecorder``) records on timed steps only
    and is told the region (forward/backward, optimizer) as the step goes.
    """

    def __init__(self, warmup: int, recorder=None, profiler=None):
        self.warmup = int(warmup)
        self.recorder = recorder
        self.profiler = profiler  # kernel_profile.StepProfiler (--profile): started with the first timed step
        self.records: list[dict] = []
        self._ev: dict | None = None
        self._iter: int | None = None

    def timed(self, iteration: int) -> bool:
        return iteration > self.warmup

    def start(self, iteration: int) -> None:
        import torch

        self._iter = iteration
        self._ev = None
        rec = self.recorder
        if not self.timed(iteration):
            if rec is not None:
                rec.active = False
            return
        if rec is not None:
            rec.step, rec.region, rec.active, rec.last_sched = iteration, "fwd_bwd", True, None
        if self.profiler is not None:
            self.profiler.step_started()
        self._ev = {"start": torch.cuda.Event(enable_timing=True)}
        self._ev["start"].record()

    def _mark(self, name: str) -> None:
        import torch

        if self._ev is not None and name not in self._ev:
            self._ev[name] = torch.cuda.Event(enable_timing=True)
            self._ev[name].record()

    def before_optimizer(self) -> None:
        if self.recorder is not None:
            self.recorder.region = "optimizer"
        self._mark("opt_start")

    def after_optimizer(self) -> None:
        if self.recorder is not None:
            self.recorder.region = "other"
        self._mark("opt_end")

    def end(self) -> dict | None:
        """Record the step's end, wait for it, and return the timed step's durations (None in warm-up)."""
        if self.recorder is not None:
            self.recorder.active = False
            self.recorder.region = "other"
        ev = self._ev
        if ev is None:
            return None
        self._mark("end")
        self._ev = None
        ev["end"].synchronize()

        def span(a: str, b: str):
            return ev[a].elapsed_time(ev[b]) / 1e3 if a in ev and b in ev else None

        out = {
            "iteration": self._iter,
            "step_s": span("start", "end"),
            "fwd_bwd_s": span("start", "opt_start"),
            "optimizer_s": span("opt_start", "opt_end"),
        }
        self.records.append(out)
        return out


class StepMeter:
    """Per step: memory after forward/backward (its peak), after the optimizer step (its
    peak), between steps; wall time; loss and grad norm. With a :class:`PerfClock`, CUDA-event
    times of the steps after warm-up (and no mid-step memory snapshots on those steps)."""

    def __init__(self, report: Report, mem: Mem, clock: PerfClock | None = None):
        self.report = report
        self.mem = mem
        self.clock = clock
        self.steps: list[dict] = []
        self.cur: dict | None = None
        self._t0 = None

    def _timed(self) -> bool:
        return self.clock is not None and self.cur is not None and self.clock.timed(self.cur["iteration"])

    def start(self, ctx):
        import torch

        torch.cuda.synchronize()
        self.mem.reset()
        self.cur = {"iteration": int(ctx.state.train_state.step) + 1, "phase": "forward_backward"}
        self.report.data["phases"]["train"]["current"] = self.cur
        self._t0 = time.perf_counter()
        if self.clock is not None:
            self.clock.start(self.cur["iteration"])

    def before_optimizer(self):
        if self.cur is None:
            return
        if self.clock is not None:
            self.clock.before_optimizer()
        if self._timed():
            self.cur["phase"] = "optimizer_step"
            return
        s = self.mem.snap()
        self.cur.update(
            after_fwd_bwd_bytes=s["allocated_bytes"],
            peak_fwd_bwd_bytes=s["peak_allocated_bytes"],
            phase="optimizer_step",
        )

    def after_optimizer(self):
        if self.cur is None:
            return
        if self.clock is not None:
            self.clock.after_optimizer()
        if self._timed():
            self.cur["phase"] = "step_end"
            return
        s = self.mem.snap()
        self.cur.update(
            after_optimizer_step_bytes=s["allocated_bytes"],
            peak_optimizer_step_bytes=s["peak_allocated_bytes"],
            phase="step_end",
        )

    def end(self, ctx):
        import torch

        timed = self.clock.end() if self.clock is not None else None
        torch.cuda.synchronize()
        dt = time.perf_counter() - self._t0
        s = self.mem.snap()
        try:
            loss = step_loss(ctx)
        except Exception:
            loss = None
        rec = dict(self.cur or {})
        rec.pop("phase", None)
        rec.update(
            time_s=round(dt, 4),
            between_steps_bytes=s["allocated_bytes"],
            peak_step_end_bytes=s["peak_allocated_bytes"],
            reserved_bytes=s["reserved_bytes"],
            loss=loss,
            grad_norm=None if ctx.grad_norm is None else as_float(ctx.grad_norm),
            skipped=bool(ctx.skipped_iter),
        )
        if timed is not None:
            rec["cuda_event_s"] = {k: v for k, v in timed.items() if k != "iteration"}
        self.steps.append(rec)
        self.cur = None
        self.report.data["phases"]["train"]["steps_done"] = len(self.steps)
        self.report.data["phases"]["train"].pop("current", None)
        self.report.data.setdefault("memory", {})["steps"] = self.steps
        self.report.write()
        progress(
            f"step {rec['iteration']}: {dt:.2f} s, loss {loss}, between steps {s['allocated_bytes'] / GIB:.2f} GiB, "
            f"peak fwd/bwd {rec.get('peak_fwd_bwd_bytes', 0) / GIB:.2f} GiB"
        )


def as_float(v):
    try:
        return float(v)
    except Exception:
        return None


def train_measured(so, manager, meter, forward_step) -> list[dict]:
    """Bridge's train() with the optimizer step wrapped, so that memory after
    forward/backward and after the optimizer step are recorded apart."""
    opt = so.optimizer
    orig_step = opt.step

    def step(*args, **kwargs):
        meter.before_optimizer()
        out = orig_step(*args, **kwargs)
        meter.after_optimizer()
        return out

    opt.step = step
    try:
        run_train(so, manager, forward_step)
    finally:
        opt.step = orig_step
    return meter.steps


def run_train(so, manager, forward_step) -> None:
    """Bridge's ``train()`` on what ``setup()`` returned (``so``), with the callbacks of ``manager``."""
    from megatron.bridge.training.train import train

    train(
        forward_step,
        so.model,
        so.optimizer,
        so.scheduler,
        so.train_data_iterator,
        so.valid_data_iterator,
        so.state,
        so.checkpoint_manager,
        so.pg_collection,
        callback_manager=manager,
    )


WARMUP_STEPS = 2  # the first steps include kernel autotuning and allocator growth; left out of step time


class SmokeStepMeter:
    """Callback functions: CUDA-synchronised wall time and reduced loss per step."""

    def __init__(self):
        self.steps: list[dict] = []
        self._t0 = None

    def start(self, ctx):
        import torch

        torch.cuda.synchronize()
        self._t0 = time.perf_counter()

    def end(self, ctx):
        import torch

        torch.cuda.synchronize()
        dt = time.perf_counter() - self._t0
        loss = step_loss(ctx)
        # Allocated memory between steps: activations are freed, so this is the model
        # state (weights, gradient buffers, fp32 master weights, Adam moments) plus any
        # buffers the strategy keeps; the figure the memory estimator's model state predicts.
        self.steps.append(
            {
                "iteration": int(ctx.state.train_state.step),
                "time_s": dt,
                "loss": loss,
                "skipped": bool(ctx.skipped_iter),
                "allocated_bytes": torch.cuda.memory_allocated(),
                "grad_norm": None if ctx.grad_norm is None else float(ctx.grad_norm),
            }
        )


def summarise_steps(steps: list[dict], tokens_per_step: int) -> dict:
    timed = [s["time_s"] for s in steps[WARMUP_STEPS:]] or [s["time_s"] for s in steps]
    timed = sorted(timed)
    median = timed[len(timed) // 2] if timed else None
    losses = [s["loss"] for s in steps if s["loss"] is not None]
    final = losses[-1] if losses else None
    return {
        "iterations": len(steps),
        "final_loss": final,
        "finite": final is not None and all(math.isfinite(x) for x in losses),
        "step_time_s_median": median,
        "tokens_per_s": (tokens_per_step / median) if median else None,
        "timed_from_step": WARMUP_STEPS + 1,
        "model_state_bytes": steps[-1]["allocated_bytes"] if steps else None,
    }
