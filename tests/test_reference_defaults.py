"""Every default that SKILL.md and references/ state for a DDP-config field, and the tuning numbers they
quote from Bridge's perf recipes and overlap code, read from the pinned wheels' source with ``ast``.

A default the text states is a claim about megatron-core's ``DistributedDataParallelConfig`` (Bridge's
subclass inherits the fields); when a release changes one, this test names the doc and the field.
"""

from __future__ import annotations

import ast
import re

import pytest

from _helpers_skill import read

MC_DDP = "megatron/core/distributed/distributed_data_parallel_config.py"
B_CFG = "megatron/bridge/training/config.py"
LLAMA_FSDP = ("megatron/bridge/perf_recipes/llama/b200/llama3.py", "llama3_70b_pretrain_64gpu_b200_fp8cs_config")
ULTRA_HSDP = ("megatron/bridge/perf_recipes/nemotronh/common.py", "_apply_nemotron_3_ultra_fsdp_hsdp")

# (doc, field, default as the doc writes it, the exact text the doc states it in). The tuning table's
# rows are read from the table itself (test_tuning_table_defaults_match_the_source).
STATED = [
    ("references/families.md", "keep_fp8_transpose_cache", "false", "`ddp.keep_fp8_transpose_cache` (default `false`)"),
    ("references/memory.md", "fsdp_all_gather_in_start_param_sync", "true", "`ddp.fsdp_all_gather_in_start_param_sync`, default\n  True"),
    ("references/troubleshooting.md", "overlap_grad_reduce", "false", "`overlap_grad_reduce=False` (megatron-core's\n  default"),
    ("SKILL.md", "data_parallel_sharding_strategy", "no_shard", "| `no_shard` (default) |"),
]  # fmt: skip


def _class(tree: ast.AST, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _defaults(text: str, cls: str) -> dict[str, str]:
    """Field -> default as the docs write it (false/true/null/number/name/dotted name)."""
    out = {}
    for item in _class(ast.parse(text), cls).body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
            v = item.value
            if isinstance(v, ast.Constant):
                val = v.value
                out[item.target.id] = "null" if val is None else str(val).lower() if isinstance(val, bool) else str(val)
            else:
                out[item.target.id] = ast.unparse(v)
    return out


@pytest.fixture(scope="module")
def ddp_defaults(mcore_src, bridge_src) -> dict[str, str]:
    core = _defaults((mcore_src / MC_DDP).read_text(), "DistributedDataParallelConfig")
    # Bridge's subclass may redefine a field; what Bridge users get is its value then.
    core.update(_defaults((bridge_src / B_CFG).read_text(), "DistributedDataParallelConfig"))
    return core


def _tuning_rows() -> list[tuple[str, str]]:
    return re.findall(r"^\| `ddp\.(\w+)` \| `([^`]+)` \|", read("references/tuning.md"), re.M)


def test_tuning_table_lists_the_knobs_the_issue_names():
    fields = {f for f, _ in _tuning_rows()}
    assert {
        "fsdp_double_buffer",
        "suggested_communication_unit_size",
        "nccl_ub",
        "num_distributed_optimizer_instances",
        "outer_dp_sharding_strategy",
        "megatron_fsdp_grad_comm_dtype",
        "keep_fp8_transpose_cache",
        "check_for_nan_in_grad",
        "megatron_fsdp_enable_fine_grained_param_gather",
        "fsdp_db_use_persist_buf_on_alloc_fail",
    } <= fields


@pytest.mark.parametrize("field,stated", _tuning_rows())
def test_tuning_table_defaults_match_the_source(ddp_defaults, field, stated):
    assert field in ddp_defaults, f"tuning.md: no DistributedDataParallelConfig.{field} in megatron-core"
    assert ddp_defaults[field] == stated, f"tuning.md says {field} defaults to {stated}, source: {ddp_defaults[field]}"


@pytest.mark.parametrize("doc,field,stated,text", STATED, ids=[f"{d}:{f}" for d, f, _, _ in STATED])
def test_defaults_stated_in_prose_match_the_source(ddp_defaults, doc, field, stated, text):
    assert text in read(doc), f"{doc} no longer says {text!r}: update this table"
    assert ddp_defaults[field] == stated


def _assignments(text: str, fn: str) -> dict[str, str]:
    """``target -> value`` source of every assignment in function ``fn`` (dict displays flattened)."""
    tree = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == fn)
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                out[ast.unparse(t)] = ast.unparse(node.value)
                if isinstance(node.value, ast.Dict):
                    for k, v in zip(node.value.keys, node.value.values, strict=True):
                        if isinstance(k, ast.Constant):
                            out[f"{ast.unparse(t)}[{k.value!s}]"] = ast.unparse(v)
    return out


def test_perf_recipe_values_quoted_in_tuning_md(bridge_src):
    doc = read("references/tuning.md")
    llama = _assignments((bridge_src / LLAMA_FSDP[0]).read_text(), LLAMA_FSDP[1])
    assert llama["cfg.ddp.fsdp_double_buffer"] == "True" and "| `true` (Llama 3 70B) |" in doc
    assert llama["cfg.ddp.suggested_communication_unit_size"] == "800000000" and "`800000000` (Llama 3 70B)" in doc
    assert llama["cfg.ddp.keep_fp8_transpose_cache"] == "False"
    assert llama["cfg.env_vars[CUDA_DEVICE_MAX_CONNECTIONS]"] == "32" and "| `32` via `env_vars` |" in doc
    ultra_text = (bridge_src / ULTRA_HSDP[0]).read_text()
    ultra = _assignments(ultra_text, ULTRA_HSDP[1])
    assert ultra["cfg.ddp.outer_dp_sharding_strategy"] == "'optim' if num_optim_instances > 1 else 'no_shard'"
    assert ultra["cfg.ddp.megatron_fsdp_grad_comm_dtype"] == "torch.bfloat16"
    assert "_GB300_NVLINK_DOMAIN_GPUS = 64" in ultra_text and "GPUs / 64" in doc


def test_unit_size_floor_and_comm_overlap_bucket_quoted_in_the_docs(mcore_src, bridge_src):
    mfsdp = (mcore_src / "megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py").read_text()
    fn = next(
        n
        for n in ast.walk(ast.parse(mfsdp))
        if isinstance(n, ast.FunctionDef) and n.name == "_init_fsdp_param_and_grad_buffer"
    )
    body = ast.unparse(fn)
    # The floor sits inside `if suggested_communication_unit_size is None:`: an explicit value skips it.
    floor = next(
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.If) and ast.unparse(n.test) == "suggested_communication_unit_size is None"
    )
    assert "max(1000000000, suggested_communication_unit_size)" in ast.unparse(floor)
    assert "self.suggested_AG_prefetch_size = suggested_communication_unit_size // 2" in body
    assert "floored at 1e9" in read("references/tuning.md")
    co = (bridge_src / "megatron/bridge/training/comm_overlap.py").read_text()
    assert "comm_overlap_cfg.bucket_size = 128 * 1024 * 1024" in co
    for doc in ("references/tuning.md", "references/memory.md"):
        assert "128 Mi" in read(doc), doc


def test_megatron_fsdp_forces_overlap_and_ignores_grad_reduce_in_fp32(mcore_src):
    """tuning.md / troubleshooting: overlap is forced on; grad_reduce_in_fp32 is never read by Megatron FSDP."""
    root = mcore_src / "megatron/core/distributed/fsdp"
    src = (root / "src/megatron_fsdp/megatron_fsdp.py").read_text()
    assert "self.ddp_config.overlap_param_gather = True" in src
    assert "self.ddp_config.overlap_grad_reduce = True" in src
    texts = [p.read_text() for p in root.rglob("*.py")]
    assert not any("grad_reduce_in_fp32" in t for t in texts)
    assert "grad_reduce_in_fp32` is ignored" in read("SKILL.md")


# --------------------------------------------------------------------------- performance behaviour the text states


def _fn_source(text: str, name: str) -> str:
    """The function's source as ``ast.unparse`` prints it, whitespace runs folded to one space."""
    fn = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == name)
    return _flat(ast.unparse(fn))


def _flat(text: str) -> str:
    return " ".join(text.split())


MFSDP = "megatron/core/distributed/fsdp/src/megatron_fsdp"


def test_overlap_is_read_at_wrap_before_megatron_fsdp_forces_it(mcore_src, bridge_src):
    """tuning.md / memory.md / troubleshooting: overlap off at wrap time -> one bucket; units only under
    optim_grads_params; the LLM recipes ship overlap on, the VLM ones off."""
    wrap = _fn_source((mcore_src / "megatron/training/models/dist_utils.py").read_text(), "_ddp_wrap")
    assert "if not ddp_config.overlap_grad_reduce: ddp_config.bucket_size = None" in wrap
    assert "max(40000000, 1000000 * pg_collection.dp_cp.size())" in wrap
    adapter = (mcore_src / "megatron/core/distributed/fsdp/mcore_fsdp_adapter.py").read_text()
    assert (
        "if self.ddp_config.data_parallel_sharding_strategy == 'optim_grads_params': "
        "self.fsdp_unit_modules = [TransformerLayer, MoETransformerLayer, MambaLayer] "
        "else: self.fsdp_unit_modules = []"
    ) in _flat(ast.unparse(ast.parse(adapter)))
    common = (bridge_src / "megatron/bridge/recipes/common.py").read_text()
    assert "overlap_grad_reduce=True" in _fn_source(common, "_pretrain_common")
    for fn in ("_sft_common_vlm", "_peft_common_vlm"):
        assert "overlap_grad_reduce=False" in _fn_source(common, fn)
    tuning = read("references/tuning.md")
    assert "`_sft_common_vlm`, `_peft_common_vlm`" in tuning and "`_pretrain_common`" in tuning


def test_double_buffer_costs_prefetch_and_exists_only_with_units(mcore_src):
    buf = (mcore_src / MFSDP / "param_and_grad_buffer.py").read_text()
    assert "if self.ddp_config.fsdp_double_buffer and len(self.bucketing_policy.fsdp_unit_modules) > 0:" in _flat(buf)
    skip = _fn_source(buf, "all_gather_params")
    assert "if len(double_buf_units) > 2:" in skip and "suggested_AG_prefetch_size = 500000000" in skip
    assert "_is_two_bucket_group_equal" in buf
    tuning = read("references/tuning.md")
    assert "`need_skip_prefetch`" in tuning and "about three Llama 3 8B" in tuning
    # the Llama 3 8B layer the text counts: 218 M parameters, so 5e8 elements of prefetch reach a third layer
    h, ffn, q, kv = 4096, 14336, 4096, 1024
    layer = h * (q + 2 * kv) + q * h + 3 * h * ffn + 2 * h
    assert round(layer / 1e6) == 218 and 2 * layer < 5e8 <= 3 * layer


def test_keep_fp8_transpose_cache_is_read_on_optim_grads_params_paths_only(mcore_src):
    src = (mcore_src / MFSDP / "megatron_fsdp.py").read_text()
    assert "We only need to remove the transpose cache in parameter # sharding strategy." in _flat(src)
    hooks = _fn_source(src, "_register_fsdp_hooks")
    assert (
        "not self.ddp_config.keep_fp8_transpose_cache and self.data_parallel_sharding_strategy == 'optim_grads_params'"
        in hooks
    )
    assert "read only under `optim_grads_params`" in read("references/tuning.md")


def test_what_megatron_lm_sets_up_and_bridge_does_not(mcore_src, bridge_src):
    training = (mcore_src / "megatron/training/training.py").read_text()
    assert "create_all_gather_groups(" in training and "pg_collection.dp_cp_ag = dp_cp_ag" in training
    buf = (mcore_src / MFSDP / "param_and_grad_buffer.py").read_text()
    assert "This avoids head-of-line blocking" in buf
    bridge_py = [p.read_text() for p in (bridge_src / "megatron/bridge").rglob("*.py")]
    assert not any("create_all_gather_groups" in t or "dp_cp_ag" in t for t in bridge_py)
    args = (mcore_src / "megatron/training/arguments.py").read_text()
    assert "Setting FSDP communication groups for high priority streams for Blackwell and later architectures" in args
    common_cfg = (mcore_src / "megatron/training/config/common_config.py").read_text()
    assert "high_priority_stream_groups: list[str] | None = field(default_factory=list)" in common_cfg
    assert (
        "high_priority_stream_groups=dist_config.high_priority_stream_groups"
        in (bridge_src / "megatron/bridge/training/initialize.py").read_text()
    )
    assert "`dist.high_priority_stream_groups=[dp_cp]`" in read("references/tuning.md")


def test_environment_is_applied_first_in_runtime_config_update(bridge_src):
    cfg = (bridge_src / B_CFG).read_text()
    body = _fn_source(cfg, "runtime_config_update").split('"""')[-1]
    assert body.strip().startswith("apply_environment_variables(cfg)")
    assert "os.environ.setdefault(name, str(value))" in _fn_source(cfg, "apply_environment_variables")


def test_gradient_accumulation_fusion_sources_quoted_in_tuning_md(bridge_src, mcore_src):
    ultra = (bridge_src / ULTRA_HSDP[0]).read_text()
    assert "# incompatible with BF16 FSDP main grads cfg.model.gradient_accumulation_fusion = False" in _flat(ultra)
    assert _assignments(ultra, ULTRA_HSDP[1])["cfg.ddp.megatron_fsdp_main_grads_dtype"] == "torch.bfloat16"
    llama70 = _assignments((bridge_src / LLAMA_FSDP[0]).read_text(), LLAMA_FSDP[1])
    assert llama70["cfg.model.gradient_accumulation_fusion"] == "False"
    b300 = _assignments(
        (bridge_src / "megatron/bridge/perf_recipes/llama/b300/llama31.py").read_text(),
        "llama31_405b_pretrain_128gpu_b300_bf16_config",
    )
    assert b300["cfg.model.gradient_accumulation_fusion"] == "True" and b300["cfg.ddp.use_megatron_fsdp"] == "True"
    assert "megatron_fsdp_main_grads_dtype" not in str(b300)
    adapter = (mcore_src / "megatron/core/distributed/fsdp/mcore_fsdp_adapter.py").read_text()
    assert "Megatron-FSDP with gradient_accumulation_fusion requires " in adapter
    assert "`llama31_405b_pretrain_128gpu_b300_bf16_config`" in read("references/tuning.md")


def test_recipe_dtypes_and_nccl_ub_quoted(bridge_src):
    nano = _assignments(
        (bridge_src / "megatron/bridge/recipes/nemotronh/gb200/nemotron_3_nano.py").read_text(),
        next(
            n.name
            for n in ast.walk(
                ast.parse((bridge_src / "megatron/bridge/recipes/nemotronh/gb200/nemotron_3_nano.py").read_text())
            )
            if isinstance(n, ast.FunctionDef)
            and "megatron_fsdp_grad_comm_dtype" in ast.unparse(n)
            and "megatron_fsdp_main_grads_dtype" in ast.unparse(n)
        ),
    )
    assert nano["cfg.ddp.megatron_fsdp_main_grads_dtype"] == "torch.float32"
    assert nano["cfg.ddp.megatron_fsdp_grad_comm_dtype"] == "torch.bfloat16"
    assert "`torch.float32` (Nemotron 3 Nano)" in read("references/tuning.md")
    gpt_oss = (bridge_src / "megatron/bridge/perf_recipes/gpt_oss/common.py").read_text()
    assert "cfg.ddp.nccl_ub = True" in gpt_oss and "use_megatron_fsdp" not in gpt_oss
    gb300 = _assignments(
        (bridge_src / "megatron/bridge/perf_recipes/llama/gb300/llama3.py").read_text(),
        "llama3_70b_pretrain_64gpu_gb300_bf16_config",
    )
    assert gb300["cfg.ddp.nccl_ub"] == "True" and gb300["cfg.ddp.use_megatron_fsdp"] == "True"
    assert "GPT-OSS sets it without Megatron FSDP" in read("references/tuning.md")


def test_async_save_check_at_construction_quoted(mcore_src):
    text = (mcore_src / "megatron/training/config/training_config.py").read_text()
    post = _fn_source(text, "__post_init__")
    assert "A compatible nvidia-resiliency-ext installation is required to enable " in text
    assert "async_strategy: Literal['nvrx', 'mcore'] = 'nvrx'" in ast.unparse(ast.parse(text))
    assert "self.async_strategy == 'nvrx' and (self.ckpt_format in ['torch_dcp', 'fsdp_dtensor'])" in post
    assert 'default `async_strategy="nvrx"`' in read("references/checkpoints.md")


def test_upstream_defect_5974_is_still_in_the_pinned_megatron_fsdp(mcore_src):
    """troubleshooting.md: #5976's fix (reset the step counters after the synthetic step) is not in 0.19.2."""
    fn = _fn_source((mcore_src / MFSDP / "fully_shard.py").read_text(), "fully_shard_optimizer")
    assert "optimizer.step()" in fn and "'step'" not in fn and '"step"' not in fn
    assert "(fixed upstream by #5976, not in these pins)" in read("references/troubleshooting.md")


def test_parameter_group_map_needed_and_bridge_cannot_dump_it(mcore_src, bridge_src):
    opt = (mcore_src / "megatron/core/optimizer/__init__.py").read_text()
    assert "ParamGroupOverride(wd_mult=0.0)" in _fn_source(opt, "get_standard_config_overrides")
    assert "dump_param_to_param_group_map" in _fn_source(opt, "get_megatron_optimizer")
    setup = _fn_source((bridge_src / "megatron/bridge/training/optim.py").read_text(), "setup_optimizer")
    assert "get_megatron_optimizer(" in setup and "dump_param_to_param_group_map" not in setup
    assert "get_standard_config_overrides(config=context.optimizer_config)" in (bridge_src / B_CFG).read_text()


def test_bucket_padding_stated_in_perf_md(mcore_src):
    """perf.md: distributed optimizer buckets pad to lcm(N, 128); Megatron FSDP's to N x the row width (Llama 3 8B:
    lcm(14336, 4096) = 28672 elements, up to 3.7 MB of bf16 per bucket at N = 64)."""
    import math

    layout = (mcore_src / "megatron/core/optimizer/param_layout.py").read_text()
    assert "return math.lcm(data_parallel_world_size, 128)" in _flat(layout)
    buf = (mcore_src / MFSDP / "param_and_grad_buffer.py").read_text()
    assert "return _pad(data_index, data_parallel_world_size * chunk_size_factor)" in _flat(buf)
    assert "lcm_chunk_size_factor = math.lcm(chunk_size_factor, param_shape[1:].numel())" in _flat(buf)
    row = math.lcm(14336, 4096)
    assert row == 28672 and f"{64 * row * 2 / 1e6:.1f}" == "3.7" and f"{64 * row * 2 / 2e6:.1f}" == "1.8"
    perf = read("references/perf.md")
    assert (
        "lcm(N, 128)" in perf and "lcm 28672" in perf and "up to 3.7 MB of bf16 per bucket, 1.8 MB on average" in perf
    )
    assert "at least 1e9" in perf
