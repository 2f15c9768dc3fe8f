#!/usr/bin/env bash
# Expert parallelism on the CPU: one MoE model (4 layers, hidden 256, 8 experts of 512 units,
# top 2; 4096 tokens a step) trained by `strata launch -n 2` in data parallelism alone (every rank
# holds every expert) and with the experts over both ranks (parallelism.expert 2), the tokens
# dispatched by all-to-all and by all-gather (parallelism.expert_dispatch), in interleaved rounds.
# Reports the median step time, tokens/s, the step's time in the expert-parallel collectives
# (ep_comm_s, from metrics.jsonl) and the model-state bytes per rank (Params + Grads + master +
# moments, from the start-up prediction line), and that all give the same losses.
# SHARED > 0 adds a gated shared expert of that many units (Qwen2-MoE's) and a fourth run, ep 2
# with the shared expert computed while the all-to-all is in flight (parallelism.expert_overlap).
# LAYOUTS replaces the runs: any of dp ep2 ep2ag ep2ov, tp2 (tensor parallelism with sequence
# parallelism, each expert split over both ranks) and tp2w (the same with whole experts, one
# rank holding half of them: expert_tensor 1, expert 2).
#   bench/moe_expert_parallel.sh [ROUNDS] [STEPS] [SHARED] [LAYOUTS]  (defaults 3, 12, 0 and
#   "dp ep2 ep2ag", ep2ov added with SHARED)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
strata=${STRATA:-$repo/build/strata}
rounds=${1:-3}
steps=${2:-12}
shared=${3:-0}
[ "$shared" -gt 0 ] && shared_moe=", \"shared_ffn_hidden\": $shared, \"shared_gate\": true" || shared_moe=""
work=$(mktemp -d /tmp/strata_ep_bench_XXXXXX)
trap 'rm -rf "$work"' EXIT
layouts=(dp ep2 ep2ag)
declare -A parallelism=([dp]='{"expert": 1}' [ep2]='{"expert": 2}'
  [ep2ag]='{"expert": 2, "expert_dispatch": "all_gather"}'
  [ep2ov]='{"expert": 2, "expert_overlap": true}'
  [tp2]='{"tensor": 2, "sequence_parallel": true}'
  [tp2w]='{"tensor": 2, "sequence_parallel": true, "expert_tensor": 1, "expert": 2}')
[ "$shared" -gt 0 ] && layouts+=(ep2ov)
if [ -n "${4:-}" ]; then read -r -a layouts <<<"$4"; fi
for ep in "${layouts[@]}"; do
  cat >"$work/$ep.json" <<JSON
{"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "steps_per_print": 1000,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
 "model": {"family": "mixtral", "layers": 4, "hidden": 256, "heads": 4, "kv_heads": 4,
           "ffn_hidden": 512, "vocab": 512, "seq_len": 256,
           "moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512, "aux_loss": "per_layer",
                   "router_aux_loss_coef": 0.01$shared_moe}},
 "parallelism": ${parallelism[$ep]},
 "train": {"steps": $steps}}
JSON
done
"$repo/bench/machine_info.sh" 2>/dev/null || lscpu | grep -E "Model name|Flags"
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for ((r = 0; r < rounds; ++r)); do
  for ep in "${layouts[@]}"; do
    run="$work/run_${ep}_$r"
    "$strata" launch -n 2 -- train --config "$work/$ep.json" --run-dir "$run" \
      >"$work/$ep.$r.log" 2>&1 || { cat "$work/$ep.$r.log"; exit 1; }
    # The steps after the first two (warm-up), each one's time and all-to-all time.
    python3 - "$run/metrics.jsonl" >>"$work/$ep.steps" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows[2:]:
    print(r["step_time_s"], r.get("ep_comm_s", 0.0), r["tokens_per_s"], r["loss"])
PY
    tail -1 "$run/metrics.jsonl" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["loss"])' \
      >"$work/$ep.loss"
  done
done
for ep in "${layouts[@]}"; do
  step=$(cut -d' ' -f1 "$work/$ep.steps" | median)
  comm=$(cut -d' ' -f2 "$work/$ep.steps" | median)
  tps=$(cut -d' ' -f3 "$work/$ep.steps" | median)
  states=$(grep -m1 -o "model states [^;,]*" "$work/$ep.0.log" || echo "model states: see log")
  awk -v ep="$ep" -v step="$step" -v tps="$tps" -v comm="$comm" -v states="$states" \
    -v loss="$(cat "$work/$ep.loss")" 'BEGIN {
    printf "%s: median step %.4f s, %.0f tokens/s, ep collectives %.4f s a step (%.1f%%); %s); last loss %s\n",
      ep, step, tps, comm, 100 * comm / step, states, loss }'
done
