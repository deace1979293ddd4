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


FSDP_ONLY = (
    "dist:\n  use_megatron_fsdp: true\nddp:\n  use_megatron_fsdp: true\n"
    "  data_parallel_sharding_strategy: optim_grads_params\n"
)


def test_partial_file_is_judged_over_a_recipe_and_says_which(cli, tmp_path):
    """A file of FSDP flags only (a --config-file for a recipe launcher) was judged over Bridge's bare dataclass
    defaults: 0 errors, while the recipe it is merged over saves torch_dist checkpoints and enable added
    ckpt_format=fsdp_dtensor. It is judged over the embedded recipe unless --base says otherwise, and says so."""
    ovr = tmp_path / "my_overrides.yaml"
    ovr.write_text(FSDP_ONLY)
    p = cli("check", str(ovr), *CLEAN_ENV)
    assert p.returncode == 1, p.stdout
    assert "ERROR   MFSDP-CKPT-FORMAT" in p.stdout and "MFSDP-AVG-IN-COLLECTIVE" in p.stdout
    head = p.stdout.splitlines()[:3]
    assert "partial" in head[0] and "embedded Llama 3 8B pretrain recipe" in head[0]
    assert any("--base RUN_CONFIG" in line and "--base defaults" in line for line in head), head
    out = _json(cli("check", str(ovr), *CLEAN_ENV, "--format", "json"))
    assert out["base"]["name"] == "embedded" and out["base"]["partial"] is True
    assert set(out["base"]["missing_sections"]) >= {"model", "train", "checkpoint"}
    # --base embedded says the same; options and KEY=VALUE items may be interleaved
    assert cli("check", str(ovr), "--base", "embedded", *CLEAN_ENV).stdout == p.stdout
    q = cli("check", str(ovr), "--base", "embedded", "checkpoint.save=null", *CLEAN_ENV, "checkpoint.load=null")
    assert q.returncode == 0, q.stdout + q.stderr
    assert cli("check", str(ovr), "--base", str(tmp_path / "missing.yaml")).returncode == 2


def test_partial_file_judged_alone_says_what_it_could_not_see(cli, tmp_path):
    ovr = tmp_path / "my_overrides.yaml"
    ovr.write_text(FSDP_ONLY)
    p = cli("check", str(ovr), "--base", "defaults", *CLEAN_ENV)
    assert p.returncode == 0, p.stdout
    head = "\n".join(p.stdout.splitlines()[:3])
    assert "judged alone" in head and "not seen" in head and "checkpoint" in head
    out = _json(cli("check", str(ovr), "--base", "defaults", *CLEAN_ENV, "--format", "json"))
    assert out["base"]["name"] == "defaults" and out["ok"] is True


def test_full_config_is_judged_as_it_is(cli, tests_dir):
    """A run_config.yaml has every section: no base is put under it, and none is named."""
    out = _json(cli("check", str(tests_dir / RUN_CONFIG), *CLEAN_ENV, "--format", "json"))
    assert out["base"] == {"name": None, "partial": False, "missing_sections": []}


def test_check_and_enable_agree_on_a_partial_file(cli, tmp_path):
    """What enable adds to a partial file is what check reported; the result then passes check."""
    ovr = tmp_path / "my_overrides.yaml"
    ovr.write_text(FSDP_ONLY)
    found = _json(cli("check", str(ovr), *CLEAN_ENV, "--format", "json"))
    fixed = {f["path"] for f in found["findings"] if f["severity"] in ("error", "warning")}
    p = cli("enable", str(ovr), "--emit", "json", *CLEAN_ENV)
    changed = {c["path"] for c in json.loads(p.stdout)["changes"]}
    assert fixed and fixed <= changed, (fixed, changed)
    out = tmp_path / "fsdp.yaml"
    assert cli("enable", str(ovr), "-o", str(out), *CLEAN_ENV).returncode == 0
    assert cli("check", str(out), *CLEAN_ENV).returncode == 0


def _trained(run_config) -> bool:
    """Whether the run beside this config trained: a rehearsal's report.json says its train phase passed, or a
    smoke run left its rank record (it writes one only after training). A run that failed earlier (a refused
    layout, an out-of-memory build) wrote its config too, and is not evidence that the config trains."""
    here = run_config.parent
    report = here / "report.json"
    if report.is_file():
        phases = json.loads(report.read_text()).get("phases") or {}
        return (phases.get("train") or {}).get("status") == "passed"
    return any(here.glob("rank*.json"))


def _not_as_given(run_config) -> list[str]:
    """An override run whose recorded config does not hold an override as given (a Hydra list the engine once read
    as text, since fixed): the config it trained is not one a user writes, so it is no evidence either way."""
    import bench_recommended_overrides as bro

    row = run_config.parent / "row.json"
    if not row.is_file():
        return []
    return bro.not_applied(run_config.parent, bro.ran_overrides(json.loads(row.read_text()).get("command")))


def _trained_run_configs(root):
    """run_config.yaml files that real Bridge jobs trained with (the recorded GPU runs)."""
    return sorted(
        [p for p in raw_store.folder().glob("**/run_config.yaml") if _trained(p) and not _not_as_given(p)]
        + list((root / "tests" / "fixtures" / "gpu-run").glob("**/run_config.yaml"))
    )


def test_runs_left_out_as_not_given_are_the_ones_the_overrides_result_flags(root):
    flagged = [
        p for p in raw_store.folder().glob("recommended_overrides_1xh200/*/*/run_config.yaml") if _not_as_given(p)
    ]
    result = json.loads((root / "benchmarks" / "results" / "recommended_overrides_1xh200.json").read_text())
    faults = {r["raw"] for r in result["rows"] if r.get("rehearsal_fault")}
    faults |= {h["raw"] for h in result["superseded"] if h.get("rehearsal_fault")}  # run again since
    assert {raw_store.logical(p.parent) for p in flagged} == faults
    assert faults, "the recorded runs include the two list values the engine once read as text"


def test_every_config_that_really_trained_passes(root):
    from mfsdp_lib import config_io, rules

    paths = _trained_run_configs(root)
    assert paths, "no run_config.yaml from real GPU runs in this checkout: the evidence for this test is missing"
    for p in paths:
        found = rules.evaluate(config_io.load_effective(str(p)), {"PATH": "/usr/bin"})
        errors = [f.rule for f in found if f.severity == "error"]
        assert not errors, f"{raw_store.logical(p) or p} trained on a GPU, yet check reports {errors}"


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


def _torch_dist_checkpoint(tmp_path):
    from _helpers_ckptlog import FIXTURES, materialise

    return materialise(FIXTURES / "ckpt" / "torch_dist_ddp", tmp_path / "ckpt")


def test_resuming_from_a_checkpoint_of_another_format_is_an_error(cli, tests_dir, tmp_path):
    """checkpoint.load=<a local torch_dist checkpoint> with ckpt_format=fsdp_dtensor got 0 errors, though Bridge's
    load asserts the two agree. check reads the folder as `ckpt` does and says what to do."""
    ckpt = _torch_dist_checkpoint(tmp_path)
    fixup = str(tests_dir / RECIPES / "llama3_8b_pretrain_fsdp_fixup.yaml")
    assert cli("check", fixup, *CLEAN_ENV).returncode == 0
    p = cli("check", fixup, f"checkpoint.load={ckpt}", *CLEAN_ENV, "--format", "json")
    assert p.returncode == 1, p.stdout
    (f,) = [f for f in _json(p)["findings"] if f["rule"] == "MFSDP-CKPT-LOAD-FORMAT"]
    assert f["severity"] == "error" and f["path"] == "checkpoint.load"
    assert "torch_dist" in f["message"] and "fsdp_dtensor" in f["message"] and "differs from inferred" in f["message"]
    assert "convert" in f["fix"]
    text = cli("check", fixup, f"checkpoint.load={ckpt}", *CLEAN_ENV).stdout
    assert "MFSDP-CKPT-LOAD-FORMAT" in text and str(ckpt) in text
    # an iteration folder named directly: no format comparison in Bridge, and still a failed load
    p = cli("check", fixup, f"checkpoint.load={ckpt / 'iter_0000020'}", *CLEAN_ENV, "--format", "json")
    (f,) = [f for f in _json(p)["findings"] if f["rule"] == "MFSDP-CKPT-LOAD-FORMAT"]
    assert "iteration folder named directly" in f["message"] and "the load fails" in f["message"]
    # the same folder with the format it holds: nothing to say about it
    p = cli("check", fixup, f"checkpoint.load={ckpt}", "checkpoint.ckpt_format=torch_dist", *CLEAN_ENV)
    assert "MFSDP-CKPT-LOAD-FORMAT" not in p.stdout


def test_pretrained_checkpoint_is_read_too_and_a_missing_folder_is_not_guessed(cli, tests_dir, tmp_path):
    ckpt = _torch_dist_checkpoint(tmp_path)
    fixup = str(tests_dir / RECIPES / "llama3_8b_pretrain_fsdp_fixup.yaml")
    p = cli("check", fixup, f"checkpoint.pretrained_checkpoint={ckpt}", *CLEAN_ENV, "--format", "json")
    rules_found = {(f["rule"], f["path"]) for f in _json(p)["findings"]}
    assert ("MFSDP-CKPT-LOAD-FORMAT", "checkpoint.pretrained_checkpoint") in rules_found
    # a path that is not on this machine (a cluster's) is not judged
    p = cli("check", fixup, f"checkpoint.load={tmp_path / 'elsewhere'}", *CLEAN_ENV, "--format", "json")
    assert not any(f["rule"] == "MFSDP-CKPT-LOAD-FORMAT" for f in _json(p)["findings"])


def test_a_hugging_face_folder_in_checkpoint_load_is_refused_as_bridge_does(cli, tests_dir, tmp_path):
    from _helpers_ckptlog import FIXTURES, materialise

    hf = materialise(FIXTURES / "ckpt" / "hf_llama", tmp_path / "hf")
    fixup = str(tests_dir / RECIPES / "llama3_8b_pretrain_fsdp_fixup.yaml")
    p = cli("check", fixup, f"checkpoint.load={hf}", *CLEAN_ENV, "--format", "json")
    (f,) = [f for f in _json(p)["findings"] if f["rule"] == "MFSDP-CKPT-LOAD-FORMAT"]
    assert "HuggingFace-format" in f["message"] and "pretrained_checkpoint" in f["fix"]
    p = cli("check", fixup, f"checkpoint.pretrained_checkpoint={hf}", *CLEAN_ENV, "--format", "json")
    assert not any(f["rule"] == "MFSDP-CKPT-LOAD-FORMAT" for f in _json(p)["findings"])
