# Client unit tests (attention-loadgen logic): trace parsing, token scaling, percentiles,
# fp16/bf16 encoding, the float64 oracle and the verification metric, the HDR histogram,
# Poisson arrivals, CSV/report output (TFLOP/s under batching, rate warning, interrupt fields),
# sweep points, backend check and failed-point CSV, the readable range checks of the flags,
# the ReleaseSequence retry (an in-process gRPC server). No network.
# Included from tests/unit/CMakeLists.txt; needs the attn_loadgen target (ATTN_SERVER=ON).
if(TARGET attn_loadgen)
  add_executable(attn_client_unit_tests
    ${CMAKE_CURRENT_LIST_DIR}/client_trace_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/client_workload_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/client_stats_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/client_dtype_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/client_oracle_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/client_verify_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/client_hdr_histogram_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/client_open_loop_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/client_report_batching_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/client_session_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/client_flag_checks_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/client_release_retry_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/client_session_progress_test.cc)
  target_link_libraries(attn_client_unit_tests PRIVATE attn_loadgen CLI11::CLI11
                        GTest::gtest_main)
  target_compile_definitions(attn_client_unit_tests PRIVATE
    ATTN_CLIENT_DATA_DIR="${CMAKE_CURRENT_LIST_DIR}/../../client/data")
  gtest_discover_tests(attn_client_unit_tests PROPERTIES LABELS unit)
endif()
