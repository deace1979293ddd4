"""Partial configs of every recipe family are accepted; typos still get a did-you-mean.

``scripts/data/section_keys.json`` must be what ``tests/gen_section_keys.py`` makes of the pinned
wheels, so a field a new Bridge adds (or drops) shows up here first.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mfsdp_lib import config_io
from mfsdp_lib.findings import InputError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_section_keys  # noqa: E402


def test_committed_keys_match_the_wheels(bridge_src, mcore_src):
    assert gen_section_keys.render(gen_section_keys.collect(bridge_src, mcore_src)) == gen_section_keys.OUT.read_text(
        encoding="utf-8"
    ), "scripts/data/section_keys.json is stale: run python3 tests/gen_section_keys.py BRIDGE_ROOT MCORE_ROOT"


# One real field per family that the embedded Llama recipe does not have (each defined in Bridge 0.6.2 /
# Megatron-Core 0.19.2: MLATransformerConfig, Nemotron-H / Mamba providers, MoE TransformerConfig fields,
# Qwen-VL providers, the SFT / HF dataset configs, LoRA).
FAMILY_YAML = {
    "mla": "model:\n  q_lora_rank: 1536\n  kv_lora_rank: 512\n  qk_pos_emb_head_dim: 64\n",
    "hybrid": "model:\n  hybrid_override_pattern: M-M-M*-\n  mamba_num_heads: 128\n  mamba_head_dim: 64\n",
    "moe": "model:\n  num_moe_experts: 64\n  moe_router_topk: 8\n  moe_token_dispatcher_type: alltoall\n",
    "vlm": "model:\n  vision_config: null\n  freeze_vision_model: true\n",
    "sft_dataset": "dataset:\n  dataset_name: squad\n  do_validation: true\n",
    "lora": "peft:\n  dim: 16\n  alpha: 32\n  target_modules: [linear_qkv]\n",
}


@pytest.mark.parametrize("family", sorted(FAMILY_YAML))
def test_partial_yaml_of_every_family_is_accepted(tmp_path, family):
    p = tmp_path / f"{family}.yaml"
    p.write_text(FAMILY_YAML[family])
    config_io.load_effective(str(p))  # no InputError
    config_io.load_effective(str(p), base="embedded")


@pytest.mark.parametrize(
    "override,suggestion",
    [("model.q_lora_rnk=3", "q_lora_rank"), ("model.tensor_model_paralel_size=2", "tensor_model_parallel_size")],
)
def test_typos_still_get_a_did_you_mean(override, suggestion):
    with pytest.raises(InputError, match=f"did you mean '{suggestion}'"):
        config_io.load_effective(None, [override])
