#!/usr/bin/env python3
"""ZeRO stages on this machine (bench-23M, fp32, AdamW, gradient clipping 1.0, random tokens),
through the strata CLI (`strata launch -- train`) and its metrics.jsonl. Two modes:

    python3 bench/zero_stages.py [report] [--steps 12] [--strata build/strata]
    python3 bench/zero_stages.py compare [--python /tmp/peer-venv/bin/python] [--reps 3]
        [--steps 10] [--warmup 3] [--stages 0 1 2 3] [--zero '{"overlap_comm": false}']

report: strata alone, global batch 8 = 2 ranks x micro-batch 4, 1 thread per rank: step time of
each stage relative to stage 0, bytes each rank put on the wire per step against ZeRO's theory,
exposed gather time at stage 3 with prefetch on and off, model-state memory per rank, and MiCS
(4 ranks, shard groups of 2) bytes crossing the groups against theory.

compare: strata against DeepSpeed (bench/deepspeed_peer.py, run by --python) with the SAME
zero_optimization settings on both sides (DEFAULT_ZERO below, overridden key by key by --zero;
printed), same model, ranks, threads, micro-batch, warm-up and timed steps. The runs are
interleaved per stage: strata, DeepSpeed, strata, DeepSpeed, ... (--reps each), so that drift in
the machine's load falls on both. Each step is split the same way on both sides:
  exposed comm  time the training thread waited for gradient reductions and (stage 3) parameter
                gathers. strata: comm_exposed_s + gather_exposed_s of metrics.jsonl. DeepSpeed:
                time blocked in its collectives during engine.forward and engine.backward (sync
                calls entry to return, async ones issue + Work.wait; see deepspeed_peer.py).
  optimizer     everything after the gradients are reduced: gradient-norm all-reduce, clipping,
                AdamW, and the all-gather of updated parameters (stages 1-2; persistent ones at
                stage 3), communication included on both sides. strata: optimizer_s.
                DeepSpeed: engine.step().
  compute       the rest of the step: step - exposed comm - optimizer (forward and backward
                compute, plus on strata's side the loss all-reduce after backward).
Reported: for each stage and side the median over every timed step of all its runs (each
column's own median: they need not add up exactly), the median step time of each run (spread),
model-state bytes and peak RSS per rank. STRATA (env) or --strata picks the binary; strata runs
with OPENBLAS_CORETYPE unset.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(here)
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
env.pop("OPENBLAS_CORETYPE", None)

# report mode: buckets and prefetch of 5e6 elements; a released stage-3 unit is re-gathered for
# backward (reuse distance 0), as ZeRO-3's 3Ψ counts it.
LEAN = {"overlap_comm": True, "reduce_bucket_size": 5_000_000,
        "stage3_prefetch_bucket_size": 5_000_000, "stage3_max_reuse_distance": 0}

# compare mode: given to strata and DeepSpeed alike. DeepSpeed's defaults, except the bucket sizes
# (5e6 elements = 19 MiB fp32, above the largest tensor, wte at 4.2M; DeepSpeed's default
# reduce_bucket_size of 5e8 would make ZeRO-3 allocate a 1.9 GiB buffer per rank) and
# overlap_comm, which DeepSpeed turns on by default at stage 3 only.
DEFAULT_ZERO = {
    "overlap_comm": True,
    "contiguous_gradients": True,
    "reduce_bucket_size": 5_000_000,
    "allgather_bucket_size": 5_000_000,
    "stage3_prefetch_bucket_size": 5_000_000,
    "stage3_max_reuse_distance": 1_000_000_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_param_persistence_threshold": 100_000,
}


def header(a, layout, pythons=()):
    """The machine header of every results file (bench/machine_info.sh)."""
    cmd = ["bash", os.path.join(here, "machine_info.sh"), "--strata", a.strata, "--layout", layout]
    for py in pythons:
        cmd += ["--python", py]
    print("# python3 bench/zero_stages.py " + " ".join(sys.argv[1:]))
    sys.stdout.flush()
    subprocess.run(cmd, check=False, env=dict(os.environ, THREADS=str(a.threads)))
    sys.stdout.flush()


def median(v):
    """The upper middle value for an even count, as strata bench and deepspeed_peer.py."""
    v = sorted(v)
    return v[len(v) // 2]


def run(strata, ranks, zero, steps, tmp, name, warmup=2, threads=1, micro=None):
    micro = micro or 8 // ranks
    cfg = {
        "train_batch_size": micro * ranks,
        "train_micro_batch_size_per_gpu": micro,
        "steps_per_print": 0,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}},
        "model": {"preset": "bench-23M"},
        "zero_optimization": zero,
    }
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    run_dir = os.path.join(tmp, name)
    proc = subprocess.run(
        [strata, "launch", "-n", str(ranks), "--threads", str(threads), "--", "train", "--config",
         path, "--steps", str(warmup + steps), "--run-dir", run_dir],
        env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"strata {name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    out = proc.stdout
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f][warmup:]
    params = int(re.search(r"(\d+) parameters", out).group(1))
    model_states = sum(rows[-1]["peak_bytes"][k]
                       for k in ("params", "master_params", "grads", "optimizer_state"))
    per_step = {k: [r[k] for r in rows] for k in (
        "step_time_s", "forward_s", "backward_s", "optimizer_s", "comm_exposed_s",
        "gather_exposed_s", "tokens_per_s", "comm_bytes", "cross_group_bytes")}
    per_step["exposed_comm_s"] = [r["comm_exposed_s"] + r["gather_exposed_s"] for r in rows]
    per_step["compute_s"] = [r["step_time_s"] - e - r["optimizer_s"]
                             for r, e in zip(rows, per_step["exposed_comm_s"])]
    med = lambda k: median(per_step[k])  # noqa: E731
    notes = sorted({line.strip() for line in out.splitlines() if line.lstrip().startswith("note:")})
    return {
        "step_s": med("step_time_s"),
        "tok_s": med("tokens_per_s"),
        "bytes": med("comm_bytes"),
        "cross": med("cross_group_bytes"),
        "gather_s": med("gather_exposed_s"),
        "reduce_s": med("comm_exposed_s"),
        "model_states": model_states,
        "rss": rows[-1]["max_rss_bytes"],
        "params": params,
        "per_step": per_step,
        "notes": notes,
    }


def report(a):
    mib = 1 << 20
    timed = max(1, a.steps - 2)  # --steps counts every step; the first 2 are dropped
    with tempfile.TemporaryDirectory() as tmp:
        print("## ZeRO stages, bench-23M fp32, 2 ranks x 1 thread, global batch 8")
        print(f"## zero_optimization: {json.dumps(LEAN)} + stage")
        print("stage | tok/s | step vs stage 0 | wire MiB/step/rank | theory | measured/theory"
              " | exposed reduce s | exposed gather s | model states MiB/rank | max RSS MiB")
        base = None
        for stage in (0, 1, 2, 3):
            r = run(a.strata, 2, dict(LEAN, stage=stage), timed, tmp, f"s{stage}")
            psi = r["params"]
            # Per rank, ring algorithms, fp32 on the wire, N = 2: all-reduce and RS+AG move
            # 2(N-1)/N·Ψ·4 bytes; stage 3 gathers twice (forward, backward) and reduce-scatters.
            theory = (3 if stage == 3 else 2) * (2 - 1) / 2 * psi * 4
            base = base or r["step_s"]
            print(f"{stage} | {r['tok_s']:.0f} | {r['step_s'] / base:.3f} | "
                  f"{r['bytes'] / mib:.1f} | {theory / mib:.1f} | {r['bytes'] / theory:.3f} | "
                  f"{r['reduce_s']:.3f} | {r['gather_s']:.3f} | {r['model_states'] / mib:.1f} | "
                  f"{r['rss'] / mib:.0f}")
        print("## stage 3 gathers: prefetch of 5e6 elements (about 1.5 blocks) vs off, and "
              "DeepSpeed's defaults (prefetch 5e7 and reuse distance 1e9: every unit stays "
              "resident from forward to backward)")
        for label, zero in (("on", dict(LEAN, stage=3)),
                            ("off", dict(LEAN, stage=3, stage3_prefetch_bucket_size=1)),
                            ("at defaults", {"stage": 3})):
            r = run(a.strata, 2, zero, timed, tmp, "pf_" + label.replace(" ", "_"))
            print(f"prefetch {label}: exposed gather {r['gather_s']:.3f} s/step, "
                  f"{r['tok_s']:.0f} tok/s, wire {r['bytes'] / mib:.1f} MiB/step")
        print("## MiCS: 4 ranks, stage 3, shard groups of 2 vs one group of 4")
        for label, zero in (("groups of 2", dict(LEAN, stage=3, mics_shard_size=2)),
                            ("one group of 4", dict(LEAN, stage=3))):
            r = run(a.strata, 4, zero, max(4, a.steps // 2) - 2, tmp,
                    "mics_" + label.replace(" ", "_"))
            # Across groups (R = 2 replicas): one all-reduce of the Ψ/G partition per step.
            theory = 2 * (2 - 1) / 2 * r["params"] / 2 * 4 if "2" in label else 0
            ratio = f"{r['cross'] / theory:.3f}" if theory else "-"
            print(f"{label}: wire {r['bytes'] / mib:.1f} MiB/step/rank, across groups "
                  f"{r['cross'] / mib:.1f} MiB (theory {theory / mib:.1f}, ratio {ratio}), "
                  f"model states {r['model_states'] / mib:.1f} MiB/rank, {r['tok_s']:.0f} tok/s")


def run_deepspeed(a, stage, zero):
    cmd = [a.python, os.path.join(here, "deepspeed_peer.py"), "--stage", str(stage),
           "--ranks", str(a.ranks), "--threads", str(a.threads), "--batch", str(a.batch),
           "--warmup", str(a.warmup), "--steps", str(a.steps), "--zero", json.dumps(zero)]
    ds_env = dict(env, DS_ACCELERATOR="cpu", OMP_NUM_THREADS=str(a.threads),
                  MKL_NUM_THREADS=str(a.threads), DS_BUILD_OPS="0")
    proc = subprocess.run(cmd, env=ds_env, capture_output=True, text=True)
    lines = (proc.stdout + proc.stderr).splitlines()
    js = [ln for ln in lines if ln.startswith("DSJSON ")]
    if proc.returncode != 0 or not js:
        sys.exit(f"deepspeed stage={stage} failed ({proc.returncode}):\n" + "\n".join(lines[-40:]))
    d = json.loads(js[-1][len("DSJSON "):])
    d["human"] = [ln for ln in lines if ln.startswith("deepspeed stage=")]
    return d


def compare(a):
    zero = dict(DEFAULT_ZERO, **json.loads(a.zero)) if a.zero else dict(DEFAULT_ZERO)
    zero.pop("stage", None)
    mib = 1 << 20
    tok = a.ranks * a.batch * 256
    print(f"## strata vs DeepSpeed ZeRO, bench-23M fp32, {a.ranks} ranks x {a.threads} thread(s), "
          f"micro-batch {a.batch} per rank (global {a.ranks * a.batch} x 256 tokens), AdamW "
          f"lr 3e-4 wd 0.1, clipping 1.0; {a.warmup} warm-up + {a.steps} timed steps per run, "
          f"{a.reps} runs per side per stage, interleaved strata/DeepSpeed")
    print(f"## zero_optimization given to both (plus \"stage\"): {json.dumps(zero)}")
    print("## semantics that still differ: stage3_param_persistence_threshold is per parameter "
          "in DeepSpeed (biases and LayerNorms stay whole) and per unit in strata (a sublayer, a "
          "vocabulary piece, the final norm); DeepSpeed's CPU accelerator is a 'synchronized device' with no "
          "side stream, so its overlap_comm does not overlap gradient reductions with backward "
          "(they run inside backward's hooks); strata's runs them on a communication thread.")
    results = {}
    for stage in a.stages:
        for rep in range(a.reps):
            with tempfile.TemporaryDirectory() as tmp:
                s = run(a.strata, a.ranks, dict(zero, stage=stage), a.steps, tmp, f"s{stage}",
                        warmup=a.warmup, threads=a.threads, micro=a.batch)
            results.setdefault((stage, "strata"), []).append(s)
            ps = s["per_step"]
            print(f"strata    stage={stage} run={rep + 1}: step {median(ps['step_time_s']):.3f} s "
                  f"(steps {', '.join(f'{v:.3f}' for v in ps['step_time_s'])}) fwd "
                  f"{median(ps['forward_s']):.3f} bwd {median(ps['backward_s']):.3f} reduce-wait "
                  f"{median(ps['comm_exposed_s']):.3f} gather-wait "
                  f"{median(ps['gather_exposed_s']):.3f} opt {median(ps['optimizer_s']):.3f}",
                  flush=True)
            if rep == 0 and s["notes"]:
                for n in s["notes"]:
                    print(f"          {n}")
            d = run_deepspeed(a, stage, zero)
            results.setdefault((stage, "DeepSpeed"), []).append(d)
            ps = d["per_step"]
            print(f"DeepSpeed stage={stage} run={rep + 1}: step {median(ps['step_time_s']):.3f} s "
                  f"(steps {', '.join(f'{v:.3f}' for v in ps['step_time_s'])}) fwd "
                  f"{median(ps['forward_s']):.3f} bwd {median(ps['backward_s']):.3f} comm-in-fwd "
                  f"{median(ps['comm_fwd_s']):.3f} comm-in-bwd {median(ps['comm_bwd_s']):.3f} "
                  f"opt {median(ps['optimizer_s']):.3f} (comm-in-opt "
                  f"{median(ps['comm_opt_s']):.3f})", flush=True)
    ds_ver = next((r[0].get("deepspeed") for (st, side), r in results.items()
                   if side == "DeepSpeed"), "?")
    torch_ver = next((r[0].get("torch") for (st, side), r in results.items()
                      if side == "DeepSpeed"), "?")
    print()
    print(f"DeepSpeed {ds_ver} (torch {torch_ver}, gloo). Medians over all timed steps of the "
          f"{a.reps} runs (s per step); ratio = DeepSpeed step time / strata step time.")
    print()
    print("| stage | side | step s | tok/s | compute s | exposed comm s | optimizer s "
          "| run medians (step s) | model states MiB/rank | peak RSS MiB | DeepSpeed / strata |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for stage in a.stages:
        step_med = {}
        for side in ("strata", "DeepSpeed"):
            runs = results[(stage, side)]
            pool = lambda k: [v for r in runs for v in r["per_step"][k]]  # noqa: E731
            step = median(pool("step_time_s"))
            step_med[side] = step
            runs_s = ", ".join(f"{median(r['per_step']['step_time_s']):.3f}" for r in runs)
            if side == "strata":
                states = runs[-1]["model_states"]
                rss = max(r["rss"] for r in runs)
            else:
                states = runs[-1]["model_state_bytes_per_rank"]
                rss = max(r["peak_rss_bytes"] for r in runs)
            ratio = f"{step_med['DeepSpeed'] / step_med['strata']:.2f}x" if side == "DeepSpeed" else ""
            print(f"| {stage} | {side} | {step:.3f} | {tok / step:.0f} | "
                  f"{median(pool('compute_s')):.3f} | {median(pool('exposed_comm_s')):.3f} | "
                  f"{median(pool('optimizer_s')):.3f} | {runs_s} | {states / mib:.1f} | "
                  f"{rss / mib:.0f} | {ratio} |")
    print()
    print("strata's peak RSS is rank 0's (metrics.jsonl), DeepSpeed's the max over ranks; model "
          "states: strata's tracked peak of params + master + grads + optimizer state, "
          "DeepSpeed's the census of bench/deepspeed_peer.py.")
    with open("/proc/loadavg") as f:
        print(f"# load average at the end: {' '.join(f.read().split()[:3])}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", default="report", choices=["report", "compare"])
    ap.add_argument("--strata", default=os.environ.get("STRATA", os.path.join(repo, "build", "strata")))
    ap.add_argument("--steps", type=int, default=None,
                    help="report: steps per run, the first 2 dropped (12); compare: timed steps after "
                    "--warmup (10)")
    # compare
    ap.add_argument("--python", default=os.environ.get("PYTHON", "/tmp/peer-venv/bin/python"),
                    help="interpreter with torch and deepspeed")
    ap.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=4, help="micro-batch per rank")
    ap.add_argument("--zero", default="", help="JSON object overriding DEFAULT_ZERO (both sides)")
    a = ap.parse_args()
    if not os.access(a.strata, os.X_OK):
        if a.strata == os.path.join(repo, "build", "strata"):
            subprocess.run([os.path.join(repo, "scripts", "setup.sh")], check=True)
        else:
            sys.exit(f"no strata binary at {a.strata}")
    if a.mode == "report":
        a.steps = a.steps or 12
        header(a, "2 ranks x 1 thread (4 ranks x 1 thread for MiCS), strata launch --threads 1")
        report(a)
    else:
        a.steps = a.steps or 10
        header(a, f"{a.ranks} ranks x {a.threads} thread(s) per rank, both sides (strata launch "
               f"--threads {a.threads}; DeepSpeed: torch.set_num_threads({a.threads}), "
               f"OMP/MKL_NUM_THREADS={a.threads})", [a.python])
        compare(a)


if __name__ == "__main__":
    main()
