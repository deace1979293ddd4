#!/usr/bin/env bash
# Two checks on one GPU with Megatron-Bridge installed (tests/gpu/setup_device.sh), results in RAW:
#
# 1. A dtype field whose default is None, given as a string override
#    (ddp.megatron_fsdp_main_grads_dtype=fp32), against the same field given the way Bridge's YAML
#    writes a dtype ({_target_: torch.float32, _call_: false}, megatron/training/config/yaml_utils.py ::
#    _torch_dtype_representer; read back by ConfigContainer.from_yaml's instantiate). Bridge's override
#    path turns a string into a dtype only when the field already holds one
#    (megatron/bridge/training/utils/omegaconf_utils.py :: _apply_overrides), so the string reaches
#    Megatron FSDP as a string. RAW/dtype_string* and RAW/dtype_yaml* hold each run's command, exit code,
#    JSON summary, stderr and engine log; the YAML run starts from the string run's own run_config.yaml
#    with that one line replaced (RAW/dtype_yaml.yaml).
# 2. SIGTERM (what timeout and schedulers send) to a rehearsal in training: the command must stop the
#    engine's whole process group, and no process of ours may keep GPU memory afterwards. RAW/stop/ holds
#    the command's exit code and stderr, and nvidia-smi's compute processes and memory before and after.
#
# usage: benchmarks/gpu_dtype_override_and_stop.sh RAW      (about 4 minutes; env PY: the interpreter)
set -u
RAW=${1:?usage: gpu_dtype_override_and_stop.sh RAW}
PY=${PY:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
M="$HERE/scripts/mfsdp.py"
STOP_AFTER_STEP=3  # SIGTERM once this step has finished: the engine is then training, its memory allocated
mkdir -p "$RAW/stop"
export PYTHONUNBUFFERED=1
unset CUDA_DEVICE_MAX_CONNECTIONS

smi() { nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$1.apps.csv" 2>&1
        nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$1.gpu.csv" 2>&1; }

# --- 2 starts first (it waits for training), 1 runs beside it ---
(
  "$PY" "$M" rehearse --model-preset llama-1b --world-size 8 --perf --warmup 1 --iters 5000 \
    --out "$RAW/stop/run" > "$RAW/stop/cli.stdout" 2> "$RAW/stop/cli.stderr" &
  echo $! > "$RAW/stop/cli.pid"
  wait $!
  echo $? > "$RAW/stop/cli.rc"
) &
STOP_JOB=$!

one() {  # name, then the rehearse arguments
  local name=$1; shift
  echo "$PY $M rehearse $*" > "$RAW/$name.cmd"
  "$PY" "$M" rehearse "$@" --out "$RAW/$name" --format json > "$RAW/$name.json" 2> "$RAW/$name.stderr"
  echo $? > "$RAW/$name.rc"
}
one dtype_string --model-preset tiny --world-size 2 --strategy optim_grads_params ddp.megatron_fsdp_main_grads_dtype=fp32
"$PY" - "$RAW/dtype_string/rank_0/run_config.yaml" "$RAW/dtype_yaml.yaml" <<'PYEOF'
import re, sys
text = open(sys.argv[1]).read()
block = "  megatron_fsdp_main_grads_dtype:\n    _call_: false\n    _target_: torch.float32\n"
new, n = re.subn(r"^  megatron_fsdp_main_grads_dtype: .*\n", block, text, flags=re.M)
if n != 1:
    sys.exit(f"megatron_fsdp_main_grads_dtype found {n} times in {sys.argv[1]}")
open(sys.argv[2], "w").write(new)
print("wrote", sys.argv[2])
PYEOF
one dtype_yaml "$RAW/dtype_yaml.yaml" --world-size 2 --strategy optim_grads_params

# --- 2: stop the rehearsal once it trains ---
LOG="$RAW/stop/run/rank_0/log.txt"
for _ in $(seq 1 300); do
  grep -q "] step $STOP_AFTER_STEP:" "$LOG" 2>/dev/null && break
  sleep 1
done
smi "$RAW/stop/before"
date -u +%FT%TZ > "$RAW/stop/sigterm_utc"
kill -TERM "$(cat "$RAW/stop/cli.pid")"
wait "$STOP_JOB"
sleep 2
smi "$RAW/stop/after"
ps -eo pid,pgid,etimes,cmd | grep -E "rehearse_train|mfsdp.py" | grep -v grep > "$RAW/stop/processes_after.txt" || true
cp "$LOG" "$RAW/stop/engine_log.txt" 2>/dev/null
cp "$RAW/stop/run/rank_0/report.json" "$RAW/stop/engine_report.json" 2>/dev/null
rm -rf "$RAW/stop/run"
for n in dtype_string dtype_yaml; do
  cp "$RAW/$n/rank_0/log.txt" "$RAW/$n.engine_log.txt" 2>/dev/null
  cp "$RAW/$n/rank_0/report.json" "$RAW/$n.report.json" 2>/dev/null
  rm -rf "${RAW:?}/$n"
done
echo "dtype_string rc=$(cat "$RAW/dtype_string.rc") dtype_yaml rc=$(cat "$RAW/dtype_yaml.rc") stop rc=$(cat "$RAW/stop/cli.rc")"
echo "compute processes after the stop:"; cat "$RAW/stop/after.apps.csv"; cat "$RAW/stop/after.gpu.csv"
