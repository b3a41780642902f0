# SPDX-License-Identifier: Apache-2.0
# tests/gpu_check/tests.cmake: the pieces of bench/gpu-check (included by tests/CMakeLists.txt).
# Each runs in seconds on the host driver (label cpu); with the CUDA driver double, the driver,
# device and sleep benchmarks also run on the cuda backend (label gpu), as bench/gpu-check runs
# them.
find_package(Python3 COMPONENTS Interpreter)
if(TARGET expseg-bench-driver AND TARGET expseg-bench-device AND TARGET expseg-bench-sleep AND
   Python3_Interpreter_FOUND)
  set(_gc ${CMAKE_CURRENT_SOURCE_DIR}/gpu_check/check_pieces.py)
  set(_gc_bin $<TARGET_FILE_DIR:expseg-bench-driver>)
  foreach(piece driver device sleep report args)
    add_test(NAME gpu_check_${piece} COMMAND ${Python3_EXECUTABLE} ${_gc} ${piece} ${_gc_bin}
                                             ${PROJECT_SOURCE_DIR})
    set_tests_properties(gpu_check_${piece} PROPERTIES LABELS cpu TIMEOUT 120)
  endforeach()
  if(TARGET cuda_double)
    foreach(piece driver device sleep)
      add_test(NAME gpu_check_${piece}_cuda COMMAND ${Python3_EXECUTABLE} ${_gc} ${piece} ${_gc_bin}
                                                    ${PROJECT_SOURCE_DIR} cuda)
      set_tests_properties(gpu_check_${piece}_cuda PROPERTIES LABELS gpu TIMEOUT 120
                           ENVIRONMENT "${EXPSEG_GPU_TEST_ENV};EXPSEG_CUDA_DOUBLE=capacity=256M")
    endforeach()
  endif()
endif()
