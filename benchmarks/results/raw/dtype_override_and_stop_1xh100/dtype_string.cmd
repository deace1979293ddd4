python3 /work/main/scripts/mfsdp.py rehearse --model-preset tiny --world-size 2 --strategy optim_grads_params ddp.megatron_fsdp_main_grads_dtype=fp32
