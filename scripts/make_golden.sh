#!/usr/bin/env bash
# Regenerates the golden fixtures: strata writes each case's initial weights and batch, PyTorch
# (Debian's python3-torch) computes logits, loss, gradients and 10 AdamW losses from them.
# Run after changing initialisation or the golden cases; commit tests/golden/fixtures/.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --build build -j2 --target golden_init
for preset in gpt2-tiny llama-tiny; do
  init=$(mktemp --suffix=.safetensors)
  build/tests/golden_init "$preset" "$init"
  /usr/bin/python3 tests/golden/make_golden.py --init "$init" --out "tests/golden/fixtures/$preset.safetensors"
  rm -f "$init"
done
