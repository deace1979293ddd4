"""SCRIPTED STAND-IN FOR A LANGUAGE MODEL JUDGE (tests only; it measures nothing and judges nothing).

``python3 tests/scripted_judge.py VERDICT [--log FILE]`` reads the judge's prompt on stdin, as a real judge
command (``claude -p``) would, and answers the fixed VERDICT it was started with: ``pass`` / ``fail`` print a
verdict object; ``garbage`` prints no verdict; ``exit3`` fails. ``--log`` keeps the prompt it was given, so a test can
see what a real judge would have read. Used by tests/test_evals_judge.py and the end-to-end runs to test the judge's
plumbing (``python3 -m evals grade --judge CMD``), never its judgement.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    verdict = argv[0] if argv else "pass"
    prompt = sys.stdin.read()
    if "--log" in argv:
        with open(argv[argv.index("--log") + 1], "w", encoding="utf-8") as f:
            f.write(prompt)
    if verdict == "exit3":
        sys.stderr.write("scripted stand-in: asked to fail\n")
        return 3
    if verdict == "garbage":
        print("I think it is probably fine.")
        return 0
    print("SCRIPTED JUDGE (stand-in, not a model)")
    print(json.dumps({"passed": verdict == "pass", "reason": f"scripted stand-in: {verdict}"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
