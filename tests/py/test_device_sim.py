"""The tools end to end on the simulated GPU: build/sim/bin/tidal-diff and tidal-logprobs are the
real tools linked with the CUDA backend compiled against tests/cudasim (a CPU simulator of CUDA
that aborts when a kernel or cublasLtMatmul is handed host memory, and, with
CUDASIM_DEVICE_GUARD=1 as here, faults with a message when host code touches device memory),
run with --device cuda against the CPU tools
(build/bin) on datasets/models/add (a trained Qwen2: C 192, 4 layers, V 100), 8 prompts of
datasets/models/prompts-add.jsonl, the same seed. The run files are compared with h5py
(reports/SCHEMA.md). What the op tests of tests/cudasim cannot see is exercised here: host
buffers at the op seam, the per-layer observer (--layers), the KV-cache session and sampling
loop, unmerged LoRA buffers, a rollout replay, the run file's attributes.

1. fp32 / fp32, greedy: the same generated tokens, and every log-prob of both paths within 1e-4
   of the CPU's (the project's fp32 standard: the simulated cuBLASLt sums in another order).
2. bf16-train / bf16-infer and bf16-train / fp8-rollout, greedy: mean |dlogp| between the paths
   on the GPU within [0.5, 2]x of the CPU's (the fidelity ratio, printed), same tokens.
3. --layers: /layers/rel_err recorded on the GPU; fp32: both devices at fp32 noise (< 1e-5);
   bf16 pair: each layer's mean within 10% of the CPU's, 90% of entries within 10%.
4. LoRA (tidal-init --lora-for, r 8, std 0.01), fp32 both paths: unmerged in both, and merged
   into path B (--lora-merge-b): log-probs within 1e-4 of the CPU's. Bound: every step is fp32
   (the LoRA branch's two GEMMs, scale and add on the device; the merge on the host), so the
   only difference is the GEMM summation order, as in 1. The adapter must matter (changes
   the tokens or moves log-probs by > 1e-3) and the lora_* attributes equal the CPU's.
5. Replay: the shipped dumps (datasets/rollouts) are for a 512-token vocabulary, so the CPU
   run of 1 is written out as vLLM RequestOutputs and replayed through recipe A on both
   devices: logp_a within 1e-4 of the CPU's and of run 1's, logp_b the dumped values.
6. tidal-logprobs --device cuda vs --device cpu, fp32, teacher-forced and --decode: within 1e-4.
7. The run file's `device` attribute: "cuda:0 (cudasim, ...)" from the sim tool, "cpu" else.
8. Also: the fp8-rollout GPU run again under CUDASIM_ORDER=shuffle:7 (threads and blocks in
   another order) is bit-identical; a sampled run (temperature 1, top-p 0.9) in 3 batches with
   prompt scoring gives the CPU's tokens and log-probs within 1e-4; tidal-bench-model --device
   cuda runs its three cases on the simulated device.
Not checked here, by design: bf16 log-probs of long decodes. The CPU emulation takes the fixed
eight-lane order for a decode step's GEMM (src/recipe/gemm.c: a decode kernel's summation order) while the simulator's
cuBLASLt model sums in k order at every M, so after ~20 decode steps one-ulp bf16 flips appear
between the devices (and the sim's decode equals its teacher forcing bit for bit): a property
of the two models, not of the tools.
Exit 0 pass, 1 fail, 77 skip (sim tools not built, or h5py missing).
"""
import json
import os
import shutil
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
from tidal_check import BUILD, check, failures, run  # noqa: E402

SIMBIN = os.path.join(BUILD, "sim", "bin")
MODEL = "datasets/models/add"
TOL = 1e-4
for tool in ["tidal-diff", "tidal-logprobs"]:
    if not os.access(os.path.join(SIMBIN, tool), os.X_OK):
        print(f"skip: {SIMBIN}/{tool} not built (make tests builds it: tests/cudasim/sim.mk)")
        sys.exit(77)


def sim(*args, order=None):
    """Runs SIMBIN/args[0] with device memory closed to host code (and the simulator's thread
    order, CUDASIM_ORDER, when given); a failure (a simulator abort naming a kernel argument, a
    host access to device memory) stops the script."""
    env = dict(os.environ, CUDASIM_DEVICE_GUARD="1")
    if order:   # a numerics check of a run already made under the guard: without it (faster)
        env["CUDASIM_ORDER"] = order
        env.pop("CUDASIM_DEVICE_GUARD")
    p = subprocess.run([os.path.join(SIMBIN, args[0]), *args[1:]], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit(f"simulated-GPU command failed (exit {p.returncode}): {' '.join(args)}")
    return p


tmp = tempfile.mkdtemp()
prompts = os.path.join(tmp, "prompts.jsonl")
with open("datasets/models/prompts-add.jsonl") as src, open(prompts, "w") as dst:
    for line in src.readlines()[:8]:
        dst.write(line)

COMMON = ["--model", MODEL, "--temperature", "0", "--max-new-tokens", "8", "--seed", "3"]


def diff_pair(name, *extra, prompts_file=prompts):
    """tidal-diff on the CPU and on the simulated GPU; returns the two open run files."""
    cpu, gpu = os.path.join(tmp, f"{name}-cpu.h5"), os.path.join(tmp, f"{name}-gpu.h5")
    args = [*COMMON, "--prompts", prompts_file, *extra]
    run("tidal-diff", *args, "-o", cpu)
    sim("tidal-diff", *args, "--device", "cuda", "-o", gpu)
    return h5py.File(cpu, "r"), h5py.File(gpu, "r")


def attr(f, k):
    v = f.attrs[k]
    return v.decode() if isinstance(v, bytes) else v


def col(f, k):
    return f["tokens"][k][:]


def max_dev(a, b, k):
    return float(np.max(np.abs(col(a, k) - col(b, k))))


# 1. fp32 / fp32, greedy, with the per-layer observer; 7. the device attribute
c, g = diff_pair("fp32", "--recipe-a", "fp32", "--recipe-b", "fp32", "--layers")
dev_c, dev_g = attr(c, "device"), attr(g, "device")
print(f"device attributes: CPU tool {dev_c!r}, sim tool {dev_g!r}")
check(dev_c == "cpu" and dev_g.startswith("cuda:0 (cudasim"),
      "the run file records the device: 'cpu' and the simulated 'cuda:0 (cudasim ...)'")
same = np.array_equal(c["prompts/tokens"][:], g["prompts/tokens"][:]) and np.array_equal(col(c, "token"), col(g, "token"))
check(same and len(col(c, "token")) == 64, "fp32 greedy: the GPU generates the same 64 tokens as the CPU")
if same:
    da, db = max_dev(c, g, "logp_a"), max_dev(c, g, "logp_b")
    print(f"  fp32: max |logp_a GPU - CPU| {da:.3g}, max |logp_b GPU - CPU| {db:.3g}")
    check(da <= TOL and db <= TOL, "fp32: both paths' log-probs on the GPU within 1e-4 of the CPU's")
    print(f"  fp32 A vs B: max |dlogp| CPU {np.abs(col(c, 'dlogp')).max():.3g}, GPU {np.abs(col(g, 'dlogp')).max():.3g}")
    check(np.abs(col(g, "dlogp")).max() <= TOL, "fp32: A vs B on the GPU within 1e-4 (training path vs KV-cache decode)")
# 3. --layers in fp32
lc, lg = c["layers/rel_err"][:], g["layers/rel_err"][:]
print(f"  fp32 --layers: max rel_err CPU {lc.max():.3g}, GPU {lg.max():.3g}")
check(lg.shape == lc.shape == (64, 4) and np.isfinite(lg).all() and lg.max() < 1e-5 and lc.max() < 1e-5,
      "fp32 --layers: /layers/rel_err on the GPU has the CPU's shape (64 x 4), both at fp32 noise (< 1e-5)")
fp32_cpu = c

# 2. the fidelity ratio of two mismatched pairs, greedy; 3. --layers of the bf16 pair
for rb in ["bf16-infer", "fp8-rollout"]:
    layers = ["--layers"] if rb == "bf16-infer" else []
    c, g = diff_pair(rb, "--recipe-a", "bf16-train", "--recipe-b", rb, *layers)
    if not np.array_equal(col(c, "token"), col(g, "token")):
        check(False, f"bf16-train/{rb}: the GPU generates the CPU's tokens (greedy)")
        continue
    mc, mg = np.abs(col(c, "dlogp")).mean(), np.abs(col(g, "dlogp")).mean()
    ratio = mg / mc
    print(f"  bf16-train/{rb}: mean |dlogp| CPU {mc:.4g} GPU {mg:.4g}: fidelity ratio {ratio:.3f}; "
          f"max |logp_a GPU - CPU| {max_dev(c, g, 'logp_a'):.3g}, |logp_b| {max_dev(c, g, 'logp_b'):.3g}")
    check(mc > 1e-4 and 0.5 <= ratio <= 2, f"bf16-train/{rb}: fidelity ratio GPU/CPU of mean |dlogp| within [0.5, 2]")
    if layers:
        lc, lg = c["layers/rel_err"][:], g["layers/rel_err"][:]
        mean_rel = np.abs(lg.mean(0) / lc.mean(0) - 1)
        near = np.mean(np.abs(lg - lc) <= 0.1 * lc)
        print(f"  bf16 --layers: per-layer mean rel_err CPU {np.round(lc.mean(0), 5)} GPU {np.round(lg.mean(0), 5)}; "
              f"{100 * near:.1f}% of entries within 10%")
        check(lg.shape == lc.shape and mean_rel.max() <= 0.1 and near >= 0.9,
              "bf16 --layers: each layer's mean rel_err on the GPU within 10% of the CPU's, 90% of entries within 10%")

    if rb == "fp8-rollout":   # the same run under another thread and block order: the same bits
        again = os.path.join(tmp, "fp8-rollout-shuffled.h5")
        sim("tidal-diff", *COMMON, "--prompts", prompts, "--recipe-a", "bf16-train", "--recipe-b", rb,
            "--device", "cuda", "-o", again, order="shuffle:7")
        with h5py.File(again, "r") as s7:
            same = all(np.array_equal(col(g, k), col(s7, k)) for k in ["token", "logp_a", "logp_b", "kl_ba"])
        check(same, "bf16-train/fp8-rollout on the GPU under CUDASIM_ORDER=shuffle:7: bit-identical run "
              "(no kernel depends on the order of its threads or blocks)")

# sampling (temperature 1, top-p 0.9), 3 batches of 3 prompts (KV slots reused), fp32
c, g = diff_pair("sampled", "--recipe-a", "fp32", "--recipe-b", "fp32", "--temperature", "1", "--top-p", "0.9",
                 "--batch", "3", "--score-prompt")
same = np.array_equal(col(c, "token"), col(g, "token")) and np.array_equal(c["seqs/batch"][:], g["seqs/batch"][:])
print(f"  sampled, 3 batches: {len(col(g, 'token'))} scored tokens (prompts too), same tokens {same}"
      + (f", max |logp GPU - CPU| {max(max_dev(c, g, 'logp_a'), max_dev(c, g, 'logp_b')):.3g}" if same else ""))
check(same and max(max_dev(c, g, "logp_a"), max_dev(c, g, "logp_b"), max_dev(c, g, "logp_b_proc")) <= TOL,
      "sampled (T 1, top-p 0.9) in 3 batches with prompt scoring: the CPU's tokens, log-probs within 1e-4")

# 4. LoRA: unmerged in both paths, then merged into path B
lora = os.path.join(tmp, "lora")
run("tidal-init", "--lora-for", MODEL, "--rank", "8", "--lora-std", "0.01", "-o", lora)
for name, extra in [("unmerged", []), ("merged-b", ["--lora-merge-b"])]:
    c, g = diff_pair(f"lora-{name}", "--recipe-a", "fp32", "--recipe-b", "fp32", "--lora", lora, *extra)
    keys = ["lora_mode_a", "lora_mode_b", "lora_survival_b", "lora_changed_frac_b"]
    ac = {k: attr(c, k) for k in keys if k in c.attrs}
    ag = {k: attr(g, k) for k in keys if k in g.attrs}
    print(f"  LoRA {name}: attributes CPU {ac}, GPU {ag}")
    mode_b = "merged" if extra else "unmerged"
    check(ac == ag and ag.get("lora_mode_a") == "unmerged" and ag.get("lora_mode_b") == mode_b,
          f"LoRA {name}: lora_mode_a/b (unmerged/{mode_b}) and merge figures on the GPU equal the CPU's")
    if not np.array_equal(col(c, "token"), col(g, "token")):
        check(False, f"LoRA {name}: the GPU generates the CPU's tokens (greedy)")
        continue
    da, db = max_dev(c, g, "logp_a"), max_dev(c, g, "logp_b")
    tok0 = col(fp32_cpu, "token")
    moved = (not np.array_equal(tok0, col(g, "token"))) or np.abs(col(fp32_cpu, "logp_a") - col(g, "logp_a")).max() > 1e-3
    print(f"  LoRA {name}: max |logp_a GPU - CPU| {da:.3g}, |logp_b| {db:.3g}")
    check(moved, f"LoRA {name}: the adapter changes the GPU run (tokens, or log-probs by > 1e-3)")
    check(da <= TOL and db <= TOL, f"LoRA {name}, fp32: both paths on the GPU within 1e-4 of the CPU's")

# 5. replay of a vLLM dump written from the CPU run of 1
dump = os.path.join(tmp, "vllm.jsonl")
f = fp32_cpu
ids, seqs = f["prompts/tokens"][:], f["seqs"]
with open(dump, "w") as out:
    for s in range(len(seqs["prompt_len"])):
        o, p, r, t0 = int(seqs["tokens_offset"][s]), int(seqs["prompt_len"][s]), int(seqs["response_len"][s]), int(seqs["token_offset"][s])
        resp = ids[o + p:o + p + r].tolist()
        lps = [{str(t): {"logprob": float(np.float32(lp)), "rank": 1, "decoded_token": ""}}
               for t, lp in zip(resp, f["tokens/logp_b"][t0:t0 + r])]
        out.write(json.dumps({"request_id": str(s), "prompt_token_ids": ids[o:o + p].tolist(),
                              "outputs": [{"index": 0, "text": "", "token_ids": resp, "logprobs": lps}]}) + "\n")
c, g = diff_pair("replay", "--recipe-a", "fp32", prompts_file=dump)
print(f"  replay: mode {attr(g, 'mode')!r} format {attr(g, 'rollout_format')!r}, "
      f"max |logp_a GPU - CPU| {max_dev(c, g, 'logp_a'):.3g}, vs the generated run {np.abs(col(g, 'logp_a') - col(fp32_cpu, 'logp_a')).max():.3g}")
check(attr(g, "mode") == "replay" and attr(g, "rollout_format") == "vllm" and np.array_equal(col(c, "token"), col(g, "token")),
      "replay on the GPU: labelled a vLLM replay, the dumped tokens")
check(max_dev(c, g, "logp_a") <= TOL and np.abs(col(g, "logp_a") - col(fp32_cpu, "logp_a")).max() <= TOL,
      "replay: recipe A's log-probs on the GPU within 1e-4 of the CPU replay's and of the generated run's")
check(np.array_equal(col(g, "logp_b"), col(fp32_cpu, "logp_b").astype(np.float32).astype(np.float64)),
      "replay: logp_b on the GPU is the dumped engine log-probs")

# 6. tidal-logprobs on both devices
TOKENS = "1,5,9,14,3,22,7,31,12,4,8,40,2,17"
for extra in [[], ["--decode"]]:
    rows = []
    for tool, dev in [(run, "cpu"), (sim, "cuda")]:
        p = tool("tidal-logprobs", "--model", MODEL, "--tokens", TOKENS, "--device", dev, *extra)
        rows.append([float(l.split()[2]) for l in p.stdout.splitlines() if not l.startswith("#")])
    what = "decode" if extra else "teacher-forced"
    d = max(abs(x - y) for x, y in zip(*rows)) if rows[0] else float("nan")
    print(f"  tidal-logprobs {what}: max |logp GPU - CPU| {d:.3g}")
    check(len(rows[0]) == len(rows[1]) == 13 and d <= TOL, f"tidal-logprobs {what}, fp32: the GPU within 1e-4 of the CPU")

# tidal-bench-model --device cuda: its three cases run on the simulated device (timings meaningless)
p = sim("tidal-bench-model", "--model", MODEL, "--tf-batch", "2", "--tf-len", "16", "--prompt", "4", "--steps", "4",
        "--decode-batch", "3", "--recipe", "fp8-rollout", "--device", "cuda")
cases = [l.split()[1] for l in p.stdout.splitlines() if l.startswith("case ")]
check(p.stdout.startswith("device cuda:0 (cudasim") and cases == ["tf", "decode1", "decode3"],
      f"tidal-bench-model --device cuda --recipe fp8-rollout runs its cases on the simulated device ({cases})")

# --resume on another device is refused (the devices' kernels give other numbers), the file kept
import gc  # noqa: E402
import hashlib  # noqa: E402
for o in gc.get_objects():   # the run files this script still holds open (HDF5 locks them)
    if isinstance(o, h5py.File) and o.id.valid:
        o.close()
for made_by, resumer, tool_dev in [("cpu", sim, "cuda"), ("gpu", run, "cpu")]:
    f = os.path.join(tmp, f"fp32-{made_by}.h5")
    before = hashlib.sha256(open(f, "rb").read()).hexdigest()
    if resumer is sim:
        p = subprocess.run([os.path.join(SIMBIN, "tidal-diff"), *COMMON, "--prompts", prompts, "--recipe-a", "fp32",
                            "--recipe-b", "fp32", "--layers", "--device", "cuda", "-o", f, "--resume"],
                           capture_output=True, text=True)
    else:
        p = run("tidal-diff", *COMMON, "--prompts", prompts, "--recipe-a", "fp32", "--recipe-b", "fp32", "--layers",
                "-o", f, "--resume", ok=False)
    after = hashlib.sha256(open(f, "rb").read()).hexdigest()
    check(p.returncode == 1 and "--resume on another device" in p.stderr and before == after,
          f"--resume of a {made_by.upper()} run file on the {tool_dev} device: refused, exit 1, the file unchanged")
    if p.returncode != 1 or before != after or "another device" not in p.stderr:
        print(p.returncode, before == after, p.stderr[-600:])

# tidal-merge joins shards of one device kind only (and keeps the device, eos list, unknown keys)
SH = [*COMMON, "--prompts", prompts, "--recipe-a", "fp32", "--recipe-b", "fp32"]
s0, s1c, s1g = (os.path.join(tmp, n) for n in ("s0-cpu.h5", "s1-cpu.h5", "s1-gpu.h5"))
run("tidal-diff", *SH, "--shard", "0/2", "-o", s0)
run("tidal-diff", *SH, "--shard", "1/2", "-o", s1c)
sim("tidal-diff", *SH, "--shard", "1/2", "--device", "cuda", "-o", s1g)
mixed = os.path.join(tmp, "mixed.h5")
p = run("tidal-merge", s0, s1g, "-o", mixed, ok=False)
check(p.returncode == 1 and "not shards of one run" in p.stderr and "cuda:0 (cudasim" in p.stderr and not os.path.exists(mixed),
      "tidal-merge of a CPU shard and a GPU shard: refused (exit 1), nothing written")
merged = os.path.join(tmp, "merged.h5")
run("tidal-merge", s0, s1c, "-o", merged)
with h5py.File(merged, "r") as m, h5py.File(s0, "r") as a:
    kept = all(attr(m, k) == attr(a, k) for k in ("device", "eos_token_ids", "config_unknown_keys"))
    check(kept and attr(m, "device") == "cpu", "tidal-merge keeps the shards' device, eos_token_ids and config_unknown_keys")

shutil.rmtree(tmp)
print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
