# SPDX-License-Identifier: Apache-2.0
# install.cmake: what `cmake --install` puts where (GNUInstallDirs), the CMake package
# (find_package(expseg) -> expseg::expseg, expseg::expseg_shared, expseg::expseg_static)
# and expseg.pc for pkg-config. Included by the top-level CMakeLists.txt when EXPSEG_INSTALL.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(EXPSEG_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/expseg)

install(FILES ${PROJECT_SOURCE_DIR}/include/expseg.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(EXISTS ${PROJECT_SOURCE_DIR}/include/expseg_testing.h)
  install(FILES ${PROJECT_SOURCE_DIR}/include/expseg_testing.h
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endif()

# Two export sets: the static library's needs hwloc found again by the consumer, the shared
# one does not, so a machine without libhwloc-dev can still use expseg::expseg_shared.
install(TARGETS expseg_shared EXPORT expsegTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS expseg_static EXPORT expsegStaticTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT expsegTargets NAMESPACE expseg:: DESTINATION ${EXPSEG_CMAKE_DIR})
install(EXPORT expsegStaticTargets NAMESPACE expseg:: DESTINATION ${EXPSEG_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/expsegConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/expsegConfig.cmake
                              INSTALL_DESTINATION ${EXPSEG_CMAKE_DIR})
# 0.x: a new minor version may break the API, so only the same minor matches.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/expsegConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/expsegConfig.cmake
              ${PROJECT_BINARY_DIR}/expsegConfigVersion.cmake
        DESTINATION ${EXPSEG_CMAKE_DIR})

# pkg-config: Requires.private and Libs.private list what libexpseg.a needs
# (`pkg-config --static --libs expseg`: hwloc's own flags come from hwloc.pc). The prefix
# is found from the .pc file's own place, so `cmake --install --prefix P` stays right.
set(EXPSEG_PC_LIBS_PRIVATE "-lpthread -ldl")
set(EXPSEG_PC_REQUIRES_PRIVATE "")
if(EXPSEG_WITH_HWLOC)
  set(EXPSEG_PC_REQUIRES_PRIVATE "Requires.private: hwloc\n")
endif()
file(RELATIVE_PATH EXPSEG_PC_UP /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
set(EXPSEG_PC_PREFIX "\${pcfiledir}/${EXPSEG_PC_UP}")
foreach(d LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${d}}")
    set(EXPSEG_PC_${d} "${CMAKE_INSTALL_${d}}")
  else()
    set(EXPSEG_PC_${d} "\${prefix}/${CMAKE_INSTALL_${d}}")
  endif()
endforeach()
configure_file(${CMAKE_CURRENT_LIST_DIR}/expseg.pc.in ${PROJECT_BINARY_DIR}/expseg.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/expseg.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Tools (bench/), the PyTorch plug-in (plugin/) and its Python helper (python/).
foreach(t expseg-replay expseg-bench-hit expseg-bench-grow expseg-bench-driver)
  if(TARGET ${t})
    install(TARGETS ${t} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()
if(TARGET expseg_torch)
  install(TARGETS expseg_torch LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(FILES ${PROJECT_SOURCE_DIR}/plugin/expseg_torch.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  # expseg.py and the modules beside it (expseg_interop.py, CuPy's allocator and the Numba
  # plugin, which expseg.py loads from beside itself; _expseg_cxx.py, the C++ backend's loader)
  file(GLOB _expseg_py ${PROJECT_SOURCE_DIR}/python/*.py)
  install(FILES ${_expseg_py} DESTINATION ${CMAKE_INSTALL_DATADIR}/expseg/python)
endif()
# The C++ backend's sources, compiled at run time by python/_expseg_cxx.py.
include(${PROJECT_SOURCE_DIR}/plugin/backend_sources.cmake)

# Documentation: README, LICENSE, CHANGELOG and docs/ under share/doc/expseg.
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${PROJECT_SOURCE_DIR}/LICENSE
              ${PROJECT_SOURCE_DIR}/CHANGELOG.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)
# Man pages of the installed tools, generated from their --help (cmake/manpages.cmake).
if(EXISTS ${PROJECT_SOURCE_DIR}/cmake/manpages.cmake)
  include(${PROJECT_SOURCE_DIR}/cmake/manpages.cmake)
endif()

# `cmake --build build --target uninstall`: removes every file the last install wrote
# (install_manifest.txt), then the directories it made that are left empty.
if(NOT TARGET uninstall)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/uninstall.cmake.in
                 ${PROJECT_BINARY_DIR}/expseg_uninstall.cmake @ONLY)
  add_custom_target(uninstall COMMAND ${CMAKE_COMMAND} -P ${PROJECT_BINARY_DIR}/expseg_uninstall.cmake
                    COMMENT "Removing the files of the last install")
endif()
