# SPDX-License-Identifier: Apache-2.0
# tests/docs/tests.cmake: what a user outside the project meets first, included by
# tests/CMakeLists.txt (python3 needed; without it these tests are not added).
#  docs_commands:   every ```sh block of README.md and docs/ runs (tools/doc-commands, in a
#                   scratch copy of the sources whose build/ is this build folder; CI also runs
#                   it from a fresh clone with nothing beside it)
#  docs_messages:   the messages quoted in docs/api.md and docs/config.md are the library's
#  public_text:     no tracker numbers or internal paths in README, docs/, headers, examples
#  spdx:            every source file has its licence line (tools/spdx-check)
#  pip_install:     `pip install ./python` (offline: --no-build-isolation, into a scratch
#                   folder) gives an importable expseg of the library's version
#  replay_header:   the replay table's header names only the keys that differ from the
#                   defaults, not the whole configuration
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
  message(STATUS "expseg: no python3: the docs tests are not added")
  return()
endif()
set(_py ${Python3_EXECUTABLE})
if(TARGET expseg-replay AND EXPSEG_INSTALL AND EXPSEG_SANITIZE STREQUAL "")
  add_test(NAME docs_commands
           COMMAND ${_py} ${PROJECT_SOURCE_DIR}/tools/doc-commands --root ${PROJECT_SOURCE_DIR}
                   --build ${PROJECT_BINARY_DIR})
  # install_manifest.txt of this build folder is written by the install it runs, and read
  # by install_consumer's uninstall
  set_tests_properties(docs_commands PROPERTIES LABELS cpu TIMEOUT 900
                       RESOURCE_LOCK expseg_install_manifest)
  if(TEST install_consumer)
    set_tests_properties(install_consumer PROPERTIES RESOURCE_LOCK expseg_install_manifest)
  endif()
endif()
if(EXPSEG_SANITIZE STREQUAL "")
  add_test(NAME docs_messages
           COMMAND ${_py} ${CMAKE_CURRENT_LIST_DIR}/check_messages.py $<TARGET_FILE:expseg_shared>)
  set_tests_properties(docs_messages PROPERTIES LABELS cpu TIMEOUT 120)
endif()
add_test(NAME public_text COMMAND ${_py} ${CMAKE_CURRENT_LIST_DIR}/check_public_text.py)
add_test(NAME spdx COMMAND ${_py} ${PROJECT_SOURCE_DIR}/tools/spdx-check)
set_tests_properties(public_text spdx PROPERTIES LABELS cpu TIMEOUT 60)
add_test(NAME pip_install
         COMMAND ${_py} ${CMAKE_CURRENT_LIST_DIR}/check_pip_install.py ${PROJECT_SOURCE_DIR}
                 ${PROJECT_VERSION} ${CMAKE_CURRENT_BINARY_DIR}/pip_install)
set_tests_properties(pip_install PROPERTIES LABELS cpu TIMEOUT 300 SKIP_RETURN_CODE 77)
if(TARGET expseg-replay)
  add_test(NAME replay_header
           COMMAND ${CMAKE_COMMAND} -DREPLAY=$<TARGET_FILE:expseg-replay>
                   -P ${CMAKE_CURRENT_LIST_DIR}/replay_header.cmake)
  set_tests_properties(replay_header PROPERTIES LABELS cpu TIMEOUT 120)
endif()
