// Explicit instantiations of the fused kernel for head dim 64 (list: fused_params.h).
#include "fused_kernel.cuh"

namespace attn::kernels::fused {
ATTN_FUSED_VARIANTS_HD64(ATTN_FUSED_INSTANTIATE)
}  // namespace attn::kernels::fused
