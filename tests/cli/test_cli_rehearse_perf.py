"""``mfsdp.py rehearse --perf`` and ``--compare``: options, the clean errors, and the whole flow.

A stub interpreter stands in for the GPU machine's Python (labelled STUB: it answers the
CUDA probe and, instead of training, writes the synthetic engine report of
``tests/fixtures/perf`` into the run's folder; for ``--strategy ddp`` it writes the same
report failed with a CUDA out-of-memory error, as a job that does not fit). The engine's
GPU side runs in ``tests/gpu/test_rehearse_perf_gpu.py``.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
MFSDP = ROOT / "scripts" / "mfsdp.py"
REPORT = ROOT / "tests" / "fixtures" / "perf" / "engine_report_synthetic.json"
HF = ROOT / "scripts" / "data" / "hf" / "Meta-Llama-3-8B" / "config.json"


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, str(MFSDP), "rehearse", *map(str, args)], capture_output=True, text=True, cwd=cwd or ROOT
    )


STUB = '''#!{python}
"""STUB engine (not a measurement): copies the synthetic report; --strategy ddp fails out of memory."""
import json, os, sys
a = sys.argv[1:]
if a[:1] == ["-c"]:
    print({probe!r}); sys.exit(0)
out = a[a.index("--out") + 1]
rep = json.load(open({report!r}))
rep["argv"] = a
if "--strategy" in a:
    rep["facts"]["strategy"] = a[a.index("--strategy") + 1]
if {refuse!r}:
    os.makedirs(out, exist_ok=True)
    rep.update(result="failed", first_failure={{"phase": "config", "type": "InputError", "message": {refuse!r}}})
    json.dump(rep, open(os.path.join(out, "report.json"), "w")); sys.exit(2)
if "--strategy" in a and a[a.index("--strategy") + 1] == "ddp":
    rep.pop("perf"); rep["result"] = "failed"
    rep["first_failure"] = {{"phase": "train", "type": "OutOfMemoryError", "message": "CUDA out of memory."}}
os.makedirs(out, exist_ok=True)
sys.stderr.write("[rehearse 00:00:00] train ...\\n")
json.dump(rep, open(os.path.join(out, "report.json"), "w"))
sys.exit(0 if rep["result"] == "passed" else 1)
'''


def _stub(tmp_path: Path, probe: str = "ok", refuse: str = "") -> Path:
    script = tmp_path / "stub_python"
    script.write_text(STUB.format(python=sys.executable, probe=probe, report=str(REPORT), refuse=refuse))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_help_teaches_the_perf_options_and_the_units():
    out = _cli("--help")
    assert out.returncode == 0
    for needle in ("--perf", "--compare", "--intra-node-gbps", "--inter-node-gbps", "--gpus-per-node", "--hf-config"):
        assert needle in out.stdout
    assert "1e9 bytes/s" in out.stdout and "400 Gb/s" in out.stdout  # the unit, said once, clearly


def test_perf_flags_reach_the_engine(tmp_path):
    out = _cli(
        "--model-preset",
        "llama-1b",
        "--world-size",
        "8",
        "--perf",
        "--warmup",
        "1",
        "--iters",
        "4",
        "--out",
        tmp_path / "r",
        "--dry-run",
    )
    assert out.returncode == 0, out.stderr
    line = [ln for ln in out.stdout.splitlines() if not ln.startswith("#")][0]
    assert "--perf --warmup 1" in line and "--iters 4" in line


def test_compare_runs_each_strategy_and_each_variant(tmp_path):
    out = _cli(
        "--model-preset",
        "llama-1b",
        "--world-size",
        "64",
        "--out",
        tmp_path / "r",
        "--dry-run",
        "--strategies",
        "distopt,optim_grads_params",
        "--compare",
        "model.recompute_granularity=full",
    )
    assert out.returncode == 0, out.stderr
    cmds = [ln for ln in out.stdout.splitlines() if not ln.startswith("#")]
    assert len(cmds) == 4
    assert sum("--strategy distopt" in c for c in cmds) == 2
    assert sum("model.recompute_granularity=full" in c for c in cmds) == 2
    assert all("--perf" in c for c in cmds)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--perf", "--parity"], "separate runs"),
        (["--compare", "--strategy", "ddp"], "--strategies"),
        (["--perf", "--inter-node-gbps", "0"], "link model"),
        (["--perf", "--gpus-per-node", "0"], "link model"),
        (["--perf", "--warmup", "-1"], "--warmup"),
        (["--strategies", "ddp,zero3", "--compare"], "--strategies"),
        (["--hf-config", "/no/such/config.json"], "no config.json"),
        (["--hf-config", "llama=/tmp"], "owner/name"),
        (["--compare", "recompute_off"], "variant"),
    ],
)
def test_bad_perf_input_is_one_line_and_exit_2(args, needle, tmp_path):
    out = _cli("--model-preset", "llama-1b", "--world-size", "8", *args, "--out", tmp_path / "r", "--dry-run")
    assert out.returncode == 2, out.stdout
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(("probe", "needle"), [("cuda", "no CUDA GPU"), ("bridge", "Megatron-Bridge is not installed")])
def test_perf_refuses_without_cuda_or_bridge_in_one_line(tmp_path, probe, needle):
    out = _cli(
        "--model-preset",
        "llama-1b",
        "--world-size",
        "8",
        "--perf",
        "--python",
        _stub(tmp_path, probe),
        "--out",
        tmp_path / "r",
    )
    assert out.returncode == 2 and needle in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_missing_hf_config_named_by_the_engine_is_one_line_and_exit_2(tmp_path):
    why = (
        "the recipe reads meta-llama/Meta-Llama-3-8B's config.json from the Hugging Face hub; give it with --hf-config"
    )
    out = _cli(
        "--model-preset",
        "llama-1b",
        "--world-size",
        "8",
        "--perf",
        "--python",
        _stub(tmp_path, refuse=why),
        "--out",
        tmp_path / "r",
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == f"mfsdp.py rehearse: error: {why}"


def test_whole_flow_perf_text_and_json_carry_every_figure(tmp_path):
    out = _cli(
        "--model-preset",
        "llama-1b",
        "--world-size",
        "8",
        "--perf",
        "--python",
        _stub(tmp_path),
        "--out",
        tmp_path / "r",
    )
    assert out.returncode == 0, out.stderr
    for needle in ("compute per step 9.150 s", "tokens/s/GPU", "MFU", "predicted step time", "reduce_scatter"):
        assert needle in out.stdout
    js = _cli(
        "--model-preset",
        "llama-1b",
        "--world-size",
        "8",
        "--perf",
        "--format",
        "json",
        "--python",
        _stub(tmp_path),
        "--out",
        tmp_path / "j",
        "--inter-node-gbps",
        "25",
    )
    data = json.loads(js.stdout)
    perf = data["ranks"][0]["perf"]
    assert perf["compute"]["step_s"]["median"] == pytest.approx(9.15)
    assert perf["tokens_per_s_per_gpu"] == pytest.approx(128 * 8192 / 8 / 9.15)
    pr = perf["prediction"]
    assert pr["links"]["inter_node_gbps"] == 25.0
    assert pr["step_time_s"]["low"] <= pr["step_time_s"]["high"]
    assert set(perf["communication"]["bytes_per_step"]) == {"all_gather", "reduce_scatter", "all_reduce"}
    assert json.loads((tmp_path / "j" / "rehearsal.json").read_text())["ranks"][0]["perf"] == perf


def test_whole_flow_compare_table_names_what_does_not_fit(tmp_path):
    out = _cli(
        "--model-preset",
        "llama-1b",
        "--world-size",
        "8",
        "--python",
        _stub(tmp_path),
        "--out",
        tmp_path / "r",
        "--strategies",
        "ddp,distopt,optim_grads_params",
        "--compare",
    )
    assert out.returncode == 0, out.stderr  # a strategy that does not fit is an answer, not a failure
    assert "does not fit (out of memory)" in out.stdout
    assert out.stdout.count("9.150 s ..") == 2
    rows = json.loads((tmp_path / "r" / "rehearsal.json").read_text())["compare"]["rows"]
    assert [r["strategy"] for r in rows] == ["ddp", "distopt", "optim_grads_params"]
    assert rows[0]["fits"] is False and rows[2]["step_time_s"]["high"] > rows[2]["step_time_s"]["low"]


def test_hf_config_is_checked_and_passed_on_with_its_model_id(tmp_path):
    out = _cli(
        "--recipe",
        "m:f",
        "--world-size",
        "8",
        "--hf-config",
        f"meta-llama/Meta-Llama-3-8B={HF.parent}",
        "--out",
        tmp_path / "r",
        "--dry-run",
    )
    assert out.returncode == 0, out.stderr
    assert f"--hf-config meta-llama/Meta-Llama-3-8B={HF}" in out.stdout
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 1}')
    out = _cli("--recipe", "m:f", "--world-size", "8", "--hf-config", bad, "--out", tmp_path / "s", "--dry-run")
    assert out.returncode == 2 and "no model_type" in out.stderr


def test_the_shipped_llama3_configs_are_the_public_shapes():
    c8 = json.loads(HF.read_text())
    c70 = json.loads((HF.parent.parent / "Meta-Llama-3-70B" / "config.json").read_text())
    assert (c8["num_hidden_layers"], c8["hidden_size"], c8["intermediate_size"]) == (32, 4096, 14336)
    assert (c70["num_hidden_layers"], c70["hidden_size"], c70["intermediate_size"]) == (80, 8192, 28672)
    assert c8["vocab_size"] == c70["vocab_size"] == 128256 and c8["num_key_value_heads"] == 8


def test_k_micro_batches_and_the_dispatcher_fallback_reach_the_engine(tmp_path):
    base = ["--model-preset", "qwen3-moe-16l", "--world-size", "8", "--perf", "--out", tmp_path / "r", "--dry-run"]
    out = _cli(*base, "--perf-micro-batches", "--moe-dispatcher", "alltoall")
    assert out.returncode == 0, out.stderr
    line = [ln for ln in out.stdout.splitlines() if not ln.startswith("#")][0]
    assert "--perf-micro-batches 4" in line and "--moe-dispatcher alltoall" in line  # 4: the stated default
    out = _cli(*base, "--perf-micro-batches", "2")
    assert "--perf-micro-batches 2" in out.stdout
    bad = _cli("--model-preset", "tiny", "--world-size", "8", "--perf-micro-batches", "2", "--dry-run")
    assert bad.returncode == 2 and "applies to --perf" in bad.stderr


def test_profile_and_te_grad_accum_fusion_reach_the_engine(tmp_path):
    base = ["--model-preset", "qwen3-moe-16l", "--world-size", "8", "--perf", "--out", tmp_path / "r", "--dry-run"]
    out = _cli(*base, "--profile", "--te-grad-accum-fusion")
    assert out.returncode == 0, out.stderr
    line = [ln for ln in out.stdout.splitlines() if not ln.startswith("#")][0]
    assert " --profile" in line and " --te-grad-accum-fusion" in line
    plain = _cli(*base)
    assert " --profile" not in plain.stdout and "--te-grad-accum-fusion" not in plain.stdout
    bad = _cli("--model-preset", "tiny", "--world-size", "8", "--profile", "--dry-run")
    assert bad.returncode == 2 and "--profile applies to --perf" in bad.stderr


def test_a_missing_dispatcher_package_is_one_line_and_exit_2(tmp_path):
    why = (
        "the config's MoE dispatcher (model.moe_token_dispatcher_type=flex, model.moe_flex_dispatcher_backend="
        "hybridep) needs HybridEP (deep_ep.HybridEPBuffer), which is not installed here; install it, or rehearse "
        "with --moe-dispatcher alltoall (a labelled deviation)"
    )
    stub = _stub(tmp_path, refuse=why)
    out = _cli("--model-preset", "llama-1b", "--world-size", "8", "--perf", "--python", stub, "--out", tmp_path / "r")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == f"mfsdp.py rehearse: error: {why}"
