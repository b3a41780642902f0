#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# mutations.sh: shows that the gpu tests, run against the CUDA driver double, catch a broken
# cuda backend. Builds a scratch copy of this tree (only the library, the double and the gpu
# test binaries), checks that the gpu tests pass on it, then breaks it one way at a time and
# checks that they fail:
#   set_access    vmm/cuda.c never calls cuMemSetAccess (mapped memory stays inaccessible)
#   leak_classic  pools/segment.c forgets the handle when a classic segment's map fails
#   leak_pages    pools/pages.c forgets the chunk whose map failed in an expandable growth
#   not_ready     vmm/cuda.c takes CUDA_ERROR_NOT_READY from cuEventQuery for "done"
#   copy_back     vmm/cuda.c's data-check copy runs the wrong way (copy_in reads the device)
#   unmap_noop    vmm/cuda.c's unmap never calls cuMemUnmap
#   release_noop  vmm/cuda.c's release never calls cuMemRelease
#   import_fd     vmm/cuda.c imports another fd than the one it was given
#   location_dev  vmm/cuda.c puts the CUdevice handle, not the ordinal, in CUmemLocation.id
#   proc_version  vmm/cuda.c asks cuGetProcAddress for cuda.h's version, not the driver's
#   deinit_warns  vmm/cuda.c takes CUDA_ERROR_DEINITIALIZED (driver shut down) as a failure
# Exits non-zero if the unbroken copy fails or any broken copy passes.
# Usage: tests/cuda_double/mutations.sh [SCRATCH_DIR]   (default: a new temporary folder)
# MUTANTS="name ..." runs only those (CI runs the first four: set_access leak_classic
# leak_pages not_ready); unset or "all": every mutant above.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-$(mktemp -d)}
copy=$work/src
build=$work/build
jobs=${JOBS:-2}
mkdir -p "$copy"
# tracked and untracked-but-not-ignored files: the working tree as it is
(cd "$src" && git ls-files -co --exclude-standard -z | xargs -0 tar cf -) | tar xf - -C "$copy"
cmake -S "$copy" -B "$build" -DCMAKE_BUILD_TYPE=Release -DEXPSEG_BUILD_BENCH=OFF \
  -DEXPSEG_BUILD_TORCH=OFF -DEXPSEG_TEST_CUDA_DOUBLE=ON >/dev/null
if [ ! -f "$build/tests/cuda_double/Makefile" ] && [ ! -f "$build/tests/cuda_double/build.ninja" ]; then
  echo "mutations: skipped: no cuda.h here, so neither the cuda backend nor the double is built"
  exit 0
fi
targets="cuda_double test_cuda_double test_gpu_vmm test_gpu_calls test_gpu_busy
         test_gpu_reliability test_gpu_streams test_gpu_devices test_gpu_host_pool test_gpu_ipc
         test_gpu_adv16"

# mutate FILE OLD NEW: replace the one occurrence of OLD (fails when OLD is not there once)
mutate() {
  python3 - "$copy/$1" "$2" "$3" <<'EOF'
import sys
path, old, new = sys.argv[1:4]
text = open(path).read()
if text.count(old) != 1:
    sys.exit(f"mutations.sh: {path}: the text to break occurs {text.count(old)} times, not once")
open(path, "w").write(text.replace(old, new))
EOF
}

build_copy() { # a copy that does not build is an error of this script, not a catch
  # shellcheck disable=SC2086
  if ! cmake --build "$build" -j"$jobs" --target $targets >"$work/build.log" 2>&1; then
    tail -n 20 "$work/build.log"
    echo "mutations: the copy does not build"
    exit 2
  fi
}

run_gpu_tests() { # 0 when every gpu test passes
  build_copy
  EXPSEG_TEST_OPS=5000 ctest --test-dir "$build" -L gpu -j"$jobs" --timeout 60 \
    >"$work/ctest.log" 2>&1
}

echo "mutations: scratch copy in $work"
if ! run_gpu_tests; then
  tail -n 30 "$work/ctest.log"
  echo "mutations: the unbroken copy fails its gpu tests; nothing to compare with"
  exit 1
fi
echo "mutations: unbroken: every gpu test passes"

survivors=0
check() { # NAME FILE OLD NEW
  local name=$1 file=$2
  case " ${MUTANTS:-all} " in
    *" all "* | *" $name "*) ;;
    *) echo "mutations: $name: not run (MUTANTS=$MUTANTS)"; return 0 ;;
  esac
  cp "$copy/$file" "$work/saved"
  mutate "$file" "$3" "$4"
  if run_gpu_tests; then
    echo "mutations: $name: SURVIVED (every gpu test passed with $file broken)"
    survivors=$((survivors + 1))
  else
    echo "mutations: $name: caught by"
    { grep -E '^\s+[0-9]+ - ' "$work/ctest.log" | grep -v '(Skipped)' | sed 's/^/    /' | head -n 12; } || true
  fi
  cp "$work/saved" "$copy/$file"
}

check set_access vmm/cuda.c \
  'r = cu.cuMemSetAccess((CUdeviceptr)addr, size, &d, 1);' \
  'r = ((void)addr, (void)size, CUDA_SUCCESS); /* mutant */'
check leak_classic pools/segment.c \
  'if (created) it.h = h, it.size_h = size;' \
  'if (created && 0) it.h = h, it.size_h = size; /* mutant */'
check leak_pages pools/pages.c \
  'put_back(a, s, c + done, m - done); /* never mapped */' \
  'if (m - done > 1) put_back(a, s, c + done + 1, m - done - 1); /* mutant */'
check not_ready vmm/cuda.c \
  '*done = r != CUDA_ERROR_NOT_READY;' \
  '*done = true; /* mutant */'
check copy_back vmm/cuda.c \
  'CUresult r = to_device ? cu.cuMemcpyHtoD' \
  'CUresult r = /* mutant */ !to_device ? cu.cuMemcpyHtoD'
check unmap_noop vmm/cuda.c \
  'CUresult r = cu.cuMemUnmap((CUdeviceptr)addr, size);' \
  'CUresult r = ((void)addr, (void)size, CUDA_SUCCESS); /* mutant */'
check release_noop vmm/cuda.c \
  'CUresult r = cu.cuMemRelease((CUmemGenericAllocationHandle)h);' \
  'CUresult r = ((void)h, CUDA_SUCCESS); /* mutant */'
check import_fd vmm/cuda.c \
  'cu.cuMemImportFromShareableHandle(&gh, (void *)(uintptr_t)fd,' \
  'cu.cuMemImportFromShareableHandle(&gh, (void *)(uintptr_t)(fd + 1) /* mutant */,'

check location_dev vmm/cuda.c \
  'p.location.id = c->ordinal;' \
  'p.location.id = c->dev; /* mutant */'
check proc_version vmm/cuda.c \
  'int ask = ver < CUDA_VERSION ? ver : CUDA_VERSION;' \
  'int ask = CUDA_VERSION; /* mutant */'
check deinit_warns vmm/cuda.c \
  'return r == CUDA_SUCCESS || r == CUDA_ERROR_DEINITIALIZED ? EXPSEG_OK : cu_fail(r, call, detail);' \
  'return r == CUDA_SUCCESS ? EXPSEG_OK : cu_fail(r, call, detail); /* mutant */'

# restore the copy's build to the unbroken sources
touch "$copy/vmm/cuda.c" "$copy/pools/segment.c" "$copy/pools/pages.c"
if [ "$survivors" -ne 0 ]; then
  echo "mutations: $survivors mutant(s) survived"
  exit 1
fi
echo "mutations: every mutant was caught"
