#!/usr/bin/env bash
# Every model family strata imports, against transformers (docs/finetune.md): for each, a tiny
# random model made by transformers (tests/ckpt/hf_families_peer.py: fp32, eager attention,
# randomised norm gains, windows shorter than the sequence), `strata ckpt import` with no model
# block, its logits against transformers' (1e-5), 10 AdamW steps with clipping on 2 ranks in a
# layout of its own (a covering design: tensor parallelism with SP, pipelines under 1F1B and
# zero-bubble, context parallelism ring and Ulysses, ZeRO-2 and 3) against transformers' losses on the same batches (1e-5),
# and the export loaded by transformers with strata's logits (1e-5).
#
#   tests/ckpt/hf_families_test.sh build/strata [FAMILY ...]
# The peer is pip's PyTorch and transformers 4.57 in /tmp/strata-hf-modern-venv
# (scripts/peer_venv.sh; STRATA_MODERN_VENV overrides). Exits 77 (skipped) when it cannot be had.
set -euo pipefail
strata=$(realpath "$1")
shift
families=("$@")
[ ${#families[@]} -gt 0 ] || families=(llama mistral qwen2 qwen3 phi3 smollm3 gemma2 gemma3 olmo2)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export STRATA_PEER_VENV=${STRATA_MODERN_VENV:-/tmp/strata-hf-modern-venv}
py=$("$repo/scripts/peer_venv.sh" torch "transformers==4.57.6" safetensors) ||
  { echo "skipped: no torch + transformers peer venv"; exit 77; }
work=$(mktemp -d /tmp/strata_hf_families_XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

# The layout each family trains in on 2 ranks.
layout() {
  case "$1" in
    llama) echo '"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},' ;;
    mistral) echo '"parallelism": {"context": 2, "context_impl": "ring"},' ;;
    qwen2) echo '"parallelism": {"pipeline": 2, "schedule": "1f1b"}, "gradient_accumulation_steps": 2,' ;;
    qwen3) echo '"parallelism": {"tensor": 2, "sequence_parallel": true},' ;;
    phi3) echo '"parallelism": {"context": 2, "context_impl": "ulysses"},' ;;
    smollm3) echo '"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},' ;;
    gemma2) echo '"zero_optimization": {"stage": 2},' ;;
    gemma3) echo '"parallelism": {"tensor": 2, "sequence_parallel": true},' ;;
    olmo2) echo '"parallelism": {"pipeline": 2, "schedule": "zero_bubble"}, "gradient_accumulation_steps": 2,' ;;
  esac
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

for family in "${families[@]}"; do
  d=$work/$family
  mkdir -p "$d"
  echo "## $family"
  "$py" "$here/hf_families_peer.py" make "$d" "$family"
  "$strata" ckpt import "$d/hf" -o "$d/base" >"$d/import.log" || { cat "$d/import.log"; exit 1; }
  "$strata" ckpt logits "$d/base" --tokens "$d/tokens.bin" -b 8 -o "$d/logits0.bin" >/dev/null
  "$py" -c "
import json, numpy as np
np.asarray(json.load(open('$d/reference.json'))['logits'], np.float32).tofile('$d/ref0.bin')"
  compare "logits at import" "$d/logits0.bin" "$d/ref0.bin"
  lr=$("$py" -c "import json; print(json.load(open('$d/reference.json'))['lr'])")
  cat >"$d/ft.json" <<JSON
{"train_batch_size": 8, "steps_per_print": 1, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": $lr, "weight_decay": 0.1}},
 $(layout "$family")
 "data": {"path": "$d/data.bin"},
 "train": {"steps": 10, "run_dir": "$d/run"},
 "checkpoint": {"dir": "$d/ckpt", "interval": 10}}
JSON
  "$strata" launch -n 2 --threads 1 -- train --config "$d/ft.json" --resume "$d/base" \
    >"$d/train.log" 2>&1 || { cat "$d/train.log"; exit 1; }
  "$py" - "$d" <<'PY'
import json, sys
d = sys.argv[1]
ours = [json.loads(l)["loss"] for l in open(f"{d}/run/metrics.jsonl") if '"loss"' in l]
theirs = json.load(open(f"{d}/reference.json"))["losses"]
assert len(ours) == len(theirs), (ours, theirs)
err = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
print(f"  10 steps: losses {ours[0]:.6f} .. {ours[-1]:.6f}, max relative difference {err:.2e}")
assert err <= 1e-5, f"losses differ: {ours} vs {theirs}"
PY
  "$strata" ckpt export "$d/ckpt" --format hf -o "$d/export" >/dev/null
  "$strata" ckpt logits "$d/ckpt" --tokens "$d/tokens.bin" -b 8 -o "$d/logits1.bin" >/dev/null
  "$py" "$here/hf_families_peer.py" logits "$d/export" "$d/ref1.bin"
  compare "export's logits in transformers" "$d/logits1.bin" "$d/ref1.bin"
done
echo "model families against transformers: ok"
