"""CPU tests of the recipe-corpus generator: everything in it that does not need Megatron-Bridge.

The generator itself runs on a CUDA machine with Bridge. Here we test its pure parts (offline hub-cache layout,
path rewriting, world sizes, argument handling, change detection) and its process management end to end: the
last test runs the real orchestrator and workers against a small stand-in for ``megatron.bridge`` (labelled as
such: Bridge cannot be imported without CUDA and Transformer Engine) whose recipes succeed, fail, hang, block
the alarm signal, kill their worker or fail to import, so a crash costs one recipe (or family) and never the run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
GEN = HERE / "gen_corpus.py"
HF = HERE / "hf_configs"

spec = importlib.util.spec_from_file_location("gen_corpus", GEN)
assert spec is not None and spec.loader is not None
gc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gc)


# --------------------------------------------------------------------------- the Hugging Face configs


def _config_files() -> list[Path]:
    return sorted(HF.glob("*/*/config.json"))


def test_hf_configs_present_parse_and_are_sourced():
    files = _config_files()
    assert len(files) >= 40
    sources = (HF / "SOURCES.md").read_text()
    for f in files:
        doc = json.loads(f.read_text())
        assert doc.get("model_type") or doc.get("architectures"), f
        model_id = f"{f.parent.parent.name}/{f.parent.name}"
        assert f"| `{model_id}` |" in sources, f"{model_id} has no row in SOURCES.md"
    rows = [line for line in sources.splitlines() if line.startswith("| `")]
    assert len(rows) == len(files), "every SOURCES.md row must have its config.json"


def test_hf_configs_keep_the_architecture_fields_bridge_reads():
    """Spot checks against the published numbers (a sibling file must not change the architecture)."""
    cfg = {f"{f.parent.parent.name}/{f.parent.name}": json.loads(f.read_text()) for f in _config_files()}
    q = cfg["Qwen/Qwen3-30B-A3B"]
    assert (q["num_hidden_layers"], q["hidden_size"], q["num_experts"], q["num_experts_per_tok"]) == (48, 2048, 128, 8)
    llama = cfg["meta-llama/Meta-Llama-3-8B"]
    assert llama["max_position_embeddings"] == 8192 and llama["rope_scaling"] is None
    assert (llama["hidden_size"], llama["intermediate_size"], llama["vocab_size"]) == (4096, 14336, 128256)
    assert cfg["deepseek-ai/DeepSeek-V3"]["n_routed_experts"] == 256
    assert cfg["openai/gpt-oss-20b"]["num_local_experts"] == 32
    for doc in cfg.values():  # keys only an inference engine's preset adds must be gone
        assert not {"context_window_size", "prefill_chunk_size"} & set(doc)


def test_layout_hf_cache_matches_the_hub_cache_scheme(tmp_path):
    rev = "a" * 40
    got = gc.layout_hf_cache(HF, tmp_path / "hf", (rev,))
    assert set(got) == {f"{f.parent.parent.name}/{f.parent.name}" for f in _config_files()}
    for model_id, digest in got.items():
        org, name = model_id.split("/")
        repo = tmp_path / "hf" / "hub" / f"models--{org}--{name}"
        assert (repo / "refs" / "main").read_text() == digest
        assert len(digest) == 40 and int(digest, 16) >= 0
        src = (HF / org / name / "config.json").read_text()
        assert (repo / "snapshots" / digest / "config.json").read_text() == src
        assert (repo / "snapshots" / rev / "config.json").read_text() == src  # a pinned revision resolves too
    again = gc.layout_hf_cache(HF, tmp_path / "hf2")
    assert again == {k: v for k, v in got.items()}, "the snapshot hash must not depend on the run"


def test_offline_env_turns_the_network_off(tmp_path):
    env = gc.offline_env(tmp_path)
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["HF_HOME"] == str(tmp_path) and env["HF_HUB_CACHE"] == str(tmp_path / "hub")
    assert env["MEGATRON_CONFIG_LOCK_DIR"].startswith(str(tmp_path))


# --------------------------------------------------------------------------- pure helpers


def test_rewrite_paths_whole_components_longest_first():
    text = "save: /tmp/run/work/nemo_experiments/default\nload: /tmp/run/workx/other\nhome: /root/.cache/x\n"
    out = gc.rewrite_paths(text, ["/tmp/run/work", "/tmp/run", "/root/"])
    assert "save: /workspace/nemo_experiments/default" in out
    assert "load: /workspace/workx/other" in out  # /tmp/run matched, /tmp/run/work did not half-match workx
    assert "home: /workspace/.cache/x" in out
    assert gc.rewrite_paths("a: /tmp/run\n", ["/tmp/run"]) == "a: /workspace\n"
    assert gc.rewrite_paths("x", ["", "/"]) == "x"  # empty and root prefixes are ignored


def test_world_sizes():
    assert gc.min_world(1, 1, 1) == 1
    assert gc.min_world(4, 2, 1) == 8
    assert gc.min_world(1, 4, 1, ep=8) == 32  # experts: ETP(=TP) x EP x PP
    assert gc.min_world(2, 1, 2, ep=4, etp=1) == 4
    assert gc.min_world(4, 1, 1, ep=8, etp=1) == 8
    assert gc.min_world(None, None, None, None) == 1
    assert gc.named_world("llama3_70b_pretrain_32gpu_h100_bf16_config") == 32
    assert gc.named_world("qwen3_30b_a3b_pretrain_config") is None


def test_names_and_selection():
    assert gc.recipe_stem("qwen3_30b_a3b_pretrain_config") == "qwen3_30b_a3b_pretrain"
    assert gc.recipe_stem("deepseek_v3_pretrain_config_32nodes") == "deepseek_v3_pretrain_config_32nodes"
    assert gc.match_only("llama3_8b_pretrain_config", None)
    assert gc.match_only("llama3_8b_pretrain_config", "qwen*,llama3_*")
    assert gc.match_only("llama3_8b_pretrain_config", "8b_pre")  # bare word: substring
    assert not gc.match_only("llama3_8b_pretrain_config", "qwen*")
    assert gc.shard(list(range(7)), 1, 3) == [1, 4]
    assert sorted(x for k in range(4) for x in gc.shard(list(range(10)), k, 4)) == list(range(10))


def test_changed_keys_lists_every_difference():
    before = {"ddp": {"use_megatron_fsdp": False, "x": 1}, "checkpoint": {"load": "/a", "format": "torch_dist"}}
    after = {"ddp": {"use_megatron_fsdp": True, "x": 1}, "checkpoint": {"load": None, "format": "fsdp_dtensor"}, "n": 2}
    assert gc.changed_keys(before, after) == {
        "checkpoint.format": ["torch_dist", "fsdp_dtensor"],
        "checkpoint.load": ["/a", None],
        "ddp.use_megatron_fsdp": [False, True],
        "n": [None, 2],
    }
    assert gc.changed_keys(before, before) == {}


def test_param_group():
    assert gc.param_group("decoder.layers.0.mlp.experts.linear_fc1.weight0") == "experts"
    assert gc.param_group("decoder.layers.0.mlp.shared_experts.linear_fc1.weight") == "shared_experts"
    assert gc.param_group("embedding.word_embeddings.weight") == "embedding"
    assert gc.param_group("output_layer.weight") == "output_layer"
    assert gc.param_group("decoder.layers.0.self_attention.linear_qkv.weight") == "other"


def test_param_tasks_one_per_family_first():
    rows = [
        {"name": n, "family": f, "alias_of": None, "helper": False, "required_args": []}
        for n, f in [
            ("llama3_8b_pretrain_2gpu_h100_fp8cs_config", "llama"),
            ("llama3_8b_pretrain_2gpu_h100_bf16_config", "llama"),
            ("llama3_70b_pretrain_32gpu_h100_bf16_config", "llama"),
            ("qwen3_8b_sft_config", "qwen"),
            ("qwen3_8b_pretrain_config", "qwen"),
        ]
    ]
    tasks = gc.param_tasks(rows, None)
    phase1 = [t for t in tasks if t["phase"] == 1]
    assert [(t["family"], t["layout"]) for t in phase1] == [
        ("llama", "tp1"),
        ("llama", "recipe"),
        ("qwen", "tp1"),
        ("qwen", "recipe"),
    ]
    assert phase1[0]["candidates"][0] == "llama3_8b_pretrain_2gpu_h100_bf16_config"  # bf16 before fp8
    assert phase1[2]["candidates"][0] == "qwen3_8b_pretrain_config"
    assert [t["candidates"] for t in tasks if t["phase"] == 2] == [["llama3_70b_pretrain_32gpu_h100_bf16_config"]] * 2


def test_progress_state_blames_the_recipe_in_flight():
    prog = [
        {"event": "imported"},
        {"event": "start", "name": "a"},
        {"event": "done", "name": "a"},
        {"event": "start", "name": "b"},
    ]
    assert gc.progress_state(prog) == ({"a"}, "b")
    assert gc.progress_state(prog + [{"event": "done", "name": "b"}]) == ({"a", "b"}, None)


def test_exc_record_points_at_the_raising_line():
    def inner():
        raise ValueError("bad layout")

    try:
        try:
            inner()
        except ValueError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as exc:
        rec = gc.exc_record(exc, 0.5)
    assert rec["ok"] is False and rec["error_type"] == "RuntimeError" and rec["error"] == "wrapped"
    first = test_exc_record_points_at_the_raising_line.__code__.co_firstlineno
    path, line = rec["raise_site"].rsplit(":", 1)
    assert path.endswith("test_gen_corpus_cpu.py") and first < int(line) < first + 12
    assert int(rec["causes"][0]["raise_site"].rsplit(":", 1)[1]) == first + 2  # the line of raise ValueError
    assert rec["causes"][0]["type"] == "ValueError" and rec["causes"][0]["error"] == "bad layout"
    assert rec["seconds"] == 0.5
    assert gc.short_path("/usr/lib/python3.12/site-packages/megatron/bridge/training/config.py") == (
        "megatron/bridge/training/config.py"
    )


def test_read_jsonl_skips_a_line_cut_by_a_kill(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n{"b": 2\n')
    assert gc.read_jsonl(p) == [{"a": 1}]
    assert gc.read_jsonl(tmp_path / "missing.jsonl") == []


# --------------------------------------------------------------------------- command line


def test_help_works_without_bridge():
    p = subprocess.run([sys.executable, str(GEN), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0, p.stderr
    for flag in ("--out", "--only", "--jobs", "--validate-yaml", "--deadline"):
        assert flag in p.stdout
    assert "_worker" not in p.stdout  # internal flags stay hidden


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "x", "--jobs", "0"], "--jobs must be at least 1"),
        (["--out", "x", "--recipe-timeout", "1"], "time limits must be at least 5 seconds"),
        (["--out", "x", "--_shard", "3/3"], "K/N with K < N"),
        ([], "--out"),
    ],
)
def test_bad_arguments_are_one_clear_error(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        gc.parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_parse_args_defaults():
    a = gc.parse_args(["--out", "r"])
    assert (a.jobs, a.param_jobs, a.deadline, a.worker, a.param_worker) == (10, 3, gc.DEADLINE_S, False, False)
    assert a.deadline < 360, "the run must end inside six minutes"


# --------------------------------------------------------------------------- the orchestrator, end to end

# A STAND-IN for megatron.bridge, only for this test: Bridge cannot be imported on a machine without CUDA and
# Transformer Engine. It has the same entry points the generator uses (recipes exported from
# megatron.bridge.recipes, AutoBridge.from_hf_pretrained reading the offline hub cache, ConfigContainer.to_yaml /
# from_yaml, runtime_config_update) and recipes that misbehave in each way a real one can.
STANDIN = {
    "megatron/__init__.py": "",
    "megatron/bridge/__init__.py": """
        import json, os

        class AutoBridge:
            @classmethod
            def from_hf_pretrained(cls, path, **kw):
                org, name = path.split("/")
                repo = os.path.join(os.environ["HF_HUB_CACHE"], f"models--{org}--{name}")
                rev = kw.get("revision") or open(os.path.join(repo, "refs", "main")).read()
                with open(os.path.join(repo, "snapshots", rev, "config.json")) as f:
                    return json.load(f)
    """,
    "megatron/bridge/training/__init__.py": "",
    "megatron/bridge/training/config.py": """
        import os, yaml

        class Section:
            def __init__(self, **kw):
                self.__dict__.update(kw)

        class ConfigContainer:
            def __init__(self, **sections):
                self.__dict__.update({k: Section(**v) for k, v in sections.items()})

            def to_dict(self):
                return {k: dict(v.__dict__) for k, v in self.__dict__.items()}

            def to_yaml(self, path):
                with open(path, "w") as f:
                    yaml.safe_dump(self.to_dict(), f)

            @classmethod
            def from_yaml(cls, path):
                with open(path) as f:
                    return cls(**yaml.safe_load(f))

        def runtime_config_update(cfg):
            if cfg.model.num_layers == 999:
                import time
                time.sleep(1000)
            world = int(os.environ["WORLD_SIZE"])
            tp = cfg.model.tensor_model_parallel_size
            assert world % tp == 0, f"world size ({world}) is not divisible by {tp}"
            if cfg.ddp.use_megatron_fsdp:
                assert cfg.checkpoint.load is None, "stand-in rule: no checkpoint.load with Megatron FSDP"
            if getattr(cfg, "peft", None) is not None:
                assert cfg.checkpoint.pretrained_checkpoint is not None, "PEFT requires a pretrained checkpoint path"
                assert os.path.isdir(cfg.checkpoint.pretrained_checkpoint), "Pretrained checkpoint does not exist"
    """,
    "megatron/bridge/recipes/__init__.py": """
        from megatron.bridge.recipes.fam_a.recipes import *
        from megatron.bridge.recipes.fam_b.recipes import *
        from megatron.bridge.recipes.fam_c.recipes import *
        from megatron.bridge.recipes.utils.helpers import *
        from megatron.bridge.recipes.fam_a.recipes import good_1gpu_config as good_alias_config
    """,
    "megatron/bridge/recipes/utils/__init__.py": "",
    "megatron/bridge/recipes/utils/helpers.py": """
        def make_something():
            raise AssertionError("a helper must never be called as a recipe")
    """,
    "megatron/bridge/recipes/fam_a/__init__.py": "",
    "megatron/bridge/recipes/fam_a/recipes.py": """
        import os, signal, time
        from megatron.bridge import AutoBridge
        from megatron.bridge.training.config import ConfigContainer

        def _cfg(tp=1, layers=2):
            return ConfigContainer(
                model={"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": 1,
                       "context_parallel_size": 1, "expert_model_parallel_size": 1, "num_layers": layers},
                ddp={"use_megatron_fsdp": False, "data_parallel_sharding_strategy": "no_shard",
                     "average_in_collective": True},
                dist={"use_megatron_fsdp": False},
                checkpoint={"load": os.path.join(os.getcwd(), "ckpt"), "save": os.path.join(os.getcwd(), "ckpt"),
                            "ckpt_format": "torch_dist"},
            )

        def good_1gpu_config():
            return _cfg()

        def lora_1gpu_peft_config():
            sections = _cfg().to_dict()
            sections["checkpoint"]["pretrained_checkpoint"] = None
            return ConfigContainer(peft={"dim": 8}, **sections)

        def good_tp2_pretrain_8gpu_config():
            return _cfg(tp=2)

        def hf_model_config():
            hf = AutoBridge.from_hf_pretrained("meta-llama/Llama-3.2-1B")
            return _cfg(layers=hf["num_hidden_layers"])

        def slow_validate_config():
            return _cfg(layers=999)

        def broken_config():
            raise ValueError("no such model")

        def crash_config():
            os._exit(7)

        def hang_config():
            time.sleep(1000)

        def stuck_config():
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
            time.sleep(1000)

        def needs_args_config(size):
            return _cfg()
    """,
    "megatron/bridge/recipes/fam_c/__init__.py": "",
    "megatron/bridge/recipes/fam_c/recipes.py": """
        raise ImportError("this family needs a package the machine lacks")
    """,
    "megatron/bridge/recipes/fam_b/__init__.py": "",
    "megatron/bridge/recipes/fam_b/recipes.py": """
        from megatron.bridge.recipes.fam_a.recipes import _cfg

        def zz_after_crash_config():
            return _cfg()
    """,
}


def _write_standin(root: Path) -> None:
    for rel, text in STANDIN.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    try:
        import torch  # noqa: F401
    except ImportError:  # the generator imports torch first, as it must on the GPU machine
        (root / "torch").mkdir()
        (root / "torch" / "__init__.py").write_text("def use_deterministic_algorithms(flag):\n    pass\n")


@pytest.mark.slow
def test_orchestrator_survives_failing_hanging_and_crashing_recipes(tmp_path):
    standin = tmp_path / "standin"
    _write_standin(standin)
    out = tmp_path / "results"
    env = dict(os.environ, PYTHONPATH=str(standin))
    cmd = [sys.executable, str(GEN), "--out", str(out), "--jobs", "2", "--no-params"]
    cmd += ["--recipe-timeout", "5", "--stall-slack", "2", "--deadline", "120"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=env, check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "[gen_corpus" in p.stdout and "done in" in p.stdout

    # one family failing to import costs that family only
    import_errors = json.loads((out / "import_errors.json").read_text())
    assert [e["module"] for e in import_errors] == ["megatron.bridge.recipes", "megatron.bridge.recipes.fam_c.recipes"]
    assert "needs a package" in import_errors[1]["error"]

    rows = json.loads((out / "recipes.json").read_text())
    names = {r["name"]: r for r in rows}
    assert names["good_alias_config"]["alias_of"] == "good_1gpu_config"
    assert names["make_something"]["helper"] is True
    assert names["needs_args_config"]["required_args"] == ["size"]

    verdicts = {r["recipe"]: r for r in gc.read_jsonl(out / "verdicts.jsonl")}
    good = verdicts["good_1gpu_config"]
    assert good["aliases"] == ["good_alias_config"]
    v = good["verdicts"]
    assert v["as_shipped"] == {"ok": True, "world": 1, "seconds": v["as_shipped"]["seconds"]}
    assert v["fsdp_keep_load"]["ok"] is False and v["fsdp_keep_load"]["error_type"] == "AssertionError"
    assert "no checkpoint.load" in v["fsdp_keep_load"]["error"]
    assert v["fsdp_keep_load"]["stage"] == "runtime_config_update"
    assert v["fsdp_keep_load"]["where"].startswith("megatron/bridge/training/config.py:")
    assert v["fsdp_load_none"]["ok"] is True
    assert v["roundtrip"]["ok"] is True
    # the real scripts/mfsdp.py enable ran: the stand-in's rule judges its output by whether it kept checkpoint.load
    assert good["enable"]["rc"] == 0, good["enable"]
    cleared = good["enable"]["changed"].get("checkpoint.load") == ["/workspace/ckpt", None]
    assert v["enabled_rebuilt"]["ok"] is cleared, v["enabled_rebuilt"]
    assert v["enabled_overrides"]["ok"] is False  # the stand-in lacks fields enable sets, or keeps load
    dumped = json.dumps(good)
    assert str(tmp_path) not in dumped, dumped[dumped.find(str(tmp_path)) - 300 :][:600]
    assert "/tmp/gen_corpus." not in dumped
    assert "enable" in good and "rc" in good["enable"]
    written = (out / good["yaml"]).read_text()
    assert "/workspace/ckpt" in written and str(tmp_path) not in written

    # PEFT: rejected as shipped; with checkpoint.pretrained_checkpoint set to an existing folder, judged on the rest
    lora = verdicts["lora_1gpu_peft_config"]
    lv = lora["verdicts"]
    assert "PEFT requires a pretrained checkpoint path" in lv["as_shipped"]["error"]
    assert lv["peft_pretrained_as_shipped"]["ok"] is True, lv["peft_pretrained_as_shipped"]
    assert "no checkpoint.load" in lv["peft_pretrained_fsdp_keep_load"]["error"]
    assert lv["peft_pretrained_fsdp_load_none"]["ok"] is True
    assert lora["pretrained_checkpoint"] == "/workspace/pretrained_checkpoint"
    assert "peft_pretrained_as_shipped" not in v  # only recipes with a PEFT section get these

    tp2 = verdicts["good_tp2_pretrain_8gpu_config"]
    assert tp2["worlds"] == {"world_min": 2, "world_named": 8}
    assert tp2["verdicts"]["as_shipped"]["ok"] and tp2["verdicts_named_world"]["as_shipped"]["world"] == 8

    assert verdicts["hf_model_config"]["build"]["ok"], verdicts["hf_model_config"]
    assert verdicts["hf_model_config"]["hf_ids"] == ["meta-llama/Llama-3.2-1B"]
    assert verdicts["hf_model_config"]["settings"]["model.num_layers"] == 16  # read from the offline cache

    assert verdicts["broken_config"]["build"]["error_type"] == "ValueError"
    assert "recipes.py:" in verdicts["broken_config"]["build"]["where"]
    assert verdicts["hang_config"]["build"]["error_type"] == "RecipeTimeout"
    assert verdicts["needs_args_config"]["build"]["error_type"] == "NeedsArguments"
    slow = verdicts["slow_validate_config"]  # built, then the time limit hit validate(): the build is kept
    assert slow["build"]["ok"] and slow["timeout"]["error_type"] == "RecipeTimeout" and slow["yaml"]
    assert verdicts["zz_after_crash_config"]["build"]["ok"]
    assert "make_something" not in verdicts

    failures = gc.read_jsonl(out / "failures.jsonl")
    by_name = {f["name"]: f for f in failures}
    assert "worker exited with code 7" in by_name["crash_config"]["reason"]
    assert "no progress" in by_name["stuck_config"]["reason"]
    assert by_name["broken_config"]["reason"] == "build failed"

    summary = json.loads((out / "summary.json").read_text())
    assert summary["recipes_built"] == 6  # good_1gpu, good_tp2, hf_model, lora, slow_validate, zz_after_crash
    assert summary["per_family"]["fam_a"] == {"exported": 11, "functions": 10, "built": 5, "failed": 3}
    assert "utils" not in summary["per_family"] and summary["helper_functions"] == ["make_something"]
    assert (out / "summary.md").read_text().startswith("# Recipe corpus run")
    assert not (out / "progress").exists()

    # --validate-yaml: Bridge's verdict on written files (here: the stand-in's), /workspace mapped back to a folder
    raw_yaml, enabled_yaml = out / good["yaml"], out / good["enabled_yaml"]
    cmd = [sys.executable, str(GEN), "--out", str(tmp_path / "reval"), "--validate-yaml", str(raw_yaml)]
    cmd += [str(enabled_yaml), str(tmp_path / "missing.yaml"), "--workspace", str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    res = gc.read_jsonl(tmp_path / "reval" / "validate_yaml.jsonl")
    assert [r["verdict"]["ok"] for r in res] == [True, cleared, False]  # the stand-in's rule, as above
    assert res[2]["verdict"]["error_type"] == "FileNotFoundError"

    # --corpus: enable runs on the committed corpus file; the record says whether it matches the fresh to_yaml
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(out / good["yaml"], corpus / Path(good["yaml"]).name)
    edited = (out / lora["yaml"]).read_text().replace("ckpt_format: torch_dist", "ckpt_format: fsdp_dtensor")
    (corpus / "lora_1gpu_peft.yaml").write_text(edited)
    out2 = tmp_path / "results2"
    cmd = [sys.executable, str(GEN), "--out", str(out2), "--jobs", "1", "--no-params", "--only", "good_1gpu,lora"]
    cmd += ["--corpus", str(corpus), "--deadline", "120"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=env, check=False)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    again = {r["recipe"]: r for r in gc.read_jsonl(out2 / "verdicts.jsonl")}
    assert set(again) == {"good_1gpu_config", "lora_1gpu_peft_config"}
    assert again["good_1gpu_config"]["corpus_yaml_same"] is True
    assert again["lora_1gpu_peft_config"]["corpus_yaml_same"] is False
    assert "checkpoint.ckpt_format" in again["good_1gpu_config"]["enable"]["changed"]
    assert "checkpoint.ckpt_format" not in again["lora_1gpu_peft_config"]["enable"]["changed"]  # read the edited file
    assert "enabled_overrides_pretrained" in again["lora_1gpu_peft_config"]["verdicts"]


# --------------------------------------------------------------------------- parameter counting helpers


def test_count_neutral_turns_off_only_kernel_choices():
    class Obj:
        pass

    cfg, m, co = Obj(), Obj(), Obj()
    m.gradient_accumulation_fusion, m.tp_comm_overlap, m.moe_token_dispatcher_type = True, True, "flex"
    m.dsa_kernel_backend, m.hidden_size = "cudnn", 4096
    co.tp_comm_overlap, co.defer_embedding_wgrad_compute = True, None  # None = "not set": left alone
    cfg.model, cfg.comm_overlap = m, co
    done = gc.count_neutral(cfg)
    assert (m.gradient_accumulation_fusion, m.tp_comm_overlap, m.dsa_kernel_backend) == (False, False, "none")
    assert m.moe_token_dispatcher_type == gc.COUNT_NEUTRAL_DISPATCHER and co.tp_comm_overlap is False
    assert co.defer_embedding_wgrad_compute is None and m.hidden_size == 4096
    assert "model.gradient_accumulation_fusion=False" in done and "comm_overlap.tp_comm_overlap=False" in done
    assert gc.count_neutral(cfg) == []  # a second pass changes nothing


def test_vocab_for_count_says_where_the_size_came_from():
    class Obj:
        pass

    cfg, tok = Obj(), Obj()
    tok.vocab_size = 32000
    cfg.tokenizer = tok
    assert gc.vocab_for_count(cfg) == (32000, "vocab_size from tokenizer config (32000)")
    tok.vocab_size = None
    size, note = gc.vocab_for_count(cfg)
    assert size == 1 and "per row" in note


def test_params_only_and_corpus_arguments(tmp_path, capsys):
    a = gc.parse_args(["--out", "r", "--params-only", "--corpus", str(tmp_path)])
    assert a.params_only and a.corpus == str(tmp_path.resolve())
    for argv, message in (
        (["--out", "r", "--params-only", "--no-params"], "--params-only needs"),
        (["--out", "r", "--corpus", str(tmp_path / "nope")], "no such folder"),
    ):
        with pytest.raises(SystemExit):
            gc.parse_args(argv)
        assert message in capsys.readouterr().err


def test_install_copies_a_run_lean(tmp_path):
    run = tmp_path / "run"
    (run / "yaml").mkdir(parents=True)
    (run / "yaml" / "a_pretrain.yaml").write_text("model: {}\n")
    long = "x" * (gc.ENABLE_OUT_KEEP * 3)
    rec = {"recipe": "a_pretrain_config", "worker": "w0.0", "enabled_yaml": "enabled/a.yaml"}
    rec["enable"] = {"rc": 1, "stdout": long, "decided": {"args": ["--set-pp-1"], "rc": 0, "stdout": long}}
    (run / "verdicts.jsonl").write_text(json.dumps(rec) + "\n")
    for f in ("recipes.json", "summary.json"):
        (run / f).write_text("{}\n")
    (run / "failures.jsonl").write_text("")
    (run / "summary.md").write_text("# Recipe corpus run\n")
    (run / "run.json").write_text(json.dumps({"argv": ["/root/x"], "corpus": True}))
    into = tmp_path / "fixtures"
    (into / "yaml").mkdir(parents=True)
    (into / "yaml" / "old.yaml").write_text("gone\n")
    done = gc.install(run, into)
    assert done["yaml_files"] == 1 and not (into / "yaml" / "old.yaml").exists()
    got = gc.read_jsonl(into / "verdicts.jsonl")[0]
    assert "worker" not in got and "enabled_yaml" not in got
    assert len(got["enable"]["stdout"]) < len(long) and len(got["enable"]["decided"]["stdout"]) < len(long)
    assert got["enable"]["decided"]["args"] == ["--set-pp-1"]
    assert json.loads((into / "run.json").read_text()) == {"corpus": True}  # no machine folders
    with pytest.raises(FileNotFoundError):
        gc.install(tmp_path / "nothing", into)


def test_decisions_follow_enables_refusals_round_by_round():
    """PP first (it sets DP); then the training batch enable names as the nearest valid one; never a key twice."""
    pp = {"rule": "MFSDP-PIPELINE-PARALLEL", "fix": "model.pipeline_model_parallel_size=1 and ..."}
    train = {"rule": "MFSDP-TRAIN-BATCH-DP", "fix": "train.global_batch_size=64, or train.micro_batch_size=1 (...)"}
    evalf = {"rule": "MFSDP-EVAL-BATCH-DP", "fix": "validation.eval_global_batch_size=64 (the nearest ...)"}
    assert gc.decisions_for([pp, train, evalf], []) == ["--set-pp-1"]  # the batch is judged again at PP 1
    assert gc.decisions_for([train, evalf], ["--set-pp-1"]) == ["train.global_batch_size=64"]  # eval follows it
    assert gc.decisions_for([evalf], ["--set-pp-1"]) == ["--fit-eval-batch"]
    assert gc.decisions_for([train], ["train.global_batch_size=64"]) == []  # decided already: stays refused
    assert gc.decisions_for([{"rule": "MFSDP-OPTIMIZER-UNSUPPORTED", "fix": "x"}], []) == []


def test_run_enable_takes_the_batch_decision_after_pp1(tmp_path):
    """The real enable on a corpus recipe: PP 4 -> 1 makes DP 32 at its 32 GPUs; 32 / (2 x 32) does not divide."""
    src = HERE.parent / "fixtures" / "recipes" / "yaml" / "qwen3_next_80b_a3b_pretrain_32gpu_h100_bf16.yaml"
    rec = gc.run_enable(src, tmp_path / "out.yaml", tmp_path / "out.json")
    assert rec["refused_rules"] == ["MFSDP-PIPELINE-PARALLEL"]
    assert rec["decided"]["args"] == ["--set-pp-1", "train.global_batch_size=64"] and rec["decided"]["rc"] == 0
    assert rec["output"] and (tmp_path / "out.yaml").is_file()
