#!/usr/bin/env python3
"""skill_signature: sign and verify the whole skill folder (skill.oms.sig).

The skill ships executable scripts, so its signature covers every file that
``npx skills add`` installs, not only the documents; an added, removed or
changed file fails ``verify`` with its name. The bundle has the shape of
NVIDIA's signed skills (OpenSSF Model Signing: Sigstore bundle v0.3, x509
chain, DSSE over an in-toto statement), so ``verify`` also checks NVIDIA's.
Which files are signed, and why build products such as ``.venv`` are not, is
explained in ``scripts/mfsdp_lib/integrity/signature.py``.

Needs ``model-signing`` and ``pyopenssl`` (``bash scripts/dev.sh test`` installs
them into ``.venv``); ``files`` needs the standard library only.
"""

from __future__ import annotations

import os
import sys

# Never write bytecode into the skill folder (verify reports any .pyc), and never read a __pycache__ entry
# planted beside the signed sources (the cache prefix cannot exist). Set before the library is imported.
sys.dont_write_bytecode = True
sys.pycache_prefix = os.path.join(os.devnull, "no-bytecode")

import argparse  # noqa: E402

_HERE = os.path.dirname(os.path.realpath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


def _refuse_unsigned_bytecode(here: str) -> None:
    """Exit 2 when a sourceless ``.pyc`` sits among the skill's scripts (see SECURITY.md).

    Python imports a ``name.pyc`` found on sys.path when no ``name.py`` comes first, and the signature does
    not cover it. (``__pycache__`` bytecode is never read: ``sys.pycache_prefix`` points elsewhere.)
    """
    for dirpath, dirnames, filenames in os.walk(here):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        bad = [os.path.join(dirpath, f) for f in filenames if f.endswith((".pyc", ".pyo"))]
        if bad:
            sys.stderr.write(
                f"{os.path.basename(sys.argv[0] or 'mfsdp.py')}: error: compiled bytecode in the skill folder "
                f"({bad[0]}) is not covered by the signature and could run instead of the signed source; "
                f"remove it (find {here} -name '*.py[co]' -delete) and check the folder with "
                "skill_signature.py verify\n"
            )
            sys.exit(2)


if os.path.basename(_HERE) == "scripts":  # inside a skill folder (an installed mfsdp-verify has nothing to guard)
    _refuse_unsigned_bytecode(_HERE)

from mfsdp_lib.findings import EXIT_FINDINGS, EXIT_INPUT, InputError  # noqa: E402

PROG = "skill_signature.py"
EXIT_INTERNAL = 3

DESCRIPTION = """\
Sign or verify skill.oms.sig over every file of the skill.

examples:
  # maintainers: re-sign after any change (same as: bash scripts/dev.sh sign)
  skill_signature.py sign --key "$MFSDP_SIGNING_DIR/leaf.key.pem" --cert "$MFSDP_SIGNING_DIR/leaf.crt.pem" \\
      --chain "$MFSDP_SIGNING_DIR/ica.crt.pem" --chain "$MFSDP_SIGNING_DIR/root.crt.pem"
  # users: verify an installed copy against the root you trust, with a verifier from OUTSIDE that copy
  # (this file inside the copy is checked by itself otherwise; see SECURITY.md), and pin the release
  mfsdp-verify --root ROOT.pem --expect-version 0.1.0 .claude/skills/nemo-mbridge-perf-megatron-fsdp
  # list the files the signature covers
  skill_signature.py files

exit codes: 0 verified/signed, 1 verification failed (each failing file is named), 2 unusable input.
"""


def _default_root() -> str:
    # The copy of the maintainers' root shipped in the skill. Convenient, not independent: whoever can
    # replace the skill can replace it too, so pass a root you obtained separately when it matters.
    return os.path.join(os.path.dirname(_HERE), "signing", "root.crt.pem")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    s = sub.add_parser(
        "sign",
        help="write DIR/skill.oms.sig over every file of the skill",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=DESCRIPTION,
    )
    s.add_argument("dir", nargs="?", metavar="DIR", help="skill folder (default: this skill)")
    s.add_argument("--key", required=True, help="private key (PEM) of the signing certificate")
    s.add_argument("--cert", required=True, help="signing (leaf) certificate, PEM")
    s.add_argument(
        "--chain",
        action="append",
        default=[],
        metavar="PEM",
        help="chain certificate, repeat in order: intermediate, then root",
    )
    s.add_argument("--output", metavar="PATH", help="write the bundle here instead of DIR/skill.oms.sig")
    s.add_argument(
        "--allow-untracked",
        action="store_true",
        help="sign even when the folder and git's tracked files disagree (not for releases)",
    )
    v = sub.add_parser(
        "verify",
        help="check DIR against its skill.oms.sig and a trusted root",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=DESCRIPTION,
    )
    v.add_argument("dir", nargs="?", metavar="DIR", help="skill folder (default: this skill)")
    v.add_argument(
        "--root",
        default=None,
        metavar="PEM",
        help="trusted root certificate (default: signing/root.crt.pem shipped with this skill)",
    )
    v.add_argument("--signature", metavar="PATH", help="bundle to check (default: DIR/skill.oms.sig)")
    v.add_argument(
        "--expect-version",
        metavar="X.Y.Z",
        help="fail unless the signed card.yaml says this release (an older signed release verifies otherwise)",
    )
    v.add_argument(
        "--dev-tree",
        action="store_true",
        help="maintainers' working tree: also accept top-level .venv/.cache/... and __pycache__ (never for an "
        "installed copy)",
    )
    f = sub.add_parser("files", help="list the files the signature covers")
    f.add_argument("dir", nargs="?", metavar="DIR", help="skill folder (default: this skill)")
    return p


def run(args) -> int:
    from mfsdp_lib.integrity import signature as sig

    root = sig.skill_root(args.dir)
    if args.command == "files":
        for name in sig.signed_files(root):
            print(name)
        return 0
    if args.command == "sign":
        out, files = sig.sign(root, args.key, args.cert, args.chain, args.output, args.allow_untracked)
        print(f"signed {len(files)} files of {root} as '{sig.SKILL_NAME}' -> {out}")
        return 0
    trust = args.root or _default_root()
    if _inside(root, _HERE):
        sys.stderr.write(
            f"{PROG} verify: note: this verifier runs from inside the folder it checks, so a tampered folder "
            "could vouch for itself; for a check that matters use a verifier installed from outside it "
            "(mfsdp-verify, or model-signing's own CLI; see SECURITY.md)\n"
        )
    if args.root is None:
        sys.stderr.write(
            f"{PROG} verify: note: no --root given: using the root certificate shipped inside the folder, which "
            "proves the folder is consistent, not who signed it\n"
        )
    try:
        ok = sig.verify(root, trust, args.signature, expect_version=args.expect_version, dev_tree=args.dev_tree)
    except sig.VerificationError as exc:
        sys.stdout.flush()
        sys.stderr.write(f"{PROG} verify: FAILED for {root}: {exc}\n")
        for problem in exc.problems:
            sys.stderr.write(f"  {problem}\n")
        return EXIT_FINDINGS
    chain = " <- ".join(ok.chain) if ok.chain else ok.signer
    print(
        f"verified: {len(ok.files)} files of {root} match skill.oms.sig, and no other file is there "
        f"(subject '{ok.subject}', release {ok.version or 'unknown'}, "
        f"signed by '{ok.signer}', chain {chain}, root {trust})"
    )
    return 0


def _inside(root, here: str) -> bool:
    r, h = os.path.realpath(str(root)), os.path.realpath(here)
    return h == r or h.startswith(r.rstrip(os.sep) + os.sep)


def verify_main() -> int:
    """The ``mfsdp-verify`` entry point: ``skill_signature.py verify`` installed outside the folder it checks."""
    return main(["verify", *sys.argv[1:]])


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return EXIT_INPUT
    try:
        return run(args)
    except InputError as exc:
        sys.stderr.write(f"{PROG} {args.command}: error: {exc}\n")
        return EXIT_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug in the skill: one line, traceback only on request
        if os.environ.get("MFSDP_DEBUG") == "1":
            raise
        sys.stderr.write(
            f"{PROG} {args.command}: internal error: {type(exc).__name__}: {exc} "
            f"(rerun with MFSDP_DEBUG=1 for the traceback)\n"
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
