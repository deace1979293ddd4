"""The memory model against real measurements kept in the repository.

* Per-rank memory: the rehearsal runs under ``benchmarks/results/raw/rehearse_1xh200`` and
  ``memory_rehearsal_1xh200`` (one H200 playing rank R of a world of N with the fake process group;
  real Megatron-Bridge code and allocations) must meet the targets on every training measurement:
  model state within 3 %, peak within 5 % and never more than 1 % under. Runs that are not one
  (controls, superseded attempts) are excluded by rule and named, failed runs listed. The committed
  ``benchmarks/results/memory_vs_measured.json`` must be what ``benchmarks/bench_memory.py`` makes of
  them, and the calibration constants must cover them.
* Parameter counts: every family's built model, counted on the GPU machine (meta device, rank 0),
  must equal the count from its recipe's YAML (``tests/fixtures/memory/param_counts``).
* Bridge's recipes rehearsed on one H100 (``what_works_trial_1xh100``): ``memory`` never predicts a peak below the
  measured one, and the LoRA recipes stay within ``LORA_TRIAL_OVER`` of theirs.
* The what-works matrix on one H200 (``what_works_1xh200``): neither the memory between steps nor the peak more
  than 1 % below the measurement on any row, the MoE rows within the matrix's 3 % / 5 %.

Missing evidence fails: these files are the claim's basis.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import raw_store  # benchmarks/: the raw GPU results, extracted from their archive on first use
from mfsdp_lib import memory
from mfsdp_lib.memory import calibration

ROOT = Path(__file__).resolve().parent.parent
RAWS = [raw_store.path(d) for d in ("rehearse_1xh200", "memory_rehearsal_1xh200")]
RESULT = ROOT / "benchmarks" / "results" / "memory_vs_measured.json"
COUNTS = ROOT / "tests" / "fixtures" / "memory" / "param_counts"


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_memory", ROOT / "benchmarks" / "bench_memory.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def assembled():
    for raw in RAWS:
        assert raw.is_dir(), f"{raw} is missing: the measured runs behind BENCHMARK.md's memory table"
    bench = _bench()
    result, problems = bench.assemble(RAWS, "check", "check")
    return bench, result, problems


def _included(result):
    return [r for r in result["raw"]["runs"] if "skipped" not in r and "excluded" not in r]


def test_evidence_covers_dense_moe_hybrid_and_lora(assembled):
    _, result, _ = assembled
    runs = _included(result)
    names = " ".join(r["run"] for r in runs)
    for needle in ("llama1b", "llama8b", "llama70b", "moe", "lora"):
        assert needle in names, f"no finished {needle} run in {RAWS}"
    assert max(r["world_size"] for r in runs) >= 64
    assert {"ddp", "distopt", "optim", "optim_grads", "optim_grads_params"} <= {r["strategy"] for r in runs}
    # The MoE trunk under the distributed optimizer is compared from its passing attempt; the failed
    # first attempt is listed as superseded, not dropped.
    moe_distopt = [r for r in result["raw"]["runs"] if r["run"] == "B_moe_n64_ep8_distopt"]
    assert any("excluded" not in r and "skipped" not in r for r in moe_distopt)
    assert any("superseded" in r.get("excluded", "") for r in moe_distopt)
    # Hybrid (Mamba) runs: Bridge's Nemotron-H recipes and the Nemotron-H preset compared at N = 8 and 64,
    # the preset under both Megatron FSDP and the distributed optimizer; a run that failed (the first
    # attempt without mamba-ssm) is a row with its failure as status.
    hybrid = [row for row in result["rows"] if "hybrid" in row[0] or "nemotron" in str(row[1])]
    compared = [row for row in hybrid if row[-1] == "compared"]
    assert {row[2] for row in compared} >= {8, 64}, "no finished hybrid run at N = 8 and 64"
    assert {row[3] for row in compared} >= {"optim_grads_params", "distopt"}, "hybrid: both weight groups measured"
    assert all(row[-1] == "compared" or "did not finish" in row[-1] for row in hybrid)


def test_controls_are_excluded_by_name_with_the_reason(assembled):
    _, result, _ = assembled
    why = {
        r["run"]: r["excluded"] for r in result["raw"]["runs"] if "excluded" in r and "superseded" not in r["excluded"]
    }
    assert "plain fake collectives" in why["C_moe_n8_ep8_optim_grads_params_plainfake"]
    assert "save and load" in why["C_saveload_llama1b_n8_optim_grads_params"]
    assert "parity" in why["C_parity_llama1b"]
    assert "pipeline stage 0" in why["C_pp2_llama1b_n8_ddp_rank0"]
    status = {row[0]: row[-1] for row in result["rows"]}
    for name, reason in why.items():
        assert status[name] == f"excluded: {reason}", "an excluded run is in the table with its reason"
    assert status["C_pp2_llama1b_n8_ddp_rank4"] == "compared"  # the most-loaded pipeline stage is compared
    failed = [r["run"] for r in result["raw"]["runs"] if "skipped" in r]
    assert failed and all(status[name].startswith("run did not finish") for name in failed)


def test_every_run_meets_the_targets(assembled):
    _, result, problems = assembled
    assert not problems, "\n".join(problems)
    cols = result["columns"]
    for row in result["rows"]:
        r = dict(zip(cols, row, strict=True))
        if r["status"] != "compared":
            continue
        assert abs(r["model state error %"]) <= 3.0, row
        assert -1.0 <= r["peak error %"] <= 5.0, row


def test_committed_result_is_current(assembled):
    _, result, _ = assembled
    committed = json.loads(RESULT.read_text())
    assert committed["rows"] == result["rows"], "regenerate: python3 benchmarks/bench_memory.py " + " ".join(
        f"--raw-dir {raw_store.logical(raw)}" for raw in RAWS
    )
    assert committed["notes"] == result["notes"]


def test_calibration_constants_cover_the_evidence(assembled):
    _, result, _ = assembled
    runs = []
    for r in _included(result):
        cfg = yaml.safe_load((raw_store.resolve(ROOT / r["path"]) / "run_config.yaml").read_text())
        est = memory.estimate(cfg, dp=r["dp"], strategies=(r["strategy"],))
        runs.append((est, r["strategy"], r["peak_measured_bytes"]))
    needed = calibration.fit(runs)
    for key, factor in needed.items():
        assert calibration.ACTIVATION_FACTOR[key] >= factor - 1e-9, f"{key}: constants need {factor:.4f}"


def _count_records():
    path = COUNTS / "params.jsonl"
    assert path.is_file(), f"{path} is missing: the real models' parameter counts"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# The built Qwen3-VL-30B-A3B holds whole experts on each EP rank (experts on rank 0:
# 3,623,878,656 = 24 layers x 128 experts x 4,718,592 / EP 4) although its YAML leaves
# expert_tensor_parallel_size null (which Megatron-Core resolves to TP); the count is pinned as built.
EXPERT_TP_AS_BUILT = {"qwen3_vl_30b_a3b_pretrain_8gpu_h100_bf16_mock_config": 1}


def test_param_counts_match_the_built_models():
    recs = _count_records()
    families = {r["family"] for r in recs}
    assert {"gpt_oss", "gemma", "qwen", "qwen_vl", "glm", "olmoe", "deepseek"} <= families
    assert len(recs) >= 31, f"{len(recs)} recorded counts; the fixture holds 31"
    mismatches = []
    for rec in recs:
        name = rec["recipe"].removesuffix("_config")
        cfg = yaml.safe_load((COUNTS / "yaml" / f"{name}.yaml").read_text())
        model = dict(cfg["model"])
        if rec.get("vocab_size"):
            model["vocab_size"] = rec["vocab_size"]
        lay = rec["layout"]
        shape = memory.shape_from_config(model, rec["recipe"])
        etp = EXPERT_TP_AS_BUILT.get(rec["recipe"], lay.get("etp"))
        counts = memory.count_parameters(shape, tp=lay["tp"], pp=lay["pp"], ep=lay["ep"], etp=etp or None)
        predicted, real = round(counts.first_stage_total), rec["numel_rank0"]
        if predicted != real:
            mismatches.append(
                f"{rec['recipe']} ({rec['family']}, {lay}): {round(counts.first_stage_total)} vs {rec['numel_rank0']}"
            )
    assert not mismatches, "\n".join(mismatches)


# Bridge 0.6.2 recipes rehearsed on one H100 (rank 0 of the recipe's world under the fake process group), kept in the
# raw archive as what_works_trial_1xh100: each row's enabled.yaml is the exact config rehearsed and its report.json
# the measured memory per step. H100 runs, outside the H200 table above; here the prediction `memory` gives for the
# config at the recipe's world (as benchmarks/bench_what_works.py asks for it) must never be below a measured peak,
# and the LoRA rows must stay within LORA_TRIAL_OVER of theirs (an activation factor fitted on the short-sequence
# preset alone, 1.3, puts them up to 17 % over).
TRIAL = "what_works_trial_1xh100"
LORA_TRIAL_OVER = 0.12


# The labelled deviations of a rehearsal that change the job's config, as the KEY=VALUE that runs it: the prediction
# compared with a row is the one for the job as it ran. Without causal-conv1d the GPU machine turns the memory-efficient
# Mamba path off (mfsdp_gpu/mamba.py ``mamba_deviations``), and ``memory`` counts the unfused path's extra activations
# when told (terms.mamba_unfused_extra_bytes).
AS_RUN = {"mamba-mem-eff-path-off": "model.use_mamba_mem_eff_path=false"}


def _as_run(rep: dict) -> tuple[str, ...]:
    return tuple(AS_RUN[d["id"]] for d in rep.get("deviations") or [] if isinstance(d, dict) and d.get("id") in AS_RUN)


def _ran_to_a_verdict(row: Path) -> bool:
    """Whether the row's rehearsal ended by itself, by the matrix's rule (``what_works_result.ran_to_a_verdict``).
    A row without a row.json (the trial's older layout) counts as ended."""
    from what_works_result import ran_to_a_verdict

    meta = row / "row.json"
    if not meta.is_file():
        return True
    runs = [r for r in json.loads(meta.read_text()).get("runs") or [] if r.get("name") == "rehearse"]
    return all(ran_to_a_verdict(r) for r in runs)


def _trial_rows(folder: str = TRIAL):
    """(row, enabled.yaml, world, measured peak bytes, measured between-steps bytes, the KEY=VALUE overrides of the
    job as run) of every row that trained."""
    base = raw_store.path(folder)
    assert base.is_dir(), f"{base} is missing: the rehearsals of Bridge's recipes"
    out = []
    for rep_path in sorted(base.glob("batch_*/rows/*/rehearse/rank_0/report.json")):
        rep = json.loads(rep_path.read_text())
        steps = [s for s in (rep.get("memory") or {}).get("steps") or [] if s.get("between_steps_bytes")]
        if not steps:
            continue  # the run did not train (it failed before its first step)
        row = rep_path.parents[2]
        if not _ran_to_a_verdict(row):
            continue  # the GPU call's budget cut it mid-step: no measured peak (what_works_result gives it no row)
        mem = rep["memory"]
        out.append(
            (
                row.name,
                row / "enabled.yaml",
                rep["request"]["world_size"],
                mem["peak_allocated_bytes"],
                mem.get("between_steps_bytes"),
                _as_run(rep),
            )
        )
    return out


def _predicted(enabled: Path, world: int, overrides: tuple[str, ...] = ()) -> dict | None:
    """The configured strategy's row of ``memory`` for the config (with ``overrides``) at the job's world, as the
    matrix asks for it."""
    import subprocess
    import sys

    cmd = [sys.executable, str(ROOT / "scripts" / "mfsdp.py"), "memory", str(enabled), *overrides, "--gpus", str(world)]
    proc = subprocess.run([*cmd, "--gpu-mem-gib", "140", "--format", "json"], capture_output=True, text=True)
    rep = json.loads(proc.stdout)
    if "strategies" not in rep:
        # A model `memory` does not size yet (diffusion, DeepSeek-V4's hybrid attention) is refused by name, exit 2;
        # the matrix shows no prediction for it either. Anything else is a failure.
        assert proc.returncode == 2 and "not sized yet" in rep.get("error", ""), rep
        return None
    return next(r for r in rep["strategies"] if r["configured"])


def test_trial_recipes_are_never_under_predicted():
    rows = _trial_rows()
    assert sum("peft" in name for name, *_ in rows) >= 4, "the four LoRA recipe rows are in the trial"
    problems = []
    for name, enabled, world, peak, _, as_run in rows:
        sized = _predicted(enabled, world, as_run)
        assert sized is not None, f"{name}: every trial row is sized"
        predicted = sized["total_gib"] * 2**30
        over = predicted / peak - 1
        if over < 0 or ("peft" in name and over > LORA_TRIAL_OVER):
            problems.append(f"{name}: predicted {predicted / 2**30:.2f} GiB, measured {peak / 2**30:.2f} ({over:+.1%})")
    assert not problems, "\n".join(problems)


# The what-works matrix on one H200 (what_works_1xh200 in the raw archive; benchmarks/bench_what_works.py): each row's
# enabled.yaml rehearsed as rank 0 of the recipe's world, dense, MoE (GQA and MLA, EP up to 32) and LoRA. Neither the
# memory between steps nor the peak may be predicted more than MATRIX_UNDER below the measurement (the matrix's own
# tolerance, benchmarks/what_works_result.py), and the LoRA rows stay within LORA_TRIAL_OVER of their peaks.
MATRIX = "what_works_1xh200"
MATRIX_UNDER = 0.01
# The MoE rows (GQA and MLA, LoRA included; GLM-5.2's with DeepSeek sparse attention at EP 16-32 and CP 16, whose peak
# is the model's construction), GPT-OSS's (MoE with a clamped activation) and Nemotron 3 Nano's (hybrid Mamba, compared
# as run: on the unfused Mamba path) also meet the matrix's upper bounds: state within 3 %, peak within 5 %.
MATRIX_MOE = (
    "deepseek_v2_lite",
    "deepseek_v3",
    "olmoe_7b",
    "qwen3_30b_a3b",
    "gpt_oss_20b",
    "nemotron_3_nano_4b",
    "glm52",
)
MATRIX_OVER = {"between steps": 0.03, "peak": 0.05}
# A row whose under-prediction between steps is named in the references (what_works_doc.NAMED_MEMORY_GAPS: the page
# points at the paragraph, which tells users the headroom to keep) is held to that headroom instead; its peak keeps
# the matrix's 1 %.
NAMED_STATE_HEADROOM = 0.04


def test_what_works_matrix_rows_are_never_under_predicted():
    import what_works_doc

    named = tuple(what_works_doc.NAMED_MEMORY_GAPS)
    rows = _trial_rows(MATRIX)
    names = {name for name, *_ in rows}
    for needed in (
        "deepseek_v2_lite_pretrain",
        "deepseek_v3_pretrain",
        "olmoe_7b_pretrain",
        "olmoe_7b_peft",
        "gpt_oss_20b_pretrain",
        "gpt_oss_20b_sft",
        "gpt_oss_20b_peft",
        "nemotron_3_nano_4b_pretrain",
        "nemotron_3_nano_4b_sft",
        "nemotron_3_nano_4b_peft",
        "glm52_pretrain",
        "glm52_sft",
        "glm52_peft",
    ):
        assert any(n.startswith(needed) for n in names), f"the {needed} row is in the matrix"
    problems = []
    for name, enabled, world, peak, between, as_run in rows:
        row = _predicted(enabled, world, as_run)
        if row is None:
            continue  # not sized (see _predicted)
        for what, predicted, measured in (
            ("peak", row["total_gib"], peak),
            ("between steps", row["after_step_gib"], between),
        ):
            if not measured:
                continue
            over = predicted * 2**30 / measured - 1
            too_high = over > MATRIX_OVER[what] if name.startswith(MATRIX_MOE) else False
            under = NAMED_STATE_HEADROOM if what == "between steps" and name.startswith(named) else MATRIX_UNDER
            if over < -under or too_high or (what == "peak" and "peft" in name and over > LORA_TRIAL_OVER):
                problems.append(
                    f"{name} {what}: predicted {predicted:.2f} GiB, measured {measured / 2**30:.2f} ({over:+.1%})"
                )
    assert not problems, "\n".join(problems)


def test_matrix_rows_on_the_unfused_mamba_path_are_compared_as_run():
    """Nemotron 3 Nano 4B's rows ran megatron-core's unfused Mamba path (a labelled deviation: no causal-conv1d on the
    GPU machine). What ``memory`` adds for that path is the allowance the run states (extra_activation_bytes, what
    mfsdp_gpu.mamba computes from the shape; under LoRA that of the layers that save anything), and without it the
    prediction for the production path is below the measured peak: the measured excess is that path's activations."""
    rows = [r for r in _trial_rows(MATRIX) if r[0].startswith("nemotron_3_nano_4b")]
    assert len(rows) == 3, [r[0] for r in rows]
    for name, enabled, world, peak, _, as_run in rows:
        assert as_run == ("model.use_mamba_mem_eff_path=false",), name
        rep = json.loads((enabled.parent / "rehearse" / "rank_0" / "report.json").read_text())
        stated = next(d for d in rep["deviations"] if d["id"] == "mamba-mem-eff-path-off")["extra_activation_bytes"]
        production = _predicted(enabled, world)["total_gib"]
        ran = _predicted(enabled, world, as_run)["total_gib"]
        # Under LoRA the Mamba layers before the first adapter save nothing (terms.peft_frozen_prefix), on either path:
        # the allowance then applies to the others only.
        est = memory.estimate(yaml.safe_load(enabled.read_text()), gpus=world, strategies=("optim_grads_params",))
        kinds = est.shape.layer_kinds()
        skip = memory.terms.peft_frozen_prefix(est.shape, est.activation, kinds)
        share = sum("mamba" in k for k in kinds[skip:]) / sum("mamba" in k for k in kinds)
        assert (share < 1) == ("peft" in name), name
        assert (ran - production) * 2**30 == pytest.approx(stated * share, abs=0.002 * 2**30), name  # factor 1.0
        assert production * 2**30 < peak <= ran * 2**30, name


def test_calibration_constants_cover_the_matrix_hybrid_and_gpt_oss_rows():
    """The factors fitted on the what-works rows of GPT-OSS 20B (MoE with a clamped activation) and Nemotron 3 Nano 4B
    (hybrid, as run) are within the constants, as ``test_calibration_constants_cover_the_evidence`` checks the
    rehearsal runs'."""
    from mfsdp_lib import config_io

    runs = []
    for name, enabled, world, peak, _, as_run in _trial_rows(MATRIX):
        if not name.startswith(("gpt_oss_20b", "nemotron_3_nano_4b")):
            continue
        cfg = yaml.safe_load(enabled.read_text())
        for kv in as_run:
            key, _, value = kv.partition("=")
            config_io.set_path(cfg, key, yaml.safe_load(value))
        est = memory.estimate(cfg, gpus=world, strategies=("optim_grads_params",))
        runs.append((est, "optim_grads_params", peak))
    assert len(runs) == 6
    families = {calibration.family(est) for est, _, _ in runs}
    assert families == {"moe_clamped", "peft", "hybrid"}, families
    needed = calibration.fit(runs)
    assert needed[("moe_clamped", "sharded")] > calibration.ACTIVATION_FACTOR[("moe", "sharded")]  # why it is apart
    for key, factor in needed.items():
        assert calibration.ACTIVATION_FACTOR[key] >= factor - 1e-9, f"{key}: constants need {factor:.4f}"


def test_the_named_dsa_state_gap_is_what_the_raw_run_shows():
    """references/memory.md names one measured under-prediction of the matrix: GLM-5.2 pretrain's state between
    steps, and the same gigabytes in its peak. The figures it quotes are the row's raw run's and memory's, the
    headroom it tells users to keep covers the gap, and the peak stays inside the 1 % bound."""
    base = raw_store.path(MATRIX) / "batch_s7a" / "rows" / "glm52_pretrain_416gpu_h100_bf16"
    rep = json.loads((base / "rehearse" / "rank_0" / "report.json").read_text())
    measured = rep["memory"]["steps"][0]["between_steps_bytes"] / 2**30
    predicted = _predicted(base / "enabled.yaml", rep["request"]["world_size"])["after_step_gib"]
    under = predicted / measured - 1
    assert -0.04 <= under < -0.01, under  # a named gap: beyond the 1 % tolerance, inside the stated 4 %
    text = " ".join((ROOT / "references" / "memory.md").read_text().split())  # a quoted phrase may wrap
    assert f"held {measured:.2f} GiB between steps against {predicted:.2f} GiB" in text
    assert f"{abs(under):.1%} under".replace("%", " %") in text and "up to 4 % low" in text
    peak = rep["memory"]["peak_allocated_bytes"] / 2**30
    predicted_peak = _predicted(base / "enabled.yaml", rep["request"]["world_size"])["total_gib"]
    assert -0.01 <= predicted_peak / peak - 1 < 0, (predicted_peak, peak)
    assert f"peaked at {peak:.2f} GiB against {predicted_peak:.2f} GiB predicted" in text
