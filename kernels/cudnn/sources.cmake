# cudnn family (DESIGN.md §5, §11): cuDNN fused SDPA through the cudnn-frontend v1 graph API
# (header-only, from the `nvidia-cudnn-frontend` wheel) with cuDNN 9 headers (the
# `nvidia-cudnn-cu13` wheel or a system install). libcudnn is NOT linked: the frontend's dynamic
# loading dlopens libcudnn.so.9 at run time, so binaries start without cuDNN and the backend
# says why it is unavailable.
#
# Cache variables (override the Python discovery):
#   CUDNN_FRONTEND_INCLUDE_DIR  directory holding cudnn_frontend.h
#   CUDNN_INCLUDE_DIR           directory holding cudnn.h / cudnn_version.h
#   CUDNN_LIBRARY               libcudnn.so.9 found at build time: step 4 of the run-time
#                               search (kernels/include/attn/kernels/cudnn_library.h)
# The cuDNN and frontend versions are pinned in scripts/cudnn_pins.txt (the one place;
# scripts/bootstrap.sh installs exactly those); headers of another version are reported here.
# Result: ATTN_CUDNN_FOUND (ON/OFF) and ATTN_CUDNN_REASON (why not), consumed by
# attn_cudnn_configure(<target>) after the kernels library exists.

# Pure host parts: every build (CPU-only too), unit-tested on CPU.
list(APPEND ATTN_KERNEL_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/cudnn_version.cc
  ${CMAKE_CURRENT_LIST_DIR}/cudnn_library.cc
  ${CMAKE_CURRENT_LIST_DIR}/cudnn_graph_key.cc
  ${CMAKE_CURRENT_LIST_DIR}/cudnn_supports.cc)

set(ATTN_CUDNN_FOUND OFF)
set(ATTN_CUDNN_HEADER_VERSION "")
set(ATTN_CUDNN_REASON "this server was built without CUDA")
if(ATTN_CUDA)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    # find_spec locates the packages without importing (executing) them.
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c [=[
import importlib.util, os
def spec_dir(name):
    try:
        s = importlib.util.find_spec(name)
    except Exception:
        return ''
    if s is None:
        return ''
    if s.submodule_search_locations:
        return list(s.submodule_search_locations)[0]
    return os.path.dirname(s.origin or '')
fe = spec_dir('cudnn')
print(os.path.join(os.path.dirname(fe), 'include') if fe else '')
cd = spec_dir('nvidia.cudnn')
print(os.path.join(cd, 'include') if cd else '')
print(os.path.join(cd, 'lib') if cd else '')
]=]
      OUTPUT_VARIABLE _attn_cudnn_py OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    string(REPLACE "\n" ";" _attn_cudnn_py "${_attn_cudnn_py}")
    list(LENGTH _attn_cudnn_py _attn_cudnn_n)
    if(_attn_cudnn_n EQUAL 3)
      list(GET _attn_cudnn_py 0 _attn_fe_guess)
      list(GET _attn_cudnn_py 1 _attn_cudnn_inc_guess)
      list(GET _attn_cudnn_py 2 _attn_cudnn_lib_guess)
    endif()
  endif()
  find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h HINTS ${_attn_fe_guess}
            DOC "directory of cudnn_frontend.h (nvidia-cudnn-frontend wheel: site-packages/include)")
  find_path(CUDNN_INCLUDE_DIR cudnn_version.h HINTS ${_attn_cudnn_inc_guess}
            PATHS /usr/include /usr/include/x86_64-linux-gnu /usr/local/cuda/include
            DOC "directory of cudnn.h / cudnn_version.h (cuDNN 9)")
  find_file(CUDNN_LIBRARY libcudnn.so.9 HINTS ${_attn_cudnn_lib_guess}
            PATHS /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64
            DOC "libcudnn.so.9, the run-time fallback when none is found on the loader path")
  if(NOT CUDNN_FRONTEND_INCLUDE_DIR)
    set(ATTN_CUDNN_REASON "cudnn-frontend headers not found at build time (pip install nvidia-cudnn-frontend, or -DCUDNN_FRONTEND_INCLUDE_DIR=...)")
  elseif(NOT CUDNN_INCLUDE_DIR)
    set(ATTN_CUDNN_REASON "cuDNN 9 headers not found at build time (pip install nvidia-cudnn-cu13, or -DCUDNN_INCLUDE_DIR=...)")
  else()
    file(STRINGS "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _attn_cudnn_major
         REGEX "^#define CUDNN_MAJOR [0-9]+")
    if(NOT _attn_cudnn_major MATCHES "CUDNN_MAJOR 9")
      set(ATTN_CUDNN_REASON "cuDNN headers in ${CUDNN_INCLUDE_DIR} are not cuDNN 9")
    else()
      set(ATTN_CUDNN_FOUND ON)
      set(ATTN_CUDNN_REASON "")
      # Compare with the pin (scripts/cudnn_pins.txt: nvidia-cudnn-cu13==MAJOR.MINOR.PATCH.BUILD).
      file(STRINGS "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _attn_cudnn_ver
           REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) [0-9]+")
      string(REGEX REPLACE "[^;]*CUDNN_[A-Z]+ ([0-9]+)" "\\1" _attn_cudnn_ver "${_attn_cudnn_ver}")
      string(REPLACE ";" "." ATTN_CUDNN_HEADER_VERSION "${_attn_cudnn_ver}")
      file(STRINGS "${PROJECT_SOURCE_DIR}/scripts/cudnn_pins.txt" _attn_pin
           REGEX "^nvidia-cudnn-cu13==")
      string(REGEX REPLACE "^nvidia-cudnn-cu13==([0-9]+\\.[0-9]+\\.[0-9]+).*" "\\1" _attn_pin "${_attn_pin}")
      if(NOT _attn_pin STREQUAL ATTN_CUDNN_HEADER_VERSION)
        message(WARNING "attn: cuDNN headers ${ATTN_CUDNN_HEADER_VERSION} in ${CUDNN_INCLUDE_DIR} differ from the pin ${_attn_pin} (scripts/cudnn_pins.txt); run scripts/bootstrap.sh or pass -DCUDNN_INCLUDE_DIR=...")
      endif()
    endif()
  endif()
  if(ATTN_CUDNN_FOUND)
    message(STATUS "attn: cudnn family on (frontend ${CUDNN_FRONTEND_INCLUDE_DIR}, cuDNN headers ${CUDNN_INCLUDE_DIR}, fallback library ${CUDNN_LIBRARY})")
    list(APPEND ATTN_KERNEL_CUDA_SOURCES ${CMAKE_CURRENT_LIST_DIR}/cudnn_prep.cu
                                          ${CMAKE_CURRENT_LIST_DIR}/cudnn_masked_values.cu)
    list(APPEND ATTN_KERNEL_CUDA_HOST_SOURCES
      ${CMAKE_CURRENT_LIST_DIR}/cudnn_graph.cc
      ${CMAKE_CURRENT_LIST_DIR}/cudnn_attention.cc)
    # The FP8 path quantises with the fp8 family's per-tensor quantiser.
    get_filename_component(_attn_fp8q "${CMAKE_CURRENT_LIST_DIR}/../fp8/fp8_quantize.cu" ABSOLUTE)
    if(NOT _attn_fp8q IN_LIST ATTN_KERNEL_CUDA_SOURCES)
      list(APPEND ATTN_KERNEL_CUDA_SOURCES ${_attn_fp8q})
    endif()
    set(_attn_cudnn_defs NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING CUDNN_FRONTEND_SKIP_JSON_LIB)
    if(CUDNN_LIBRARY)
      list(APPEND _attn_cudnn_defs "ATTN_CUDNN_FALLBACK_LIBRARY=\"${CUDNN_LIBRARY}\"")
    endif()
    set_source_files_properties(
      ${CMAKE_CURRENT_LIST_DIR}/cudnn_graph.cc ${CMAKE_CURRENT_LIST_DIR}/cudnn_attention.cc
      PROPERTIES INCLUDE_DIRECTORIES "${CUDNN_FRONTEND_INCLUDE_DIR};${CUDNN_INCLUDE_DIR}"
                 COMPILE_DEFINITIONS "${_attn_cudnn_defs}")
  else()
    message(STATUS "attn: cudnn family off: ${ATTN_CUDNN_REASON}")
  endif()
endif()

# Visible to tests/ and bench/ (other directory scopes).
set(ATTN_CUDNN_FOUND ${ATTN_CUDNN_FOUND} CACHE INTERNAL "cudnn family built")
set(ATTN_CUDNN_REASON "${ATTN_CUDNN_REASON}" CACHE INTERNAL "why the cudnn family is not built")
set(ATTN_CUDNN_HEADER_VERSION "${ATTN_CUDNN_HEADER_VERSION}" CACHE INTERNAL "cuDNN headers built against")

# Called by kernels/CMakeLists.txt once the library target exists.
function(attn_cudnn_configure target)
  target_link_libraries(${target} PUBLIC ${CMAKE_DL_LIBS})  # cudnn_library.cc: dlopen, every build
  if(ATTN_CUDNN_FOUND)
    target_compile_definitions(${target} PUBLIC ATTN_HAVE_CUDNN=1)
  else()
    target_compile_definitions(${target} PUBLIC "ATTN_CUDNN_UNAVAILABLE_REASON=\"${ATTN_CUDNN_REASON}\"")
  endif()
endfunction()
