# Server-side GPU tests (included from tests/gpu/CMakeLists.txt; need the server runtime, so
# they are built where gRPC is, and run on GPU hosts from the bundle: scripts/bundle.sh).
# ctest label `gpu`; without a CUDA device they GTEST_SKIP ("no CUDA device: skipped").
if(ATTN_CUDA AND TARGET attn_runtime)
  add_executable(gpu_paged_attention_test ${CMAKE_CURRENT_LIST_DIR}/gpu_paged_attention_test.cc)
  target_link_libraries(gpu_paged_attention_test PRIVATE attn_runtime GTest::gtest_main)
  add_test(NAME gpu_paged_attention_test COMMAND gpu_paged_attention_test)
  set_tests_properties(gpu_paged_attention_test PROPERTIES
    LABELS gpu
    SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
    TIMEOUT 600)
  add_executable(gpu_paged_graphs_test ${CMAKE_CURRENT_LIST_DIR}/gpu_paged_graphs_test.cc)
  target_link_libraries(gpu_paged_graphs_test PRIVATE attn_runtime GTest::gtest_main)
  add_test(NAME gpu_paged_graphs_test COMMAND gpu_paged_graphs_test)
  set_tests_properties(gpu_paged_graphs_test PROPERTIES
    LABELS gpu
    SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
    TIMEOUT 600)
endif()
