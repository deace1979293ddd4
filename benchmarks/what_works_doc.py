#!/usr/bin/env python3
"""Generate ``references/what-works.md`` from the measured what-works results.

    python3 benchmarks/what_works_doc.py --write references/what-works.md
    python3 benchmarks/what_works_doc.py --check references/what-works.md     # exit 1 when it has drifted

One table, a row per model family and a column per mode (pretrain, SFT, PEFT); each cell is the measured row of
that family and mode: the verdict (every phase passed, or the phase that failed), the layout at the recipe's world
(before and after ``enable``), memory per GPU between steps and at the peak as measured (``memory``'s prediction
beside it), and the compute throughput. Each failure, fallback and rehearsal limit is a numbered footnote under the
table. Only measured rows are used (``mfsdp_lib.what_works.load``); with none, the generator writes nothing and
exits 1 ("not measured yet"), so the reference never shows a planned row as a result.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from mfsdp_lib import what_works  # noqa: E402
from mfsdp_lib.memory.devices import GPU_PRESETS  # noqa: E402

H100_GIB = GPU_PRESETS["h100"].gib  # what an 80 GB H100 gives a process (measured; devices.py says how)

MODES = ("pretrain", "sft", "peft")
MODE_TITLES = {"pretrain": "pretrain", "sft": "SFT", "peft": "PEFT (LoRA)"}
MARK = {"passed": "passes", "failed": "fails"}


def _layout(layout) -> str:
    if not isinstance(layout, dict):
        return "?"
    parts = [f"{k.upper()}{layout[k]}" for k in ("tp", "pp", "cp", "ep") if (layout.get(k) or 1) > 1]
    parts.append(f"DP{layout.get('dp')}")
    return " ".join(parts)


def _gpus(n) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def _num(x, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else "n/a"


def gpu_name(device: str | None) -> str:
    """The GPU's model from a device string (``NVIDIA H100 80GB HBM3`` -> ``H100``), else the string itself."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,3}[A-Z]?)\b", str(device or ""))
    return m.group(1) if m else str(device or "one GPU")


# Rows whose memory miss is an under-prediction not traced yet: where the references name it (file, the bold
# lead-in of its paragraph) and tell users what headroom to keep. tests/test_what_works_doc.py holds the anchor.
NAMED_MEMORY_GAPS = {
    "glm52_pretrain_416gpu_h100_bf16": ("references/memory.md", "A measured gap, DeepSeek sparse attention"),
}


def cell(row: dict, notes: list[str], name_device: bool = False) -> str:
    """One table cell; ``name_device`` (when the rows were measured on more than one kind of GPU) puts the GPU
    beside the throughput, which depends on it."""
    """One cell's text; footnotes are appended to ``notes`` and referenced by number."""
    v = what_works.verdict(row)
    mem = row.get("memory_gib") or {}
    refs = []

    def note(text: str) -> None:
        notes.append(text)
        refs.append(f"[{len(notes)}]")

    err = row.get("first_error")
    if v.startswith("failed") and isinstance(err, dict):
        rule = err.get("rule") or "no rule"
        # the file and function, no line number: line citations in the references are anchored (mfsdp.py anchors)
        where = f" ({re.sub(r':[0-9]+ in ', ', ', str(err['where']))})" if err.get("where") else ""
        why = err.get("why") or (
            (row.get("expected") or {}).get("why")
            if "limit" in str((row.get("expected") or {}).get("outcome"))
            else None
        )
        note(
            f"{row['recipe']}: {v}: `{str(err.get('message') or '').splitlines()[0][:240]}`{where}; rule: {rule}"
            + (f"; {why}" if why else "")
        )
    cut = row.get("cut")
    if isinstance(cut, dict):
        done = [p for p in ("save", "load") if (row.get("phases") or {}).get(p) == "passed"]
        note(
            f"{row['recipe']}: the {cut.get('phase')} was not run to its end: the {cut.get('by')} cut it after "
            f"the training steps{' and the ' + ' and '.join(done) if done else ''} had passed; the verdict is of "
            "the phases that ran"
        )
    for fb in row.get("fallbacks") or []:
        note(f"{row['recipe']}: ran with `{fb}` (the package the recipe's setting needs was not installed)")
    if (row.get("measured") or {}).get("timing_exclusive") is False:
        note(f"{row['recipe']}: timed while another run of its batch could use the GPU (no shared lock)")
    for ov in row.get("rehearsal_overrides") or []:
        note(f"{row['recipe']}: timed with `{ov}` (fewer micro-batches per step than the recipe)")
    if "vlm" in (row.get("kinds") or []) and (row.get("measured") or {}).get("device"):
        note(
            f"{row['recipe']}: rehearsed on text-only mock batches through Bridge's GPT step: the vision tower is "
            "built, wrapped and sharded but fed no image, so the measured peak and throughput leave out image "
            "activations"
        )
    if "diffusion" in (row.get("kinds") or []) and (row.get("measured") or {}).get("device"):
        note(
            f"{row['recipe']}: a diffusion model, driven by Bridge's own training step on Bridge's mock batches "
            "(their latent tokens, not the recipe's dataset, set the activations); `memory` does not size diffusion "
            "models yet and no token throughput is given"
        )
    if mem.get("as_run"):
        note(
            f"{row['recipe']}: ran with `{'`, `'.join(mem['as_run'])}` (a labelled deviation of the "
            "rehearsal: a kernel package the recipe's setting needs was missing), so `memory` is compared with its "
            'prediction for the job as it ran ("as run")'
        )
    if row.get("forward_only_steps"):
        note(
            f"{row['recipe']}: the timed steps ran no backward (every gradient norm 0.0: the rehearsal feeds text, "
            "and what this recipe trains sees none of it), so the measured peak is a forward pass's and no "
            "training throughput is given; `memory`'s training peak is held only never to be below it "
            "(references/memory.md, section 11)"
        )
    peak = mem.get("measured_peak")
    if v == "passed" and isinstance(peak, (int, float)) and peak > H100_GIB and "_h100_" in str(row.get("id")):
        pp_note = " with PP set to 1" if ((row.get("layout_before") or {}).get("pp") or 1) > 1 else ""
        predicted = mem.get("predicted_peak")
        before = (
            f"`memory` predicted {predicted:.1f} GiB, so `memory CONFIG --gpu-mem-gib h100` says so before a run"
            if isinstance(predicted, (int, float)) and predicted > H100_GIB
            else "`memory` gives no prediction for it"
            if predicted is None
            else f"`memory` predicted {predicted:.1f} GiB"
        )
        note(
            f"{row['recipe']}: its measured peak, {peak:.1f} GiB, is more than an 80 GB H100 gives a process "
            f"({H100_GIB:.2f} GiB): as rehearsed (the enabled job{pp_note}), this rank does not fit the GPU the "
            f"recipe is named for; {before}"
        )
    check = row.get("memory_check") or {}
    if check.get("within_tolerance") is False:
        named = NAMED_MEMORY_GAPS.get(str(row.get("id")))
        note(
            f"{row['recipe']}: `memory` missed the measurement: state {_num(check.get('state_error'), '+.1%')}, "
            f"peak {_num(check.get('peak_error'), '+.1%')} (tolerance: state 3 %, peak 5 %, never under by more "
            "than 1 %)"
            + (f"; the gap is named, with the headroom to keep, in {named[0]} ({named[1]})" if named else "")
        )
    pp = (row.get("layout_before") or {}).get("pp") or 1
    layout = _layout(row.get("layout_before"))
    if row.get("layout_after") and _layout(row.get("layout_after")) != layout:
        layout += f" -> {_layout(row.get('layout_after'))}"
    text = [
        f"**{MARK.get(v, v)}** ({_gpus(row.get('world_size'))}{', PP set to 1' if pp > 1 else ''})",
        layout,
        f"{_num(mem.get('measured_state'), '.1f')} / {_num(mem.get('measured_peak'), '.1f')} GiB "
        f"(pred. {_num(mem.get('predicted_state'), '.1f')} / {_num(mem.get('predicted_peak'), '.1f')}"
        + (
            f"; as run {_num(mem.get('predicted_state_as_run'), '.1f')} / "
            f"{_num(mem.get('predicted_peak_as_run'), '.1f')}"
            if mem.get("as_run")
            else ""
        )
        + ")",
    ]
    tps = row.get("tokens_per_s_per_gpu")
    if isinstance(tps, (int, float)):
        on = f" on {gpu_name((row.get('measured') or {}).get('device'))}" if name_device else ""
        text.append(f"{tps:,.0f} tok/s/GPU compute{on}")
    return "<br>".join(text) + (" " + " ".join(refs) if refs else "")


def fixed_faults(path: str) -> list[dict]:
    """The results file's ``rehearsal_faults`` that were measured again after their fix (``measured_again``)."""
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return []
    faults = data.get("rehearsal_faults") if isinstance(data, dict) else None
    return [f for f in faults or [] if isinstance(f, dict) and f.get("measured_again")]


def coverage(rows: list[dict], plan_rows: list[dict]) -> list[str]:
    """The page's coverage section: the corpus's family x mode cells (families as users name them,
    ``bench_what_works.FAMILY_GROUPS``) with a measured row, then each planned recipe not measured yet with what
    the plan expects of it (a recipe one rank of which does not fit the GPU says so with `memory`'s figure)."""
    from bench_what_works import FAMILY_GROUPS, group_of

    measured = {str(r.get("id")) for r in rows}
    cells = {(group_of(r.get("family")), r.get("mode")) for r in plan_rows}
    have = {(group_of(r.get("family")), r.get("mode")) for r in rows}
    out = [
        "## Coverage",
        "",
        f"{len(cells & have)} of the corpus's {len(cells)} family x mode cells have a measured row, with families "
        "as users name them: "
        + "; ".join(f"{g} ({', '.join(m)})" for g, m in FAMILY_GROUPS.items() if any(c[0] == g for c in cells))
        + ".",
    ]
    missing = sorted(cells - have, key=str)
    if missing:
        out.append("Cells with no measured row: " + ", ".join(f"{g} {m}" for g, m in missing) + ".")
    pending = [r for r in plan_rows if str(r.get("id")) not in measured]
    if pending:
        out += [
            "",
            "Recipes of the corpus not measured yet. What each line gives is the plan's expectation from the CPU "
            "route (`check`, `enable` and Bridge's own validation of the recipe's dump), not a verdict:",
            "",
        ]
        out += [
            f"- `{r.get('recipe')}` ({r.get('family')}, {r.get('mode')}): expected: "
            f"{(r.get('expected') or {}).get('outcome')} ({str((r.get('expected') or {}).get('why') or '').split(';')[0]})"
            for r in pending
        ]
    return out + [""]


def render(rows: list[dict], source: str, faults: list[dict] | None = None, plan_rows: list[dict] | None = None) -> str:
    families: list[str] = []
    for r in rows:
        fam = str(r.get("family"))
        if fam not in families:
            families.append(fam)
    notes: list[str] = []
    lines = [
        "# What works with Megatron FSDP: Bridge's recipes, measured",
        "",
        f"<!-- Generated by benchmarks/what_works_doc.py from {source}; do not edit by hand. -->",
        "",
        "Each cell is one of Megatron-Bridge 0.6.2's own recipes taken through this skill's route: `check`, "
        "`enable` (with `--set-pp-1` where the recipe uses pipeline parallelism), `memory`, then `rehearse --perf` "
        "of the enabled job on ONE GPU as rank 0 of the recipe's world size. A cell gives the verdict, the layout "
        "(before -> after `enable`), memory per GPU between steps / at the peak as measured on that rank with "
        "`memory`'s prediction beside it, and the compute throughput (no communication: the fake process group "
        "moves no data). Where a row saves and loads an `fsdp_dtensor` checkpoint (one row per family), the "
        "save runs at the recipe's world size and the load runs, but with one process standing for the world it "
        'restores no tensor (references/rehearse.md, "Save/load at N > 1"); the round trip is checked at a real '
        "world of 1 (the checkpoint settings in the recommended overrides). `check`, `enable` and `memory` print "
        "the row of a config whose model is in this table.",
        "",
        "| family | " + " | ".join(MODE_TITLES[m] for m in MODES) + " |",
        "|---|" + "---|" * len(MODES),
    ]
    devices = sorted(
        {str((r.get("measured") or {}).get("device")) for r in rows if (r.get("measured") or {}).get("device")}
    )
    measured = [r.get("measured") or {} for r in rows if (r.get("measured") or {}).get("device")]
    at_once = max((int(m["engines_at_once"]) for m in measured if m.get("engines_at_once")), default=None)
    alone = sum(1 for m in measured if m.get("timing_exclusive") is True)
    if measured:
        lines[-2:-2] = [
            f"{alone} of the {len(measured)} measured rows were built, wrapped and timed alone on the GPU: "
            + (
                f"up to {at_once} rehearsals were alive at once so that their imports of Bridge overlapped, but "
                if at_once
                else ""
            )
            + "each took one GPU lock once Bridge had validated its config and held it to its exit "
            "(`measured.timing_exclusive` in the JSON; a row timed without it says so in its note).",
            "",
        ]
    for fam in families:
        cells = []
        for mode in MODES:
            row = next((r for r in rows if r.get("family") == fam and r.get("mode") == mode), None)
            cells.append(f"`{row['recipe']}`<br>" + cell(row, notes, len(devices) > 1) if row else "")
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    lines += ["", f"Measured on: {', '.join(devices) or 'one GPU'}. Source: `{source}`.", ""]
    if plan_rows:
        lines += coverage(rows, plan_rows)
    if notes:
        lines += ["## Notes", ""] + [f"{i}. {n}" for i, n in enumerate(notes, 1)] + [""]
    if faults:
        lines += [
            "## Faults of the rehearsal, fixed and measured again",
            "",
            "These runs first failed on a fault of the rehearsal or of the GPU machine's set-up, not of the recipe "
            "under Megatron FSDP. Each was fixed, and the row above is the run made after the fix.",
            "",
        ]
        lines += [f"- `{f['id']}`: {f.get('fault')}. Fixed: {f.get('fixed')}." for f in faults] + [""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(Path(what_works.RESULTS)))
    from bench_what_works import PLAN_PATH

    ap.add_argument("--plan", default=str(PLAN_PATH), help="the plan (coverage)")
    out = ap.add_mutually_exclusive_group(required=True)
    out.add_argument("--write", metavar="MD")
    out.add_argument("--check", metavar="MD")
    out.add_argument("--print", action="store_true")
    a = ap.parse_args(argv)
    rows = what_works.load(a.results)
    if not rows:
        print(f"what_works_doc: not measured yet: no measured row in {a.results}; nothing written", file=sys.stderr)
        return 1
    try:
        source = str(Path(a.results).resolve().relative_to(ROOT))
    except ValueError:
        source = Path(a.results).name
    plan = json.loads(Path(a.plan).read_text(encoding="utf-8")) if Path(a.plan).is_file() else {}
    text = render(rows, source, fixed_faults(a.results), plan.get("rows") or None)
    if a.print:
        sys.stdout.write(text)
        return 0
    if a.check:
        current = Path(a.check).read_text(encoding="utf-8") if Path(a.check).exists() else None
        if current != text:
            print(f"what_works_doc: {a.check} differs from the results; regenerate it with --write", file=sys.stderr)
            return 1
        return 0
    Path(a.write).write_text(text, encoding="utf-8")
    print(f"{len(rows)} measured rows -> {a.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
