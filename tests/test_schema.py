"""schema.py against the real megatron-bridge 0.6.2 / megatron-core 0.19.2 sources.

The defaults table is what ``check`` assumes for every key a config leaves out, so it
must equal the dataclass defaults in the wheels. The tests walk each section's class
chain (most derived first, as Python's MRO would) and compare the first definition.
"""

from __future__ import annotations

import ast

import pytest

from _helpers_config import (
    NoDefault,
    Unevaluable,
    class_fields,
    field_docstring,
    find_class,
    literal_choices,
    wheel_file,
)
from mfsdp_lib import schema as S

TYPE_WORDS = {S.BOOL: "bool", S.INT: "int", S.FLOAT: "float", S.STR: "str"}


def _definition(bridge_src, mcore_src, section, key):
    for rel, cls in S.SECTION_CLASSES[section]:
        path = wheel_file(bridge_src, mcore_src, rel)
        fields = class_fields(path, cls)
        if key in fields:
            return rel, cls, fields[key]
    return None


SECTION_PATHS = [p for p in S.FIELDS if "." in p]


@pytest.mark.parametrize("path", SECTION_PATHS)
def test_default_matches_wheel(bridge_src, mcore_src, path):
    section, key = path.split(".", 1)
    found = _definition(bridge_src, mcore_src, section, key)
    assert found is not None, f"{path}: no class in {S.SECTION_CLASSES[section]} defines '{key}'"
    rel, cls, (annotation, default) = found
    typ, ours, choices, nullable, source = S.FIELDS[path]
    assert source == f"{rel}: {cls}", f"{path}: defined in {rel}: {cls}, schema says {source}"
    if isinstance(default, NoDefault):
        assert path in S.REQUIRED and ours is None, f"{path}: required in the source, schema default {ours!r}"
    elif isinstance(default, Unevaluable):
        assert ours == S.FACTORY, f"{path}: computed default {default} in the source, schema says {ours!r}"
    else:
        assert ours == default and type(ours) is type(default), f"{path}: source default {default!r}, schema {ours!r}"
    if typ in TYPE_WORDS:
        assert TYPE_WORDS[typ] in annotation or "Literal" in annotation, f"{path}: annotation {annotation}"
    if nullable:
        assert "None" in annotation or "Optional" in annotation or ours is None, f"{path}: not Optional: {annotation}"


@pytest.mark.parametrize("path", [p for p in SECTION_PATHS if S.FIELDS[p][2] is not None])
def test_enum_choices_match_wheel(bridge_src, mcore_src, path):
    """Literal annotations must list exactly our choices; plain-str enums must document each choice."""
    section, key = path.split(".", 1)
    rel, cls, (annotation, _default) = _definition(bridge_src, mcore_src, section, key)
    choices = S.FIELDS[path][2]
    lit = literal_choices(annotation)
    if lit is None:  # a subclass may re-declare it as plain str (Bridge's CheckpointConfig.async_strategy)
        for prel, pcls in S.SECTION_CLASSES[section]:
            pf = class_fields(wheel_file(bridge_src, mcore_src, prel), pcls)
            if key in pf and literal_choices(pf[key][0]) is not None:
                lit = literal_choices(pf[key][0])
                break
    if lit is None and section == "mixed_precision":
        # MixedPrecisionConfig.fp8_recipe is a plain str copied onto TransformerConfig.fp8_recipe (a Literal).
        tc = class_fields(wheel_file(bridge_src, mcore_src, S.MC_TC), "TransformerConfig")
        lit = literal_choices(tc[key][0])
    if lit is not None:
        assert set(choices) == set(lit), f"{path}: source Literal {lit}, schema {choices}"
    else:
        doc = field_docstring(wheel_file(bridge_src, mcore_src, rel), cls, key)
        for c in choices:
            assert f"'{c}'" in doc or f'"{c}"' in doc, f"{path}: choice {c!r} not documented in {rel}: {cls}.{key}"


def test_section_classes_exist(bridge_src, mcore_src):
    for chain in S.SECTION_CLASSES.values():
        for rel, cls in chain:
            assert find_class(wheel_file(bridge_src, mcore_src, rel), cls) is not None, f"{rel}: {cls} missing"


def test_container_keys_are_configcontainer_fields(bridge_src, mcore_src):
    fields = class_fields(wheel_file(bridge_src, mcore_src, S.B_CFG), "ConfigContainer")
    public = {k for k in fields if not k.startswith("_")}
    assert set(S.CONTAINER_KEYS) == public


def test_mixed_precision_and_comm_overlap_keys(bridge_src, mcore_src):
    mp = class_fields(wheel_file(bridge_src, mcore_src, S.B_MP), "MixedPrecisionConfig")
    assert set(S.MIXED_PRECISION_KEYS) == set(mp)
    co = class_fields(wheel_file(bridge_src, mcore_src, S.B_CO), "CommOverlapConfig")
    assert set(S.COMM_OVERLAP_KEYS) == set(co)
    # the base of our presets is the class default for every field we track
    for k, v in S._MP_BASE.items():
        assert mp[k][1] == v, f"MixedPrecisionConfig.{k}: source {mp[k][1]!r}, _MP_BASE {v!r}"


def _presets_from_source(bridge_src, mcore_src) -> dict:
    """Evaluate Bridge's @register preset functions symbolically over the tracked fields."""
    path = wheel_file(bridge_src, mcore_src, S.B_MP)
    tree = ast.parse(path.read_text())
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    registered = [
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and any(getattr(d, "id", None) == "register" for d in n.decorator_list)
    ]
    base = S._MP_BASE

    def run(name):
        out = None
        for stmt in funcs[name].body:
            if (
                isinstance(stmt, ast.Return)
                and isinstance(stmt.value, ast.Call)
                and getattr(stmt.value.func, "id", None) == "MixedPrecisionConfig"
            ):
                out = dict(base)
                for kw in stmt.value.keywords:
                    if kw.arg in base:
                        out[kw.arg] = ast.literal_eval(kw.value)
                return out
            if (
                isinstance(stmt, ast.Assign)
                and isinstance(stmt.value, ast.Call)
                and getattr(stmt.value.func, "id", None) in funcs
            ):
                out = run(stmt.value.func.id)
            elif isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Attribute):
                attr = stmt.targets[0].attr
                if attr in base:
                    out[attr] = ast.literal_eval(stmt.value)
        return out

    return {name: run(name) for name in registered}


def test_mixed_precision_presets_match_source(bridge_src, mcore_src):
    real = _presets_from_source(bridge_src, mcore_src)
    assert len(real) >= 10
    ours = {k: v for k, v in S.MIXED_PRECISION_PRESETS.items() if "-" not in k}
    assert set(ours) == set(real)
    for name, fields in real.items():
        assert ours[name] == fields, f"{name}: source {fields}, schema {ours[name]}"
        assert S.MIXED_PRECISION_PRESETS[name.replace("_", "-")] == fields  # hyphen alias (Bridge's register)


def test_mp_targets_exist_in_target_classes(bridge_src, mcore_src):
    """MixedPrecisionConfig.setup copies a field only where the target class has it."""
    for section, keys in S.MP_TARGETS.items():
        for k in keys:
            assert _definition(bridge_src, mcore_src, section, k) is not None, f"{section}.{k} not a field"


def test_section_defaults_shape():
    d = S.section_defaults()
    assert d["ddp"]["data_parallel_sharding_strategy"] == "no_shard"
    assert d["checkpoint"]["ckpt_format"] == "torch_dist"
    assert d["env_vars"] == {} and d["mixed_precision"] is None
    d["env_vars"]["X"] = "1"
    assert S.section_defaults()["env_vars"] == {}  # a fresh dict each time


def test_not_in_this_release_really_absent(bridge_src, mcore_src):
    """The keys we call absent from this release are named nowhere in the pinned wheels' Python sources."""
    for path in S.NOT_IN_THIS_RELEASE:
        name = path.split(".", 1)[1]
        for root in (bridge_src, mcore_src):
            hits = [p for p in root.rglob("*.py") if name in p.read_text(encoding="utf-8", errors="replace")]
            assert not hits, f"{name} appears in {hits[:3]}"


@pytest.mark.parametrize("path", sorted(S.FAMILY_NULLABLE))
def test_family_nullable_fields_are_optional_in_that_familys_provider(bridge_src, mcore_src, path):
    """A null the base class forbids is accepted only where a family's provider really declares it Optional."""
    rel, cls = S.FAMILY_NULLABLE[path]
    fields = class_fields(wheel_file(bridge_src, mcore_src, rel), cls)
    key = path.split(".", 1)[1]
    assert key in fields, f"{cls} in {rel} declares no '{key}'"
    annotation, default = fields[key]
    assert "None" in annotation or "Optional" in annotation, f"{path}: {cls} declares it {annotation}"
