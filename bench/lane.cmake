# Host cost of a small GPU round trip (graph launch vs stream calls, event nodes, copies vs
# zero-copy): bench/graph_launch_bench.cu, issue 18 item 4. No project kernels.
add_executable(attn_graph_launch_bench ${CMAKE_CURRENT_LIST_DIR}/graph_launch_bench.cu)
target_link_libraries(attn_graph_launch_bench PRIVATE CUDA::cudart_static)
