"""Microsoft DeepSpeed ZeRO (stage 0/1/2/3) on CPU with gloo: the ZeRO peer of `strata launch -n N`.

The model is the one of bench/ddp_peer.py (strata's "bench-23M" preset: GPT-2 style, 6 layers,
d 512, 8 heads, vocab 8192, seq 256, tied embeddings, GELU tanh, LayerNorm, biases). fp32,
torch.optim.AdamW (lr 3e-4, weight decay 0.1) handed to DeepSpeed as the client optimizer,
gradient clipping 1.0, micro batch 4 per rank, gradient accumulation 1, random tokens.

DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu) uses the `ccl` backend only when
oneccl_bindings_for_pytorch is importable and otherwise falls back to torch.distributed gloo,
which is what is used here. Install: bench/setup_peers.sh (`DS_BUILD_OPS=0 pip install deepspeed`
in the pip venv; pure Python, no oneCCL and no intel_extension_for_pytorch needed). At init
DeepSpeed's comm layer JIT-compiles its small shm all-reduce op with g++/ninja (about a minute,
once, cached under ~/.cache/torch_extensions); that op serves only inference_all_reduce, training
goes through gloo.

Launch (one process per rank; the script spawns its ranks itself, one stage per launch so that
ru_maxrss is per stage):

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 PY bench/deepspeed_peer.py --stage 2 \
        --zero '{"overlap_comm": true, "reduce_bucket_size": 5000000}'

It also runs under a launcher that sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* itself, e.g.
`torchrun --nproc_per_node 2 bench/deepspeed_peer.py --stage 2` (under torchrun spell the width
--hidden, not --d). bench/deepspeed_peer.sh runs it interleaved with strata (bench/zero_stages.py
compare), giving both the same zero_optimization settings.

ZeRO settings: --zero takes a JSON object of zero_optimization keys (overlap_comm,
reduce_bucket_size, allgather_bucket_size, stage3_prefetch_bucket_size, stage3_max_reuse_distance,
stage3_max_live_parameters, stage3_param_persistence_threshold, ...), passed to DeepSpeed as given
(with "stage" set from --stage); keys not given keep DeepSpeed's defaults. The legacy --bucket and
--persist set the bucket sizes and the persistence threshold when --zero does not.

Timing, per timed step, rank 0's (as strata's metrics.jsonl is rank 0's); a dist.barrier() before
each step is outside the timed region:
  forward_s   engine(x, y)                 backward_s  engine.backward(loss)
  optimizer_s engine.step()                step_time_s the three plus loss.item()
  comm_fwd_s, comm_bwd_s, comm_opt_s: time the training thread spent blocked in communication
    during each phase. Every collective of DeepSpeed's comm backend (deepspeed.comm's cdb:
    all_reduce, reduce_scatter_tensor, all_gather_into_tensor, broadcast, ...; barriers and
    *_object calls excluded) is wrapped: a synchronous call counts from entry to return; an
    asynchronous one (async_op=True) counts its issue call plus the time blocked in its
    Work.wait(). gloo runs asynchronous collectives on its own threads, so communication that
    overlaps compute is not counted: this is the exposed communication, as strata's
    comm_exposed_s + gather_exposed_s count its waits for reductions and gathers.
  exposed_comm_s = comm_fwd_s + comm_bwd_s (gradient reductions, and ZeRO-3 parameter gathers,
    waited for in forward and backward, where DeepSpeed does all of them);
  compute_s = forward_s + backward_s - exposed_comm_s;
  the optimizer phase keeps its own communication (gradient-norm all-reduce, the all-gather of
    updated partitions at stages 1-2, of persistent parameters at stage 3) inside optimizer_s,
    as strata's optimizer_s does; comm_opt_s says how much of it that was.
Rank 0 prints the human line `deepspeed stage=... step_s_median=...` and one line
`DSJSON {...}` with the settings and every per-step list, for bench/zero_stages.py.

model_state_bytes_per_rank is the max over ranks of the bytes of the distinct tensor storages
that hold parameters, gradients and optimizer states on that rank (module parameters and .grad,
DeepSpeed's flat "bit16" groups/partitions and its separate fp32 master partitions, gradient
partitions, AdamW exp_avg/exp_avg_sq/step), sampled after backward and right before and after
the inner optimizer step of one extra, untimed step; the breakdown in MiB follows it.
live_tensor_mib is every CPU tensor storage reachable through Python's gc at those points, so it
also counts DeepSpeed's communication buckets (ZeRO-3 keeps a flat reduce buffer of
reduce_bucket_size elements) and the inputs. peak_rss_mib is the max over ranks of ru_maxrss;
base_rss_mib is ru_maxrss right after `import deepspeed` and init_distributed (framework cost).
"""
import argparse
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import gc  # noqa: E402
import json  # noqa: E402
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


class CommTimer:
    """Time the training thread spends blocked in DeepSpeed's collectives, per phase."""

    COLLECTIVES = ("all_reduce", "inference_all_reduce", "all_reduce_coalesced", "reduce",
                   "reduce_scatter", "reduce_scatter_tensor", "broadcast", "all_gather",
                   "all_gather_into_tensor", "all_gather_base", "all_gather_coalesced",
                   "all_to_all_single", "all_to_all", "send", "recv", "isend", "irecv",
                   "batch_isend_irecv", "gather", "scatter")  # not barrier, not *_object

    def __init__(self):
        self.phase = None
        self.seconds = {}
        self.calls = {}

    def add(self, dt):
        if self.phase is not None:
            self.seconds[self.phase] = self.seconds.get(self.phase, 0.0) + dt

    def take(self, phase):
        return self.seconds.pop(phase, 0.0)

    def install(self, backend):
        for name in self.COLLECTIVES:
            fn = getattr(backend, name, None)
            if callable(fn):
                setattr(backend, name, self._wrap(name, fn))

    def _wrap(self, name, fn):
        timer = self

        def wrapped(*args, **kw):
            t = time.perf_counter()
            r = fn(*args, **kw)
            timer.add(time.perf_counter() - t)
            timer.calls[name] = timer.calls.get(name, 0) + 1
            if isinstance(r, list):
                return [timer._work(w) for w in r]
            return timer._work(r)

        return wrapped

    def _work(self, w):
        if w is None or not hasattr(w, "wait"):
            return w
        timer = self

        class TimedWork:
            def wait(self, *args, **kw):
                t = time.perf_counter()
                r = w.wait(*args, **kw)
                timer.add(time.perf_counter() - t)
                return r

            def __getattr__(self, attr):
                return getattr(w, attr)

        return TimedWork()


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
    zero = dict(json.loads(a.zero)) if a.zero else {
        "overlap_comm": False, "contiguous_gradients": True, "reduce_bucket_size": a.bucket,
        "allgather_bucket_size": a.bucket, "stage3_prefetch_bucket_size": a.bucket,
        "stage3_param_persistence_threshold": a.persist}
    zero["stage"] = a.stage
    cfg = {"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": 1,
           "train_batch_size": a.batch * ranks, "gradient_clipping": 1.0,
           "zero_optimization": zero, "steps_per_print": 10 ** 9, "wall_clock_breakdown": False,
           "zero_allow_untested_optimizer": True}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)

    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)

    from deepspeed.comm import comm as ds_comm
    timer = CommTimer()
    timer.install(ds_comm.cdb)
    keys = ("step_time_s", "forward_s", "backward_s", "optimizer_s", "comm_fwd_s", "comm_bwd_s",
            "comm_opt_s")
    per_step = {k: [] for k in keys}

    def step(record):
        t0 = time.perf_counter()
        timer.phase = "fwd"
        loss = engine(x, y)
        t1 = time.perf_counter()
        timer.phase = "bwd"
        engine.backward(loss)
        t2 = time.perf_counter()
        timer.phase = "opt"
        engine.step()
        t3 = time.perf_counter()
        timer.phase = None
        value = loss.item()
        t4 = time.perf_counter()
        fwd, bwd, opt = timer.take("fwd"), timer.take("bwd"), timer.take("opt")
        if record:
            for k, v in zip(keys, (t4 - t0, t1 - t0, t2 - t1, t3 - t2, fwd, bwd, opt)):
                per_step[k].append(v)
        return value

    for _ in range(a.warmup):
        loss = step(False)
    for _ in range(a.steps):
        dist.barrier()
        loss = step(True)
    times = per_step["step_time_s"]
    timer.phase = None

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
        dt = sorted(times)[len(times) // 2]  # median (upper middle for an even count)
        tok = ranks * a.batch * a.seq
        mib = lambda v: f"{v / 2 ** 20:.1f}"  # noqa: E731
        print(f"deepspeed stage={a.stage} ranks={ranks} tok/s={tok / dt:.0f} "
              f"model_state_bytes_per_rank={int(mx[0])} peak_rss_mib={mx[1] / 1024:.0f} "
              f"step_s_median={dt:.3f} step_s_mean={statistics.mean(times):.3f} "
              f"state_mib[params={mib(mx[2])} grads={mib(mx[3])} optim={mib(mx[4])}] live_tensor_mib={mib(mx[5])} base_rss_mib={mx[6] / 1024:.0f} "
              f"per_rank_state_bytes={[int(v) for v in rows[:, 0]]} n_params={n_params} loss={loss:.3f} "
              f"backend={dist.get_backend()} accel={get_accelerator().device_name()} "
              f"deepspeed={deepspeed.__version__} torch={torch.__version__}", flush=True)
        med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731  (upper middle, as strata's)
        exposed = [f + b for f, b in zip(per_step["comm_fwd_s"], per_step["comm_bwd_s"])]
        compute = [f + b - e for f, b, e in
                   zip(per_step["forward_s"], per_step["backward_s"], exposed)]
        print(f"deepspeed stage={a.stage} breakdown (median s): step={med(times):.3f} "
              f"compute={med(compute):.3f} exposed_comm={med(exposed):.3f} "
              f"optimizer={med(per_step['optimizer_s']):.3f} "
              f"(of which comm {med(per_step['comm_opt_s']):.3f})", flush=True)
        print("DSJSON " + json.dumps({
            "stage": a.stage, "ranks": ranks, "threads": a.threads, "batch": a.batch,
            "seq": a.seq, "warmup": a.warmup, "steps": a.steps, "zero": zero,
            "tokens_per_step": tok, "n_params": n_params,
            "model_state_bytes_per_rank": int(mx[0]), "peak_rss_bytes": int(mx[1]) * 1024,
            "deepspeed": deepspeed.__version__, "torch": torch.__version__,
            "backend": dist.get_backend(), "comm_calls": timer.calls,
            "per_step": dict(per_step, exposed_comm_s=exposed, compute_s=compute)}), flush=True)
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
    p.add_argument("--zero", default="", help="zero_optimization settings as a JSON object")
    args = p.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun / deepspeed
        run(int(os.environ["RANK"]), args)
    else:
        mp.spawn(worker, args=(args,), nprocs=args.ranks)
