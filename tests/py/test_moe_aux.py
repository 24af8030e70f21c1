"""The load-balancing loss in tidal-rl and tidal-sft (--output-router-logits, --router-aux-loss-coef;
issue 35). The gradient itself is checked against transformers' float64 autograd in
test_grad_moe.py; here what the tools do with it, on datasets/models/add-moe (Qwen2-MoE, 8 experts
top-2, config.json: output_router_logits false, router_aux_loss_coef 0.001):
1. tidal-rl --output-router-logits true: /steps/aux_loss finite and >= 1 (aux = E sum_e f_e P_e is
   K = 2 for an even router, here measured ~2.3), rl_config records output_router_logits and the
   checkpoint's coefficient; the step-0 grad_norm differs from the run without (the term is
   trained); without the flag aux_loss is nan and rl_config has neither key (what older run files
   hold: they resume);
2. --gradient-checkpointing with the aux loss gives the same /steps bit for bit (the backward's
   recompute must not count the routing twice);
3. --resume of an aux run with another --router-aux-loss-coef is refused naming the flag; with the
   run's values it continues bit for bit (2 + 1 steps against 3);
4. tidal-sft --output-router-logits true writes /steps/aux_loss (absent without); on the dense
   model the flag exits 1 naming it; a bad value exits 2.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError:
    print("h5py/numpy unavailable: skipped")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from tidal_check import BIN, check, failures  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
tmp = tempfile.mkdtemp(prefix="tidal-moe-aux-")
MOE, DENSE = os.path.join(ROOT, "datasets/models/add-moe"), os.path.join(ROOT, "datasets/models/add")
BASE = ["--dataset-path", os.path.join(ROOT, "datasets/tasks/add/train.jsonl"), "--num-generations", "4",
        "--per-device-batch-size", "16", "--max-completion-length", "32", "--learning-rate", "1e-4", "--dtype", "bf16",
        "--seed", "5", "--quiet", "--save-steps", "1"]
ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")


def rl(out, *args, model=MOE):
    return subprocess.run([os.path.join(BIN, "tidal-rl"), "--model-path", model, *BASE, "--output-dir",
                           os.path.join(tmp, out), *args], capture_output=True, text=True, env=ENV)


def run_file(out, name="rl.h5"):
    with h5py.File(os.path.join(tmp, out, name), "r") as f:
        cfg = f.attrs.get("rl_config")
        return {k: f["steps"][k][:] for k in f["steps"]}, json.loads(cfg) if cfg is not None else None


def same(a, b):
    return [k for k in a if not k.startswith("time_") and k != "seconds" and not np.array_equal(a[k], b.get(k), equal_nan=True)]


on = rl("on", "--max-steps", "3", "--output-router-logits", "true")
off = rl("off", "--max-steps", "1")
check(on.returncode == 0 and off.returncode == 0, "tidal-rl on add-moe with and without --output-router-logits"
      + ("" if on.returncode == 0 and off.returncode == 0 else on.stderr[-300:] + off.stderr[-300:]))
if on.returncode or off.returncode:
    sys.exit(1)
s_on, c_on = run_file("on")
s_off, c_off = run_file("off")
aux = s_on["aux_loss"]
check(bool(np.all(np.isfinite(aux)) and np.all(aux >= 1)), f"/steps/aux_loss {np.round(aux, 4)} finite, >= 1")
check(c_on.get("output_router_logits") is True and c_on.get("router_aux_loss_coef") == 0.001,
      f"rl_config records output_router_logits and the checkpoint's coefficient "
      f"({c_on.get('output_router_logits')}, {c_on.get('router_aux_loss_coef')})")
check(bool(np.isnan(s_off["aux_loss"]).all()) and "output_router_logits" not in c_off and "router_aux_loss_coef" not in c_off,
      "without the flag: aux_loss nan, rl_config without the keys (older run files resume)")
check(s_on["grad_norm"][0] != s_off["grad_norm"][0] and s_on["logp_diff_mean"][0] == s_off["logp_diff_mean"][0],
      f"step 0: same rollout and pi_old, another gradient (grad_norm {s_on['grad_norm'][0]:.6f} vs {s_off['grad_norm'][0]:.6f})")

gc = rl("gc", "--max-steps", "3", "--output-router-logits", "true", "--gradient-checkpointing")
s_gc, _ = run_file("gc") if gc.returncode == 0 else ({}, None)
bad = same(s_on, s_gc) if gc.returncode == 0 else ["(run failed)"]
check(not bad, f"--gradient-checkpointing with the aux loss: /steps bit for bit{' (differ: ' + str(bad) + ')' if bad else ''}")

cut = rl("cut", "--max-steps", "2", "--output-router-logits", "true")
refused = rl("cut", "--max-steps", "3", "--output-router-logits", "true", "--router-aux-loss-coef", "0.01", "--resume")
check(cut.returncode == 0 and refused.returncode == 1 and "--router-aux-loss-coef" in refused.stderr,
      "--resume with another --router-aux-loss-coef: refused naming it" + ("" if refused.returncode == 1 else refused.stderr[-300:]))
res = rl("cut", "--max-steps", "3", "--output-router-logits", "true", "--resume")
s_res, _ = run_file("cut") if res.returncode == 0 else ({}, None)
bad = same(s_on, s_res) if res.returncode == 0 else ["(resume failed) " + res.stderr[-300:]]
check(not bad, f"--resume of an aux run (2 + 1 steps): /steps bit for bit with 3 steps{' (differ: ' + str(bad) + ')' if bad else ''}")


def sft(out, *args, model=MOE):
    return subprocess.run([os.path.join(BIN, "tidal-sft"), "--model-path", model, "--dataset-path",
                           os.path.join(ROOT, "datasets/tasks/add"), "--output-dir", os.path.join(tmp, out), "--max-steps", "2",
                           "--per-device-batch-size", "4", "--gradient-accumulation-steps", "2", "--learning-rate", "1e-3",
                           "--eval-steps", "0", *args], capture_output=True, text=True, env=ENV)


a, b = sft("sft-on", "--output-router-logits", "True", "--router-aux-loss-coef", "0.02"), sft("sft-off")
check(a.returncode == 0 and b.returncode == 0, "tidal-sft on add-moe with and without --output-router-logits"
      + ("" if a.returncode == 0 and b.returncode == 0 else a.stderr[-300:] + b.stderr[-300:]))
if a.returncode == 0 and b.returncode == 0:
    sa, _ = run_file("sft-on", "sft.h5")
    sb, _ = run_file("sft-off", "sft.h5")
    check("aux_loss" in sa and bool(np.all(np.isfinite(sa["aux_loss"]) & (sa["aux_loss"] >= 1))) and "aux_loss" not in sb,
          f"tidal-sft: /steps/aux_loss {np.round(sa.get('aux_loss', []), 4)} with the flag, absent without")
d = sft("sft-dense", "--output-router-logits", "true", model=DENSE)
check(d.returncode == 1 and "--output-router-logits" in d.stderr, "--output-router-logits true on a dense model: exit 1 naming it")
d = sft("sft-bad", "--output-router-logits", "maybe")
check(d.returncode == 2, "--output-router-logits maybe: usage error (exit 2)")
sys.exit(1 if failures else 0)
