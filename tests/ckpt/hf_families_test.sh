#!/usr/bin/env bash
# Every model family strata imports, against transformers (docs/finetune.md): for each, a tiny
# random model made by transformers (tests/ckpt/hf_families_peer.py: fp32, eager attention,
# randomised norm gains, windows shorter than the sequence), `strata ckpt import` with no model
# block, its logits against transformers' (1e-5), 10 AdamW steps with clipping on 2 ranks in each
# of four layouts (tensor parallelism with SP, a pipeline, context parallelism, ZeRO-3) against
# transformers' losses on the same batches (1e-5), and the last layout's checkpoint exported and
# loaded by transformers with strata's logits (1e-5).
#
#   tests/ckpt/hf_families_test.sh build/strata [FAMILY ...]
# The peer is pip's PyTorch and transformers 4.57 in /tmp/strata-hf-modern-venv
# (scripts/peer_venv.sh; STRATA_MODERN_VENV overrides). Exits 77 (skipped) when it cannot be had.
set -euo pipefail
strata=$(realpath "$1")
shift
families=("$@")
[ ${#families[@]} -gt 0 ] || families=(llama mistral qwen2 qwen3 phi3 smollm3 gemma2 gemma3 olmo2 mixtral
  qwen2_moe qwen3_moe)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export STRATA_PEER_VENV=${STRATA_MODERN_VENV:-/tmp/strata-hf-modern-venv}
py=$("$repo/scripts/peer_venv.sh" torch "transformers==4.57.6" safetensors) ||
  { echo "skipped: no torch + transformers peer venv"; exit 77; }
work=$(mktemp -d /tmp/strata_hf_families_XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

# The four layouts every family trains in on 2 ranks, and each family's own (its config and
# checkpoint are exported): tensor 2 with sequence parallelism, a pipeline of 2 (1F1B; OLMo 2's
# zero-bubble), context parallelism 2 (ring; Phi-3 Ulysses) and ZeRO-3 (Gemma 2: ZeRO-2).
layouts() {
  local pp='"parallelism": {"pipeline": 2, "schedule": "1f1b"}, "gradient_accumulation_steps": 2,'
  local cp='"parallelism": {"context": 2, "context_impl": "ring"},'
  local zero='"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},'
  case "$1" in
    olmo2) pp='"parallelism": {"pipeline": 2, "schedule": "zero_bubble"}, "gradient_accumulation_steps": 2,' ;;
    phi3) cp='"parallelism": {"context": 2, "context_impl": "ulysses"},' ;;
    gemma2) zero='"zero_optimization": {"stage": 2},' ;;
    # A mixture of experts pools its layers' routing into one balancing loss, which a pipeline
    # does not see in one place (model.moe.aux_loss): the micro-batch split in its stead.
    mixtral | qwen2_moe | qwen3_moe)
      pp='"gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1},' ;;
  esac
  printf '%s\n' '"parallelism": {"tensor": 2, "sequence_parallel": true},' "$pp" "$cp" "$zero"
}

compare() {  # compare WHAT GOT WANT: two float32 files, max |a-b| <= 1e-5 · max(1, |b|)
  "$py" - "$@" <<'PY'
import sys
import numpy as np
what, a, b = sys.argv[1], np.fromfile(sys.argv[2], np.float32), np.fromfile(sys.argv[3], np.float32)
assert a.shape == b.shape, f"{what}: {a.shape} values, want {b.shape}"
err = float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b))))
print(f"  {what}: max difference {err:.2e}")
assert err <= 1e-5, f"{what} differ"
PY
}

"$py" "$here/hf_families_peer.py" make "$work" "${families[@]}"
for family in "${families[@]}"; do
  d=$work/$family
  echo "## $family"
  "$strata" ckpt import "$d/hf" -o "$d/base" >"$d/import.log" || { cat "$d/import.log"; exit 1; }
  "$strata" ckpt logits "$d/base" --tokens "$d/tokens.bin" -b 8 -o "$d/logits0.bin" >/dev/null
  "$py" -c "
import json, numpy as np
np.asarray(json.load(open('$d/reference.json'))['logits'], np.float32).tofile('$d/ref0.bin')"
  compare "logits at import" "$d/logits0.bin" "$d/ref0.bin"
  lr=$("$py" -c "import json; print(json.load(open('$d/reference.json'))['lr'])")
  n=0
  while IFS= read -r layout; do
    n=$((n + 1))
    rm -rf "$d/run" "$d/ckpt"
    cat >"$d/ft.json" <<JSON
{"train_batch_size": 8, "steps_per_print": 1, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": $lr, "weight_decay": 0.1}},
 $layout
 "data": {"path": "$d/data.bin"},
 "train": {"steps": 10, "run_dir": "$d/run"},
 "checkpoint": {"dir": "$d/ckpt", "interval": 10}}
JSON
    "$strata" launch -n 2 --threads 1 -- train --config "$d/ft.json" --resume "$d/base" \
      </dev/null >"$d/train.log" 2>&1 || { echo "$layout"; cat "$d/train.log"; exit 1; }
    "$py" - "$d" "$layout" <<'PY'
import json, sys
d, layout = sys.argv[1], sys.argv[2]
ours = [json.loads(l)["loss"] for l in open(f"{d}/run/metrics.jsonl") if '"loss"' in l]
theirs = json.load(open(f"{d}/reference.json"))["losses"]
assert len(ours) == len(theirs), (ours, theirs)
err = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
print(f"  10 steps, {layout.rstrip(',')}: losses {ours[0]:.6f} .. {ours[-1]:.6f}, "
      f"max relative difference {err:.2e}")
assert err <= 1e-5, f"losses differ: {ours} vs {theirs}"
PY
  done < <(layouts "$family")
  [ $n -eq 4 ] || { echo "$n layouts ran, not 4"; exit 1; }
  "$strata" ckpt export "$d/ckpt" --format hf -o "$d/export" >/dev/null
  "$strata" ckpt logits "$d/ckpt" --tokens "$d/tokens.bin" -b 8 -o "$d/logits1.bin" >/dev/null
done
# The exports in transformers, all in one process.
"$py" "$here/hf_families_peer.py" logits "$work" "${families[@]}"
for family in "${families[@]}"; do
  compare "$family: the export's logits in transformers" "$work/$family/logits1.bin" \
    "$work/$family/ref1.bin"
done
echo "model families against transformers: ok"
