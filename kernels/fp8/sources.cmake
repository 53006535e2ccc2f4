# fp8 family (DESIGN.md §5): per-tensor E4M3 quantisation and our own FP8 attention kernel for
# sm_89+ (mma.sync m16n8k32 e4m3, fp32 accumulation). CUDA builds only. One .cu per head dim
# instantiates that head dim's tile variants and the Vᵀ pre-pass (the explicit list lives in
# fp8_params.h; the kernel fp8_kernel.cuh, its PTX wrappers fp8_mma.cuh, its launch wrappers
# fp8_launch.cuh); the host API is fp8_attention.cc. fp8_prepass.cu is the accuracy pre-pass
# (statistics over valid positions, K smoothing, Hadamard rotation, quantisation) of both FP8
# paths (kernels: fp8_prepass_kernels.cuh; row transform: fp8_prepass_device.cuh), and
# fp8_prepass_reference.cc its bit-exact host twin. int8_prepass.cu is the per-token
# INT8 pre-pass of the kernel's INT8 Q·Kᵀ path (int8_prepass_reference.cc its host twin);
# int8_hd<H>.cu instantiate the INT8 Q·Kᵀ variants of the same kernel, int8_attention.cc is
# their host API.
list(APPEND ATTN_KERNEL_CUDA_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/fp8_quantize.cu
  ${CMAKE_CURRENT_LIST_DIR}/fp8_prepass.cu
  ${CMAKE_CURRENT_LIST_DIR}/fp8_hd64.cu
  ${CMAKE_CURRENT_LIST_DIR}/fp8_hd128.cu
  ${CMAKE_CURRENT_LIST_DIR}/int8_prepass.cu
  ${CMAKE_CURRENT_LIST_DIR}/int8_hd64.cu
  ${CMAKE_CURRENT_LIST_DIR}/int8_hd128.cu)
list(APPEND ATTN_KERNEL_CUDA_HOST_SOURCES ${CMAKE_CURRENT_LIST_DIR}/fp8_attention.cc
  ${CMAKE_CURRENT_LIST_DIR}/fp8_prepass_reference.cc
  ${CMAKE_CURRENT_LIST_DIR}/int8_prepass_reference.cc
  ${CMAKE_CURRENT_LIST_DIR}/int8_attention.cc)
