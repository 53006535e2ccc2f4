// Explicit instantiations of the decode kernel for head dim 64 (list: decode_params.h), and the
// merge kernel (one per output dtype).
#include "decode_kernel.cuh"

namespace attn::kernels::decode {
ATTN_DECODE_VARIANTS_HD64(ATTN_DECODE_INSTANTIATE)
template cudaError_t MergeLaunch<ATTN_DECODE_DT_F16>(const MergeParams&, cudaStream_t);
template cudaError_t MergeLaunch<ATTN_DECODE_DT_BF16>(const MergeParams&, cudaStream_t);
}  // namespace attn::kernels::decode
