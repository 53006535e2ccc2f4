# decode family GPU tests (included from tests/gpu/CMakeLists.txt): the paged KV append kernel
# and split-KV paged/contiguous decode against the float64 CPU reference. ctest label `gpu`;
# without a CUDA device every GPU test GTEST_SKIPs ("no CUDA device: skipped") and ctest counts
# it skipped.
if(ATTN_CUDA)
  add_executable(paged_decode_test ${CMAKE_CURRENT_LIST_DIR}/paged_decode_test.cc)
  target_link_libraries(paged_decode_test PRIVATE attn_kernels attn_parity GTest::gtest_main
                        CUDA::cudart_static)
  add_test(NAME paged_decode_test COMMAND paged_decode_test)
  set_tests_properties(paged_decode_test PROPERTIES
    LABELS gpu
    SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
    TIMEOUT 1200)
endif()
