// Explicit instantiations of the decode kernel for head dim 64 (list: decode_params.h).
#include "decode_kernel.cuh"

namespace attn::kernels::decode {
ATTN_DECODE_VARIANTS_HD64(ATTN_DECODE_INSTANTIATE)
}  // namespace attn::kernels::decode
