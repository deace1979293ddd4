"""Which forward step and mock data a rehearsal drives (``mfsdp_gpu.workload``): Wan's or the GPT one.

Bridge cannot be imported here (it needs CUDA and Transformer Engine), so the provider classes are
STAND-INS whose module and class names are Bridge's (the choice reads only those), and Bridge's
modules the engine imports are stub modules in ``sys.modules`` that record what they are given.
The names and fields relied on are pinned against the real Megatron-Bridge 0.6.2 wheel's source.
"""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from mfsdp_gpu import perf, workload
from mfsdp_lib.perf import report as perf_report

ROOT = Path(__file__).resolve().parent.parent.parent
ROWS_CFG = ROOT / "tests" / "fixtures" / "recipes" / "yaml"


def _provider(module: str, name: str, base: type = object) -> type:
    """A STAND-IN provider class named like Bridge's (``module.name``)."""
    cls = type(name, (base,), {})
    cls.__module__ = module
    cls.__qualname__ = name
    return cls


WAN_MODULE, WAN_NAME = workload.WAN_PROVIDER.rsplit(".", 1)
Wan = _provider(WAN_MODULE, WAN_NAME)
GPT = _provider("megatron.bridge.models.gpt_provider", "GPTModelProvider")


# --------------------------------------------------------------------------- the choice


def test_a_wan_provider_or_a_subclass_of_it_gets_the_wan_step():
    assert workload.choose(Wan()).kind == "wan"
    mine = _provider("my_project.models", "MyWan", Wan)  # a user's subclass still builds a WanModel
    got = workload.choose(mine())
    assert got.kind == "wan" and got.step == workload.WAN_STEP and "WanForwardStep" in got.why


def test_every_other_provider_keeps_the_gpt_step():
    for model in (
        GPT(),
        None,
        _provider("my_project.models", WAN_NAME)(),  # same class name, another module: not Bridge's Wan
        _provider(WAN_MODULE, "WanModelProviderLike")(),  # a name that only starts like it
        _provider("megatron.bridge.diffusion.models.flux.flux_provider", "FluxProvider")(),  # diffusion, not Wan
        SimpleNamespace(_target_=workload.WAN_PROVIDER),  # a field mentioning the name is not the class
    ):
        got = workload.choose(model)
        assert (got.kind, got.step) == ("gpt", workload.GPT_STEP), model


def test_a_vision_language_provider_is_listed_as_rehearsed_on_text_only():
    """A provider with a vision config (Bridge's Qwen3-VL provider carries ``vision_config``) driven by the GPT step
    gets the ``vlm-text-only`` deviation; a text model, a provider whose vision config is unset, Wan (its own
    step) and no model get none."""
    vl = _provider("megatron.bridge.models.qwen_vl.qwen3_vl_provider", "Qwen3VLModelProvider", GPT)()
    vl.vision_config = SimpleNamespace(depth=27)
    dev = workload.text_only_vision_deviation(vl)
    assert dev and dev["id"] == "vlm-text-only" and "no image" in dev["what"]
    assert {"why", "memory_effect", "time_effect"} <= set(dev)
    unset = _provider("megatron.bridge.models.qwen_vl.qwen3_vl_provider", "Qwen3VLModelProvider", GPT)()
    unset.vision_config = None
    wan = Wan()
    wan.vision_config = SimpleNamespace()
    for model in (GPT(), unset, wan, None):
        assert workload.text_only_vision_deviation(model) is None, model


def _stub(monkeypatch, dotted: str, **attrs) -> types.ModuleType:
    """Put a stub module (and its parents) into ``sys.modules``."""
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        monkeypatch.setitem(
            sys.modules,
            ".".join(parts[:i]),
            sys.modules.get(".".join(parts[:i])) or types.ModuleType(".".join(parts[:i])),
        )
    mod = types.ModuleType(dotted)
    for k, v in attrs.items():
        setattr(mod, k, v)
    monkeypatch.setitem(sys.modules, dotted, mod)
    return mod


class RecordingStep:
    """STAND-IN for WanForwardStep: remembers its keyword arguments."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs


def gpt_forward_step(state, data_iterator, model):  # STAND-IN for gpt_step.forward_step
    return None


def test_the_step_is_bridges_own_imported_where_the_choice_names_it(monkeypatch):
    _stub(monkeypatch, "megatron.bridge.diffusion.models.wan.wan_step", WanForwardStep=RecordingStep)
    _stub(monkeypatch, "megatron.bridge.training.gpt_step", forward_step=gpt_forward_step)
    step = workload.forward_step(workload.choose(Wan()))
    assert isinstance(step, RecordingStep) and step.kwargs == {"mode": workload.WAN_STEP_MODE}
    assert workload.forward_step(workload.choose(GPT())) is gpt_forward_step
    for choice in (workload.choose(Wan()), workload.choose(GPT())):  # the name recorded is the object used
        module, name = choice.step.rsplit(".", 1)
        assert sys.modules[module].__dict__[name] in (RecordingStep, gpt_forward_step)


# --------------------------------------------------------------------------- the mock data


def _recipe_dataset(**over):
    """The dataset section of tests/fixtures/recipes/yaml/wan_1_3b_text2image_pretrain_1gpu_h100_bf16.yaml."""
    import yaml

    data = yaml.safe_load((ROWS_CFG / "wan_1_3b_text2image_pretrain_1gpu_h100_bf16.yaml").read_text())["dataset"]
    assert data["_target_"].endswith("WanDatasetConfig")
    data.update(over)
    return SimpleNamespace(**{k: v for k, v in data.items() if not k.startswith("_")})


def test_mock_fields_take_the_recipes_shapes_and_run_without_worker_processes():
    ds = _recipe_dataset(F_latents=1, context_seq_len=256)
    got = workload.wan_mock_fields(ds, seq_length=9999, micro_batch_size=1, global_batch_size=2)
    assert got["F_latents"] == 1 and got["context_seq_len"] == 256  # the recipe's, not the class defaults
    assert got["seq_length"] == ds.seq_length == 4096  # the dataset's own, as WanDatasetConfig passes it on
    assert got["num_workers"] == workload.WAN_MOCK_WORKERS == 0 and ds.num_workers == 16
    assert (got["micro_batch_size"], got["global_batch_size"]) == (1, 2)
    assert set(got) == set(workload.WAN_MOCK_SHAPE_FIELDS) | set(workload.WAN_MOCK_RUN_FIELDS) | {
        "micro_batch_size",
        "global_batch_size",
        "num_workers",
    }


def test_a_dataset_without_wan_fields_gets_the_classes_defaults():
    got = workload.wan_mock_fields(SimpleNamespace(), seq_length=1024, micro_batch_size=2, global_batch_size=8)
    assert {k: got[k] for k in workload.WAN_MOCK_SHAPE_FIELDS} == workload.WAN_MOCK_DEFAULTS
    assert got["seq_length"] == 1024 and got["packing_buffer_size"] == workload.WAN_PACKING_BUFFER_DEFAULT


def test_latent_tokens_are_the_patchified_latents_of_every_packed_sample():
    fields = dict(workload.WAN_MOCK_DEFAULTS)
    assert workload.wan_latent_tokens(fields) == 24 * (104 // 2) * (60 // 2) == 37440
    fields.update(number_packed_samples=3, patch_temporal=2)
    assert workload.wan_latent_tokens(fields) == 3 * 12 * 52 * 30
    label = workload.wan_mock_label({**fields, "num_workers": 0})
    assert label.startswith("WanMockDataModuleConfig(F_latents=24,") and label.endswith("num_workers=0)")


# --------------------------------------------------------------------------- configure(): the settings row


def _engine_stubs(monkeypatch, made: list):
    class MockGPTDatasetConfig:  # STAND-IN: Bridge's GPT mock data config
        def __init__(self, **kw):
            self.kw = kw

    class WanMockDataModuleConfig:  # STAND-IN: records the fields it was built with
        def __init__(self, **kw):
            made.append(kw)
            self.__dict__.update(kw)

    cuda = SimpleNamespace(get_device_properties=lambda i: SimpleNamespace(total_memory=141 * 2**30))
    _stub(monkeypatch, "torch", cuda=cuda)
    _stub(monkeypatch, "megatron.bridge.training.config", MockGPTDatasetConfig=MockGPTDatasetConfig)
    _stub(
        monkeypatch,
        "megatron.bridge.diffusion.data.wan.wan_mock_datamodule",
        WanMockDataModuleConfig=WanMockDataModuleConfig,
    )


def _cfg(model, dataset):
    """A STAND-IN container with the sections configure() reads."""
    ns = SimpleNamespace
    return ns(
        model=model,
        dataset=dataset,
        train=ns(train_iters=10000, micro_batch_size=1, global_batch_size=2),
        validation=ns(eval_iters=32, eval_interval=2000),
        logger=ns(log_interval=10, tensorboard_dir="/tmp/tb"),
        checkpoint=ns(load="/x", save="/x", save_interval=2000, async_save=False),
        scheduler=ns(lr_warmup_iters=0, lr_decay_iters=None),
        tokenizer=ns(tokenizer_type="NullTokenizer"),
        ddp=ns(use_megatron_fsdp=True),
        comm_overlap=None,
        peft=None,
    )


def _args():
    return SimpleNamespace(
        overrides=[],
        strategy=None,
        model_preset=None,
        iters=2,
        seq_length=4096,
        world_size=1,
        perf_micro_batches=None,
        te_grad_accum_fusion=False,
        balanced_routing=False,
        moe_dispatcher=None,
        meta_init=False,
    )


def _model(cls):
    m = cls()
    m.seq_length, m.tensor_model_parallel_size, m.context_parallel_size = 4096, 1, 1
    return m


def test_configure_gives_a_wan_model_bridges_wan_mock_data_and_says_so(monkeypatch, tmp_path):
    from mfsdp_gpu import rehearse

    made: list = []
    _engine_stubs(monkeypatch, made)
    cfg = _cfg(_model(Wan), _recipe_dataset())
    settings, facts = rehearse.configure(_args(), cfg, 1_300_000_000, False, str(tmp_path), None)
    assert type(cfg.dataset).__name__ == "WanMockDataModuleConfig" and len(made) == 1
    assert made[0]["F_latents"] == 24 and made[0]["num_workers"] == 0 and made[0]["seq_length"] == 4096
    row = next(r for r in settings.rows if r["key"] == "dataset")
    assert row["category"] == "rehearsal" and row["was"] == "SimpleNamespace" and row["why"]
    assert row["value"] == workload.wan_mock_label(made[0])
    assert facts["workload"]["kind"] == "wan" and facts["workload"]["latent_tokens_per_micro_batch"] == 37440


def test_configure_leaves_a_gpt_model_on_the_gpt_mock_data_as_before(monkeypatch, tmp_path):
    from mfsdp_gpu import rehearse

    made: list = []
    _engine_stubs(monkeypatch, made)
    cfg = _cfg(_model(GPT), SimpleNamespace(blend=None))
    settings, facts = rehearse.configure(_args(), cfg, 8_000_000_000, False, str(tmp_path), None)
    assert made == [] and "workload" not in facts  # nothing of Wan's touched, nothing new recorded
    assert type(cfg.dataset).__name__ == "MockGPTDatasetConfig" and cfg.dataset.kw["seq_length"] == 4096
    row = next(r for r in settings.rows if r["key"] == "dataset")
    assert row == {
        "key": "dataset",
        "value": "MockGPTDatasetConfig(seq_length=4096)",
        "was": "SimpleNamespace",
        "category": "rehearsal",
        "why": "mock data: nothing is read or downloaded",
    }


def test_the_run_and_its_save_load_check_use_the_chosen_step():
    import inspect

    from mfsdp_gpu import rehearse

    src = inspect.getsource(rehearse.run_once)
    pick = "forward_step = workload.forward_step("
    assert src.index("from megatron.bridge.training.gpt_step import forward_step") < src.index(pick)
    assert src.index(pick) < src.index("train_measured(so, manager, meter, forward_step)")
    assert "save_load(a, holder, report, mem, forward_step," in src  # checkpoint.forward_only_loss gets it
    assert "checkpoint.forward_only_loss(forward_step, so" in inspect.getsource(rehearse.save_load)


# --------------------------------------------------------------------------- --perf


def test_perf_reports_no_token_rate_for_a_wan_job_and_says_why():
    ns = SimpleNamespace
    dataset = ns(**workload.WAN_MOCK_DEFAULTS)
    cfg = ns(model=_model(Wan), dataset=dataset, train=ns(global_batch_size=2, micro_batch_size=1), ddp=ns())
    clock = ns(records=[{"iteration": 2, "step_s": 1.5, "fwd_bwd_s": 1.2, "optimizer_s": 0.3}], warmup=1)
    recorder = ns(errors=[], patched=[], calls=0, overhead_s=0.0, log=lambda *a: {})
    so = ns(pg_collection=None, model=[])
    rec = perf.record(cfg, so, clock, recorder, 1, 0, {}, "NVIDIA H200", steps=[{"iteration": 2, "loss": 0.5}])
    assert rec["seq_length"] is None and "37440 latent tokens" in rec["tokens_why"]
    summary = perf_report.summarize(rec)
    assert summary["available"] and summary["tokens_per_s_per_gpu"] is None
    assert summary["tokens_why"] == rec["tokens_why"]
    assert any("tokens/s/GPU - (not reported for a diffusion model" in line for line in perf_report.render(summary))
    cfg.model = _model(GPT)
    gpt = perf.record(cfg, so, clock, recorder, 1, 0, {}, "NVIDIA H200", steps=[{"iteration": 2, "loss": 0.5}])
    assert gpt["seq_length"] == 4096 and "tokens_why" not in gpt  # a GPT record is what it was
    assert perf_report.summarize(gpt)["tokens_per_s_per_gpu"] == pytest.approx(2 * 4096 / 1.5)
    assert "tokens_why" not in perf_report.summarize(gpt)


# --------------------------------------------------------------------------- pinned against the real wheel


def _class(src: Path, name: str) -> ast.ClassDef:
    tree = ast.parse(src.read_text())
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    assert found, f"{name} not in {src}"
    return found[0]


def _fields(cls: ast.ClassDef) -> dict:
    """Annotated fields of a dataclass: name -> default (a literal) or ``...`` when required."""
    out = {}
    for n in cls.body:
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out[n.target.id] = ast.literal_eval(n.value) if n.value is not None else ...
    return out


def _path(root: Path, dotted_module: str) -> Path:
    return root / (dotted_module.replace(".", "/") + ".py")


def test_the_vision_field_is_the_one_bridges_vision_language_providers_declare(bridge_src):
    for module, name in (
        ("megatron.bridge.models.qwen_vl.qwen3_vl_provider", "Qwen3VLModelProvider"),
        ("megatron.bridge.models.qwen_vl.qwen35_vl_provider", "Qwen35VLModelProvider"),
        ("megatron.bridge.models.gemma_vl.gemma3_vl_provider", "Gemma3VLModelProvider"),
    ):
        assert workload.VISION_FIELD in _fields_named(_class(_path(bridge_src, module), name)), name


def _fields_named(cls: ast.ClassDef) -> set[str]:
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def test_the_names_relied_on_are_bridges(bridge_src):
    for dotted in (workload.WAN_PROVIDER, workload.WAN_STEP, workload.WAN_MOCK_DATA):
        module, name = dotted.rsplit(".", 1)
        _class(_path(bridge_src, module), name)
    gpt_module, gpt_name = workload.GPT_STEP.rsplit(".", 1)
    tree = ast.parse(_path(bridge_src, gpt_module).read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == gpt_name for n in tree.body)


def test_the_wan_step_mode_is_its_default_and_only_picks_the_timestep_sampling(bridge_src):
    src = _path(bridge_src, workload.WAN_STEP.rsplit(".", 1)[0])
    init = next(
        n for n in _class(src, "WanForwardStep").body if isinstance(n, ast.FunctionDef) and n.name == "__init__"
    )
    with_default = [a.arg for a in init.args.args][-len(init.args.defaults) :]
    defaults = dict(zip(with_default, (ast.literal_eval(d) for d in init.args.defaults), strict=True))
    assert defaults["mode"] == workload.WAN_STEP_MODE
    tree = ast.parse(src.read_text())
    table = next(
        n for n in tree.body if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", None) == "_WAN_MODE_DEFAULTS"
    )
    keys = [ast.literal_eval(k) for k in table.value.keys]
    assert workload.WAN_STEP_MODE in keys
    for call in table.value.values:  # each mode sets only sampling parameters: nothing that sizes a tensor
        assert {kw.arg for kw in call.keywords} <= {"timestep_sampling", "logit_std", "flow_shift", "mix_uniform_ratio"}


def test_the_mock_data_fields_and_defaults_are_bridges(bridge_src):
    mock = _fields(_class(_path(bridge_src, workload.WAN_MOCK_DATA.rsplit(".", 1)[0]), "WanMockDataModuleConfig"))
    built = workload.wan_mock_fields(SimpleNamespace(), seq_length=1, micro_batch_size=1, global_batch_size=1)
    assert set(built) <= set(mock)  # every keyword the engine passes is a field
    assert {k for k, v in mock.items() if v is ...} <= set(built)  # and every required field is passed
    assert {k: mock[k] for k in workload.WAN_MOCK_SHAPE_FIELDS} == workload.WAN_MOCK_DEFAULTS
    energon = _path(bridge_src, "megatron.bridge.diffusion.data.wan.wan_energon_datamodule")
    recipe_cfg = _fields(_class(energon, "WanDatasetConfig"))
    assert recipe_cfg["packing_buffer_size"] == workload.WAN_PACKING_BUFFER_DEFAULT
    assert set(workload.WAN_MOCK_SHAPE_FIELDS) | set(workload.WAN_MOCK_RUN_FIELDS) <= set(recipe_cfg)
    # without a path, WanDatasetConfig builds the same mock config the engine builds
    assert "WanMockDataModuleConfig(" in energon.read_text() and "_is_empty_path(self.path)" in energon.read_text()


def test_the_mock_batch_ignores_the_samples_and_packs_patchified_latents(bridge_src):
    text = _path(bridge_src, workload.WAN_MOCK_DATA.rsplit(".", 1)[0]).read_text()
    assert "def _collate_ignore_samples(_samples, **kwargs):\n" in text and "return mock_batch(**kwargs)" in text
    for line in (
        "video_latent.shape[1] // patch_temporal,",
        "video_latent.shape[2] // patch_spatial,",
        "video_latent.shape[3] // patch_spatial,",
        "video_latents_packed = [video_latent for _ in range(number_packed_samples)]",
    ):
        assert line in text, line
    provider = _path(bridge_src, workload.WAN_PROVIDER.rsplit(".", 1)[0]).read_text()
    assert "unused for images/videos" in provider  # model.seq_length: why --perf makes no token rate


# --------------------------------------------------------------------------- --perf: Bridge's Wan FLOPs


def test_the_flops_sums_of_a_mock_step_are_those_of_its_packs():
    fields = dict(workload.WAN_MOCK_DEFAULTS)
    got = workload.wan_flops_stats(fields, global_batch_size=2, micro_batch_size=1)
    q, k = 37440, 512
    assert got == {
        "seqlen_sum": 2 * q,
        "seqlen_squared_sum": 2 * q * q,  # attention is per sample: Σ q², not (Σ q)²
        "cross_seqlen_sum": 2 * k,
        "cross_seqlen_product_sum": 2 * q * k,
    }
    fields["number_packed_samples"] = 3  # three samples per pack, one pack per micro-batch of any size
    got = workload.wan_flops_stats(fields, global_batch_size=8, micro_batch_size=2)
    assert got["seqlen_sum"] == 4 * 3 * q and got["seqlen_squared_sum"] == 4 * 3 * q * q
    assert got["cross_seqlen_product_sum"] == 4 * 3 * q * k


def test_perf_gives_bridges_flops_function_the_wan_sums_and_the_gpt_call_is_unchanged(monkeypatch):
    calls = []

    def num_floating_point_operations(cfg, batch_size=1, **kw):  # STAND-IN: records its arguments
        calls.append({"batch_size": batch_size, **kw})
        return 1e15

    _stub(
        monkeypatch,
        "megatron.bridge.training.utils.flop_utils",
        num_floating_point_operations=num_floating_point_operations,
    )
    ns = SimpleNamespace
    cfg = ns(
        model=_model(Wan), dataset=ns(**workload.WAN_MOCK_DEFAULTS), train=ns(global_batch_size=2, micro_batch_size=1)
    )
    assert perf.model_flops(cfg) == (1e15, None)
    clock = ns(records=[{"iteration": 2, "step_s": 1.5}], warmup=1)
    recorder = ns(errors=[], patched=[], calls=0, overhead_s=0.0, log=lambda *a: {})
    rec = perf.record(cfg, ns(pg_collection=None, model=[]), clock, recorder, 1, 0, {}, "NVIDIA H200")
    assert rec["model_flops_per_step"] == 1e15 and rec["flops_source"].endswith("sequence sums (Wan)")
    assert calls[-1] == {"batch_size": 2, **workload.wan_flops_stats(workload.WAN_MOCK_DEFAULTS, 2, 1)}
    cfg.model = _model(GPT)
    perf.model_flops(cfg)
    assert calls[-1] == {"batch_size": 2}


def test_the_flops_sums_mean_what_bridge_accumulates(bridge_src):
    """Per micro-batch Bridge adds mbs x the pack's length, Σ q² from cu_seqlens and, for cross-attention,
    Σ k and Σ q·k; a Wan pack is [1, n·q] after the step's transpose; the sums are taken over data parallel."""
    flop = (bridge_src / "megatron/bridge/training/utils/flop_utils.py").read_text()
    for line in (
        '_add_flops_accumulator(state, "_flops_seqlen_sum", mbs * tensor_seq_len)',
        '_add_flops_accumulator(state, "_flops_seqlen_sq_sum", _scalar_sum_for_accumulator(sub_seq_lens.long() ** 2))',
        "_scalar_sum_for_accumulator(sub_seq_lens * cross_sub_seq_lens)",
        "seqlen_sum = local_seqlen_sum * data_parallel_size",
    ):
        assert line in flop, line
    tree = ast.parse(flop)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "num_floating_point_operations")
    params = {a.arg for a in fn.args.args}
    assert set(workload.wan_flops_stats(workload.WAN_MOCK_DEFAULTS, 1, 1)) <= params
    step = _path(bridge_src, workload.WAN_STEP.rsplit(".", 1)[0]).read_text()
    assert 'batch["video_latents"] = batch["video_latents"].transpose(0, 1)' in step
    assert "cu_seqlens=self_attention.cu_seqlens_q_padded," in step
    mock = _path(bridge_src, workload.WAN_MOCK_DATA.rsplit(".", 1)[0]).read_text()
    assert "video_latents=video_latents_packed.unsqueeze(1)," in mock  # [n·q, 1, C]: one pack per micro-batch
