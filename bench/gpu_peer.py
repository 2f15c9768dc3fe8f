#!/usr/bin/env python3
"""The PyTorch peer on one GPU (../shared/peers/README.md, "On a GPU"): training-step throughput
and MFU of GPT-2-124M (eager and torch.compile) and of a Llama-1B-like model, random tokens,
for strata's CUDA backend to be compared with on the same machine (docs/gpu.md).

    python3 bench/gpu_peer.py --peak-json gpu_gemm.json --json gpu_peer.json   # scripts/gpu_check.sh
    python3 bench/gpu_peer.py --device cpu --tiny --no-compile                 # smoke test

Configurations (run in this order; each one's result is written to --json as soon as it ends):
  gpt2-124M eager    12 layers, C 768, 12 heads, vocab 50304 (padded, as llm.c), T 1024, tied
                     embeddings, learned positions, LayerNorm, GELU (tanh), biases; attention
                     through F.scaled_dot_product_attention(is_causal=True) (flash).
  llama-1B           strata's `llama-1B` preset: 16 layers, C 2048, 32 heads, 8 KV heads,
                     FFN 8192 (SwiGLU), vocab 128256 (--llama-vocab 32000 for the Llama-2
                     vocabulary), T 2048, RMSNorm, RoPE (theta 500000), no biases, untied
                     embeddings (--llama-tied to tie them), full activation checkpointing (every
                     block recomputed in backward, torch.utils.checkpoint, non-reentrant), at the
                     largest micro-batch that fits (doubling from 1, then a bisection step or two;
                     --llama-batch N to fix it).
  gpt2-124M compile  the eager model under torch.compile (default mode); skipped, and reported as
                     such, with --no-compile, without a C compiler (Triton and Inductor build
                     with one), or when compiling fails (the error is reported).
Every configuration: fp32 master parameters, bf16 autocast for the forward and the loss, AdamW
(lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the matrices and embeddings, none on
biases and norm gains, as nanoGPT and llm.c), the fused AdamW kernel where this torch has it,
gradients set to None after each step. One step = forward, loss, backward, optimizer step.

Timing: --warmup untimed steps, then --steps steps, each between two CUDA events recorded on the
stream without synchronising in between (the time of each step on the GPU, the host running
ahead as it would in training); the median step time gives tokens/s. On the CPU (--device cpu)
perf_counter per step.

MFU = FLOPs/token x tokens/s / peak. FLOPs/token = 6·N + 6·L·C·T, llm.c's gpt2_estimate_mfu:
6·N is forward (2 FLOP per parameter per token: one multiply-add) plus backward (twice the
forward: the gradients of the inputs and of the weights) for every parameter's matmul; 6·L·C·T is
the attention's two T x T matmuls (QKᵀ and AV, 2·2·T·C per token per layer forward, times 3 for
forward + backward) counting only the causal half that a flash kernel computes. N is every
parameter (llm.c counts the padded vocabulary and the position table; for an untied Llama the
input embedding is counted although it does no matmul: mfu_matmul leaves it out). Recomputation
under activation checkpointing is not counted (it is work the model does not need). Beside it,
strata's own convention (6·N + 12·L·C·T, model/param_spec.h, as ../shared/peers count) is given
as mfu_strata. The peak is the measured dense bf16 GEMM of this GPU from bench/gpu_gemm.py's JSON
(--peak-json), else --peak-tflops, else the datasheet's 989.5 (labelled so).
"""
import argparse
import gc
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time
import traceback

# Less fragmentation near the memory limit (the largest-micro-batch search): the caching
# allocator grows segments instead of carving fixed ones. Before torch is imported.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

T0 = time.time()
DATASHEET_TFLOPS = 989.5  # H100/H200 SXM dense bf16 (../shared/reference/gpu.md §3)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write results as JSON here (rewritten after each config)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke test)")
    ap.add_argument("--tiny", action="store_true",
                    help="tiny models (2 layers, C 64, T 32): proves the code paths only")
    ap.add_argument("--configs", default="gpt2-eager,llama-1b,gpt2-compile",
                    help="comma-separated subset of gpt2-eager, llama-1b, gpt2-compile")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (reported)")
    ap.add_argument("--peak-json", help="bench/gpu_gemm.py's JSON: its peak_tflops")
    ap.add_argument("--peak-tflops", type=float, help="the peak for MFU, if no --peak-json")
    ap.add_argument("--batch", type=int, default=16, help="GPT-2 micro-batch (default 16)")
    ap.add_argument("--seq", type=int, default=1024, help="GPT-2 sequence length")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before timing")
    ap.add_argument("--steps", type=int, default=30, help="timed steps (GPT-2)")
    ap.add_argument("--llama-vocab", type=int, default=128256, choices=[32000, 128256])
    ap.add_argument("--llama-seq", type=int, default=2048)
    ap.add_argument("--llama-tied", action="store_true", help="tie the Llama embeddings")
    ap.add_argument("--llama-batch", type=int, default=0,
                    help="Llama micro-batch; 0 (default): the largest that fits")
    ap.add_argument("--llama-max-batch", type=int, default=64, help="cap of the search")
    ap.add_argument("--llama-steps", type=int, default=8, help="timed steps (Llama)")
    ap.add_argument("--gqa", choices=["repeat", "native"], default="repeat",
                    help="Llama KV heads: repeated before SDPA (default) or enable_gqa=True")
    ap.add_argument("--budget", type=float, default=0,
                    help="seconds this run may take; configurations that would not fit are "
                         "skipped (reported). 0: no limit")
    ap.add_argument("--seed", type=int, default=1337)
    return ap.parse_args()


A = parse_args()
DEV = torch.device(A.device)
CUDA = DEV.type == "cuda"


def left():
    return A.budget - (time.time() - T0) if A.budget > 0 else float("inf")


# --- models -------------------------------------------------------------------------------------

class GPT2Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, C, H, V, T):
        super().__init__()
        self.V = V
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([GPT2Block(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():  # GPT-2's init (nanoGPT / llm.c)
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, self.V), targets.view(-1))


class RMSNorm(nn.Module):
    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        if hasattr(F, "rms_norm"):
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(T, hd, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv)  # T x hd/2
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):  # x: B x H x T x hd; rotate the two halves (Hugging Face layout)
    h = x.shape[-1] // 2
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def sdpa_gqa(q, k, v):
    """Causal attention with fewer KV heads than query heads. Default (--gqa repeat): each KV
    head repeated for its query heads before SDPA, as torchtitan's Llama does (repeat_kv), so the
    flash kernel runs; --gqa native passes enable_gqa=True (torch >= 2.5), which not every SDPA
    backend takes (a fallback to the math backend would materialise T x T scores)."""
    if A.gqa == "native":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1),
                                          v.repeat_interleave(rep, 1), is_causal=True)


class LlamaBlock(nn.Module):
    def __init__(self, C, H, KV, FFN):
        super().__init__()
        self.H, self.KV, self.hd = H, KV, C // H
        self.attention_norm = RMSNorm(C)
        self.wq = nn.Linear(C, H * self.hd, bias=False)
        self.wk = nn.Linear(C, KV * self.hd, bias=False)
        self.wv = nn.Linear(C, KV * self.hd, bias=False)
        self.wo = nn.Linear(H * self.hd, C, bias=False)
        self.ffn_norm = RMSNorm(C)
        self.w1 = nn.Linear(C, FFN, bias=False)  # gate
        self.w3 = nn.Linear(C, FFN, bias=False)  # up
        self.w2 = nn.Linear(FFN, C, bias=False)  # down

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.attention_norm(x)
        q = self.wq(h).view(B, T, self.H, self.hd).transpose(1, 2)
        k = self.wk(h).view(B, T, self.KV, self.hd).transpose(1, 2)
        v = self.wv(h).view(B, T, self.KV, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = sdpa_gqa(q, k, v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.wo(y)
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, L, C, H, KV, FFN, V, T, theta, tied, ckpt):
        super().__init__()
        self.V, self.ckpt = V, ckpt
        self.tok_embeddings = nn.Embedding(V, C)
        self.layers = nn.ModuleList([LlamaBlock(C, H, KV, FFN) for _ in range(L)])
        self.norm = RMSNorm(C)
        self.output = nn.Linear(C, V, bias=False)
        if tied:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(T, C // H, theta, self.tok_embeddings.weight.device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        h = self.tok_embeddings(idx)
        for layer in self.layers:
            if self.ckpt and self.training:
                h = checkpoint(layer, h, cos, sin, use_reentrant=False)
            else:
                h = layer(h, cos, sin)
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits.view(-1, self.V), targets.view(-1))


# --- training step, timing ----------------------------------------------------------------------

def make_optimizer(model):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    try:
        return torch.optim.AdamW(groups, fused=True, **kw), "fused"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, foreach=True, **kw), "foreach"


def param_count(model, skip=()):
    seen, n = set(), 0
    for name, p in model.named_parameters():  # tied weights are one parameter
        if id(p) in seen or any(name.startswith(s) for s in skip):
            continue
        seen.add(id(p))
        n += p.numel()
    return n


def sync():
    if CUDA:
        torch.cuda.synchronize(DEV)


def make_step(model, fwd, opt, B, T, V_real, gen):
    x = torch.randint(0, V_real, (B, T), device=DEV, generator=gen)
    y = torch.randint(0, V_real, (B, T), device=DEV, generator=gen)

    def step():
        with torch.autocast(device_type=DEV.type, dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return step


def time_steps(step, steps):
    """Per-step seconds: CUDA events at every step boundary on the stream (no host sync in
    between), else perf_counter. Returns (times, last loss)."""
    loss = None
    if CUDA:
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
        ev[0].record()
        for i in range(steps):
            loss = step()
            ev[i + 1].record()
        torch.cuda.synchronize(DEV)
        times = [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(steps)]
    else:
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            loss = step()
            times.append(time.perf_counter() - t)
    return times, float(loss.item())


def is_oom(e):
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def free_memory():
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()


# --- the run ------------------------------------------------------------------------------------

def peak_tflops():
    if A.peak_json:
        try:
            with open(A.peak_json) as f:
                j = json.load(f)
            return float(j["peak_tflops"]), "measured: %s (%s)" % (A.peak_json, j.get("peak_shape"))
        except (OSError, ValueError, KeyError) as e:
            print("gpu_peer.py: cannot read the peak from %s: %s" % (A.peak_json, e), flush=True)
    if A.peak_tflops:
        return A.peak_tflops, "given: --peak-tflops"
    return DATASHEET_TFLOPS, "datasheet (H100/H200 SXM dense bf16), not measured"


def c_compiler():
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return shutil.which(cc)
    return None


def main():
    torch.manual_seed(A.seed)
    if CUDA and not torch.cuda.is_available():
        print("gpu_peer.py: no CUDA device is visible to PyTorch (torch %s, CUDA %s)"
              % (torch.__version__, torch.version.cuda), file=sys.stderr)
        return 3
    if CUDA:
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls outside autocast, if any
        torch.backends.cudnn.allow_tf32 = True
    peak, peak_src = peak_tflops()
    gen = torch.Generator(device=DEV)
    gen.manual_seed(A.seed)
    out = {
        "script": "bench/gpu_peer.py",
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "device": torch.cuda.get_device_name(DEV) if CUDA else (platform.processor() or "cpu"),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if CUDA else None,
        "tiny": A.tiny, "peak_tflops": peak, "peak_source": peak_src,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "argv": sys.argv[1:], "rows": [],
    }

    def save():
        if A.json:
            with open(A.json, "w") as f:
                json.dump(out, f, indent=1)

    if A.tiny:
        g2 = dict(L=2, C=64, H=4, V=512, T=32, B=4, Vreal=500)
        ll = dict(L=2, C=64, H=4, KV=2, FFN=160, V=512, T=32, theta=500000.0)
        llama_max = 8
    else:
        g2 = dict(L=12, C=768, H=12, V=50304, T=A.seq, B=A.batch, Vreal=50257)
        ll = dict(L=16, C=2048, H=32, KV=8, FFN=8192, V=A.llama_vocab, T=A.llama_seq,
                  theta=500000.0)
        llama_max = A.llama_max_batch

    def record(row):
        out["rows"].append(row)
        save()
        if row.get("status") == "ok":
            print("%-18s B=%-3d T=%-5d %8.1f ms/step  %9.0f tok/s  MFU %5.1f%% (strata conv. "
                  "%5.1f%%)  peak mem %s" % (
                      row["config"], row["B"], row["T"], row["step_ms_median"], row["tokens_per_s"],
                      row["mfu_pct"], row["mfu_strata_pct"],
                      "-" if row["peak_mem_gib"] is None else "%.1f GiB" % row["peak_mem_gib"]),
                  flush=True)
        else:
            print("%-18s %s" % (row["config"], row["status"]), flush=True)

    def run_config(config, model, fwd, B, T, Vreal, L, C, steps, warmup, notes, n_skip=()):
        opt, opt_kind = make_optimizer(model)
        step = make_step(model, fwd, opt, B, T, Vreal, gen)
        if CUDA:
            torch.cuda.reset_peak_memory_stats(DEV)
        t = time.time()
        first = None
        for i in range(warmup):
            step()
            if i == 0:
                sync()
                first = time.time() - t
        sync()
        warm_s = time.time() - t
        times, loss = time_steps(step, steps)
        N = param_count(model)
        N_mm = param_count(model, n_skip)
        fpt = 6 * N + 6 * L * C * T          # llm.c
        fpt_mm = 6 * N_mm + 6 * L * C * T    # without the input embedding of an untied model
        fpt_strata = 6 * N + 12 * L * C * T  # strata (model/param_spec.h) and ../shared/peers
        med = statistics.median(times)
        tps = B * T / med
        row = {
            "config": config, "status": "ok", "B": B, "T": T, "params": N,
            "params_matmul": N_mm, "optimizer": "AdamW (%s)" % opt_kind,
            "warmup_steps": warmup, "timed_steps": steps, "first_step_s": first,
            "warmup_s": warm_s, "step_ms_median": med * 1e3,
            "step_ms_mean": statistics.fmean(times) * 1e3, "step_ms_min": min(times) * 1e3,
            "step_ms": [round(x * 1e3, 3) for x in times], "tokens_per_s": tps,
            "flops_per_token": fpt, "flops_per_token_strata": fpt_strata,
            "achieved_tflops": fpt * tps / 1e12,
            "mfu_pct": 100.0 * fpt * tps / (peak * 1e12),
            "mfu_matmul_pct": 100.0 * fpt_mm * tps / (peak * 1e12),
            "mfu_strata_pct": 100.0 * fpt_strata * tps / (peak * 1e12),
            "mfu_datasheet_pct": 100.0 * fpt * tps / (DATASHEET_TFLOPS * 1e12),
            "loss_last": loss,
            "peak_mem_gib": torch.cuda.max_memory_allocated(DEV) / 2**30 if CUDA else None,
            "notes": notes,
        }
        del opt, step
        return row

    configs = [c.strip() for c in A.configs.split(",") if c.strip()]
    for config in configs:
        free_memory()
        if config == "gpt2-eager":
            with torch.device(DEV):  # parameters made and initialised on the device
                model = GPT2(g2["L"], g2["C"], g2["H"], g2["V"], g2["T"])
            try:
                row = run_config("gpt2-124M eager" if not A.tiny else "gpt2-tiny eager", model,
                                 model, g2["B"], g2["T"], g2["Vreal"], g2["L"], g2["C"],
                                 A.steps, A.warmup, "sdpa (flash), bf16 autocast")
            except Exception as e:  # noqa: BLE001 (reported, the next config runs)
                row = {"config": "gpt2-124M eager", "status": "failed: %s: %s" % (
                    type(e).__name__, str(e)[:400])}
                traceback.print_exc()
            record(row)
            del model
        elif config == "gpt2-compile":
            name = "gpt2-124M compile" if not A.tiny else "gpt2-tiny compile"
            cc = c_compiler()
            if A.no_compile:
                record({"config": name, "status": "skipped: --no-compile"})
                continue
            if cc is None:
                record({"config": name, "status": "skipped: no C compiler (cc, gcc, clang) for "
                        "Triton and Inductor"})
                continue
            if left() < 60:
                record({"config": name, "status": "skipped: out of time budget (%.0f s left, "
                        "compiling needs about a minute)" % left()})
                continue
            with torch.device(DEV):
                model = GPT2(g2["L"], g2["C"], g2["H"], g2["V"], g2["T"])
            try:
                fwd = torch.compile(model)
                row = run_config(name, model, fwd, g2["B"], g2["T"], g2["Vreal"], g2["L"],
                                 g2["C"], A.steps, max(3, A.warmup),
                                 "torch.compile (default mode), sdpa, bf16 autocast; the first "
                                 "step's time includes compiling (first_step_s)")
            except Exception as e:  # noqa: BLE001
                row = {"config": name, "status": "compile failed: %s: %s" % (
                    type(e).__name__, str(e).strip().splitlines()[0][:400] if str(e).strip()
                    else "")}
                traceback.print_exc()
            record(row)
            del model
            try:
                torch._dynamo.reset()
            except Exception:  # noqa: BLE001
                pass
        elif config == "llama-1b":
            name = "llama-1B ckpt" if not A.tiny else "llama-tiny ckpt"
            if left() < 40:
                record({"config": name, "status": "skipped: out of time budget (%.0f s left)"
                        % left()})
                continue
            with torch.device(DEV):
                model = Llama(ll["L"], ll["C"], ll["H"], ll["KV"], ll["FFN"], ll["V"], ll["T"],
                              ll["theta"], A.llama_tied, ckpt=True)
            skip = () if A.llama_tied else ("tok_embeddings",)
            tried = []

            def fits(B):
                """Two full steps at B (the second has the optimizer's state allocated)."""
                opt, _ = make_optimizer(model)
                st = make_step(model, model, opt, B, ll["T"], ll["V"], gen)
                ok = True
                try:
                    st()
                    st()
                    sync()
                except Exception as e:  # noqa: BLE001
                    if not is_oom(e):
                        raise
                    ok = False
                for p in model.parameters():
                    p.grad = None
                del opt, st
                free_memory()
                tried.append((B, ok))
                print("  llama micro-batch %d: %s" % (B, "fits" if ok else "out of memory"),
                      flush=True)
                return ok

            try:
                if A.llama_batch > 0:
                    B = A.llama_batch
                else:  # doubling, then bisection while the gap is over a quarter
                    lo, hi, B = 0, None, 1
                    while B <= llama_max and left() > 25:
                        if fits(B):
                            lo, B = B, B * 2
                        else:
                            hi = B
                            break
                    if hi is not None:
                        while hi - lo > max(1, lo // 4) and left() > 25:
                            mid = (lo + hi) // 2
                            if fits(mid):
                                lo = mid
                            else:
                                hi = mid
                    if lo == 0:
                        raise RuntimeError("micro-batch 1 does not fit")
                    B = lo
                notes = ("full activation checkpointing; micro-batch %s; GQA %s; vocab %d%s" % (
                    "given" if A.llama_batch > 0 else "the largest that fit of %s" % tried,
                    "native (enable_gqa)" if A.gqa == "native" else "by repeat_interleave", ll["V"],
                    ", tied" if A.llama_tied else ", untied"))
                row = None
                while row is None:
                    try:
                        row = run_config(name, model, model, B, ll["T"], ll["V"], ll["L"], ll["C"],
                                         A.llama_steps, 2, notes, skip)
                    except Exception as e:  # noqa: BLE001
                        if not is_oom(e) or B <= 1:
                            raise
                        for p in model.parameters():
                            p.grad = None
                        free_memory()
                        B = max(1, B * 3 // 4)
                        notes += "; timed run out of memory, retried at %d" % B
            except Exception as e:  # noqa: BLE001
                row = {"config": name, "status": "failed: %s: %s" % (type(e).__name__,
                                                                     str(e)[:400])}
                traceback.print_exc()
            record(row)
            del model
        else:
            record({"config": config, "status": "unknown configuration (skipped)"})

    print()
    print("peak for MFU: %.1f TFLOP/s, %s" % (peak, peak_src))
    print("| config | B | T | params | ms/step (median) | tokens/s | TFLOP/s | MFU (6N+6LCT) | "
          "MFU (6N+12LCT) | peak mem GiB | status |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in out["rows"]:
        if r.get("status") == "ok":
            print("| %s | %d | %d | %.1fM | %.1f | %.0f | %.1f | %.1f%% | %.1f%% | %s | ok |" % (
                r["config"], r["B"], r["T"], r["params"] / 1e6, r["step_ms_median"],
                r["tokens_per_s"], r["achieved_tflops"], r["mfu_pct"], r["mfu_strata_pct"],
                "%.1f" % r["peak_mem_gib"] if r["peak_mem_gib"] is not None else "-"))
        else:
            print("| %s | | | | | | | | | | %s |" % (r["config"], r["status"]))
    out["elapsed_s"] = time.time() - T0
    save()
    if A.json:
        print("wrote %s" % A.json)
    return 0 if all(r.get("status") == "ok" or r["status"].startswith("skipped")
                    for r in out["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
