# Architecture probe and device limits (DESIGN.md §10). CUDA builds only.
list(APPEND ATTN_KERNEL_CUDA_SOURCES ${CMAKE_CURRENT_LIST_DIR}/arch_probe.cu)
list(APPEND ATTN_KERNEL_CUDA_HOST_SOURCES ${CMAKE_CURRENT_LIST_DIR}/device_limits.cc)
