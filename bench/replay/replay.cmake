# SPDX-License-Identifier: Apache-2.0
# replay.cmake: the replay tool (included by bench/CMakeLists.txt): library expseg_traces
# (the trace readers, synth workloads, models, sweep, cost model and report of this folder,
# plus bench/tool_args.c, the tools' command-line parser, so that the microbenchmarks and
# the parser's tests and fuzzer link one library) and expseg-replay.
set(_replay ${CMAKE_CURRENT_LIST_DIR})
file(GLOB EXPSEG_TRACES_SOURCES CONFIGURE_DEPENDS
     ${_replay}/trace*.c
     ${_replay}/pickle*.c
     ${_replay}/synth*.c
     ${_replay}/report.c)
list(APPEND EXPSEG_TRACES_SOURCES ${_replay}/../tool_args.c)
get_filename_component(_bench ${_replay} DIRECTORY)
add_library(expseg_traces STATIC ${EXPSEG_TRACES_SOURCES})
# Walls (docs/design.md, "Layers"): the trace library sees the public headers, base/, its own
# folder and bench/ (tool_args.h, tool_version.h), reports errors through its own message
# (trace_error.c) and uses only the public API.
target_include_directories(expseg_traces PUBLIC ${_replay} ${_bench} ${PROJECT_SOURCE_DIR}/base
                           ${PROJECT_BINARY_DIR}/generated)
target_compile_definitions(expseg_traces PRIVATE _GNU_SOURCE)
target_compile_options(expseg_traces PRIVATE -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes)
target_link_libraries(expseg_traces PUBLIC expseg_static)

add_executable(expseg-replay ${_replay}/replay.c)
target_link_libraries(expseg-replay PRIVATE expseg_traces)
target_compile_definitions(expseg-replay PRIVATE _GNU_SOURCE)
target_compile_options(expseg-replay PRIVATE -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes)

# The same library and the replay tool linked against libexpseg.so: proof that the tools
# need nothing the shared library hides (CTest tools_link_shared; test builds only).
if(EXPSEG_BUILD_TESTS)
  add_library(expseg_traces_shared STATIC ${EXPSEG_TRACES_SOURCES})
  target_include_directories(expseg_traces_shared PUBLIC ${_replay} ${_bench} ${PROJECT_SOURCE_DIR}/base
                             ${PROJECT_BINARY_DIR}/generated)
  target_compile_definitions(expseg_traces_shared PRIVATE _GNU_SOURCE)
  target_link_libraries(expseg_traces_shared PUBLIC expseg_shared)
  add_executable(expseg-replay-shared ${_replay}/replay.c)
  target_compile_definitions(expseg-replay-shared PRIVATE _GNU_SOURCE)
  target_link_libraries(expseg-replay-shared PRIVATE expseg_traces_shared)
endif()
