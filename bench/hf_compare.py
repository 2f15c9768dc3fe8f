#!/usr/bin/env python3
"""Compares strata's logits with Hugging Face transformers' on a strata export.

    python bench/hf_compare.py --export DIR [--tokens TOKENS.bin --logits LOGITS.bin
                               --batch B] [--dtype fp32|bf16] [--tol TOL]

DIR is what strata's Hugging Face export wrote (config.json + model.safetensors). It is loaded
with AutoModelForCausalLM.from_pretrained(DIR, dtype=...) (torch_dtype= before transformers 4.56);
loading alone checks that the file holds exactly the tensors transformers builds from
config.json: any missing, unexpected or mismatched key is printed and the script exits 1.

File formats (little-endian, no header, row-major):
    TOKENS.bin  int32 token ids, B*T of them: B sequences of T tokens (T = bytes / 4 / B).
    LOGITS.bin  float32 logits strata computed for those tokens, B*T*V of them: sequence b,
                position t, vocabulary entry v at element (b*T + t)*V + v, with V the export's
                vocab_size (unpadded).

With --tokens and --logits the script runs the B sequences through the model (causal attention
from position 0, no padding) and prints the max absolute difference of the logits, the max
relative one (to max(|transformers' logit|, 1e-3)) and at how many positions the argmax agrees;
it exits 1 if the max absolute difference exceeds --tol (default 1e-3 for fp32; 1e-1 for bf16,
where transformers runs the model in bf16 and strata's logits may be fp32).
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging


def load(export, dtype):
    # transformers calls it dtype since 4.56, torch_dtype before.
    version = tuple(int(x) for x in transformers.__version__.split(".")[:2])
    key = "dtype" if version >= (4, 56) else "torch_dtype"
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            export, output_loading_info=True, **{key: dtype})
    except (OSError, RuntimeError, ValueError) as e:  # a shape mismatch raises
        print(f"cannot load {export}: {e}")
        return None, False
    problems = {k: v for k, v in info.items() if v}
    print(f"loaded {type(model).__name__} from {export} ({dtype}): "
          f"{sum(p.numel() for p in model.parameters())} parameters")
    for kind, keys in problems.items():
        print(f"  {kind}: {sorted(keys)}")
    return model.eval(), not problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--export", required=True, help="directory strata's export wrote")
    ap.add_argument("--tokens", help="int32 token ids, B*T (see the file's docstring)")
    ap.add_argument("--logits", help="float32 strata logits, B*T*V")
    ap.add_argument("--batch", type=int, default=1, help="B: sequences in TOKENS.bin")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--tol", type=float, help="max abs difference allowed")
    args = ap.parse_args()
    if (args.tokens is None) != (args.logits is None):
        ap.error("--tokens and --logits go together")

    hf_logging.set_verbosity_warning()
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    tol = args.tol if args.tol is not None else (1e-3 if args.dtype == "fp32" else 1e-1)
    model, clean = load(args.export, dtype)
    if not clean:
        print("FAIL: the export does not match the model transformers builds from config.json")
        return 1
    if args.tokens is None:
        return 0

    with open(os.path.join(args.export, "config.json")) as f:
        V = json.load(f)["vocab_size"]
    tokens = np.fromfile(args.tokens, dtype="<i4")
    B = args.batch
    if tokens.size == 0 or tokens.size % B:
        sys.exit(f"{args.tokens}: {tokens.size} token ids do not make {B} equal sequences")
    T = tokens.size // B
    ours = np.fromfile(args.logits, dtype="<f4")
    if ours.size != B * T * V:
        sys.exit(f"{args.logits}: {ours.size} floats, expected B*T*V = {B}*{T}*{V}")
    ours = ours.reshape(B, T, V).astype(np.float64)

    with torch.no_grad():
        ids = torch.from_numpy(tokens.reshape(B, T).astype(np.int64))
        theirs = model(input_ids=ids).logits.float().numpy().astype(np.float64)

    diff = np.abs(ours - theirs)
    rel = diff / np.maximum(np.abs(theirs), 1e-3)  # near-zero logits: relative to 1e-3
    agree = (ours.argmax(-1) == theirs.argmax(-1))
    print(f"B={B} T={T} V={V}: max abs diff {diff.max():.3e}, mean abs diff {diff.mean():.3e}, "
          f"max rel diff {rel.max():.3e}, max |logit| {np.abs(theirs).max():.3e}")
    print(f"argmax agrees at {int(agree.sum())}/{agree.size} positions")
    if diff.max() > tol:
        print(f"FAIL: max abs diff {diff.max():.3e} > tol {tol:.1e}")
        return 1
    print(f"OK (tol {tol:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
