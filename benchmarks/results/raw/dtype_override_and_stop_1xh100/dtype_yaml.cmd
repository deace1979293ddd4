python3 /work/main/scripts/mfsdp.py rehearse /root/raw/dtype_and_stop/dtype_yaml.yaml --world-size 2 --strategy optim_grads_params
