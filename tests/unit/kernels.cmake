# Kernel unit tests: pure host logic (CPU reference, dtype conversions). No device needed.
add_executable(attn_cpu_reference_test ${CMAKE_CURRENT_LIST_DIR}/cpu_reference_test.cc)
target_link_libraries(attn_cpu_reference_test PRIVATE attn_kernels GTest::gtest_main)
gtest_discover_tests(attn_cpu_reference_test DISCOVERY_TIMEOUT 60)

add_executable(attn_host_dtype_test ${CMAKE_CURRENT_LIST_DIR}/host_dtype_test.cc)
target_link_libraries(attn_host_dtype_test PRIVATE attn_kernels GTest::gtest_main)
gtest_discover_tests(attn_host_dtype_test DISCOVERY_TIMEOUT 60)
