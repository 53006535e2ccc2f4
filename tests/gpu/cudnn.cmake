# cudnn family GPU tests (included from tests/gpu/CMakeLists.txt). ctest label `gpu`; without a
# CUDA device or a loadable cuDNN 9 every test GTEST_SKIPs with the reason and ctest counts it
# skipped. ATTN_PARITY_OUT=<path> appends per-case parity results (JSON lines).
if(ATTN_CUDA AND ATTN_CUDNN_FOUND)
  add_executable(cudnn_parity_test ${CMAKE_CURRENT_LIST_DIR}/cudnn_parity_test.cc)
  target_link_libraries(cudnn_parity_test PRIVATE attn_parity attn_kernels GTest::gtest_main
                        CUDA::cudart_static)
  add_test(NAME cudnn_parity_test COMMAND cudnn_parity_test)
  set_tests_properties(cudnn_parity_test PROPERTIES
    LABELS gpu
    SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
    TIMEOUT 1200)
endif()
