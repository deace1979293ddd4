"""``mfsdp.py log FILE|-``: judge a training log against the smoke criteria.

Thin glue over ``logs.analyse`` / ``logs.judge``. Exit 0 only when the smoke criteria hold (at least one
iteration, a finite last loss, no known failure signature, and - when pytest output is present - passes and no
failures); 1 otherwise; 2 when the input cannot be read or holds no training log at all. The JSON has the same
``{"ok", "findings": [...]}`` shape as ``check`` plus the measured facts.
"""

from __future__ import annotations

from ..findings import exit_code, render_json, render_text
from ..runs import logs

DESCRIPTION = """\
Judge a Megatron-Bridge / Megatron-Core training log (and any pytest output in it) without a GPU.

Reads the log once, line by line (multi-gigabyte logs are fine), through torchrun rank prefixes
([rank0]:, [default0]:), interleaved ranks, ANSI colour, carriage returns and a truncated last line.
Reports iterations seen, first and last loss, whether the last loss is finite (Bridge omits a NaN loss from
its line), skipped and NaN iteration counts, checkpoint saves and loads, the pytest summary, and every known
failure signature with its fix (Megatron FSDP checkpoint-format assertions, use_megatron_fsdp + use_torch_fsdp2,
CUDA_DEVICE_MAX_CONNECTIONS, use_tp_pp_dp_mapping, CUDA OOM, NCCL errors and timeouts, FSDP2's pg_collection
TypeError, NaN/Inf validation, dataset-helper Makefile, gradient_accumulation_fusion without APEX, HF hub offline).
"""

EPILOG = """\
examples:
  mfsdp.py log train.log
  torchrun ... 2>&1 | tee run.log; mfsdp.py log run.log --format json | jq .loss
  pytest tests/test_smoke.py 2>&1 | mfsdp.py log -      # smoke: '1 passed', finite loss, no failure

exit codes: 0 smoke criteria hold, 1 they do not, 2 unreadable input or no training log in it.
"""


def configure(parser) -> None:
    parser.add_argument("file", metavar="FILE", help="the log file, or '-' for stdin")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")


def run(args) -> int:
    stream = logs.open_log(args.file)
    try:
        report = logs.analyse(stream, source=args.file)
    finally:
        if args.file != "-":
            stream.close()
    findings = logs.judge(report)
    facts = report.to_dict()
    if args.format == "json":
        render_json(findings, **facts)
    else:
        render_text(findings, header=_header(report, facts))
    return exit_code(findings)


def _header(r: logs.LogReport, facts: dict) -> str:
    it = facts["iterations"]
    loss = facts["loss"]
    ranks = facts["ranks"]
    who = f", rank {ranks[0]}" if len(ranks) == 1 else (f", ranks {_ranks(ranks)}" if ranks else "")
    out = [f"log: {r.source} ({r.lines} lines{who})"]
    if it["count"]:
        out.append(
            f"iterations: {it['count']} lines, {it['first']} -> {it['last']} of {it['train_iters']}"
            + (f", {it['restarts']} restart(s)" if it["restarts"] else "")
        )
    else:
        out.append("iterations: none")
    if loss["key"]:
        out.append(
            f"{loss['key']}: first {loss['first']} (it {loss['first_iteration']}), last "
            f"{'left out (NaN)' if loss.get('missing_at_last_iteration') else loss['last']} "
            f"(it {loss['last_iteration']}), finite: {'yes' if loss['last_finite'] else 'NO'}"
            + (
                f"; first NaN: it {loss['first_nonfinite_iteration']}, last finite {loss['last_finite_value']} "
                f"(it {loss['last_finite_iteration']})"
                if loss.get("first_nonfinite_iteration") is not None
                else ""
            )
        )
    out.append(f"skipped iterations: {facts['skipped_iterations']}, nan iterations: {facts['nan_iterations']}")
    ck = facts["checkpoints"]
    if ck["saves_total"] or ck["loads_total"]:
        saves = ", ".join(
            f"{s['iteration']}{'' if s['completed'] else ' (not confirmed)'}"
            + (f" {s['format']}" if s.get("format") else "")
            for s in ck["saves"][:6]
        )
        loads = ", ".join(f"{x['iteration']}" + ("" if x["completed"] else " (not confirmed)") for x in ck["loads"][:6])
        out.append(f"checkpoints: {ck['saves_total']} save(s) [{saves}], {ck['loads_total']} load(s) [{loads}]")
    if facts["pytest"]:
        out.append(f"pytest: {facts['pytest']['summary']}")
    return "\n".join(out) + "\n"


def _ranks(ranks: list[int]) -> str:
    return ",".join(map(str, ranks[:8])) + (f",... ({len(ranks)})" if len(ranks) > 8 else "")
