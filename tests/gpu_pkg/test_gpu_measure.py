"""Counting what a rank holds (``mfsdp_gpu.measure``): the optimizer state of chained optimizers."""

from __future__ import annotations

from mfsdp_gpu import measure


class _Param:
    def __init__(self, n):
        self.n = n

    def numel(self):
        return self.n

    def element_size(self):
        return 4

    def dim(self):
        return 1


class _Inner:
    def __init__(self, n):
        self.state = {0: {"exp_avg": _Param(n), "exp_avg_sq": _Param(n), "step": 3}}
        self.param_groups = [{"params": [_Param(n)]}]


class _Wrapped:
    def __init__(self, n):
        self.optimizer = _Inner(n)


class _Chained:
    """Like megatron-core's ChainedOptimizer: ``optimizer`` asserts a single child."""

    def __init__(self, *children):
        self.chained_optimizers = list(children)

    @property
    def optimizer(self):
        assert len(self.chained_optimizers) == 1, "ChainedOptimizer has more than one optimizer"
        return self.chained_optimizers[0].optimizer


def test_count_optimizer_walks_every_child_of_a_chained_optimizer():
    # MoE with the distributed optimizer: one optimizer for dense and one for expert parameters.
    got = measure.count_optimizer(_Chained(_Wrapped(10), _Wrapped(5)))
    assert got["state_numel"] == 2 * 10 + 2 * 5  # two moments each; the scalar step is not state memory
    assert got["updated_param_numel"] == 15
    assert got["updated_param_bytes"] == 60
    assert got["inner_optimizers"] == ["_Inner", "_Inner"]
