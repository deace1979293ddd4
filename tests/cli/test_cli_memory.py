"""Tests for ``mfsdp.py memory``: the command-line contract, run the way an agent runs it."""

from __future__ import annotations

import json

import pytest

from mfsdp_lib import memory
from mfsdp_lib.cli import memory as cli_memory


def run_json(cli, *args):
    proc = cli("memory", *args, "--format", "json")
    # stderr holds nothing, or only the measured what-works row of the config's model (beside the JSON)
    assert proc.stderr == "" or proc.stderr.startswith("what-works: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return proc, json.loads(proc.stdout)


def test_help_has_examples(cli):
    proc = cli("memory", "--help")
    assert proc.returncode == 0
    assert "examples:" in proc.stdout and "--gpu-mem-gib" in proc.stdout
    for name in memory.builtin_names():
        assert name in proc.stdout
    assert "Exit codes" in proc.stdout


def test_json_contract(cli):
    proc, out = run_json(cli, "--model", "llama3-8b", "--dp", "8", "--gpu-mem-gib", "80")
    assert proc.returncode == 0
    assert [r["name"] for r in out["strategies"]] == list(memory.STRATEGIES)
    for row in out["strategies"]:
        for key in (
            "name",
            "params_gib",
            "grads_gib",
            "optimizer_gib",
            "buffers_gib",
            "activations_gib",
            "total_gib",
            "fits",
        ):
            assert key in row
        assert row["fits"] == (row["total_gib"] <= 80)
    assert isinstance(out["assumptions"], dict)
    assert out == memory.report(None, model="llama3-8b", dp=8, gpu_mem_gib=80)


def test_strategy_selection_and_params_suffix(cli):
    proc, out = run_json(
        cli, "--params", "8.03B", "--dp", "4", "--strategy", "ddp,optim_grads_params", "--strategy", "ddp"
    )
    assert [r["name"] for r in out["strategies"]] == ["ddp", "optim_grads_params"]
    assert out["model"]["params"] == 8_030_000_000
    assert out["strategies"][0]["activations_gib"] is None  # no shape, no activations


def test_exit_1_when_nothing_fits(cli):
    proc = cli("memory", "--model", "llama3-70b", "--gpu-mem-gib", "24")
    assert proc.returncode == 1
    assert "NO" in proc.stdout and "min DP" in proc.stdout


def test_text_table(cli):
    proc = cli("memory", "--model", "llama3-8b", "--dp", "8", "--gpu-mem-gib", "80")
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("strategy"))
    for word in ("params", "grads", "optim", "buffers", "activ.", "total", "fits", "min DP"):
        assert word in header
    assert any(line.startswith("optim_grads_params") for line in lines)
    assert "assumptions:" in proc.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--params", "many"], "--params"),
        (["--model", "gpt-17"], "unknown model"),
        (["--model", "llama3-8b", "--dp", "0"], "dp"),
        (["--model", "llama3-8b", "--strategy", "zero3"], "unknown strategy"),
        (["--model", "llama3-8b", "--gpu-mem-gib", "-3"], "positive"),
        (["--model", "llama3-8b", "--params", "1e9"], "not allowed"),
        (["--dp", "8"], "nothing to size"),
        (["a.yaml", "b.yaml"], "more than one CONFIG"),
        (["--tp", "two"], "invalid int"),
    ],
)
def test_bad_input_one_line_exit_2(cli, args, needle):
    proc = cli("memory", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert needle in proc.stderr
    # one error line (argparse prints its usage above its own errors)
    assert sum("error:" in line for line in proc.stderr.splitlines()) == 1


def test_parse_count():
    assert cli_memory.parse_count("8.03e9") == 8.03e9
    assert cli_memory.parse_count("405b") == 405e9
    assert cli_memory.parse_count("1_000M") == 1e9


def test_real_run_config(cli, tests_dir):
    path = tests_dir / "fixtures" / "real-h200-run" / "checkpoint_metadata_only" / "iter_0000010" / "run_config.yaml"
    proc, out = run_json(cli, str(path), "--dp", "8")
    assert out["model"]["params"] == 17_835_264
    assert [r["name"] for r in out["strategies"] if r["configured"]] == ["optim_grads_params"]
    proc, over = run_json(cli, str(path), "model.seq_length=4096", "--dp", "8")
    assert over["assumptions"]["seq_length"] == 4096
    assert over["strategies"][0]["activations_gib"] > out["strategies"][0]["activations_gib"]


def test_overrides_alone_use_the_embedded_recipe(cli):
    proc, out = run_json(cli, "model.seq_length=4096", "--dp", "8")
    # config_io's embedded Llama 3 8B recipe as Bridge 0.6.2 ships it trains on mock data with a
    # NullTokenizer of 32000 and use_tokenizer_vocab_size=True: Bridge's setup replaces the model's
    # 128256 by 32000, so the recipe's model has 2 x (128256 - 32000) x 4096 fewer parameters.
    assert out["model"]["params"] == 8_030_261_248 - 2 * (128256 - 32000) * 4096
    assert out["assumptions"]["seq_length"] == 4096
    assert [r["name"] for r in out["strategies"] if r["configured"]] == ["distopt"]


def test_parallel_sizes_taken_from_the_embedded_recipe_are_named(cli):
    """Overrides without a CONFIG or a model of the user's sit on the embedded recipe (its Llama 3 8B is the model
    sized), whose CP=2 halves the activations: the estimate names what it took in the layout line itself and in the
    JSON, and --cp 1 (or the override) makes it the user's."""
    args = ("model.recompute_granularity=full", "--dp", "4", "--tp", "4")
    proc, out = run_json(cli, *args)
    assert out["parallelism"]["cp"] == 2 and out["inherited_from_embedded_recipe"] == {"context_parallel_size": 2}
    assert any("--cp 1" in n for n in out["assumptions"]["notes"])
    text = cli("memory", *args).stdout.splitlines()
    assert text[1].startswith("DP=4 TP=4 PP=1 CP=2 (embedded recipe's) EP=1"), text[1]
    assert text[2].startswith("note: no CONFIG given")
    for fixed in ((*args, "--cp", "1"), ("model.context_parallel_size=1", *args)):
        _, out = run_json(cli, *fixed)
        assert out["parallelism"]["cp"] == 1 and "inherited_from_embedded_recipe" not in out


PARAMS_70B = ("--params", "70600000000", "--dp", "64", "--gpu-mem-gib", "80")
DSV3 = "fixtures/memory/hf_configs/deepseek-ai/DeepSeek-V3"


def test_an_override_never_swaps_the_users_model_onto_the_embedded_recipe(cli):
    """`--params 70.6e9 --dp 64 model.init_model_with_meta_device=true` put the embedded Llama 3 8B recipe under
    the user's 70.6 B model and took its CP 2: 131.6 GiB "NO" became 10.4 GiB "yes" at a sharding degree of 128.
    With a model of the user's (--params, --model, --hf-config) the overrides apply to that model alone: the
    layout, precision and optimizer are what the same command without the override assumes."""
    _, bare = run_json(cli, *PARAMS_70B)
    _, over = run_json(cli, *PARAMS_70B, "model.init_model_with_meta_device=true")
    assert over["parallelism"] == bare["parallelism"] and over["parallelism"]["cp"] == 1
    assert "inherited_from_embedded_recipe" not in over
    assert not any(r["configured"] for r in over["strategies"])  # the override selects no strategy
    for a, b in zip(bare["strategies"], over["strategies"], strict=True):
        assert (a["params_gib"], a["grads_gib"], a["optimizer_gib"]) == (
            b["params_gib"],
            b["grads_gib"],
            b["optimizer_gib"],
        )
    fsdp = {r["name"]: r for r in over["strategies"]}["optim_grads_params"]
    # meta init: no construction peak; 64-way shards of weights, grads and Adam state plus the step's fp32 copy
    assert fsdp["init_peak_gib"] in (None, 0.0) and 16 < fsdp["total_gib"] < 24 and fsdp["fits"]
    assert {r["name"]: r for r in bare["strategies"]}["optim_grads_params"]["total_gib"] > 130


def test_an_override_changes_only_what_it_names_for_a_builtin_model(cli):
    """With --model, a recompute override must not also switch the Llama bridge's settings (dropout 0, fused bias
    activation) to mcore's defaults, nor bring the recipe's batch in: only the recomputation changes."""
    base = ("--model", "llama3-70b", "--dp", "4", "--tp", "4", "--gpu-mem-gib", "80")
    _, bare = run_json(cli, *base)
    _, over = run_json(cli, *base, "model.recompute_granularity=full")
    changed = {k for k in bare["assumptions"] if bare["assumptions"][k] != over["assumptions"].get(k)}
    assert changed == {"recompute"}, changed


def test_an_override_keeps_the_users_world_and_hf_model(cli, tests_dir):
    """`--hf-config dsv3 --gpus 256 ... model.recompute_granularity=full` silently halved DP 256 -> 128 (the
    embedded recipe's CP 2) and took its seq 8192."""
    base = ("--hf-config", str(tests_dir / DSV3), "--gpus", "256", "--ep", "64")
    _, bare = run_json(cli, *base)
    _, over = run_json(cli, *base, "model.recompute_granularity=full")
    assert over["parallelism"]["dp"] == 256 and over["parallelism"]["cp"] == 1
    assert over["assumptions"]["seq_length"] == bare["assumptions"]["seq_length"]
    assert over["assumptions"]["recompute"].startswith("full") and "inherited_from_embedded_recipe" not in over


def test_bad_override_is_one_line(cli):
    proc = cli("memory", "model.recompute_granularity=fulll")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "fulll" in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--model", "llama3-8b", "--seq-length", "9" * 400],  # int too large for float(): was exit 3
        ["--model", "llama3-8b", "--micro-batch-size", "9" * 400],
        ["--params", "1e308"],  # finite input, inf bytes: was "Infinity" in the JSON, which is not JSON
    ],
)
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_absurd_sizes_are_input_errors(cli, args, fmt):
    proc = cli("memory", *args, "--format", fmt)
    assert proc.returncode == 2, proc.stdout[:300] + proc.stderr
    assert "too large" in proc.stderr and "Traceback" not in proc.stderr
    # text: nothing on stdout; json: the refusal as the one JSON object (cli/common.py)
    assert proc.stdout == "" if fmt == "text" else json.loads(proc.stdout)["exit"] == 2, proc.stdout


HF_FIXTURES = __import__("pathlib").Path(__file__).resolve().parent.parent / "fixtures" / "memory" / "hf_configs"


def test_hf_config_moe_with_ep(cli):
    path = str(HF_FIXTURES / "Qwen" / "Qwen3-30B-A3B" / "config.json")
    proc, out = run_json(
        cli, "--hf-config", path, "--ep", "8", "--dp", "64", "--seq-length", "2048", "--gpu-mem-gib", "141"
    )
    assert proc.returncode == 0
    assert out["model"]["params"] == 30_532_122_624
    assert out["parallelism"]["ep"] == 8 and out["parallelism"]["dp_multiple_of"] == 8
    row = {r["name"]: r for r in out["strategies"]}["optim_grads_params"]
    assert row["modelled"] and row["assumed"] and row["smallest_dp_that_fits"] % 8 == 0
    assert not any(r["configured"] for r in out["strategies"])  # no Bridge config: nothing is "selected"


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--hf-config", "/nonexistent/config.json"], "cannot read"),
        (["--model", "llama3-8b", "--tp", "3"], "transformer_config.py:1323"),
        (["--params", "30e9", "--ep", "8", "--dp", "8"], "--expert-params"),
        (["--params", "30e9", "--expert-params", "lots"], "--expert-params must be a number"),
    ],
)
def test_bad_inputs_exit_2_with_the_reason(cli, args, needle):
    proc = cli("memory", *args)
    assert proc.returncode == 2, proc.stdout
    assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_text_output_says_what_is_modelled(cli):
    path = str(HF_FIXTURES / "nvidia" / "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    proc = cli("memory", "--hf-config", path, "--ep", "8", "--dp", "8", "--strategy", "optim_grads_params")
    assert proc.returncode == 0, proc.stderr
    assert "modelled (optim_grads_params):" in proc.stdout and "assumed (optim_grads_params):" in proc.stdout
    assert "mamba" in proc.stdout


def test_mtp_activations_are_counted_and_said(cli):
    """DeepSeek-V3 has one MTP depth: its activations are in the figure (JSON ``assumptions.mtp_activations_gib``,
    part of ``activations_gib``) and the text output says what is counted and what is assumed for them."""
    path = str(HF_FIXTURES / "deepseek-ai" / "DeepSeek-V3")
    args = ("--hf-config", path, "--ep", "64", "--dp", "64", "--seq-length", "4096", "--strategy", "optim_grads_params")
    proc, out = run_json(cli, *args)
    assert proc.returncode == 0
    mtp = out["assumptions"]["mtp_activations_gib"]
    assert 0 < mtp < out["strategies"][0]["activations_gib"]
    text = cli("memory", *args)
    assert text.returncode == 0, text.stderr
    assert "MTP depths: parameters and activations counted" in text.stdout
    assert "assumed: the depths sit on the last stage" in text.stdout
    assert "MTP depths and their losses" in text.stdout


def test_gpus_derives_and_checks_dp(cli):
    proc, out = run_json(cli, "--model", "llama3-8b", "--tp", "4", "--gpus", "64")
    assert out["parallelism"]["dp"] == 16
    bad = cli("memory", "--model", "llama3-8b", "--tp", "4", "--gpus", "30")
    assert bad.returncode == 2 and "parallel_state.py:822" in bad.stderr
    clash = cli("memory", "--model", "llama3-8b", "--tp", "4", "--gpus", "64", "--dp", "8")
    assert clash.returncode == 2 and "not --gpus 64" in clash.stderr


def test_hf_config_folder_without_config_json_says_so(cli, tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"")
    p = cli("memory", "--hf-config", str(folder))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"no config.json in {folder}" in p.stderr, p.stderr


LLAMA70B_TP4_PP2_FSDP = """\
model:
  tensor_model_parallel_size: 4
  pipeline_model_parallel_size: 2
dist:
  use_megatron_fsdp: true
ddp:
  use_megatron_fsdp: true
  data_parallel_sharding_strategy: optim_grads_params
"""


def test_a_strategy_the_job_cannot_run_is_not_said_to_fit(cli, tmp_path):
    """`memory llama70b_tp4_pp2_fsdp.yaml --gpus 128` printed `optim_grads_params* ... yes` while `check` on the
    same file says MFSDP-PIPELINE-PARALLEL. Megatron FSDP rows at PP > 1 are n/a, and the way out is named."""
    cfg = tmp_path / "llama70b_tp4_pp2_fsdp.yaml"
    cfg.write_text(LLAMA70B_TP4_PP2_FSDP)
    assert "MFSDP-PIPELINE-PARALLEL" in cli("check", str(cfg), "--env", "PATH=/usr/bin").stdout
    args = (str(cfg), "--model", "llama3-70b", "--gpus", "128", "--gpu-mem-gib", "141")
    _, out = run_json(cli, *args)
    rows = {r["name"]: r for r in out["strategies"]}
    for name in ("no_shard", "optim", "optim_grads", "optim_grads_params"):
        assert rows[name]["fit"] == "n/a (PP > 1)" and rows[name]["fits"] is False, rows[name]
        assert rows[name]["smallest_dp_that_fits"] is None
    assert rows["distopt"]["fit"] in ("yes", "tight", "no")
    text = cli("memory", *args).stdout
    line = next(x for x in text.splitlines() if x.startswith("optim_grads_params*"))
    assert "n/a(PP>1)" in line and " yes" not in line
    assert "enable" in text and "--set-pp-1" in text and "MFSDP-PIPELINE-PARALLEL" in text


def test_fits_has_three_states_and_names_what_is_not_counted(cli):
    """`--gpu-mem-gib 80` said 78.96 GiB "yes": no room for the CUDA context, NCCL or fragmentation."""
    args = ("--params", "12.8e9", "--dp", "64", "--strategy", "distopt")
    _, out = run_json(cli, *args, "--gpu-mem-gib", "80")
    row = out["strategies"][0]
    assert 72 < row["total_gib"] <= 80, row["total_gib"]  # above the headroom line, below the card
    assert row["fit"] == "tight" and row["fits"] is True
    assert out["gpu"]["tight_above_gib"] == pytest.approx(80 * memory.TIGHT_FRACTION, abs=0.01)
    text = cli("memory", *args, "--gpu-mem-gib", "80").stdout
    assert "tight" in next(x for x in text.splitlines() if x.startswith("distopt"))
    assert "CUDA context" in text and "NCCL" in text and "fragmentation" in text
    assert run_json(cli, *args, "--gpu-mem-gib", "141")[1]["strategies"][0]["fit"] == "yes"
    assert run_json(cli, *args, "--gpu-mem-gib", "40")[1]["strategies"][0]["fit"] == "no"


@pytest.mark.parametrize("name,gib", [("h100", 79.18), ("H200", 139.80)])
def test_gpu_presets_are_the_memory_a_process_gets(cli, name, gib):
    """An H100 80GB gives a process 79.18 GiB, not 80: the preset is the measured figure, with its source."""
    _, out = run_json(cli, "--model", "llama3-8b", "--dp", "8", "--gpu-mem-gib", name)
    assert out["gpu_mem_gib"] == pytest.approx(gib, abs=0.005)
    assert "benchmarks/results/raw/" in out["gpu"]["source"]
    text = cli("memory", "--model", "llama3-8b", "--dp", "8", "--gpu-mem-gib", name).stdout
    assert f"GPU {gib:.2f} GiB ({name.upper()}" in text


def test_a_nominal_card_size_points_at_the_preset(cli):
    text = cli("memory", "--model", "llama3-8b", "--dp", "8", "--gpu-mem-gib", "80").stdout
    assert "--gpu-mem-gib h100" in text and "79.18" in text


def test_gpu_mem_gib_bad_value_is_one_line(cli):
    p = cli("memory", "--model", "llama3-8b", "--gpu-mem-gib", "a100x")
    assert p.returncode == 2 and "h100" in p.stderr and "Traceback" not in p.stderr


LORA_8B = """\
model:
  num_layers: 32
  hidden_size: 4096
  ffn_hidden_size: 14336
  num_attention_heads: 32
  num_query_groups: 8
  vocab_size: 128256
  hf_model_id: meta-llama/Meta-Llama-3-8B
peft:
  _target_: megatron.bridge.peft.lora.LoRA
  dim: 16
"""

QWEN3_MOE = """\
model:
  num_layers: 48
  hidden_size: 2048
  num_attention_heads: 32
  num_query_groups: 4
  kv_channels: 128
  ffn_hidden_size: 6144
  moe_ffn_hidden_size: 768
  num_moe_experts: 128
  moe_router_topk: 8
  vocab_size: 151936
  expert_model_parallel_size: 8
"""


def test_defaults_filling_a_partial_model_section_are_named(cli, tmp_path):
    """A Llama-8B-shaped LoRA file came out at 5.6 B parameters (no gated MLP, tied embeddings: Bridge's
    GPTModelProvider defaults) without a word; its model id names Llama 3 8B, whose count is 8.03 B."""
    cfg = tmp_path / "lora.yaml"
    cfg.write_text(LORA_8B)
    _, out = run_json(cli, str(cfg), "--dp", "8")
    used = out["model"]["defaults_used"]
    assert used["model.gated_linear_unit"] is False and used["model.share_embeddings_and_output_weights"] is True
    assert "model.ffn_hidden_size" not in used and "model.num_query_groups" not in used  # the file sets them
    assert used["model.bf16"] is False  # no bf16, fp16 or mixed_precision: fp32 weights
    ref = out["model"]["reference"]
    assert ref["name"] == "llama3-8b" and ref["params"] == 8_030_261_248 and ref["source"] == "model.hf_model_id"
    assert ref["difference"] == pytest.approx(out["model"]["params"] / 8_030_261_248 - 1, abs=1e-3)
    assert ref["difference"] < -0.25
    text = cli("memory", str(cfg), "--dp", "8").stdout
    head = "\n".join(text.splitlines()[:6])
    assert "model.gated_linear_unit=false" in head and "model.share_embeddings_and_output_weights=true" in head
    assert "llama3-8b" in head and "8.030 B" in head and "%" in head
    assert "model.bf16=false" in head and "4 bytes" in head


def test_a_config_model_section_is_compared_with_the_named_hf_model(cli, tmp_path, tests_dir):
    """A Qwen3-30B-A3B file counted 20.6 B (30.5 B with --hf-config): with both, the gap is said."""
    cfg = tmp_path / "qwen3moe.yaml"
    cfg.write_text(QWEN3_MOE)
    hf = str(tests_dir / "fixtures/memory/hf_configs/Qwen/Qwen3-30B-A3B")
    _, out = run_json(cli, str(cfg), "--dp", "8", "--hf-config", hf)
    section = out["model"]["config_model_section"]
    assert 20.0e9 < section["params"] < 21.0e9 and 30.0e9 < out["model"]["params"] < 31.0e9
    assert section["difference"] == pytest.approx(section["params"] / out["model"]["params"] - 1, abs=1e-3)
    assert section["defaults_used"]["model.gated_linear_unit"] is False
    text = cli("memory", str(cfg), "--dp", "8", "--hf-config", hf).stdout
    assert "config's model section" in "\n".join(text.splitlines()[:6])


def test_a_full_model_section_names_no_default(cli, tests_dir):
    path = tests_dir / "fixtures/real-h200-run/checkpoint_metadata_only/iter_0000010/run_config.yaml"
    _, out = run_json(cli, str(path), "--dp", "8")
    assert out["model"]["defaults_used"] == {}
