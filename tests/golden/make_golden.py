#!/usr/bin/env python3
"""PyTorch reference for strata's golden test.

strata's `golden` test writes INIT.safetensors (the model's initial F32
parameters under strata's names, a fixed batch "tokens" I32 of shape (B, T+1)
and the model/optimiser config as string __metadata__), runs this script, then
compares strata's own forward, backward and training steps against OUT:

    make_golden.py --init INIT.safetensors --out OUT.safetensors

OUT holds (all F32):
    logits        (B, T, V)  forward at the initial weights
    loss          (1,)       mean cross-entropy over all B*T targets
    grad.<name>   per param  gradient of that loss at the initial weights
    losses        (steps,)   loss in the forward of each training step
                             (losses[0] == loss)
and INIT's __metadata__ copied verbatim.

Each training step: forward on the same batch, backward,
clip_grad_norm_(grad_clip) if grad_clip > 0, AdamW step (weight decay only for
parameters with ndim >= 2), constant lr. Everything is fp32 on the CPU with one
thread. Only torch and numpy are needed; safetensors is read/written by hand.
"""
import argparse
import json
import math
import struct

import numpy as np
import torch
import torch.nn.functional as F

_NP = {"F32": np.float32, "I32": np.int32, "F64": np.float64, "I64": np.int64}


def read_safetensors(path):
    """Return ({name: torch.Tensor}, metadata dict)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    buf = blob[8 + n:]
    tensors = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        raw, shape = buf[b:e], info["shape"]
        if info["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(_NP[info["dtype"]]).newbyteorder("<"))
        tensors[name] = torch.from_numpy(arr.reshape(shape).copy())
    return tensors, meta


def write_safetensors(path, tensors, meta):
    """Write {name: tensor} as F32 (float) / I32 (int) with string metadata."""
    header, chunks, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu()
        if t.is_floating_point():
            arr, dt = t.to(torch.float32).numpy().astype("<f4"), "F32"
        else:
            arr, dt = t.to(torch.int32).numpy().astype("<i4"), "I32"
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(t.shape),
                        "data_offsets": [off, off + len(data)]}
        chunks.append(data)
        off += len(data)
    header["__metadata__"] = {str(k): str(v) for k, v in meta.items()}
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for c in chunks:
            f.write(c)


def causal_attention(q, k, v):
    """q: (B, H, T, hd); k, v: (B, H, T, hd). Explicit masked softmax."""
    T, hd = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return att @ v


def gpt2_forward(cfg, p, idx):
    B, T = idx.shape
    C, H = cfg["hidden"], cfg["heads"]
    hd, eps = C // H, cfg["norm_eps"]
    ln = lambda x, pre: F.layer_norm(x, (C,), p[pre + ".weight"], p[pre + ".bias"], eps)
    x = p["wte"][idx] + p["wpe"][:T]
    for l in range(cfg["layers"]):
        a = f"h.{l}."
        qkv = F.linear(ln(x, a + "ln_1"), p[a + "attn.c_attn.weight"], p[a + "attn.c_attn.bias"])
        q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in qkv.split(C, dim=-1))
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, p[a + "attn.c_proj.weight"], p[a + "attn.c_proj.bias"])
        h = F.linear(ln(x, a + "ln_2"), p[a + "mlp.c_fc.weight"], p[a + "mlp.c_fc.bias"])
        h = F.gelu(h, approximate="tanh")
        x = x + F.linear(h, p[a + "mlp.c_proj.weight"], p[a + "mlp.c_proj.bias"])
    x = ln(x, "ln_f")
    head = p["wte"] if cfg["tied"] else p["lm_head.weight"]
    return x @ head.t()


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * w


def rope_cos_sin(T, hd, theta, dtype):
    # Hugging Face Llama convention: inv_freq[i] = theta^(-2i/hd), cos/sin = cat([f, f]).
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def llama_forward(cfg, p, idx):
    B, T = idx.shape
    C, H, KV, Fh = cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["ffn_hidden"]
    hd, eps = C // H, cfg["norm_eps"]
    x = p["embed_tokens"][idx]
    cos, sin = rope_cos_sin(T, hd, cfg["rope_theta"], x.dtype)
    for l in range(cfg["layers"]):
        a = f"layers.{l}."
        h = rms_norm(x, p[a + "input_layernorm.weight"], eps)
        qkv = F.linear(h, p[a + "self_attn.qkv_proj.weight"])
        q, k, v = qkv.split([H * hd, KV * hd, KV * hd], dim=-1)
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, KV, hd).transpose(1, 2)
        v = v.view(B, T, KV, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)  # query head h -> kv head h // (H // KV)
        v = v.repeat_interleave(H // KV, dim=1)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + F.linear(y, p[a + "self_attn.o_proj.weight"])
        h = rms_norm(x, p[a + "post_attention_layernorm.weight"], eps)
        gate, up = F.linear(h, p[a + "mlp.gate_up_proj.weight"]).split(Fh, dim=-1)
        x = x + F.linear(F.silu(gate) * up, p[a + "mlp.down_proj.weight"])
    x = rms_norm(x, p["norm.weight"], eps)
    head = p["embed_tokens"] if cfg["tied"] else p["lm_head.weight"]
    return x @ head.t()


def parse_config(meta):
    ints = ["layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "steps"]
    floats = ["norm_eps", "rope_theta", "lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip"]
    cfg = {"family": meta["family"], "tied": meta["tied"].strip().lower() == "true"}
    for k in ints:
        if k in meta:
            cfg[k] = int(meta[k])
    for k in floats:
        if k in meta:
            cfg[k] = float(meta[k])
    if cfg["family"] not in ("gpt2", "llama"):
        raise ValueError(f"unknown family {cfg['family']!r}")
    return cfg


def forward(cfg, params, idx):
    fn = gpt2_forward if cfg["family"] == "gpt2" else llama_forward
    return fn(cfg, params, idx)


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", required=True, help="INIT.safetensors written by strata")
    ap.add_argument("--out", required=True, help="OUT.safetensors to write")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)

    tensors, meta = read_safetensors(args.init)
    cfg = parse_config(meta)
    tokens = tensors.pop("tokens").long()
    idx, targets = tokens[:, :-1], tokens[:, 1:]
    # Every other tensor is a parameter; copy it exactly into an fp32 leaf.
    params = {n: torch.nn.Parameter(t.to(torch.float32).clone()) for n, t in tensors.items()}

    decay = [p for p in params.values() if p.ndim >= 2]
    no_decay = [p for p in params.values() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"], foreach=False)

    out, losses = {}, []
    for step in range(cfg["steps"]):
        opt.zero_grad(set_to_none=True)
        logits = forward(cfg, params, idx)
        loss = loss_fn(logits, targets)
        loss.backward()
        losses.append(loss.item())
        if step == 0:  # initial-weight outputs, gradients before clipping
            out["logits"] = logits.detach().clone()
            out["loss"] = loss.detach().reshape(1).clone()
            for n, p in params.items():
                out["grad." + n] = p.grad.detach().clone()
        if cfg["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), cfg["grad_clip"])
        opt.step()
    if "logits" not in out:  # steps == 0: still emit the initial-weight outputs
        logits = forward(cfg, params, idx)
        loss = loss_fn(logits, targets)
        loss.backward()
        out["logits"], out["loss"] = logits.detach(), loss.detach().reshape(1)
        out.update({"grad." + n: p.grad.detach() for n, p in params.items()})
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    write_safetensors(args.out, out, meta)
    print(f"{cfg['family']}: loss {losses[0]:.6f} -> {losses[-1]:.6f} over {len(losses)} steps")


if __name__ == "__main__":
    main()
