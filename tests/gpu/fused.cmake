# fused family GPU tests (included from tests/gpu/CMakeLists.txt). ctest label `gpu`; without a
# CUDA device every GPU test GTEST_SKIPs ("no CUDA device: skipped") and ctest counts it skipped.
# ATTN_PARITY_OUT=<path> appends per-case parity results (JSON lines).
if(ATTN_CUDA)
  add_executable(fused_parity_test ${CMAKE_CURRENT_LIST_DIR}/fused_parity_test.cc)
  target_link_libraries(fused_parity_test PRIVATE attn_parity attn_kernels GTest::gtest_main
                        CUDA::cudart_static)
  # BlockKeyTiles (kernels/fused/fused_params.h) is tested on the host too.
  target_include_directories(fused_parity_test PRIVATE ${PROJECT_SOURCE_DIR}/kernels/fused)
  add_test(NAME fused_parity_test COMMAND fused_parity_test)
  set_tests_properties(fused_parity_test PROPERTIES
    LABELS gpu
    SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
    TIMEOUT 1200)

  # Paged K/V (FusedPagedRun) against the float64 reference and the contiguous kernel.
  add_executable(fused_paged_test ${CMAKE_CURRENT_LIST_DIR}/fused_paged_test.cc)
  target_link_libraries(fused_paged_test PRIVATE attn_parity attn_kernels GTest::gtest_main
                        CUDA::cudart_static)
  add_test(NAME fused_paged_test COMMAND fused_paged_test)
  set_tests_properties(fused_paged_test PROPERTIES
    LABELS gpu
    SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
    TIMEOUT 1200)
endif()
