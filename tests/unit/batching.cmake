# Dynamic batching (server/batching/): the decision function, the scheduler, Attend coalescing
# and batched sequence steps.
if(ATTN_SERVER)
  add_executable(batching_unit_test
    ${CMAKE_CURRENT_LIST_DIR}/batch_decision_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/batch_scheduler_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/attend_coalescer_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/extend_batch_test.cc)
  target_link_libraries(batching_unit_test PRIVATE attn_runtime GTest::gtest_main)
  gtest_discover_tests(batching_unit_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
endif()
