"""PyTorch DDP (gloo) on the bench model, the data-parallel peer of `strata launch -n N`.

The model is the one of shared/peers/torch_gpt_bench.py (GPT-2 style, tied embeddings, GELU
tanh, AdamW); each of N processes runs `--batch` sequences per step with `--threads` threads and
DDP all-reduces gradients with gloo. Prints tokens/s of the global batch (N x batch x seq).

    python3 bench/ddp_peer.py --ranks 2 --threads 1 --batch 4
"""
import argparse
import math
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, 2)
        q, k, v = [t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.h)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(a.vocab, a.d), nn.Embedding(a.seq, a.d)
        self.blocks = nn.ModuleList([Block(a.d, a.heads) for _ in range(a.layers)])
        self.lnf = nn.LayerNorm(a.d)
        self.vocab = a.vocab

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, self.vocab), tgt.view(-1))


def worker(rank, a):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(a.port))
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(GPT(a))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)

    def step():
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    times = []
    for _ in range(a.steps):
        dist.barrier()
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    if rank == 0:
        dt = sorted(times)[len(times) // 2]
        tok = a.ranks * a.batch * a.seq
        print(f"ddp ranks={a.ranks} threads={a.threads} step_s={dt:.3f} tokens_per_s={tok / dt:.0f}"
              f" torch={torch.__version__}")
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    for name, default in [("layers", 6), ("d", 512), ("heads", 8), ("vocab", 8192), ("seq", 256),
                          ("batch", 4), ("steps", 5), ("threads", 1), ("ranks", 2),
                          ("port", 29533)]:
        p.add_argument("--" + name, type=int, default=default)
    args = p.parse_args()
    mp.spawn(worker, args=(args,), nprocs=args.ranks)
