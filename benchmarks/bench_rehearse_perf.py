#!/usr/bin/env python3
"""Measure ``rehearse --perf`` on ONE GPU: the rows behind ``benchmarks/results/rehearse_perf_1xh200.json``.

Why: ``rehearse --perf`` claims that one GPU playing rank R of a world of N measures the job's
compute per step, counts its communication exactly, and predicts its step time within a
stated range. These rows put the claim against NVIDIA's published figure and against a
plain run:

1. ``anchor_fsdp_n8``: Bridge's ``llama3_8b_pretrain_8gpu_h100_fp8cs_config`` (Llama 3 8B, FP8
   current scaling, GBS 128, MBS 1, sequence 8192, TP 1, full recompute of 5 layers) with the
   Megatron FSDP overrides Bridge's performance launcher applies
   (``scripts/performance/utils/overrides.py`` :: ``_set_megatron_fsdp_overrides`` and
   ``_set_common_perf_overrides`` in the Megatron-Bridge repository), as rank 0 of 8; NVIDIA
   publishes 14451 tokens/s/GPU and 744 model TFLOP/s/GPU for it on 8 H100s (25.11 container);
2. ``anchor_distopt_n8``: the same recipe under the distributed optimizer;
3. ``llama1b_n8``, ``llama1b_n64``: the llama 1.1 B preset, ``--compare`` of the distributed
   optimizer and ``optim_grads_params`` at N = 8 and 64;
4. ``llama70b_n64``: Bridge's Llama 3 70B FSDP recipe (``llama3_70b_pretrain_64gpu_b200_fp8cs_config``:
   TP 1, ``optim_grads_params``, meta-device init) at N = 64, with full recompute instead of
   the recipe's CPU offloading of 5 layers' activations and GBS 64 (one micro-batch per rank), so
   that rank 0 fits one H200 and a step takes seconds;
5. ``n1_perf`` and ``n1_plain``: the N = 1 agreement check, the llama 1.1 B preset at MBS 8, GBS 32 under
   ``optim_grads_params``: ``rehearse --perf`` (fake backend, recorder on, CUDA events) against a
   plain real run of the same config (a real NCCL world of 1, no recorder, no ``--perf``; its step
   time is Bridge's own ``elapsed time per iteration`` log line).

Recipes read their model's Hugging Face ``config.json``; the ones shipped in ``scripts/data/hf``
are passed with ``--hf-config`` so that nothing is fetched.

How, within one machine call (``BUDGET_S``): rows start in priority order, at most
``MAX_CONCURRENT`` at a time; Bridge's import (30-60 s of CPU per process) overlaps, while a GPU
lock (``MFSDP_GPU_LOCK``, taken by the engine after its config is validated and held to its exit)
lets one process at a time build a model and train, so timed steps never share the GPU. Each row
has its own timeout (what is left of the budget, at most its cap); a failed row never stops the
others; at the budget's end running rows are stopped and recorded as cut off.

Output, flat in RAW: ``<row>.json`` (the command, exit code, wall time, and the command's own JSON:
``mfsdp.py rehearse --format json`` or the engine's report), ``<row>.log`` (everything the row
printed), ``<row>.<run>.report.json`` (each engine report, with its full collective log) and
``driver.json``. Then ``benchmarks/rehearse_perf_result.py RAW --out
benchmarks/results/rehearse_perf_1xh200.json`` and ``bash scripts/dev.sh benchmark-md``.

    python3 benchmarks/bench_rehearse_perf.py --out RAW            # everything, about 8 minutes
    python3 benchmarks/bench_rehearse_perf.py --out RAW --list     # the rows and their commands only
    python3 benchmarks/bench_rehearse_perf.py --out RAW --only n1_perf,n1_plain --repeat 2 --max-concurrent 1

``--repeat K`` runs the selected rows K times, interleaved (A1 B1 A2 B2 ...), as rows named
``<row>_r<k>``: the N = 1 agreement is then measured pair by pair with its spread, and with
``--max-concurrent 1`` nothing else runs on the machine while a row holds the GPU (the 1.1 B model's
kernel launches are CPU-bound, so another process importing Bridge slows its steps).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench_rehearse import stop_process_group  # SIGTERM then SIGKILL of a run's process group

ROOT = Path(__file__).resolve().parent.parent
MFSDP = ROOT / "scripts" / "mfsdp.py"
ENGINE = ROOT / "scripts" / "rehearse_train.py"
HF = ROOT / "scripts" / "data" / "hf"

BUDGET_S = 530  # one device call is 10 minutes; leave room for the start and for copying the results back
MAX_CONCURRENT = 3  # 16 CPU cores: imports overlap while one row holds the GPU; few enough not to slow its steps
GPU_LOCK_ENV = "MFSDP_GPU_LOCK"  # read by the engine: one process at a time on the GPU after set-up starts
STAGGER_S = 3.0  # start rows a little apart, so that they reach the GPU lock in priority order
IMPORT_S = 45  # importing Bridge (Transformer Engine, megatron-core) before a process can use the GPU
EXIT_S = 5  # a process's teardown after its report is written

RECIPE_8B = "megatron.bridge.perf_recipes.llama.h100.llama3:llama3_8b_pretrain_8gpu_h100_fp8cs_config"
RECIPE_70B = "megatron.bridge.perf_recipes.llama.b200.llama3:llama3_70b_pretrain_64gpu_b200_fp8cs_config"
HF_8B = f"meta-llama/Meta-Llama-3-8B={HF / 'Meta-Llama-3-8B' / 'config.json'}"
HF_70B = f"meta-llama/Meta-Llama-3-70B={HF / 'Meta-Llama-3-70B' / 'config.json'}"

# Bridge's performance launcher (scripts/performance/utils/overrides.py in the Megatron-Bridge repository):
# _set_common_perf_overrides, the settings that change what a step computes (train_iters, logging and the
# checks the rehearsal turns off itself are left to it) ...
COMMON_PERF = [
    "ddp.check_for_large_grads=false",
    "model.apply_rope_fusion=true",
    "model.cross_entropy_fusion_impl=te",
]
# ... and _set_megatron_fsdp_overrides with use_megatron_fsdp=True (the strategy's own five settings come
# with --strategy optim_grads_params; gradient_accumulation_fusion=True needs APEX, which the rehearsal
# turns off and records where it is absent; checkpoint.load=None is what a rehearsal does anyway).
FSDP_PERF = [
    "ddp.keep_fp8_transpose_cache=false",
    "model.init_model_with_meta_device=true",
    "model.gradient_accumulation_fusion=true",
    "optimizer.use_precision_aware_optimizer=false",
    "comm_overlap.defer_embedding_wgrad_compute=false",
]
# Timed steps of the anchor rows: a median and a spread need at least 4 (at about 9.4 s a step on an H100).
ANCHOR_ITERS = 4
# What Bridge's launcher sets after the recipe (scripts/performance/utils/overrides.py :: set_post_overrides,
# r0.6.0): the precision-aware optimizer for bf16 Adam states; FSDP_PERF turns it off, as the anchor does.
LAUNCHER_POST = ["optimizer.use_precision_aware_optimizer=true"]
# Qwen3-30B-A3B on 16 H100s (Bridge's recipe): EP 16, GBS 1024 at micro-batch 1 = 64 micro-batches per step.
RECIPE_QWEN30B = "megatron.bridge.recipes.qwen.h100.qwen3_moe:qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"
HF_QWEN30B = (
    f"Qwen/Qwen3-30B-A3B={ROOT / 'tests' / 'recipes' / 'hf_configs' / 'Qwen' / 'Qwen3-30B-A3B' / 'config.json'}"
)
# The recipe captures the MoE router and preprocessing in Transformer Engine CUDA graphs; the rehearsal turns
# that off (graph capture of a step whose collectives return at once is not what the job runs).
QWEN_NO_GRAPHS = ['model.cuda_graph_impl="none"']  # a JSON string: a bare none is read as null
# The rows of rehearse_perf_1xh100.json (one H100 call each: --only with the first four, then the rest).
H100_ROWS = (
    "anchor_fsdp_n8",
    "anchor_distopt_n8",
    "anchor_fsdp_n8_pao",
    "anchor_fsdp_n8_gafte",
    "anchor_fsdp_n8_nomirror",
    "kscale_full",
    "kscale_k2",
    "qwen30b_refusal",
    "qwen30b_k4",
)
H100_CALLS = (H100_ROWS[:4], H100_ROWS[4:])  # --only for each machine call
# The MoE compute gap (moe_profile_1xh100.json, one call into its own folder): the qwen3-moe-16l preset at
# EP 8 as rank 0 of 64, each strategy's timed steps under the kernel profiler, and FSDP without the mirror's
# copies (what of the gap is the fake backend's).
MOE_PROFILE_ROWS = ("moe_prof_fsdp", "moe_prof_distopt", "moe_prof_fsdp_nomirror")
MOE_PROFILE_WORLD = 64
# The scaling check's job: micro-batch 4 (at micro-batch 1 the 1.1 B model's step follows the host's kernel
# launches, see N1_MBS), 8 micro-batches per step at N = 8.
KSCALE_BATCH = ["train.micro_batch_size=4", "train.global_batch_size=256"]
K_SCALE = 2  # the scaling check: 2 of 8 micro-batches against the whole step
# Llama 3 70B on one H200 as rank 0 of 64: activations of 80 layers at sequence 8192 do not fit without
# recompute; the recipe offloads 5 layers' activations to the CPU instead (192 GB B200s).
FIT_70B = [
    "model.cpu_offloading=false",
    "model.recompute_granularity=full",
    "model.recompute_method=uniform",
    "model.recompute_num_layers=1",
    "train.global_batch_size=64",
]
# The N = 1 check: the same settings in both runs (the fake backend turns these off; the plain run is told to).
SAME_CHECKS = [
    "ddp.check_for_nan_in_grad=false",
    "rerun_state_machine.check_for_nan_in_loss=false",
    "rerun_state_machine.check_for_spiky_loss=false",
]
# Micro-batches of 8 x 2048 tokens: large enough that the GPU, not the host's kernel launches, sets the step
# time. At micro-batch 1 the 1.1 B model runs at about 12 % MFU and its step time follows the host: the same
# plain run measured 0.73 s and 1.08 s per step in two runs a minute apart (n1_pairs_mbs1/).
N1_MBS = 8
N1_GBS = 32  # four micro-batches per step
N1_WARMUP, N1_ITERS = (
    2,
    8,
)  # the plain run's timer is per iteration: 8 steps give a median that one slow step cannot move


@dataclass
class Row:
    name: str
    argv: list[str]  # after the interpreter
    cap_s: int  # this row's own timeout
    gpu_s: int  # expected time holding the GPU (model build, wrap, steps), imports aside
    why: str
    kind: str = "cli"  # "cli": mfsdp.py rehearse --format json; "engine": the engine directly
    runs: list[str] = field(default_factory=list)  # the engine reports it leaves (for copying)


def rehearse(*args: str) -> list[str]:
    return [str(MFSDP), "rehearse", *args, "--format", "json"]


def plan(raw: Path) -> list[Row]:
    """Every row, in priority order, with the exact argument list it runs."""
    raw = Path(raw)

    def out(name: str) -> list[str]:
        return ["--out", str(raw / f"{name}.run")]

    def anchor(name: str, strategy: str, *extra: str, flags: tuple[str, ...] = ()) -> list[str]:
        """NVIDIA's Llama 3 8B FP8 job as rank 0 of 8 under ``strategy``, with the row's own settings after."""
        return rehearse(
            *("--recipe", RECIPE_8B, "--hf-config", HF_8B, "--world-size", "8", "--strategy", strategy),
            *("--perf", "--warmup", "1", "--iters", str(ANCHOR_ITERS), *flags, *COMMON_PERF, *extra, *out(name)),
        )

    rows = [
        Row(
            "anchor_fsdp_n8",
            anchor("anchor_fsdp_n8", "optim_grads_params", *FSDP_PERF),
            cap_s=330,
            gpu_s=70,
            why="NVIDIA's published Llama 3 8B FP8 FSDP job, rank 0 of 8",
            runs=["rank_0"],
        ),
        Row(
            "anchor_distopt_n8",
            anchor("anchor_distopt_n8", "distopt"),
            cap_s=330,
            gpu_s=70,
            why="the same job under the distributed optimizer",
            runs=["rank_0"],
        ),
        Row(
            "llama1b_n8",
            rehearse(
                "--model-preset",
                "llama-1b",
                "--world-size",
                "8",
                "--warmup",
                "2",
                "--iters",
                "5",
                *out("llama1b_n8"),
                "--strategies",
                "distopt,optim_grads_params",
                "--compare",
            ),
            cap_s=300,
            gpu_s=35,
            why="llama 1.1 B at N = 8: distributed optimizer vs optim_grads_params (--compare)",
            runs=["distopt/rank_0", "optim_grads_params/rank_0"],
        ),
        Row(
            "llama1b_n64",
            rehearse(
                "--model-preset",
                "llama-1b",
                "--world-size",
                "64",
                "--warmup",
                "2",
                "--iters",
                "5",
                *out("llama1b_n64"),
                "--strategies",
                "distopt,optim_grads_params",
                "--compare",
            ),
            cap_s=300,
            gpu_s=35,
            why="llama 1.1 B at N = 64: distributed optimizer vs optim_grads_params (--compare)",
            runs=["distopt/rank_0", "optim_grads_params/rank_0"],
        ),
        Row(
            "llama70b_n64",
            rehearse(
                "--recipe",
                RECIPE_70B,
                "--hf-config",
                HF_70B,
                "--world-size",
                "64",
                "--strategy",
                "optim_grads_params",
                "--perf",
                "--warmup",
                "1",
                "--iters",
                "2",
                *COMMON_PERF,
                *FIT_70B,
                *out("llama70b_n64"),
            ),
            cap_s=360,
            gpu_s=70,
            why="Llama 3 70B, Megatron FSDP, TP 1, meta-device init, rank 0 of 64",
            runs=["rank_0"],
        ),
        Row(
            "n1_perf",
            rehearse(
                "--model-preset",
                "llama-1b",
                "--world-size",
                "1",
                "--strategy",
                "optim_grads_params",
                "--perf",
                "--warmup",
                str(N1_WARMUP),
                "--iters",
                str(N1_ITERS),
                f"train.micro_batch_size={N1_MBS}",
                f"train.global_batch_size={N1_GBS}",
                *SAME_CHECKS,
                *out("n1_perf"),
            ),
            cap_s=240,
            gpu_s=25,
            why="N = 1 agreement: rehearse --perf (fake backend, recorder, CUDA events)",
            runs=["rank_0"],
        ),
        Row(
            "n1_plain",
            [
                str(ENGINE),
                "--model-preset",
                "llama-1b",
                "--world-size",
                "1",
                "--no-fake-pg",
                "--strategy",
                "optim_grads_params",
                "--iters",
                str(N1_WARMUP + N1_ITERS),
                "--micro-batch-size",
                str(N1_MBS),
                "--global-batch-size",
                str(N1_GBS),
                *SAME_CHECKS,
                "--out",
                str(raw / "n1_plain.run"),
            ],
            cap_s=240,
            gpu_s=25,
            why="N = 1 agreement: a plain real run of the same config (real NCCL world of 1, Bridge's own timer)",
            kind="engine",
            runs=[""],
        ),
        # ---- the H100 rows (rehearse_perf_1xh100.json): the anchor's gap to the published figure, measured
        Row(
            "anchor_fsdp_n8_pao",
            anchor("anchor_fsdp_n8_pao", "optim_grads_params", *FSDP_PERF, *LAUNCHER_POST),
            cap_s=330,
            gpu_s=70,
            why="the anchor with the launcher's set_post_overrides: precision-aware optimizer on",
            runs=["rank_0"],
        ),
        Row(
            "anchor_fsdp_n8_gafte",
            anchor("anchor_fsdp_n8_gafte", "optim_grads_params", *FSDP_PERF, flags=("--te-grad-accum-fusion",)),
            cap_s=330,
            gpu_s=70,
            why="the anchor with gradient-accumulation fusion kept on in Transformer Engine's layers (no APEX here)",
            runs=["rank_0"],
        ),
        Row(
            "anchor_fsdp_n8_nomirror",
            anchor("anchor_fsdp_n8_nomirror", "optim_grads_params", *FSDP_PERF, flags=("--no-mirror-collectives",)),
            cap_s=330,
            gpu_s=70,
            why="the anchor without the mirror's copies: the fake backend's own cost (and NaN risk)",
            runs=["rank_0"],
        ),
        Row(
            "kscale_full",
            rehearse(
                "--model-preset",
                "llama-1b",
                "--world-size",
                "8",
                "--strategy",
                "optim_grads_params",
                "--perf",
                "--warmup",
                "2",
                "--iters",
                "4",
                *KSCALE_BATCH,
                *out("kscale_full"),
            ),
            cap_s=240,
            gpu_s=30,
            why="the K-micro-batch scaling check: llama 1.1 B, micro-batch 4, 8 micro-batches per step, whole step timed",
            runs=["rank_0"],
        ),
        Row(
            "kscale_k2",
            rehearse(
                "--model-preset",
                "llama-1b",
                "--world-size",
                "8",
                "--strategy",
                "optim_grads_params",
                "--perf",
                "--warmup",
                "2",
                "--iters",
                "4",
                "--perf-micro-batches",
                str(K_SCALE),
                *KSCALE_BATCH,
                *out("kscale_k2"),
            ),
            cap_s=240,
            gpu_s=25,
            why=f"the same job timing {K_SCALE} of its 8 micro-batches, scaled to the step",
            runs=["rank_0"],
        ),
        Row(
            "qwen30b_refusal",
            rehearse(
                "--recipe",
                RECIPE_QWEN30B,
                "--hf-config",
                HF_QWEN30B,
                "--world-size",
                "16",
                "--perf",
                *QWEN_NO_GRAPHS,
                *out("qwen30b_refusal"),
            ),
            cap_s=200,
            gpu_s=5,
            why="Qwen3-30B-A3B recipe, flex/HybridEP dispatcher not installed: refused before the model build",
            runs=["rank_0"],
        ),
        Row(
            "qwen30b_k4",
            rehearse(
                "--recipe",
                RECIPE_QWEN30B,
                "--hf-config",
                HF_QWEN30B,
                "--world-size",
                "16",
                "--perf",
                "--warmup",
                "1",
                "--iters",
                "4",
                "--perf-micro-batches",
                "4",
                "--moe-dispatcher",
                "alltoall",
                *QWEN_NO_GRAPHS,
                *out("qwen30b_k4"),
            ),
            cap_s=420,
            gpu_s=150,
            why="Qwen3-30B-A3B recipe (64 micro-batches per step) timed on 4 per step, all-to-all dispatcher",
            runs=["rank_0"],
        ),
    ]
    for name, strategy, flags in (
        ("moe_prof_fsdp", "optim_grads_params", ()),
        ("moe_prof_distopt", "distopt", ()),
        ("moe_prof_fsdp_nomirror", "optim_grads_params", ("--no-mirror-collectives",)),
    ):
        rows.append(
            Row(
                name,
                rehearse(
                    *("--model-preset", "qwen3-moe-16l", "--world-size", str(MOE_PROFILE_WORLD)),
                    *("--strategy", strategy, "--perf", "--profile", "--warmup", "2", "--iters", "2", *flags),
                    *out(name),
                ),
                cap_s=300,
                gpu_s=45,
                why=f"MoE preset at EP 8, rank 0 of {MOE_PROFILE_WORLD}, {strategy}"
                + (" without the mirror" if flags else "")
                + ": the timed steps' kernels by kind",
                runs=["rank_0"],
            )
        )
    return rows


def repeated(rows: list[Row], raw: Path, times: int) -> list[Row]:
    """``rows`` ``times`` times, interleaved, as ``<row>_r<k>`` with their own output folders."""
    if times <= 1:
        return rows
    out = []
    for k in range(1, times + 1):
        for r in rows:
            name = f"{r.name}_r{k}"
            old, new = str(Path(raw) / f"{r.name}.run"), str(Path(raw) / f"{name}.run")
            argv = [new if a == old else a for a in r.argv]
            out.append(Row(name, argv, r.cap_s, r.gpu_s, f"{r.why} (repeat {k} of {times})", r.kind, list(r.runs)))
    return out


def expected_wall_s(rows: list[Row]) -> int:
    """One import that nothing hides, then the GPU work one row after another, and each process's exit."""
    processes = sum(max(len(r.runs), 1) for r in rows)
    return IMPORT_S + sum(r.gpu_s for r in rows) + EXIT_S * processes


def stamp(msg: str) -> None:
    print(f"[bench_rehearse_perf {_dt.datetime.now(_dt.timezone.utc).strftime('%H:%M:%S')}] {msg}", flush=True)


def child_env(raw: Path) -> dict:
    env = dict(os.environ)
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)  # Megatron FSDP needs it unset or > 1
    env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="2")
    env[GPU_LOCK_ENV] = str(raw / "gpu.lock")
    return env


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def collect(row: Row, raw: Path, rc: int | None, wall: float, timed_out: str | None, cmd: list[str]) -> dict:
    """Write RAW/<row>.json and copy the engine reports beside it (flat); returns the record."""
    run_dir = raw / f"{row.name}.run"
    stdout = raw / f"{row.name}.stdout"
    out: dict = {
        "row": row.name,
        "why": row.why,
        "kind": row.kind,
        "command": cmd,
        "exit_code": rc,
        "wall_s": round(wall, 1),
        "timed_out": timed_out,
        "result": None,
        "reports": {},
    }
    if row.kind == "cli":
        out["result"] = _read_json(stdout)
    for run in row.runs:
        src = run_dir / run / "report.json" if run else run_dir / "report.json"
        rep = _read_json(src)
        label = (run.split("/")[0] if "/" in run else run) or "engine"
        if rep is not None:
            dst = raw / f"{row.name}.{label}.report.json"
            shutil.copyfile(src, dst)
            out["reports"][label] = dst.name
            cfg = src.parent / "run_config.yaml"
            if cfg.is_file():
                shutil.copyfile(cfg, raw / f"{row.name}.{label}.run_config.yaml")
            if row.kind == "engine":
                out["result"] = rep
    # the engine's own log lines (Bridge's timers among them) go into the row's log
    with open(raw / f"{row.name}.log", "a", encoding="utf-8", errors="replace") as log:
        for logf in sorted(run_dir.rglob("log.txt")) if run_dir.is_dir() else []:
            log.write(f"\n===== {logf.relative_to(run_dir)} =====\n")
            log.write(logf.read_text(encoding="utf-8", errors="replace"))
    (raw / f"{row.name}.json").write_text(json.dumps(out, indent=1) + "\n")
    if stdout.exists():
        stdout.unlink()
    shutil.rmtree(run_dir, ignore_errors=True)  # flat: what matters was copied beside it
    return out


def run_all(
    rows: list[Row], raw: Path, python: str, budget_s: int, max_concurrent: int, summary_name: str = "driver.json"
) -> dict:
    raw.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    deadline = t0 + budget_s
    pending = list(rows)
    running: dict[str, tuple[Row, subprocess.Popen, float, list[str], float]] = {}
    done: list[dict] = []
    env = child_env(raw)
    last_beat = t0
    stamp(f"{len(rows)} rows, budget {budget_s} s, at most {max_concurrent} at a time; results in {raw}")
    while pending or running:
        now = time.time()
        while pending and len(running) < max_concurrent and now < deadline - 20:
            row = pending.pop(0)
            for stale in (raw / f"{row.name}.run", raw / f"{row.name}.log"):
                if stale.is_dir():
                    shutil.rmtree(stale)
                elif stale.exists():
                    stale.unlink()
            timeout = int(min(row.cap_s, deadline - now))
            cmd = [python, *row.argv]
            if row.kind == "cli":
                cmd += ["--timeout-s", str(timeout)]
            stdout = open(raw / f"{row.name}.stdout", "w")  # noqa: SIM115 (closed when the row ends)
            log = open(raw / f"{row.name}.log", "w")  # noqa: SIM115
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            proc = subprocess.Popen(
                cmd, stdout=stdout if row.kind == "cli" else log, stderr=log, env=env, cwd=ROOT, start_new_session=True
            )
            stdout.close()
            log.close()
            running[row.name] = (row, proc, time.time(), cmd, now + timeout)
            stamp(f"{row.name}: started ({len(done) + len(running)}/{len(rows)}; timeout {timeout} s): {row.why}")
            time.sleep(STAGGER_S)
            now = time.time()
        for name, (row, proc, started, cmd, until) in list(running.items()):
            rc = proc.poll()
            why = None
            if rc is None and time.time() > min(until, deadline):
                why = "budget" if time.time() > deadline else "row timeout"
                stamp(f"{name}: stopping ({why})")
                stop_process_group(proc)
                rc = proc.poll()
            if rc is None:
                continue
            del running[name]
            rec = collect(row, raw, rc, time.time() - started, why, cmd)
            done.append(rec)
            stamp(f"{name}: exit {rc} after {rec['wall_s']:.0f} s" + (f" ({why})" if why else ""))
        if pending and time.time() >= deadline - 20:
            for row in pending:
                stamp(f"{row.name}: not started (budget)")
                done.append(collect(row, raw, None, 0.0, "not started: budget", [python, *row.argv]))
            pending = []
        if time.time() - last_beat > 30 and running:
            last_beat = time.time()
            stamp("running: " + ", ".join(f"{n} {time.time() - v[2]:.0f} s" for n, v in running.items()))
        time.sleep(1.0)
    summary = {
        "started_utc": _dt.datetime.fromtimestamp(t0, _dt.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(time.time() - t0, 1),
        "budget_s": budget_s,
        "max_concurrent": max_concurrent,
        "rows": [{k: r[k] for k in ("row", "exit_code", "wall_s", "timed_out")} for r in done],
    }
    (raw / summary_name).write_text(json.dumps(summary, indent=1) + "\n")
    (raw / "gpu.lock").unlink(missing_ok=True)  # the engines' lock file: nothing to keep
    stamp(f"done in {summary['wall_s']:.0f} s; next: python3 benchmarks/rehearse_perf_result.py {raw}")
    return summary


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="bench_rehearse_perf.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    p.add_argument("--out", type=Path, required=True, help="RAW folder (flat: <row>.json, <row>.log, ...)")
    p.add_argument("--python", default=sys.executable, help="the interpreter with Megatron-Bridge (default: this)")
    p.add_argument("--budget-s", type=int, default=BUDGET_S, help=f"all rows together (default {BUDGET_S})")
    p.add_argument("--max-concurrent", type=int, default=MAX_CONCURRENT, help=f"default {MAX_CONCURRENT}")
    p.add_argument("--only", default=None, help="comma-separated row names")
    p.add_argument("--repeat", type=int, default=1, help="run the selected rows this many times, interleaved")
    p.add_argument(
        "--summary",
        default="driver.json",
        help="the driver's summary file in RAW (default driver.json; give another name to add runs to a RAW folder)",
    )
    p.add_argument("--list", action="store_true", help="print the rows and their commands, run nothing")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    rows = plan(a.out)
    if a.only:
        wanted = [x.strip() for x in a.only.split(",") if x.strip()]
        unknown = sorted(set(wanted) - {r.name for r in rows})
        if unknown:
            sys.stderr.write(f"bench_rehearse_perf.py: unknown rows: {', '.join(unknown)}\n")
            return 2
        rows = [r for r in rows if r.name in wanted]
    if a.repeat < 1:
        sys.stderr.write("bench_rehearse_perf.py: --repeat must be 1 or more\n")
        return 2
    rows = repeated(rows, a.out, a.repeat)
    if a.list:
        for r in rows:
            print(f"# {r.name} (about {r.gpu_s} s on the GPU, cap {r.cap_s} s): {r.why}")
            print(" ".join([a.python, *r.argv]))
        print(
            f"# expected: about {expected_wall_s(rows)} s in all (imports overlap the GPU work); budget {a.budget_s} s"
        )
        return 0
    summary = run_all(rows, a.out, a.python, a.budget_s, a.max_concurrent, a.summary)
    return 0 if all(r["exit_code"] == 0 for r in summary["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
