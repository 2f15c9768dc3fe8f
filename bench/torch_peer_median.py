"""The PyTorch peer (shared/peers/torch_gpt_bench.py) timed per step, reporting the median.

torch_gpt_bench.py prints the mean of its timed steps; strata bench prints the median. This runs
the peer's own code, unchanged, up to its timing loop: its argument parsing, model, weight
initialisation, AdamW, random batch and its step() (forward under autocast when --bf16, backward,
optimizer step, zero_grad, loss.item()). The statements from the peer's first top-level `step()`
call on (its warm-up and mean-timing loop) are replaced by: --warmup untimed steps, then --steps
steps each timed alone. Nothing of the peer is copied here; its source is read and executed.

    PY bench/torch_peer_median.py [--peer shared/peers/torch_gpt_bench.py] [--warmup 1]
        --steps 5 [peer arguments: --threads 2 --bf16 --layers 12 --d 768 ...]

Prints one line: peer=torch torch=<version> step_s=<median> tokens_per_s=<from the median> ...
times=[each step]. The median of an even count is the upper middle value, as strata bench's.
"""
import argparse
import ast
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
default_peer = os.path.join(os.path.dirname(os.path.dirname(here)), "shared", "peers",
                            "torch_gpt_bench.py")
ap = argparse.ArgumentParser(allow_abbrev=False)
ap.add_argument("--peer", default=os.environ.get("PEER_SCRIPT", default_peer))
ap.add_argument("--warmup", type=int, default=1)
ap.add_argument("--steps", type=int, default=5)
a, peer_args = ap.parse_known_args()
if a.steps < 1 or a.warmup < 0:
    sys.exit("--steps must be >= 1 and --warmup >= 0")

src = open(a.peer).read()
tree = ast.parse(src, a.peer)


def is_step_call(node):
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id == "step")


cut = next((i for i, n in enumerate(tree.body) if is_step_call(n)), None)
if cut is None:
    sys.exit(f"{a.peer}: no top-level step() call found; the peer changed shape, update this wrapper")
prefix = ast.Module(body=tree.body[:cut], type_ignores=[])
ns = {"__name__": "__peer__", "__file__": a.peer}
# The peer parses sys.argv itself; its own --steps is unused here (its timing loop is not run).
sys.argv = [a.peer] + peer_args
exec(compile(prefix, a.peer, "exec"), ns)
for name in ("step", "a", "n"):
    if name not in ns:
        sys.exit(f"{a.peer}: '{name}' is not defined before the first step() call; update this wrapper")
step, pa, n_params = ns["step"], ns["a"], ns["n"]
torch = ns["torch"]

for _ in range(a.warmup):
    step()
times = []
loss = float("nan")
for _ in range(a.steps):
    t = time.perf_counter()
    loss = step()
    times.append(time.perf_counter() - t)
med = sorted(times)[len(times) // 2]
mean = sum(times) / len(times)
tok = pa.batch * pa.seq
flops = 6 * n_params * tok + 12 * pa.layers * pa.d * pa.seq * tok  # the peer's own count
print(f"peer=torch torch={torch.__version__} params={n_params} B={pa.batch} T={pa.seq} "
      f"threads={torch.get_num_threads()} bf16={pa.bf16} warmup={a.warmup} steps={a.steps} | "
      f"step_s={med:.4f} tokens_per_s={tok / med:.1f} achieved_gflops={flops / med / 1e9:.1f} "
      f"step_s_mean={mean:.4f} loss={loss:.3f} times=[{', '.join(f'{t:.3f}' for t in times)}]",
      flush=True)
