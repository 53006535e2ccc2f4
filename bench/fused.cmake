# Kernel benchmark (included from bench/CMakeLists.txt when ATTN_CUDA is on): times the fused
# family (every tile variant) and, when built, the naive family; correctness is checked first.
# scripts/fused_bench.sh builds it and runs it next to PyTorch's SDPA backends
# (bench/attention_bench.py).
add_executable(attn_kernel_bench ${CMAKE_CURRENT_LIST_DIR}/attn_kernel_bench.cu)
target_link_libraries(attn_kernel_bench PRIVATE attn_kernels CUDA::cudart_static)
if(TARGET CUDA::cublas)
  target_link_libraries(attn_kernel_bench PRIVATE CUDA::cublas)
endif()
target_compile_options(attn_kernel_bench PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
