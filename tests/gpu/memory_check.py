"""The memory plan against a real GPU (tests/gpu/run.sh memory; the simulator's version is
tests/py/test_memplan.py). On the Qwen2.5-0.5B-shaped random bf16 checkpoint that
reports/gpu/fidelity.sh small writes ($BUILD/gpu/qwen2.5-0.5b-bf16, made here if absent),
8 prompts of 1024 random tokens + 64 generated, --batch 8, for bf16-train/bf16-infer and
bf16-train/fp8-rollout:
  - the run completes, and its run file's memory_peak (every cudaMalloc / cudaMallocAsync the
    backend made, less what it freed) is at most the plan's total, the plan at most 15 % above;
  - memory_used_max (cudaMemGetInfo's free memory at the plan less its least value after a
    batch: what the driver really gave, allocation rounding and cuBLASLt's own memory included)
    is printed beside them, and must stay under plan + 5 % + 256 MiB (the context is already
    open when the plan reads the free memory);
  - with the free memory the GPU has now, --plan-only of the Llama-3.1-8B 8 x (8192 + 1024)
    case is printed (tidal-init --config-only) and the same plan with --batch 64 is lowered.
Figures go to $OUT/memory.md (rewritten after each part, so a killed run keeps what it did).
Needs numpy (run files are read with h5py, or tidal-export without it: tests/py/runfile_read.py).
TIDAL_GPU_TINY=1 (tests/gpu/run.sh's rehearsal on the simulator): a tiny Qwen2, 2 x (16 + 4),
--batch 2, the 8B plan with 2 prompts of 64 + 16; the bounds are checked all the same (the
simulator's allocator counts what the backend asks for). Exit 0 pass, 1 fail."""
import json
import os
import random
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
import runfile_read  # noqa: E402  (h5py, or tidal-export where this python has none)

BUILD = os.environ.get("BUILD", "build")
OUT = os.environ.get("OUT", "out/gpu")
B = os.path.join(BUILD, "bin")
TINY = os.environ.get("TIDAL_GPU_TINY") == "1"
Q = os.path.join(BUILD, "gpu", "tiny-qwen2-bf16" if TINY else "qwen2.5-0.5b-bf16")
INIT = (["--arch", "qwen2", "--hidden-size", "64", "--num-layers", "2", "--num-heads", "4", "--num-kv-heads", "2",
         "--intermediate-size", "128", "--vocab-size", "512"] if TINY else ["--preset", "qwen2.5-0.5b"])
# prompts x (prompt tokens + new tokens), --batch; the 8B plan's prompts x (tokens + new), batches
N, PLEN, NEW, BATCH, VOCAB = (2, 16, 4, 2, 512) if TINY else (8, 1024, 64, 8, 151000)
N8, PLEN8, NEW8, BATCHES8 = (2, 64, 16, ["2"]) if TINY else (64, 8192, 1024, ["8", "64"])
work = os.path.join(OUT, "memory")
os.makedirs(work, exist_ok=True)
fails, lines = [], ["# The memory plan on a real GPU (tests/gpu/memory_check.py)", ""]


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    lines.append(("- ok " if cond else "- FAIL ") + what)
    if not cond:
        fails.append(what)
    with open(os.path.join(OUT, "memory.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if not os.path.exists(os.path.join(Q, "config.json")):
    subprocess.run([os.path.join(B, "tidal-init"), *INIT, "--dtype", "bf16", "--seed", "1",
                    "-o", Q], check=True, capture_output=True)
prompts = os.path.join(work, f"prompts-{PLEN}.jsonl")
r = random.Random(1)
with open(prompts, "w") as f:
    for _ in range(N):
        f.write(json.dumps({"tokens": [r.randrange(VOCAB) for _ in range(PLEN)]}) + "\n")
for a, b in [("bf16-train", "bf16-infer"), ("bf16-train", "fp8-rollout")]:
    out = os.path.join(work, f"{a}_{b}.h5")
    p = subprocess.run([os.path.join(B, "tidal-diff"), "--model", Q, "--prompts", prompts, "-o", out, "--force",
                        "--recipe-a", a, "--recipe-b", b, "--device", "cuda", "--max-new-tokens", str(NEW), "--batch", str(BATCH),
                        "--seed", "1"], capture_output=True, text=True)
    print(p.stderr[-3000:])
    if p.returncode != 0:
        check(False, f"{a}/{b}: the run completes (exit {p.returncode})")
        continue
    at = runfile_read.attrs(out, ["memory_plan", "memory_peak", "memory_used_max"])
    if len(at) < 3:
        check(False, f"{a}/{b}: the run file has memory_plan, memory_peak, memory_used_max (has {sorted(at)})")
        continue
    plan = json.loads(at["memory_plan"])
    peak, used = int(at["memory_peak"]), int(at["memory_used_max"])
    tot = plan["total"]
    check(peak <= tot <= 1.15 * peak, f"{a}/{b}: plan {tot / 2**30:.3f} GiB >= tidal's peak {peak / 2**30:.3f} GiB, "
          f"within 15 % (+{100 * (tot - peak) / max(peak, 1):.1f} %)")
    check(used <= 1.05 * tot + (256 << 20), f"{a}/{b}: cudaMemGetInfo's use {used / 2**30:.3f} GiB <= plan + 5 % + 256 MiB")
l8b = os.path.join(work, "llama-3.1-8b-config")
subprocess.run([os.path.join(B, "tidal-init"), "--preset", "llama-3.1-8b", "--dtype", "bf16", "--config-only", "-o", l8b],
               check=True, capture_output=True)
p8k = os.path.join(work, f"prompts-{PLEN8}.jsonl")
with open(p8k, "w") as f:
    for i in range(N8):   # --batch 64 needs 64 prompts: a batch never has more slots than prompts
        f.write(json.dumps({"tokens": [r.randrange(128000) for _ in range(PLEN8)]}) + "\n")
for batch in BATCHES8:
    p = subprocess.run([os.path.join(B, "tidal-diff"), "--model", l8b, "--prompts", p8k, "--max-new-tokens", str(NEW8),
                        "--batch", batch, "--device", "cuda", "--plan-only"], capture_output=True, text=True)
    plan = [l for l in p.stderr.splitlines() if "memory plan" in l or l.startswith("tidal-diff:   ") or "note:" in l]
    lines += ["", f"8B, {N8} prompts of {PLEN8} + {NEW8}, --batch {batch}, --plan-only (exit {p.returncode}):", "```",
              *plan, "```"]
    print("\n".join(plan))
    if p.returncode:
        print(p.stderr[-2000:])
    check(p.returncode == 0, f"8B / {PLEN8} --batch {batch}: the plan fits (lowered if need be), exit 0")
with open(os.path.join(OUT, "memory.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
sys.exit(1 if fails else 0)
