"""tidal-postmortem end to end (issue 36), on folders as the trainers leave them:

1. a TRL-shaped folder: HF Trainer checkpoint-N/ with adapters written by real PEFT
   (get_peft_model + save_pretrained on transformers' Qwen2ForCausalLM of datasets/models/add), the
   newest checkpoint's trainer_state.json in HF's schema (log_history every step, TRL's key names),
   a collapse planted at step 40 (reward 0.6 -> 0.05, entropy falling from step 30): exit 0, the drop
   dated at step 40 (the detector confirms it later), the entropy precursor before it, checkpoints before and after the
   onset diffed in bf16 and fp16 (the FP16 counterfactual has the smaller mismatch: the ordering
   every tidal measurement of these recipes shows), the update a merged engine copy keeps nearer 1
   in fp16 than in bf16, report.md with its figures, --json with reward_drop_step and checkpoints;
   the same log as TensorBoard events (torch's SummaryWriter, HF's train/ tags) gives the same drop,
   and as verl leaves it (its file logger's JSON lines under verl's keys, global_step_N/actor/
   lora_adapter, a step in FSDP shards named with verl's converter) the same drop and checkpoints;
2. a tidal-rl run driven into collapse (learning rate 0.03 on the add model: reward 0.66 at step 1,
   ~0 from step 2; a checkpoint every 5 steps): every checkpoint-K/ keeps the policy and HF's
   trainer_state.json (log_history at steps 1..K), and the post-mortem finds the drop the run file
   recorded (collapse_step + 1: HF counts from 1) and dates its onset at step 2, where the detector's
   EMA confirms it only later;
3. bad input: no folder, a folder without a log, a corrupt trainer_state.json (file:line), a log
   without a reward (the keys named), --checkpoints naming a step the folder lacks (exit 2),
   an adapter measured against another base (exit 1, the tensor named), --preflight without
   --model (exit 2); --preflight on the add model with LoRA r 1 runs and writes its report.
Exit 0 pass, 1 fail, 77 skip (torch / transformers / peft missing)."""
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2ForCausalLM
except Exception as e:  # noqa: BLE001
    print(f"torch/transformers/peft unavailable ({type(e).__name__}: {e}): skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tidal_check import BIN, check, failures  # noqa: E402

PM = os.path.join(BIN, "tidal-postmortem")
MODEL = os.path.abspath("datasets/models/add")
DATA = "datasets/tasks/add/train.jsonl"
tmp = tempfile.mkdtemp(prefix="tidal-postmortem-")
ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")


def pm(*args):
    return subprocess.run([PM, *args], capture_output=True, text=True, env=ENV, timeout=600)


# ---- 1. a TRL-shaped folder with a planted collapse ----
trl = os.path.join(tmp, "trl")
os.makedirs(trl)
torch.manual_seed(0)
base = Qwen2ForCausalLM.from_pretrained(MODEL, torch_dtype=torch.float32)
peft_model = get_peft_model(base, LoraConfig(r=1, lora_alpha=2, target_modules=["q_proj", "v_proj", "down_proj"]))
rng = np.random.default_rng(1)
steps = list(range(10, 81, 10))
for s in steps:   # the adapter grows with the step: lora_B from 0 towards 2e-3 per element
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.from_numpy(rng.standard_normal(p.shape).astype(np.float32) * 2.5e-5 * s))
    peft_model.save_pretrained(os.path.join(trl, f"checkpoint-{s}"))
log = []
for s in range(1, 81):
    rew = (0.6 if s < 40 else 0.05) + 0.02 * rng.standard_normal()
    ent = 0.9 if s < 30 else 0.9 * 0.5 ** ((s - 29) / 2)
    log.append({"step": s, "epoch": s / 80, "loss": 0.01, "grad_norm": 0.5 + 0.05 * rng.standard_normal(),
                "learning_rate": 1e-5, "reward": rew, "reward_std": 0.3, "kl": 0.001 * s, "entropy": ent,
                "completions/mean_length": 30.0, "completions/clipped_ratio": 0.0, "frac_reward_zero_std": 0.1,
                "clip_ratio/region_mean": 0.0})
state = {"global_step": 80, "max_steps": 80, "log_history": log, "best_metric": None, "logging_steps": 1}
json.dump(state, open(os.path.join(trl, "checkpoint-80", "trainer_state.json"), "w"))
out = os.path.join(tmp, "trl-pm")
p = pm(trl, "--dataset-path", DATA, "--max-prompts", "8", "--max-completion-length", "16", "--max-checkpoints", "4",
       "-o", out, "--json")
check(p.returncode == 0, f"TRL folder: exit 0 (rc {p.returncode}: {p.stderr.strip()[-300:]})")
j = json.loads(p.stdout) if p.returncode == 0 else {}
d = j.get("reward_drop_step")
check(d is not None and 40 <= d <= 42 and j.get("reward_drop_confirmed_step", 0) >= d,
      f"the planted drop at step 40 found at step {d} (the detector confirmed it at {j.get('reward_drop_confirmed_step')})")
ev = {e["event"]: e["step"] for e in j.get("events", [])}
check("entropy" in ev and ev["entropy"] < (d or 0), f"the entropy precursor comes first (events {ev})")
cks = j.get("checkpoints", [])
st = [c["step"] for c in cks]
on = j.get("onset_step") or 0
check(len(cks) == 4 and any(s <= on for s in st) and any(s > on for s in st),
      f"4 checkpoints measured, before and after the onset {on}: {st}")
ok16 = all(c["fp16"]["logp_diff_mean"] < c["logp_diff_mean"] for c in cks if c.get("logp_diff_mean") is not None)
check(cks and ok16, "the FP16 counterfactual's mean |dlogp| is below bf16's at every checkpoint: " +
      ", ".join("%s: %.3g vs %.3g" % (c["step"], c["logp_diff_mean"], c["fp16"]["logp_diff_mean"]) for c in cks))
sv = [(c["merge_aligned"], c["merge_aligned_fp16"]) for c in cks]
check(all(s is not None and abs(f - 1) < abs(s - 1) for s, f in sv) and sv[0][0] < 0.95,
      f"what a merged engine copy keeps of the adapter (its component along the update): fp16 nearer 1 than bf16 at "
      f"every checkpoint, bf16 < 0.95 at the first, smallest one ({sv})")
up = [(c["step"], c.get("update_since_step"), c.get("update_kept"), c.get("update_kept_fp16")) for c in cks]
check(all(u[1] is not None and abs(u[3] - 1) < abs(u[2] - 1) for u in up if u[0] > 10) and up and up[0][1] is None,
      f"the update since the checkpoint before each one, as the engine copy sees it: fp16 nearer 1 than bf16 ({up})")
rep = open(os.path.join(out, "report.md")).read() if os.path.exists(os.path.join(out, "report.md")) else ""
check("## Verdict" in rep and "![reward.png](reward.png)" in rep and os.path.exists(os.path.join(out, "checkpoints.png"))
      and os.path.exists(os.path.join(out, "diffs", f"step-{st[0] if st else 0}-fp16.h5")),
      "report.md with its verdict and figures; the diffs' run files kept")
p2 = pm(trl, "--dataset-path", DATA, "--max-prompts", "8", "--max-completion-length", "16", "--max-checkpoints", "4",
        "-o", out, "--json")
j2 = json.loads(p2.stdout) if p2.returncode == 0 else {}
check(p2.returncode == 0 and [c["logp_diff_mean"] for c in j2.get("checkpoints", [])] == [c["logp_diff_mean"] for c in cks],
      "run again: the finished diffs are read back, the same numbers")

# the same log as TensorBoard events (HF's train/ tags), no trainer_state.json
tb = os.path.join(tmp, "tb")
os.makedirs(os.path.join(tb, "runs", "Nov28_host"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from torch.utils.tensorboard import SummaryWriter
    w = SummaryWriter(os.path.join(tb, "runs", "Nov28_host"))
    for e in log:
        for k, v in e.items():
            if k not in ("step", "epoch"):
                w.add_scalar("train/" + k, v, e["step"])
    w.close()
    p = pm(tb, "--no-measure", "--json", "-o", os.path.join(tmp, "tb-pm"))
    jt = json.loads(p.stdout) if p.returncode == 0 else {}
    check(p.returncode == 0 and jt.get("log_format") == "tensorboard" and jt.get("reward_drop_step") == d,
          f"TensorBoard events (torch's SummaryWriter): the same drop ({jt.get('reward_drop_step')} vs {d})")
except ImportError:
    print("torch.utils.tensorboard unavailable: the TensorBoard case skipped")

# the same collapse as verl leaves it: its file logger's JSON lines ({"step", "data"}, verl's keys), the
# adapter in global_step_N/actor/lora_adapter/, and a step saved as FSDP shards only (torch pickles)
verl = os.path.join(tmp, "verl")
os.makedirs(verl)
with open(os.path.join(verl, "grpo_run.jsonl"), "w") as f:
    for e in log:
        f.write(json.dumps({"step": e["step"], "data": {"critic/score/mean": e["reward"], "actor/entropy": e["entropy"],
                                                        "actor/grad_norm": e["grad_norm"], "response_length/mean": 30.0,
                                                        "response_length/clip_ratio": 0.0, "actor/lr": 1e-5}}) + "\n")
for s_ in (10, 50):
    import shutil
    shutil.copytree(os.path.join(trl, f"checkpoint-{s_}"), os.path.join(verl, f"global_step_{s_}", "actor", "lora_adapter"))
os.makedirs(os.path.join(verl, "global_step_60", "actor"))
open(os.path.join(verl, "global_step_60", "actor", "model_world_size_1_rank_0.pt"), "wb").write(b"\x80\x02}q\x00.")
p = pm(verl, "--model", MODEL, "--dataset-path", DATA, "--max-prompts", "4", "--max-completion-length", "8", "--json",
       "-o", os.path.join(tmp, "verl-pm"))
jv = json.loads(p.stdout) if p.returncode == 0 else {}
found = {c["step"]: c for c in jv.get("checkpoints_found", [])}
check(p.returncode == 0 and jv.get("log_format") == "verl" and jv.get("reward_key") == "critic/score/mean" and
      jv.get("reward_drop_step") == d and [c["step"] for c in jv.get("checkpoints", [])] == [10, 50] and
      "model_merger" in found.get(60, {}).get("unreadable", ""),
      f"verl folder: its JSON lines read under verl's names (reward {jv.get('reward_key')}, drop {jv.get('reward_drop_step')}), "
      f"the lora_adapter checkpoints measured, FSDP shards named with verl's converter (rc {p.returncode}: {p.stderr.strip()[-150:]})")

# ---- 2. a tidal-rl run driven into collapse ----
rl = os.path.join(tmp, "rl")
r = subprocess.run([os.path.join(BIN, "tidal-rl"), "--model-path", MODEL, "--dataset-path", DATA, "--num-generations", "8",
                    "--per-device-batch-size", "16", "--gradient-accumulation-steps", "1", "--max-completion-length", "48",
                    "--learning-rate", "0.03", "--max-steps", "20", "--save-steps", "5", "--seed", "3", "-o", rl],
                   capture_output=True, text=True, env=ENV, timeout=900)
check(r.returncode == 0, f"tidal-rl at lr 0.03 runs (rc {r.returncode}: {r.stderr.strip()[-200:]})")
check("tidal-rl: collapse:" in r.stderr and f"tidal-postmortem {rl}" in r.stderr,
      "tidal-rl says on the console when the detector's reward_drop fires, and what examines the run")
said = re.search(r"from step (\d+) \(reward_drop\)", r.stderr)
check(said is not None and f"  collapse    yes: reward_drop from step {said.group(1)}" in r.stdout,
      f"... and its end-of-run summary names the same step: {r.stdout.strip()[:400]!r}")
cks = sorted(int(x.split("-")[1]) for x in os.listdir(rl) if x.startswith("checkpoint-")) if r.returncode == 0 else []
ts = os.path.join(rl, "checkpoint-10", "trainer_state.json")
hist = json.load(open(ts))["log_history"] if os.path.exists(ts) else []
check(cks == [5, 10, 15, 20] and os.path.exists(os.path.join(rl, "checkpoint-10", "model.safetensors"))
      and [h["step"] for h in hist] == list(range(1, 11)) and "reward" in hist[0],
      f"every checkpoint-K/ kept with the policy and HF's trainer_state.json (steps 1..K): {cks}, {len(hist)} entries")
attrs = subprocess.run([os.path.join(BIN, "tidal-export"), os.path.join(rl, "rl.h5"), "--attr", "collapse_step"],
                       capture_output=True, text=True).stdout.strip()
p = pm(rl, "--max-prompts", "4", "--max-checkpoints", "2", "--json")
jr = json.loads(p.stdout) if p.returncode == 0 else {}
want = int(attrs) + 1 if attrs and int(attrs) >= 0 else None
check(p.returncode == 0 and want is not None and jr.get("reward_drop_confirmed_step") == want and jr.get("reward_drop_step") == 2 and
      len(jr.get("checkpoints", [])) == 2,
      f"tidal-rl folder: the drop the run recorded (collapse_step {attrs} -> HF step {want}) found "
      f"({jr.get('reward_drop_confirmed_step')}), the drop itself dated at step {jr.get('reward_drop_step')}, 2 checkpoints measured (rc {p.returncode}: {p.stderr.strip()[-200:]})")

# ---- 3. bad input ----
p = pm(os.path.join(tmp, "nope"))
check(p.returncode == 1 and "no such folder" in p.stderr, "a missing folder: exit 1, named")
empty = os.path.join(tmp, "empty")
os.makedirs(empty)
p = pm(empty)
check(p.returncode == 1 and "no run log" in p.stderr and "trainer_state.json" in p.stderr, "a folder without a log: exit 1, what is looked for")
bad = os.path.join(tmp, "badjson")
os.makedirs(bad)
open(os.path.join(bad, "trainer_state.json"), "w").write('{"log_history": [\n{"step": 1, "reward": 0.5},\n{"step": 2, "reward": }\n]}')
p = pm(bad)
check(p.returncode == 1 and "trainer_state.json:3" in p.stderr, f"a corrupt trainer_state.json: exit 1, file:line ({p.stderr.strip()[:150]})")
nor = os.path.join(tmp, "noreward")
os.makedirs(nor)
json.dump({"log_history": [{"step": 1, "loss": 0.5, "grad_norm": 1.0}]}, open(os.path.join(nor, "trainer_state.json"), "w"))
p = pm(nor)
check(p.returncode == 1 and "no reward" in p.stderr and "grad_norm" in p.stderr, "a log without a reward: exit 1, its keys named")
p = pm(trl, "--dataset-path", DATA, "--checkpoints", "10,55", "-o", os.path.join(tmp, "x"))
check(p.returncode == 2 and "55" in p.stderr and "10 20 30" in p.stderr, "--checkpoints with a step the folder lacks: exit 2, the steps it has")
other = os.path.join(tmp, "other")
subprocess.run([os.path.join(BIN, "tidal-init"), "--arch", "qwen2", "--hidden-size", "64", "--num-layers", "2", "--num-heads", "4",
                "--num-kv-heads", "2", "--intermediate-size", "128", "--vocab-size", "100", "-o", other], capture_output=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    if os.path.exists(os.path.join(MODEL, f)):
        open(os.path.join(other, f), "wb").write(open(os.path.join(MODEL, f), "rb").read())
p = pm(trl, "--model", other, "--dataset-path", DATA, "--checkpoints", "10", "--max-prompts", "2", "-o", os.path.join(tmp, "y"))
check(p.returncode == 1 and "adapter" in p.stderr.lower(), f"an adapter against another base: exit 1 ({p.stderr.strip()[-200:]})")
p = pm("--preflight", "--dataset-path", DATA)
check(p.returncode == 2 and "--model" in p.stderr, "--preflight without --model: exit 2")
pf = os.path.join(tmp, "pre")
p = pm("--preflight", "--model", MODEL, "--dataset-path", DATA, "--lora-r", "1", "--learning-rate", "1e-5",
       "--max-prompts", "4", "--max-completion-length", "16", "-o", pf, "--json")
jp = json.loads(p.stdout) if p.returncode == 0 else {}
proj = jp.get("lora_projection", [])
check(p.returncode == 0 and len(jp.get("checkpoints", [])) == 1 and len(proj) == 3 and
      all(abs(x["merge_aligned_fp16"] - 1) <= abs(x["merge_aligned"] - 1) for x in proj) and proj[0]["merge_aligned"] < 0.5 and
      os.path.exists(os.path.join(pf, "report.md")),
      "--preflight: the step-0 diff; LoRA's projected update kept (bf16 / fp16) after 1, 10, 100 Adam steps at lr 1e-5: " +
      ", ".join("%d: %.3g/%.3g" % (x["adam_steps"], x["merge_aligned"], x["merge_aligned_fp16"]) for x in proj) +
      " (bf16 keeps < 0.5 after one step)" if proj else "--preflight")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
