# SPDX-License-Identifier: Apache-2.0
# cmake -DCC=<C compiler> -DINCS=<dir|dir|...> -DSRC=<file.c> -DEXPECT=<fail|pass>
#       -DHEADER=<name> -P check_include.cmake
# Compiles SRC (syntax only) with exactly the include paths a layer's target has and
# checks the outcome: EXPECT=fail passes only when the compiler says HEADER was not found
# (the wall held), EXPECT=pass only when it compiles (the command line itself is sound).
string(REPLACE "|" ";" dirs "${INCS}")
set(flags)
foreach(d ${dirs})
  list(APPEND flags "-I${d}")
endforeach()
execute_process(COMMAND ${CC} -std=c11 -D_GNU_SOURCE -fsyntax-only ${flags} ${SRC}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(EXPECT STREQUAL "pass")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${SRC} must compile with ${INCS}:\n${out}")
  endif()
elseif(rc EQUAL 0 OR NOT out MATCHES "${HEADER}")
  message(FATAL_ERROR "${SRC} included ${HEADER} through ${INCS}: the wall is open (${rc}):\n${out}")
endif()
