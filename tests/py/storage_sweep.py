"""Storage-fault sweeps over tidal's writers, shared by tests/py/test_storage_faults.py (a sample
that fits a test's time) and reports/storage/sweep.py (the wider sweep behind the report).

A clean run under build/tests/fault/faultfs.so (tests/fault/faultfs.c) records every write-side
call on the run's folder (TIDAL_FAULT_TRACE); each case then reruns the writer with the fault at
one of those calls: the call and every later one failing with ENOSPC or EIO (a disk that fills
up, a device that fails), or the process SIGKILLed inside it (a torn write). After each case:

  - a failure exits 1 with a message naming the file and the error; a kill is SIGKILL (no other
    signal death: no crash);
  - the run file opens with h5py (`raw_unreadable` counts files that needed tidal to finish a
    commit first: a kill between the journal and its deletion; any tidal reader does it);
  - every completed batch or step is still there, its rows equal to the clean run's bit for bit;
  - tidal-rl: the checkpoint the run file names is whole; no checkpoint-K.tmp or empty folder
    is left after a failure;
  - no temporary (.journal, .compact.tmp, .new.tmp) is left after a failure (a kill may leave
    one; the resume removes it);
  - `--resume` then finishes the run, bit-identical to the clean run (tidal-rl: its timing
    columns aside).
"""
import glob
import os
import shutil
import subprocess

import h5py
import numpy as np

BUILD = os.environ.get("BUILD", "build")
BIN = os.path.join(BUILD, "bin")
SHIM = os.path.abspath(os.path.join(BUILD, "tests", "fault", "faultfs.so"))
ERRTEXT = {"ENOSPC": "No space left on device", "EIO": "Input/output error"}
DIFF_GROUPS = ("tokens", "seqs", "prompts", "progress", "text")
RL_GROUPS = ("steps", "tokens", "seqs", "prompts", "progress")
ENV = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE",
           ASAN_OPTIONS=(os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0:detect_leaks=0").lstrip(":"))


def run(cmd, watch=None, at=None, mode="fail", errno_name="ENOSPC", trace=None):
    env = dict(ENV)
    if watch:
        env.update(LD_PRELOAD=SHIM, TIDAL_FAULT_PATH=watch)
        if at is not None:
            env.update(TIDAL_FAULT_AT=str(at), TIDAL_FAULT_MODE=mode, TIDAL_FAULT_ERRNO=errno_name)
        if trace:
            env["TIDAL_FAULT_TRACE"] = trace
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return p.returncode, p.stderr


def read_trace(path):
    """[(k, op, name, nbytes)] of a clean run's calls."""
    out = []
    for line in open(path):
        k, op, name, n = line.split()
        out.append((int(k), op, name, int(n)))
    return out


def datasets(path, groups):
    out = {}
    with h5py.File(path, "r") as f:
        for g in groups:
            if g in f:
                for k in f[g]:
                    out["/%s/%s" % (g, k)] = f[g][k][()]
        attrs = dict(f.attrs)
    return out, attrs


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def open_raw(path):
    """Whether h5py reads the whole file: every attribute and every dataset. In a child process:
    HDF5 can crash on a torn file rather than report it."""
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            with h5py.File(path, "r") as f:
                dict(f.attrs)

                def read(name, obj):
                    if isinstance(obj, h5py.Dataset):
                        obj[()]
                f.visititems(read)   # a callback that returns something stops the walk
            ok = True
        except Exception:
            pass
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def has_signature(path):
    """Whether the file starts as an HDF5 file does (a new file's first commit writes it last)."""
    try:
        with open(path, "rb") as f:
            return f.read(8) == b"\x89HDF\r\n\x1a\n"
    except OSError:
        return False


def readable(path):
    """(readable, readable by h5py before a tidal tool finished a commit the writer was killed in).
    A journal beside the file: the writer stopped inside a commit; tidal-report (any tidal tool)
    rolls it forward, and then h5py must read the whole file."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return True, True   # stopped before its first commit: nothing was complete
    raw = open_raw(path)
    if os.path.exists(path + ".journal"):
        subprocess.run([os.path.join(BIN, "tidal-report"), path], capture_output=True, env=ENV)
        return open_raw(path) and not os.path.exists(path + ".journal"), raw
    return raw, raw


class Counts:
    def __init__(self):
        self.c = {}

    def add(self, key, n=1):
        self.c[key] = self.c.get(key, 0) + n


def fresh_case(folder, cmd, writer, at, mode, errno_name, counts):
    """Runs cmd in folder, emptied first, with the fault at call `at`: (rc, stderr, the case's tag,
    what is wrong so far: its exit status, exit_verdict)."""
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    rc, err = run(cmd, watch=folder, at=at, mode=mode, errno_name=errno_name)
    tag = "%s K=%d %s%s" % (writer, at, mode, "" if mode.startswith("kill") else " " + errno_name)
    bad = []
    exit_verdict(rc, err, mode, errno_name, counts, bad)
    return rc, err, tag, bad


def case_done(tag, bad, counts, log):
    """Logs a failed case (its tag and everything wrong); whether it passed."""
    if bad:
        counts.add("failed cases")
        log.append(tag + ": " + "; ".join(bad))
    return not bad


def exit_verdict(rc, err, mode, errno_name, counts, bad):
    """A case's exit status: 0 (the fault landed on a call whose failure does not matter), SIGKILL
    under a kill, else 1 with a message naming the error; any other signal death is a crash."""
    counts.add("cases")
    if rc == 0:
        counts.add("finished anyway")
    elif mode.startswith("kill"):
        if rc != -9:
            bad.append("rc %d, not SIGKILL" % rc)
    elif rc != 1:
        bad.append("rc %d, not 1" % rc)
    elif ERRTEXT[errno_name] not in err:
        bad.append("message does not name the error: " + err.strip()[-200:])
    if rc < 0 and rc != -9:
        counts.add("crashes")


def file_opens(path, name, counts, bad):
    """Whether the run file at path opens after a case (readable); counts a stop inside a commit
    and a file h5py could not read raw. name: the file as a failure names it."""
    if os.path.exists(path + ".journal"):
        counts.add("stopped inside a commit")
    sig = has_signature(path)
    ok, raw = readable(path)
    if not ok:
        counts.add("unreadable")
        bad.append(name + " does not open")
    if os.path.exists(path) and os.path.getsize(path) and not raw:
        # cut inside a new file's first commit: no HDF5 file yet, and nothing in it was complete
        counts.add("raw_unreadable" if sig else "cut in its first commit")
    return ok


# ---------------------------------------------------------------- tidal-diff

class DiffSweep:
    def __init__(self, tmp, model, prompts, shape):
        self.tmp, self.model, self.prompts, self.shape = tmp, model, prompts, shape
        self.dir = os.path.join(tmp, "diff") + os.sep
        os.makedirs(self.dir, exist_ok=True)
        self.out = os.path.join(self.dir, "run.h5")
        ref = os.path.join(tmp, "diff-ref.h5")
        trace = os.path.join(tmp, "diff.trace")
        rc, err = run(self.cmd(self.out), watch=self.dir, trace=trace)
        if rc != 0:
            raise SystemExit("clean tidal-diff run failed: " + err)
        shutil.move(self.out, ref)
        self.ref, self.ref_attrs = datasets(ref, DIFF_GROUPS)
        self.trace = read_trace(trace)

    def cmd(self, out, *extra):
        return [os.path.join(BIN, "tidal-diff"), "--model", self.model, "--prompts", self.prompts, "-o", out,
                *self.shape, *extra]

    def phases(self):
        """{phase name: [call numbers]} from the clean run's trace. A commit ends with the removal
        of run.h5.journal: commit 0 writes the attributes, commit b+1 batch b, the last one the
        close; then the compaction."""
        ph, unlinks, compact = {}, 0, False
        nb = len(self.ref["/progress/batch"])
        for k, op, name, n in self.trace:
            compact = compact or ".compact.tmp" in name
            if compact:
                key = "compaction: " + ("rename" if op == "rename" else "write" if op == "pwrite" else op)
            else:
                c = max(unlinks - 1, 0)
                label = "attributes" if c == 0 else "close" if c > nb else "first batch" if c == 1 else "batch %d" % (c - 1)
                step = {"pwrite": "append/apply", "write": "journal", "fsync": "journal fsync",
                        "fdatasync": "fsync", "unlink": "journal removal", "ftruncate": "truncate"}.get(op, op)
                key = "%s: %s" % (label, step)
            if op == "unlink" and name == "run.h5.journal":
                unlinks += 1
            ph.setdefault(key, []).append(k)
        return ph

    def case(self, at, mode, errno_name, counts, log):
        for p in glob.glob(self.dir + "*"):
            os.remove(p)
        rc, err = run(self.cmd(self.out), watch=self.dir, at=at, mode=mode, errno_name=errno_name)
        tag = "diff K=%d %s%s" % (at, mode, "" if mode.startswith("kill") else " " + errno_name)
        bad = []
        counts.add("cases")
        if rc == 0:
            counts.add("finished anyway")   # the fault landed on a call whose failure does not matter
        elif mode.startswith("kill"):
            if rc != -9:
                bad.append("rc %d, not SIGKILL" % rc)
        else:
            if rc != 1:
                bad.append("rc %d, not 1" % rc)
            elif "run.h5" not in err or ERRTEXT[errno_name] not in err:
                bad.append("message does not name the file and the error: " + err.strip().splitlines()[-1])
            leftovers = [p for p in glob.glob(self.dir + "*") if p.endswith((".compact.tmp", ".new.tmp"))]
            if os.path.exists(self.out + ".journal") and "journal" not in err:
                leftovers.append(self.out + ".journal")
            if leftovers:
                bad.append("left behind: " + ", ".join(os.path.basename(p) for p in leftovers))
        if rc < 0 and rc != -9:
            counts.add("crashes")
        ok = file_opens(self.out, "the file", counts, bad)
        done = err.count("tidal-diff: batch ")
        if ok and os.path.exists(self.out) and os.path.getsize(self.out) > 0:
            have, _ = datasets(self.out, DIFF_GROUPS)
            nb = min(len(have.get("/progress/" + c, [])) for c in ("batch", "seq_rows", "token_rows", "prompt_rows"))
            if nb < done:
                counts.add("batches lost", done - nb)
                bad.append("%d batches reported complete, %d in the file" % (done, nb))
            if nb:
                last = {g: int(have["/progress/%s" % c][nb - 1]) for g, c in
                        (("tokens", "token_rows"), ("seqs", "seq_rows"), ("prompts", "prompt_rows"))}
                for name, a in have.items():
                    g = name.split("/")[1]
                    n = last.get(g, nb if g == "progress" else None)
                    if n is None or g == "text":
                        continue
                    if not same_bits(a[:n], self.ref[name][:n]):
                        counts.add("completed rows damaged")
                        bad.append(name + " differs in completed rows")
            counts.add("batches kept", nb)
        elif done:
            counts.add("batches lost", done)
            bad.append("%d batches reported complete, no file" % done)
        # room again: --resume finishes it
        rc2, err2 = run(self.cmd(self.out, "--resume"))
        if rc2 != 0:
            counts.add("resume failed")
            bad.append("--resume: rc %d: %s" % (rc2, err2.strip().splitlines()[-1] if err2.strip() else ""))
        else:
            have, _ = datasets(self.out, DIFF_GROUPS)
            diffs = [k for k in self.ref if k not in have or not same_bits(have[k], self.ref[k])]
            if diffs or set(have) != set(self.ref):
                counts.add("resume not bit-identical")
                bad.append("after --resume differs: " + ", ".join(diffs[:4]))
            else:
                counts.add("resumed bit-identical")
            left = [p for p in glob.glob(self.dir + "*") if not p.endswith("run.h5")]
            if left:
                bad.append("after --resume left behind: " + ", ".join(map(os.path.basename, left)))
        return case_done(tag, bad, counts, log)


# ---------------------------------------------------------------- tidal-rl

TIMING = ("time_rollout", "time_reward", "time_old", "time_update", "time_step")


class RlSweep:
    def __init__(self, tmp, model, data, steps=3):
        self.tmp, self.model, self.data, self.steps = tmp, model, data, steps
        self.dir = os.path.join(tmp, "rl") + os.sep
        self.out = os.path.join(self.dir, "rl.h5")
        trace = os.path.join(tmp, "rl.trace")
        rc, err = run(self.cmd(), watch=self.dir, trace=trace)
        if rc != 0:
            raise SystemExit("clean tidal-rl run failed: " + err)
        self.ref, _ = datasets(self.out, RL_GROUPS)
        self.ref_checkpoints = sorted(d for d in os.listdir(self.dir) if d.startswith("checkpoint-"))
        self.trace = read_trace(trace)
        shutil.rmtree(self.dir)

    def cmd(self, *extra):
        return [os.path.join(BIN, "tidal-rl"), "--model-path", self.model, "--dataset-path", self.data,
                "--num-generations", "4", "--per-device-batch-size", "4", "--gradient-accumulation-steps", "1",
                "--max-completion-length", "12", "--learning-rate", "1e-3", "-q", "--max-steps", str(self.steps),
                "--save-steps", "1", "--seed", "5", "--output-dir", self.dir, *extra]

    def phases(self):
        ph = {}
        for k, op, name, n in self.trace:
            if name.startswith("trainer_state") or name.startswith("checkpoint-"):
                key = "checkpoint save: " + op
            elif name.startswith("rl.h5"):
                key = "rl.h5 commit: " + ("journal" if name.endswith(".journal") else op)
            else:
                key = "final model: " + op
            ph.setdefault(key, []).append(k)
        return ph

    def case(self, at, mode, errno_name, counts, log):
        rc, err, tag, bad = fresh_case(self.dir, self.cmd(), "rl", at, mode, errno_name, counts)
        ckdirs = [d for d in glob.glob(self.dir + "checkpoint-*")]
        if mode == "fail" and rc != 0:
            tmpdirs = [d for d in ckdirs if d.endswith(".tmp")]
            if tmpdirs:
                bad.append("left behind: " + ", ".join(map(os.path.basename, tmpdirs)))
        for d in ckdirs:
            if not d.endswith(".tmp") and not os.path.exists(os.path.join(d, "trainer_state.bin")):
                bad.append(os.path.basename(d) + " has no trainer_state.bin")
        ok = file_opens(self.out, "rl.h5", counts, bad)
        if ok and os.path.exists(self.out) and os.path.getsize(self.out) > 0:
            have, attrs = datasets(self.out, RL_GROUPS)
            ck = int(attrs.get("checkpoint_step", 0))
            n = len(have.get("/steps/reward", []))
            if n < ck:
                counts.add("steps lost", ck - n)
                bad.append("checkpoint_step %d but %d steps" % (ck, n))
            if ck and not os.path.exists(os.path.join(self.dir, "checkpoint-%d" % ck, "trainer_state.bin")):
                bad.append("checkpoint-%d named by rl.h5 is missing" % ck)
            for name, a in have.items():
                if name.startswith("/steps/") and name.split("/")[-1] not in TIMING and \
                        not same_bits(a[:n], self.ref[name][:n]):
                    counts.add("completed rows damaged")
                    bad.append(name + " differs in completed steps")
            counts.add("steps kept", n)
        rc2, err2 = run(self.cmd("--resume"))
        if rc2 != 0:
            counts.add("resume failed")
            bad.append("--resume: rc %d: %s" % (rc2, err2.strip()[-200:]))
        else:
            have, _ = datasets(self.out, RL_GROUPS)
            diffs = [k for k in self.ref if k.split("/")[-1] not in TIMING and
                     (k not in have or not same_bits(have[k], self.ref[k]))]
            if diffs:
                counts.add("resume not bit-identical")
                bad.append("after --resume differs: " + ", ".join(diffs[:4]))
            else:
                counts.add("resumed bit-identical")
            left = [p for p in glob.glob(self.dir + "*") if p.endswith((".tmp", ".journal"))]
            if left:
                bad.append("after --resume left behind: " + ", ".join(map(os.path.basename, left)))
        return case_done(tag, bad, counts, log)


def pick(phases, per_phase):
    """Up to per_phase call numbers from each phase, spread over it."""
    out = []
    for key, ks in phases.items():
        if len(ks) <= per_phase:
            sel = ks
        else:
            sel = [ks[int(i * (len(ks) - 1) / max(per_phase - 1, 1))] for i in range(per_phase)]
        out += [(key, k) for k in dict.fromkeys(sel)]
    return out


# ---------------------------------------------------------------- tidal-sft

class SftSweep:
    """tidal-sft: sft.h5 committed after every step, checkpoint-K/ written as .tmp and renamed."""

    def __init__(self, tmp, model, data, steps=3):
        self.tmp, self.model, self.data, self.steps = tmp, model, data, steps
        self.dir = os.path.join(tmp, "sft") + os.sep
        self.out = os.path.join(self.dir, "sft.h5")
        trace = os.path.join(tmp, "sft.trace")
        rc, err = run(self.cmd(), watch=self.dir, trace=trace)
        if rc != 0:
            raise SystemExit("clean tidal-sft run failed: " + err)
        self.ref, _ = datasets(self.out, ("steps",))
        self.trace = read_trace(trace)
        shutil.rmtree(self.dir)

    def cmd(self, *extra):
        return [os.path.join(BIN, "tidal-sft"), "--model-path", self.model, "--dataset-path", self.data,
                "--learning-rate", "1e-3", "--per-device-batch-size", "4", "--seed", "5", "--eval-max-samples", "4",
                "--max-steps", str(self.steps), "--save-steps", "1", "--output-dir", self.dir, *extra]

    def phases(self):
        ph = {}
        for k, op, name, n in self.trace:
            key = ("sft.h5 commit: " if name.startswith("sft.h5") else "checkpoint/model save: ") + op
            ph.setdefault(key, []).append(k)
        return ph

    def case(self, at, mode, errno_name, counts, log):
        rc, err, tag, bad = fresh_case(self.dir, self.cmd(), "sft", at, mode, errno_name, counts)
        if mode == "fail" and rc != 0:
            tmps = [p for p in glob.glob(self.dir + "*") if p.endswith(".tmp")]
            if tmps:
                bad.append("left behind: " + ", ".join(map(os.path.basename, tmps)))
        ok = file_opens(self.out, "sft.h5", counts, bad)
        if ok and os.path.exists(self.out) and os.path.getsize(self.out) > 0:
            have, _ = datasets(self.out, ("steps",))
            n = len(have.get("/steps/step", []))
            for name, a in have.items():
                if name != "/steps/seconds" and not same_bits(a[:n], self.ref[name][:n]):
                    counts.add("completed rows damaged")
                    bad.append(name + " differs in completed steps")
            counts.add("steps kept", n)
        # tidal-sft continues from its latest checkpoint; before the first one there is none, and
        # the run starts over (--overwrite-output-dir), as its --resume message says
        whole = [d for d in glob.glob(self.dir + "checkpoint-*") if not d.endswith(".tmp")]
        rc2, err2 = run(self.cmd("--resume" if whole else "--overwrite-output-dir"))
        if rc2 != 0:
            counts.add("resume failed")
            bad.append("--resume: rc %d: %s" % (rc2, err2.strip()[-200:]))
        else:
            have, _ = datasets(self.out, ("steps",))
            diffs = [k for k in self.ref if k != "/steps/seconds" and (k not in have or not same_bits(have[k], self.ref[k]))]
            if diffs:
                counts.add("resume not bit-identical")
                bad.append("after --resume differs: " + ", ".join(diffs[:4]))
            else:
                counts.add("resumed bit-identical")
        return case_done(tag, bad, counts, log)


# ---------------------------------------------------------------- tidal-merge

class MergeSweep:
    """tidal-merge of two shards into a folder that fails: the merged file appears whole or not at
    all (an older OUT given --force stays as it was), and no OUT.tmp is left."""

    def __init__(self, tmp, diff_cmd):
        self.tmp = tmp
        self.dir = os.path.join(tmp, "merge") + os.sep
        os.makedirs(self.dir, exist_ok=True)
        self.parts = []
        for k in range(2):
            p = os.path.join(tmp, "shard%d.h5" % k)
            rc, err = run(diff_cmd(p, "--shard", "%d/2" % k))
            if rc != 0:
                raise SystemExit("shard run failed: " + err)
            self.parts.append(p)
        self.out = os.path.join(self.dir, "merged.h5")
        trace = os.path.join(tmp, "merge.trace")
        rc, err = run(self.cmd(), watch=self.dir, trace=trace)
        if rc != 0:
            raise SystemExit("clean tidal-merge failed: " + err)
        self.ref, _ = datasets(self.out, DIFF_GROUPS)
        self.trace = read_trace(trace)

    def cmd(self):
        return [os.path.join(BIN, "tidal-merge"), "-o", self.out, "--force", *self.parts]

    def phases(self):
        ph = {}
        for k, op, name, n in self.trace:
            ph.setdefault("merge: " + op, []).append(k)
        return ph

    def case(self, at, mode, errno_name, counts, log):
        # an older merged file is there (--force): it must stay whole whatever happens
        shutil.copy(self.parts[0], self.out)
        before = open(self.out, "rb").read()
        rc, err = run(self.cmd(), watch=self.dir, at=at, mode=mode, errno_name=errno_name)
        tag = "merge K=%d %s%s" % (at, mode, "" if mode.startswith("kill") else " " + errno_name)
        bad = []
        counts.add("cases")
        if rc == 0:
            counts.add("finished anyway")
        elif mode.startswith("kill") and rc != -9:
            bad.append("rc %d, not SIGKILL" % rc)
        elif mode == "fail" and (rc != 1 or ERRTEXT[errno_name] not in err):
            bad.append("rc %d: %s" % (rc, err.strip()[-200:]))
        if rc < 0 and rc != -9:
            counts.add("crashes")
        now = open(self.out, "rb").read()
        if now != before:
            have, _ = datasets(self.out, DIFF_GROUPS) if open_raw(self.out) else ({}, None)
            if set(have) != set(self.ref) or any(not same_bits(have[k], self.ref[k]) for k in self.ref):
                counts.add("unreadable")
                bad.append("merged.h5 is neither the old file nor the whole merge")
        if mode == "fail" and rc != 0 and os.path.exists(self.out + ".tmp"):
            bad.append("left behind: merged.h5.tmp")
        passed = case_done(tag, bad, counts, log)
        for p in glob.glob(self.dir + "*.tmp*"):
            os.remove(p)
        return passed
