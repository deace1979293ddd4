"""SKILL.md: the Agent Skills frontmatter rules, size limits, and that every
``scripts/mfsdp.py`` command it names exists and parses with the flags it shows."""

from __future__ import annotations

import re
import sys
import unicodedata

import pytest

from _helpers_skill import ROOT, estimate_tokens, frontmatter, mfsdp_commands, read
from mfsdp_lib import SKILL_NAME

# The Agent Skills specification's frontmatter keys (also what skills-ref enforces).
ALLOWED_KEYS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools"}
NAME = SKILL_NAME
MAX_NAME = 64
MAX_DESCRIPTION = 1024
MAX_COMPATIBILITY = 500
# Anthropic's guidance for SKILL.md bodies, and the budget for the whole file.
MAX_LINES = 150  # short enough to read whole; details live in references/
MAX_TOKENS = 5000
# What users type when they need this skill; each must appear in the description.
TRIGGER_TERMS = [
    "use_megatron_fsdp",
    "data_parallel_sharding_strategy",
    "fsdp_dtensor",
    "sharded data parallel",
    "FSDP OOM",
    "torch_dist vs fsdp_dtensor",
    "FSDP2",
]
# Neighbouring topics the skill must not claim; they may appear only in the exclusion sentence.
NOT_FOR = ["PyTorch FSDP", "DeepSpeed", "torchtitan"]
# The workflow steps of SKILL.md and the command each one names.
WORKFLOW_COMMANDS = ["check", "enable", "memory", "rehearse", "smoke", "log", "ckpt", "anchors"]
SMOKE_COMMAND = "python -m torch.distributed.run --nproc_per_node=2 -m pytest tests/gpu/test_smoke_gpu.py -v -s"

TEXT = read("SKILL.md")
META, BODY = frontmatter(TEXT)


def test_frontmatter_keys_are_only_those_the_spec_allows():
    assert set(META) <= ALLOWED_KEYS, f"keys outside the spec: {sorted(set(META) - ALLOWED_KEYS)}"
    assert {"name", "description"} <= set(META)


def test_name_follows_the_spec_and_matches_the_skill():
    name = unicodedata.normalize("NFKC", META["name"])
    assert name == NAME
    assert len(name) <= MAX_NAME and name == name.lower()
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name), "letters/digits/single hyphens only"


def test_description_length_and_trigger_terms():
    desc = META["description"]
    assert isinstance(desc, str) and 0 < len(desc) <= MAX_DESCRIPTION
    folded = " ".join(desc.split()).lower()
    missing = [t for t in TRIGGER_TERMS if t.lower() not in folded]
    assert not missing, f"description lacks trigger terms: {missing}"


def test_description_excludes_neighbouring_topics_only_in_its_exclusion_sentence():
    desc = " ".join(META["description"].split())
    head, sep, exclusion = desc.partition("Do not use for")
    assert sep, "the description must say when NOT to use the skill"
    for topic in NOT_FOR:
        assert topic.lower() in exclusion.lower(), f"{topic} not excluded"
        assert topic.lower() not in head.lower(), f"{topic} appears as if it were in scope"


def test_optional_keys_have_the_spec_types():
    assert META.get("license") == "Apache-2.0"
    comp = META.get("compatibility", "")
    assert isinstance(comp, str) and len(comp) <= MAX_COMPATIBILITY
    meta = META.get("metadata", {})
    assert isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values()), (
        "metadata values must be strings (the spec's string->string map)"
    )


def test_metadata_pins_the_versions_the_code_pins():
    from mfsdp_lib import PINNED_BRIDGE, PINNED_MCORE, __version__

    meta = META["metadata"]
    assert meta["megatron-bridge"] == PINNED_BRIDGE
    assert meta["megatron-core"] == PINNED_MCORE
    assert meta["version"] == __version__


def test_size_limits():
    assert len(TEXT.splitlines()) <= MAX_LINES, f"{len(TEXT.splitlines())} lines: move details to references/"
    assert estimate_tokens(TEXT) < MAX_TOKENS, f"~{estimate_tokens(TEXT)} tokens (chars/4)"


def test_the_intent_table_comes_first_and_routes_to_commands():
    """An agent reads what to run for the user's intent before any detail: the first section is a table of
    intents, each row naming a command of scripts/mfsdp.py."""
    heads = re.findall(r"^## (.+)$", BODY, re.M)
    assert heads[0] == "What to run", heads[:2]
    section = BODY.split("## What to run", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| The user wants")]
    assert len(rows) >= 8
    import mfsdp

    for row in rows:
        cell = row.split("|")[2]
        assert any(f"`{c} " in cell or f"mfsdp.py {c}" in cell for c in mfsdp.COMMANDS), row


def test_partial_files_absolute_paths_and_the_evidence_folders_are_taught():
    flat = " ".join(BODY.split())
    assert "--base" in flat and "partial override file" in flat and "`embedded`" in flat
    assert "absolute paths" in flat and "relative path is read from the skill folder" in flat
    assert "maintainers' evidence" in flat  # the agent need not walk tests/ and benchmarks/


def test_the_70b_example_gives_the_answer_memory_gives(cli):
    """The example's command, run as written, says what its answer says: optim_grads_params fits with
    meta-device init at about the stated GiB, every other strategy does not, and without the override the
    same row is the build-time peak that does not fit."""
    import json
    import shlex

    line = next(ln for ln in BODY.splitlines() if "Will 70B fit on 64 H100s" in ln)
    argv = shlex.split(re.search(r"`python3 scripts/mfsdp\.py (memory [^`]+)`", line).group(1))
    answer = " ".join(BODY.split("Will 70B fit on 64 H100s", 1)[1].split("\n- ", 1)[0].split())

    def rows(args):
        out = cli(*args, "--format", "json")
        assert out.returncode in (0, 1), out.stderr
        return {r["name"]: r for r in json.loads(out.stdout)["strategies"]}

    def fits(row):
        return row["fits"] not in (False, "no", "NO", None)

    with_meta = rows(argv)
    stated = float(re.search(r"about (\d+) GiB of model state", answer).group(1))
    ogp = with_meta["optim_grads_params"]
    assert fits(ogp) and abs(ogp["total_gib"] - stated) <= 1.0, ogp["total_gib"]
    assert not any(fits(r) for name, r in with_meta.items() if name != "optim_grads_params")
    without = rows([a for a in argv if a != "model.init_model_with_meta_device=true"])["optim_grads_params"]
    peak = float(re.search(r"says NO \((\d+) GiB\)", answer).group(1))
    assert not fits(without) and abs(without["total_gib"] - peak) <= 1.0 and without["init_peak_gib"] > 0


def test_every_workflow_step_names_its_command():
    named = {argv[0] for argv in mfsdp_commands(TEXT)}
    missing = [c for c in WORKFLOW_COMMANDS if c not in named]
    assert not missing, f"SKILL.md does not show how to run: {missing}"


def test_verification_path_is_the_torchrun_pytest_smoke_with_its_criteria():
    assert SMOKE_COMMAND in TEXT
    assert "scripts/mfsdp.py smoke --nproc-per-node 2" in TEXT
    section = TEXT[TEXT.index("## 4.") : TEXT.index("## 5.")]
    for criterion in ("`1 passed`", "finite", "checkpoint-format assertion"):
        assert criterion in section


def test_minimal_enablement_block_has_the_five_settings():
    block = re.search(r"```python\n(.*?)```", BODY, re.S).group(1)
    settings = dict(re.findall(r"^cfg\.(\S+) = (\S+)", block, re.M))
    assert settings == {
        "dist.use_megatron_fsdp": "True",
        "ddp.use_megatron_fsdp": "True",
        "ddp.data_parallel_sharding_strategy": '"optim_grads_params"',
        "ddp.average_in_collective": "False",
        "checkpoint.ckpt_format": '"fsdp_dtensor"',
    }


COMMANDS_CITED = mfsdp_commands(TEXT) + [
    argv for p in sorted((ROOT / "references").glob("*.md")) for argv in mfsdp_commands(p.read_text())
]


@pytest.mark.parametrize("argv", COMMANDS_CITED, ids=[" ".join(a)[:60] for a in COMMANDS_CITED])
def test_cited_command_exists_and_its_flags_parse(argv):
    import mfsdp
    from mfsdp_lib.cli import common as cliutil

    name, rest = argv[0], argv[1:]
    assert name in mfsdp.COMMANDS, f"SKILL.md/references cite unknown command {name!r}"
    _module, parser = cliutil.build_parser("mfsdp.py", name, mfsdp.COMMANDS[name])
    try:
        _ns, unknown = parser.parse_known_args(rest)
    except SystemExit as exc:  # argparse rejected the documented invocation
        pytest.fail(f"`mfsdp.py {' '.join(argv)}` does not parse (exit {exc.code})")
    assert not unknown, f"`mfsdp.py {' '.join(argv)}`: flags the command does not know: {unknown}"


def test_no_bare_line_number_citations():
    from mfsdp_lib.integrity.anchors import BARE_LINE_RE

    for p in [ROOT / "SKILL.md", *sorted((ROOT / "references").glob("*.md"))]:
        assert not BARE_LINE_RE.search(p.read_text()), f"{p.name} cites a Megatron file by line number"


def test_smoke_section_says_what_the_smoke_command_really_launches(cli):
    """`mfsdp.py smoke` runs scripts/smoke_train.py under torchrun, not pytest: SKILL.md must not tell the
    agent that it prints pytest's `1 passed` (it once said the smoke command 'runs' the pytest line)."""
    section = TEXT[TEXT.index("## 4.") : TEXT.index("## 5.")]
    launched = cli("smoke", "--dry-run", "--nproc-per-node", "2", "--save-resume").stdout.split()
    entry = next(a for a in launched if a.endswith(".py"))
    assert "-m" in launched and "pytest" not in launched
    assert f"scripts/{entry.rsplit('/', 1)[-1]}" in section
    assert not re.search(r"It runs `python -m torch\.distributed\.run[^`]*pytest", section)


def test_skill_name_has_one_source():
    """mfsdp_lib.SKILL_NAME is the name; every other place that states it must agree."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: pip's own copy of the same parser
        from pip._vendor import tomli as tomllib

    assert frontmatter(read("SKILL.md"))[0]["name"] == SKILL_NAME
    assert tomllib.loads(read("pyproject.toml"))["project"]["name"] == SKILL_NAME
    assert read("skill-card.md").splitlines()[0] == f"# Skill card: {SKILL_NAME}"
