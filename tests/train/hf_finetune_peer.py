#!/usr/bin/env python3
"""The Hugging Face side of tests/train/hf_finetune_test.sh (run in the peer venv).

    hf_finetune_peer.py make DIR FAMILY        a tiny random GPT-2 or Llama and a byte-level BPE
                                               tokenizer trained on /usr/share/common-licenses,
                                               saved as DIR/{config.json, model.safetensors,
                                               tokenizer.json}
    hf_finetune_peer.py val-loss DIR VAL T N   the mean loss transformers computes for the first N
                                               windows of T+1 tokens of VAL, read in order (window
                                               w: tokens w*T .. w*T+T, wrapping), as strata
                                               evaluates; printed
"""
import glob
import sys

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CORPUS = "/usr/share/common-licenses"


def documents():
    texts = []
    for path in sorted(glob.glob(CORPUS + "/*")):
        try:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        except (UnicodeDecodeError, IsADirectoryError):
            pass
    return texts


def make(out, family):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(documents(), trainer)
    tok.save(out + "/tokenizer.json")
    vocab = tok.get_vocab_size()
    torch.manual_seed(5)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=vocab, n_positions=64, n_embd=64, n_layer=2,
                                         n_head=4, layer_norm_epsilon=1e-5)
        model = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, max_position_embeddings=64,
                                          rms_norm_eps=1e-5, rope_theta=10000.0,
                                          tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    print(f"{family}: vocab {vocab}, {sum(p.numel() for p in model.parameters())} parameters")


def val_loss(model_dir, val, T, N):
    magic = int(np.fromfile(val, dtype=np.int32, count=1)[0])  # llm.c: GPT-2 uint16, Llama-3 uint32
    dtype = np.uint32 if magic == 20240801 else np.uint16
    ids = np.fromfile(val, dtype=dtype, offset=1024).astype(np.int64)
    windows = (len(ids) - 1) // T
    rows = [ids[(w % windows) * T:(w % windows) * T + T + 1] for w in range(N)]
    batch = torch.tensor(np.stack(rows))
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).float().eval()
    with torch.no_grad():
        logits = model(batch[:, :-1]).logits.double()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             batch[:, 1:].reshape(-1))
    print(f"{loss.item():.9f}")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make":
        make(sys.argv[2], sys.argv[3])
    else:
        val_loss(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
