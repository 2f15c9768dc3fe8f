#!/usr/bin/env bash
# Activation checkpointing. (1) A 12-layer model (bench-23M with 12 blocks, fp32, B=8, T=256) on
# one rank with both cores: none, selective and full recompute, run in turn ROUNDS times (none,
# selective, full, none, ...); each run prints its median step, and the summary gives the median
# over rounds, the bytes kept between forward and backward (activations + checkpoints, as the
# tracker counts them) and both as ratios against none. (2) The seed config's checkpointing
# options (partition_activations, cpu_checkpointing, contiguous_memory_optimization: full
# recompute, checkpoints in host memory) with its bf16 and ZeRO-3 on 4 ranks, against none: dp 4
# (the seed's layout; partitioning has nothing to shard) and tp 2 x dp 2 (it shards).
#
#   bench/recompute.sh | tee bench/results_recompute_$(date +%F).txt
#   ROUNDS=1 STEPS=2 STRATA=build/strata bench/recompute.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
strata=${STRATA:-$repo/build/strata}
rounds=${ROUNDS:-3}
steps=${STEPS:-3}
machine_info --strata "$strata" --layout "1 rank x 2 threads; 4 ranks x 1 thread"

ac() { echo "--set" "activation_checkpointing.recompute_granularity=\"$1\""; }
# The median step time and the kept bytes of one bench run's output.
summarise() {
  awk '/^bench model=/ { for (i = 1; i <= NF; ++i) if ($i ~ /^step_s=/) { sub("step_s=", "", $i); s = $i } }
       /^bench recompute/ { for (i = 1; i <= NF; ++i) if ($i ~ /^activations\+checkpoints=/) { sub(".*=", "", $i); k = $i " " $(i + 1) } }
       END { print s, k }'
}

echo "## 12 blocks, fp32, B=8 T=256, 1 rank x 2 threads: none / selective / full, $rounds rounds"
declare -A times kept
for r in $(seq "$rounds"); do
  for g in none selective full; do
    out=$(OMP_NUM_THREADS=2 "$strata" bench --model bench-23M --layers 12 --dtype fp32 -b 8 \
      --steps "$steps" $(ac "$g") 2>&1 | grep '^bench')
    echo "# round $r, $g"
    echo "$out"
    read -r s k u <<<"$(summarise <<<"$out")"
    times[$g]="${times[$g]:-} $s"
    kept[$g]="$k $u"
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
to_mib() { awk -v v="$1" -v u="$2" 'BEGIN { f = u == "GiB" ? 1024 : u == "KiB" ? 1 / 1024 : 1; print v * f }'; }
base_t=$(median <<<"${times[none]}")
read -r bv bu <<<"${kept[none]}"
base_m=$(to_mib "$bv" "$bu")
echo "## summary (median over rounds)"
printf '%-10s %10s %12s %14s %14s\n' policy step_s "vs none" kept_MiB "none / this"
for g in none selective full; do
  t=$(median <<<"${times[$g]}")
  read -r v u <<<"${kept[$g]}"
  m=$(to_mib "$v" "$u")
  awk -v g="$g" -v t="$t" -v bt="$base_t" -v m="$m" -v bm="$base_m" \
    'BEGIN { printf "%-10s %10.3f %+11.1f%% %14.1f %13.2fx\n", g, t, 100 * (t / bt - 1), m, bm / m }'
done

seed=(--set 'activation_checkpointing.partition_activations=true'
  --set 'activation_checkpointing.cpu_checkpointing=true'
  --set 'activation_checkpointing.contiguous_memory_optimization=true')
common=(bench --model bench-23M --layers 12 --dtype bf16 -b 1 -t 128 --micro 4 --steps 2
  --set 'zero_optimization.stage=3' --set 'zero_optimization.overlap_comm=true'
  --set 'communication_data_type="bf16"')
for layout in "dp 4" "tp 2 x dp 2"; do
  extra=()
  [ "$layout" = "dp 4" ] || extra=(--tensor 2)
  for what in none seed; do
    echo "## 4 ranks, $layout, bf16, ZeRO-3, 4 micro-batches of 1 x 128: $what"
    if [ "$what" = none ]; then opts=(); else opts=("${seed[@]}"); fi
    "$strata" launch -n 4 -- "${common[@]}" "${extra[@]}" "${opts[@]}" 2>&1 | grep -E '^(bench|note)'
  done
done
