# SPDX-License-Identifier: Apache-2.0
# help2roff.cmake: cmake -DTOOL=PATH -DNAME=NAME -DVERSION=V -DOUT=FILE -P help2roff.cmake
# Writes a man(7) page for a tool from its --help: NAME (the first line after "usage:"'s line
# that describes the tool, or the tool's name), SYNOPSIS (the usage line), DESCRIPTION and
# OPTIONS (the rest of the text, kept as written: no fill, so the columns stay aligned).
# Backslashes are escaped and lines starting with . or ' are protected, so any text is safe.
execute_process(COMMAND ${TOOL} --help OUTPUT_VARIABLE _help RESULT_VARIABLE _rc
                ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "${NAME} --help failed (${_rc}): ${_err}")
endif()
string(REPLACE "\\" "\\e" _help "${_help}")
string(REGEX REPLACE "\n$" "" _help "${_help}")
string(REPLACE ";" "<expseg-semicolon>" _help "${_help}") # a list separator otherwise
string(REPLACE "\n" ";" _lines "${_help}")
set(_synopsis "")
set(_body "")
foreach(_l IN LISTS _lines)
  if(_synopsis STREQUAL "" AND _l MATCHES "^usage: (.*)$")
    set(_synopsis "${CMAKE_MATCH_1}")
  else()
    if(_l MATCHES "^[.']")
      set(_l "\\&${_l}")
    endif()
    string(REPLACE "<expseg-semicolon>" ";" _l "${_l}")
    string(APPEND _body "${_l}\n")
  endif()
endforeach()
string(TOUPPER "${NAME}" _upper)
file(WRITE ${OUT} ".\\\" Generated from `${NAME} --help` by expseg's cmake/help2roff.cmake.
.TH ${_upper} 1 \"\" \"expseg ${VERSION}\" \"User Commands\"
.SH NAME
${NAME} \\- a tool of expseg, the caching GPU memory allocator
.SH SYNOPSIS
.nf
${_synopsis}
.fi
.SH DESCRIPTION
.nf
${_body}.fi
.SH SEE ALSO
The documentation installed under share/doc/expseg (docs/replay.md, docs/benchmarks.md).
")
