# SPDX-License-Identifier: Apache-2.0
# tests/install/tests.cmake: packaging tests, included by tests/CMakeLists.txt.
#  install_consumer: `cmake --install` into a scratch prefix, then a small C program built
#    against it four ways (CMake package / pkg-config x shared / static) and run.
#  subproject_without_gtest: expseg under add_subdirectory with GoogleTest made unfindable
#    (tests and benchmarks default off there), and a top-level configure with
#    -DEXPSEG_BUILD_TESTS=OFF, both without GoogleTest.
#  python_helper, python_route, python_route_adv, python_route_adv15, python_route_strict,
#    python_interop: tests/python/test_expseg.py, test_pyroute.py, test_pyroute_adv.py,
#    test_pyroute_adv15.py, test_pyroute_strict.py, test_interop.py
#    (python/expseg.py without PyTorch, CuPy or Numba: stand-in modules, the library on the
#    host and sim drivers).
# Sanitizer builds skip them: their libraries need the sanitizer runtime in the consumer.
if(NOT EXPSEG_SANITIZE STREQUAL "")
  return()
endif()
set(_pkg ${CMAKE_CURRENT_LIST_DIR}/package_test.sh)
set(_torch OFF)
if(TARGET expseg_torch)
  set(_torch ON)
endif()
if(EXPSEG_INSTALL)
  add_test(NAME install_consumer
           COMMAND bash ${_pkg} install ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR}
                   ${CMAKE_CURRENT_BINARY_DIR}/install_consumer)
  set_tests_properties(install_consumer PROPERTIES LABELS cpu TIMEOUT 600
                       ENVIRONMENT "CMAKE=${CMAKE_COMMAND};CC=${CMAKE_C_COMPILER};BENCH=${EXPSEG_BUILD_BENCH};TORCH=${_torch}")
endif()
add_test(NAME subproject_without_gtest
         COMMAND bash ${_pkg} subproject ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR}/subproject_without_gtest)
set_tests_properties(subproject_without_gtest PROPERTIES LABELS cpu TIMEOUT 600
                     ENVIRONMENT "CMAKE=${CMAKE_COMMAND};CC=${CMAKE_C_COMPILER}")

if(TARGET expseg_torch)
  find_package(Python3 COMPONENTS Interpreter)
  if(Python3_Interpreter_FOUND)
    foreach(_t helper:test_expseg route:test_pyroute route_adv:test_pyroute_adv
            route_adv15:test_pyroute_adv15 route_strict:test_pyroute_strict interop:test_interop
            host_snapshot:test_host_snapshot)
      string(REPLACE ":" ";" _t ${_t})
      list(GET _t 0 _name)
      list(GET _t 1 _module)
      add_test(NAME python_${_name}
               COMMAND ${Python3_EXECUTABLE} -m unittest -v ${_module}
               WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}/tests/python)
      set_tests_properties(python_${_name} PROPERTIES LABELS cpu TIMEOUT 300
                           ENVIRONMENT "EXPSEG_TEST_TORCH_LIB=$<TARGET_FILE:expseg_torch>;PYTHONPATH=${PROJECT_SOURCE_DIR}/python;PYTHONDONTWRITEBYTECODE=1")
    endforeach()
  else()
    message(STATUS "expseg: no python3: the python_helper test is not added (apt-get install python3)")
  endif()
endif()
