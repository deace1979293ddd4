"""Packages a config needs beyond Megatron-Bridge, checked before the model is built. Pure Python.

A recipe can name a part that lives in a package of its own: megatron-core's ``flex`` MoE token
dispatcher runs DeepEP's or HybridEP's kernels (``deep_ep.Buffer``, ``deep_ep.HybridEPBuffer``) or
Transformer Engine's ``ep`` module (megatron/core/transformer/moe/fused_a2a.py, 0.19.2: each
import in a ``try``, ``HAVE_DEEP_EP`` / ``HAVE_HYBRIDEP`` / ``HAVE_TE_EP``), and hybrid models' Mamba
layers run mamba-ssm's kernels (``mamba.py``), gated delta net layers flash-linear-attention's, and Bridge's full
Transformer Engine layer spec Apex's fused layer norm. Without the package the model fails at build or at
the first dispatch, minutes into a GPU call, with an error that does not name the setting. The
rehearsal looks first (:func:`missing_for`) and refuses in one line, naming the setting, the
package and the labelled way around it (``--moe-dispatcher alltoall``: :func:`dispatcher_fallback`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

# flex backend -> (what it is called, module, attribute the module must have; None: the module alone).
# megatron-core 0.19.2 transformer_config.py: moe_flex_dispatcher_backend is 'deepep' | 'hybridep' |
# 'ncclep' (default 'deepep'); the deprecated moe_enable_deepep selects 'deepep'.
FLEX_BACKENDS = {
    "deepep": ("DeepEP", "deep_ep", "Buffer"),
    "hybridep": ("HybridEP", "deep_ep", "HybridEPBuffer"),
    "ncclep": ("Transformer Engine's ep module", "transformer_engine.pytorch.ep", None),
}
FALLBACK_DISPATCHERS = ("alltoall", "allgather")  # need nothing beyond megatron-core
# Gated delta net (linear attention) layers: megatron-core 0.19.2 ssm/gated_delta_net/common.py:44-54 imports
# flash-linear-attention's kernels (fla.modules.convolution, fla.modules.l2norm, fla.ops.gated_delta_rule) in a
# try and raises "FLA is not installed" when the layer is built (:141). The package is fla-core (pure Python,
# Triton kernels); megatron-core's dev extra pins flash-linear-attention~=0.4.0.
GDN_VARIANT = "gated_delta_net"
GDN_MODULE, GDN_ATTR = "fla.ops.gated_delta_rule", "chunk_gated_delta_rule"
# Bridge 0.6.2's full Transformer Engine layer spec (model.use_transformer_engine_full_layer_spec=true:
# gpt_provider.default_layer_spec -> gpt_full_te_layer_autocast_spec.get_gpt_full_te_layer_autocast_spec) builds
# the block's final norm as megatron-core's FusedLayerNorm, whatever Transformer Engine offers; that class raises
# "Apex must be installed to use FusedLayerNorm." at build without Apex's fused layer norm
# (megatron/core/fusions/fused_layer_norm.py: HAVE_FUSED_LAYER_NORM, or Apex's persistent kernel). Measured:
# GPT-3 175B's recipe stops at model build on a machine without Apex.
FULL_TE_SPEC_KEY = "use_transformer_engine_full_layer_spec"
APEX_LN_MODULE, APEX_LN_ATTR = "apex.normalization.fused_layer_norm", "FusedLayerNormAffineFunction"


def flex_backend(dispatcher: str | None, backend: str | None, enable_deepep: bool | None) -> str | None:
    """The flex backend a model config uses, or None when its dispatcher is not flex."""
    if dispatcher != "flex":
        return None
    if enable_deepep:
        return "deepep"
    return backend or "deepep"


def have_module(module: str, attr: str | None, importer: Callable = importlib.import_module) -> bool:
    """Whether ``module`` imports (and has ``attr``): the test megatron-core's own imports make."""
    try:
        mod = importer(module)
    except Exception:  # ImportError, or a broken build raising anything else at import
        return False
    return attr is None or hasattr(mod, attr)


def missing_for(model, has_mamba: bool, mamba_importable: bool, importer: Callable = importlib.import_module) -> list:
    """What this config needs and this Python lacks: dicts with ``package``, ``setting``, ``refusal``."""
    out = []
    dispatcher = getattr(model, "moe_token_dispatcher_type", None)
    backend = flex_backend(
        dispatcher, getattr(model, "moe_flex_dispatcher_backend", None), getattr(model, "moe_enable_deepep", None)
    )
    if backend is not None and getattr(model, "num_moe_experts", None):
        name, module, attr = FLEX_BACKENDS.get(backend, (backend, backend, None))
        if not have_module(module, attr, importer):
            setting = f"model.moe_token_dispatcher_type=flex, model.moe_flex_dispatcher_backend={backend}"
            out.append(
                {
                    "package": name,
                    "setting": setting,
                    "refusal": f"the config's MoE dispatcher ({setting}) needs {name} "
                    f"({module}{'.' + attr if attr else ''}), which is not installed here; install it, or rehearse "
                    "with --moe-dispatcher alltoall (a labelled deviation)",
                }
            )
    if getattr(model, "experimental_attention_variant", None) == GDN_VARIANT and not have_module(
        GDN_MODULE, GDN_ATTR, importer
    ):
        out.append(
            {
                "package": "flash-linear-attention",
                "setting": f"model.experimental_attention_variant={GDN_VARIANT}",
                "refusal": f"the config builds gated delta net layers (model.experimental_attention_variant="
                f"{GDN_VARIANT}), which need flash-linear-attention's kernels ({GDN_MODULE}.{GDN_ATTR}); it is not "
                "installed in this Python (the pure-Python fla-core wheel, 0.4.x, is enough)",
            }
        )
    if getattr(model, FULL_TE_SPEC_KEY, False) is True and not have_module(APEX_LN_MODULE, APEX_LN_ATTR, importer):
        out.append(
            {
                "package": "Apex",
                "setting": f"model.{FULL_TE_SPEC_KEY}=true",
                "refusal": f"the config builds Bridge's full Transformer Engine layer spec (model.{FULL_TE_SPEC_KEY}"
                "=true), whose final norm is megatron-core's FusedLayerNorm: it needs Apex's fused layer norm "
                f"({APEX_LN_MODULE}), which is not installed here (NVIDIA's PyTorch containers have it); install "
                f"Apex, or rehearse with model.{FULL_TE_SPEC_KEY}=false (Bridge's Transformer Engine layer spec: "
                "other layer modules, so not this recipe's build)",
            }
        )
    if has_mamba and not mamba_importable:
        out.append(
            {
                "package": "mamba-ssm",
                "setting": "model.hybrid_layer_pattern (Mamba layers)",
                "refusal": "the config builds Mamba layers, which need mamba-ssm (its Triton kernels); it is not "
                "installed in this Python (tests/gpu/build_mamba_wheel.sh makes a wheel for a machine without "
                "a compiler)",
            }
        )
    return out


def dispatcher_fallback(backend: str, dispatcher: str) -> dict:
    """The deviation a ``--moe-dispatcher`` fallback writes into the report: what changes and how."""
    name = FLEX_BACKENDS.get(backend, (backend,))[0]
    return {
        "id": "moe-dispatcher-fallback",
        "what": f"model.moe_token_dispatcher_type: flex ({backend}) -> {dispatcher}",
        "why": f"{name} is not installed here (--moe-dispatcher {dispatcher})",
        "memory_effect": f"too low by {name}'s communication buffers: the production run reserves them "
        "(DeepEP/HybridEP buffers, fixed at start) and this rehearsal does not; the "
        f"{dispatcher} dispatcher's own permutation buffers, counted here, are per micro-batch",
        "time_effect": f"the dispatch and combine run megatron-core's {dispatcher} path (token permutation "
        f"kernels and NCCL {'all-to-all' if dispatcher == 'alltoall' else 'all-gather'}) in place of "
        f"{name}'s fused kernels: expert compute is the same, the permutation compute differs, and the "
        "counted communication is the fallback's",
    }
