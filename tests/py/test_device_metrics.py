"""tidal-diff --device cuda computes the per-token metrics on the device (issue 26, item 2): B's
log-softmax rows of a batch stay in device memory (td_rows_dev: row_logsoftmax_cuda writes each
decode step's rows there, and prefill's prompt rows with --score-prompt), A's rows are scored
chunk by chunk against them (token_metrics_cuda), prefill's last row of each sequence stays on the
device where the first sampling step reads it, and only the sampled tokens (and their processed
log-probs) per sampling step and one metrics row per token come to the host. Checked on the
simulated GPU (build/sim/bin/tidal-diff, tests/cudasim) with a random model whose vocabulary
(V 4096: a row is 16 KiB) is large against a metrics row (80 bytes), 4 prompts (5, 9, 7 and 150
tokens: the long one spans two prefill chunks of 128 and three 64-row logits chunks), T 1
sampling, 10 new tokens every one (--no-stop-at-eos), --logprob-temperature 0.7 (rows of
logits / T), with --score-prompt and without:

1. The bytes the backend copied device -> host (its counter, printed by tidal-diff), against the
   same sim tool with the metrics on the host (TIDAL_METRICS_ON_HOST=1, the path before):
   prefill (runs of 1 new token: prefill + the first draw): at most 64 bytes per sequence on the
   device path, with and without --score-prompt, however long the prompt (the first draw's token,
   processed log-prob and status: 12); on the host path every prompt row (--score-prompt) or each
   sequence's last row (V x 4 bytes). Generation with 10 new tokens: at most 64 bytes per
   sequence per sampled token, prefill included, on the device path; the rows (n x V x 4) per
   decode step on the host path. Scoring: at most 80 bytes (one td_token_metrics) per scored
   token, against A's every row on the host path.
2. The run files, with and without --score-prompt: device metrics vs host metrics on the same
   simulated GPU: tokens, logp_a, logp_b, logp_b_proc, k3, top-1, rank identical
   (row_logsoftmax_cuda gives td_log_softmax's floats, for prefill's rows as for decode's;
   token_metrics_cuda takes them exactly; a prompt position's logp_b_proc is its kept row's value
   at the token, the raw log-prob, as the host path records it); KL both ways, TV and both
   entropies within 1e-8 relative + 2e-12 (double sums in the block's order:
   test_token_metrics_sim measures <= 1.1e-11 relative on the kernel; a sum of V terms <= 1 in
   another order moves by up to ~2 V 2^-53 = 9e-13 absolutely, which is what the TV of near
   fp32 / fp32 rows, ~1e-7, shows).
3. Against the CPU tool (fp32 / fp32), with and without --score-prompt: the same tokens, logp_a /
   logp_b within 1e-4 (the project's fp32 standard, test_device_sim.py), entropies within 1e-4,
   KL / TV within 1e-5.
4. A replay of rollouts (tidal's format, written from the CPU's run without --score-prompt, raw
   log-probs): B is the recorded log-prob, A's rows are scored on the device
   (td_forward_metrics_replay) instead of downloaded: scoring at most 80 bytes per token against
   A's every row on the host path; device vs host: the EXACT columns and the B-side NaNs
   identical, entropy_a within 1e-8 relative + 2e-12; vs the CPU: logp_a and entropy_a within 1e-4,
   logp_b the recorded value on both.
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
lens = [5, 9, 7, 150]
with open(prompts, "w") as f:
    for i, n in enumerate(lens):
        f.write(json.dumps({"tokens": [(97 * i + 31 * j) % (V - 10) + 5 for j in range(n)]}) + "\n")
n = len(lens)
BASE = ["--model", model, "--prompts", prompts, "--recipe-a", "fp32", "--recipe-b", "fp32", "--temperature", "1",
        "--no-stop-at-eos", "--logprob-temperature", "0.7", "--seed", "11"]


def sim(out, host_rows, args):
    env = dict(os.environ, CUDASIM_DEVICE_GUARD="1", OMP_WAIT_POLICY="PASSIVE")
    if host_rows:
        env["TIDAL_METRICS_ON_HOST"] = "1"
    p = subprocess.run([os.path.join(SIMBIN, "tidal-diff"), *args, "--device", "cuda", "-o", out],
                       capture_output=True, text=True, env=env)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        raise SystemExit(f"simulated-GPU tidal-diff failed (exit {p.returncode})")
    m = re.search(r"device to host: generation (\d+) bytes \(([^)]*)\), scoring (\d+) bytes", p.stderr)
    if not m:
        print(p.stderr)
        raise SystemExit("tidal-diff printed no device-to-host line")
    return int(m.group(1)), m.group(2), int(m.group(3))


# 1a. prefill: runs of one new token (prefill, then the first draw from prefill's last rows)
for sp in (True, False):
    args = BASE + ["--max-new-tokens", "1"] + (["--score-prompt"] if sp else [])
    tag = "with --score-prompt" if sp else "without --score-prompt"
    gen_d, _, _ = sim(os.path.join(tmp, f"pre_dev_{sp}.h5"), False, args)
    gen_h, _, _ = sim(os.path.join(tmp, f"pre_host_{sp}.h5"), True, args)
    rows_h = (sum(lens) if sp else n) * V * 4
    print(f"prefill + first draw, {tag}: device path {gen_d} bytes ({gen_d / n:.0f} per sequence), host path "
          f"{gen_h} ({gen_h / n:.0f} per sequence)")
    check(0 < gen_d <= 64 * n, f"device path, {tag}: prefill + first draw bring down {gen_d / n:.0f} bytes per "
          f"sequence <= 64 (prompts of up to {max(lens)} tokens; a row is {V * 4} bytes)")
    check(gen_h >= rows_h, f"host path, {tag}: prefill brings down the rows ({gen_h} >= {rows_h} bytes)")

T = lambda f, k: f["tokens"][k][:]  # noqa: E731
EXACT = ["token", "pos", "seq", "logp_a", "logp_b", "logp_b_proc", "k3", "top1_a", "top1_b", "rank_a", "rank_b"]
SUMS = ["kl_ba", "kl_ab", "tv", "entropy_a", "entropy_b"]

for sp in (True, False):
    tag = "--score-prompt" if sp else "no --score-prompt"
    args = BASE + ["--max-new-tokens", str(NEW)] + (["--score-prompt"] if sp else [])
    cpu, dev, host = (os.path.join(tmp, f"{k}_{sp}.h5") for k in ("cpu", "dev", "host"))
    run("tidal-diff", *args, "-o", cpu)
    gen_d, how_d, score_d = sim(dev, False, args)
    gen_h, how_h, score_h = sim(host, True, args)
    steps = NEW - 1                      # decode steps: the first token is drawn from the prefill's rows
    prefill_rows = (sum(lens) if sp else n) * V * 4   # what prefill brings down on the host path
    scored = sum((L - 1 if sp else 0) + NEW for L in lens)
    rows_a = sum(L + NEW for L in lens)  # A's teacher-forced rows, every one downloaded before
    print(f"[{tag}] device path: generation {gen_d} bytes ({how_d}), scoring {score_d} bytes")
    print(f"[{tag}] host path:   generation {gen_h} bytes ({how_h}), scoring {score_h} bytes")
    per_step_h = (gen_h - prefill_rows) / steps
    print(f"[{tag}] generation per sampled token ({n} sequences, V {V}, prefill included): "
          f"{gen_d / (n * NEW):.1f} bytes per sequence on the device path; per decode step {per_step_h:.0f} on the "
          f"host path; per scored token: {score_d / scored:.0f} vs {score_h / scored:.0f} bytes")

    # 1b. what comes down
    check(how_d == "B's rows kept on the device" and how_h == "B's rows downloaded",
          f"[{tag}] the sim tool keeps B's rows on the device, and downloads them under TIDAL_METRICS_ON_HOST=1")
    check(0 < gen_d <= 64 * n * NEW, f"[{tag}] device path: generation brings down {gen_d} bytes <= 64 per sequence "
          f"per sampled token, prefill included (O(metrics row), not O(V): a row is {V * 4} bytes)")
    check(per_step_h >= n * V * 4,
          f"[{tag}] host path: a decode step brings down the {n} rows ({per_step_h:.0f} >= {n * V * 4} bytes)")
    check(score_d <= ROW_METRICS * scored + 4096,
          f"[{tag}] device path: scoring brings down {score_d} bytes <= {ROW_METRICS} per scored token ({scored} tokens)")
    check(score_h >= rows_a * V * 4, f"[{tag}] host path: scoring downloads A's {rows_a} rows ({score_h} bytes)")

    c, d, h = (h5py.File(p, "r") for p in (cpu, dev, host))
    # 2. device metrics vs host metrics, same simulated GPU
    check(len(T(d, "token")) == scored, f"[{tag}] {scored} tokens scored")
    for k in EXACT:
        check(np.array_equal(T(d, k), T(h, k)), f"[{tag}] device vs host metrics: {k} identical")
    for k in SUMS:
        a, b = T(h, k), T(d, k)
        r = float(np.max(np.abs(a - b) / (1e-8 * np.abs(a) + 2e-12)))
        check(r <= 1, f"[{tag}] device vs host metrics: {k} within 1e-8 relative + 2e-12 (max {r:.2g} of it)")

    # 3. against the CPU tool
    same = np.array_equal(T(c, "token"), T(d, "token")) and np.array_equal(c["prompts/tokens"][:], d["prompts/tokens"][:])
    check(same, f"[{tag}] the simulated GPU samples the CPU's tokens")
    if same:
        for k, tol in [("logp_a", 1e-4), ("logp_b", 1e-4), ("logp_b_proc", 1e-4), ("entropy_a", 1e-4),
                       ("entropy_b", 1e-4), ("kl_ba", 1e-5), ("kl_ab", 1e-5), ("tv", 1e-5)]:
            e = float(np.max(np.abs(T(c, k) - T(d, k))))
            check(e <= tol, f"[{tag}] GPU (device metrics) vs CPU: {k} within {tol:g} (max {e:.2g})")
    for f in (c, d, h):
        f.close()

# 4. a replay of rollouts (tidal's format, written from the CPU's generated run without --score-prompt): B
#    is the recorded log-prob of each token, A's rows are scored on the device (td_forward_metrics_replay:
#    token_metrics_cuda on A's rows alone) instead of downloaded
cpu_gen = h5py.File(os.path.join(tmp, "cpu_False.h5"), "r")
dump = os.path.join(tmp, "rollouts.jsonl")
ids, seqs = cpu_gen["prompts/tokens"][:], cpu_gen["seqs"]
with open(dump, "w") as out:
    for q in range(len(seqs["prompt_len"])):
        o, p_, r_, t0 = (int(seqs[k][q]) for k in ("tokens_offset", "prompt_len", "response_len", "token_offset"))
        out.write(json.dumps({"prompt_ids": ids[o:o + p_].tolist(), "response_ids": ids[o + p_:o + p_ + r_].tolist(),
                              "rollout_logprobs": [float(x) for x in cpu_gen["tokens/logp_b"][t0:t0 + r_]]}) + "\n")
cpu_gen.close()
RARGS = ["--model", model, "--prompts", dump, "--recipe-a", "fp32", "--logprob-temperature", "0.7"]
cpu, dev, host = (os.path.join(tmp, f"replay_{k}.h5") for k in ("cpu", "dev", "host"))
run("tidal-diff", *RARGS, "-o", cpu)
gen_d, how_d, score_d = sim(dev, False, RARGS)
gen_h, how_h, score_h = sim(host, True, RARGS)
scored = n * NEW
rows_a = sum(L + NEW for L in lens)
print(f"[replay] device path: scoring {score_d} bytes ({score_d / scored:.0f} per token); host path {score_h} bytes "
      f"({score_h / scored:.0f} per token)")
check(gen_d == 0 and gen_h == 0 and how_d == "a replay: none", "[replay] no generation")
check(score_d <= ROW_METRICS * scored + 4096,
      f"[replay] device path: scoring brings down {score_d} bytes <= {ROW_METRICS} per scored token ({scored} tokens)")
check(score_h >= rows_a * V * 4, f"[replay] host path: scoring downloads A's {rows_a} rows ({score_h} bytes)")
c, d, h = (h5py.File(p_, "r") for p_ in (cpu, dev, host))
check(len(T(d, "token")) == scored and np.array_equal(T(d, "token"), T(c, "token")),
      f"[replay] {scored} tokens scored, the CPU's")
for k in EXACT + ["kl_ba", "kl_ab", "tv", "entropy_b"]:   # the B-side sums are NaN on both paths
    check(np.array_equal(T(d, k), T(h, k), equal_nan=True), f"[replay] device vs host metrics: {k} identical")
a, b = T(h, "entropy_a"), T(d, "entropy_a")
r = float(np.max(np.abs(a - b) / (1e-8 * np.abs(a) + 2e-12)))
check(r <= 1, f"[replay] device vs host metrics: entropy_a within 1e-8 relative + 2e-12 (max {r:.2g} of it)")
for k, tol in [("logp_a", 1e-4), ("entropy_a", 1e-4)]:
    e = float(np.max(np.abs(T(c, k) - T(d, k))))
    check(e <= tol, f"[replay] GPU (device metrics) vs CPU: {k} within {tol:g} (max {e:.2g})")
check(np.array_equal(T(c, "logp_b"), T(d, "logp_b")), "[replay] logp_b is the recorded log-prob on both")
for f in (c, d, h):
    f.close()

sys.exit(1 if failures else 0)
