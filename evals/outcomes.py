"""Outcome checks: the file a task leaves behind decides whether it was done, not the prose about it.

Why: prose can be phrased in endless ways, right and wrong, and a pattern reader is always one phrasing behind.
A config either passes the skill's own ``check`` at the job's world size or it does not, and a keyword-stuffed
answer cannot fake that. So a case whose question asks for a file (a fixed config, an overrides file, a verdict
file, a repaired tracker) names it here (``evals.checks.CaseChecks.outcome``), with what a right one must hold
beyond passing ``check``: a key kept (``checkpoint.load``, ``checkpoint.save``), a layout (PP 1, EP 8), user
files left as the case's project had them.

The evidence is the project as the run left it (the runner's copy of ``evals/fixtures/<case>``; the adversarial
harness builds the same from an item's steps). Without it there is no outcome to check and the grader falls back
to the prose (``grade(..., workspace=None)``).

``evaluate(outcome, workspace, fixture) -> (verdict, evidence)`` with verdict ``"right"`` or ``"wrong"``: every
part is a fact about files, so a failed part is decisive.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .runcache import RunCache, env_key

ROOT = Path(__file__).resolve().parent.parent
MFSDP = ROOT / "scripts" / "mfsdp.py"
CHECK_TIMEOUT_S = 120  # one `check` run takes well under a second; the margin is for a loaded machine

CONFIG = "config"  # a Bridge YAML (full or partial), checked as `check FILE`
OVERRIDES = "overrides"  # one key=value per line, checked as `check KEY=VALUE ...` on the built-in recipe
JSON = "json"  # a small verdict object the user asked for
TEXT = "text"  # any other file: exact content or lines that must stay
CKPT = "ckpt"  # a checkpoint folder, judged by the skill's own `ckpt` (no error finding: Bridge would load it)
COMMAND = "command"  # a file holding the skill command the user will run elsewhere, judged by its own --dry-run
ESTIMATE = "estimate"  # a JSON answer file whose figure and verdict must be what the skill's `memory` prints

# The five settings that turn Megatron FSDP on in Bridge 0.6.2 (see references/ and the rule table); an artefact
# that "enables" Megatron FSDP must hold all five in its effective config.
FSDP_ON = (
    ("dist.use_megatron_fsdp", (True,)),
    ("ddp.use_megatron_fsdp", (True,)),
    ("ddp.data_parallel_sharding_strategy", ("optim_grads_params",)),
    ("ddp.average_in_collective", (False,)),
    ("checkpoint.ckpt_format", ("fsdp_dtensor",)),
)
EMPTY = (None, "", "none", "null")
ENV_KEYS = "<environment>"  # in ``Outcome.settled_keys``: every environment variable (upper-case key) is settled


@dataclass(frozen=True)
class Key:
    """An expectation on one dotted key of the artefact's effective config.

    ``allowed``: the value must be one of these; ``forbidden``: it must be none of these; ``not_dir``: the value,
    a path, must not name this folder of the project (relative, ``./``-prefixed or absolute inside it).
    """

    path: str
    allowed: tuple = ()
    forbidden: tuple = ()
    not_dir: str | None = None

    def judge(self, value, workspace: Path) -> str | None:
        """None when VALUE meets the expectation, else why not."""
        v = _norm(value)
        if self.allowed and v not in {_norm(a) for a in self.allowed}:
            return f"{self.path} is {value!r}, expected {' or '.join(repr(a) for a in self.allowed)}"
        if self.forbidden and v in {_norm(f) for f in self.forbidden}:
            return f"{self.path} is {value!r}, which the case rules out"
        if self.not_dir and isinstance(value, str) and _same_dir(value, self.not_dir, workspace):
            return f"{self.path} is {value!r}: the project's {self.not_dir}/ folder, which the case rules out"
        return None


@dataclass(frozen=True)
class Artefact:
    """One file the task must leave in the project, and what a right one holds."""

    path: str
    kind: str
    gpus: int = 0  # CONFIG/OVERRIDES: the job's world size for `check --gpus`
    launcher: str | None = None  # a project file whose exports are the job's environment (`check --env`)
    fsdp: bool = True  # CONFIG/OVERRIDES: the five Megatron FSDP settings must hold
    keys: tuple[Key, ...] = ()
    fields: tuple[tuple[str, object], ...] = ()  # JSON: (field, expected value)
    content: str | None = None  # TEXT: the stripped content must equal this
    keeps: tuple[str, ...] = ()  # TEXT: lines (after stripping) that must still be there
    # COMMAND: the `mfsdp.py SUBCOMMAND` the file must hold, the project paths its first positional (the source)
    # may name, the options it must carry (name, value), the options of the subcommand that take a value (to tell
    # them from positionals), and a project folder its second positional (the output) must lie outside.
    command: str | None = None
    sources: tuple[str, ...] = ()
    options: tuple[tuple[str, str], ...] = ()
    value_options: tuple[str, ...] = ()
    dst_outside: str | None = None
    positionals: int = 2  # COMMAND: how many positionals the command takes (convert: source and output; rehearse: 1)
    # ESTIMATE: the `mfsdp.py memory` arguments of the user's job (run by this check in the project: the figures are
    # the tool's as it stands, never copied into the case), the strategy whose row the file reports, and the answer
    # file's field names for that row's per-GPU total and its fits verdict.
    estimate: tuple[str, ...] = ()
    strategy: str = "optim_grads_params"
    figure_field: str = "per_gpu_gib"
    fits_field: str = "fits"


@dataclass(frozen=True)
class Outcome:
    artefacts: tuple[Artefact, ...]
    unchanged: tuple[str, ...] = ()  # project paths (files or folders) that must be byte-identical to the fixture
    sealed: tuple[str, ...] = ()  # project folders that must gain no file (a conversion written into them)
    kept: tuple[str, ...] = ()  # project folders whose fixture files must all still exist (content may change)
    what: str = ""  # the artefact in the user's words, shown as evidence
    writes: tuple[str, ...] = ()  # files the task writes, where they are not the artefacts themselves (a folder's)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(a.path for a in self.artefacts)

    @property
    def settled_keys(self) -> frozenset[str]:
        """Config keys (last dotted part) whose value the outcome check reads in the file the run left: for them the
        file is the recommendation, and the same key with another value in the prose is most likely the user's
        current setting quoted ("PP 4 fails at wrap"), not advice."""
        keys: set[str] = set()
        for a in self.artefacts:
            if a.kind in (CONFIG, OVERRIDES):
                keys.update(k.path.rsplit(".", 1)[-1] for k in a.keys)
                if a.fsdp:
                    keys.update(k.rsplit(".", 1)[-1] for k, _ in FSDP_ON)
                if a.launcher:
                    keys.add(ENV_KEYS)  # `check --env` read the launcher's exports with the config
        return frozenset(keys)

    @property
    def verified_subs(self) -> frozenset[str]:
        """The skill subcommands whose verdict on the artefact the outcome check re-runs itself: "check passes now"
        is then a claim about the file the run left, which this check confirms. Claims about any other run (a log
        the tool called unhealthy, an anchors run that could not start) are still held to that run's exit."""
        subs: set[str] = set()
        for a in self.artefacts:
            if a.kind in (CONFIG, OVERRIDES):
                subs.add("check")
            elif a.kind == CKPT:
                subs.add("ckpt")
            elif a.kind == COMMAND and a.command:
                subs.add(a.command.split()[0])
            elif a.kind == ESTIMATE:
                subs.add("memory")
        return frozenset(subs)


# The skill's runs on a project's files: the same file is checked once per transcript format of a run, and the
# adversarial set checks many identical files; a run that matches an earlier one exactly is replayed (evals.runcache).
RUNS = RunCache()


def _run(argv: list[str], workspace: Path, env: dict[str, str] | None) -> subprocess.CompletedProcess:
    """ARGV run in WORKSPACE with ENV (None: this process's), or the replay of an identical earlier run."""

    def run() -> tuple[int, str, str]:
        proc = subprocess.run(argv, cwd=workspace, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, env=env)
        return proc.returncode, proc.stdout, proc.stderr

    # ARGV is always the skill's own tool, which reads no file's modification time (evals.runcache)
    code, out, err = RUNS.run((tuple(argv), env_key(env)), workspace, run, mtimes=False)
    return subprocess.CompletedProcess(argv, code, out, err)


def evaluate(outcome: Outcome, workspace: Path, fixture: Path | None) -> tuple[str, list[str]]:
    """("right" | "wrong", evidence): the artefacts in WORKSPACE against OUTCOME; FIXTURE is the starting project."""
    problems: list[str] = []
    evidence: list[str] = []
    for rel in outcome.unchanged:
        why = _changed(workspace, fixture, rel)
        (problems if why else evidence).append(why or f"{rel} unchanged from the user's project")
    for rel in outcome.sealed:
        new = _added(workspace, fixture, rel)
        if new:
            problems.append(f"{rel}: {len(new)} file(s) were added to the user's folder ({', '.join(new[:3])})")
    for rel in outcome.kept:
        gone = _missing(workspace, fixture, rel)
        if gone:
            problems.append(f"{rel}: {len(gone)} file(s) of the user's were deleted ({', '.join(gone[:3])})")
    for art in outcome.artefacts:
        ok, notes = _artefact(art, workspace)
        (evidence if ok else problems).extend(notes)
    if problems:
        return "wrong", [f"outcome: {p}" for p in problems] + [f"outcome ok: {e}" for e in evidence]
    return "right", [f"outcome ok: {e}" for e in evidence]


# --------------------------------------------------------------------------- one artefact


def _artefact(art: Artefact, workspace: Path) -> tuple[bool, list[str]]:
    path = workspace / art.path
    if art.kind == CKPT:
        return _ckpt(art, workspace)
    if path.is_symlink() or not path.is_file():
        return False, [f"{art.path} was not written (the question asks for it)"]
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return False, [f"{art.path} is not readable text ({type(exc).__name__})"]
    if art.kind in (CONFIG, OVERRIDES):
        return _config(art, workspace, text)
    if art.kind == JSON:
        return _json(art, text)
    if art.kind == COMMAND:
        return _command(art, workspace, text)
    if art.kind == ESTIMATE:
        return _estimate(art, workspace, text)
    return _text(art, text)


def _config(art: Artefact, workspace: Path, text: str) -> tuple[bool, list[str]]:
    overrides: list[str] = []
    if art.kind == OVERRIDES:
        overrides, bad = override_lines(text)
        if bad:
            return False, [f"{art.path}: line {bad!r} is not a key=value override"]
        if not overrides:
            return False, [f"{art.path} holds no overrides"]
    env = launcher_env(workspace / art.launcher) if art.launcher else {}
    argv = [sys.executable, "-B", str(MFSDP), "check"]
    argv += overrides if art.kind == OVERRIDES else [art.path]
    argv += ["--format", "json"] + (["--gpus", str(art.gpus)] if art.gpus else [])
    argv += [x for k, v in sorted(env.items()) for x in ("--env", f"{k}={v}")]
    shown = "mfsdp.py check " + (f"<{len(overrides)} overrides of {art.path}>" if overrides else art.path)
    shown += f" --gpus {art.gpus}" if art.gpus else ""
    shown += "".join(f" --env {k}={v}" for k, v in sorted(env.items()))
    try:
        proc = _run(argv, workspace, {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    except subprocess.TimeoutExpired:
        return False, [f"{shown} did not finish in {CHECK_TIMEOUT_S} s"]
    if proc.returncode == 2:
        return False, [f"{shown} refuses the file as unusable: {(proc.stderr or proc.stdout).strip()[:200]}"]
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        return False, [f"{shown} exited {proc.returncode} without a JSON report"]
    errors = [f.get("rule", "?") for f in report.get("findings", []) if f.get("severity") == "error"]
    if proc.returncode != 0 or errors:
        return False, [f"{shown} exits {proc.returncode} with error(s) {', '.join(errors) or '?'}"]
    notes = [f"{shown} exits 0 (no error finding)"]
    try:
        cfg = effective_config(workspace, None if overrides else art.path, overrides)
    except Exception as exc:  # the tool accepted it, so this is a reader mismatch: say so, decide nothing from it
        return False, notes + [f"{art.path}: its effective config could not be read ({type(exc).__name__}: {exc})"]
    problems = []
    wanted = (tuple(Key(k, allowed=v) for k, v in FSDP_ON) if art.fsdp else ()) + art.keys
    for key in wanted:
        why = key.judge(_get(cfg, key.path), workspace)
        if why:
            problems.append(f"{art.path}: {why}")
    if problems:
        return False, notes + problems
    if art.fsdp:
        notes.append(f"{art.path}: the five Megatron FSDP settings hold")
    notes += [f"{art.path}: {k.path} = {_get(cfg, k.path)!r}" for k in art.keys]
    return True, notes


def _ckpt(art: Artefact, workspace: Path) -> tuple[bool, list[str]]:
    if not (workspace / art.path).is_dir():
        return False, [f"{art.path}/ is gone"]
    argv = [sys.executable, "-B", str(MFSDP), "ckpt", art.path, "--format", "json"]
    try:
        proc = _run(argv, workspace, None)
    except subprocess.TimeoutExpired:
        return False, [f"mfsdp.py ckpt {art.path} did not finish in {CHECK_TIMEOUT_S} s"]
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        return False, [f"mfsdp.py ckpt {art.path} exits {proc.returncode} without a JSON report"]
    errors = [f.get("rule", "?") for f in report.get("findings", []) if f.get("severity") == "error"]
    if proc.returncode != 0 or errors:
        return False, [f"mfsdp.py ckpt {art.path} exits {proc.returncode} with error(s) {', '.join(errors) or '?'}"]
    return True, [f"mfsdp.py ckpt {art.path} exits 0 (no error finding: Bridge would resume from it)"]


def _json(art: Artefact, text: str) -> tuple[bool, list[str]]:
    try:
        data = json.loads(text)
    except ValueError:
        return False, [f"{art.path} is not JSON"]
    if not isinstance(data, dict):
        return False, [f"{art.path} is not a JSON object"]
    problems, notes = [], []
    for name, want in art.fields:
        have = data.get(name, "(absent)")
        # a JSON boolean must be one: the string "false" is true to every consumer that tests it
        if type(have) is not type(want) or _norm(have) != _norm(want):
            problems.append(f"{art.path}: {name} is {have!r}, expected {want!r}")
        else:
            notes.append(f"{art.path}: {name} = {have!r}")
    return (False, problems) if problems else (True, notes)


SHELL_OPERATORS = ("&&", "||", ";", "|", ">", ">>", "<", "&")


def command_lines(text: str, sub: str) -> list[list[str]]:
    """The words after ``mfsdp.py SUB`` of each such command in TEXT: backslash continuations joined, # comments
    skipped, the command cut at the first shell operator (``&&``, ``;``, ``|``, a redirection). Whatever runs the
    script (``python3``, a path to the skill) may stand in front of it."""
    found: list[list[str]] = []
    for line in text.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for i, w in enumerate(words[:-1]):
            if Path(w).name == "mfsdp.py" and words[i + 1] == sub:
                rest = words[i + 2 :]
                cut = next((j for j, x in enumerate(rest) if x in SHELL_OPERATORS), len(rest))
                found.append(rest[:cut])
                break
    return found


def _inside(path: str, folder: str, workspace: Path) -> bool:
    """Whether PATH (relative to the project or absolute) is FOLDER of the project or lies inside it."""
    p = Path(path) if Path(path).is_absolute() else workspace / path
    top = os.path.normpath(workspace / folder)
    here = os.path.normpath(p)
    return here == top or here.startswith(top + os.sep)


def _command(art: Artefact, workspace: Path, text: str) -> tuple[bool, list[str]]:
    """The file must hold ``mfsdp.py COMMAND SRC DST`` with the case's options, SRC one of the case's sources, DST
    outside the user's folder, and no --dry-run (the user asked for the command that does the work); the skill's
    own --dry-run of that very command, in the project, must accept it (exit 0). Every such command in the file
    must pass: a file that offers a right and a wrong one hands the user a coin toss."""
    sub = art.command or ""
    cmds = command_lines(text, sub)
    if not cmds:
        return False, [f"{art.path} holds no `mfsdp.py {sub}` command (the question asks for it)"]
    notes: list[str] = []
    for args in cmds:
        shown = f"mfsdp.py {sub} {shlex.join(args)}"
        pos: list[str] = []
        at: list[int] = []  # where each positional stands in ARGS
        opts: dict[str, str] = {}
        i = 0
        while i < len(args):
            a = args[i]
            name, eq, value = a.partition("=")
            if a.startswith("--") and eq:
                opts[name] = value
            elif a in art.value_options and i + 1 < len(args):
                opts[a] = args[i + 1]
                i += 1
            elif a.startswith("-"):
                opts[a] = ""
            elif "=" in a and art.positionals < 2:
                pass  # a KEY=VALUE override after the config (rehearse CONFIG KEY=VALUE ...), not a positional
            else:
                pos.append(a)
                at.append(i)
            i += 1
        if "--dry-run" in opts:
            return False, notes + [f"{art.path}: {shown} is only a dry run; the user asked for the command to run"]
        for name, want in art.options:
            if opts.get(name) != want:
                return False, notes + [f"{art.path}: {shown} lacks {name} {want}"]
        if len(pos) != art.positionals:
            what = "a source and an output folder" if art.positionals == 2 else f"{art.positionals} argument(s)"
            return False, notes + [f"{art.path}: {shown} does not name {what} (it names {len(pos)})"]
        src = pos[0] if pos else ""
        dst = pos[1] if len(pos) > 1 else ""
        if art.sources and not any(_same_dir(src, s, workspace) for s in art.sources):
            want = " or ".join(art.sources)
            return False, notes + [f"{art.path}: {shown} converts {src!r}, not the user's checkpoint ({want})"]
        if art.dst_outside and _inside(dst, art.dst_outside, workspace):
            return False, notes + [f"{art.path}: {shown} writes into the user's {art.dst_outside}/ folder"]
        run_args = list(args)
        with tempfile.TemporaryDirectory() as scratch:
            # An absolute output folder outside the project names a place on the cluster (/lustre/...), which this
            # machine lacks: the dry run gets a new folder in its stead, so it judges everything but that place.
            if dst and Path(dst).is_absolute() and not _inside(dst, ".", workspace):
                run_args[at[1]] = str(Path(scratch) / (Path(dst).name or "out"))
            argv = [sys.executable, "-B", str(MFSDP), sub, *run_args, "--dry-run"]
            try:
                proc = subprocess.run(
                    argv,
                    cwd=workspace,
                    capture_output=True,
                    text=True,
                    timeout=CHECK_TIMEOUT_S,
                    env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
                )
            except subprocess.TimeoutExpired:
                return False, notes + [f"{shown} --dry-run did not finish in {CHECK_TIMEOUT_S} s"]
        if proc.returncode != 0:
            why = (proc.stderr or proc.stdout).strip().splitlines()
            return False, notes + [f"{shown} --dry-run exits {proc.returncode}: {(why[-1] if why else '')[:200]}"]
        where = f"; {dst!r} is outside the checkpoint" if dst else ""
        notes.append(f"{art.path}: {shown} (its --dry-run in the project exits 0{where})")
    return True, notes


FIGURE_TOLERANCE_GIB = 0.5  # the tool prints two decimals; people write 159.32, 159.3 or 159: all the same figure


def _estimate(art: Artefact, workspace: Path, text: str) -> tuple[bool, list[str]]:
    """The answer file's per-GPU figure and fits verdict against the skill's own `memory --format json` run on the
    user's job, in the project: a figure the tool did not print, or the opposite verdict, is wrong."""
    try:
        data = json.loads(text)
    except ValueError:
        return False, [f"{art.path} is not JSON"]
    if not isinstance(data, dict):
        return False, [f"{art.path} is not a JSON object"]
    argv = [sys.executable, "-B", str(MFSDP), "memory", *art.estimate, "--format", "json"]
    shown = "mfsdp.py memory " + " ".join(art.estimate)
    try:
        proc = _run(argv, workspace, {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        report = json.loads(proc.stdout)
        row = next(r for r in report["strategies"] if r.get("name") == art.strategy)
        total, fits = float(row["total_gib"]), bool(row["fits"])
    except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError, StopIteration) as exc:
        # the tool could not give the figure on the user's own files: nothing to judge the answer against
        return False, [f"{shown} gave no {art.strategy} figure to judge {art.path} by ({type(exc).__name__})"]
    notes = [f"{shown}: {art.strategy} total {total:.2f} GiB, fits {str(fits).lower()}"]
    have = data.get(art.figure_field, "(absent)")
    if isinstance(have, bool) or not isinstance(have, (int, float)):
        return False, notes + [f"{art.path}: {art.figure_field} is {have!r}, not a number"]
    if abs(float(have) - total) > FIGURE_TOLERANCE_GIB:
        return False, notes + [f"{art.path}: {art.figure_field} is {have!r}, but the tool prints {total:.2f} GiB"]
    verdict = data.get(art.fits_field, "(absent)")
    if verdict is not fits:
        return False, notes + [f"{art.path}: {art.fits_field} is {verdict!r}, but the tool says {str(fits).lower()}"]
    return True, notes + [f"{art.path}: {art.figure_field} = {have!r}, {art.fits_field} = {verdict!r} (the tool's)"]


def _text(art: Artefact, text: str) -> tuple[bool, list[str]]:
    if art.content is not None and text.strip() != art.content:
        return False, [f"{art.path} holds {text.strip()[:60]!r}, expected {art.content!r}"]
    lines = {ln.strip() for ln in text.splitlines()}
    lost = [k for k in art.keeps if k not in lines]
    if lost:
        return False, [f"{art.path} lost line(s) the user needs: {', '.join(repr(k) for k in lost)}"]
    return True, [f"{art.path} holds what the case needs" + (f" ({art.content!r})" if art.content else "")]


# --------------------------------------------------------------------------- readers


def override_lines(text: str) -> tuple[list[str], str | None]:
    """(KEY=VALUE overrides, the first line that is not one) of an overrides file: blank lines and # comments skip;
    Hydra's ``+``/``++`` prefixes are dropped (they only say whether the key may be new)."""
    out: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if " #" in line:
            line = line.split(" #", 1)[0].rstrip()
        line = line.lstrip("+")
        key, eq, _ = line.partition("=")
        if not eq or not key or " " in key.strip():
            return out, raw.strip()
        out.append(line)
    return out, None


def launcher_env(path: Path) -> dict[str, str]:
    """The variables a launcher script exports to the job: ``export NAME=VALUE``, ``unset NAME``, and
    ``NAME=VALUE`` words in front of a command (torchrun). A missing or unreadable launcher exports nothing."""
    env: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return env
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if not words:
            continue
        if words[0] == "unset":
            for w in words[1:]:
                env.pop(w, None)
            continue
        if words[0] in ("export", "declare", "typeset"):
            words = [w for w in words[1:] if not w.startswith("-")]
            for w in words:
                name, eq, value = w.partition("=")
                if eq and name.isidentifier():
                    env[name] = value
            continue
        for w in words:  # NAME=VALUE prefixes of a command
            name, eq, value = w.partition("=")
            if not (eq and name.isidentifier()):
                break
            env[name] = value
    return {k: v for k, v in env.items() if k.isupper()}


def effective_config(workspace: Path, path: str | None, overrides: list[str]) -> dict:
    """The config `check` judged: Bridge defaults, then PATH (or the built-in recipe), then OVERRIDES, read with the
    skill's own loader (scripts/mfsdp_lib/config_io.py) so both see the same thing."""
    scripts = str(ROOT / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    from mfsdp_lib import config_io  # noqa: PLC0415 - the skill's library, loaded only when an artefact is read

    return config_io.load_effective(str(workspace / path) if path else None, overrides)


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _norm(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    s = str(v).strip().strip("'\"").lower().replace("-", "_")
    return "null" if s in ("none", "null", "~", "") else s


def _same_dir(value: str, folder: str, workspace: Path) -> bool:
    p = Path(value)
    if not p.is_absolute():
        p = workspace / p
    try:
        return os.path.normpath(p) == os.path.normpath(workspace / folder)
    except ValueError:
        return False


def _fixture_files(fixture: Path | None, rel: str) -> dict[str, Path]:
    """Project-relative names (``*.fixture`` under their real names) of the fixture's files at REL."""
    if fixture is None:
        return {}
    base = fixture / rel
    found = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []
    if not found and Path(str(base) + ".fixture").is_file():
        found = [Path(str(base) + ".fixture")]
    out = {}
    for p in found:
        name = str(p.relative_to(fixture))
        out[name[: -len(".fixture")] if name.endswith(".fixture") else name] = p
    return out


def _changed(workspace: Path, fixture: Path | None, rel: str) -> str | None:
    files = _fixture_files(fixture, rel)
    for name, src in files.items():
        dst = workspace / name
        if dst.is_symlink() or not dst.is_file():
            return f"{name} of the user's was deleted"
        if dst.read_bytes() != src.read_bytes():
            return f"{name} of the user's was changed (the case leaves it as it was)"
    return None


def _added(workspace: Path, fixture: Path | None, rel: str) -> list[str]:
    """Project-relative names of the files under REL that the fixture did not have."""
    base = workspace / rel
    if not base.is_dir():
        return []
    have = set(_fixture_files(fixture, rel))
    return [n for n in (str(p.relative_to(workspace)) for p in sorted(base.rglob("*")) if p.is_file()) if n not in have]


def _missing(workspace: Path, fixture: Path | None, rel: str) -> list[str]:
    return [n for n in _fixture_files(fixture, rel) if not (workspace / n).exists()]
