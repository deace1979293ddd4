#!/usr/bin/env python3
"""Turn ``gpu_dtype_override_and_stop.sh``'s raw folder into ``benchmarks/results/dtype_override_and_stop_1xh100.json``.

Reads only what the script wrote and runs nothing:

* ``dtype_string.*`` and ``dtype_yaml.*``: the command, its exit code, its JSON summary and the engine's
  log, for a dtype field whose default is None given as a string override and the same field in Bridge's
  YAML dtype form; the row carries the first failure (phase, type, message, innermost frame) and the
  mixed-precision policy Megatron FSDP was built with, as the engine log prints it;
* ``stop/``: a training rehearsal stopped with SIGTERM: the command's exit code and last stderr lines,
  the GPU's compute processes before and after (nvidia-smi), and the processes left that belong to the
  stopped command (none may be; processes of other commands that were running are named as such).

    python3 benchmarks/dtype_stop_result.py benchmarks/results/raw/dtype_override_and_stop_1xh100
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

BENCHMARK = "dtype_override_and_stop_1xh100"
TITLE = (
    "A dtype override given as a string against Bridge's YAML dtype form, and SIGTERM to a training rehearsal, "
    "on one H100"
)
COLUMNS = ["check", "command", "exit code", "result", "evidence"]
POLICY = re.compile(r"MixedPrecisionPolicy\(([^)]*)\)")


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _apps(path: Path) -> list[dict]:
    rows = list(csv.reader(io.StringIO(_text(path))))
    return [{"pid": int(r[0]), "used": r[2].strip()} for r in rows[1:] if len(r) >= 3 and r[0].strip().isdigit()]


def dtype_row(raw: Path, name: str, label: str) -> dict:
    summary = _json(raw / f"{name}.json") or {}
    rank = (summary.get("ranks") or [{}])[0]
    f = rank.get("failure") or {}
    policy = POLICY.search(_text(raw / f"{name}.engine_log.txt"))
    return {
        "check": label,
        "command": _text(raw / f"{name}.cmd").strip(),
        "exit_code": int(_text(raw / f"{name}.rc").strip() or -1),
        "result": rank.get("result"),
        "failure": {k: f.get(k) for k in ("phase", "type", "message", "site")} if f else None,
        "first_error_line": f"{f.get('type')}: {f.get('message')}" if f else None,
        "mixed_precision_policy": policy.group(1) if policy else None,
    }


def stop_row(raw: Path) -> dict:
    stop = raw / "stop"
    rep = _json(stop / "engine_report.json") or {}
    engine_pid = rep.get("host_pid")
    before = _apps(stop / "before.apps.csv")
    after = _apps(stop / "after.apps.csv")
    stderr = _text(stop / "cli.stderr").strip().splitlines()
    others = _text(stop / "processes_after.txt").strip().splitlines()
    return {
        "check": "SIGTERM to `mfsdp.py rehearse` while it trains",
        "command": "timeout-style SIGTERM to: mfsdp.py rehearse --model-preset llama-1b --world-size 8 --perf "
        "--warmup 1 --iters 5000",
        "exit_code": int(_text(stop / "cli.rc").strip() or -1),
        "engine_pid": engine_pid,
        "engine_gpu_memory_before": next((a["used"] for a in before if a["pid"] == engine_pid), None),
        "engine_listed_after": any(a["pid"] == engine_pid for a in after),
        "engine_failure": (rep.get("first_failure") or {}).get("message"),
        "cli_last_lines": stderr[-3:],
        "gpu_processes_after": after,
        "other_processes_after": others,
        "sigterm_utc": _text(stop / "sigterm_utc").strip(),
    }


def build(raw: Path) -> dict:
    s = dtype_row(raw, "dtype_string", "ddp.megatron_fsdp_main_grads_dtype=fp32 as a KEY=VALUE override")
    y = dtype_row(raw, "dtype_yaml", "the same field in the YAML dtype form {_target_: torch.float32, _call_: false}")
    t = stop_row(raw)
    stray = [p for p in t["gpu_processes_after"] if p["pid"] == t["engine_pid"]]
    rows = [s, y, t]
    table = [
        [
            s["check"],
            s["command"],
            s["exit_code"],
            s["first_error_line"],
            f"{(s['failure'] or {}).get('phase')} at "
            f"{(s['failure'] or {}).get('site')}; policy {s['mixed_precision_policy']}",
        ],
        [y["check"], y["command"], y["exit_code"], y["result"], f"policy {y['mixed_precision_policy']}"],
        [
            t["check"],
            t["command"],
            t["exit_code"],
            "; ".join(t["cli_last_lines"][-2:]),
            f"engine pid {t['engine_pid']} held {t['engine_gpu_memory_before']} before; listed after: "
            f"{t['engine_listed_after']}",
        ],
    ]
    notes = [
        "Bridge's override path turns a string into a dtype only where the field already holds one "
        "(megatron/bridge/training/utils/omegaconf_utils.py :: _apply_overrides); this field defaults to None, so "
        "the string reached Megatron FSDP's mixed-precision policy as a string (the policy line above) and failed "
        "when the buffers were built. The YAML form, which is how Bridge's own to_yaml writes a dtype "
        "(megatron/training/config/yaml_utils.py :: _torch_dtype_representer), is instantiated to torch.float32.",
        f"After SIGTERM the command exited {t['exit_code']} (128 + 15) having stopped its engine's process group; "
        f"the engine (pid {t['engine_pid']}, {t['engine_gpu_memory_before']} on the GPU before) is "
        f"{'still listed' if stray else 'not listed'} among the GPU's compute processes after. The processes "
        f"listed after are other rehearsals started in the same machine call, not the stopped command's: "
        + " | ".join(re.sub(r"\s+", " ", o)[:160] for o in t["other_processes_after"] if "rehearse_train.py" in o),
    ]
    return {
        "benchmark": BENCHMARK,
        "title": TITLE,
        "date": t["sigterm_utc"][:10] or None,
        "machine": "1x NVIDIA H100 80GB HBM3",
        "command": f"bash benchmarks/gpu_dtype_override_and_stop.sh RAW; python3 benchmarks/dtype_stop_result.py "
        f"benchmarks/results/raw/{BENCHMARK}",
        "columns": COLUMNS,
        "rows": rows,
        "table_rows": table,
        "notes": notes,
        "raw": {"folder": f"benchmarks/results/raw/{BENCHMARK}"},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="dtype_stop_result.py", description=__doc__.split("\n\n")[0])
    p.add_argument("raw", type=Path)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / f"{BENCHMARK}.json")
    a = p.parse_args(argv)
    import raw_store  # beside this script: a packed raw folder is read from the archive

    a.raw = raw_store.resolve(a.raw)
    if not (a.raw / "stop").is_dir():
        sys.stderr.write(f"dtype_stop_result.py: error: {a.raw} has no stop/ folder\n")
        return 2
    from mfsdp_lib import config_io

    config_io.write_atomic(str(a.out), json.dumps(build(a.raw), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
