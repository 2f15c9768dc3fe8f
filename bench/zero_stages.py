#!/usr/bin/env python3
"""ZeRO stages on this machine, one run (bench-23M, fp32, AdamW, global batch 8 = 2 ranks x
micro-batch 4, 1 thread per rank): step time of each stage relative to stage 0, bytes each rank
put on the wire per step against ZeRO's theory, exposed gather time at stage 3 with prefetch on
and off, model-state memory per rank, and MiCS (4 ranks, shard groups of 2) bytes crossing the
groups against theory. Uses the strata CLI (`strata launch -- train`) and its metrics.jsonl.

    python3 bench/zero_stages.py [--steps 12]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
strata = os.path.join(repo, "build", "strata")
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


# Buckets and prefetch of 5e6 elements, as bench/deepspeed_peer.py gives DeepSpeed; a released
# stage-3 unit is re-gathered for backward (reuse distance 0), as ZeRO-3's 3Ψ counts it.
LEAN = {"overlap_comm": True, "reduce_bucket_size": 5_000_000,
        "stage3_prefetch_bucket_size": 5_000_000, "stage3_max_reuse_distance": 0}


def run(ranks, zero, steps, tmp, name):
    cfg = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 8 // ranks,
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
    out = subprocess.run(
        [strata, "launch", "-n", str(ranks), "--threads", "1", "--", "train", "--config", path,
         "--steps", str(steps), "--run-dir", run_dir],
        env=env, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))][2:]
    params = int(re.search(r"(\d+) parameters", out).group(1))
    model_states = sum(rows[-1]["peak_bytes"][k]
                       for k in ("params", "master_params", "grads", "optimizer_state"))
    med = lambda k: statistics.median(r[k] for r in rows)
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
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    if not os.access(strata, os.X_OK):
        subprocess.run([os.path.join(repo, "scripts", "setup.sh")], check=True)
    mib = 1 << 20
    with tempfile.TemporaryDirectory() as tmp:
        print("## ZeRO stages, bench-23M fp32, 2 ranks x 1 thread, global batch 8")
        print("stage | tok/s | step vs stage 0 | wire MiB/step/rank | theory | measured/theory"
              " | exposed reduce s | exposed gather s | model states MiB/rank | max RSS MiB")
        base = None
        for stage in (0, 1, 2, 3):
            r = run(2, dict(LEAN, stage=stage), a.steps, tmp, f"s{stage}")
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
            r = run(2, zero, a.steps, tmp, "pf_" + label)
            print(f"prefetch {label}: exposed gather {r['gather_s']:.3f} s/step, "
                  f"{r['tok_s']:.0f} tok/s, wire {r['bytes'] / mib:.1f} MiB/step")
        print("## MiCS: 4 ranks, stage 3, shard groups of 2 vs one group of 4")
        for label, zero in (("groups of 2", dict(LEAN, stage=3, mics_shard_size=2)),
                            ("one group of 4", dict(LEAN, stage=3))):
            r = run(4, zero, max(4, a.steps // 2), tmp, "mics_" + label.replace(" ", "_"))
            # Across groups (R = 2 replicas): one all-reduce of the Ψ/G partition per step.
            theory = 2 * (2 - 1) / 2 * r["params"] / 2 * 4 if "2" in label else 0
            ratio = f"{r['cross'] / theory:.3f}" if theory else "-"
            print(f"{label}: wire {r['bytes'] / mib:.1f} MiB/step/rank, across groups "
                  f"{r['cross'] / mib:.1f} MiB (theory {theory / mib:.1f}, ratio {ratio}), "
                  f"model states {r['model_states'] / mib:.1f} MiB/rank, {r['tok_s']:.0f} tok/s")


if __name__ == "__main__":
    main()
