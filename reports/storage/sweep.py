"""The storage-fault sweep behind reports/storage/README.md: every writer of tidal (tidal-diff,
tidal-rl, tidal-sft, tidal-merge), with the fault at every STRIDE-th write-side call of a clean
run (tests/fault/faultfs.c numbers them), in four modes: ENOSPC from that call on (a disk that
fills), EIO from that call on (a device that fails), SIGKILL inside the call after half its bytes
(a torn write), SIGKILL as the call begins (a kill between two calls). What each case checks:
tests/py/storage_sweep.py.

    make tests && .venv/bin/python reports/storage/sweep.py [--stride N] > reports/storage/results.md

Prints a markdown table of the counts per writer and mode, then the failed cases.
"""
import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
os.chdir(ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
import storage_sweep as S  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--stride", type=int, default=1, help="every N-th call (tidal-diff); the others scale it")
ap.add_argument("--writers", default="diff,rl,sft,merge")
ap.add_argument("--modes", default="fail:ENOSPC,fail:EIO,kill,killbefore", help="a subset of the four, comma-separated")
args = ap.parse_args()

MODES = [(m.split(":")[0], m.split(":")[1] if ":" in m else "ENOSPC") for m in args.modes.split(",")]
MODEL = "datasets/models/add"
tmp = tempfile.mkdtemp(prefix="tidal-sweep-")
prompts = os.path.join(tmp, "p.jsonl")
with open("datasets/demo-task-prompts.jsonl") as f, open(prompts, "w") as g:
    g.writelines(f.readlines()[:6])

t0 = time.time()
writers = {}
D = S.DiffSweep(tmp, MODEL, prompts, ["--batch", "2", "--max-new-tokens", "4", "--seed", "7"])
if "diff" in args.writers:
    writers["tidal-diff (3 batches + compaction)"] = (D, args.stride)
if "rl" in args.writers:
    writers["tidal-rl (3 steps, checkpoint each)"] = (S.RlSweep(tmp, MODEL, "datasets/tasks/add/train.jsonl", steps=3),
                                                     args.stride * 3)
if "sft" in args.writers:
    writers["tidal-sft (2 steps, checkpoint each)"] = (S.SftSweep(tmp, MODEL, "datasets/tasks/add", steps=2),
                                                      args.stride * 3)
if "merge" in args.writers:
    writers["tidal-merge (2 shards, --force over an old file)"] = (S.MergeSweep(tmp, D.cmd), args.stride)

KEYS = ["cases", "finished anyway", "crashes", "unreadable", "raw_unreadable", "batches lost", "steps lost",
        "completed rows damaged", "resume failed", "resume not bit-identical", "resumed bit-identical", "failed cases"]
rows, log, phase_rows = [], [], []
for name, (W, stride) in writers.items():
    calls = [k for k, *_ in W.trace]
    phase_of = {k: p for p, ks in W.phases().items() for k in ks}
    for mode, errno_name in MODES:
        counts = S.Counts()
        for k in calls[::stride]:
            before = len(log)
            W.case(k, mode, errno_name, counts, log)
            if len(log) > before:
                log[-1] += " [%s]" % phase_of.get(k, "?")
        label = mode if mode != "fail" else "fail " + errno_name
        rows.append((name, label, len(calls), counts.c))
        print("%s %s: %s (%.0f s)" % (name, label, counts.c, time.time() - t0), file=sys.stderr)
    phase_rows.append((name, {p: len(ks) for p, ks in W.phases().items()}))

print("| writer | fault | calls in a clean run | cases | crashes | unreadable | stopped inside a commit | of which h5py "
      "could not read before a tidal tool rolled it forward | completed rows lost or damaged | resume failed | resumed "
      "bit-identical | finished anyway | failed cases |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for name, label, ncalls, c in rows:
    lost = c.get("batches lost", 0) + c.get("steps lost", 0) + c.get("completed rows damaged", 0)
    print("| %s | %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d |" % (
        name, label, ncalls, c.get("cases", 0), c.get("crashes", 0), c.get("unreadable", 0),
        c.get("stopped inside a commit", 0), c.get("raw_unreadable", 0) + c.get("cut in its first commit", 0),
        lost, c.get("resume failed", 0) + c.get("resume not bit-identical", 0), c.get("resumed bit-identical", 0),
        c.get("finished anyway", 0), c.get("failed cases", 0)))
print()
print("Phases (calls of a clean run in each):")
print()
for name, ph in phase_rows:
    print("- %s: %s" % (name, "; ".join("%s %d" % (p, n) for p, n in ph.items())))
print()
print("Sweep took %.0f s (stride %d)." % (time.time() - t0, args.stride))
if log:
    print()
    print("Failed cases:")
    print()
    for line in log:
        print("- " + line)
