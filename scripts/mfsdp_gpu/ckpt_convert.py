"""The torch side of ``mfsdp.py convert``: one checkpoint in, another out, at world size 1.

``mfsdp_lib/cli/convert.py`` has already refused everything it can without torch and made an empty
temporary folder; this module fills it. Every step goes through a public API of the pinned packages
(Megatron-Bridge 0.6.2, megatron-core 0.19.2, megatron-fsdp 0.6.1, torch.distributed.checkpoint):

* the model's shape: ``megatron.bridge.training.model_load_save.load_model_config`` reads the provider from the
  checkpoint's ``run_config.yaml``; for a Hugging Face folder ``AutoBridge.from_hf_pretrained(...)
  .to_megatron_provider(load_weights=False)``;
* reading weights: torch_dist through ``model_load_save.load_megatron_model`` (Megatron-Core
  ``dist_checkpointing``), fsdp_dtensor through ``checkpointing.load_checkpoint`` on a Megatron FSDP model with
  ``finetune=True, load_optim=False, load_rng=False`` (PyTorch DCP underneath), hf through
  ``AutoBridge.load_hf_weights`` (which fills Megatron FSDP's DTensors too);
* writing: ``checkpointing.save_checkpoint`` with ``save_optim=False, save_rng=False`` and the source's
  ``TrainState`` (so the iteration and consumed samples carry over), in ``torch_dist`` for a plain model and
  ``fsdp_dtensor`` for a Megatron FSDP model; ``AutoBridge.save_hf_pretrained`` for hf (it gathers Megatron
  FSDP's DTensors itself);
* torch_dist -> fsdp_dtensor copies the plain model's state dict into the new model in a pre-wrap hook (the
  provider's own extension point), before Megatron FSDP shards it; fsdp_dtensor -> torch_dist gathers each
  DTensor with megatron-fsdp's ``gather_uneven_dtensor_to_full_tensor`` and loads it into a plain model.
  Both copies check that every parameter was matched, with its shape, or fail.

Parallel sizes are set to 1 (as Bridge's ``load_megatron_model`` does for single-GPU loading); both Megatron
formats reshard on load. Optimizer, scheduler and RNG state are not carried.
"""

from __future__ import annotations

import os
import socket
import time

from . import bridge as bridge_setup

FSDP_STRATEGY = "optim_grads_params"  # what the skill enables; the saved layout does not depend on it at DP=1
SEED = 1234

# Provider fields reset for a world of one, the same fields Bridge's load_megatron_model resets
# (megatron/bridge/training/model_load_save.py :: load_megatron_model).
WORLD_ONE = {
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "context_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "expert_tensor_parallel_size": 1,
    "virtual_pipeline_model_parallel_size": None,
    "num_layers_in_first_pipeline_stage": None,
    "num_layers_in_last_pipeline_stage": None,
    "pipeline_model_parallel_layout": None,
    "hierarchical_context_parallel_sizes": None,
    "sequence_parallel": False,
    "overlap_moe_expert_parallel_comm": False,
    "delay_wgrad_compute": False,
    # APEX's fused wgrad kernel is absent from pip installs, and nothing is trained here anyway.
    "gradient_accumulation_fusion": False,
    # Weights are copied into the modules before Megatron FSDP wraps them: they must be real tensors, not meta.
    "init_model_with_meta_device": False,
    "use_cpu_initialization": False,
}

# config.json's dtype (transformers 5 writes "dtype", 4.x "torch_dtype") -> torch dtype name
HF_DTYPES = ("bfloat16", "float16", "float32")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_world_one() -> tuple[bool, bool]:
    """A process group of one and Megatron's parallel state at size 1.

    Returns (made the process group, made the parallel state): ``release_world`` undoes only those, so a
    caller that already runs Bridge in this process (a test, the benchmark) keeps its own.
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state

    made_pg = made_mp = False
    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise RuntimeError(
                f"convert runs at world size 1; this process is rank {dist.get_rank()} of {dist.get_world_size()}"
            )
    else:
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend, init_method=f"tcp://127.0.0.1:{_free_port()}", world_size=1, rank=0)
        made_pg = True
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
        made_mp = True
        if torch.cuda.is_available():
            from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

            model_parallel_cuda_manual_seed(SEED)
    return made_pg, made_mp


def release_world(made: tuple[bool, bool]) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    made_pg, made_mp = made
    if made_mp:
        parallel_state.destroy_model_parallel()
    if made_pg and dist.is_initialized():
        dist.destroy_process_group()


def _world_one(provider):
    for k, v in WORLD_ONE.items():
        if hasattr(provider, k):
            setattr(provider, k, v)
    if getattr(provider, "moe_token_dispatcher_type", None) == "flex":  # flex needs TP*EP > 1
        provider.moe_token_dispatcher_type = "allgather"
    return provider


def fsdp_ddp_config():
    from megatron.core.distributed import DistributedDataParallelConfig

    return DistributedDataParallelConfig(
        use_distributed_optimizer=True,
        use_megatron_fsdp=True,
        data_parallel_sharding_strategy=FSDP_STRATEGY,
        average_in_collective=False,
        overlap_grad_reduce=False,
        overlap_param_gather=False,
    )


def build_fsdp_model(provider, pre_wrap_hook=None):
    provider.finalize()
    kwargs = dict(
        init_model_with_meta_device=False,
        ddp_config=fsdp_ddp_config(),
        use_megatron_fsdp=True,
        use_torch_fsdp2=False,
        wrap_with_ddp=True,
        data_parallel_random_init=False,
        overlap_param_gather_with_optimizer_step=False,
    )
    if pre_wrap_hook is not None:
        kwargs["pre_wrap_hook"] = pre_wrap_hook  # overrides registered hooks: only ours runs
    return provider.provide_distributed_model(**kwargs)


def build_plain_model(provider):
    provider.finalize()
    return provider.provide_distributed_model(wrap_with_ddp=False)


def hf_dtype_name(hf_dir: str) -> str:
    """The dtype a Hugging Face folder's config.json records; bfloat16 when it records none."""
    import json

    try:
        with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError):
        return "bfloat16"
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    return name if name in HF_DTYPES else "bfloat16"


def _set_dtype(provider, name: str):
    """Build the Megatron model in the checkpoint's own dtype, so no weight is rounded on the way."""
    import torch

    dtype = getattr(torch, name)
    provider.params_dtype = dtype
    provider.pipeline_dtype = dtype
    provider.bf16 = name == "bfloat16"
    provider.fp16 = name == "float16"
    return provider


def provider_from_checkpoint(iter_dir: str):
    from megatron.bridge.training.model_load_save import load_model_config

    model_cfg, mlm_args = load_model_config(iter_dir)
    if mlm_args is not None:
        raise RuntimeError(f"{iter_dir}: a Megatron-LM checkpoint (no run_config.yaml); convert reads Bridge's")
    _world_one(model_cfg)
    model_cfg.perform_initialization = False  # every weight is loaded next
    return model_cfg


def read_source_train_state(iter_dir: str):
    from megatron.bridge.training.state import TrainState
    from megatron.bridge.training.utils.checkpoint_utils import read_train_state

    path = os.path.join(iter_dir, "train_state.pt")
    return read_train_state(path) if os.path.isfile(path) else TrainState()


def load_fsdp_dtensor(iter_dir: str, say) -> list:
    """An FSDP-wrapped model holding the weights of an fsdp_dtensor iteration folder (Bridge's own loader)."""
    from megatron.bridge.training.checkpointing import load_checkpoint
    from megatron.bridge.training.state import GlobalState

    provider = provider_from_checkpoint(iter_dir)
    model = build_fsdp_model(provider)
    state = GlobalState()
    state.cfg = bridge_setup.checkpoint_only_container(
        provider,
        model[0].ddp_config if hasattr(model[0], "ddp_config") else fsdp_ddp_config(),
        dict(
            load=iter_dir,
            finetune=True,
            load_optim=False,
            load_rng=False,
            # The state dict Bridge builds to load holds "rng_state" whenever save_rng is on, even when the RNG
            # is not loaded (checkpointing.py :: generate_state_dict: ``if ckpt_cfg.save_rng or ...``);
            # a checkpoint saved without it then fails DCP's planner ("Missing key in checkpoint state_dict:
            # rng_state", seen on the H200 for a resumed run's fsdp_dtensor save). Weights are all we read.
            save_rng=False,
            ckpt_format="fsdp_dtensor",
            strict_fsdp_dtensor_load=True,  # every model key must be in the checkpoint
        ),
    )
    say(f"loading fsdp_dtensor weights from {iter_dir}")
    load_checkpoint(state=state, model=model, optimizer=None, opt_param_scheduler=None, strict=True)
    return model


def load_torch_dist_plain(iter_dir: str, say) -> list:
    from megatron.bridge.training.model_load_save import load_megatron_model

    say(f"loading torch_dist weights from {iter_dir}")
    model = load_megatron_model(iter_dir, skip_temp_dist_context=True)
    return model if isinstance(model, list) else [model]


def _unwrapped(model_chunk):
    from megatron.core.utils import unwrap_model

    return unwrap_model(model_chunk)


def _strip(key: str) -> str:
    while key.startswith("module."):
        key = key[len("module.") :]
    return key


def _copy_into(target_module, source: dict, what: str) -> int:
    """Load ``source`` (name -> full tensor) into ``target_module``; fail unless every parameter matched.

    Every parameter must be in ``source`` with its shape; a persistent buffer missing from it (say a MoE
    router's token counters) keeps the value the model was built with. Transformer Engine's ``_extra_state``
    entries are not weights and are skipped on both sides.
    """
    import torch

    params = {n for n, _ in target_module.named_parameters()}
    want = {k: v for k, v in target_module.state_dict().items() if not k.endswith("_extra_state")}
    missing = [k for k in want if k not in source and k in params]
    if missing:
        raise RuntimeError(f"{what}: {len(missing)} parameters not found in the source, e.g. {missing[:3]}")
    take = {k: source[k] for k in want if k in source}
    bad = [k for k, v in take.items() if isinstance(v, torch.Tensor) and tuple(v.shape) != tuple(want[k].shape)]
    if bad:
        k = bad[0]
        raise RuntimeError(f"{what}: shape of {k} differs ({tuple(take[k].shape)} vs {tuple(want[k].shape)})")
    result = target_module.load_state_dict(take, strict=False)
    left = [k for k in result.missing_keys if k in params]
    if left:
        raise RuntimeError(f"{what}: parameters left unset: {left[:3]}")
    return len(take)


def plain_state(model: list) -> dict:
    """name -> tensor of a plain (not FSDP) model, names relative to the GPT model."""
    return {
        _strip(k): v.detach()
        for k, v in _unwrapped(model[0]).state_dict().items()
        if not k.endswith("_extra_state") and hasattr(v, "shape")
    }


def fsdp_full_state(model: list) -> dict:
    """name -> full tensor of a Megatron FSDP model, each DTensor gathered (world 1: a local copy)."""
    from megatron.core.distributed.fsdp.src.megatron_fsdp.uneven_dtensor import gather_uneven_dtensor_to_full_tensor
    from torch.distributed.tensor import DTensor

    chunk = model[0]
    raw = (
        chunk.state_dict_for_save_checkpoint()
        if hasattr(chunk, "state_dict_for_save_checkpoint")
        else chunk.state_dict()
    )
    out = {}
    for k, v in raw.items():
        if k.endswith("_extra_state") or not hasattr(v, "shape"):
            continue
        if isinstance(v, DTensor):
            v = gather_uneven_dtensor_to_full_tensor(v)
            v = v.to_local() if isinstance(v, DTensor) else v
        out[_strip(k)] = v.detach().clone()
    return out


def save_megatron(model: list, provider, train_state, out: str, fmt: str, say) -> str:
    """Bridge's save_checkpoint without optimizer or RNG state; returns the iteration folder written."""
    from megatron.bridge.training.checkpointing import get_checkpoint_name, save_checkpoint
    from megatron.bridge.training.state import GlobalState

    ddp = getattr(model[0], "ddp_config", None) if fmt == "fsdp_dtensor" else None
    state = GlobalState()
    state.cfg = bridge_setup.checkpoint_only_container(
        provider,
        ddp,
        dict(
            save=out,
            save_optim=False,
            save_rng=False,
            ckpt_format=fmt,
            dist_ckpt_optim_fully_reshardable=True,
        ),
    )
    state.train_state = train_state
    say(f"saving {fmt} at iteration {train_state.step} into {out}")
    save_checkpoint(
        state=state,
        model=model,
        optimizer=None,
        opt_param_scheduler=None,
        num_floating_point_operations_so_far=int(getattr(train_state, "floating_point_operations_so_far", 0) or 0),
        callback_manager=None,
    )
    return get_checkpoint_name(out, train_state.step, release=False)


def hf_bridge(hf_ref: str | None):
    from megatron.bridge import AutoBridge

    if not hf_ref:
        raise ValueError("a Hugging Face config (--hf-config) is needed to read or write hf")
    return AutoBridge.from_hf_pretrained(hf_ref)


# Files by which transformers finds a tokenizer in a model folder (any one is enough).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def has_tokenizer(hf_ref: str | None) -> bool:
    """True when ``hf_ref`` is a local folder holding a tokenizer (a hub id is assumed to have one)."""
    if not hf_ref or not os.path.isdir(hf_ref):
        return bool(hf_ref)
    return any(os.path.exists(os.path.join(hf_ref, name)) for name in TOKENIZER_FILES)


def export_hf(bridge, model, out: str, hf_ref: str | None, say=print) -> str:
    """Write ``model`` as a Hugging Face folder; returns what was written.

    ``AutoBridge.save_hf_pretrained`` also copies the reference's tokenizer, and raises when the
    reference folder has none (a config-only folder). Then the config and the weights are written
    (``save_hf_weights``) and the report says the tokenizer is missing, rather than failing after the
    weights were gathered.
    """
    if has_tokenizer(hf_ref):
        bridge.save_hf_pretrained(model, out, show_progress=True, strict=True)
        return "config, tokenizer and weights"
    say(f"{hf_ref} has no tokenizer: writing the config and the weights only")
    bridge.hf_pretrained.config.save_pretrained(out)
    bridge.save_hf_weights(model, out, show_progress=True, strict=True)
    return "config and weights (the reference folder has no tokenizer)"


def convert(src_iter: str, src_format: str, to: str, out: str, hf_ref: str | None = None, say=print) -> dict:
    """Convert ``src_iter`` (an iteration folder, or a Hugging Face folder) into the empty folder ``out``."""
    import torch

    t0 = time.monotonic()
    if os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":  # Megatron FSDP needs it unset or > 1
        from .bridge import unset_cuda_device_max_connections

        unset_cuda_device_max_connections()
    created = ensure_world_one()
    result: dict = {"world_size": 1, "optimizer_state": "dropped"}
    try:
        if src_format == "hf":
            bridge = hf_bridge(src_iter)
            provider = _set_dtype(_world_one(bridge.to_megatron_provider(load_weights=False)), hf_dtype_name(src_iter))
            from megatron.bridge.training.state import TrainState

            train_state = TrainState()
            say(f"building the model from {src_iter} and loading its Hugging Face weights")
            model = build_fsdp_model(provider) if to == "fsdp_dtensor" else build_plain_model(provider)
            bridge.load_hf_weights(model)
            result["iteration_dir"] = save_megatron(model, provider, train_state, out, to, say)
            result["optimizer_state"] = "none in the source"
        elif src_format == "torch_dist":
            train_state = read_source_train_state(src_iter)
            plain = load_torch_dist_plain(src_iter, say)
            if to == "hf":
                bridge = hf_bridge(hf_ref)
                say(f"exporting to Hugging Face with the architecture of {hf_ref}")
                result["hf_written"] = export_hf(bridge, plain, out, hf_ref, say)
            else:  # fsdp_dtensor
                weights = plain_state(plain)
                provider = provider_from_checkpoint(src_iter)
                counted: dict = {}

                def _fill(chunks):
                    target = _unwrapped(chunks[0])
                    if any(p.is_meta for p in target.parameters()):
                        raise RuntimeError("the model was built on the meta device; weights cannot be copied into it")
                    counted["n"] = _copy_into(target, weights, "torch_dist -> fsdp_dtensor")
                    return chunks

                say(f"copying {len(weights)} tensors into a Megatron FSDP ({FSDP_STRATEGY}) model")
                model = build_fsdp_model(provider, pre_wrap_hook=_fill)
                del plain, weights
                result["tensors_copied"] = counted.get("n")
                result["iteration_dir"] = save_megatron(model, provider, train_state, out, "fsdp_dtensor", say)
        elif src_format == "fsdp_dtensor":
            train_state = read_source_train_state(src_iter)
            fsdp = load_fsdp_dtensor(src_iter, say)
            if to == "hf":
                bridge = hf_bridge(hf_ref)
                say(f"exporting to Hugging Face with the architecture of {hf_ref}")
                result["hf_written"] = export_hf(bridge, fsdp, out, hf_ref, say)
            else:  # torch_dist
                weights = fsdp_full_state(fsdp)
                del fsdp
                provider = provider_from_checkpoint(src_iter)
                plain = build_plain_model(provider)
                say(f"copying {len(weights)} gathered tensors into a plain model")
                result["tensors_copied"] = _copy_into(_unwrapped(plain[0]), weights, "fsdp_dtensor -> torch_dist")
                del weights
                result["iteration_dir"] = save_megatron(plain, provider, train_state, out, "torch_dist", say)
        else:
            raise ValueError(f"unsupported source format {src_format!r}")
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            result["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        result["seconds"] = round(time.monotonic() - t0, 1)
        return result
    finally:
        release_world(created)
