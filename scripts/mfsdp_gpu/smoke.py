"""One smoke / strategy-benchmark rank (``scripts/smoke_train.py``, run under torchrun).

``mfsdp.py smoke`` and ``benchmarks/bench_strategies.py`` launch ``smoke_train.py`` with the
real launcher (``python -m torch.distributed.run ...``); ``tests/gpu/test_smoke_gpu.py``
calls :func:`run` in-process from pytest ranks started the same way. One code path
therefore serves the user-facing command, the pytest criterion and the benchmark.

What one run does, and why each step is there:

1. Build a Megatron-Bridge ``ConfigContainer`` for a small Llama-3-shaped
   ``GPTModelProvider`` on mock data with ``NullTokenizer`` (no downloads, no hub:
   recipes such as ``llama3_8b_pretrain_config()`` read the Hugging Face hub).
2. Turn on the chosen strategy. For Megatron FSDP this goes through
   ``mfsdp_lib.enable.MINIMAL_OVERRIDES`` (``bridge.strategy_settings``) and
   ``enable.apply_to_object`` - the very
   settings ``mfsdp.py enable`` tells users to apply - so the smoke proves that
   those settings train, not a hand-written copy of them.
3. Write the container's own ``to_yaml()`` and run our ``check`` rules on it, then
   run Bridge's ``runtime_config_update`` (which ends in ``ConfigContainer.validate()``).
   Both verdicts are recorded: a disagreement is a bug in one of them.
4. ``setup`` + ``train`` with a callback that times each step (CUDA-synchronised)
   and keeps the reduced loss; afterwards ``torch.cuda.max_memory_allocated``.
5. With ``--save-resume``: the run saves at its last iteration, computes a
   forward-only loss on the next batch, then a fresh model is set up from the
   checkpoint and computes the forward-only loss on the same batch. A correct
   ``fsdp_dtensor`` round trip gives the same loss (compared within bf16 tolerance).

Every rank writes ``rank<R>.json`` into ``--out``; the launcher merges them.
"""

from __future__ import annotations

import os
import sys
import traceback

from . import bridge, checkpoint
from .args import smoke_parser
from .measure import global_param_count
from .presets import SMOKE_SHAPES
from .report import scalar_or_repr, versions, write_rank_record
from .steps import SmokeStepMeter, run_train, summarise_steps

PROG = "smoke_train.py"


def build_config(args, save_dir: str | None = None, load_dir: str | None = None):
    """A ConfigContainer for ``args``; ``save_dir``/``load_dir`` set checkpointing."""
    iters = args.iters
    cfg = bridge.config_container(
        bridge.model_provider(SMOKE_SHAPES[args.model], args.seq_length),
        iters=iters,
        global_batch_size=args.global_batch_size,
        micro_batch_size=args.micro_batch_size,
        warmup_iters=2,
        checkpoint=dict(save=save_dir, load=load_dir, save_interval=iters if save_dir else None),
        train=dict(exit_signal_handler=True),
    )
    from mfsdp_lib.enable import apply_to_object

    overrides, source = bridge.strategy_settings(args.strategy), bridge.strategy_source(args.strategy)
    apply_to_object(cfg, overrides)
    return cfg, {
        "overrides": {k: scalar_or_repr(v) for k, v in overrides.items()},
        "overrides_source": source,
        "applied_by": "mfsdp_lib.enable.apply_to_object",
    }


def run_our_check(yaml_path: str) -> dict:
    """Our rules on the container's real to_yaml() output."""
    try:
        from mfsdp_lib import config_io, rules
    except ImportError as exc:
        return {"available": False, "why": f"mfsdp_lib rules not importable: {exc}"}
    try:
        import torch

        arch = "sm_{}{}".format(*torch.cuda.get_device_capability()) if torch.cuda.is_available() else None
    except ImportError:
        arch = None
    try:
        cfg = config_io.load_effective(yaml_path)
        findings = rules.evaluate(cfg, dict(os.environ), gpu_arch=arch)
        rows = [f.to_dict() for f in findings]
        return {"available": True, "ok": not any(r["severity"] == "error" for r in rows), "findings": rows}
    except Exception as exc:  # record, do not stop the run: the Bridge verdict is still wanted
        return {"available": True, "ok": False, "crashed": f"{type(exc).__name__}: {exc}"}


def run(args) -> dict:
    """Run one smoke/benchmark job on this rank; return (and write) this rank's record."""
    import torch

    out = os.path.abspath(args.out)
    if torch.cuda.is_available():  # before any CUDA call, so rank R never opens a context on GPU 0
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.makedirs(out, exist_ok=True)
    ckpt_dir = os.path.join(out, "checkpoints") if args.save_resume else None
    record: dict = {
        "rank": rank,
        "world_size": world,
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "strategy": args.strategy,
        "model": args.model,
        "seq_length": args.seq_length,
        "global_batch_size": args.global_batch_size,
        "micro_batch_size": args.micro_batch_size,
        "iters": args.iters,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "versions": versions(),
        "ckpt_dir": ckpt_dir,
    }
    try:
        from megatron.bridge.training.gpt_step import forward_step

        cfg, how = build_config(args, save_dir=ckpt_dir)
        record["config"] = how
        yaml_path = os.path.join(out, "run_config.yaml")
        if rank == 0:
            cfg.to_yaml(yaml_path)
            record["check"] = run_our_check(yaml_path)
        record["bridge_validate"] = bridge.validate(cfg)
        if not record["bridge_validate"]["ok"]:
            raise RuntimeError("Bridge rejected the config: " + record["bridge_validate"]["error"])

        meter = SmokeStepMeter()
        torch.cuda.reset_peak_memory_stats()
        manager = bridge.callback_manager(meter)
        so = bridge.setup(cfg, manager)
        record["allocated_after_setup_bytes"] = torch.cuda.memory_allocated()
        record["parameters"] = global_param_count(so.model)
        run_train(so, manager, forward_step)
        record["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        record["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        record["steps"] = meter.steps
        record.update(summarise_steps(meter.steps, args.global_batch_size * args.seq_length))
        if args.save_resume:
            before = checkpoint.forward_only_loss(forward_step, so)
            checkpoint.finish(so)
            torch.distributed.barrier()
            del so
            cfg2, _ = build_config(args, load_dir=ckpt_dir)
            v2 = bridge.validate(cfg2)
            if not v2["ok"]:
                raise RuntimeError("Bridge rejected the resume config: " + v2["error"])
            so2 = bridge.setup(cfg2, bridge.callback_manager())
            after = checkpoint.forward_only_loss(forward_step, so2)
            record["resumed_iteration"] = int(so2.state.train_state.step)
            checkpoint.finish(so2)
            delta, equal = checkpoint.losses_agree(before, after)
            record["save_resume"] = {
                "loss_before_save": before,
                "loss_after_load": after,
                "abs_delta": delta,
                "rtol": checkpoint.RESUME_RTOL,
                "atol": checkpoint.RESUME_ATOL,
                "equal": equal,
            }
        else:
            checkpoint.finish(so)
        record["error"] = None
    except BaseException as exc:  # keep the evidence: the launcher reports it
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()[-4000:]
        write_rank_record(out, rank, record)
        raise
    write_rank_record(out, rank, record)
    return record


def main(argv=None) -> int:
    """``smoke_train.py``: exit 0 when this rank's run finished, 2 without torch or Megatron-Bridge."""
    args = smoke_parser().parse_args(argv)
    try:
        import megatron.bridge  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        sys.stderr.write(f"{PROG}: needs torch and Megatron-Bridge on a CUDA machine ({exc})\n")
        return 2
    run(args)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0
