# Decode benchmark (included from bench/CMakeLists.txt when ATTN_CUDA is on): split-KV decode on
# a paged KV cache vs contiguous K/V vs a read-only streaming kernel; correctness checked first.
# scripts/decode_bench.sh builds and runs it (and bench/decode_peers.py when torch is present).
add_executable(attn_decode_bench ${CMAKE_CURRENT_LIST_DIR}/decode_bench.cu)
target_link_libraries(attn_decode_bench PRIVATE attn_kernels CUDA::cudart_static)
target_compile_options(attn_decode_bench PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr>)
