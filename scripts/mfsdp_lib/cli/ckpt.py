"""``mfsdp.py ckpt PATH``: tell a checkpoint's real format and whether it matches its run config.

Thin glue over ``checkpoints.inspect``: argument parsing, the text report and the JSON object. The JSON has
the same ``{"ok", "findings": [...]}`` shape as ``check`` plus ``format``, ``iterations``, ``latest``,
``config`` (the fields ``run_config.yaml`` recorded) and ``details``. Exit codes: 0 consistent (and
``--expect`` met), 1 error-severity findings, 2 PATH unusable or not a checkpoint.
"""

from __future__ import annotations

import sys

from ..findings import Finding, exit_code, render_json, render_text
from ..runs import checkpoints

DESCRIPTION = """\
Tell a checkpoint's real format from its metadata files (never loads tensors, never needs torch, never
unpickles) and check it against the run_config.yaml Bridge saved with it.

PATH is a checkpoint root (latest_train_state.pt / latest_checkpointed_iteration.txt + iter_NNNNNNN/) or one
iteration folder. Detection follows Megatron-Bridge 0.6.2: metadata.json (Megatron-Core sharded_backend)
= torch_dist, PyTorch DCP .metadata + *.distcp = fsdp_dtensor, config.json + safetensors = hf, and the legacy
Megatron-LM mp_rank_XX/model_optim_rng.pt = torch. A DCP folder without metadata.json whose tensor names,
common.pt or common_state entry are torch_dist's is an incomplete torch_dist save (an interrupted save, or a
copy that dropped metadata.json), not fsdp_dtensor: the fix restores the marker.

Findings: format on disk vs checkpoint.ckpt_format recorded; --expect not met; tracker pointing at a missing
iteration; iteration folder without payload or with missing shards; fsdp_dtensor from a run without Megatron
FSDP (or the reverse); and the conversion that applies, with a `mfsdp.py convert` command only for
paths recorded as run and checked (scripts/data/ckpt_migration_passing.json), printed with this script's
absolute path and quoted paths so it pastes from any folder. A .metadata that names code to
run, or that is too large or too complex to walk in full, is an error: Bridge unpickles it on every rank when it
loads.
"""

EPILOG = """\
examples:
  mfsdp.py ckpt /results/checkpoints                     # the root: latest iteration, trackers, all folders
  mfsdp.py ckpt /results/checkpoints/iter_0001000        # one iteration folder
  mfsdp.py ckpt /results/checkpoints --expect fsdp_dtensor   # exit 1 (with the conversion command) if not
  mfsdp.py ckpt /results/checkpoints --format json | jq .format

exit codes: 0 consistent, 1 error findings (or --expect not met), 2 not a checkpoint / unreadable.
"""


def configure(parser) -> None:
    parser.add_argument("path", metavar="PATH", help="checkpoint root or one iteration folder")
    parser.add_argument(
        "--expect",
        choices=("fsdp_dtensor", "torch_dist", "hf", "torch"),
        help="the format the checkpoint must have (exit 1 with a conversion command if not)",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    parser.add_argument(
        "--trust-pickle",
        action="store_true",
        help="also read .metadata with torch's DCP reader (executes the pickle: only for files you trust; needs torch)",
    )


def run(args) -> int:
    report = checkpoints.inspect(args.path, expect=args.expect)
    details = report.to_dict()
    if args.trust_pickle:
        info = report.inspected
        if (
            info is not None
            and info.format in ("fsdp_dtensor", "torch_dist")
            and checkpoints.DCP_METADATA in info.entries
        ):
            trusted, err = checkpoints.trusted_dcp_summary(info.path)
            if err:
                sys.stderr.write(f"mfsdp.py ckpt: --trust-pickle: {err}\n")
            details["trusted_dcp_metadata"] = trusted
            if trusted is not None:  # the user vouched for the file and torch read it: no longer unchecked
                report.findings = [_vouched(f) if f.rule == checkpoints.UNCHECKED_RULE else f for f in report.findings]
    if args.format == "json":
        render_json(
            report.findings,
            format=report.format,
            iterations=report.iterations,
            latest=report.latest,
            config=report.config,
            details=details,
        )
    else:
        render_text(report.findings, header=_header(report))
    return exit_code(report.findings)


def _vouched(f: Finding) -> Finding:
    """The unchecked-metadata error once torch's reader read the file under --trust-pickle: a warning that says so."""
    return Finding(
        f.rule,
        "warning",
        f.path,
        f"{f.message}; --trust-pickle: torch's DCP reader read it (running the pickle), on your word that the "
        "source is trusted",
        f.fix,
        f.extra,
    )


def _header(r: checkpoints.CheckpointReport) -> str:
    lines = [
        f"checkpoint: {r.path} ({'checkpoint root' if r.kind == 'root' else 'iteration folder'})",
        f"format:     {r.format or 'unknown'}"
        + (" (incomplete save: no metadata.json)" if r.inspected is not None and r.inspected.incomplete else ""),
    ]
    if r.iterations:
        shown = ", ".join(str(i) for i in r.iterations[-8:])
        more = f" (+{len(r.iterations) - 8} earlier)" if len(r.iterations) > 8 else ""
        lines.append(f"iterations: {shown}{more}; latest: {r.latest}")
    for name, val in r.tracker.items():
        if isinstance(val, dict) and "step" in val:
            val = f"step {val['step']}"
        lines.append(f"tracker:    {name} -> {val}")
    info = r.inspected
    if info is not None:
        if info.backend:
            lines.append(f"backend:    metadata.json sharded_backend={info.backend}")
        if info.dcp:
            d = info.dcp
            if d.get("mode"):
                lines.append(f"metadata:   {d['mode']}: shard names read, entries not parsed")
            else:
                gib = d["tensor_bytes"] / 2**30
                lines.append(
                    f"metadata:   {d['tensors']} tensors ({gib:.2f} GiB), {d['objects']} objects; "
                    f"groups: {', '.join(d['key_groups'])}"
                )
            lines.append(f"shards:     {len(d['files'])} named in .metadata, {len(info.shard_files)} on disk")
    if r.config:
        keys = (
            "checkpoint.ckpt_format",
            "ddp.use_megatron_fsdp",
            "dist.use_megatron_fsdp",
            "dist.use_torch_fsdp2",
            "ddp.data_parallel_sharding_strategy",
        )
        lines.append("run_config: " + ", ".join(f"{k}={r.config.get(k)}" for k in keys))
    elif info is not None and info.format in ("fsdp_dtensor", "torch_dist"):
        lines.append("run_config: (none)")
    return "\n".join(lines) + "\n"
