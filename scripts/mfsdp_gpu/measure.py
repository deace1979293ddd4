"""CUDA memory per phase, this process's memory as the driver sees it, parameter and optimizer counts.

``Mem`` resets the allocator's peak between phases and keeps the overall peak across the resets;
the counts read the model chunks and the optimizer that Bridge's ``setup()`` returns.
"""

from __future__ import annotations

import os


class Mem:
    """Per-phase CUDA memory: allocated after, peak during (max_memory_allocated since the
    last reset), reserved; keeps the overall peak across the resets."""

    def __init__(self):
        import torch

        self.torch = torch
        self.overall_peak = 0
        self.overall_peak_reserved = 0

    def reset(self) -> None:
        t = self.torch
        self.overall_peak = max(self.overall_peak, t.cuda.max_memory_allocated())
        self.overall_peak_reserved = max(self.overall_peak_reserved, t.cuda.max_memory_reserved())
        t.cuda.reset_peak_memory_stats()

    def snap(self, reset: bool = True) -> dict:
        t = self.torch
        t.cuda.synchronize()
        peak = t.cuda.max_memory_allocated()
        rec = {
            "allocated_bytes": t.cuda.memory_allocated(),
            "peak_allocated_bytes": peak,
            "reserved_bytes": t.cuda.memory_reserved(),
            "peak_reserved_bytes": t.cuda.max_memory_reserved(),
        }
        if reset:
            self.reset()
        else:
            self.overall_peak = max(self.overall_peak, peak)
        return rec

    def overall(self) -> dict:
        t = self.torch
        self.overall_peak = max(self.overall_peak, t.cuda.max_memory_allocated())
        self.overall_peak_reserved = max(self.overall_peak_reserved, t.cuda.max_memory_reserved())
        free, total = t.cuda.mem_get_info()
        stats = t.cuda.memory_stats()
        return {
            # the caching allocator had to free cached blocks and retry (a sign of fragmentation
            # close to the limit), and how often an allocation failed outright
            "alloc_retries": stats.get("num_alloc_retries"),
            "ooms": stats.get("num_ooms"),
            "peak_allocated_bytes": self.overall_peak,
            "peak_reserved_bytes": self.overall_peak_reserved,
            "allocated_bytes": t.cuda.memory_allocated(),
            "reserved_bytes": t.cuda.memory_reserved(),
            "device_total_bytes": total,
            # device-wide: includes other processes sharing the GPU, the CUDA context and
            # NCCL's own buffers; only meaningful when this process ran alone
            "device_used_bytes": total - free,
            "process_used_bytes_nvml": nvml_process_used_bytes(),
        }


def nvml_process_used_bytes() -> int | None:
    """This process's GPU memory as the driver sees it (CUDA context, NCCL and cuBLAS
    buffers included), through NVML by ctypes; None when NVML is absent or the process
    id is not visible (inside a PID namespace)."""
    try:
        import ctypes

        lib = ctypes.CDLL("libnvidia-ml.so.1")

        class Info(ctypes.Structure):
            _fields_ = [
                ("pid", ctypes.c_uint),
                ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint),
            ]

        if lib.nvmlInit_v2() != 0:
            return None
        count = ctypes.c_uint()
        if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return None
        pid, total, found = os.getpid(), 0, False
        fn = (
            getattr(lib, "nvmlDeviceGetComputeRunningProcesses_v3", None) or lib.nvmlDeviceGetComputeRunningProcesses_v2
        )
        for i in range(count.value):
            handle = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                continue
            # room for 4x the entries announced: a driver whose process record is larger than
            # this layout still writes inside the buffer
            n = ctypes.c_uint(64)
            infos = (Info * 256)()
            if fn(handle, ctypes.byref(n), infos) != 0:
                continue
            for k in range(min(n.value, 64)):
                if infos[k].pid == pid:
                    found = True
                    total += infos[k].usedGpuMemory
        return total if found else None
    except Exception:
        return None


def count_params(model, tp: int = 1, ep: int = 1, etp: int | None = None, pp: int = 1) -> dict:
    """Numel of this rank's local parameters (DTensor shards counted locally), split by
    dense/expert (Megatron marks expert parameters ``allreduce=False``; names with
    ``.experts.`` as a fallback), plus trainable and global counts.

    ``global_numel`` is this rank's model-parallel partition (DTensor shards counted whole: what
    data parallelism replicates or shards). ``model_total_numel`` is the model's: a tensor-parallel
    weight (megatron-core sets ``tensor_model_parallel`` on it) counts ``tp`` times, an expert weight
    ``ep x etp`` times (each expert-parallel rank holds other experts; ``etp``, the expert
    tensor-parallel size, defaults to ``tp`` as in megatron-core). With pipeline parallelism this rank
    holds one stage, and the total covers that stage (``model_total_scope`` says so)."""
    etp = tp if etp is None else etp
    total = 0
    local = dense = expert = trainable = global_n = 0
    by_dtype: dict[str, int] = {}
    seen = set()
    for chunk in model:
        for name, p in chunk.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            n_local = p.to_local().numel() if hasattr(p, "to_local") else p.numel()
            local += n_local
            global_n += p.numel()
            is_expert = getattr(p, "allreduce", True) is False or ".experts." in name
            if is_expert:
                total += p.numel() * ep * etp
            else:
                total += p.numel() * (tp if getattr(p, "tensor_model_parallel", False) else 1)
            if is_expert:
                expert += n_local
            else:
                dense += n_local
            if p.requires_grad:
                trainable += n_local
            key = str(p.dtype).replace("torch.", "")
            by_dtype[key] = by_dtype.get(key, 0) + n_local
    return {
        "model_total_numel": total,
        "model_total_scope": "the whole model"
        if pp <= 1
        else "this pipeline stage's layers (the other stages are not built here)",
        "local_numel": local,
        "local_dense_numel": dense,
        "local_expert_numel": expert,
        "local_trainable_numel": trainable,
        "global_numel": global_n,
        "local_numel_by_dtype": by_dtype,
    }


def count_optimizer(optimizer) -> dict:
    """Numel and bytes of the optimizer state (Adam moments...) and of the parameters the
    inner torch optimizers update (fp32 main copies under mixed precision)."""
    state_numel = state_bytes = main_numel = main_bytes = 0
    inner_types = []
    stack = [optimizer]
    seen = set()
    while stack:
        opt = stack.pop()
        if id(opt) in seen or opt is None:
            continue
        seen.add(id(opt))
        children = getattr(opt, "chained_optimizers", None)
        if children:
            # megatron-core's ChainedOptimizer (dense + expert optimizers under MoE): its
            # ``optimizer`` property asserts there is exactly one child, so never touch it;
            # count each child instead.
            stack.extend(children)
            continue
        try:
            inner = getattr(opt, "optimizer", None)
        except AssertionError:  # any other wrapper whose property guards a single child
            continue
        if inner is None or not hasattr(inner, "state"):
            continue
        inner_types.append(type(inner).__name__)
        for st in inner.state.values():
            for v in st.values() if isinstance(st, dict) else []:
                if hasattr(v, "numel") and getattr(v, "dim", lambda: 0)() > 0:
                    state_numel += v.numel()
                    state_bytes += v.numel() * v.element_size()
        for group in inner.param_groups:
            for p in group["params"]:
                t = p.to_local() if hasattr(p, "to_local") else p
                main_numel += t.numel()
                main_bytes += t.numel() * t.element_size()
    return {
        "state_numel": state_numel,
        "state_bytes": state_bytes,
        "updated_param_numel": main_numel,
        "updated_param_bytes": main_bytes,
        "inner_optimizers": inner_types,
    }


def global_param_count(model) -> int | None:
    """Parameters of the model (global count: FSDP's DTensor parameters report their full shape)."""
    try:
        seen, total = set(), 0
        for chunk in model:
            for p in chunk.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
        return total
    except Exception:
        return None
