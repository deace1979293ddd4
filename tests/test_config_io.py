"""config_io: layering, OmegaConf-like coercion, and one-line input errors."""

from __future__ import annotations

import os

import pytest

from mfsdp_lib import config_io
from mfsdp_lib.findings import InputError

RUN_CONFIG = "fixtures/real-h200-run/checkpoint_metadata_only/iter_0000010/run_config.yaml"


def _write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_embedded_default_is_the_recipe():
    cfg = config_io.load_effective(None)
    assert cfg["ddp"]["use_megatron_fsdp"] is False
    assert cfg["checkpoint"]["ckpt_format"] == "torch_dist"
    assert cfg["model"]["context_parallel_size"] == 2
    assert cfg["mixed_precision"] == "bf16_mixed"
    assert cfg["env_vars"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_partial_file_layers_over_defaults(tmp_path):
    path = _write(tmp_path, "ddp:\n  use_megatron_fsdp: true\n")
    cfg = config_io.load_effective(path)
    assert cfg["ddp"]["use_megatron_fsdp"] is True
    assert cfg["ddp"]["data_parallel_sharding_strategy"] == "no_shard"  # Bridge default
    assert cfg["checkpoint"]["save"] is None and cfg["dist"]["use_gloo_process_groups"] is True


def test_overrides_win_over_file(tmp_path):
    path = _write(tmp_path, "checkpoint:\n  ckpt_format: torch_dist\n")
    cfg = config_io.load_effective(path, ["checkpoint.ckpt_format=fsdp_dtensor", "checkpoint.save=/tmp/x"])
    assert cfg["checkpoint"]["ckpt_format"] == "fsdp_dtensor" and cfg["checkpoint"]["save"] == "/tmp/x"


def test_real_run_config_loads(tests_dir):
    cfg = config_io.load_effective(str(tests_dir / RUN_CONFIG))
    assert cfg["ddp"]["use_megatron_fsdp"] is True
    assert cfg["ddp"]["data_parallel_sharding_strategy"] == "optim_grads_params"
    assert cfg["checkpoint"]["ckpt_format"] == "fsdp_dtensor"
    assert isinstance(cfg["mixed_precision"], dict) and cfg["mixed_precision"]["bf16"] is True


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("True", True),
        ("yes", True),
        ("on", True),
        ("3", True),
        ("0", False),
        ("false", False),
        ("No", False),
        (1, True),
        (0, False),
        (True, True),
    ],
)
def test_bool_coercion_like_omegaconf(raw, expected):
    assert config_io.coerce("ddp.use_megatron_fsdp", raw) is expected


@pytest.mark.parametrize("raw", ["maybe", 2.5, [1], {"a": 1}, ""])
def test_bool_rejects(raw):
    with pytest.raises(InputError, match="ddp.use_megatron_fsdp"):
        config_io.coerce("ddp.use_megatron_fsdp", raw)


def test_int_coercion():
    assert config_io.coerce("model.num_layers", "4") == 4
    assert config_io.coerce("model.num_layers", 4) == 4
    for bad in (2.5, "2.5", True, "four"):
        with pytest.raises(InputError, match="expected an int"):
            config_io.coerce("model.num_layers", bad)


def test_nullable_and_not():
    assert config_io.coerce("checkpoint.save", None) is None
    with pytest.raises(InputError, match="null is not allowed"):
        config_io.coerce("ddp.use_megatron_fsdp", None)


def test_enum_misspelling_did_you_mean():
    with pytest.raises(InputError) as exc:
        config_io.load_effective(None, ["ddp.data_parallel_sharding_strategy=optim_grad_params"])
    msg = str(exc.value)
    assert "did you mean 'optim_grads_params'" in msg and "\n" not in msg


def test_unknown_section_and_key(tmp_path):
    with pytest.raises(InputError, match="unknown section 'dpp'.*did you mean 'ddp'"):
        config_io.load_effective(_write(tmp_path, "dpp:\n  use_megatron_fsdp: true\n"))
    with pytest.raises(InputError, match="unknown key 'ddp.use_megatron_fdsp'.*did you mean 'use_megatron_fsdp'"):
        config_io.load_effective(None, ["ddp.use_megatron_fdsp=true"])
    # megatron_fsdp_version is not a field of Megatron-Core 0.19.2's DDP config
    with pytest.raises(InputError, match="unknown key 'ddp.megatron_fsdp_version': Megatron-FSDP v2 is not"):
        config_io.load_effective(None, ["ddp.megatron_fsdp_version=2"])


def test_other_model_class_keys_not_rejected(tmp_path):
    """A section of another class (another _target_) has its own fields; only ours are checked."""
    path = _write(tmp_path, "model:\n  _target_: some.OtherProvider\n  q_lora_rank: 512\n  cpu_offloading: yes\n")
    cfg = config_io.load_effective(path)
    assert cfg["model"]["q_lora_rank"] == 512 and cfg["model"]["cpu_offloading"] is True


def test_yaml_syntax_error_has_line(tmp_path):
    with pytest.raises(InputError, match=r"line 3"):
        config_io.load_effective(_write(tmp_path, "ddp:\n  a: 1\n b: [\n"))


@pytest.mark.parametrize(
    "text,match",
    [
        ("- a\n- b\n", "top level must be a mapping"),
        ("42\n", "top level must be a mapping"),
        ("ddp: 3\n", "must be a mapping"),
        ("ddp: null\n", "is null"),
        ("env_vars:\n  A: [1]\n", "must be a scalar"),
        ("mixed_precision: bf16_mix\n", "did you mean 'bf16_mixed'"),
    ],
)
def test_bad_shapes(tmp_path, text, match):
    with pytest.raises(InputError, match=match):
        config_io.load_effective(_write(tmp_path, text))


def test_empty_file_is_all_defaults(tmp_path):
    cfg = config_io.load_effective(_write(tmp_path, ""))
    assert cfg["ddp"]["use_megatron_fsdp"] is False and cfg["checkpoint"]["save"] is None


def test_missing_unreadable_binary(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        config_io.load_effective(str(tmp_path / "nope.yaml"))
    with pytest.raises(InputError, match="is a directory"):
        config_io.load_effective(str(tmp_path))
    b = tmp_path / "b.yaml"
    b.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(InputError, match="not UTF-8"):
        config_io.load_effective(str(b))


@pytest.mark.parametrize("item", ["noequals", "=3", "ddp..x=1", "1ddp.x=2", "ddp.x y=1"])
def test_malformed_override(item):
    with pytest.raises(InputError):
        config_io.parse_override(item)


def test_parse_value_hydra_like():
    assert config_io.parse_value("null") is None
    assert config_io.parse_value("TRUE") is True
    assert config_io.parse_value("12") == 12 and config_io.parse_value("1e-4") == 1e-4
    assert config_io.parse_value("'12'") == "12"
    assert config_io.parse_value("/a/b:c") == "/a/b:c"
    assert config_io.parse_value("[1,x]") == [1, "x"]


def test_parse_env():
    assert config_io.parse_env(["A=1", "B=", "C=x=y"]) == {"A": "1", "B": "", "C": "x=y"}
    for bad in (["A"], ["=1"], ["1A=2"]):
        with pytest.raises(InputError):
            config_io.parse_env(bad)


def test_env_vars_override_and_mixed_precision_field(tmp_path):
    cfg = config_io.load_effective(None, ["env_vars.CUDA_DEVICE_MAX_CONNECTIONS=1"])
    assert cfg["env_vars"]["CUDA_DEVICE_MAX_CONNECTIONS"] == 1
    with pytest.raises(InputError, match="env_vars"):
        config_io.load_effective(None, ["env_vars.CUDA_DEVICE_MAX_CONNECTIONS=null"])
    # a preset name has no fields to override (Bridge holds it as a string)
    with pytest.raises(InputError, match="preset 'bf16_mixed'"):
        config_io.load_effective(None, ["mixed_precision.fp8_param_gather=true"])
    # a mapping does
    path = _write(tmp_path, "mixed_precision:\n  bf16: true\n")
    cfg = config_io.load_effective(path, ["mixed_precision.fp8_param_gather=true"])
    assert cfg["mixed_precision"] == {"bf16": True, "fp8_param_gather": True}


def test_get():
    cfg = {"a": {"b": 1}}
    assert config_io.get(cfg, "a.b") == 1
    assert config_io.get(cfg, "a.c", "d") == "d" and config_io.get(cfg, "x.y") is None


def test_write_atomic_and_backup(tmp_path):
    target = tmp_path / "out.yaml"
    assert config_io.write_atomic(str(target), "a: 1\n") is None
    os.chmod(target, 0o640)
    bak = config_io.write_atomic(str(target), "a: 2\n", backup=True)
    assert target.read_text() == "a: 2\n" and open(bak).read() == "a: 1\n"
    assert (os.stat(target).st_mode & 0o777) == 0o640
    bak2 = config_io.write_atomic(str(target), "a: 3\n", backup=True)
    assert bak2 != bak and open(bak2).read() == "a: 2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.yaml", "out.yaml.bak", "out.yaml.bak.1"]
    with pytest.raises(InputError, match="does not exist"):
        config_io.write_atomic(str(tmp_path / "no" / "x.yaml"), "")


def test_write_atomic_backup_failure_is_input_error(tmp_path):
    """A backup that cannot be made (here: PATH.bak is longer than NAME_MAX) is one line, not a traceback.

    The same path is taken by --in-place in a read-only folder; root ignores permissions, a name limit
    it cannot, so this runs anywhere.
    """
    target = tmp_path / ("c" * 250 + ".yaml")  # 255 bytes: the longest name; ".bak" makes it too long
    target.write_text("a: 1\n")
    with pytest.raises(InputError, match="cannot keep a backup"):
        config_io.write_atomic(str(target), "a: 2\n", backup=True)
    assert target.read_text() == "a: 1\n"


DEEP = 50_000  # well past where libyaml's C composer overflowed the stack (about 20,000 levels)


@pytest.mark.parametrize(
    "text",
    [
        "- " * DEEP + "x\n",  # block sequences on one line: 100 KB
        "ddp: " + "[" * DEEP + "]" * DEEP + "\n",
        "a: " + "{a: " * DEEP + "1" + "}" * DEEP + "\n",
    ],
    ids=["block-sequences", "flow-sequences", "flow-mappings"],
)
def test_deeply_nested_yaml_is_an_input_error_not_a_segfault(cli, tmp_path, text):
    """Run in a subprocess: the failure was SIGSEGV (exit -11), which kills pytest itself in-process."""
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    for argv in (["check", str(path)], ["memory", str(path)], ["enable", str(path)]):
        p = cli(*argv)
        assert p.returncode == 2, (argv[0], p.returncode, p.stderr[-300:])
        assert "nested more than" in p.stderr


def test_input_without_a_size_is_refused_before_it_is_opened(tmp_path):
    """A pipe (or /dev/zero) has no size to check up front, and a FIFO without a writer blocks open()
    forever: only regular files are read. No writer is started, so a reader that opened the FIFO would hang
    (the test then fails on pytest's own timeout rather than passing by luck)."""
    import time

    fifo = tmp_path / "stream.yaml"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(InputError, match="named pipe"):
        config_io.read_text(str(fifo))
    assert time.monotonic() - start < 5


def test_embedded_default_is_the_real_recipe_dump(tests_dir, root):
    dump = tests_dir / "fixtures" / "bridge-0.6.2-recipes" / "llama3_8b_pretrain_default.yaml"
    assert (root / "scripts" / "data" / "llama3_8b_pretrain.yaml").read_bytes() == dump.read_bytes()


# --- what Hydra users type, and large legitimate configs ------------------------------------------------------


def test_hydra_deletion_says_it_is_not_supported_and_what_to_write():
    """Bridge's launchers parse ~KEY (Hydra) but then apply only the keys left, so the recipe's value stays:
    omegaconf_utils.process_config_with_overrides -> parse_hydra_overrides -> apply_overrides."""
    with pytest.raises(InputError) as exc:
        config_io.refuse_unusable_override("~checkpoint.load")
    msg = str(exc.value)
    assert "deletion" in msg and "not supported" in msg and "checkpoint.load=null" in msg, msg


def test_hydra_deletion_is_a_no_op_in_bridge(bridge_src):
    text = (bridge_src / "megatron/bridge/training/utils/omegaconf_utils.py").read_text()
    body = text[text.index("def process_config_with_overrides") :]
    assert "parse_hydra_overrides(omega_conf, cli_overrides)" in body
    assert "apply_overrides(config, final_config_dict, excluded_fields)" in body
    apply = text[text.index("def _apply_overrides") :]
    assert "for key, value in overrides_dict.items():" in apply  # only the keys present are set


@pytest.mark.parametrize("item", ["model.num_layers", "+model.num_layers", "ddp.use_megatron_fsdp"])
def test_bare_key_says_the_value_is_missing(item):
    with pytest.raises(InputError, match=r"missing =VALUE.*=VALUE"):
        config_io.refuse_unusable_override(item)


@pytest.mark.parametrize("item", ["run.yaml", "configs/my.model.yaml", "model.num_layers=32", "./model.yaml"])
def test_files_and_overrides_pass(item):
    config_io.refuse_unusable_override(item)  # no error: a file name or a real override


def test_a_long_plain_list_is_not_an_alias_bomb(tmp_path):
    """A legitimate 3 MB config whose dataset.blend names 250,000 files: no alias, so nothing to refuse."""
    n = 250_000
    path = tmp_path / "blend.yaml"
    path.write_text("dataset:\n  blend:\n" + "".join(f"  - d/{i:06d}\n" for i in range(n)))
    assert path.stat().st_size > 2_500_000
    data = config_io.safe_yaml(path.read_text(), str(path))
    assert len(data["dataset"]["blend"]) == n


def test_alias_expansion_is_still_bounded(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    with pytest.raises(InputError, match="aliases"):
        config_io.safe_yaml("\n".join(lines) + "\n", "bomb.yaml")


def test_a_file_over_the_size_limit_says_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(config_io, "MAX_FILE_BYTES", 1000)
    big = tmp_path / "big.yaml"
    big.write_text("x" * 2000)
    with pytest.raises(InputError, match=r"2000 bytes.*limit is 1000 bytes"):
        config_io.read_text(str(big))
