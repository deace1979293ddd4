#!/usr/bin/env bash
# Set up a bare GPU machine (PyTorch present, no network) for the Megatron-Bridge smoke test.
#
# usage: tests/gpu/setup_device.sh WHEEL_DIR TE_CORE [EXTRA_DIR]
#   WHEEL_DIR  folder of wheels: megatron-bridge 0.6.2, megatron-core 0.19.2, megatron-fsdp 0.6.1,
#              transformer_engine 2.20.2 (meta), transformer_engine_torch 2.20.2 (built for this torch),
#              and their pure dependencies (tests/gpu/device-wheels.txt; tests/gpu/README.md says how to make it)
#   TE_CORE    transformer_engine_cu13 2.20.2 wheel, or a folder holding it split into parts
#              (te.part.0, te.part.1, ...: a 276 MB wheel is larger than some transfer limits allow)
#   EXTRA_DIR  optional folder of optional wheels, installed the same way when present: mamba-ssm's
#              pure-Python wheel (tests/gpu/build_mamba_wheel.sh) for hybrid (Mamba) models
# env: PY (default: python3, the interpreter that has torch), TE_SHA256 (expected digest of TE_CORE),
#      ALL=1 (reinstall what is present), DRY=1 (print the plan only)
#
# Why each step exists (all met on the lent H200, 2026-12-02):
# * offline install with --no-deps, skipping distributions already present: the image's torch,
#   numpy, scipy, transformers... must stay as they are, and there is no index to resolve against;
# * nvidia-resiliency-ext 0.6.0 is published for manylinux_2_39 only, although its one extension
#   needs GLIBC_2.32: on an older glibc the wheel is installed under a manylinux_2_32 name;
# * megatron-core's wheel ships the dataset helper extension but not the Makefile that Bridge's
#   compile_helpers() runs 'make' on: without one, the first mock-data build exits with
#   "Failed to compile the C++ dataset helper functions". We write a Makefile whose target is the
#   shipped extension, so make finds it up to date and builds nothing;
# * torch must be imported before transformer_engine (torch loads libnccl.so.2, which TE's core
#   library links against), which the final import check does;
# * mamba-ssm's wheel is pure Python and is installed without its dependencies: it needs torch,
#   triton and einops (and transformers for its package import), which the image must have; the
#   final check imports it the way a rehearsal does (scripts/mfsdp_gpu/mamba.py: before megatron, so
#   that megatron-core's Mamba mixer binds its kernels) and says what the rehearsal will have to work around.
set -euo pipefail

WHEEL_DIR=${1:?usage: setup_device.sh WHEEL_DIR TE_CORE [EXTRA_DIR]}
TE_CORE=${2:?usage: setup_device.sh WHEEL_DIR TE_CORE [EXTRA_DIR]}
EXTRA_DIR=${3:-}
if [ -n "$EXTRA_DIR" ] && [ ! -d "$EXTRA_DIR" ]; then
  echo "setup_device: EXTRA_DIR $EXTRA_DIR is not a folder" >&2
  exit 2
fi
PY=${PY:-python3}
TE_SHA256=${TE_SHA256:-30063d3699e779cce63617c3458804f7a504ce8279f2749c98313db9daae273e}  # transformer_engine_cu13-2.20.2 manylinux_2_28 x86_64 on PyPI
TE_NAME=transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT

if [ -d "$TE_CORE" ]; then  # reassemble the parts in order
  ls "$TE_CORE"/te.part.* >/dev/null
  cat "$TE_CORE"/te.part.? > "$STAGE/$TE_NAME"  # single-digit part numbers: the glob is in order
  TE_WHL="$STAGE/$TE_NAME"
else
  TE_WHL="$TE_CORE"
fi
got=$(sha256sum "$TE_WHL" | cut -d' ' -f1)
if [ "$got" != "$TE_SHA256" ]; then
  echo "setup_device: $TE_WHL has sha256 $got, expected $TE_SHA256 (a part missing or out of order?)" >&2
  exit 1
fi

# Pick the wheels to install (one line per decision on stderr, the paths on stdout).
SELECTED=$(ALL=${ALL:-0} STAGE="$STAGE" "$PY" - "$WHEEL_DIR" "$TE_WHL" ${EXTRA_DIR:+"$EXTRA_DIR"} <<'PYEOF'
import glob, os, shutil, sys
from importlib import metadata

paths = []
for arg in sys.argv[1:]:
    paths += sorted(glob.glob(os.path.join(arg, "*.whl"))) if os.path.isdir(arg) else [arg]
libc = os.confstr("CS_GNU_LIBC_VERSION").split()[1]
glibc = tuple(int(x) for x in libc.split(".")[:2])
chosen = []
for path in paths:
    base = os.path.basename(path)
    dist, version = base.split("-")[:2]
    try:
        present = metadata.version(dist)
    except metadata.PackageNotFoundError:
        present = None
    if present and os.environ.get("ALL") != "1":
        print(f"keep    {dist} {present} (wheel has {version})", file=sys.stderr)
        continue
    if "manylinux_2_39" in base and glibc < (2, 39):
        renamed = os.path.join(os.environ["STAGE"], base.replace("manylinux_2_39", "manylinux_2_32"))
        shutil.copy(path, renamed)
        print(f"retag   {base} for glibc {libc}", file=sys.stderr)
        path = renamed
    print(f"install {dist} {version}", file=sys.stderr)
    chosen.append(path)
print("\n".join(chosen))
PYEOF
)

if [ "${DRY:-0}" = 1 ]; then echo "$SELECTED"; exit 0; fi
if [ -n "$SELECTED" ]; then
  if "$PY" -m pip --version >/dev/null 2>&1; then
    PIP=("$PY" -m pip)
  else  # a venv made without pip: run pip from its wheel in WHEEL_DIR
    PIPWHL=$(ls "$WHEEL_DIR"/pip-*.whl | head -1)
    PIP=("$PY" "$PIPWHL/pip")
  fi
  mapfile -t WHEELS <<< "$SELECTED"
  "${PIP[@]}" install --no-index --no-deps --no-compile -q "${WHEELS[@]}"
fi

# The dataset-helper Makefile megatron-core's wheel lacks.
DS_DIR=$("$PY" -c "import importlib.util as u, os; print(os.path.dirname(u.find_spec('megatron.core').origin) + '/datasets')")
SUFFIX=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
if [ ! -f "$DS_DIR/Makefile" ]; then
  INCLUDES=$("$PY" -m pybind11 --includes 2>/dev/null || true)
  printf 'all: helpers_cpp%s\n\nhelpers_cpp%s: helpers.cpp\n\t$(CXX) -O3 -shared -std=c++17 -fPIC %s helpers.cpp -o $@\n' \
    "$SUFFIX" "$SUFFIX" "$INCLUDES" > "$DS_DIR/Makefile"
  touch "$DS_DIR/helpers_cpp$SUFFIX"  # newer than helpers.cpp: nothing to rebuild
  echo "wrote $DS_DIR/Makefile"
fi
make -q -C "$DS_DIR" && echo "dataset helpers: up to date"

"$PY" "$(dirname "${BASH_SOURCE[0]}")/check_device.py"
