#!/usr/bin/env bash
# Live mode (`mfsdp.py enable --recipe`) on a GPU machine with the real Megatron-Bridge: do our batch
# rules and Bridge's runtime_config_update() judge the same world? Each run's stdout, stderr and exit
# code land in /root/r as <run>.out/.err/.rc (wall times in stages.txt), packed into $OUT/live_world.tgz.
# Runs named *0 use enable.py's live mode as it was before live_world() (kept in .whl/old), for the
# before/after of the launcher's-WORLD_SIZE case.
# Set-up: tests/gpu/README.md (wheels in .whl/wheels, TE core parts in /root/te).
set -u
R=/root/r; rm -rf $R; mkdir -p $R
export PYTHONUNBUFFERED=1
rm -rf /tmp/old_scripts; cp -r scripts /tmp/old_scripts; cp .whl/old/cli_enable.py /tmp/old_scripts/mfsdp_lib/cli/enable.py
sha256sum scripts/mfsdp_lib/cli/enable.py /tmp/old_scripts/mfsdp_lib/cli/enable.py > $R/code_sha256.txt
t0=$(date +%s)
{ time bash tests/gpu/setup_device.sh .whl/wheels /root/te; } > $R/setup.log 2>&1
echo "setup rc=$? $(( $(date +%s) - t0 ))s" | tee -a $R/stages.txt
unset CUDA_DEVICE_MAX_CONNECTIONS WORLD_SIZE
export RANK=0 LOCAL_RANK=0
M="model.num_layers=2 model.hidden_size=256 model.num_attention_heads=4 train.micro_batch_size=2"
V=vanilla_gpt_pretrain_config
E="python3 scripts/mfsdp.py enable --recipe"
E0="python3 /tmp/old_scripts/mfsdp.py enable --recipe"
job() {  # name, then env/command words; records out, err, rc, seconds
  local n=$1; shift
  ( s=$(date +%s); timeout -k 5 150 env "$@" > $R/$n.out 2> $R/$n.err; echo "$?" > $R/$n.rc
    echo "$n rc=$(cat $R/$n.rc) $(( $(date +%s) - s ))s :: $*" >> $R/stages.txt ) &
}
job W1  $E $V $M --gpus 8                                        # 32 / (2 x 8): fits
job W2  $E $V $M train.global_batch_size=24 --gpus 8             # 24 / (2 x 8): both must refuse
job W3  $E $V $M train.global_batch_size=24                      # no world given: the layout's smallest (1)
job W4  WORLD_SIZE=8 $E $V $M train.global_batch_size=24         # a launcher's world of 8: both must refuse
job W40 WORLD_SIZE=8 $E0 $V $M train.global_batch_size=24        # the same before live_world()
job W5  WORLD_SIZE=8 $E $V $M train.global_batch_size=24 --gpus 4  # --gpus wins: 24 / (2 x 4)
job W6  WORLD_SIZE=eight $E $V $M                                # not a count: one line, exit 2
wait
echo "total $(( $(date +%s) - t0 ))s" >> $R/stages.txt
cat $R/stages.txt
for n in W1 W2 W3 W4 W40 W5 W6; do echo "== $n rc=$(cat $R/$n.rc)"; grep -E "MFSDP-|runtime_config_update|error" $R/$n.err | cut -c1-240 | tail -n 6; done
tar czf $OUT/live_world.tgz -C /root r
