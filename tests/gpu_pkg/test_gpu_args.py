"""The GPU runs' command lines (``mfsdp_gpu.args``): options, overrides, refusals, ``--help`` without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mfsdp_gpu import args

ROOT = Path(__file__).resolve().parent.parent.parent
ENGINE = ROOT / "scripts" / "rehearse_train.py"


def _parse(*argv):
    return args.rehearse_parser().parse_intermixed_args(list(argv))


def test_help_works_without_torch():
    out = subprocess.run([sys.executable, str(ENGINE), "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0
    for flag in (
        "--world-size",
        "--iters",
        "--strategy",
        "--fake-pg",
        "--meta-init",
        "--balanced-routing",
        "--save-load",
        "--parity",
        "--out",
    ):
        assert flag in out.stdout


def test_overrides_may_sit_between_options():
    a = _parse(
        "--yaml", "job.yaml", "train.global_batch_size=64", "--world-size", "8", "--out", "o", "model.seq_length=4096"
    )
    assert a.overrides == ["train.global_batch_size=64", "model.seq_length=4096"]
    assert a.world_size == 8 and a.out == "o" and a.yaml == "job.yaml"


def test_a_config_source_is_required_and_unique():
    with pytest.raises(SystemExit):
        _parse("--out", "o")
    with pytest.raises(SystemExit):
        _parse("--yaml", "a.yaml", "--model-preset", "llama-1b", "--out", "o")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--model-preset", "llama-1b", "--world-size", "0"], "at least 1"),
        (["--model-preset", "llama-1b", "--world-size", "8", "--rank", "8"], "outside a world of 8"),
        (["--model-preset", "llama-1b", "--iters", "0"], "--iters"),
        (["--model-preset", "llama-1b", "--world-size", "4", "--no-fake-pg"], "--world-size 1"),
        (["--model-preset", "llama-1b", "--parity", "--world-size", "2"], "--parity"),
        (["--yaml", "x.yaml", "--peft", "lora"], "--peft"),
    ],
)
def test_bad_combinations_are_input_errors(argv, needle):
    a = _parse(*argv, "--out", "o")
    with pytest.raises(args.InputError, match=needle):
        args.check_args(a)


def test_bad_input_is_one_line_and_exit_2():
    out = subprocess.run(
        [sys.executable, str(ENGINE), "--model-preset", "llama-1b", "--rank", "3", "--out", "o"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "outside a world of 1" in out.stderr
    assert "Traceback" not in out.stderr


def test_refuses_without_torch_in_one_line(tmp_path):
    # A clean interpreter with no torch on its path: the engine says what it needs.
    code = "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('torch') else 1)"
    if subprocess.run([sys.executable, "-c", code], check=False).returncode == 0:
        pytest.skip("torch is installed here: the refusal path is not reachable")
    out = subprocess.run(
        [sys.executable, str(ENGINE), "--model-preset", "tiny", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "torch" in out.stderr
    assert not (tmp_path / "o").exists()  # nothing written when refused


def test_fake_pg_defaults_to_worlds_larger_than_one():
    assert args.use_fake_pg(_parse("--model-preset", "tiny", "--world-size", "8", "--out", "o")) is True
    assert args.use_fake_pg(_parse("--model-preset", "tiny", "--out", "o")) is False
    assert args.use_fake_pg(_parse("--model-preset", "tiny", "--fake-pg", "--out", "o")) is True


@pytest.mark.parametrize(
    "text, value",
    [
        ("true", True),
        ("False", False),
        ("null", None),
        ("NULL", None),
        ("none", "none"),  # a string to Hydra: megatron-core's fields take it (model.dsa_kernel_backend=none)
        ("None", "None"),
        ("8", 8),
        ("-3", -3),
        ("1e-4", 1e-4),
        ("[1, 2]", [1, 2]),
        # Hydra's unquoted words: a list, read as config_io reads it on the CPU side (not the string "[...]")
        ("[core_attn,attn_proj]", ["core_attn", "attn_proj"]),
        ("[]", []),
        ("[1,none]", [1, "none"]),
        ("optim_grads_params", "optim_grads_params"),
        ("nan", "nan"),  # not a finite number: kept as text, Bridge decides
        ("/data/ckpt", "/data/ckpt"),
    ],
)
def test_parse_value(text, value):
    assert args.parse_value(text) == value
    assert type(args.parse_value(text)) is type(value)


def test_parse_overrides_rejects_malformed_items():
    assert args.parse_overrides(["a.b=1", "+c.d=x=y"]) == {"a.b": 1, "c.d": "x=y"}
    with pytest.raises(args.InputError, match="not KEY=VALUE"):
        args.parse_overrides(["a.b"])
    with pytest.raises(args.InputError, match="dotted attribute"):
        args.parse_overrides(["a..b=1"])
    with pytest.raises(args.InputError, match="dotted attribute"):
        args.parse_overrides(["a.b-c=1"])


def test_perf_micro_batches_needs_perf():
    p = args.rehearse_parser()
    a = p.parse_intermixed_args(["--model-preset", "tiny", "--perf-micro-batches", "4", "--out", "o"])
    with pytest.raises(args.InputError, match="needs --perf"):
        args.check_args(a)
    a = p.parse_intermixed_args(["--model-preset", "tiny", "--perf", "--perf-micro-batches", "4", "--out", "o"])
    args.check_args(a)
    assert a.perf_micro_batches == 4


def test_profile_needs_perf():
    p = args.rehearse_parser()
    a = p.parse_intermixed_args(["--model-preset", "tiny", "--profile", "--out", "o"])
    with pytest.raises(args.InputError, match="--profile needs --perf"):
        args.check_args(a)
    a = p.parse_intermixed_args(
        ["--model-preset", "tiny", "--perf", "--profile", "--te-grad-accum-fusion", "--out", "o"]
    )
    args.check_args(a)
    assert a.profile and a.te_grad_accum_fusion


@pytest.mark.parametrize("text", ["null", "NULL", "none", "None", "~", "true", "False", "8", "1e-4", "[1, 2]", "fp32"])
def test_engine_reads_scalar_overrides_as_the_cpu_tools_do(text):
    # one KEY=VALUE means the same to check/enable (Hydra's grammar, config_io) and to the engine
    from mfsdp_lib import config_io

    assert args.parse_value(text) == config_io.parse_value(text)
    assert type(args.parse_value(text)) is type(config_io.parse_value(text))


def test_list_values_read_as_the_cpu_side_reads_them():
    from mfsdp_lib import config_io

    for text in ("[core_attn,attn_proj]", "[1, 2]", "[]", "[a]", '["x", "y"]'):
        assert args.parse_value(text) == config_io.parse_value(text), text
