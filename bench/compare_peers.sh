#!/usr/bin/env bash
# strata against the PyTorch peer (shared/peers/torch_gpt_bench.py) side by side, in one run:
# same model shapes, same thread count, fp32 and bf16. Prints a markdown table of tokens/s.
#
#   bench/compare_peers.sh                     # Debian's PyTorch (installed if missing)
#   PIP_TORCH_PYTHON=/path/venv/bin/python bench/compare_peers.sh   # also a pip PyTorch
#
# Debian's PyTorch gets its fp32 matmul from the system BLAS: libopenblas0-pthread is installed so
# it is OpenBLAS (not the reference BLAS), with OPENBLAS_CORETYPE=Haswell, the best kernel for an
# AVX2 CPU (set OPENBLAS_CORETYPE yourself on another CPU). strata's figure is the median of
# STEPS steps; the peer's the mean of its steps after a warm-up step, as it prints.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
peers=${PEERS_DIR:-$repo/../shared/peers}
threads=${THREADS:-2}
steps=${STEPS:-5}
peer_bf16_steps=${PEER_BF16_STEPS:-1}  # PyTorch bf16 on a CPU without bf16 units is very slow
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}

missing=()
for p in python3-torch libopenblas0-pthread; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
[ -x "$repo/build/strata" ] || "$repo/scripts/setup.sh"

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }

# model_args: strata args | peer args
run_case() {
  local name=$1 strata_args=$2 peer_args=$3 dtype=$4
  local s p s_step p_step ratio peer_steps=$steps bf16_flag="" out
  if [ "$dtype" = bf16 ]; then bf16_flag=--bf16; peer_steps=$peer_bf16_steps; fi
  out=$(OMP_NUM_THREADS=$threads "$repo/build/strata" bench $strata_args --dtype "$dtype" \
          --steps "$steps")
  s=$(echo "$out" | field tokens_per_s)
  s_step=$(echo "$out" | field step_s)
  for py in /usr/bin/python3 ${PIP_TORCH_PYTHON:-}; do
    local ver
    ver=$("$py" -c 'import torch; print(torch.__version__)')
    out=$("$py" "$peers/torch_gpt_bench.py" $peer_args --threads "$threads" \
            --steps "$peer_steps" $bf16_flag)
    p=$(echo "$out" | field tokens_per_s)
    p_step=$(echo "$out" | field step_s)
    ratio=$(python3 -c "print(f'{$p_step/$s_step:.2f}')")  # same tokens per step: a time ratio
    echo "| $name | $dtype | $s | PyTorch $ver: $p | ${ratio}x |"
  done
}

echo "| model | dtype | strata tokens/s | PyTorch tokens/s | strata / PyTorch |"
echo "|---|---|---|---|---|"
for dtype in fp32 bf16; do
  run_case bench-23M "--model bench-23M" "" "$dtype"
done
for dtype in fp32 bf16; do
  run_case "gpt2-124M B=4 T=64" "--model gpt2-124M -b 4 -t 64" \
    "--layers 12 --d 768 --heads 12 --vocab 50304 --seq 64 --batch 4" "$dtype"
done
