"""``rehearse --perf``'s GPU-side parts that run without a GPU: the collective recorder's counting,
the offline Hugging Face configs, the GPU lock.

torch cannot be installed on the CPU test machines, so the recorder's wrappers are exercised with
stand-ins for tensors (objects with ``numel()`` and ``element_size()``: what the recorder reads) and
a group table filled in advance (what ``get_process_group_ranks`` answers on a GPU). The wrappers
installed into torch.distributed run in ``tests/gpu/test_rehearse_perf_gpu.py``.
"""

from __future__ import annotations

import json
import os

import pytest

from mfsdp_gpu import collectives as co
from mfsdp_gpu import hfhub, perf
from mfsdp_lib.perf import collectives as analysis


class T:
    """STAND-IN for a tensor: the two methods the recorder calls."""

    def __init__(self, numel: int, element_size: int = 2):
        self._n, self._e = numel, element_size

    def numel(self):
        return self._n

    def element_size(self):
        return self._e


DP = object()  # stand-ins for process-group objects
TP = object()


def _recorder() -> co.CollectiveRecorder:
    rec = co.CollectiveRecorder()
    rec.groups[id(DP)] = ("g0", (0, 1, 2, 3), DP)
    rec.groups[id(TP)] = ("g1", (0, 1), TP)
    rec.active, rec.step, rec.region, rec.sched = True, 3, "fwd_bwd", "forward"
    return rec


def _wrap(rec, name, orig=None):
    spec, pos = co.RECORD_SPECS[name]
    return rec._wrapper(name, orig or (lambda *a, **k: "work"), spec, pos)


def test_sizes_follow_nccl_tests_message_sizes():
    rec = _recorder()
    ag = _wrap(rec, "all_gather_into_tensor")
    rs = _wrap(rec, "reduce_scatter_tensor")
    ar = _wrap(rec, "all_reduce")
    al = _wrap(rec, "all_gather")
    assert ag(T(400), T(100), group=DP, async_op=True) == "work"  # the original's result, unchanged
    rec.sched = "backward"
    rs(T(25, 4), T(100, 4), None, DP)  # positional group (op, group)
    ar(T(10, 4), group=TP)
    al([T(100), T(100), T(100), T(100)], T(100), DP)
    log = rec.log(0, 4, [3], {"dp": [0, 1, 2, 3], "tp": [0, 1]})
    ev = {(e["op"], e["phase"]): e for e in log["events"]}
    assert ev[("all_gather_into_tensor", "forward")]["size_bytes"] == 800  # the output: N x the input
    assert ev[("reduce_scatter_tensor", "backward")]["size_bytes"] == 400  # the input: N x the output
    assert ev[("all_reduce", "backward")]["size_bytes"] == 40
    assert ev[("all_gather", "backward")]["size_bytes"] == 800
    agg = analysis.aggregate(log)  # the CPU side reads what the GPU side writes
    assert agg["bytes_per_step"]["all_gather"]["dp"] == round(1600 * 3 / 4)
    assert agg["bytes_per_step"]["all_reduce"]["tp"] == 40


def test_only_the_outermost_call_counts_and_nothing_while_inactive():
    rec = _recorder()
    inner = _wrap(rec, "all_gather_into_tensor")
    outer = _wrap(rec, "_all_gather_base", orig=lambda out, inp, group=None, async_op=False: inner(out, inp, group))
    outer(T(400), T(100), DP)
    assert rec.calls == 1 and [k[1] for k in rec.counts] == ["_all_gather_base"]
    rec.active = False
    inner(T(400), T(100), DP)
    assert rec.calls == 1


def test_same_calls_are_one_row_with_a_count_and_phases_follow_the_meter():
    rec = _recorder()
    ag = _wrap(rec, "all_gather_into_tensor")
    for _ in range(32):
        ag(T(400), T(100), group=DP)
    rec.region = "optimizer"
    ag(T(400), T(100), group=DP)
    rec.region = "other"
    ag(T(400), T(100), group=DP)
    rows = rec.log(0, 4, [3], {})["events"]
    assert sorted((r["phase"], r["count"]) for r in rows) == [("forward", 32), ("optimizer", 1), ("other", 1)]


def test_a_call_it_cannot_read_is_an_error_entry_never_a_failure():
    rec = _recorder()
    ag = _wrap(rec, "all_gather_into_tensor")
    assert ag("not a tensor", T(1), group=DP) == "work"
    assert rec.calls == 0 and rec.errors and "all_gather_into_tensor" in rec.errors[0]


def test_batched_point_to_point_operations_are_counted_one_by_one():
    rec = _recorder()

    class Op:  # STAND-IN for torch.distributed.P2POp
        def __init__(self, fn, n):
            self.op, self.tensor, self.group = fn, T(n), TP

    def isend():
        pass

    def irecv():
        pass

    batch = rec._batch_wrapper(lambda ops: ["w"] * len(ops))
    assert batch([Op(isend, 10), Op(irecv, 10), Op(irecv, 10)]) == ["w", "w", "w"]
    ops = {(k[1], n) for k, n in rec.counts.items()}
    assert ops == {("isend", 1), ("irecv", 2)}


def test_every_recorded_function_has_a_kind_the_analysis_knows():
    assert set(co.RECORD_SPECS) <= set(analysis.OP_KIND)


def test_hf_configs_are_laid_out_as_an_offline_hub_cache(tmp_path, monkeypatch):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096}))
    state = hfhub.prepare([f"meta-llama/Meta-Llama-3-8B={cfg}"], str(tmp_path / "run"))
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["HF_HUB_CACHE"] == state["cache"]
    folder = tmp_path / "run" / "hf_hub" / "models--meta-llama--Meta-Llama-3-8B"
    rev = (folder / "refs" / "main").read_text()
    assert (
        len(rev) == 40 and json.loads((folder / "snapshots" / rev / "config.json").read_text())["hidden_size"] == 4096
    )
    hfhub.check("meta-llama/Meta-Llama-3-8B", state)  # given: goes through


def test_a_config_without_an_id_serves_the_id_the_recipe_asks_for(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "llama"}')
    state = hfhub.prepare([str(tmp_path)], str(tmp_path / "run"))
    hfhub.check("meta-llama/Meta-Llama-3-70B", state)
    assert (tmp_path / "run" / "hf_hub" / "models--meta-llama--Meta-Llama-3-70B" / "refs" / "main").is_file()


def test_a_missing_config_is_named_at_once_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hfhub, "cached", lambda model_id: False)
    monkeypatch.setattr(hfhub, "hub_reachable", lambda *a, **k: pytest.fail("offline: the hub is never tried"))
    with pytest.raises(hfhub.MissingConfig) as exc:
        hfhub.check("meta-llama/Meta-Llama-3-8B", {"ids": {}})
    msg = str(exc.value)
    assert "meta-llama/Meta-Llama-3-8B" in msg and "--hf-config meta-llama/Meta-Llama-3-8B=PATH" in msg
    assert "\n" not in msg


def test_a_missing_config_is_named_when_the_hub_cannot_be_reached(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hfhub, "cached", lambda model_id: False)
    monkeypatch.setattr(hfhub, "hub_reachable", lambda *a, **k: False)
    with pytest.raises(hfhub.MissingConfig, match="cannot be reached"):
        hfhub.check("org/model", {"ids": {}})
    monkeypatch.setattr(hfhub, "hub_reachable", lambda *a, **k: True)
    hfhub.check("org/model", {"ids": {}})  # reachable: the recipe downloads it as usual


def test_gpu_lock_is_taken_once_and_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(perf, "_LOCK", [])
    monkeypatch.delenv(perf.GPU_LOCK_ENV, raising=False)
    assert perf.gpu_lock() is None
    monkeypatch.setenv(perf.GPU_LOCK_ENV, str(tmp_path / "gpu.lock"))
    said = []
    free = lambda: (70 * 2**30, 80 * 2**30)  # noqa: E731  10 GiB held by others, then the next call frees it
    calls = iter([(60 * 2**30, 80 * 2**30), (79 * 2**30, 80 * 2**30)])
    assert perf.gpu_lock(said.append, mem_info=lambda: next(calls)) == str(tmp_path / "gpu.lock")
    assert perf.LOCK_STATE["others_held_bytes"] == 2**30  # waited until the previous holder's 20 GiB came back
    assert said[-1].startswith("20.0 GiB of the GPU still held by others")
    assert perf.gpu_lock(said.append, mem_info=free) == str(tmp_path / "gpu.lock") and len(said) == 3  # held
    import fcntl

    other = os.open(tmp_path / "gpu.lock", os.O_RDWR)
    with pytest.raises(BlockingIOError):  # another process (descriptor) cannot take it meanwhile
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(other)
    os.close(perf._LOCK[0])


def test_waiting_for_gpu_memory_stops_at_the_margin_or_the_timeout():
    t = [0.0]

    def sleep(s):
        t[0] += s

    busy = lambda: (10 * 2**30, 80 * 2**30)  # noqa: E731  70 GiB held by others for ever
    waited, others = perf.wait_for_gpu_memory(busy, timeout_s=5.0, sleep=sleep, clock=lambda: t[0])
    assert waited == 5.0 and others == 70 * 2**30  # gave up after the timeout, and says what was held
    t[0] = 0.0
    quiet = lambda: (79 * 2**30, 80 * 2**30)  # noqa: E731
    assert perf.wait_for_gpu_memory(quiet, sleep=sleep, clock=lambda: t[0]) == (0.0, 2**30)

    def no_cuda():
        raise RuntimeError("no CUDA")

    assert perf.wait_for_gpu_memory(no_cuda) == (0.0, None)


def test_free_margin_comes_from_the_environment_for_shared_slots(monkeypatch):
    monkeypatch.delenv(perf.GPU_FREE_MARGIN_ENV, raising=False)
    assert perf.free_margin() == perf.GPU_FREE_MARGIN_BYTES
    monkeypatch.setenv(perf.GPU_FREE_MARGIN_ENV, "inf")
    assert perf.free_margin() == float("inf")
    # a shared slot never waits: the others' memory is alive
    full = lambda: (0, 140 * 2**30)  # noqa: E731
    assert perf.wait_for_gpu_memory(full, margin=perf.free_margin(), clock=lambda: 0.0) == (0.0, 140 * 2**30)
    monkeypatch.setenv(perf.GPU_FREE_MARGIN_ENV, "2")
    assert perf.free_margin() == 2 * 2**30
    for bad in ("lots", "-1", "nan"):
        monkeypatch.setenv(perf.GPU_FREE_MARGIN_ENV, bad)
        assert perf.free_margin() == perf.GPU_FREE_MARGIN_BYTES, bad


def test_gradient_finalisation_after_the_last_backward_counts_as_backward():
    rec = _recorder()
    rec.sched, rec.last_sched = None, "backward"  # finalize_model_grads runs between the schedule functions
    assert rec.phase() == "backward"
    rec.region = "optimizer"
    assert rec.phase() == "optimizer"
    rec.region = "other"
    assert rec.phase() == "other"


def test_timed_numerics_counts_nan_and_inf_among_the_timed_steps_only():
    steps = [
        {"iteration": 1, "loss": float("nan"), "grad_norm": 1.0},  # warm-up: not timed, not counted
        {"iteration": 2, "loss": 10.0, "grad_norm": 1.0},
        {"iteration": 3, "loss": float("nan"), "grad_norm": 1.0},
        {"iteration": 4, "loss": 9.9, "grad_norm": float("inf")},
        {"iteration": 5, "loss": None, "grad_norm": None},  # a pipeline stage without the loss: unknown
    ]
    got = perf.timed_numerics(steps, [2, 3, 4, 5])
    assert got["nonfinite_timed_steps"] == 2 and got["nonfinite_steps"] == [3, 4]
    assert got["timed_losses"][0] == 10.0 and got["timed_losses"][3] is None


def test_flops_of_k_micro_batches_scale_to_the_step():
    assert perf.scaled_flops(1e15, {"micro_batches_run": 4, "micro_batches_full": 32}) == pytest.approx(8e15)
    assert perf.scaled_flops(1e15, None) == 1e15
    assert perf.scaled_flops(None, {"micro_batches_run": 4, "micro_batches_full": 32}) is None


class P:
    """STAND-IN for a parameter: what count_params reads."""

    def __init__(self, n, tp=False, expert=False):
        self._n, self.tensor_model_parallel, self.requires_grad = n, tp, True
        self.dtype = "torch.bfloat16"
        if expert:
            self.allreduce = False

    def numel(self):
        return self._n


class Chunk:
    def __init__(self, named):
        self._named = named

    def named_parameters(self):
        return iter(self._named)


def test_params_is_the_model_total_and_the_partition_goes_beside_it():
    from mfsdp_gpu import measure

    model = [
        Chunk(
            [
                ("embedding.word_embeddings.weight", P(1000, tp=True)),
                ("decoder.layers.0.input_layernorm.weight", P(10)),
                ("decoder.layers.0.mlp.experts.linear_fc1.weight0", P(400, tp=True, expert=True)),
            ]
        )
    ]
    got = measure.count_params(model, tp=2, ep=8, etp=1)
    assert got["global_numel"] == 1410  # this rank's model-parallel partition
    assert got["model_total_numel"] == 1000 * 2 + 10 + 400 * 8 * 1  # TP x2, experts over EP 8 (ETP 1)
    assert got["model_total_scope"] == "the whole model"
    assert measure.count_params(model, tp=2, ep=8, pp=4)["model_total_scope"].startswith("this pipeline stage")


def test_a_revision_pinned_by_the_recipe_is_served_from_the_same_config(tmp_path, monkeypatch):
    # Bridge's Qwen3 MoE recipes call AutoBridge.from_hf_pretrained(id, revision=<commit>): huggingface_hub
    # then reads snapshots/<commit>/config.json (a branch or tag name: refs/<name>), not refs/main
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "qwen3_moe", "num_experts": 128}))
    model = "Qwen/Qwen3-30B-A3B"
    state = hfhub.prepare([f"{model}={cfg}"], str(tmp_path / "run"))
    folder = tmp_path / "run" / "hf_hub" / "models--Qwen--Qwen3-30B-A3B"
    commit = "ad44e777bcd18fa416d9da3bd8f70d33ebb85d39"
    got = hfhub.pin_revision(model, commit, state)
    assert got == str(folder / "snapshots" / commit / "config.json")
    assert json.loads((folder / "snapshots" / commit / "config.json").read_text())["num_experts"] == 128
    tag = hfhub.pin_revision(model, "v1.0", state)
    rev = (folder / "refs" / "v1.0").read_text()
    assert tag == str(folder / "snapshots" / rev / "config.json")
    assert hfhub.pin_revision(model, None, state) is None
    assert hfhub.pin_revision("other/model", commit, state) is None  # no config given for it


def test_a_plus_inf_loss_under_tensor_parallelism_with_a_finite_gradient_counts():
    # TE's vocabulary-parallel cross-entropy under the mirror: +inf reported, the gradient finite
    steps = [
        {"iteration": 2, "loss": float("inf"), "grad_norm": 56.1},
        {"iteration": 3, "loss": float("inf"), "grad_norm": float("nan")},  # the gradient too: non-finite
        {"iteration": 4, "loss": float("nan"), "grad_norm": 1.0},  # NaN is never the reduction's: non-finite
        {"iteration": 5, "loss": float("inf"), "grad_norm": None},  # no gradient norm to vouch for it
    ]
    got = perf.timed_numerics(steps, [2, 3, 4, 5], tp=4)
    assert got["loss_inf_tp_steps"] == [2] and got["nonfinite_steps"] == [3, 4, 5]
    plain = perf.timed_numerics(steps, [2, 3, 4, 5])  # without tensor parallelism nothing is exempt
    assert plain["loss_inf_tp_steps"] == [] and plain["nonfinite_steps"] == [2, 3, 4, 5]
