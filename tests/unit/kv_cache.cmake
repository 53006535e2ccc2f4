# Paged KV cache unit tests (server/kv_cache/), one file per component: the host page format,
# the page pool and its sub-pools, block tables, sequence ids, the sequence store (and its
# per-identity accounting, its TTL sweeper), the Attend split of a sequence step, the replay
# digest of a step and its stored output, and steps with CUDA IPC tensors through ExtendStep (a
# test double for the device copies; no GPU).
if(ATTN_SERVER)
  add_executable(kv_cache_unit_test
    ${CMAKE_CURRENT_LIST_DIR}/paged_kv_cpu_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/page_pool_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/block_table_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/sequence_id_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/sequence_store_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/identity_quota_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/sequence_store_quota_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/sequence_store_sweep_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/attend_split_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/replay_digest_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/replay_output_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/sequence_id_echo_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/device_step_test.cc)
  target_link_libraries(kv_cache_unit_test PRIVATE attn_runtime GTest::gtest_main)
  gtest_discover_tests(kv_cache_unit_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
endif()
