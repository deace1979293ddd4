"""Hybrid (Mamba) models: what this machine's mamba-ssm can run, prepared before megatron is imported.

megatron-core's Mamba mixer binds mamba-ssm's kernels when it is imported, so a run that may build
Mamba layers calls :func:`prepare_mamba_ssm` first. When mamba-ssm lacks its compiled Mamba-1
kernel, that one name is registered as a module that raises on any use (the Mamba-2 layers never
call it); when causal-conv1d is absent, the memory-efficient Mamba path is switched off. Each such
work-around is a labelled deviation from a production run, with its memory effect
(:func:`mamba_deviations`), in the report.
"""

from __future__ import annotations

import sys
import types

from .report import GIB

BF16_BYTES = 2  # bytes per saved activation element: bf16, the compute dtype of the hybrid runs

# What megatron-core 0.19.2's Mamba-2 mixer imports when megatron/core/ssm/mamba_mixer.py is
# imported (lines 61-79): RMSNormGated from mamba_ssm.ops.triton.layernorm_gated and the chunked
# scans from mamba_ssm.ops.triton.ssd_combined (Triton kernels: Python files compiled on the GPU
# at first use), and causal_conv1d_fn from causal-conv1d (a compiled extension; None when absent).
# Without mamba-ssm the mixer's constructor raises "MambaSSM is not installed" (line 203).
MAMBA_MODULES = ("mamba_ssm.ops.triton.layernorm_gated", "mamba_ssm.ops.triton.ssd_combined")
# mamba-ssm's package __init__ imports ops/selective_scan_interface.py, which imports this compiled
# Mamba-1 kernel at module level. A wheel built without its CUDA extension (MAMBA_SKIP_CUDA_BUILD)
# lacks it; the Mamba-2 mixer never calls it.
MAMBA1_KERNEL = "selective_scan_cuda"
# The memory-efficient path (model.use_mamba_mem_eff_path, default True) runs
# mamba_split_conv1d_scan_combined, whose forward calls causal-conv1d's compiled
# causal_conv1d_fwd_function (mamba_ssm/ops/triton/ssd_combined.py:840); ssd_combined binds it
# to None when causal-conv1d is absent (lines 21-28). The other path (mamba_mixer.py:502,
# _ssm_prefill) convolves with torch's conv1d when causal_conv1d_fn is None (line 913).
MEM_EFF_KERNEL_ATTR = "causal_conv1d_fwd_function"
# Mamba layers in a hybrid pattern (megatron/core/models/hybrid/hybrid_layer_allocation.py: Symbols).
MAMBA_SYMBOL = "M"
# d_inner when mamba_num_heads is unset: hidden_size x expand (TransformerConfig, expand 2).
MAMBA_EXPAND = 2


class AbsentKernelError(AttributeError, RuntimeError):
    """Something used the compiled Mamba-1 kernel that this machine does not have.

    An AttributeError too, so that generic introspection over ``sys.modules`` (``inspect``,
    ``pickle.whichmodule``, ``getattr(module, name, default)``) treats the guard like a module
    without that name instead of crashing; every real use still raises this error."""


class AbsentKernelModule(types.ModuleType):
    """Stands in for ``selective_scan_cuda`` so mamba-ssm's package import completes.

    Every attribute a caller asks for raises ``AbsentKernelError`` naming what was asked,
    so a call into the Mamba-1 kernel fails loudly, never silently."""

    def __init__(self, name: str):
        import importlib.machinery

        super().__init__(name, "stands in for an absent compiled kernel (rehearse_train.py)")
        self.__spec__ = importlib.machinery.ModuleSpec(name, None)  # find_spec() answers, as for any module

    def __getattr__(self, attr: str):
        raise AbsentKernelError(
            f"{self.__name__}.{attr}: mamba-ssm's compiled Mamba-1 kernel is not installed on this machine "
            "(the rehearsal registered this module only so that mamba-ssm's package import completes; "
            "megatron-core's Mamba-2 layers do not use it). Install mamba-ssm with its CUDA extension."
        )


def _forget_modules(prefix: str) -> None:
    for name in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[name]


def _import_error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def prepare_mamba_ssm(modules=MAMBA_MODULES) -> dict:
    """Import the mamba-ssm modules megatron-core's Mamba-2 mixer needs, before megatron is imported.

    When the import fails only because the compiled Mamba-1 kernel ``selective_scan_cuda`` is
    absent, that name is registered as an ``AbsentKernelModule`` and the import is tried again;
    any other failure is reported as it is (``error``), and nothing is registered. Returns what
    was found: ``installed``, ``version``, ``importable``, ``mamba1_kernel`` ("present" or
    "absent (guarded)"), ``mem_eff_kernels`` (causal-conv1d's compiled functions reached
    ssd_combined), ``causal_conv1d_installed`` and ``error``.
    """
    import importlib
    import importlib.util
    from importlib import metadata

    info: dict = {
        "installed": False,
        "version": None,
        "importable": False,
        "mamba1_kernel": None,
        "mem_eff_kernels": False,
        "causal_conv1d_installed": importlib.util.find_spec("causal_conv1d") is not None,
        "error": None,
    }
    try:
        info["version"] = metadata.version("mamba-ssm")
    except metadata.PackageNotFoundError:
        pass
    if importlib.util.find_spec("mamba_ssm") is None:
        info["error"] = "mamba-ssm is not installed"
        return info
    info["installed"] = True

    def import_all():
        for name in modules:
            importlib.import_module(name)

    try:
        import_all()
        info["mamba1_kernel"] = "present"
    except ModuleNotFoundError as exc:
        if exc.name != MAMBA1_KERNEL or MAMBA1_KERNEL in sys.modules:
            _forget_modules("mamba_ssm")  # megatron-core then meets the same failure itself, from scratch
            info["error"] = _import_error_text(exc)
            return info
        _forget_modules("mamba_ssm")
        sys.modules[MAMBA1_KERNEL] = AbsentKernelModule(MAMBA1_KERNEL)
        try:
            import_all()
        except Exception as exc2:  # another cause behind the first: report it, leave nothing registered
            del sys.modules[MAMBA1_KERNEL]
            _forget_modules("mamba_ssm")
            info["error"] = _import_error_text(exc2)
            return info
        info["mamba1_kernel"] = "absent (guarded)"
    except Exception as exc:
        _forget_modules("mamba_ssm")
        info["error"] = _import_error_text(exc)
        return info
    info["importable"] = True
    ssd = sys.modules.get(modules[-1])
    info["mem_eff_kernels"] = getattr(ssd, MEM_EFF_KERNEL_ATTR, None) is not None
    return info


def mamba_layer_count(pattern) -> int:
    """Mamba layers in a hybrid layer pattern (MTP copies after '/' included)."""
    return str(pattern or "").count(MAMBA_SYMBOL)


def model_has_mamba(model) -> bool:
    """A Bridge model config with Mamba layers: a hybrid pattern holding 'M', or a hybrid
    provider without a pattern (layers then allocated by ratio, Mamba first)."""
    if model is None:
        return False
    pattern = getattr(model, "hybrid_layer_pattern", None) or getattr(model, "hybrid_override_pattern", None)
    if pattern:
        return mamba_layer_count(pattern) > 0
    # Only Bridge's hybrid provider allocates layers by ratio (hybrid_provider.py :: HybridModelProvider
    # .hybrid_attention_ratio). ``mamba_num_groups`` cannot tell: megatron-core 0.19's TransformerConfig
    # defines it for every model (transformer_config.py :: TransformerConfig.mamba_num_groups), so a GPT
    # provider has it too and a dense Llama would be reported as hybrid.
    if not hasattr(model, "hybrid_attention_ratio"):
        return False
    ratios = (getattr(model, "hybrid_attention_ratio", 0) or 0) + (getattr(model, "hybrid_mlp_ratio", 0) or 0)
    return ratios < 1


def unfused_mamba_extra_bytes(model, micro_batch_size: int) -> int | None:
    """Activations the non-memory-efficient Mamba path saves beyond the memory-efficient one.

    Per Mamba layer and token, in bf16 elements (d = d_inner, g = 2 x groups x state, both / TP):
    the fused kernel saves its input zxBCdt (2d + g + heads), the scan output (d), the gated
    norm's input (d) and out_proj's input (d) (ssd_combined.py MambaSplitConv1dScanCombinedFn;
    mamba_mixer.py _ssm_training). The unfused path (mamba_mixer.py _ssm_prefill) saves conv1d's
    input and SiLU's input (2 x (d + g)), the scan's contiguous x, B, C (d + g) and dt (heads),
    z's contiguous copy (d), the norm's y and out_proj's input (2d): d + 2g more. With a
    micro-batch above 1 the scan output's ``rearrange(...).contiguous()`` is a real copy, one d
    more. The same count as ``mfsdp_lib.memory.terms.mamba_unfused_extra_bytes``, which the
    hybrid H200 rehearsals' measured peaks are calibrated against (a larger figure here would let
    a reader subtract too much from a rehearsal's peak and under-predict production).
    Per micro-batch whose activations are alive (the last one's, without pipeline parallelism).
    None when the shape is unknown.
    """
    try:
        hidden = int(model.hidden_size)
        heads = getattr(model, "mamba_num_heads", None)
        head_dim = int(getattr(model, "mamba_head_dim", 64) or 64)
        d_inner = int(heads) * head_dim if heads else hidden * MAMBA_EXPAND
        groups = int(getattr(model, "mamba_num_groups", 8) or 8)
        state = int(getattr(model, "mamba_state_dim", 128) or 128)
        tp = int(getattr(model, "tensor_model_parallel_size", 1) or 1)
        cp = int(getattr(model, "context_parallel_size", 1) or 1)
        seq = int(model.seq_length)
        pattern = getattr(model, "hybrid_layer_pattern", None) or getattr(model, "hybrid_override_pattern", None)
        layers = mamba_layer_count(pattern)
    except (AttributeError, TypeError, ValueError):
        return None
    if not layers:
        return None
    pp = int(getattr(model, "pipeline_model_parallel_size", 1) or 1)
    mbs = max(int(micro_batch_size), 1)
    per_token = (d_inner + 2 * (2 * groups * state) + (d_inner if mbs > 1 else 0)) // tp
    return per_token * BF16_BYTES * (seq // cp) * mbs * -(-layers // pp)


def unfused_mamba_effect(extra_bytes: int | None) -> str:
    """The ``memory_effect`` text of the ``mamba-mem-eff-path-off`` deviation."""
    size = f"about {extra_bytes / GIB:.2f} GiB" if extra_bytes else "an amount that depends on the shape"
    return (
        f"measured peak is ABOVE a run on the memory-efficient path by {size} per "
        "micro-batch in flight (more saved activations per Mamba layer); memory between steps is the same"
    )


def mamba_deviations(env: dict | None, mem_eff_requested: bool, extra_bytes: int | None) -> tuple[list[dict], bool]:
    """The labelled deviations from a production run that this machine's mamba-ssm forces.

    Returns ``(deviations, turn the memory-efficient path off)``. Nothing when mamba-ssm is
    absent or broken: the model build then fails with megatron-core's own ImportError, reported
    as an environment failure."""
    if not env or not env.get("importable"):
        return [], False
    out: list[dict] = []
    if env.get("mamba1_kernel") == "absent (guarded)":
        out.append(
            {
                "id": "mamba1-kernel-absent",
                "what": f"the module '{MAMBA1_KERNEL}' is registered as a guard that raises on any use",
                "why": "mamba-ssm is installed without its compiled Mamba-1 kernel, which its package import "
                "needs; megatron-core's Mamba-2 layers never call it",
                "memory_effect": "none: the kernel is not on the Mamba-2 path, and a call into it fails the run",
            }
        )
    turn_off = bool(mem_eff_requested and not env.get("mem_eff_kernels"))
    if turn_off:
        out.append(
            {
                "id": "mamba-mem-eff-path-off",
                "what": "model.use_mamba_mem_eff_path: true -> false (megatron-core's unfused Mamba path)",
                "why": "causal-conv1d's compiled functions are not installed (or do not import); the "
                "memory-efficient kernel needs them, the unfused path convolves with torch's conv1d",
                "memory_effect": unfused_mamba_effect(extra_bytes),
                "extra_activation_bytes": extra_bytes,
            }
        )
    return out, turn_off
