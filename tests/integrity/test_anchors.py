"""``mfsdp.py anchors``: citation syntax, source location without imports, and
checking every anchor of SKILL.md/references against the real pinned wheels and
against an edited copy in which anchors moved, were renamed or reworded."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from mfsdp_lib import PINNED_BRIDGE, PINNED_MCORE
from mfsdp_lib.integrity import anchors, sources

# ------------------------------------------------------------------ syntax


def test_extract_symbol_and_message_forms_with_line_of_citation():
    doc = textwrap.dedent("""\
        intro
        see `megatron/bridge/training/config.py` :: `ConfigContainer.validate` and
        `megatron/core/x.py` ::
          "Some assertion text, with 'quotes'."
        `megatron/core/x.py` :: "A long message that is cited by its prefix ..."
        `megatron/core/x.py`: not an anchor, and `config.py` :: `Foo` is not one either
        """)
    got = anchors.extract(doc, "DOC.md")
    assert [(a.file, a.kind, a.symbol, a.cited_in) for a in got] == [
        ("megatron/bridge/training/config.py", "symbol", "ConfigContainer.validate", ["DOC.md:2"]),
        ("megatron/core/x.py", "message", "Some assertion text, with 'quotes'.", ["DOC.md:3"]),
        ("megatron/core/x.py", "message", "A long message that is cited by its prefix ...", ["DOC.md:5"]),
    ]


def test_bare_line_number_citation_is_detected():
    assert anchors.BARE_LINE_RE.search("see megatron/bridge/training/config.py:1533")
    assert not anchors.BARE_LINE_RE.search("`megatron/bridge/training/config.py` :: `X`")


def test_file_index_symbols_fields_and_messages():
    src = textwrap.dedent("""\
        import os
        LIMIT = 3
        if True:
            def guarded():
                pass
        class A:
            field: int = 1
            other = 2
            def method(self):
                assert x, (
                    "first part "
                    "second part"
                )
                raise ValueError(f"bad {self.field} value")
            class Inner:
                def deep(self):
                    pass
        """)
    idx = anchors.FileIndex(src)
    assert idx.find_symbol("LIMIT") == (2, 2)
    assert idx.find_symbol("guarded") == (4, 5)
    assert idx.find_symbol("A.field") == (7, 7)
    assert idx.find_symbol("A.other") == (8, 8)
    assert idx.find_symbol("A.method") == (9, 14)
    assert idx.find_symbol("A.Inner.deep") == (16, 17)
    assert idx.find_symbol("A.missing") is None
    assert idx.find_message("first part second part") == (11, 12)
    assert idx.find_message("first part ...") == (11, 12)
    assert idx.find_message("first part") is None, "without '...' the whole literal must match"
    assert idx.find_message("bad {self.field} value") == (14, 14)


# ------------------------------------------------------------------ sources


def test_installed_distribution_is_read_from_metadata_without_importing(tmp_path, monkeypatch):
    site = tmp_path / "site"
    pkg = site / "megatron" / "bridge"
    pkg.mkdir(parents=True)
    (site / "megatron" / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    (pkg / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    (pkg / "config.py").write_text("class C:\n    x: int = 1\n")
    info = site / "megatron_bridge-9.8.7.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: megatron-bridge\nVersion: 9.8.7\n")
    (info / "RECORD").write_text("megatron/__init__.py,,\nmegatron/bridge/__init__.py,,\nmegatron/bridge/config.py,,\n")
    monkeypatch.syspath_prepend(str(site))
    src = sources.from_installed("bridge")
    assert src is not None and src.version == "9.8.7" and src.kind == "installed"
    assert "class C" in src.read_text("megatron/bridge/config.py")
    assert src.python_files() == ["megatron/bridge/__init__.py", "megatron/bridge/config.py"]
    assert "megatron" not in sys.modules and "megatron.bridge" not in sys.modules


def test_folder_layouts_and_versions(bridge_src, mcore_src, bridge_wheel, mcore_wheel):
    b = sources.locate("bridge", str(bridge_src))
    m = sources.locate("mcore", str(mcore_src))
    assert (b.kind, b.version) == ("folder", PINNED_BRIDGE)
    assert (m.kind, m.version) == ("folder", PINNED_MCORE)
    # Pointing at the package folder itself works too.
    assert sources.locate("bridge", str(bridge_src / "megatron" / "bridge")).version == PINNED_BRIDGE
    bw, mw = sources.locate("bridge", str(bridge_wheel)), sources.locate("mcore", str(mcore_wheel))
    assert (bw.kind, bw.version, mw.version) == ("wheel", PINNED_BRIDGE, PINNED_MCORE)
    assert bw.read_text("megatron/bridge/training/config.py") == b.read_text("megatron/bridge/training/config.py")
    # A Bridge wheel is not a Megatron-Core source.
    assert sources.locate("mcore", str(bridge_wheel)) is None


def test_owner_of_paths():
    assert sources.owner_of("megatron/bridge/training/config.py") == "bridge"
    assert sources.owner_of("megatron/core/distributed/x.py") == "mcore"
    assert sources.owner_of("megatron/training/arguments.py") == "mcore"
    assert sources.owner_of("megatron/other/x.py") is None


def test_sources_module_never_uses_find_spec():
    import ast

    tree = ast.parse(Path(sources.__file__).read_text())
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert "find_spec" not in attrs | names, "find_spec imports parent packages"


# ------------------------------------------------------------------ the real wheels


def _run_json(cli, *args, cwd=None):
    proc = cli("anchors", "--format", "json", *args, cwd=cwd)
    return proc, (json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None)


def test_every_anchor_of_the_skill_is_found_in_the_pinned_wheels(cli, bridge_wheel, mcore_wheel, root):
    proc, out = _run_json(cli, "--bridge-src", str(bridge_wheel), "--mcore-src", str(mcore_wheel))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out["bridge_version"] == PINNED_BRIDGE and out["mcore_version"] == PINNED_MCORE
    assert len(out["anchors"]) >= 20, "the skill cites its facts"
    for a in out["anchors"]:
        assert set(a) >= {"file", "symbol", "status", "lines"}
        assert a["status"] == "found", a
        assert a["lines"][0] <= a["lines"][1]
    # Every citation in the documents is in the report.
    cited = {(a.file, a.symbol) for a in anchors.collect(root)}
    assert cited == {(a["file"], a["symbol"]) for a in out["anchors"]}


def test_reported_lines_point_at_the_cited_thing(cli, bridge_src, mcore_src):
    proc, out = _run_json(cli, "--bridge-src", str(bridge_src), "--mcore-src", str(mcore_src))
    assert proc.returncode == 0, proc.stderr
    for a in out["anchors"]:
        root = bridge_src if a["source"] == "bridge" else mcore_src
        lines = (root / a["file"]).read_text().splitlines()
        first = lines[a["lines"][0] - 1]
        if a["kind"] == "symbol":
            name = a["symbol"].rsplit(".", 1)[-1]
            assert name in first, (a, first)
        else:
            span = " ".join(lines[a["lines"][0] - 1 : a["lines"][1]])
            word = max(a["symbol"].replace("...", "").split(), key=len).strip("'\".,!{}")
            assert word in span, (a, span)


def test_one_folder_holding_both_packages_serves_both(cli, tmp_path, bridge_src, mcore_src):
    both = tmp_path / "site"
    (both / "megatron").mkdir(parents=True)
    for s, pkgs in ((bridge_src, ["bridge"]), (mcore_src, ["core", "training"])):
        for p in pkgs:
            (both / "megatron" / p).symlink_to(s / "megatron" / p)
    proc, out = _run_json(cli, "--bridge-src", str(both))
    assert proc.returncode == 0, proc.stderr
    assert out["mcore_version"] == PINNED_MCORE  # from megatron/core/package_info.py


def test_text_report_names_versions_and_counts(cli, bridge_wheel, mcore_wheel):
    proc = cli("anchors", "--bridge-src", str(bridge_wheel), "--mcore-src", str(mcore_wheel))
    assert proc.returncode == 0
    assert f"megatron-bridge {PINNED_BRIDGE}" in proc.stdout and f"megatron-core {PINNED_MCORE}" in proc.stdout
    n = len(anchors.collect(Path(__file__).resolve().parents[2]))
    assert f"{n}/{n} anchors found" in proc.stdout


# ------------------------------------------------------------------ drift


def _edited_bridge_copy(bridge_src: Path, dest: Path) -> Path:
    """A Bridge source tree with the cited files only, then edited the ways code drifts."""
    skill = Path(__file__).resolve().parents[2]
    cited = {a.file for a in anchors.collect(skill) if a.file.startswith("megatron/bridge/")}
    for rel in cited | {"megatron/bridge/package_info.py"}:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(bridge_src / rel, dest / rel)
    cfg = dest / "megatron/bridge/training/config.py"
    text = cfg.read_text()
    # moved within the file: 7 new lines on top shift every line range
    text = "\n".join(f"# padding {i}" for i in range(7)) + "\n" + text
    # renamed method
    text = text.replace("def _validate_and_apply_megatron_fsdp_configs(", "def _validate_megatron_fsdp(")
    # reworded assertion
    text = text.replace(
        '"Megatron-FSDP requires the fsdp_dtensor checkpointing format!"',
        '"Megatron-FSDP requires the fsdp_dtensor checkpoint format."',
    )
    cfg.write_text(text)
    # moved to another file
    ck = dest / "megatron/bridge/training/checkpointing.py"
    text = ck.read_text()
    start = text.index("def _get_checkpoint_format(")
    end = text.index("\ndef ", start + 10)
    (dest / "megatron/bridge/training/format_detection.py").write_text("import os\n\n\n" + text[start:end] + "\n")
    ck.write_text(text[:start] + text[end:])
    return dest


def test_edited_copy_reports_moved_renamed_and_reworded_anchors(cli, tmp_path, bridge_src, mcore_wheel):
    pristine = sources.locate("bridge", str(bridge_src))
    orig_lines = anchors.FileIndex(pristine.read_text("megatron/bridge/training/config.py")).find_symbol(
        "ConfigContainer.validate"
    )
    edited = _edited_bridge_copy(bridge_src, tmp_path / "bridge")
    proc, out = _run_json(cli, "--bridge-src", str(edited), "--mcore-src", str(mcore_wheel))
    assert proc.returncode == 1, proc.stderr
    by = {(a["file"], a["symbol"]): a for a in out["anchors"]}
    cfg = "megatron/bridge/training/config.py"

    shifted = by[(cfg, "ConfigContainer.validate")]
    assert shifted["status"] == "found" and shifted["lines"] == [orig_lines[0] + 7, orig_lines[1] + 7]

    renamed = by[(cfg, "ConfigContainer._validate_and_apply_megatron_fsdp_configs")]
    assert renamed["status"] == "drifted" and renamed["lines"] is None
    assert renamed["nearest"]["symbol"] == "ConfigContainer._validate_megatron_fsdp"

    reworded = by[(cfg, "Megatron-FSDP requires the fsdp_dtensor checkpointing format!")]
    assert reworded["status"] == "drifted"
    assert reworded["nearest"]["symbol"] == "Megatron-FSDP requires the fsdp_dtensor checkpoint format."

    moved = by[("megatron/bridge/training/checkpointing.py", "_get_checkpoint_format")]
    assert moved["status"] == "drifted"
    assert moved["nearest"]["file"] == "megatron/bridge/training/format_detection.py"
    assert moved["nearest"]["lines"][0] == 4

    untouched = [a for a in out["anchors"] if a["source"] == "mcore"]
    assert untouched and all(a["status"] == "found" for a in untouched)

    text = cli("anchors", "--bridge-src", str(edited), "--mcore-src", str(mcore_wheel))
    assert text.returncode == 1
    assert "nearest: megatron/bridge/training/format_detection.py" in text.stdout
    assert "drifted" in text.stdout


def test_deleted_file_suggests_the_closest_path(cli, tmp_path, bridge_src, mcore_wheel):
    edited = _edited_bridge_copy(bridge_src, tmp_path / "bridge")
    perf = edited / "megatron/bridge/perf_recipes/llama/b200/llama3.py"
    perf.rename(perf.with_name("llama3_perf.py"))
    proc, out = _run_json(cli, "--bridge-src", str(edited), "--mcore-src", str(mcore_wheel))
    a = next(a for a in out["anchors"] if a["file"].endswith("b200/llama3.py"))
    # The function still exists in the renamed file, so it is reported as moved there.
    assert a["status"] == "drifted" and a["nearest"]["file"].endswith("b200/llama3_perf.py")


# ------------------------------------------------------------------ bad input


def test_no_source_available_exits_2_with_one_line(cli, tmp_path):
    import importlib.metadata as md

    try:
        md.distribution("megatron-bridge")
        pytest.skip("megatron-bridge is installed here; the no-source case cannot be shown")
    except md.PackageNotFoundError:
        pass
    proc = cli("anchors", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--bridge-src" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("bad", ["/nonexistent/dir", __file__])
def test_unusable_source_argument_exits_2(cli, bad, mcore_wheel):
    proc = cli("anchors", "--bridge-src", bad, "--mcore-src", str(mcore_wheel))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--bridge-src" in proc.stderr


def test_skill_dir_without_anchors_exits_2(cli, tmp_path, bridge_wheel, mcore_wheel):
    (tmp_path / "SKILL.md").write_text("---\nname: x\ndescription: y\n---\nno anchors here\n")
    proc = cli(
        "anchors", "--skill-dir", str(tmp_path), "--bridge-src", str(bridge_wheel), "--mcore-src", str(mcore_wheel)
    )
    assert proc.returncode == 2 and "no code anchors" in proc.stderr


def test_anchor_to_a_path_no_distribution_ships_is_drifted(cli, tmp_path, bridge_wheel, mcore_wheel):
    (tmp_path / "SKILL.md").write_text(
        "`megatron/bridge/training/config.py` :: `ConfigContainer`\n`megatron/legacy/model.py` :: `GPT`\n"
    )
    proc, out = _run_json(
        cli, "--skill-dir", str(tmp_path), "--bridge-src", str(bridge_wheel), "--mcore-src", str(mcore_wheel)
    )
    assert proc.returncode == 1
    assert [a["status"] for a in out["anchors"]] == ["found", "drifted"]
