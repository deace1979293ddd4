"""The real-wheel fixtures deliver Bridge's and Megatron-Core's sources."""


def test_bridge_src_has_config(bridge_src):
    cfg = bridge_src / "megatron" / "bridge" / "training" / "config.py"
    assert cfg.is_file()
    assert "class ConfigContainer" in cfg.read_text()


def test_mcore_src_has_ddp_config(mcore_src):
    ddp = mcore_src / "megatron" / "core" / "distributed" / "distributed_data_parallel_config.py"
    assert ddp.is_file()
    assert "data_parallel_sharding_strategy" in ddp.read_text()
