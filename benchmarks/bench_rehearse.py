#!/usr/bin/env python3
"""Measure rehearsals on one GPU: the memory matrix behind ``mfsdp.py rehearse`` and ``memory``.

Why: a rehearsal claims that one GPU, playing rank R of a world of N with PyTorch's
fake process group, shows what rank R of the real job allocates. This benchmark
runs that claim over the cases users meet (dense Llama at several data-parallel
sizes and every strategy, the 8 B and 70 B trunks, a mixture of experts with expert
parallelism, a hybrid Mamba trunk, LoRA, pipeline parallelism) and keeps, per run,
the engine's full JSON report: per-phase memory, per-step memory, local parameter
and optimizer-state sizes, and what failed where.

How: every run is one ``scripts/rehearse_train.py`` process (fresh allocator, fresh
peak counters), started with its own timeout. Runs share the GPU: several run at
once while their estimated peak memory fits beside each other (``--gpu-budget-gib``)
and at most ``--max-concurrent`` at a time (each process imports Bridge on the CPU).
The matrix is split into groups that each fit one call of a time-limited machine:

* ``A``: llama 1.1 B at N = 1, 2, 8, 64 under DDP, the distributed optimizer and
  Megatron FSDP's three strategies;
* ``B``: the Llama 3 8 B and 70 B trunks, the MoE trunk with EP 8, LoRA, and the
  pipeline-parallel wrap failure;
* ``C``: DDP-vs-FSDP loss parity and checkpoint save/load, rank positions of a
  pipeline, the effect of mirrored collectives and forced routing, then any run of
  A or B that has no report yet;
* ``H``: hybrid Mamba (Nemotron-H): the preset trunk at N = 8 and 64 under Megatron
  FSDP and the distributed optimizer, and Bridge's Nemotron 3 Nano 4B and Nemotron-H
  4B recipes (needs mamba-ssm on the machine; see tests/gpu/README.md).

Runs are ordered by importance inside a group: when the group's time budget
(``--budget-s``) runs out, no new run starts and running ones are stopped, so a
cut-off loses the least important ones. A run whose report exists is not run again
(``--force`` reruns it). Each run leaves ``RESULTS/<name>/report.json`` and a log
tail; the group leaves ``RESULTS/summary_<group>.json``.

    python3 benchmarks/bench_rehearse.py --out RESULTS --group A
    python3 benchmarks/bench_rehearse.py --out RESULTS --group B --list
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import raw_store  # noqa: E402  (beside this script: the raw results are read from their archive)

ENGINE = ROOT / "scripts" / "rehearse_train.py"
GIB = 2**30

# What one H200 offers the matrix: 139 GiB minus room for every process's CUDA
# context (about 0.5 GiB each) and the caching allocator's slack.
GPU_BUDGET_GIB = 120.0
MAX_CONCURRENT = 6  # 16 CPU cores; each run imports Bridge (~15 s of one core) and feeds one data worker
GROUP_BUDGET_S = {"A": 360, "B": 330, "C": 240, "H": 400}
LOG_TAIL_LINES = 300  # keep result files small: the report holds the numbers


@dataclass
class Run:
    name: str
    args: list[str]
    est_gib: float  # peak memory estimate, for packing runs onto the GPU (measured peaks plus reserve slack)
    timeout_s: int = 240
    est_s: int = 75  # expected wall time, to decide whether it can still finish in the budget
    why: str = ""
    tags: dict = field(default_factory=dict)


def _dense_est(strategy: str, n: int) -> float:
    """llama 1.1 B peak (GiB) + slack, from the fake-backend table: DDP 22.6 at any N;
    sharded strategies shrink with N."""
    if strategy == "ddp" or n == 1:
        return 27.0
    table = {
        "distopt": {2: 20.0, 8: 15.0, 64: 14.0},
        "optim": {2: 20.0, 8: 15.0, 64: 14.0},
        "optim_grads": {2: 18.0, 8: 12.0, 64: 10.0},
        "optim_grads_params": {2: 16.0, 8: 10.0, 64: 8.0},
    }
    return table[strategy].get(n, 16.0)


def group_a() -> list[Run]:
    """llama 1.1 B, N x strategy; the rows the earlier fake-backend table has come first."""
    order = [
        (1, "ddp"),
        (8, "distopt"),
        (8, "optim_grads_params"),
        (64, "distopt"),
        (64, "optim_grads_params"),
        (8, "ddp"),
        (8, "optim"),
        (8, "optim_grads"),
        (64, "ddp"),
        (64, "optim"),
        (64, "optim_grads"),
        (2, "ddp"),
        (2, "distopt"),
        (2, "optim"),
        (2, "optim_grads"),
        (2, "optim_grads_params"),
        (1, "distopt"),
        (1, "optim"),
        (1, "optim_grads"),
        (1, "optim_grads_params"),
    ]
    runs = []
    for n, strategy in order:
        runs.append(
            Run(
                name=f"A_llama1b_n{n}_{strategy}",
                args=["--model-preset", "llama-1b", "--world-size", str(n), "--strategy", strategy, "--iters", "3"],
                est_gib=_dense_est(strategy, n),
                why="1.1 B grid (seq 2048, MBS 1, bf16, grad_reduce_in_fp32)",
                tags={"model": "llama-1b", "n": n, "strategy": strategy},
            )
        )
    return runs


def group_b() -> list[Run]:
    moe = ["--model-preset", "qwen3-moe-16l"]
    return [
        Run(
            "B_llama70b_n64_optim_grads_params",
            ["--model-preset", "llama3-70b", "--world-size", "64", "--strategy", "optim_grads_params", "--iters", "2"],
            est_gib=96.0,
            timeout_s=330,
            est_s=180,
            why="70 B trunk, meta-device init",
            tags={"model": "llama3-70b", "n": 64, "strategy": "optim_grads_params"},
        ),
        Run(
            "B_llama8b_n8_optim_grads_params",
            ["--model-preset", "llama3-8b", "--world-size", "8", "--strategy", "optim_grads_params", "--iters", "3"],
            est_gib=34.0,
            est_s=110,
            tags={"model": "llama3-8b", "n": 8, "strategy": "optim_grads_params"},
        ),
        Run(
            "B_moe_n8_ep8_optim_grads_params",
            [*moe, "--world-size", "8", "--strategy", "optim_grads_params", "--iters", "3"],
            est_gib=30.0,
            est_s=120,
            why="MoE EP 8, real router, mirrored collectives",
            tags={"model": "qwen3-moe-16l", "n": 8, "strategy": "optim_grads_params", "ep": 8},
        ),
        Run(
            "B_moe_n64_ep8_optim_grads_params",
            [*moe, "--world-size", "64", "--strategy", "optim_grads_params", "--iters", "3"],
            est_gib=14.0,
            est_s=120,
            tags={"model": "qwen3-moe-16l", "n": 64, "strategy": "optim_grads_params", "ep": 8},
        ),
        Run(
            "B_llama8b_n64_optim_grads_params",
            ["--model-preset", "llama3-8b", "--world-size", "64", "--strategy", "optim_grads_params", "--iters", "3"],
            est_gib=16.0,
            est_s=110,
            tags={"model": "llama3-8b", "n": 64, "strategy": "optim_grads_params"},
        ),
        Run(
            "B_lora_llama1b_n8_optim_grads_params",
            [
                "--model-preset",
                "llama-1b",
                "--peft",
                "lora",
                "--world-size",
                "8",
                "--strategy",
                "optim_grads_params",
                "--iters",
                "3",
            ],
            est_gib=12.0,
            why="PEFT: LoRA adapters on random base weights",
            tags={"model": "llama-1b", "n": 8, "strategy": "optim_grads_params", "peft": "lora"},
        ),
        Run(
            "B_pp2_llama1b_n8_optim_grads_params",
            [
                "--model-preset",
                "llama-1b",
                "--world-size",
                "8",
                "--strategy",
                "optim_grads_params",
                "--iters",
                "3",
                "model.pipeline_model_parallel_size=2",
            ],
            est_gib=8.0,
            est_s=60,
            why="expected to fail at the Megatron FSDP wrap with PP > 1",
            tags={"model": "llama-1b", "n": 8, "strategy": "optim_grads_params", "pp": 2},
        ),
        Run(
            "B_moe_n64_ep8_distopt",
            [*moe, "--world-size", "64", "--strategy", "distopt", "--iters", "3"],
            est_gib=22.0,
            est_s=120,
            tags={"model": "qwen3-moe-16l", "n": 64, "strategy": "distopt", "ep": 8},
        ),
        Run(
            "B_lora_llama1b_n64_optim_grads_params",
            [
                "--model-preset",
                "llama-1b",
                "--peft",
                "lora",
                "--world-size",
                "64",
                "--strategy",
                "optim_grads_params",
                "--iters",
                "3",
            ],
            est_gib=10.0,
            tags={"model": "llama-1b", "n": 64, "strategy": "optim_grads_params", "peft": "lora"},
        ),
    ]


def group_c() -> list[Run]:
    return [
        Run(
            "C_parity_llama1b",
            ["--model-preset", "llama-1b", "--parity", "--save-load", "--iters", "5"],
            est_gib=56.0,  # two legs at once, a real world of 1 each
            timeout_s=330,
            est_s=200,
            why="DDP vs Megatron FSDP losses, real NCCL world of 1; the FSDP leg also saves and loads fsdp_dtensor",
            tags={"model": "llama-1b", "n": 1, "parity": True},
        ),
        Run(
            "C_saveload_llama1b_n8_optim_grads_params",
            [
                "--model-preset",
                "llama-1b",
                "--world-size",
                "8",
                "--strategy",
                "optim_grads_params",
                "--iters",
                "2",
                "--save-load",
            ],
            est_gib=12.0,
            timeout_s=300,
            est_s=120,
            why="fsdp_dtensor save/load as rank 0 of 8 under the fake backend",
            tags={"model": "llama-1b", "n": 8, "strategy": "optim_grads_params", "save_load": True},
        ),
        Run(
            "C_pp2_llama1b_n8_ddp_rank0",
            [
                "--model-preset",
                "llama-1b",
                "--world-size",
                "8",
                "--strategy",
                "ddp",
                "--iters",
                "3",
                "model.pipeline_model_parallel_size=2",
            ],
            est_gib=16.0,
            why="pipeline stage 0 (embedding)",
            tags={"model": "llama-1b", "n": 8, "strategy": "ddp", "pp": 2, "rank": 0},
        ),
        Run(
            "C_pp2_llama1b_n8_ddp_rank4",
            [
                "--model-preset",
                "llama-1b",
                "--world-size",
                "8",
                "--rank",
                "4",
                "--strategy",
                "ddp",
                "--iters",
                "3",
                "model.pipeline_model_parallel_size=2",
            ],
            est_gib=16.0,
            why="pipeline stage 1 (output layer): a rank position of its own",
            tags={"model": "llama-1b", "n": 8, "strategy": "ddp", "pp": 2, "rank": 4},
        ),
        Run(
            "C_moe_n8_ep8_optim_grads_params_balanced",
            [
                "--model-preset",
                "qwen3-moe-16l",
                "--world-size",
                "8",
                "--strategy",
                "optim_grads_params",
                "--iters",
                "3",
                "--balanced-routing",
            ],
            est_gib=30.0,
            est_s=120,
            why="forced balanced routing vs the real router (B_moe_n8_ep8_optim_grads_params)",
            tags={"model": "qwen3-moe-16l", "n": 8, "strategy": "optim_grads_params", "ep": 8, "balanced": True},
        ),
        Run(
            "C_llama1b_n8_optim_grads_params_mirror",
            [
                "--model-preset",
                "llama-1b",
                "--world-size",
                "8",
                "--strategy",
                "optim_grads_params",
                "--iters",
                "3",
                "--mirror-collectives",
            ],
            est_gib=10.0,
            why="mirrored collectives on a dense model vs the plain fake backend (A_llama1b_n8_optim_grads_params)",
            tags={"model": "llama-1b", "n": 8, "strategy": "optim_grads_params", "mirror": True},
        ),
        Run(
            "C_moe_n8_ep8_optim_grads_params_plainfake",
            [
                "--model-preset",
                "qwen3-moe-16l",
                "--world-size",
                "8",
                "--strategy",
                "optim_grads_params",
                "--iters",
                "2",
                "--no-mirror-collectives",
            ],
            est_gib=40.0,
            est_s=120,
            why="MoE under the plain fake backend: token counts from unwritten memory (expected to fail or mis-size)",
            tags={"model": "qwen3-moe-16l", "n": 8, "strategy": "optim_grads_params", "ep": 8, "mirror": False},
        ),
    ]


# Bridge recipes of hybrid Mamba models, rehearsed as shipped plus the strategy (module:function).
NANO4B_RECIPE = (
    "megatron.bridge.recipes.nemotronh.h100.nemotron_3_nano_4b:nemotron_3_nano_4b_pretrain_8gpu_h100_bf16_config"
)
NEMOTRONH4B_RECIPE = "megatron.bridge.recipes.nemotronh.h100.nemotronh:nemotronh_4b_pretrain_1gpu_h100_bf16_config"


def group_h() -> list[Run]:
    """Hybrid Mamba (Nemotron-H): the preset trunk at N = 8 and 64 under Megatron FSDP and the
    distributed optimizer, then real Bridge recipes. The first hybrid runs compile mamba-ssm's
    Triton kernels (minutes on a fresh machine; later runs reuse Triton's cache), hence the
    longer time estimates. Recipes keep their own shape and sequence length; their global batch
    is set to one micro-batch per data-parallel rank (the recipe's 1024 or 768 would run hundreds
    of micro-batches per step, with the same memory per micro-batch)."""
    runs = []
    for n, strategy, est in ((8, "optim_grads_params", 16.0), (64, "optim_grads_params", 12.0),
                             (8, "distopt", 26.0), (64, "distopt", 22.0)):  # fmt: skip
        runs.append(
            Run(
                f"H_nemotronh_small_n{n}_{strategy}",
                ["--model-preset", "nemotronh-small", "--world-size", str(n), "--strategy", strategy, "--iters", "3"],
                est_gib=est,
                timeout_s=380,
                est_s=200,
                why="Nemotron-H 4B layer shapes, 26 of its 52 layers (2.0 B), seq 2048, MBS 1",
                tags={"model": "nemotronh-small", "n": n, "strategy": strategy, "hybrid": True},
            )
        )
    for name, recipe, n, est, why in (
        ("H_nano4b_recipe_n8_optim_grads_params", NANO4B_RECIPE, 8, 40.0,
         "Bridge's Nemotron 3 Nano 4B pretrain recipe (seq 4096, asks for the memory-efficient Mamba path)"),
        ("H_nano4b_recipe_n64_optim_grads_params", NANO4B_RECIPE, 64, 32.0, "the same recipe at N = 64"),
        ("H_nemotronh4b_recipe_n8_optim_grads_params", NEMOTRONH4B_RECIPE, 8, 60.0,
         "Bridge's Nemotron-H 4B pretrain recipe (seq 8192; ships with the unfused Mamba path)"),
    ):  # fmt: skip
        runs.append(
            Run(
                name,
                ["--recipe", recipe, "--world-size", str(n), "--strategy", "optim_grads_params", "--iters", "3"]
                + [f"train.global_batch_size={n}"],
                est_gib=est,
                timeout_s=380,
                est_s=220,
                why=why,
                tags={"model": recipe.rpartition(":")[2], "n": n, "strategy": "optim_grads_params", "hybrid": True},
            )
        )
    return runs


GROUPS = {"A": group_a, "B": group_b, "C": group_c, "H": group_h}


def all_runs() -> dict[str, Run]:
    return {r.name: r for g in GROUPS.values() for r in g()}


# --------------------------------------------------------------------------- scheduling (pure)


def pick_next(
    pending: list[Run], used_gib: float, n_running: int, budget_gib: float, max_concurrent: int, time_left_s: float
):
    """The first pending run (in priority order) that fits beside the running ones in
    memory and can finish in the time left; None when nothing can start now. A run
    larger than the whole budget may start alone."""
    if n_running >= max_concurrent:
        return None
    for run in pending:
        if run.est_s > time_left_s:
            continue
        if used_gib + run.est_gib <= budget_gib or (n_running == 0 and run.est_gib > budget_gib):
            return run
    return None


BUDGET_MARKER = "stopped_by_group_budget"  # a run cut off by its group's budget, not by its own fault


def report_done(out: Path, name: str) -> bool:
    """A report with a verdict exists (a run stopped only because its group ran out of time is not done)."""
    path = out / name / "report.json"
    if (out / name / BUDGET_MARKER).exists():
        return False
    try:
        return json.loads(path.read_text()).get("result") in ("passed", "failed")
    except (OSError, ValueError):
        return False


def summarize_report(rep: dict | None) -> dict:
    """The few figures BENCHMARK.md and the memory calibration read, from one report."""
    if not rep:
        return {"result": "no report"}
    mem = rep.get("memory") or {}
    phases = rep.get("phases") or {}
    ff = rep.get("first_failure") or {}
    steps = mem.get("steps") or []

    def gib(v):
        return None if v is None else round(v / GIB, 3)

    out = {
        "result": rep.get("result"),
        "setup_wall_s": rep.get("setup_wall_s"),
        "between_steps_gib": gib(mem.get("between_steps_bytes")),
        "peak_allocated_gib": gib(mem.get("peak_allocated_bytes")),
        "peak_reserved_gib": gib(mem.get("peak_reserved_bytes")),
        "after_model_build_gib": gib((phases.get("model_build") or {}).get("allocated_bytes")),
        "after_model_wrap_gib": gib((phases.get("model_wrap") or {}).get("allocated_bytes")),
        "after_optimizer_gib": gib((phases.get("optimizer") or {}).get("allocated_bytes")),
        "peak_fwd_bwd_gib": gib(max((s.get("peak_fwd_bwd_bytes") or 0 for s in steps), default=None)),
        "peak_optimizer_step_gib": gib(max((s.get("peak_optimizer_step_bytes") or 0 for s in steps), default=None)),
        "local_param_numel": (rep.get("params") or {}).get("local_numel"),
        "local_expert_numel": (rep.get("params") or {}).get("local_expert_numel"),
        "optimizer_state_numel": (rep.get("optimizer_state") or {}).get("state_numel"),
        "process_groups": (rep.get("process_groups") or {}).get("count"),
        "losses": (phases.get("train") or {}).get("losses"),
    }
    if ff:
        out["failure"] = {
            "phase": ff.get("phase"),
            "type": ff.get("type"),
            "message": (ff.get("message") or "")[:400],
            "where": (ff.get("frames") or {}).get("bridge")
            or (ff.get("frames") or {}).get("core")
            or (ff.get("frames") or {}).get("innermost"),
        }
    if rep.get("parity"):
        out["parity"] = rep["parity"]
    if rep.get("save_load"):
        sl = dict(rep["save_load"])
        sl.pop("checkpoint_files", None)
        out["save_load"] = sl
    return out


# --------------------------------------------------------------------------- running


def stamp(msg: str) -> None:
    print(f"[bench_rehearse {_dt.datetime.now(_dt.timezone.utc).strftime('%H:%M:%S')}] {msg}", flush=True)


def child_env() -> dict:
    env = dict(os.environ)
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)  # Megatron FSDP needs it unset or > 1
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="2", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def command(run: Run, out: Path, python: str) -> list[str]:
    return [python, str(ENGINE), *run.args, "--out", str(out / run.name)]


def _trim_log(path: Path) -> None:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return
    if len(lines) > LOG_TAIL_LINES:
        path.write_text(
            f"[... {len(lines) - LOG_TAIL_LINES} earlier lines dropped]\n" + "\n".join(lines[-LOG_TAIL_LINES:]) + "\n"
        )


def _signal(proc: subprocess.Popen, sig) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stop_process_group(proc: subprocess.Popen) -> None:
    """SIGTERM the run's process group (the engine records the phase it was in), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_group(runs: list[Run], out: Path, a) -> dict:
    t0 = time.time()
    deadline = t0 + a.budget_s
    pending = [r for r in runs if a.force or not report_done(out, r.name)]
    skipped = [r.name for r in runs if r not in pending]
    for name in skipped:
        stamp(f"{name}: report present, not run again (--force reruns)")
    running: dict[str, tuple] = {}
    jobs: dict[str, dict] = {}
    while pending or running:
        now = time.time()
        # reap and enforce timeouts / the group deadline
        for name, (proc, run, started, log) in list(running.items()):
            rc = proc.poll()
            if rc is None and now - started > run.timeout_s:  # the group deadline is handled below, for all at once
                stamp(f"{name}: stopping (timeout after {run.timeout_s}s)")
                stop_process_group(proc)
                rc = proc.poll()
                jobs[name]["stopped"] = "timeout"
            if rc is not None:
                log.close()
                _trim_log(out / name / "log.txt")
                for p in (out / name).rglob("*.distcp"):
                    p.unlink(missing_ok=True)
                jobs[name].update(exit_code=rc, wall_s=round(time.time() - started, 1))
                del running[name]
                res = summarize_report(_read(out / name / "report.json"))
                if _oom(res) and jobs[name].get("shared_gpu") and not run.tags.get("_alone"):
                    # out of memory beside other runs: the packing, not the job, may be at fault
                    os.replace(out / name / "report.json", out / name / "report_oom_beside_others.json")
                    alone = Run(
                        run.name,
                        run.args,
                        a.gpu_budget_gib,
                        run.timeout_s,
                        run.est_s,
                        run.why,
                        {**run.tags, "_alone": True},
                    )
                    pending.insert(0, alone)
                    stamp(f"{name}: out of memory beside other runs; queued again to run alone")
                    continue
                stamp(
                    f"{name}: exit {rc} in {jobs[name]['wall_s']:.0f}s, {res.get('result')}, "
                    f"between {res.get('between_steps_gib')} GiB, peak {res.get('peak_allocated_gib')} GiB"
                    + (f", failed in {res['failure']['phase']}: {res['failure']['type']}" if res.get("failure") else "")
                )
        if time.time() > deadline:
            break
        used = sum(r.est_gib for (_p, r, _s, _l) in running.values())
        nxt = pick_next(pending, used, len(running), a.gpu_budget_gib, a.max_concurrent, deadline - time.time())
        if nxt is not None:
            pending.remove(nxt)
            (out / nxt.name).mkdir(parents=True, exist_ok=True)
            (out / nxt.name / BUDGET_MARKER).unlink(missing_ok=True)
            cmd = command(nxt, out, a.python)
            log = open(out / nxt.name / "log.txt", "w")
            proc = subprocess.Popen(
                cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True
            )
            for other in running:
                jobs[other]["shared_gpu"] = True
            running[nxt.name] = (proc, nxt, time.time(), log)
            jobs[nxt.name] = {
                "shared_gpu": len(running) > 1,
                "command": shlex.join(
                    ["python3", os.path.relpath(ENGINE, ROOT), *nxt.args, "--out", f"RESULTS/{nxt.name}"]
                ),
            }
            stamp(
                f"{nxt.name}: started ({len(running)} running, ~{used + nxt.est_gib:.0f} GiB planned, {len(pending)} pending)"
            )
            time.sleep(2)  # stagger imports a little
            continue
        if not running and pending:
            break  # nothing fits in the time left
        time.sleep(1)
    # Out of time: stop everything still running at once (SIGTERM lets each engine record
    # the phase it was in), then SIGKILL what has not exited after a grace period.
    for name, (proc, _run, _started, _log) in running.items():
        stamp(f"{name}: stopping (group budget spent)")
        _signal(proc, signal.SIGTERM)
    grace = time.time() + 15
    while time.time() < grace and any(p.poll() is None for (p, _r, _s, _l) in running.values()):
        time.sleep(0.5)
    for name, (proc, _run, started, log) in list(running.items()):
        if proc.poll() is None:
            _signal(proc, signal.SIGKILL)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        (out / name / BUDGET_MARKER).write_text("stopped when the group's time budget was spent\n")
        log.close()
        _trim_log(out / name / "log.txt")
        for p in (out / name).rglob("*.distcp"):
            p.unlink(missing_ok=True)
        jobs[name].update(exit_code=proc.poll(), wall_s=round(time.time() - started, 1), stopped="group budget spent")
    not_run = [r.name for r in pending]
    for name in not_run:
        stamp(f"{name}: not run (time budget)")
    return {"jobs": jobs, "skipped_present": skipped, "not_run": not_run, "wall_s": round(time.time() - t0, 1)}


def _oom(summary: dict) -> bool:
    return "OutOfMemory" in ((summary.get("failure") or {}).get("type") or "")


def _read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    p.add_argument("--out", required=True, help="results folder (one sub-folder per run); with --summarize, the JSON")
    p.add_argument("--group", choices=sorted(GROUPS), default=None, help="which part of the matrix to run")
    p.add_argument(
        "--summarize",
        metavar="RAW",
        default=None,
        help="run nothing: read the run folders under RAW and write the result JSON to --out",
    )
    p.add_argument(
        "--summarize-cli",
        metavar="RAW",
        default=None,
        help="run nothing: read the recorded output of the 'mfsdp.py rehearse' GPU test and write the result JSON",
    )
    p.add_argument(
        "--budget-s", type=int, default=None, help="seconds for the whole group (default A 360, B 330, C 240)"
    )
    p.add_argument("--gpu-budget-gib", type=float, default=GPU_BUDGET_GIB)
    p.add_argument("--max-concurrent", type=int, default=MAX_CONCURRENT)
    p.add_argument("--python", default=sys.executable, help="interpreter for the runs")
    p.add_argument("--only", default=None, help="comma-separated run names (default: the whole group)")
    p.add_argument("--force", action="store_true", help="rerun runs whose report exists")
    p.add_argument("--list", action="store_true", help="print the group's runs and commands, run nothing")
    p.add_argument(
        "--no-leftovers",
        action="store_true",
        help="group C: do not append the runs of A and B that have no report in --out",
    )
    return p.parse_args(argv)


# The same method measured independently before this benchmark existed (one H200, 2026-12-02: llama 1.1 B,
# seq 2048, MBS 1, bf16), GiB per rank: (N, strategy) -> (allocated between steps, peak allocated).
REFERENCE_1B = {
    (1, "ddp"): (18.61, 22.57),
    (8, "distopt"): (7.81, 11.77),
    (8, "optim_grads_params"): (3.83, 7.21),
    (64, "distopt"): (6.46, 10.42),
    (64, "optim_grads_params"): (1.59, 5.44),
}
REFERENCE_TOLERANCE = 0.03  # a rehearsal agrees with the reference when both figures are within 3 %


def _model_label(source) -> str:
    """'preset llama-1b' -> 'llama-1b'; 'recipe module:function' -> 'recipe function'."""
    text = str(source or "")
    if text.startswith("recipe "):
        return "recipe " + text.rpartition(":")[2]
    return text.replace("preset ", "")


def _current_deviations(deviations: list[dict], run_dir: Path) -> list[dict]:
    """A run's deviations, with the unfused-Mamba allowance re-derived from its ``run_config.yaml``
    by today's ``mfsdp_gpu.mamba.unfused_mamba_extra_bytes``.

    Why: the allowance is a computed figure, not a measurement, and a reader subtracts it from the
    measured peak; a run recorded with an older, larger count would make that subtraction
    under-predict production. What the run itself stated stays beside it (``stated_by_run_bytes``).
    """
    dev = next((x for x in deviations if x.get("id") == "mamba-mem-eff-path-off"), None)
    cfg = run_dir / "run_config.yaml"
    if dev is None or not cfg.is_file():
        return deviations
    from types import SimpleNamespace

    sys.path.insert(0, str(ROOT / "scripts"))
    from mfsdp_gpu.mamba import unfused_mamba_effect, unfused_mamba_extra_bytes
    from mfsdp_lib import config_io

    built = config_io.load_yaml(str(cfg))
    extra = unfused_mamba_extra_bytes(SimpleNamespace(**built.get("model", {})), built["train"]["micro_batch_size"])
    if extra == dev.get("extra_activation_bytes"):
        return deviations
    fixed = {
        **dev,
        "extra_activation_bytes": extra,
        "memory_effect": unfused_mamba_effect(extra),
        "stated_by_run_bytes": dev.get("extra_activation_bytes"),
    }
    return [fixed if x is dev else x for x in deviations]


def summarize_raw(raw: Path) -> dict:
    """The result JSON behind BENCHMARK.md's rehearsal section, from the recorded run folders.

    Each run folder is read the way ``mfsdp.py rehearse`` reads a fresh one
    (``mfsdp_lib.runs.rehearse``): verdict, first failure with its rule id and fix, measured
    memory beside ``memory``'s prediction, the NCCL allowance. The llama 1.1 B runs are also
    held against ``REFERENCE_1B``.
    """
    sys.path.insert(0, str(ROOT / "scripts"))
    from mfsdp_lib.runs import rehearse as rh

    runs: dict[str, dict] = {}
    summaries: dict[str, dict] = {}
    harness: dict[str, str] = {}  # run -> the bench_rehearse command whose output folder holds it (a rerun wins)
    for f in sorted(raw.glob("summary_*.json")):
        data = _read(f) or {}
        summaries.update(data.get("runs") or {})
        for name in data.get("runs") or {}:
            harness[name] = str(data.get("command") or "")
    for d in sorted(p for p in raw.iterdir() if p.is_dir()):
        rep = _read(d / "report.json")
        if not isinstance(rep, dict):
            continue
        command = "python3 scripts/rehearse_train.py " + shlex.join(rep.get("argv") or [])
        if rep.get("mode") == "parity":
            runs[d.name] = {"kind": "parity", "command": command, **rh.summarize_parity(rep)}
            continue
        s = rh.summarize_run(rep, str(d))
        row = {
            "kind": "rank",
            "why": (summaries.get(d.name) or {}).get("why"),
            "command": command,
            "harness_command": harness.get(d.name),
            **{k: s[k] for k in ("rank", "world_size", "strategy", "source", "result", "memory", "predicted")},
            "failure": s["failure"],
            "nccl": s["nccl"],
            "moe": s["moe"],
            "save_load": s["save_load"],
            "deviations": _current_deviations(s["deviations"], d),
        }
        ref = REFERENCE_1B.get((s["world_size"], s["strategy"]))
        req = rep.get("request") or {}
        plain = not req.get("peft") and not req.get("overrides") and not req.get("rank")
        if ref and s["result"] == "passed" and s["source"] == "preset llama-1b" and plain:
            m = s["memory"]
            dev = [
                abs(m[k] - r) / r for k, r in zip(("between_steps_gib", "peak_allocated_gib"), ref, strict=True) if m[k]
            ]
            row["reference"] = {
                "between_steps_gib": ref[0],
                "peak_gib": ref[1],
                "max_rel_diff": round(max(dev), 4) if dev else None,
                "within_tolerance": bool(dev) and max(dev) <= REFERENCE_TOLERANCE,
            }
        runs[d.name] = row
    first = next((r for r in runs.values() if r.get("kind") == "rank"), {})
    refs = [r["reference"] for r in runs.values() if r.get("reference")]
    reps = [_read(d / "report.json") or {} for d in sorted(raw.iterdir()) if d.is_dir()]
    versions = next((r.get("versions") for r in reps if r.get("versions")), None) or {}
    started = sorted(str(r.get("started_utc")) for r in reps if r.get("started_utc"))
    rel = raw_store.logical(raw) or (str(raw.relative_to(ROOT)) if raw.is_relative_to(ROOT) else str(raw))
    machine = "1x " + (next((r.get("device") for r in reps if r.get("device")), None) or "GPU")
    if versions:
        machine += " (" + ", ".join(f"{k} {v}" for k, v in versions.items() if v) + ")"
    columns = [
        "run",
        "model",
        "N",
        "rank",
        "strategy",
        "result",
        "first failure (phase: rule or kind)",
        "between steps GiB (measured)",
        "between steps GiB (memory)",
        "peak allocated GiB (measured)",
        "peak GiB (memory)",
        "peak reserved GiB",
        "NCCL allowance GiB",
        "reference between / peak GiB (max diff)",
        "command (the run; its folder is the --out)",
    ]
    rows = []
    for name, r in runs.items():
        if r.get("kind") != "rank":
            continue
        m, p, f = r["memory"], r["predicted"] or {}, r["failure"]
        ref = r.get("reference")
        rows.append(
            [
                name,
                _model_label(r["source"]),
                r["world_size"],
                r["rank"],
                r["strategy"],
                r["result"],
                f"{f['phase']}: {f['rule'] or f['category']}" if f else None,
                m["between_steps_gib"],
                p.get("between_steps_gib"),
                m["peak_allocated_gib"],
                p.get("peak_gib"),
                m["peak_reserved_gib"],
                (r.get("nccl") or {}).get("allowance_gib"),
                f"{ref['between_steps_gib']} / {ref['peak_gib']} ({ref['max_rel_diff'] * 100:.1f} %)" if ref else None,
                f"`{r['command']}`",
            ]
        )
    parity = next((r for r in runs.values() if r.get("kind") == "parity"), None)
    no_mamba = [
        n
        for n, r in runs.items()
        if r.get("kind") == "rank"
        and (r.get("failure") or {}).get("category") == "environment"
        and "mamba" in str((r.get("failure") or {}).get("fix"))
    ]
    no_attention = [
        n
        for n, r in runs.items()
        if r.get("kind") == "rank"
        and str((r.get("failure") or {}).get("message")).startswith("No dot product attention backend")
    ]
    deviated = {n: r["deviations"] for n, r in runs.items() if r.get("deviations")}
    notes = [
        "each run is one process on one GPU playing rank R of a world of N under PyTorch's fake process-group "
        "backend (collectives move no data; every allocation is real); rank, world and strategy as listed; llama "
        "1.1 B, 8 B, 70 B trunks, a 16-layer 128-expert MoE trunk (EP 8) and a hybrid Mamba trunk (Nemotron-H "
        "shapes), seq 2048, MBS 1; Bridge recipes (--recipe) at their own sequence length; mock data, 2-3 steps; "
        "the verdict and explanations are those `mfsdp.py rehearse` prints for the same reports",
        "measured: torch.cuda.memory_allocated() between steps and max_memory_allocated() / max_memory_reserved() "
        "over the run; for a failed run, the peak up to the failure. 'memory' columns: mfsdp_lib.memory's "
        "after_step_gib and total_gib for the run's own run_config.yaml and data-parallel size (the memory model "
        "in this tree; regenerate this file when it changes)",
        f"llama 1.1 B against an earlier independent measurement of the same method (one H200, 2026-12-02): "
        f"{len(refs)} runs compared, all within {REFERENCE_TOLERANCE * 100:.0f} % on both figures: "
        f"{'yes' if refs and all(x['within_tolerance'] for x in refs) else 'NO'}",
        "NCCL allowance: " + str((first.get("nccl") or {}).get("basis")),
        "failures are part of the result: pipeline parallelism with Megatron FSDP fails at model wrapping "
        "(MFSDP-PIPELINE-PARALLEL, as expected)"
        + (
            f"; on a machine without mamba-ssm the hybrid trunk fails at model_build ({', '.join(no_mamba)}: an "
            "environment failure, reported as such)"
            if no_mamba
            else ""
        )
        + (
            f"; with the hybrid provider's default attention_backend=flash and no flash-attn on the machine, Transformer "
            f"Engine has no attention kernel it may use ({', '.join(no_attention)}: an environment failure at the first "
            "attention layer, reported as such)"
            if no_attention
            else ""
        ),
    ]
    if deviated:
        by_id: dict[str, dict[str, dict]] = {}
        for name, ds in deviated.items():
            for d in ds:
                by_id.setdefault(d["id"], {})[name] = d
        parts = []
        for dev_id, named in sorted(by_id.items()):
            amounts = [
                f"{n} {d['extra_activation_bytes'] / GIB:.2f} GiB"
                for n, d in named.items()
                if d.get("extra_activation_bytes")
            ]
            if amounts:
                parts.append(
                    f"{dev_id} in {len(named)} runs: the unfused Mamba path; the measured peak is above a run on the "
                    "memory-efficient path by about " + ", ".join(amounts)
                )
            else:
                effect = next(iter(named.values())).get("memory_effect")
                parts.append(f"{dev_id} in {len(named)} runs: memory effect {effect}")
        unfused_by_config = [
            n
            for n, r in runs.items()
            if n in deviated and not any(d["id"] == "mamba-mem-eff-path-off" for d in deviated[n])
        ]
        if unfused_by_config:
            parts.append(
                f"{', '.join(unfused_by_config)} ran the unfused path because the recipe asks for it (no path deviation)"
            )
        notes.append(
            "hybrid (Mamba) runs on mamba-ssm's Triton kernels differ from a production run in labelled deviations "
            "(raw.runs.<run>.deviations; the text report prints them): " + "; ".join(parts)
        )
    if parity:
        notes.append(
            f"parity (a real world of 1, DDP vs Megatron FSDP optim_grads_params, same seed and data): "
            f"{'passed' if parity['passed'] else 'FAILED'}, max |loss diff| {parity['max_abs_loss_diff']:.4f} over "
            f"{parity['steps_compared']} steps (atol {parity['atol']}); fsdp_dtensor save/load round trip equal: "
            f"{(parity['legs'].get('fsdp') or {}).get('save_load_equal')}; command: `{parity['command']}`"
        )
    by_harness: dict[str, list[str]] = {}
    for name in runs:
        if harness.get(name):
            by_harness.setdefault(harness[name], []).append(name)
    for cmd, names in by_harness.items():
        notes.append(f"`{cmd}` ran (one after another or side by side on the GPU): {', '.join(names)}")
    return {
        "benchmark": "rehearse_1xh200",
        "title": "Rehearsal: one GPU as rank R of a world of N, measured against the memory model",
        "date": started[0] if started else None,
        "machine": machine,
        "command": f"python3 benchmarks/bench_rehearse.py --summarize {rel} --out benchmarks/results/rehearse_1xh200.json",
        "columns": columns,
        "rows": rows,
        "notes": notes,
        "raw": {
            "folder": rel,
            "reference_tolerance": REFERENCE_TOLERANCE,
            "reference_compared": len(refs),
            "reference_all_within": bool(refs) and all(x["within_tolerance"] for x in refs),
            "passed": sum(1 for r in runs.values() if r.get("result") == "passed"),
            "total": len(runs),
            "runs": runs,
        },
    }


# The two ``mfsdp.py rehearse`` invocations of tests/gpu/test_rehearse_gpu.py (its output folder, under
# MFSDP_REHEARSE_OUT, is the case name). tests/runs/test_rehearse_cli_record.py checks that these arguments,
# given to ``mfsdp.py rehearse --dry-run``, print the very engine commands the recorded rehearsal.json lists.
CLI_CASES = {
    "llama1b_n8_optim_grads_params": [
        "--model-preset", "llama-1b", "--world-size", "8", "--strategy", "optim_grads_params", "--iters", "2",
    ],
    "llama1b_n8_pp2": [
        "--model-preset", "llama-1b", "--world-size", "8", "--strategy", "optim_grads_params", "--iters", "2",
        "model.pipeline_model_parallel_size=2",
    ],
}  # fmt: skip
CLI_GPU_TEST = "tests/gpu/test_rehearse_gpu.py"
CLI_TIMEOUT_S = 400  # the GPU test's RANK_TIMEOUT_S, passed as --timeout-s


def cli_command(case: str, out: str) -> str:
    return shlex.join(
        ["python3", "scripts/mfsdp.py", "rehearse", *CLI_CASES[case], "--out", out, "--format", "json"]
        + ["--timeout-s", str(CLI_TIMEOUT_S)]
    )


def summarize_cli(raw: Path) -> dict:
    """The result JSON of ``mfsdp.py rehearse`` run end to end (the GPU test's recorded output).

    Each case folder holds the ``rehearsal.json`` the command wrote (its verdict as the user got it)
    and one ``rank_R/report.json`` per rehearsed rank position. One row per rank position.
    """
    sys.path.insert(0, str(ROOT / "scripts"))
    from mfsdp_lib.runs import rehearse as rh

    rel = raw_store.logical(raw) or (str(raw.relative_to(ROOT)) if raw.is_relative_to(ROOT) else str(raw))
    columns = [
        "case",
        "command",
        "exit",
        "rank (role)",
        "result",
        "first failure (phase: rule)",
        "fix",
        "between steps GiB (measured)",
        "between steps GiB (memory)",
        "peak allocated GiB (measured)",
        "peak GiB (memory)",
        "peak reserved GiB",
        "NCCL allowance GiB",
    ]
    rows, cases, reps = [], {}, []
    for d in sorted(p for p in raw.iterdir() if p.is_dir()):
        summ = _read(d / "rehearsal.json")
        if not isinstance(summ, dict) or d.name not in CLI_CASES:
            continue
        cmd = cli_command(d.name, f"{rel}/{d.name}")
        cases[d.name] = {"command": cmd, "result": summ.get("result"), "exit": rh.exit_code(summ)}
        for r in summ.get("ranks") or []:
            reps.append(_read(d / f"rank_{r.get('rank')}" / "report.json") or {})
            m, p, f, n = r.get("memory") or {}, r.get("predicted") or {}, r.get("failure"), r.get("nccl") or {}
            rows.append(
                [
                    d.name,
                    f"`{cmd}`",
                    rh.exit_code(summ),
                    f"{r.get('rank')} ({r.get('role')})",
                    r.get("result"),
                    f"{f['phase']}: {f['rule'] or f['category']}" if f else None,
                    f["fix"] if f else None,
                    m.get("between_steps_gib"),
                    p.get("between_steps_gib"),
                    m.get("peak_allocated_gib"),
                    p.get("peak_gib"),
                    m.get("peak_reserved_gib"),
                    n.get("allowance_gib"),
                ]
            )
    versions = next((r.get("versions") for r in reps if r.get("versions")), None) or {}
    started = sorted(str(r.get("started_utc")) for r in reps if r.get("started_utc"))
    machine = "1x " + (next((r.get("device") for r in reps if r.get("device")), None) or "GPU")
    if versions:
        machine += " (" + ", ".join(f"{k} {v}" for k, v in versions.items() if v) + ")"
    log = raw / "gpu_test.log"
    tail = log.read_text().strip().splitlines()[-2:] if log.is_file() else []
    verdict = next((x.strip("= ") for x in tail if " passed" in x or " failed" in x), "no test log")
    notes = [
        f"`MFSDP_REHEARSE_OUT={rel} python3 -m pytest {CLI_GPU_TEST} -v -s` on one GPU ran the command in each row "
        f"as a user runs it (a subprocess of scripts/mfsdp.py) and kept its output in {rel}/ (pytest: {verdict})",
        "the rows are what that command printed (rehearsal.json): one row per rank position it rehearsed; with "
        "pipeline parallelism it rehearses the first rank of the first and of the last stage",
        "memory: measured on the GPU (torch.cuda.memory_allocated() between steps, max_memory_allocated() and "
        "max_memory_reserved(); for a failed rank, up to the failure); 'memory' columns: the prediction the command "
        "printed beside it; NCCL allowance: an allowance the command adds, not a measurement",
    ]
    return {
        "benchmark": "rehearse_cli_1xh200",
        "title": "mfsdp.py rehearse end to end: the command's own verdict on one GPU",
        "date": started[0] if started else None,
        "machine": machine,
        "command": f"python3 benchmarks/bench_rehearse.py --summarize-cli {rel} --out "
        "benchmarks/results/rehearse_cli_1xh200.json",
        "columns": columns,
        "rows": rows,
        "notes": notes,
        "raw": {"folder": rel, "gpu_test": verdict, "cases": cases},
    }


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.summarize or a.summarize_cli:
        raw = raw_store.resolve(a.summarize or a.summarize_cli).resolve()
        if not raw.is_dir():
            print(f"bench_rehearse: {a.summarize or a.summarize_cli}: no such folder", file=sys.stderr)
            return 2
        result = summarize_raw(raw) if a.summarize else summarize_cli(raw)
        dest = Path(a.out)
        tmp = dest.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        os.replace(tmp, dest)
        if a.summarize:
            stamp(f"{result['raw']['passed']}/{result['raw']['total']} runs passed -> {dest}")
        else:
            stamp(f"{len(result['rows'])} rank positions in {len(result['raw']['cases'])} rehearsals -> {dest}")
        return 0
    if not a.group:
        print("bench_rehearse: --group is required (or --summarize RAW, --summarize-cli RAW)", file=sys.stderr)
        return 2
    a.budget_s = a.budget_s or GROUP_BUDGET_S[a.group]
    out = Path(a.out).resolve()
    runs = GROUPS[a.group]()
    if a.group == "C" and not a.no_leftovers:  # then whatever A and B left without a report
        runs += [r for g in ("A", "B") for r in GROUPS[g]() if not report_done(out, r.name)]
    if a.only:
        names = set(a.only.split(","))
        unknown = names - set(all_runs())
        if unknown:
            print(f"bench_rehearse: unknown run name(s): {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        runs = [r for r in all_runs().values() if r.name in names]
    if a.list:
        for r in runs:
            print(f"{r.name:48s} ~{r.est_gib:5.1f} GiB ~{r.est_s:4d}s  " + shlex.join(command(r, out, "python3")[1:]))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    stamp(
        f"group {a.group}: {len(runs)} runs, budget {a.budget_s}s, GPU budget {a.gpu_budget_gib} GiB, up to {a.max_concurrent} at once"
    )
    result = run_group(runs, out, a)
    summary = {
        "benchmark": "rehearse",
        "group": a.group,
        "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(
            ["python3", "benchmarks/bench_rehearse.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "budget_s": a.budget_s,
        **result,
        "runs": {
            r.name: {
                "args": r.args,
                "why": r.why,
                "tags": r.tags,
                **summarize_report(_read(out / r.name / "report.json")),
            }
            for r in runs
        },
    }
    dest = out / f"summary_{a.group}.json"
    tmp = dest.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    os.replace(tmp, dest)
    n_pass = sum(1 for v in summary["runs"].values() if v.get("result") == "passed")
    stamp(f"group {a.group}: {n_pass}/{len(runs)} passed in {result['wall_s']:.0f}s -> {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
