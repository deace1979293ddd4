"""The shared Finding record, its JSON contract, and file-system errors as one-line input errors."""

from __future__ import annotations

import io
import json
import os

import pytest

from mfsdp_lib.findings import (
    EXIT_FINDINGS,
    EXIT_OK,
    Finding,
    InputError,
    exit_code,
    oserror_to_input,
    render_json,
    render_text,
)


def _f(sev: str, path: str = "ddp.x") -> Finding:
    return Finding(rule=f"R-{sev}", severity=sev, path=path, message=f"{sev} found", fix="set it")


def test_bad_severity_is_refused():
    with pytest.raises(ValueError):
        Finding(rule="R", severity="fatal", path="p", message="m", fix="f")


def test_exit_code_follows_error_severity_only():
    assert exit_code([_f("warning"), _f("info")]) == EXIT_OK
    assert exit_code([_f("info"), _f("error")]) == EXIT_FINDINGS


def test_json_contract_and_order():
    out = io.StringIO()
    render_json([_f("info"), _f("error"), _f("warning")], out=out, extra_key=1)
    obj = json.loads(out.getvalue())
    assert obj["ok"] is False and obj["extra_key"] == 1
    assert [f["severity"] for f in obj["findings"]] == ["error", "warning", "info"]
    assert set(obj["findings"][0]) >= {"rule", "severity", "path", "message", "fix"}


def test_extra_details_never_overwrite_contract_keys():
    f = Finding(rule="R", severity="info", path="p", message="m", fix="f", extra={"rule": "X", "source": "s"})
    d = f.to_dict()
    assert d["rule"] == "R" and d["source"] == "s"


def test_text_report_counts():
    out = io.StringIO()
    render_text([_f("error"), _f("error"), _f("info")], header="h", out=out)
    assert out.getvalue().splitlines()[-1] == "2 errors, 0 warnings, 1 info"


def test_oserror_messages(tmp_path):
    missing = tmp_path / "nope"
    assert "no such file or folder" in str(oserror_to_input(str(missing), FileNotFoundError(2, "x")))
    link = tmp_path / "dangling"
    os.symlink(tmp_path / "target-gone", link)
    assert "broken symbolic link" in str(oserror_to_input(str(link), FileNotFoundError(2, "x")))
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    try:
        os.stat(loop)
    except OSError as exc:
        msg = str(oserror_to_input(str(loop), exc))
    assert msg.endswith("symbolic link loop")
    perm = oserror_to_input("f", PermissionError(13, "denied"), "cannot list the folder")
    assert isinstance(perm, InputError) and str(perm) == "f: permission denied (cannot list the folder)"
