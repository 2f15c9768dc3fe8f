#!/usr/bin/env bash
# Installs the peers strata is benchmarked against and checks that each has a real BLAS behind it.
# Idempotent: installs only what is missing. As root (apt-get), on Debian 12:
#
#   bench/setup_peers.sh
#   PEER_VENV=/tmp/peer-venv WITH_DEEPSPEED=0 THREADS=2 bench/setup_peers.sh
#
# 1. Debian's PyTorch: python3-torch with libopenblas0-pthread (Debian packages only). Without
#    OpenBLAS, python3-torch's fp32 matmuls run on the reference BLAS (libblas3, ~5 GFLOP/s at
#    2048^3). libblas.so.3 is pointed at OpenBLAS if update-alternatives says otherwise.
# 2. pip's PyTorch 2.x (MKL, oneDNN 3) in a venv outside the repository (PEER_VENV, default
#    /tmp/peer-venv, made with VENV_PYTHON, default python3), and DeepSpeed in it
#    (DS_BUILD_OPS=0: pure Python, no ops compiled at install; skip with WITH_DEEPSPEED=0).
# 3. The check: for each PyTorch, which BLAS it loads (torch.__config__.show(), /proc/self/maps)
#    and the GFLOP/s of a 2048^3 fp32 matmul on THREADS threads. Debian's OpenBLAS 0.3.21 may not
#    recognise a new CPU and run a generic kernel, so Debian's PyTorch is timed both as OpenBLAS
#    detects the CPU and with OPENBLAS_CORETYPE from the CPU flags (avx512_bf16: Cooperlake,
#    avx512f: SkylakeX, avx2: Haswell), which the bench scripts set for Debian's PyTorch only
#    (never for strata, which does not use BLAS).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
venv=${PEER_VENV:-/tmp/peer-venv}
threads=${THREADS:-2}
with_ds=${WITH_DEEPSPEED:-1}
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo

# ---- 1. Debian's python3-torch + OpenBLAS ------------------------------------------------------
missing=()
for p in python3-torch libopenblas0-pthread; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== apt-get install ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
for alt in libblas.so.3 liblapack.so.3; do
  want=/usr/lib/$arch/openblas-pthread/$alt
  cur=$(update-alternatives --query "$alt-$arch" 2>/dev/null | sed -n 's/^Value: //p')
  if [ -e "$want" ] && [ "$cur" != "$want" ]; then
    echo "== update-alternatives: $alt was '$cur', now OpenBLAS"
    $SUDO update-alternatives --set "$alt-$arch" "$want"
  fi
done

# ---- 2. pip's PyTorch (+ DeepSpeed) in a venv ---------------------------------------------------
# Another pip may be filling this venv right now (e.g. started by hand): wait for it to finish
# rather than start a second install into the same directory.
while pgrep -f "^$venv/bin/python[0-9.]* $venv/bin/pip" >/dev/null 2>&1 ||
      pgrep -f "^$venv/bin/pip" >/dev/null 2>&1; do
  echo "== waiting for a pip already running in $venv"
  sleep 20
done
if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
  [ -x "$venv/bin/python" ] || "${VENV_PYTHON:-python3}" -m venv "$venv"
  echo "== pip install torch numpy into $venv"
  "$venv/bin/pip" install -q torch numpy
fi
if [ "$with_ds" = 1 ] && ! DS_ACCELERATOR=cpu "$venv/bin/python" -c "import deepspeed" >/dev/null 2>&1; then
  echo "== DS_BUILD_OPS=0 pip install deepspeed into $venv"
  DS_BUILD_OPS=0 "$venv/bin/pip" install -q deepspeed
  DS_ACCELERATOR=cpu "$venv/bin/python" -c "import deepspeed; print('deepspeed', deepspeed.__version__)"
fi

# ---- 3. The check --------------------------------------------------------------------------------
ct=$(openblas_coretype)
echo "== peers, ${threads} threads; OPENBLAS_CORETYPE for this CPU: ${ct:-none}"
gflops() { sed -n 's/.*matmul, [0-9]* threads: \([0-9.]*\) GFLOP\/s.*/\1/p' | tail -1; }
echo "-- pip's PyTorch ($venv/bin/python)"
out=$(OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads "$venv/bin/python" "$here/peer_blas.py" \
        --gemm --threads "$threads" 2>&1)
echo "$out"
pip_gf=$(echo "$out" | gflops)
echo "-- Debian's PyTorch (/usr/bin/python3), OpenBLAS detecting the CPU itself"
out=$(env -u OPENBLAS_CORETYPE OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" \
        /usr/bin/python3 "$here/peer_blas.py" --gemm --threads "$threads" 2>&1)
echo "$out"
deb_auto_gf=$(echo "$out" | gflops)
echo "-- Debian's PyTorch (/usr/bin/python3), $(debian_torch_env "$threads") (as the bench scripts run it)"
# shellcheck disable=SC2046
out=$(env $(debian_torch_env "$threads") /usr/bin/python3 "$here/peer_blas.py" --gemm \
        --threads "$threads" 2>&1)
echo "$out"
deb_gf=$(echo "$out" | gflops)
echo "== fp32 2048^3 GFLOP/s: pip ${pip_gf:-?}, Debian ${deb_gf:-?} (OpenBLAS auto-detected: ${deb_auto_gf:-?})"
if ! echo "$out" | grep -q "openblas"; then
  echo "WARNING: Debian's PyTorch does not load OpenBLAS: its fp32 figures are not fair to quote" >&2
fi
python3 - "${pip_gf:-0}" "${deb_gf:-0}" <<'EOF'
import sys
pip, deb = (float(x or 0) for x in sys.argv[1:3])
if pip > 0 and deb < 0.5 * pip:
    print(f"WARNING: Debian's PyTorch GEMM runs at {deb / pip:.2f}x pip's: a slow BLAS kernel; "
          "quote pip's PyTorch (the faster peer)", file=sys.stderr)
EOF
