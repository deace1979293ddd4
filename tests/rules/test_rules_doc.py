"""references/rules.md is generated from the rule table; this fails when they drift."""

from __future__ import annotations

import json

from mfsdp_lib import rules
from mfsdp_lib import schema as S
from mfsdp_lib.cli import rules as cli_rules


def test_reference_matches_table(root):
    doc = (root / "references" / "rules.md").read_text(encoding="utf-8")
    assert doc == cli_rules.markdown(), (
        "references/rules.md is stale: run 'python3 scripts/mfsdp.py rules --write references/rules.md'"
    )


def test_every_rule_and_default_is_in_the_doc(root):
    doc = (root / "references" / "rules.md").read_text(encoding="utf-8")
    for r in rules.RULES:
        assert f"| `{r.id}` | {r.severity} | {r.stage} |" in doc
    for path in S.FIELDS:
        assert f"| `{path}` |" in doc


def test_cli_write_and_json(cli, tmp_path, root):
    out = tmp_path / "rules.md"
    p = cli("rules", "--write", str(out))
    assert p.returncode == 0 and out.read_text() == (root / "references" / "rules.md").read_text()
    table = json.loads(cli("rules", "--format", "json").stdout)["rules"]
    assert [d["rule"] for d in table] == [r.id for r in rules.RULES]
    one = cli("rules", "MFSDP-CKPT-FORMAT")
    assert "Megatron-FSDP requires the fsdp_dtensor checkpointing format!" in one.stdout
    bad = cli("rules", "MFSDP-CKPT-FORMT")
    assert bad.returncode == 2 and "did you mean 'MFSDP-CKPT-FORMAT'" in bad.stderr


def test_write_replaces_a_rule_table_but_never_another_file(cli, tmp_path):
    """`rules --write PATH` must not clobber a user's file that happens to be at PATH (a typo, a config)."""
    mine = tmp_path / "run_config.yaml"
    mine.write_text("ddp:\n  use_megatron_fsdp: true\n")
    p = cli("rules", "--write", str(mine))
    assert p.returncode == 2 and "not a rule table" in p.stderr and "Traceback" not in p.stderr
    assert mine.read_text() == "ddp:\n  use_megatron_fsdp: true\n"
    old = tmp_path / "rules.md"
    old.write_text(cli_rules.DOC_TITLE + "\n\nan older table\n")
    p = cli("rules", "--write", str(old))
    assert p.returncode == 0, p.stderr
    assert old.read_text() == cli_rules.markdown()
