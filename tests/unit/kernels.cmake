# Kernel unit tests: pure host logic (CPU reference, dtype conversions). No device needed.
add_executable(attn_cpu_reference_test ${CMAKE_CURRENT_LIST_DIR}/cpu_reference_test.cc)
target_link_libraries(attn_cpu_reference_test PRIVATE attn_kernels GTest::gtest_main)
gtest_discover_tests(attn_cpu_reference_test DISCOVERY_TIMEOUT 60)

add_executable(attn_host_dtype_test ${CMAKE_CURRENT_LIST_DIR}/host_dtype_test.cc)
target_link_libraries(attn_host_dtype_test PRIVATE attn_kernels GTest::gtest_main)
gtest_discover_tests(attn_host_dtype_test DISCOVERY_TIMEOUT 60)

# The fused family's paged K/V host logic (Supports, refusals, tile list, page arithmetic): CUDA
# builds only (the family is built only with CUDA), but no device needed.
if(ATTN_CUDA)
  add_executable(attn_fused_paged_plan_test ${CMAKE_CURRENT_LIST_DIR}/fused_paged_plan_test.cc)
  target_include_directories(attn_fused_paged_plan_test PRIVATE ${PROJECT_SOURCE_DIR}/kernels/fused)
  target_link_libraries(attn_fused_paged_plan_test PRIVATE attn_kernels GTest::gtest_main)
  gtest_discover_tests(attn_fused_paged_plan_test DISCOVERY_TIMEOUT 60)
endif()

# The cpu reference's StopCheck (cancellation between chunks of rows).
add_executable(attn_cpu_stop_test ${CMAKE_CURRENT_LIST_DIR}/cpu_stop_test.cc)
target_link_libraries(attn_cpu_stop_test PRIVATE attn_kernels GTest::gtest_main)
gtest_discover_tests(attn_cpu_stop_test DISCOVERY_TIMEOUT 60)

# The FP8 accuracy pre-pass's host reference (padding invariance, K means, rotation): CUDA builds
# only (the fp8 family is), no device needed; the GPU pre-pass is compared with it bit for bit in
# tests/gpu/fp8_prepass_test.cc.
if(ATTN_CUDA)
  add_executable(attn_fp8_prepass_reference_test
                 ${CMAKE_CURRENT_LIST_DIR}/fp8_prepass_reference_test.cc)
  target_link_libraries(attn_fp8_prepass_reference_test PRIVATE attn_kernels GTest::gtest_main)
  gtest_discover_tests(attn_fp8_prepass_reference_test DISCOVERY_TIMEOUT 60)
endif()

# The per-token INT8 pre-pass's host reference (dequantisation bounds, padding invariance, the
# per-token property): CUDA builds only (the fp8 family is), no device needed; the GPU pre-pass is
# compared with it bit for bit in tests/gpu/int8_attention_test.cc.
if(ATTN_CUDA)
  add_executable(attn_int8_prepass_reference_test
                 ${CMAKE_CURRENT_LIST_DIR}/int8_prepass_reference_test.cc)
  target_link_libraries(attn_int8_prepass_reference_test PRIVATE attn_kernels GTest::gtest_main)
  gtest_discover_tests(attn_int8_prepass_reference_test DISCOVERY_TIMEOUT 60)
endif()
