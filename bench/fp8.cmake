# FP8 kernel benchmark (included from bench/CMakeLists.txt when ATTN_CUDA is on): our FP8 kernel
# (every variant, with and without the quantisation of bf16 inputs) against our bf16 fused
# kernel on the same shapes; correctness is checked first. scripts/fp8_bench.sh builds and runs
# it (default build, or the L4 build with ARCHS=89 EMULATE_L4=ON).
add_executable(attn_fp8_bench ${CMAKE_CURRENT_LIST_DIR}/fp8_bench.cu)
target_link_libraries(attn_fp8_bench PRIVATE attn_kernels CUDA::cudart_static)
target_compile_options(attn_fp8_bench PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)

# INT8 Q·Kᵀ benchmark (issue 20): both P·V variants of the 8-bit kernel's INT8 path, kernel only
# and with the per-token pre-pass, against the bf16 fused kernel and the e4m3 kernel; correctness
# first. Run it in the sm_89-only build (CMAKE_CUDA_ARCHITECTURES=89) for the L4 comparison.
add_executable(attn_int8_bench ${CMAKE_CURRENT_LIST_DIR}/int8_bench.cu)
target_link_libraries(attn_int8_bench PRIVATE attn_kernels CUDA::cudart_static)
target_compile_options(attn_int8_bench PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)

# cuDNN FP8 benchmark (issue 20): cuDNN's FP8 SDPA on Hopper, alone (E4M3 in/out, heuristic and
# autotuned engine) and as the whole fp8 path from bf16 (pre-pass + graph + conversion, recipe
# off and default), against cuDNN bf16; correctness first. Built only with the cudnn family;
# ATTN_HAVE_CUDNN comes from attn_kernels (attn_cudnn_configure), as for attn_kernel_bench.
if(ATTN_CUDNN_FOUND)
  add_executable(attn_cudnn_fp8_bench ${CMAKE_CURRENT_LIST_DIR}/cudnn_fp8_bench.cu)
  target_link_libraries(attn_cudnn_fp8_bench PRIVATE attn_kernels CUDA::cudart_static)
  target_compile_options(attn_cudnn_fp8_bench PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
endif()
