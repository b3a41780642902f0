# SPDX-License-Identifier: Apache-2.0
# backend_sources.cmake: installs what python/_expseg_cxx.py compiles the C++ backend from
# at run time (PREFIX/share/expseg/plugin/) and the module itself (next to expseg.py), with or
# without EXPSEG_WITH_TORCH. Included by cmake/install.cmake.
install(FILES ${CMAKE_CURRENT_LIST_DIR}/backend.cpp ${CMAKE_CURRENT_LIST_DIR}/backend_glue.h
        DESTINATION ${CMAKE_INSTALL_DATADIR}/expseg/plugin)
if(EXISTS ${PROJECT_SOURCE_DIR}/python/_expseg_cxx.py)
  install(FILES ${PROJECT_SOURCE_DIR}/python/_expseg_cxx.py
          DESTINATION ${CMAKE_INSTALL_DATADIR}/expseg/python)
endif()
