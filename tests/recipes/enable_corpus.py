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
* a training batch that does not divide by micro-batch x DP at the recipe's world (PP 1 grows DP): the nearest
  valid value enable names; an eval batch alone: ``--fit-eval-batch``. A decision can reveal the next (PP first,
  then the batch at the new DP), so this runs up to three rounds, the same decisions ``gen_corpus.py`` takes;
* nothing else: a recipe refused for another reason (Muon, offloading ...) gets no output, only its reason.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MFSDP = ROOT / "scripts" / "mfsdp.py"
CORPUS = ROOT / "tests" / "fixtures" / "recipes"
ROUNDS = 3


def _decisions(findings: list[dict], taken: list[str], peft_base: str = "/workspace") -> list[str]:
    """The arguments that decide this round's refusals (the batch once PP is 1; a key never twice); ``peft_base``
    is the base checkpoint a PEFT user names (benchmarks/bench_what_works.py takes the same decisions)."""
    rules = {f["rule"] for f in findings}
    out: list[str] = []
    for f in sorted(findings, key=lambda f: f["rule"]):
        rule = f["rule"]
        if rule.endswith("-BATCH-DP") and "MFSDP-PIPELINE-PARALLEL" in rules:
            continue
        if rule == "MFSDP-EVAL-BATCH-DP" and "MFSDP-TRAIN-BATCH-DP" in rules:
            continue
        if rule == "MFSDP-PIPELINE-PARALLEL":
            args = ["--set-pp-1"]
        elif rule == "MFSDP-PEFT-NEEDS-PRETRAINED":
            args = [f"checkpoint.pretrained_checkpoint={peft_base}"]
        elif rule == "MFSDP-TRAIN-BATCH-DP":
            m = re.match(r"^([A-Za-z_][\w.]*=\d+)\b", f.get("fix", ""))
            args = [m.group(1)] if m else []
        elif rule == "MFSDP-EVAL-BATCH-DP":
            args = ["--fit-eval-batch"]
        else:
            args = []
        out += [a for a in args if a.split("=", 1)[0] not in {t.split("=", 1)[0] for t in taken + out}]
    return out


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
    rec["error_findings"] = [f for f in rep.get("findings", []) if f["severity"] == "error"]
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
        for _ in range(ROUNDS):
            more = _decisions(rec.get("error_findings", []), extra) if rec["rc"] != 0 else []
            if not more:
                break
            extra += more
            rec = _enable(src, extra, None)
        rec = _enable(src, extra, out / src.name)
        rec.pop("error_findings", None)
        index[src.stem] = rec
        print(f"{src.stem}: rc={rec['rc']} {' '.join(extra)} {','.join(rec.get('errors', []))}", file=sys.stderr)
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    written = sum(1 for r in index.values() if r.get("written"))
    print(f"{written}/{len(index)} enabled configs written to {out}; refusals in {out / 'index.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
