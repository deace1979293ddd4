"""Kernel time by kind for ``rehearse --perf --profile`` (``mfsdp_gpu.kernel_profile``): pure Python parts."""

from __future__ import annotations

import pytest

from mfsdp_gpu import kernel_profile as kp

# Kernel names as CUPTI reports them for the libraries the rehearsal runs (cuBLAS/CUTLASS, cuDNN flash
# attention, Transformer Engine, megatron-core's MoE permutation, PyTorch, NCCL).
NAMES = {
    "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1": "gemm",
    "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN": "gemm",
    "cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16": "gemm",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3": "attention",
    "void transformer_engine::detail::cast_transpose_kernel<float, __nv_fp8_e4m3>": "fp8_cast",
    "void moe_permute_row_map(int const*, int*, int, int, int)": "moe_permute",
    "void at::native::(anonymous namespace)::sort_kernel": "moe_permute",
    "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "nccl",
    "Memcpy DtoD (Device -> Device)": "memcpy",
    "Memset (Device)": "memset",
    "void at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)": "copy",
    "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>": "optimizer",
    "void transformer_engine::rmsnorm_fwd_tuned_kernel<float>": "norm",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>": "elementwise",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>": "reduce",
    "void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>>": "add",
    # PyTorch's implementation word "nocast" is not a cast: the functor decides
    "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::silu_kernel>>": (
        "elementwise"
    ),
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>": (
        "copy"
    ),
    "void at::native::indexFuncLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>": "moe_permute",
    "some_kernel_nobody_named": "other",
}


@pytest.mark.parametrize(("name", "kind"), sorted(NAMES.items()))
def test_kernel_kinds_from_names(name, kind):
    assert kp.kind_of(name) == kind


def test_summary_is_per_step_by_kind_with_the_longest_kernels():
    kernels = kp.group_by_name(
        [
            ("nvjet_hsh_256x128", 3000.0),
            ("nvjet_hsh_256x128", 1000.0),
            ("Memcpy DtoD (Device -> Device)", 500.0),
            ("void at::native::direct_copy_kernel_cuda(x)", 1500.0),
            ("idle", 0.0),
        ]
    )
    s = kp.summarise(kernels, steps=2)
    assert s["steps"] == 2
    assert s["device_ms_per_step"] == pytest.approx(3.0)  # 6000 us over 2 steps
    assert s["by_kind_ms_per_step"] == {"gemm": 2.0, "copy": 0.75, "memcpy": 0.25}
    assert list(s["by_kind_ms_per_step"]) == ["gemm", "copy", "memcpy"]  # longest first
    assert s["calls_by_kind_per_step"]["gemm"] == 1.0  # 2 calls over 2 steps
    assert [k["name"] for k in s["top_kernels"]] == [
        "nvjet_hsh_256x128",
        "void at::native::direct_copy_kernel_cuda(x)",
        "Memcpy DtoD (Device -> Device)",
    ]  # a kernel with no time is left out
    assert len(kp.summarise(kp.group_by_name([(f"k{i}", 1.0) for i in range(100)]), 1)["top_kernels"]) == kp.TOP_KERNELS


def test_difference_is_a_minus_b_largest_first():
    a = {"by_kind_ms_per_step": {"gemm": 300.0, "copy": 120.0}}
    b = {"by_kind_ms_per_step": {"gemm": 290.0, "moe_permute": 5.0}}
    assert kp.difference(a, b) == {"copy": 120.0, "gemm": 10.0, "moe_permute": -5.0}


def test_the_profiler_summary_is_none_when_no_step_was_profiled():
    assert kp.StepProfiler().summary() is None  # no torch needed: it never started
