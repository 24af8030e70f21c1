"""What a new user tripped on (issue 37, item 6), each mistake made as a user makes it:

1. `tidal-rl --model-path datasets/model/add` (a typo): the message says the directory does not
   exist; a directory without tokenizer.json gives the reason in full (td_fail once overwrote the
   reason it was wrapping, printing an empty one).
2. `--lora-rank` (verl's spelling) is `--lora-r` in tidal-rl and tidal-sft: the same plan, byte for
   byte; a mistyped recipe name (`vllm_bf16`, `bf16-trian`) is answered with the preset it meant.
3. `tidal` with no arguments or `tidal help` lists every tool (as git does), `tidal help TOOL`
   prints that tool's help, `tidal TOOL ARGS` runs it, an unknown name exits 2 with the list.
4. `tidal-rl --resume` without `--report-to` once stopped the TensorBoard log (and without
   `--eval-steps` was refused): the settings that are not the maths carry over unless given again.
5. `tidal-rl -q` printed nothing, a normal run no summary: both end with one on stdout (the last
   step's reward, the last clean evaluation, the detector's verdict, where the files are); -q
   prints nothing else. (The summary of a collapsed run: tests/py/test_postmortem.py.)
6. `tidal-heatmap --plot steps` drew positions within a completion, not optimiser steps: it is
   `--plot positions` (`steps` still accepted, the same picture), and `--plot training` draws a
   tidal-rl run's /steps column against the optimiser step.
7. tidal-sweep's table printed "best acc 1.000" beside "final acc 0.113" on a 10-step run (the
   best window a partial one), "0.280 ± nan" for one seed and "nan ± nan" base drift for full
   fine-tuning: what is defined is printed, the rest marked "—" or "(1 seed)".
8. No shipped model has a chat template: `--chat-template FILE` (TRL's chat_template_path) gives
   tidal-rl and tidal-diff one for conversational prompts; the refusal without it names the flag.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

from tidal_check import BIN, check, failures  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ENV = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))


def tool(*args):
    return subprocess.run([os.path.join(ROOT, BIN, args[0]), *args[1:]], capture_output=True, text=True, cwd=ROOT,
                          env=ENV)


tmp = tempfile.mkdtemp(prefix="tidal-newcomer-")

# ---- 1. a model directory that is not there, or has no tokenizer
p = tool("tidal-rl", "--model-path", "datasets/model/add", "--dataset-path", "datasets/tasks/add/train.jsonl",
         "--output-dir", os.path.join(tmp, "rl"))
check(p.returncode == 1 and "datasets/model/add" in p.stderr and "does not exist" in p.stderr,
      f"tidal-rl --model-path TYPO says the directory does not exist: {p.stderr.strip()!r}")
check(not os.path.exists(os.path.join(tmp, "rl")), "... and makes no --output-dir")
notok = os.path.join(tmp, "no-tokenizer")
os.makedirs(notok)
shutil.copy(os.path.join(ROOT, "datasets/models/add/config.json"), notok)
p = tool("tidal-rl", "--model-path", notok, "--dataset-path", "datasets/tasks/add/train.jsonl",
         "--output-dir", os.path.join(tmp, "rl2"))
msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
check(p.returncode == 1 and "tokenizer.json:" in msg and not msg.startswith("tidal-rl:  ("),
      f"a model directory without tokenizer.json: the reason is given, not an empty one: {msg!r}")

# ---- 2. PEFT/verl spellings and recipe typos
for name, extra in (("tidal-rl", []), ("tidal-sft", ["--dataset-path", "datasets/tasks/add/train.jsonl"])):
    a = tool(name, "--plan-only", "--model-path", "datasets/models/add", "--lora-r", "2", *extra)
    b = tool(name, "--plan-only", "--model-path", "datasets/models/add", "--lora-rank", "2", *extra)
    b2 = tool(name, "--plan-only", "--model-path", "datasets/models/add", "--lora_rank=2", *extra)
    check(a.returncode == 0 and a.stdout + a.stderr == b.stdout + b.stderr == b2.stdout + b2.stderr
          and "LoRA" in a.stdout + a.stderr,
          f"{name} --lora-rank 2 (and --lora_rank=2) is --lora-r 2: the same plan"
          + ("" if a.returncode == 0 else f": {a.stderr[-300:]}"))
for typo, meant in (("vllm_bf16", "vllm-bf16"), ("bf16-trian", "bf16-train"), ("fp8-unifed", "fp8-unified")):
    p = tool("tidal-diff", "--model", "datasets/models/add", "--prompts", "datasets/models/prompts-add.jsonl",
             "--recipe-b", typo, "-o", os.path.join(tmp, "x.h5"))
    check(p.returncode == 2 and f"unknown recipe '{typo}'; did you mean '{meant}'?" in p.stderr,
          f"--recipe-b {typo}: did you mean '{meant}'? ({p.stderr.strip()[:120]!r})")
p = tool("tidal-diff", "--model", "datasets/models/add", "--prompts", "datasets/models/prompts-add.jsonl",
         "--recipe-b", "nothing-like-it", "-o", os.path.join(tmp, "x.h5"))
check(p.returncode == 2 and "unknown recipe 'nothing-like-it' (presets:" in p.stderr,
      "a name close to no preset gets the list, no guess")

# ---- 3. the front door
tools = sorted(os.path.basename(t)[len("tidal-"):-2] for t in glob.glob(os.path.join(ROOT, "tools", "tidal-*.c")))
for args in ([], ["help"], ["--help"]):
    p = tool("tidal", *args)
    listed = {ln.split()[0] for ln in p.stdout.splitlines() if ln.startswith("   ") and ln[3] != " "}
    check(p.returncode == 0 and listed == set(tools),
          f"tidal {' '.join(args)}: lists the {len(tools)} tools (missing {sorted(set(tools) - listed)}, "
          f"extra {sorted(listed - set(tools))})")
p, q = tool("tidal", "help", "diff"), tool("tidal-diff", "--help")
check(p.returncode == 0 and p.stdout == q.stdout, "tidal help diff = tidal-diff --help")
p = tool("tidal", "cast", "--format", "e4m3", "--saturate", "500")
check(p.returncode == 0 and p.stdout.strip() == "0x7e 448", f"tidal cast ... runs tidal-cast: {p.stdout.strip()!r}")
p = tool("tidal", "dif")
check(p.returncode == 2 and "'dif' is not a tidal tool" in p.stderr and "report" in p.stderr,
      "tidal dif: exit 2, the list on stderr")
p = tool("tidal", "--version")
check(p.returncode == 0 and p.stdout.startswith("tidal (tidal) "), "tidal --version")

# ---- 4. --resume keeps the run's output settings
import h5py  # noqa: E402

run = os.path.join(tmp, "resumed")
RL = ["tidal-rl", "--model-path", "datasets/models/add", "--dataset-path", "datasets/tasks/add/train.jsonl",
      "--num-generations", "4", "--per-device-batch-size", "8", "--max-completion-length", "16",
      "--output-dir", run]


def rl_config():
    with h5py.File(os.path.join(run, "rl.h5"), "r") as f:
        return json.loads(f.attrs["rl_config"]), f["steps/eval_accuracy"][:]


def events():
    return len(glob.glob(os.path.join(run, "runs", "events.out.tfevents.*")))


p = tool(*RL, "--max-steps", "2", "--report-to", "tensorboard", "--eval-steps", "1", "--eval-max-samples", "4",
         "--log-completions", "2", "-q")
check(p.returncode == 0 and events() == 1, f"a 2-step run with --report-to tensorboard: one events file {p.stderr[-300:]}")
summary = p.stdout
check(p.returncode == 0 and not p.stderr and summary.startswith("tidal-rl: done after 2 of 2 steps")
      and "  reward " in summary and "clean eval  accuracy" in summary and "before step 2 (4 records" in summary
      and "collapse    no" in summary and f"{run}/rl.h5" in summary and f"{run}/checkpoint-2/" in summary
      and f"{run}/model/" in summary and f"{run}/runs/" in summary,
      f"-q: the end-of-run summary on stdout and nothing else: {summary!r} {p.stderr[-200:]!r}")
p = tool(*RL, "--max-steps", "3", "--resume")
check(p.returncode == 0 and "tidal-rl: step 3/3 reward" in p.stderr and p.stdout.startswith("tidal-rl: done after 3 of 3"),
      f"a normal run: progress on stderr, the summary on stdout ({p.stdout[:60]!r})")
cfg, acc = rl_config() if p.returncode == 0 else ({}, [])
check(p.returncode == 0 and events() == 2 and cfg.get("report_to") == "tensorboard"
      and "carried over from the run" in p.stderr and "--report-to tensorboard" in p.stderr,
      f"--resume without --report-to: the TensorBoard log goes on (a second events file), said on stderr "
      f"({p.stderr.strip()[:300]!r})")
check(len(acc) == 3 and all(a == a for a in acc) and cfg.get("eval_max_samples") == 4 and cfg.get("log_completions") == 2,
      f"... and --eval-steps 1 --eval-max-samples 4 --log-completions 2 with it (eval_accuracy {list(acc)})")
p = tool(*RL, "--max-steps", "4", "--resume", "--report-to", "none", "-q")
cfg, _ = rl_config() if p.returncode == 0 else ({}, [])
check(p.returncode == 0 and events() == 2 and cfg.get("report_to") == "none" and not p.stderr,
      f"--resume --report-to none: given again, it changes (no new events file) {p.stderr[-300:]!r}")

# ---- 6. tidal-heatmap's two step axes
def png_pixels(path):
    """the PNG's chunks but its text (the command line differs between two invocations)"""
    data, out, at = open(path, "rb").read(), [], 8
    while at < len(data):
        n = int.from_bytes(data[at:at + 4], "big")
        kind = data[at + 4:at + 8]
        if kind not in (b"tEXt", b"iTXt", b"zTXt"):
            out.append(data[at + 4:at + 12 + n])
        at += 12 + n
    return out


rl_h5 = os.path.join(run, "rl.h5")
pngs = {k: os.path.join(tmp, f"{k}.png") for k in ("positions", "steps", "training", "eval")}
ps = {k: tool("tidal-heatmap", rl_h5, "--plot", k, "-o", pngs[k]) for k in ("positions", "steps", "training")}
check(all(p.returncode == 0 for p in ps.values()) and png_pixels(pngs["positions"]) == png_pixels(pngs["steps"]),
      "--plot steps (the old name) draws what --plot positions draws: " + " ".join(p.stderr for p in ps.values())[:300])
p = tool("tidal-heatmap", "--help")
check("positions mean |dlogp|" in p.stdout and "training  tidal-rl runs" in p.stdout and "|steps" not in p.stdout,
      "--help names positions and training (steps is not offered)")
p = tool("tidal-heatmap", rl_h5, "--plot", "training", "--column", "eval_accuracy", "-o", pngs["eval"])
check(p.returncode == 0 and open(pngs["training"], "rb").read(8) == open(pngs["eval"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
      and png_pixels(pngs["training"]) != png_pixels(pngs["eval"]),
      f"--plot training: the reward and --column eval_accuracy against the optimiser step {p.stderr[-200:]}")
p = tool("tidal-heatmap", rl_h5, "--plot", "training", "--column", "rewrd", "-o", os.path.join(tmp, "x.png"))
check(p.returncode == 1 and "no /steps/rewrd" in p.stderr, f"--column of no /steps column: named ({p.stderr.strip()!r})")

# ---- 7. tidal-sweep's table says what is not defined
sweep = os.path.join(tmp, "sweep")
conf = {"tool": os.path.join(ROOT, BIN, "tidal-rl"), "output_dir": sweep, "report_dir": os.path.join(sweep, "report"),
        "args": {"model-path": "datasets/models/add", "dataset-path": "datasets/tasks/add/train.jsonl",
                 "num-generations": 4, "per-device-batch-size": 8, "max-completion-length": 16, "learning-rate": 1e-3,
                 "max-steps": 3, "eval-steps": 1, "eval-max-samples": 4, "quiet": True},
        "runs": [{"name": "full", "args": {}}, {"name": "lora", "args": {"lora-r": 2}},
                 {"name": "ten", "args": {"max-steps": 10}}]}
json.dump(conf, open(os.path.join(tmp, "sweep.json"), "w"))
p = tool("tidal-sweep", os.path.join(tmp, "sweep.json"), "--workers", "1")
table = open(os.path.join(sweep, "report", "table.md")).read() if p.returncode == 0 else ""
rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[1:-1]] for ln in table.splitlines()
        if ln.startswith("| ") and not ln.startswith("| configuration")}
head = [c.strip() for c in table.splitlines()[0].split("|")[1:-1]] if table else []
col = {name: head.index(name) for name in head}
check(p.returncode == 0 and set(rows) == {"full", "lora", "ten"} and "nan" not in table,
      f"the sweep's table has no nan ({p.stderr[-300:]})")
if set(rows) == {"full", "lora", "ten"}:
    drift, best, clean = (col["base drift max at the end (mean ± sd)"], col["best acc"],
                          col["final clean acc (mean ± sd)"])
    check(rows["full"][drift] == "—" and rows["lora"][drift].endswith("(1 seed)"),
          f"base drift: — for full fine-tuning, LoRA's one seed marked ({rows['full'][drift]!r}, {rows['lora'][drift]!r})")
    check(rows["full"][best] == "—" and rows["ten"][best] == rows["ten"][col["final acc"]],
          f"best acc: — in a 3-step run, the one 10-step window (= final acc) in a 10-step run ({rows['ten']})")
    check(all(r[clean].endswith("(1 seed)") and "±" not in r[clean] for r in rows.values()),
          "final clean acc of one seed: the mean, marked (1 seed), no ± nan")

# ---- 8. --chat-template FILE
tmpl = os.path.join(tmp, "plain.jinja")
open(tmpl, "w").write("{% for m in messages %}{{ m['content'] }}{% endfor %}")
conv, convd = os.path.join(tmp, "conv.jsonl"), os.path.join(tmp, "convd.jsonl")
with open(conv, "w") as f, open(convd, "w") as g:
    for a in (12, 23, 34):
        f.write(json.dumps({"prompt": [{"role": "user", "content": f"{a}+{a}="}]}) + "\n")
        g.write(json.dumps({"messages": [{"role": "user", "content": f"{a}+{a}="}]}) + "\n")
RLC = ["tidal-rl", "--model-path", "datasets/models/add", "--dataset-path", conv, "--reward-command",
       "while read -r l; do echo 1; done", "--num-generations", "4", "--per-device-batch-size", "8",
       "--max-completion-length", "8", "--max-steps", "1", "-q"]
p = tool(*RLC, "-o", os.path.join(tmp, "conv-no"))
check(p.returncode == 1 and "has no chat template" in p.stderr and "--chat-template FILE" in p.stderr,
      f"tidal-rl, conversational prompts, no template: refused naming --chat-template ({p.stderr.strip()[-200:]!r})")
p = tool(*RLC, "-o", os.path.join(tmp, "conv"), "--chat-template", tmpl)
cfg = {}
if p.returncode == 0:
    with h5py.File(os.path.join(tmp, "conv", "rl.h5"), "r") as f:
        cfg = json.loads(f.attrs["rl_config"])
check(p.returncode == 0 and cfg.get("chat_template") == tmpl and "reward      1.000" in p.stdout,
      f"tidal-rl --chat-template FILE: the run goes, rl_config records the file ({p.stderr.strip()[-200:]!r})")
p = tool(*RLC, "-o", os.path.join(tmp, "conv"), "--max-steps", "2", "--resume")
check(p.returncode == 1 and "--chat-template" in p.stderr,
      f"--resume without --chat-template: refused, named ({p.stderr.strip()[-200:]!r})")
DIFF = ["tidal-diff", "--model", "datasets/models/add", "--prompts", convd, "--max-new-tokens", "4"]
p = tool(*DIFF, "-o", os.path.join(tmp, "d-no.h5"))
check(p.returncode == 1 and "--chat-template FILE" in p.stderr, "tidal-diff, messages, no template: refused naming the flag")
p = tool(*DIFF, "-o", os.path.join(tmp, "d.h5"), "--chat-template", tmpl)
check(p.returncode == 0, f"tidal-diff --chat-template FILE: the conversations are scored ({p.stderr.strip()[-200:]!r})")
p = tool(*DIFF, "-o", os.path.join(tmp, "d2.h5"), "--chat-template", os.path.join(tmp, "none.jinja"))
check(p.returncode == 1 and "none.jinja" in p.stderr, "--chat-template of a missing file: named")
bad = os.path.join(tmp, "bad.jinja")
open(bad, "w").write("{% for m in messages %}{{ m['content'] }")
p = tool(*DIFF, "-o", os.path.join(tmp, "d3.h5"), "--chat-template", bad)
check(p.returncode == 1 and "bad.jinja: not a chat template" in p.stderr,
      f"--chat-template of a broken template: named ({p.stderr.strip()[-200:]!r})")

shutil.rmtree(tmp, ignore_errors=True)
print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
