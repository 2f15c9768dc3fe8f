#!/usr/bin/env bash
# A mixture of experts' MLP against a dense SwiGLU MLP of the same active FLOPs, on the CPU:
# three models alike but for the MLP of their 2 layers (hidden 512, 2048 tokens a step) — MoE
# (8 experts of 512 units, top 2: 2·512 active units a token), dense (1024 units) and a base with
# a 16-unit MLP — timed by `strata bench` in interleaved rounds (median step of each round's
# --steps). Each MLP's time is its model's step less the base's; the ratio is the dense MLP's time
# over the MoE MLP's (its tokens/s over the dense one's). Routing is the random model's (near
# uniform: 8 experts, 4096 choices a layer). fp32 and bf16.
#   bench/moe_layer.sh [ROUNDS] [STEPS]          (defaults 5 and 5)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
strata=${STRATA:-$repo/build/strata}
rounds=${1:-5}
steps=${2:-5}
work=$(mktemp -d /tmp/strata_moe_bench_XXXXXX)
trap 'rm -rf "$work"' EXIT
model() {  # model() NAME FFN MOE_JSON
  cat >"$work/$1.json" <<JSON
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
 "model": {"family": "mixtral", "layers": 2, "hidden": 512, "heads": 4, "kv_heads": 4,
           "ffn_hidden": $2, "vocab": 256, "seq_len": 256 $3}}
JSON
}
model moe 1024 ', "moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512}'
model dense 1024 ''
model base 16 ''
sed -i 's/"family": "mixtral"/"family": "llama"/' "$work/dense.json" "$work/base.json"
"$repo/bench/machine_info.sh" 2>/dev/null || lscpu | grep -E "Model name|Flags"
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for dtype in fp32 bf16; do
  for name in moe dense base; do : >"$work/$name.$dtype"; done
  for ((r = 0; r < rounds; ++r)); do
    for name in moe dense base; do
      "$strata" bench --config "$work/$name.json" --dtype "$dtype" --steps "$steps" 2>/dev/null |
        sed -n 's/.*step_s=\([0-9.]*\).*/\1/p' >>"$work/$name.$dtype"
    done
  done
  m=$(median <"$work/moe.$dtype") d=$(median <"$work/dense.$dtype") b=$(median <"$work/base.$dtype")
  awk -v m="$m" -v d="$d" -v b="$b" -v t="$dtype" 'BEGIN {
    printf "%s: step moe %.4f s, dense %.4f s, base %.4f s | MLP moe %.4f s, dense %.4f s | MoE tokens/s = %.2f x dense\n",
      t, m, d, b, m - b, d - b, (d - b) / (m - b) }'
done
