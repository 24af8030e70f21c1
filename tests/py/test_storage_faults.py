"""Storage faults: tidal-diff and tidal-rl with a storage that fails on cue (ENOSPC, EIO) or a
SIGKILL inside a chosen write, through the LD_PRELOAD shim tests/fault/faultfs.c. What each case
checks: tests/py/storage_sweep.py. This test takes a sample: per phase of each writer (first
batch, a later batch, the commit's journal, its apply and fsync, the close, the compaction;
tidal-rl's checkpoint save and its run-file commits; tidal-sft's; tidal-merge's output), one
call, alternately failed with ENOSPC,
failed with EIO, and killed. reports/storage/sweep.py runs the wider sweep behind
reports/storage/README.md. A case that fails prints what it saw.

Plus the disk-full run of issue 28 on a real 120 KiB tmpfs when this machine lets us mount one
(root): exit 1 with the message, the file readable, --resume finishing it once there is room.

And a tidal-rl run read while it is written: h5py and tidal-report see the steps committed so
far; every tidal-report succeeds (after the first step) and reads a whole commit's rows.

Exit 0 pass, 1 fail, 77 skip (h5py missing, or the shim cannot preload: a static build).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

try:
    import h5py  # noqa: F401
    import numpy as np  # noqa: F401
except ImportError:
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import storage_sweep as S  # noqa: E402

if not os.path.exists(S.SHIM):
    print("skip: %s not built" % S.SHIM)
    sys.exit(77)

t0 = time.time()
tmp = tempfile.mkdtemp(prefix="tidal-storage-")
prompts = os.path.join(tmp, "p.jsonl")
with open("datasets/demo-task-prompts.jsonl") as f, open(prompts, "w") as g:
    g.writelines(f.readlines()[:6])
MODEL = "datasets/models/add"
log, counts = [], S.Counts()
MODES = [("fail", "ENOSPC"), ("kill", None), ("fail", "EIO")]

# ---- tidal-diff: 6 prompts, batch 2 (3 batches)
D = S.DiffSweep(tmp, MODEL, prompts, ["--batch", "2", "--max-new-tokens", "4", "--seed", "7"])
phases = D.phases()
want = [k for k in phases if k.startswith(("attributes: journal", "first batch", "batch 1: append", "batch 1: journal",
                                          "close", "compaction"))]
i = 0
for key in want:
    ks = phases[key]
    k = ks[len(ks) // 2]
    mode, errno_name = MODES[i % len(MODES)]
    i += 1
    if not D.case(k, mode, errno_name or "ENOSPC", counts, log):
        print("FAIL (%s):" % key, log[-1])
# a full disk: everything fails from the first batch's appends on
k = phases["first batch: append/apply"][0]
D.case(k, "fail", "ENOSPC", counts, log)

# ---- tidal-rl: 3 steps, a checkpoint after each
R = S.RlSweep(tmp, MODEL, "datasets/tasks/add/train.jsonl", steps=3)
rph = R.phases()
for j, key in enumerate(sorted(rph)):
    ks = rph[key]
    mode, errno_name = MODES[j % len(MODES)]
    k = ks[len(ks) // 3]
    if not R.case(k, mode, errno_name or "ENOSPC", counts, log):
        print("FAIL (%s):" % key, log[-1])

# ---- tidal-merge (the merged file whole or not at all) and tidal-sft (its steps and checkpoints)
M = S.MergeSweep(tmp, D.cmd)
mph = M.phases()
for key, mode, errno_name in (("merge: ftruncate", "fail", "ENOSPC"), ("merge: pwrite", "kill", "ENOSPC"),
                              ("merge: pwrite", "fail", "EIO"), ("merge: rename", "fail", "ENOSPC")):
    ks = mph.get(key, [])
    if ks and not M.case(ks[len(ks) // 2], mode, errno_name, counts, log):
        print("FAIL (%s):" % key, log[-1])
F = S.SftSweep(tmp, MODEL, "datasets/tasks/add", steps=2)
fph = F.phases()
for j, key in enumerate(k for k in sorted(fph) if k.endswith(("pwrite", "write", "rename", "fsync"))):
    ks = fph[key]
    mode, errno_name = MODES[j % len(MODES)]
    if not F.case(ks[len(ks) // 2], mode, errno_name or "ENOSPC", counts, log):
        print("FAIL (%s):" % key, log[-1])

# ---- issue 28's run on a real 120 KiB tmpfs, when this machine lets us mount one
mnt = os.path.join(tmp, "small")
os.makedirs(mnt)
if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=120k", "tmpfs", mnt],
                                        capture_output=True).returncode == 0:
    try:
        out = os.path.join(mnt, "run.h5")
        cmd = [os.path.join(S.BIN, "tidal-diff"), "--model", MODEL, "--prompts", "datasets/demo-task-prompts.jsonl",
               "--max-new-tokens", "40", "-o", out]
        p = subprocess.run(cmd, capture_output=True, text=True, env=S.ENV)
        msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
        ok = p.returncode == 1 and out in msg and "No space left on device" in msg
        ok = ok and S.open_raw(out) and sorted(os.listdir(mnt)) == ["run.h5"]
        subprocess.run(["mount", "-o", "remount,size=4m", mnt], check=True)
        p2 = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, env=S.ENV)
        ok = ok and p2.returncode == 0 and sorted(os.listdir(mnt)) == ["run.h5"]
        print("120 KiB tmpfs: rc %d (%s); after room, --resume rc %d" % (p.returncode, msg, p2.returncode))
        if not ok:
            log.append("120 KiB tmpfs run: rc %d %s / resume rc %d %s" % (p.returncode, msg, p2.returncode, p2.stderr[-300:]))
    finally:
        subprocess.run(["umount", mnt])
else:
    print("(no tmpfs mount here: the 120 KiB run is skipped; the shim cases stand for it)")

# ---- a run read while it is written: tidal-report and h5py see the steps committed so far, each
#      time a whole commit (the rows a /progress row names), even when a commit comes mid-read
live = os.path.join(tmp, "live") + os.sep
cmd = R.cmd()[:-2] + ["--output-dir", live]
cmd[cmd.index("--max-steps") + 1] = "10"
w = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=S.ENV)
seen, reports, report_tokens, report_fail = [], 0, set(), []
while w.poll() is None and len(seen) < 40:
    f = os.path.join(live, "rl.h5")
    if os.path.exists(f) and os.path.getsize(f) > 0:
        if S.open_raw(f):
            with h5py.File(f, "r") as h:
                seen.append(len(h["steps/reward"]) if "steps" in h else 0)
        r = subprocess.run([os.path.join(S.BIN, "tidal-report"), "--json", f], capture_output=True, text=True, env=S.ENV)
        if r.returncode == 0:
            reports += 1
            report_tokens.add(json.loads(r.stdout)["n_tokens"])
        elif "empty run" not in r.stderr:   # before the first step: nothing to report yet
            report_fail.append(r.stderr.strip()[-200:])
    time.sleep(0.2)
w.wait()
with h5py.File(os.path.join(live, "rl.h5"), "r") as h:
    whole = set(int(x) for x in h["progress/token_rows"][:])
print("live: steps seen by h5py while tidal-rl wrote: %s; tidal-report read it %d times (%d failed), token rows %s" % (
    sorted(set(seen)), reports, len(report_fail), sorted(report_tokens)))
if not (seen and max(seen) >= 1 and reports >= 1):
    log.append("a running tidal-rl's rl.h5 was not readable while written (h5py saw %s, tidal-report %d)" % (seen, reports))
if report_fail:
    log.append("tidal-report failed on a running tidal-rl's rl.h5: %s" % report_fail[:3])
if not report_tokens <= whole:
    log.append("tidal-report read %s token rows of a running tidal-rl's rl.h5, not a whole commit's (%s)" % (
        sorted(report_tokens - whole), sorted(whole)))

c = counts.c
print("cases %d, failed %d, crashes %d, unreadable %d (needed tidal to finish a commit first: %d), batches/steps "
      "lost %d, resumed bit-identical %d; %.0f s" %
      (c.get("cases", 0), c.get("failed cases", 0), c.get("crashes", 0), c.get("unreadable", 0),
       c.get("raw_unreadable", 0), c.get("batches lost", 0) + c.get("steps lost", 0), c.get("resumed bit-identical", 0),
       time.time() - t0))
for line in log:
    print("FAIL:", line)
if log:
    sys.exit(1)
print("test_storage_faults: ok")
