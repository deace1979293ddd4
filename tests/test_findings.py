"""The shared Finding record, its JSON contract, and file-system errors as one-line input errors."""

from __future__ import annotations

import io
import json
import os

import pytest

from mfsdp_lib.findings import (
    EXIT_FINDINGS,
    EXIT_OK,
    Finding,
    InputError,
    exit_code,
    fix_overrides,
    oserror_to_input,
    render_json,
    render_text,
)


def _f(sev: str, path: str = "ddp.x") -> Finding:
    return Finding(rule=f"R-{sev}", severity=sev, path=path, message=f"{sev} found", fix="set it")


def test_bad_severity_is_refused():
    with pytest.raises(ValueError):
        Finding(rule="R", severity="fatal", path="p", message="m", fix="f")


def test_exit_code_follows_error_severity_only():
    assert exit_code([_f("warning"), _f("info")]) == EXIT_OK
    assert exit_code([_f("info"), _f("error")]) == EXIT_FINDINGS


def test_json_contract_and_order():
    out = io.StringIO()
    render_json([_f("info"), _f("error"), _f("warning")], out=out, extra_key=1)
    obj = json.loads(out.getvalue())
    assert obj["ok"] is False and obj["extra_key"] == 1
    assert [f["severity"] for f in obj["findings"]] == ["error", "warning", "info"]
    assert set(obj["findings"][0]) >= {"rule", "severity", "path", "message", "fix"}


def test_extra_details_never_overwrite_contract_keys():
    f = Finding(rule="R", severity="info", path="p", message="m", fix="f", extra={"rule": "X", "source": "s"})
    d = f.to_dict()
    assert d["rule"] == "R" and d["source"] == "s"


def test_text_report_counts():
    out = io.StringIO()
    render_text([_f("error"), _f("error"), _f("info")], header="h", out=out)
    assert out.getvalue().splitlines()[-1] == "2 errors, 0 warnings, 1 info"


def test_oserror_messages(tmp_path):
    missing = tmp_path / "nope"
    assert "no such file or folder" in str(oserror_to_input(str(missing), FileNotFoundError(2, "x")))
    link = tmp_path / "dangling"
    os.symlink(tmp_path / "target-gone", link)
    assert "broken symbolic link" in str(oserror_to_input(str(link), FileNotFoundError(2, "x")))
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    try:
        os.stat(loop)
    except OSError as exc:
        msg = str(oserror_to_input(str(loop), exc))
    assert msg.endswith("symbolic link loop")
    perm = oserror_to_input("f", PermissionError(13, "denied"), "cannot list the folder")
    assert isinstance(perm, InputError) and str(perm) == "f: permission denied (cannot list the folder)"


# --- fix_overrides: the fix as overrides an agent can apply -----------------------------------------------------


@pytest.mark.parametrize(
    "fix, expected",
    [
        (
            "checkpoint.ckpt_format=fsdp_dtensor (or set both checkpoint.save and checkpoint.load to null)",
            ["checkpoint.ckpt_format=fsdp_dtensor"],
        ),
        (
            "dist.use_torch_fsdp2=false and dist.use_megatron_fsdp=true",
            ["dist.use_torch_fsdp2=false", "dist.use_megatron_fsdp=true"],
        ),
        (
            "ddp.use_custom_fsdp=false, ddp.use_megatron_fsdp=true, dist.use_megatron_fsdp=true",
            ["ddp.use_custom_fsdp=false", "ddp.use_megatron_fsdp=true", "dist.use_megatron_fsdp=true"],
        ),
        (
            "train.global_batch_size=96 (or 128), or train.micro_batch_size=2 (keeps the global batch)",
            ["train.global_batch_size=96"],
        ),
        (
            "load it in a Megatron FSDP run (dist.use_megatron_fsdp=true ddp.use_megatron_fsdp=true), or export it",
            ["dist.use_megatron_fsdp=true", "ddp.use_megatron_fsdp=true"],
        ),
        (
            "model.offload_modules=[core_attn,attn_proj] (or model.fine_grained_activation_offloading=false)",
            ["model.offload_modules=[core_attn,attn_proj]"],
        ),
        (
            "choose one: model.fine_grained_activation_offloading=false or model.cpu_offloading=false",
            ["model.fine_grained_activation_offloading=false"],
        ),
        ("mixed_precision=bf16_mixed (sets model and optimizer consistently)", ["mixed_precision=bf16_mixed"]),
        # placeholders and words that are not a config section's key=value are never overrides
        ("checkpoint.save=/path/to/checkpoints (or checkpoint.async_save=false)", []),
        ("checkpoint.hf_source_path=<HF model id or local HF folder>", []),
        (
            "convert it first (python3 mfsdp.py convert HF_DIR DST --to fsdp_dtensor) and set "
            "checkpoint.pretrained_checkpoint=DST",
            [],
        ),
        ("remove expandable_segments:True from PYTORCH_CUDA_ALLOC_CONF / env_vars (or use PyTorch >= 2.11)", []),
        ("'mfsdp.py enable' (all five settings), or ddp.data_parallel_sharding_strategy=no_shard", []),
        ("export NCCL_FOO=1 and set foo.bar=1", []),  # foo is no section of a ConfigContainer
        ("", []),
        (None, []),
    ],
)
def test_fix_overrides_reads_the_first_option(fix, expected):
    assert fix_overrides(fix) == expected


def test_finding_json_carries_fix_overrides():
    d = Finding("R", "error", "ddp.x", "m", "ddp.average_in_collective=false (or leave it)").to_dict()
    assert d["fix"] == "ddp.average_in_collective=false (or leave it)"
    assert d["fix_overrides"] == ["ddp.average_in_collective=false"]


def test_every_rule_override_is_in_its_fix_and_accepted_by_check():
    """The list comes from the rule table's own fix text; each entry is a word of that text and an override
    `check` itself accepts (config_io.apply_overrides, the code path of `check KEY=VALUE`)."""
    from mfsdp_lib import config_io
    from mfsdp_lib.rules import RULES

    seen = 0
    for rule in RULES:
        if not isinstance(rule.fix, str):
            continue
        got = fix_overrides(rule.fix)
        seen += bool(got)
        for o in got:
            assert o in rule.fix, (rule.id, o)
            config_io.apply_overrides(config_io.base_config(None), [o])
    assert seen >= 50  # nearly every rule's fix is a set of overrides
