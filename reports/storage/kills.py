"""Random SIGKILLs of tidal's writers (issue 28): each writer runs on tiny shipped inputs
(datasets/models/add and its task data) and is SIGKILLed at a uniformly random instant within
its run time (the wall time of an uninterrupted run, measured once); then:

  - the run file opens: h5py reads it whole, before any tidal tool touched it ("raw") or, when the
    writer was killed inside a commit, after tidal-report rolled the journal forward; tidal-report
    opens it (an "empty run" is fine when nothing was complete);
  - every batch or step reported complete on stderr before the kill is in the file, its rows
    equal to the uninterrupted reference run's bit for bit (tidal-rl, tidal-sft: timing columns
    aside), and so is every row that /progress (tidal-diff, tidal-rl) or /steps (tidal-sft) holds;
  - `--resume` (tidal-sft before its first checkpoint: --overwrite-output-dir, as its message
    says; tidal-merge and tidal-sweep: the same command again) finishes it bit-identical to the
    reference, and leaves the folder as the reference run left its own: no temporary
    (.journal, .tmp, .compact.tmp, checkpoint-K.tmp/) behind.

Writers: tidal-diff (6 prompts, batch 2, 4 new tokens: 3 batches, the close, the compaction);
tidal-rl (3 steps, a checkpoint after each); tidal-sft (2 steps, a checkpoint after each, an
evaluation); tidal-merge (two tidal-diff shards merged --force over an older file: the target is
the old file or the whole merge, never anything between); tidal-sweep (a grid of two 2-step
tidal-rl runs with one worker; the kill takes the sweep's whole process group, its running
tidal-rl with it, as a killed job would).

Seeded and resumable: kill i of a writer lands at the fraction Random(SEED, writer, i) of the
reference's run time, and the counts are saved after every kill (WORK/state.json), so a stopped
run continues where it was. Progress with an ETA on stderr. Run it niced (the machine is shared):

    make && nice -n 10 .venv/bin/python reports/storage/kills.py [--kills 2000] [--work build/kills]

then reports/storage/kills.md is written from the counts (also at any time with --report-only).
Exit 0 when no kill lost anything, 1 otherwise (the failed kills are listed in kills.md).
"""
import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
os.chdir(ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--kills", type=int, default=2000, help="kills in all, shared among the writers (default 2000)")
ap.add_argument("--writers", default="diff,rl,sft,merge,sweep")
ap.add_argument("--seed", type=int, default=28)
ap.add_argument("--work", default="build/kills", help="references, the runs and state.json (default build/kills)")
ap.add_argument("--bin", default=os.path.join(os.environ.get("BUILD", "build"), "bin"),
                help="the tools (default build/bin; copied to WORK/bin first, so a rebuild does not change them mid-run)")
ap.add_argument("--hours", type=float, default=0, help="stop after this long (0: no limit); --report-only or a rerun continues")
ap.add_argument("--report-only", action="store_true", help="write kills.md from WORK/state.json")
ap.add_argument("--out", default=os.path.join(HERE, "kills.md"))
args = ap.parse_args()

import h5py  # noqa: E402
import storage_sweep as S  # noqa: E402  (datasets, same_bits, open_raw, has_signature)

WORK = os.path.abspath(args.work)
os.makedirs(WORK, exist_ok=True)
BIN = os.path.join(WORK, "bin")
STATE = os.path.join(WORK, "state.json")
MODEL = os.path.abspath("datasets/models/add")
ENV = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
DIFF_GROUPS = S.DIFF_GROUPS
RL_GROUPS = S.RL_GROUPS
TIMING = set(S.TIMING) | {"seconds"}
SHARE = {"diff": 0.30, "rl": 0.22, "sft": 0.20, "merge": 0.18, "sweep": 0.10}


def tool(name):
    return os.path.join(BIN, name)


def listing(d):
    """Every file and folder under d, relative (what a finished run leaves)."""
    out = []
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            out.append(os.path.relpath(os.path.join(root, n), d))
    return sorted(out)


def temporaries(d):
    return [p for p in listing(d) if p.endswith((".tmp", ".journal")) or ".tmp/" in p or ".compact.tmp" in p]


def read_file(path, groups):
    return S.datasets(path, groups)[0] if os.path.exists(path) and os.path.getsize(path) else {}


def compare(have, ref, skip=()):
    """Names of reference datasets that differ from, or are missing in, have."""
    return [k for k in ref if k.split("/")[-1] not in skip and (k not in have or not S.same_bits(have[k], ref[k]))]


def progress_cut(have):
    """Rows of each group that /progress says are complete: {group: rows}, and the batches."""
    nb = min((len(have.get("/progress/" + c, [])) for c in ("batch", "seq_rows", "token_rows", "prompt_rows")), default=0)
    if not nb:
        return {}, 0
    cut = {"progress": nb}
    for g, c in (("tokens", "token_rows"), ("seqs", "seq_rows"), ("prompts", "prompt_rows"), ("text", "text_rows")):
        if "/progress/" + c in have:
            cut[g] = int(have["/progress/" + c][nb - 1])
    return cut, nb


class Case:
    """One kill's verdicts and counts."""

    def __init__(self, counts, log, tag):
        self.c, self.log, self.tag, self.bad = counts, log, tag, []

    def add(self, k, n=1):
        self.c[k] = self.c.get(k, 0) + n

    def fail(self, what):
        self.bad.append(what)

    def done(self):
        if self.bad:
            self.add("failures")
            self.log.append(self.tag + ": " + "; ".join(self.bad))
        return not self.bad


def run_and_kill(cmd, t_kill, cwd=None, group=False, stderr_path=None):
    """Starts cmd, SIGKILLs it t_kill seconds later (its whole process group when group), returns
    (returncode, stderr text). stderr goes to a file: what the writer reported survives it."""
    with open(stderr_path, "wb") as ef:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=ef, cwd=cwd, env=ENV, start_new_session=group)
        try:
            p.wait(timeout=t_kill)
        except subprocess.TimeoutExpired:
            if group:
                os.killpg(p.pid, signal.SIGKILL)
            else:
                p.kill()
            p.wait()
    if group:   # the group's other members (a sweep's tidal-rl): gone with it, waited for by init
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for _ in range(200):   # until none is left writing into the folder
            try:
                os.killpg(p.pid, 0)
                time.sleep(0.01)
            except ProcessLookupError:
                break
    return p.returncode, open(stderr_path, errors="replace").read()


def quiet_run(cmd, cwd=None):
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=ENV)
    return p.returncode, p.stderr


def check_opens(case, path, reported, what="batches"):
    """The file after a kill: raw h5py, tidal-report (which rolls a journal forward), h5py whole.
    Returns True when it holds HDF5 data to compare (False: nothing was committed yet)."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        case.add("no file yet (killed before its first commit)")
        if reported:
            case.fail("%d %s reported complete, but %s" % (reported, what, "no file" if not os.path.exists(path) else "an empty file"))
        return False
    if os.path.exists(path + ".journal"):
        case.add("killed inside a commit (journal left)")
    raw = S.open_raw(path)
    if not S.has_signature(path):
        # a new file's first commit writes its superblock last: not an HDF5 file yet
        case.add("no HDF5 file yet (killed inside its first commit)")
        if reported:
            case.fail("%d %s reported complete, but the file has no HDF5 signature" % (reported, what))
        rc, err = quiet_run([tool("tidal-report"), path])
        if "not an HDF5 file" not in err:
            case.fail("tidal-report on a file cut in its first commit: rc %d %s" % (rc, err.strip()[-200:]))
        return False
    if not raw:
        case.add("h5py could not read it before a tidal tool rolled the journal forward")
    rc, err = quiet_run([tool("tidal-report"), path])
    if rc == 0 or (rc == 1 and ("empty run" in err or "missing dataset /tokens" in err)):
        case.add("tidal-report opened it")
    else:
        case.fail("tidal-report: rc %d: %s" % (rc, err.strip()[-300:]))
    if os.path.exists(path + ".journal"):
        case.fail("tidal-report left the journal (the commit was not finished)")
    if S.open_raw(path):
        case.add("files opened by h5py")
        return True
    case.fail("h5py cannot read the file after tidal-report")
    return False


# ---------------------------------------------------------------- the writers

class Writer:
    name = ""
    what = "batches"

    def __init__(self, work):
        self.work = os.path.join(work, self.name)
        self.run_dir = os.path.join(self.work, "run")
        os.makedirs(self.work, exist_ok=True)

    def fresh(self):
        shutil.rmtree(self.run_dir, ignore_errors=True)
        os.makedirs(self.run_dir)

    def time_reference(self, tries=3):
        """The reference run's wall time: the median of a few uninterrupted runs."""
        ts = []
        for _ in range(tries):
            self.fresh()
            self.before_run()
            t0 = time.monotonic()
            rc, err = quiet_run(self.cmd(), cwd=self.cwd())
            ts.append(time.monotonic() - t0)
            if rc != 0:
                raise SystemExit("%s reference run failed: %s" % (self.name, err[-500:]))
        return sorted(ts)[len(ts) // 2]

    def cwd(self):
        return None

    def before_run(self):
        pass


class Diff(Writer):
    name, what = "diff", "batches"

    def setup(self):
        self.prompts = os.path.join(self.work, "p.jsonl")
        with open("datasets/demo-task-prompts.jsonl") as f, open(self.prompts, "w") as g:
            g.writelines(f.readlines()[:6])
        self.out = os.path.join(self.run_dir, "run.h5")
        t = self.time_reference()
        self.ref = read_file(self.out, DIFF_GROUPS)
        self.ref_list = listing(self.run_dir)
        return t

    def cmd(self, out=None, *extra):
        return [tool("tidal-diff"), "--model", MODEL, "--prompts", self.prompts, "-o", out or self.out,
                "--batch", "2", "--max-new-tokens", "4", "--seed", "7", *extra]

    def kill(self, t_kill, case):
        self.fresh()
        rc, err = run_and_kill(self.cmd(), t_kill, stderr_path=os.path.join(self.work, "stderr"))
        if rc == 0:
            return "finished"
        if rc != -9:
            case.fail("rc %d, not death by SIGKILL: %s" % (rc, err.strip()[-300:]))
        reported = err.count("tidal-diff: batch ")
        if check_opens(case, self.out, reported):
            have = read_file(self.out, DIFF_GROUPS)
            cut, nb = progress_cut(have)
            if nb < reported:
                case.fail("%d batches reported complete, %d in /progress" % (reported, nb))
            for k, a in have.items():
                g = k.split("/")[1]
                n = cut.get(g, 0)
                if len(a) < n:
                    case.fail("%s has %d rows, /progress promises %d" % (k, len(a), n))
                elif n and not S.same_bits(a[:n], self.ref[k][:n]):
                    case.fail("%s: completed rows differ from the reference" % k)
                case.add("rows checked", n)
            case.add("batches or steps reported complete", reported)
            case.add("batches or steps checked", nb)
        rc2, err2 = quiet_run(self.cmd(None, "--resume"))
        if rc2 != 0:
            case.fail("--resume: rc %d: %s" % (rc2, err2.strip()[-300:]))
            return "killed"
        have = read_file(self.out, DIFF_GROUPS)
        bad = compare(have, self.ref)
        if bad or set(have) != set(self.ref):
            case.fail("after --resume differs from the reference: %s" % (bad[:4] or sorted(set(have) ^ set(self.ref))))
        else:
            case.add("resumed bit-identical")
        if listing(self.run_dir) != self.ref_list:
            case.fail("after --resume the folder holds %s, the reference's %s" % (listing(self.run_dir), self.ref_list))
        return "killed"


class Rl(Writer):
    name, what = "rl", "steps"
    steps = 3

    def setup(self):
        self.out = os.path.join(self.run_dir, "rl.h5")
        t = self.time_reference()
        self.ref = read_file(self.out, RL_GROUPS)
        self.ref_list = listing(self.run_dir)
        return t

    def cmd(self, *extra):
        return [tool("tidal-rl"), "--model-path", MODEL, "--dataset-path", os.path.abspath("datasets/tasks/add/train.jsonl"),
                "--num-generations", "4", "--per-device-batch-size", "4", "--gradient-accumulation-steps", "1",
                "--max-completion-length", "12", "--learning-rate", "1e-3", "--max-steps", str(self.steps),
                "--save-steps", "1", "--seed", "5", "--output-dir", self.run_dir, *extra]

    def check_run(self, case, d, out, reported, ref):
        """A killed tidal-rl's folder: its file, its steps, the checkpoint it names."""
        if not check_opens(case, out, reported, "steps"):
            return
        have, attrs = S.datasets(out, RL_GROUPS)
        n = min((len(have[k]) for k in have if k.startswith("/steps/")), default=0)
        ck = int(attrs.get("checkpoint_step", 0))
        if n < reported:
            case.fail("%d steps reported complete, %d in /steps" % (reported, n))
        if ck > n:
            case.fail("checkpoint_step %d but %d steps" % (ck, n))
        if ck and not os.path.exists(os.path.join(d, "checkpoint-%d" % ck, "trainer_state.bin")):
            case.fail("checkpoint-%d, named by rl.h5, is not whole" % ck)
        cut, nb = progress_cut(have)
        if nb and nb != n:
            case.fail("/progress holds %d steps, /steps %d" % (nb, n))
        cut["steps"] = n
        for k, a in have.items():
            g = k.split("/")[1]
            m = cut.get(g, 0)
            if k.split("/")[-1] in TIMING:
                continue
            if len(a) < m:
                case.fail("%s has %d rows, fewer than the %d committed" % (k, len(a), m))
            elif m and not S.same_bits(a[:m], ref[k][:m]):
                case.fail("%s: completed rows differ from the reference" % k)
            case.add("rows checked", m)
        case.add("batches or steps reported complete", reported)
        case.add("batches or steps checked", n)

    def kill(self, t_kill, case):
        self.fresh()
        rc, err = run_and_kill(self.cmd(), t_kill, stderr_path=os.path.join(self.work, "stderr"))
        if rc == 0:
            return "finished"
        if rc != -9:
            case.fail("rc %d, not death by SIGKILL: %s" % (rc, err.strip()[-300:]))
        self.check_run(case, self.run_dir, self.out, err.count("tidal-rl: step "), self.ref)
        rc2, err2 = quiet_run(self.cmd("--resume"))
        if rc2 != 0:
            case.fail("--resume: rc %d: %s" % (rc2, err2.strip()[-300:]))
            return "killed"
        have = read_file(self.out, RL_GROUPS)
        bad = compare(have, self.ref, TIMING)
        if bad:
            case.fail("after --resume differs from the reference: %s" % bad[:4])
        else:
            case.add("resumed bit-identical")
        if listing(self.run_dir) != self.ref_list:
            case.fail("after --resume the folder holds %s, the reference's %s" % (listing(self.run_dir), self.ref_list))
        return "killed"


class Sft(Writer):
    name, what = "sft", "steps"

    def setup(self):
        self.out = os.path.join(self.run_dir, "sft.h5")
        t = self.time_reference()
        self.ref = read_file(self.out, ("steps",))
        self.ref_list = listing(self.run_dir)
        return t

    def cmd(self, *extra):
        return [tool("tidal-sft"), "--model-path", MODEL, "--dataset-path", os.path.abspath("datasets/tasks/add"),
                "--learning-rate", "1e-3", "--per-device-batch-size", "4", "--seed", "5", "--eval-max-samples", "4",
                "--max-steps", "2", "--save-steps", "1", "--output-dir", self.run_dir, *extra]

    def kill(self, t_kill, case):
        self.fresh()
        rc, err = run_and_kill(self.cmd(), t_kill, stderr_path=os.path.join(self.work, "stderr"))
        if rc == 0:
            return "finished"
        if rc != -9:
            case.fail("rc %d, not death by SIGKILL: %s" % (rc, err.strip()[-300:]))
        reported = err.count("tidal-sft: step ")
        if check_opens(case, self.out, reported, "steps"):
            have = read_file(self.out, ("steps",))
            n = min((len(a) for a in have.values()), default=0)
            if n < reported:
                case.fail("%d steps reported complete, %d in /steps" % (reported, n))
            for k, a in have.items():
                if k.split("/")[-1] in TIMING:
                    continue
                if not S.same_bits(a[:n], self.ref[k][:n]):
                    case.fail("%s: completed steps differ from the reference" % k)
                case.add("rows checked", n)
            case.add("batches or steps reported complete", reported)
            case.add("batches or steps checked", n)
        # tidal-sft continues from its latest whole checkpoint; before the first there is none and
        # the run starts over, as its --resume message says
        whole = [d for d in glob.glob(os.path.join(self.run_dir, "checkpoint-*")) if not d.endswith(".tmp")]
        rc2, err2 = quiet_run(self.cmd("--resume" if whole else "--overwrite-output-dir"))
        if rc2 != 0:
            case.fail("%s: rc %d: %s" % ("--resume" if whole else "--overwrite-output-dir", rc2, err2.strip()[-300:]))
            return "killed"
        have = read_file(self.out, ("steps",))
        bad = compare(have, self.ref, TIMING)
        if bad:
            case.fail("after --resume differs from the reference: %s" % bad[:4])
        else:
            case.add("resumed bit-identical")
        if listing(self.run_dir) != self.ref_list:
            case.fail("after --resume the folder holds %s, the reference's %s" % (listing(self.run_dir), self.ref_list))
        return "killed"


class Merge(Writer):
    name, what = "merge", "batches"

    def setup(self):
        d = Diff(os.path.dirname(self.work))
        d.prompts = os.path.join(self.work, "p.jsonl")
        with open("datasets/demo-task-prompts.jsonl") as f, open(d.prompts, "w") as g:
            g.writelines(f.readlines()[:6])
        self.parts = []
        for k in range(2):
            p = os.path.join(self.work, "shard%d.h5" % k)
            if os.path.exists(p):
                os.remove(p)
            rc, err = quiet_run(d.cmd(p, "--shard", "%d/2" % k))
            if rc != 0:
                raise SystemExit("shard run failed: " + err)
            self.parts.append(p)
        self.out = os.path.join(self.run_dir, "merged.h5")
        self.old = open(self.parts[0], "rb").read()
        t = self.time_reference()
        self.ref = read_file(self.out, DIFF_GROUPS)
        self.ref_list = listing(self.run_dir)
        return t

    def before_run(self):   # an older merged file is there (--force): it must stay whole whatever happens
        with open(self.out, "wb") as f:
            f.write(self.old)

    def cmd(self):
        return [tool("tidal-merge"), "-o", self.out, "--force", *self.parts]

    def kill(self, t_kill, case):
        self.fresh()
        self.before_run()
        rc, err = run_and_kill(self.cmd(), t_kill, stderr_path=os.path.join(self.work, "stderr"))
        if rc == 0:
            return "finished"
        if rc != -9:
            case.fail("rc %d, not death by SIGKILL: %s" % (rc, err.strip()[-300:]))
        now = open(self.out, "rb").read() if os.path.exists(self.out) else None
        if now == self.old:
            case.add("target still the old file")
            case.add("files opened by h5py")
        elif now is None:
            case.fail("merged.h5 is gone")
        else:
            have = read_file(self.out, DIFF_GROUPS) if S.open_raw(self.out) else {}
            if set(have) != set(self.ref) or compare(have, self.ref):
                case.fail("merged.h5 is neither the old file nor the whole merge")
            else:
                case.add("target already the whole merge")
                case.add("files opened by h5py")
                case.add("rows checked", sum(len(a) for a in have.values()))
        rc2, err2 = quiet_run([tool("tidal-report"), self.out])
        if rc2 == 0:
            case.add("tidal-report opened it")
        else:
            case.fail("tidal-report: rc %d: %s" % (rc2, err2.strip()[-300:]))
        rc3, err3 = quiet_run(self.cmd())   # the same command again
        if rc3 != 0:
            case.fail("the merge again: rc %d: %s" % (rc3, err3.strip()[-300:]))
            return "killed"
        have = read_file(self.out, DIFF_GROUPS)
        if set(have) != set(self.ref) or compare(have, self.ref):
            case.fail("the merge run again differs from the reference")
        else:
            case.add("resumed bit-identical")
        if listing(self.run_dir) != self.ref_list:
            case.fail("after the merge again the folder holds %s, the reference's %s" % (listing(self.run_dir), self.ref_list))
        return "killed"


class Sweep(Writer):
    name, what = "sweep", "steps"
    RUNS = ("s1", "s2")

    def setup(self):
        self.cfg = os.path.join(self.work, "sweep.json")
        args_ = {"model-path": MODEL, "dataset-path": os.path.abspath("datasets/tasks/add/train.jsonl"),
                 "num-generations": 4, "per-device-batch-size": 4, "gradient-accumulation-steps": 1,
                 "max-completion-length": 12, "learning-rate": 1e-3, "max-steps": 2, "save-steps": 1}
        with open(self.cfg, "w") as f:
            json.dump({"tool": tool("tidal-rl"), "output_dir": self.run_dir, "report_dir": os.path.join(self.run_dir, "report"),
                       "args": args_, "grid": [{"axis": "seed", "seed": True,
                                                "values": {"s1": {"seed": 1}, "s2": {"seed": 2}}}]}, f)
        t = self.time_reference()
        self.ref = {r: read_file(os.path.join(self.run_dir, r, "rl.h5"), RL_GROUPS) for r in self.RUNS}
        self.ref_list = [p for p in listing(self.run_dir)]
        return t

    def cmd(self):
        return [tool("tidal-sweep"), self.cfg, "--workers", "1"]

    def kill(self, t_kill, case):
        self.fresh()
        rc, err = run_and_kill(self.cmd(), t_kill, group=True, stderr_path=os.path.join(self.work, "stderr"))
        if rc == 0:
            return "finished"
        if rc != -9:
            case.fail("rc %d, not death by SIGKILL: %s" % (rc, err.strip()[-300:]))
        rl = Rl.__new__(Rl)
        for r in self.RUNS:
            d = os.path.join(self.run_dir, r)
            log = os.path.join(d, "log.txt")
            reported = open(log, errors="replace").read().count("tidal-rl: step ") if os.path.exists(log) else 0
            if os.path.isdir(d):
                rl.check_run(case, d, os.path.join(d, "rl.h5"), reported, self.ref[r])
        rc2, err2 = quiet_run(self.cmd())   # the same command: finished runs skipped, the others resumed
        if rc2 != 0:
            case.fail("the sweep again: rc %d: %s" % (rc2, err2.strip()[-300:]))
            return "killed"
        bad = []
        for r in self.RUNS:
            have = read_file(os.path.join(self.run_dir, r, "rl.h5"), RL_GROUPS)
            bad += ["%s%s" % (r, k) for k in compare(have, self.ref[r], TIMING)]
        if bad:
            case.fail("after the sweep again differs from the reference: %s" % bad[:4])
        else:
            case.add("resumed bit-identical")
        if listing(self.run_dir) != self.ref_list:
            case.fail("after the sweep again the folder holds %s, the reference's %s" % (listing(self.run_dir), self.ref_list))
        return "killed"


WRITERS = {"diff": Diff, "rl": Rl, "sft": Sft, "merge": Merge, "sweep": Sweep}
LABEL = {"diff": "tidal-diff (3 batches, close, compaction)", "rl": "tidal-rl (3 steps, a checkpoint after each)",
         "sft": "tidal-sft (2 steps, a checkpoint after each, eval)",
         "merge": "tidal-merge (2 shards, --force over an older file)",
         "sweep": "tidal-sweep (2 tidal-rl runs of 2 steps, 1 worker)"}

# ---------------------------------------------------------------- report

COLS = [("kills", "kills"), ("finished first", "finished before the kill¹"),
        ("no file yet (killed before its first commit)", "no file yet²"),
        ("no HDF5 file yet (killed inside its first commit)", "cut in its first commit²"),
        ("killed inside a commit (journal left)", "killed inside a commit³"),
        ("h5py could not read it before a tidal tool rolled the journal forward", "h5py needed the roll-forward³"),
        ("files opened by h5py", "files opened (h5py)"), ("tidal-report opened it", "opened by tidal-report"),
        ("batches or steps reported complete", "batches/steps reported complete"),
        ("batches or steps checked", "batches/steps in the file, checked"),
        ("rows checked", "rows compared bit for bit"), ("resumed bit-identical", "resumes bit-identical⁴"),
        ("failures", "failures")]


def write_report(state):
    lines = ["# Random SIGKILLs of tidal's writers", "",
             "Made by `reports/storage/kills.py` (what each kill checks: its docstring; the writers, their",
             "inputs and the checks: [README.md](README.md), \"Random kills\"). Regenerate with:", "",
             "```", "make && nice -n 10 .venv/bin/python reports/storage/kills.py --kills %d --seed %d" % (state["target"], state["seed"]),
             "```", "",
             "Each kill lands at a uniformly random instant in [0, T] after the writer starts, T the wall",
             "time of an uninterrupted run measured when the references were made (per writer: %s)." % ", ".join(
                 "%s %.2f s" % (w, state["writers"][w]["t_ref"]) for w in state["writers"]),
             "Machine: %s; %s." % (state.get("machine", "?"), state.get("when", "")), ""]
    hdr = "| writer | " + " | ".join(label for _, label in COLS) + " |"
    lines += [hdr, "|" + "---|" * (len(COLS) + 1)]
    tot = {}
    for w, st in state["writers"].items():
        c = st["counts"]
        for k, _ in COLS:
            tot[k] = tot.get(k, 0) + c.get(k, 0)
        lines.append("| %s | " % LABEL[w] + " | ".join(str(c.get(k, 0)) for k, _ in COLS) + " |")
    lines.append("| **all** | " + " | ".join("**%d**" % tot.get(k, 0) for k, _ in COLS) + " |")
    lines += ["",
              "1. The run ended (rc 0) before its kill came: the machine ran it faster than the reference; not",
              "   counted as a kill (the loop draws another instant).",
              "2. Nothing was committed yet: no file, an empty one, or one whose first commit was cut before",
              "   its superblock (not an HDF5 file yet; tidal-report says so, `--resume` starts it afresh);",
              "   a failure if any batch or step had been reported complete.",
              "3. A journal was left beside the file (killed between writing it and deleting it). \"h5py",
              "   needed the roll-forward\": h5py could not read the file before a tidal tool touched it",
              "   (killed inside a commit's apply); tidal-report rolled every journal forward, after which",
              "   h5py read the whole file (a kill is a failure otherwise).",
              "4. `--resume` (tidal-sft before its first checkpoint: `--overwrite-output-dir`; tidal-merge and",
              "   tidal-sweep: the same command again) finished the run bit-identical to the reference",
              "   (tidal-rl, tidal-sft: timing columns aside) and left the folder as the reference's: no",
              "   temporary left.", ""]
    took = state.get("seconds", 0)
    lines.append("%d kills in %.0f min of wall time (kill, checks, resume)." % (tot.get("kills", 0), took / 60))
    if tot.get("kills", 0) < state["target"]:
        lines.append("Stopped before the target of %d (rerun the command to continue: it resumes from its state)."
                     % state["target"])
    if state["log"]:
        lines += ["", "## Failed kills", ""] + ["- " + x for x in state["log"][:200]]
    else:
        lines += ["", "No kill lost or changed a completed batch or step, left a file that does not open, or a "
                  "resume that is not bit-identical."]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


def save(state):
    tmp = STATE + ".new"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, STATE)


# ---------------------------------------------------------------- main

state = json.load(open(STATE)) if os.path.exists(STATE) else None
if args.report_only:
    if not state:
        raise SystemExit("%s: no state (run the kills first)" % STATE)
    write_report(state)
    sys.exit(1 if state["log"] else 0)

if not state or state["seed"] != args.seed or state["target"] != args.kills:
    # new run: the tools copied (a rebuild must not change them mid-run), references made and timed
    shutil.rmtree(BIN, ignore_errors=True)
    shutil.copytree(args.bin, BIN)
    names = [w for w in args.writers.split(",") if w in WRITERS]
    share = sum(SHARE[w] for w in names)
    state = {"seed": args.seed, "target": args.kills, "writers": {}, "log": [], "seconds": 0,
             "machine": "%d CPUs, load %.1f at the start" % (os.cpu_count(), os.getloadavg()[0]),
             "when": time.strftime("%Y-%m-%d", time.gmtime())}
    for w in names:
        state["writers"][w] = {"target": int(round(args.kills * SHARE[w] / share)), "counts": {}, "draws": 0}
objs = {}
for w in state["writers"]:
    W = WRITERS[w](WORK)
    t = W.setup()   # references are remade on a resume too (they are deterministic)
    state["writers"][w].setdefault("t_ref", t)
    objs[w] = W
    print("reference %s: %.2f s" % (w, state["writers"][w]["t_ref"]), file=sys.stderr)
save(state)

t_start = time.time()
sec0 = state["seconds"]
deadline = t_start + args.hours * 3600 if args.hours else None
total_target = sum(s["target"] for s in state["writers"].values())
done0 = sum(s["counts"].get("kills", 0) for s in state["writers"].values())
while True:
    todo = [w for w, s in state["writers"].items() if s["counts"].get("kills", 0) < s["target"]]
    if not todo or (deadline and time.time() > deadline):
        break
    # round robin, weighted by what is left, so a stopped run has every writer in proportion
    w = max(todo, key=lambda x: (state["writers"][x]["target"] - state["writers"][x]["counts"].get("kills", 0))
            / state["writers"][x]["target"])
    st = state["writers"][w]
    i = st["draws"]
    frac = random.Random("%d/%s/%d" % (state["seed"], w, i)).random()
    t_kill = frac * st["t_ref"]
    case = Case(st["counts"], state["log"], "%s kill %d at %.3f of %.2f s" % (w, i, frac, st["t_ref"]))
    try:
        verdict = objs[w].kill(t_kill, case)
    except Exception as e:   # a check that raises is a finding, not a crash of the storm
        case.fail("check raised %s: %s" % (type(e).__name__, e))
        verdict = "killed"
    st["draws"] += 1
    if verdict == "finished":
        case.add("finished first")
    else:
        case.add("kills")
        case.done()
    state["seconds"] = sec0 + time.time() - t_start
    save(state)
    done = sum(s["counts"].get("kills", 0) for s in state["writers"].values())
    el, left = time.time() - t_start, total_target - done
    if done % 10 == 0 or left == 0:
        print("kills %d/%d (%s) failures %d | %.0f s, ETA %.0f min" % (
            done, total_target, " ".join("%s %d" % (x, s["counts"].get("kills", 0)) for x, s in state["writers"].items()),
            len(state["log"]), el, left * el / max(done - done0, 1) / 60), file=sys.stderr)
    if case.bad:
        print("FAIL %s" % state["log"][-1][:500], file=sys.stderr)

write_report(state)
print("wrote %s" % args.out, file=sys.stderr)
sys.exit(1 if state["log"] else 0)
