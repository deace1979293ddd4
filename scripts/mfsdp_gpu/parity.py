"""``rehearse_train.py --parity``: DDP and Megatron FSDP on a real world of 1, same model, data and seed.

Two legs, each its own engine process (``--no-fake-pg --world-size 1``, one ``--strategy``),
started side by side; their per-step losses are compared within ``--parity-atol``. Written into
``--out``: ``report.json`` (mode "parity") and each leg's folder (``ddp/``, ``fsdp/``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from .report import Report, now_utc, progress

# DDP and Megatron FSDP at a real world of 1 compute the same model in bf16 with different
# reduction order and buffer layout, so per-step losses may differ in the last bf16 digits.
# 0.02 absolute on a loss near ln(32000) = 10.4 is 0.2 %.
PARITY_ATOL = 0.02
# The engine each leg runs (this package's entry point beside it).
ENGINE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rehearse_train.py")


def run_parity(a, argv: list[str]) -> int:
    """Two real worlds of 1 (DDP, Megatron FSDP optim_grads_params), same model/data/seed."""
    out = os.path.abspath(a.out)
    report = Report(out, {"mode": "parity", "argv": argv, "started_utc": now_utc()})
    report.begin("parity")
    base = strip_args(argv, {"--parity", "--strategy", "--out", "--fake-pg", "--no-fake-pg", "--world-size", "--rank"})
    legs = {"ddp": "ddp", "fsdp": "optim_grads_params"}
    procs = {}
    for leg, strategy in legs.items():
        leg_out = os.path.join(out, leg)
        os.makedirs(leg_out, exist_ok=True)
        cmd = [
            sys.executable,
            ENGINE,
            *base,
            "--no-fake-pg",
            "--world-size",
            "1",
            "--strategy",
            strategy,
            "--out",
            leg_out,
        ]
        if leg == "ddp":
            cmd = [c for c in cmd if c != "--save-load"]
        log = open(os.path.join(leg_out, "log.txt"), "w")
        procs[leg] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log, cmd)
        progress(f"parity leg {leg}: {strategy} started")
    legs_out: dict[str, dict] = {}
    for leg, (proc, log, cmd) in procs.items():
        rc = proc.wait()
        log.close()
        path = os.path.join(out, leg, "report.json")
        try:
            with open(path) as fh:
                rep = json.load(fh)
        except (OSError, ValueError):
            rep = None
        rep = rep or {}
        mem = rep.get("memory") or {}
        losses = (rep.get("phases", {}).get("train", {}) or {}).get("losses")
        legs_out[leg] = {
            "exit_code": rc,
            "report": os.path.relpath(path, out),
            "command": cmd[1:],
            "result": rep.get("result"),
            "losses": losses if isinstance(losses, list) else None,
            "between_steps_bytes": mem.get("between_steps_bytes"),
            "peak_allocated_bytes": mem.get("peak_allocated_bytes"),
            "process_used_bytes_nvml": mem.get("process_used_bytes_nvml"),
            "first_failure": rep.get("first_failure"),
        }
        if rep.get("save_load"):
            legs_out[leg]["save_load"] = {k: v for k, v in rep["save_load"].items() if k != "checkpoint_files"}
        progress(f"parity leg {leg}: exit {rc}")
    la: list = legs_out["ddp"]["losses"] or []
    lb: list = legs_out["fsdp"]["losses"] or []
    num = (int, float)
    # unequal lengths are judged below (a leg that stopped early fails the parity)
    diffs = [abs(x - y) for x, y in zip(la, lb, strict=False) if isinstance(x, num) and isinstance(y, num)]
    ok = bool(diffs) and len(diffs) == len(la) == len(lb) and all(math.isfinite(d) for d in diffs)
    worst = max(diffs) if diffs else None
    report.data["legs"] = legs_out
    report.data["parity"] = {
        "steps_compared": len(diffs),
        "max_abs_loss_diff": worst,
        "per_step_abs_diff": diffs,
        "atol": a.parity_atol,
        "passed": bool(ok and worst <= a.parity_atol),
    }
    if report.data["parity"]["passed"] and all(v["exit_code"] == 0 for v in legs_out.values()):
        report.end()
        report.data["result"] = "passed"
        report.write()
        return 0
    report.data["phases"]["parity"]["status"] = "failed"
    report.data["result"] = "failed"
    report.data["first_failure"] = report.data["first_failure"] or {
        "phase": "parity",
        "type": "LegFailed" if any(v["exit_code"] != 0 for v in legs_out.values()) else "ParityMismatch",
        "message": f"max |loss(DDP) - loss(FSDP)| = {worst} (atol {a.parity_atol}); legs: "
        + ", ".join(f"{k} exit {v['exit_code']}" for k, v in legs_out.items()),
    }
    report.write()
    return 1


def strip_args(argv: list[str], drop: set[str]) -> list[str]:
    """``argv`` without the options in ``drop`` (and the value of those that take one)."""
    takes_value = {"--strategy", "--out", "--world-size", "--rank"}
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in drop:
            skip = name in takes_value and "=" not in arg
            continue
        out.append(arg)
    return out
