#!/usr/bin/env bash
# Run the GPU evidence of this repo on a machine prepared by tests/gpu/setup_device.sh.
#
# usage: tests/gpu/run_device.sh RESULTS_DIR STAGE [STAGE ...]
#   pytest     the seed's smoke: torchrun -> pytest tests/gpu/test_smoke_gpu.py (-v -s), 1 passed wanted
#   smoke      scripts/mfsdp.py smoke --save-resume --format json (the user-facing command)
#   verdicts   tests/differential/gen_verdicts.py (Bridge's verdicts for the differential test)
#   bench      benchmarks/bench_strategies.py (DDP / distopt / FSDP optim, optim_grads, optim_grads_params)
# env: NPROC (GPUs per node, default: all visible), PY (default python3), TAG (benchmark tag, default <NPROC>xh200),
#      STAGE_TIMEOUT (seconds per stage, default 600), BENCH_TIMEOUT (seconds per benchmarked strategy, default 420)
#
# Each stage writes under RESULTS_DIR and keeps going when an earlier one failed, so one
# device call brings back all the evidence it can. Checkpoint tensors (*.distcp) are
# deleted after each stage: only metadata is kept as fixtures.
set -uo pipefail
OUTDIR=$(realpath -m "${1:?usage: run_device.sh RESULTS_DIR STAGE...}"); shift
PY=${PY:-python3}
NPROC=${NPROC:-$("$PY" -c 'import torch; print(torch.cuda.device_count())')}
TAG=${TAG:-${NPROC}xh200}
T=(timeout -k 15 "${STAGE_TIMEOUT:-600}")  # a hung NCCL job must not eat the next stages' time
HERE=$(cd "$(dirname "$0")/../.." && pwd)
cd "$HERE"
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron FSDP asserts it is unset or > 1
status=0
stamp() { echo "[run_device $(date -u +%H:%M:%S)] $*"; }

for stage in "$@"; do
  t0=$(date +%s)
  case "$stage" in
    pytest)
      stamp "pytest smoke on $NPROC GPU(s)"
      MFSDP_SMOKE_OUT="$OUTDIR/pytest_smoke" "${T[@]}" "$PY" -m torch.distributed.run --nproc_per_node="$NPROC" \
        -m pytest tests/gpu/test_smoke_gpu.py -v -s -p no:cacheprovider 2>&1 | tee "$OUTDIR/pytest_smoke.log"
      rc=${PIPESTATUS[0]} ;;
    smoke)
      stamp "mfsdp.py smoke on $NPROC GPU(s)"
      "${T[@]}" "$PY" scripts/mfsdp.py smoke --nproc-per-node "$NPROC" --save-resume --format json \
        --out "$OUTDIR/cli_smoke" > "$OUTDIR/cli_smoke.json" 2> "$OUTDIR/cli_smoke.stderr"
      rc=$?; tail -c 3000 "$OUTDIR/cli_smoke.json" ;;
    verdicts)
      stamp "differential verdicts"
      "${T[@]}" "$PY" tests/differential/gen_verdicts.py --out "$OUTDIR/differential" 2>&1 | tail -n 40 > "$OUTDIR/verdicts.log"
      rc=${PIPESTATUS[0]}; tail -n 3 "$OUTDIR/verdicts.log" ;;
    bench)
      stamp "strategy benchmark on $NPROC GPU(s)"
      "${T[@]}" "$PY" benchmarks/bench_strategies.py --nproc-per-node "$NPROC" --tag "$TAG" --timeout "${BENCH_TIMEOUT:-420}" \
        --raw-dir "$OUTDIR/bench_raw" --results-dir "$OUTDIR/bench_results" 2>&1 | tee "$OUTDIR/bench.log"
      rc=${PIPESTATUS[0]} ;;
    *) echo "unknown stage $stage"; rc=2 ;;
  esac
  find "$OUTDIR" -name '*.distcp' -delete
  stamp "$stage: exit $rc after $(( $(date +%s) - t0 ))s"
  echo "$stage $rc $(( $(date +%s) - t0 ))" >> "$OUTDIR/stages.txt"
  [ "$rc" = 0 ] || status=1
done
exit $status
