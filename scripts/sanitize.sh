#!/usr/bin/env bash
# The test suite under AddressSanitizer (with LeakSanitizer) and UndefinedBehaviorSanitizer:
# installs what is missing, builds every target into build-asan/ with
# -DSTRATA_SANITIZE=address,undefined (-O1 -g), and runs every test under ctest. Any sanitizer
# report fails the test that triggered it. The allocation-counting tests report skipped: ASan owns
# malloc (tests/alloc_hooks.h).
#
#   scripts/sanitize.sh [CTEST_ARGS...]     e.g. -R Engine to run a part of the suite
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# shellcheck source=packages.sh
. scripts/packages.sh
install_missing_packages

# Warnings stay warnings: GCC's flow analysis under -fsanitize gives false positives
# (-Wmaybe-uninitialized, -Wstringop-overflow) that the Release build does not have.
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Release -DSTRATA_SANITIZE=address,undefined \
  -DSTRATA_WERROR=OFF > build-asan.log 2>&1 || { cat build-asan.log; exit 1; }
cmake --build build-asan -j"$(nproc)" >> build-asan.log 2>&1 || { tail -50 build-asan.log; exit 1; }

# mpirun passes these to its ranks (-x, tests/CMakeLists.txt); the strata CLI's ranks inherit them.
# LeakSanitizer runs at every exit; scripts/lsan.supp exempts what OpenMPI keeps until exit, by
# module, which needs each allocation's whole stack: OpenMPI has no frame pointers, so the fast
# unwinder stops at its first frame (fast_unwind_on_malloc=0: DWARF unwinding, slower).
# allocator_may_return_null=1: an impossible allocation returns null as glibc's does, instead of
# aborting, so that the tests of strata's out-of-memory errors still see them.
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:allocator_may_return_null=1:check_initialization_order=1:strict_init_order=1
export LSAN_OPTIONS=suppressions=$root/scripts/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
# The gtest-discovered tests' limit; the others have their own TIMEOUT, scaled for a sanitizer
# build (STRATA_TIMEOUT_SCALE in tests/CMakeLists.txt).
cd build-asan && ctest --output-on-failure --timeout 3000 -j1 "$@"
