"""``check`` and ``enable`` on every Megatron-Bridge 0.6.2 recipe, against the real Bridge's verdicts.

``tests/fixtures/recipes/`` holds each recipe's ``to_yaml()`` (``yaml/``) and, per recipe, what the real
``runtime_config_update()`` (ending in ``ConfigContainer.validate()``) said of it as shipped and with the
five Megatron FSDP settings (``verdicts.jsonl``; written by ``tests/recipes/gen_corpus.py`` on a GPU
machine). Here, for every recipe:

* our verdict on the recipe as shipped agrees with Bridge's, as in the differential test: where Bridge
  accepted, we report no validate-stage error; where Bridge's message is one our table quotes, that rule
  fires (that every recipe is readable input, and the verdict with Megatron FSDP on, wrap failures
  included, are tested through the command line in ``tests/recipes/test_corpus.py``);
* ``enable`` either gives a config without errors that keeps ``checkpoint.load``, or refuses with
  errors that each need the user's decision (the list below), never something else.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mfsdp_lib import config_io, enable, rules
from mfsdp_lib.rules import differential

DIR = Path(__file__).resolve().parents[1] / "fixtures" / "recipes"
VERDICTS = DIR / "verdicts.jsonl"
# The corpus covers every recipe Bridge 0.6.2 exports; fewer than this many built means a broken run.
MIN_RECIPES = 100
# The five Megatron FSDP settings, as the corpus generator applied them (checkpoint.load kept).
FSDP = [
    "dist.use_megatron_fsdp=true",
    "ddp.use_megatron_fsdp=true",
    "ddp.data_parallel_sharding_strategy=optim_grads_params",
    "ddp.average_in_collective=false",
    "checkpoint.ckpt_format=fsdp_dtensor",
]
# Errors ``enable`` may leave (and so refuse on): each needs a choice only the user can make.
DECISIONS = {
    "MFSDP-PIPELINE-PARALLEL",  # PP=1 (--set-pp-1) or no Megatron FSDP
    "MFSDP-OPTIMIZER-UNSUPPORTED",  # Muon: another optimizer, or no Megatron FSDP
    "MFSDP-PEFT-NEEDS-PRETRAINED",  # the base model's path
    "MFSDP-MOE-OVERLAP-CUDA-GRAPH",  # graphs or the A2A overlap
    "MFSDP-CPU-OFFLOAD-PP",
    "MFSDP-CPU-OFFLOAD-RECOMPUTE",
    "MFSDP-CPU-OFFLOAD-LAYERS",
    "MFSDP-CPU-OFFLOAD-CUDA-GRAPH",
    "MFSDP-CPU-OFFLOAD-FINE-GRAINED",
    "MFSDP-FINE-GRAINED-OFFLOAD-ENV",
    "MFSDP-TRAIN-BATCH-DP",  # the batch sizes at the world size: the user's (the training batch changes the run)
    "MFSDP-EVAL-BATCH-DP",
}


# Bridge rejections of unmodified recipes that have nothing to do with Megatron FSDP (no rule of ours quotes them,
# and none should): message start -> why. A rejection outside this list and outside our table fails the test.
NOT_FSDP = {
    "PEFT requires a pretrained checkpoint path": "covered by MFSDP-PEFT-NEEDS-PRETRAINED when it comes first",
    "dsa_kernel_backend=cudnn requires fused DSA kernels": "packages missing on the recording machine",
    "Invalid choices for recompute_modules: {'mhc'}": "DeepSeek-V4 recipe names a module this megatron-core lacks",
    "Please ensure sequence length configuration in model config and dataset config match": "recipe's own mismatch",
    "EnergonDatasetConfig.path must be set": "the user must give the dataset path",
    "integer division or modulo by zero": "vanilla GPT recipe without a model shape (num_attention_heads unset)",
}


def _records() -> list[dict]:
    if not VERDICTS.is_file():
        return []
    out = []
    for line in VERDICTS.read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            if r.get("build", {}).get("ok") and r.get("yaml") and (DIR / r["yaml"]).is_file():
                out.append(r)
    return out


RECORDS = _records()
IDS = [r["recipe"] for r in RECORDS]


def test_corpus_is_present_and_large():
    assert VERDICTS.is_file(), (
        "tests/fixtures/recipes/verdicts.jsonl missing: generate it with tests/recipes/gen_corpus.py on a GPU machine"
    )
    assert len(RECORDS) >= MIN_RECIPES, f"only {len(RECORDS)} recipes built with a YAML"


def _load(rec, overrides=()):
    return config_io.load_effective(str(DIR / rec["yaml"]), list(overrides))


def _errors(findings) -> set[str]:
    return {f.rule for f in findings if f.severity == "error"}


def _compare(rec, verdict, findings) -> list[str]:
    """Disagreements between Bridge's verdict and our findings (empty: agree)."""
    if not verdict or verdict.get("error_type") == "OverrideError" or verdict.get("stage") == "make_config":
        return []
    errors = _errors(findings)
    hard = {r for r in errors if rules.RULES_BY_ID[r].stage == "validate"}
    if verdict.get("ok"):
        return [f"Bridge accepted; we report validate-stage errors {sorted(hard)}"] if hard else []
    message = verdict.get("error") or ""
    expected = differential.rules_quoting(message)
    if expected and not expected & errors:
        return [f"Bridge raised {message[:200]!r}; expected {sorted(expected)}, ours {sorted(errors)}"]
    if not expected and not any(message.startswith(m) for m in NOT_FSDP):
        return [f"Bridge raised {message[:200]!r}: neither our table nor the documented non-FSDP causes explain it"]
    return []


def test_the_corpus_shows_what_the_rules_are_for():
    """The recipes that motivate the rules are in the corpus, and the rules fire on them (with FSDP on)."""
    fired: dict[str, set] = {}
    for rec in RECORDS:
        for f in rules.evaluate(_load(rec, FSDP), {}, None):
            fired.setdefault(f.rule, set()).add(rec["recipe"])
    assert len(fired.get("MFSDP-PIPELINE-PARALLEL", ())) >= 50  # most large recipes use PP
    assert "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_functional_config" in fired["MFSDP-MOE-OVERLAP-CUDA-GRAPH"]
    assert {"deepseek_v4_flash_pretrain_32gpu_h100_bf16_muon_config"} <= fired["MFSDP-OPTIMIZER-UNSUPPORTED"]
    assert "llama3_8b_peft_1gpu_h100_bf16_config" in fired["MFSDP-PEFT-NEEDS-PRETRAINED"]
    assert "nemotron_3_super_sft_16gpu_h100_bf16_32k_config" in fired["MFSDP-ENV-MAX-CONNECTIONS"]
    # NVIDIA's own FSDP recipe fails validate() as shipped (torch_dist checkpoints): check says so unmodified
    shipped = {f.rule for f in rules.evaluate(_load(_by_name("qwen35_vl_35b_a3b_sft_2gpu_h100_bf16_fsdp_config")), {})}
    assert "MFSDP-CKPT-FORMAT" in shipped


def _by_name(name: str) -> dict:
    return next(r for r in RECORDS if r["recipe"] == name)


def test_unmodified_recipes_get_only_warnings_an_expert_wants():
    """Warnings on recipes as shipped: only on the one that turns Megatron FSDP on itself."""
    warned = {
        (rec["recipe"], f.rule)
        for rec in RECORDS
        for f in rules.evaluate(_load(rec), {}, None)
        if f.severity == "warning"
    }
    assert warned == {("qwen35_vl_35b_a3b_sft_2gpu_h100_bf16_fsdp_config", "MFSDP-AVG-IN-COLLECTIVE")}


# Reading every recipe as shipped, and the verdict with Megatron FSDP on (with the pipeline-parallel wrap failures),
# are tested once, through the command line, in tests/recipes/test_corpus.py (test_check_reads_every_recipe_as_shipped,
# test_check_agrees_with_bridge_with_fsdp_on, test_check_reports_pipeline_parallel_under_fsdp).


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
def test_as_shipped_verdict_agrees(rec):
    findings = rules.evaluate(_load(rec), {}, None)
    assert not _compare(rec, rec.get("verdicts", {}).get("as_shipped"), findings)


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
def test_enable_gives_a_startable_config_or_refuses_for_a_decision(rec):
    cfg = _load(rec)
    changes = enable.plan(cfg)
    result = enable.apply(cfg, changes)
    left = _errors(rules.evaluate(result, {}, None))
    assert left <= DECISIONS, f"enable left errors that it should have fixed: {sorted(left - DECISIONS)}"
    assert config_io.get(result, "checkpoint.load") == config_io.get(cfg, "checkpoint.load")
    assert config_io.get(result, "checkpoint.pretrained_checkpoint") == config_io.get(
        cfg, "checkpoint.pretrained_checkpoint"
    )
    assert all(not enable._same(c.old, c.new) for c in changes)
    # with the user's decisions given, nothing is left
    if "MFSDP-PIPELINE-PARALLEL" in left:
        result = enable.apply(cfg, enable.plan(cfg, set_pp1=True))
        assert "MFSDP-PIPELINE-PARALLEL" not in _errors(rules.evaluate(result, {}, None))


# What a user passes once enable has refused for a decision (as tests/recipes/enable_corpus.py does).
USER_CHOICES = {"MFSDP-PEFT-NEEDS-PRETRAINED": "checkpoint.pretrained_checkpoint=/workspace/base_model_hf"}
# Refusals that stay whatever the user passes here: another optimizer or graph mode is a choice of theirs.
STAYS_REFUSED = {"MFSDP-OPTIMIZER-UNSUPPORTED", "MFSDP-MOE-OVERLAP-CUDA-GRAPH"}


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
def test_enabled_yaml_as_written_passes_check_after_the_users_decisions(rec):
    """The YAML enable writes (edited in place), read back like check reads it: no error left but a real refusal."""
    path = DIR / rec["yaml"]
    text = path.read_text(encoding="utf-8")
    data = config_io.parse_yaml(text, str(path))
    cfg = config_io.merge_file(config_io.base_config(None), data, str(path))
    first = _errors(rules.evaluate(enable.apply(cfg, enable.plan(cfg)), {}, None))
    changes = []
    for rule in sorted(first & set(USER_CHOICES)):
        key, value = config_io.parse_override(USER_CHOICES[rule])
        changes.append(enable.Change(key, config_io.get(cfg, key), value, "the user's choice"))
        config_io.set_path(cfg, key, value)
    given = config_io.merge_file(config_io.base_config(None), data, str(path))
    planned = enable.plan(cfg, set_pp1="MFSDP-PIPELINE-PARALLEL" in first, given=given)
    world = enable.job_world(given, enable.apply(cfg, planned))
    # the batch no longer divides by micro-batch x DP at that world (PP=1 grew DP): the user picks the nearest
    # valid training batch enable names (the eval batch follows it)
    batch = [
        f for f in rules.evaluate(enable.apply(cfg, planned), {}, None, *world) if f.rule == "MFSDP-TRAIN-BATCH-DP"
    ]
    if batch:
        key, value = config_io.parse_override(batch[0].fix.split(",")[0].split(" ")[0])
        changes.append(enable.Change(key, config_io.get(cfg, key), value, "the user's choice"))
        config_io.set_path(cfg, key, value)
        planned = enable.plan(cfg, set_pp1="MFSDP-PIPELINE-PARALLEL" in first, given=given)
    changes += planned
    body, _ = enable.yaml_edit(text, data, changes)
    reread = config_io.merge_file(config_io.base_config(None), config_io.parse_yaml(body, "result"), "result")
    left = _errors(rules.evaluate(reread, {}, None, *world))
    assert left <= STAYS_REFUSED, sorted(left)
    assert config_io.get(reread, "checkpoint.load") == config_io.get(cfg, "checkpoint.load")


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
def test_bridge_accepted_what_enable_wrote(rec):
    """The real validate() on enable's changes (recorded on the GPU machine): accepted, or rejected for a cause
    that is not Megatron FSDP's (documented above). A rejection enable caused means the recorded run is stale or
    enable is wrong: regenerate the corpus with tests/recipes/gen_corpus.py after changing enable."""
    verdicts = rec.get("verdicts", {})
    for key in ("enabled_overrides", "enabled_overrides_pretrained"):
        v = verdicts.get(key)
        if not v or v.get("ok") or v.get("error_type") == "OverrideError":
            continue
        message = v.get("error") or ""
        assert any(message.startswith(m) for m in NOT_FSDP), f"{key}: {message[:200]}"
