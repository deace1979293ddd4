"""The what-works row lookup (``mfsdp_lib.what_works``) and the rows ``check``, ``enable`` and ``memory`` print.

The results file here is a TEST FIXTURE with invented numbers (tests/fixtures/what_works/README.md); the recipe
configs are the real Bridge 0.6.2 dumps, so the lookup is exercised on real model sections.
"""

from __future__ import annotations

import json

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, ROOT
from mfsdp_lib import what_works

FIXTURE = FIXTURES / "what_works" / "what_works_TEST_FIXTURE.json"
RECIPES = FIXTURES / "recipes" / "yaml"
QWEN_PRE = RECIPES / "qwen3_1p7b_pretrain_1gpu_h100_bf16.yaml"
QWEN_SFT = RECIPES / "qwen3_1p7b_sft_1gpu_h100_bf16.yaml"
DSV3 = RECIPES / "deepseek_v3_pretrain_256gpu_h100_bf16_32nodes.yaml"
OLMOE_SFT = RECIPES / "olmoe_7b_sft_8gpu_h100_bf16.yaml"
ENV = {what_works.RESULTS_ENV: str(FIXTURE)}


def _cfg(path):
    return yaml.safe_load(path.read_text())


def test_fixture_is_labelled_as_a_test_fixture():
    data = json.loads(FIXTURE.read_text())
    assert "TEST FIXTURE" in data["_fixture"] and "not a measurement" in data["_fixture"]


def test_fingerprint_is_the_model_not_the_layout():
    a = _cfg(QWEN_PRE)
    b = _cfg(QWEN_PRE)
    b["model"]["tensor_model_parallel_size"] = 8
    b["train"]["global_batch_size"] = 4096
    assert what_works.fingerprint(a) == what_works.fingerprint(b)
    b["model"]["num_layers"] += 1
    assert what_works.fingerprint(a) != what_works.fingerprint(b)
    # the provider class is part of it: a VL model with the same trunk is another model
    c = _cfg(QWEN_PRE)
    c["model"]["_target_"] = "megatron.bridge.models.qwen_vl.qwen3_vl_provider.Qwen3VLModelProvider"
    assert what_works.fingerprint(a) != what_works.fingerprint(c)
    assert what_works.fingerprint({"model": {"num_layers": 2}}) is None
    assert what_works.fingerprint({}) is None


def test_mode_of_config_from_its_sections():
    assert what_works.mode_of_config(_cfg(QWEN_PRE)) == "pretrain"
    assert what_works.mode_of_config(_cfg(QWEN_SFT)) == "sft"
    assert what_works.mode_of_config(_cfg(RECIPES / "qwen3_1p7b_peft_1gpu_h100_bf16.yaml")) == "peft"


def test_load_keeps_measured_rows_only(tmp_path):
    rows = what_works.load(str(FIXTURE))
    assert {r["id"] for r in rows} == {
        "qwen3_1p7b_pretrain_1gpu_h100_bf16",
        "deepseek_v3_pretrain_256gpu_h100_bf16_32nodes",
    }
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"schema": "something-else", "rows": json.loads(FIXTURE.read_text())["rows"]}))
    assert what_works.load(str(bad)) == []
    assert what_works.load(str(tmp_path / "absent.json")) == []
    bad.write_text("{not json")
    assert what_works.load(str(bad)) == []


def test_find_same_mode_first_and_other_modes_labelled():
    rows = what_works.load(str(FIXTURE))
    hits = what_works.find(_cfg(QWEN_PRE), rows)
    assert [(h[0]["id"], h[1]) for h in hits] == [("qwen3_1p7b_pretrain_1gpu_h100_bf16", True)]
    sft = what_works.find(_cfg(QWEN_SFT), rows)  # same model, another mode: given, and said so
    assert [(h[0]["id"], h[1]) for h in sft] == [("qwen3_1p7b_pretrain_1gpu_h100_bf16", False)]
    assert "mode pretrain" in what_works.lines(_cfg(QWEN_SFT), rows)[0]
    assert what_works.find(_cfg(OLMOE_SFT), rows) == []  # its row was planned, never measured


def test_lines_carry_verdict_memory_changes_and_error():
    rows = what_works.load(str(FIXTURE))
    text = "\n".join(what_works.lines(_cfg(DSV3), rows))
    assert "failed at wrap" in text and "256 GPUs" in text
    assert "TP2 PP8 CP1 EP32 DP16 -> TP2 PP1 CP1 EP32 DP128" in text
    assert "predicted 58.9 GiB" in text
    assert "model.pipeline_model_parallel_size=1" in text
    assert "ran with: model.moe_token_dispatcher_type=alltoall" in text
    assert "first error (no rule): FIXTURE ERROR" in text
    ok = "\n".join(what_works.lines(_cfg(QWEN_PRE), rows))
    assert "passed" in ok and "10.0 GiB" in ok and "1,234 tokens/s/GPU" in ok


def test_lines_name_a_cut_phase_and_a_cause_outside_megatron_fsdp(monkeypatch):
    """A row whose load the GPU call's time limit cut says so; a row whose first error lies outside Megatron FSDP
    (category not-fsdp) says it is no verdict on it. Both from the shipped results' rows."""
    import json

    shipped = {r["id"]: r for r in json.loads((ROOT / "benchmarks/results/what_works_1xh200.json").read_text())["rows"]}
    for rid, expect in (
        ("glm52_pretrain_416gpu_h100_bf16", "load: not run to its end"),
        ("wan_14b_sft_8gpu_h100_bf16", "not a verdict on Megatron FSDP"),
    ):
        monkeypatch.setattr(what_works, "find", lambda cfg, rows=None, r=shipped[rid]: [(r, True)])
        assert expect in "\n".join(what_works.lines({})), rid
    monkeypatch.setattr(what_works, "find", lambda cfg, rows=None: [(shipped["olmoe_7b_sft_8gpu_h100_bf16"], True)])
    text = "\n".join(what_works.lines({}))
    assert "not run to its end" not in text and "not a verdict" not in text


def test_check_prints_the_row(cli):
    p = cli("check", str(DSV3), "--env", "PATH=/usr/bin", env=ENV)
    assert p.returncode == 0, p.stderr
    assert "what-works: deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config: failed at wrap" in p.stdout


def test_check_json_stays_json_and_the_row_goes_to_stderr(cli):
    p = cli("check", str(DSV3), "--env", "PATH=/usr/bin", "--format", "json", env=ENV)
    json.loads(p.stdout)  # stdout holds the JSON alone
    assert "what-works:" in p.stderr


def test_enable_and_memory_print_the_row(cli, tmp_path):
    e = cli("enable", str(QWEN_PRE), "--gpus", "1", "-o", str(tmp_path / "out.yaml"), env=ENV)
    assert e.returncode == 0, e.stderr
    assert "what-works: qwen3_1p7b_pretrain_1gpu_h100_bf16_config: passed" in e.stdout
    m = cli("memory", str(QWEN_PRE), "--gpus", "1", env=ENV)
    assert m.returncode == 0, m.stderr
    assert "what-works: qwen3_1p7b_pretrain_1gpu_h100_bf16_config: passed" in m.stdout


def test_nothing_printed_without_a_measured_row(cli, tmp_path):
    planned = tmp_path / "planned.json"
    data = json.loads(FIXTURE.read_text())
    for r in data["rows"]:
        r["phases"] = dict.fromkeys(what_works.PHASES, "not run")
    planned.write_text(json.dumps(data))
    for env in ({what_works.RESULTS_ENV: str(planned)}, {what_works.RESULTS_ENV: str(tmp_path / "absent.json")}):
        p = cli("check", str(DSV3), "--env", "PATH=/usr/bin", env=env)
        assert p.returncode == 0 and "what-works" not in p.stdout + p.stderr


def test_the_shipped_results_file_holds_no_unmeasured_claims():
    """While nothing is measured there is no results file; once there is, every row it has came from a raw file."""
    path = what_works.RESULTS
    try:
        data = json.loads(open(path, encoding="utf-8").read())
    except FileNotFoundError:
        return
    assert data["schema"] == what_works.SCHEMA
    for row in data["rows"]:
        assert row.get("measured", {}).get("raw"), row.get("id")


leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=6))
nested = st.recursive(
    leaf,
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(
    model=st.dictionaries(
        st.sampled_from(["_target_", "num_layers", "hidden_size", *what_works.FINGERPRINT_FIELDS]), nested
    ),
    rest=st.dictionaries(st.sampled_from(["peft", "dataset", "train", "x"]), nested, max_size=3),
)
def test_lookup_never_raises_on_any_config(model, rest):
    """check, enable and memory call the lookup on the user's config: whatever it holds, no exception."""
    rows = what_works.load(str(FIXTURE))
    cfg = {"model": model, **rest}
    assert isinstance(what_works.lines(cfg, rows), list)
    assert what_works.mode_of_config(cfg) in ("pretrain", "sft", "peft")
