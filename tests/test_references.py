"""references/ and the skill's other markdown: every relative link resolves, long
files have a working table of contents, and the facts the references state that are
not anchors (format lists, recipe defaults, the FSDP2 wrap path) match the real
pinned source."""

from __future__ import annotations

import ast
import re

import pytest
import yaml

from _helpers_skill import ROOT, headings, read, relative_links

MY_REFERENCES = [
    "background.md",
    "checkpoints.md",
    "fsdp2.md",
    "perf.md",
    "rehearse.md",
    "smoke-test.md",
    "troubleshooting.md",
    "tuning.md",
]
DOCS = ["SKILL.md", "skill-card.md", *[f"references/{n}" for n in MY_REFERENCES]]
TOC_OVER_LINES = 60  # "a short table of contents when long"
LINKS = [(doc, link) for doc in DOCS for link in relative_links(read(doc))]


@pytest.mark.parametrize("doc,link", LINKS, ids=[f"{d}->{link}" for d, link in LINKS])
def test_relative_link_resolves(doc, link):
    path, _, frag = link.partition("#")
    target = (ROOT / doc).parent / path if path else ROOT / doc
    rel = target.resolve().relative_to(ROOT.resolve()).as_posix()
    assert target.exists(), f"{doc}: link to missing {link}"
    if frag and target.is_file():
        assert frag in headings(target.read_text()), f"{doc}: no heading #{frag} in {rel}"


def test_skill_md_routes_to_every_reference():
    links = {link.split("#")[0] for link in relative_links(read("SKILL.md"))}
    for name in MY_REFERENCES + ["rules.md", "memory.md"]:
        assert f"references/{name}" in links, f"SKILL.md never says when to read references/{name}"


@pytest.mark.parametrize("name", MY_REFERENCES)
def test_long_reference_has_a_working_table_of_contents(name):
    text = read(f"references/{name}")
    if text.count("\n") <= TOC_OVER_LINES:
        return
    toc = re.findall(r"^- \[[^\]]+\]\(#([^)]+)\)$", text, re.M)
    assert len(toc) >= 3, f"{name} is long and has no table of contents"
    assert set(toc) <= headings(text), f"{name}: TOC entries without headings: {set(toc) - headings(text)}"


def _class_field_default(text: str, cls: str, field: str):
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and getattr(item.target, "id", None) == field:
                    return item
    raise AssertionError(f"{cls}.{field} not found")


def test_checkpoint_format_list_matches_megatron_core(mcore_src):
    node = _class_field_default(
        (mcore_src / "megatron/training/config/training_config.py").read_text(), "CheckpointConfig", "ckpt_format"
    )
    literal = [e.value for e in node.annotation.slice.elts]  # Literal["torch", ...]
    default = node.value.value
    doc = read("references/checkpoints.md")
    listed = re.search(r"takes one of (.+?)\n\(", doc, re.S).group(1)
    assert re.findall(r"`(\w+)`", listed) == literal
    assert f"Default: `{default}`" in doc


def test_recipes_default_to_torch_dist_with_save_and_load(bridge_src):
    """SKILL.md's first pitfall: recipes save/load torch_dist, so FSDP alone fails validation."""
    tree = ast.parse((bridge_src / "megatron/bridge/recipes/common.py").read_text())
    formats, ckpt_calls = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "CheckpointConfig":
            kw = {k.arg for k in node.keywords}
            ckpt_calls.append(kw)
            formats |= {k.value.value for k in node.keywords if k.arg == "ckpt_format"}
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "cfg.checkpoint.ckpt_format":
            formats.add(node.value.value)
    assert formats == {"torch_dist"}
    assert ckpt_calls and all({"save", "load", "ckpt_format"} <= kw for kw in ckpt_calls)


def test_real_recipe_dump_shows_the_same_defaults(tests_dir):
    cfg = yaml.safe_load((tests_dir / "fixtures/bridge-0.6.2-recipes/llama3_8b_pretrain_default.yaml").read_text())
    assert cfg["checkpoint"]["ckpt_format"] == "torch_dist"
    assert cfg["checkpoint"]["save"] and cfg["checkpoint"]["load"]
    assert cfg["ddp"]["use_megatron_fsdp"] is False and cfg["ddp"]["data_parallel_sharding_strategy"] == "no_shard"


def test_fsdp2_wrap_path_no_longer_passes_pg_collection(mcore_src):
    """fsdp2.md: in megatron-core 0.19.2, _ddp_wrap gives pg_collection only to non-FSDP2 wrappers."""
    text = (mcore_src / "megatron/training/models/dist_utils.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == "_ddp_wrap")
    guarded = [
        n
        for n in ast.walk(fn)
        if isinstance(n, ast.If)
        and ast.unparse(n.test) == "not use_torch_fsdp2"
        and "dp_init_kwargs['pg_collection'] = pg_collection" in ast.unparse(n)
    ]
    assert guarded, "pg_collection is passed to FSDP2 again: update references/fsdp2.md and card.yaml"
    # And TorchFullyShardedDataParallel still takes no pg_collection argument.
    tfsdp = (mcore_src / "megatron/core/distributed/torch_fully_sharded_data_parallel.py").read_text()
    init = next(n for n in ast.walk(ast.parse(tfsdp)) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert "pg_collection" not in [a.arg for a in init.args.args]


def test_sharding_strategies_table_matches_megatron_fsdp(mcore_src):
    text = (mcore_src / "megatron/core/distributed/fsdp/src/megatron_fsdp/fully_shard.py").read_text()
    enum = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef) and n.name == "ShardingStrategy")
    names = [t.id.lower() for n in enum.body if isinstance(n, ast.Assign) for t in n.targets]
    table = re.findall(r"^\| `(\w+)`(?: \(default\))? \|", read("SKILL.md"), re.M)
    assert table == names


def test_bytes_per_parameter_match_megatron_estimator(mcore_src):
    text = (mcore_src / "megatron/training/theoretical_memory_usage.py").read_text()
    assert "return 18 if not args.use_distributed_optimizer else 6 + (12 / data_parallel_size)" in text
    skill = read("SKILL.md")
    assert "18 bytes/parameter" in skill and "`6 + 12/DP`" in skill


def test_coverage_is_stated_in_readme_help_and_rule_reference(root, cli):
    """README, `check --help` and the rule reference say which families are covered and which are not."""
    from mfsdp_lib import rules

    readme = (root / "README.md").read_text(encoding="utf-8")
    ref = (root / "references" / "rules.md").read_text(encoding="utf-8")
    families = (root / "references" / "families.md").read_text(encoding="utf-8")
    help_text = " ".join(cli("check", "--help").stdout.split())
    for item in rules.NOT_COVERED:
        assert " ".join(item.split()) in help_text
        assert item in ref
    for word in ("FP4", "Megatron-MIMO", "FLUX", "T5", "PEFT", "pipeline parallelism", "MoE", "hybrid Mamba", "MLA"):
        assert word in " ".join(readme.split()), word
        assert word in " ".join(families.split()), word
    assert "references/families.md" in readme and "(families.md)" in ref


def test_conversion_evidence_table_states_the_recorded_results():
    """checkpoints.md's results table says 'passes' for each path that passed in the recorded run, with
    its recorded difference, and names each failing installed route with its recorded error."""
    import json

    doc = read("references/checkpoints.md")
    table = doc[doc.index("## Conversion evidence") :]
    rows = json.loads((ROOT / "benchmarks" / "results" / "ckpt_migration_1xh200.json").read_text())["rows"]
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]
    for r in rows:
        if r["via"] != "convert":
            continue
        line = next(ln for ln in lines if ln.startswith(f"| {r['from']} → {r['to']}") and "**passes**" in ln)
        assert r["passed"], r
        if "logits" in r["check"]:
            assert f"{100 * r['difference']:.2f} %" in line, (line, r["difference"])
    table_words = [" ".join(re.findall(r"[A-Za-z0-9_]+", ln)) for ln in lines]
    for r in rows:
        if r["via"] == "upstream" and r.get("error"):
            words = re.findall(r"[A-Za-z0-9_]+", r["error"].split(":", 1)[1])
            runs = {" ".join(words[i : i + 4]) for i in range(max(len(words) - 3, 1))}
            assert any(run in tw for run in runs for tw in table_words), r["error"][:200]
