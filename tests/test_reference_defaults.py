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
