"""The rule registry: one typed record per rule, one module per topic, one table for check and the docs."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from mfsdp_lib import rules
from mfsdp_lib.rules.model import SEVERITIES, STAGES, Rule

RULES_DIR = Path(rules.__file__).parent
NOT_TOPICS = {"__init__", "model", "context", "differential"}  # the registry and its helpers


def test_every_topic_module_is_registered_and_every_registered_topic_exists():
    on_disk = {p.stem for p in RULES_DIR.glob("*.py")} - NOT_TOPICS
    assert on_disk == set(rules.TOPICS), "a rules/<topic>.py must be listed in rules.TOPICS (and only those)"


def test_each_rule_lives_in_the_module_of_its_topic():
    for topic in rules.TOPICS:
        module = importlib.import_module(f"mfsdp_lib.rules.{topic}")
        assert module.RULES, f"rules/{topic}.py holds no rule"
        for rule in module.RULES:
            assert rule.topic == topic, rule.id


def test_the_table_is_every_topic_module_once_errors_first():
    from_modules = [r.id for t in rules.TOPICS for r in importlib.import_module(f"mfsdp_lib.rules.{t}").RULES]
    assert sorted(from_modules) == sorted(r.id for r in rules.RULES)
    assert len(set(from_modules)) == len(from_modules)
    ranks = [SEVERITIES.index(r.severity) for r in rules.RULES]
    assert ranks == sorted(ranks)
    assert {r.id: r for r in rules.RULES} == rules.RULES_BY_ID


def test_every_rule_is_well_formed():
    for r in rules.RULES:
        assert r.id.startswith("MFSDP-") and r.id == r.id.upper(), r.id
        assert r.severity in SEVERITIES and r.stage in STAGES, r.id
        assert r.paths and all(isinstance(p, str) and "." in p for p in r.paths), r.id
        assert callable(r.when) and r.source, r.id
        # A rule with a fixed message and fix has both; one without returns its own (path, message, fix) list.
        assert (r.message is None) == (r.fix is None), r.id


def _kw(**over):
    base = dict(
        id="MFSDP-X",
        severity="error",
        stage="validate",
        topic="core",
        paths=("ddp.x",),
        when=lambda e: False,
        message=lambda e: "m",
        fix="ddp.x=1",
        source="s",
    )
    base.update(over)
    return base


def test_rule_records_are_keyword_only_immutable_and_checked():
    r = Rule(**_kw())
    with pytest.raises(TypeError):
        Rule("MFSDP-X", "error", "validate", "core", ("ddp.x",), None, None, None, "s")  # positional: refused
    with pytest.raises(AttributeError):
        r.severity = "info"
    for bad in ({"severity": "fatal"}, {"stage": "later"}, {"paths": ()}):
        with pytest.raises(ValueError):
            Rule(**_kw(**bad))
