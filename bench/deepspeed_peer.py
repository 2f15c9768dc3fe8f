"""Microsoft DeepSpeed ZeRO (stage 0/1/2/3) on CPU with gloo: the ZeRO peer of `strata launch -n N`.

The model is the one of bench/ddp_peer.py (strata's "bench-23M" preset: GPT-2 style, 6 layers,
d 512, 8 heads, vocab 8192, seq 256, tied embeddings, GELU tanh, LayerNorm, biases). fp32,
torch.optim.AdamW (lr 3e-4, weight decay 0.1) handed to DeepSpeed as the client optimizer,
gradient clipping 1.0, micro batch 4 per rank, gradient accumulation 1, random tokens.

DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu) uses the `ccl` backend only when
oneccl_bindings_for_pytorch is importable and otherwise falls back to torch.distributed gloo,
which is what is used here. Install: `DS_BUILD_OPS=0 /tmp/tv/bin/pip install deepspeed` (0.19.8,
pure Python; no oneCCL and no intel_extension_for_pytorch needed). At init DeepSpeed's comm layer
JIT-compiles its small shm all-reduce op with g++/ninja (about a minute, once, cached under
~/.cache/torch_extensions); that op serves only inference_all_reduce, training goes through gloo.

Launch (one process per rank; the script spawns its ranks itself, one stage per launch so that
ru_maxrss is per stage):

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 /tmp/tv/bin/python bench/deepspeed_peer.py --stage 2

It also runs under a launcher that sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* itself, e.g.
`torchrun --nproc_per_node 2 bench/deepspeed_peer.py --stage 2` (under torchrun spell the width
--hidden, not --d). Rank 0 prints one line:

    deepspeed stage=2 ranks=2 tok/s=... model_state_bytes_per_rank=... peak_rss_mib=...

model_state_bytes_per_rank is the max over ranks of the bytes of the distinct tensor storages
that hold parameters, gradients and optimizer states on that rank (module parameters and .grad,
DeepSpeed's flat "bit16" groups/partitions and its separate fp32 master partitions, gradient
partitions, AdamW exp_avg/exp_avg_sq/step), sampled after backward and right before and after
the inner optimizer step of one extra, untimed step; the breakdown in MiB follows it.
live_tensor_mib is every CPU tensor storage reachable through Python's gc at those points, so it
also counts DeepSpeed's communication buckets (ZeRO-3 keeps a flat reduce buffer of
reduce_bucket_size elements) and the inputs. peak_rss_mib is the max over ranks of ru_maxrss;
base_rss_mib is ru_maxrss right after `import deepspeed` and init_distributed (framework cost).

Bucket sizes (reduce/allgather/stage-3 prefetch) are --bucket elements (default 5e6 = 19 MiB
fp32, above the largest tensor, wte at 4.2M); DeepSpeed's own default reduce_bucket_size of 5e8
would make ZeRO-3 allocate a 1.9 GiB fp32 buffer per rank. Other ZeRO settings are DeepSpeed's
defaults except overlap_comm off (stage3_param_persistence_threshold stays 1e5: parameters
under 100k elements, i.e. all biases and LayerNorms, stay whole on every rank).
"""
import argparse
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import gc  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_peer import GPT  # noqa: E402  (same model as the DDP peer)


def storage_key(t):
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


class Census:
    """Distinct storages of the model states a rank holds, each counted once under a category."""

    def __init__(self):
        self.seen = {}

    def add(self, t, cat):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            return
        ptr, nbytes = storage_key(t)
        if nbytes == 0 or ptr == 0:
            return
        self.seen.setdefault(ptr, (nbytes, cat))

    def walk(self, obj, cat, depth=0):
        if depth > 4:
            return
        if isinstance(obj, torch.Tensor):
            self.add(obj, cat)
            if obj.grad is not None:
                self.add(obj.grad, "grads")
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                self.walk(x, cat, depth + 1)
        elif isinstance(obj, dict):
            for x in obj.values():
                self.walk(x, cat, depth + 1)

    def totals(self):
        out = {}
        for nbytes, cat in self.seen.values():
            out[cat] = out.get(cat, 0) + nbytes
        return out


def model_state_census(engine):
    c = Census()
    inner = getattr(engine.optimizer, "optimizer", None)
    for opt in (inner, engine.optimizer):  # optimizer states first: AdamW exp_avg/exp_avg_sq/step
        if isinstance(opt, torch.optim.Optimizer):
            for st in opt.state.values():
                c.walk(st, "optim")
    for p in engine.module.parameters():  # stage 3: p.data is empty, p.ds_tensor is the partition
        if p.grad is not None:
            c.add(p.grad, "grads")
        for name in ("grad_accum", "ds_grad"):  # not always present
            c.walk(getattr(p, name, None), "grads")
    z = engine.optimizer
    if z is not inner and z is not None and not isinstance(z, torch.optim.Optimizer):
        for name, val in vars(z).items():  # ZeRO optimizer: flat groups, partitions, buckets
            low = name.lower()
            if "ipg" in low or "bucket" in low:
                continue  # communication buckets are not model states (they show in live_tensor_mib)
            cat = "grads" if "grad" in low else "params"
            c.walk(val, cat)
    if isinstance(inner, torch.optim.Optimizer):
        for g in inner.param_groups:
            c.walk(g["params"], "params")
    for p in engine.module.parameters():
        c.add(p.data, "params")
        c.walk(getattr(p, "ds_tensor", None), "params")
    return c.totals()


def live_tensor_bytes():
    """Bytes of all distinct CPU tensor storages that Python can reach (gc): model states plus
    DeepSpeed's communication buckets (e.g. ZeRO-3's reduce_bucket_size flat buffer) and inputs."""
    seen = {}
    with warnings.catch_warnings():  # isinstance() on torch.distributed's deprecated reduce_op warns
        warnings.simplefilter("ignore")
        objs = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for o in objs:
        if o.device.type == "cpu":
            ptr, nbytes = storage_key(o)
            if ptr and nbytes:
                seen[ptr] = nbytes
    return sum(seen.values())


def worker(rank, a):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(a.ranks),
                      MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                      MASTER_PORT=os.environ.get("MASTER_PORT", str(a.port)))
    run(rank, a)


def run(rank, a):
    torch.set_num_threads(a.threads)
    import deepspeed
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    ranks = dist.get_world_size()
    base_rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # torch + deepspeed + gloo
    torch.manual_seed(0)
    model = GPT(a)
    for p in model.parameters():
        if p.dim() == 2:
            nn.init.normal_(p, std=0.02)
    if a.stage == 3:  # the tied wte.weight is read in GPT.forward, outside wte's own forward
        deepspeed.zero.register_external_parameter(model, model.wte.weight)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    zero = {"stage": a.stage, "overlap_comm": False, "contiguous_gradients": True,
            "reduce_bucket_size": a.bucket, "allgather_bucket_size": a.bucket}
    if a.stage == 3:
        zero.update(stage3_prefetch_bucket_size=a.bucket, stage3_param_persistence_threshold=a.persist)
    cfg = {"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": 1,
           "train_batch_size": a.batch * ranks, "gradient_clipping": 1.0,
           "zero_optimization": zero, "steps_per_print": 10 ** 9, "wall_clock_breakdown": False,
           "zero_allow_untested_optimizer": True}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)

    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)

    def step():
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        return loss.item()

    for _ in range(a.warmup):
        loss = step()
    times = []
    for _ in range(a.steps):
        dist.barrier()
        t = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t)

    # One extra, untimed step to take the model-state census at its fullest points.
    samples = []
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    orig = inner.step

    def sample():
        d = model_state_census(engine)
        d["live"] = live_tensor_bytes()
        samples.append(d)

    def sampled_step(*args, **kw):
        sample()
        r = orig(*args, **kw)
        sample()
        return r

    inner.step = sampled_step
    loss_t = engine(x, y)
    engine.backward(loss_t)
    sample()
    engine.step()
    inner.step = orig
    cats = ("params", "grads", "optim")
    best = max(samples, key=lambda d: sum(d.get(k, 0) for k in cats))
    state_bytes = sum(best.get(k, 0) for k in cats)
    live = max(d["live"] for d in samples)
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    row = torch.tensor([state_bytes, rss_kib] + [best.get(k, 0) for k in cats] + [live, base_rss_kib],
                       dtype=torch.float64)
    rows = [torch.zeros_like(row) for _ in range(ranks)]
    dist.all_gather(rows, row)
    if rank == 0:
        rows = torch.stack(rows)
        mx = rows.max(0).values
        dt = statistics.median(times)
        tok = ranks * a.batch * a.seq
        mib = lambda v: f"{v / 2 ** 20:.1f}"  # noqa: E731
        print(f"deepspeed stage={a.stage} ranks={ranks} tok/s={tok / dt:.0f} "
              f"model_state_bytes_per_rank={int(mx[0])} peak_rss_mib={mx[1] / 1024:.0f} "
              f"step_s_median={dt:.3f} step_s_mean={statistics.mean(times):.3f} "
              f"state_mib[params={mib(mx[2])} grads={mib(mx[3])} optim={mib(mx[4])}] live_tensor_mib={mib(mx[5])} base_rss_mib={mx[6] / 1024:.0f} "
              f"per_rank_state_bytes={[int(v) for v in rows[:, 0]]} n_params={n_params} loss={loss:.3f} "
              f"backend={dist.get_backend()} accel={get_accelerator().device_name()} "
              f"deepspeed={deepspeed.__version__} torch={torch.__version__}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", "--d", dest="d", type=int, default=512)  # torchrun rejects a bare --d
    for name, default in [("stage", 2), ("layers", 6), ("heads", 8), ("vocab", 8192),
                          ("seq", 256), ("batch", 4), ("warmup", 3), ("steps", 10), ("threads", 1),
                          ("ranks", 2), ("port", 29543), ("bucket", 5_000_000),
                          ("persist", 100_000)]:
        p.add_argument("--" + name, type=int, default=default)
    args = p.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun / deepspeed
        run(int(os.environ["RANK"]), args)
    else:
        mp.spawn(worker, args=(args,), nprocs=args.ranks)
