# cudnn family unit tests (pure logic on CPU) and the server's auto calibration / warm-up
# parsing. cudnn_graph_validate_test builds and validates real cuDNN graphs without a GPU
# (CUDA builds with cuDNN found; skips when libcudnn.so.9 cannot be loaded).
add_executable(cudnn_pure_test ${CMAKE_CURRENT_LIST_DIR}/cudnn_pure_test.cc)
target_link_libraries(cudnn_pure_test PRIVATE attn_kernels GTest::gtest_main)
gtest_discover_tests(cudnn_pure_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)

if(ATTN_CUDA AND ATTN_CUDNN_FOUND)
  add_executable(cudnn_graph_validate_test ${CMAKE_CURRENT_LIST_DIR}/cudnn_graph_validate_test.cc)
  target_include_directories(cudnn_graph_validate_test PRIVATE ${PROJECT_SOURCE_DIR}/kernels/cudnn)
  target_link_libraries(cudnn_graph_validate_test PRIVATE attn_kernels GTest::gtest_main)
  gtest_discover_tests(cudnn_graph_validate_test PROPERTIES LABELS unit
                       SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]" DISCOVERY_TIMEOUT 60)
endif()

if(ATTN_SERVER)
  add_executable(calibration_unit_test ${CMAKE_CURRENT_LIST_DIR}/calibration_test.cc)
  target_link_libraries(calibration_unit_test PRIVATE attn_runtime GTest::gtest_main)
  gtest_discover_tests(calibration_unit_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
endif()

# libcudnn search order and choice (kernels/include/attn/kernels/cudnn_library.h), every build:
# fake libraries that only export cudnnGetVersion() stand in for old and new cuDNN releases.
foreach(_v 91400 91900 91901 92600 100100)
  add_library(fake_cudnn_${_v} SHARED ${CMAKE_CURRENT_LIST_DIR}/fake_cudnn/fake_cudnn.cc)
  target_compile_definitions(fake_cudnn_${_v} PRIVATE FAKE_CUDNN_VERSION=${_v})
  # Built like the real libcudnn, without the sanitizer runtime: the probe opens it with
  # dlmopen in a namespace of its own, where an ASan-linked library would load a second ASan
  # runtime and abort ("ASan runtime does not come first").
  set_property(TARGET fake_cudnn_${_v} PROPERTY COMPILE_OPTIONS "")
  set_property(TARGET fake_cudnn_${_v} PROPERTY LINK_OPTIONS "")
endforeach()
add_executable(cudnn_library_test ${CMAKE_CURRENT_LIST_DIR}/cudnn_library_test.cc)
target_link_libraries(cudnn_library_test PRIVATE attn_kernels GTest::gtest_main)
foreach(_v 91400 91900 91901 92600 100100)
  target_compile_definitions(cudnn_library_test PRIVATE
    "FAKE_CUDNN_${_v}=\"$<TARGET_FILE:fake_cudnn_${_v}>\"")
  add_dependencies(cudnn_library_test fake_cudnn_${_v})
endforeach()
gtest_discover_tests(cudnn_library_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
