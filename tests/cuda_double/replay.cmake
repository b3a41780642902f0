# SPDX-License-Identifier: Apache-2.0
# replay.cmake: expseg-replay --driver cuda over the recorded histories (TRACES, a folder of
# PyTorch snapshot pickles) against the CUDA driver double (DOUBLE_DIR), with --check, must
# succeed (no check violation, no out-of-memory) and hold what the sim driver holds on the
# same device (80 GiB, 2 MiB pages): peak reserved bytes within 1 %, history by history.
# Says "no recorded traces" (the test's skip pattern) when TRACES is absent.
file(GLOB traces ${TRACES}/*.pickle)
if(NOT traces)
  message("no recorded traces in ${TRACES}: skipped")
  return()
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${DOUBLE_DIR}
          EXPSEG_CUDA_DOUBLE=capacity=80G,granularity=2M,recommended=2M
          ${REPLAY} --driver cuda --json --check --quiet ${traces}
  RESULT_VARIABLE rc OUTPUT_VARIABLE cuda_out ERROR_VARIABLE cuda_err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "expseg-replay --driver cuda failed (${rc}): ${cuda_err}")
endif()
execute_process(COMMAND ${REPLAY} --driver sim:capacity=80G,granularity=2M --json --quiet ${traces}
                RESULT_VARIABLE rc OUTPUT_VARIABLE sim_out ERROR_VARIABLE sim_err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "expseg-replay --driver sim failed (${rc}): ${sim_err}")
endif()
# peak reserved bytes per history: "trace=bytes;..."
function(peaks text out)
  string(REPLACE "\n" ";" lines "${text}")
  set(acc "")
  foreach(line IN LISTS lines)
    # the first peak_reserved of the line is the replay's (a later one is the baseline's)
    if(line MATCHES "\"trace\":\"([^\"]*)\"")
      set(name "${CMAKE_MATCH_1}")
      string(REGEX MATCH "\"peak_reserved\":([0-9]+)" found "${line}")
      list(APPEND acc "${name}=${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(${out} "${acc}" PARENT_SCOPE)
endfunction()
peaks("${cuda_out}" cuda)
peaks("${sim_out}" sim)
list(LENGTH cuda n)
list(LENGTH sim m)
if(n EQUAL 0 OR NOT n EQUAL m)
  message(FATAL_ERROR "${n} histories replayed on cuda, ${m} on sim:\n${cuda_out}")
endif()
# Addresses differ (the double's reservations come from mmap, sim's from a counter), and so
# do tie-breaks among equal fits: the peaks must agree within 1 %, not to the byte.
math(EXPR last "${n} - 1")
set(bad "")
foreach(i RANGE ${last})
  list(GET cuda ${i} c)
  list(GET sim ${i} s)
  string(REGEX REPLACE "=.*" "" name "${c}")
  string(REGEX REPLACE ".*=" "" cb "${c}")
  string(REGEX REPLACE ".*=" "" sb "${s}")
  math(EXPR diff "${cb} - ${sb}")
  if(diff LESS 0)
    math(EXPR diff "0 - ${diff}")
  endif()
  math(EXPR lhs "${diff} * 100")
  message("${name}: cuda ${cb}, sim ${sb}")
  if(lhs GREATER sb)
    string(APPEND bad "${name}: peak reserved ${cb} on cuda, ${sb} on sim\n")
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "cuda against the double and sim differ by more than 1 %:\n${bad}")
endif()
message("${n} histories: cuda against the double holds what sim holds, within 1 %")
