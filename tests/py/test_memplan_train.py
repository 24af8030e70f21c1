"""The trainers' GPU memory plan (td_memplan_train_*, src/backend/memplan.c; tidal-sft and tidal-rl
--device cuda, issue 27) against the simulated GPU (tests/cudasim: CUDASIM_PEAK=1 prints the most
device memory held at once, CUDASIM_MEM sets the device's memory). Device tools as in
tests/py/device_train.py (build/sim/bin by default).

Model: a tidal-init Qwen2 (C 64, 2 layers, F 128, V 4000, untied) with the character tokenizer:
the vocabulary is wide so that the optimizer state (4 x 0.57M parameters x 4 bytes = 9 MiB) and
the logits weigh beside cuBLASLt's 32 MiB workspace (40 MiB with tdc_scratch's 1.25x growth),
which is most of a tiny model's peak; datasets/tasks/add, one step.

1. plan vs measured peak: the plan (printed, and the run file's memory_plan attribute) is an
   upper bound of the simulator's peak and at most 1.15x it (1.5x before the MoE cases: loose), for tidal-sft fp32 full fine-tuning,
   bf16-train with --gradient-checkpointing, LoRA r 8 on all linear layers; tidal-rl bf16 with
   --gradient-checkpointing (pi_old forward, the rollout session of 4 completions) and --eval-steps
   (the evaluation's session beside the rollouts'), bf16 LoRA r 8
   (merged sync), fp32 with beta 0.1 (the reference forward on the loaded checkpoint). The ratios
   are printed (measured when written: 1.03 to 1.07).
2. --gradient-checkpointing lowers the planned activations (--plan-only of the same run).
3. refusal: CUDASIM_MEM=30M: tidal-sft --overwrite-output-dir on a folder holding an earlier run
   exits 1 with the numbers (needed, free, short by, the largest items, what to change) and leaves
   the folder as it was; tidal-rl likewise names --max-completion-length and makes no rl.h5.
4. --plan-only of a DeepSeek-R1-Distill-Qwen-1.5B-shaped config (tidal-init --config-only: no
   weights, no tokenizer; 1.78B parameters, untied) for the FP16 paper's sanity test (Dr.GRPO,
   8 generations, up to 8,192 response tokens) with 8 prompts per step (64 completions), 4,096
   and 8,192 response tokens + a 512-token prompt, with and without --gradient-checkpointing:
   exit 0, nothing written; the optimizer state (4 x nparams x 4 bytes) and the KV cache (L x
   completions x positions x 2 x NKV x HD x 2 bytes) against a hand computation; printed (the
   figures reports/rl/gpu/README.md quotes). The CPU build's tools plan too (free memory unknown).
Exit 0 pass, 1 fail, 77 skip (sim tools not built, or h5py missing)."""
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError as e:
    print(f"skip: {e}")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tidal_check import BIN, BUILD, check, failures, run  # noqa: E402

SIMBIN = os.environ.get("DEVICE_BIN", os.path.join(BUILD, "sim", "bin"))
SIM = "DEVICE_BIN" not in os.environ   # on a GPU (tests/gpu/run.sh rl): the run file's memory_peak, no CUDASIM_MEM
for tool in ["tidal-sft", "tidal-rl"]:
    if not os.access(os.path.join(SIMBIN, tool), os.X_OK):
        print(f"skip: {SIMBIN}/{tool} not built (make tests builds it: tests/cudasim/sim.mk)")
        sys.exit(77)

tmp = tempfile.mkdtemp(prefix="tidal-memplan-train-")
ENV = dict(os.environ, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE")
MODEL = os.path.join(tmp, "init")
run("tidal-init", "--arch", "qwen2", "--hidden-size", "64", "--num-layers", "2", "--num-heads", "2",
    "--num-kv-heads", "1", "--head-dim", "32", "--intermediate-size", "128", "--vocab-size", "4000", "--no-tie",
    "--seed", "3", "-o", MODEL)
run("tidal-tokenize", "--write-char-vocab", MODEL)
SFT = ["--model-path", MODEL, "--dataset-path", "datasets/tasks/add", "--per-device-batch-size", "2", "--max-steps",
       "1", "--eval-max-samples", "1", "--per-device-eval-batch-size", "1", "--max-new-tokens", "4"]
RL = ["--model-path", MODEL, "--dataset-path", "datasets/tasks/add/train.jsonl", "--num-generations", "2",
      "--per-device-batch-size", "2", "--gradient-accumulation-steps", "2", "--max-completion-length", "8",
      "--learning-rate", "1e-3", "--max-steps", "1", "--seed", "3", "-q"]


def tool(name, *args, mem=None, binary=None):
    env = dict(ENV, CUDASIM_PEAK="1")
    if mem:
        env["CUDASIM_MEM"] = mem
    return subprocess.run([os.path.join(binary or SIMBIN, name), *args], capture_output=True, text=True, env=env)


def printed_total(p):
    m = re.search(r"memory plan \(GPU\): (\d+) bytes", p.stderr)
    return int(m.group(1)) if m else None


def plan_attr(path):
    with h5py.File(path, "r") as f:
        v = f.attrs["memory_plan"]
        return json.loads(v.decode() if isinstance(v, bytes) else v)


# 1. plan vs the simulator's peak
cases = [("tidal-sft", "sft.h5", "fp32", SFT + ["--recipe", "fp32"]),
         ("tidal-sft", "sft.h5", "bf16-train, gradient checkpointing", SFT + ["--recipe", "bf16-train", "--gradient-checkpointing"]),
         ("tidal-sft", "sft.h5", "LoRA r 8 all-linear", SFT + ["--lora-r", "8", "--lora-target-modules", "all-linear"]),
         ("tidal-rl", "rl.h5", "bf16, gradient checkpointing, evaluation", RL + ["--dtype", "bf16", "--gradient-checkpointing",
                                                                          "--eval-steps", "1", "--eval-max-samples", "2"]),
         ("tidal-rl", "rl.h5", "bf16 LoRA r 8 merged", RL + ["--dtype", "bf16", "--lora-r", "8"]),
         ("tidal-rl", "rl.h5", "bf16 LoRA r 8 merge-unmerge (the sync on the device: base, engine, W_0 in fp32)",
          RL + ["--dtype", "bf16", "--lora-r", "8", "--lora-sync", "merge-unmerge", "--model-dtype", "bf16"]),
         ("tidal-rl", "rl.h5", "fp32, beta 0.1", RL + ["--dtype", "fp32", "--beta", "0.1"])]
for i, (name, runfile, what, args) in enumerate(cases):
    out = os.path.join(tmp, f"run{i}")
    p = tool(name, *args, "-o", out, "--device", "cuda")
    m = re.search(r"cudasim: peak device memory (\d+) bytes", p.stderr)
    plan = printed_total(p)
    if p.returncode != 0 or plan is None or (SIM and not m):
        print(p.stderr[-3000:])
        check(False, f"{name} {what}: the run completes, prints its plan (and the simulator its peak)")
        continue
    attr = plan_attr(os.path.join(out, runfile))
    with h5py.File(os.path.join(out, runfile), "r") as f:
        own = int(f.attrs["memory_peak"])   # the backend's own count (tdc_malloc / tdc_free)
    peak = int(m.group(1)) if SIM else own
    check(own == peak, f"{name} {what}: {runfile} memory_peak {own} = the simulator's peak")
    check(attr["total"] == plan and attr["free"] > 0, f"{name} {what}: {runfile} memory_plan total {attr['total']} = "
          "the printed plan, with the free memory")
    check(peak <= plan <= 1.15 * peak, f"{name} {what}: plan {plan} bytes >= measured peak {peak}, "
          f"ratio {plan / peak:.3f} (<= 1.15)")

# 2. checkpointing lowers the activations the plan holds
acts = {}
for gc in [[], ["--gradient-checkpointing"]]:
    p = tool("tidal-sft", *SFT, "--plan-only", *gc)
    m = re.search(r"activations\s+([\d.]+) (KiB|MiB)", p.stderr)
    acts[bool(gc)] = float(m.group(1)) * (1024 if m.group(2) == "MiB" else 1) if p.returncode == 0 and m else None
check(None not in acts.values() and acts[True] < acts[False],
      f"--plan-only: activations {acts[False]} KiB, with --gradient-checkpointing {acts[True]} KiB")

# 3. refusal: a small device, an output folder holding an earlier run (the simulator's CUDASIM_MEM)
if not SIM:
    sys.exit(1 if failures else 0)
keep = os.path.join(tmp, "run0")
before = sorted(os.listdir(keep))
size = os.path.getsize(os.path.join(keep, "sft.h5"))
p = tool("tidal-sft", *SFT, "-o", keep, "--overwrite-output-dir", "--device", "cuda", mem="30M")
print("   ", [ln for ln in p.stderr.splitlines() if "does not fit" in ln][:1])
check(p.returncode == 1 and "does not fit the GPU" in p.stderr and "short by" in p.stderr and "largest:" in p.stderr
      and "--gradient-checkpointing" in p.stderr and "--per-device-batch-size" in p.stderr,
      f"tidal-sft at 30M: refused with exit 1, the numbers and what to change (rc {p.returncode})")
check(sorted(os.listdir(keep)) == before and os.path.getsize(os.path.join(keep, "sft.h5")) == size,
      "tidal-sft refused: --overwrite-output-dir's folder left as it was")
out = os.path.join(tmp, "rl-refused")
p = tool("tidal-rl", *RL, "--dtype", "bf16", "-o", out, "--device", "cuda", mem="30M")
check(p.returncode == 1 and "does not fit the GPU" in p.stderr and "--max-completion-length" in p.stderr,
      f"tidal-rl at 30M: refused with exit 1, naming --max-completion-length (rc {p.returncode})")
check(not os.path.exists(os.path.join(out, "rl.h5")), "tidal-rl refused: no rl.h5 made")
# a LoRA sync whose device copies do not fit runs on the host instead: a memory between the two plans
MU = RL + ["--dtype", "bf16", "--lora-r", "8", "--lora-sync", "merge-unmerge", "--model-dtype", "bf16"]
env_host = dict(ENV, TIDAL_PREPARE_ON_HOST="1")
ref = os.path.join(tmp, "rl-sync-host-ref")
r = subprocess.run([os.path.join(SIMBIN, "tidal-rl"), *MU, "-o", ref, "--device", "cuda"], capture_output=True,
                   text=True, env=env_host)
pd = tool("tidal-rl", *MU, "-o", os.path.join(tmp, "rl-sync-dev"), "--device", "cuda")
t_dev, t_host = printed_total(pd), printed_total(r)
check(r.returncode == 0 and pd.returncode == 0 and t_dev and t_host and t_dev > t_host,
      f"merge-unmerge: the device sync's plan {t_dev} > the host sync's {t_host} (TIDAL_PREPARE_ON_HOST=1)")
if t_dev and t_host and r.returncode == 0:
    mid = (t_dev + t_host) // 2 * 64 // 63 // (1 << 20)   # MiB: the host plan fits with the reserve, the device's not
    out = os.path.join(tmp, "rl-sync-host")
    p = tool("tidal-rl", *MU, "-o", out, "--device", "cuda", mem=f"{mid}M")
    same = False
    if p.returncode == 0:
        with h5py.File(os.path.join(out, "rl.h5"), "r") as a, h5py.File(os.path.join(ref, "rl.h5"), "r") as b:
            cols = [k for k in a["steps"].keys() if not (k == "seconds" or k.startswith("time_"))]
            same = all(np.array_equal(a["steps"][k][()], b["steps"][k][()], equal_nan=True) for k in cols)
    print("   ", [ln for ln in p.stderr.splitlines() if "the sync runs on the host" in ln][:1])
    check(p.returncode == 0 and "the sync runs on the host" in p.stderr and same and printed_total(p) == t_host,
          f"merge-unmerge at {mid} MiB: the sync falls back to the host with a note, runs (rc {p.returncode}) on the "
          f"host sync's plan, /steps equal the TIDAL_PREPARE_ON_HOST=1 run's")
p = tool("tidal-sft", *SFT, "-o", os.path.join(tmp, "ignored"), "--device", "cuda", "--ignore-memory-plan", mem="30M")
check(p.returncode == 1 and "does not fit" not in p.stderr, f"--ignore-memory-plan: no refusal, the run itself fails "
      f"at 30M (rc {p.returncode})")

# 4. the 1.5B plan (R1-Distill-Qwen-1.5B's shape), FP16 paper's sanity test with 8 prompts per step
q15 = os.path.join(tmp, "q15")
run("tidal-init", "--preset", "qwen2.5-0.5b", "--hidden-size", "1536", "--num-layers", "28", "--num-heads", "12",
    "--num-kv-heads", "2", "--intermediate-size", "8960", "--no-tie", "--dtype", "bf16", "--config-only", "-o", q15)
C, F, L, NH, NKV, HD, V = 1536, 8960, 28, 12, 2, 128, 151936
nparams = 2 * V * C + L * (C * NH * HD * 2 + 2 * C * NKV * HD + NH * HD + 2 * NKV * HD + 3 * C * F + 2 * C) + C
GiB = 2.0 ** 30
usable = 78 * GiB * 63 / 64   # an 80 GB H100's free memory less the plan's reserve
totals = {}
for resp in [4096, 8192]:
    for gc in [False, True]:
        nodir = os.path.join(tmp, f"plan-{resp}-{gc}")
        p = tool("tidal-rl", "--model-path", q15, "--dataset-path", "datasets/tasks/add/train.jsonl", "--dtype", "fp16",
                 "--num-generations", "8", "--per-device-batch-size", "1", "--gradient-accumulation-steps", "64",
                 "--max-completion-length", str(resp), "--max-seq-length", str(resp + 512), "--loss-type", "dr_grpo",
                 "--scale-rewards", "none", "-o", nodir, "--plan-only", *(["--gradient-checkpointing"] if gc else []),
                 binary=BIN)
        print("\n".join(ln for ln in p.stderr.splitlines() if "tidal-rl:   " in ln))
        t = printed_total(p)
        totals[(resp, gc)] = t
        check(p.returncode == 0 and t is not None and not os.path.exists(nodir),
              f"1.5B, {resp}-token responses, checkpointing {gc}: --plan-only exits 0 ({t / GiB if t else 0:.2f} GiB), "
              "writes nothing")
        state = re.search(r"optimizer\s+([\d.]+) GiB\s+\((\d+) trained", p.stderr)
        check(state and int(state.group(2)) == nparams and abs(float(state.group(1)) - 16 * nparams / GiB) < 0.006,
              f"1.5B: {nparams} trained parameters, optimizer state 16 x that = {16 * nparams / GiB:.2f} GiB")
        kv = re.search(r"KV cache ([\d.]+) GiB", p.stderr)
        want = L * 64 * (resp + 512) * 2 * NKV * HD * 2
        check(kv and abs(float(kv.group(1)) - want / GiB) < 0.006, f"1.5B: KV cache of 64 x {resp + 512} positions, "
              f"fp16: {want / GiB:.2f} GiB")
if None not in totals.values():
    check(totals[(8192, True)] < usable < totals[(8192, False)],
          f"1.5B, 8K responses, 64 completions: fits an 80 GB GPU with --gradient-checkpointing "
          f"({totals[(8192, True)] / GiB:.1f} GiB), not without ({totals[(8192, False)] / GiB:.1f} GiB)")
p = tool("tidal-sft", *SFT, "--plan-only", binary=BIN)
check(p.returncode == 0 and "memory plan (GPU)" in p.stderr and "free memory unknown" in p.stderr,
      f"tidal-sft --plan-only without --device, no output dir: the plan, free memory unknown (rc {p.returncode})")

sys.exit(1 if failures else 0)
