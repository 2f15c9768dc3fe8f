"""The `tokenizers` side of bench/tokenizer.sh.

  tokenizer_peer.py corpus DIR MB      DIR/corpus/doc_*.txt, about MB megabytes made as the peer
                                       test's corpus (many scripts, CJK, emoji, odd whitespace,
                                       text not in NFC), and the peer test's tokenizers trained
                                       on its first 1.2 MB
  tokenizer_peer.py time DIR NAME      seconds of tokenizers' encode_batch over the corpus with
                                       the tokenizer DIR/NAME (threads: RAYON_NUM_THREADS), best
                                       of ROUNDS (default 3); prints "wall S cpu S bytes N"
  tokenizer_peer.py strata DIR NAME STRATA
                                       the same for `STRATA data prepare --tokenizer DIR/NAME`
                                       (threads: OMP_NUM_THREADS), the whole command
CPU seconds (user + system, all threads) are given beside wall seconds: the development machine
is shared, and CPU time is what other processes disturb least.
"""
import os
import random
import resource
import shutil
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "data"))
import tokenizer_peer  # noqa: E402


def corpus(out, mb):
    tokenizer_peer.make(out)  # 1.2 MB and the tokenizers
    n = len(os.listdir(f"{out}/corpus"))
    seed = 1
    total = sum(os.path.getsize(f"{out}/corpus/{f}") for f in os.listdir(f"{out}/corpus"))
    while total < mb * 1_000_000:
        for d in tokenizer_peer.make_corpus(random.Random(seed)):
            with open(f"{out}/corpus/doc_{n:05d}.txt", "w", encoding="utf-8", newline="") as f:
                f.write(d)
            n += 1
            total += len(d.encode("utf-8"))
        seed += 1
    print(f"corpus: {n} documents, {total} bytes")


def timed(out, name):
    from tokenizers import Tokenizer
    texts = []
    for f in sorted(os.listdir(f"{out}/corpus")):
        with open(f"{out}/corpus/{f}", encoding="utf-8", newline="") as fh:
            texts.append(fh.read())
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    tok = Tokenizer.from_file(f"{out}/{name}/tokenizer.json")
    best_wall = best_cpu = float("inf")
    for _ in range(int(os.environ.get("ROUNDS", "3"))):
        c0, t0 = cpu_self(), time.perf_counter()
        tok.encode_batch(texts, add_special_tokens=True)
        t1, c1 = time.perf_counter(), cpu_self()
        best_wall, best_cpu = min(best_wall, t1 - t0), min(best_cpu, c1 - c0)
    print(f"wall {best_wall:.3f} cpu {best_cpu:.3f} bytes {nbytes}")


def cpu_self():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed_strata(out, name, strata):
    best_wall = best_cpu = float("inf")
    for _ in range(int(os.environ.get("ROUNDS", "3"))):
        shutil.rmtree(f"{out}/out", ignore_errors=True)
        c0, t0 = cpu_children(), time.perf_counter()
        subprocess.run([strata, "data", "prepare", "--input", f"{out}/corpus", "--tokenizer",
                        f"{out}/{name}", "--output", f"{out}/out/x"], check=True,
                       stdout=subprocess.DEVNULL)
        t1, c1 = time.perf_counter(), cpu_children()
        best_wall, best_cpu = min(best_wall, t1 - t0), min(best_cpu, c1 - c0)
    print(f"wall {best_wall:.3f} cpu {best_cpu:.3f}")


if __name__ == "__main__":
    if sys.argv[1] == "corpus":
        corpus(sys.argv[2], float(sys.argv[3]))
    elif sys.argv[1] == "time":
        timed(sys.argv[2], sys.argv[3])
    else:
        timed_strata(sys.argv[2], sys.argv[3], sys.argv[4])
