#!/usr/bin/env bash
# The header every bench results file starts with: date, CPU, the ISA flags that decide which
# kernels run, nproc, the layout (ranks x threads), and the versions of everything measured
# (strata's commit, oneDNN, OpenMPI, each PyTorch with the BLAS it really loads, DeepSpeed).
#
# Run:     bench/machine_info.sh [--strata BIN] [--layout TEXT] [--python PY]... [--gemm]
# Source:  . bench/machine_info.sh   (defines the functions; prints nothing)
#   machine_info [options as above]   the header, every line starting with '# '
#   openblas_coretype                 OPENBLAS_CORETYPE for this CPU (empty if not x86 AVX2+)
#   debian_torch_env                  'env' arguments for running Debian's python3-torch
#
# --python PY (repeatable) adds a block for the PyTorch of interpreter PY (bench/peer_blas.py);
# --gemm also times a 2048^3 fp32 matmul in each (THREADS threads, default 2). Debian's
# /usr/bin/python3 is run with OPENBLAS_CORETYPE set as debian_torch_env says; nothing else is.

_mi_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_mi_repo=$(cd "$_mi_here/.." && pwd)

# One CPU flag from /proc/cpuinfo: "yes" or "no".
cpu_has() {
  grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' | grep -qx "$1" && echo yes || echo no
}

# The newest OpenBLAS core type this CPU supports. Debian's OpenBLAS 0.3.21 may not recognise a
# new CPU and fall back to a generic kernel; naming the core type picks the right one.
openblas_coretype() {
  if [ "$(cpu_has avx512_bf16)" = yes ]; then echo Cooperlake
  elif [ "$(cpu_has avx512f)" = yes ]; then echo SkylakeX
  elif [ "$(cpu_has avx2)" = yes ]; then echo Haswell
  fi
}

# Arguments for `env` that run Debian's PyTorch fairly with T threads: OpenBLAS's core type
# chosen from the CPU and its thread count. (Never used for strata, which does not use BLAS.)
debian_torch_env() {
  local t=${1:-${THREADS:-2}} ct
  ct=$(openblas_coretype)
  echo "OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t${ct:+ OPENBLAS_CORETYPE=$ct}"
}

_mi_pkg() {
  dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo "not installed"
}

machine_info() {
  local strata="" layout="" gemm="" pythons=() f
  while [ $# -gt 0 ]; do
    case $1 in
      --strata) strata=$2; shift 2 ;;
      --layout) layout=$2; shift 2 ;;
      --python) pythons+=("$2"); shift 2 ;;
      --gemm) gemm=--gemm; shift ;;
      *) echo "machine_info: unknown argument $1" >&2; return 2 ;;
    esac
  done
  echo "# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "# host: $(uname -srm)"
  echo "# cpu: $(grep -m1 '^model name' /proc/cpuinfo | sed 's/^model name[[:space:]]*:[[:space:]]*//')"
  local flags=""
  for f in avx2 fma avx512f avx512_vnni avx512_bf16 amx_tile amx_bf16; do
    flags+="$f=$(cpu_has "$f") "
  done
  echo "# isa: ${flags% }"
  echo "# nproc: $(nproc)   load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  [ -n "$layout" ] && echo "# layout: $layout"
  # The source tree the binary was configured from (its build dir's CMakeCache.txt), else this one.
  local src=$_mi_repo commit dirty=""
  if [ -n "$strata" ] && [ -f "$(dirname "$strata")/CMakeCache.txt" ]; then
    src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$(dirname "$strata")/CMakeCache.txt")
    src=${src:-$_mi_repo}
  fi
  if commit=$(git -C "$src" rev-parse --short=12 HEAD 2>/dev/null); then
    if [ -n "$(git -C "$src" status --porcelain -- src tools CMakeLists.txt 2>/dev/null)" ]; then
      dirty=" + uncommitted changes in src/ or tools/ (now)"
    fi
  else
    commit="unknown (source $src is not a git checkout)"
  fi
  echo "# strata: commit $commit$dirty, source $src${strata:+, binary $strata built $(date -u -r "$strata" '+%Y-%m-%d %H:%M:%S UTC' 2>/dev/null || echo '(missing)')}"
  echo "# onednn: libdnnl-dev $(_mi_pkg libdnnl-dev) (libdnnl2 $(_mi_pkg libdnnl2))"
  echo "# openmpi: $( (mpirun --version 2>/dev/null || echo 'mpirun not found') | head -1)"
  echo "# openblas: libopenblas0-pthread $(_mi_pkg libopenblas0-pthread); libblas.so.3 -> $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo none)"
  echo "# OPENBLAS_CORETYPE for this CPU (Debian's PyTorch only): $(openblas_coretype)"
  echo "# env: OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset} OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} (of the calling shell)"
  local py
  for py in "${pythons[@]}"; do
    [ -n "$py" ] || continue
    if [ "$py" = /usr/bin/python3 ]; then
      # shellcheck disable=SC2046
      env $(debian_torch_env "${THREADS:-2}") "$py" "$_mi_here/peer_blas.py" $gemm --threads "${THREADS:-2}" \
        2>&1 | sed 's/^/# /'
    else
      env OMP_NUM_THREADS="${THREADS:-2}" MKL_NUM_THREADS="${THREADS:-2}" \
        "$py" "$_mi_here/peer_blas.py" $gemm --threads "${THREADS:-2}" 2>&1 | sed 's/^/# /'
    fi
  done
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  machine_info "$@"
fi
