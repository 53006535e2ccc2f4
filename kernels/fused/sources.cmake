# fused family (DESIGN.md §5): FlashAttention-2-style kernel on mma.sync tensor cores.
# CUDA builds only. One .cu per head dim instantiates that head dim's tile variants for fp16 and
# bf16 (the explicit list lives in fused_params.h); the host API is fused_attention.cc.
foreach(_attn_fused_hd 32 64 80 96 128 256)
  list(APPEND ATTN_KERNEL_CUDA_SOURCES ${CMAKE_CURRENT_LIST_DIR}/fused_hd${_attn_fused_hd}.cu)
endforeach()
# Paged K/V (prefill over the paged KV cache): one tile per head dim, 64 and 128 only.
foreach(_attn_fused_hd 64 128)
  list(APPEND ATTN_KERNEL_CUDA_SOURCES ${CMAKE_CURRENT_LIST_DIR}/fused_paged_hd${_attn_fused_hd}.cu)
endforeach()
list(APPEND ATTN_KERNEL_CUDA_HOST_SOURCES ${CMAKE_CURRENT_LIST_DIR}/fused_attention.cc)
