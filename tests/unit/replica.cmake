# Scale-out support (DESIGN.md §12): replica-tagged sequence ids, GetLoad's report, the NVIDIA
# driver check, flags from ATTN_* environment variables.
if(ATTN_SERVER)
  add_executable(replica_unit_test ${CMAKE_CURRENT_LIST_DIR}/replica_test.cc)
  target_link_libraries(replica_unit_test PRIVATE attn_runtime GTest::gtest_main)
  gtest_discover_tests(replica_unit_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
endif()
