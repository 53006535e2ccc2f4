# Server-side GPU tests (included from tests/gpu/CMakeLists.txt; need the server runtime, so
# they are built where gRPC is, and run on GPU hosts from the bundle: scripts/bundle.sh).
# ctest label `gpu`; without a CUDA device they GTEST_SKIP ("no CUDA device: skipped").
if(ATTN_CUDA AND TARGET attn_runtime)
  foreach(t gpu_paged_attention_test gpu_paged_graphs_test gpu_staged_attend_test
          gpu_fp8_backend_test)
    add_executable(${t} ${CMAKE_CURRENT_LIST_DIR}/${t}.cc)
    target_link_libraries(${t} PRIVATE attn_runtime GTest::gtest_main)
    add_test(NAME ${t} COMMAND ${t})
    set_tests_properties(${t} PROPERTIES
      LABELS gpu
      SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
      TIMEOUT 600)
  endforeach()
endif()
