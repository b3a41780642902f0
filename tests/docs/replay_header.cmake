# SPDX-License-Identifier: Apache-2.0
# replay_header.cmake: cmake -DREPLAY=expseg-replay -P replay_header.cmake
# The table's header line names the configuration by the keys that differ from expseg's
# defaults ("expseg's defaults" when none), not by the whole 500-character string, which
# --json still carries.
function(run out)
  execute_process(COMMAND ${REPLAY} --quiet --limit 200 ${ARGN} OUTPUT_VARIABLE o
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "expseg-replay ${ARGN}: exit ${rc}")
  endif()
  string(REGEX MATCH "# driver [^\n]*" head "${o}")
  set(${out} "${head}" PARENT_SCOPE)
endfunction()
run(h --synth train)
message("defaults: ${h}")
if(NOT h MATCHES "; config expseg's defaults " OR h MATCHES "backend:native")
  message(FATAL_ERROR "the defaults' header should say \"expseg's defaults\": ${h}")
endif()
run(h --synth train --conf "expandable_segments:False,roundup_power2_divisions:[256:4,>:1]")
message("two keys set: ${h}")
if(NOT h MATCHES "; config roundup_power2_divisions:\\[256:4,>:1\\],expandable_segments:False "
   OR h MATCHES "backend:native")
  message(FATAL_ERROR "the header should name exactly the two keys set: ${h}")
endif()
execute_process(COMMAND ${REPLAY} --quiet --limit 200 --json --synth train OUTPUT_VARIABLE j)
if(NOT j MATCHES "\"config\":\"backend:native,")
  message(FATAL_ERROR "--json should carry the whole configuration: ${j}")
endif()
