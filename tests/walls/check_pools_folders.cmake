# SPDX-License-Identifier: Apache-2.0
# cmake -DPOOLS=<a pools/ folder> -DEXPECT=<pass|fail> -P check_pools_folders.cmake
# The folders inside pools/ (docs/design.md, "Inside pools/"), one include path for all
# three, so the wall is on the include lines: the core (pools/*.c, *.h) includes nothing of
# host/ and, of observe/, only history.h (the history hooks, from internal.h); observe/
# includes nothing of host/; host/ includes nothing of observe/. EXPECT=pass: no breach
# (the real tree); EXPECT=fail: a breach is found and named (tests/walls/pools_breach/,
# the control that the scan sees one).
set(breach "")
function(_scan files regex allow)
  foreach(f ${files})
    file(STRINGS ${f} lines REGEX "${regex}")
    foreach(l ${lines})
      if(allow STREQUAL "" OR NOT l MATCHES "${allow}")
        set(breach "${breach}\n  ${f}: ${l}")
      endif()
    endforeach()
  endforeach()
  set(breach "${breach}" PARENT_SCOPE)
endfunction()
file(GLOB core ${POOLS}/*.c ${POOLS}/*.h)
file(GLOB observe ${POOLS}/observe/*.c ${POOLS}/observe/*.h)
file(GLOB host ${POOLS}/host/*.c ${POOLS}/host/*.h)
_scan("${core}" "^#include \"(host|observe)/" "^#include \"observe/history\\.h\"")
_scan("${observe}" "^#include \"(\\.\\./)?host/|^#include \"host_pool\\.h\"" "")
_scan("${host}" "^#include \"(\\.\\./)?observe/|^#include \"(history|walk)\\.h\"" "")
if(EXPECT STREQUAL "pass" AND NOT breach STREQUAL "")
  message(FATAL_ERROR "pools/ folders: an include crosses a wall:${breach}")
elseif(EXPECT STREQUAL "fail" AND breach STREQUAL "")
  message(FATAL_ERROR "pools/ folders: ${POOLS} holds a breach the scan did not see")
endif()
message(STATUS "pools/ folders (${EXPECT}):${breach}")
