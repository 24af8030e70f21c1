"""tidal-rl on a user's own task, as a TRL GRPOTrainer user brings it (issue 25), on the shipped
add model (datasets/models/add) given a chat template (a few seconds of CPU in all):

1. own reward and dataset: a conversational JSONL dataset ({"prompt": [messages]} and
   {"messages": [...]}, an extra "target" column) scored by a --reward-command written in
   Python that reads the column; /steps/reward and reward_std equal the mean and std of what the
   script returned, step by step (it logs every value it prints); the script received TRL's
   fields (prompt as messages, completion as [{"role": "assistant", ...}], completion_ids
   ending with EOS or at the length limit, the record's columns). Named components with
   --reward-weights give reward = sum w_i r_i and /steps/reward_<name> columns.
2. the same records as a .json array, gzip-compressed with a UTF-8 BOM, give the same /steps;
   tidal-sft reads built-in task records from such files too.
3. failures: a line that is not a reward, a process that exits, a reward that never comes
   (--reward-timeout): exit 1 with a message naming the record (file:line) and the output line;
   a run whose reward crashed at step 3 resumes from its checkpoint (--resume) and ends equal to
   the uninterrupted run. Dataset errors: own records without --reward-command, a directory, a
   JSON error (its line named).
4. the shipped example datasets/rewards/python_exec.py: scores code (tests passed, partial,
   an endless loop stopped by its timeout, a memory hog stopped by its limit) and runs under
   tidal-rl.
5. docs/trl.md's "Your own task" block runs.
"""
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError:
    print("h5py/numpy missing: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import BIN, check, failures  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
tmp = tempfile.mkdtemp(prefix="tidal-rl-own-")
RL = os.path.join(BIN, "tidal-rl")
PY = sys.executable

# ---- the model: the shipped add model with a chat template (user turns' content after <bos>)
model = os.path.join(tmp, "model")
shutil.copytree(os.path.join(ROOT, "datasets", "models", "add"), model)
tc = json.load(open(os.path.join(model, "tokenizer_config.json")))
tc["chat_template"] = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}"
                       "{% endif %}{% endfor %}")
json.dump(tc, open(os.path.join(model, "tokenizer_config.json"), "w"))

# ---- the dataset: conversational records with an extra column
rng = np.random.default_rng(5)
records = []
for i in range(8):
    a, b = (int(x) for x in rng.integers(100, 1000, 2))
    turn = [{"role": "user", "content": f"{a}+{b}\n"}]
    rec = {"messages": turn} if i % 4 == 3 else {"prompt": turn}
    rec.update(target=str(a + b), id=f"q{i}")
    records.append(rec)
data = os.path.join(tmp, "data.jsonl")
open(data, "w").write("".join(json.dumps(r) + "\n" for r in records))

# ---- the reward: 1 for the right sum on the last line, plus 0.01 per token; logs what it says
reward_py = os.path.join(tmp, "reward.py")
open(reward_py, "w").write(r'''
import json, os, sys
log = open(sys.argv[1], "a")
named = len(sys.argv) > 2
crash_at = int(os.environ.get("CRASH_AT", "0"))
for n, line in enumerate(sys.stdin, 1):
    if n == crash_at:
        sys.exit(3)
    r = json.loads(line)
    text = r["completion"][0]["content"]
    correct = float(text.strip().split("\n")[-1] == r["target"])
    length = 0.01 * len(r["completion_ids"])
    out = {"correct": correct, "length": length} if named else correct + length
    log.write(json.dumps({"out": out, "in": r}) + "\n")
    log.flush()
    print(json.dumps(out), flush=True)
''')

COMMON = ["--model-path", model, "--num-generations", "4", "--per-device-batch-size", "8",
          "--max-completion-length", "36", "--learning-rate", "1e-3", "-q"]


def rl(out, dataset, *extra, env=None):
    return subprocess.run([RL, *COMMON, "--dataset-path", dataset, "--output-dir", out, *extra],
                          capture_output=True, text=True, env=dict(ENV, **(env or {})))


def steps(out):
    with h5py.File(os.path.join(out, "rl.h5"), "r") as f:
        return {k: f["steps"][k][()] for k in f["steps"]}


def logged(path):
    return [json.loads(x) for x in open(path)] if os.path.exists(path) else []


# ---- 1. own reward on a conversational dataset
log1 = os.path.join(tmp, "log1.jsonl")
run1 = os.path.join(tmp, "run1")
cmd1 = f"{PY} {reward_py} {log1}"
p = rl(run1, data, "--max-steps", "4", "--save-steps", "1", "--reward-command", cmd1)
check(p.returncode == 0, "tidal-rl runs a conversational dataset with a Python --reward-command"
      + ("" if p.returncode == 0 else f": {p.stderr[-600:]}"))
s1 = steps(run1) if p.returncode == 0 else {}
got = logged(log1)
if s1:
    r = np.array([g["out"] for g in got]).reshape(4, 8)
    check(np.allclose(s1["reward"], r.mean(1), rtol=0, atol=1e-12) and
          np.allclose(s1["reward_std"], r.std(1, ddof=1), rtol=0, atol=1e-12),
          f"/steps reward and reward_std equal the script's values ({s1['reward']} vs {r.mean(1)})")
    check(r.std() > 0 and np.all(np.isnan(s1["accuracy"])),
          "the rewards vary; accuracy is nan without built-in task records")
    first = got[0]["in"]
    ok = (isinstance(first["prompt"], list) and first["prompt"][-1]["role"] == "user" and
          first["completion"][0]["role"] == "assistant" and all(isinstance(t, int) for t in first["completion_ids"]) and
          {"target", "id"} <= set(first))
    msgs = [g["in"] for g in got if "messages" in g["in"]]
    ok = ok and msgs and all(g["prompt"] == g["messages"] for g in msgs)
    eos_or_full = all(g["in"]["completion_ids"][-1] == 2 or len(g["in"]["completion_ids"]) == 36 for g in got)
    check(ok and eos_or_full, "the script gets TRL's fields: prompt messages, assistant completion, completion_ids, "
          "the record's columns")

# named components with weights
log2 = os.path.join(tmp, "log2.jsonl")
run2 = os.path.join(tmp, "run2")
p = rl(run2, data, "--max-steps", "2", "--reward-command", f"{PY} {reward_py} {log2} named",
       "--reward-weights", "correct=1,length=0.5")
check(p.returncode == 0, "named reward components with --reward-weights" +
      ("" if p.returncode == 0 else f": {p.stderr[-400:]}"))
if p.returncode == 0:
    s2 = steps(run2)
    o = logged(log2)
    c = np.array([g["out"]["correct"] for g in o]).reshape(2, 8)
    ln = np.array([g["out"]["length"] for g in o]).reshape(2, 8)
    check(np.allclose(s2["reward"], (c + 0.5 * ln).mean(1), atol=1e-12) and
          np.allclose(s2["reward_correct"], c.mean(1), atol=1e-12) and np.allclose(s2["reward_length"], ln.mean(1), atol=1e-12),
          "reward = sum w_i r_i; /steps/reward_correct and reward_length hold the components' means")

# ---- 2. the same records as a gzip-compressed JSON array with a BOM
gz = os.path.join(tmp, "data.json.gz")
with gzip.open(gz, "wb") as f:
    f.write(b"\xef\xbb\xbf" + json.dumps(records, indent=2).encode())
run3 = os.path.join(tmp, "run3")
p = rl(run3, gz, "--max-steps", "4", "--reward-command", f"{PY} {reward_py} {os.path.join(tmp, 'log3.jsonl')}")
check(p.returncode == 0 and s1 and np.array_equal(steps(run3)["reward"], s1["reward"]),
      "a .json.gz array with a BOM gives the JSONL run's rewards" + ("" if p.returncode == 0 else f": {p.stderr[-300:]}"))

# built-in task records read the same way everywhere (tidal-sft, tidal-task): a gzip-compressed
# JSON array evaluates as its JSON Lines do
add_test = [json.loads(x) for x in open(os.path.join(ROOT, "datasets", "tasks", "add", "test.jsonl")).read().splitlines()[:6]]
for name, body in (("test.jsonl", "".join(json.dumps(r) + "\n" for r in add_test)), ("test.json.gz", json.dumps(add_test, indent=1))):
    path = os.path.join(tmp, name)
    if name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(body)
    else:
        open(path, "w").write(body)
ev = [subprocess.run([os.path.join(BIN, "tidal-sft"), "--model-path", os.path.join(ROOT, "datasets", "models", "add"),
                      "--dataset-path", os.path.join(tmp, name), "--eval-dataset-path", os.path.join(tmp, name), "--eval-only"],
                     capture_output=True, text=True, env=ENV) for name in ("test.jsonl", "test.json.gz")]
def eval_fields(out):   # the evaluation's result, without its wall time
    try:
        d = json.loads(out)
    except ValueError:
        return None
    d.pop("seconds", None)
    return d


check(all(e.returncode == 0 for e in ev) and eval_fields(ev[0].stdout) == eval_fields(ev[1].stdout) is not None
      and '"eval_records": 6' in ev[0].stdout,
      f"tidal-sft evaluates a .json.gz array as its JSONL ({ev[1].stdout.strip()[:80]}{ev[1].stderr.strip()[:200]})")

# ---- 3. failures name the record; a crashed run resumes
bad_py = os.path.join(tmp, "bad.py")
open(bad_py, "w").write("import sys, time\nmode = sys.argv[1]\n"
                        "for n, line in enumerate(sys.stdin, 1):\n"
                        "    if n < 3: print(0.5, flush=True); continue\n"
                        "    if mode == 'text': print('score: 1', flush=True)\n"
                        "    if mode == 'exit': sys.exit(4)\n"
                        "    if mode == 'hang': time.sleep(60)\n")


def fails(mode, what, *words, extra=()):
    out = os.path.join(tmp, "fail-" + mode)
    p = rl(out, data, "--max-steps", "2", "--reward-command", f"{PY} {bad_py} {mode}", *extra)
    msg = p.stderr
    ok = p.returncode == 1 and re.search(re.escape(data) + r":\d+", msg) and all(w in msg for w in words)
    check(bool(ok), f"{what}: exit {p.returncode}, '{msg.strip()[:300]}'")


fails("text", "a line that is not a reward", "line 3 of its output", "score: 1", "completion 2 of step 0")
fails("exit", "a reward process that exits", "exited with status 4", "completion 2 of step 0")
fails("hang", "a reward that never comes", "--reward-timeout", "completion 2 of step 0",
      extra=("--reward-timeout", "1"))

run4 = os.path.join(tmp, "run4")
log4 = os.path.join(tmp, "log4.jsonl")
cmd4 = f"{PY} {reward_py} {log4}"
p = rl(run4, data, "--max-steps", "4", "--save-steps", "1", "--reward-command", cmd4, env={"CRASH_AT": "21"})
with h5py.File(os.path.join(run4, "rl.h5"), "r") as f:
    n_rows, ck = len(f["steps/reward"]), int(f.attrs["checkpoint_step"])
check(p.returncode == 1 and "exited with status 3" in p.stderr and n_rows == 2 and ck == 2 and
      "--resume continues from checkpoint-2" in p.stderr,
      f"a reward crash at step 2 stops the run with steps 0-1 and checkpoint-2 kept (exit {p.returncode}, "
      f"{n_rows} rows, checkpoint {ck})")
p = rl(run4, data, "--max-steps", "4", "--save-steps", "1", "--reward-command", cmd4, "--resume")
check(p.returncode == 0 and s1 and all(np.array_equal(steps(run4)[k], s1[k]) for k in ("reward", "loss", "grad_norm")),
      "--resume after the crash ends equal to the uninterrupted run" + ("" if p.returncode == 0 else f": {p.stderr[-300:]}"))

p = rl(os.path.join(tmp, "noreward"), data, "--max-steps", "1")
check(p.returncode == 1 and f"{data}:1" in p.stderr and "--reward-command" in p.stderr,
      f"own records without --reward-command: exit 1 naming the record ({p.stderr.strip()[:160]})")
p = rl(os.path.join(tmp, "dir"), tmp, "--max-steps", "1", "--reward-command", cmd1)
check(p.returncode == 1 and "is a directory" in p.stderr, f"a directory as dataset: {p.stderr.strip()[:120]}")
broken = os.path.join(tmp, "broken.jsonl")
lines = open(data).read().splitlines()
lines[5] = lines[5][:-3]
open(broken, "w").write("\n".join(lines) + "\n")
p = rl(os.path.join(tmp, "broken"), broken, "--max-steps", "1", "--reward-command", cmd1)
check(p.returncode == 1 and f"{broken}:6: invalid JSON" in p.stderr and "end of file" not in p.stderr,
      f"a JSON error names its line, not the file's end: {p.stderr.strip()[:160]}")

# ---- flags as TRL users spell them
p = rl(os.path.join(tmp, "typo"), data, "--lerning-rate", "1e-5")
check(p.returncode == 2 and "--lerning-rate: unknown option; did you mean --learning-rate?" in p.stderr,
      f"did-you-mean for a mistyped flag ({p.stderr.strip()[:100]})")
p = rl(os.path.join(tmp, "typo"), data, "--lora-r", "2", "--lora-dropout", "0.05")
check(p.returncode == 2 and "--lora-dropout: expected 0 (PEFT's lora_dropout" in p.stderr,
      f"--lora-dropout other than 0 is refused with the reason ({p.stderr.strip()[:100]})")
run6 = os.path.join(tmp, "run6")
p = subprocess.run([RL, "--model_name_or_path", model, "--dataset-path", data, "--output-dir", run6, "--dtype", "float16",
                    "--lora-r", "2", "--lora-target-modules", "all-linear", "--num-generations", "4",
                    "--per-device-train-batch-size", "8", "--max-completion-length", "8", "--max-steps", "1", "-q",
                    "--reward-command", cmd1], capture_output=True, text=True, env=ENV)
ok = p.returncode == 0
if ok:
    mods = json.load(open(os.path.join(run6, "model", "adapter_config.json")))["target_modules"]
    with h5py.File(os.path.join(run6, "rl.h5"), "r") as f:
        ok = len(mods) == 7 and f.attrs["recipe_a_name"] == "fp16-train" and f.attrs["recipe_b_name"] == "fp16-infer"
check(ok, "--model_name_or_path, --dtype float16, --lora-target-modules all-linear (7 modules adapted)" +
      ("" if p.returncode == 0 else f": {p.stderr[-300:]}"))

# ---- metrics under the names users know: TRL's kl (to the reference, --beta > 0), verl's
# rollout_corr_kl (the mismatch k1, "kl" before); a dead run is said
ADD = os.path.join(ROOT, "datasets", "tasks", "add", "train.jsonl")
kl = {}
for lr in ("0", "1e-3"):
    out = os.path.join(tmp, "kl" + lr)
    p = rl(out, ADD, "--max-steps", "3", "--beta", "0.04", "--learning-rate", lr, "--save-steps", "1")
    kl[lr] = steps(out) if p.returncode == 0 else None
s0 = steps(os.path.join(tmp, "run1")) if s1 else None
ok = kl["0"] is not None and kl["1e-3"] is not None and s0 is not None
check(ok and np.all(kl["0"]["kl"] == 0) and kl["1e-3"]["kl"][0] == 0 and np.all(kl["1e-3"]["kl"][1:] > 0) and
      np.all(np.isnan(s0["kl"])) and np.all(np.isfinite(s0["rollout_corr_kl"])) and np.any(s0["rollout_corr_kl"] != 0),
      "TRL kl: 0 while the policy is the reference, > 0 after it moved, nan without --beta; rollout_corr_kl the k1")
if ok:   # a run file from before the rename ("kl" held the k1) resumes, its k1 copied to rollout_corr_kl
    out = os.path.join(tmp, "kl1e-3")
    with h5py.File(os.path.join(out, "rl.h5"), "r+") as f:
        del f["steps/kl"]
        f.move("steps/rollout_corr_kl", "steps/kl")
    # continued from its last step's checkpoint (always kept) to a larger total: step 4 is new
    p = rl(out, ADD, "--max-steps", "4", "--beta", "0.04", "--learning-rate", "1e-3", "--save-steps", "1", "--resume")
    r = steps(out) if p.returncode == 0 else {}
    check(p.returncode == 0 and np.array_equal(r["rollout_corr_kl"][:3], kl["1e-3"]["rollout_corr_kl"]) and
          np.isfinite(r["rollout_corr_kl"][3]) and np.array_equal(r["kl"][:3], kl["1e-3"]["rollout_corr_kl"]) and
          r["kl"][3] > 0 and len(r["kl"]) == 4,
          "an old run file (k1 under 'kl') resumes: rollout_corr_kl holds every step's k1, a new step TRL's kl" +
          ("" if p.returncode == 0 else f": {p.stderr[-300:]}"))
out = os.path.join(tmp, "dead")
p = subprocess.run([RL, *COMMON[:-1], "--dataset-path", ADD, "--output-dir", out, "--max-completion-length", "4",
                    "--mask-truncated-completions", "--max-steps", "6"], capture_output=True, text=True, env=ENV)
ok = p.returncode == 0
if ok:
    with h5py.File(os.path.join(out, "rl.h5"), "r") as f:
        ok = int(f.attrs["first_dead"]) == 0 and int(f["steps/collapse_fired"][4]) & (1 << 5)
check(ok and "dead run since step 1: every completion hit --max-completion-length for 5 steps" in p.stderr,
      "a dead run (every completion truncated, grad_norm 0) is marked (first_dead 0) and said on stderr")

# ---- 4. the shipped code-execution reward
EXEC = os.path.join(ROOT, "datasets", "rewards", "python_exec.py")
cases = [
    ("```python\ndef add(a, b):\n    return a + b\n```", ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"], 1.0, 1.0),
    ([{"role": "assistant", "content": "def add(a, b):\n    return a - b"}], ["assert add(2, 3) == 5", "assert add(0, 0) == 0"], 0.5, 1.0),
    ("def add(a, b):\n    while True: pass", ["assert add(2, 3) == 5"], 0.0, 1.0),
    ("x = bytearray(1 << 34)\ndef add(a, b): return a + b", ["assert add(2, 3) == 5"], 0.0, 1.0),
    ("7+1+0=08\n1888", ["assert add(2, 3) == 5"], 0.0, 0.0),
]
inp = "".join(json.dumps({"completion": c, "tests": t}) + "\n" for c, t, _, _ in cases)
p = subprocess.run([PY, EXEC, "--timeout", "1", "--memory-mb", "256"], input=inp, capture_output=True, text=True,
                   timeout=60)
out = [json.loads(x) for x in p.stdout.splitlines()] if p.returncode == 0 else []
check(len(out) == len(cases) and all(o["passed"] == w and o["compiled"] == c for o, (_, _, w, c) in zip(out, cases)),
      f"python_exec.py: passed/partial/endless loop/memory hog/not code scored {out}")
code_data = os.path.join(tmp, "code.jsonl")
open(code_data, "w").write("".join(json.dumps({"prompt": [{"role": "user", "content": f"{r['target']}\n"}],
                                               "tests": [f"assert f() == {r['target']}"]}) + "\n" for r in records))
run5 = os.path.join(tmp, "run5")
p = rl(run5, code_data, "--max-steps", "1", "--reward-command", f"{PY} {EXEC} --timeout 2 --workers 2",
       "--reward-weights", "passed=1,compiled=0.1")
check(p.returncode == 0 and "reward_passed" in steps(run5), "python_exec.py runs as tidal-rl's --reward-command" +
      ("" if p.returncode == 0 else f": {p.stderr[-300:]}"))

# ---- 5. the README block
readme = open(os.path.join(ROOT, "docs", "trl.md")).read()
m = re.search(r"## Your own task.*?\n```sh\n(.*?)```", readme, re.S)
check(m is not None, "docs/trl.md 'Your own task' block found")
if m is not None:
    script = m.group(1).replace("build/bin/", os.path.join(ROOT, BIN) + "/")
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, cwd=ROOT, env=ENV)
    check(p.returncode == 0, "docs/trl.md 'Your own task' runs" + ("" if p.returncode == 0 else f": {p.stderr[-400:]}"))

print(f"{len(failures)} failed")
shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if failures else 0)
