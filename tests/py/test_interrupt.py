"""Interrupted runs: tidal-diff and tidal-init killed at random (seeded) moments.

tidal-diff: a tiny Qwen2 model. (1) 40 prompts, batch 4, 32 new tokens (10 batches): runs killed
with SIGKILL or SIGINT after a random number of completed batches plus a random fraction of a
batch's time. (2) 24 prompts, batch 1, 2 new tokens, so that writing dominates: runs killed with
SIGKILL at a random fraction of the reference run's duration, landing in commits and flushes.
TIDAL_INTERRUPT_KILLS=N kills per part (default 4; more for a stress run). Each part has its own
uninterrupted reference run. After each kill:
  - the run file opens with h5py;
  - the rows of every completed batch (rows below the last /progress row) equal the reference's
    rows bit for bit (nothing completed is lost or damaged);
  - SIGINT only: tidal-diff exits 130 with a message naming --resume, and no group holds rows
    past the last completed batch (it stopped between batches);
  - `--resume` finishes the file, and every dataset of /tokens, /seqs, /prompts, /progress then
    equals the reference bit for bit (NaNs included, compared as bytes).
tidal-init: killed with SIGKILL / SIGINT while writing a ~100 MB model: model.safetensors is
never left half-written under its real name (it is written as .tmp and renamed when complete);
after SIGINT the .tmp is removed too (after SIGKILL it stays: nothing can run then).

Exit 0 pass, 1 fail, 77 skip (h5py missing).
"""
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import tidal_check  # noqa: F401,E402  (SIGINT deliverable to the tools, whatever started the suite)

try:
    import h5py
    import numpy as np
except ImportError:
    sys.exit(77)

BUILD = os.environ.get("BUILD", "build")
BIN = os.path.join(BUILD, "bin")
GROUPS = ("tokens", "seqs", "prompts", "progress")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    return cond


journals = [0]   # kills that landed inside a commit (a journal was left)


def datasets(path):
    """{'/tokens/logp_a': ndarray, ...} of every dataset in GROUPS ({} for an empty file)."""
    out = {}
    if os.path.getsize(path) == 0:
        return out
    with h5py.File(path, "r") as f:
        for g in GROUPS:
            if g in f:
                for k in f[g]:
                    out["/%s/%s" % (g, k)] = f[g][k][()]
    return out


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


SHAPE = ["--batch", "4", "--max-new-tokens", "32"]


def diff_cmd(d, out, *extra):
    return [os.path.join(BIN, "tidal-diff"), "--model", os.path.join(d, "m"), "--prompts",
            os.path.join(d, "p.jsonl"), "-o", out, *SHAPE, "--seed", "7", *extra]


def run_killed(cmd, sig, delay, after_batches=0, after_file=None):
    """Starts cmd, waits until its stderr has reported after_batches completed batches (timing
    on a loaded 2-core machine is too noisy to aim by the clock alone) and until after_file
    exists (a kill before the tool made its run file leaves nothing to check: CI, 2026-11-30, a
    SIGKILL 28 ms into a 0.12 s run), sleeps delay, signals."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = b""
    while err.count(b"tidal-diff: batch ") < after_batches:
        c = p.stderr.read1(4096)
        if not c:
            break
        err += c
    while after_file and not os.path.exists(after_file) and p.poll() is None:
        time.sleep(0.001)
    time.sleep(delay)
    p.send_signal(sig)
    _, rest = p.communicate(timeout=120)
    return p.returncode, (err + rest).decode(errors="replace")


def test_diff(d, part, n_prompts, plan, by_batches):
    rng = random.Random(20261121)
    with open(os.path.join(d, "p.jsonl"), "w") as f:
        for _ in range(n_prompts):
            ids = [rng.randrange(3, 512) for _ in range(rng.randrange(4, 13))]
            f.write('{"tokens": [%s]}\n' % ", ".join(map(str, ids)))
    ref_path = os.path.join(d, part + "-ref.h5")
    t0 = time.monotonic()
    r = subprocess.run(diff_cmd(d, ref_path), capture_output=True)
    t_ref = time.monotonic() - t0
    if not check(r.returncode == 0, "reference run: %s" % r.stderr.decode()[-500:]):
        return
    # a second, warm run: the first pays for cold caches, so its time overstates later runs' (CI,
    # 2026-11-30: a 0.31 s reference, and 3 of 4 kills at 0.63-0.68 of it came after the end)
    t0 = time.monotonic()
    subprocess.run(diff_cmd(d, os.path.join(d, part + "-warm.h5")), capture_output=True)
    t_ref = min(t_ref, time.monotonic() - t0)
    ref = datasets(ref_path)
    print("[%s] reference: %.2f s, %d token rows, %d batches" % (part, t_ref, len(ref["/tokens/seq"]), len(ref["/progress/batch"])))

    nb_ref = len(ref["/progress/batch"])
    late = 0
    t_batch = t_ref / nb_ref
    for i, sig in enumerate(plan):
        path = os.path.join(d, "%s-run%d.h5" % (part, i))
        if by_batches:   # after a random number of completed batches + a random fraction of one
            k, frac = rng.randrange(1, nb_ref - 1), rng.random()
            rc, err = run_killed(diff_cmd(d, path), sig, frac * t_batch, k)
            name = "%s after batch %d + %.2f of a batch" % (sig.name, k, frac)
        else:            # at a random fraction of the reference's duration; a kill that came
            # after the end (the machine ran this one faster) is aimed again at half the delay
            frac = rng.uniform(0.1, 0.7)
            for _ in range(3):
                rc, err = run_killed(diff_cmd(d, path), sig, frac * t_ref, after_file=path)
                if rc != 0:
                    break
                print("%s at %.2f of the reference run: the run finished first, aimed again" % (sig.name, frac))
                os.unlink(path)
                frac /= 2
            name = "%s at %.2f of the reference run" % (sig.name, frac)
        if rc == 0:   # timing on a loaded machine (the reference may have run slower): this kill came too late
            late += 1
            print("%s: the run finished first (rc 0)" % name)
            continue
        check(rc != 0, "%s: the run finished before the signal (rc 0): the test aimed badly" % name)
        if sig == signal.SIGKILL:
            check(rc == -signal.SIGKILL, "%s: expected death by SIGKILL, got rc %d" % (name, rc))
        else:
            check(rc == 130, "%s: expected exit 130, got %d: %s" % (name, rc, err[-300:]))
            check("--resume" in err, "%s: no --resume hint in: %s" % (name, err[-300:]))
        if not check(os.path.exists(path), "%s: no run file left" % name):
            continue
        if os.path.getsize(path) == 0:   # killed before its first commit: nothing was complete
            print("%s: rc %d, killed before the first commit (empty file)" % (name, rc))
        elif os.path.exists(path + ".journal"):
            # killed inside a commit: h5py reads the file once a tidal tool has rolled the
            # journal forward (killed inside its apply, the file is torn until then)
            journals[0] += 1
            subprocess.run([os.path.join(BIN, "tidal-report"), path], capture_output=True)
            check(not os.path.exists(path + ".journal"), "%s: tidal-report did not finish the commit" % name)
        try:
            got = datasets(path)
        except Exception as e:  # a SIGKILL that leaves an unreadable file is a real finding
            check(False, "%s: run file unreadable by h5py: %s" % (name, e))
            continue
        nb = len(got.get("/progress/batch", [])) if got else 0
        cut = {}
        if nb:
            cut = {"tokens": got["/progress/token_rows"][-1], "seqs": got["/progress/seq_rows"][-1],
                   "prompts": got["/progress/prompt_rows"][-1], "progress": nb}
        for k, v in got.items():
            n = cut.get(k.split("/")[1], 0)
            check(len(v) >= n, "%s: %s has %d rows, fewer than /progress promises (%d)" % (name, k, len(v), n))
            check(same_bits(v[:n], ref[k][:n]), "%s: completed rows of %s differ from the reference" % (name, k))
            if sig == signal.SIGINT and rc == 130:
                check(len(v) == n, "%s: %s has %d rows past the last completed batch (%d)" % (name, k, len(v), n))
        print("%s: rc %d, %d completed batches kept, %s" % (name, rc, nb,
              "token rows %d/%d" % (len(got.get("/tokens/seq", [])), len(ref["/tokens/seq"]))))
        r = subprocess.run(diff_cmd(d, path, "--resume"), capture_output=True)
        if not check(r.returncode == 0, "%s: --resume failed: %s" % (name, r.stderr.decode()[-500:])):
            continue
        fin = datasets(path)
        check(set(fin) == set(ref), "%s: resumed file has datasets %s, reference %s" % (name, sorted(set(fin) ^ set(ref)), ""))
        bad = [k for k in ref if k in fin and not same_bits(fin[k], ref[k])]
        check(not bad, "%s: after --resume these differ from the reference: %s" % (name, bad))
    check(late * 2 <= len(plan), "[%s] %d of %d kills came after the run had finished" % (part, late, len(plan)))


def test_init(d):
    rng = random.Random(7)
    cmd_tail = ["--arch", "qwen2", "--hidden-size", "256", "--num-layers", "6", "--num-heads", "4", "--num-kv-heads", "2",
                "--head-dim", "64", "--intermediate-size", "1024", "--vocab-size", "32000", "--seed", "1"]
    out = os.path.join(d, "init-ref")
    t0 = time.monotonic()
    r = subprocess.run([os.path.join(BIN, "tidal-init"), *cmd_tail, "-o", out], capture_output=True)
    t_ref = time.monotonic() - t0
    if not check(r.returncode == 0, "tidal-init reference: %s" % r.stderr.decode()[-300:]):
        return
    for i, sig in enumerate([signal.SIGKILL, signal.SIGINT, signal.SIGKILL]):
        o = os.path.join(d, "init%d" % i)
        frac = rng.uniform(0.2, 0.8)
        rc, _ = run_killed([os.path.join(BIN, "tidal-init"), *cmd_tail, "-o", o], sig, frac * t_ref)
        final = os.path.join(o, "model.safetensors")
        if os.path.exists(final):   # renamed into place before the signal: then it must be whole (the
            # signal may still land between the rename and the exit: rc 0 or killed, either is fine)
            v = subprocess.run([os.path.join(BIN, "tidal-inspect"), o, "--no-tensors"], capture_output=True, text=True)
            check(rc in (0, -sig, 128 + sig) and v.returncode == 0, "tidal-init %s at %.2f: model.safetensors "
                  "exists, rc %d, tidal-inspect: %s" % (sig.name, frac, rc, v.stderr[-300:]))
        if sig == signal.SIGINT:
            check(not os.path.exists(final + ".tmp"), "tidal-init SIGINT left model.safetensors.tmp behind")
        print("tidal-init %s at %.2f of %.2f s: rc %d, model.safetensors %s, .tmp %s" % (
            sig.name, frac, t_ref, rc, "complete" if os.path.exists(final) else "absent",
            "left" if os.path.exists(final + ".tmp") else "absent"))


with tempfile.TemporaryDirectory() as d:
    r = subprocess.run([os.path.join(BIN, "tidal-init"), "--arch", "qwen2", "--preset", "tiny", "--seed", "1",
                        "-o", os.path.join(d, "m")], capture_output=True)
    if check(r.returncode == 0, "tidal-init tiny: %s" % r.stderr.decode()[-300:]):
        # 1. batches of 4 prompts x 32 tokens: kills land mostly inside compute
        n_kills = int(os.environ.get("TIDAL_INTERRUPT_KILLS", "4"))
        test_diff(d, "compute", 40, [signal.SIGKILL if i % 4 < 2 else signal.SIGINT for i in range(n_kills)], True)
        # 2. batches of 1 prompt x 2 tokens: writing dominates, so SIGKILLs land inside commits and
        #    flushes (before run files stopped reusing freed space, 4 of 12 such kills left
        #    completed rows undecodable: "inflate() failed")
        SHAPE[:] = ["--batch", "1", "--max-new-tokens", "2"]
        test_diff(d, "commit", 24, [signal.SIGKILL] * n_kills, False)
    test_init(d)

print("kills inside a commit (journal rolled forward): %d" % journals[0])
print("test_interrupt: %s" % ("FAILED: %d problems" % len(failures) if failures else "ok"))
sys.exit(1 if failures else 0)
