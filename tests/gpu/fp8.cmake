# fp8 family GPU tests (included from tests/gpu/CMakeLists.txt). ctest label `gpu`; without a
# CUDA device (or below sm_89) every GPU test GTEST_SKIPs with the reason and ctest counts it
# skipped. ATTN_PARITY_OUT=<path> appends per-case parity results (JSON lines, runner "fp8/...").
if(ATTN_CUDA)
  add_executable(fp8_parity_test ${CMAKE_CURRENT_LIST_DIR}/fp8_parity_test.cc)
  target_link_libraries(fp8_parity_test PRIVATE attn_parity attn_kernels GTest::gtest_main
                        CUDA::cudart_static)
  # The Vᵀ key permutation (kernels/fp8/fp8_params.h) is tested on the host too.
  target_include_directories(fp8_parity_test PRIVATE ${PROJECT_SOURCE_DIR}/kernels/fp8)
  add_test(NAME fp8_parity_test COMMAND fp8_parity_test)

  add_executable(fp8_quantize_test ${CMAKE_CURRENT_LIST_DIR}/fp8_quantize_test.cc)
  target_link_libraries(fp8_quantize_test PRIVATE attn_kernels GTest::gtest_main
                        CUDA::cudart_static)
  add_test(NAME fp8_quantize_test COMMAND fp8_quantize_test)

  # The accuracy pre-pass against its host reference, and the recipes on both FP8 paths (the
  # cuDNN cases when the build has cuDNN).
  add_executable(fp8_prepass_test ${CMAKE_CURRENT_LIST_DIR}/fp8_prepass_test.cc)
  target_link_libraries(fp8_prepass_test PRIVATE attn_parity attn_kernels GTest::gtest_main
                        CUDA::cudart_static)
  target_include_directories(fp8_prepass_test PRIVATE ${PROJECT_SOURCE_DIR}/kernels/fp8)
  if(ATTN_CUDNN_FOUND)
    target_compile_definitions(fp8_prepass_test PRIVATE ATTN_TEST_CUDNN)
  endif()
  add_test(NAME fp8_prepass_test COMMAND fp8_prepass_test)

  # The INT8 Q·Kᵀ path of the 8-bit kernel (per-token pre-pass, both P·V formats): pre-pass
  # bit-exactness, recipe errors, causal and tile invariance, padding garbage.
  add_executable(int8_attention_test ${CMAKE_CURRENT_LIST_DIR}/int8_attention_test.cc)
  target_link_libraries(int8_attention_test PRIVATE attn_parity attn_kernels GTest::gtest_main
                        CUDA::cudart_static)
  add_test(NAME int8_attention_test COMMAND int8_attention_test)

  set_tests_properties(fp8_parity_test fp8_quantize_test fp8_prepass_test int8_attention_test
    PROPERTIES
    LABELS gpu
    SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
    TIMEOUT 1200)
endif()
