// Explicit instantiations of the 8-bit kernel's INT8 Q·Kᵀ variants for head dim 128 (list:
// fp8_params.h; E4M3 P·V and the bf16/fp16 P·V kernels).
#include "fp8_launch.cuh"

namespace attn::kernels::fp8 {
ATTN_INT8_VARIANTS_HD128(ATTN_INT8_INSTANTIATE)
}  // namespace attn::kernels::fp8
