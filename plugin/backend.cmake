# SPDX-License-Identifier: Apache-2.0
# backend.cmake: libexpseg_torch_backend.so, the C++ backend (plugin/backend.cpp): a
# CUDAAllocator subclass that makes expseg PyTorch's CUDA allocator (docs/torch.md, "The C++
# backend"). Included by the top-level CMakeLists.txt only with -DEXPSEG_WITH_TORCH=ON.
# PyTorch's CMake package comes from Torch_DIR, else from the python3 on PATH
# (torch.utils.cmake_prefix_path). The library lands next to libexpseg_torch.so with a
# .torch_version file naming the PyTorch it was built against: python/_expseg_cxx.py loads
# it instead of compiling when that matches the running PyTorch.
if(NOT TARGET expseg_torch)
  message(FATAL_ERROR "EXPSEG_WITH_TORCH=ON needs the C plug libexpseg_torch.so: configure "
                      "with -DEXPSEG_BUILD_TORCH=ON (the default)")
endif()
if(NOT Torch_DIR)
  find_program(EXPSEG_PYTHON3 python3)
  if(EXPSEG_PYTHON3)
    execute_process(COMMAND ${EXPSEG_PYTHON3} -c "import torch; print(torch.utils.cmake_prefix_path)"
                    OUTPUT_VARIABLE _expseg_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _expseg_torch_rc ERROR_QUIET)
    if(_expseg_torch_rc EQUAL 0 AND _expseg_torch_prefix)
      list(APPEND CMAKE_PREFIX_PATH ${_expseg_torch_prefix})
    endif()
  endif()
endif()
find_package(Torch QUIET)
if(NOT Torch_FOUND)
  message(FATAL_ERROR "EXPSEG_WITH_TORCH=ON: PyTorch's CMake package (TorchConfig.cmake) was "
                      "not found: python3 -c 'import torch' failed or Torch_DIR is not set. "
                      "Install PyTorch for the python3 on PATH, or pass -DTorch_DIR=<dir holding "
                      "TorchConfig.cmake> (python3 -c 'import torch; print(torch.utils."
                      "cmake_prefix_path)' + /Torch), or configure with -DEXPSEG_WITH_TORCH=OFF")
endif()
if(Torch_VERSION VERSION_LESS 2.10)
  message(FATAL_ERROR "EXPSEG_WITH_TORCH=ON: PyTorch ${Torch_VERSION} found; the C++ backend "
                      "needs 2.10 or later (older releases: the CUDAPluggableAllocator route, "
                      "libexpseg_torch.so)")
endif()
enable_language(CXX)

add_library(expseg_torch_backend SHARED ${CMAKE_CURRENT_LIST_DIR}/backend.cpp)
get_target_property(_expseg_plug_dir expseg_torch BINARY_DIR)
set_target_properties(expseg_torch_backend PROPERTIES
                      CXX_VISIBILITY_PRESET hidden
                      LIBRARY_OUTPUT_DIRECTORY ${_expseg_plug_dir} INSTALL_RPATH "$ORIGIN")
# C++17 at least; PyTorch's own targets raise it when its headers need more.
target_compile_features(expseg_torch_backend PRIVATE cxx_std_17)
target_include_directories(expseg_torch_backend PRIVATE ${CMAKE_CURRENT_LIST_DIR})
separate_arguments(_expseg_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(expseg_torch_backend PRIVATE ${_expseg_torch_flags} -Wall -Wextra)
target_link_libraries(expseg_torch_backend PRIVATE expseg_torch expseg_shared ${TORCH_LIBRARIES})
# What python/_expseg_cxx.py checks before loading the prebuilt library.
file(GENERATE OUTPUT ${_expseg_plug_dir}/libexpseg_torch_backend.so.torch_version
     CONTENT "torch ${Torch_VERSION}\nexpseg ${PROJECT_VERSION}\n")
message(STATUS "expseg: C++ backend against PyTorch ${Torch_VERSION} (${Torch_DIR})")

if(EXPSEG_INSTALL)
  include(GNUInstallDirs)
  install(TARGETS expseg_torch_backend LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(FILES ${_expseg_plug_dir}/libexpseg_torch_backend.so.torch_version
          DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
