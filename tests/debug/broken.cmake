# SPDX-License-Identifier: Apache-2.0
# cmake -DSOURCE=<checkout> -DBINARY=<dir> -DCC=<C compiler> -P broken.cmake
# Builds the library with EXPSEG_TEST_BREAK_INVARIANT=1 (pools/segment.c skips one
# statistic update) at EXPSEG_DEBUG=3 plus tests/debug/probe.c, runs the probe, and passes
# only when the build succeeded and the library's own checks stopped the probe with a
# message: the CI configuration catches a broken invariant. Built without sanitizers in
# every tree (the checks under test are the library's own).
file(REMOVE_RECURSE ${BINARY})
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE}/tests/debug/project -B ${BINARY}
                        -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=${CC}
                        -DEXPSEG_SOURCE=${SOURCE} -DEXPSEG_DEBUG=3
                        -DEXPSEG_TEST_BREAK_INVARIANT=1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configure of the broken build failed (${rc}):\n${out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY} --target probe -j2
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "build of the broken build failed (${rc}):\n${out}")
endif()
set(ENV{EXPSEG_CHECK_EVERY} 1)
execute_process(COMMAND ${BINARY}/probe RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0 OR NOT out MATCHES "expseg: (internal check failed|EXPSEG_DEBUG=3 check)")
  message(FATAL_ERROR "the broken invariant was not caught: probe exit ${rc}, output:\n${out}")
endif()
message(STATUS "caught, as it must be (exit ${rc}):\n${out}")
file(REMOVE_RECURSE ${BINARY})
