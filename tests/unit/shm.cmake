# Shared-memory unit tests (server/shm/): the SIGBUS guard (chaining as death tests) and the
# region registry (names, errors, limits, ownership, bounds, pins, truncated objects; CUDA IPC
# regions through a fake opener, no GPU needed), and a call's pinned region fields
# (service/call_regions.h).
if(ATTN_SERVER)
  add_executable(shm_unit_test
    ${CMAKE_CURRENT_LIST_DIR}/fault_guard_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/region_registry_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/device_region_registry_test.cc
    ${CMAKE_CURRENT_LIST_DIR}/call_regions_test.cc)
  target_link_libraries(shm_unit_test PRIVATE attn_runtime GTest::gtest_main)
  gtest_discover_tests(shm_unit_test PROPERTIES LABELS unit DISCOVERY_TIMEOUT 60)
endif()
