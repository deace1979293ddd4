"""What a training run leaves behind: logs, checkpoints, and the GPU smoke test that makes both."""
