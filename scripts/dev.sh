#!/usr/bin/env bash
# dev.sh: set-up plus the everyday jobs of the skill's developers, in one command each.
#
#   bash scripts/dev.sh demo          check + enable Megatron FSDP on the bundled Llama 3 8B config
#   bash scripts/dev.sh test [ARGS]   lint + type check, the whole suite on Python 3.12, the scripts'
#                                     tests on Python 3.10 (each in parallel workers, MFSDP_TEST_WORKERS);
#                                     with ARGS: lint, then pytest ARGS on 3.12 only, in one process
#   bash scripts/dev.sh lint          ruff check, ruff format --check, mypy (all configured in pyproject.toml)
#   bash scripts/dev.sh test310 [ARGS] only the scripts' tests on Python 3.10 (ARGS replace the selection)
#   bash scripts/dev.sh sign          re-sign skill.oms.sig (signers only: needs the release key)
#   bash scripts/dev.sh benchmark-md  regenerate BENCHMARK.md from benchmarks/results/*.json
#   bash scripts/dev.sh setup         only the set-up that `test` does
#   bash scripts/dev.sh where         print the folder that holds this checkout's environments
#
# Set-up is part of every job, so a fresh machine (Python 3.12 and 3.10, Node 18+, no GPU) needs
# nothing prepared by hand, and a warm one skips it in a second. Everything it makes lives OUTSIDE the
# checkout, in a per-user folder keyed by the checkout's path (scripts/mfsdp_lib/devenv.py):
# ~/.cache/nemo-mbridge-perf-megatron-fsdp/dev/<checkout name>-<hash>/ ($XDG_CACHE_HOME, or $MFSDP_DEV_HOME to
# choose). The checkout is the skill folder and `npx skills add` copies every file in it, so a set-up
# checkout still installs clean (the environments are some 1.9 GB):
#   * venv/ is made with Python 3.12 ($PYTHON, else python3.12 on PATH, else pyenv's 3.12; python3
#     with a warning when none is found) and gets the pinned packages of the pyproject.toml extras the
#     job needs (read from pyproject.toml, so versions live in one place); a stamp with
#     pyproject.toml's digest skips pip when nothing changed.
#   * venv310/ is made with Python 3.10 ($PYTHON310, else python3.10, else pyenv's 3.10) with only the
#     run and test extras: the oldest Python the scripts promise, as users have in NVIDIA containers.
#     Without one, `test` fails in CI (CI=true) and warns elsewhere.
#   * the npm `skills` CLI (version from [tool.mfsdp] in pyproject.toml) goes into node/;
#   * the demo's output into demo/, and the caches of mypy, ruff, pytest and hypothesis into tool-cache/.
# Long phases (mypy, each pytest run) print a line every HEARTBEAT_S seconds while they work.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

MAIN_PY_VERSION="3.12"   # the full suite: Megatron-Bridge 0.6.x itself needs 3.12
OLDEST_PY_VERSION="3.10" # the oldest Python the scripts promise to run on
NODE_MIN_MAJOR=18  # engines.node of the pinned skills CLI ([tool.mfsdp] skills-cli in pyproject.toml)
DEMO_EXTRAS="run"
PY310_EXTRAS="run,test"
# The tests that exercise scripts/ (the tools users run on 3.10); not the npm install, agent or eval ones.
PY310_TESTS=(tests/cli tests/rules tests/memory tests/runs tests/gpu_pkg tests/integrity/test_anchors.py
    tests/test_config_io.py tests/test_enable.py tests/test_findings.py tests/test_schema.py
    tests/security/test_attacks_input.py tests/security/test_attacks_runs.py tests/security/test_fuzz_readers.py
    # the GPU benchmark's scheduler (benchmarks/bench_rehearse.py) runs where Bridge does, on 3.12, and its test
    # spends some 20 s waiting out budgets and timeouts: the 3.12 suite runs it, 3.10 has nothing to add
    --ignore=tests/runs/test_bench_rehearse.py)
# The full suites run in parallel pytest-xdist workers (pytest-xdist is in the test extra): one per CPU, at most
# MAX_TEST_WORKERS (more only adds start-up cost: the longest test file is a sizeable share of the suite);
# --dist loadfile keeps each test file in one worker, so a module's fixtures (the adversarial grading, the
# signed copies) run once. MFSDP_TEST_WORKERS=N sets the count, 0 runs in one process.
MAX_TEST_WORKERS=4
# "all" = every extra in pyproject.toml except those in NOT_FOR_TESTS, so a dependency added to any extra
# (or a new extra) reaches the test suite and CI without touching this file.
TEST_EXTRAS="all"
NOT_FOR_TESTS="gpu"  # torch/Megatron-Bridge come from NVIDIA's container on GPU machines; GPU tests skip here
NO_DEPS_EXTRAS="agents"  # wheels used only for the binaries they carry: their Python dependencies are not needed

# Installer telemetry off everywhere (the skills CLI reads either variable).
export DISABLE_TELEMETRY=1 DO_NOT_TRACK=1
# No bytecode in the skill folder: `skill_signature.py verify` reports every unsigned .pyc (SECURITY.md).
export PYTHONDONTWRITEBYTECODE=1
export PIP_DISABLE_PIP_VERSION_CHECK=1

say() { printf '[dev.sh] %s\n' "$*" >&2; }
die() { printf '[dev.sh] error: %s\n' "$*" >&2; exit 2; }

dev_home() {  # the checkout's environment folder, from scripts/mfsdp_lib/devenv.py (one rule for all who look)
    local py="${PYTHON:-}"
    [ -n "$py" ] || py="$(command -v python3 || command -v "python$MAIN_PY_VERSION" || true)"
    [ -n "$py" ] || die "no python3 found; install Python $MAIN_PY_VERSION (and $OLDEST_PY_VERSION for the scripts' tests)"
    "$py" -c '
import sys
sys.path.insert(0, sys.argv[1])
from mfsdp_lib import devenv
try:
    print(devenv.dev_home(sys.argv[2]))
except devenv.DevHomeError as exc:
    sys.exit(f"[dev.sh] error: {exc}")
' "$ROOT/scripts" "$ROOT" || exit 2
}

DEV_HOME="$(dev_home)"
VENV="$DEV_HOME/venv"
VENV310="$DEV_HOME/venv310"
NODE_PREFIX="$DEV_HOME/node"
# Everything this script starts finds the same folder (tests look up the skills CLI and the virtualenvs there).
export MFSDP_DEV_HOME="$DEV_HOME"
# The tools' own caches would otherwise be written into the checkout (.mypy_cache, .ruff_cache, .hypothesis;
# pytest's cache_dir is passed in run_pytest), and installed from there with the skill.
export MYPY_CACHE_DIR="$DEV_HOME/tool-cache/mypy" RUFF_CACHE_DIR="$DEV_HOME/tool-cache/ruff"
export HYPOTHESIS_STORAGE_DIRECTORY="$DEV_HOME/tool-cache/hypothesis"
PYTEST_CACHE_DIR="$DEV_HOME/tool-cache/pytest"
# A pytest run or mypy prints nothing for minutes at a time (a long test file holds the progress line at one
# percentage): one line this often says it is still working (MFSDP_HEARTBEAT_S to change it).
HEARTBEAT_S="${MFSDP_HEARTBEAT_S:-60}"

make_dev_home() {
    mkdir -p "$(dirname "$DEV_HOME")"
    mkdir -p -m 700 "$DEV_HOME"
    local old
    for old in .venv .venv310 .cache; do
        if [ -e "$ROOT/$old" ]; then
            say "note: $old in the checkout is no longer used (environments live in $DEV_HOME);" \
                "delete it, or 'npx skills add' on this checkout installs it with the skill"
        fi
    done
}

with_heartbeat() {  # $1 = what runs (for the message); the rest = the command. Returns the command's status.
    local what="$1" parent=$$ start hb rc=0
    shift
    start="$(date +%s)"
    (
        # sleep gets /dev/null, so a heartbeat still asleep never holds a caller's output pipe open
        while sleep "$HEARTBEAT_S" </dev/null >/dev/null 2>&1; do
            kill -0 "$parent" 2>/dev/null || exit 0
            say "still running: $what ($(($(date +%s) - start)) s so far)"
        done
    ) &
    hb=$!
    "$@" || rc=$?
    kill "$hb" 2>/dev/null || true
    wait "$hb" 2>/dev/null || true
    return "$rc"
}

find_python() {  # $1 = version (3.12); prints an interpreter of that version, or nothing
    local v="$1" c root
    for c in "python$v" "$(command -v pyenv >/dev/null && pyenv root 2>/dev/null)/versions/$v"*/bin/python3 \
             "${PYENV_ROOT:-$HOME/.pyenv}/versions/$v"*/bin/python3; do
        [ -n "$c" ] || continue
        root="$(command -v "$c" 2>/dev/null)" || continue
        if "$root" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$v'.split('.'))))" 2>/dev/null; then
            echo "$root"
            return 0
        fi
    done
    return 0
}

make_venv() {  # $1 = folder, $2 = interpreter
    local venv="$1" py="$2"
    [ -x "$venv/bin/python" ] && return 0
    command -v "$py" >/dev/null || die "$py not found; install Python $MAIN_PY_VERSION (and $OLDEST_PY_VERSION for the scripts' tests)"
    "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || die "$py is $("$py" -V 2>&1); the skill needs Python 3.10 or newer (set PYTHON=...)"
    make_dev_home
    say "creating $venv with $("$py" -V 2>&1)"
    if ! "$py" -m venv "$venv"; then
        rm -rf "$venv"
        die "'$py -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv"
    fi
}

main_python() {
    if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return 0; fi
    local py
    py="$(find_python "$MAIN_PY_VERSION")"
    if [ -z "$py" ]; then
        say "warning: no Python $MAIN_PY_VERSION found (python$MAIN_PY_VERSION, pyenv); using python3 ($(python3 -V 2>&1))"
        py=python3
    fi
    echo "$py"
}

setup_python() {  # $1 = comma-separated extras, or "all" ("" = runtime dependencies only); $2 = venv (default .venv)
    local extras="$1" venv="${2:-$VENV}"
    if [ "$venv" = "$VENV" ]; then
        [ -x "$VENV/bin/python" ] || make_venv "$VENV" "$(main_python)"
    fi
    local stamp="$venv/.deps-${extras//,/-}" want
    want="$(cksum < pyproject.toml)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    local reqs
    # pyproject.toml is the single source of versions; tomllib is 3.11+, pip vendors tomli for 3.10.
    reqs="$("$venv/bin/python" - "$extras" "$NOT_FOR_TESTS" "$NO_DEPS_EXTRAS" <<'PY'
import sys
try:
    import tomllib
except ImportError:
    from pip._vendor import tomli as tomllib
with open("pyproject.toml", "rb") as fh:
    project = tomllib.load(fh)["project"]
reqs = list(project["dependencies"])
extras = project["optional-dependencies"]
wanted = sys.argv[1].split(",") if sys.argv[1] != "all" else [e for e in extras if e not in sys.argv[2].split(",")]
no_deps = sys.argv[3].split(",")
for extra in filter(None, wanted):
    # A "nodeps:" prefix asks the shell below to install that requirement with --no-deps.
    reqs += [("nodeps:" + r) if extra in no_deps else r for r in extras[extra]]
print("\n".join(reqs))
PY
)"
    say "installing into $venv: $(echo "$reqs" | tr '\n' ' ')"
    local -a args=() nodeps=()
    while IFS= read -r line; do
        case "$line" in
            "") ;;
            nodeps:*) nodeps+=("${line#nodeps:}") ;;
            *) args+=("$line") ;;
        esac
    done <<< "$reqs"
    "$venv/bin/python" -m pip install -q "${args[@]}"
    if [ "${#nodeps[@]}" -gt 0 ]; then
        "$venv/bin/python" -m pip install -q --no-deps "${nodeps[@]}"
    fi
    echo "$want" > "$stamp"
}

skills_cli_version() {  # the one place it is written: [tool.mfsdp] skills-cli in pyproject.toml
    "$VENV/bin/python" - <<'PY'
try:
    import tomllib
except ImportError:
    from pip._vendor import tomli as tomllib
with open("pyproject.toml", "rb") as fh:
    print(tomllib.load(fh)["tool"]["mfsdp"]["skills-cli"])
PY
}

setup_node() {
    local SKILLS_CLI_VERSION
    SKILLS_CLI_VERSION="$(skills_cli_version)"
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            say "node/npm missing: installing Debian's nodejs and npm"
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
        else
            die "node and npm are needed for the install test (Node $NODE_MIN_MAJOR or newer)"
        fi
    fi
    local major
    major="$(node -p 'process.versions.node.split(".")[0]')"
    [ "$major" -ge "$NODE_MIN_MAJOR" ] || die "node $(node --version) is too old; skills $SKILLS_CLI_VERSION needs >= $NODE_MIN_MAJOR"
    local pkg="$NODE_PREFIX/node_modules/skills/package.json"
    if [ ! -f "$pkg" ] || [ "$(node -p "require('$pkg').version")" != "$SKILLS_CLI_VERSION" ]; then
        say "installing npm skills@$SKILLS_CLI_VERSION into $NODE_PREFIX"
        make_dev_home
        mkdir -p "$NODE_PREFIX"
        npm install --prefix "$NODE_PREFIX" --no-audit --no-fund --save-exact --loglevel=error \
            "skills@$SKILLS_CLI_VERSION" >/dev/null
    fi
    # Tests find the pinned CLI through either variable, or as `skills` on PATH.
    export MFSDP_SKILLS_CLI="$NODE_PREFIX/node_modules/.bin/skills" SKILLS_CLI="$NODE_PREFIX/node_modules/.bin/skills"
    export PATH="$NODE_PREFIX/node_modules/.bin:$PATH"
}

cmd_demo() {
    setup_python "$DEMO_EXTRAS"
    local py="$VENV/bin/python" out="$DEV_HOME/demo" rc=0
    mkdir -p "$out"
    echo "== 1. check: the bundled Llama 3 8B pretrain config as Bridge builds it =="
    "$py" scripts/mfsdp.py check || rc=$?
    [ "$rc" -le 1 ] || exit "$rc"   # 1 = findings of error severity, which is what we are showing
    echo
    echo "== 2. enable: the Megatron FSDP overrides for it (Hydra-style, for Bridge's launchers) =="
    "$py" scripts/mfsdp.py enable --emit overrides
    echo
    echo "== 3. check the enabled config (enable -o $out/llama3_8b_fsdp.yaml) =="
    # enable -o never overwrites without --force; the file is this job's own output from an earlier run.
    rm -f "$out/llama3_8b_fsdp.yaml"
    "$py" scripts/mfsdp.py enable -o "$out/llama3_8b_fsdp.yaml" >/dev/null
    "$py" scripts/mfsdp.py check "$out/llama3_8b_fsdp.yaml"
}

run_pytest() {  # $1 = interpreter, rest = pytest arguments; exit 5 (nothing selected) is no failure
    local py="$1" rc=0
    shift
    # -ra: a summary line per skipped test with its reason (plus failures), so CI shows what did not run.
    with_heartbeat "pytest on $("$py" -V 2>&1)" "$py" -m pytest -ra -o "cache_dir=$PYTEST_CACHE_DIR" "$@" || rc=$?
    if [ "$rc" -eq 5 ]; then
        say "pytest selected no test (exit 5): nothing failed; check the -k/-m selection"
        return 0
    fi
    return "$rc"
}

parallel_args() {  # $1 = interpreter; prints the pytest-xdist arguments (none: one process)
    local py="$1" n="${MFSDP_TEST_WORKERS:-auto}"
    [ "$n" = 0 ] && return 0
    if ! "$py" -c 'import xdist' 2>/dev/null; then
        say "pytest-xdist is not installed in $py: the suite runs in one process"
        return 0
    fi
    # --no-loadscope-reorder: files go to the workers in the order they are collected, which puts the longest first
    # (LONGEST_FILES in tests/conftest.py); xdist's own order, most tests first, left the slowest few-test files
    # (the agent runs, the adversarial grading, the install) to run alone at the end.
    if [ "$n" = auto ]; then
        echo "-n auto --maxprocesses $MAX_TEST_WORKERS --dist loadfile --no-loadscope-reorder"
    else
        echo "-n $n --dist loadfile --no-loadscope-reorder"
    fi
}

warm_bytecode() {  # $1 = interpreter: one run of each subcommand fills the per-user bytecode cache
    # The suites run mfsdp.py in thousands of subprocesses with PYTHONDONTWRITEBYTECODE=1 (no .pyc in the skill
    # folder), which reads the per-user cache but never writes it (scripts/mfsdp_lib/bytecode_cache.py): without
    # this, each of them compiles the library again, as a user's very first call does. These runs write the
    # cache outside the skill folder, as a user's first calls do; what they print is not needed.
    local py="$1" tmp
    tmp="$(mktemp -d)"
    (
        unset PYTHONDONTWRITEBYTECODE
        local m="scripts/mfsdp.py" ck="tests/fixtures/gpu-run/checkpoints"
        "$py" "$m" check
        "$py" "$m" enable
        "$py" "$m" memory
        "$py" "$m" rules
        "$py" "$m" ckpt "$ck"
        "$py" "$m" log tests/fixtures/gpu-run/smoke_train.log
        "$py" "$m" convert "$ck" "$tmp/out" --to fsdp_dtensor --dry-run
        "$py" "$m" rehearse --model-preset tiny --world-size 8 --dry-run
        "$py" "$m" smoke --nproc-per-node 2 --dry-run
        "$py" "$m" anchors --help
    ) >/dev/null 2>&1 || true
    rm -rf "$tmp"
}

cmd_lint() {
    setup_python "$TEST_EXTRAS"
    say "ruff check, ruff format --check, mypy"
    "$VENV/bin/ruff" check . || die "ruff check failed (ruff check --fix fixes many)"
    "$VENV/bin/ruff" format --check . || die "ruff format --check failed (run: $VENV/bin/ruff format .)"
    with_heartbeat mypy "$VENV/bin/mypy" || die "mypy failed"
}

setup_py310() {  # the Python 3.10 environment; returns 1 (after a warning) when no 3.10 is found outside CI
    local py="${PYTHON310:-}"
    [ -n "$py" ] || py="$(find_python "$OLDEST_PY_VERSION")"
    if [ -z "$py" ]; then
        local msg="no Python $OLDEST_PY_VERSION found (set PYTHON310, or put python$OLDEST_PY_VERSION on PATH, or pyenv install $OLDEST_PY_VERSION)"
        if [ "${CI:-}" = "true" ] || [ "${CI:-}" = "1" ]; then
            die "$msg: CI runs the scripts' tests on the oldest Python they promise"
        fi
        say "warning: $msg; the scripts' tests did not run on Python $OLDEST_PY_VERSION"
        return 1
    fi
    make_venv "$VENV310" "$py"
    setup_python "$PY310_EXTRAS" "$VENV310"
    warm_bytecode "$VENV310/bin/python"
}

cmd_test310() {
    setup_py310 || return 0
    say "the scripts' tests on $("$VENV310/bin/python" -V 2>&1)"
    if [ "$#" -gt 0 ]; then
        run_pytest "$VENV310/bin/python" "$@"
    else
        # shellcheck disable=SC2046  # the arguments are words on purpose
        run_pytest "$VENV310/bin/python" $(parallel_args "$VENV310/bin/python") -q "${PY310_TESTS[@]}"
    fi
}

cmd_test() {
    setup_python "$TEST_EXTRAS"
    setup_node
    # before the 3.12 suite: its dev.sh tests (the heartbeat) run test310 and need the 3.10 environment made
    [ "$#" -gt 0 ] || setup_py310 || true
    export PATH="$VENV/bin:$PATH"  # agentskills (skills-ref) for the install test
    cmd_lint
    warm_bytecode "$VENV/bin/python"
    say "the test suite on $("$VENV/bin/python" -V 2>&1)"
    if [ "$#" -gt 0 ]; then
        run_pytest "$VENV/bin/python" "$@"
        return
    fi
    local rc=0
    # shellcheck disable=SC2046  # the arguments are words on purpose
    run_pytest "$VENV/bin/python" $(parallel_args "$VENV/bin/python") tests || rc=$?
    cmd_test310 || rc=$?  # runs even when the 3.12 suite failed: CI shows both
    return "$rc"
}

cmd_sign() {
    setup_python "run,sign"
    # The release key never enters the repository: MFSDP_SIGNING_DIR names the folder that holds it (default:
    # signing/ in $MFSDP_SHARED_DIR, else in a folder named shared beside the checkout).
    local s="${MFSDP_SIGNING_DIR:-${MFSDP_SHARED_DIR:-$(dirname "$ROOT")/shared}/signing}"
    [ -f "$s/leaf.key.pem" ] || die "no signing key at $s/leaf.key.pem (set MFSDP_SIGNING_DIR=folder with leaf.key.pem)"
    "$VENV/bin/python" scripts/skill_signature.py sign --key "$s/leaf.key.pem" --cert "$s/leaf.crt.pem" \
        --chain "$s/ica.crt.pem" --chain "$s/root.crt.pem" "$ROOT"
    "$VENV/bin/python" scripts/skill_signature.py verify --dev-tree --root "$s/root.crt.pem" "$ROOT"
}

cmd_benchmark_md() {
    setup_python "$DEMO_EXTRAS"
    "$VENV/bin/python" benchmarks/make_report.py "$@"
}

case "${1:-}" in
    demo) shift; cmd_demo "$@" ;;
    test) shift; cmd_test "$@" ;;
    lint) shift; cmd_lint ;;
    test310) shift; cmd_test310 "$@" ;;
    sign) shift; cmd_sign "$@" ;;
    benchmark-md) shift; cmd_benchmark_md "$@" ;;
    setup) shift; setup_python "$TEST_EXTRAS"; setup_node; say "ready: $VENV and $NODE_PREFIX" ;;
    where) echo "$DEV_HOME" ;;
    -h|--help|help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' ;;
    *) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
