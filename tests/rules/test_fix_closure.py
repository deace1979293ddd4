"""No finding offers a fix that another rule rejects: every fix, applied, leaves no new error.

A user (or an agent) applies the ``fix`` a finding gives and runs ``check`` again. Advice whose fix
turns into an error there is worse than no advice: ``MFSDP-META-DEVICE-INIT`` once offered
``model.init_model_with_meta_device=true`` on ``no_shard`` (Megatron FSDP then fails at model wrap,
``MFSDP-NO-SHARD-META-INIT``) and on PEFT (the base weights load into meta tensors,
``MFSDP-PEFT-META-DEVICE``).

For every real config the tests use (the recorded Bridge 0.6.2 recipe corpus, Bridge's own Llama 3 8B
dumps, the embedded default, the differential base config), in the variants the corpus tests judge (as
shipped; Megatron FSDP on with each sharding strategy; PEFT with a base model), at the smallest world the
layout allows and at the GPU count a recipe's name states, each finding's fix is applied (each ``or``
alternative that is plain ``key=value`` assignments, separately) and the config is checked again. An error
rule that was not there before is a bad fix, and the test names it.
"""

from __future__ import annotations

import copy
import functools
import re

import pytest

from conftest import FIXTURES, SCRIPTS
from mfsdp_lib import config_io, rules
from mfsdp_lib.findings import InputError

CORPUS = sorted((FIXTURES / "recipes" / "yaml").glob("*.yaml"))
OTHER_REAL = [
    *sorted((FIXTURES / "bridge-0.6.2-recipes").glob("*.yaml")),
    FIXTURES / "differential" / "base_run_config.yaml",
    SCRIPTS / "data" / "llama3_8b_pretrain.yaml",
]
# The corpus holds 208 recipes (tests/fixtures/recipes/README.md); far fewer is a broken checkout.
MIN_CORPUS = 150
STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")


def _fsdp(strategy: str) -> list[str]:
    """The five Megatron FSDP settings (as the corpus recording applied them), with a given sharding strategy."""
    return [
        "dist.use_megatron_fsdp=true",
        "ddp.use_megatron_fsdp=true",
        f"ddp.data_parallel_sharding_strategy={strategy}",
        "ddp.average_in_collective=false",
        "checkpoint.ckpt_format=fsdp_dtensor",
    ]


# What the corpus recording set for PEFT recipes (tests/recipes/test_corpus.py PRETRAINED).
PRETRAINED = "checkpoint.pretrained_checkpoint=/workspace/pretrained_checkpoint"

# One assignment inside a fix: a dotted key and a value without spaces (a trailing comma is punctuation).
_ASSIGN = re.compile(r"([A-Za-z_]\w*(?:\.\w+)+)=([^\s,]+)")
# Words that join assignments in one alternative ("a=1 and b=2", "a=1 with b=2, c=3", "a=1 b=2").
_JOINERS = re.compile(r"\b(?:and|with)\b|[,;]")
# Where one alternative ends and the next begins: "x=1, or y=2", "x=1 (or y=2)".
_OR = re.compile(r",\s*or\s+|\(\s*or\s+|\bor\s+")


def alternatives(fix: str) -> list[list[tuple[str, str]]]:
    """Each alternative of a fix that consists only of ``key=value`` assignments, as (key, raw value) pairs.

    Prose (``fewer data-parallel ranks``), placeholders (``<path>``) and notes in parentheses are no
    assignment: an alternative holding any of them is not applied mechanically, and is left out.
    """
    out = []
    for part in _OR.split(fix):
        part = re.sub(r"\([^()]*\)", " ", part).strip().rstrip(")").strip()
        pairs = _ASSIGN.findall(part)
        rest = _JOINERS.sub(" ", _ASSIGN.sub(" ", part)).strip()
        if pairs and not rest and not any(v.startswith("<") for _, v in pairs):
            out.append(pairs)
    return out


def test_alternatives_reads_the_fix_shapes_the_table_uses():
    assert alternatives("model.init_model_with_meta_device=true") == [[("model.init_model_with_meta_device", "true")]]
    assert alternatives("ddp.use_distributed_optimizer=true optimizer.use_distributed_optimizer=true") == [
        [("ddp.use_distributed_optimizer", "true"), ("optimizer.use_distributed_optimizer", "true")]
    ]
    assert alternatives(
        "train.global_batch_size=32 (or 48), or train.micro_batch_size=3 (keeps the global batch), or fewer "
        "data-parallel ranks"
    ) == [[("train.global_batch_size", "32")], [("train.micro_batch_size", "3")]]
    assert alternatives("model.init_model_with_meta_device=false (or a sharding strategy other than no_shard)") == [
        [("model.init_model_with_meta_device", "false")]
    ]
    assert alternatives("checkpoint.pretrained_checkpoint=<Hugging Face model folder>") == []
    assert alternatives("point checkpoint.pretrained_checkpoint at the Hugging Face model folder") == []


@functools.cache
def _base(path: str) -> dict:
    return config_io.load_effective(path)


def _variants(path: str) -> list[tuple[str, dict]]:
    """(name, effective config) for each variant of one real config the corpus tests judge."""
    base = _base(path)
    out = [("as shipped", base)]
    peft = base.get("peft") is not None
    for strategy in STRATEGIES:
        overrides = _fsdp(strategy) + ([PRETRAINED] if peft else [])
        out.append((f"fsdp {strategy}" + (" + base model" if peft else ""), _apply(base, overrides)))
    return out


def _apply(cfg: dict, overrides) -> dict:
    return config_io.apply_overrides(copy.deepcopy(cfg), list(overrides))


def _named_world(path) -> int | None:
    m = re.search(r"_(\d+)gpu_", path.stem + "_")
    return int(m.group(1)) if m else None


def _errors(cfg: dict, world: int | None) -> set[str]:
    how = None if world is None else "--gpus"
    return {f.rule for f in rules.evaluate(cfg, {}, None, world, how) if f.severity == "error"}


def _bad_fixes(path) -> tuple[list[str], int]:
    """Fixes on one config that bring a new error, and how many fixes were applied."""
    bad, applied = [], 0
    worlds = sorted({None, _named_world(path)}, key=lambda w: -1 if w is None else w)
    for name, cfg in _variants(str(path)):
        for world in worlds:
            how = None if world is None else "--gpus"
            findings = rules.evaluate(cfg, {}, None, world, how)
            before = {f.rule for f in findings if f.severity == "error"}
            for f in findings:
                for pairs in alternatives(f.fix):
                    overrides = [f"{k}={v}" for k, v in pairs]
                    try:
                        fixed = _apply(cfg, overrides)
                    except InputError as exc:
                        bad.append(f"{name}, world {world}: {f.rule} fix {overrides} is not a valid override: {exc}")
                        continue
                    applied += 1
                    new = _errors(fixed, world) - before
                    if new:
                        bad.append(f"{name}, world {world}: {f.rule} fix {overrides} brings {sorted(new)}")
    return bad, applied


def test_the_corpus_is_there():
    assert len(CORPUS) >= MIN_CORPUS, f"tests/fixtures/recipes/yaml holds {len(CORPUS)} recipes"
    for path in OTHER_REAL:
        assert path.is_file(), path


def test_every_fix_on_every_real_config_brings_no_new_error():
    """One test over the whole corpus (a failure lists every bad fix at once, and the configs load once)."""
    bad: list[str] = []
    applied = 0
    for path in CORPUS + OTHER_REAL:
        b, n = _bad_fixes(path)
        bad += [f"{path.name}: {x}" for x in b]
        applied += n
    assert applied > 1000, f"only {applied} fixes were applied: the fix parser no longer reads the table's fixes"
    assert not bad, f"{len(bad)} fixes bring a new error:\n" + "\n".join(bad[:40])


@pytest.mark.parametrize(
    "recipe, overrides, peft",
    [
        ("llama3_8b_pretrain_2gpu_h100_bf16", _fsdp("no_shard"), False),
        ("llama3_8b_peft_1gpu_h100_bf16", _fsdp("optim_grads_params") + [PRETRAINED], True),
    ],
    ids=["no_shard", "peft"],
)
def test_meta_device_advice_is_not_offered_where_meta_init_crashes(recipe, overrides, peft):
    """The two cases the GPU rejects (megatron_fsdp 0.6.1 param_and_grad_buffer: no model weight buffer under
    no_shard, so meta parameters are never materialised; PEFT loads weights before wrapping)."""
    path = FIXTURES / "recipes" / "yaml" / f"{recipe}.yaml"
    cfg = _apply(_base(str(path)), overrides)
    found = {f.rule for f in rules.evaluate(cfg, {}, None)}
    assert "MFSDP-META-DEVICE-INIT" not in found
    crashed = _apply(cfg, ["model.init_model_with_meta_device=true"])
    assert ("MFSDP-PEFT-META-DEVICE" if peft else "MFSDP-NO-SHARD-META-INIT") in _errors(crashed, None)
    # ... and still offered where it helps: a sharded strategy without PEFT.
    pretrain = FIXTURES / "recipes" / "yaml" / "llama3_8b_pretrain_2gpu_h100_bf16.yaml"
    sharded = _apply(_base(str(pretrain)), _fsdp("optim_grads_params"))
    assert "MFSDP-META-DEVICE-INIT" in {f.rule for f in rules.evaluate(sharded, {}, None)}
