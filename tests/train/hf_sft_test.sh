#!/usr/bin/env bash
# Instruction fine-tuning end to end (README: "Fine-tune on conversations"), against transformers:
# a tiny random Qwen2 with Qwen2.5's chat template made by transformers (tests/train/
# hf_sft_peer.py), `strata ckpt import`, `strata data prepare --jsonl` with the model's template
# (every conversation's ids must be apply_chat_template's, the trained tokens its assistant turns),
# 10 steps on 2 ranks (tensor parallelism 2 with sequence parallelism) on the packed conversations
# with document masking against transformers trained on the same windows as a flattened batch
# (position ids restarting per document, labels -100 off the assistant turns): losses, and the
# validation loss after them, within 1e-5; then `ckpt export` and transformers' loss on the
# export equal to its own trained model's.
#
#   tests/train/hf_sft_test.sh build/strata
# The peer is pip's PyTorch and transformers 4.57 in /tmp/strata-hf-modern-venv
# (scripts/peer_venv.sh; STRATA_MODERN_VENV overrides). Exits 77 (skipped) when it cannot be had.
set -euo pipefail
strata=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export STRATA_PEER_VENV=${STRATA_MODERN_VENV:-/tmp/strata-hf-modern-venv}
py=$("$repo/scripts/peer_venv.sh" torch "transformers==4.57.6" safetensors) ||
  { echo "skipped: no torch + transformers peer venv"; exit 77; }
work=$(mktemp -d /tmp/strata_hf_sft_XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
T=64 steps=10

"$py" "$here/hf_sft_peer.py" make "$work"
"$strata" ckpt import "$work/hf" -o "$work/base" >"$work/import.log" ||
  { cat "$work/import.log"; exit 1; }
"$strata" data prepare --jsonl "$work/conversations.jsonl" --tokenizer "$work/hf" \
  --output "$work/data/" --val-fraction 0.15 --seq-len $T | tee "$work/prepare.log"
windows=$(sed -n "s/^packed first-fit into \([0-9]*\) windows of $T.*/\1/p" "$work/prepare.log")
[ -n "$windows" ] || { echo "data prepare --seq-len printed no packing"; exit 1; }

# Every window in each step: the global batch is the whole epoch, in whatever order.
cat >"$work/sft.json" <<JSON
{"train_batch_size": $windows, "train_micro_batch_size_per_gpu": $windows, "steps_per_print": 1,
 "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
 "parallelism": {"tensor": 2, "sequence_parallel": true},
 "data": {"path": "$work/data/", "document_mask": true},
 "train": {"steps": $steps, "eval_interval": $steps, "eval_iters": 1, "run_dir": "$work/run"},
 "checkpoint": {"dir": "$work/ckpt", "interval": $steps}}
JSON
"$strata" launch -n 2 --threads 1 -- train --config "$work/sft.json" --resume "$work/base" \
  </dev/null >"$work/train.log" 2>&1 || { cat "$work/train.log"; exit 1; }
grep -E '^data: ' "$work/train.log"
"$strata" ckpt export "$work/ckpt" --format hf -o "$work/export" >/dev/null
"$py" "$here/hf_sft_peer.py" check "$work" "$work/data" $T $steps "$windows" "$work/run" \
  "$work/export"
echo "instruction fine-tuning against transformers: ok"
