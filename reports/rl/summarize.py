"""Numbers for reports/rl/README.md from the run files tidal-rl wrote (h5py only; the figures and
per-sweep tables come from tidal-sweep). Usage: .venv/bin/python reports/rl/summarize.py
Prints Markdown: mismatch by recipe (level at step 0, trend, IS-weight spread, corrections'
clipped/masked shares, gradient noise), outcomes by configuration, the lr = 0 drift, the
dose-response arm against the measured bf16 level, and long responses."""
import glob
import os

import h5py
import numpy as np

os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def load(d):
    p = os.path.join(ROOT, d, "rl.h5")
    if not os.path.exists(p):
        return None
    try:
        f = h5py.File(p, "r")
    except OSError:
        return None
    s = {k: f["steps"][k][:] for k in f["steps"]} if "steps" in f else None
    a = dict(f.attrs)
    f.close()
    return (s, a) if s is not None and len(s["reward"]) else None


def w(x, a, b):
    x = x[a:b]
    x = x[np.isfinite(x)]
    return float(x.mean()) if len(x) else float("nan")


def runs(pattern):
    out = {}
    for d in sorted(glob.glob(os.path.join(ROOT, pattern))):
        r = load(os.path.relpath(d, ROOT))
        if r:
            out[os.path.basename(d)] = r
    return out


def clean(sweep, run):
    """the final policy scored on a clean path (eval_final.sh): reward, accuracy"""
    r = load(os.path.join("build", "rl", "eval", sweep, run))
    return (w(r[0]["reward"], 0, None), w(r[0]["accuracy"], 0, None)) if r else (float("nan"), float("nan"))


RECIPES = ["bf16", "fp16", "fp8roll", "fp8uni"]
g = runs("build/rl/grid/*")
bf = [g[n][0] for n in g if n.startswith("bf16-")]
bf16_level = np.mean([s["logp_diff_mean"][0] for s in bf]) if bf else float("nan")
bf16_k3 = np.mean([s["k3_kl"][0] for s in bf]) if bf else float("nan")

print("### Mismatch by recipe (grid, every correction and seed; step 0 and the trend)\n")
print("| recipe | runs | mean abs dlogp step 0 | x bf16 | k3_kl step 0 | k3 last 20 / first 20 | IS std (mean) | "
      "IS max (max) | chi2_seq (mean) | ESS min | grad-norm CV |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for rc in RECIPES + ["exact"]:
    ss = [g[n][0] for n in g if n.startswith(rc + "-")]
    if not ss:
        continue
    d0 = np.mean([s["logp_diff_mean"][0] for s in ss])
    k0 = np.mean([s["k3_kl"][0] for s in ss])
    tr = np.mean([w(s["k3_kl"], -20, None) / max(w(s["k3_kl"], 0, 20), 1e-300) for s in ss]) if rc != "exact" else float("nan")
    fin = [s["grad_norm"][np.isfinite(s["grad_norm"])] for s in ss]
    cv = np.mean([x.std() / x.mean() for x in fin if len(x)])
    print(f"| {rc} | {len(ss)} | {d0:.2e} | {d0 / bf16_level:.2f} | {k0:.2e} | {tr:.2f} | "
          f"{np.mean([np.nanmean(s['rollout_is_std']) for s in ss]):.2e} | {max(np.nanmax(s['rollout_is_max']) for s in ss):.3f} | "
          f"{np.mean([np.nanmean(s['chi2_seq']) for s in ss]):.2e} | {min(np.nanmin(s['rollout_is_eff_sample_size']) for s in ss):.4f} | {cv:.2f} |")

print("\n### What the corrections did (grid)\n")
print("| configuration | runs | TIS clipped share (mean) | MIS masked token share (mean) | MIS masked sequence share (mean) |")
print("|---|---|---|---|---|")
for rc in RECIPES:
    for c in ["tis", "seqmis"]:
        ss = [g[n][0] for n in g if n.startswith(f"{rc}-{c}-")]
        if ss:
            print(f"| {rc}-{c} | {len(ss)} | {np.mean([np.nanmean(s['rollout_is_clipped_fraction']) for s in ss]):.2e} | "
                  f"{np.mean([np.nanmean(s['rollout_rs_masked_fraction']) for s in ss]):.2e} | "
                  f"{np.mean([np.nanmean(s['rollout_rs_seq_masked_fraction']) for s in ss]):.2e} |")

print("\n### Outcomes (grid): per seed, final = last 10 steps\n")
print("| configuration | final acc per seed | best 10-step acc per seed | final reward per seed | final policy on a clean path: acc per seed | collapse (first reward_drop) |")
print("|---|---|---|---|---|---|")
cfgs = sorted({n.rsplit("-", 1)[0] for n in g if not n.startswith("noise")})
for c in cfgs:
    ss = [(n, g[n]) for n in sorted(g) if n.rsplit("-", 1)[0] == c]
    fa = " / ".join(f"{w(s['accuracy'], -10, None):.3f}" for _, (s, a) in ss)
    ba = " / ".join(f"{max(w(s['accuracy'], k, k + 10) for k in range(max(1, len(s['accuracy']) - 9))):.3f}" for _, (s, a) in ss)
    fr = " / ".join(f"{w(s['reward'], -10, None):.3f}" for _, (s, a) in ss)
    co = " / ".join(str(a.get("collapse_step", "?")) for _, (s, a) in ss)
    ce = " / ".join(f"{clean('grid', n)[1]:.3f}" for n, _ in ss)
    print(f"| {c} | {fa} | {ba} | {fr} | {ce} | {co} |")

z = runs("build/rl/lr0/*")
if z:
    print("\n### lr = 0 control: the mismatch of a policy that does not learn (120 steps, seed 1)\n")
    print("| recipe | mean abs dlogp first 20 | last 20 | k3 first 20 | last 20 | reward (mean) |")
    print("|---|---|---|---|---|---|")
    for n, (s, a) in z.items():
        print(f"| {n} | {w(s['logp_diff_mean'], 0, 20):.2e} | {w(s['logp_diff_mean'], -20, None):.2e} | "
              f"{w(s['k3_kl'], 0, 20):.2e} | {w(s['k3_kl'], -20, None):.2e} | {w(s['reward'], 0, None):.3f} |")

dose = {n: g[n] for n in g if n.startswith("noise")}
if dose:
    print("\n### SYNTHETIC dose-response arm (bf16 paths + rollout-logit noise; seed 1)\n")
    print("| noise sigma | correction | mean abs dlogp step 0 | x bf16 | k3 step 0 | ESS min | rollout reward first 10 | "
          "rollout reward last 10 | final policy, clean path: reward / acc | collapse step | first precursor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    base_clean = clean("grid", "bf16-none-s1")
    print(f"| (base model) | | | | | | | | {load('build/rl/eval/base/base-short')[0]['reward'].mean() if load('build/rl/eval/base/base-short') else float('nan'):.3f} | | |")
    for n, (s, a) in sorted(dose.items(), key=lambda kv: (float(kv[0].split("-")[0][5:]), kv[0])):
        sig, corr = n.split("-")[0][5:], n.split("-")[1]
        pre = min(((a.get(f"first_{k}", -1), k) for k in ("grad_spike", "entropy", "mismatch", "length")
                   if a.get(f"first_{k}", -1) >= 0), default=(-1, "—"))
        cr, ca = clean("grid", n)
        print(f"| {sig} | {corr} | {s['logp_diff_mean'][0]:.2e} | {s['logp_diff_mean'][0] / bf16_level:.0f} | {s['k3_kl'][0]:.2e} | "
              f"{np.nanmin(s['rollout_is_eff_sample_size']):.3f} | {w(s['reward'], 0, 10):.3f} | {w(s['reward'], -10, None):.3f} | "
              f"{cr:.3f} / {ca:.3f} | {a.get('collapse_step', '?')} | {pre[1]}@{pre[0]} |")

for tag, pat in (("2x learning rate (4e-4)", "build/rl/lr2x/*"), ("long responses (add-long, 40 steps)", "build/rl/long/*")):
    rr = runs(pat)
    if not rr:
        continue
    print(f"\n### {tag}\n")
    print("| run | mean abs dlogp step 0 | k3 step 0 | chi2_seq (mean) | MIS masked seq share | final acc | final reward | "
          "collapse step | first precursor |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, (s, a) in rr.items():
        pre = min(((a.get(f"first_{k}", -1), k) for k in ("grad_spike", "entropy", "mismatch", "length")
                   if a.get(f"first_{k}", -1) >= 0), default=(-1, "—"))
        print(f"| {n} | {s['logp_diff_mean'][0]:.2e} | {s['k3_kl'][0]:.2e} | {np.nanmean(s['chi2_seq']):.2e} | "
              f"{np.nanmean(s['rollout_rs_seq_masked_fraction']):.3f} | {w(s['accuracy'], -10, None):.3f} | "
              f"{w(s['reward'], -10, None):.3f} | {a.get('collapse_step', '?')} | {pre[1]}@{pre[0]} |")
print(f"\nbf16 reference level: mean |dlogp| at step 0 = {bf16_level:.2e}, k3 = {bf16_k3:.2e} (mean over the grid's bf16 runs)")
