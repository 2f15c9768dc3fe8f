#!/usr/bin/env bash
# strata data prepare --tokenizer against the `tokenizers` package (PyPI, in the peer venv):
# tokenizers of seven families trained here (tokenizer_peer.py: GPT-2; Llama-3 with > 65,536 ids;
# Qwen2 with NFC; SmolLM2 with Digits; Gemma, legacy Llama-2 and Mistral, character BPE with
# byte_fallback or unk) on a > 1 MB corpus with much non-ASCII and non-NFC text; every document's
# ids must be identical, in llm.c and Megatron formats. Then a broken tokenizer of a new kind must
# stop the CLI with exit 2 and leave nothing. Exits 77 (skip) when the venv cannot be made, e.g.
# without network.
#
#   tests/data/tokenizer_peer_test.sh STRATA_BINARY
set -euo pipefail
strata=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=$("$root/scripts/peer_venv.sh" tokenizers) || exit 77
work=$(mktemp -d /tmp/strata-tok-peer.XXXXXX)
trap 'rm -rf "$work"' EXIT

"$py" "$here/tokenizer_peer.py" make "$work"
export OMP_NUM_THREADS=2
run() { "$strata" data prepare --input "$work/corpus" "$@" >/dev/null; }

run --tokenizer "$work/gpt2" --output "$work/out/gpt2"
"$py" "$here/tokenizer_peer.py" check "$work" gpt2 llmc "$work/out/gpt2_train.bin"
run --tokenizer "$work/gpt2/tokenizer.json" --format megatron --append-eod --output "$work/out/gpt2m"
"$py" "$here/tokenizer_peer.py" check "$work" gpt2 megatron "$work/out/gpt2m_train" --append-eod
run --tokenizer "$work/llama3" --output "$work/out/llama3"
"$py" "$here/tokenizer_peer.py" check "$work" llama3 llmc "$work/out/llama3_train.bin"
run --tokenizer "$work/llama3" --format megatron --append-eod --output "$work/out/llama3m"
"$py" "$here/tokenizer_peer.py" check "$work" llama3 megatron "$work/out/llama3m_train" --append-eod

for name in qwen2 smollm gemma llama2 mistral; do
  run --tokenizer "$work/$name" --output "$work/out/$name"
  "$py" "$here/tokenizer_peer.py" check "$work" "$name" llmc "$work/out/${name}_train.bin"
done
run --tokenizer "$work/gemma" --format megatron --append-eod --output "$work/out/gemmam"
"$py" "$here/tokenizer_peer.py" check "$work" gemma megatron "$work/out/gemmam_train" --append-eod

# A tokenizer of a new kind with a bad value: exit 2, the key named, nothing written.
sed 's/"prepend_scheme": *"first"/"prepend_scheme": "sometimes"/' "$work/mistral/tokenizer.json" \
  >"$work/bad.json"
set +e
msg=$("$strata" data prepare --input "$work/corpus" --tokenizer "$work/bad.json" \
      --output "$work/out/bad" 2>&1)
rc=$?
set -e
[ $rc -eq 2 ] || { echo "bad tokenizer: exit $rc, expected 2: $msg"; exit 1; }
grep -q 'pre_tokenizer.prepend_scheme is "sometimes"' <<<"$msg" || { echo "$msg"; exit 1; }
[ -z "$(find "$work/out" -name 'bad*')" ] || { echo "bad tokenizer left output"; exit 1; }

# inspect counts the documents by the tokenizer's document token, and knows its vocabulary.
docs=$(find "$work/corpus" -name 'doc_*.txt' | wc -l)
info=$("$strata" data inspect "$work/out/llama3_train.bin" --tokenizer "$work/llama3")
echo "$info"
grep -q "format llmc, dtype uint32" <<<"$info"
grep -q "documents $docs (occurrences of id" <<<"$info"
grep -q "vocabulary 70000: every id fits" <<<"$info"
echo "tokenizer peer test: passed"
