# Dynamic batching (server/batching/): the decision function, the scheduler, Attend coalescing,
# batched sequence steps, and the two batchers (Attend and sequence steps) on the cpu backend.
if(ATTN_SERVER)
  add_executable(batching_unit_test
    ${CMAKE_CURRENT_LIST_DIR}/batch_decision_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/batch_scheduler_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/batch_scheduler_inline_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/attend_coalescer_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/extend_batch_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/attend_batcher_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/step_batcher_test.cc)
  target_link_libraries(batching_unit_test PRIVATE attn_runtime GTest::gtest_main)
  gtest_discover_tests(batching_unit_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
endif()
