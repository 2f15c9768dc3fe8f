#!/usr/bin/env bash
# strata against the PyTorch peers, side by side in one run: same model shapes, same thread count,
# same number of timed steps after the same warm-up, medians on both sides. Prints the machine
# header (bench/machine_info.sh), then a markdown table, then every raw line it parsed.
#
#   bench/compare_peers.sh | tee bench/results_peers_$(date +%F).txt
#   STRATA=build-x/strata THREADS=2 STEPS=5 WARMUP=1 BF16_STEPS=3 bench/compare_peers.sh
#
# Rows: bench-23M (B=8, T=256) and gpt2-124M (B=4, T=64), fp32 and bf16 (MODELS, DTYPES select).
# Peers: pip's PyTorch 2.x (PIP_TORCH_PYTHON, default /tmp/peer-venv/bin/python) and Debian's
# python3-torch (DEBIAN_TORCH_PYTHON, default /usr/bin/python3), each running
# shared/peers/torch_gpt_bench.py's model through bench/torch_peer_median.py (its code, per-step
# timing, median). Missing peers are installed by bench/setup_peers.sh (as root). Debian's
# PyTorch runs on OpenBLAS with OPENBLAS_CORETYPE chosen from the CPU flags; strata runs with
# OPENBLAS_CORETYPE unset. Threads: strata OMP_NUM_THREADS=THREADS; PyTorch
# torch.set_num_threads(THREADS) with OMP/MKL/OPENBLAS_NUM_THREADS=THREADS.
#
# strata's step time is the median `strata bench` prints (STEPS timed steps after WARMUP); the
# peer's the median of its STEPS steps after WARMUP (the upper middle value for an even count,
# as strata's). bf16 rows use BF16_STEPS (default STEPS) on both sides: PyTorch's bf16 autocast
# is very slow on a CPU without bf16 units. Ratio = peer median step time / strata median step
# time (same tokens per step on both sides, so it is also strata's tokens/s over the peer's).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
strata=${STRATA:-$repo/build/strata}
threads=${THREADS:-2}
steps=${STEPS:-5}
warmup=${WARMUP:-1}
bf16_steps=${BF16_STEPS:-$steps}
models=${MODELS:-bench-23M gpt2-124M}
dtypes=${DTYPES:-fp32 bf16}
peer=${PEER_SCRIPT:-$repo/../shared/peers/torch_gpt_bench.py}
pip_py=${PIP_TORCH_PYTHON:-/tmp/peer-venv/bin/python}
deb_py=${DEBIAN_TORCH_PYTHON:-/usr/bin/python3}

if [ ! -x "$strata" ]; then
  echo "no strata binary at $strata: build one (cmake -S . -B build -DCMAKE_BUILD_TYPE=Release &&" \
       "cmake --build build --target strata) or set STRATA=path/to/strata" >&2
  exit 2
fi
[ -f "$peer" ] || { echo "peer script $peer not found (set PEER_SCRIPT)" >&2; exit 2; }
need_setup=0
"$pip_py" -c "import torch" >/dev/null 2>&1 || need_setup=1
"$deb_py" -c "import torch" >/dev/null 2>&1 || need_setup=1
dpkg-query -W -f='${Status}' libopenblas0-pthread 2>/dev/null | grep -q "install ok installed" ||
  need_setup=1
if [ $need_setup = 1 ]; then
  echo "== a peer is missing: bench/setup_peers.sh" >&2
  PEER_VENV=$(dirname "$(dirname "$pip_py")") WITH_DEEPSPEED=0 THREADS=$threads \
    "$here/setup_peers.sh" >&2
fi

echo "# bench/compare_peers.sh: STRATA=$strata THREADS=$threads STEPS=$steps WARMUP=$warmup BF16_STEPS=$bf16_steps"
machine_info --strata "$strata" --gemm --python "$pip_py" --python "$deb_py" \
  --layout "1 process x $threads threads on every side (strata: OMP_NUM_THREADS=$threads; PyTorch: torch.set_num_threads($threads), OMP/MKL/OPENBLAS_NUM_THREADS=$threads)"
echo "# PyTorch peer: $peer via bench/torch_peer_median.py (median of per-step times)"
echo

raw=$(mktemp)
rows=$(mktemp)
trap 'rm -f "$raw" "$rows"' EXIT
field() { sed -n "s/.*[ |]$1=\([0-9.]*\).*/\1/p" | head -1; }

run_case() {  # name B T strata-args peer-args dtype
  local name=$1 B=$2 T=$3 sargs=$4 pargs=$5 dtype=$6 n=$steps bf16="" out s py label ver
  if [ "$dtype" = bf16 ]; then n=$bf16_steps; bf16=--bf16; fi
  # shellcheck disable=SC2086
  if out=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_NUM_THREADS OMP_NUM_THREADS="$threads" \
             "$strata" bench $sargs --dtype "$dtype" --steps "$n" --warmup "$warmup" 2>&1); then
    s=$(echo "$out" | grep '^bench ' | field step_s)
  else
    s=""
  fi
  { echo "strata $name $dtype:"; echo "$out" | sed 's/^/  /'; } >>"$raw"
  echo "$name|$dtype|$n|$B|$T|strata|strata|${s:-failed}" >>"$rows"
  for py in "$pip_py" "$deb_py"; do
    [ -n "$py" ] || continue
    ver=$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "?")
    if [ "$py" = /usr/bin/python3 ]; then label="Debian PyTorch $ver"
      # shellcheck disable=SC2046,SC2086
      out=$(env $(debian_torch_env "$threads") "$py" "$here/torch_peer_median.py" --peer "$peer" \
              --warmup "$warmup" --steps "$n" --threads "$threads" $pargs $bf16 2>&1) || true
    else label="pip PyTorch $ver"
      # shellcheck disable=SC2086
      out=$(env OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads" "$py" \
              "$here/torch_peer_median.py" --peer "$peer" --warmup "$warmup" --steps "$n" \
              --threads "$threads" $pargs $bf16 2>&1) || true
    fi
    { echo "$label $name $dtype:"; echo "$out" | sed 's/^/  /'; } >>"$raw"
    s=$(echo "$out" | grep '^peer=torch' | field step_s)
    echo "$name|$dtype|$n|$B|$T|peer|$label|${s:-failed}" >>"$rows"
  done
}

for model in $models; do
  for dtype in $dtypes; do
    case $model in
      bench-23M) run_case "bench-23M B=8 T=256" 8 256 "--model bench-23M -b 8" "" "$dtype" ;;
      gpt2-124M) run_case "gpt2-124M B=4 T=64" 4 64 "--model gpt2-124M -b 4 -t 64" \
                   "--layers 12 --d 768 --heads 12 --vocab 50304 --seq 64 --batch 4" "$dtype" ;;
      *) echo "unknown model $model (bench-23M, gpt2-124M)" >&2; exit 2 ;;
    esac
  done
done

python3 - "$rows" "$warmup" <<'EOF'
import sys
rows = [l.rstrip("\n").split("|") for l in open(sys.argv[1]) if l.strip()]
warmup = sys.argv[2]
print("| model | dtype | timed steps (after warm-up) | who | median step s | tokens/s (from the median) | peer / strata step time |")
print("|---|---|---|---|---|---|---|")
strata_s = None
best = {}
for name, dtype, n, B, T, kind, label, s in rows:
    tok = int(B) * int(T)
    if kind == "strata":
        strata_s = float(s) if s != "failed" else None
    if s == "failed":
        print(f"| {name} | {dtype} | {n} ({warmup}) | {label} | failed | - | - |")
        continue
    t = float(s)
    ratio = "1.00" if kind == "strata" else (f"{t / strata_s:.2f}x" if strata_s else "-")
    print(f"| {name} | {dtype} | {n} ({warmup}) | {label} | {t:.3f} | {tok / t:.1f} | {ratio} |")
    if kind == "peer" and strata_s:
        k = (name, dtype)
        if k not in best or t < best[k][1]:
            best[k] = (label, t, strata_s)
print()
print("Against the faster peer (strata tokens/s / peer tokens/s = peer median / strata median):")
for (name, dtype), (label, t, s) in best.items():
    print(f"- {name} {dtype}: {t / s:.2f}x vs {label}")
EOF
echo
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) (other work on these cores makes every figure noisy)"
echo
echo "## raw output"
cat "$raw"
