# SPDX-License-Identifier: Apache-2.0
# cmake -DROOT=<a source tree> -DALLOWED=<path|path|...> -DEXPECT=<pass|fail>
#       [-DNAMES=<path|...>] -P check_cuda_h.cmake
# Only vmm/cuda.c includes cuda.h (docs/design.md, "Layers"): in the library, the tools and
# the plug-in (base/ include/ vmm/ policy/ pools/ bench/ plugin/ examples/ under ROOT), an
# #include of cuda.h is allowed only in the ALLOWED files, paths relative to ROOT (the real
# tree: vmm/cuda.c); each of them must exist. tests/ is not scanned: test doubles may include
# cuda.h (tests/cuda_double/). EXPECT=pass: no breach (the real tree); EXPECT=fail: a breach
# is found and named (tests/walls/cuda_breach/, the control that the scan sees one), and
# every file of NAMES is among those named.
cmake_policy(SET CMP0057 NEW)
string(REPLACE "|" ";" allowed "${ALLOWED}")
set(breach "")
foreach(a ${allowed})
  if(NOT EXISTS ${ROOT}/${a})
    set(breach "${breach}\n  ${a}: allowed to include cuda.h but not in the tree (a stale list)")
  endif()
endforeach()
set(files "")
foreach(d base include vmm policy pools bench plugin examples)
  file(GLOB_RECURSE f ${ROOT}/${d}/*.c ${ROOT}/${d}/*.h ${ROOT}/${d}/*.cc ${ROOT}/${d}/*.cpp
       ${ROOT}/${d}/*.hpp)
  list(APPEND files ${f})
endforeach()
foreach(f ${files})
  file(RELATIVE_PATH rel ${ROOT} ${f})
  if(rel IN_LIST allowed)
    continue()
  endif()
  file(STRINGS ${f} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]*/)?cuda\\.h[>\"]")
  foreach(l ${lines})
    set(breach "${breach}\n  ${rel}: ${l}")
  endforeach()
endforeach()
if(EXPECT STREQUAL "pass" AND NOT breach STREQUAL "")
  message(FATAL_ERROR "cuda.h included outside ${ALLOWED}:${breach}")
elseif(EXPECT STREQUAL "fail")
  if(breach STREQUAL "")
    message(FATAL_ERROR "cuda.h: ${ROOT} holds a breach the scan did not see")
  endif()
  string(REPLACE "|" ";" names "${NAMES}")
  foreach(n ${names})
    string(FIND "${breach}" "\n  ${n}: " at)
    if(at EQUAL -1)
      message(FATAL_ERROR "cuda.h: the scan did not name ${n}:${breach}")
    endif()
  endforeach()
endif()
message(STATUS "cuda.h (${EXPECT}), ${ROOT}:${breach}")
