"""The rehearsal engine's logic that runs without torch or Megatron-Bridge.

``scripts/rehearse_train.py`` runs on a GPU machine; what decides its behaviour
before any GPU work (arguments, overrides, settings bookkeeping, the report writer,
the failure locator, the meta-init rule and the mirrored collectives' copy plans) is
pure Python and is held here. The engine must also refuse cleanly where torch is
absent, and ``--help`` must work there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import rehearse_train as rt

ROOT = Path(__file__).resolve().parent.parent.parent
ENGINE = ROOT / "scripts" / "rehearse_train.py"


def _parse(*argv):
    return rt.build_parser().parse_intermixed_args(list(argv))


# --------------------------------------------------------------------------- arguments


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
    with pytest.raises(rt.InputError, match=needle):
        rt.check_args(a)


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
    assert rt.use_fake_pg(_parse("--model-preset", "tiny", "--world-size", "8", "--out", "o")) is True
    assert rt.use_fake_pg(_parse("--model-preset", "tiny", "--out", "o")) is False
    assert rt.use_fake_pg(_parse("--model-preset", "tiny", "--fake-pg", "--out", "o")) is True


# --------------------------------------------------------------------------- overrides and settings


@pytest.mark.parametrize(
    "text, value",
    [
        ("true", True),
        ("False", False),
        ("null", None),
        ("8", 8),
        ("-3", -3),
        ("1e-4", 1e-4),
        ("[1, 2]", [1, 2]),
        ("optim_grads_params", "optim_grads_params"),
        ("nan", "nan"),  # not a finite number: kept as text, Bridge decides
        ("/data/ckpt", "/data/ckpt"),
    ],
)
def test_parse_value(text, value):
    assert rt.parse_value(text) == value
    assert type(rt.parse_value(text)) is type(value)


def test_parse_overrides_rejects_malformed_items():
    assert rt.parse_overrides(["a.b=1", "+c.d=x=y"]) == {"a.b": 1, "c.d": "x=y"}
    with pytest.raises(rt.InputError, match="not KEY=VALUE"):
        rt.parse_overrides(["a.b"])
    with pytest.raises(rt.InputError, match="dotted attribute"):
        rt.parse_overrides(["a..b=1"])
    with pytest.raises(rt.InputError, match="dotted attribute"):
        rt.parse_overrides(["a.b-c=1"])


def _cfg():
    return SimpleNamespace(
        ddp=SimpleNamespace(check_for_nan_in_grad=True, use_megatron_fsdp=False),
        train=SimpleNamespace(exit_signal_handler=True, train_iters=1000),
        env_vars={},
        model=None,
    )


def test_set_dotted_refuses_unknown_names_and_unset_sections():
    cfg = _cfg()
    assert rt.set_dotted(cfg, "ddp.check_for_nan_in_grad", False) is True
    assert cfg.ddp.check_for_nan_in_grad is False
    rt.set_dotted(cfg, "env_vars.NCCL_DEBUG", "INFO")
    assert cfg.env_vars == {"NCCL_DEBUG": "INFO"}
    with pytest.raises(rt.InputError, match="no attribute 'check_nan'"):
        rt.set_dotted(cfg, "ddp.check_nan", False)
    with pytest.raises(rt.InputError, match="'model' is not set"):
        rt.set_dotted(cfg, "model.seq_length", 1)


def test_settings_record_only_real_changes_with_reason_and_category():
    cfg = _cfg()
    s = rt.Settings(cfg)
    for key, (value, why) in rt.FAKE_BACKEND_SETTINGS.items():
        if key.startswith("rerun"):
            continue
        s.apply(key, value, "fake-backend", why, only_if_present=True)
    s.apply("train.train_iters", 1000, "rehearsal", "unchanged: not recorded")
    keys = [r["key"] for r in s.rows]
    assert keys == ["ddp.check_for_nan_in_grad", "train.exit_signal_handler"]  # gloo key absent here: skipped
    row = s.rows[0]
    assert row["was"] is True and row["value"] is False and row["category"] == "fake-backend" and row["why"]


def test_fake_backend_needs_exactly_the_documented_settings():
    assert set(rt.FAKE_BACKEND_SETTINGS) == {
        "ddp.check_for_nan_in_grad",
        "dist.use_gloo_process_groups",
        "train.exit_signal_handler",
        "rerun_state_machine.check_for_nan_in_loss",
        "rerun_state_machine.check_for_spiky_loss",
    }
    assert all(v is False and why for v, why in rt.FAKE_BACKEND_SETTINGS.values())


def test_strategy_settings():
    fsdp = rt.strategy_settings("optim_grads")
    assert fsdp["ddp.data_parallel_sharding_strategy"] == "optim_grads"
    assert fsdp["dist.use_megatron_fsdp"] is True and fsdp["checkpoint.ckpt_format"] == "fsdp_dtensor"
    dist = rt.strategy_settings("distopt")
    assert dist["ddp.use_distributed_optimizer"] is True and dist["dist.use_megatron_fsdp"] is False
    assert rt.strategy_settings("ddp")["ddp.use_distributed_optimizer"] is False


# --------------------------------------------------------------------------- meta init


def test_parameter_estimates_match_the_known_trunks():
    assert abs(rt.estimate_params(rt.PRESETS["llama-1b"]) / 1e9 - 1.1) < 0.05
    assert abs(rt.estimate_params(rt.PRESETS["llama3-8b"]) / 1e9 - 7.2) < 0.3  # 8 B minus the 128k vocabulary
    assert abs(rt.estimate_params(rt.PRESETS["qwen3-moe-16l"]) / 1e9 - 10.1) < 0.2
    assert 68 < rt.estimate_params(rt.PRESETS["llama3-70b"]) / 1e9 < 70


def test_meta_init_only_where_the_unsharded_model_would_not_fit():
    h200 = 139 * rt.GIB
    big = rt.estimate_params(rt.PRESETS["llama3-70b"])
    small = rt.estimate_params(rt.PRESETS["llama3-8b"])
    assert rt.decide_meta_init(None, True, big, h200)[0] is True
    assert rt.decide_meta_init(None, True, small, h200)[0] is False
    assert rt.decide_meta_init(None, False, big, h200)[0] is False  # DDP cannot start from the meta device
    used, why = rt.decide_meta_init(True, False, small, h200)
    assert used is False and "needs Megatron FSDP" in why
    assert rt.decide_meta_init(False, True, big, h200) == (False, "requested")


# --------------------------------------------------------------------------- mirrored collectives


def test_all_gather_fills_every_slot_with_the_local_input():
    assert rt.all_gather_slots(32, 4) == [0, 4, 8, 12, 16, 20, 24, 28]
    assert rt.all_gather_slots(4, 4) == [0]
    assert rt.all_gather_slots(3, 4) == [] and rt.all_gather_slots(8, 0) == []


def _apply(plan, inp, out_rows):
    copies, fills = plan
    out = [None] * out_rows
    for s, d, n in copies:
        out[d : d + n] = inp[s : s + n]
    for d, n in fills:
        out[d : d + n] = [0] * n
    return out


def test_all_to_all_delivers_what_this_rank_sends_itself_to_every_slot():
    # rank 0 of 4 sends 2 rows to itself and 1, 3, 0 rows to the others; with every peer
    # looking like rank 0 each peer sends it 2 rows: the token-count exchange says so.
    inp = ["a0", "a1", "b0", "c0", "c1", "c2"]
    plan = rt.all_to_all_plan(6, 8, [2, 1, 3, 0], [2, 2, 2, 2], me=0, world=4)
    assert _apply(plan, inp, 8) == ["a0", "a1"] * 4
    assert plan[1] == []


def test_all_to_all_even_split_and_other_positions():
    inp = list(range(8))
    assert _apply(rt.all_to_all_plan(8, 8, None, None, me=1, world=4), inp, 8) == [2, 3] * 4
    # an output slot larger than what is delivered is zeroed, never left unwritten
    assert _apply(rt.all_to_all_plan(8, 6, [2, 2, 2, 2], [3, 1, 1, 1], me=0, world=4), inp, 6) == [0, 1, 0, 0, 0, 0]


def test_all_to_all_outside_the_group_copies_what_fits():
    assert _apply(rt.all_to_all_plan(3, 5, None, None, me=-1, world=4), ["x", "y", "z"], 5) == ["x", "y", "z", 0, 0]


def test_mirror_wraps_every_collective_that_carries_data():
    names = set(rt._MIRROR_NAMES)
    assert {"all_gather_into_tensor", "all_to_all_single", "all_gather", "reduce_scatter_tensor"} <= names
    assert "all_reduce" not in names and "broadcast" not in names  # in place: already "like this rank"


# --------------------------------------------------------------------------- failures and the report


def test_innermost_frames_name_bridge_core_and_fsdp():
    frames = [
        ("/work/scripts/rehearse_train.py", 10, "run_once"),
        ("/usr/lib/python3.12/site-packages/megatron/bridge/training/setup.py", 253, "setup"),
        ("/usr/lib/python3.12/site-packages/megatron/bridge/models/model_provider.py", 698, "get_model"),
        (
            "/usr/lib/python3.12/site-packages/megatron/core/distributed/fsdp/mcore_fsdp_adapter.py",
            140,
            "_get_dp_tp_mesh",
        ),
        ("/usr/lib/python3.12/site-packages/einops/einops.py", 400, "rearrange"),
    ]
    got = rt.innermost_frames(frames)
    assert got["bridge"] == "megatron/bridge/models/model_provider.py:698 in get_model"
    assert got["core"] == "megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:140 in _get_dp_tp_mesh"
    assert got["innermost"] == "einops.py:400 in rearrange"
    assert "fsdp" not in got


def test_report_is_written_phase_by_phase_and_keeps_the_failure(tmp_path):
    rep = rt.Report(str(tmp_path / "run"), {"request": {"world_size": 8}})
    rep.begin("config")
    on_disk = json.loads((tmp_path / "run" / "report.json").read_text())
    assert on_disk["phases"]["config"]["status"] == "running" and on_disk["result"] == "running"
    rep.end(allocated_bytes=3 * rt.GIB)
    rep.begin("model_wrap")
    try:
        raise ValueError("einops shape mismatch")
    except ValueError as exc:
        rep.fail(exc)
    on_disk = json.loads((tmp_path / "run" / "report.json").read_text())
    assert on_disk["phases"]["config"] == {
        "status": "passed",
        "wall_s": on_disk["phases"]["config"]["wall_s"],
        "allocated_bytes": 3 * rt.GIB,
    }
    assert on_disk["phases"]["model_wrap"]["status"] == "failed"
    ff = on_disk["first_failure"]
    assert ff["phase"] == "model_wrap" and ff["type"] == "ValueError" and "einops" in ff["message"]
    assert "test_rehearse_engine.py" in ff["frames"]["innermost"]
    assert on_disk["result"] == "failed" and on_disk["request"] == {"world_size": 8}
    assert not list((tmp_path / "run").glob("*.tmp"))


def test_report_failure_inside_a_step_names_the_step_and_part(tmp_path):
    rep = rt.Report(str(tmp_path))
    rep.begin("train")
    rep.data["phases"]["train"]["current"] = {"iteration": 2, "phase": "optimizer_step"}
    rep.fail(RuntimeError("CUDA out of memory"))
    ff = json.loads((tmp_path / "report.json").read_text())["first_failure"]
    assert (ff["step"], ff["sub_phase"]) == (2, "optimizer_step")


def test_jsonable_keeps_reports_valid_json():
    got = rt.jsonable({"a": float("inf"), "b": (1, 2), 3: object.__new__(object)})
    assert got["a"] == "inf" and got["b"] == [1, 2] and got["3"].startswith("<object")
    json.dumps(got, allow_nan=False)


def test_parity_legs_drop_the_flags_they_set_themselves():
    argv = [
        "--model-preset",
        "llama-1b",
        "--parity",
        "--save-load",
        "--iters",
        "5",
        "--out",
        "o",
        "--strategy=ddp",
        "x.y=1",
    ]
    drop = {"--parity", "--strategy", "--out", "--fake-pg", "--no-fake-pg", "--world-size", "--rank"}
    assert rt._strip_args(argv, drop) == ["--model-preset", "llama-1b", "--save-load", "--iters", "5", "x.y=1"]


def test_parity_reports_failed_legs_without_crashing(tmp_path):
    # Here the legs refuse (no torch/GPU): the parity verdict must say so, not raise.
    argv = ["--model-preset", "tiny", "--parity", "--iters", "2", "--out", str(tmp_path / "p")]
    a = _parse(*argv)
    assert rt.run_parity(a, argv) == 1
    rep = json.loads((tmp_path / "p" / "report.json").read_text())
    assert rep["result"] == "failed" and rep["first_failure"]["type"] == "LegFailed"
    assert set(rep["legs"]) == {"ddp", "fsdp"}
    for leg in rep["legs"].values():
        assert leg["exit_code"] != 0 and "--no-fake-pg" in leg["command"]
    assert rep["parity"]["passed"] is False and rep["parity"]["steps_compared"] == 0
    assert "--strategy" in rep["legs"]["fsdp"]["command"] and "optim_grads_params" in rep["legs"]["fsdp"]["command"]


# --------------------------------------------------------------------------- optimizer accounting


class _Param:
    def __init__(self, n):
        self.n = n

    def numel(self):
        return self.n

    def element_size(self):
        return 4

    def dim(self):
        return 1


class _Inner:
    def __init__(self, n):
        self.state = {0: {"exp_avg": _Param(n), "exp_avg_sq": _Param(n), "step": 3}}
        self.param_groups = [{"params": [_Param(n)]}]


class _Wrapped:
    def __init__(self, n):
        self.optimizer = _Inner(n)


class _Chained:
    """Like megatron-core's ChainedOptimizer: ``optimizer`` asserts a single child."""

    def __init__(self, *children):
        self.chained_optimizers = list(children)

    @property
    def optimizer(self):
        assert len(self.chained_optimizers) == 1, "ChainedOptimizer has more than one optimizer"
        return self.chained_optimizers[0].optimizer


def test_count_optimizer_walks_every_child_of_a_chained_optimizer():
    # MoE with the distributed optimizer: one optimizer for dense and one for expert parameters.
    got = rt.count_optimizer(_Chained(_Wrapped(10), _Wrapped(5)))
    assert got["state_numel"] == 2 * 10 + 2 * 5  # two moments each; the scalar step is not state memory
    assert got["updated_param_numel"] == 15
    assert got["updated_param_bytes"] == 60
    assert got["inner_optimizers"] == ["_Inner", "_Inner"]


def test_global_plan_waiver_answers_valid_in_the_callers_terms(monkeypatch):
    """The waiver keeps torch's verdict on record and answers "valid" as the installed torch spells it."""
    import types

    fake_dp = types.ModuleType("torch.distributed.checkpoint.default_planner")
    pkg = {
        "torch": types.ModuleType("torch"),
        "torch.distributed": types.ModuleType("torch.distributed"),
        "torch.distributed.checkpoint": types.ModuleType("torch.distributed.checkpoint"),
        "torch.distributed.checkpoint.default_planner": fake_dp,
    }
    for verdict, valid in ((False, True), (["key:w has a gap"], [])):
        fake_dp._validate_global_plan = lambda plan, md, v=verdict: v
        for name, mod in pkg.items():
            monkeypatch.setitem(sys.modules, name, mod)
        pkg["torch.distributed.checkpoint"].default_planner = fake_dp
        rt.GLOBAL_PLAN_CHECKS.clear()
        assert rt.waive_global_plan_coverage_check().startswith("global-plan coverage check waived")
        assert fake_dp._validate_global_plan([], None) == valid
        assert rt.GLOBAL_PLAN_CHECKS[-1]["torch_verdict"] is False and rt.GLOBAL_PLAN_CHECKS[-1]["waived"] is True
        assert rt.waive_global_plan_coverage_check() == ""  # installed once
