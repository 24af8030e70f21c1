"""Kills of tidal's writers: a small sample of reports/storage/kills.py's random SIGKILLs, and the
regressions that its storm found, each at the one instant that showed it (through the shim
tests/fault/faultfs.c, killbefore: a SIGKILL as that write begins):

  1. tidal-diff killed before it made its file (while the model loads): `--resume` said "no such
     file"; it now starts the run, bit-identical to an uninterrupted one (tidal-rl did already).
  2. tidal-sft killed while it compacted sft.h5 after publishing its final model: `--resume` said
     "complete: nothing to resume" and left sft.h5.compact.tmp; it now finishes the compaction.
     Its final_eval_* attributes are committed before the model is published.
  3. tidal-rl killed while it wrote its final model: rl.h5 already said finished, so tidal-sweep
     skipped the run and model/ held only model.safetensors.tmp; the model is now written
     before the run file says finished, and `--resume` writes it whole. (3b) Killed between the
     commit that names checkpoint-2 and the removal of checkpoint-1: the resumed run kept both
     (only the latest is kept); `--resume` now removes every checkpoint but the one rl.h5 names.
     (3c) A tidal-sweep run killed while tidal-rl compacted its finished rl.h5: the sweep skipped
     the finished run again and left rl.h5.compact.tmp; it now finishes the compaction.
  4. A reader that reads rl.h5 while tidal-rl applies a commit (here: the writer killed between
     two writes of the apply, rl.h5 copied without its journal, so no tool rolls it forward): the
     /steps and /tokens columns stand at different lengths (h5py shows it); tidal-report used to
     fail ("/tokens/seq has 96 rows x 1, expected 48"); it now reads the last whole commit, the
     rows /progress names, in every group.
  5. 15 random kills over the five writers (kills.py --kills 15): every check of the storm.

Exit 0 pass, 1 fail, 77 skip (h5py missing, or the shim not built).
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import h5py
except ImportError:
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import storage_sweep as S  # noqa: E402

if not os.path.exists(S.SHIM):
    print("skip: %s not built" % S.SHIM)
    sys.exit(77)

MODEL = "datasets/models/add"
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    return cond


def trace(cmd, watch, path):
    rc, err = S.run(cmd, watch=watch, trace=path)
    if rc != 0:
        raise SystemExit("clean run failed: " + err[-500:])
    return S.read_trace(path)


def kill_at(cmd, watch, k):
    return S.run(cmd, watch=watch, at=k, mode="killbefore")


tmp = tempfile.mkdtemp(prefix="tidal-kills-")

# ---- 1. tidal-diff --resume of a file that was never made
prompts = os.path.join(tmp, "p.jsonl")
with open("datasets/demo-task-prompts.jsonl") as f, open(prompts, "w") as g:
    g.writelines(f.readlines()[:6])
D = S.DiffSweep(tmp, MODEL, prompts, ["--batch", "2", "--max-new-tokens", "4", "--seed", "7"])
out = os.path.join(tmp, "never.h5")
rc, err = S.run(D.cmd(out, "--resume"))
if check(rc == 0, "1. tidal-diff --resume of a missing file: rc %d: %s" % (rc, err[-300:])):
    check("starting it" in err, "1. no note that the run starts: " + err[-300:])
    have, _ = S.datasets(out, S.DIFF_GROUPS)
    bad = [k for k in D.ref if k not in have or not S.same_bits(have[k], D.ref[k])]
    check(not bad and set(have) == set(D.ref), "1. differs from the uninterrupted run: %s" % bad[:4])
print("1. tidal-diff --resume of a missing file: rc %d" % rc)

# ---- 2. tidal-sft killed inside the compaction after its final model
F = S.SftSweep(tmp, MODEL, "datasets/tasks/add", steps=2)
ks = [k for k, op, name, n in F.trace if name == "sft.h5.compact.tmp"]
shutil.rmtree(F.dir, ignore_errors=True)
os.makedirs(F.dir)
rc, _ = kill_at(F.cmd(), F.dir, ks[len(ks) // 2])
check(rc == -9, "2. tidal-sft was not killed in its compaction (rc %d)" % rc)
check(os.path.exists(F.out + ".compact.tmp"), "2. the kill left no sft.h5.compact.tmp (the case is not reached)")
with h5py.File(F.out, "r") as h:
    check("final_eval_accuracy" in h.attrs, "2. sft.h5 has no final_eval_accuracy though the final model is published")
rc, err = S.run(F.cmd("--resume"))
check(rc == 0 and "nothing to resume" in err, "2. tidal-sft --resume: rc %d: %s" % (rc, err[-300:]))
left = [os.path.basename(p) for p in glob.glob(F.dir + "*") if p.endswith((".tmp", ".journal"))]
check(not left, "2. after --resume left behind: %s" % left)
print("2. tidal-sft killed in its final compaction: --resume rc %d, left %s" % (rc, left))

# ---- 3. tidal-rl killed while writing its final model
R = S.RlSweep(tmp, MODEL, "datasets/tasks/add/train.jsonl", steps=3)
ks = [k for k, op, name, n in R.trace if name == "model.safetensors.tmp"]
shutil.rmtree(R.dir, ignore_errors=True)
os.makedirs(R.dir)
rc, _ = kill_at(R.cmd(), R.dir, ks[len(ks) // 2])
check(rc == -9, "3. tidal-rl was not killed writing its model (rc %d)" % rc)
subprocess.run([os.path.join(S.BIN, "tidal-report"), R.out], capture_output=True)   # rolls a journal forward
with h5py.File(R.out, "r") as h:
    check(int(h.attrs.get("finished", 0)) == 0, "3. rl.h5 says finished while model/ is not written")
rc, err = S.run(R.cmd("--resume"))
check(rc == 0, "3. tidal-rl --resume: rc %d: %s" % (rc, err[-300:]))
model = sorted(os.listdir(os.path.join(R.dir, "model")))
check("model.safetensors" in model and "config.json" in model and not any(m.endswith(".tmp") for m in model),
      "3. model/ after --resume: %s" % model)
print("3. tidal-rl killed writing its final model: --resume rc %d, model/ %s" % (rc, model))

# ---- 3b. tidal-rl killed after the commit that names checkpoint-2, before checkpoint-1 is removed
ren = [k for k, op, name, n in R.trace if op == "rename" and name == "checkpoint-2"][0]
k = [k for k, op, name, n in R.trace if k > ren and op == "unlink" and name == "rl.h5.journal"][0]
shutil.rmtree(R.dir, ignore_errors=True)
os.makedirs(R.dir)
rc, _ = kill_at(R.cmd(), R.dir, k)
before = sorted(d for d in os.listdir(R.dir) if d.startswith("checkpoint-"))
check(before == ["checkpoint-1", "checkpoint-2"], "3b. the kill left %s (the case is not reached)" % before)
rc, err = S.run(R.cmd("--resume"))
after = sorted(d for d in os.listdir(R.dir) if d.startswith("checkpoint-"))
check(rc == 0 and after == R.ref_checkpoints, "3b. after --resume (rc %d) the folder holds %s, as an uninterrupted "
      "run: %s alone (the last step's checkpoint)" % (rc, after, R.ref_checkpoints))
have, _ = S.datasets(R.out, S.RL_GROUPS)
bad = [n for n in R.ref if n.split("/")[-1] not in S.TIMING and (n not in have or not S.same_bits(have[n], R.ref[n]))]
check(not bad, "3b. after --resume differs: %s" % bad[:4])
print("3b. tidal-rl killed between naming checkpoint-2 and removing checkpoint-1: %s, after --resume %s" % (before, after))

# ---- 4. a reader between two writes of a commit's apply
# the commit of the second step: the writes to rl.h5 between its journal and the journal's removal
commits, cur = [], None
for k, op, name, n in R.trace:
    if op == "write" and name == "rl.h5.journal":
        cur = []
    elif cur is not None and op == "pwrite" and name == "rl.h5":
        cur.append(k)
    elif op == "unlink" and name == "rl.h5.journal" and cur is not None:
        commits.append(cur)
        cur = None
big = [c for c in commits if len(c) > 20]   # the steps' commits (the others set an attribute)
check(len(big) >= 1, "4. found %d step commits in the trace" % len(big))
apply = big[0] if big else []   # the second step: the first to rewrite the columns
skewed, reads = 0, 0
side = os.path.join(tmp, "reader.h5")
for k in apply[::max(len(apply) // 12, 1)]:
    shutil.rmtree(R.dir, ignore_errors=True)
    os.makedirs(R.dir)
    rc, _ = kill_at(R.cmd(), R.dir, k)
    shutil.copy(R.out, side)   # without the journal: as a reader finds the file mid-apply
    with h5py.File(side, "r") as h:
        lens = {g: {len(h[g][c]) for c in h[g]} for g in ("steps", "tokens", "seqs", "prompts", "progress") if g in h}
        # the last whole commit: the largest k whose /progress row's counts every column holds
        k_ = min(lens["progress"])
        prog = {g: h["progress/%s_rows" % g[:-1]][:k_] for g in ("tokens", "seqs", "prompts")}
        while k_ > 0 and (k_ > min(lens["steps"]) or any(prog[g][k_ - 1] > min(lens[g]) for g in prog)):
            k_ -= 1
        want = (int(prog["tokens"][k_ - 1]), int(prog["seqs"][k_ - 1])) if k_ else None
    skewed += any(len(v) > 1 for v in lens.values())
    r = subprocess.run([os.path.join(S.BIN, "tidal-report"), "--json", side], capture_output=True, text=True, env=S.ENV)
    if not check(r.returncode == 0, "4. kill before call %d (lengths %s): tidal-report rc %d: %s" % (
            k, lens, r.returncode, r.stderr.strip()[-300:])):
        continue
    rep = json.loads(r.stdout)
    reads += 1
    check((rep["n_tokens"], rep["n_seqs"]) == want, "4. kill before call %d (lengths %s): tidal-report read %d tokens, "
          "%d seqs; the last whole commit holds %s" % (k, lens, rep["n_tokens"], rep["n_seqs"], want))
check(skewed > 0, "4. no kill left columns of different lengths: the case is not reached")
print("4. reader mid-apply: %d kills in the second step's apply, %d left columns of different lengths, "
      "tidal-report read %d of them" % (len(apply[::max(len(apply) // 12, 1)]), skewed, reads))

# ---- 3c. a tidal-sweep run killed while tidal-rl compacted its finished rl.h5: the sweep skipped
#          the finished run and left rl.h5.compact.tmp; it now finishes the compaction
sw = os.path.join(tmp, "sweep")
cfg = os.path.join(tmp, "sweep.json")
args = {"model-path": os.path.abspath(MODEL), "dataset-path": os.path.abspath("datasets/tasks/add/train.jsonl"),
        "num-generations": 4, "per-device-batch-size": 4, "gradient-accumulation-steps": 1,
        "max-completion-length": 12, "learning-rate": 1e-3, "max-steps": 2, "save-steps": 1, "quiet": True}
with open(cfg, "w") as f:
    json.dump({"tool": os.path.abspath(os.path.join(S.BIN, "tidal-rl")), "output_dir": sw, "args": args,
               "grid": [{"axis": "seed", "seed": True, "values": {"s1": {"seed": 1}}}]}, f)
run_dir = os.path.join(sw, "s1") + os.sep
rl_cmd = [os.path.join(S.BIN, "tidal-rl")] + [x for k_, v in args.items() for x in (["--" + k_] if v is True else
                                                                                 ["--" + k_, str(v)])] + \
    ["--seed", "1", "--output-dir", run_dir]
os.makedirs(run_dir)
tr = trace(rl_cmd, run_dir, os.path.join(tmp, "sweep.trace"))
ks = [k for k, op, name, n in tr if name == "rl.h5.compact.tmp" and op == "pwrite"]
shutil.rmtree(run_dir)
os.makedirs(run_dir)
rc, _ = kill_at(rl_cmd, run_dir, ks[len(ks) // 2])
check(rc == -9 and os.path.exists(run_dir + "rl.h5.compact.tmp"), "3c. tidal-rl was not killed in its compaction (rc %d)" % rc)
rc, err = S.run([os.path.join(S.BIN, "tidal-sweep"), cfg, "--no-report"])
check(rc == 0 and "1 finished (skipped)" in err, "3c. tidal-sweep: rc %d: %s" % (rc, err[-300:]))
left = [p for p in os.listdir(run_dir) if p.endswith((".tmp", ".journal"))]
check(not left and S.open_raw(run_dir + "rl.h5"), "3c. after tidal-sweep: left %s" % left)
print("3c. tidal-sweep over a run killed in its final compaction: rc %d, left %s" % (rc, left))

# ---- 5. a sample of the random kills
work = os.path.join(tmp, "storm")
r = subprocess.run([sys.executable, "reports/storage/kills.py", "--kills", "15", "--work", work,
                    "--bin", S.BIN, "--out", os.path.join(tmp, "kills.md")], capture_output=True, text=True)
check(r.returncode == 0, "5. kills.py --kills 15: rc %d: %s" % (r.returncode, (r.stderr + open(
    os.path.join(tmp, "kills.md")).read() if os.path.exists(os.path.join(tmp, "kills.md")) else r.stderr)[-1500:]))
print("5. 15 random kills: rc %d" % r.returncode)

shutil.rmtree(tmp, ignore_errors=True)
print("test_kills: %s" % ("FAILED: %d problems" % len(failures) if failures else "ok"))
sys.exit(1 if failures else 0)
