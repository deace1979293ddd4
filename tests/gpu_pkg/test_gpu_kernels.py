"""``mfsdp_gpu.kernels``: a config's MoE dispatcher or Mamba package, looked for before the model is built."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from mfsdp_gpu import kernels  # noqa: E402


def _importer(present: dict):
    """Imports only the modules in ``present`` (name -> attributes it has)."""

    def imp(name):
        if name not in present:
            raise ImportError(f"No module named {name!r}")
        return SimpleNamespace(**dict.fromkeys(present[name], object()))

    return imp


def _moe(dispatcher="flex", backend="hybridep", deepep=False, experts=128):
    return SimpleNamespace(
        num_moe_experts=experts,
        moe_token_dispatcher_type=dispatcher,
        moe_flex_dispatcher_backend=backend,
        moe_enable_deepep=deepep,
    )


@pytest.mark.parametrize(
    ("model", "present", "package"),
    [
        (_moe(backend="hybridep"), {}, "HybridEP"),
        (_moe(backend="hybridep"), {"deep_ep": ["Buffer"]}, "HybridEP"),  # DeepEP without its HybridEP part
        (_moe(backend="deepep"), {}, "DeepEP"),
        (_moe(backend="hybridep", deepep=True), {"deep_ep": ["HybridEPBuffer"]}, "DeepEP"),  # the deprecated flag
        (_moe(backend="ncclep"), {}, "Transformer Engine's ep module"),
    ],
)
def test_a_missing_flex_backend_is_refused_in_one_line(model, present, package):
    got = kernels.missing_for(model, False, True, _importer(present))
    assert [m["package"] for m in got] == [package]
    line = got[0]["refusal"]
    assert "\n" not in line and "--moe-dispatcher alltoall" in line and "moe_token_dispatcher_type=flex" in line


@pytest.mark.parametrize(
    ("model", "present"),
    [
        (_moe(backend="hybridep"), {"deep_ep": ["Buffer", "HybridEPBuffer"]}),
        (_moe(dispatcher="alltoall"), {}),
        (_moe(experts=None), {}),  # no experts: the dispatcher is never built
    ],
)
def test_what_is_installed_or_not_needed_passes(model, present):
    assert kernels.missing_for(model, False, True, _importer(present)) == []


def test_mamba_layers_without_mamba_ssm_are_refused():
    got = kernels.missing_for(SimpleNamespace(), True, False, _importer({}))
    assert [m["package"] for m in got] == ["mamba-ssm"] and "build_mamba_wheel.sh" in got[0]["refusal"]
    assert kernels.missing_for(SimpleNamespace(), True, True, _importer({})) == []


def test_gated_delta_net_layers_without_fla_are_refused_in_one_line():
    gdn = SimpleNamespace(experimental_attention_variant="gated_delta_net")
    got = kernels.missing_for(gdn, False, True, _importer({}))
    assert [m["package"] for m in got] == ["flash-linear-attention"]
    assert "\n" not in got[0]["refusal"] and "experimental_attention_variant=gated_delta_net" in got[0]["refusal"]
    present = {"fla.ops.gated_delta_rule": ["chunk_gated_delta_rule"]}
    assert kernels.missing_for(gdn, False, True, _importer(present)) == []
    other = SimpleNamespace(experimental_attention_variant="dsa")  # another variant needs nothing from fla
    assert kernels.missing_for(other, False, True, _importer({})) == []


def test_the_fallback_is_labelled_with_its_memory_and_time_effect():
    d = kernels.dispatcher_fallback("hybridep", "alltoall")
    assert d["id"] == "moe-dispatcher-fallback" and d["what"].endswith("flex (hybridep) -> alltoall")
    assert "too low" in d["memory_effect"] and "HybridEP" in d["memory_effect"]
    assert "all-to-all" in d["time_effect"]
    assert kernels.flex_backend("alltoall", "hybridep", False) is None
    assert kernels.flex_backend("flex", None, False) == "deepep"  # megatron-core's default backend


def test_the_full_te_layer_spec_without_apex_is_refused_in_one_line():
    """GPT-3 175B's recipe (the full Transformer Engine layer spec) stopped at model build on a machine without
    Apex: its final norm is megatron-core's FusedLayerNorm. The rehearsal names the setting and the package first."""
    full = SimpleNamespace(use_transformer_engine_full_layer_spec=True)
    got = kernels.missing_for(full, False, True, _importer({}))
    assert [m["package"] for m in got] == ["Apex"]
    line = got[0]["refusal"]
    assert "\n" not in line and "use_transformer_engine_full_layer_spec=true" in line and "=false" in line
    present = {"apex.normalization.fused_layer_norm": ["FusedLayerNormAffineFunction"]}
    assert kernels.missing_for(full, False, True, _importer(present)) == []
    assert (
        kernels.missing_for(SimpleNamespace(use_transformer_engine_full_layer_spec=False), False, True, _importer({}))
        == []
    )
    assert kernels.missing_for(SimpleNamespace(), False, True, _importer({})) == []
