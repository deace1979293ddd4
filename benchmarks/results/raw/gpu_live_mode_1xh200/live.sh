#!/usr/bin/env bash
# gpu2 streak: set up Bridge, then run `mfsdp.py enable --recipe` (live mode) for real, and the
# differential verdicts with the two appended weight-hash cases. Everything lands in /root/r,
# packed into $OUT/live.tgz (the device tool brings back at most 8 files).
set -u
R=/root/r; rm -rf $R; mkdir -p $R
export PYTHONUNBUFFERED=1
cp -r scripts /tmp/main_scripts                       # main's code as merged (for the before/after)
cp .gpuwork/g2/cli_enable.py scripts/mfsdp_lib/cli_enable.py
cp .gpuwork/g2/gen_verdicts.py tests/differential/gen_verdicts.py
git rev-parse HEAD > $R/main_head.txt 2>/dev/null
sha256sum scripts/mfsdp_lib/cli_enable.py /tmp/main_scripts/mfsdp_lib/cli_enable.py tests/differential/gen_verdicts.py > $R/code_sha256.txt
t0=$(date +%s)
{ time bash tests/gpu/setup_device.sh .gpuwork/wheels /root/te; } > $R/setup.log 2>&1
echo "setup rc=$? $(( $(date +%s) - t0 ))s" | tee -a $R/stages.txt
unset CUDA_DEVICE_MAX_CONNECTIONS
export WORLD_SIZE=1 RANK=0 LOCAL_RANK=0
M="model.num_layers=2 model.hidden_size=256 model.num_attention_heads=4"
V=vanilla_gpt_pretrain_config
job() {  # name, then env/command words; records out, err, rc, seconds
  local n=$1; shift
  ( s=$(date +%s); timeout -k 5 100 env "$@" > $R/$n.out 2> $R/$n.err; echo "$?" > $R/$n.rc
    echo "$n rc=$(cat $R/$n.rc) $(( $(date +%s) - s ))s :: $*" >> $R/stages.txt ) &
}
E="python3 scripts/mfsdp.py enable --recipe"
E0="python3 /tmp/main_scripts/mfsdp.py enable --recipe"
job A      $E $V $M
job A0     $E0 $V $M
job B      $E $V $M train.check_weight_hash_across_dp_replicas_interval=100
job C      $E $V --strategy optim $M train.check_weight_hash_across_dp_replicas_interval=100
job D      CUDA_DEVICE_MAX_CONNECTIONS=1 $E $V $M
job F      $E $V
job E      HF_HUB_OFFLINE=1 $E llama3_8b_pretrain_config
job E0     HF_HUB_OFFLINE=1 $E0 llama3_8b_pretrain_config
job G      timeout 45 $E llama3_8b_pretrain_config   # no HF_HUB_OFFLINE: what a user offline meets
( s=$(date +%s); timeout -k 5 150 python3 tests/differential/gen_verdicts.py --out $R/differential > $R/verdicts.log 2>&1
  echo "verdicts rc=$? $(( $(date +%s) - s ))s" >> $R/stages.txt ) &
wait
for n in A A0; do
  if [ "$(cat $R/$n.rc)" = 3 ]; then MFSDP_DEBUG=1 timeout 60 $([ $n = A ] && echo $E || echo $E0) $V $M > $R/$n.debug 2>&1; fi
done
echo "total $(( $(date +%s) - t0 ))s" >> $R/stages.txt
cat $R/stages.txt
for n in A B C D F E E0 G; do echo "== $n rc=$(cat $R/$n.rc)"; tail -n 4 $R/$n.err | cut -c1-300; done
tar czf $OUT/live.tgz -C /root r
