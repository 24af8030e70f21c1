"""tidal-diff --logprob-temperature: both paths score at logits / T, as TRL and verl compute
old log-probs at the sampling temperature (issue: metrics always used raw T = 1 rows).

References: the sampler's own processed log-prob (src/sampling, an independent code path that
divides by the temperature before its log-softmax) must equal the inference path's row at T
when no other processing is on; the fp32 training path must agree with the fp32 inference path
within 1e-4 (the project's invariant) at T as at 1; the T = 1 default leaves run files unchanged.
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np

try:
    import h5py
except ImportError:
    print("h5py not installed: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tidal_check import check, failures, run  # noqa: E402

tmp = tempfile.mkdtemp(prefix="tidal-logprob-T-")
try:
    model = os.path.join(tmp, "m")
    run("tidal-init", "--arch", "qwen2", "--preset", "tiny", "--seed", "9", "--embed-std", "0.5", "-o", model)
    prompts = os.path.join(tmp, "p.jsonl")
    rng = np.random.default_rng(2)
    with open(prompts, "w") as f:
        for _ in range(5):
            f.write(json.dumps({"tokens": rng.integers(3, 512, int(rng.integers(3, 8))).tolist()}) + "\n")

    def diff(out, *extra, ok=True):
        return run("tidal-diff", "--model", model, "--prompts", prompts, "-o", out, "--max-new-tokens", "10",
                   "--seed", "4", "--temperature", "0.7", *extra, ok=ok)

    def cols(path):
        with h5py.File(path, "r") as g:
            return {k: g["tokens"][k][()] for k in g["tokens"]}, dict(g.attrs)

    t1, t7 = os.path.join(tmp, "t1.h5"), os.path.join(tmp, "t7.h5")
    diff(t1, "--recipe-a", "fp32", "--recipe-b", "fp32")
    diff(t7, "--recipe-a", "fp32", "--recipe-b", "fp32", "--logprob-temperature", "0.7")
    c1, a1 = cols(t1)
    c7, a7 = cols(t7)
    check(np.array_equal(c1["token"], c7["token"]), "the same tokens are sampled (scoring does not change sampling)")
    d = np.abs(c7["logp_b"] - c7["logp_b_proc"]).max()
    check(d < 2e-6, f"inference rows at T equal the sampler's processed log-probs (max |Δ| {d:.2g})")
    d = np.abs(c1["logp_b"] - c1["logp_b_proc"]).max()
    check(d > 1e-2, f"at the default (raw rows) they differ, so the check above can fail (max |Δ| {d:.2g})")
    d = np.abs(c7["logp_a"] - c7["logp_b"]).max()
    check(d <= 1e-4, f"fp32 training path vs fp32 inference path at T = 0.7: max |Δlogp| {d:.2g} <= 1e-4")
    check(np.abs(c7["logp_a"] - c1["logp_a"]).max() > 1e-2, "the training path's log-probs move with T")
    check(a7["logprob_temperature"] in ("0.69999999999999996", b"0.69999999999999996") and
          a1["logprob_temperature"] in ("1", b"1"), "recorded in the run file (logprob_temperature)")

    bf = os.path.join(tmp, "bf.h5")
    diff(bf, "--recipe-a", "bf16-train", "--recipe-b", "bf16-infer", "--logprob-temperature", "0.7")
    cb, _ = cols(bf)
    m = np.abs(cb["logp_b"] - cb["logp_a"]).mean()
    check(0 < m < 0.1, f"bf16 pair at T = 0.7 runs: mean |Δlogp| {m:.3g}")

    p = diff(os.path.join(tmp, "x.h5"), "--logprob-temperature", "0.7", "--rollout-logprobs", "processed", ok=False)
    check(p.returncode == 2 and "--logprob-temperature" in p.stderr, "contradicts --rollout-logprobs processed: exit 2")
    p = diff(t7, "--recipe-a", "fp32", "--recipe-b", "fp32", "--resume", ok=False)
    check(p.returncode == 1 and "--logprob-temperature: run has 0.7, command gives 1" in p.stderr,
          "--resume with another --logprob-temperature is refused, naming both values: " + p.stderr.strip()[-120:])
finally:
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if failures else 0)
