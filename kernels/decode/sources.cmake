# decode family (DESIGN.md §5, §7): the paged KV append kernel (owner of the page format) and
# split-KV decode attention over paged or contiguous K/V. CUDA builds only. One .cu per head
# dim instantiates the (dtype, kv dtype) pairs (list: decode_params.h); paged_append.cu holds the
# append kernel and its host entry point; paged_decode.cc the decode plan/run API.
if(ATTN_CUDA)
  list(APPEND ATTN_KERNEL_CUDA_SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/decode_hd64.cu
    ${CMAKE_CURRENT_LIST_DIR}/decode_hd128.cu
    ${CMAKE_CURRENT_LIST_DIR}/paged_append.cu)
  list(APPEND ATTN_KERNEL_CUDA_HOST_SOURCES ${CMAKE_CURRENT_LIST_DIR}/paged_decode.cc)
endif()
