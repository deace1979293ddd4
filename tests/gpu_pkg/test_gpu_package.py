"""The GPU-side package as a whole: thin entry points, no torch at import, one Bridge set-up.

``scripts/rehearse_train.py`` and ``scripts/smoke_train.py`` are started by ``mfsdp.py`` and the
benchmarks; everything they do lives in ``scripts/mfsdp_gpu``. Its modules must import where torch
and Megatron-Bridge are absent (``--help``, the CPU tests, Python 3.10), and what builds a Bridge
model or container must exist once.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPTS = ROOT / "scripts"
PKG = SCRIPTS / "mfsdp_gpu"
ENTRIES = ("rehearse_train.py", "smoke_train.py")
MAX_ENTRY_LINES = 40  # a docstring, the bytecode settings, the path, one import, the call


def _modules() -> list[str]:
    return sorted(p.stem for p in PKG.glob("*.py") if p.stem != "__init__")


def test_every_module_imports_without_torch_or_megatron():
    # torch and megatron made unimportable: a module-level import of either fails this
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['megatron'] = None\n"
        f"sys.path.insert(0, {str(SCRIPTS)!r})\n"
        "import importlib\n"
        f"for m in {_modules()!r}: importlib.import_module('mfsdp_gpu.' + m)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-B", "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_entry_points_are_thin_and_run_the_package():
    for name in ENTRIES:
        text = (SCRIPTS / name).read_text()
        tree = ast.parse(text)
        assert len(text.splitlines()) <= MAX_ENTRY_LINES, name
        assert not [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))], name
        froms = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert [m for m in froms if m and m.startswith("mfsdp_gpu")] == [f"mfsdp_gpu.{name.split('_')[0]}"], name
        assert "sys.dont_write_bytecode = True" in text, name  # the package's imports write no .pyc


def _calls(name: str) -> dict[str, list[str]]:
    """Module -> where it calls ``name(...)`` (by bare or attribute name)."""
    got: dict[str, list[str]] = {}
    for path in sorted(PKG.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if called == name:
                    got.setdefault(path.stem, []).append(f"{path.name}:{node.lineno}")
    return got


def test_the_bridge_set_up_exists_once():
    for ctor in (
        "GPTModelProvider",
        "HybridModelProvider",
        "ConfigContainer",
        "MockGPTDatasetConfig",
        "WanMockDataModuleConfig",
        "TokenizerConfig",
    ):
        assert set(_calls(ctor)) == {"bridge"}, (ctor, _calls(ctor))
    assert set(_calls("WanForwardStep")) == {"workload"}  # the forward step: chosen in one place
    assert set(_calls("runtime_config_update")) <= {"bridge", "checkpoint", "rehearse"}
    assert set(_calls("bridge_setup")) == {"bridge"}  # Bridge's setup(): through bridge.setup only
    assert set(_calls("train")) == {"steps"}  # Bridge's train(): through steps.run_train only
    assert set(_calls("_finish_train")) == {"checkpoint"}


def test_collectives_are_patched_in_one_place():
    assert set(_calls("signature")) == {"collectives", "fakeworld"}  # inspect.signature: the wrapper, the planner
    text = (PKG / "collectives.py").read_text()
    assert "setattr(c10d, name, wrapper)" in text
    others = [p.name for p in PKG.glob("*.py") if p.name != "collectives.py" and "setattr(c10d" in p.read_text()]
    assert others == []


def _package_imports() -> dict[str, set[str]]:
    """Module -> the package modules it imports (at module level or inside functions)."""
    mods = set(_modules())
    got: dict[str, set[str]] = {m: set() for m in mods}
    for m in mods:
        for node in ast.walk(ast.parse((PKG / f"{m}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    got[m].add(node.module.split(".")[0])
                else:
                    got[m].update(a.name for a in node.names)
    return {m: {d for d in deps if d in mods and d != m} for m, deps in got.items()}


def test_package_imports_are_one_way():
    # a cycle (even through a function-level import) means two modules share a name that belongs a floor down
    deps = _package_imports()
    assert deps["bridge"] and deps["presets"], deps  # the walk sees imports at all
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        for d in sorted(deps[m]):
            if d in path:
                cycles.append(path[path.index(d) :] + [d])
            elif len(path) < len(deps):
                visit(d, path + [d])

    for m in sorted(deps):
        visit(m, [m])
    assert not cycles, sorted({" -> ".join(c) for c in cycles})
