"""The dtype-string rules against the pinned sources: the whole class of fields, and the conversion they rely on.

A string on a ``torch.dtype`` field whose default is None is never turned into a dtype by Bridge's
override path (``_apply_overrides`` converts only over a field that already holds a dtype), so
``ddp.megatron_fsdp_main_grads_dtype=fp32`` reaches Megatron FSDP's mixed-precision policy as a string
and the model wrap fails. The rule tables in ``rules/precision.py`` must name every such field of the
config sections: this test finds them in the pinned wheels with ``ast``, so a field added by a new
release fails here until it is placed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mfsdp_lib import config_io, rules
from mfsdp_lib.rules import precision as P

# Source files whose dataclasses are ConfigContainer sections, and the section their fields land in.
# A folder is scanned whole; ``None`` means "no dtype field with default None is expected here" (a hit
# fails and asks for its section).
SCANNED: list[tuple[str, str, str | None]] = [
    ("mcore", "megatron/core/distributed/distributed_data_parallel_config.py", "ddp"),
    ("mcore", "megatron/core/model_parallel_config.py", "model"),
    ("mcore", "megatron/core/transformer/transformer_config.py", "model"),
    ("mcore", "megatron/core/optimizer/optimizer_config.py", "optimizer"),
    ("mcore", "megatron/training/config", None),
    ("bridge", "megatron/bridge/training/mixed_precision.py", "mixed_precision"),
    ("bridge", "megatron/bridge/training/config.py", None),
    ("bridge", "megatron/bridge/peft", "peft"),
    ("bridge", "megatron/bridge/models", "model"),
]
# Not config sections: the checkpoint converter's per-task settings.
NOT_CONFIG = ("megatron/bridge/models/conversion/",)


def _none_dtype_fields(path: Path) -> list[tuple[str, str]]:
    """(class, field) of every class-level ``x: <...torch.dtype...> = None`` in ``path``."""
    out = []
    for cls in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(cls, ast.ClassDef):
            continue
        for item in cls.body:
            if (
                isinstance(item, ast.AnnAssign)
                and isinstance(item.target, ast.Name)
                and "torch.dtype" in ast.unparse(item.annotation)
                and "dict[" not in ast.unparse(item.annotation).lower()
                and "list[" not in ast.unparse(item.annotation).lower()
                and isinstance(item.value, ast.Constant)
                and item.value.value is None
            ):
                out.append((cls.name, item.target.id))
    return out


@pytest.fixture(scope="module")
def source_fields(bridge_src, mcore_src) -> dict[str, str]:
    """``section.field`` -> where it was found, for every dtype field with default None in a section."""
    roots = {"bridge": bridge_src, "mcore": mcore_src}
    found: dict[str, str] = {}
    unplaced: list[str] = []
    for wheel, rel, section in SCANNED:
        base = roots[wheel] / rel
        assert base.exists(), f"{rel} is not in the pinned {wheel} wheel: update SCANNED"
        files = sorted(base.rglob("*.py")) if base.is_dir() else [base]
        for f in files:
            rel_f = f.relative_to(roots[wheel]).as_posix()
            if rel_f.startswith(NOT_CONFIG):
                continue
            for cls, field in _none_dtype_fields(f):
                if section is None:
                    unplaced.append(f"{rel_f}::{cls}.{field}")
                else:
                    found[f"{section}.{field}"] = f"{rel_f}::{cls}"
    assert not unplaced, f"dtype fields with default None in a file SCANNED maps to no section: {unplaced}"
    return found


def test_the_rule_tables_name_exactly_the_fields_the_source_has(source_fields):
    tabled = set(P.FSDP_DTYPE_NONE_FIELDS) | set(P.OTHER_DTYPE_NONE_FIELDS) | set(P.DTYPE_NONE_SKIPPED)
    missing = {k: v for k, v in source_fields.items() if k not in tabled}
    stale = tabled - set(source_fields)
    assert not missing, f"dtype fields with default None that no rule table names: {missing}"
    assert not stale, f"tabled fields the pinned source no longer types as dtype with default None: {stale}"
    # The ones the review found must be among them (the scan itself works).
    assert {"ddp.megatron_fsdp_main_grads_dtype", "ddp.megatron_fsdp_grad_comm_dtype"} <= set(source_fields)


def test_the_conversion_and_the_failure_the_rules_quote(bridge_src, mcore_src):
    omega = (bridge_src / "megatron/bridge/training/utils/omegaconf_utils.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(omega)) if isinstance(n, ast.FunctionDef) and n.name == "_apply_overrides")
    body = ast.unparse(fn)
    assert "isinstance(current_attr, torch.dtype) and isinstance(value, str)" in body
    assert "'_target_' in value" in body and "instantiate(value)" in body  # the form that works
    buf = (mcore_src / "megatron/core/distributed/fsdp/src/megatron_fsdp/param_and_grad_buffer.py").read_text()
    assert "group.grad_dtype.is_floating_point" in buf
    # megatron_fsdp_main_params_dtype defaults to a dtype: a string there IS converted, so it is not in the class.
    ddp = (mcore_src / "megatron/core/distributed/distributed_data_parallel_config.py").read_text()
    assert "megatron_fsdp_main_params_dtype: Optional[torch.dtype] = torch.float32" in ddp
    # Bridge's YAML dumper writes a dtype as the mapping the fix gives.
    dumper = (mcore_src / "megatron/training/config/yaml_utils.py").read_text()
    rep = next(
        n
        for n in ast.walk(ast.parse(dumper))
        if isinstance(n, ast.FunctionDef) and n.name == "_torch_dtype_representer"
    )
    assert "'_target_': str(data)" in ast.unparse(rep) and "'_call_': False" in ast.unparse(rep)
    # instantiate returns the target itself, uncalled, when _call_ is false.
    inst = (mcore_src / "megatron/training/config/instantiate_utils.py").read_text()
    assert "if not should_call_target:" in inst and "return _target_" in inst


def test_dtype_spellings_are_bridges(bridge_src):
    """The fix names the torch dtype of every spelling Bridge's str_to_dtype knows (activation_map.DTYPE_MAP)."""
    text = (bridge_src / "megatron/bridge/utils/activation_map.py").read_text()
    node = next(
        n
        for n in ast.walk(ast.parse(text))
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == "DTYPE_MAP"
    )
    bridge = {k.value: ast.unparse(v) for k, v in zip(node.value.keys, node.value.values, strict=True)}
    assert bridge == P._TORCH_DTYPE


def _check(*overrides: str) -> list:
    cfg = config_io.load_effective(
        None,
        [
            "ddp.use_megatron_fsdp=true",
            "dist.use_megatron_fsdp=true",
            "ddp.data_parallel_sharding_strategy=optim_grads_params",
            "checkpoint.ckpt_format=fsdp_dtensor",
            *overrides,
        ],
    )
    return rules.evaluate(cfg, {}, None)


@pytest.mark.parametrize("field", sorted(P.FSDP_DTYPE_NONE_FIELDS))
@pytest.mark.parametrize("value", ["fp32", "torch.float32", "bf16"])
def test_a_string_on_a_megatron_fsdp_dtype_field_is_an_error(field, value):
    found = [f for f in _check(f"{field}={value}") if f.rule == "MFSDP-DTYPE-STRING"]
    assert len(found) == 1 and found[0].severity == "error" and found[0].path == field
    name = P.torch_dtype_name(value)
    assert f"'{field}={{_target_:{name},_call_:false}}'" in found[0].fix


@pytest.mark.parametrize("field", sorted(P.FSDP_DTYPE_NONE_FIELDS))
def test_the_working_forms_pass(field):
    """The Hydra-dict override and the YAML mapping give a mapping, not a string: no finding."""
    assert not [f for f in _check(f"{field}={{_target_:torch.float32,_call_:false}}") if "DTYPE" in f.rule]
    assert not [f for f in _check(f"{field}=null") if "DTYPE" in f.rule]


def test_without_megatron_fsdp_the_ddp_fields_are_unread():
    cfg = config_io.load_effective(None, ["ddp.megatron_fsdp_main_grads_dtype=fp32"])
    assert not [f for f in rules.evaluate(cfg, {}, None) if f.rule == "MFSDP-DTYPE-STRING"]


def test_model_dtype_strings_warn_only_without_mixed_precision():
    """MixedPrecisionConfig.setup overwrites model.*_dtype, so the string only stays without a preset."""
    assert not [f for f in _check("model.autocast_dtype=bf16") if f.rule == "MFSDP-DTYPE-STRING-OTHER"]
    found = [f for f in _check("mixed_precision=null", "model.autocast_dtype=bf16") if f.rule.startswith("MFSDP-DTYPE")]
    assert [(f.rule, f.severity, f.path) for f in found] == [
        ("MFSDP-DTYPE-STRING-OTHER", "warning", "model.autocast_dtype")
    ]


def test_hydra_dict_override_parses_to_a_mapping():
    assert config_io.parse_value("{_target_:torch.float32,_call_:false}") == {
        "_target_": "torch.float32",
        "_call_": False,
    }
    assert config_io.parse_value("{a:{b:1}}") == "{a:{b:1}}"  # nested: left as text
