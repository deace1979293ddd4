"""card.yaml validates against schemas/card.schema.json, and every status it claims
is backed: by a test that exists, or (for runtime_verified) by a recorded GPU run
in this repo. skill-card.md has its sections (its Results: tests/test_skill_card.py)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from _helpers_skill import ROOT, read

CARD = yaml.safe_load(read("card.yaml"))
SKILL_CARD = read("skill-card.md")
# Which evidence kinds can back which status.
BACKING = {
    "code_verified": {"test"},
    "runtime_verified": {"run"},
    "known_failure": {"run", "upstream_issue", "test"},
    "doc_only": {"source", "upstream_issue", "test", "pending_run", "run"},
    "unclear": {"source", "upstream_issue", "test", "pending_run", "run"},
}
SKILL_CARD_SECTIONS = [
    "Description",
    "Owner",
    "License",
    "Use case",
    "Known risks and mitigations",
    "References",
    "Skill output",
    "Evaluation agents",
    "Evaluation tasks and metrics",
    "Results",
    "Version",
]


def _schema():
    return json.loads(read("schemas/card.schema.json"))


def test_card_validates_against_its_schema():
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(_schema())
    jsonschema.validate(CARD, _schema())


def test_schema_rejects_what_it_should():
    import jsonschema

    bad_status = dict(CARD, validation_status={"x": ["verified_by_vibes"]})
    no_pins = {k: v for k, v in CARD.items() if k != "validated_against"}
    extra_key = dict(CARD, when_to_use="anything")
    for bad in (bad_status, no_pins, extra_key):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, _schema())


def test_pinned_versions_match_the_code():
    from mfsdp_lib import PINNED_BRIDGE, PINNED_MCORE

    assert CARD["validated_against"]["megatron-bridge"] == PINNED_BRIDGE
    assert CARD["validated_against"]["megatron-core"] == PINNED_MCORE


def test_every_status_is_backed_by_evidence_of_the_right_kind():
    for item, statuses in CARD["validation_status"].items():
        kinds = {e["kind"] for e in CARD["evidence"] if item in e["covers"]}
        for status in statuses:
            assert kinds & BACKING[status], f"{item}: {status} needs evidence of kind {BACKING[status]}, has {kinds}"


def test_evidence_entries_cover_real_items_and_point_at_real_files():
    items = set(CARD["validation_status"])
    for e in CARD["evidence"]:
        assert set(e["covers"]) <= items, f"evidence covers unknown items: {set(e['covers']) - items}"
        if e["kind"] in ("test", "run"):
            assert (ROOT / e["ref"].rstrip("/")).exists(), f"evidence {e['ref']} does not exist"
        if e["kind"] == "test":
            assert re.fullmatch(r"tests/(\w+/)?test_\w+\.py", e["ref"])


def test_runtime_verified_only_from_a_recorded_run_in_this_repo():
    """A GPU claim needs a results file (benchmarks/results/*.json) naming a real command."""
    for item, statuses in CARD["validation_status"].items():
        if "runtime_verified" not in statuses:
            continue
        runs = [e for e in CARD["evidence"] if e["kind"] == "run" and item in e["covers"]]
        assert runs, f"{item} is runtime_verified without a run"
        for e in runs:
            path = ROOT / e["ref"]
            assert path.is_file() and path.suffix == ".json", f"{e['ref']}: a recorded result file"
            result = json.loads(path.read_text())
            assert result.get("command") and result.get("machine") and result.get("date")


def test_recommended_path_is_what_skill_md_tells_the_agent_to_set():
    body = read("SKILL.md")
    for key, value in CARD["recommended_path"].items():
        py = {True: "True", False: "False"}.get(value, f'"{value}"')
        assert f"cfg.{key} = {py}" in body, f"SKILL.md does not set {key} = {py}"


def test_skill_card_sections_license_and_version():
    heads = re.findall(r"^## (.+)$", SKILL_CARD, re.M)
    assert heads == SKILL_CARD_SECTIONS
    assert "Apache-2.0" in SKILL_CARD
    from mfsdp_lib import __version__

    assert __version__ in SKILL_CARD.split("## Version", 1)[1]


def test_validated_on_is_the_date_and_machine_of_the_runs_behind_runtime_verified():
    """validated_on / validated_on_machine name the GPU run the runtime_verified items come from."""
    refs = {
        e["ref"]
        for e in CARD["evidence"]
        if e["kind"] == "run" and any("runtime_verified" in CARD["validation_status"][i] for i in e["covers"])
    }
    gpu = [json.loads((ROOT / r).read_text()) for r in sorted(refs) if r.startswith("benchmarks/results/gpu_")]
    assert gpu, "no GPU run behind runtime_verified"
    for result in gpu:
        assert result["date"].startswith(CARD["validated_on"]), (result["benchmark"], result["date"])
        assert result["machine"] == CARD["validated_on_machine"], result["benchmark"]


def test_unsharded_items_stay_unverified_until_a_multi_gpu_run():
    """One GPU means DP=1: sharding, multi-node and srun cannot be runtime_verified from a 1-GPU result."""
    for item in ("megatron_fsdp_sharding_at_dp2_or_more", "megatron_fsdp_multi_node_and_srun"):
        statuses = CARD["validation_status"][item]
        runs = [e["ref"] for e in CARD["evidence"] if e["kind"] == "run" and item in e["covers"]]
        if "runtime_verified" in statuses:
            assert any("1xh200" not in r for r in runs), f"{item}: runtime_verified needs a multi-GPU run"
    follow = " ".join(CARD["follow_up_validation"])
    assert "NPROC=2 tests/gpu/run_device.sh" in follow and "smoke --nproc-per-node 2 --save-resume" in follow


def test_rehearsal_items_claim_only_what_the_recorded_rehearsals_show():
    """Each rehearsal item is runtime_verified from result files whose own rows show it."""
    cli = json.loads((ROOT / "benchmarks/results/rehearse_cli_1xh200.json").read_text())
    runs = json.loads((ROOT / "benchmarks/results/rehearse_1xh200.json").read_text())["raw"]["runs"]
    status = CARD["validation_status"]
    shown = {
        # the real command passed one case (exit 0) and failed the PP case on both stages (exit 1)
        "megatron_fsdp_rehearsal_end_to_end": {c: v["exit"] for c, v in cli["raw"]["cases"].items()}
        == {"llama1b_n8_optim_grads_params": 0, "llama1b_n8_pp2": 1},
        "megatron_fsdp_pipeline_parallel_wrap_failure": [r[5] for r in cli["rows"] if r[4] == "failed"]
        == ["model_wrap: MFSDP-PIPELINE-PARALLEL"] * 2
        and runs["B_pp2_llama1b_n8_optim_grads_params"]["failure"]["rule"] == "MFSDP-PIPELINE-PARALLEL",
        "megatron_fsdp_moe_expert_parallel_rehearsal": all(
            runs[n]["result"] == "passed" and runs[n]["moe"]
            for n in ("B_moe_n8_ep8_optim_grads_params", "B_moe_n64_ep8_optim_grads_params", "B_moe_n64_ep8_distopt")
        ),
        "megatron_fsdp_ddp_loss_parity": runs["C_parity_llama1b"]["passed"] is True,
        "megatron_fsdp_save_load_rehearsed_at_fake_world_8": runs["C_saveload_llama1b_n8_optim_grads_params"]["result"]
        == "passed"
        and runs["C_saveload_llama1b_n8_optim_grads_params"]["world_size"] == 8
        and runs["C_saveload_llama1b_n8_optim_grads_params"]["save_load"]["saved_iteration"] is not None,
    }
    for item, ok in shown.items():
        assert "runtime_verified" in status[item], item
        assert ok, f"{item} is runtime_verified but the recorded rehearsal does not show it"
    # what no rehearsal can show stays unverified: fake collectives move no data
    assert "runtime_verified" not in status["megatron_fsdp_sharding_at_dp2_or_more"]
