#!/usr/bin/env bash
# Hugging Face interop, end to end: train a small GPT-2 and a small Llama (GQA, untied) with
# strata for a few steps on 2 ranks (tp 2, ZeRO-1), save a checkpoint, export it with
# `strata ckpt export --format hf`, load the export with pip's PyTorch and transformers
# (bench/hf_compare.py) and compare its logits with `strata ckpt logits` on the same tokens; then
# import the export back (`strata ckpt import`) and check that its weights give the same logits.
#
#   bench/hf_interop.sh | tee bench/results_hf_$(date +%F).txt
#   PEER_VENV=/tmp/peer-venv STRATA=build/strata bench/hf_interop.sh
# Installs transformers and safetensors into PEER_VENV (bench/setup_peers.sh makes the venv) when
# missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
strata=${STRATA:-$repo/build/strata}
venv=${PEER_VENV:-/tmp/peer-venv}
py=$venv/bin/python
[ -x "$py" ] || PEER_VENV="$venv" WITH_DEEPSPEED=0 "$here/setup_peers.sh" >/dev/null
"$py" -c 'import transformers, safetensors' 2>/dev/null ||
  "$venv/bin/pip" install -q transformers safetensors
machine_info --strata "$strata" --layout "2 ranks x 1 thread (training); 1 process (logits)"
echo "# transformers $("$py" -c 'import transformers; print(transformers.__version__)'), torch $("$py" -c 'import torch; print(torch.__version__)')"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for family in gpt2 llama; do
  if [ "$family" = gpt2 ]; then
    model='{"family": "gpt2", "layers": 2, "hidden": 64, "heads": 4, "vocab": 300, "seq_len": 32}'
  else
    model='{"family": "llama", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 96, "vocab": 300, "seq_len": 32, "rope_theta": 500}'
  fi
  cat >"$work/$family.json" <<EOF
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 0,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
 "zero_optimization": {"stage": 1},
 "parallelism": {"tensor": 2},
 "model": $model,
 "checkpoint": {"dir": "$work/$family/ckpt"}}
EOF
  echo "## $family: 20 steps on tp 2 x ZeRO-1, export, compare"
  "$strata" launch -n 2 -- train --config "$work/$family.json" --steps 20 \
    --run-dir "$work/$family/run" 2>&1 | grep -E '^(checkpoint|done)'
  "$strata" ckpt export "$work/$family/ckpt" --format hf -o "$work/$family/hf"
  # 2 sequences of 32 token ids.
  "$py" - "$work/$family/tokens.bin" <<'EOF'
import sys
import numpy as np
np.random.default_rng(7).integers(0, 300, size=2 * 32, dtype=np.int32).tofile(sys.argv[1])
EOF
  "$strata" ckpt logits "$work/$family/ckpt" --tokens "$work/$family/tokens.bin" -b 2 \
    -o "$work/$family/logits.bin"
  "$py" "$here/hf_compare.py" --export "$work/$family/hf" --tokens "$work/$family/tokens.bin" \
    --logits "$work/$family/logits.bin" --batch 2
  echo "## $family: import the export back, same logits"
  "$strata" ckpt import "$work/$family/hf" -o "$work/$family/imported"
  "$strata" ckpt logits "$work/$family/imported" --tokens "$work/$family/tokens.bin" -b 2 \
    -o "$work/$family/logits2.bin"
  cmp "$work/$family/logits.bin" "$work/$family/logits2.bin" &&
    echo "identical logits (bit for bit) from the re-imported weights"
done
