# SPDX-License-Identifier: Apache-2.0
# tools.cmake: the microbenchmarks; included by bench/CMakeLists.txt after
# bench/replay/replay.cmake (which defines expseg_traces, the trace readers and synthetic
# workloads they draw requests from, and expseg-replay). Results and how to reproduce them:
# docs/benchmarks.md.
# Walls: the tools see the public headers and the trace library's (not vmm/, pools/,
# policy/); expseg-bench-driver and expseg-bench-device are the white-box tools: one times
# vmm/ calls directly, the other reaches the driver's copy hook to check the allocator's bytes.
foreach(b hit grow driver host device streams pickle pinned sleep)
  add_executable(expseg-bench-${b} ${CMAKE_CURRENT_LIST_DIR}/bench_${b}.c)
  target_link_libraries(expseg-bench-${b} PRIVATE expseg_traces)
endforeach()
target_link_libraries(expseg-bench-driver PRIVATE expseg_internal)
target_link_libraries(expseg-bench-device PRIVATE expseg_internal)
target_link_libraries(expseg-bench-pinned PRIVATE m)

foreach(t expseg-bench-hit expseg-bench-grow expseg-bench-driver expseg-bench-host
          expseg-bench-device expseg-bench-streams expseg-bench-pickle expseg-bench-pinned
          expseg-bench-sleep)
  target_compile_definitions(${t} PRIVATE _GNU_SOURCE)
  target_compile_options(${t} PRIVATE -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes)
endforeach()
