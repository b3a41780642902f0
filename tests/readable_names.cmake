# SPDX-License-Identifier: Apache-2.0
# readable_names.cmake: fails when `ctest -N` lists a parameterized test by the raw bytes or
# pointer values of its parameter (GoogleTest's fallback printer: "16-byte object <...>",
# "0x... pointing to ..."), which also change from one build to the next. Give the
# parameter type a PrintTo (tests/support/pool_support.h, tests/test_alloc_sleep_common.h).
#   cmake -DCTEST=ctest -DBUILD=BUILD_DIR -P readable_names.cmake
execute_process(COMMAND ${CTEST} -N WORKING_DIRECTORY ${BUILD}
                OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "ctest -N failed (${_rc}): ${_err}")
endif()
string(REPLACE "\n" ";" _lines "${_out}")
set(_bad "")
set(_n 0)
foreach(_l IN LISTS _lines)
  if(_l MATCHES "GetParam\\(\\) = ")
    math(EXPR _n "${_n} + 1")
    if(_l MATCHES "-byte object <" OR _l MATCHES "0x[0-9a-f]+ pointing to")
      string(APPEND _bad "\n  ${_l}")
    endif()
  endif()
endforeach()
if(_bad)
  message(FATAL_ERROR "parameterized tests listed by raw bytes or pointers:${_bad}")
endif()
message(STATUS "${_n} parameterized tests listed, each parameter as text")
