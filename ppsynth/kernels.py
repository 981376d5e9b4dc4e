"""The CUDA kernels and autograd ops a synthetic Megatron-style rank records (real names, so the
parsers' name grammar meets what a real H100 trace holds): per phase, ``(cpu op, kernel)`` pairs in
launch order, and the NCCL kernels of the p2p and the step-end all-reduces."""

from __future__ import annotations

FWD_KERNELS: tuple[tuple[str, str], ...] = (
    (
        "aten::native_layer_norm",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
        "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, "
        "c10::BFloat16*)",
    ),
    ("aten::mm", "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNT"),
    (
        "aten::_flash_attention_forward",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
        "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, "
        "false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)",
    ),
    ("aten::mm", "nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_NNT"),
    (
        "aten::gelu",
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl("
        "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
        "operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, "
        "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::"
        "operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, "
        "std::array<char*, 2ul>)",
    ),
    (
        "aten::add",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",
    ),
)
BWD_KERNELS: tuple[tuple[str, str], ...] = (
    ("MmBackward0", "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN"),
    (
        "GeluBackward0",
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluBackwardCUDAKernelImpl("
        "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
        "operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, std::array<char*, 3ul> >(int, "
        "at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::"
        "operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}, "
        "std::array<char*, 3ul>)",
    ),
    (
        "ScaledDotProductFlashAttentionBackward0",
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, "
        "8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, "
        "cutlass::bfloat16_t> >, false, false, false, false, false, false, false, false>("
        "pytorch_flash::Flash_bwd_params)",
    ),
    ("MmBackward0", "nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_NTN"),
    (
        "NativeLayerNormBackward0",
        "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, float>"
        "(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, "
        "c10::BFloat16*, int)",
    ),
    (
        "AddBackward0",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",
    ),
)
WGRAD_KERNELS: tuple[tuple[str, str], ...] = (
    ("MmBackward0", "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_TNT"),
    ("MmBackward0", "nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNT"),
    (
        "SumBackward1",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<c10::BFloat16, float, float>::operator()(at::TensorIterator&)::{lambda(float, "
        "float)#1}>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
        "at::native::sum_functor<c10::BFloat16, float, float>::operator()(at::TensorIterator&)::{lambda(float, "
        "float)#1}>, unsigned int, float, 4, 4>)",
    ),
)
OPTIM_KERNELS: tuple[tuple[str, str], ...] = (
    (
        "aten::_foreach_mul_",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "TensorListMetadata<1>, at::native::(anonymous namespace)::BinaryOpScalarFunctor<float, 1, 1, 0>, "
        "std::multiplies<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<1>, "
        "at::native::(anonymous namespace)::BinaryOpScalarFunctor<float, 1, 1, 0>, std::multiplies<float>, "
        "float)",
    ),
    (
        "aten::_fused_adamw_",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
        "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
        "(at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, float const*, "
        "float const*>(at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, at::native::"
        "(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, "
        "double, double, double, double, double, bool, float const*, float const*)",
    ),
)
AUTOGRAD_ATEN = {
    "MmBackward0": "aten::mm",
    "GeluBackward0": "aten::gelu_backward",
    "ScaledDotProductFlashAttentionBackward0": "aten::_scaled_dot_product_flash_attention_backward",
    "NativeLayerNormBackward0": "aten::native_layer_norm_backward",
    "AddBackward0": "aten::add_",
    "SumBackward1": "aten::sum",
}
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
ALLREDUCE_BF16 = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ALLREDUCE_F32 = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
