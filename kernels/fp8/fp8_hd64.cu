// Explicit instantiations of the FP8 attention kernel and the Vᵀ pre-pass for head dim 64
// (list: fp8_params.h).
#include "fp8_launch.cuh"

namespace attn::kernels::fp8 {
ATTN_FP8_VARIANTS_HD64(ATTN_FP8_INSTANTIATE)
template cudaError_t Fp8TransposeV<64>(const Fp8Params&, cudaStream_t);
}  // namespace attn::kernels::fp8
