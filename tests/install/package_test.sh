#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# package_test.sh MODE BUILD_DIR SOURCE_DIR WORK_DIR: the packaging tests (tests.cmake).
#  install:    cmake --install BUILD_DIR into WORK_DIR/prefix, check what is there, then build
#              and run tests/install/consumer/main.c four ways: CMake package shared and
#              static, pkg-config shared and static (docs/build.md shows each).
#              Then pkg-config --static --libs alone links a consumer against a copy of the
#              prefix holding only the static library; the docs and man pages are there;
#              the uninstall target removes everything the install wrote.
#  subproject: configure and build tests/install/parent (add_subdirectory of SOURCE_DIR, with
#              -DBUILD_SHARED_LIBS=OFF: expseg::expseg must be the static library) and
#              configure SOURCE_DIR with -DEXPSEG_BUILD_TESTS=OFF, GoogleTest unfindable in
#              both (CMAKE_DISABLE_FIND_PACKAGE_GTest).
# Environment: CMAKE (cmake), CC (C compiler), BENCH and TORCH (ON when the tools and
# libexpseg_torch.so were built).
set -euo pipefail
mode=$1 build=$2 src=$3 work=$4
cmake=${CMAKE:-cmake}
cc=${CC:-cc}
rm -rf "$work"
mkdir -p "$work"
say() { printf -- '-- %s\n' "$*"; }
fail() { printf 'FAILED: %s\n' "$*" >&2; exit 1; }
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
check_linked() { # BINARY shared|static
  if [ "$2" = shared ]; then
    needed "$1" | grep -qx 'libexpseg.so.0' || fail "$1 does not need libexpseg.so.0"
  else
    if needed "$1" | grep -q libexpseg; then fail "$1 needs libexpseg dynamically"; fi
  fi
}

if [ "$mode" = subproject ]; then
  say "add_subdirectory(expseg) without GoogleTest"
  "$cmake" -S "$src/tests/install/parent" -B "$work/parent" -DEXPSEG_SOURCE_DIR="$src" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DBUILD_SHARED_LIBS=OFF \
    >"$work/parent.log" 2>&1 ||
    { cat "$work/parent.log"; fail "configure as a subproject"; }
  "$cmake" --build "$work/parent" -j2 --target consumer >>"$work/parent.log" 2>&1 ||
    { cat "$work/parent.log"; fail "build as a subproject"; }
  check_linked "$work/parent/consumer" static # BUILD_SHARED_LIBS=OFF honoured
  "$work/parent/consumer" subproject
  say "top level with -DEXPSEG_BUILD_TESTS=OFF without GoogleTest"
  "$cmake" -S "$src" -B "$work/top" -DEXPSEG_BUILD_TESTS=OFF -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON >"$work/top.log" 2>&1 ||
    { cat "$work/top.log"; fail "configure with EXPSEG_BUILD_TESTS=OFF"; }
  echo "subproject and tests-off configures need no GoogleTest: ok"
  exit 0
fi

[ "$mode" = install ] || fail "mode '$mode': expected install or subproject"
prefix=$work/prefix
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" ||
  { cat "$work/install.log"; fail "cmake --install"; }
lib=$(dirname "$(find "$prefix" -name libexpseg.a | head -n 1)")
[ -d "$lib" ] || fail "no libexpseg.a under $prefix"
say "installed into $prefix (libraries in ${lib#"$prefix"/})"
rel=${lib#"$prefix"/}
want=(include/expseg.h "$rel/libexpseg.so.0.1.0" "$rel/cmake/expseg/expsegConfig.cmake"
      "$rel/pkgconfig/expseg.pc")
[ -e "$src/include/expseg_testing.h" ] && want+=(include/expseg_testing.h)
if [ "${TORCH:-ON}" = ON ]; then
  want+=(include/expseg_torch.h "$rel/libexpseg_torch.so" share/expseg/python/expseg.py
        share/expseg/python/expseg_interop.py)
fi
for f in "${want[@]}"; do
  [ -e "$prefix/$f" ] || fail "not installed: $f"
done
if [ "${TORCH:-ON}" = ON ]; then # loadable from its installed place (RUNPATH $ORIGIN)
  readelf -d "$lib/libexpseg_torch.so" | grep -q 'R.*PATH.*\[\$ORIGIN\]' ||
    fail "libexpseg_torch.so has no RUNPATH \$ORIGIN"
fi
if [ "${BENCH:-ON}" = ON ]; then
  for t in expseg-replay expseg-bench-hit expseg-bench-grow expseg-bench-driver; do
    [ -x "$prefix/bin/$t" ] || fail "not installed: bin/$t"
    "$prefix/bin/$t" --version | grep -q "$t" || fail "$t --version"
  done
fi
[ "$(readlink "$lib/libexpseg.so")" = libexpseg.so.0 ] || fail "libexpseg.so -> libexpseg.so.0"
[ "$(readlink "$lib/libexpseg.so.0")" = libexpseg.so.0.1.0 ] || fail "libexpseg.so.0 -> 0.1.0"
readelf -d "$lib/libexpseg.so.0.1.0" | grep -q 'SONAME.*\[libexpseg.so.0\]' || fail "SONAME"
grep -qx 'Requires.private: hwloc' "$lib/pkgconfig/expseg.pc" || fail "Requires.private: hwloc"
grep -qx 'License: Apache-2.0' "$lib/pkgconfig/expseg.pc" || fail "expseg.pc: License"
grep -q 'set(expseg_LICENSE "Apache-2.0")' "$lib/cmake/expseg/expsegConfig.cmake" ||
  fail "expsegConfig.cmake: expseg_LICENSE"
for f in share/doc/expseg/LICENSE share/doc/expseg/README.md share/doc/expseg/CHANGELOG.md \
         share/doc/expseg/docs/build.md; do
  [ -e "$prefix/$f" ] || fail "not installed: $f"
done
if [ "${BENCH:-ON}" = ON ]; then
  for t in expseg-replay expseg-bench-hit expseg-bench-grow expseg-bench-driver; do
    [ -s "$prefix/share/man/man1/$t.1" ] || fail "no man page: share/man/man1/$t.1"
  done
fi

for kind in shared static; do
  say "CMake package, $kind"
  use_static=OFF
  [ $kind = static ] && use_static=ON
  "$cmake" -S "$src/tests/install/consumer" -B "$work/cmake-$kind" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_COMPILER="$cc" -DEXPSEG_USE_STATIC=$use_static >"$work/cmake-$kind.log" 2>&1 ||
    { cat "$work/cmake-$kind.log"; fail "configure the consumer ($kind)"; }
  "$cmake" --build "$work/cmake-$kind" >>"$work/cmake-$kind.log" 2>&1 ||
    { cat "$work/cmake-$kind.log"; fail "build the consumer ($kind)"; }
  check_linked "$work/cmake-$kind/consumer" $kind
  "$work/cmake-$kind/consumer" "cmake, $kind"
done

export PKG_CONFIG_PATH=$lib/pkgconfig
pkg-config --exists expseg || fail "pkg-config does not find expseg"
[ "$(pkg-config --modversion expseg)" = 0.1.0 ] || fail "pkg-config --modversion"
say "pkg-config, shared"
# shellcheck disable=SC2046
"$cc" "$src/tests/install/consumer/main.c" -o "$work/pc-shared" $(pkg-config --cflags expseg) \
  $(pkg-config --libs expseg) -Wl,-rpath,"$(pkg-config --variable=libdir expseg)"
check_linked "$work/pc-shared" shared
"$work/pc-shared" "pkg-config, shared"
say "pkg-config, static"
# shellcheck disable=SC2046
"$cc" "$src/tests/install/consumer/main.c" -o "$work/pc-static" $(pkg-config --cflags expseg) \
  "$(pkg-config --variable=libdir expseg)/libexpseg.a" \
  $(pkg-config --static --libs-only-l expseg | sed 's/-lexpseg\b//')
check_linked "$work/pc-static" static
"$work/pc-static" "pkg-config, static"
say "pkg-config --static --libs alone, a prefix with only the static library"
sp=$work/static-prefix
mkdir -p "$sp/$rel/pkgconfig"
cp -r "$prefix/include" "$sp/"
cp "$lib/libexpseg.a" "$sp/$rel/"
cp "$lib/pkgconfig/expseg.pc" "$sp/$rel/pkgconfig/"
# hwloc.pc's own Libs.private (-ludev on Debian) need their -dev packages: said, not failed
absent=""
for l in $(PKG_CONFIG_PATH=$sp/$rel/pkgconfig pkg-config --static --libs-only-l expseg); do
  n=${l#-l}
  [ "$n" = expseg ] && continue
  [ "$("$cc" -print-file-name="lib$n.so")" != "lib$n.so" ] ||
    [ "$("$cc" -print-file-name="lib$n.a")" != "lib$n.a" ] || absent="$absent lib$n"
done
if [ -n "$absent" ]; then
  say "not linked: pkg-config --static names libraries not installed here:$absent" \
      "(hwloc's static dependencies: apt-get install libudev-dev)"
else
  # shellcheck disable=SC2046
  "$cc" "$src/tests/install/consumer/main.c" -o "$work/pc-static-only" \
    $(PKG_CONFIG_PATH=$sp/$rel/pkgconfig pkg-config --static --cflags --libs expseg) ||
    fail "pkg-config --static --libs expseg does not link a static consumer"
  check_linked "$work/pc-static-only" static
  "$work/pc-static-only" "pkg-config --static"
fi
if [ "${TORCH:-ON}" = ON ] && command -v python3 >/dev/null; then
  say "installed python helper finds the installed libexpseg_torch.so"
  got=$(env -u EXPSEG_TORCH_LIB EXPSEG_DRIVER=host:capacity=16M \
        PYTHONPATH="$prefix/share/expseg/python" python3 -c \
        'import expseg; print(expseg.library_path(), expseg.memory_stats(0)["allocation.all.current"]); assert expseg.cupy_allocator.__module__ == "expseg_interop"')
  [ "$got" = "$(cd "$lib" && pwd)/libexpseg_torch.so 0" ] || fail "python helper: got '$got'"
fi
say "uninstall removes what the install wrote"
"$cmake" --build "$build" --target uninstall >"$work/uninstall.log" 2>&1 ||
  { cat "$work/uninstall.log"; fail "uninstall target"; }
left=""
[ ! -d "$prefix" ] || left=$(find "$prefix" -type f -o -type l) # empty folders may go too
[ -z "$left" ] || fail "left after uninstall: $left"
echo "installed tree: 5 consumers built and run, uninstalled: ok"
