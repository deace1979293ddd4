"""evals/evals.json: schema, coverage, scripts it names, checks in step, facts against the real source."""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evals import checks  # noqa: E402
from evals.__main__ import dispatcher_commands, validate_cases  # noqa: E402

EVALS = json.loads((ROOT / "evals" / "evals.json").read_text())
SCHEMA = json.loads((ROOT / "evals" / "evals.schema.json").read_text())
KEYS = {"id", "question", "expected_skill", "expected_script", "ground_truth", "expected_behavior"}


def _validate(argv=(), cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "evals", "validate", *argv], capture_output=True, text=True, cwd=cwd, timeout=60
    )


def test_validate_cli_accepts_the_shipped_cases():
    proc = _validate(["--format", "json"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"] is True and out["problems"] == []
    assert out["cases"] == len(EVALS) >= 20
    assert out["negative"] >= 5 and out["with_script"] >= 6


def test_every_case_has_exactly_the_six_keys_and_unique_ids():
    assert all(set(c) == KEYS for c in EVALS)
    ids = [c["id"] for c in EVALS]
    assert len(ids) == len(set(ids))


def test_cases_cover_what_users_ask():
    """Every subcommand, the new features, fixtures for half the cases, at least 10 negative or trap cases."""
    scripts = {c["expected_script"].split()[1] for c in EVALS if c["expected_script"]}
    assert {"check", "enable", "memory", "ckpt", "log", "anchors", "rules", "smoke"} <= scripts
    assert len(EVALS) >= 40
    with_fixture = [c["id"] for c in EVALS if checks.CHECKS[c["id"]].fixture]
    assert len(with_fixture) * 2 >= len(EVALS), with_fixture
    for cid in with_fixture:
        assert (ROOT / "evals" / "fixtures" / checks.CHECKS[cid].fixture).is_dir(), cid
    negative = [c for c in EVALS if c["expected_skill"] is None or c["id"].startswith("trap-")]
    assert len(negative) >= 10
    text = " ".join(c["question"] + c["ground_truth"] for c in EVALS).lower()
    for topic in ("pp=4", "moe", "lora", "256 gpus", "mixtral", "fsdp_dtensor", "cuda_device_max_connections"):
        assert topic in text, topic
    # questions read like a user's, not an expert's checklist
    assert sum(len(c["question"]) for c in EVALS) / len(EVALS) < 160


@pytest.mark.parametrize(
    "mutate, expect",
    [
        (lambda c: c[0].update(extra=1), "Additional properties"),
        (lambda c: c[0].pop("ground_truth"), "'ground_truth' is a required property"),
        (lambda c: c[0].update(expected_script="mfsdp.py check"), "does not match"),
        (lambda c: c[0].update(expected_behavior="one string"), "is not of type 'array'"),
        (lambda c: c[0].update(expected_skill=""), "does not match"),
        (lambda c: c[1].update(id=c[0]["id"]), "duplicate id"),
        (lambda c: c[0].update(expected_script="scripts/mfsdp.py frobnicate"), "'frobnicate' is not a command"),
        (lambda c: c[0].update(expected_script="scripts/nothere.py check"), "does not exist"),
        (lambda c: c.__setitem__(slice(None), c[:3]), "coverage"),
    ],
)
def test_validate_reports_each_kind_of_problem(mutate, expect):
    cases = copy.deepcopy(EVALS)
    mutate(cases)
    problems = validate_cases(cases, SCHEMA)
    assert any(expect in p for p in problems), problems


def test_validate_cli_exit_codes(tmp_path):
    bad = tmp_path / "evals.json"
    bad.write_text(json.dumps([{"id": "x"}]))
    proc = _validate(["--evals", str(bad)])
    assert proc.returncode == 1 and "required property" in proc.stdout
    bad.write_text("[{not json")
    proc = _validate(["--evals", str(bad)])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "not valid JSON" in proc.stderr
    proc = _validate(["--evals", str(tmp_path / "missing.json")])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_expected_scripts_name_real_dispatcher_commands():
    commands = dispatcher_commands(ROOT / "scripts" / "mfsdp.py")
    assert {"check", "enable", "memory", "ckpt", "log", "smoke"} <= commands
    for c in EVALS:
        if c["expected_script"]:
            path, *sub = c["expected_script"].split()
            assert (ROOT / path).is_file()
            assert not sub or sub[0] in commands


def test_checks_cover_exactly_the_cases_and_compile():
    assert set(checks.CHECKS) == {c["id"] for c in EVALS}
    for cid, cc in checks.CHECKS.items():
        assert cc.required, cid
        for fact in cc.facts + cc.forbidden:
            re.compile(fact.pattern)
        # unusable input never counts as the script working, except where the tool rightly refuses the
        # user's input (the misspelt strategy), has no source to check (anchors without Bridge) or no GPU to
        # rehearse on (rehearse on a machine without PyTorch)
        allowed = ("mfsdp-sharding-strategy-typo", "mfsdp-anchors-after-upgrade", "mfsdp-rehearse-before-cluster")
        assert 2 not in cc.exit_codes or cid in allowed


def test_two_thirds_of_the_positive_cases_are_decided_by_what_the_run_leaves():
    """A positive case whose question asks for a file is decided by that file (graded by the skill's own tools), which
    prose cannot fake; without a judge the others are not judged. At least two thirds must be of the first kind, and
    each names the file in its question, its ground truth and its expected behaviour."""
    positive = [c for c in EVALS if c["expected_skill"]]
    decided = [c for c in positive if checks.CHECKS[c["id"]].outcome is not None]
    assert len(decided) * 3 >= len(positive) * 2, f"{len(decided)} of {len(positive)}"
    for c in decided:
        for art in checks.CHECKS[c["id"]].outcome.artefacts:
            named = (Path(art.path).name, art.path, Path(art.path).parts[0])  # the file, or the folder it repairs
            assert any(n in c["question"] for n in named), (c["id"], art.path)
        arts = checks.CHECKS[c["id"]].outcome.artefacts
        names = {Path(a.path).parts[0] for a in arts} | {Path(a.path).name for a in arts}
        assert any(n in c["ground_truth"] for n in names), c["id"]
        assert any(n in " ".join(c["expected_behavior"]) for n in names), c["id"]
    assert not [c["id"] for c in EVALS if c["expected_skill"] is None and checks.CHECKS[c["id"]].outcome]


@pytest.mark.parametrize("case", EVALS, ids=lambda c: c["id"])
def test_ground_truth_passes_its_own_checks_and_a_non_answer_fails(case):
    assert checks.evaluate(case["id"], case["ground_truth"])["passed"], case["id"]
    assert not checks.evaluate(case["id"], "I am not sure, sorry.")["passed"]


def test_settings_are_read_in_every_form_answers_write():
    from evals import settings

    def rec(text):
        return [(x.key, x.value) for x in settings.extract(text) if not x.negated]

    want = ("ddp.use_megatron_fsdp", "true")
    for text in (
        "ddp.use_megatron_fsdp=True",
        "cfg.ddp.use_megatron_fsdp = True",
        "set `ddp.use_megatron_fsdp` to true",
        "ddp:\n  overlap_grad_reduce: true\n  use_megatron_fsdp: true\n",
        "DistributedDataParallelConfig(use_megatron_fsdp=True, overlap_grad_reduce=True)",
        "| setting | value |\n|---|---|\n| `ddp.use_megatron_fsdp` | `True` |",
        "Enable ddp.use_megatron_fsdp.",
    ):
        assert want in rec(text), text
    for text in (
        "dist.use_megatron_fsdp=True",
        "ddp.use_megatron_fsdp=False",
        "ddp.use_megatron_fsdp_v2=True",
        "dist:\n  use_megatron_fsdp: true\n",
        "Do not set ddp.use_megatron_fsdp=True here.",
        "ddp.use_megatron_fsdp=True is wrong for this job.",
        "Instead of ddp.use_megatron_fsdp=True, use FSDP2.",
    ):
        assert want not in rec(text), text
    assert ("cuda_device_max_connections", "32") in rec("export CUDA_DEVICE_MAX_CONNECTIONS=32")


def test_settings_forms_right_answers_write_beyond_the_first_set():
    from evals import settings

    def rec(text):
        return [(x.key, x.value) for x in settings.extract(text) if not x.negated]

    # a denial governing the verb negates "clear / unset X"; the verb alone recommends it
    assert ("checkpoint.load", settings.UNSET) not in rec("Don't clear checkpoint.load (auto-resume).")
    assert ("checkpoint.load", settings.UNSET) not in rec("You should never unset checkpoint.load.")
    assert ("checkpoint.load", settings.UNSET) in rec("Then clear checkpoint.load.")
    # what the user's files hold now is not a recommendation
    assert ("cuda_device_max_connections", "1") not in rec(
        "With the launcher's CUDA_DEVICE_MAX_CONNECTIONS=1 it fails."
    )
    assert ("cuda_device_max_connections", "1") in rec("Keep CUDA_DEVICE_MAX_CONNECTIONS=1: TP overlap needs it.")
    assert ("ckpt_format", "torch_dist") not in rec("Your config saves checkpoints with ckpt_format torch_dist.")
    # "KEY VALUE" counts only with a value from the key's own closed set
    assert ("ckpt_format", "fsdp_dtensor") in rec("It now saves with ckpt_format fsdp_dtensor to a fresh folder.")
    assert ("ddp.data_parallel_sharding_strategy", "optim_grads_params") in rec(
        "ddp.data_parallel_sharding_strategy optim_grads_params"
    )
    assert rec("the ckpt_format optim_grads is odd") == []
    assert rec("ckpt_format fsdp_dtensor_v2") == []


def test_facts_accept_the_forms_tools_print():
    # the smoke dry run prints "python -m torch.distributed.run", which is torchrun
    assert checks.evaluate(
        "mfsdp-smoke-dry-run", "Printed, not run: `python3 -m torch.distributed.run --nproc-per-node=8 smoke_train.py`"
    )["passed"]
    # "DP=1" and "above 1" state the data-parallel condition
    f = checks.F_DP_GT_1
    assert f.find("at DP=1 it shards nothing") and f.find("only with a data-parallel size above 1")
    assert not f.find("with DP=16 it is fine")


# Facts the cases state, checked in the real pinned wheels' source (read as text).
BRIDGE_FACTS = [
    "Megatron-FSDP requires the fsdp_dtensor checkpointing format!",
    "use_megatron_fsdp and use_torch_fsdp2 are mutually exclusive.",
    "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset.",
    "use_tp_pp_dp_mapping is not supported with Megatron FSDP",
    "fsdp_dtensor checkpoint format only supports Megatron FSDP",
    "average_in_collective not supported with NCCL symmetric registration. Deactivating...",
    "check_weight_hash_across_dp_replicas_interval is not",
    "also_save_hf_checkpoint=True is not supported together with ckpt_format='fsdp_dtensor'",
]


def test_quoted_bridge_messages_exist_in_bridge_062(bridge_src):
    text = (bridge_src / "megatron" / "bridge" / "training" / "config.py").read_text()
    for fact in BRIDGE_FACTS:
        assert fact in text, fact
    quoted = " ".join(c["question"] + c["ground_truth"] for c in EVALS)
    for fact in BRIDGE_FACTS[:5]:
        assert fact.rstrip(".!") in quoted or fact.split(" (")[0][:40] in quoted, fact


def test_mcore_facts_in_megatron_core_0192(mcore_src):
    core = mcore_src / "megatron" / "core"
    ddp = (core / "distributed" / "distributed_data_parallel_config.py").read_text()
    assert "data_parallel_sharding_strategy: str = 'no_shard'" in ddp
    for s in ("'no_shard', 'optim',", "'optim_grads', 'optim_grads_params'"):
        assert s in ddp
    tc = (core / "transformer" / "transformer_config.py").read_text()
    assert "no support for Pipeline parallelism with CPU offloading" in tc
    assert "CPU offloading does not work when activation recomputation is enabled" in tc
    assert re.search(r"cuda_graph_impl: Literal\[[^\]]*'transformer_engine'", tc)
    training = (mcore_src / "megatron" / "training" / "config" / "training_config.py").read_text()
    assert re.search(r'ckpt_format: Literal\[[^\]]*\] = "torch_dist"', training)


def _dispatcher_subcommands() -> list[str]:
    """The subcommands scripts/mfsdp.py really dispatches: its COMMANDS table, loaded from the script itself, and
    the same names in the order its top-level --help lists them (what a user and an agent see)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mfsdp_entry_for_coverage", ROOT / "scripts" / "mfsdp.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = list(module.COMMANDS)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "mfsdp.py"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    listed = re.findall(r"^  (\w+)  ", proc.stdout.split("\ncommands:\n", 1)[1].split("\n\n", 1)[0], re.M)
    assert listed == table, (listed, table)
    return table


def uncovered_subcommands(subcommands, cases, good_scripts) -> dict[str, str]:
    """Subcommand -> why no case exercises it: none names it as expected_script, or no case's good scripted run
    runs it (so the end-to-end tests with both CLIs never call it)."""
    named = {
        c["expected_script"].split()[1] for c in cases if c.get("expected_script", "") and " " in c["expected_script"]
    }
    ran = set()
    for turns in good_scripts.values():
        for t in turns:
            words = shlex.split(t.get("run", ""))
            if len(words) >= 3 and words[1] == "{skill_dir}/scripts/mfsdp.py":
                ran.add(words[2])
    out = {}
    for sub in subcommands:
        if sub not in named:
            out[sub] = "no case has expected_script 'scripts/mfsdp.py " + sub + "'"
        elif sub not in ran:
            out[sub] = "no good scripted run (evals/scripted/*.json) runs it"
    return out


def test_every_subcommand_of_the_dispatcher_is_exercised_by_a_case():
    from evals import runner
    from evals import scripted_model as sm

    subs = _dispatcher_subcommands()
    assert "rehearse" in subs and len(subs) >= 9
    scripts = {cid: sm.load_script(p)["turns"] for cid, p in runner.scripted_cases().items()}
    assert uncovered_subcommands(subs, EVALS, scripts) == {}
    # the test can fail: a subcommand the dispatcher gains without a case is reported
    missing = uncovered_subcommands([*subs, "newcmd"], EVALS, scripts)
    assert list(missing) == ["newcmd"] and "expected_script" in missing["newcmd"]
    # ... and so is one that a case names but no scripted run calls
    no_runs = {cid: [t for t in turns if "mfsdp.py rehearse" not in t.get("run", "")] for cid, turns in scripts.items()}
    assert list(uncovered_subcommands(subs, EVALS, no_runs)) == ["rehearse"]


WRONG_BESIDE_RIGHT = [
    (
        "mfsdp-average-in-collective-message",
        "It is informational, but you need to upgrade NCCL to a newer version.",
        "It is informational; no need to upgrade NCCL.",
    ),
    (
        "mfsdp-convert-torch-dist",
        "To convert, edit ckpt_format in checkpoints/iter_0000020/run_config.yaml to fsdp_dtensor.",
        "The checkpoint's run_config.yaml records ckpt_format torch_dist; convert it with the convert command.",
    ),
    (
        "mfsdp-enable-llama3-recipe",
        "Bridge will automatically resume from the torch_dist checkpoint and re-save it as fsdp_dtensor.",
        "Bridge cannot resume a torch_dist checkpoint in an fsdp_dtensor run: convert it or use a fresh folder.",
    ),
    (
        "mfsdp-vs-fsdp2",
        "Use use_torch_fsdp2 instead of Megatron FSDP; the two are mutually exclusive.",
        "If you want FSDP2 you must turn Megatron FSDP off; use Megatron FSDP.",
    ),
    (
        "mfsdp-smoke-verify",
        "A NaN loss at the last iteration is normal, and you can skip the save/resume check.",
        "A NaN loss is not normal; do not skip the save/resume check.",
    ),
    (
        "decoy-bridge-ddp-tuning",
        "overlap_grad_reduce requires the distributed optimizer, and bucket_size is in MB.",
        "bucket_size counts parameters, not MB; overlap_grad_reduce works with plain DDP too.",
    ),
]


@pytest.mark.parametrize(("case_id", "wrong", "right"), WRONG_BESIDE_RIGHT, ids=[w[0] for w in WRONG_BESIDE_RIGHT])
def test_wrong_claims_real_answers_added_beside_the_facts_are_read(case_id, wrong, right):
    """Claims wrong answers added beside every right fact: each keeps its run from passing on the file or the facts
    alone; the right statement of the same point is no hit."""
    forbidden = checks.CHECKS[case_id].forbidden
    assert [f for f in forbidden if f.find(wrong)], wrong
    assert not [f.name for f in forbidden if f.find(right)], right
    # beside the ground truth (every required point), the wrong claim leaves the prose undecided, never right
    assert checks.evaluate(case_id, checks_gt(case_id) + "\n\n" + wrong)["verdict"] != "right"


def checks_gt(case_id: str) -> str:
    return next(c["ground_truth"] for c in EVALS if c["id"] == case_id)
