"""tidal-diff --device cuda computes the per-token metrics on the device (issue 26, item 2): B's
log-softmax rows of a batch stay in device memory (td_rows_dev: row_logsoftmax_cuda writes each
decode step's rows there), A's rows are scored chunk by chunk against them (token_metrics_cuda),
and only the sampled tokens (and their processed log-probs) per decode step and one metrics row
per token come to the host. Checked on the simulated GPU (build/sim/bin/tidal-diff, tests/cudasim)
with a random model whose vocabulary (V 4096: a row is 16 KiB) is large against a metrics row
(80 bytes), 3 prompts, T 1 sampling, 10 new tokens every one (--no-stop-at-eos), --score-prompt
(prompt rows uploaded from the host's prefill) and --logprob-temperature 0.7 (rows of logits / T):

1. The bytes the backend copied device -> host (its counter, printed by tidal-diff), against the
   same sim tool with the metrics on the host (TIDAL_METRICS_ON_HOST=1, the path before):
   generation: per decode step at most 64 bytes per sequence (token, processed log-prob, status:
   12) on the device path, the whole rows (n x V x 4) on the host path; the only V-wide rows
   still coming down are the prefill's (with --score-prompt every prompt row, else the last one
   of each sequence: once per prompt token, not per step). Scoring: at most 80 bytes (one
   td_token_metrics) per scored token, against A's every row on the host path.
2. The run files: device metrics vs host metrics on the same simulated GPU: tokens, logp_a,
   logp_b, logp_b_proc, k3, top-1, rank identical (row_logsoftmax_cuda gives td_log_softmax's
   floats; token_metrics_cuda takes them exactly); KL both ways, TV and both entropies within
   1e-8 relative + 2e-12 (double sums in the block's order: test_token_metrics_sim measures
   <= 1.1e-11 relative on the kernel; a sum of V terms <= 1 in another order moves by up to
   ~2 V 2^-53 = 9e-13 absolutely, which is what the TV of near fp32 / fp32 rows, ~1e-7, shows).
3. Against the CPU tool (fp32 / fp32): the same tokens, logp_a / logp_b within 1e-4 (the
   project's fp32 standard, test_device_sim.py), entropies within 1e-4, KL / TV within 1e-5.
On a GPU (tests/gpu/run.sh check, DEVICE_BIN=$BUILD/bin: the real backend) the same checks hold:
the certified log-softmax gives td_log_softmax's floats there too (its margins cover the GPU's
double exp / log).
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

SIMBIN = os.environ.get("DEVICE_BIN", os.path.join(BUILD, "sim", "bin"))   # DEVICE_BIN=build/bin on a GPU
if not os.access(os.path.join(SIMBIN, "tidal-diff"), os.X_OK):
    print(f"skip: {SIMBIN}/tidal-diff not built (make tests builds it: tests/cudasim/sim.mk)")
    sys.exit(77)

V, NEW, ROW_METRICS = 4096, 10, 80
tmp = tempfile.mkdtemp()
model = os.path.join(tmp, "m")
run("tidal-init", "--arch", "llama", "--hidden-size", "64", "--num-layers", "2", "--num-heads", "4",
    "--num-kv-heads", "2", "--intermediate-size", "128", "--vocab-size", str(V), "--seed", "5", "-o", model)
prompts = os.path.join(tmp, "p.jsonl")
lens = [5, 9, 7]
with open(prompts, "w") as f:
    for i, n in enumerate(lens):
        f.write(json.dumps({"tokens": [(97 * i + 31 * j) % (V - 10) + 5 for j in range(n)]}) + "\n")
ARGS = ["--model", model, "--prompts", prompts, "--recipe-a", "fp32", "--recipe-b", "fp32", "--temperature", "1",
        "--max-new-tokens", str(NEW), "--no-stop-at-eos", "--score-prompt", "--logprob-temperature", "0.7",
        "--seed", "11"]


def sim(out, host_rows):
    env = dict(os.environ, CUDASIM_DEVICE_GUARD="1", OMP_WAIT_POLICY="PASSIVE")
    if host_rows:
        env["TIDAL_METRICS_ON_HOST"] = "1"
    p = subprocess.run([os.path.join(SIMBIN, "tidal-diff"), *ARGS, "--device", "cuda", "-o", out],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit(f"simulated-GPU tidal-diff failed (exit {p.returncode})")
    m = re.search(r"device to host: generation (\d+) bytes \(([^)]*)\), scoring (\d+) bytes", p.stderr)
    if not m:
        print(p.stderr)
        raise SystemExit("tidal-diff printed no device-to-host line")
    return int(m.group(1)), m.group(2), int(m.group(3))


cpu, dev, host = (os.path.join(tmp, f"{k}.h5") for k in ("cpu", "dev", "host"))
run("tidal-diff", *ARGS, "-o", cpu)
gen_d, how_d, score_d = sim(dev, False)
gen_h, how_h, score_h = sim(host, True)
n = len(lens)
steps = NEW - 1                      # the first token is drawn from the prefill's rows
prefill_rows = sum(lens) * V * 4     # prefill's rows: with --score-prompt every prompt row (once)
scored = sum(L - 1 + NEW for L in lens)
rows_a = sum(L + NEW for L in lens)  # A's teacher-forced rows, every one downloaded before
print(f"device path: generation {gen_d} bytes ({how_d}), scoring {score_d} bytes")
print(f"host path:   generation {gen_h} bytes ({how_h}), scoring {score_h} bytes")
per_step_d = (gen_d - prefill_rows) / steps
per_step_h = (gen_h - prefill_rows) / steps
print(f"per decode step ({n} sequences, V {V}): {per_step_d:.0f} bytes on the device path, {per_step_h:.0f} on the "
      f"host path; per scored token: {score_d / scored:.0f} vs {score_h / scored:.0f} bytes")

# 1. what comes down
check(how_d == "B's rows kept on the device" and how_h == "B's rows downloaded",
      "the sim tool keeps B's rows on the device, and downloads them under TIDAL_METRICS_ON_HOST=1")
check(0 < per_step_d <= 64 * n, f"device path: a decode step brings down {per_step_d:.0f} bytes <= 64 per sequence "
      f"(O(metrics row), not O(V): a row is {V * 4} bytes)")
check(per_step_h >= n * V * 4, f"host path: a decode step brings down the {n} rows ({per_step_h:.0f} >= {n * V * 4} bytes)")
check(score_d <= ROW_METRICS * scored + 4096,
      f"device path: scoring brings down {score_d} bytes <= {ROW_METRICS} per scored token ({scored} tokens)")
check(score_h >= rows_a * V * 4, f"host path: scoring downloads A's {rows_a} rows ({score_h} bytes)")

c, d, h = (h5py.File(p, "r") for p in (cpu, dev, host))
T = lambda f, k: f["tokens"][k][:]  # noqa: E731
EXACT = ["token", "pos", "seq", "logp_a", "logp_b", "logp_b_proc", "k3", "top1_a", "top1_b", "rank_a", "rank_b"]
SUMS = ["kl_ba", "kl_ab", "tv", "entropy_a", "entropy_b"]

# 2. device metrics vs host metrics, same simulated GPU
check(len(T(d, "token")) == scored, f"{scored} tokens scored (prompt and response)")
for k in EXACT:
    check(np.array_equal(T(d, k), T(h, k)), f"device vs host metrics: {k} identical")
for k in SUMS:
    a, b = T(h, k), T(d, k)
    r = float(np.max(np.abs(a - b) / (1e-8 * np.abs(a) + 2e-12)))
    check(r <= 1, f"device vs host metrics: {k} within 1e-8 relative + 2e-12 (max {r:.2g} of it)")

# 3. against the CPU tool
same = np.array_equal(T(c, "token"), T(d, "token")) and np.array_equal(c["prompts/tokens"][:], d["prompts/tokens"][:])
check(same, "the simulated GPU samples the CPU's tokens")
if same:
    for k, tol in [("logp_a", 1e-4), ("logp_b", 1e-4), ("entropy_a", 1e-4), ("entropy_b", 1e-4), ("kl_ba", 1e-5),
                   ("kl_ab", 1e-5), ("tv", 1e-5)]:
        e = float(np.max(np.abs(T(c, k) - T(d, k))))
        check(e <= tol, f"GPU (device metrics) vs CPU: {k} within {tol:g} (max {e:.2g})")

sys.exit(1 if failures else 0)
