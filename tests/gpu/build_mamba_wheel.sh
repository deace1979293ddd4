#!/usr/bin/env bash
# Build a pure-Python wheel of mamba-ssm (its Triton kernels, no compiled extension) for a GPU machine
# that has PyTorch but no CUDA toolkit and no network.
#
# usage: tests/gpu/build_mamba_wheel.sh SDIST OUT_DIR
#   SDIST    mamba-ssm's source distribution (mamba_ssm-2.3.2.post1.tar.gz), its unpacked folder, or a
#            requirement such as mamba-ssm==2.3.2.post1 to fetch it from the package index (a plain
#            `pip download` of it fails without torch: pip runs setup.py to read its metadata)
#   OUT_DIR  where the wheel goes (created); carry it to the GPU machine and give it to setup_device.sh
# env: PY (default python3): an interpreter with setuptools>=61, wheel and packaging (no torch needed)
#
# Why this is enough for megatron-core's Mamba-2 mixer (megatron/core/ssm/mamba_mixer.py, 0.19.2):
# * the mixer imports only mamba_ssm.ops.triton.layernorm_gated (RMSNormGated) and
#   mamba_ssm.ops.triton.ssd_combined (mamba_chunk_scan_combined, mamba_split_conv1d_scan_combined),
#   mamba_mixer.py:68-79: Triton kernels, plain Python files compiled on the GPU at first use;
# * the package's compiled extension (selective_scan_cuda, the Mamba-1 scan) is built only when
#   MAMBA_SKIP_CUDA_BUILD is not TRUE (setup.py:42, :135) and the Mamba-2 mixer never calls it; the
#   package's __init__ still imports it (ops/selective_scan_interface.py): the rehearsal
#   (scripts/mfsdp_gpu/mamba.py) handles that at run time, loudly (references/rehearse.md, "Hybrid (Mamba) models");
# * MAMBA_FORCE_BUILD=TRUE (setup.py:41, :337) keeps bdist_wheel from trying to download a prebuilt
#   binary wheel from GitHub (no network here, and it would be the compiled one);
# * setup.py imports torch at the top only to read torch.version.hip and to name the extension
#   builders, none of which a build without extensions uses: a stub `torch` package on PYTHONPATH,
#   for this build only, stands in for it. The wheel holds the sdist's own Python files, unchanged.
# The wheel is py3-none-any; its dependencies (torch, triton, einops, transformers...) are not
# installed with it (setup_device.sh installs it with --no-deps and checks they import).
set -euo pipefail

SDIST=${1:?usage: build_mamba_wheel.sh SDIST OUT_DIR}
OUT=${2:?usage: build_mamba_wheel.sh SDIST OUT_DIR}
PY=${PY:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

INDEX=(--no-index)
if [ -d "$SDIST" ]; then
  cp -r "$SDIST" "$WORK/src"
elif [ -f "$SDIST" ]; then
  mkdir "$WORK/unpack"
  tar -xzf "$SDIST" -C "$WORK/unpack"
  mv "$WORK"/unpack/* "$WORK/src"
else  # a requirement: pip fetches the source distribution (never a prebuilt binary wheel)
  SRC="$SDIST"
  INDEX=(--no-binary :all:)
fi
if [ -z "${SRC:-}" ]; then
  [ -f "$WORK/src/setup.py" ] && [ -d "$WORK/src/mamba_ssm" ] || {
    echo "build_mamba_wheel: $SDIST is not mamba-ssm's source (no setup.py and mamba_ssm/)" >&2; exit 2; }
  SRC="$WORK/src"
fi

# The build-time stand-in for torch (see above): only the names setup.py reads at import.
mkdir -p "$WORK/shim/torch/utils"
cat > "$WORK/shim/torch/__init__.py" <<'EOF'
"""Build-time stand-in: mamba-ssm's setup.py imports torch; a build without extensions reads only these."""
__version__ = "0.0"


class version:
    hip = None
    cuda = None
EOF
: > "$WORK/shim/torch/utils/__init__.py"
cat > "$WORK/shim/torch/utils/cpp_extension.py" <<'EOF'
CUDA_HOME = None
HIP_HOME = None


class BuildExtension:  # named by setup.py; used only when it builds extensions
    pass


def CUDAExtension(*args, **kwargs):
    raise RuntimeError("this build skips the CUDA extensions (MAMBA_SKIP_CUDA_BUILD=TRUE)")
EOF

mkdir -p "$OUT"
MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE PYTHONPATH="$WORK/shim" PYTHONDONTWRITEBYTECODE=1 \
  "$PY" -m pip wheel --no-deps --no-build-isolation "${INDEX[@]}" -q -w "$WORK/dist" "$SRC"

WHL=$(ls "$WORK"/dist/mamba_ssm-*.whl)
case "$(basename "$WHL")" in
  *-py3-none-any.whl) ;;
  *) echo "build_mamba_wheel: expected a py3-none-any wheel, got $(basename "$WHL")" >&2; exit 1 ;;
esac
"$PY" - "$WHL" <<'PYEOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
binary = [n for n in names if n.endswith((".so", ".pyd"))]
need = ["mamba_ssm/ops/triton/ssd_combined.py", "mamba_ssm/ops/triton/layernorm_gated.py"]
missing = [n for n in need if n not in names]
if binary or missing:
    sys.exit(f"build_mamba_wheel: unexpected wheel content: binary {binary}, missing {missing}")
print(f"{len(names)} files, no compiled code")
PYEOF
cp "$WHL" "$OUT/"
echo "wrote $OUT/$(basename "$WHL") sha256 $(sha256sum "$WHL" | cut -d' ' -f1)"
