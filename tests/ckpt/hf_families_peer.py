#!/usr/bin/env python3
"""The transformers side of tests/ckpt/hf_families_test.sh (run in the peer venv).

    hf_families_peer.py make DIR FAMILY...
                                          for each FAMILY, a tiny random model made by
                                          transformers (fp32, eager attention, norm weights
                                          randomised, sliding windows shorter than the sequence),
                                          saved as DIR/FAMILY/hf/{config.json, model.safetensors};
                                          DIR/FAMILY/data.bin, an llm.c shard of exactly GBS
                                          windows of T+1 tokens (so that every strata step trains
                                          on all of them, in whatever order); DIR/FAMILY/tokens.bin,
                                          their inputs as int32; and DIR/FAMILY/reference.json:
                                          transformers' logits of those windows and its losses over
                                          STEPS steps of AdamW with gradient clipping on them
    hf_families_peer.py logits DIR FAMILY...
                                          for each FAMILY, the logits transformers computes with
                                          the model in DIR/FAMILY/export (a strata export) for the
                                          windows of its data.bin, written as float32 to
                                          DIR/FAMILY/ref1.bin
One process does every family: PyTorch's import is paid once.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers

T, GBS, STEPS, VOCAB = 16, 8, 10, 96
LR, WD, CLIP = 3e-3, 0.1, 1.0


def config(family):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                  rms_norm_eps=1e-5, attention_dropout=0.0, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2)
    if family == "llama":  # a Llama 3.2 / SmolLM2 style model: llama3 RoPE scaling, tied
        return transformers.LlamaConfig(
            **common, tie_word_embeddings=True, rope_theta=5e5,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8})
    if family == "mistral":  # a window of 5 on every layer
        return transformers.MistralConfig(**common, sliding_window=5, head_dim=16,
                                          tie_word_embeddings=False, rope_theta=1e6)
    if family == "qwen2":  # q/k/v biases, yarn RoPE scaling, tied
        return transformers.Qwen2Config(
            **common, tie_word_embeddings=True, rope_theta=1e6, use_sliding_window=False,
            rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4})
    if family == "qwen3":  # per-head q/k norms, head_dim 24 apart from hidden / heads
        return transformers.Qwen3Config(**common, head_dim=24, tie_word_embeddings=True,
                                        rope_theta=1e6, attention_bias=False,
                                        use_sliding_window=False)
    if family == "phi3":  # fused qkv_proj and gate_up_proj, a window of 6 on every layer
        return transformers.Phi3Config(**common, sliding_window=6, tie_word_embeddings=False,
                                       original_max_position_embeddings=T, resid_pdrop=0.0,
                                       embd_pdrop=0.0)
    if family == "smollm3":  # RoPE left out on every second layer of 4
        c = dict(common, num_hidden_layers=4)
        return transformers.SmolLM3Config(**c, no_rope_layer_interval=2, tie_word_embeddings=True,
                                          rope_theta=2e6, use_sliding_window=False)
    if family == "gemma3":  # sandwich (1 + w) norms, GeGLU, scaled embeddings and scores, per-head
        # q/k norms, a window on the first layer, a local RoPE base apart from the global scaled one
        return transformers.Gemma3TextConfig(
            **common, head_dim=24, query_pre_attn_scalar=20, sliding_window=4,
            layer_types=["sliding_attention", "full_attention"], rope_theta=1e6,
            rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 2.0},
            hidden_activation="gelu_pytorch_tanh", attn_logit_softcapping=None,
            final_logit_softcapping=None, tie_word_embeddings=True)
    if family == "gemma2":  # Gemma 3's block without q/k norms, with soft-capped scores and logits
        # (caps low enough that tanh bends), a window on every second layer
        return transformers.Gemma2Config(
            **common, head_dim=16, query_pre_attn_scalar=24, sliding_window=5, rope_theta=1e4,
            attn_logit_softcapping=2.0, final_logit_softcapping=1.5,
            hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)
    if family == "olmo2":  # post norms, q/k norms over whole projections
        return transformers.Olmo2Config(**common, rope_theta=5e5, attention_bias=False,
                                        tie_word_embeddings=False)
    # The mixtures of experts, with transformers' balancing loss (output_router_logits) at a
    # coefficient large enough to show in the losses.
    moe = dict(output_router_logits=True, router_aux_loss_coef=0.05)
    if family == "mixtral":  # renormalised top 2 of 4 experts on every layer
        return transformers.MixtralConfig(**common, **moe, num_local_experts=4,
                                          num_experts_per_tok=2, sliding_window=None,
                                          tie_word_embeddings=False, rope_theta=1e6)
    if family == "qwen2_moe":  # top 2 of 4, not renormalised, a gated shared expert, q/k/v
        # biases, a dense middle layer
        c = dict(common, num_hidden_layers=3)
        return transformers.Qwen2MoeConfig(**c, **moe, num_experts=4, num_experts_per_tok=2,
                                           moe_intermediate_size=48,
                                           shared_expert_intermediate_size=64,
                                           norm_topk_prob=False, mlp_only_layers=[1],
                                           use_sliding_window=False, tie_word_embeddings=True,
                                           rope_theta=1e6)
    if family == "qwen3_moe":  # renormalised top 3 of 8, per-head q/k norms
        return transformers.Qwen3MoeConfig(**common, **moe, head_dim=24, num_experts=8,
                                           num_experts_per_tok=3, moe_intermediate_size=32,
                                           norm_topk_prob=True, attention_bias=False,
                                           use_sliding_window=False, tie_word_embeddings=False,
                                           rope_theta=1e6)
    raise SystemExit(f"unknown family {family}")


def windows(tokens):
    return torch.tensor(np.stack([tokens[w * T:w * T + T + 1] for w in range(GBS)]),
                        dtype=torch.long)


def write_llmc(path, tokens):
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def loss_of(model, batch):
    cfg = model.config
    moe = getattr(cfg, "output_router_logits", False)
    out = model(batch[:, :-1], output_router_logits=moe) if moe else model(batch[:, :-1])
    logits = out.logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             batch[:, 1:].reshape(-1))
    if moe:
        # transformers' balancing loss (its layers pooled) over each sequence, averaged over the
        # batch's sequences: strata's statistic, which no micro-batch split or layout changes.
        from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
        experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
        B, T = batch.shape[0], batch.shape[1] - 1
        per_layer = [r.view(B, T, -1) for r in out.router_logits]
        aux = sum(load_balancing_loss_func(tuple(r[b] for r in per_layer), experts,
                                           cfg.num_experts_per_tok) for b in range(B)) / B
        loss = loss + cfg.router_aux_loss_coef * aux
    return loss


def make(out, family):
    torch.manual_seed(11)
    cfg = config(family)
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    model = model.float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                # Gains near 1, none alike, so that a wrong gain or placement shows: w itself,
                # or Gemma's 1 + w (a gain of w would be near 0).
                base = 0.0 if family.startswith("gemma") else 1.0
                p.copy_(base + 0.3 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
    model.save_pretrained(os.path.join(out, "hf"), safe_serialization=True)
    rng = np.random.default_rng(3)
    tokens = rng.integers(3, VOCAB, size=GBS * T + 1)
    write_llmc(os.path.join(out, "data.bin"), tokens)
    batch = windows(tokens)
    batch[:, :-1].numpy().astype(np.int32).tofile(os.path.join(out, "tokens.bin"))
    model.eval()
    with torch.no_grad():
        logits = model(batch[:, :-1]).logits
    # strata's AdamW: decay on the matrices (ndim >= 2), none on gains and biases.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    other = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": other, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.999),
                            eps=1e-8)
    losses = []
    model.train()
    for _ in range(STEPS):
        opt.zero_grad()
        loss = loss_of(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"losses": losses, "logits": logits.flatten().tolist(), "vocab": VOCAB,
                   "T": T, "gbs": GBS, "steps": STEPS, "lr": LR, "weight_decay": WD,
                   "clip": CLIP}, f)
    print(f"{family}: {type(model).__name__}, "
          f"{sum(p.numel() for p in model.parameters())} parameters, losses "
          f"{losses[0]:.6f} .. {losses[-1]:.6f}")


def logits(model_dir, out):
    data = os.path.join(os.path.dirname(os.path.abspath(model_dir)), "data.bin")
    tokens = np.fromfile(data, dtype=np.uint16, offset=1024).astype(np.int64)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        result = model(windows(tokens)[:, :-1]).logits
    result.numpy().astype(np.float32).tofile(out)


if __name__ == "__main__":
    for family in sys.argv[3:]:
        d = os.path.join(sys.argv[2], family)
        if sys.argv[1] == "make":
            os.makedirs(d, exist_ok=True)
            make(d, family)
        else:
            logits(os.path.join(d, "export"), os.path.join(d, "ref1.bin"))
