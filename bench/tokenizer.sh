#!/usr/bin/env bash
# Tokenizer throughput: strata data prepare --tokenizer against the `tokenizers` package's
# encode_batch (the peer venv, scripts/peer_venv.sh) on the same corpus, at 1 and 2 threads
# (OMP_NUM_THREADS for strata, RAYON_NUM_THREADS for tokenizers), with the tokenizers the peer
# test trains (tests/data/tokenizer_peer.py: GPT-2 byte-level BPE, 3,000 ids; Llama-3 style, 70,000
# ids; Qwen2 (NFC), SmolLM2 (Digits), Gemma, Llama-2 legacy and Mistral styles, 3,000 ids each), or
# those named in NAMES. Best of ROUNDS.
#   strata:     the whole command (read the files, check UTF-8, encode, write the llm.c shard)
#   tokenizers: encode_batch alone (the texts already in memory, the tokenizer loaded)
# MB/s = corpus bytes / wall seconds (1 MB = 10^6 bytes); ratio > 1: strata faster. CPU seconds
# (user + system, all threads) beside them, less disturbed by other load on a shared machine.
#
#   bench/tokenizer.sh | tee bench/results_tokenizer_$(date +%F).txt
#   MB=4 ROUNDS=1 STRATA=build/strata NAMES="qwen2 gemma" bench/tokenizer.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=machine_info.sh
. "$here/machine_info.sh"
strata=${STRATA:-$repo/build/strata}
rounds=${ROUNDS:-3}
mb=${MB:-16}
py=$("$repo/scripts/peer_venv.sh" tokenizers) || { echo "no peer venv" >&2; exit 1; }
work=$(mktemp -d /tmp/strata-tok-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

machine_info --strata "$strata" --layout "1 process x 1 and 2 threads"
echo "# tokenizers $("$py" -c 'import tokenizers; print(tokenizers.__version__)')"
"$py" "$here/tokenizer_peer.py" corpus "$work" "$mb" | sed 's/^/# /'
bytes=$(cat "$work"/corpus/*.txt | wc -c)

echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %-7s %11s %11s %7s   %11s %11s %7s\n' tokenizer threads strata_MB/s peer_MB/s ratio \
  strata_cpu_s peer_cpu_s ratio
for name in ${NAMES:-gpt2 llama3 qwen2 smollm gemma llama2 mistral}; do
  for threads in 1 2; do
    s=$(OMP_NUM_THREADS=$threads ROUNDS=$rounds "$py" "$here/tokenizer_peer.py" strata "$work" \
        "$name" "$strata")
    p=$(RAYON_NUM_THREADS=$threads ROUNDS=$rounds "$py" "$here/tokenizer_peer.py" time "$work" \
        "$name")
    python3 -c "
b = $bytes
sw, sc = map(float, '$s'.split()[1::2])
pw, pc = map(float, '$p'.split()[1:4:2])
print(f'{\"$name\":<8} {$threads:<7} {b/sw/1e6:11.2f} {b/pw/1e6:11.2f} {pw/sw:6.2f}x   '
      f'{sc:11.2f} {pc:11.2f} {pc/sc:6.2f}x')"
  done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
