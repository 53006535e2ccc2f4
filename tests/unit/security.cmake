# Security unit tests (server/security/: tokens, per-identity accounting, element limit).
if(ATTN_SERVER)
  add_executable(security_unit_test ${CMAKE_CURRENT_LIST_DIR}/security_test.cc)
  target_link_libraries(security_unit_test PRIVATE attn_runtime GTest::gtest_main)
  gtest_discover_tests(security_unit_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
endif()
