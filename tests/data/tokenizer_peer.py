"""The `tokenizers` side of tokenizer_peer_test.sh.

  tokenizer_peer.py make DIR      corpus (DIR/corpus/doc_*.txt, > 1 MB, much non-ASCII, some of it
                                  not NFC) and tokenizers trained on it, DIR/NAME/tokenizer.json
                                  for each NAME of FAMILIES:
                                    gpt2    byte-level BPE as GPT-2
                                    llama3  Llama-3's Split regex + ByteLevel(use_regex=False), BOS
                                            template, Llama-3's special tokens, padded past 65,536
                                            ids
                                    qwen2   NFC + Qwen2's Split regex + ByteLevel(use_regex=False)
                                    smollm  Digits(individual_digits) + ByteLevel(use_regex=True)
                                    gemma   Replace(" ", "▁") + Split(" ", merged_with_previous),
                                            character BPE with byte_fallback (<0x00>..<0xFF>),
                                            fuse_unk, "<bos> $A"
                                    llama2  legacy Llama-2/Phi-3: Prepend("▁") + Replace(" ", "▁"),
                                            no pre-tokenizer, byte_fallback, "<s> $A"
                                    mistral non-legacy: Metaspace(prepend_scheme="first",
                                            split=False), no byte_fallback (unknown characters
                                            become one fused <unk>), "<s> $A"
  tokenizer_peer.py check DIR NAME FORMAT PATH [--append-eod]
                                  the ids strata wrote at PATH (llm.c shard or Megatron prefix)
                                  against tokenizers' encode(doc, add_special_tokens=True) of
                                  every document, framed as strata defines: without a BOS template
                                  the end-of-text token opens each document (closes it with
                                  --append-eod); with one, the template's BOS opens it and the
                                  end-of-text token closes it with --append-eod
"""
import json
import os
import random
import struct
import sys

from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                   "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                   "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
LLAMA3_VOCAB = 70000  # > 65,536: strata must write uint32 / int32
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SP_BYTES = [f"<0x{b:02X}>" for b in range(256)]
# The special tokens of every family, put inside documents: text right after them is where
# Prepend (legacy) and Metaspace "first" differ.
FAMILY_SPECIALS = ["<s>", "</s>", "<unk>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>",
                   "<|endoftext|>"]

WORDS = {
    "english": "the quick brown fox jumps over lazy dog while we're sure it's fine THEY'LL "
               "DON'T WE'VE I'M YOU'D She'S it'LL o'clock rock'n'roll naïve café résumé".split(),
    "german": "Straße über Größe Fußgänger Äpfel Öl Übermut schön heißt Mädchen".split(),
    "greek": "Καλημέρα κόσμε ελληνικά γλώσσα Αθήνα φιλοσοφία ψυχή ΩΜΕΓΑ".split(),
    "russian": "Привет мир русский язык Москва ЁЛКА съешь ещё этих мягких булок".split(),
    "arabic": "مرحبا بالعالم اللغة العربية القاهرة كتاب مدرسة ٠١٢٣٤٥٦٧٨٩".split(),
    "hebrew": "שלום עולם עברית ירושלים ספר".split(),
    "hindi": "नमस्ते दुनिया हिन्दी भाषा दिल्ली क़िताब ९८७६".split(),
    "thai": "สวัสดีชาวโลก ภาษาไทย กรุงเทพ".split(),
    "chinese": "你好世界 中文 北京 汉字 机器学习 深度神经网络 的 了 是".split(),
    "japanese": "こんにちは世界 日本語 東京 カタカナ ひらがな ｶﾀｶﾅ 漢字".split(),
    "korean": "안녕하세요 세계 한국어 서울 한글".split(),
    "emoji": "🙂 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇯🇵 ✨ 🤖 ☕".split(),
    "combining": ["e\u0301", "a\u0308\u0304", "n\u0303", "Z\u0351\u0358\u0361a\u0334lgo",
                  "\u0915\u093c", "o\u0328\u0301", "cafe\u0301", "A\u030a", "\u1e9b\u0323",
                  "\u0071\u0307\u0323", "\ufb01ne", "\u2126"],
    # Not NFC: conjoining jamo (NFC makes syllables of them) and decomposed syllables.
    "hangul": ["\u1100\u1161", "\u1112\u1161\u11ab\u1100\u1173\u11af", "\u1161", "\u11a8",
               "\u1109\u1165\u110b\u116e\u11af", "\u1100\u1161\u11a8", "한국어",
               "\u1103\u1161\u1100\u1161"],
    "digits": ["1", "42", "2026", "314159265358979", "1,000,000", "3.14", "٣٤٥", "１２３",
               "0x1F600", "12ab34", "v2.0.1"],
    "symbols": ["!!", "...", "—", "«»", "“quoted”", "(a+b)*c", "#include", "<tag>", "&&", "->",
                "$5", "€10", "©", "§3", "~/path"],
}
# Alphabets for made-up words, so that most words are several tokens and the merges matter.
ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZäöüßéèêçñ'",
    "αβγδεζηθικλμνξοπρστυφχψωάέήίόύώΑΒΓΔΣΩ",
    "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЁЖ",
    "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
    "कखगघचछजझटठडढणतथदधनपफबभमयरलवशषसहािीुूेैोौं्",
    "".join(chr(c) for c in range(0x4E00, 0x4F00)),
    "".join(chr(c) for c in range(0xAC00, 0xAD00)),
    "".join(chr(c) for c in range(0x3041, 0x3097)),
    "".join(chr(c) for c in range(0x1F600, 0x1F650)),
    "0123456789",
]
SPACES = [" ", " ", " ", " ", "  ", "\t", "\n", "\r\n", "\n\n", " \n", "\u00a0", "\u2003",
          "\u3000", "\u2028", "\u0085", "\x0b", "\x0c", "   ", " \t ", "\u180e", "\u200b",
          "\ufeff", "\x1c", "        ", "\n\n\n    ", "\t\t"]


def make_corpus(rng):
    docs = []
    kinds = list(WORDS)
    total = 0
    i = 0
    while total < 1_200_000:
        parts = []
        n = rng.randint(200, 3000)
        main = rng.choice(kinds)
        for _ in range(n):
            if rng.random() < 0.5:
                alphabet = rng.choice(ALPHABETS)
                parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))))
            else:
                kind = main if rng.random() < 0.6 else rng.choice(kinds)
                parts.append(rng.choice(WORDS[kind]))
            parts.append(rng.choice(SPACES))
        if i % 7 == 3:  # the end-of-text text inside a document
            parts.insert(rng.randrange(len(parts)), "<|endoftext|>")
        if i % 11 == 5:  # Llama-3 special tokens in the text
            parts.insert(rng.randrange(len(parts)), rng.choice(LLAMA3_SPECIALS[1:]))
        if i % 3 == 1:  # other families' special tokens, before words and before spaces
            for _ in range(rng.randint(1, 6)):
                parts.insert(rng.randrange(len(parts)), rng.choice(FAMILY_SPECIALS))
        if i % 13 == 0:  # leading and trailing whitespace
            parts.insert(0, "  \n")
            parts.append("\n\n   ")
        text = "".join(parts)
        docs.append(text)
        total += len(text.encode("utf-8"))
        i += 1
    return docs


def train_gpt2(docs):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer)
    return tok


def train_llama3(docs):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4000, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer)
    base = tok.get_vocab_size()
    specials = LLAMA3_SPECIALS + [f"<|reserved_special_token_{k}|>"
                                  for k in range(3, LLAMA3_VOCAB - base - len(LLAMA3_SPECIALS) + 3)]
    tok.add_special_tokens(specials)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    assert tok.get_vocab_size() == LLAMA3_VOCAB, tok.get_vocab_size()
    return tok


def train_qwen2(docs):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=CHAT_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer)
    return tok


def train_smollm(docs):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=CHAT_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(docs, trainer)
    return tok


def train_sentencepiece_style(docs, specials, unk):
    """A character-level BPE with "▁" for spaces, as the SentencePiece models transformers converts:
    the special tokens, <0x00>..<0xFF> (in the vocabulary, not added tokens), then the pieces.
    The alphabet is limited so that rare characters (CJK, emoji) need byte_fallback or unk.
    Returns the tokenizer.json as a dict, for each family to put its pipeline around."""
    tok = Tokenizer(models.BPE(unk_token=unk, byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never",
                                                 split=True)
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=specials + SP_BYTES,
                                  limit_alphabet=160, show_progress=False)
    tok.train_from_iterator(docs, trainer)
    j = json.loads(tok.to_str())
    j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] not in SP_BYTES]
    return j


def replace_json(pattern, content):
    return {"type": "Replace", "pattern": {"String": pattern}, "content": content}


def bos_template(j, bos):
    bos_id = j["model"]["vocab"][bos]
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}


SP_DECODER = {"type": "Sequence", "decoders": [replace_json("▁", " "), {"type": "ByteFallback"},
                                               {"type": "Fuse"}]}


def train_gemma(docs):
    j = train_sentencepiece_style(docs, ["<pad>", "<eos>", "<bos>", "<unk>"], "<unk>")
    j["normalizer"] = replace_json(" ", "▁")
    j["pre_tokenizer"] = {"type": "Split", "pattern": {"String": " "},
                          "behavior": "MergedWithPrevious", "invert": False}
    j["post_processor"] = bos_template(j, "<bos>")
    j["decoder"] = SP_DECODER
    return Tokenizer.from_str(json.dumps(j))


def train_llama2(docs):
    j = train_sentencepiece_style(docs, ["<unk>", "<s>", "</s>"], "<unk>")
    j["normalizer"] = {"type": "Sequence",
                       "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                       replace_json(" ", "▁")]}
    j["pre_tokenizer"] = None
    j["post_processor"] = bos_template(j, "<s>")
    j["decoder"] = SP_DECODER
    return Tokenizer.from_str(json.dumps(j))


def train_mistral(docs):
    j = train_sentencepiece_style(docs, ["<unk>", "<s>", "</s>"], "<unk>")
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                          "split": False}
    j["model"]["byte_fallback"] = False
    j["post_processor"] = bos_template(j, "<s>")
    j["decoder"] = SP_DECODER
    return Tokenizer.from_str(json.dumps(j))


# name: (trainer, end-of-text token, ids need 32 bits)
FAMILIES = {
    "gpt2": (train_gpt2, "<|endoftext|>", False),
    "llama3": (train_llama3, "<|end_of_text|>", True),
    "qwen2": (train_qwen2, "<|endoftext|>", False),
    "smollm": (train_smollm, "<|endoftext|>", False),
    "gemma": (train_gemma, "<eos>", False),
    "llama2": (train_llama2, "</s>", False),
    "mistral": (train_mistral, "</s>", False),
}


def make(out):
    rng = random.Random(20261202)
    docs = make_corpus(rng)
    os.makedirs(f"{out}/corpus", exist_ok=True)
    for i, d in enumerate(docs):
        with open(f"{out}/corpus/doc_{i:05d}.txt", "w", encoding="utf-8", newline="") as f:
            f.write(d)
    for name, (train, _, _) in FAMILIES.items():
        os.makedirs(f"{out}/{name}", exist_ok=True)
        train(docs).save(f"{out}/{name}/tokenizer.json")
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    print(f"corpus: {len(docs)} documents, {nbytes} bytes")


def expected_docs(out, name, append_eod):
    tok = Tokenizer.from_file(f"{out}/{name}/tokenizer.json")
    files = sorted(os.listdir(f"{out}/corpus"))
    texts = []
    for f in files:
        with open(f"{out}/corpus/{f}", encoding="utf-8", newline="") as fh:
            texts.append(fh.read())
    encs = tok.encode_batch(texts, add_special_tokens=True)
    eot = tok.token_to_id(FAMILIES[name][1])
    with_bos = len(tok.encode("", add_special_tokens=True).ids) > 0
    docs = []
    for e in encs:
        ids = list(e.ids)
        if not with_bos:
            ids = ids + [eot] if append_eod else [eot] + ids
        elif append_eod:
            ids.append(eot)
        docs.append(ids)
    return files, docs


def read_llmc(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, ntok = struct.unpack_from("<3i", data, 0)
    width = {20240520: 2, 20240801: 4}[magic]
    fmt = {2: "H", 4: "I"}[width]
    assert len(data) == 1024 + ntok * width, "shard size does not match its header"
    return width, list(struct.unpack_from(f"<{ntok}{fmt}", data, 1024))


def read_megatron(prefix):
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    code = idx[17]
    seqs, _ = struct.unpack_from("<QQ", idx, 18)
    sizes = struct.unpack_from(f"<{seqs}i", idx, 34)
    pointers = struct.unpack_from(f"<{seqs}q", idx, 34 + 4 * seqs)
    width, fmt = {8: (2, "H"), 4: (4, "i")}[code]
    with open(prefix + ".bin", "rb") as f:
        bin_ = f.read()
    return width, [list(struct.unpack_from(f"<{n}{fmt}", bin_, p)) for n, p in zip(sizes, pointers)]


def first_difference(a, b):
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return min(len(a), len(b))


def check(out, name, fmt, path, append_eod):
    files, want = expected_docs(out, name, append_eod)
    want_width = 4 if FAMILIES[name][2] else 2
    if fmt == "llmc":
        width, stream = read_llmc(path)
        got, pos = [], 0
        for d in want:  # cut the stream where the expected documents end
            got.append(stream[pos:pos + len(d)])
            pos += len(d)
        if pos != len(stream):
            got[-1] += stream[pos:]
    else:
        width, got = read_megatron(path)
    if width != want_width:
        sys.exit(f"{name} {fmt}: token width {width} bytes, expected {want_width}")
    if len(got) != len(want):
        sys.exit(f"{name} {fmt}: {len(got)} documents, tokenizers made {len(want)}")
    ntok = 0
    for f, g, w in zip(files, got, want):
        if g != w:
            k = first_difference(g, w)
            sys.exit(f"{name} {fmt}: {f} differs from tokenizers at token {k}: strata "
                     f"{g[max(0, k - 3):k + 5]}, tokenizers {w[max(0, k - 3):k + 5]}")
        ntok += len(w)
    print(f"{name} {fmt}{' --append-eod' if append_eod else ''}: {len(want)} documents, "
          f"{ntok} tokens identical to tokenizers")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        check(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], "--append-eod" in sys.argv[6:])
