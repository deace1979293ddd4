"""Hybrid (Mamba) rehearsals: how the engine prepares mamba-ssm, and what it reports as deviations.

A rehearsal (``mfsdp_gpu.mamba``) imports mamba-ssm's Triton kernels before megatron (megatron-core's
Mamba mixer binds them at import). When mamba-ssm was built without its compiled Mamba-1 kernel,
its package import fails on ``import selective_scan_cuda``; only then is that name registered as a
module that raises on any use, and only then does the import go on. Without causal-conv1d the
memory-efficient Mamba path cannot run and is switched off. Each of these is a labelled deviation
from a production run, with its memory effect, in report.json and in the text report.

The import tests run in a fresh interpreter (``sys.modules`` clean) on a package laid out like
mamba-ssm 2.3.2.post1, made at test time: a stand-in, labelled as such, for the parts that decide
the behaviour (its ``__init__`` imports ``ops/selective_scan_interface.py``, which does
``import selective_scan_cuda``; ``ops/triton/ssd_combined.py`` binds causal-conv1d's compiled
functions to None when causal-conv1d is absent). The real package on a GPU machine is exercised by
the recorded H200 runs (``benchmarks/results/raw/rehearse_1xh200/H_*``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

import bench_rehearse as br
import raw_store  # benchmarks/: the raw GPU results, extracted from their archive on first use
from mfsdp_gpu import args, mamba, presets, report
from mfsdp_lib import config_io
from mfsdp_lib.runs import rehearse as rh

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPTS = ROOT / "scripts"
RECIPES = ROOT / "tests" / "fixtures" / "recipes"
RAW = raw_store.path("rehearse_1xh200")

# --------------------------------------------------------------------------- a package laid out like mamba-ssm

INIT = "from mamba_ssm.ops.selective_scan_interface import selective_scan_fn\n"
SELECTIVE_SCAN = (
    "import selective_scan_cuda\n\n\ndef selective_scan_fn(*args):\n    return selective_scan_cuda.fwd(*args)\n"
)
SSD_COMBINED = textwrap.dedent(
    """\
    try:
        from causal_conv1d.cpp_functions import causal_conv1d_fwd_function
    except ImportError:
        causal_conv1d_fwd_function = None
    {extra}
    def mamba_chunk_scan_combined(*args):
        return "scan"
    """
)


def make_mamba(root: Path, *, ssd_extra: str = "", version: str = "2.3.2.post1") -> Path:
    pkg = root / "mamba_ssm"
    for sub in ("", "ops", "ops/triton"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(INIT)
    (pkg / "ops" / "selective_scan_interface.py").write_text(SELECTIVE_SCAN)
    (pkg / "ops" / "triton" / "layernorm_gated.py").write_text("class RMSNorm:\n    pass\n")
    (pkg / "ops" / "triton" / "ssd_combined.py").write_text(SSD_COMBINED.format(extra=ssd_extra))
    meta = root / f"mamba_ssm-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mamba_ssm\nVersion: {version}\n")
    return root


def make_causal_conv1d(root: Path) -> None:
    pkg = root / "causal_conv1d"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cpp_functions.py").write_text("def causal_conv1d_fwd_function(*args):\n    return 'conv'\n")


PROBE = textwrap.dedent(
    """\
    import json, sys
    sys.path[:0] = [{path!r}, {scripts!r}]
    from mfsdp_gpu import mamba
    info = mamba.prepare_mamba_ssm()
    out = {{"info": info, "guard_registered": "selective_scan_cuda" in sys.modules,
           "mamba_modules_left": sorted(m for m in sys.modules if m.startswith("mamba_ssm"))}}
    if info["importable"]:
        import mamba_ssm
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
        out["mamba2_call"] = mamba_chunk_scan_combined()
        try:
            mamba_ssm.selective_scan_fn(1)
            out["mamba1_call"] = "returned"
        except mamba.AbsentKernelError as exc:
            out["mamba1_call"] = str(exc)
    print(json.dumps(out))
    """
)


def probe(path: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(path=str(path), scripts=str(SCRIPTS))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_without_the_mamba1_kernel_the_import_completes_and_any_use_of_it_fails_loudly(tmp_path):
    got = probe(make_mamba(tmp_path))
    info = got["info"]
    assert info["installed"] and info["importable"] and info["error"] is None
    assert info["version"] == "2.3.2.post1"
    assert info["mamba1_kernel"] == "absent (guarded)" and got["guard_registered"]
    assert got["mamba2_call"] == "scan"  # the Mamba-2 kernels megatron-core calls work
    assert "selective_scan_cuda.fwd" in got["mamba1_call"] and "not installed" in got["mamba1_call"]
    assert info["mem_eff_kernels"] is False and info["causal_conv1d_installed"] is False


def test_with_causal_conv1d_the_memory_efficient_kernels_are_found(tmp_path):
    root = make_mamba(tmp_path)
    make_causal_conv1d(root)
    info = probe(root)["info"]
    assert info["importable"] and info["mem_eff_kernels"] is True and info["causal_conv1d_installed"] is True


def test_another_missing_module_is_reported_as_it_is_and_nothing_is_registered(tmp_path):
    got = probe(make_mamba(tmp_path, ssd_extra="import triton_absent_here\n"))
    # the first failure is the Mamba-1 kernel; behind it, the real cause: reported, guard taken back
    assert got["info"]["importable"] is False
    assert "triton_absent_here" in got["info"]["error"]
    assert got["guard_registered"] is False and got["mamba_modules_left"] == []


def test_a_failure_before_the_mamba1_kernel_is_not_worked_around(tmp_path):
    root = make_mamba(tmp_path)
    (root / "mamba_ssm" / "__init__.py").write_text("import torch_absent_here\n" + INIT)
    got = probe(root)
    assert got["info"]["importable"] is False and "torch_absent_here" in got["info"]["error"]
    assert got["guard_registered"] is False and got["mamba_modules_left"] == []


def test_mamba_ssm_not_installed(tmp_path):
    got = probe(tmp_path)
    assert got["info"]["installed"] is False and got["info"]["error"] == "mamba-ssm is not installed"
    assert got["guard_registered"] is False


def test_every_use_of_the_guard_raises_and_introspection_sees_a_module_without_that_name():
    guard = mamba.AbsentKernelModule("selective_scan_cuda")
    for name in ("fwd", "bwd", "__path__"):
        with pytest.raises(mamba.AbsentKernelError, match=f"selective_scan_cuda.{name}: .*not installed"):
            getattr(guard, name)
    with pytest.raises(RuntimeError):  # a runtime error to whoever calls it
        guard.fwd(1, 2)
    # generic walkers of sys.modules (inspect, pickle) probe with a default: a module without the name
    assert getattr(guard, "fwd", None) is None and guard.__name__ == "selective_scan_cuda"
    assert guard.__spec__.name == "selective_scan_cuda"


# --------------------------------------------------------------------------- deviations


ENV_NO_KERNELS = {"importable": True, "mamba1_kernel": "absent (guarded)", "mem_eff_kernels": False}


def test_deviations_name_each_work_around_with_its_memory_effect():
    devs, off = mamba.mamba_deviations(ENV_NO_KERNELS, mem_eff_requested=True, extra_bytes=2 * report.GIB)
    assert off is True
    by_id = {d["id"]: d for d in devs}
    assert set(by_id) == {"mamba1-kernel-absent", "mamba-mem-eff-path-off"}
    assert by_id["mamba1-kernel-absent"]["memory_effect"].startswith("none")
    eff = by_id["mamba-mem-eff-path-off"]["memory_effect"]
    assert (
        "ABOVE" in eff
        and "2.00 GiB" in eff
        and by_id["mamba-mem-eff-path-off"]["extra_activation_bytes"] == 2 * report.GIB
    )


def test_a_config_that_asks_for_the_unfused_path_gets_no_path_deviation():
    devs, off = mamba.mamba_deviations(ENV_NO_KERNELS, mem_eff_requested=False, extra_bytes=None)
    assert off is False and [d["id"] for d in devs] == ["mamba1-kernel-absent"]


def test_a_full_install_has_no_deviation_and_a_broken_one_leaves_the_failure_to_megatron():
    full = {"importable": True, "mamba1_kernel": "present", "mem_eff_kernels": True}
    assert mamba.mamba_deviations(full, True, 1) == ([], False)
    assert mamba.mamba_deviations({"importable": False, "error": "x"}, True, 1) == ([], False)
    assert mamba.mamba_deviations(None, True, 1) == ([], False)


def test_unfused_extra_activations_for_the_preset():
    shape = dict(presets.PRESETS["nemotronh-small"])
    model = SimpleNamespace(**{k: v for k, v in shape.items() if k != "kind"}, seq_length=2048)
    # d_inner + 2 g bf16 elements per token per Mamba layer (g = 2 x groups x state): 112 x 64 + 2 x 2 x 8 x 128
    per_token_bytes = (112 * 64 + 2 * (2 * 8 * 128)) * 2
    assert mamba.unfused_mamba_extra_bytes(model, 1) == per_token_bytes * 2048 * 12
    # a micro-batch above 1 copies the scan output too: one d_inner more
    model.tensor_model_parallel_size = 2
    per_token_mbs2 = (2 * 112 * 64 + 2 * (2 * 8 * 128)) * 2
    assert mamba.unfused_mamba_extra_bytes(model, 2) == per_token_mbs2 // 2 * 2048 * 2 * 12
    assert mamba.unfused_mamba_extra_bytes(SimpleNamespace(hidden_size=8), 1) is None


def test_which_models_have_mamba_layers():
    assert mamba.model_has_mamba(SimpleNamespace(hybrid_layer_pattern="M-M*-"))
    assert not mamba.model_has_mamba(SimpleNamespace(hybrid_layer_pattern="*-*-", mamba_num_groups=8))
    assert mamba.model_has_mamba(SimpleNamespace(hybrid_layer_pattern=None, hybrid_attention_ratio=0.0))
    assert not mamba.model_has_mamba(SimpleNamespace(hidden_size=4096))  # a GPT provider
    # megatron-core 0.19's TransformerConfig gives every provider mamba_num_groups: a GPT provider has it
    # too (a dense Llama rehearsal on the H200 reported itself as hybrid while the check keyed on it).
    assert not mamba.model_has_mamba(SimpleNamespace(hidden_size=4096, mamba_num_groups=8, hybrid_layer_pattern=None))
    assert mamba.mamba_layer_count("M-M*-/M-") == 3  # MTP copies after '/' are Mamba layers too


def test_presets_prepare_mamba_only_when_they_can_have_it():
    parse = args.rehearse_parser().parse_intermixed_args
    assert presets.wants_mamba_ssm(parse(["--model-preset", "nemotronh-small", "--out", "o"]))
    assert not presets.wants_mamba_ssm(parse(["--model-preset", "llama-1b", "--out", "o"]))
    assert presets.wants_mamba_ssm(parse(["--yaml", "job.yaml", "--out", "o"]))  # known only after Bridge is imported


def test_the_preset_is_nemotron_h_4b_layer_shapes_as_bridge_builds_them():
    # the recipe corpus holds what Bridge's own nemotronh_4b recipe built (to_yaml on a GPU machine)
    model = config_io.load_yaml(str(RECIPES / "yaml" / "nemotronh_4b_pretrain_1gpu_h100_bf16.yaml"))["model"]
    preset = presets.PRESETS["nemotronh-small"]
    for key in (
        "hidden_size",
        "ffn_hidden_size",
        "num_attention_heads",
        "num_query_groups",
        "kv_channels",
        "mamba_num_heads",
        "mamba_head_dim",
        "mamba_state_dim",
        "mamba_num_groups",
    ):
        assert preset[key] == model[key], key
    assert model["hybrid_layer_pattern"] == presets.NEMOTRONH_4B_PATTERN
    assert model["hybrid_layer_pattern"].startswith(preset["hybrid_layer_pattern"])
    assert {c for c in preset["hybrid_layer_pattern"]} == {"M", "*", "-"}  # Mamba, attention and MLP layers
    assert model["activation_func"]["_target_"] == "megatron.core.activations.squared_relu"
    assert model["gated_linear_unit"] is False


# --------------------------------------------------------------------------- what the user reads


def _report(**extra):
    rep = {
        "schema": rh.ENGINE_SCHEMA,
        "result": "passed",
        "request": {"world_size": 8, "rank": 0},
        "phases": {"train": {"status": "passed"}},
        "facts": {"strategy": "optim_grads_params", "data_parallel_size": 8},
        "memory": {"between_steps_bytes": 3 * rh.GIB, "peak_allocated_bytes": 9 * rh.GIB},
    }
    rep.update(extra)
    return rep


def test_the_text_report_prints_each_deviation_with_its_memory_effect():
    devs, _ = mamba.mamba_deviations(ENV_NO_KERNELS, True, report.GIB)
    s = rh.summarize([], None)
    run = rh.summarize_run(_report(deviations=devs))
    assert [d["id"] for d in run["deviations"]] == ["mamba1-kernel-absent", "mamba-mem-eff-path-off"]
    text = rh.render_text({**s, "ranks": [run]})
    assert "hybrid (Mamba):" not in text  # no hybrid facts in this report
    hybrid = {"mamba_layers": 12, "mem_eff_path_requested": True, "mem_eff_path_used": False}
    text = rh.render_text({**s, "ranks": [rh.summarize_run(_report(deviations=devs, facts={"hybrid": hybrid}))]})
    assert "hybrid (Mamba): 12 Mamba layers; Mamba path: unfused (the fused kernel cannot run here" in text
    assert "DEVIATION from a production run [mamba-mem-eff-path-off]" in text
    assert "DEVIATION from a production run [mamba1-kernel-absent]" in text
    assert "ABOVE a run on the memory-efficient path by about 1.00 GiB" in text
    assert "DEVIATION" not in rh.render_text({**s, "ranks": [rh.summarize_run(_report())]})


def test_a_config_that_asks_for_the_unfused_path_says_so():
    hybrid = {"mamba_layers": 24, "mem_eff_path_requested": False, "mem_eff_path_used": False}
    run = rh.summarize_run(_report(facts={"hybrid": hybrid}))
    assert "Mamba path: unfused, as the config asks" in rh.render_text({**rh.summarize([], None), "ranks": [run]})


def test_a_call_into_the_absent_kernel_is_explained_as_an_environment_failure():
    ff = {"type": "AbsentKernelError", "message": "selective_scan_cuda.fwd: ...", "phase": "train", "frames": {}}
    got = rh.explain_failure(ff)
    assert got["category"] == "environment" and "CUDA extension" in got["fix"]


def test_no_c_compiler_for_triton_is_an_environment_failure():
    msg = "Failed to find C compiler. Please specify via CC environment variable or set triton.knobs.build.impl."
    got = rh.explain_failure({"type": "RuntimeError", "message": msg, "phase": "train", "frames": {}})
    assert got["category"] == "environment" and "C compiler" in got["fix"]
    other = rh.explain_failure({"type": "RuntimeError", "message": "C compiler warnings", "phase": "train"})
    assert other["category"] == "unknown"


def test_no_attention_backend_is_explained_with_the_setting_that_decides_it():
    # the failure the hybrid preset met on the H200 before it set attention_backend=auto (the provider's
    # default, flash, needs the flash-attn package)
    rep = json.loads((RAW / "H_nemotronh_small_n8_optim_grads_params" / "report_attention_flash.json").read_text())
    f = rh.summarize_run(rep)["failure"]
    assert f["phase"] == "train" and f["category"] == "environment"
    assert "model.attention_backend=auto" in f["fix"] and "flash-attn" in f["why"]


def test_a_broken_mamba_install_is_named_in_the_explanation():
    ff = {
        "type": "ImportError",
        "message": "MambaSSM is not installed. Please install it with `pip install mamba-ssm`.",
        "phase": "model_build",
        "frames": {"core": "megatron/core/ssm/mamba_mixer.py:203 in __init__"},
    }
    rep = _report(result="failed", first_failure=ff, mamba_ssm={"error": "ModuleNotFoundError: No module named 'x'"})
    rep.pop("memory")
    f = rh.summarize_run(rep)["failure"]
    assert f["category"] == "environment" and "No module named 'x'" in f["why"] and "mamba-ssm" in f["fix"]


# --------------------------------------------------------------------------- the benchmark group


def test_group_h_measures_the_hybrid_trunk_at_8_and_64_under_fsdp_and_the_distributed_optimizer():
    runs = br.group_h()
    preset = {(r.tags["n"], r.tags["strategy"]) for r in runs if r.tags["model"] == "nemotronh-small"}
    assert preset == {(n, s) for n in (8, 64) for s in ("optim_grads_params", "distopt")}
    assert all(r.tags.get("hybrid") for r in runs)


def test_group_h_recipes_are_bridge_recipes_with_one_micro_batch_per_rank():
    known = {r["function"] for r in json.loads((RECIPES / "recipes.json").read_text())}
    recipes = [r for r in br.group_h() if "--recipe" in r.args]
    assert len(recipes) >= 2
    for r in recipes:
        module, _, fn = r.args[r.args.index("--recipe") + 1].partition(":")
        assert f"{module}.{fn}" in known, fn
        n = r.args[r.args.index("--world-size") + 1]
        assert f"train.global_batch_size={n}" in r.args


def test_the_wheel_builder_refuses_a_folder_that_is_not_mamba_ssm(tmp_path):
    proc = subprocess.run(
        ["bash", str(ROOT / "tests" / "gpu" / "build_mamba_wheel.sh"), str(tmp_path), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "not mamba-ssm's source" in proc.stderr


# --------------------------------------------------------------------------- the recorded H200 runs


def test_the_h200_hybrid_runs_passed_on_the_real_mamba_ssm_with_their_deviations_recorded():
    passed = []
    for d in sorted(RAW.glob("H_*")):
        rep = json.loads((d / "report.json").read_text())
        if rep["result"] != "passed":
            continue
        passed.append(rep)
        env = rep["mamba_ssm"]
        assert env["importable"] and env["version"] == "2.3.2.post1" and env["mamba1_kernel"] == "absent (guarded)"
        hybrid = rep["facts"]["hybrid"]
        ids = [x["id"] for x in rep["deviations"]]
        assert ids[0] == "mamba1-kernel-absent"
        assert ("mamba-mem-eff-path-off" in ids) == hybrid["mem_eff_path_requested"], d.name
        assert hybrid["mem_eff_path_used"] is False  # no causal-conv1d on that machine
        # the stated extra activations follow from the shape Bridge built (run_config.yaml)
        built = config_io.load_yaml(str(d / "run_config.yaml"))
        model, mbs = SimpleNamespace(**built["model"]), built["train"]["micro_batch_size"]
        for dev in rep["deviations"]:
            if dev["id"] == "mamba-mem-eff-path-off":
                # what the run stated is never below today's count (a smaller stated figure would have been
                # the safe side; these runs stated 2 (d + g) per token, one d more than this count)
                assert dev["extra_activation_bytes"] >= mamba.unfused_mamba_extra_bytes(model, mbs) > 0
        steps = rep["memory"]["steps"]
        assert len(steps) == 3 and all(s["loss"] is not None for s in steps)
    worlds = {(p["source"].startswith("recipe"), p["request"]["world_size"]) for p in passed}
    assert {(True, 8), (True, 64)} <= worlds, worlds
    preset = {(p["request"]["world_size"], p["facts"]["strategy"]) for p in passed if "nemotronh-small" in p["source"]}
    assert preset == {(n, s) for n in (8, 64) for s in ("optim_grads_params", "distopt")}


@pytest.mark.parametrize("mbs, tp, pp, cp", [(1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1), (4, 2, 2, 2)])
def test_rehearsal_and_memory_model_count_the_unfused_mamba_path_alike(mbs, tp, pp, cp):
    """The allowance a rehearsal states for the unfused Mamba path is the memory model's term (the one
    the hybrid H200 peaks are calibrated against), summed over the Mamba layers on the rank."""
    from mfsdp_lib.memory.terms import mamba_unfused_extra_bytes

    built = config_io.load_yaml(str(RAW / "H_nano4b_recipe_n8_optim_grads_params" / "run_config.yaml"))
    m = dict(built["model"], tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp)
    model = SimpleNamespace(**m)
    d_inner = m["mamba_num_heads"] * m["mamba_head_dim"]
    bc = 2 * m["mamba_num_groups"] * m["mamba_state_dim"]
    layers = -(-mamba.mamba_layer_count(m["hybrid_layer_pattern"] or m.get("hybrid_override_pattern")) // pp)
    per_layer = mamba_unfused_extra_bytes(m["seq_length"] // cp, mbs, d_inner, bc) / tp
    assert mamba.unfused_mamba_extra_bytes(model, mbs) == pytest.approx(per_layer * layers, rel=1e-9)


def test_the_rehearsal_summary_states_the_current_unfused_mamba_allowance():
    """benchmarks/results/rehearse_1xh200.json re-derives each hybrid run's allowance from its
    run_config.yaml, and keeps what the run stated beside it."""
    summary = json.loads((ROOT / "benchmarks" / "results" / "rehearse_1xh200.json").read_text())
    seen = 0
    for name, run in summary["raw"]["runs"].items():
        for dev in run.get("deviations") or []:
            if dev["id"] != "mamba-mem-eff-path-off":
                continue
            built = config_io.load_yaml(str(RAW / name / "run_config.yaml"))
            want = mamba.unfused_mamba_extra_bytes(
                SimpleNamespace(**built["model"]), built["train"]["micro_batch_size"]
            )
            assert dev["extra_activation_bytes"] == want, name
            assert f"{want / report.GIB:.2f} GiB" in dev["memory_effect"], name
            stated = dev.get("stated_by_run_bytes", want)
            assert stated >= want, name
            seen += 1
    assert seen == 6
