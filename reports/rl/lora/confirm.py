"""Section 5's pre-registered tests (README.md, issue 41), from the packed run files:
  runs/confirm-lr1e-2/s{6..15}-{bf16-mu,bf16-merged,bf16-adapter,fp16-mu,em}/rl.h5   the new seeds
  runs/control-lr1e-2/s{1..5}-em/rl.h5                                             the control's old seeds
  runs/grid/s{1..5}-{bf16,fp16}-{mu,merged,adapter}/rl.h5                           the grid (section 3)
  runs/confirm-lr3e-3/s{6..10}-{bf16-mu,fp16-mu,em}/rl.h5                           the follow-up at 3e-3
Usage: .venv/bin/python reports/rl/lora/confirm.py [--allow-interim]      (h5py and numpy only)

Dead, as pre-registered: final clean accuracy (mean of the last two eval_accuracy values) below
0.005. Only finished runs (steps_done = max_steps) count. H1 (one-sided): bf16 merge-unmerge +
bf16 merged end dead more often than bf16 adapter + fp16 merge-unmerge. Primary: one-sided Fisher
exact test on the new seeds 6-15; secondary: one-sided Mann-Whitney U on the final clean accuracy
(the weight-sync group lower), exact permutation p (all splits when they number at most 2e6, else
2e6 random ones, seeded); then both pooled with the grid's seeds 1-5 (reported, not deciding). The
control: its dead count over seeds 1-15 and a two-sided Fisher test against the bf16 weight-sync
arms' seeds 6-15; the conditional follow-up at 3e-3 is due when it died in at least 5 of its 15.
Until all 40 H1 runs on seeds 6-15 are finished the output says INTERIM and calls nothing a result
(the script refuses to print p-values then, unless --allow-interim).
"""
import glob
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from rlstats import DEAD, final_clean, fisher_greater, fisher_two_sided, last_eval, mann_whitney_less, newcombe_diff  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "runs")
H1_A = ("bf16-mu", "bf16-merged")      # bf16 base, merged weights to the engine
H1_B = ("bf16-adapter", "fp16-mu")      # the comparison arms
NEW = range(6, 16)
OLD = range(1, 6)


PATHS = {}   # (arm, seed) -> run file, filled by collect()


def collect():
    """{(arm, seed): final clean accuracy} of every finished run of the four folders."""
    out = {}
    pats = [("confirm-lr1e-2", r"s(\d+)-(\w+-\w+|em)"), ("control-lr1e-2", r"s(\d+)-(em)"),
            ("grid", r"s(\d+)-(\w+)-(\w+)"), ("confirm-lr3e-3", r"s(\d+)-(\w+-\w+|em)")]
    for folder, pat in pats:
        for p in sorted(glob.glob(os.path.join(RUNS, folder, "*", "rl.h5"))):
            m = re.fullmatch(pat, os.path.basename(os.path.dirname(p)))
            if not m:
                continue
            seed = int(m.group(1))
            arm = m.group(2) if folder != "grid" else f"{m.group(2)}-{m.group(3)}"
            if folder == "confirm-lr3e-3":
                arm += "@3e-3"
            acc = final_clean(p)
            if acc is not None:
                out[(arm, seed)] = acc
                PATHS[(arm, seed)] = p
    return out


def main():
    interim_ok = "--allow-interim" in sys.argv
    acc = collect()
    arms = ("bf16-mu", "bf16-merged", "bf16-adapter", "fp16-mu", "em")
    print("| arm | seeds 6-15 finished | dead (6-15) | final clean acc per seed (6-15) | seeds 1-5 dead |")
    print("|---|---|---|---|---|")
    for arm in arms:
        new = [(s, acc[(arm, s)]) for s in NEW if (arm, s) in acc]
        old = [acc[(arm, s)] for s in OLD if (arm, s) in acc]
        print(f"| {arm} | {len(new)} | {sum(v < DEAD for _, v in new)} | "
              f"{' / '.join(f's{s} ' + ('dead' if v < DEAD else f'{v:.2f}') for s, v in new)} | "
              f"{sum(v < DEAD for v in old)} of {len(old)} |")
    h1_new = [(arm, s) for arm in H1_A + H1_B for s in NEW]
    done = sum(k in acc for k in h1_new)
    complete = done == len(h1_new)
    print()
    print(f"H1 runs on seeds 6-15 finished: {done} of {len(h1_new)}" + ("" if complete else " -- INTERIM"))
    if not complete and not interim_ok:
        print("No test is run before every H1 run is in (the pre-registration's rule); --allow-interim prints "
              "them marked as interim.")
        return
    tag = "" if complete else " [INTERIM: not a result]"
    for label, seeds in (("new seeds 6-15", NEW), ("pooled with the grid's seeds 1-5", list(OLD) + list(NEW))):
        xa = [acc[(a, s)] for a in H1_A for s in seeds if (a, s) in acc]
        xb = [acc[(a, s)] for a in H1_B for s in seeds if (a, s) in acc]
        da, db = sum(v < DEAD for v in xa), sum(v < DEAD for v in xb)
        p = fisher_greater(da, len(xa) - da, db, len(xb) - db)
        U, pu, exact = mann_whitney_less(xa, xb)
        lo, hi = newcombe_diff(da, len(xa), db, len(xb))
        print(f"- {label}: weight-sync arms dead {da} of {len(xa)}, comparison arms {db} of {len(xb)}; one-sided "
              f"Fisher p = {p:.3f}; Mann-Whitney U = {U:.1f}, one-sided p = {pu:.3f} "
              f"({'exact' if exact else '40,000 random splits'}); difference in the share dead "
              f"{da / len(xa) - db / len(xb):+.2f}, 95 % interval {lo:+.2f} to {hi:+.2f} (Newcombe){tag}")
    ce = [acc[("em", s)] for s in list(OLD) + list(NEW) if ("em", s) in acc]
    dc = sum(v < DEAD for v in ce)
    xa = [acc[(a, s)] for a in H1_A for s in NEW if (a, s) in acc]
    da = sum(v < DEAD for v in xa)
    cn = [acc[("em", s)] for s in NEW if ("em", s) in acc]
    dn = sum(v < DEAD for v in cn)
    print(f"- control (exact match, mismatch 0): dead {dc} of {len(ce)} over seeds 1-15; seeds 6-15 {dn} of {len(cn)} "
          f"against the bf16 weight-sync arms' {da} of {len(xa)}: two-sided Fisher p = "
          f"{fisher_two_sided(dn, len(cn) - dn, da, len(xa) - da):.3f}{tag}")
    # added after the pre-registration, descriptive: "dead" as the last evaluation alone (0 right
    # answers at step 950), which counts the runs that die in the last 100 steps
    lastd = {a: sum(last_eval(p) < DEAD for (arm, s), p in PATHS.items() if arm == a and s in NEW) for a in arms}
    la, lb = lastd["bf16-mu"] + lastd["bf16-merged"], lastd["bf16-adapter"] + lastd["fp16-mu"]
    print(f"- descriptive, not registered: dead by the last evaluation alone (seeds 6-15) "
          f"{' / '.join(f'{a} {lastd[a]}' for a in arms)}; weight-sync arms {la} of 20, comparison arms {lb} of 20, "
          f"one-sided Fisher p = {fisher_greater(la, 20 - la, lb, 20 - lb):.3f}{tag}")
    print(f"- the conditional follow-up at 3e-3 (control dead in >= 5 of its 15): "
          f"{'due' if dc >= 5 else 'not due' if len(ce) == 15 else f'open ({dc} dead of {len(ce)} so far)'}")

    followup(acc, interim_ok)


def followup(acc, interim_ok):
    """section 5's conditional follow-up at 3e-3 (seeds 6-10), when any of its runs exist"""
    arms = ("bf16-mu", "fp16-mu", "em")
    runs = {a: [(s, acc[(a + "@3e-3", s)]) for s in range(6, 11) if (a + "@3e-3", s) in acc] for a in arms}
    if not any(runs.values()):
        return
    print()
    print("Follow-up at 3e-3 (seeds 6-10):")
    print()
    print("| arm | finished | dead | final clean acc per seed |")
    print("|---|---|---|---|")
    for a in arms:
        print(f"| {a} | {len(runs[a])} | {sum(v < DEAD for _, v in runs[a])} | "
              f"{' / '.join(f's{s} ' + ('dead' if v < DEAD else f'{v:.2f}') for s, v in runs[a])} |")
    xa, xb = [v for _, v in runs["bf16-mu"]], [v for _, v in runs["fp16-mu"]]
    complete = all(len(runs[a]) == 5 for a in arms)
    tag = "" if complete else " [INTERIM: not all 15 runs in]"
    if not complete and not interim_ok:
        print(f"Follow-up runs finished: {sum(len(v) for v in runs.values())} of 15 -- INTERIM; no test before all are in "
              "(--allow-interim prints them marked as interim).")
        return
    if xa and xb:
        da, db = sum(v < DEAD for v in xa), sum(v < DEAD for v in xb)
        U, pu, exact = mann_whitney_less(xa, xb)
        print(f"- bf16 merge-unmerge dead {da} of {len(xa)}, fp16 merge-unmerge {db} of {len(xb)}: one-sided "
              f"Fisher p = {fisher_greater(da, len(xa) - da, db, len(xb) - db):.3f}; Mann-Whitney U = {U:.1f}, "
              f"one-sided p = {pu:.3f}{tag}")


if __name__ == "__main__":
    main()
