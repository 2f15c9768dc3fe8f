"""Which BLAS a PyTorch really uses, and how fast its fp32 GEMM runs: one block of lines for the
bench headers (bench/machine_info.sh --python PY) and for bench/setup_peers.sh.

    PY bench/peer_blas.py [--gemm] [--threads 2] [--n 2048]

Prints the interpreter, torch's version and build's BLAS (torch.__config__.show()), the BLAS,
MKL, oneDNN and OpenMP libraries mapped into this process after a matmul (/proc/self/maps: for
Debian's python3-torch this is whichever libblas.so.3 update-alternatives selects, the reference
BLAS unless OpenBLAS is installed), OpenBLAS's core type when OpenBLAS is loaded, the DeepSpeed
version when installed, and with --gemm the GFLOP/s of an n^3 fp32 matmul (median of 5 after a
warm-up; one timing only if the first takes over 2 s, as the reference BLAS does).
"""
import argparse
import ctypes
import importlib.metadata
import os
import re
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--gemm", action="store_true")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--n", type=int, default=2048)
a = ap.parse_args()

try:
    import torch
except ImportError as e:
    print(f"python {sys.executable}: no torch ({e})")
    sys.exit(0)

torch.set_num_threads(a.threads)
cfg = torch.__config__.show()
settings = dict(re.findall(r"(\w+)=([^,\s]*)", cfg))
lib_lines = [ln.strip(" -") for ln in cfg.splitlines()
             if re.search(r"Math Kernel|MKL-DNN|oneDNN|OpenMP|CPU capability", ln)]
# One small matmul so that a lazily loaded BLAS is mapped before /proc/self/maps is read.
x = torch.randn(64, 64)
(x @ x).sum().item()
libs = set()
with open("/proc/self/maps") as f:
    for line in f:
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        base = os.path.basename(path)
        # numpy's own bundled OpenBLAS and CUDA's cuBLAS are mapped too but serve no CPU matmul
        # of torch's; pip's torch links MKL statically (BLAS_INFO=mkl, nothing to see here).
        if "numpy.libs" in path or "/nvidia/" in path:
            continue
        if re.search(r"blas|mkl|dnnl|gomp|iomp|lapack", base, re.I):
            libs.add(path)
corename = ""
for path in sorted(libs):
    if "openblas" in path:
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            lib.openblas_get_config.restype = ctypes.c_char_p
            corename = (f"{lib.openblas_get_corename().decode()} "
                        f"({lib.openblas_get_config().decode()})")
        except (OSError, AttributeError):
            pass
        break
try:
    ds = importlib.metadata.version("deepspeed")
except importlib.metadata.PackageNotFoundError:
    ds = "not installed"

print(f"python {sys.executable}: torch {torch.__version__}, BLAS_INFO={settings.get('BLAS_INFO', '?')}"
      f" LAPACK_INFO={settings.get('LAPACK_INFO', '?')}, torch threads={torch.get_num_threads()},"
      f" deepspeed {ds}")
for ln in lib_lines:
    print(f"  built with: {ln}")
static = " (MKL is linked statically into libtorch_cpu)" if settings.get("BLAS_INFO") == "mkl" else ""
print("  loaded: " + (", ".join(sorted(libs)) or "no separate BLAS/MKL/oneDNN library") + static)
if corename:
    print(f"  OpenBLAS core: {corename}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}"
          f" OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
if a.gemm:
    n = a.n
    A, B = torch.randn(n, n), torch.randn(n, n)
    t = time.perf_counter()
    A @ B
    first = time.perf_counter() - t
    times = [first]
    if first < 2.0:
        times = []
        for _ in range(5):
            t = time.perf_counter()
            A @ B
            times.append(time.perf_counter() - t)
    gf = 2 * n ** 3 / statistics.median(times) / 1e9
    print(f"  fp32 {n}^3 matmul, {a.threads} threads: {gf:.1f} GFLOP/s"
          f" (median of {len(times)}{', warm-up only: too slow to repeat' if first >= 2.0 else ''})")
