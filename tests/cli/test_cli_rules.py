"""``mfsdp.py rules ID``: a rule is found however its id is typed."""

from __future__ import annotations

import json

import pytest


@pytest.mark.parametrize("typed", ["mfsdp-ckpt-format", "Mfsdp-Ckpt-Format", " MFSDP-CKPT-FORMAT "])
def test_rule_id_in_any_case(cli, typed):
    p = cli("rules", typed)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("MFSDP-CKPT-FORMAT  (error, validate)"), p.stdout
    table = json.loads(cli("rules", typed, "--format", "json").stdout)["rules"]
    assert [d["rule"] for d in table] == ["MFSDP-CKPT-FORMAT"]


def test_unknown_rule_in_lower_case_gets_the_did_you_mean(cli):
    p = cli("rules", "mfsdp-ckpt-formt")
    assert p.returncode == 2 and "did you mean 'MFSDP-CKPT-FORMAT'" in p.stderr, p.stderr
