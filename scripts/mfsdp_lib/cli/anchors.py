"""``mfsdp.py anchors``: prove the skill's code citations against real Megatron source.

Every anchor in SKILL.md and references/*.md (syntax: see ``anchors`` module)
is looked up in the Megatron-Bridge / Megatron-Core source - by default the
installed distributions, found through package metadata without importing them
(see ``sources``), or a folder / wheel given on the command line. The report
says, per anchor, whether it is still there (with today's line range) or has
drifted (with the nearest match), and which versions were checked against the
pinned ones, so an agent knows whether to trust a citation before acting on it.

Exit codes: 0 every anchor found; 1 at least one drifted; 2 no source to check
against (or no anchors, or an unreadable --*-src).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .. import PINNED_BRIDGE, PINNED_MCORE
from ..findings import InputError
from ..integrity import anchors as _anchors
from ..integrity import sources as _sources

DESCRIPTION = """\
Verify the skill's code anchors (file + function/class/field or assertion text)
against the installed Megatron-Bridge and Megatron-Core, or a given source.

examples:
  mfsdp.py anchors                                   # installed packages
  mfsdp.py anchors --bridge-src megatron_bridge-0.6.2-py3-none-any.whl \\
                   --mcore-src megatron_core-0.19.2-cp312-...whl
  mfsdp.py anchors --bridge-src ~/Megatron-Bridge --mcore-src ~/Megatron-LM
  mfsdp.py anchors --bridge-src /usr/lib/python3/site-packages --format json
"""

EPILOG = """\
A folder may be a site-packages / unpacked-wheel folder (holding megatron/bridge
or megatron/core), a Megatron-Bridge checkout (src/megatron/bridge) or a
Megatron-LM checkout (megatron/core). One folder holding both packages serves
for both. Exit codes: 0 all found, 1 any drifted, 2 no source to check against.
"""

PINNED = {"bridge": PINNED_BRIDGE, "mcore": PINNED_MCORE}
DEFAULT_SKILL_DIR = Path(__file__).resolve().parents[3]  # scripts/mfsdp_lib/cli -> skill root


def configure(parser) -> None:
    parser.add_argument(
        "--bridge-src",
        metavar="DIR|WHEEL",
        help="Megatron-Bridge source: folder or .whl (default: the installed megatron-bridge)",
    )
    parser.add_argument(
        "--mcore-src",
        metavar="DIR|WHEEL",
        help="Megatron-Core source: folder or .whl (default: the installed megatron-core)",
    )
    parser.add_argument(
        "--skill-dir",
        metavar="DIR",
        default=str(DEFAULT_SKILL_DIR),
        help="skill folder whose SKILL.md and references/*.md are read (default: this skill)",
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")


def _locate(which: str, given: str | None):
    src = _sources.locate(which, given)
    if given and src is None:
        name = _sources.DISTRIBUTIONS[which]
        raise InputError(
            f"--{which}-src {given}: "
            f"no {name} sources there (want a folder holding "
            f"{_sources.PACKAGE_PREFIXES[which][0]} or a {name.replace('-', '_')} wheel)"
        )
    return src


def run(args) -> int:
    skill_dir = Path(args.skill_dir)
    if not (skill_dir / "SKILL.md").is_file():
        raise InputError(f"{skill_dir}: no SKILL.md there")
    anchors = _anchors.collect(skill_dir)
    if not anchors:
        raise InputError(f"{skill_dir}: no code anchors cited in SKILL.md or references/*.md")

    srcs = {"bridge": _locate("bridge", args.bridge_src), "mcore": _locate("mcore", args.mcore_src)}
    # One folder often holds both (a site-packages folder, an unpacked pair of wheels).
    for which, other in (("bridge", "mcore"), ("mcore", "bridge")):
        if srcs[which] is None and srcs[other] is not None and srcs[other].kind == "folder":
            srcs[which] = _sources.from_folder(which, srcs[other].location)
    needed = sorted({w for w in (_sources.owner_of(a.file) for a in anchors) if w is not None})
    missing = [w for w in needed if srcs.get(w) is None]
    if missing:
        names = " and ".join(_sources.DISTRIBUTIONS[w] for w in missing)
        flags = " ".join(f"--{w}-src DIR|WHEEL" for w in missing)
        raise InputError(f"{names} not installed here and no source given; pass {flags}")

    checked = _anchors.check_all(anchors, srcs)
    drifted = [a for a in checked if a.status != "found"]
    versions = {w: (srcs[w].version if srcs.get(w) else None) for w in ("bridge", "mcore")}

    if args.format == "json":
        json.dump(
            {
                "ok": not drifted,
                "bridge_version": versions["bridge"],
                "mcore_version": versions["mcore"],
                "pinned": {"bridge_version": PINNED["bridge"], "mcore_version": PINNED["mcore"]},
                "sources": {w: s.describe() for w, s in srcs.items() if s is not None},
                "anchors": [a.to_json() for a in checked],
            },
            sys.stdout,
            indent=2,
        )
        sys.stdout.write("\n")
    else:
        _render_text(checked, srcs, versions)
    return 1 if drifted else 0


def _render_text(checked, srcs, versions) -> None:
    out = sys.stdout
    for which in ("bridge", "mcore"):
        src = srcs.get(which)
        if src is None:
            continue
        pin = PINNED[which]
        flag = "" if versions[which] == pin else f"  (skill pinned to {pin}: expect drift)"
        out.write(f"{src.describe()}{flag}\n")
    width = max(len(a.file) for a in checked)
    for a in checked:
        what = f"`{a.symbol}`" if a.kind == "symbol" else f'"{a.symbol}"'
        if a.status == "found":
            out.write(f"  found    {a.file:<{width}} :: {what}  lines {a.lines[0]}-{a.lines[1]}\n")
        else:
            out.write(f"  {a.status:<8} {a.file:<{width}} :: {what}  ({a.note}; cited in {', '.join(a.cited_in)})\n")
            if a.nearest:
                n = a.nearest
                where = f" lines {n['lines'][0]}-{n['lines'][1]}" if n.get("lines") else ""
                sym = f" :: {n['symbol']}" if n.get("symbol") else ""
                out.write(f"           nearest: {n['file']}{sym}{where}\n")
    found = sum(a.status == "found" for a in checked)
    out.write(
        f"{found}/{len(checked)} anchors found"
        + ("" if found == len(checked) else f"; {len(checked) - found} drifted: fix the citation or the advice")
        + "\n"
    )
