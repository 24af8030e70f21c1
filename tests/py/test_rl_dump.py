"""tidal-rl --dump-step K: step K's tensors in TRL's names and shapes, checked against TRL's
GRPOTrainer._compute_loss transcribed in numpy (trl/trainer/grpo_trainer.py, loss_type "dapo",
the default since TRL 0.20: per_token_loss = -min(r*A, clip(r, 1-eps, 1+eps_high)*A) times the IS
weight, plus beta*k3(ref) with --beta, summed over the mask and divided by the mask's total) and
its gradient in per_token_logps, and against the run's own /steps row (rewards, loss).
Exit 0 = pass, 77 = skipped (safetensors or h5py missing)."""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

try:
    import h5py
    from safetensors import safe_open
except ImportError:
    print("safetensors or h5py not installed: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tidal_check import BIN, check, failures  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
tmp = tempfile.mkdtemp(prefix="tidal-rl-dump-")
try:
    out = os.path.join(tmp, "run")
    argv = [os.path.join(BIN, "tidal-rl"), "--model-path", os.path.join(ROOT, "datasets/models/add"),
            "--dataset-path", os.path.join(ROOT, "datasets/tasks/add/train.jsonl"), "--max-steps", "3",
            "--per-device-batch-size", "8", "--num-generations", "4", "--max-completion-length", "40",
            "--learning-rate", "1e-3", "--beta", "0.04", "--rollout-logit-noise", "0.3",
            "--is-correction", "token-tis", "--dump-step", "3", "--output-dir", out]
    p = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    check(p.returncode == 0, f"tidal-rl --dump-step 3 ran ({p.stderr.strip()[-300:]})")
    path = os.path.join(out, "dump-step-3.safetensors")
    prog = [l for l in p.stderr.splitlines() if l.startswith("tidal-rl: step ")]
    check(len(prog) >= 3 and all(" clip_ratio " in l for l in prog if "/3 " in l) and f"-> {path}" in p.stderr,
          "the progress line shows clip_ratio (TRL's name); the dump's path is said")
    check(os.path.exists(path) and not os.path.exists(os.path.join(out, "dump-step-2.safetensors")),
          "only dump-step-3.safetensors written")
    with safe_open(path, "np") as f:
        d = {k: f.get_tensor(k) for k in f.keys()}
        meta = f.metadata()
    B, T = d["completion_ids"].shape
    check(B == 8 and d["prompt_ids"].shape[0] == 8 and d["advantages"].shape == (8,), f"shapes [B, T] = {B, T}")
    check(meta["step"] == "3" and meta["loss_type"] == "dapo" and "--dump-step 3" in meta["command_line"],
          "metadata: step, loss_type, the command line")
    cm, lm = d["completion_mask"], d["loss_mask"]
    lens = cm.sum(1)
    check(all((cm[s, :int(lens[s])] == 1).all() and (cm[s, int(lens[s]):] == 0).all() for s in range(B)),
          "completion_mask: ones then zero padding")
    pm = d["prompt_mask"]
    check(all(np.all(np.diff(pm[s]) >= 0) for s in range(B)) and (pm[:, -1] == 1).all(), "prompts left-padded")

    # TRL's _compute_loss in numpy (float64 over the float32 tensors)
    lp, old = d["per_token_logps"].astype(np.float64), d["old_per_token_logps"].astype(np.float64)
    ref, w = d["ref_per_token_logps"].astype(np.float64), d["importance_sampling_ratio"].astype(np.float64)
    A = d["advantages"].astype(np.float64)[:, None]
    eps, eps_hi, beta = float(meta["epsilon"]), float(meta["epsilon_high"]), float(meta["beta"])
    r = np.exp(lp - old)
    rc = np.clip(r, 1 - eps, 1 + eps_hi)
    per_token_loss = -np.minimum(r * A, rc * A) * w
    kl = np.exp(ref - lp) - (ref - lp) - 1
    per_token_loss += beta * kl
    loss = (per_token_loss * lm).sum() / max(lm.sum(), 1.0)
    check(abs(loss - float(meta["loss"])) <= 1e-6 * max(1.0, abs(loss)),
          f"loss = TRL's dapo loss on the dumped tensors: {float(meta['loss']):.9g} vs numpy {loss:.9g}")
    unclipped = (r * A <= rc * A)
    grad = (np.where(unclipped, -A * r, 0.0) * w + beta * (1 - np.exp(ref - lp))) * lm / max(lm.sum(), 1.0)
    g = d["per_token_loss_grad"].astype(np.float64)
    err = np.abs(g - grad).max() / max(np.abs(grad).max(), 1e-30)
    check(err <= 1e-5 and np.abs(grad).max() > 0, f"per_token_loss_grad = d(TRL loss)/d(per_token_logps), rel. max error {err:.2e}")
    check(not np.array_equal(d["sampling_per_token_logps"], d["old_per_token_logps"]),
          "sampling_per_token_logps (the engine's, with logit noise) differ from old_per_token_logps")
    with h5py.File(os.path.join(out, "rl.h5"), "r") as h:
        steps = h["steps"]
        reward = steps["reward"][2]
        lossh = steps["loss"][2]
    check(abs(d["rewards"].astype(np.float64).mean() - reward) <= 1e-6, f"rewards mean = /steps reward of step 3 ({reward:.6f})")
    check(abs(lossh - float(meta["loss"])) <= 1e-12 * max(1.0, abs(lossh)), "metadata loss = /steps loss of step 3")
    # group-normalised advantages as TRL: (r - mean_group) / (std_group + 1e-4), std unbiased
    rw = d["rewards"].astype(np.float64).reshape(-1, 4)
    a = (rw - rw.mean(1, keepdims=True)) / (rw.std(1, ddof=1, keepdims=True) + 1e-4)
    check(np.allclose(a.ravel(), d["advantages"], rtol=1e-6, atol=1e-6), "advantages = TRL's group-normalised rewards")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if failures else 0)
