#!/usr/bin/env python3
"""Dense bf16 GEMM rates of one GPU through PyTorch (cuBLAS / cuBLASLt): the measured peak that
MFU figures use (docs/gpu.md), and GPT-2-124M's GEMMs at llm.c's micro-batch.

    python3 bench/gpu_gemm.py --json gpu_gemm.json           # on the GPU machine (scripts/gpu_check.sh)
    python3 bench/gpu_gemm.py --device cpu --tiny --json x   # a smoke test of the code paths

Rows (M x N x K, C = A @ B with A M x K and B K x N, 2·M·N·K FLOP each):
  peak    large square-ish products; the best of them (by median time) is `peak_tflops`, the
          denominator of every "% of peak" here and of bench/gpu_peer.py's MFU.
          2048 x 2048 x 13312 is the shape stas00's MAMF finder reported best on an H100.
  fwd     GPT-2-124M's four Linear layers at B·T = 65,536 rows (B=64, T=1024, llm.c's
          run_gpt2_124M.sh), as nn.Linear runs them: y = x Wᵀ + b (torch.addmm, W stored
          out x in): QKV 65536x2304x768, attproj 65536x768x768, fc 65536x3072x768,
          fcproj 65536x768x3072.
  bwd     their backward as autograd runs it: dX = dY W (M x in x out) and dW = dYᵀ X
          (out x in x M: the reduction runs over the 65,536 rows).
  extra   the tied lm-head (65536 x 50304 x 768, vocab padded as llm.c's), forward and
          backward: not one of the four, but GPT-2-small's largest GEMM.

Timing, as llm.c's dev/cuda benchmark_kernel does: warm-up runs first, then each timed run alone
between two CUDA events, with an L2-sized buffer (twice the L2, 256 MiB if unknown) zeroed
before each run so that no run finds its operands in L2. Inputs are random normals, never zeros
(a product of zeros runs faster: ../.library/device/METHOD.md). Reported: the median, the best
and the mean of the timed runs; TFLOP/s from the median.
"""
import argparse
import json
import platform
import statistics
import sys
import time

import torch

DATASHEET_BF16_DENSE_TFLOPS = {"H100": 989.5, "H200": 989.5, "A100": 312.0}

PEAK_SHAPES = [  # name, M, N, K
    ("8192^3", 8192, 8192, 8192),
    ("4096x4096x16384", 4096, 4096, 16384),
    ("16384x16384x4096", 16384, 16384, 4096),
    ("2048x2048x13312 (MAMF)", 2048, 2048, 13312),
]
# GPT-2-124M: C = 768, rows = B·T = 65,536; (name, out features, in features).
GPT2_ROWS = 65536
GPT2_LINEARS = [("qkv", 2304, 768), ("attproj", 768, 768), ("fc", 3072, 768), ("fcproj", 768, 3072)]
GPT2_VOCAB_PADDED = 50304


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the results as JSON to this path")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke test)")
    ap.add_argument("--tiny", action="store_true",
                    help="small shapes (rows 512, C 64): proves the code paths, measures nothing")
    ap.add_argument("--warmup", type=int, default=5, help="untimed runs per shape")
    ap.add_argument("--iters", type=int, default=20, help="timed runs per shape")
    ap.add_argument("--no-extra", action="store_true", help="leave out the lm-head rows")
    ap.add_argument("--seed", type=int, default=1234)
    return ap.parse_args()


class Timer:
    """Times fn() alone, `iters` times after `warmup` runs: CUDA events on a GPU (an L2 flush
    before each run, outside the events), perf_counter on the CPU."""

    def __init__(self, device, warmup, iters):
        self.dev = device
        self.cuda = device.type == "cuda"
        self.warmup, self.iters = warmup, iters
        self.flush = None
        self.flush_bytes = 0
        if self.cuda:
            props = torch.cuda.get_device_properties(device)
            l2 = int(getattr(props, "L2_cache_size", 0) or 0)
            self.flush_bytes = 2 * l2 if l2 > 0 else 256 << 20
            self.flush = torch.empty(self.flush_bytes, dtype=torch.uint8, device=device)

    def __call__(self, fn):
        for _ in range(self.warmup):
            fn()
        ms = []
        if self.cuda:
            torch.cuda.synchronize(self.dev)
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
            for i in range(self.iters):
                self.flush.zero_()  # llm.c: a memset of an L2-sized buffer between runs
                starts[i].record()
                fn()
                ends[i].record()
            torch.cuda.synchronize(self.dev)
            ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        else:
            for _ in range(self.iters):
                t = time.perf_counter()
                fn()
                ms.append((time.perf_counter() - t) * 1e3)
        return ms


def rand(shape, device, gen):
    # Random normals scaled to keep products O(1); bf16 on every device.
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
            .mul_(0.05).to(torch.bfloat16))


def main():
    a = parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("gpu_gemm.py: no CUDA device is visible to PyTorch (torch %s, built for CUDA %s)"
              % (torch.__version__, torch.version.cuda), file=sys.stderr)
        return 3
    if not cuda:
        torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    timer = Timer(dev, a.warmup, a.iters)

    peak_shapes = PEAK_SHAPES
    rows_n, linears, vocab = GPT2_ROWS, GPT2_LINEARS, GPT2_VOCAB_PADDED
    if a.tiny:
        peak_shapes = [("256^3", 256, 256, 256), ("128x128x1024", 128, 128, 1024)]
        rows_n, vocab = 512, 512
        linears = [(n, o // 12, i // 12) for n, o, i in GPT2_LINEARS]

    rows = []

    def run(group, name, M, N, K, fn):
        ms = timer(fn)
        med = statistics.median(ms)
        flop = 2.0 * M * N * K
        r = {"group": group, "name": name, "M": M, "N": N, "K": K, "flop": flop,
             "median_ms": med, "min_ms": min(ms), "mean_ms": statistics.fmean(ms),
             "tflops": flop / (med * 1e-3) / 1e12, "tflops_best": flop / (min(ms) * 1e-3) / 1e12,
             "times_ms": [round(x, 5) for x in ms]}
        rows.append(r)
        print("  %-6s %-24s %6d x %6d x %6d  %9.3f ms  %8.1f TFLOP/s" %
              (group, name, M, N, K, med, r["tflops"]), flush=True)
        return r

    print("gpu_gemm.py: bf16 in, fp32 accumulate, bf16 out; %d warm-up + %d timed runs per shape"
          % (a.warmup, a.iters), flush=True)
    # The peak: plain C = A @ B on contiguous row-major operands.
    for name, M, N, K in peak_shapes:
        A, B = rand((M, K), dev, gen), rand((K, N), dev, gen)
        C = torch.empty((M, N), dtype=torch.bfloat16, device=dev)
        run("peak", name, M, N, K, lambda A=A, B=B, C=C: torch.mm(A, B, out=C))
        del A, B, C
    peak_row = max((r for r in rows if r["group"] == "peak"), key=lambda r: r["tflops"])
    peak = peak_row["tflops"]

    def linear_rows(group_prefix, name, out_f, in_f, M):
        x = rand((M, in_f), dev, gen)
        w = rand((out_f, in_f), dev, gen)  # nn.Linear's weight: out x in
        b = rand((out_f,), dev, gen)
        y = torch.empty((M, out_f), dtype=torch.bfloat16, device=dev)
        dy = rand((M, out_f), dev, gen)
        dx = torch.empty((M, in_f), dtype=torch.bfloat16, device=dev)
        dw = torch.empty((out_f, in_f), dtype=torch.bfloat16, device=dev)
        # forward: y = x Wᵀ + b, as F.linear / nn.Linear (addmm: the bias in cuBLASLt's epilogue)
        run(group_prefix or "fwd", name, M, out_f, in_f,
            lambda: torch.addmm(b, x, w.t(), out=y))
        # backward, as autograd: dX = dY W; dW = dYᵀ X (the bias gradient, a row sum, left out)
        run(group_prefix or "bwd", name + " dX", M, in_f, out_f, lambda: torch.mm(dy, w, out=dx))
        run(group_prefix or "bwd", name + " dW", out_f, in_f, M,
            lambda: torch.mm(dy.t(), x, out=dw))

    for name, out_f, in_f in linears:
        linear_rows(None, name, out_f, in_f, rows_n)
    if not a.no_extra:
        C = linears[0][2]
        x = rand((rows_n, C), dev, gen)
        w = rand((vocab, C), dev, gen)
        y = torch.empty((rows_n, vocab), dtype=torch.bfloat16, device=dev)
        run("extra", "lm_head", rows_n, vocab, C, lambda: torch.mm(x, w.t(), out=y))
        dy = y.normal_(0, 0.05, generator=gen)
        dx = torch.empty((rows_n, C), dtype=torch.bfloat16, device=dev)
        dw = torch.empty((vocab, C), dtype=torch.bfloat16, device=dev)
        run("extra", "lm_head dX", rows_n, C, vocab, lambda: torch.mm(dy, w, out=dx))
        run("extra", "lm_head dW", vocab, C, rows_n, lambda: torch.mm(dy.t(), x, out=dw))
        del x, w, y, dy, dx, dw

    for r in rows:
        r["pct_of_peak"] = 100.0 * r["tflops"] / peak
    name = torch.cuda.get_device_name(dev) if cuda else platform.processor() or "cpu"
    sheet = next((v for k, v in DATASHEET_BF16_DENSE_TFLOPS.items() if k in name), None)
    fwd = [r for r in rows if r["group"] == "fwd"]
    gpt2_flop = sum(r["flop"] for r in rows if r["group"] in ("fwd", "bwd"))
    gpt2_ms = sum(r["median_ms"] for r in rows if r["group"] in ("fwd", "bwd"))

    print()
    print("| group | GEMM | M x N x K | median ms | best ms | TFLOP/s | %% of measured peak |%s"
          % (" % of datasheet |" if sheet else ""))
    print("|---|---|---|---|---|---|---|%s" % ("---|" if sheet else ""))
    for r in rows:
        print("| %s | %s | %d x %d x %d | %.3f | %.3f | %.1f | %.1f |%s" % (
            r["group"], r["name"], r["M"], r["N"], r["K"], r["median_ms"], r["min_ms"],
            r["tflops"], r["pct_of_peak"],
            (" %.1f |" % (100.0 * r["tflops"] / sheet)) if sheet else ""))
    print()
    print("measured peak: %.1f TFLOP/s (%s, median of %d)%s" % (
        peak, peak_row["name"], a.iters,
        ("; datasheet dense bf16 %.1f: %.1f%%" % (sheet, 100.0 * peak / sheet)) if sheet else ""))
    if gpt2_ms > 0:
        print("GPT-2-124M's 12 Linear GEMMs of one layer (fwd + bwd) back to back: %.1f TFLOP/s "
              "(%.1f%% of the measured peak)" % (gpt2_flop / (gpt2_ms * 1e-3) / 1e12,
                                                100.0 * gpt2_flop / (gpt2_ms * 1e-3) / 1e12 / peak))
    if fwd:
        print("forward rows at %.0f-%.0f%% of the measured peak" %
              (min(r["pct_of_peak"] for r in fwd), max(r["pct_of_peak"] for r in fwd)))

    result = {
        "script": "bench/gpu_gemm.py",
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "device": name,
        "device_type": dev.type,
        "tiny": a.tiny,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cublas_bf16_reduced_precision_reduction":
            bool(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction),
        "sm_count": torch.cuda.get_device_properties(dev).multi_processor_count if cuda else None,
        "l2_bytes": int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0))
                    if cuda else None,
        "l2_flush_bytes": timer.flush_bytes,
        "warmup": a.warmup,
        "iters": a.iters,
        "peak_tflops": peak,
        "peak_shape": peak_row["name"],
        "datasheet_tflops": sheet,
        "gpt2_layer_gemms_tflops": gpt2_flop / (gpt2_ms * 1e-3) / 1e12 if gpt2_ms > 0 else None,
        "rows": rows,
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
        print("wrote %s" % a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
