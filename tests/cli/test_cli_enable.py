"""``mfsdp.py enable`` end to end: every emit form passes ``check``; files are never clobbered."""

from __future__ import annotations

import json

import pytest
import yaml

RUN_CONFIG = "fixtures/real-h200-run/checkpoint_metadata_only/iter_0000010/run_config.yaml"
CLEAN_ENV = ["--env", "PATH=/usr/bin"]


def test_yaml_output_passes_check_and_changes_only_what_it_says(cli, tmp_path, root):
    out = tmp_path / "fsdp.yaml"
    p = cli("enable", "-o", str(out), "--save-dir", "/results/ckpt", *CLEAN_ENV)
    assert p.returncode == 0, p.stderr
    assert "wrote" in p.stdout and "checkpoint.ckpt_format: torch_dist -> fsdp_dtensor" in p.stdout
    before = (root / "scripts/data/llama3_8b_pretrain.yaml").read_text().splitlines()
    after = out.read_text().splitlines()
    assert len(before) == len(after)  # edited in place: same lines, same order
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == 6, changed  # 5 minimal + save; checkpoint.load is kept
    assert "note: checkpoint.load=" in p.stdout and "--expect fsdp_dtensor" in p.stdout
    assert cli("check", str(out), *CLEAN_ENV).returncode == 0


@pytest.mark.parametrize("emit", ["overrides", "python", "json", "yaml"])
def test_every_emit_form(cli, emit):
    p = cli("enable", "--emit", emit, *CLEAN_ENV)
    assert p.returncode == 0, p.stderr
    if emit == "overrides":
        lines = p.stdout.splitlines()
        assert "ddp.data_parallel_sharding_strategy=optim_grads_params" in lines
        assert "change(s):" in p.stderr  # report on stderr, result alone on stdout
        assert cli("check", *lines, *CLEAN_ENV).returncode == 0  # the overrides pass check on the recipe
    elif emit == "python":
        assert "cfg.checkpoint.ckpt_format = 'fsdp_dtensor'" in p.stdout
        compile(p.stdout, "snippet", "exec")
    elif emit == "json":
        out = json.loads(p.stdout)
        assert out["ok"] is True and out["overrides"]["ddp.use_megatron_fsdp"] is True
        assert all({"path", "old", "new", "why"} <= set(c) for c in out["changes"])
    else:
        assert yaml.safe_load(p.stdout)["ddp"]["use_megatron_fsdp"] is True


def test_real_run_config_needs_no_change(cli, tests_dir):
    p = cli("enable", str(tests_dir / RUN_CONFIG), "--emit", "json", *CLEAN_ENV)
    assert p.returncode == 0
    assert json.loads(p.stdout)["changes"] == []
    p = cli("enable", str(tests_dir / RUN_CONFIG), *CLEAN_ENV)  # nothing to change: the file comes back as is
    assert p.returncode == 0 and p.stdout == (tests_dir / RUN_CONFIG).read_text()


def test_in_place_keeps_backup_and_user_overrides(cli, tmp_path):
    cfg = tmp_path / "ovr.yaml"
    original = "# mine\ntrain:\n  train_iters: 20\ncheckpoint:\n  save: /c\n"
    cfg.write_text(original)
    p = cli("enable", str(cfg), "train.global_batch_size=64", "--in-place", *CLEAN_ENV)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "ovr.yaml.bak").read_text() == original
    new = cfg.read_text()
    assert new.startswith("# mine\ntrain:\n  train_iters: 20\n  global_batch_size: 64\n")
    data = yaml.safe_load(new)
    assert data["checkpoint"] == {"save": "/c", "ckpt_format": "fsdp_dtensor"}
    assert cli("check", str(cfg), *CLEAN_ENV).returncode == 0


def test_never_overwrites_without_asking(cli, tmp_path):
    out = tmp_path / "exists.yaml"
    out.write_text("keep: me\n")
    p = cli("enable", "-o", str(out))
    assert p.returncode == 2 and "--force" in p.stderr and out.read_text() == "keep: me\n"
    p = cli("enable", "-o", str(out), "--force", *CLEAN_ENV)
    assert p.returncode == 0 and (tmp_path / "exists.yaml.bak").read_text() == "keep: me\n"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("ddp:\n  use_megatron_fsdp: false\n")
    cli("enable", str(cfg), *CLEAN_ENV)  # no --in-place: CONFIG untouched
    assert cfg.read_text() == "ddp:\n  use_megatron_fsdp: false\n"


def test_in_place_needs_config(cli):
    p = cli("enable", "--in-place")
    assert p.returncode == 2 and "needs a CONFIG" in p.stderr


def test_unfixable_error_reported_exit_1(cli):
    p = cli(
        "enable", "model.cpu_offloading=true", "model.pipeline_model_parallel_size=2", "--emit", "overrides", *CLEAN_ENV
    )
    assert p.returncode == 1 and "MFSDP-CPU-OFFLOAD-PP" in p.stderr
    assert p.stdout == ""  # refused: no config that cannot start is emitted
    assert "enable refused" in p.stderr and "--set-pp-1" in p.stderr


def test_pipeline_parallel_refused_then_set_pp1(cli, tmp_path):
    out = tmp_path / "fsdp.yaml"
    p = cli("enable", "model.pipeline_model_parallel_size=2", "-o", str(out), *CLEAN_ENV)
    assert p.returncode == 1 and not out.exists()
    assert "MFSDP-PIPELINE-PARALLEL" in p.stderr and "nothing was written" in p.stderr
    p = cli("enable", "model.pipeline_model_parallel_size=2", "--set-pp-1", "-o", str(out), *CLEAN_ENV)
    assert p.returncode == 0, p.stderr
    assert "model.pipeline_model_parallel_size: 2 -> 1" in p.stdout and "--set-pp-1" in p.stdout
    assert yaml.safe_load(out.read_text())["model"]["pipeline_model_parallel_size"] == 1
    assert cli("check", str(out), *CLEAN_ENV).returncode == 0


# The embedded recipe has CP 2; with PP 4 its smallest world is 8 GPUs, where PP 1 makes DP 4.
PP4_SMALL_BATCH = ["model.pipeline_model_parallel_size=4", "train.global_batch_size=6", "train.micro_batch_size=2"]


def test_set_pp1_refuses_a_batch_the_grown_dp_cannot_split(cli, tmp_path):
    """PP 4 -> 1 on the same 8 GPUs: DP 4, micro-batch 2: 6 is not a multiple of 8; nothing is written."""
    out = tmp_path / "fsdp.yaml"
    p = cli("enable", *PP4_SMALL_BATCH, "--set-pp-1", "-o", str(out), *CLEAN_ENV)
    assert p.returncode == 1 and not out.exists(), p.stderr
    err = p.stderr
    assert "MFSDP-TRAIN-BATCH-DP" in err and "MFSDP-EVAL-BATCH-DP" in err
    assert "train.global_batch_size=6 is not a multiple of train.micro_batch_size 2 x data-parallel size 4 = 8" in err
    assert "at 8 GPUs (assumed" in err and "--gpus N" in err and "--fit-eval-batch" in err
    assert "train.global_batch_size=8 (or 0)" not in err and "train.global_batch_size=8" in err  # nearest valid
    assert "train.micro_batch_size=1 (keeps the global batch)" not in err  # 6 / (1 x 4) does not divide either


def test_set_pp1_with_the_users_batch_and_world(cli, tmp_path):
    """The user decides: the job's world (--gpus) and the training batch (KEY=VALUE); written and said."""
    out = tmp_path / "fsdp.yaml"
    p = cli("enable", *PP4_SMALL_BATCH, "train.global_batch_size=24", "--set-pp-1", "--gpus", "16", "-o", str(out))
    assert p.returncode == 1 and not out.exists()  # 16 GPUs, CP 2: DP 8, 2 x 8 = 16 does not divide 24
    assert "at 16 GPUs (given with --gpus; DP = 16 / (TP 1 x PP 1 x CP 2) = 8)" in p.stderr
    assert "train.global_batch_size=32 (or 16)" in p.stderr  # equally near: the larger first
    p = cli("enable", *PP4_SMALL_BATCH, "train.global_batch_size=32", "--set-pp-1", "--gpus", "16", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert "train.global_batch_size: 6 -> 32" in p.stdout and "4x larger" not in p.stdout  # the world is known
    assert yaml.safe_load(out.read_text())["train"]["global_batch_size"] == 32


def test_fit_eval_batch_is_listed_and_json_says_the_world(cli):
    args = ["model.pipeline_model_parallel_size=4", "validation.eval_global_batch_size=36"]
    args += ["validation.eval_micro_batch_size=2", "validation.eval_iters=10", "--set-pp-1"]
    p = cli("enable", *args, "--emit", "json", *CLEAN_ENV)
    assert p.returncode == 1 and "MFSDP-EVAL-BATCH-DP" in {f["rule"] for f in json.loads(p.stdout)["findings"]}
    p = cli("enable", *args, "--fit-eval-batch", "--emit", "json", *CLEAN_ENV)
    data = json.loads(p.stdout)
    assert p.returncode == 0 and data["ok"], p.stdout[-2000:]
    assert (
        data["world"] == {"size": 8, "given": False, "how": data["world"]["how"]} and "--gpus" in data["world"]["how"]
    )
    changes = {c["path"]: c for c in data["changes"]}
    assert changes["validation.eval_global_batch_size"]["new"] == 40 and changes["validation.eval_iters"]["new"] == 9


@pytest.mark.parametrize("bad", ["0", "-4", "eight"])
def test_gpus_must_be_a_positive_whole_number(cli, bad):
    p = cli("enable", "--gpus", bad)
    assert p.returncode == 2 and "--gpus" in p.stderr


def test_gpus_that_do_not_fit_the_layout_are_refused(cli):
    p = cli("enable", "model.tensor_model_parallel_size=2", "--gpus", "6", *CLEAN_ENV)
    assert p.returncode == 1 and "MFSDP-WORLD-LAYOUT" in p.stderr and "TP x PP x CP = 4 does not divide it" in p.stderr


def test_refused_json_still_reports(cli):
    p = cli("enable", "optimizer.optimizer=dist_muon", "--emit", "json", *CLEAN_ENV)
    assert p.returncode == 1
    data = json.loads(p.stdout)
    assert data["refused"] is True and data["ok"] is False
    assert "MFSDP-OPTIMIZER-UNSUPPORTED" in [f["rule"] for f in data["findings"]]


def test_recipe_without_bridge_one_line_exit_2(cli):
    p = cli("enable", "--recipe", "llama3_8b_pretrain_config")
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "Megatron-Bridge" in p.stderr


def test_recipe_refuses_config(cli, tmp_path):
    p = cli("enable", "--recipe", "llama3_8b_pretrain_config", str(tmp_path / "x.yaml"))
    assert p.returncode == 2 and "not CONFIG" in p.stderr


def test_help_teaches(cli):
    p = cli("enable", "--help")
    assert p.returncode == 0 and "examples:" in p.stdout and "--emit overrides" in p.stdout
    assert "--gpus N" in p.stdout and "--fit-eval-batch" in p.stdout and "micro_batch_size x DP" in p.stdout


def test_partial_file_with_base_gets_what_the_recipe_needs(cli, tmp_path):
    ovr = tmp_path / "ovr.yaml"
    ovr.write_text("train:\n  train_iters: 20\n")
    out = tmp_path / "fsdp_ovr.yaml"
    p = cli("enable", str(ovr), "--base", "embedded", "-o", str(out), *CLEAN_ENV)
    assert p.returncode == 0, p.stderr
    data = yaml.safe_load(out.read_text())
    assert data["train"] == {"train_iters": 20}
    assert data["checkpoint"] == {"ckpt_format": "fsdp_dtensor"}  # the recipe's load directory is kept
    assert "model" not in data and "optimizer" not in data  # only what differs from the base is written
    assert cli("check", str(out), "--base", "embedded", *CLEAN_ENV).returncode == 0


def test_in_place_when_no_backup_can_be_made_is_exit_2(cli, tmp_path):
    """--in-place must keep a backup; when it cannot (name too long here, a read-only folder for a user),
    the answer is one line and exit 2, and CONFIG is untouched - not exit 3 'internal error'."""
    cfg = tmp_path / ("c" * 250 + ".yaml")
    cfg.write_text("ddp:\n  use_megatron_fsdp: false\n")
    p = cli("enable", str(cfg), "--in-place", *CLEAN_ENV)
    assert p.returncode == 2, p.stderr
    assert "cannot keep a backup" in p.stderr and "Traceback" not in p.stderr and len(p.stderr.splitlines()) == 1
    assert cfg.read_text() == "ddp:\n  use_megatron_fsdp: false\n"


@pytest.mark.parametrize("emit", ["python", "overrides", "json"])
def test_in_place_never_turns_the_yaml_into_another_format(cli, tmp_path, emit):
    """`enable cfg.yaml --in-place --emit python` replaced the YAML config with Python lines."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("ddp:\n  use_megatron_fsdp: false\n")
    p = cli("enable", str(cfg), "--in-place", "--emit", emit, *CLEAN_ENV)
    assert p.returncode == 2 and "--in-place rewrites CONFIG as YAML" in p.stderr
    assert cfg.read_text() == "ddp:\n  use_megatron_fsdp: false\n" and not (tmp_path / "c.yaml.bak").exists()


def test_in_place_with_nothing_to_change_writes_nothing(cli, tmp_path):
    """A second --in-place run made c.yaml.bak.1, .bak.2 ... of an unchanged file, one per run."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("ddp:\n  use_megatron_fsdp: false\n")
    assert cli("enable", str(cfg), "--in-place", *CLEAN_ENV).returncode == 0
    enabled = cfg.read_text()
    p = cli("enable", str(cfg), "--in-place", *CLEAN_ENV)
    assert p.returncode == 0 and "left as it was" in p.stdout
    assert cfg.read_text() == enabled
    assert sorted(x.name for x in tmp_path.iterdir()) == ["c.yaml", "c.yaml.bak"]


# --------------------------------------------------------------------------- live mode (--recipe)
# The live path itself needs an importable Megatron-Bridge; it ran on the H200 (evidence:
# benchmarks/results/gpu_live_mode_1xh200.json). What can fail without Bridge is tested here.


def test_recipe_failure_is_one_line_input_error_not_internal():
    """On the offline H200 the Llama recipe raised a multi-line ValueError from the HF hub: exit 2, one line."""
    from mfsdp_lib.cli import enable as cli_enable
    from mfsdp_lib.findings import InputError

    def offline_recipe():
        raise ValueError(
            "Failed to load configuration from meta-llama/Meta-Llama-3-8B after 4 attempts.\n"
            "Check your internet connection or see how to run the library in offline mode"
        )

    with pytest.raises(InputError) as err:
        cli_enable._call_recipe("llama3_8b_pretrain_config", offline_recipe)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("--recipe llama3_8b_pretrain_config: building the recipe raised ValueError: Failed to load")
    assert cli_enable._call_recipe("r", lambda: {"built": 1}) == {"built": 1}


def test_megatron_log_handler_binds_stdout_at_construction(mcore_src):
    """Why live mode imports Bridge with stdout pointed at stderr: Megatron's handler keeps the stream it saw."""
    src = (mcore_src / "megatron" / "training" / "log_handler.py").read_text()
    assert "super().__init__(stream=sys.stdout)" in src
    training = (mcore_src / "megatron" / "training" / "training.py").read_text()
    assert "logging.basicConfig(handlers=[CustomHandler()]" in training  # installed when the module is imported


def test_live_world_is_one_world_for_our_rules_and_bridge(monkeypatch):
    """Live mode hands Bridge the world our rules judged (WORLD_SIZE): --gpus first, then a launcher's
    WORLD_SIZE, then the smallest world the layout allows; a WORLD_SIZE that is no count is exit 2."""
    from mfsdp_lib import config_io
    from mfsdp_lib.cli import enable as cli_enable

    given = {"model": {"tensor_model_parallel_size": 2, "context_parallel_size": 1, "pipeline_model_parallel_size": 1}}
    assert cli_enable.live_world(given, given, 8, "16")[0] == 8
    assert cli_enable.live_world(given, given, None, "16") == (
        16,
        "from WORLD_SIZE in the environment (the launcher's); --gpus N overrides it",
    )
    world, how = cli_enable.live_world(given, given, None, None)
    assert world == 2 and how.startswith("assumed")
    for bad in ("0", "-4", "eight", ""):
        with pytest.raises(config_io.InputError, match="WORLD_SIZE=.* is not a positive whole number"):
            cli_enable.live_world(given, given, None, bad)
