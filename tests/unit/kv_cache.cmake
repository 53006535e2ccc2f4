# Paged KV cache unit tests (page format, sub-pools, block tables, sequence store).
if(ATTN_SERVER)
  add_executable(kv_cache_unit_test ${CMAKE_CURRENT_LIST_DIR}/kv_cache_test.cc
                 ${CMAKE_CURRENT_LIST_DIR}/attend_split_test.cc
                 ${CMAKE_CURRENT_LIST_DIR}/sequence_store_sweep_test.cc
                 ${CMAKE_CURRENT_LIST_DIR}/sequence_id_echo_test.cc)
  target_link_libraries(kv_cache_unit_test PRIVATE attn_runtime GTest::gtest_main)
  gtest_discover_tests(kv_cache_unit_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
endif()
