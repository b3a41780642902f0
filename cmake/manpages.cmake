# SPDX-License-Identifier: Apache-2.0
# manpages.cmake: a man page per installed tool, generated at build time from the tool's own
# --help by cmake/help2roff.cmake (so a page never disagrees with its tool), installed under
# share/man/man1. Included by cmake/install.cmake; skipped when cross-compiling (the tools
# cannot run on the build machine).
if(CMAKE_CROSSCOMPILING)
  return()
endif()
set(_expseg_man_pages "")
foreach(t expseg-replay expseg-bench-hit expseg-bench-grow expseg-bench-driver)
  if(TARGET ${t})
    set(_page ${PROJECT_BINARY_DIR}/man/${t}.1)
    add_custom_command(OUTPUT ${_page}
                       COMMAND ${CMAKE_COMMAND} -DTOOL=$<TARGET_FILE:${t}> -DNAME=${t}
                               -DVERSION=${EXPSEG_BUILD_VERSION} -DOUT=${_page}
                               -P ${CMAKE_CURRENT_LIST_DIR}/help2roff.cmake
                       DEPENDS ${t} ${CMAKE_CURRENT_LIST_DIR}/help2roff.cmake
                       COMMENT "Man page ${t}.1 from ${t} --help" VERBATIM)
    list(APPEND _expseg_man_pages ${_page})
  endif()
endforeach()
if(_expseg_man_pages)
  add_custom_target(expseg_man_pages ALL DEPENDS ${_expseg_man_pages})
  install(FILES ${_expseg_man_pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
endif()
