#!/usr/bin/env bash
# dev.sh: set-up plus the everyday jobs of the skill's developers, in one command each.
#
#   bash scripts/dev.sh demo          check + enable Megatron FSDP on the bundled Llama 3 8B config
#   bash scripts/dev.sh test [ARGS]   the whole test suite (ARGS go to pytest, e.g. -k signature)
#   bash scripts/dev.sh sign          re-sign skill.oms.sig with the maintainers' key in ../shared/signing
#   bash scripts/dev.sh benchmark-md  regenerate BENCHMARK.md from benchmarks/results/*.json
#   bash scripts/dev.sh setup         only the set-up that `test` does
#
# Set-up is part of every job, so a fresh machine (Python 3.10+, Node 18+, no GPU) needs nothing
# prepared by hand, and a warm one skips it in a second:
#   * .venv is made with python3 ($PYTHON to choose another) and gets the pinned packages of the
#     pyproject.toml extras the job needs (read from pyproject.toml, so versions live in one place);
#     a stamp with pyproject.toml's digest skips pip when nothing changed.
#   * the npm `skills` CLI (pinned below) goes into .cache/node for the install test.
# Both folders are git-ignored and are not part of the signed skill (scripts/mfsdp_lib/integrity/signature.py).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
NODE_PREFIX="$ROOT/.cache/node"
# The newest `skills` release whose package.json allows Node 20: 1.5.19 and later declare
# engines.node >= 22.20.0 (1.5.26 still happens to run a local add on Node 20, with npm's EBADENGINE
# warning; 1.7.4 fails to start there). Checked to install and run on Node 20.20.
SKILLS_CLI_VERSION="1.5.18"
NODE_MIN_MAJOR=18  # engines.node of skills 1.5.18
DEMO_EXTRAS="run"
# "all" = every extra in pyproject.toml except those in NOT_FOR_TESTS, so a dependency added to any extra
# (or a new extra) reaches the test suite and CI without touching this file.
TEST_EXTRAS="all"
NOT_FOR_TESTS="gpu"  # torch/Megatron-Bridge come from NVIDIA's container on GPU machines; GPU tests skip here
NO_DEPS_EXTRAS="agents"  # wheels used only for the binaries they carry: their Python dependencies are not needed

# Installer telemetry off everywhere (the skills CLI reads either variable).
export DISABLE_TELEMETRY=1 DO_NOT_TRACK=1
export PIP_DISABLE_PIP_VERSION_CHECK=1

say() { printf '[dev.sh] %s\n' "$*" >&2; }
die() { printf '[dev.sh] error: %s\n' "$*" >&2; exit 2; }

setup_python() {  # $1 = comma-separated extras, or "all" ("" = runtime dependencies only)
    local extras="$1" py="${PYTHON:-python3}"
    if [ ! -x "$VENV/bin/python" ]; then
        command -v "$py" >/dev/null || die "$py not found; install Python 3.10 or newer"
        "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
            || die "$py is $("$py" -V 2>&1); the skill needs Python 3.10 or newer (set PYTHON=...)"
        say "creating .venv with $("$py" -V 2>&1)"
        if ! "$py" -m venv "$VENV"; then
            rm -rf "$VENV"
            die "'$py -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv"
        fi
    fi
    local stamp="$VENV/.deps-${extras//,/-}" want
    want="$(cksum < pyproject.toml)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return 0
    fi
    local reqs
    # pyproject.toml is the single source of versions; tomllib is 3.11+, pip vendors tomli for 3.10.
    reqs="$("$VENV/bin/python" - "$extras" "$NOT_FOR_TESTS" "$NO_DEPS_EXTRAS" <<'PY'
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
    say "installing into .venv: $(echo "$reqs" | tr '\n' ' ')"
    local -a args=() nodeps=()
    while IFS= read -r line; do
        case "$line" in
            "") ;;
            nodeps:*) nodeps+=("${line#nodeps:}") ;;
            *) args+=("$line") ;;
        esac
    done <<< "$reqs"
    "$VENV/bin/python" -m pip install -q "${args[@]}"
    if [ "${#nodeps[@]}" -gt 0 ]; then
        "$VENV/bin/python" -m pip install -q --no-deps "${nodeps[@]}"
    fi
    echo "$want" > "$stamp"
}

setup_node() {
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
        say "installing npm skills@$SKILLS_CLI_VERSION into .cache/node"
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
    local py="$VENV/bin/python" out="$ROOT/.cache/demo" rc=0
    mkdir -p "$out"
    echo "== 1. check: the bundled Llama 3 8B pretrain config as Bridge builds it =="
    "$py" scripts/mfsdp.py check || rc=$?
    [ "$rc" -le 1 ] || exit "$rc"   # 1 = findings of error severity, which is what we are showing
    echo
    echo "== 2. enable: the Megatron FSDP overrides for it (Hydra-style, for Bridge's launchers) =="
    "$py" scripts/mfsdp.py enable --emit overrides
    echo
    echo "== 3. check the enabled config (enable -o .cache/demo/llama3_8b_fsdp.yaml) =="
    # enable -o never overwrites without --force; the file is this job's own output from an earlier run.
    rm -f "$out/llama3_8b_fsdp.yaml"
    "$py" scripts/mfsdp.py enable -o "$out/llama3_8b_fsdp.yaml" >/dev/null
    "$py" scripts/mfsdp.py check "$out/llama3_8b_fsdp.yaml"
}

cmd_test() {
    setup_python "$TEST_EXTRAS"
    setup_node
    export PATH="$VENV/bin:$PATH"  # agentskills (skills-ref) for the install test
    local rc=0
    # -ra: a summary line per skipped test with its reason (plus failures), so CI shows what did not run.
    "$VENV/bin/python" -m pytest -ra "${@:-tests}" || rc=$?
    if [ "$rc" -eq 5 ]; then
        say "pytest selected no test (exit 5): nothing failed; check the -k/-m selection"
        return 0
    fi
    return "$rc"
}

cmd_sign() {
    setup_python "run,sign"
    # The maintainers' key lives beside the checkout in ../shared/signing and never enters the repo.
    local s="${MFSDP_SIGNING_DIR:-${MFSDP_SHARED_DIR:-$ROOT/../shared}/signing}"
    [ -f "$s/leaf.key.pem" ] || die "no signing key at $s/leaf.key.pem (set MFSDP_SIGNING_DIR=folder with leaf.key.pem)"
    "$VENV/bin/python" scripts/skill_signature.py sign --key "$s/leaf.key.pem" --cert "$s/leaf.crt.pem" \
        --chain "$s/ica.crt.pem" --chain "$s/root.crt.pem" "$ROOT"
    "$VENV/bin/python" scripts/skill_signature.py verify --root "$s/root.crt.pem" "$ROOT"
}

cmd_benchmark_md() {
    setup_python "$DEMO_EXTRAS"
    "$VENV/bin/python" benchmarks/make_report.py "$@"
}

case "${1:-}" in
    demo) shift; cmd_demo "$@" ;;
    test) shift; cmd_test "$@" ;;
    sign) shift; cmd_sign "$@" ;;
    benchmark-md) shift; cmd_benchmark_md "$@" ;;
    setup) shift; setup_python "$TEST_EXTRAS"; setup_node; say "ready: .venv and .cache/node" ;;
    -h|--help|help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' ;;
    *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
