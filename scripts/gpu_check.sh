#!/usr/bin/env bash
# The GPU check: one prepared run on the GPU machine (docs/gpu.md). Run there in the repository
# root, with $OUT set by the device tool and gpu_bundle/ carried (scripts/gpu_bundle.sh, here):
#
#   bash scripts/gpu_check.sh
#
# Stages, each with its own time limit, log and PASS / FAIL / SKIP; a failing stage does not
# stop the ones after it, and the whole run keeps under GPU_CHECK_DEADLINE_S (default 450 s, the
# device tool's call is sized for 8 minutes):
#   machine             nvidia-smi, driver, nvcc, compilers, CMake, compute-sanitizer, PyTorch, lscpu
#   unpack              gpu_bundle/*.deb unpacked (dpkg -x) into a prefix; the libraries the machine
#                       lacks are put on LD_LIBRARY_PATH (those it has, it keeps)
#   configure           cmake, Release, -DSTRATA_CUDA_ARCHITECTURES=90, -DSTRATA_REPORT=OFF (no
#                       cairo there), against the prefix
#   build               strata and the GPU test binaries (test_gpu*), all cores
#   build_all           every other target (in the background, nice 19)
#   gpu_gemm            bench/gpu_gemm.py: the bf16 GEMM peak and GPT-2's GEMM shapes
#   ctest_gpu           ctest -L gpu (the CUDA ops against the CPU backend, training through the CLI)
#   sanitize_memcheck   compute-sanitizer --tool memcheck on build/tests/test_gpu
#   sanitize_racecheck  compute-sanitizer --tool racecheck on build/tests/test_gpu
#   gpu_peer            bench/gpu_peer.py: PyTorch GPT-2-124M (eager, compile), Llama-1B
#   strata_train        strata's own training on the GPU: gpt2-124M, bf16, B=16, T=1024
#   strata_llama        strata llama-1B, bf16, ZeRO-3, full recompute, T=2048: the largest of
#                       B=32/16/8 that fits, then dp 2 (two ranks sharing the GPU) at B=8 each
# While the build runs (GPU_CHECK_OVERLAP=1, the default) the GPU benchmarks run in the
# foreground; the build runs at nice 19 so that they keep the CPU they need to feed the GPU (their
# times are CUDA events on the GPU). GPU_CHECK_OVERLAP=0 runs everything one after another.
#
# Writes $OUT/gpu_results.txt (rewritten after every stage, summary table at its end),
# $OUT/gpu_logs.tar.gz (every stage's full log), $OUT/gpu_gemm.json and $OUT/gpu_peer.json.
# Without a GPU (no nvidia-smi, or it lists none) the GPU stages say so and SKIP; the build and
# the gpu-labelled tests still run (the tests skip themselves).
#
# Knobs (environment):
#   GPU_CHECK_DRY=1          stop after configure (what can be checked on a machine without a GPU)
#   GPU_CHECK_DEADLINE_S     the whole run's budget in seconds (450)
#   GPU_CHECK_BUILD_DIR      build directory (build)
#   GPU_CHECK_WORK           scratch: logs, the prefix, data (/tmp/gpu_check)
#   GPU_CHECK_JOBS           build parallelism (nproc)
#   GPU_CHECK_CMAKE_ARGS     more cmake arguments (split on spaces)
#   GPU_CHECK_WERROR         STRATA_WERROR for this build (OFF: the GPU machine's compiler may be
#                            newer than Debian 12's GCC 12 and warn where it did not; warnings
#                            are counted in the results)
#   GPU_CHECK_OVERLAP        1: GPU benchmarks while the build runs (default); 0: one at a time
#   GPU_CHECK_PYTHON         the Python with PyTorch (python3)
#   GPU_CHECK_NO_DEDUPE=1    put every bundled library on LD_LIBRARY_PATH, even those the system has
#   GPU_SANITIZE_FILTER      gtest filter for the sanitizer runs ('*-*Large*:*Stress*:*Bench*:*Perf*')
#   GPU_SANITIZE_TOOLS       which compute-sanitizer tools run (memcheck racecheck)
#   GPU_PEER_ARGS            extra arguments for bench/gpu_peer.py (e.g. --no-compile)
#   GPU_CHECK_SKIP           stages to skip (space-separated names, e.g. "gpu_peer" on a rerun)
#   GPU_CHECK_PEER_JSON      the PyTorch figures strata_train compares with when gpu_peer did not
#                            run (default: this run's gpu_peer.json)
set -uo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/.." || exit 1
repo=$(pwd)

# Stage order in the results (sanitize_<tool> for each of GPU_SANITIZE_TOOLS) and time limits (s).
read -r -a SAN_TOOLS <<<"${GPU_SANITIZE_TOOLS:-memcheck racecheck}"
STAGES=(machine unpack configure build build_all gpu_gemm ctest_gpu "${SAN_TOOLS[@]/#/sanitize_}"
        gpu_peer strata_train strata_llama)
# Typical run (a guess until the first one): 45 s to configure, then the GEMMs and the peer while
# the build runs, then the tests and sanitizers, strata last; about 7 minutes in all.
declare -A LIMIT=([machine]=40 [unpack]=60 [configure]=120 [build]=300 [build_all]=300
                  [gpu_gemm]=90 [ctest_gpu]=150 [gpu_peer]=170 [strata_train]=75
                  [strata_llama]=110)
for t in "${SAN_TOOLS[@]}"; do LIMIT[sanitize_$t]=75; done
LIMIT[sanitize_racecheck]=120

# ---------------------------------------------------------------------------------------------
# Stage bodies. Each runs in its own process (`bash gpu_check.sh --stage NAME`, under timeout),
# writes its full output to its log (stdout), a short section for the results file to $SECTION
# and a one-line note to $NOTE; exit 0 = PASS, 77 = SKIP, anything else = FAIL.
# ---------------------------------------------------------------------------------------------
note() { echo "$*" >"$NOTE"; }
section() { cat >>"$SECTION"; }
skip() { echo "SKIP: $*"; note "$*"; exit 77; }
need_gpu() { [ "$GPU_CHECK_HAVE_GPU" = 1 ] || skip "no GPU visible ($GPU_CHECK_NO_GPU_WHY)"; }
py() { env -u LD_LIBRARY_PATH -u OPAL_PREFIX PYTHONUNBUFFERED=1 "$GPU_CHECK_PY" "$@"; }

stage_machine() {
  {
    echo "## machine"
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "host: $(uname -srm); $( (. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME") || echo 'os unknown')"
    echo "glibc: $(ldd --version 2>/dev/null | head -1)"
    echo "cpu: $(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1), nproc $(nproc)"
    echo "memory: $(free -g 2>/dev/null | awk '/^Mem:/ {print $2 " GiB total, " $7 " GiB available"}')"
    if [ "$GPU_CHECK_HAVE_GPU" = 1 ]; then
      echo "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version,pstate,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,persistence_mode,compute_mode,mig.mode.current --format=csv,noheader 2>&1 | head -1)"
      echo "  (name, memory, driver, pstate, SM clock, max SM clock, memory clock, power, power limit, temperature, persistence, compute mode, MIG)"
      echo "cuda (driver): $(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)"
    else
      echo "NO GPU VISIBLE: $GPU_CHECK_NO_GPU_WHY. Every GPU stage below is skipped."
    fi
    echo "nvcc: ${GPU_CHECK_NVCC:-not found}$([ -n "$GPU_CHECK_NVCC" ] && "$GPU_CHECK_NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\), \(V[0-9.]*\).*/ (release \1, \2)/p')"
    echo "c++: $(c++ --version 2>/dev/null | head -1 || echo 'not found')"
    echo "cmake: $(cmake --version 2>/dev/null | head -1)"
    echo "ninja: $(ninja --version 2>/dev/null || echo 'not found'); make: $(make --version 2>/dev/null | head -1 || echo 'not found')"
    echo "compute-sanitizer: ${GPU_CHECK_SANITIZER:-not found}$([ -n "$GPU_CHECK_SANITIZER" ] && "$GPU_CHECK_SANITIZER" --version 2>/dev/null | sed -n 's/.*Version \(.*\)/ (\1)/p' | head -1)"
    echo "python: $(py -c 'import sys, torch; print(sys.executable, sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "gpus", torch.cuda.device_count())' 2>&1 | tail -1)"
    echo "repository: commit $(git -C "$repo" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$( [ -n "$(git -C "$repo" status --porcelain -- src tools tests CMakeLists.txt 2>/dev/null)" ] && echo ' + uncommitted changes in src/ tools/ tests/ or CMakeLists.txt')"
  } | tee /dev/stderr | section
  echo "---- full ----"
  if command -v nvidia-smi >/dev/null; then nvidia-smi; nvidia-smi -q | head -120; else echo "nvidia-smi: not found"; fi
  [ -n "$GPU_CHECK_NVCC" ] && "$GPU_CHECK_NVCC" --version
  lscpu
  free -g
  df -h /tmp "$repo" 2>/dev/null
  [ -n "$GPU_CHECK_SANITIZER" ] && "$GPU_CHECK_SANITIZER" --version
  ls -la /dev/nvidia* 2>/dev/null
  note "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || echo 'no GPU')"
  return 0
}

# A .deb without dpkg: the ar archive's data.tar.* unpacked by Python.
extract_deb_py() {
  "$GPU_CHECK_PY" - "$1" "$2" <<'EOF'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
data = open(deb, "rb").read()
assert data[:8] == b"!<arch>\n", deb + ": not an ar archive"
pos = 8
while pos + 60 <= len(data):
    hdr = data[pos:pos + 60]
    name = hdr[:16].decode().strip().rstrip("/")
    size = int(hdr[48:58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    pos += 60 + size + (size & 1)
    if name.startswith("data.tar"):
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as t:
            kw = {"filter": "fully_trusted"} if hasattr(tarfile, "data_filter") else {}
            t.extractall(dest, **kw)
EOF
}

stage_unpack() {
  local debs=("$repo"/gpu_bundle/*.deb)
  if [ ! -e "${debs[0]}" ]; then
    echo "## unpack" | section
    echo "no gpu_bundle/*.deb: the build uses the system's own packages (run scripts/gpu_bundle.sh where apt works and carry gpu_bundle)" | section
    skip "no gpu_bundle/: the system's own packages are used"
  fi
  rm -rf "$GPU_CHECK_PREFIX"
  mkdir -p "$GPU_CHECK_PREFIX/ldpath"
  local d how=dpkg-deb
  command -v dpkg-deb >/dev/null || how=python
  for d in "${debs[@]}"; do
    if [ $how = dpkg-deb ]; then dpkg-deb -x "$d" "$GPU_CHECK_PREFIX" || return 1
    else extract_deb_py "$d" "$GPU_CHECK_PREFIX" || return 1; fi
  done
  # Debian's update-alternatives links (mpirun -> mpirun.openmpi, ...), which dpkg -x does not
  # make: strata launch runs `mpirun` from PATH.
  for d in "$GPU_CHECK_PREFIX"/usr/bin/*.openmpi; do
    [ -e "${d%.openmpi}" ] || ln -s "$(basename "$d")" "${d%.openmpi}"
  done
  # Absolute symlinks inside the packages point into /: re-point them into the prefix.
  local l t
  while IFS= read -r l; do
    t=$(readlink "$l")
    ln -sfn "$GPU_CHECK_PREFIX$t" "$l"
    echo "re-pointed $l -> $GPU_CHECK_PREFIX$t"
  done < <(find "$GPU_CHECK_PREFIX/usr" -type l -lname '/*')
  # The libraries the system lacks go on LD_LIBRARY_PATH (ldpath/, one link per soname); those it
  # has (same soname: same ABI, its copy likely newer) stay the system's.
  # Keyed by soname (readelf), also where Debian makes the soname link in a maintainer script
  # (update-alternatives), which dpkg -x does not run; the soname links sort first.
  local sys_cache f so ours=() theirs=()
  local -A seen=()
  sys_cache=$(ldconfig -p 2>/dev/null || true)
  while IFS= read -r f; do
    if command -v readelf >/dev/null; then
      so=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p' | head -1)
    else
      so=$(basename "$f" | grep -E '^lib.*\.so\.[0-9]+$')
    fi
    if [ -z "$so" ] || [ -n "${seen[$so]:-}" ]; then continue; fi
    seen[$so]=1
    if [ "${GPU_CHECK_NO_DEDUPE:-0}" != 1 ] && grep -q "^[[:space:]]*$so (" <<<"$sys_cache"; then
      theirs+=("$so")
    else
      ln -sfn "$f" "$GPU_CHECK_PREFIX/ldpath/$so"
      ours+=("$so")
    fi
  done < <(find "$GPU_CHECK_PREFIX/usr/lib" \( -type f -o -type l \) -name 'lib*.so.*' |
           awk '{n = split($0, p, "/"); print length(p[n]), $0}' | sort -n | cut -d' ' -f2-)
  {
    echo "## unpack"
    echo "${#debs[@]} packages from gpu_bundle/ ($(du -shL "$repo/gpu_bundle" | cut -f1)) unpacked with $how into $GPU_CHECK_PREFIX ($(du -sh "$GPU_CHECK_PREFIX" | cut -f1))"
    echo "libraries from the bundle on LD_LIBRARY_PATH (${#ours[@]}): ${ours[*]:-none}"
    echo "bundled libraries left to the system's copies (${#theirs[@]}): ${theirs[*]:-none}"
  } | tee /dev/stderr | section
  note "${#debs[@]} packages; ${#ours[@]} libraries from the bundle, ${#theirs[@]} from the system"
}

stage_configure() {
  # strata report is left out (-DSTRATA_REPORT=OFF): the bundle carries no cairo (gpu_bundle.sh).
  local args=(-S "$repo" -B "$GPU_CHECK_BUILD" -DCMAKE_BUILD_TYPE=Release
              -DSTRATA_CUDA_ARCHITECTURES=90 -DSTRATA_WERROR="$GPU_CHECK_WERROR"
              -DSTRATA_REPORT=OFF)
  local cmv
  cmv=$(cmake --version | sed -n 's/^cmake version \([0-9][0-9.]*\).*/\1/p')
  # CMake 4 refuses package configs that declare compatibility with CMake < 3.5.
  [ "${cmv%%.*}" -ge 4 ] 2>/dev/null && args+=(-DCMAKE_POLICY_VERSION_MINIMUM=3.5)
  # CMake before 3.25.2 (Debian 12 has 3.25.1) does not know nvcc's C++20 flag ("Target
  # strata_kernels requires the language dialect CUDA20"); these name it for that CMake.
  if [ -n "$GPU_CHECK_NVCC" ] && [ "$(printf '%s\n' "$cmv" 3.25.2 | sort -V | head -1)" != 3.25.2 ]; then
    args+=(-DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20
           -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20)
  fi
  if [ ! -f "$GPU_CHECK_BUILD/CMakeCache.txt" ] && command -v ninja >/dev/null; then
    args+=(-G Ninja)
  fi
  [ -n "$GPU_CHECK_NVCC" ] && args+=(-DCMAKE_CUDA_COMPILER="$GPU_CHECK_NVCC")
  local p=$GPU_CHECK_PREFIX
  if [ -d "$p/usr" ]; then
    first() { find "$p/usr" \( -type f -o -type l \) -name "$1" 2>/dev/null | sort | head -1; }
    local gtest cli11 njson mpicxx mpicc mpiexec
    gtest=$(first GTestConfig.cmake); cli11=$(first CLI11Config.cmake)
    njson=$(first nlohmann_jsonConfig.cmake)
    mpicxx=$(first 'mpicxx.openmpi'); mpicc=$(first 'mpicc.openmpi'); mpiexec=$(first 'mpirun.openmpi')
    args+=(-DCMAKE_PREFIX_PATH="$p/usr"
           -DGTest_DIR="$(dirname "$gtest")" -DCLI11_DIR="$(dirname "$cli11")"
           -Dnlohmann_json_DIR="$(dirname "$njson")"
           -DMPI_CXX_COMPILER="$mpicxx" -DMPI_C_COMPILER="$mpicc" -DMPIEXEC_EXECUTABLE="$mpiexec"
           -DDNNL_LIB="$(first 'libdnnl.so')" -DDNNL_INCLUDE="$(dirname "$(first dnnl.hpp)")"
           -DPCRE2_LIB="$(first 'libpcre2-8.so')" -DPCRE2_INCLUDE="$(dirname "$(first pcre2.h)")"
           -DProtobuf_PROTOC_EXECUTABLE="$p/usr/bin/protoc" -DProtobuf_INCLUDE_DIR="$p/usr/include"
           -DProtobuf_LIBRARY="$(first 'libprotobuf.so')"
           -DProtobuf_LITE_LIBRARY="$(first 'libprotobuf-lite.so')"
           -DProtobuf_PROTOC_LIBRARY="$(first 'libprotoc.so')"
           "-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$p/ldpath"
           "-DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath-link,$p/ldpath")
  fi
  # NCCL: the toolkit's own when it has one; otherwise the one PyTorch's wheels bring
  # (nvidia-nccl-*: include/nccl.h and lib/libnccl.so.2, no unversioned link for find_library).
  local cuda_root
  cuda_root=$(dirname "$(dirname "${GPU_CHECK_NVCC:-/usr/local/cuda/bin/nvcc}")")
  if [ ! -f "$cuda_root/include/nccl.h" ] && [ ! -f /usr/include/nccl.h ]; then
    local site nccl_h nccl_so
    site=$(py -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
    # shellcheck disable=SC2086
    nccl_h=$( [ -n "$site" ] && find $site -path '*nvidia*' -name nccl.h 2>/dev/null | head -1)
    if [ -n "$nccl_h" ]; then
      nccl_so=$(find "$(dirname "$(dirname "$nccl_h")")" -name 'libnccl.so*' 2>/dev/null | sort | head -1)
      [ -n "$nccl_so" ] && args+=(-DNCCL_INCLUDE="$(dirname "$nccl_h")" -DNCCL_LIB="$nccl_so")
      echo "NCCL from the Python wheels: $nccl_h $nccl_so"
    else
      echo "no NCCL found: GPU collectives will be staged through MPI"
    fi
  fi
  # shellcheck disable=SC2206
  [ -n "${GPU_CHECK_CMAKE_ARGS:-}" ] && args+=($GPU_CHECK_CMAKE_ARGS)
  printf '%q ' cmake "${args[@]}"; echo
  cmake "${args[@]}"
  local rc=$?
  {
    echo "## configure"
    echo "cmake ${args[*]}" | sed "s|$p|\$PREFIX|g"
    echo "exit $rc"
    grep -E '^-- (strata:|Found MPI|Found OpenMP|Found GTest|Found CUDAToolkit|The CUDA compiler|The CXX compiler)' "$GPU_CHECK_LOG" | sed 's/^-- //'
    grep -E '^(CMAKE_GENERATOR|CMAKE_CUDA_COMPILER|CMAKE_CXX_COMPILER|MPI_CXX_COMPILER|MPIEXEC_EXECUTABLE|DNNL_LIB|PCRE2_LIB|GTest_DIR|CLI11_DIR|nlohmann_json_DIR|NCCL_INCLUDE|NCCL_LIB|STRATA_CUDA_ARCHITECTURES|STRATA_WERROR)[:=]' \
      "$GPU_CHECK_BUILD/CMakeCache.txt" 2>/dev/null | sed "s|$p|\$PREFIX|g"
    [ $rc -ne 0 ] && grep -E 'CMake Error|error' "$GPU_CHECK_LOG" | head -20
  } | section
  [ $rc -eq 0 ] || { note "cmake failed (exit $rc)"; return $rc; }
  if grep -q 'strata: CUDA backend for sm' "$GPU_CHECK_LOG"; then
    note "$(sed -n 's/^-- strata: //p' "$GPU_CHECK_LOG" | head -1)"
  else
    note "configured WITHOUT the CUDA backend (STRATA_CUDA=OFF or no nvcc) $(sed -n 's/^-- strata: //p' "$GPU_CHECK_LOG" | head -1)"
  fi
}

# Targets defined in the build tree (Ninja or Makefiles).
list_targets() {
  if [ -f "$GPU_CHECK_BUILD/build.ninja" ]; then
    ninja -C "$GPU_CHECK_BUILD" -t targets all 2>/dev/null | sed -n 's/^\([A-Za-z0-9_.+-]*\): phony$/\1/p'
  else
    make -C "$GPU_CHECK_BUILD" help 2>/dev/null | sed -n 's/^\.\.\. \([A-Za-z0-9_.+-]*\).*/\1/p'
  fi
}

build_summary() {  # label seconds rc
  local w
  w=$(grep -c 'warning:' "$GPU_CHECK_LOG" 2>/dev/null)
  {
    echo "## $1"
    echo "exit $3 after $2 s, $GPU_CHECK_JOBS jobs; lines mentioning a warning: ${w:-0}"
    grep -E 'warning:' "$GPU_CHECK_LOG" | sed 's/^.*warning: //' | sort | uniq -c | sort -rn | head -8
    [ "$3" -ne 0 ] && { echo "--- the first errors:"; grep -E 'error|Error' "$GPU_CHECK_LOG" | head -25; }
  } | section
}

stage_build() {
  local targets=(strata) t s rc
  while IFS= read -r t; do
    case $t in test_gpu*) targets+=("$t") ;; esac
  done < <(list_targets | sort -u)
  echo "targets: ${targets[*]}"
  s=$(date +%s)
  cmake --build "$GPU_CHECK_BUILD" -j "$GPU_CHECK_JOBS" --target "${targets[@]}"
  rc=$?
  build_summary "build (${targets[*]})" $(( $(date +%s) - s )) $rc
  if [ $rc -ne 0 ]; then note "build failed (exit $rc)"
  elif [ ${#targets[@]} -eq 1 ]; then note "built strata; no test_gpu target is defined yet"
  else note "built ${targets[*]}"; fi
  return $rc
}

stage_build_all() {
  local s rc
  s=$(date +%s)
  cmake --build "$GPU_CHECK_BUILD" -j "$GPU_CHECK_JOBS"
  rc=$?
  build_summary "build_all (every target)" $(( $(date +%s) - s )) $rc
  if [ $rc -eq 0 ]; then note "every target built"; else note "exit $rc"; fi
  return $rc
}

stage_gpu_gemm() {
  need_gpu
  rm -f "$OUT/gpu_gemm.json"
  py bench/gpu_gemm.py --json "$OUT/gpu_gemm.json"
  local rc=$?
  { echo "## gpu_gemm (bench/gpu_gemm.py; JSON: gpu_gemm.json)"
    grep -E '^(\||measured peak|GPT-2|forward rows|gpu_gemm)' "$GPU_CHECK_LOG"; echo "exit $rc"; } | section
  note "$(grep -m1 '^measured peak' "$GPU_CHECK_LOG" || tail -1 "$GPU_CHECK_LOG")"
  return $rc
}

stage_ctest_gpu() {
  [ -f "$GPU_CHECK_BUILD/CTestTestfile.cmake" ] || { note "no build tree"; return 1; }
  cd "$GPU_CHECK_BUILD" || return 1
  local n
  n=$(ctest -N -L gpu 2>/dev/null | sed -n 's/^Total Tests: *//p')
  if [ "${n:-0}" -eq 0 ]; then
    { echo "## ctest_gpu"; echo "no tests labelled gpu in this build (tests/gpu is not in tests/CMakeLists.txt yet)"; } | section
    skip "no tests labelled gpu in this build yet"
  fi
  ctest -L gpu --output-on-failure --timeout 120 -j1
  local rc=$?
  local skipped
  skipped=$(grep -c -E '\*\*\*Skipped|Skipped *[0-9.]+ sec' "$GPU_CHECK_LOG")
  {
    echo "## ctest_gpu (ctest -L gpu, $n tests)"
    grep -E 'tests passed|tests failed|Total Test time|\*\*\*Failed|\*\*\*Exception|\*\*\*Timeout|Not Run' "$GPU_CHECK_LOG" | head -40
    echo "skipped: $skipped"
    [ "$GPU_CHECK_HAVE_GPU" = 1 ] || echo "(no GPU: every test should report skipped)"
  } | section
  note "$(grep -m1 -E 'tests passed' "$GPU_CHECK_LOG" || echo "exit $rc"); skipped $skipped"
  return $rc
}

stage_sanitize() {  # tool
  local tool=$1
  need_gpu
  [ -n "$GPU_CHECK_SANITIZER" ] || skip "compute-sanitizer not found"
  local bin
  bin=$GPU_CHECK_BUILD/tests/test_gpu
  [ -x "$bin" ] || bin=$(find "$GPU_CHECK_BUILD" -name test_gpu -type f -perm -u+x 2>/dev/null | head -1)
  if [ -z "$bin" ] || [ ! -x "$bin" ]; then skip "no test_gpu binary (not defined or not built yet)"; fi
  local args=(--tool "$tool" --error-exitcode 86 --print-limit 30) filter=$GPU_SANITIZE_FILTER
  # racecheck runs the mma attention kernels many times slower: the bit-identity reruns (the
  # same kernels at a larger shape) are left to memcheck.
  if [ "$tool" = racecheck ]; then
    case $filter in *-*) filter="$filter:*GpuDeterminism*" ;; *) filter="$filter-*GpuDeterminism*" ;; esac
  fi
  echo "$GPU_CHECK_SANITIZER ${args[*]} $bin --gtest_filter=$filter"
  "$GPU_CHECK_SANITIZER" "${args[@]}" "$bin" --gtest_filter="$filter"
  local rc=$?
  {
    echo "## sanitize_$tool (compute-sanitizer --tool $tool, filter '$filter')"
    grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|\[  PASSED  \]|\[  FAILED  \]|\[  SKIPPED \] [0-9]+ tests?,|tests? from .* ran|not supported|Error:' "$GPU_CHECK_LOG" | head -30
    grep -E '^========= (Invalid|Race|Error|Uninitialized|Barrier|Warning)' "$GPU_CHECK_LOG" | sort | uniq -c | sort -rn | head -15
    echo "exit $rc"
  } | section
  if grep -qiE 'Device not supported|device is not supported' "$GPU_CHECK_LOG"; then
    skip "compute-sanitizer refused the device (a gVisor machine? ../.library/device/KINDS.md)"
  fi
  note "$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$GPU_CHECK_LOG" | sed 's/^=* *//' || echo "exit $rc")"
  return $rc
}
stage_sanitize_memcheck() { stage_sanitize memcheck; }
stage_sanitize_racecheck() { stage_sanitize racecheck; }
stage_sanitize_initcheck() { stage_sanitize initcheck; }
stage_sanitize_synccheck() { stage_sanitize synccheck; }

stage_gpu_peer() {
  need_gpu
  local peak=()
  [ -s "$OUT/gpu_gemm.json" ] && peak=(--peak-json "$OUT/gpu_gemm.json")
  local budget=$(( GPU_CHECK_STAGE_LIMIT - 20 ))
  rm -f "$OUT/gpu_peer.json"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  # shellcheck disable=SC2086
  py bench/gpu_peer.py "${peak[@]}" --json "$OUT/gpu_peer.json" --budget "$budget" ${GPU_PEER_ARGS:-}
  local rc=$?
  { echo "## gpu_peer (bench/gpu_peer.py; JSON: gpu_peer.json)"
    echo "load average at start: $(sed -n 's/^load average at start: //p' "$GPU_CHECK_LOG")$( [ -f "$GPU_CHECK_WORK/build_running" ] && echo ' (the build was running at nice 19)')"
    grep -E '^(\||peak for MFU|  llama micro-batch)' "$GPU_CHECK_LOG"; echo "exit $rc"; } | section
  note "$(grep -m1 -E '^gpt2-124M eager' "$GPU_CHECK_LOG" | tr -s ' ' || tail -1 "$GPU_CHECK_LOG")"
  return $rc
}

stage_strata_train() {
  local bin=$GPU_CHECK_BUILD/strata help
  [ -x "$bin" ] || { note "no strata binary at $bin"; echo "## strata_train" | section; echo "no strata binary" | section; return 1; }
  help=$("$bin" train --help 2>&1)
  if ! grep -q -- '--device' <<<"$help"; then
    { echo "## strata_train"; echo "strata training on CUDA: not built yet (strata train --help has no --device option)"; } | section
    skip "strata training on CUDA: not built yet"
  fi
  need_gpu
  local steps=20 out rc cmd=()
  if "$bin" bench --help 2>&1 | grep -q -- '--device'; then
    cmd=("$bin" bench --model gpt2-124M --dtype bf16 -b 16 -t 1024 --steps "$steps" --warmup 3 --device cuda)
  else
    # strata train on a byte-level dataset of this repository's own text (no downloads there).
    local data=$GPU_CHECK_WORK/strata_data cfg=$GPU_CHECK_WORK/strata_train_gpu.json
    rm -rf "$data" "$GPU_CHECK_WORK/strata_run"
    "$bin" data prepare --input "$repo/src" "$repo/docs" "$repo/tools" --output "$data" || {
      note "strata data prepare failed"; return 1; }
    cat >"$cfg" <<EOF
{
  "train_batch_size": 16,
  "train_micro_batch_size_per_gpu": 16,
  "gradient_clipping": 1.0,
  "steps_per_print": 1,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
  "model": {"preset": "gpt2-124M"},
  "data": {"path": "$data"},
  "train": {"steps": $steps, "seed": 1234, "run_dir": "$GPU_CHECK_WORK/strata_run"}
}
EOF
    cmd=("$bin" train --config "$cfg" --device cuda --steps "$steps")
  fi
  echo "${cmd[*]}"
  # Through tee: a run cut off by the stage's timeout still leaves its lines in the log.
  "${cmd[@]}" 2>&1 | tee "$GPU_CHECK_WORK/strata_train.out"
  rc=${PIPESTATUS[0]}
  out=$(cat "$GPU_CHECK_WORK/strata_train.out")
  # tokens/s: bench's median line, or the median of train's step lines after the first 5.
  local tps
  tps=$(sed -n 's/^bench .*tokens_per_s=\([0-9.]*\).*/\1/p' <<<"$out" | head -1)
  if [ -z "$tps" ]; then
    tps=$(sed -n 's/^step *\([0-9]*\)\/[0-9]* |.*| *\([0-9.]*\) tok\/s |.*/\1 \2/p' <<<"$out" |
          awk '$1 > 5 {print $2}' | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}')
  fi
  local mfu=""
  if [ -n "$tps" ]; then
    local peer_json=$OUT/gpu_peer.json
    [ -s "$peer_json" ] || peer_json=${GPU_CHECK_PEER_JSON:-$peer_json}
    mfu=$(py - "$tps" "$OUT/gpu_gemm.json" "$peer_json" <<'EOF'
import json, sys
tps = float(sys.argv[1])
fpt = 6 * 124475904 + 6 * 12 * 768 * 1024  # llm.c's FLOPs/token for gpt2-124M (bench/gpu_peer.py)
try:
    peak = json.load(open(sys.argv[2]))["peak_tflops"]; src = "measured"
except Exception:
    peak, src = 989.5, "datasheet"
s = "%.0f tok/s, MFU %.1f%% of %.0f TFLOP/s (%s)" % (tps, 100 * fpt * tps / (peak * 1e12), peak, src)
try:
    for r in json.load(open(sys.argv[3]))["rows"]:
        if r.get("status") == "ok" and r["config"].startswith("gpt2-124M"):
            s += "; strata / PyTorch %s (B=%d): %.2fx" % (r["config"].split()[-1], r["B"], tps / r["tokens_per_s"])
except Exception:
    pass
print(s)
EOF
)
  fi
  {
    echo "## strata_train (strata on the GPU: gpt2-124M, bf16, B=16, T=1024)"
    echo "${cmd[*]//$GPU_CHECK_WORK/\$WORK}"
    echo "exit $rc"
    grep -E '^(bench |step |note:|error|strata:)|rror' <<<"$out" | tail -6
    echo "${mfu:-no throughput line found}"
  } | section
  note "${mfu:-exit $rc}"
  return "$rc"
}

# strata's llama-1B as issue 23 asks: bf16, ZeRO-3, full recompute, T=2048, the largest
# micro-batch of 32/16/8 that fits; then data parallel 2 (two ranks sharing the one GPU, their
# collectives staged through host memory) for the exposed communication.
stage_strata_llama() {
  local bin=$GPU_CHECK_BUILD/strata
  [ -x "$bin" ] || { note "no strata binary"; return 1; }
  need_gpu
  local common=(--model llama-1B --dtype bf16 --steps 3 --warmup 1 --device cuda
                --set zero_optimization.stage=3
                --set 'activation_checkpointing.recompute_granularity="full"')
  local b fit="" line rc
  echo "## strata_llama (strata llama-1B, bf16, ZeRO-3, full recompute, T=2048)" | section
  for b in 32 16 8; do
    echo "$bin bench ${common[*]} -b $b"
    timeout -k 5 $(( GPU_CHECK_STAGE_LIMIT / 3 )) "$bin" bench "${common[@]}" -b "$b" 2>&1 |
      tee "$GPU_CHECK_WORK/llama_b$b.out"
    rc=${PIPESTATUS[0]}
    line=$(grep -m1 '^bench model=' "$GPU_CHECK_WORK/llama_b$b.out")
    if [ "$rc" = 0 ] && [ -n "$line" ]; then
      fit=$b
      { echo "B=$b: $line"; grep -m1 '^bench recompute' "$GPU_CHECK_WORK/llama_b$b.out"; } | section
      break
    fi
    echo "B=$b: exit $rc: $(grep -m1 -iE 'error|memory' "$GPU_CHECK_WORK/llama_b$b.out")" | section
  done
  [ -n "$fit" ] || { note "no micro-batch of 32/16/8 ran"; return 1; }
  local dp_line=""
  echo "$bin launch -n 2 -- bench ${common[*]} -b 8"
  timeout -k 5 $(( GPU_CHECK_STAGE_LIMIT / 2 )) "$bin" launch -n 2 -- bench "${common[@]}" -b 8 2>&1 |
    tee "$GPU_CHECK_WORK/llama_dp2.out"
  rc=${PIPESTATUS[0]}
  dp_line=$(grep -m1 '^bench model=' "$GPU_CHECK_WORK/llama_dp2.out")
  echo "dp 2 (two ranks on one GPU), B=8 each: exit $rc: ${dp_line:-$(grep -m1 -iE 'error' "$GPU_CHECK_WORK/llama_dp2.out")}" | section
  local exposed
  exposed=$(sed -n 's/.*step_s=\([0-9.]*\).*comm_exposed_s=\([0-9.]*\).*/\1 \2/p' <<<"$dp_line" |
            awk '{ if ($1 > 0) printf "exposed communication %.1f%% of the step", 100 * $2 / $1 }')
  [ -n "$exposed" ] && echo "$exposed" | section
  note "largest micro-batch $fit: $(sed -n 's/.*tokens_per_s=\([0-9]*\).*mfu=\([0-9.]*%\).*/\1 tok\/s, MFU \2/p' <<<"$(grep -m1 '^bench model=' "$GPU_CHECK_WORK/llama_b$fit.out")")${exposed:+; dp 2: $exposed}"
  return 0
}

if [ "${1:-}" = --stage ]; then
  "stage_$2"
  exit $?
fi

# ---------------------------------------------------------------------------------------------
# The driver.
# ---------------------------------------------------------------------------------------------
t_start=$(date +%s)
export OUT=${OUT:-/tmp/gpu_check_out}
export GPU_CHECK_WORK=${GPU_CHECK_WORK:-/tmp/gpu_check}
export GPU_CHECK_PREFIX=$GPU_CHECK_WORK/prefix
export GPU_CHECK_BUILD=${GPU_CHECK_BUILD_DIR:-$repo/build}
export GPU_CHECK_JOBS=${GPU_CHECK_JOBS:-$(nproc)}
export GPU_CHECK_WERROR=${GPU_CHECK_WERROR:-OFF}
export GPU_CHECK_PY=${GPU_CHECK_PYTHON:-python3}
export GPU_SANITIZE_FILTER=${GPU_SANITIZE_FILTER:-'*-*Large*:*Stress*:*Bench*:*Perf*'}
deadline=$(( t_start + ${GPU_CHECK_DEADLINE_S:-450} ))
dry=${GPU_CHECK_DRY:-0}
overlap=${GPU_CHECK_OVERLAP:-1}
mkdir -p "$OUT"
work=$GPU_CHECK_WORK
rm -rf "$work/logs" "$work/sections" "$work/notes" "$work/records" "$work/running" "$work/build_running"
mkdir -p "$work/logs" "$work/sections" "$work/notes" "$work/records" "$work/running"

# The tools, wherever this machine keeps them.
find_tool() {  # name [dirs...]
  local n=$1 d
  shift
  command -v "$n" 2>/dev/null && return 0
  for d in "$@"; do [ -x "$d/$n" ] && { echo "$d/$n"; return 0; }; done
  return 0
}
GPU_CHECK_NVCC=$(find_tool nvcc /usr/local/cuda/bin /usr/local/cuda-*/bin /opt/cuda/bin)
cuda_bin=$(dirname "${GPU_CHECK_NVCC:-/usr/local/cuda/bin/nvcc}")
GPU_CHECK_SANITIZER=$(find_tool compute-sanitizer "$cuda_bin" "$cuda_bin/../compute-sanitizer" \
                        /usr/local/cuda/compute-sanitizer /opt/nvidia/compute-sanitizer)
[ -n "$GPU_CHECK_SANITIZER" ] || GPU_CHECK_SANITIZER=$(find /usr/local /opt -maxdepth 5 -type f \
  -name compute-sanitizer -perm -u+x 2>/dev/null | head -1)
export GPU_CHECK_NVCC GPU_CHECK_SANITIZER
GPU_CHECK_HAVE_GPU=0
if ! command -v nvidia-smi >/dev/null; then GPU_CHECK_NO_GPU_WHY="nvidia-smi not found"
elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then GPU_CHECK_NO_GPU_WHY="nvidia-smi lists no GPU"
else GPU_CHECK_HAVE_GPU=1; GPU_CHECK_NO_GPU_WHY=""; fi
export GPU_CHECK_HAVE_GPU GPU_CHECK_NO_GPU_WHY
# The bundle's libraries and OpenMPI's relocation, for the build, the tests and strata (the Python
# benchmarks run without them).
if [ -d "$repo/gpu_bundle" ]; then
  export LD_LIBRARY_PATH=$GPU_CHECK_PREFIX/ldpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export OPAL_PREFIX=$GPU_CHECK_PREFIX/usr
  export PATH=$GPU_CHECK_PREFIX/usr/bin:$PATH  # this OpenMPI's mpirun, the one strata links
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

{
  echo "# scripts/gpu_check.sh: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), repository $(git -C "$repo" rev-parse --short=12 HEAD 2>/dev/null || echo '?')$( [ -n "$(git -C "$repo" status --porcelain -- src tools tests CMakeLists.txt 2>/dev/null)" ] && echo ' (+ uncommitted changes)')"
  echo "# host $(uname -n) $(uname -r), nproc $(nproc); GPU: $( [ "$GPU_CHECK_HAVE_GPU" = 1 ] && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1 || echo "NONE ($GPU_CHECK_NO_GPU_WHY)")"
  echo "# deadline ${GPU_CHECK_DEADLINE_S:-450} s, jobs $GPU_CHECK_JOBS, overlap $overlap, dry $dry, STRATA_WERROR=$GPU_CHECK_WERROR, build dir $GPU_CHECK_BUILD"
  [ "$GPU_CHECK_HAVE_GPU" = 1 ] || echo "# NO GPU VISIBLE ($GPU_CHECK_NO_GPU_WHY): the GPU stages are skipped."
  echo
} >"$work/header.txt"

order_of() { local i; for i in "${!STAGES[@]}"; do [ "${STAGES[$i]}" = "$1" ] && printf '%02d' $((i + 1)); done; }

# Records one stage's outcome: name status seconds note (records/NAME, read by finalize).
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >"$work/records/$1"; }

finalize() {
  local tmp=$OUT/.gpu_results.$BASHPID n f st
  {
    cat "$work/header.txt"
    for f in "$work"/sections/*.txt; do [ -f "$f" ] && { cat "$f"; echo; }; done
    echo "## summary (seconds from the start of the check in brackets)"
    echo "| stage | status | seconds | note |"
    echo "|---|---|---|---|"
    for n in "${STAGES[@]}"; do
      if [ -f "$work/records/$n" ]; then
        IFS=$'\t' read -r _ st secs nt <"$work/records/$n"
        echo "| $n | $st | $secs | $nt |"
      elif [ -f "$work/running/$n" ]; then
        echo "| $n | INCOMPLETE | | running since [$(cat "$work/running/$n")] when this file was written |"
      else
        echo "| $n | NOT RUN | | |"
      fi
    done
    echo "total: $(( $(date +%s) - t_start )) s"
  } >"$tmp" && mv -f "$tmp" "$OUT/gpu_results.txt"
  tar -czf "$OUT/.gpu_logs.$BASHPID.tgz" -C "$work" logs 2>/dev/null &&
    mv -f "$OUT/.gpu_logs.$BASHPID.tgz" "$OUT/gpu_logs.tar.gz"
}

run_stage() {  # name [nice]
  local name=$1 nice=${2:-} lim left s rc st secs nt
  case " ${GPU_CHECK_SKIP:-} " in
    *" $name "*) record "$name" SKIP 0 "GPU_CHECK_SKIP"; finalize; return 0 ;;
  esac
  lim=${LIMIT[$name]}
  left=$(( deadline - $(date +%s) - 5 ))
  [ "$left" -lt "$lim" ] && lim=$left
  if [ "$lim" -lt 10 ]; then
    record "$name" SKIP 0 "out of time (GPU_CHECK_DEADLINE_S)"
    finalize
    return 0
  fi
  echo "[$(( $(date +%s) - t_start ))s] $name (limit ${lim}s)"
  echo "$(( $(date +%s) - t_start ))" >"$work/running/$name"
  s=$(date +%s.%N)
  local sec
  sec=$work/sections/$(order_of "$name")_$name.txt
  rm -f "$sec" "$work/notes/$name"
  GPU_CHECK_STAGE_LIMIT=$lim SECTION=$sec NOTE=$work/notes/$name GPU_CHECK_LOG=$work/logs/$name.log \
    ${nice:+nice -n 19} timeout -k 10 "$lim" bash "$self" --stage "$name" >"$work/logs/$name.log" 2>&1
  rc=$?
  secs=$(awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  nt=$(head -1 "$work/notes/$name" 2>/dev/null)
  case $rc in
    0) st=PASS ;;
    77) st=SKIP ;;
    124|137) st=FAIL; nt="timed out after ${lim} s${nt:+; $nt}"
             echo "## $name: timed out after ${lim} s (log: logs/$name.log)" >>"$sec" ;;
    *) st=FAIL; nt="exit $rc${nt:+; $nt}" ;;
  esac
  record "$name" "$st" "$secs" "[$(cat "$work/running/$name")] $nt"
  rm -f "$work/running/$name"
  echo "[$(( $(date +%s) - t_start ))s] $name: $st ($secs s) $nt"
  finalize
}

status_of() { cut -f2 "$work/records/$1" 2>/dev/null; }
skip_stage() { record "$1" SKIP 0 "$2"; }

on_signal() {
  echo "gpu_check.sh: interrupted; writing what there is"
  finalize
  exit 130
}
trap on_signal TERM INT
trap '' PIPE  # output piped into `head` and closed must not stop the check

echo "gpu_check.sh: results in $OUT/gpu_results.txt; logs in $work/logs (and $OUT/gpu_logs.tar.gz)"
[ "$GPU_CHECK_HAVE_GPU" = 1 ] ||
  echo "gpu_check.sh: NO GPU VISIBLE ($GPU_CHECK_NO_GPU_WHY): the GPU stages will be skipped"
run_stage machine
run_stage unpack
run_stage configure
configured=0
[ "$(status_of configure)" = PASS ] && configured=1

later_stages=(build build_all ctest_gpu strata_train strata_llama)
for t in "${SAN_TOOLS[@]}"; do later_stages+=("sanitize_$t"); done
if [ "$dry" = 1 ]; then
  for n in "${later_stages[@]}"; do skip_stage "$n" "GPU_CHECK_DRY=1: stopped after configure"; done
  run_stage gpu_gemm
  run_stage gpu_peer
  finalize
  echo "gpu_check.sh: dry run done in $(( $(date +%s) - t_start )) s"
  exit 0
fi
if [ $configured = 0 ]; then
  for n in "${later_stages[@]}"; do skip_stage "$n" "configure did not pass"; done
fi

build_pid=""
if [ $configured = 1 ]; then
  if [ "$overlap" = 1 ]; then
    ( touch "$work/build_running"; run_stage build nice; run_stage build_all nice
      rm -f "$work/build_running" ) &
    build_pid=$!
  else
    run_stage build
  fi
fi
run_stage gpu_gemm
peer_done=0
if [ -n "$build_pid" ] && [ ! -f "$work/records/build" ]; then
  run_stage gpu_peer  # the GPU is idle while the build runs: use it
  peer_done=1
fi
if [ $configured = 1 ]; then
  # The op tests need the core build (strata and test_gpu), not every target.
  while [ ! -f "$work/records/build" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 2; done
  if [ "$(status_of build)" = PASS ]; then
    run_stage ctest_gpu
    for t in "${SAN_TOOLS[@]}"; do run_stage "sanitize_$t"; done
  else
    for n in ctest_gpu "${SAN_TOOLS[@]/#/sanitize_}"; do skip_stage "$n" "build did not pass"; done
  fi
fi
[ $peer_done = 1 ] || run_stage gpu_peer
if [ $configured = 1 ]; then
  [ -n "$build_pid" ] || run_stage build_all
  # strata's own benchmark after every target is built, unless waiting would leave it no time.
  while [ -f "$work/build_running" ] && [ $(( deadline - $(date +%s) )) -gt $(( LIMIT[strata_train] + 10 )) ]; do
    sleep 2
  done
  if [ "$(status_of build)" = PASS ]; then run_stage strata_train; run_stage strata_llama
  else skip_stage strata_train "build did not pass"; skip_stage strata_llama "build did not pass"; fi
fi
[ -n "$build_pid" ] && wait "$build_pid"
finalize
echo "gpu_check.sh: done in $(( $(date +%s) - t_start )) s"
grep -A100 '^## summary' "$OUT/gpu_results.txt"
