# Unit tests for the metrics module (server/metrics): naming and labels, the scrape-time
# registration API, the shadow checker's sampling and error computation.
if(ATTN_SERVER)
  add_executable(metrics_unit_test
    ${CMAKE_CURRENT_LIST_DIR}/metrics_http_server_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/metrics_naming_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/metrics_shadow_test.cc)
  target_link_libraries(metrics_unit_test PRIVATE attn_runtime GTest::gtest_main)
  gtest_discover_tests(metrics_unit_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
endif()
