# naive family (DESIGN.md §5): cuBLAS GEMM + mask/softmax kernel + cuBLAS GEMM. CUDA builds only.
list(APPEND ATTN_KERNEL_CUDA_SOURCES ${CMAKE_CURRENT_LIST_DIR}/naive_softmax.cu
  ${CMAKE_CURRENT_LIST_DIR}/naive_masked_values.cu)
list(APPEND ATTN_KERNEL_CUDA_HOST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/naive_plan.cc
  ${CMAKE_CURRENT_LIST_DIR}/naive_run.cc)
