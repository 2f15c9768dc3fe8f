#!/usr/bin/env bash
# strata data prepare --tokenizer against the `tokenizers` package (PyPI, in the peer venv): two
# tokenizers trained here (GPT-2 byte-level BPE; Llama-3 style with its Split regex, BOS template
# and special tokens, > 65,536 ids) on a > 1 MB corpus with much non-ASCII text; every document's
# ids must be identical, in llm.c and Megatron formats. Exits 77 (skip) when the venv cannot be
# made, e.g. without network.
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

# inspect counts the documents by the tokenizer's document token, and knows its vocabulary.
docs=$(find "$work/corpus" -name 'doc_*.txt' | wc -l)
info=$("$strata" data inspect "$work/out/llama3_train.bin" --tokenizer "$work/llama3")
echo "$info"
grep -q "format llmc, dtype uint32" <<<"$info"
grep -q "documents $docs (occurrences of id" <<<"$info"
grep -q "vocabulary 70000: every id fits" <<<"$info"
echo "tokenizer peer test: passed"
