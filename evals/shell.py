"""Shell text -> the simple commands it runs, each with the directory it runs in and how it was reached.

Why a tokenizer of our own rather than ``shlex``: the grader must see every command an agent's shell line
starts, and ``shlex`` knows neither newlines as separators, nor ``$(...)``, backticks, heredocs or ``2>&1``
(it splits ``2>&1 | tail`` into a bogus ``&``). This module follows POSIX shell grammar far enough for the
command lines agents write:

* separators ``\\n ; & && || | |&`` and ``( ) { }`` groups; shell keywords (``if then do ! ...``) are
  skipped; ``for NAME in WORDS`` headers are not commands;
* quoting (``'..'``, ``".."``, backslash), comments, redirections (``> f``, ``2>&1``, ``&>f``, ``<<EOF``
  heredocs, whose bodies are kept);
* nested command text is parsed too, with ``via`` saying how it was reached: ``sh -c``/``bash -lc`` bodies,
  ``eval``, ``$(...)`` and backtick bodies, ``<(...)``, ``find -exec``/``-execdir``/``-ok``, ``xargs``, and
  ``python -c``/``python - <<EOF`` code (whose ``os.system``/``subprocess`` strings are shell again);
* ``cd``/``pushd`` are tracked, so a relative path resolves against the directory the command runs in
  (``cd /etc && rm -rf ssl`` removes ``/etc/ssl``); a ``( ... )`` subshell's ``cd`` ends with it;
* each command knows whether its exit status reaches the caller: not when its output is piped on (without
  ``set -o pipefail``) nor when another command follows it.

Standard library only. Anything unparseable degrades to whitespace words, never an exception.
"""

from __future__ import annotations

import ast
import os
import posixpath
import re
from dataclasses import dataclass, field

# Programs that run their first non-option argument as a command (``sudo rm -rf /``).
PREFIX_COMMANDS = frozenset(
    {"env", "sudo", "time", "nice", "nohup", "exec", "command", "stdbuf", "timeout", "doas", "ionice", "chronic"}
)
SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh"})
PYTHONS_RE = re.compile(r"^(?:python(?:\d(?:\.\d+)?)?|pypy3?)$")
ASSIGNMENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
KEYWORDS = frozenset({"if", "then", "else", "elif", "do", "while", "until", "!", "time"})
CLOSERS = frozenset({"fi", "done", "esac", "}"})
OPERATORS = ("&&", "||", "|&", ";;", "|", "&", ";", "\n", "(", ")")
REDIRECT_RE = re.compile(r"(\d*|&)(>>|>\||>&|<&|<<<|<<-|<<|<>|>|<)")
MAX_DEPTH = 6  # nesting deeper than this is not something an agent writes
HOME = "~"


@dataclass
class Word:
    text: str  # the value after quote removal (substitutions left as written)
    substs: list[str] = field(default_factory=list)  # bodies of $(...), `...`, <(...), >(...)
    quoted: bool = False


@dataclass
class Redirect:
    op: str  # ">", ">>", "<", "<<", ">&" ...
    target: str  # file, fd, or the heredoc body for << / <<-


@dataclass
class Command:
    """One simple command."""

    words: list[str]
    cwd: str  # the directory it runs in: absolute, "~"-relative, or "." (the agent's workspace)
    via: str = "line"  # how it was reached: line, sh -c, $(...), find -exec, xargs, python -c, eval, ...
    redirects: list[Redirect] = field(default_factory=list)
    status_visible: bool = True  # its exit status is the status of the whole line
    piped_into: list[str] = field(default_factory=list)  # programs that read its output
    stdin_from: list[str] = field(default_factory=list)  # programs whose output it reads
    source: str = ""  # the text it was parsed from
    pipeline: int = 0  # index of its pipeline within the text it came from

    @property
    def argv(self) -> list[str]:
        """The words after leading assignments and wrappers (``sudo``, ``env X=1``, ``timeout 5``)."""
        return program_words(self.words)

    @property
    def prog(self) -> str:
        a = self.argv
        return os.path.basename(a[0]) if a else ""

    def resolve(self, path: str) -> str:
        return resolve_path(path, self.cwd)


def resolve_path(path: str, cwd: str) -> str:
    """PATH as seen from CWD, normalised; "~/x" stays "~/x", a workspace-relative path is "./x"."""
    p = path.strip()
    for var in ("$HOME", "${HOME}"):
        if p == var or p.startswith(var + "/"):
            p = HOME + p[len(var) :]
    if p == HOME or p.startswith(HOME + "/"):
        return posixpath.normpath(p)
    if p.startswith("/"):
        return posixpath.normpath(p)
    joined = posixpath.normpath(posixpath.join(cwd, p))
    if cwd in (".", "") and not joined.startswith(("..", "/")):
        joined = "./" + joined if joined != "." else "."
    return joined


def program_words(words: list[str]) -> list[str]:
    """Drop leading VAR=value assignments and wrappers like env/sudo/timeout N/uv run."""
    i = 0
    while i < len(words):
        w = words[i]
        base = os.path.basename(w)
        if ASSIGNMENT_RE.match(w):
            i += 1
        elif base in PREFIX_COMMANDS:
            i += 1
            if base == "timeout":
                while i < len(words) and words[i].startswith("-"):
                    i += 1
                if i < len(words) and re.match(r"^\d", words[i]):
                    i += 1
            while i < len(words) and words[i].startswith("-") and base in ("env", "sudo", "nice", "stdbuf", "doas"):
                i += 2 if words[i] in ("-u", "-g", "-n") and base in ("sudo", "nice") else 1
        elif base in ("uv", "poetry", "pipenv", "pixi") and i + 1 < len(words) and words[i + 1] == "run":
            i += 2
        else:
            break
    return words[i:] or words


# --------------------------------------------------------------------------- tokenizer


class _Lexer:
    def __init__(self, text: str):
        self.s = text
        self.i = 0
        self.pending_heredocs: list[tuple[Redirect, str, bool]] = []

    def _skip_blanks(self) -> None:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t\r":
                self.i += 1
            elif c == "\\" and self.s[self.i + 1 : self.i + 2] == "\n":
                self.i += 2
            elif c == "#":
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            else:
                break

    def _balanced(self, start: int, open_c: str = "(", close_c: str = ")") -> int:
        """Index just past the ``)`` matching the ``(`` before START, quotes honoured."""
        depth, i = 1, start
        while i < len(self.s):
            c = self.s[i]
            if c == "\\":
                i += 2
                continue
            if c == "'":
                j = self.s.find("'", i + 1)
                i = len(self.s) if j < 0 else j + 1
                continue
            if c == '"':
                i = self._dquote_end(i + 1)
                continue
            if c == open_c:
                depth += 1
            elif c == close_c:
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        return len(self.s)

    def _dquote_end(self, i: int) -> int:
        while i < len(self.s):
            c = self.s[i]
            if c == "\\":
                i += 2
                continue
            if c == '"':
                return i + 1
            if c == "$" and self.s[i + 1 : i + 2] == "(":
                i = self._balanced(i + 2)
                continue
            if c == "`":
                j = self.s.find("`", i + 1)
                i = len(self.s) if j < 0 else j + 1
                continue
            i += 1
        return len(self.s)

    def _word(self) -> Word:
        out: list[str] = []
        substs: list[str] = []
        quoted = False
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\r\n;&|()":
                break
            if c in "<>" and s[self.i + 1 : self.i + 2] != "(":
                break
            if c in "<>" and s[self.i + 1 : self.i + 2] == "(":  # process substitution <(...)
                end = self._balanced(self.i + 2)
                substs.append(s[self.i + 2 : end - 1])
                out.append(s[self.i : end])
                self.i = end
                continue
            if c == "\\":
                if self.i + 1 < len(s) and s[self.i + 1] != "\n":
                    out.append(s[self.i + 1])
                self.i += 2
                continue
            if c == "'":
                quoted = True
                j = s.find("'", self.i + 1)
                j = len(s) if j < 0 else j
                out.append(s[self.i + 1 : j])
                self.i = j + 1
                continue
            if c == '"':
                quoted = True
                end = self._dquote_end(self.i + 1)
                body = s[self.i + 1 : max(self.i + 1, end - 1)]
                for m in re.finditer(r"\$\(", body):
                    sub_lex = _Lexer(body)
                    e = sub_lex._balanced(m.end())
                    substs.append(body[m.end() : e - 1])
                for m in re.finditer(r"`([^`]*)`", body):
                    substs.append(m.group(1))
                out.append(re.sub(r"\\([\\\"$`])", r"\1", body))
                self.i = end
                continue
            if c == "$" and s[self.i + 1 : self.i + 2] == "(":
                end = self._balanced(self.i + 2)
                if s[self.i + 2 : self.i + 3] != "(":  # $(( arithmetic )) is not a command
                    substs.append(s[self.i + 2 : end - 1])
                out.append(s[self.i : end])
                self.i = end
                continue
            if c == "`":
                j = s.find("`", self.i + 1)
                j = len(s) if j < 0 else j
                substs.append(s[self.i + 1 : j])
                out.append(s[self.i : j + 1])
                self.i = j + 1
                continue
            out.append(c)
            self.i += 1
        return Word("".join(out), substs, quoted)

    def tokens(self) -> list[Word | str | Redirect]:
        toks: list[Word | str | Redirect] = []
        s = self.s
        while True:
            self._skip_blanks()
            if self.i >= len(s):
                break
            c = s[self.i]
            if c == "\n":
                self.i += 1
                toks.append("\n")
                self._read_heredocs()
                continue
            m = REDIRECT_RE.match(s, self.i)
            if m and not (m.group(2) in ("<", ">") and s[m.end() : m.end() + 1] == "("):
                op = m.group(2)
                self.i = m.end()
                if op in ("<<", "<<-"):
                    self._skip_blanks()
                    delim = self._word()
                    r = Redirect(op, "")
                    self.pending_heredocs.append((r, delim.text, op == "<<-"))
                    toks.append(r)
                    continue
                self._skip_blanks()
                target = self._word()
                toks.append(Redirect(op, target.text))
                if target.substs:
                    toks.append(Word("", target.substs))
                continue
            matched = next((op for op in OPERATORS if s.startswith(op, self.i)), None)
            if matched and matched != "\n":
                self.i += len(matched)
                toks.append(matched)
                continue
            w = self._word()
            if not w.text and not w.substs and not w.quoted:
                self.i += 1  # a stray character we do not understand: skip it
                continue
            toks.append(w)
        return toks

    def _read_heredocs(self) -> None:
        for r, delim, strip_tabs in self.pending_heredocs:
            lines = []
            while self.i < len(self.s):
                j = self.s.find("\n", self.i)
                line = self.s[self.i : j if j >= 0 else len(self.s)]
                self.i = j + 1 if j >= 0 else len(self.s)
                if (line.lstrip("\t") if strip_tabs else line) == delim:
                    break
                lines.append(line)
            r.target = "\n".join(lines)
        self.pending_heredocs = []


# --------------------------------------------------------------------------- parser


@dataclass
class _Simple:
    words: list[Word] = field(default_factory=list)
    redirects: list[Redirect] = field(default_factory=list)


def parse(text: str, cwd: str = ".", via: str = "line", depth: int = 0) -> list[Command]:
    """Every simple command TEXT runs, nested ones included, in order; see the module docstring."""
    if depth > MAX_DEPTH or not text.strip():
        return []
    lex = _Lexer(text)
    try:
        toks = lex.tokens()
        if lex.pending_heredocs:
            lex._read_heredocs()
    except (IndexError, ValueError):
        toks = [Word(w) for w in text.split()]
    out: list[Command] = []
    cwd_stack: list[str] = []
    state: dict = {"cwd": cwd, "pipefail": False, "n": 0}
    # Group into pipelines; a pipeline's members are joined by | or |&.
    pipeline: list[_Simple] = [_Simple()]
    trailing: list[str] = []  # operator after each pipeline

    def flush(op: str) -> None:
        nonlocal pipeline
        members = [p for p in pipeline if p.words or p.redirects]
        if members:
            _emit_pipeline(members, op, state, out, text, via, depth)
            state["n"] += 1
        pipeline = [_Simple()]
        trailing.append(op)

    for tok in toks:
        if isinstance(tok, Redirect):
            pipeline[-1].redirects.append(tok)
        elif isinstance(tok, Word):
            cur = pipeline[-1]
            if not cur.words and tok.text in KEYWORDS and not tok.quoted:
                continue
            if not cur.words and tok.text in CLOSERS and not tok.quoted:
                continue
            if not cur.words and tok.text == "{" and not tok.quoted:
                continue
            cur.words.append(tok)
        elif tok in ("|", "|&"):
            pipeline.append(_Simple())
        elif tok == "(":
            flush(";")
            cwd_stack.append(state["cwd"])
        elif tok == ")":
            flush(";")
            if cwd_stack:
                state["cwd"] = cwd_stack.pop()
        else:
            flush(tok)
    flush("end")
    # A command's status reaches the caller only if it is in the last pipeline of the line, and is that
    # pipeline's last member (or the line set pipefail).
    top = [c for c in out if c.via == via and c.source == text]
    if top:
        last = top[-1].pipeline
        for c in top:
            c.status_visible = c.pipeline == last and (c is top[-1] or state["pipefail"])
    return out


def _for_header(words: list[Word]) -> bool:
    return bool(words) and words[0].text in ("for", "select", "case") and not words[0].quoted


def _emit_pipeline(
    members: list[_Simple], op: str, state: dict, out: list[Command], text: str, via: str, depth: int
) -> None:
    progs = [os.path.basename(program_words([w.text for w in m.words])[0]) if m.words else "" for m in members]
    for idx, m in enumerate(members):
        if _for_header(m.words):
            continue
        words = [w.text for w in m.words]
        cwd = state["cwd"]
        # nested substitutions run first, in the same directory
        for w in m.words:
            for body in w.substs:
                out.extend(parse(body, cwd, "$(...)", depth + 1))
        if not words:
            continue
        cmd = Command(words=words, cwd=cwd, via=via, redirects=list(m.redirects), source=text, pipeline=state["n"])
        after = progs[idx + 1 :]
        cmd.piped_into = [p for p in after if p]
        cmd.stdin_from = [p for p in progs[:idx] if p]
        if after and not state["pipefail"]:
            cmd.status_visible = False
        out.append(cmd)
        argv = cmd.argv
        prog = os.path.basename(argv[0]) if argv else ""
        if prog == "set" and "pipefail" in argv:
            state["pipefail"] = True
        if prog in ("cd", "pushd") and len(members) == 1:
            target = next((a for a in argv[1:] if not a.startswith("-")), HOME)
            state["cwd"] = resolve_path(target, cwd) if target != "-" else cwd
        nested = _nested(cmd, depth)
        if prog == "xargs" and idx > 0:
            # xargs runs its command on the words the previous command printed: name them where we can
            upstream = program_words([w.text for w in members[idx - 1].words])
            listed = _listed_paths(upstream)
            for n in nested:
                if n.via == "xargs":
                    n.words = [w for w in n.words if w != "{xargs}"] + (listed or ["{xargs}"])
                    n.stdin_from = cmd.stdin_from
        out.extend(nested)


def _nested(cmd: Command, depth: int) -> list[Command]:
    """Commands that CMD itself starts: sh -c bodies, eval, find -exec, xargs, python -c code."""
    argv = cmd.argv
    if not argv:
        return []
    prog = os.path.basename(argv[0])
    args = argv[1:]
    found: list[Command] = []
    if prog in SHELLS:
        body = _shell_c_body(args)
        if body is not None:
            found += parse(body, cmd.cwd, f"{prog} -c", depth + 1)
        for r in cmd.redirects:
            if r.op in ("<<", "<<-", "<<<") and not any(not a.startswith("-") for a in args):
                found += parse(r.target, cmd.cwd, f"{prog} <<heredoc", depth + 1)
    elif prog == "eval":
        found += parse(" ".join(args), cmd.cwd, "eval", depth + 1)
    elif prog in ("find", "fd"):
        found += _find_exec(cmd, args)
    elif prog == "xargs":
        i = 0
        while i < len(args) and args[i].startswith("-"):
            i += 2 if args[i] in ("-I", "-n", "-P", "-d", "-L", "-s", "-E") else 1
        if i < len(args):
            found.append(
                Command(words=args[i:] + ["{xargs}"], cwd=cmd.cwd, via="xargs", source=cmd.source, status_visible=False)
            )
    elif prog in SCRIPT_REMOVERS and any(a in ("-e", "-E") for a in args):
        j = next(i for i, a in enumerate(args) if a in ("-e", "-E"))
        if j + 1 < len(args):
            found += script_commands(prog, args[j + 1], cmd.cwd, depth)
    elif PYTHONS_RE.match(prog):
        code = None
        if "-c" in args:
            j = args.index("-c")
            code = args[j + 1] if j + 1 < len(args) else None
        elif args[:1] == ["-"] or not args:
            code = next((r.target for r in cmd.redirects if r.op in ("<<", "<<-", "<<<")), None)
        if code:
            found += python_commands(code, cmd.cwd, depth)
    return found


def _listed_paths(argv: list[str]) -> list[str]:
    """The paths a listing command (ls, find, echo, printf) prints, as far as its words tell."""
    if not argv:
        return []
    prog = os.path.basename(argv[0])
    args = [a for a in argv[1:] if not a.startswith("-")]
    if prog in ("ls", "echo", "printf"):
        return args
    if prog in ("find", "fd"):
        roots = []
        for a in argv[1:]:
            if a.startswith(("-", "(", "!")):
                break
            roots.append(a)
        return [r.rstrip("/") + "/*" for r in roots or ["."]]
    return []


def _shell_c_body(args: list[str]) -> str | None:
    i = 0
    while i < len(args) and args[i].startswith("-"):
        flag = args[i]
        if flag in ("-o", "+o"):
            i += 2
            continue
        if "c" in flag.lstrip("-") and not flag.startswith("--"):
            return args[i + 1] if i + 1 < len(args) else None
        i += 1
    return None


def _find_exec(cmd: Command, args: list[str]) -> list[Command]:
    roots = []
    for a in args:
        if a.startswith(("-", "(", "!")):
            break
        roots.append(a)
    roots = roots or ["."]
    found = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-exec", "-execdir", "-ok", "-okdir"):
            j = i + 1
            sub = []
            while j < len(args) and args[j] not in (";", "+", "\\;"):
                sub.append(args[j])
                j += 1
            words: list[str] = []
            for w in sub:
                if "{}" in w:  # the matched files, inside the roots
                    words.extend(w.replace("{}", r.rstrip("/") + "/*") for r in roots)
                else:
                    words.append(w)
            if words:
                found.append(Command(words=words, cwd=cmd.cwd, via="find -exec", source=cmd.source))
            i = j + 1
            continue
        if a == "-delete":
            targets = [r.rstrip("/") + "/*" for r in roots]
            found.append(Command(words=["rm", "-rf", *targets], cwd=cmd.cwd, via="find -delete", source=cmd.source))
        i += 1
    return found


# --------------------------------------------------------------------------- perl / ruby / node one-liners

# Calls that remove files in other interpreters' one-liners (``perl -e 'unlink glob "x/*"'``), each with its
# first string argument (a glob stays a glob: it is judged by the paths it can match).
_STR = r"""\s*\(?\s*(?:glob\s*\(?\s*)?["']([^"']+)["']"""
SCRIPT_REMOVERS = {
    "perl": re.compile(r"\b(?:unlink|rmtree|remove_tree|rmdir)\b" + _STR),
    "ruby": re.compile(
        r"\b(?:File\.(?:delete|unlink)|FileUtils\.(?:rm_rf|rm_r|rm|rm_f|remove_dir|remove_entry)|Dir\.rmdir)" + _STR
    ),
    "node": re.compile(r"\b(?:rmSync|unlinkSync|rmdirSync|rm|unlink|rmdir)\s*\(\s*[\"'`]([^\"'`]+)[\"'`]"),
}
# Their ways of running a shell command: perl/ruby ``system("...")`` / backticks, node ``execSync("...")``.
SCRIPT_SHELL = re.compile(r"""\b(?:system|exec|execSync|spawnSync)\s*\(?\s*["']([^"']+)["']|`([^`]+)`""")


def script_commands(prog: str, code: str, cwd: str, depth: int = 0) -> list[Command]:
    """What a perl/ruby/node one-liner does to files, as shell-equivalent commands."""
    found = [
        Command(words=["rm", "-rf", m.group(1)], cwd=cwd, via=f"{prog} -e")
        for m in SCRIPT_REMOVERS[prog].finditer(code)
    ]
    for m in SCRIPT_SHELL.finditer(code):
        found += parse(m.group(1) or m.group(2), cwd, f"{prog} system", depth + 1)
    return found


# --------------------------------------------------------------------------- python code

# Python calls that remove files or trees; their first string argument is the path.
PY_REMOVERS = {
    "rmtree": "rm -rf",
    "remove": "rm -f",
    "unlink": "rm -f",
    "rmdir": "rm -rf",
    "removedirs": "rm -rf",
}
PY_SHELL_CALLS = frozenset({"system", "popen", "run", "call", "check_call", "check_output", "Popen", "getoutput"})


def python_commands(code: str, cwd: str, depth: int = 0) -> list[Command]:
    """What Python CODE does to the system, as shell-equivalent commands (rm, cat, writes, subprocesses)."""
    found: list[Command] = []
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        tree = None
    if tree is None:
        for m in re.finditer(r"\b(rmtree|remove|unlink|rmdir)\s*\(\s*['\"]([^'\"]+)['\"]", code):
            found.append(Command(words=[*PY_REMOVERS[m.group(1)].split(), m.group(2)], cwd=cwd, via="python -c"))
        return found
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        strs = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if name in PY_REMOVERS:
            target = strs[0] if strs else _path_receiver(node)
            if target:
                found.append(Command(words=[*PY_REMOVERS[name].split(), target], cwd=cwd, via="python -c"))
        elif name in PY_SHELL_CALLS:
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found += parse(first.value, cwd, "python subprocess", depth + 1)
            elif isinstance(first, (ast.List, ast.Tuple)):
                words = [e.value for e in first.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if words:
                    found.append(Command(words=words, cwd=cwd, via="python subprocess"))
        elif name in ("open", "read_text", "read_bytes", "write_text", "write_bytes"):
            target = strs[0] if name == "open" and strs else _path_receiver(node)
            if not target:
                continue
            mode = strs[1] if name == "open" and len(strs) > 1 else ""
            for kw in node.keywords:
                if kw.arg == "mode" and isinstance(kw.value, ast.Constant):
                    mode = str(kw.value.value)
            writes = name.startswith("write") or any(c in mode for c in "wax+")
            words = ["tee", target] if writes else ["cat", target]
            found.append(Command(words=words, cwd=cwd, via="python -c"))
    return found


def _path_receiver(node: ast.Call) -> str | None:
    """``Path("x").unlink()`` / ``Path("x").write_text(...)``: the literal path of the receiver."""
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call):
        inner = func.value
        if inner.args and isinstance(inner.args[0], ast.Constant) and isinstance(inner.args[0].value, str):
            return inner.args[0].value
    return None
