"""The monitor peer test's Python side (tests/monitor/monitor_peer_test.sh).

  data WORK                  writes WORK/train.bin and WORK/val.bin (llm.c GPT-2 shards)
  check WORK STEPS PHASE     reads WORK/tb/tiny with TensorBoard and WORK/csv/tiny as CSV, and
                             checks both against WORK/run/metrics.jsonl
"""
import csv
import glob
import json
import math
import os
import struct
import sys


def write_shard(path, tokens):
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))


def data(work):
    write_shard(os.path.join(work, "train.bin"), [(i * 7 + i // 13) % 64 for i in range(6000)])
    write_shard(os.path.join(work, "val.bin"), [(i * 5 + i // 11) % 64 for i in range(3000)])


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def close(a, b, what):
    # TensorBoard keeps simple_value as float32.
    if not math.isclose(a, b, rel_tol=2e-7, abs_tol=1e-30):
        fail("%s: TensorBoard %r, metrics.jsonl %r" % (what, a, b))


def check(work, steps, phase):
    from tensorboard.backend.event_processing import event_accumulator, event_file_loader

    rows = [json.loads(line) for line in open(os.path.join(work, "run", "metrics.jsonl"))]
    if [r["step"] for r in rows] != list(range(1, steps + 1)):
        fail("metrics.jsonl steps %r" % [r["step"] for r in rows])
    batch = 8
    expect = {  # tag -> {samples: value}
        "Train/Samples/train_loss": {r["step"] * batch: r["loss"] for r in rows},
        "Train/Samples/lr": {r["step"] * batch: r["lr"] for r in rows},
        "Train/Samples/loss_scale": {r["step"] * batch: r["loss_scale"] for r in rows},
        "Train/Samples/grad_norm": {r["step"] * batch: r["grad_norm"] for r in rows},
        "Train/Samples/tokens_per_s": {r["step"] * batch: r["tokens_per_s"] for r in rows},
        "Train/Samples/mfu": {r["step"] * batch: r["mfu"] for r in rows},
        "Train/Samples/val_loss": {r["step"] * batch: r["val_loss"] for r in rows if "val_loss" in r},
        "Train/Samples/memory/activations_bytes":
            {r["step"] * batch: r["peak_bytes"]["activations"] for r in rows},
        "Train/Samples/memory/params_bytes":
            {r["step"] * batch: r["peak_bytes"]["params"] for r in rows},
        "Train/Samples/comm_exposed_s": {r["step"] * batch: r["comm_exposed_s"] for r in rows},
    }
    if sorted(expect["Train/Samples/val_loss"]) != [16, 32]:
        fail("validation at steps 2 and 4 expected, metrics.jsonl has samples %r"
             % sorted(expect["Train/Samples/val_loss"]))

    tb = os.path.join(work, "tb", "tiny")
    files = sorted(glob.glob(os.path.join(tb, "events.out.tfevents.*")))
    if len(files) != (1 if phase == "first" else 2):
        fail("event files %r" % files)
    # The newest file: the version record, then SessionLog START past the samples kept.
    events = list(event_file_loader.EventFileLoader(files[-1]).Load())
    if events[0].file_version != "brain.Event:2":
        fail("first record %r" % events[0])
    start = 1 if phase == "first" else 2 * batch + 1
    if events[1].WhichOneof("what") != "session_log" or events[1].session_log.status != 1 \
            or events[1].step != start:
        fail("second record is not SessionLog START at step %d: %r" % (start, events[1]))

    acc = event_accumulator.EventAccumulator(tb, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag, want in expect.items():
        if tag not in tags:
            fail("TensorBoard has no scalar %s; it has %s" % (tag, sorted(tags)))
        got = acc.Scalars(tag)
        if [e.step for e in got] != sorted(want):
            fail("%s: steps %r, expected %r" % (tag, [e.step for e in got], sorted(want)))
        for e in got:
            close(e.value, want[e.step], "%s at %d" % (tag, e.step))

    # DeepSpeed's CSV layout: Train_Samples_train_loss.csv with "step,train_loss".
    for tag, want in expect.items():
        name = os.path.join(work, "csv", "tiny", tag.replace("/", "_") + ".csv")
        with open(name, newline="") as f:
            table = list(csv.reader(f))
        if table[0] != ["step", tag.split("/")[-1]]:
            fail("%s header %r" % (name, table[0]))
        got = {int(r[0]): float(r[1]) for r in table[1:]}
        if len(table) - 1 != len(want) or sorted(got) != sorted(want):
            fail("%s rows %r, expected steps %r" % (name, table[1:], sorted(want)))
        for s, v in want.items():
            if got[s] != v:  # the shortest round-trip text of the double
                fail("%s at %d: %r, metrics.jsonl %r" % (name, s, got[s], v))
    print("%s: %d tags read by TensorBoard and as CSV, %d steps" % (phase, len(expect), steps))


if __name__ == "__main__":
    if sys.argv[1] == "data":
        data(sys.argv[2])
    elif sys.argv[1] == "check":
        check(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        fail("usage: see the docstring")
