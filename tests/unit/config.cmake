# attention-server's flags and logging (server/config/, server/common/logging.*): the grouped
# --help, size suffixes, ATTN_ variable errors, Cloud Logging JSON fields.
if(ATTN_SERVER)
  add_executable(config_unit_test
    ${CMAKE_CURRENT_LIST_DIR}/byte_size_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/memory_limit_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/server_flags_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/logging_test.cc)
  target_link_libraries(config_unit_test PRIVATE attn_runtime GTest::gtest_main)
  gtest_discover_tests(config_unit_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
endif()
