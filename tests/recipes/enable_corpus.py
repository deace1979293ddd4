#!/usr/bin/env python3
"""Run ``mfsdp.py enable`` on every recipe of the corpus, taking the user's decisions a real user would take.

For each ``tests/fixtures/recipes/yaml/<recipe>.yaml`` this writes ``OUT/<recipe>.yaml``: ``enable``'s output,
so that a GPU machine can ask the real Bridge whether each one passes ``validate()``::

    python3 tests/recipes/enable_corpus.py --out OUT
    python3 tests/recipes/gen_corpus.py --out RESULTS --validate-yaml OUT/*.yaml     # on the GPU machine

``enable`` refuses a config that needs a decision; the decisions taken here, and recorded per recipe in
``OUT/index.json`` (with every change ``enable`` listed and whatever it still refused):

* pipeline parallelism: ``--set-pp-1``;
* a PEFT recipe without a base checkpoint: ``checkpoint.pretrained_checkpoint=/workspace`` (an existing
  folder on the GPU machine: ``--validate-yaml`` maps ``/workspace`` to its working directory);
* nothing else: a recipe refused for another reason (Muon, offloading ...) gets no output, only its reason.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MFSDP = ROOT / "scripts" / "mfsdp.py"
CORPUS = ROOT / "tests" / "fixtures" / "recipes"
DECISIONS = {
    "MFSDP-PIPELINE-PARALLEL": ["--set-pp-1"],
    "MFSDP-PEFT-NEEDS-PRETRAINED": ["checkpoint.pretrained_checkpoint=/workspace"],
}


def _enable(src: Path, extra: list[str], out: Path | None) -> dict:
    cmd = [sys.executable, str(MFSDP), "enable", str(src), *extra, "--emit", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    rec = {"rc": p.returncode, "args": extra}
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        return {**rec, "error": (p.stderr or p.stdout)[-2000:]}
    rec["changes"] = rep.get("changes", [])
    rec["errors"] = sorted({f["rule"] for f in rep.get("findings", []) if f["severity"] == "error"})
    rec["notes"] = rep.get("notes", [])
    if out is not None and p.returncode == 0:
        w = subprocess.run(
            [sys.executable, str(MFSDP), "enable", str(src), *extra, "-o", str(out), "--force"],
            capture_output=True,
            text=True,
            check=False,
        )
        rec["written"] = w.returncode == 0
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the enabled YAMLs and index.json")
    ap.add_argument("--corpus", default=str(CORPUS), help="corpus folder holding yaml/ (default: %(default)s)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    index = {}
    for src in sorted((Path(a.corpus) / "yaml").glob("*.yaml")):
        extra: list[str] = []
        rec = _enable(src, extra, None)
        for rule, args in DECISIONS.items():
            if rule in rec.get("errors", []):
                extra += args
        rec = _enable(src, extra, out / src.name)
        index[src.stem] = rec
        print(f"{src.stem}: rc={rec['rc']} {' '.join(extra)} {','.join(rec.get('errors', []))}", file=sys.stderr)
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    written = sum(1 for r in index.values() if r.get("written"))
    print(f"{written}/{len(index)} enabled configs written to {out}; refusals in {out / 'index.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
