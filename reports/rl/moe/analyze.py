"""The pre-registered table of issue 35's grid (README.md: "Tests", predictions 3-5), from the packed
run files runs/grid/s{1..5}-ARM/rl.h5. Usage: .venv/bin/python reports/rl/moe/analyze.py [--allow-interim]
(h5py and numpy only; the tests in ../rlstats.py, shared with reports/rl/lora/confirm.py).

Per arm: finished seeds, dead runs (final clean accuracy, the mean of the last two evaluations, below
0.005), the one-sided Fisher exact p of the arm dying more often than its model's exact-match control,
the final clean accuracy per seed and the one-sided exact Mann-Whitney p of it being lower than the
control's; from /steps, means over the arm's seeds: mean |dlogp| (logp_diff_mean) at step 1 and over
the last 10 steps, the routing flip rate (routing_flip_rate: under R3 what the trainer's router would
have chosen) over steps 1-10 and the last 10, and the mean |dlogp| of flipped over unflipped tokens.
Then the comparison that answers the README's question: add-moe bf16 against the dense twin's bf16.
No test is printed before every run of the grid (11 arms x 5 seeds) is finished, as pre-registered,
unless --allow-interim (then every p is marked INTERIM)."""
import glob
import os
import re
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from rlstats import DEAD, final_clean, fisher_greater, fisher_two_sided, mann_whitney_less  # noqa: E402

RUNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs", "grid")
ARMS = ("moe-em", "moe-bf16", "moe-fp16", "moe-bf16-r2", "moe-bf16-r3", "moe-bf16-tis", "moe-fp8roll",
        "moe-fp8roll-r3", "dense-em", "dense-bf16", "dense-fp16")
SEEDS = range(1, 6)


def control_of(arm):
    return "moe-em" if arm.startswith("moe") else "dense-em"


def step_means(path):
    """mismatch and routing figures of one finished run (NaN where not measured)"""
    with h5py.File(path, "r") as f:
        s = f["steps"]

        def col(k):
            return s[k][:].astype(float) if k in s else np.full(len(s["step"]), np.nan)

        d, fr = col("logp_diff_mean"), col("routing_flip_rate")
        ff, fu = col("routing_mismatch_flipped"), col("routing_mismatch_unflipped")
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.nanmean(ff) / np.nanmean(fu) if np.isfinite(fu).any() and np.nanmean(fu) > 0 else np.nan
    nm = lambda x: float(np.nanmean(x)) if np.isfinite(x).any() else float("nan")  # noqa: E731
    return {"d0": float(d[0]), "dlast": nm(d[-10:]), "f0": nm(fr[:10]), "flast": nm(fr[-10:]), "ratio": ratio}


def collect():
    acc, figs = {}, {}
    for p in sorted(glob.glob(os.path.join(RUNS, "*", "rl.h5"))):
        m = re.fullmatch(r"s(\d+)-(.+)", os.path.basename(os.path.dirname(p)))
        if not m or m.group(2) not in ARMS:
            continue
        key = (m.group(2), int(m.group(1)))
        a = final_clean(p)
        if a is not None:
            acc[key] = a
            figs[key] = step_means(p)
    return acc, figs


def fmt(v, spec=".2e"):
    return "—" if v is None or not np.isfinite(v) else format(v, spec)


def main():
    interim_ok = "--allow-interim" in sys.argv
    acc, figs = collect()
    done = sum((a, s) in acc for a in ARMS for s in SEEDS)
    complete = done == len(ARMS) * len(SEEDS)
    tests = complete or interim_ok
    tag = "" if complete else " (INTERIM)"
    print(f"Finished runs: {done} of {len(ARMS) * len(SEEDS)}" + ("" if complete else " -- INTERIM: no test is a result"))
    print()
    print("| arm | seeds | dead | Fisher p (more dead than control) | final clean acc per seed | Mann-Whitney p "
          "(lower than control) | mean abs dlogp step 1 / last 10 | flip rate steps 1-10 / last 10 | "
          "flipped / unflipped abs dlogp |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arm in ARMS:
        xs = [acc[(arm, s)] for s in SEEDS if (arm, s) in acc]
        if not xs:
            print(f"| {arm} | 0 | | | | | | | |")
            continue
        ctl = control_of(arm)
        cs = [acc[(ctl, s)] for s in SEEDS if (ctl, s) in acc]
        dead, cdead = sum(v < DEAD for v in xs), sum(v < DEAD for v in cs)
        fp = mw = "—"
        if tests and arm != ctl and cs:
            fp = f"{fisher_greater(dead, len(xs) - dead, cdead, len(cs) - cdead):.3f}{tag}"
            mw = f"{mann_whitney_less(xs, cs)[1]:.3f}{tag}"
        fg = [figs[(arm, s)] for s in SEEDS if (arm, s) in figs]
        mean = lambda k: float(np.nanmean([g[k] for g in fg])) if any(np.isfinite(g[k]) for g in fg) else float("nan")  # noqa: E731
        per = " / ".join("dead" if v < DEAD else f"{v:.3f}" for v in xs)
        print(f"| {arm} | {len(xs)} | {dead} | {fp} | {per} | {mw} | {fmt(mean('d0'))} / {fmt(mean('dlast'))} | "
              f"{fmt(mean('f0'), '.4f')} / {fmt(mean('flast'), '.4f')} | {fmt(mean('ratio'), '.1f')} |")
    print()
    mb = [acc[("moe-bf16", s)] for s in SEEDS if ("moe-bf16", s) in acc]
    db = [acc[("dense-bf16", s)] for s in SEEDS if ("dense-bf16", s) in acc]
    if tests and mb and db:
        a, b = sum(v < DEAD for v in mb), sum(v < DEAD for v in db)
        print(f"- add-moe bf16 against the dense twin's bf16: dead {a} of {len(mb)} against {b} of {len(db)}; "
              f"one-sided Fisher p (MoE more) = {fisher_greater(a, len(mb) - a, b, len(db) - b):.3f}, two-sided "
              f"{fisher_two_sided(a, len(mb) - a, b, len(db) - b):.3f}{tag}. Their final clean accuracies are not "
              "compared: the twins started 0.14 apart (README, set-up).")
    elif not tests:
        print("No test is run before every run is in (the pre-registration's rule); --allow-interim prints them "
              "marked INTERIM.")


if __name__ == "__main__":
    main()
