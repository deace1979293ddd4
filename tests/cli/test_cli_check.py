"""``mfsdp.py check`` as an agent runs it: verdicts on the real configs, JSON contract, exit codes."""

from __future__ import annotations

import json

import pytest

import raw_store  # benchmarks/: the raw GPU results, extracted from their archive on first use

RUN_CONFIG = "fixtures/real-h200-run/checkpoint_metadata_only/iter_0000010/run_config.yaml"
RECIPES = "fixtures/bridge-0.6.2-recipes"
CLEAN_ENV = ["--env", "PATH=/usr/bin"]  # judge against a known environment, not this shell's


def _json(proc):
    assert proc.stdout.count("\n{") == 0 and proc.stdout.lstrip().startswith("{")
    return json.loads(proc.stdout)


def test_real_run_config_accepted(cli, tests_dir):
    """The run_config.yaml of a real Megatron FSDP training run passes (exit 0)."""
    p = cli("check", str(tests_dir / RUN_CONFIG), *CLEAN_ENV, "--format", "json")
    assert p.returncode == 0, p.stdout + p.stderr
    out = _json(p)
    assert out["ok"] is True and out["megatron_fsdp"] is True
    assert all(f["severity"] != "error" for f in out["findings"])


def test_checkpoint_folder_means_its_run_config(cli, tests_dir):
    folder = tests_dir / RUN_CONFIG.rsplit("/", 1)[0]
    p = cli("check", str(folder), *CLEAN_ENV, "--format", "json")
    assert p.returncode == 0 and _json(p)["config"].endswith("run_config.yaml")


def test_real_fixup_valid_and_two_flags_rejected_as_bridge_did(cli, tests_dir):
    """Bridge validated the fix-up and raised the checkpoint-format assert on the two-flag version."""
    fixup = cli("check", str(tests_dir / RECIPES / "llama3_8b_pretrain_fsdp_fixup.yaml"), *CLEAN_ENV)
    assert fixup.returncode == 0, fixup.stdout + fixup.stderr
    two = cli(
        "check",
        str(tests_dir / RECIPES / "llama3_8b_pretrain_default.yaml"),
        "dist.use_megatron_fsdp=True",
        "ddp.use_megatron_fsdp=True",
        *CLEAN_ENV,
        "--format",
        "json",
    )
    assert two.returncode == 1
    errors = [f for f in _json(two)["findings"] if f["severity"] == "error"]
    assert [f["rule"] for f in errors] == ["MFSDP-CKPT-FORMAT"]
    assert "torch_dist" in errors[0]["message"] and errors[0]["path"] == "checkpoint.ckpt_format"


def test_embedded_default_same_verdicts(cli):
    assert cli("check", *CLEAN_ENV).returncode == 0
    p = cli("check", "dist.use_megatron_fsdp=true", "ddp.use_megatron_fsdp=true", *CLEAN_ENV)
    assert (
        p.returncode == 1 and "MFSDP-CKPT-FORMAT" in p.stdout and "fix: checkpoint.ckpt_format=fsdp_dtensor" in p.stdout
    )


def test_json_contract(cli):
    p = cli(
        "check",
        "ddp.use_megatron_fsdp=true",
        "train.check_weight_hash_across_dp_replicas_interval=5",
        "ddp.data_parallel_sharding_strategy=optim_grads_params",
        *CLEAN_ENV,
        "--format",
        "json",
    )
    out = _json(p)
    assert set(out) >= {"ok", "findings"} and out["ok"] is False
    for f in out["findings"]:
        assert set(f) >= {"rule", "severity", "path", "message", "fix"}
        assert f["severity"] in ("error", "warning", "info")
    rules_found = {f["rule"] for f in out["findings"]}
    assert {"MFSDP-CKPT-FORMAT", "MFSDP-WEIGHT-HASH", "MFSDP-FLAGS-SYNC"} <= rules_found  # all at once
    sev = [f["severity"] for f in out["findings"]]
    assert sev == sorted(sev, key=["error", "warning", "info"].index)


def test_env_flag_and_process_env(cli):
    args = ["dist.use_megatron_fsdp=true", "ddp.use_megatron_fsdp=true", "checkpoint.ckpt_format=fsdp_dtensor"]
    p = cli("check", *args, "--env", "CUDA_DEVICE_MAX_CONNECTIONS=1")
    assert p.returncode == 1 and "MFSDP-ENV-MAX-CONNECTIONS" in p.stdout
    # the shell's environment is not the job's unless you say so: the verdict does not change with the terminal
    p = cli("check", *args, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert p.returncode == 0 and "MFSDP-ENV-MAX-CONNECTIONS" not in p.stdout, p.stdout
    p = cli("check", *args, "--shell-env", env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert p.returncode == 1 and "MFSDP-ENV-MAX-CONNECTIONS" in p.stdout
    p = cli(
        "check",
        *args,
        "--shell-env",
        "--env",
        "CUDA_DEVICE_MAX_CONNECTIONS=8",
        env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
    )
    assert p.returncode == 0, p.stdout  # --env wins over the shell's value


def test_gpu_arch_advice(cli):
    args = ["dist.use_megatron_fsdp=true", "checkpoint.ckpt_format=fsdp_dtensor", "model.tp_comm_overlap=true"]
    assert "MFSDP-ENV-MAX-CONN-TP-OVERLAP" in cli("check", *args, *CLEAN_ENV, "--gpu-arch", "hopper").stdout
    assert "MFSDP-ENV-MAX-CONN-TP-OVERLAP" not in cli("check", *args, *CLEAN_ENV, "--gpu-arch", "blackwell").stdout
    assert "MFSDP-ENV-MAX-CONN-TP-OVERLAP" in cli("check", *args, *CLEAN_ENV, "--gpu-arch", "H200").stdout
    p = cli("check", "--gpu-arch", "pascal")
    assert p.returncode == 2 and "unknown GPU architecture" in p.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["/nonexistent/run_config.yaml"], "no such file"),
        (["ddp.data_parallel_sharding_strategy=optim_grad_params"], "did you mean 'optim_grads_params'"),
        (["ddp.use_megatron_fsdp=maybe"], "expected a bool"),
        (["model.num_layers=2.5"], "expected an int"),
        (["dpp.use_megatron_fsdp=true"], "did you mean 'ddp'"),
        (["ddp.use_megatron_fsdp"], "missing =VALUE; write it as ddp.use_megatron_fsdp=VALUE"),
        (["run.yaml", "ddp.use_megatron_fsdp"], "missing =VALUE"),
        (["run.yaml", "not_a_section.key"], "expected section.key=value"),
        (["--env", "NOVALUE"], "expected NAME=VALUE"),
    ],
)
def test_unusable_input_one_line_exit_2(cli, args, needle):
    p = cli("check", *args)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_yaml_error_names_the_line(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("ddp:\n  use_megatron_fsdp: true\n  x: [1, 2\n")
    p = cli("check", str(bad))
    assert p.returncode == 2 and "line 4" in p.stderr and "Traceback" not in p.stderr


def test_config_after_overrides_is_rejected(cli, tmp_path):
    p = cli("check", "ddp.use_megatron_fsdp=true", "extra")
    assert p.returncode == 2


def test_help_teaches(cli):
    p = cli("check", "--help")
    assert p.returncode == 0 and "examples:" in p.stdout and "mfsdp.py check run_config.yaml" in p.stdout
    assert "exit codes" in p.stdout


def test_without_pyyaml_one_line_exit_2(root):
    """A Python without PyYAML gets the install command, not a traceback."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['yaml'] = None; sys.path.insert(0, 'scripts'); import mfsdp; "
        "sys.exit(mfsdp.main(['check']))"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "pip install PyYAML" in p.stderr and "Traceback" not in p.stderr


def test_base_layers_a_partial_file_on_the_recipe(cli, tmp_path):
    """A partial --config-file is judged as the launcher applies it: over the recipe (--base)."""
    ovr = tmp_path / "ovr.yaml"
    ovr.write_text("ddp:\n  use_megatron_fsdp: true\n")
    assert cli("check", str(ovr), *CLEAN_ENV).returncode == 0  # over bare dataclass defaults: no save/load
    p = cli("check", str(ovr), "--base", "embedded", *CLEAN_ENV, "--format", "json")
    assert p.returncode == 1 and "MFSDP-CKPT-FORMAT" in {f["rule"] for f in _json(p)["findings"]}
    # options and KEY=VALUE items may be interleaved
    p = cli("check", str(ovr), "--base", "embedded", "checkpoint.save=null", *CLEAN_ENV, "checkpoint.load=null")
    assert p.returncode == 0, p.stdout + p.stderr
    assert cli("check", str(ovr), "--base", str(tmp_path / "missing.yaml")).returncode == 2


def _trained_run_configs(root):
    """run_config.yaml files that real Bridge jobs trained with (the recorded H200 runs)."""
    return sorted(
        list(raw_store.folder().glob("**/run_config.yaml"))
        + list((root / "tests" / "fixtures" / "gpu-run").glob("**/run_config.yaml"))
    )


def test_every_config_that_really_trained_passes(root):
    from mfsdp_lib import config_io, rules

    paths = _trained_run_configs(root)
    assert paths, "no run_config.yaml from real GPU runs in this checkout: the evidence for this test is missing"
    for p in paths:
        found = rules.evaluate(config_io.load_effective(str(p)), {"PATH": "/usr/bin"})
        errors = [f.rule for f in found if f.severity == "error"]
        assert not errors, f"{p.relative_to(root)} trained on a GPU, yet check reports {errors}"


def test_gpus_judges_the_batch_at_the_jobs_world(cli, tmp_path):
    """A batch that divides at the layout's smallest world can fail at the job's: --gpus says which world."""
    # The embedded recipe has CP 2: at 8 GPUs DP is 4 and micro-batch 1 x 4 divides 8; at 32 GPUs DP 16 does not.
    args = ["train.global_batch_size=8", "train.micro_batch_size=1", *CLEAN_ENV, "--format", "json"]
    small = cli("check", *args)
    assert small.returncode == 0, small.stdout + small.stderr
    assert "MFSDP-TRAIN-BATCH-DP" not in {f["rule"] for f in _json(small)["findings"]}
    big = cli("check", *args, "--gpus", "32")
    assert big.returncode == 1, big.stdout + big.stderr
    found = {f["rule"]: f for f in _json(big)["findings"]}
    assert "MFSDP-TRAIN-BATCH-DP" in found and found["MFSDP-TRAIN-BATCH-DP"]["severity"] == "error"
    assert "--gpus" in json.dumps(found["MFSDP-TRAIN-BATCH-DP"])


@pytest.mark.parametrize("bad", ["0", "-4", "eight"])
def test_gpus_must_be_a_positive_whole_number(cli, bad):
    p = cli("check", "--gpus", bad, *CLEAN_ENV)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "--gpus" in p.stderr


@pytest.mark.parametrize("command", ["check", "enable", "memory", "rehearse"])
@pytest.mark.parametrize(
    "item, needle",
    [("~checkpoint.load", "checkpoint.load=null"), ("model.num_layers", "missing =VALUE")],
    ids=["hydra-deletion", "bare-key"],
)
def test_hydra_words_get_clear_messages_in_every_command(cli, tmp_path, command, item, needle):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("ddp:\n  use_megatron_fsdp: true\n")
    extra = {"memory": ["--model", "llama3-8b"], "rehearse": ["--world-size", "8", "--dry-run"]}.get(command, [])
    p = cli(command, str(cfg), item, *extra, cwd=tmp_path)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr, p.stderr
