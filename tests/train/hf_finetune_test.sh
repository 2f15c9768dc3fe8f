#!/usr/bin/env bash
# The fine-tuning workflow end to end (docs/finetune.md), against transformers as the peer: for a
# tiny GPT-2 and a tiny Llama that transformers makes (random weights, a BPE tokenizer trained on
# the licence texts), `strata ckpt import`, `strata data prepare --tokenizer` with the model's
# tokenizer into train.bin + val.bin, a fine-tune on 2 ranks (GPT-2: tp 2 at seq_len 32, shorter than its 64
# positions, with its model block; Llama: pp 2 without a model block, the checkpoint's), `ckpt
# export`, and transformers' loss on the export for the same validation windows must equal
# strata's last val_loss within 1e-4.
#
#   tests/train/hf_finetune_test.sh build/strata [PEER_VENV]
# The peer is Debian's PyTorch (python3-torch, CPU; installed here when missing and run as root)
# with transformers 4.46 (a release that still supports PyTorch 1.13) from PyPI in a venv that sees the
# system's packages, /tmp/strata-hf-venv: a few MB to download, where pip's PyTorch brings GBs.
# Exits 77 (skipped) when that peer cannot be had (no network).
set -euo pipefail
strata=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch >/dev/null 2>&1; } || true
  fi
  /usr/bin/python3 -c 'import torch' 2>/dev/null ||
    { echo "skipped: Debian's python3-torch is not installed and cannot be"; exit 77; }
fi
export STRATA_PEER_VENV=${2:-${PEER_VENV:-/tmp/strata-hf-venv}} STRATA_PEER_SYSTEM_SITE=1
py=$("$repo/scripts/peer_venv.sh" "transformers==4.46.3" safetensors) ||
  { echo "skipped: no transformers peer venv"; exit 77; }
"$py" -c 'import torch, transformers, tokenizers' 2>/dev/null ||
  { echo "skipped: no torch + transformers + tokenizers in $STRATA_PEER_VENV"; exit 77; }
work=$(mktemp -d /tmp/strata_hf_finetune_XXXXXX)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
gbs=8 iters=2

for family in gpt2 llama; do
  d=$work/$family
  mkdir -p "$d/hf" "$d/data"
  "$py" "$here/hf_finetune_peer.py" make "$d/hf" "$family"
  "$strata" ckpt import "$d/hf" -o "$d/base"
  "$strata" data prepare --tokenizer "$d/hf" --input /usr/share/common-licenses \
    --output "$d/data/" --val-fraction 0.1
  vocab=$("$py" -c "import json; print(json.load(open('$d/hf/config.json'))['vocab_size'])")
  if [ "$family" = gpt2 ]; then
    seq_len=32
    extra="\"parallelism\": {\"tensor\": 2}, \"model\": {\"family\": \"gpt2\", \"layers\": 2,
           \"hidden\": 64, \"heads\": 4, \"vocab\": $vocab, \"seq_len\": $seq_len},"
  else
    seq_len=64
    extra='"parallelism": {"pipeline": 2},'
  fi
  cat >"$d/ft.json" <<JSON
{"train_batch_size": $gbs, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}},
 $extra
 "data": {"path": "$d/data"},
 "train": {"steps": 6, "eval_interval": 3, "eval_iters": $iters, "run_dir": "$d/run"},
 "checkpoint": {"dir": "$d/ckpt", "interval": 4}}
JSON
  "$strata" launch -n 2 --threads 1 -- train --config "$d/ft.json" --resume "$d/base" \
    >"$d/train.log" 2>&1 || { cat "$d/train.log"; exit 1; }
  grep -E '^(note|data|validation|step .* val loss|checkpoint|done)' "$d/train.log"
  if [ "$family" = gpt2 ]; then
    grep -q "the position table's first rows are loaded" "$d/train.log"
  else
    grep -q "note: no model block: the model of $d/base" "$d/train.log"
  fi
  "$strata" ckpt export "$d/ckpt" --format hf -o "$d/export"
  ours=$("$py" -c "
import json
rows = [json.loads(l) for l in open('$d/run/metrics.jsonl')]
assert [r['step'] for r in rows] == [1, 2, 3, 4, 5, 6], rows
val = [r for r in rows if 'val_loss' in r]
assert [r['step'] for r in val] == [3, 6], val
print(repr(val[-1]['val_loss']))")
  theirs=$("$py" "$here/hf_finetune_peer.py" val-loss "$d/export" "$d/data/val.bin" $seq_len \
    $((gbs * iters)))
  "$py" -c "
a, b = $ours, $theirs
print(f'$family: strata val_loss {a:.7f}, transformers on the export {b:.7f}, diff {abs(a - b):.2e}')
assert abs(a - b) <= 1e-4, 'validation losses differ'"
done
echo "fine-tuning workflow: ok"
