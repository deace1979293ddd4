"""Hostile and careless input, one test per attack: each reproduces the attack and shows it is held.

The numbers in the test names are the attack list of SECURITY.md ("What was tried"). Everything runs the
real CLI in a subprocess, the way an agent does, with a time limit: a hang fails the test instead of
stalling the suite.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _helpers_ckptlog import REAL_LOG

TIMEOUT = 20  # seconds; every command must answer hostile input well inside this


def _run(cli, *args, **kw):
    start = time.monotonic()
    p = cli(*map(str, args), timeout=TIMEOUT, **kw)
    p.elapsed = time.monotonic() - start
    return p


def _one_line_error(p, code=2):
    assert p.returncode == code, (p.returncode, p.stdout[-400:], p.stderr[-400:])
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    return lines[0]


# --------------------------------------------------------------------------- 3. log: failed runs exit 1

REAL = REAL_LOG.read_text(encoding="utf-8").split("\n")
START = next(i for i, ln in enumerate(REAL) if ln.startswith("Starting training loop"))
ITERS = [ln for ln in REAL if re.search(r"\] iteration\s+\d+/", ln)]


def _iter(n: int, total: int = 12) -> str:
    line = ITERS[(n - 1) % len(ITERS)]
    return re.sub(r"iteration\s+\d+/\s*\d+", f"iteration {n:8d}/{total:8d}", line)


def _tb(prefix: str, last: str) -> list[str]:
    return [
        f"{prefix}Traceback (most recent call last):",
        f'{prefix}  File "/opt/venv/lib/python3.12/site-packages/megatron/bridge/training/train.py", line 3, in train',
        f"{prefix}    loss = train_step(...)",
        f"{prefix}{last}",
    ]


def _write(tmp_path, name, lines) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_3a_traceback_after_6_of_12_iterations_is_a_failure(cli, tmp_path):
    log = _write(
        tmp_path,
        "tb.log",
        REAL[: START + 1]
        + [_iter(n) for n in range(1, 7)]
        + _tb("", "RuntimeError: CUDA error: an illegal memory access"),
    )
    p = _run(cli, "log", log)
    assert p.returncode == 1, p.stdout
    assert "MFSDP-LOG-RANK-FAILED" in p.stdout and "illegal memory access" in p.stdout
    assert "after iteration 6 of 12" in p.stdout


def test_3b_rank_killed_by_the_launcher_is_a_failure(cli, tmp_path):
    child = [
        "E1203 10:01:02.000000 77 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: -9) "
        "local_rank: 1 (pid: 4244) of binary: /usr/bin/python3",
        "Traceback (most recent call last):",
        '  File "/usr/local/bin/torchrun", line 8, in <module>',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "train.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "  <NO_OTHER_FAILURES>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-12-03_10:01:02",
        "  host      : node0",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : -9 (pid: 4244)",
        "  error_file: <N/A>",
        "  traceback : Signal 9 (SIGKILL) received by PID 4244",
        "============================================================",
    ]
    log = _write(tmp_path, "killed.log", REAL[: START + 1] + [_iter(n, 10) for n in range(1, 11)] + child)
    p = _run(cli, "log", log, "--format", "json")
    assert p.returncode == 1, p.stdout[-2000:]
    import json

    out = json.loads(p.stdout)
    f = next(f for f in out["findings"] if f["rule"] == "MFSDP-LOG-RANK-FAILED")
    assert "SIGKILL" in f["message"] and "rank 1" in f["message"], f
    assert out["launcher_failed"] is True


def test_3c_rank_1_failing_in_the_save_while_rank_0_looks_healthy(cli, tmp_path):
    lines = [f"[rank0]:{ln}" for ln in REAL[: START + 1]]
    lines += [f"[rank0]:{_iter(n, 10)}" for n in range(1, 11)]
    lines += _tb("[rank1]: ", "OSError: [Errno 28] No space left on device: '/ckpt/iter_0000010/__1_0.distcp'")
    log = _write(tmp_path, "rank1.log", lines)
    p = _run(cli, "log", log)
    assert p.returncode == 1, p.stdout
    assert "rank 1 failed" in p.stdout and "No space left" in p.stdout


def test_3d_crash_at_model_wrap_is_reported_as_a_crash_not_as_no_log(cli, tmp_path):
    log = _write(
        tmp_path,
        "wrap.log",
        ["some launcher banner"]
        + _tb("[rank0]: ", "TypeError: FullyShardedDataParallel.__init__() got an unexpected keyword 'x'"),
    )
    p = _run(cli, "log", log)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "rank 0 failed" in p.stdout and "no training log found" not in p.stderr


def test_3_healthy_run_still_passes(cli):
    p = _run(cli, "log", REAL_LOG)
    assert p.returncode == 0, p.stdout


# --------------------------------------------------------------------------- 4. writers replace only regular files


def test_4_enable_force_never_replaces_a_device_node(cli, tmp_path):
    link = tmp_path / "out.yaml"
    link.symlink_to("/dev/null")  # as root, -o /dev/null --force used to make /dev/null a regular file
    before = os.stat("/dev/null")
    err = _one_line_error(_run(cli, "enable", "-o", link, "--force"))
    assert "character device" in err
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino
    assert link.is_symlink()
    err = _one_line_error(_run(cli, "enable", "-o", "/dev/null", "--force"))
    assert "character device" in err and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_4_fifo_as_output_is_refused_without_hanging(cli, tmp_path):
    fifo = tmp_path / "out.yaml"
    os.mkfifo(fifo)
    err = _one_line_error(_run(cli, "enable", "-o", fifo, "--force"))
    assert "named pipe" in err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_4_symlinked_config_is_edited_through_the_link(cli, tmp_path):
    real = tmp_path / "real.yaml"
    real.write_text("train:\n  micro_batch_size: 1\n")
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    p = _run(cli, "enable", link, "--in-place")
    assert p.returncode == 0, p.stderr
    assert link.is_symlink() and "use_megatron_fsdp: true" in real.read_text()


# --------------------------------------------------------------------------- 5. hangs and crashes (config side)


@pytest.mark.parametrize("command", ["check", "enable", "memory"])
def test_5_fifo_as_config_is_refused_not_a_hang(cli, tmp_path, command):
    fifo = tmp_path / "cfg.yaml"
    os.mkfifo(fifo)
    p = _run(cli, command, fifo)
    assert "named pipe" in _one_line_error(p)
    assert p.elapsed < TIMEOUT / 2


def _alias_bomb() -> str:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    prev = "a"
    for name in "bcdefgh":
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        prev = name
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("command", ["check", "enable", "memory"])
def test_5_yaml_alias_bomb_is_refused_quickly(cli, tmp_path, command):
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    p = _run(cli, command, path)
    assert "YAML aliases" in _one_line_error(p)
    assert p.elapsed < 5


def test_5_many_aliases_are_refused(cli, tmp_path):
    path = tmp_path / "aliases.yaml"
    path.write_text("x: &x 1\nl: [" + ", ".join(["*x"] * 500) + "]\n")
    assert "aliases" in _one_line_error(_run(cli, "check", path))


# --------------------------------------------------------------------------- 9. concurrent --in-place


def test_9_concurrent_in_place_runs_lose_no_change_and_clobber_no_backup(tmp_path):
    from conftest import MFSDP

    cfg = tmp_path / "ov.yaml"
    original = "train:\n  micro_batch_size: 1\n"
    cfg.write_text(original)
    overrides = ["train.micro_batch_size=2", "train.global_batch_size=64", "train.train_iters=7", "checkpoint.save=/x"]
    procs = [
        subprocess.Popen(
            [sys.executable, str(MFSDP), "enable", str(cfg), o, "--in-place"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for o in overrides
    ]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    assert all(rc == 0 for _, _, rc in results), results
    import yaml

    final = yaml.safe_load(cfg.read_text())
    assert final["train"] == {"micro_batch_size": 2, "global_batch_size": 64, "train_iters": 7}
    assert final["checkpoint"]["save"] == "/x"
    backups = sorted(tmp_path.glob("ov.yaml.bak*"))
    assert len(backups) == 4  # one per run, none overwritten
    assert original in [b.read_text() for b in backups]


def test_9_existing_backup_is_never_overwritten(cli, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  micro_batch_size: 1\n")
    (tmp_path / "c.yaml.bak").write_text("precious\n")
    other = tmp_path / "elsewhere"
    other.write_text("do not touch\n")
    (tmp_path / "c.yaml.bak.1").symlink_to(other)
    assert _run(cli, "enable", cfg, "--in-place").returncode == 0
    assert (tmp_path / "c.yaml.bak").read_text() == "precious\n"
    assert other.read_text() == "do not touch\n"
    assert (tmp_path / "c.yaml.bak.2").read_text() == "train:\n  micro_batch_size: 1\n"


# --------------------------------------------------------------------------- 10. duplicate YAML keys


@pytest.mark.parametrize(
    "text, key",
    [
        ("ddp:\n  use_megatron_fsdp: true\n  use_megatron_fsdp: false\n", "ddp.use_megatron_fsdp"),
        ("ddp:\n  use_megatron_fsdp: true\nddp:\n  use_megatron_fsdp: false\n", "ddp"),
        ("model:\n  x:\n    a: 1\n    a: 2\n", "model.x.a"),
    ],
    ids=["key", "section", "nested"],
)
@pytest.mark.parametrize("command", ["check", "enable", "memory"])
def test_10_duplicate_keys_are_an_error_naming_the_key(cli, tmp_path, text, key, command):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    err = _one_line_error(_run(cli, command, path))
    assert f"duplicate key '{key}'" in err


def test_10_run_config_in_a_checkpoint_with_duplicate_keys_is_reported(cli, tmp_path):
    from _helpers_ckptlog import CKPT_STORED, materialise

    root = materialise(CKPT_STORED / "fsdp_dtensor_ok", tmp_path / "ck")
    rc = root / "iter_0000020" / "run_config.yaml"
    rc.write_text(rc.read_text() + "checkpoint:\n  ckpt_format: torch_dist\n")
    p = _run(cli, "ckpt", root)
    assert "duplicate key 'checkpoint'" in p.stdout, p.stdout


# --------------------------------------------------------------------------- held already: keep them held


@pytest.mark.parametrize("kind", ["dev-zero-link", "sparse-1g", "not-utf8", "device"])
def test_held_inputs_stay_held(cli, tmp_path, kind):
    path = tmp_path / "cfg.yaml"
    if kind == "dev-zero-link":
        path.symlink_to("/dev/zero")
    elif kind == "sparse-1g":
        with open(path, "wb") as fh:
            fh.truncate(1 << 30)
    elif kind == "not-utf8":
        path.write_bytes(b"ddp:\n  x: \xff\xfe\n")
    else:
        path = Path("/dev/null")
    for command in ("check", "enable", "memory"):
        p = _run(cli, command, path)
        _one_line_error(p)
        assert p.elapsed < 5


def test_smoke_outputs_are_never_written_through_a_planted_link(tmp_path):
    from mfsdp_lib.findings import InputError
    from mfsdp_lib.runs import smoke

    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.log").symlink_to(victim)
    with pytest.raises(InputError, match="symbolic link"):
        smoke.launch([sys.executable, "-c", "print('x')"], out / "train.log")
    assert victim.read_text() == "keep me\n"


def test_3_a_caught_traceback_the_rank_survived_is_not_a_failure(cli, tmp_path):
    """A rank that logs a handled exception (a retried download) and goes on training did not fail."""
    lines = REAL[: START + 1] + [_iter(n, 10) for n in range(1, 4)]
    lines += _tb("", "ConnectionError: HTTPSConnectionPool(host='huggingface.co'): Read timed out.")
    lines += [_iter(n, 10) for n in range(4, 11)]
    p = _run(cli, "log", _write(tmp_path, "caught.log", lines))
    assert p.returncode == 0, p.stdout
