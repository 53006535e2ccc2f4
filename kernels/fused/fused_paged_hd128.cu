// Explicit instantiations of the fused kernel with paged K/V for head dim 128 (list:
// ATTN_FUSED_PAGED_VARIANTS_HD128 in fused_params.h).
#include "fused_kernel.cuh"

namespace attn::kernels::fused {
ATTN_FUSED_PAGED_VARIANTS_HD128(ATTN_FUSED_PAGED_INSTANTIATE)
}  // namespace attn::kernels::fused
