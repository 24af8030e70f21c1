"""The command-line convention of every tool, and the mistakes that must not lose results
(issue 14). Each check runs the real tools on real files and reads the results back with h5py.

1. Every tool in build/bin: -h/--help (full help on stdout, exit 0), --version, an unknown
   option (one message format, exit 2), --opt=value as --opt value, HF underscore spellings
   and vLLM's --max-tokens / --top-k -1; bad values exit 2 naming the option and what was
   expected; a runtime failure exits 1.
2. Mistakes: --force with a mistyped prompts file keeps the finished file; tidal-merge refuses a
   missing, doubled or unfinished shard (--allow-partial merges and records it); the Ctrl-C hint
   is a command that finishes the file; model_path is absolute; --max-new-tokens 0 is refused;
   tidal-init -o creates parent directories.
3. Output: --json summary equals the file's numbers; the generation line shows only what
   generation_config.json holds and says what is used; KL >= 0 exactly; same-recipe report
   columns are titled by file name.
4. /tokens/step = pos - prompt_len; tidal-heatmap --plot positions (and its old name steps); tidal-export CSV equals the
   HDF5 columns bit for bit; the docs/diff.md tour and the docs/run-files.md pandas one-liner run.
"""
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    import h5py
except ImportError:
    print("h5py not installed: skipped")
    sys.exit(77)

from tidal_check import BIN, check, failures, run  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ENV = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))


def tool(*args, cwd=None):
    exe = args[0] if os.path.isabs(args[0]) else os.path.join(ROOT, BIN, args[0])
    return subprocess.run([exe, *args[1:]], capture_output=True, text=True, cwd=cwd, env=ENV)


def write_prompts(path, n, vocab, seed, lo=3, hi=12):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(n):
            f.write(json.dumps({"tokens": rng.integers(0, vocab, rng.integers(lo, hi)).tolist()}) + "\n")


USAGE_ERR = re.compile(r"^(tidal-[a-z-]+): (\S+): (.+)$")

tmp = tempfile.mkdtemp(prefix="tidal-cli-test-")
tools = sorted(t for t in os.listdir(os.path.join(ROOT, BIN)) if t.startswith("tidal-"))
check(len(tools) >= 11, f"{len(tools)} tools in {BIN}")

# ---- 1. the convention, every tool
for t in tools:
    for h in ["--help", "-h"]:
        p = tool(t, h)
        check(p.returncode == 0 and p.stdout.startswith(f"usage: {t} ") and "--version" in p.stdout and not p.stderr,
              f"{t} {h}: full help on stdout, exit 0 (rc {p.returncode})")
    p = tool(t, "--version")
    check(p.returncode == 0 and re.fullmatch(rf"{t} \(tidal\) \d+\.\d+\.\d+\n", p.stdout) is not None,
          f"{t} --version: {p.stdout.strip()!r}")
    p = tool(t, "--no-such-option")
    first = p.stderr.splitlines()[0] if p.stderr else ""
    check(p.returncode == 2 and first == f"{t}: --no-such-option: unknown option" and f"{t} --help" in p.stderr,
          f"{t}: unknown option -> exit 2, one message format ({p.returncode}: {first!r})")

model = os.path.join(tmp, "m")
run("tidal-init", "--preset", "tiny", "--seed", "3", "-o", model)
prompts = os.path.join(tmp, "p.jsonl")
write_prompts(prompts, 12, 512, 1)
bad_values = [
    ("tidal-diff", ["--min-p", "2"], "--min-p", "2"),
    ("tidal-diff", ["--top-k", "x"], "--top-k", "x"),
    ("tidal-diff", ["--temperature=-1"], "--temperature", "-1"),
    ("tidal-diff", ["--top_p", "0"], "--top-p", "0"),
    ("tidal-diff", ["--max-new-tokens", "0"], "--max-new-tokens", "0"),
    ("tidal-diff", ["--shard", "2/2"], "--shard", "2/2"),
    ("tidal-diff", ["--batch", "0"], "--batch", "0"),
    ("tidal-heatmap", ["x.h5", "-o", "y.png", "--plot", "pie"], "--plot", "pie"),
    ("tidal-report", ["x.h5", "--worst", "-1"], "--worst", "-1"),
    ("tidal-report", ["x.h5", "--is", "token:clip:2"], "--is", "token:clip:2"),
    ("tidal-init", ["--preset", "tiny", "--dtype", "f64", "-o", os.path.join(tmp, "never")], "--dtype", "f64"),
    ("tidal-init", ["--num-layers", "0", "-o", os.path.join(tmp, "never")], "--num-layers", "0"),
    ("tidal-cast", ["--format", "q"], "--format", "q"),
    ("tidal-export", ["x.h5", "--group", "foo"], "--group", "foo"),
    ("tidal-bench-model", ["--model", model, "--only", "x"], "--only", "x"),
    ("tidal-logprobs", ["--model", model, "--tokens", "1,2", "--top-logprobs", "-2"], "--top-logprobs", "-2"),
]
for t, args, opt, val in bad_values:
    p = tool(t, *args)
    m = USAGE_ERR.match(p.stderr.splitlines()[0] if p.stderr else "")
    check(p.returncode == 2 and m is not None and m.group(1) == t and m.group(2) == opt
          and m.group(3).startswith("expected ") and m.group(3).endswith(f", got '{val}'"),
          f"{t} {' '.join(args)}: exit 2, '{t}: {opt}: expected ..., got {val!r}' ({p.returncode}: {p.stderr[:120]!r})")
for t, args in [("tidal-diff", ["--prompts", prompts, "-o", os.path.join(tmp, "x.h5")]),
                ("tidal-merge", ["x.h5"]), ("tidal-logprobs", ["--tokens", "1"])]:
    p = tool(t, *args)
    check(p.returncode == 2 and re.match(rf"^{t}: --\S+: (required|expected)", p.stderr) is not None,
          f"{t}: a missing required option is a usage error naming it ({p.stderr[:100]!r})")
for t, args in [("tidal-inspect", [os.path.join(tmp, "nowhere")]), ("tidal-report", [os.path.join(tmp, "none.h5")]),
                ("tidal-logprobs", ["--model", os.path.join(tmp, "nowhere"), "--tokens", "1,2"])]:
    p = tool(t, *args)
    check(p.returncode == 1, f"{t}: a runtime failure exits 1 (rc {p.returncode})")
a, b = tool("tidal-cast", "--format=e4m3", "--saturate", "500"), tool("tidal-cast", "--format", "e4m3", "500", "-1.5")
check(a.stdout == "0x7e 448\n" and b.stdout == "0x7e 448\n0xbc -1.5\n", "--opt=value == --opt value; negative operands")
p = tool("tidal-tokenize", "--model", "datasets/demo-model", "--info", cwd=ROOT)
q = tool("tidal-tokenize", "--tokenizer", "datasets/demo-model", "--info", cwd=ROOT)
r = tool("tidal-tokenize", "--tokenizer", "datasets/demo-model/tokenizer.json", "--info", cwd=ROOT)
check(p.returncode == 0 and p.stdout == q.stdout == r.stdout, "tidal-tokenize: --model DIR, --tokenizer DIR or FILE")
under = os.path.join(tmp, "under.h5")
p = tool("tidal-diff", "--model", model, "--prompts", prompts, "-o", under, "--max_new_tokens=4", "--top_k", "-1",
         "--repetition_penalty", "1.1", "--batch", "4")
with h5py.File(under, "r") as f:
    sj = json.loads(f.attrs["sampling"])
check(p.returncode == 0 and sj["max_new_tokens"] == 4 and sj["top_k"] == 0 and sj["repetition_penalty"] == 1.1,
      f"HF underscore spellings and --top-k -1 (off): {sj}")
p = tool("tidal-diff", "--model", model, "--prompts", prompts, "-o", os.path.join(tmp, "vllm.h5"), "--max-tokens", "3")
with h5py.File(os.path.join(tmp, "vllm.h5"), "r") as f:
    check(p.returncode == 0 and json.loads(f.attrs["sampling"])["max_new_tokens"] == 3, "vLLM's --max-tokens")

# ---- 2. mistakes that must not lose results
done = os.path.join(tmp, "done.h5")
run("tidal-diff", "--model", model, "--prompts", prompts, "-o", done, "--max-new-tokens", "6", "--batch", "4")
before = open(done, "rb").read()
for what, args in [("a mistyped prompts file", ["--prompts", os.path.join(tmp, "typo.jsonl")]),
                   ("a mistyped model directory", ["--prompts", prompts, "--model", os.path.join(tmp, "mm")])]:
    argv = ["--model", model, *args, "-o", done, "--max-new-tokens", "6", "--force"]
    p = tool("tidal-diff", *argv)
    check(p.returncode == 1 and open(done, "rb").read() == before and not os.path.exists(done + ".new.tmp"),
          f"--force with {what}: exit 1, the finished file untouched, no temporary left (rc {p.returncode})")
p = tool("tidal-diff", "--model", model, "--prompts", prompts, "-o", done, "--max-new-tokens", "5", "--force")
with h5py.File(done, "r") as f:
    check(p.returncode == 0 and json.loads(f.attrs["sampling"])["max_new_tokens"] == 5
          and not os.path.exists(done + ".new.tmp"), "--force with good inputs replaces the file")

parts = [os.path.join(tmp, f"s{k}.h5") for k in range(3)]
for k in range(3):
    run("tidal-diff", "--model", model, "--prompts", prompts, "-o", parts[k], "--max-new-tokens", "4", "--batch", "2",
        "--shard", f"{k}/3")
merged = os.path.join(tmp, "merged.h5")
p = tool("tidal-merge", "-o", merged, parts[0], parts[2])
check(p.returncode == 1 and "shard 1 of 3 missing" in p.stderr and not os.path.exists(merged),
      f"tidal-merge with shard 1/3 missing: refused ({p.stderr.strip()[:120]})")
p = tool("tidal-merge", "-o", merged, parts[0], parts[0], parts[1], parts[2])
check(p.returncode == 1 and "given twice" in p.stderr, "tidal-merge with a shard twice: refused")
p = tool("tidal-merge", "-o", merged, parts[0], parts[2], "--allow-partial")
with h5py.File(merged, "r") as f:
    check(p.returncode == 0 and f.attrs["partial"] == "shard 1 of 3 missing" and len(f["seqs/prompt_index"]) == 8,
          f"--allow-partial merges and records it: {f.attrs.get('partial')!r}")
keep = open(merged, "rb").read()
unfinished = os.path.join(tmp, "s1-cut.h5")
subprocess.run(["cp", parts[1], unfinished], check=True)
with h5py.File(unfinished, "r+") as f:
    for k in f["progress"]:
        f["progress"][k].resize((1,))
p = tool("tidal-merge", "-o", merged, "--force", parts[0], unfinished, parts[2])
check(p.returncode == 1 and "did not finish" in p.stderr and open(merged, "rb").read() == keep,
      f"tidal-merge of an unfinished shard: refused, and --force kept the old output ({p.stderr.strip()[:100]})")
p = tool("tidal-merge", "-o", merged, "--force", *parts)
with h5py.File(merged, "r") as f:
    idx = sorted(f["seqs/prompt_index"][:].tolist())
check(p.returncode == 0 and idx == list(range(12)), "the complete set merges: every prompt once")

# Ctrl-C: the printed command finishes the file
big = os.path.join(tmp, "p300.jsonl")
write_prompts(big, 300, 512, 4)
cut = os.path.join(tmp, "cut.h5")
run("tidal-diff", "--model", model, "--prompts", prompts, "-o", cut, "--max-new-tokens", "2")
argv = [os.path.join(ROOT, BIN, "tidal-diff"), "--model", model, "--prompts", big, "-o", cut, "--max-new-tokens", "48",
        "--batch", "2", "--force"]
proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=ENV)
err = ""
t0 = time.monotonic()
while time.monotonic() - t0 < 120:
    line = proc.stderr.readline()
    err += line
    if re.search(r"batch [3-9]/\d+", line) or not line:
        break
proc.send_signal(signal.SIGINT)
err += proc.stderr.read()
rc = proc.wait()
lines = err.strip().splitlines()
hint = shlex.split(lines[-1]) if lines else []
check(rc == 130 and "to finish it, run:" in err and "--resume" in hint and "--force" not in hint
      and hint[:len(argv) - 1] == argv[:-1], f"SIGINT: exit 130 and the command to run ({lines[-1] if lines else ''})")
p = subprocess.run(hint, capture_output=True, text=True, env=ENV)
with h5py.File(cut, "r") as f:
    check(p.returncode == 0 and len(f["seqs/prompt_index"]) == 300, "running the printed command finishes the file")

rel = os.path.join(tmp, "rel")
os.makedirs(rel)
p = tool("tidal-diff", "--model", "../m", "--prompts", "../p.jsonl", "-o", "r.h5", "--max-new-tokens", "3", cwd=rel)
with h5py.File(os.path.join(rel, "r.h5"), "r") as f:
    mp = f.attrs["model_path"]
check(p.returncode == 0 and os.path.isabs(mp) and os.path.samefile(mp, model), f"model_path stored absolute: {mp}")
p = tool("tidal-diff", "--model", model, "--prompts", prompts, "-o", os.path.join(tmp, "zero.h5"), "--max-new-tokens", "0")
check(p.returncode == 2 and not os.path.exists(os.path.join(tmp, "zero.h5")), "--max-new-tokens 0 refused, no file")
nested = os.path.join(tmp, "a", "b", "c", "model")
p = tool("tidal-init", "--preset", "tiny", "-o", nested)
check(p.returncode == 0 and os.path.exists(os.path.join(nested, "model.safetensors")),
      "tidal-init -o creates parent directories (make bench on a fresh clone)")

# ---- 3. output that does not mislead
js = os.path.join(tmp, "js.h5")
p = tool("tidal-diff", "--model", model, "--prompts", prompts, "-o", js, "--max-new-tokens", "8", "--json")
s = json.loads(p.stdout)
with h5py.File(js, "r") as f:
    d = f["tokens/dlogp"][:]
    kl = f["tokens/kl_ba"][:], f["tokens/kl_ab"][:]
check(p.returncode == 0 and s["tokens"] == len(d) and s["seqs"] == 12 and abs(s["mean_abs_dlogp"] - np.abs(d).mean()) < 1e-15
      and s["out"] == js and s["recipe_b"] == "bf16-infer", "--json summary matches the file")
check(all((k >= 0).all() for k in kl), f"full-vocabulary KL never negative: min {min(k.min() for k in kl):.3g}")
gdir = os.path.join(tmp, "g")
run("tidal-init", "--preset", "tiny", "--seed", "3", "-o", gdir)
with open(os.path.join(gdir, "generation_config.json"), "w") as f:
    json.dump({"temperature": 0.6}, f)
p = tool("tidal-diff", "--model", gdir, "--prompts", prompts, "-o", os.path.join(tmp, "g1.h5"), "--max-new-tokens", "2")
check("generation: generation_config.json sets temperature=0.6\n" in p.stderr and "top_k=50" not in p.stderr
      and "sampling used: temperature=1 (default)" in p.stderr, "generation line: the file's keys only, and what is used")
p = tool("tidal-diff", "--model", gdir, "--prompts", prompts, "-o", os.path.join(tmp, "g2.h5"), "--max-new-tokens", "2",
         "--use-generation-config", "--top-p", "0.9")
check("temperature=0.6 (generation_config.json) top_p=0.9 (flag)" in p.stderr, "--use-generation-config: sources named")
p = tool("tidal-report", js, done, "--worst", "0")
title = p.stdout.splitlines()[0]
check(p.returncode == 0 and "(js.h5)" in title and "(done.h5)" in title, f"same-recipe columns titled by file: {title!r}")

# ---- 4. steps, export, README, SCHEMA
with h5py.File(js, "r") as f:
    t = {k: f["tokens"][k][:] for k in f["tokens"]}
    pl = f["seqs/prompt_len"][:]
check(np.array_equal(t["step"], t["pos"] - pl[t["seq"]]) and t["step"].min() == 0 and t["step"].dtype == np.int32,
      "/tokens/step = pos - prompt_len, 0 at the first generated token")
png = os.path.join(tmp, "steps.png")
p = tool("tidal-heatmap", js, done, "--plot", "positions", "-o", png)
check(p.returncode == 0 and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "tidal-heatmap --plot positions")
csv = os.path.join(tmp, "t.csv")
p = tool("tidal-export", js, "-o", csv)
header = open(csv).readline().strip().split(",")
data = np.loadtxt(csv, delimiter=",", skiprows=1, ndmin=2)
ok = p.returncode == 0 and set(header) == set(t) and data.shape == (len(d), len(t))
ok = ok and all(np.array_equal(data[:, i], t[h].astype(np.float64), equal_nan=True) for i, h in enumerate(header))
check(ok, "tidal-export CSV equals every /tokens column bit for bit")

readme = open(os.path.join(ROOT, "docs", "diff.md")).read()
m = re.search(r"## A tour \(these lines run in the test suite.*?\n```sh\n(.*?)```", readme, re.S)
check(m is not None, "docs/diff.md tour block found")
if m is not None:
    script = m.group(1).replace("build/bin/", os.path.join(ROOT, BIN) + "/")
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, cwd=ROOT, env=ENV)
    check(p.returncode == 0, "docs/diff.md tour runs" + ("" if p.returncode == 0 else f": {p.stderr[-400:]}"))
schema = open(os.path.join(ROOT, "docs", "run-files.md")).read()
m = re.search(r"```python\n(.*?)```", schema, re.S)
try:
    import pandas  # noqa: F401
    code = m.group(1).replace('"run.h5"', repr(js))
    ns = {}
    exec(code, ns)
    check(list(ns["tokens"].shape) == [len(d), len(t)], "docs/run-files.md pandas one-liner gives the /tokens frame")
except ImportError:
    print("pandas not installed: the docs/run-files.md one-liner is not run (its h5py part is the dict above)")

print(f"{len(failures)} failed")
subprocess.run(["rm", "-rf", tmp])
sys.exit(1 if failures else 0)
