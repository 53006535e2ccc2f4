# Unit tests for the runtime's pure logic (validation, registry, allocator, worker pool,
# the Unix-socket listen helpers, the NVIDIA driver check, the GetLoad report, the device
# fault latch).
if(ATTN_SERVER)
  add_executable(server_unit_test
    ${CMAKE_CURRENT_LIST_DIR}/attend_validator_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/backend_registry_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/client_text_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/deadline_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/driver_check_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/load_report_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/fault_latch_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/range_allocator_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/sequence_validator_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/packed_batch_validator_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/wide_window_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/work_bound_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/worker_pool_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/unix_socket_test.cc)
  target_link_libraries(server_unit_test PRIVATE attn_runtime GTest::gtest_main)
  gtest_discover_tests(server_unit_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
  # ExtendBatchStream in process over loopback gRPC, behind a gated cpu paged backend.
  add_executable(batch_stream_unit_test ${CMAKE_CURRENT_LIST_DIR}/batch_stream_test.cc)
  target_link_libraries(batch_stream_unit_test PRIVATE attn_runtime GTest::gtest_main)
  gtest_discover_tests(batch_stream_unit_test PROPERTIES LABELS unit TIMEOUT 120
                       DISCOVERY_TIMEOUT 60)
endif()
