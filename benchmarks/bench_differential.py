#!/usr/bin/env python3
"""How often ``mfsdp.py check`` agrees with the real Megatron-Bridge, over recorded verdicts.

Reads ``tests/fixtures/differential/verdicts.json`` (real ``runtime_config_update()``
verdicts recorded with ``tests/differential/gen_verdicts.py`` on a
GPU machine), replays every case through our rule table (``mfsdp_lib.rules.differential``)
and writes ``benchmarks/results/differential_agreement.json``: how many rejections we
reproduce, how many name the same rule as Bridge's message, and how many acceptances
we leave alone (with the documented exceptions counted separately).

    python3 benchmarks/bench_differential.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from mfsdp_lib import config_io  # noqa: E402
from mfsdp_lib.rules import differential  # noqa: E402

VERDICTS = ROOT / "tests" / "fixtures" / "differential" / "verdicts.json"
RESULT = ROOT / "benchmarks" / "results" / "differential_agreement.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--verdicts", default=str(VERDICTS))
    ap.add_argument("--out", default=str(RESULT))
    a = ap.parse_args(argv)
    if not Path(a.verdicts).is_file():
        print(
            f"{a.verdicts}: not present (tests/differential/gen_verdicts.py writes it on a GPU machine)",
            file=sys.stderr,
        )
        return 2
    doc, base = differential.load(a.verdicts)
    records = differential.replay(doc, base)
    s = differential.summary(records)
    rows = [
        ["cases with a real Bridge verdict", s["cases"] - s["no_verdict"], ""],
        ["Bridge rejected", s["bridge_rejected"], ""],
        ["  check rejected too", s["we_rejected_too"], f"{s['we_rejected_too']}/{s['bridge_rejected']}"],
        [
            "  same rule as Bridge's message",
            s["exact_rule"],
            f"{s['bridge_message_without_quote']} had a bare assert with no message to match",
        ],
        ["Bridge accepted", s["bridge_accepted"], ""],
        ["  check found no error", s["we_accepted_too"], ""],
        ["  documented exceptions (runtime-stage errors, misspelt enums)", s["documented_exceptions"], ""],
        ["disagreements", s["disagreements"], "target 0"],
    ]
    doc_out = {
        "benchmark": "differential_agreement",
        "title": "check vs. the real Megatron-Bridge runtime_config_update() on recorded configs",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": (
            f"replayed on {platform.system()} {platform.machine()}, Python {platform.python_version()}; "
            f"verdicts: {doc.get('generated_by', '?')}"
        ),
        "command": shlex.join(
            ["python3", "benchmarks/bench_differential.py"]
            + (["--verdicts", a.verdicts] if a.verdicts != str(VERDICTS) else [])
            + (["--out", a.out] if a.out != str(RESULT) else [])
        ),
        "columns": ["measure", "cases", "note"],
        "rows": rows,
        "notes": [
            f"Verdicts recorded {doc.get('date')} with megatron-bridge {doc.get('bridge_version')}.",
            "Documented exceptions: Bridge accepts the config but the job fails after validate() (stage "
            "'runtime': FSDP2 with the ddp flag, HSDP outer sharding without full sharding), or a misspelt "
            "enum that Bridge stores unchecked and check refuses as input.",
        ],
        "raw": {"summary": s, "records": records},
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    config_io.write_atomic(str(out), json.dumps(doc_out, indent=1) + "\n")
    print(
        f"{s['we_rejected_too']}/{s['bridge_rejected']} rejections reproduced ({s['exact_rule']} same rule), "
        f"{s['we_accepted_too']}+{s['documented_exceptions']}/{s['bridge_accepted']} acceptances, "
        f"{s['disagreements']} disagreements -> {out}"
    )
    return 0 if s["disagreements"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
