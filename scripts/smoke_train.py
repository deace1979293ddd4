#!/usr/bin/env python3
"""Training entry for the GPU smoke test and the strategy benchmark (run under torchrun).

``mfsdp.py smoke`` and ``benchmarks/bench_strategies.py`` launch this file with the
real launcher (``python -m torch.distributed.run ...``); ``tests/gpu/test_smoke_gpu.py``
calls :func:`run` in-process from pytest ranks started the same way. One code path
therefore serves the user-facing command, the pytest criterion and the benchmark.

What one run does, and why each step is there:

1. Build a Megatron-Bridge ``ConfigContainer`` for a small Llama-3-shaped
   ``GPTModelProvider`` on mock data with ``NullTokenizer`` (no downloads, no hub:
   recipes such as ``llama3_8b_pretrain_config()`` read the Hugging Face hub).
2. Turn on the chosen strategy. For Megatron FSDP this goes through
   ``mfsdp_lib.enable.MINIMAL_OVERRIDES`` and ``enable.apply_to_object`` - the very
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

Every rank writes ``rank<R>.json`` into ``--out``; the launcher merges them. The
module imports torch and megatron only inside functions, so ``--help`` and the CPU
tests work without them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

sys.dont_write_bytecode = True  # no unsigned .pyc in the skill folder (see SECURITY.md)
sys.pycache_prefix = os.path.join(os.devnull, "no-bytecode")  # and none read from its __pycache__

_HERE = os.path.dirname(os.path.realpath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

# Strategy names as the CLI takes them. The last three are Megatron FSDP's
# ``ddp.data_parallel_sharding_strategy`` values (megatron_fsdp 0.6.1 also has
# ``no_shard``, which is plain data parallelism through the FSDP wrapper).
FSDP_STRATEGIES = ("optim", "optim_grads", "optim_grads_params")
STRATEGIES = ("ddp", "distopt") + FSDP_STRATEGIES

# Model shapes (Llama 3 style: RMSNorm, SwiGLU, RoPE, GQA, untied embeddings).
# "small" is the shape of Bridge's own Megatron FSDP functional test (2 layers,
# hidden 768); "llama-1b" is Llama 3.2 1B's trunk (16 layers, hidden 2048, FFN 8192,
# 32 heads, 8 KV groups) so that model state, not activations, dominates memory.
MODEL_SHAPES = {
    "tiny": dict(num_layers=2, hidden_size=256, ffn_hidden_size=688, num_attention_heads=4, num_query_groups=2),
    "small": dict(num_layers=2, hidden_size=768, ffn_hidden_size=2688, num_attention_heads=16, num_query_groups=8),
    "llama-1b": dict(num_layers=16, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=32, num_query_groups=8),
}
NULL_TOKENIZER_VOCAB = 32000  # NullTokenizer needs an explicit vocabulary size; Llama 2's size.

# Forward-only loss before/after the checkpoint round trip must agree within
# torch.testing's default tolerance for bf16 (rtol 1.6e-2, atol 1e-5): the model
# computes in bf16, so that is the finest difference that means anything.
RESUME_RTOL = 1.6e-2
RESUME_ATOL = 1e-5

WARMUP_STEPS = 2  # the first steps include kernel autotuning and allocator growth; left out of step time


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="smoke_train.py",
        description="Megatron-Bridge pretrain of a small Llama on mock data; run under torchrun.",
    )
    p.add_argument("--strategy", choices=STRATEGIES, default="optim_grads_params")
    p.add_argument("--model", choices=sorted(MODEL_SHAPES), default="small")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--seq-length", type=int, default=512)
    p.add_argument("--global-batch-size", type=int, default=8)
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument(
        "--save-resume",
        action="store_true",
        help="save at the last iteration, reload into a fresh model, compare forward loss",
    )
    p.add_argument("--out", required=True, help="folder for rank<R>.json, run_config.yaml and checkpoints")
    return p


# --------------------------------------------------------------------------- config


def minimal_fsdp_overrides(strategy: str) -> tuple[dict, str]:
    """The overrides ``mfsdp.py enable`` applies, with the sharding strategy chosen."""
    from mfsdp_lib.enable import MINIMAL_OVERRIDES

    overrides = dict(MINIMAL_OVERRIDES)
    overrides["ddp.data_parallel_sharding_strategy"] = strategy
    return overrides, "mfsdp_lib.enable.MINIMAL_OVERRIDES"


def strategy_overrides(strategy: str) -> tuple[dict, str]:
    if strategy in FSDP_STRATEGIES:
        return minimal_fsdp_overrides(strategy)
    distopt = strategy == "distopt"
    return (
        {
            "dist.use_megatron_fsdp": False,
            "ddp.use_megatron_fsdp": False,
            "ddp.use_distributed_optimizer": distopt,
            "optimizer.use_distributed_optimizer": distopt,
            # overlap_param_gather only exists for the distributed optimizer's all-gather.
            "ddp.overlap_param_gather": distopt,
            "optimizer.overlap_param_gather": distopt,
            "checkpoint.ckpt_format": "torch_dist",
        },
        "plain Bridge settings",
    )


def build_config(args, save_dir: str | None = None, load_dir: str | None = None):
    """A ConfigContainer for ``args``; ``save_dir``/``load_dir`` set checkpointing."""
    import torch
    import torch.nn.functional as F
    from megatron.bridge.models.gpt_provider import GPTModelProvider
    from megatron.bridge.training.config import (
        CheckpointConfig,
        ConfigContainer,
        DistributedDataParallelConfig,
        DistributedInitConfig,
        LoggerConfig,
        MockGPTDatasetConfig,
        OptimizerConfig,
        RNGConfig,
        SchedulerConfig,
        TokenizerConfig,
        TrainingConfig,
        ValidationConfig,
    )

    shape = MODEL_SHAPES[args.model]
    model = GPTModelProvider(
        normalization="RMSNorm",
        activation_func=F.silu,
        gated_linear_unit=True,
        position_embedding_type="rope",
        rotary_base=500_000,
        add_bias_linear=False,
        share_embeddings_and_output_weights=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        init_method_std=0.01,
        layernorm_epsilon=1e-5,
        seq_length=args.seq_length,
        tensor_model_parallel_size=1,
        pipeline_model_parallel_size=1,
        context_parallel_size=1,
        sequence_parallel=False,
        attention_softmax_in_fp32=True,
        make_vocab_size_divisible_by=128,
        vocab_size=None,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        # No APEX in plain PyTorch images: the fused wgrad accumulation kernel is missing
        # and ColumnParallelLinear raises at the first step if this stays True.
        gradient_accumulation_fusion=False,
        **shape,
    )
    iters = args.iters
    cfg = ConfigContainer(
        model=model,
        dist=DistributedInitConfig(),
        train=TrainingConfig(
            train_iters=iters,
            global_batch_size=args.global_batch_size,
            micro_batch_size=args.micro_batch_size,
            exit_signal_handler=True,
        ),
        validation=ValidationConfig(eval_interval=iters + 1, eval_iters=0),
        optimizer=OptimizerConfig(
            optimizer="adam",
            bf16=True,
            fp16=False,
            adam_beta1=0.9,
            adam_beta2=0.95,
            adam_eps=1e-5,
            clip_grad=1.0,
            lr=3e-4,
            min_lr=3e-5,
            weight_decay=0.01,
        ),
        scheduler=SchedulerConfig(
            lr_decay_style="cosine",
            lr_warmup_iters=2,
            lr_warmup_init=0.0,
            lr_decay_iters=iters,
            start_weight_decay=0.01,
            end_weight_decay=0.01,
            weight_decay_incr_style="constant",
            override_opt_param_scheduler=True,
        ),
        ddp=DistributedDataParallelConfig(
            check_for_nan_in_grad=True, grad_reduce_in_fp32=True, overlap_grad_reduce=True, average_in_collective=False
        ),
        dataset=MockGPTDatasetConfig(
            seq_length=args.seq_length,
            random_seed=1234,
            reset_attention_mask=False,
            reset_position_ids=False,
            eod_mask_loss=False,
            num_dataset_builder_threads=1,
            data_sharding=True,
            dataloader_type="single",
            num_workers=1,
        ),
        logger=LoggerConfig(log_interval=1, log_memory_to_tensorboard=False),
        tokenizer=TokenizerConfig(tokenizer_type="NullTokenizer", vocab_size=NULL_TOKENIZER_VOCAB),
        checkpoint=CheckpointConfig(
            save=save_dir,
            load=load_dir,
            save_interval=iters if save_dir else None,
            fully_parallel_save=True,
            async_save=False,
        ),
        rng=RNGConfig(seed=1234),
    )
    from mfsdp_lib.enable import apply_to_object

    overrides, source = strategy_overrides(args.strategy)
    apply_to_object(cfg, overrides)
    return cfg, {
        "overrides": {k: _jsonable(v) for k, v in overrides.items()},
        "overrides_source": source,
        "applied_by": "mfsdp_lib.enable.apply_to_object",
    }


def _jsonable(v):
    return v if isinstance(v, (str, int, float, bool, type(None))) else repr(v)


def run_our_check(yaml_path: str) -> dict:
    """Our rules on the container's real to_yaml() output."""
    try:
        from mfsdp_lib import config_io, rules
    except ImportError as exc:
        return {"available": False, "why": f"mfsdp_lib rules not importable: {exc}"}
    try:
        import torch

        arch = "sm_%d%d" % torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    except ImportError:
        arch = None
    try:
        cfg = config_io.load_effective(yaml_path)
        findings = rules.evaluate(cfg, dict(os.environ), gpu_arch=arch)
        rows = [f.to_dict() for f in findings]
        return {"available": True, "ok": not any(r["severity"] == "error" for r in rows), "findings": rows}
    except Exception as exc:  # record, do not stop the run: the Bridge verdict is still wanted
        return {"available": True, "ok": False, "crashed": f"{type(exc).__name__}: {exc}"}


# --------------------------------------------------------------------------- training


class _StepMeter:
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
        loss = None
        if ctx.loss_dict:
            key = next((k for k in ctx.loss_dict if "loss" in k), next(iter(ctx.loss_dict)))
            loss = float(ctx.loss_dict[key])
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


def forward_only_loss(forward_step_func, setup_out) -> float | None:
    """One forward-only pass over the next global batch; the reduced LM loss.

    Same data position before save and after load (the loaded train state restores
    the consumed-samples counter), so equal weights give an equal loss.
    """
    import torch
    from megatron.bridge.training.utils.train_utils import prepare_forward_step_func
    from megatron.core.num_microbatches_calculator import get_num_microbatches
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
    from megatron.core.utils import get_model_config

    state, model, pgs = setup_out.state, setup_out.model, setup_out.pg_collection
    cfg = state.cfg
    fwd_bwd = get_forward_backward_func(pp_size=pgs.pp.size(), vp_size=cfg.model.virtual_pipeline_model_parallel_size)
    for chunk in model:
        chunk.eval()
    with torch.no_grad():
        out = fwd_bwd(
            forward_step_func=prepare_forward_step_func(forward_step_func, state),
            data_iterator=setup_out.train_data_iterator,
            model=model,
            num_microbatches=get_num_microbatches(),
            seq_length=cfg.model.seq_length,
            micro_batch_size=cfg.train.micro_batch_size,
            decoder_seq_length=cfg.model.seq_length,
            forward_only=True,
            p2p_communicator=P2PCommunicator(pp_group=pgs.pp, config=get_model_config(model[0])),
            pg_collection=pgs,
        )
    if not out:
        return None  # not the last pipeline stage
    key = next(k for k in out[0] if "loss" in k)
    parts = [x[key].view(-1).float() for x in out]
    if parts[0].numel() == 2:  # (sum of token losses, token count): reduce over data parallel ranks
        tot = torch.vstack(parts).sum(dim=0)
        torch.distributed.all_reduce(tot, group=pgs.dp_cp)
        return float(tot[0] / tot[1])
    return float(torch.cat(parts).mean())


def _setup(cfg, meter=None):
    from megatron.bridge.data.utils import get_dataset_provider
    from megatron.bridge.training.callbacks import CallbackManager
    from megatron.bridge.training.setup import setup
    from megatron.bridge.training.state import GlobalState

    manager = CallbackManager()
    if meter is not None:
        manager.register("on_train_step_start", meter.start)
        manager.register("on_train_step_end", meter.end)
    state = GlobalState()
    state.cfg = cfg
    return setup(state, get_dataset_provider(cfg.dataset), callback_manager=manager), manager


def _validate(cfg) -> dict:
    from megatron.bridge.training.config import runtime_config_update

    try:
        runtime_config_update(cfg)
        return {"ok": True}
    except Exception as exc:
        return {"ok": False, "error_type": type(exc).__name__, "error": str(exc)[:2000]}


def _summarise_steps(steps: list[dict], tokens_per_step: int) -> dict:
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
        "versions": _versions(),
        "ckpt_dir": ckpt_dir,
    }
    try:
        from megatron.bridge.training.gpt_step import forward_step
        from megatron.bridge.training.train import _finish_train, train

        cfg, how = build_config(args, save_dir=ckpt_dir)
        record["config"] = how
        yaml_path = os.path.join(out, "run_config.yaml")
        if rank == 0:
            cfg.to_yaml(yaml_path)
            record["check"] = run_our_check(yaml_path)
        record["bridge_validate"] = _validate(cfg)
        if not record["bridge_validate"]["ok"]:
            raise RuntimeError("Bridge rejected the config: " + record["bridge_validate"]["error"])

        meter = _StepMeter()
        torch.cuda.reset_peak_memory_stats()
        so, manager = _setup(cfg, meter)
        record["allocated_after_setup_bytes"] = torch.cuda.memory_allocated()
        record["parameters"] = _count_parameters(so.model)
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
        record["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        record["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        record["steps"] = meter.steps
        record.update(_summarise_steps(meter.steps, args.global_batch_size * args.seq_length))
        if args.save_resume:
            before = forward_only_loss(forward_step, so)
            _finish_train(so.state, so.checkpoint_manager)
            torch.distributed.barrier()
            del so
            cfg2, _ = build_config(args, load_dir=ckpt_dir)
            v2 = _validate(cfg2)
            if not v2["ok"]:
                raise RuntimeError("Bridge rejected the resume config: " + v2["error"])
            so2, _ = _setup(cfg2)
            after = forward_only_loss(forward_step, so2)
            record["resumed_iteration"] = int(so2.state.train_state.step)
            _finish_train(so2.state, so2.checkpoint_manager)
            delta = None if before is None or after is None else abs(after - before)
            record["save_resume"] = {
                "loss_before_save": before,
                "loss_after_load": after,
                "abs_delta": delta,
                "rtol": RESUME_RTOL,
                "atol": RESUME_ATOL,
                "equal": delta is not None and delta <= RESUME_ATOL + RESUME_RTOL * abs(before),
            }
        else:
            _finish_train(so.state, so.checkpoint_manager)
        record["error"] = None
    except BaseException as exc:  # keep the evidence: the launcher reports it
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()[-4000:]
        _write(out, rank, record)
        raise
    _write(out, rank, record)
    return record


def _count_parameters(model) -> int | None:
    """Parameters of the model (global count: FSDP's DTensor parameters report their full shape)."""
    try:
        seen, total = set(), 0
        for chunk in model:
            for p in chunk.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
        return total
    except Exception:
        return None


def _write(out: str, rank: int, record: dict) -> None:
    import tempfile

    path = os.path.join(out, f"rank{rank}.json")
    fd, tmp = tempfile.mkstemp(prefix=f".rank{rank}.", suffix=".tmp", dir=out)  # a new file: never through a link
    with os.fdopen(fd, "w") as fh:
        json.dump(record, fh, indent=1, default=str)
    os.replace(tmp, path)


def _versions() -> dict:
    from importlib import metadata

    got = {}
    for name in ("torch", "megatron-bridge", "megatron-core", "megatron-fsdp", "transformer-engine"):
        try:
            got[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            got[name] = None
    return got


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        import megatron.bridge  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        sys.stderr.write(f"smoke_train.py: needs torch and Megatron-Bridge on a CUDA machine ({exc})\n")
        return 2
    run(args)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
