# tools.cmake: expseg-replay and the microbenchmarks; included by bench/CMakeLists.txt
# (which defines expseg_traces: the trace readers, synth.c and the replay core
# synth_replay.c). Results and how to reproduce them: docs/benchmarks.md.
add_executable(expseg-replay ${CMAKE_CURRENT_LIST_DIR}/replay.c)
target_link_libraries(expseg-replay PRIVATE expseg_traces expseg_internal)

foreach(b hit grow driver host)
  add_executable(expseg-bench-${b} ${CMAKE_CURRENT_LIST_DIR}/bench_${b}.c)
  target_link_libraries(expseg-bench-${b} PRIVATE expseg_traces expseg_internal)
endforeach()

foreach(t expseg-replay expseg-bench-hit expseg-bench-grow expseg-bench-driver expseg-bench-host)
  target_compile_definitions(${t} PRIVATE _GNU_SOURCE)
  target_compile_options(${t} PRIVATE -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes)
endforeach()
