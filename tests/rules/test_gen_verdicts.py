"""The differential-verdict generator: its cases, and that the committed verdicts are its output.

Bridge itself only runs on the GPU machine; here we check what can drift without it:
the case list (deterministic, >= 100, inside the fields our rules claim to know, one
rank's worth of parallelism) and that ``tests/fixtures/differential/verdicts.json``
still holds exactly the cases the generator makes (else it must be regenerated).
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import pytest

from mfsdp_lib.rules import differential

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gen_verdicts", ROOT / "tests" / "differential" / "gen_verdicts.py")
assert _spec is not None and _spec.loader is not None
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)
VERDICTS = ROOT / "tests" / "fixtures" / "differential" / "verdicts.json"
PAIR_ONLY = {"ddp.disable_symmetric_registration"}  # set only in the targeted pairs


def test_cases_are_many_unique_and_deterministic():
    a, b = gen.generate_cases(), gen.generate_cases()
    assert a == b
    assert len(a) >= 100
    assert len({c["id"] for c in a}) == len(a)
    assert len({(tuple(c["overrides"]), tuple(sorted(c["env"].items()))) for c in a}) == len(a)


def test_cases_stay_inside_the_rule_fields_and_one_rank():
    known = set(differential.DIFFERENTIAL_FIELDS) | PAIR_ONLY
    for case in gen.generate_cases():
        for o in case["overrides"]:
            key = o.split("=", 1)[0]
            assert key in known or key.startswith("env_vars."), o
            assert not key.endswith(("_parallel_size", "sequence_parallel")), o
        assert set(case["env"]) <= set(differential.DIFFERENTIAL_ENV)


def test_override_sets_attributes_and_dict_keys():
    class Section:
        use_megatron_fsdp = False

    class Container:
        ddp = Section()
        env_vars: dict = {}
        mixed_precision = None

    c = Container()
    gen.apply_override(c, "ddp.use_megatron_fsdp=true")
    gen.apply_override(c, "env_vars.CUDA_DEVICE_MAX_CONNECTIONS=1")
    gen.apply_override(c, "mixed_precision=bf16_mixed")
    assert c.ddp.use_megatron_fsdp is True and c.env_vars == {"CUDA_DEVICE_MAX_CONNECTIONS": 1}
    assert c.mixed_precision == "bf16_mixed"
    with pytest.raises(AttributeError, match="no field 'typo'"):
        gen.apply_override(c, "ddp.typo=1")


def test_committed_verdicts_are_the_generators_cases():
    doc = json.loads(VERDICTS.read_text())
    assert set(doc) == {"generated_by", "date", "bridge_version", "base_config", "cases"}
    assert doc["bridge_version"] == "0.6.2" and doc["base_config"] == "base_run_config.yaml"
    assert (VERDICTS.parent / doc["base_config"]).is_file()
    assert "WORLD_SIZE=1" in doc["generated_by"]
    # Every field and environment variable our rules claim to know was put to Bridge at least once.
    # (The exact case list may lag behind the generator until someone with a GPU reruns it; a
    # field Bridge was never asked about is a real gap, so that fails.)
    asked = {o.split("=", 1)[0] for c in doc["cases"] for o in c["overrides"]}
    missing = set(differential.DIFFERENTIAL_FIELDS) - asked
    assert not missing, f"rerun tests/differential/gen_verdicts.py on a GPU machine: no verdict for {sorted(missing)}"
    asked_env = {name for c in doc["cases"] for name in c["env"]}
    assert set(differential.DIFFERENTIAL_ENV) <= asked_env
    made = gen.generate_cases()
    if [{k: c[k] for k in ("id", "overrides", "env")} for c in doc["cases"]] != made:
        warnings.warn(
            "tests/differential/gen_verdicts.py now makes other cases than verdicts.json holds; "
            "rerun it on a GPU machine",
            stacklevel=2,
        )
    for c in doc["cases"]:
        b = c["bridge"]
        assert set(b) == {"ok", "error_type", "error"}
        assert (b["error_type"] is None) == b["ok"]
    # Bridge really said no to some and yes to others: the file is not a constant
    oks = [c["bridge"]["ok"] for c in doc["cases"]]
    assert any(oks) and not all(oks)
    assert doc["cases"][1]["overrides"] == gen.FSDP_ON and doc["cases"][1]["bridge"]["ok"]


def test_weight_hash_check_against_each_sharding_strategy():
    """Bridge's verdicts (H200, 2026-12-02): the weight-hash check is refused only with optim_grads_params."""
    doc = json.loads(VERDICTS.read_text())
    hash_on = "train.check_weight_hash_across_dp_replicas_interval=100"
    seen = {}
    for c in doc["cases"]:
        over = c["overrides"]
        if c["env"] or hash_on not in over or not set(gen.FSDP_ON) <= set(over) or len(over) != len(gen.FSDP_ON) + 2:
            continue
        strategy = next(o.split("=", 1)[1] for o in over if o.startswith("ddp.data_parallel_sharding_strategy="))
        seen[strategy] = c["bridge"]
    assert set(seen) == {"optim", "optim_grads", "optim_grads_params"}
    assert seen["optim"]["ok"] and seen["optim_grads"]["ok"]
    assert not seen["optim_grads_params"]["ok"] and seen["optim_grads_params"]["error_type"] == "AssertionError"
    assert "optim_grads_params" in seen["optim_grads_params"]["error"]
