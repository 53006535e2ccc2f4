# Security unit tests (server/security/), one file per component: the token file, the
# authenticator, the tensor element limit (per-identity accounting: kv_cache.cmake).
if(ATTN_SERVER)
  add_executable(security_unit_test
    ${CMAKE_CURRENT_LIST_DIR}/token_table_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/authenticator_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/tensor_limit_test.cc)
  target_link_libraries(security_unit_test PRIVATE attn_runtime GTest::gtest_main)
  gtest_discover_tests(security_unit_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
endif()
