#!/usr/bin/env python3
"""The transformers side of tests/train/hf_sft_test.sh (run in the peer venv).

    hf_sft_peer.py make DIR          a tiny random Qwen2 (fp32, eager attention) and a byte-level
                                     BPE tokenizer with ChatML's tokens and Qwen2.5's chat template,
                                     saved as DIR/hf/; DIR/conversations.jsonl, conversations with
                                     and without system prompts, of one to three turns, and
                                     prompt/completion pairs
    hf_sft_peer.py check DIR DATA T STEPS WINDOWS RUN EXPORT
                                     checks strata's work against transformers:
        - DATA/train and DATA/val (Megatron .bin/.idx/.lossmask) hold, per conversation, the ids
          of apply_chat_template(tokenize=True), trained on its assistant turns;
        - DATA/train packed first-fit into windows of T (written here from the files, not by
          strata) gives WINDOWS windows, the count strata printed;
        - transformers trained STEPS steps of AdamW on all of them at once, as it trains on a
          flattened batch (DataCollatorWithFlattening: position ids that restart at each
          document, no attention mask; labels -100 where DATA/train.lossmask says 0 and at each
          document's first token), has the losses of RUN/metrics.jsonl (1e-5), and after them the
          validation loss strata computed (DATA/val packed, GBS windows modulo its windows);
        - the model in EXPORT (strata's, exported) has transformers' trained model's loss.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

LR, WD, CLIP = 3e-3, 0.1, 1.0

# Qwen2.5's template, without its tool-calling branches (no conversation here calls tools).
TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\") %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")

WORDS = ("the model reads every token of a window and learns the next one; packed documents do "
         "not see each other, and positions restart where a conversation begins. Ärger über "
         "Ünicode — 東京 café naïve 42 7 1999").split()


def conversations():
    rng = np.random.default_rng(17)

    def sentence(lo, hi):
        return " ".join(rng.choice(WORDS, size=int(rng.integers(lo, hi))))

    out = []
    for i in range(36):
        if i % 6 == 5:
            out.append({"prompt": sentence(3, 12), "completion": sentence(2, 20)})
            continue
        messages = []
        if i % 3 == 0:
            messages.append({"role": "system", "content": "You answer in " + sentence(1, 4)})
        for _ in range(int(rng.integers(1, 4))):
            messages.append({"role": "user", "content": sentence(2, 14)})
            messages.append({"role": "assistant", "content": sentence(1, 24)})
        out.append({"messages": messages})
    return out


def as_messages(c):
    if "messages" in c:
        return c["messages"]
    return [{"role": "user", "content": c["prompt"]},
            {"role": "assistant", "content": c["completion"]}]


def make(out):
    convs = conversations()
    with open(os.path.join(out, "conversations.jsonl"), "w", encoding="utf-8") as f:
        for c in convs:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300,
                                  special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([m["content"] for c in convs for m in as_messages(c)] * 4, trainer)
    hf = os.path.join(out, "hf")
    os.makedirs(hf, exist_ok=True)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                                pad_token="<|endoftext|>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(hf)
    torch.manual_seed(5)
    config = transformers.Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=64,
                                      intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, rms_norm_eps=1e-6,
                                      rope_theta=10000.0, tie_word_embeddings=False)
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
    model.save_pretrained(hf, safe_serialization=True)
    print(f"qwen2: vocab {tok.get_vocab_size()}, "
          f"{sum(p.numel() for p in model.parameters())} parameters, {len(convs)} conversations")


def read_split(data, split="train"):
    idx = open(f"{data}/{split}.idx", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00", "not a Megatron index"
    code = idx[17]
    seqs = int(np.frombuffer(idx[18:26], np.uint64)[0])
    sizes = np.frombuffer(idx[34:34 + 4 * seqs], np.int32)
    dtype = {8: np.uint16, 4: np.int32}[code]
    ids = np.fromfile(f"{data}/{split}.bin", dtype).astype(np.int64)
    mask_bytes = open(f"{data}/{split}.lossmask", "rb").read()
    assert mask_bytes[:8] == b"STRLMASK"
    mask = np.frombuffer(mask_bytes[24:], np.uint8)
    assert len(mask) == len(ids) == int(sizes.sum())
    docs, at = [], 0
    for n in sizes:
        docs.append((ids[at:at + n], mask[at:at + n]))
        at += int(n)
    return docs


def check_ids(out, data):
    tok = transformers.AutoTokenizer.from_pretrained(os.path.join(out, "hf"))
    convs = [json.loads(line) for line in open(os.path.join(out, "conversations.jsonl"))]
    docs = read_split(data) + read_split(data, "val")
    assert len(docs) == len(convs), f"{len(docs)} documents for {len(convs)} conversations"
    trained = 0
    for k, (c, (ids, mask)) in enumerate(zip(convs, docs)):
        want = tok.apply_chat_template(as_messages(c), tokenize=True)
        assert list(ids) == list(want), f"conversation {k}: ids differ\n{list(ids)}\n{want}"
        # The trained tokens are the assistant turns, each through <|im_end|> and its newline.
        text = tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=False)
        answers = "".join(m["content"] + "<|im_end|>\n" for m in as_messages(c)
                          if m["role"] == "assistant")
        assert text == answers, f"conversation {k}: trained text {text!r}, want {answers!r}"
        trained += int(mask.sum())
    print(f"  {len(convs)} conversations: ids as apply_chat_template's, {trained} trained tokens "
          "are the assistant turns")


def pack(docs, T):
    """First-fit in order; a document longer than T cut into pieces of T overlapping by one."""
    pieces = []
    for ids, mask in docs:
        p = 0
        while p + 1 < len(ids):
            pieces.append((ids[p:p + T], mask[p:p + T]))
            p += T - 1
    windows, room = [], []
    for ids, mask in pieces:
        w = next((i for i, r in enumerate(room) if r >= len(ids)), None)
        if w is None:
            windows.append([])
            room.append(T)
            w = len(windows) - 1
        windows[w].append((ids, mask))
        room[w] -= len(ids)
    rows, positions, labels = [], [], []
    for w in windows:
        row, pos, lab = [], [], []
        for ids, mask in w:
            row += list(ids)
            pos += list(range(len(ids)))
            lab += [-100] + [int(t) if m else -100 for t, m in zip(ids[1:], mask[1:])]
        pad = T - len(row)
        row += [0] * pad
        pos += list(range(pad))
        lab += [-100] * pad
        rows.append(row), positions.append(pos), labels.append(lab)
    return (torch.tensor(rows), torch.tensor(positions), torch.tensor(labels))


def loss_of(model, batch, windows=None):
    rows, positions, labels = batch if windows is None else (t[windows] for t in batch)
    logits = model(input_ids=rows, position_ids=positions, use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             labels[:, 1:].reshape(-1), ignore_index=-100)


def load(model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="eager", dtype=torch.float32)


def train(out, data, T, steps):
    """transformers' losses over the steps, its loss after them, and its validation loss."""
    batch = pack(read_split(data), T)
    model = load(os.path.join(out, "hf"))
    decay = [p for p in model.parameters() if p.ndim >= 2]
    other = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": other, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.999),
                            eps=1e-8)
    model.train()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_of(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
    # strata's validation batch: windows 0 .. GBS-1 of the val split modulo its windows, in order.
    val = pack(read_split(data, "val"), T)
    model.eval()
    with torch.no_grad():
        final = loss_of(model, batch).item()
        val_loss = loss_of(model, val, torch.arange(len(batch[0])) % len(val[0])).item()
    return len(batch[0]), losses, final, val_loss


def close(what, got, want):
    err = abs(got - want) / abs(want)
    assert err <= 1e-5, f"{what}: {got} against transformers' {want}"
    return err


def check(out, data, T, steps, windows, run, export):
    check_ids(out, data)
    n, theirs, final, val_loss = train(out, data, T, steps)
    assert n == windows, f"strata packed {windows} windows, first-fit here gives {n}"
    rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))
            if '"loss"' in line]
    ours = [r["loss"] for r in rows]
    assert len(ours) == len(theirs), (ours, theirs)
    err = max(close(f"step {i + 1}", a, b) for i, (a, b) in enumerate(zip(ours, theirs)))
    trained = {r["trained_tokens"] for r in rows}
    assert len(trained) == 1 and all(r["trained_tokens"] < r["tokens"] for r in rows), rows[0]
    assert all(r["trained_tokens_per_s"] < r["tokens_per_s"] for r in rows), rows[0]
    print(f"  {len(ours)} steps on {n} packed windows, {trained.pop()} trained tokens a step: "
          f"losses {ours[0]:.6f} .. {ours[-1]:.6f}, max relative difference {err:.2e}")
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    assert len(val) == 1, rows
    verr = close("validation loss", val[0], val_loss)
    print(f"  validation loss over the trained tokens {val[0]:.6f}, transformers {val_loss:.6f}: "
          f"relative difference {verr:.2e}")
    model = load(export).eval()
    with torch.no_grad():
        got = loss_of(model, pack(read_split(data), T)).item()
    eerr = close("the export's loss", got, final)
    print(f"  the export in transformers: loss {got:.6f}, transformers' own trained model "
          f"{final:.6f}: relative difference {eerr:.2e}")


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        check(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]),
              sys.argv[7], sys.argv[8])
